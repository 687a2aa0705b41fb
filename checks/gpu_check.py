"""`python -m checks.gpu_check`: chapter 13's prefill/decode timing, chapter 14's training run and
chapter 16's speculative decoding on SmolLM2 on this machine's accelerator (CUDA, else MPS, else
the CPU), in one report.

    python -m checks.gpu_check [--out gpu-report.md] [--json gpu-report.json] [--quick]
                               [--device cuda|mps|cpu] [--steps N]

What it runs is chosen by plain functions (`plan`), tested on a CPU: on a GPU, chapter 13's
timing at the size `checks.timing` picks for it and chapter 14's "gpu" run (a 10 M-parameter
LLaMA, bf16 autocast where supported) for its steps; on a CPU the "cpu" run; `--quick` the
smallest of each (proves the command works, measures nothing). `make gpu-check` runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

import torch

from . import training_run


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one report measures."""

    device: str
    timing_size: str | None        # checks.timing's plan size (None: its own choice)
    timing_budget: float           # seconds per timed point
    training: str                  # checks.training_run settings
    steps: int                     # training steps
    autocast: str | None           # "bfloat16" or None


def plan(device: str, *, quick: bool = False, steps: int | None = None,
         bf16_supported: bool | None = None) -> Plan:
    """The report's choices for `device` ("cuda", "mps" or "cpu")."""
    if device not in ("cuda", "mps", "cpu"):
        raise ValueError(f"unknown device {device!r}: cuda, mps or cpu")
    if quick:
        kind = "grading"
    else:
        kind = training_run.run_kind(device, grading=False)
    run = training_run.settings(kind)
    amp = training_run.autocast_dtype(device, bf16_supported=bf16_supported) \
        if device == "cuda" else None
    return Plan(device=device, timing_size="tiny" if quick else None,
                timing_budget=0.01 if quick else 0.3, training=kind,
                steps=steps if steps is not None else run.steps,
                autocast=None if amp is None else str(amp).removeprefix("torch."))


def run_report(p: Plan, say=print) -> dict:
    """Both measurements; plain data."""
    from . import shakespeare, timing

    report: dict = {"plan": dataclasses.asdict(p), "torch": torch.__version__,
                    "python": platform.python_version(), "machine": platform.machine(),
                    "cpu_count": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if p.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
    say(f"chapter 13: prefill and decode timing on {p.device}")
    result = timing.run(p.device, p.timing_size, budget=p.timing_budget)
    report["timing"] = {"table": timing.format_table(result)}
    say(f"chapter 14: training ({p.training} size, {p.steps} steps) on {p.device}")
    s = dataclasses.replace(training_run.settings(p.training), steps=p.steps)
    train, valid = shakespeare.load()
    out = training_run.run_reference(s, train, valid, device=p.device)
    tokens_per_s = out["tokens"] / out["seconds"]
    per_token = training_run.train_flops_per_token(out["cfg"], s.context_len)
    peak = training_run.matmul_peak(p.device)
    report["training"] = {
        "config": str(out["cfg"]), "steps": s.steps, "tokens": out["tokens"],
        "seconds": out["seconds"], "tokens_per_s": tokens_per_s,
        "first_loss": out["losses"][0], "last_loss": out["losses"][-1],
        "final_val": out["final_val"], "train_flops_per_token": per_token,
        "achieved_flop_per_s": per_token * tokens_per_s, "matmul_peak_fp32": peak,
        "mfu_vs_fp32_peak": per_token * tokens_per_s / peak}
    say(f"chapter 16: speculative decoding on SmolLM2 on {p.device}")
    report["speculative"] = _speculative(p, say)
    return report


def _speculative(p: Plan, say) -> dict:
    """Chapter 16's table (the benchmark's section `speculative`) on this device; the quick
    plan's smallest run with --quick. Skipped with a note when the model is not installed."""
    from . import speculation

    return speculation.run_smollm(quick=p.training == "grading", device=p.device, say=say)


def format_report(report: dict) -> str:
    """The report as Markdown."""
    t = report["training"]
    p = report["plan"]
    return "\n".join([
        f"# GPU check: {report.get('gpu', p['device'])}",
        "",
        f"torch {report['torch']}, Python {report['python']}, {report['cpu_count']} CPU cores; "
        f"started {report['started']}",
        "",
        "## Chapter 13: prefill and decode",
        "",
        "```", report["timing"]["table"], "```",
        "",
        "## Chapter 14: training on Shakespeare",
        "",
        f"| | |\n|---|---|\n| model | {t['config']} |\n| steps | {t['steps']} "
        f"({t['tokens']:,} tokens), autocast {p['autocast'] or 'none'} |\n"
        f"| time | {t['seconds']:.1f} s, {t['tokens_per_s']:,.0f} tokens/s |\n"
        f"| loss | {t['first_loss']:.3f} -> {t['last_loss']:.3f} (train); validation "
        f"{t['final_val']:.3f} nats per byte |\n"
        f"| FLOPs | {t['train_flops_per_token'] / 1e6:.1f} M per token; "
        f"{t['achieved_flop_per_s'] / 1e12:.2f} TFLOP/s achieved |\n"
        f"| MFU | {100 * t['mfu_vs_fp32_peak']:.1f} % of the measured fp32 matmul peak "
        f"({t['matmul_peak_fp32'] / 1e12:.1f} TFLOP/s) |",
        ""] + _speculative_lines(report.get("speculative")))


def _speculative_lines(section: dict | None) -> list[str]:
    from . import speculation

    if not section:
        return []
    return ["## Chapter 16: speculative decoding", "", "```",
            *speculation.format_section(section), "```", ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "mps", "cpu"], default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out", default="gpu-report.md")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = args.device or training_run.choose_device()
    report = run_report(plan(device, quick=args.quick, steps=args.steps))
    text = format_report(report)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
    print(text)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
