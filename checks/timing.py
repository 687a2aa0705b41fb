"""Prefill vs decode, timed: FLOPs and bytes from the config, measured against the device's peaks.

    python -m checks.timing [--json FILE] [--device cpu|cuda] [--size tiny|small|7b]
                            [--model random|smollm] [--budget SECONDS] [--figure PNG]

prints a table and (with --json) writes every number. On a CUDA GPU the default is LLaMA-2-7B's
shapes in bf16 (all 32 layers, random weights); on a CPU a scaled-down configuration in fp32,
labelled as such, that finishes in seconds. `--model smollm` times the course's real model,
SmolLM2-135M-Instruct (`checks.smollm`), instead: fp32 on a CPU, bf16 on a GPU (`--size tiny`:
the smallest run, one prefill and one decode point). Chapter 13's notebook calls the same functions.

What is measured, and how:
- The device's peaks, by the device itself: FLOP/s of one large square matmul, and bytes/s of one
  large device-to-device copy (each byte read once and written once); the fastest repeat counts.
- Prefill: one forward call over B prompts of P tokens at start_pos 0, filling the KV cache
  (LM head on the last position only, as generation needs): tokens/s and achieved FLOP/s.
- Decode: one forward call with one new token per sequence at position C, reading a cache that
  already holds C positions (filled with random numbers: the cost does not depend on them):
  latency per step, tokens/s (B per step) and achieved bytes/s (weights + KV read per step).
- Timing: warm-up calls first, then repeats, each bracketed by a device synchronisation
  (`torch.cuda.synchronize()` on CUDA: kernels run asynchronously, so a clock read without it
  would time the kernel launches only); the median of the repeats is reported for prefill and
  decode. The repeats are a fixed number (the plan's, or `--repeats`), or, with `--budget`, as
  many as fit in that many seconds per point (`checks.context.time_budget`, at least 3): a busy
  machine then costs precision, not time. Every row records its number of repeats.
The model is the course's reference (`checks.reference.generation`) under `torch.inference_mode`.
The FLOP and byte counts are those of chapter 13's exercises (`prefill_flops`, `decode_step_bytes`;
the reference writes them per operation, this module per token, and the tests compare the two).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from . import context
from .config import LLAMA2_7B, ModelConfig
from .reference import generation as gen

# --------------------------------------------------------------------------------------------
# The arithmetic, from the config (a multiply-add counts as 2 FLOPs)


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that every token multiplies: per layer W_qkv, W_O and the three FFN matrices, plus
    the LM head. (The embedding table is a lookup, not a product; the norms are tiny.)"""
    h, d = cfg.hidden_size, cfg.head_dim
    attention = h * (cfg.n_heads + 2 * cfg.n_kv_heads) * d + cfg.n_heads * d * h
    ffn = 3 * h * cfg.ffn_hidden_size
    return cfg.n_layers * (attention + ffn) + h * cfg.vocab_size


def weight_bytes(cfg: ModelConfig, bytes_per_param: int) -> int:
    """Bytes of weights one forward call reads: every matrix once, and the norm scales."""
    norms = (2 * cfg.n_layers + 1) * cfg.hidden_size
    return (matmul_params(cfg) + norms) * bytes_per_param


def kv_bytes(cfg: ModelConfig, batch: int, positions: int, bytes_per_elem: int) -> int:
    """K and V of `positions` tokens in every layer: 2 L B S N_kv D_h s (chapter 06)."""
    return 2 * cfg.n_layers * batch * positions * cfg.n_kv_heads * cfg.head_dim * bytes_per_elem


def attention_flops(cfg: ModelConfig, batch: int, new_tokens: int, cached: int) -> int:
    """Q K^T and the weighted sum of V for `new_tokens` queries after `cached` positions, causal:
    query i sees cached + i + 1 keys; each (query, key) pair costs 2 D_h FLOPs twice, per head."""
    pairs = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    return cfg.n_layers * batch * cfg.n_heads * 4 * cfg.head_dim * pairs


def prefill_flops(cfg: ModelConfig, batch: int, prompt_len: int) -> int:
    """The whole prompt through every matrix (the LM head for the last position only)."""
    lm_head = cfg.hidden_size * cfg.vocab_size
    per_token = 2 * (matmul_params(cfg) - lm_head)
    return (batch * prompt_len * per_token + batch * 2 * lm_head
            + attention_flops(cfg, batch, prompt_len, 0))


def prefill_bytes(cfg: ModelConfig, batch: int, prompt_len: int, bytes_per_elem: int) -> int:
    """Weights read once, K and V written for every prompt token (activations left out)."""
    return weight_bytes(cfg, bytes_per_elem) + kv_bytes(cfg, batch, prompt_len, bytes_per_elem)


def decode_flops(cfg: ModelConfig, batch: int, context_len: int) -> int:
    """One new token per sequence, attending to `context_len` cached positions and itself."""
    return batch * 2 * matmul_params(cfg) + attention_flops(cfg, batch, 1, context_len)


def decode_bytes(cfg: ModelConfig, batch: int, context_len: int, bytes_per_elem: int) -> int:
    """Every weight read once, the whole cache read, the new token's K and V written."""
    return (weight_bytes(cfg, bytes_per_elem)
            + kv_bytes(cfg, batch, context_len + 1, bytes_per_elem))


# --------------------------------------------------------------------------------------------
# Timing


def synchronize(device: torch.device) -> None:
    """Wait until the device has finished everything queued (CUDA runs kernels asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_it(fn, device: torch.device, *, warmup: int, repeats: int) -> list[float]:
    """Seconds per call of fn(): `warmup` untimed calls, then `repeats` timed ones."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


@dataclass(frozen=True)
class Measured:
    """Seconds per call: the median and the fastest of `repeats` timed calls; `times` lists them
    all when the number of repeats was fixed (None when a time budget decided it)."""

    median: float
    fastest: float
    repeats: int
    times: list[float] | None


def measure(fn, device: torch.device, *, warmup: int, repeats: int,
            budget: float | None = None) -> Measured:
    """Time fn(): `repeats` timed calls after `warmup` untimed ones, or, with a `budget` in
    seconds, as many as fit in it (`checks.context.time_budget`: warm-up first, at least 3)."""
    if budget is None:
        times = time_it(fn, device, warmup=warmup, repeats=repeats)
        return Measured(statistics.median(times), min(times), len(times), times)
    timed = context.time_budget(fn, budget=budget, warmup=max(warmup, 1),
                                sync=lambda: synchronize(device))
    return Measured(timed.median, timed.fastest, timed.repeats, None)


def measure_peak_flops(device: torch.device, dtype: torch.dtype, n: int, *, warmup: int = 2,
                       repeats: int = 5, budget: float | None = None) -> float:
    """FLOP/s of an n x n by n x n matmul (2 n^3 FLOPs), from the fastest repeat (a peak is a
    best case; the workloads below report medians)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    timed = measure(lambda: torch.matmul(a, b, out=out), device, warmup=warmup, repeats=repeats,
                    budget=budget)
    return 2 * n**3 / timed.fastest


def measure_peak_bandwidth(device: torch.device, nbytes: int, *, warmup: int = 2,
                           repeats: int = 5, budget: float | None = None) -> float:
    """Bytes/s of a device-to-device copy: each byte read once and written once (2 * nbytes),
    from the fastest repeat."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    timed = measure(lambda: dst.copy_(src), device, warmup=warmup, repeats=repeats,
                    budget=budget)
    return 2 * nbytes / timed.fastest


def random_params(cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                  seed: int = 0) -> dict:
    """Random weights in the course's layout, drawn directly on the device (values do not matter
    for timing; N(0, 0.02^2) keeps the activations finite)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, d, h_ff = cfg.hidden_size, cfg.head_dim, cfg.ffn_hidden_size

    def w(*shape):
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=g)

    def ones(n):
        return torch.ones(n, dtype=dtype, device=device)

    layers = [{"attn_norm": ones(h), "wqkv": w(h, (cfg.n_heads + 2 * cfg.n_kv_heads) * d),
               "wo": w(cfg.n_heads * d, h), "ffn_norm": ones(h), "w_gate": w(h, h_ff),
               "w_up": w(h, h_ff), "w_down": w(h_ff, h)} for _ in range(cfg.n_layers)]
    return {"embed": w(cfg.vocab_size, h), "layers": layers, "final_norm": ones(h),
            "lm_head": w(h, cfg.vocab_size)}


def _row(batch, length, timed: Measured, flops, nbytes, tokens) -> dict:
    seconds = timed.median
    return {"batch": batch, "length": length, "seconds": seconds, "repeats": timed.repeats,
            "fastest": timed.fastest, **({"times": timed.times} if timed.times else {}),
            "tokens_per_s": tokens / seconds, "flops": flops, "bytes": nbytes,
            "intensity": flops / nbytes, "flop_per_s": flops / seconds,
            "bytes_per_s": nbytes / seconds}


def time_prefill(params: dict, cfg: ModelConfig, batch: int, prompt_len: int, *,
                 dtype: torch.dtype, device: torch.device, warmup: int, repeats: int,
                 budget: float | None = None) -> dict:
    """One prefill call of B prompts of P tokens, timed."""
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=device)
    cache = gen.KVCache(cfg, batch, prompt_len, dtype=dtype, device=device)

    def call():
        gen.forward_with_cache(ids, params, cfg, cache, 0, last_only=True)

    timed = measure(call, device, warmup=warmup, repeats=repeats, budget=budget)
    s = torch.finfo(dtype).bits // 8
    return _row(batch, prompt_len, timed,
                prefill_flops(cfg, batch, prompt_len), prefill_bytes(cfg, batch, prompt_len, s),
                batch * prompt_len)


def time_decode(params: dict, cfg: ModelConfig, batch: int, context_len: int, *,
                dtype: torch.dtype, device: torch.device, warmup: int, repeats: int,
                budget: float | None = None) -> dict:
    """One decode step (one new token per sequence at position C after C cached), timed. Every
    repeat is the same step: it writes the same slot C and reads the same C + 1 positions."""
    cache = gen.KVCache(cfg, batch, context_len + 1, dtype=dtype, device=device)
    cache.storage.normal_()                     # a filled cache; the values do not matter
    token = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)

    def call():
        gen.forward_with_cache(token, params, cfg, cache, context_len)

    timed = measure(call, device, warmup=warmup, repeats=repeats, budget=budget)
    s = torch.finfo(dtype).bits // 8
    row = _row(batch, context_len, timed,
               decode_flops(cfg, batch, context_len),
               decode_bytes(cfg, batch, context_len, s), batch)
    row["ms_per_step"] = 1000 * row["seconds"]
    return row


# --------------------------------------------------------------------------------------------
# What to run where


@dataclass(frozen=True)
class Plan:
    label: str
    cfg: ModelConfig
    dtype: torch.dtype
    prefill: tuple[tuple[int, int], ...]   # (batch, prompt length)
    decode: tuple[tuple[int, int], ...]    # (batch, cached positions)
    matmul_n: int                          # size of the peak-FLOP/s matmul
    copy_bytes: int                        # size of the peak-bandwidth copy
    warmup: int = 2
    repeats: int = 5


MiB = 2**20
SIZES = {
    "tiny": Plan(
        "tiny scaled-down config (H=64, L=2, |V|=512), fp32: a demonstration, not a benchmark",
        ModelConfig(vocab_size=512, hidden_size=64, n_heads=4, n_kv_heads=2, ffn_hidden_size=176,
                    n_layers=2, max_seq_len=512),
        torch.float32, prefill=((1, 8), (1, 32), (1, 128), (4, 128)),
        decode=((1, 32), (4, 32), (16, 32), (64, 32)), matmul_n=384, copy_bytes=32 * MiB,
        warmup=1, repeats=5),
    "small": Plan(
        "scaled-down LLaMA shape (H=256, L=4, N_h=8, N_kv=2, |V|=4096), fp32",
        ModelConfig(vocab_size=4096, hidden_size=256, n_heads=8, n_kv_heads=2,
                    ffn_hidden_size=688, n_layers=4, max_seq_len=1024),
        torch.float32, prefill=((1, 16), (1, 64), (1, 256), (4, 128)),
        decode=((1, 128), (8, 128), (32, 128), (128, 128)), matmul_n=1024,
        copy_bytes=128 * MiB, warmup=1, repeats=5),
    "7b": Plan(
        "LLaMA-2-7B shapes (all 32 layers, random weights), bf16",
        LLAMA2_7B, torch.bfloat16,
        prefill=((1, 128), (1, 512), (1, 1024), (1, 2048), (4, 2048)),
        decode=((1, 512), (8, 512), (32, 512), (128, 512), (1, 2048), (32, 2048)),
        matmul_n=8192, copy_bytes=2048 * MiB),
}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    n = torch.get_num_threads()
    return f"{platform.processor() or platform.machine()} CPU, {n} thread{'s' if n > 1 else ''}"


# The real model: SmolLM2-135M-Instruct's weights (checks.smollm), CPU fp32 or GPU bf16.
SMOLLM_POINTS = {
    "cpu": dict(prefill=((1, 16), (1, 64), (1, 256), (4, 64)),
                decode=((1, 64), (1, 256), (4, 256), (16, 256)), matmul_n=1024,
                copy_bytes=128 * MiB),
    "cuda": dict(prefill=((1, 128), (1, 512), (1, 2048), (8, 2048)),
                 decode=((1, 512), (8, 512), (64, 512), (256, 512), (1, 2048)), matmul_n=8192,
                 copy_bytes=2048 * MiB),
    "tiny": dict(prefill=((1, 8),), decode=((1, 8),), matmul_n=256, copy_bytes=8 * MiB),
}


def smollm_plan(device: torch.device, size: str | None = None) -> tuple[Plan, dict]:
    """The plan and the weights for the real model on `device` (size "tiny": the smallest run).
    Raises checks.smollm.ModelUnavailable when its package is missing."""
    from . import smollm

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    params, cfg = smollm.load(dtype=dtype, device=device)
    points = SMOLLM_POINTS["tiny" if size == "tiny" else device.type]
    label = (f"SmolLM2-135M-Instruct, its real weights (H={cfg.hidden_size}, L={cfg.n_layers}, "
             f"N_h={cfg.n_heads}, N_kv={cfg.n_kv_heads}, |V|={cfg.vocab_size}, tied LM head), "
             f"{str(dtype).removeprefix('torch.')}")
    return Plan(label, cfg, dtype, warmup=1, repeats=3, **points), params


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    n = torch.get_num_threads()
    return f"{platform.processor() or platform.machine()} CPU, {n} thread{'s' if n > 1 else ''}"


def run(device: str | torch.device | None = None, size: str | None = None, *,
        repeats: int | None = None, budget: float | None = None, model: str = "random",
        progress=None) -> dict:
    """Measure the peaks, then prefill and decode for the plan `size` on `device` (defaults:
    CUDA if available, with the 7b plan; else the CPU with the small plan). Returns plain data.

    `budget`: seconds per measured point (as many repeats as fit, at least 3) instead of a fixed
    number of repeats. `model="smollm"`: the real model's weights and shapes (`size` "tiny" or
    None); raises checks.smollm.ModelUnavailable when its package is missing."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if model == "smollm":
        plan, params = smollm_plan(device, size)
        size = f"smollm{'-tiny' if size == 'tiny' else ''}"
    elif model == "random":
        size = size or ("7b" if device.type == "cuda" else "small")
        plan, params = SIZES[size], None
    else:
        raise ValueError(f"model {model!r}: expected 'random' or 'smollm'")
    reps = plan.repeats if repeats is None else repeats
    warm = min(plan.warmup, reps) if budget is None else max(plan.warmup, 1)
    say = progress or (lambda text: None)
    timing = dict(dtype=plan.dtype, device=device, warmup=warm, repeats=reps, budget=budget)
    started = time.perf_counter()
    with torch.inference_mode():
        say("measuring the peaks")
        peak_flops = measure_peak_flops(device, plan.dtype, plan.matmul_n, warmup=warm,
                                        repeats=reps, budget=budget)
        peak_bw = measure_peak_bandwidth(device, plan.copy_bytes, warmup=warm, repeats=reps,
                                         budget=budget)
        if params is None:
            params = random_params(plan.cfg, plan.dtype, device)
        prefill = []
        for batch, prompt_len in plan.prefill:
            say(f"prefill B={batch} P={prompt_len}")
            prefill.append(time_prefill(params, plan.cfg, batch, prompt_len, **timing))
        decode = []
        for batch, context_len in plan.decode:
            say(f"decode B={batch} C={context_len}")
            decode.append(time_decode(params, plan.cfg, batch, context_len, **timing))
        del params
    cfg = plan.cfg
    return {
        "size": size, "model": model,
        "label": plan.label,
        "device": device.type, "device_name": _device_name(device),
        "torch": torch.__version__, "dtype": str(plan.dtype).removeprefix("torch."),
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "weight_bytes": weight_bytes(cfg, torch.finfo(plan.dtype).bits // 8),
        "peaks": {"flop_per_s": peak_flops, "bytes_per_s": peak_bw,
                  "ridge_flop_per_byte": peak_flops / peak_bw, "matmul_n": plan.matmul_n,
                  "copy_bytes": plan.copy_bytes},
        "timing": {"warmup": warm, "repeats": None if budget is not None else reps,
                   "budget_s": budget, "statistic": "median"},
        "prefill": prefill, "decode": decode,
        "seconds_total": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------------------------
# Showing the results


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _how_timed(result: dict) -> str:
    t = result["timing"]
    if t.get("budget_s") is not None:
        return (f"median of as many repeats as fit in {t['budget_s']:g} s per point (column n) "
                f"after {t['warmup']} warm-up")
    return f"median of {t['repeats']} repeats after {t['warmup']} warm-up"


def format_table(result: dict) -> str:
    peaks = result["peaks"]
    lines = [
        f"{result['label']}",
        f"device: {result['device_name']} (torch {result['torch']}), {result['dtype']}; "
        f"{_how_timed(result)} (peaks: the fastest repeat)",
        f"peaks measured here: matmul {_si(peaks['flop_per_s'], 'FLOP/s')} "
        f"(n={peaks['matmul_n']}), copy {_si(peaks['bytes_per_s'], 'B/s')} "
        f"({peaks['copy_bytes'] // MiB} MiB); ridge point {peaks['ridge_flop_per_byte']:.1f} "
        "FLOP/byte",
        "",
        f"{'prefill':<8}{'B':>5}{'P':>6}{'ms':>10}{'n':>5}{'tokens/s':>12}{'FLOP/s':>13}"
        f"{'% peak':>8}{'FLOP/byte':>11}",
    ]
    for r in result["prefill"]:
        lines.append(f"{'':<8}{r['batch']:>5}{r['length']:>6}{1000 * r['seconds']:>10.3f}"
                     f"{r.get('repeats', len(r.get('times', []))):>5}"
                     f"{r['tokens_per_s']:>12.4g}{_si(r['flop_per_s'], ''):>13}"
                     f"{100 * r['flop_per_s'] / peaks['flop_per_s']:>7.1f}%"
                     f"{r['intensity']:>11.1f}")
    lines += ["", f"{'decode':<8}{'B':>5}{'C':>6}{'ms/step':>10}{'n':>5}{'tokens/s':>12}"
              f"{'bytes/s':>13}{'% peak':>8}{'FLOP/byte':>11}"]
    for r in result["decode"]:
        lines.append(f"{'':<8}{r['batch']:>5}{r['length']:>6}{r['ms_per_step']:>10.3f}"
                     f"{r.get('repeats', len(r.get('times', []))):>5}"
                     f"{r['tokens_per_s']:>12.4g}{_si(r['bytes_per_s'], 'B/s'):>13}"
                     f"{100 * r['bytes_per_s'] / peaks['bytes_per_s']:>7.1f}%"
                     f"{r['intensity']:>11.1f}")
    lines += ["", "P: prompt tokens; C: positions already cached; n: timed repeats; % peak: of "
              "the matmul FLOP/s (prefill) and of the copy bandwidth (decode); FLOP/byte: "
              "arithmetic intensity from the config (bytes: weights + KV cache traffic)."]
    return "\n".join(lines)


def _place_labels(ax, points: list[tuple[float, float, str, str]], avoid=()) -> None:
    """Label each point (x, y, text, color) next to it without overlapping another label, a
    marker, the legend or the extra artists in `avoid`: each label takes the first of a few
    positions around its point that collides with nothing placed so far (else the least
    crowded one)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    taken = [a.get_window_extent(renderer).expanded(1.05, 1.1) for a in avoid if a is not None]
    for x, y, _, _ in points:                       # the markers themselves
        cx, cy = ax.transData.transform((x, y))
        taken.append(_box(cx - 5, cy - 5, cx + 5, cy + 5))
    inside = ax.get_window_extent(renderer)
    offsets = [(6, 4), (6, -11), (-6, 4), (-6, -11), (6, 12), (-6, 12), (6, -19), (-6, -19),
               (16, -4), (-16, -4)]
    for x, y, text, color in points:
        best, best_hits = None, None
        for dx, dy in offsets:
            label = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                                fontsize=7, color=color, ha="left" if dx > 0 else "right")
            box = label.get_window_extent(renderer)
            hits = sum(box.overlaps(other) for other in taken) + \
                (0 if inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1) else 2)
            if best_hits is None or hits < best_hits:
                if best is not None:
                    best.remove()
                best, best_hits = label, hits
            else:
                label.remove()
            if hits == 0:
                break
        taken.append(best.get_window_extent(renderer).expanded(1.05, 1.15))


def _box(x0, y0, x1, y1):
    from matplotlib.transforms import Bbox

    return Bbox([[x0, y0], [x1, y1]])


def plot_roofline(result: dict, ax=None):
    """The roofline min(peak FLOP/s, intensity x peak bytes/s) with the measured points, each
    labelled where no other label, marker or the legend (outside the plot, below it) sits."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5.2))
    peaks = result["peaks"]
    pf, bw, ridge = peaks["flop_per_s"], peaks["bytes_per_s"], peaks["ridge_flop_per_byte"]
    points = result["prefill"] + result["decode"]
    lo = min([r["intensity"] for r in points] + [ridge]) / 4
    hi = max([r["intensity"] for r in points] + [ridge]) * 4
    x = np.geomspace(lo, hi, 200)
    ax.loglog(x, np.minimum(pf, x * bw), color="black", linewidth=1.5,
              label=f"roof: {_si(bw, 'B/s')} x intensity, capped at {_si(pf, 'FLOP/s')}")
    ax.axvline(ridge, color="gray", linestyle=":", linewidth=1)
    low = min([r["flop_per_s"] for r in points] + [lo * bw]) / 3
    ax.set_ylim(low, pf * 3)
    ax.set_xlim(lo, hi)
    ridge_text = ax.annotate(f"ridge {ridge:.0f} FLOP/byte", (ridge, pf),
                             textcoords="offset points", xytext=(4, 6), fontsize=8, color="gray")
    labels = []
    for rows, marker, color, name, key in ((result["prefill"], "o", "tab:blue", "prefill", "P"),
                                           (result["decode"], "s", "tab:orange", "decode", "C")):
        ax.scatter([r["intensity"] for r in rows], [r["flop_per_s"] for r in rows],
                   marker=marker, color=color, label=name, zorder=3)
        labels += [(r["intensity"], r["flop_per_s"], f"B={r['batch']} {key}={r['length']}", color)
                   for r in rows]
    ax.set_xlabel("arithmetic intensity (FLOP per byte of weights and KV cache)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"{result['label']}\n{result['device_name']}", fontsize=9)
    legend = ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3,
                       frameon=False)
    ax.figure.tight_layout()
    _place_labels(ax, labels, avoid=(legend, ridge_text))
    return ax


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.timing",
        description="Time prefill and decode of the course's reference model against this "
                    "device's measured peaks; print a table, optionally write JSON and a figure.")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="default: cuda when available, else cpu")
    parser.add_argument("--size", choices=list(SIZES),
                        help="random weights: default 7b on cuda, small on cpu; with --model "
                             "smollm only tiny (the smallest run) is accepted")
    parser.add_argument("--model", choices=["random", "smollm"], default="random",
                        help="random weights in the shape of --size (default), or the real "
                             "SmolLM2-135M-Instruct (needs its package: see checks.smollm)")
    parser.add_argument("--repeats", type=int, help="timed repeats per point (default: the plan's)")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="time each point for this many seconds instead of a fixed number "
                             "of repeats (at least 3 repeats)")
    parser.add_argument("--json", metavar="FILE", help="write every number to FILE")
    parser.add_argument("--figure", metavar="PNG", help="save the roofline figure to PNG")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.budget is not None and args.budget <= 0:
        parser.error("--budget must be a positive number of seconds")
    if args.budget is not None and args.repeats is not None:
        parser.error("--budget and --repeats exclude each other")
    if args.model == "smollm" and args.size not in (None, "tiny"):
        parser.error("--model smollm has its own shapes: --size tiny (the smallest run) or none")
    try:
        result = run(args.device, args.size, repeats=args.repeats, budget=args.budget,
                     model=args.model,
                     progress=lambda text: print(f"... {text}", file=sys.stderr, flush=True))
    except Exception as exc:            # the model's package missing, or its file damaged
        if type(exc).__name__ in ("ModelUnavailable", "ModelFileError"):
            parser.exit(2, f"python -m checks.timing: {exc}\n")
        raise
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"\nwrote {args.json}")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ax = plot_roofline(result)
        ax.figure.savefig(args.figure, dpi=120)
        plt.close(ax.figure)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
