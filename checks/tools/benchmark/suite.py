"""Running every section in order and printing their tables: `run` and `format_table`.

The order matters: `generate` hands its cached generation times to `no_cache`; the bandwidth is
sampled during `generate` and `decode_path`, and its best sample is attached to every decode
measurement once they are all done (`smollm`'s included); `load`'s quiet runs are the numbers of
`notebooks` and `grading`, measured once.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, replace

import torch

from .bandwidth import (attach_bandwidth, format_bandwidth, format_decode_bandwidth,
                        measure_read_bandwidth)
from .classroom import format_class, run_class
from .common import FULL, MiB, Plan, benchmark_params
from .decode_path import format_decode_path, run_decode_path
from .generate import format_generate, hf_available, hf_model_if_available, run_generate
from .grading import format_grading, run_grading
from .load import format_load, run_under_load
from .no_cache import format_no_cache, run_no_cache
from .notebooks import format_notebooks, run_notebooks
from .serving import format_serving, run_serving
from .smollm import format_smollm, run_smollm
from .speculative import format_speculative, run_speculative
from .timing import format_timing, run_timing
from .training import format_training, run_training


def run(plan: Plan = FULL, *, skip: tuple[str, ...] = (), progress=None) -> dict:
    """Every section not in `skip`, in one process; every number they measured."""
    say = progress or (lambda text: None)
    started = time.perf_counter()
    result = _start(plan, skip)
    torch.manual_seed(0)
    params = benchmark_params(plan.cfg)
    samples: list[dict] = []
    sample = None
    if "bandwidth" not in skip:
        def sample(repeats: int = 3) -> None:
            samples.append(measure_read_bandwidth(plan.bandwidth_bytes, repeats=repeats))

        say(f"memory read bandwidth ({plan.bandwidth_bytes // MiB} MiB array)")
        sample(repeats=5)
    _model_sections(result, params, plan, skip, say, sample)
    if samples:
        attach_bandwidth(result, samples)
    if "timing" not in skip:
        result["timing"] = run_timing(plan, say)
    if "training" not in skip:  # chapter 14's training step against nn.Module + torch AdamW
        quick = plan.cfg.hidden_size <= 64
        result["training"] = run_training("grading" if quick else "ablation",
                                          4 if quick else 40, say)
    if "speculative" not in skip:   # chapter 16 on the real model
        result["speculative"] = run_speculative(plan, say)
    _course_sections(result, plan, skip, say)
    result["machine"]["load_average_end"] = os.getloadavg()
    result["seconds_total"] = time.perf_counter() - started
    return result


def _start(plan: Plan, skip: tuple[str, ...]) -> dict:
    """The result's head: the plan, the machine, what is skipped."""
    result: dict = {
        "plan": {**asdict(replace(plan, cfg=None)), "cfg": asdict(plan.cfg)},
        "label": plan.label,
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "load_average_start": os.getloadavg()},
        "skipped": list(skip),
    }
    if hf_available():
        from transformers import __version__ as hf_version
        result["machine"]["transformers"] = hf_version
    return result


def _model_sections(result: dict, params: dict, plan: Plan, skip, say, sample) -> None:
    """generate, no_cache, decode_path, smollm: the model's speed (`sample` takes a bandwidth
    sample after each generation length and decode-path context; None when not measured)."""
    cfg = plan.cfg
    cached: dict[int, float] = {}
    if "generate" not in skip:
        model = hf_model_if_available(params, cfg, result, say)
        result["generate"] = run_generate(params, cfg, plan, model, say, after_each=sample)
        cached = {row["new_tokens"]: min(row["ours_seconds"]) for row in result["generate"]}
        del model
    if "no_cache" not in skip:
        result["no_cache"] = run_no_cache(params, cfg, plan, cached, say)
    if "decode_path" not in skip:
        result["decode_path"] = run_decode_path(params, cfg, plan, say, after_each=sample)
    if "smollm" not in skip:   # compared with the best bandwidth sample of the other sections
        result["smollm"] = run_smollm(plan, say)
    if "serving" not in skip:
        result["serving"] = run_serving(plan, say)


def _course_sections(result: dict, plan: Plan, skip, say) -> None:
    """notebooks, grading, load, class: the course's own speed."""
    if "load" in skip:
        if "notebooks" not in skip:
            result["notebooks"] = run_notebooks(plan.notebooks, say)
        if "grading" not in skip:
            result["grading"] = run_grading(plan.notebooks, say)
    else:  # its quiet runs are sections notebooks and grading
        result["load"] = run_under_load(plan.notebooks, say, plan.load_hogs)
        if "notebooks" not in skip:
            result["notebooks"] = [row["quiet"] for row in result["load"]["notebooks"]]
        if "grading" not in skip:
            result["grading"] = result["load"]["grading"]["quiet"]
    if "class" not in skip:
        result["class"] = run_class(plan.notebooks, say, plan.class_size)


# The tables in the order they print; each formatter returns no lines for a skipped section.
FORMATTERS = (format_bandwidth, format_generate, format_decode_bandwidth, format_smollm,
              format_serving, format_no_cache, format_timing, format_notebooks, format_grading,
              format_load, format_class, format_decode_path, format_training, format_speculative)


def format_header(result: dict) -> list[str]:
    m = result["machine"]
    return [f"benchmark: {result['label']}",
            f"machine: {m['cpu']}, {m['cpu_count']} cores, torch {m['torch']} with "
            f"{m['torch_threads']} threads"
            + (f", transformers {m['transformers']}" if "transformers" in m else "")
            + f"; load average {m['load_average_start'][0]:.1f} at the start, "
            f"{m['load_average_end'][0]:.1f} at the end",
            "every ratio: two numbers measured in this process (fastest repeat of each)"]


def format_table(result: dict) -> str:
    lines = format_header(result)
    for formatter in FORMATTERS:
        lines += formatter(result)
    lines += ["", f"total benchmark time: {result['seconds_total']:.0f} s"]
    return "\n".join(lines)
