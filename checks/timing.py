"""Prefill vs decode, timed: FLOPs and bytes from the config, measured against the device's peaks.

    python -m checks.timing [--json FILE] [--device cpu|cuda] [--size tiny|small|7b] [--figure PNG]

prints a table and (with --json) writes every number. On a CUDA GPU the default is LLaMA-2-7B's
shapes in bf16 (all 32 layers, random weights); on a CPU a scaled-down configuration in fp32,
labelled as such, that finishes in seconds. Chapter 13's notebook calls the same functions.

What is measured, and how:
- The device's peaks, by the device itself: FLOP/s of one large square matmul, and bytes/s of one
  large device-to-device copy (each byte read once and written once); the fastest repeat counts.
- Prefill: one forward call over B prompts of P tokens at start_pos 0, filling the KV cache
  (LM head on the last position only, as generation needs): tokens/s and achieved FLOP/s.
- Decode: one forward call with one new token per sequence at position C, reading a cache that
  already holds C positions (filled with random numbers: the cost does not depend on them):
  latency per step, tokens/s (B per step) and achieved bytes/s (weights + KV read per step).
- Timing: warm-up calls first, then several repeats, each bracketed by a device synchronisation
  (`torch.cuda.synchronize()` on CUDA: kernels run asynchronously, so a clock read without it
  would time the kernel launches only); the median of the repeats is reported for prefill and
  decode.
The model is the course's reference (`checks.reference.generation`) under `torch.inference_mode`.
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


def measure_peak_flops(device: torch.device, dtype: torch.dtype, n: int, *, warmup: int = 2,
                       repeats: int = 5) -> float:
    """FLOP/s of an n x n by n x n matmul (2 n^3 FLOPs), from the fastest repeat (a peak is a
    best case; the workloads below report medians)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    times = time_it(lambda: torch.matmul(a, b, out=out), device, warmup=warmup, repeats=repeats)
    return 2 * n**3 / min(times)


def measure_peak_bandwidth(device: torch.device, nbytes: int, *, warmup: int = 2,
                           repeats: int = 5) -> float:
    """Bytes/s of a device-to-device copy: each byte read once and written once (2 * nbytes),
    from the fastest repeat."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    times = time_it(lambda: dst.copy_(src), device, warmup=warmup, repeats=repeats)
    return 2 * nbytes / min(times)


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


def _row(batch, length, seconds, times, flops, nbytes, tokens) -> dict:
    return {"batch": batch, "length": length, "seconds": seconds, "times": times,
            "tokens_per_s": tokens / seconds, "flops": flops, "bytes": nbytes,
            "intensity": flops / nbytes, "flop_per_s": flops / seconds,
            "bytes_per_s": nbytes / seconds}


def time_prefill(params: dict, cfg: ModelConfig, batch: int, prompt_len: int, *,
                 dtype: torch.dtype, device: torch.device, warmup: int, repeats: int) -> dict:
    """One prefill call of B prompts of P tokens, timed."""
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=device)
    cache = gen.KVCache(cfg, batch, prompt_len, dtype=dtype, device=device)

    def call():
        gen.forward_with_cache(ids, params, cfg, cache, 0, last_only=True)

    times = time_it(call, device, warmup=warmup, repeats=repeats)
    s = torch.finfo(dtype).bits // 8
    return _row(batch, prompt_len, statistics.median(times), times,
                prefill_flops(cfg, batch, prompt_len), prefill_bytes(cfg, batch, prompt_len, s),
                batch * prompt_len)


def time_decode(params: dict, cfg: ModelConfig, batch: int, context_len: int, *,
                dtype: torch.dtype, device: torch.device, warmup: int, repeats: int) -> dict:
    """One decode step (one new token per sequence at position C after C cached), timed. Every
    repeat is the same step: it writes the same slot C and reads the same C + 1 positions."""
    cache = gen.KVCache(cfg, batch, context_len + 1, dtype=dtype, device=device)
    cache.storage.normal_()                     # a filled cache; the values do not matter
    token = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)

    def call():
        gen.forward_with_cache(token, params, cfg, cache, context_len)

    times = time_it(call, device, warmup=warmup, repeats=repeats)
    s = torch.finfo(dtype).bits // 8
    row = _row(batch, context_len, statistics.median(times), times,
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


def run(device: str | torch.device | None = None, size: str | None = None, *,
        repeats: int | None = None, progress=None) -> dict:
    """Measure the peaks, then prefill and decode for the plan `size` on `device` (defaults:
    CUDA if available, with the 7b plan; else the CPU with the small plan). Returns plain data."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    plan = SIZES[size or ("7b" if device.type == "cuda" else "small")]
    reps = plan.repeats if repeats is None else repeats
    warm = min(plan.warmup, reps)
    say = progress or (lambda text: None)
    timing = dict(dtype=plan.dtype, device=device, warmup=warm, repeats=reps)
    started = time.perf_counter()
    with torch.inference_mode():
        say("measuring the peaks")
        peak_flops = measure_peak_flops(device, plan.dtype, plan.matmul_n, warmup=warm,
                                        repeats=reps)
        peak_bw = measure_peak_bandwidth(device, plan.copy_bytes, warmup=warm, repeats=reps)
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
        "size": size or ("7b" if device.type == "cuda" else "small"),
        "label": plan.label,
        "device": device.type, "device_name": _device_name(device),
        "torch": torch.__version__, "dtype": str(plan.dtype).removeprefix("torch."),
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "weight_bytes": weight_bytes(cfg, torch.finfo(plan.dtype).bits // 8),
        "peaks": {"flop_per_s": peak_flops, "bytes_per_s": peak_bw,
                  "ridge_flop_per_byte": peak_flops / peak_bw, "matmul_n": plan.matmul_n,
                  "copy_bytes": plan.copy_bytes},
        "timing": {"warmup": warm, "repeats": reps, "statistic": "median"},
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


def format_table(result: dict) -> str:
    peaks = result["peaks"]
    lines = [
        f"{result['label']}",
        f"device: {result['device_name']} (torch {result['torch']}), {result['dtype']}; "
        f"median of {result['timing']['repeats']} repeats after {result['timing']['warmup']} "
        "warm-up (peaks: the fastest repeat)",
        f"peaks measured here: matmul {_si(peaks['flop_per_s'], 'FLOP/s')} "
        f"(n={peaks['matmul_n']}), copy {_si(peaks['bytes_per_s'], 'B/s')} "
        f"({peaks['copy_bytes'] // MiB} MiB); ridge point {peaks['ridge_flop_per_byte']:.1f} "
        "FLOP/byte",
        "",
        f"{'prefill':<8}{'B':>5}{'P':>6}{'ms':>10}{'tokens/s':>12}{'FLOP/s':>13}"
        f"{'% peak':>8}{'FLOP/byte':>11}",
    ]
    for r in result["prefill"]:
        lines.append(f"{'':<8}{r['batch']:>5}{r['length']:>6}{1000 * r['seconds']:>10.3f}"
                     f"{r['tokens_per_s']:>12.4g}{_si(r['flop_per_s'], ''):>13}"
                     f"{100 * r['flop_per_s'] / peaks['flop_per_s']:>7.1f}%"
                     f"{r['intensity']:>11.1f}")
    lines += ["", f"{'decode':<8}{'B':>5}{'C':>6}{'ms/step':>10}{'tokens/s':>12}{'bytes/s':>13}"
              f"{'% peak':>8}{'FLOP/byte':>11}"]
    for r in result["decode"]:
        lines.append(f"{'':<8}{r['batch']:>5}{r['length']:>6}{r['ms_per_step']:>10.3f}"
                     f"{r['tokens_per_s']:>12.4g}{_si(r['bytes_per_s'], 'B/s'):>13}"
                     f"{100 * r['bytes_per_s'] / peaks['bytes_per_s']:>7.1f}%"
                     f"{r['intensity']:>11.1f}")
    lines += ["", "P: prompt tokens; C: positions already cached; % peak: of the matmul FLOP/s "
              "(prefill) and of the copy bandwidth (decode); FLOP/byte: arithmetic intensity "
              "from the config (bytes: weights + KV cache traffic)."]
    return "\n".join(lines)


def plot_roofline(result: dict, ax=None):
    """The roofline min(peak FLOP/s, intensity x peak bytes/s) with the measured points."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    peaks = result["peaks"]
    pf, bw, ridge = peaks["flop_per_s"], peaks["bytes_per_s"], peaks["ridge_flop_per_byte"]
    points = result["prefill"] + result["decode"]
    lo = min([r["intensity"] for r in points] + [ridge]) / 4
    hi = max([r["intensity"] for r in points] + [ridge]) * 4
    x = np.geomspace(lo, hi, 200)
    ax.loglog(x, np.minimum(pf, x * bw), color="black", linewidth=1.5,
              label=f"roof: {_si(bw, 'B/s')} x intensity, capped at {_si(pf, 'FLOP/s')}")
    ax.axvline(ridge, color="gray", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {ridge:.0f}", (ridge, pf), textcoords="offset points", xytext=(4, -12),
                fontsize=8, color="gray")
    for rows, marker, color, name, key in ((result["prefill"], "o", "tab:blue", "prefill", "P"),
                                           (result["decode"], "s", "tab:orange", "decode", "C")):
        ax.scatter([r["intensity"] for r in rows], [r["flop_per_s"] for r in rows],
                   marker=marker, color=color, label=name, zorder=3)
        for r in rows:
            ax.annotate(f"B={r['batch']} {key}={r['length']}", (r["intensity"], r["flop_per_s"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of weights and KV cache)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"{result['label']}\n{result['device_name']}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.timing",
        description="Time prefill and decode of the course's reference model against this "
                    "device's measured peaks; print a table, optionally write JSON and a figure.")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="default: cuda when available, else cpu")
    parser.add_argument("--size", choices=list(SIZES),
                        help="default: 7b on cuda, small on cpu")
    parser.add_argument("--repeats", type=int, help="timed repeats per point (default: the plan's)")
    parser.add_argument("--json", metavar="FILE", help="write every number to FILE")
    parser.add_argument("--figure", metavar="PNG", help="save the roofline figure to PNG")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    result = run(args.device, args.size, repeats=args.repeats,
                 progress=lambda text: print(f"... {text}", file=sys.stderr, flush=True))
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
        ax.figure.tight_layout()
        ax.figure.savefig(args.figure, dpi=120)
        plt.close(ax.figure)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
