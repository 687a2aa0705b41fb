"""The benchmark command, run once at its tiny size to prove that it works.

Not a benchmark: nothing here asserts a speed. It asserts that every section ran and wrote its
numbers, and the correctness facts the benchmark reports: the same greedy tokens from the
reference and Hugging Face (when `transformers` is installed), with and without the cache, and
from every variant of the decode path; the notebook executed and the submission graded in full,
quiet and with a CPU hog alongside; the class graded in full, the same with one job and with two.
And that its numbers agree with each other whatever the machine's load: every rate and ratio is
the one its times give, the bytes per decode step are those the configuration gives (counted
here), an estimate lies between the times it was drawn from, a notebook's parts add up to its
total, the hogs used no more CPU than they had time. The only bounds on a measured number (the
bandwidth, the MFU, the training ratio) are orders of magnitude wide.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from checks.tools import benchmark

from .test_benchmark_training import check_training


def _approx(value):
    """Two numbers the benchmark derives from the same measurements: equal but for rounding."""
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def _step_bytes(cfg, positions: int) -> int:
    """What one float32 decode step must read, counted here from the configuration (not with
    checks.reference.roofline): every matrix and norm scale of the layers, the final norm and the
    LM head once (the embedding gives one row), and K and V of `positions` tokens in each layer."""
    h, d = cfg.hidden_size, cfg.head_dim
    layer = (h * (cfg.n_heads + 2 * cfg.n_kv_heads) * d + cfg.n_heads * d * h
             + 3 * h * cfg.ffn_hidden_size + 2 * h)
    weights = cfg.n_layers * layer + h + h * cfg.vocab_size
    return 4 * (weights + cfg.n_layers * 2 * cfg.n_kv_heads * d * positions)


def _check_generation_rows(rows, lengths, repeats, prompt_len, cfg, bandwidth, *, hf: bool):
    """Table (a)'s rows (and (g)'s): every rate is its time's, the ratio is the two rates', and
    the bytes per decode step are the weights plus the cache as it grows."""
    assert [r["new_tokens"] for r in rows] == list(lengths)
    for r in rows:
        n = r["new_tokens"]
        assert r["prompt_len"] == prompt_len and len(r["ours_seconds"]) == repeats
        assert r["ours_tokens_per_s"] == _approx(n / min(r["ours_seconds"]))
        if cfg is not None:   # step s reads the P + s + 1 positions cached by then
            want = sum(_step_bytes(cfg, prompt_len + s + 1) for s in range(n - 1)) / (n - 1)
            assert r["decode_bytes_per_step"] == _approx(want)
        # bytes/s over steps/s: the bytes of one step, whatever the decode time was
        assert r["ours_decode_bytes_per_s"] / r["ours_decode_tokens_per_s"] == _approx(
            r["decode_bytes_per_step"])
        assert r["ours_bandwidth_fraction"] == _approx(r["ours_decode_bytes_per_s"] / bandwidth)
        if hf:
            assert r["identical_tokens"], r["first_difference"]
            assert r["first_difference"] is None and len(r["hf_seconds"]) == repeats
            assert r["hf_tokens_per_s"] == _approx(n / min(r["hf_seconds"]))
            assert r["ratio"] == _approx(r["ours_tokens_per_s"] / r["hf_tokens_per_s"])
            assert r["paired_ratios"] == [_approx(h / o) for o, h in
                                          zip(r["ours_seconds"], r["hf_seconds"])]
            assert r["hf_bandwidth_fraction"] == _approx(r["hf_decode_bytes_per_s"] / bandwidth)
        else:
            assert "ratio" not in r and "hf_seconds" not in r
    sizes = [r["decode_bytes_per_step"] for r in rows]
    assert sizes == sorted(sizes)        # a longer generation reads a longer cache on average


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
                    "(e) under load", "(e) a class of", "(f) the decode path",
                    "training step (grading size"):
        assert heading in done.stdout, heading
    result = json.loads(out.read_text())
    plan = benchmark.QUICK
    hf = "hf_missing" not in result
    assert result["machine"]["torch_threads"] == 1 and result["skipped"] == []

    # Bandwidth: the best sample, and that sample's best way; a sane rate for a memory bus.
    bw = result["bandwidth"]
    samples = bw["samples_bytes_per_s"]
    assert len(samples) == 1 + len(plan.lengths) + len(plan.decode_contexts)
    assert bw["bytes"] == plan.bandwidth_bytes
    assert bw["bytes_per_s"] == max(samples) == bw["ways"][bw["best_way"]] == max(
        bw["ways"].values())
    assert 1e8 < bw["bytes_per_s"] < 1e13, bw      # 0.1 GB/s .. 10 TB/s
    peak = bw["bytes_per_s"]

    _check_generation_rows(result["generate"], plan.lengths, plan.repeats, plan.prompt_len,
                           plan.cfg, peak, hf=hf)

    # No cache: the cached times are (a)'s; the estimate lies between its sampled steps' times.
    cached = {r["new_tokens"]: min(r["ours_seconds"]) for r in result["generate"]}
    rows = result["no_cache"]
    assert [r["new_tokens"] for r in rows] == list(plan.lengths)
    for r in rows:
        n, lengths, steps = r["new_tokens"], r["sampled_lengths"], r["sampled_step_seconds"]
        assert r["cache_seconds"] == cached[n]
        assert lengths == sorted(set(lengths)) and len(steps) == len(lengths)
        assert lengths[0] == plan.prompt_len and lengths[-1] == plan.prompt_len + n - 1
        assert len(lengths) <= plan.no_cache_samples
        assert n * min(steps) * (1 - 1e-9) <= r["no_cache_estimated_seconds"] <= n * max(
            steps) * (1 + 1e-9)
        assert ("no_cache_measured_seconds" in r) == (n <= plan.no_cache_full_max)
        assert r["no_cache_seconds"] == r.get("no_cache_measured_seconds",
                                              r["no_cache_estimated_seconds"])
        assert r["speedup"] == _approx(r["no_cache_seconds"] / r["cache_seconds"])
    measured = [r for r in rows if "no_cache_measured_seconds" in r]
    assert measured and all(r["identical_tokens"] for r in measured)

    # The decode path: every variant's tokens are the reference's; each step time is the fastest
    # round's median; the bytes per step are counted from the configuration.
    dp = result["decode_path"]
    names = [v.name for v in benchmark.VARIANTS]
    assert dp["variants"] == [dataclasses.asdict(v) for v in benchmark.VARIANTS]
    assert list(dp["identical_tokens"]) == names and all(dp["identical_tokens"].values())
    assert [c["context"] for c in dp["contexts"]] == list(plan.decode_contexts)
    for c in dp["contexts"]:
        assert set(c["step_seconds"]) == set(names) | {benchmark.REFERENCE_STEP}
        for name, medians in c["round_medians"].items():
            assert len(medians) == plan.decode_rounds and c["step_seconds"][name] == min(medians)
        assert c["decode_bytes"] == _step_bytes(plan.cfg, c["context"] + 1)
        assert c["reference_bytes_per_s"] == _approx(
            c["decode_bytes"] / c["step_seconds"][benchmark.REFERENCE_STEP])
        assert c["reference_bandwidth_fraction"] == _approx(c["reference_bytes_per_s"] / peak)
    assert set(dp["prefill_seconds"]) == {"every_position", "last_only"}

    timing = result["timing"]
    assert timing["size"] == plan.timing_size and timing["decode"] and timing["prefill"]
    assert timing["peaks"]["ridge_flop_per_byte"] == _approx(
        timing["peaks"]["flop_per_s"] / timing["peaks"]["bytes_per_s"])

    check_training(result["training"], kind="grading", steps=4)
    assert result["training"]["threads"] == 1

    # The notebook and the submission, quiet: its parts add up, every point is scored.
    (nb,) = result["notebooks"]
    assert nb["notebook"].startswith("solutions/01_") and nb["error"] is None
    assert nb["stderr_outputs"] == 0
    assert nb["kernel_start_seconds"] + nb["cells_seconds"] + nb["shutdown_seconds"] == (
        pytest.approx(nb["total_seconds"], abs=1e-6))
    assert all(nb[k] > 0 for k in ("kernel_start_seconds", "cells_seconds", "total_seconds"))
    grading = result["grading"]
    assert grading["returncode"] == 0 and grading["notebooks"] == grading["graded"] == 1
    assert grading["points"] == grading["max_points"] > 0
    assert grading["hogs"] == 0 and grading["hog_cpu_seconds"] == 0
    (chapter,) = grading["per_notebook_seconds"]
    assert chapter.startswith("01_")
    assert 0 < grading["per_notebook_seconds"][chapter] <= grading["seconds"]

    # Under load: the quiet runs are (e)'s, the ratios are the runs' times, and the hogs used
    # no more CPU than they had wall time (one core each, a little start-up aside).
    load = result["load"]
    assert load["hogs"] == plan.load_hogs >= 1
    (row,) = load["notebooks"]
    assert row["quiet"] == nb                           # (e)'s numbers are the quiet runs
    assert row["loaded"]["error"] is None and row["loaded"]["stderr_outputs"] == 0
    assert row["ratio"] == _approx(row["loaded"]["total_seconds"] / row["quiet"]["total_seconds"])
    assert 0 < row["hog_cpu_seconds"] <= load["hogs"] * (row["loaded"]["total_seconds"] + 5)
    assert load["grading"]["quiet"] == grading
    loaded = load["grading"]["loaded"]
    assert loaded["returncode"] == 0 and loaded["points"] == grading["points"]
    assert loaded["hogs"] == plan.load_hogs
    assert 0 < loaded["hog_cpu_seconds"] <= loaded["hogs"] * (loaded["seconds"] + 5)
    assert load["grading"]["ratio"] == _approx(loaded["seconds"] / grading["seconds"])

    school = result["class"]
    assert school["students"] == school["notebooks"] == plan.class_size >= 2
    assert set(school["runs"]) == {"1", "2"}
    for run in school["runs"].values():
        assert run["returncode"] == 0, run["stderr_tail"]
        assert run["points"] == run["max_points"] == plan.class_size * grading["points"]
        assert run["graded"] == plan.class_size
    one, two = school["runs"]["1"], school["runs"]["2"]
    assert school["complete"] and school["same_results"] and school["differences"] == []
    assert school["speedup"] == _approx((two["graded"] / two["seconds"])
                                        / (one["graded"] / one["seconds"]))

    assert "(g) the real model" in done.stdout
    smollm = result["smollm"]
    if "missing" not in smollm:                          # the real model, when it is installed
        rows = smollm["generate"]
        _check_generation_rows(rows, plan.smollm_lengths, plan.repeats, rows[0]["prompt_len"],
                               None, peak, hf=hf)
        # every decode step reads all the weights, and the cache besides
        assert all(r["decode_bytes_per_step"] > smollm["weight_bytes"] for r in rows)


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
