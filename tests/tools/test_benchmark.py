"""The benchmark command, run once at its tiny size to prove that it works.

Not a benchmark: nothing here asserts a speed. It asserts that every section ran and wrote its
numbers, and the correctness facts the benchmark reports: the same greedy tokens from the
reference and Hugging Face (when `transformers` is installed), with and without the cache, and
from every variant of the decode path; the notebook executed and the submission graded in full,
quiet and with a CPU hog alongside; the class graded in full, the same with one job and with two.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from checks.tools import benchmark


@pytest.mark.slow
@pytest.mark.grader_workers
def test_quick_benchmark_runs_every_section(tmp_path):
    out = tmp_path / "benchmark.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # The time limit only stops a hang: a few times what it takes with two CPU hogs alongside.
    done = subprocess.run([sys.executable, "-m", "checks.tools.benchmark", "--quick", "--json",
                           str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for heading in ("memory read bandwidth", "(a) greedy generation", "(b) decode's achieved",
                    "(c) the reference with its KV cache", "(d) chapter 13",
                    "(e) solution notebooks", "(e) python -m checks grade",
                    "(e) under load", "(e) a class of", "(f) the decode path"):
        assert heading in done.stdout, heading
    result = json.loads(out.read_text())
    plan = benchmark.QUICK
    assert result["machine"]["torch_threads"] == 1
    assert result["bandwidth"]["bytes_per_s"] > 0
    assert len(result["bandwidth"]["samples_bytes_per_s"]) == (1 + len(plan.lengths)
                                                            + len(plan.decode_contexts))

    rows = result["generate"]
    assert [r["new_tokens"] for r in rows] == list(plan.lengths)
    for r in rows:
        assert len(r["ours_seconds"]) == plan.repeats and r["ours_tokens_per_s"] > 0
        assert r["ours_bandwidth_fraction"] > 0
        if "hf_missing" not in result:
            assert r["identical_tokens"], r["first_difference"]
            assert r["ratio"] > 0 and r["hf_bandwidth_fraction"] > 0

    rows = result["no_cache"]
    assert [r["new_tokens"] for r in rows] == list(plan.lengths)
    assert all(r["speedup"] > 0 and r["no_cache_estimated_seconds"] > 0 for r in rows)
    measured = [r for r in rows if "no_cache_measured_seconds" in r]
    assert measured and all(r["identical_tokens"] for r in measured)

    dp = result["decode_path"]
    assert all(dp["identical_tokens"].values()) and len(dp["identical_tokens"]) == len(
        benchmark.VARIANTS)
    assert [c["context"] for c in dp["contexts"]] == list(plan.decode_contexts)
    for c in dp["contexts"]:
        assert set(c["step_seconds"]) == {v.name for v in benchmark.VARIANTS} | {
            benchmark.REFERENCE_STEP}
        assert c["reference_bandwidth_fraction"] > 0

    assert result["timing"]["size"] == plan.timing_size and result["timing"]["decode"]

    (nb,) = result["notebooks"]
    assert nb["notebook"].startswith("solutions/01_") and nb["error"] is None
    assert nb["stderr_outputs"] == 0 and nb["kernel_start_seconds"] > 0
    grading = result["grading"]
    assert grading["returncode"] == 0 and grading["notebooks"] == 1
    assert grading["points"] == grading["max_points"] > 0

    load = result["load"]
    assert load["hogs"] == plan.load_hogs >= 1
    (row,) = load["notebooks"]
    assert row["quiet"] == nb                           # (e)'s numbers are the quiet runs
    assert row["loaded"]["error"] is None and row["loaded"]["stderr_outputs"] == 0
    assert row["hog_cpu_seconds"] > 0 and row["ratio"] > 0
    assert load["grading"]["quiet"] == grading and grading["hog_cpu_seconds"] == 0
    loaded = load["grading"]["loaded"]
    assert loaded["returncode"] == 0 and loaded["points"] == grading["points"]
    assert loaded["hogs"] == plan.load_hogs and loaded["hog_cpu_seconds"] > 0

    school = result["class"]
    assert school["students"] == school["notebooks"] == plan.class_size >= 2
    assert set(school["runs"]) == {"1", "2"}
    for run in school["runs"].values():
        assert run["returncode"] == 0, run["stderr_tail"]
        assert run["points"] == run["max_points"] == plan.class_size * grading["points"]
        assert run["graded"] == plan.class_size
    assert school["complete"] and school["same_results"] and school["speedup"] > 0

    assert "(g) the real model" in done.stdout
    if "missing" not in result["smollm"]:                # the real model, when it is installed
        rows = result["smollm"]["generate"]
        assert rows and all(r["identical_tokens"] and r["ratio"] > 0 for r in rows)


def test_quick_plan_fits_its_cache_and_the_variants_end_at_the_reference():
    for plan in (benchmark.QUICK, benchmark.FULL):
        assert plan.prompt_len + max(plan.lengths) <= plan.cfg.max_seq_len
    flags = [f.name for f in dataclasses.fields(benchmark.Variant) if f.name != "name"]
    last = benchmark.VARIANTS[-1]
    assert last == benchmark.Variant(last.name)          # every change turned on
    assert not any(getattr(benchmark.VARIANTS[0], f) for f in flags)
    for before, after in zip(benchmark.VARIANTS, benchmark.VARIANTS[1:]):  # one change a step
        assert sum(getattr(before, f) != getattr(after, f) for f in flags) == 1


@pytest.mark.parametrize("argv, message", [
    (["--skip", "nonsense"], "unknown section"),
    (["--lengths", "0,5"], "not a list of positive lengths"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--students", "0"], "--students must be at least 1"),
])
def test_bad_arguments_are_refused(argv, message):
    done = subprocess.run([sys.executable, "-m", "checks.tools.benchmark", *argv],
                          capture_output=True, text=True, timeout=300)  # stops a hang only
    assert done.returncode == 2 and message in done.stderr
