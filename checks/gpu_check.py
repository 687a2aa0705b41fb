"""`python -m checks.gpu_check`: chapter 13's prefill/decode timing, chapter 14's training run and
chapter 15's serving (eight SmolLM2 chats one after another and together) and chapter 16's
speculative decoding on SmolLM2 on this machine's accelerator (CUDA, else MPS, else the CPU), in
one report.

    python -m checks.gpu_check [--out gpu-report.md] [--json gpu-report.json] [--quick]
                               [--device cuda|mps|cpu] [--steps N] [--notebook | --no-notebook]

What it runs is chosen by plain functions (`plan`), tested on a CPU: on a GPU, chapter 13's
timing at the size `checks.timing` picks for it and chapter 14's "gpu" run (a 10 M-parameter
LLaMA, bf16 autocast where supported) for its steps; on a CPU the "cpu" run; `--quick` the
smallest of each (proves the command works, measures nothing). `make gpu-check` runs it.

On a GPU it also runs chapter 14 itself: the solution notebook, top to bottom in a fresh kernel
(`jupyter nbconvert --execute`), beside copies of the other chapters' solutions, so that the
chapter's own loop, evaluation, samples, save and ablations run on the device with the functions
a learner who solved every chapter has (`--notebook` on a CPU too, `--no-notebook` never; with
`--quick` the notebook runs as a grader runs it, at its smallest sizes). It needs the
repository's `solutions/` folder; without it the report says the chapter was not run.
The serving part needs SmolLM2-135M-Instruct (`checks.smollm`); without it the report says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    notebook: bool = False         # run chapter 14's notebook on the device
    serving_tokens: int = 48       # chapter 15: new tokens at most per chat


def plan(device: str, *, quick: bool = False, steps: int | None = None,
         bf16_supported: bool | None = None, notebook: bool | None = None) -> Plan:
    """The report's choices for `device` ("cuda", "mps" or "cpu"); `notebook` None: chapter
    14's notebook runs on a GPU, not on the CPU."""
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
                autocast=None if amp is None else str(amp).removeprefix("torch."),
                notebook=device != "cpu" if notebook is None else notebook,
                serving_tokens=2 if quick else 48)


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
    if p.notebook:
        say(f"chapter 14: the notebook, top to bottom, on {p.device}")
        report["notebook"] = run_notebook(quick=p.timing_size == "tiny")
    say(f"chapter 15: eight chats served one after another and together on {p.device}")
    report["serving"] = run_serving(p.device, p.serving_tokens)
    say(f"chapter 16: speculative decoding on SmolLM2 on {p.device}")
    report["speculative"] = _speculative(p, say)
    return report


SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"
CHAPTER = "14_training"
NOTEBOOK_TIMEOUT = 1800     # seconds for the whole notebook
CELL_TIMEOUT = 900


def run_notebook(quick: bool = False, solutions: Path = SOLUTIONS) -> dict:
    """Chapter 14's solution notebook executed in a fresh kernel, in a copy of the solutions
    (so that it borrows the solutions of chapters 02-13 as a learner's own); the kernel picks
    the device as a learner's does (CUDA, then MPS, then the CPU). `quick`: as a grader runs it
    (the smallest sizes). Plain data: whether it ran to the end, its seconds, the error's last
    lines, and the lines the run printed about the device and the validation loss."""
    if not (solutions / CHAPTER / f"{CHAPTER}.ipynb").is_file():
        return {"ran": False, "why": f"no {solutions / CHAPTER} (a wheel install has none)"}
    with tempfile.TemporaryDirectory() as workdir:
        course = Path(workdir)
        for folder in solutions.glob("[0-9][0-9]_*"):
            shutil.copytree(folder, course / folder.name,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "*.pt"))
        env = dict(os.environ)
        env.pop("LLAMA_COURSE_GRADING", None)
        env.pop("NBGRADER_EXECUTION", None)
        if quick:
            env["LLAMA_COURSE_GRADING"] = "1"
        folder, out = course / CHAPTER, course / "executed"
        cmd = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
               f"--ExecutePreprocessor.timeout={CELL_TIMEOUT}", "--output-dir", str(out),
               str(folder / f"{CHAPTER}.ipynb")]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT)
            code, log = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            code, log = -1, f"took longer than {NOTEBOOK_TIMEOUT} s"
        seconds = time.monotonic() - start
        printed = _printed(out / f"{CHAPTER}.ipynb") if code == 0 else []
    wanted = ("device:", "validation loss", "Yours:", "Not for training", "steps in")
    return {"ran": True, "ok": code == 0, "seconds": seconds,
            "error": "" if code == 0 else "\n".join(log.strip().splitlines()[-15:]),
            "lines": [line for line in printed if line.startswith(wanted)]}


def _printed(executed: Path) -> list[str]:
    """Every line the executed notebook's cells printed."""
    lines = []
    for cell in json.loads(executed.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            lines += "".join(output.get("text", "")).splitlines()
    return lines


def run_serving(device: str, max_tokens: int) -> dict:
    """Chapter 15's measurement: SmolLM2's eight chats (`checks.reference.serving.CHATS`, each
    with the notebook's limit, capped at `max_tokens`) served with `max_batch=1` and `max_batch=8`
    on `device`, greedy; plain data, or {"missing": why} without the model."""
    from . import smollm
    from .reference import serving

    if not smollm.available():
        return {"missing": str(smollm.ModelUnavailable())}
    params, cfg = smollm.load(device=device)
    tok = smollm.tokenizer()
    prompts = [tok.chat_prompt(q) for q in serving.CHATS]
    limits = [min(n, max_tokens) for n in (12, 40, 48, 24, 32, 36, 28, 44)]
    sync = torch.cuda.synchronize if device == "cuda" else None
    runs = {label: serving.serve_chats(params, cfg, prompts, limits, stop_id=tok.im_end_id,
                                       max_batch=batch, sync=sync)
            for label, batch in (("one after another", 1), ("together", 8))}
    alone, together = runs["one after another"], runs["together"]
    return {"runs": {label: {k: r[k] for k in ("tokens", "seconds", "tokens_per_s", "ttft",
                                                "tpot")} for label, r in runs.items()},
            "ratio": together["tokens_per_s"] / alone["tokens_per_s"],
            "same_tokens": sum(a["tokens"] == b["tokens"]
                               for a, b in zip(alone["results"], together["results"]))}


def format_serving(serving: dict) -> list[str]:
    """The report's chapter 15 section."""
    lines = ["## Chapter 15: eight chats with SmolLM2, one after another and together", ""]
    if "missing" in serving:
        return lines + [f"skipped: {serving['missing']}", ""]
    lines += ["| | tokens | seconds | tokens/s | mean TTFT | mean TPOT |",
              "|---|---|---|---|---|---|"]
    for label, r in serving["runs"].items():
        lines.append(f"| {label} | {r['tokens']} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} "
                     f"| {r['ttft']:.3f} s | {1e3 * r['tpot']:.1f} ms |")
    lines += ["", f"throughput together / one after another: {serving['ratio']:.1f}x; the same "
                  f"tokens both ways: {serving['same_tokens']} of 8", ""]
    return lines


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
        "", *_notebook_section(report.get("notebook"), p["device"]),
        *format_serving(report.get("serving") or {"missing": "not run"}),
        *_speculative_lines(report.get("speculative"))])


def _notebook_section(notebook: dict | None, device: str) -> list[str]:
    if notebook is None:
        return []
    head = [f"## Chapter 14: the notebook on {device}", ""]
    if not notebook["ran"]:
        return head + [f"Not run: {notebook['why']}.", ""]
    if not notebook["ok"]:
        return head + [f"**Failed** after {notebook['seconds']:.0f} s:", "", "```",
                       notebook["error"], "```", ""]
    return head + [f"Ran to the end in {notebook['seconds']:.0f} s.", "", "```",
                   *notebook["lines"], "```", ""]


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
    parser.add_argument("--notebook", action=argparse.BooleanOptionalAction, default=None,
                        help="run chapter 14's notebook on the device (default: on a GPU)")
    parser.add_argument("--out", default="gpu-report.md")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = args.device or training_run.choose_device()
    report = run_report(plan(device, quick=args.quick, steps=args.steps,
                             notebook=args.notebook))
    text = format_report(report)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
    print(text)
    print(f"written: {args.out}")
    notebook = report.get("notebook") or {}
    return 1 if notebook.get("ran") and not notebook.get("ok") else 0


if __name__ == "__main__":
    raise SystemExit(main())
