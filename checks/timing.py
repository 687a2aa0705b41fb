"""Timing, in one place: how the course measures time, and chapter 13's prefill vs decode, timed
(FLOPs and bytes beside the times, against the device's own peaks).

The course's timing helpers live here: `time_repeats` (a fixed number of timed calls) and
`time_budget` (as many as fit in a budget of seconds) both make warm-up calls first, synchronise
the device after every call (`synchronize`) and give the median and the fastest in a `Timing`.
`checks.context.time_budget` is the notebooks' door to it (the budget a learner or a grader gets);
`checks.training_run` measures chapter 14's matmul peak with `measure_peak_flops`; durations are
put in words by `seconds_text`.

    python -m checks.timing [--json FILE] [--device cpu|cuda|mps] [--size tiny|small|7b]
                            [--model random|smollm] [--budget SECONDS] [--figure PNG]

prints a table and (with --json) writes every number. What runs is chosen from the device found
(`describe_device`: kind, name, memory, CUDA compute capability) by plain functions of that
description (`timing_dtype`, `plan_for`, `fit_points`: tested without a GPU in
tests/core/test_devices.py): CUDA, else Apple's MPS, else the CPU; bf16 on GPUs that compute it
fast (capability 8.0 and later), fp16 on older ones (a T4, a V100) and on MPS, fp32 on the CPU;
on a GPU LLaMA-2-7B's shapes with random weights (`--size 7b`), as many of its 32 layers as fit
the free memory (`torch.cuda.mem_get_info`: a 16 GB T4 cannot hold 13.5 GB of weights and a
cache) and the points whose cache and activations fit beside them; on a CPU a scaled-down
configuration in fp32 (`--size small`). Every table says what was chosen and why.
`--model smollm` times the course's real model, SmolLM2-135M-Instruct (`checks.smollm`), on a GPU
in the GPU's dtype (`--size tiny`: one prefill and one decode point). Chapter 13's notebook calls
the same functions.

What is measured, and how:
- The device's peaks, by the device itself: FLOP/s of one large square matmul, and bytes/s of one
  large device-to-device copy (each byte read once and written once); the fastest repeat counts.
  The roofline is drawn from these, so it is that device's roofline.
- Prefill: one forward call over B prompts of P tokens at start_pos 0, filling the KV cache
  (LM head on the last position only, as generation needs): tokens/s and achieved FLOP/s.
- Decode: one forward call with one new token per sequence at position C, reading a cache that
  already holds C positions (filled with random numbers: the cost does not depend on them):
  latency per step, tokens/s (B per step) and achieved bytes/s (weights + KV read per step).
- Timing: warm-up calls first, then repeats, each bracketed by a device synchronisation (GPUs
  run kernels asynchronously: without it a clock would time the launches only); the median
  counts. The repeats are a fixed number (the plan's, or `--repeats`), or, with `--budget`, as
  many as fit in that many seconds per point (`time_budget`, at least 3): a busy machine then
  costs precision, not time. Every row records its number of repeats.
The model is the course's reference (`checks.reference.generation`) under `torch.inference_mode`.
The FLOP and byte counts are chapter 13's exercises, so this module holds none of them: `run`
takes them as arguments (`Counts`; the notebook passes the learner's own), and the command line
uses the course's (`reference_counts`, from `checks.reference.roofline`, which the grader
withholds from a worker grading chapter 13 like every other answer).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import LLAMA2_7B, ModelConfig, block_shapes, model_shapes, param_shapes
from .i18n import _
from .reference import generation as gen
from .reference import roofline

MiB = 2**20

# --------------------------------------------------------------------------------------------
# Measuring time: every wall-clock measurement the course shows goes through these


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a timed function: the median of `repeats` timed calls (what counts)
    and the fastest; `result` is the last call's return value; `times` lists every call's
    seconds (None where a budget decided how many: they can be thousands)."""

    median: float
    repeats: int
    fastest: float
    result: Any = None
    times: list[float] | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        return _("{time} ms (median of {count})").format(time=f"{self.median * 1e3:.3f}",
                                                          count=self.repeats)


def synchronize(device: torch.device | str) -> None:
    """Wait until the device has finished everything queued (GPUs run kernels asynchronously:
    without this a clock would time the launches only). Nothing to wait for on the CPU."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def _timed_calls(fn: Callable[[], Any], *, warmup: int, sync: Callable[[], None] | None,
                 more: Callable[[int, float], bool]) -> Timing:
    """`warmup` untimed calls of fn(), then timed ones while more(calls so far, seconds since
    the first timed call began) says so; `sync` runs after every call, inside the clock."""
    done = sync or (lambda: None)
    result = None
    for _n in range(warmup):
        result = fn()
        done()
    samples: list[float] = []
    began = time.perf_counter()
    while more(len(samples), time.perf_counter() - began):
        start = time.perf_counter()
        result = fn()
        done()
        samples.append(time.perf_counter() - start)
    return Timing(statistics.median(samples), len(samples), min(samples), result, samples)


def time_repeats(fn: Callable[[], Any], *, repeats: int, warmup: int = 1,
                 sync: Callable[[], None] | None = None) -> Timing:
    """Time fn(): `warmup` untimed calls, then exactly `repeats` timed ones (at least 1)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    return _timed_calls(fn, warmup=warmup, sync=sync, more=lambda n, _s: n < repeats)


def time_budget(fn: Callable[[], Any], *, budget: float, warmup: int = 1, min_repeats: int = 3,
                max_repeats: int = 10_000, sync: Callable[[], None] | None = None) -> Timing:
    """Time fn() for about `budget` seconds: `warmup` untimed calls, then timed calls until the
    budget is spent (at least `min_repeats`, at most `max_repeats`); the median counts, so a busy
    machine costs precision, not time. `sync` (for example `torch.cuda.synchronize`) runs after
    every call so that asynchronous devices are timed to completion.

    The notebooks call `checks.context.time_budget`, which picks the budget: a learner's or a
    grader's."""
    return _timed_calls(fn, warmup=warmup, sync=sync,
                        more=lambda n, spent: n < max_repeats and (n < min_repeats
                                                                   or spent < budget))


def measure(fn, device: torch.device | str, *, warmup: int, repeats: int,
            budget: float | None = None) -> Timing:
    """Time fn() on `device` (synchronised after every call): `repeats` timed calls after
    `warmup` untimed ones (`times` lists them), or, with a `budget` in seconds, as many as fit in
    it (`time_budget`: at least one warm-up call, at least 3 repeats; `times` not kept)."""
    def sync():
        synchronize(device)

    if budget is None:
        return time_repeats(fn, repeats=repeats, warmup=warmup, sync=sync)
    timed = time_budget(fn, budget=budget, warmup=max(warmup, 1), sync=sync)
    return dataclasses.replace(timed, times=None)


def seconds_text(seconds: float) -> str:
    """A duration in words: 42 s, 3.5 min, 2.1 h, 4.0 days, 12 years."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    if seconds < 2 * 365 * 86400:
        return f"{seconds / 86400:.0f} days"
    return f"{seconds / (365 * 86400):,.0f} years"


# --------------------------------------------------------------------------------------------
# The counts beside the measurements: chapter 13's answers, passed in


@dataclass(frozen=True)
class Counts:
    """The FLOPs and bytes a timing table puts beside each measured time (a multiply-add is 2
    FLOPs): chapter 13's `prefill_flops(cfg, batch, seq_len)`, a decode step's
    `decode_flops(cfg, batch, context_len)`, and `decode_step_bytes(cfg, batch, context_len,
    bytes_per_elem)`. A prefill of P tokens moves what a decode step after P - 1 cached positions
    moves (every weight once, K and V of P positions), so one byte count serves both."""

    prefill_flops: Callable[..., int]
    decode_flops: Callable[..., int]
    decode_step_bytes: Callable[..., int]

    def prefill_bytes(self, cfg: ModelConfig, batch: int, prompt_len: int,
                      bytes_per_elem: int) -> int:
        return self.decode_step_bytes(cfg, batch, prompt_len - 1, bytes_per_elem)


def reference_counts() -> Counts:
    """The course's own counts (`checks.reference.roofline`), for the command line."""
    return Counts(roofline.prefill_flops, roofline.decode_flops, roofline.decode_bytes)


# --------------------------------------------------------------------------------------------
# The device, described; what to run on it, chosen from that description alone


@dataclass(frozen=True)
class DeviceInfo:
    """What the choices below need to know about a device. Memory in bytes; `free_memory` is
    what this process may still allocate; `capability` is CUDA's compute capability."""

    kind: str                                  # "cuda", "mps" or "cpu"
    name: str
    total_memory: int
    free_memory: int
    capability: tuple[int, int] | None = None
    index: int | None = None                   # which CUDA device (None: the current one)


def default_kind(cuda: bool | None = None, mps: bool | None = None) -> str:
    """"cuda" when a CUDA device is there, else "mps" (Apple silicon), else "cpu". The two flags
    stand in for torch's own answers (for tests)."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if mps is None:
        backend = getattr(torch.backends, "mps", None)
        mps = bool(backend is not None and backend.is_available())
    return "cuda" if cuda else "mps" if mps else "cpu"


def _cpu_name() -> str:
    n = torch.get_num_threads()
    return f"{platform.processor() or platform.machine()} CPU, {n} thread{'s' if n > 1 else ''}"


def _host_memory() -> tuple[int, int]:
    """(total, available) bytes of the machine's memory: Linux's /proc/meminfo; elsewhere the
    page counts, half taken as available (no portable count of free pages); (0, 0) if neither."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)}
        return info["MemTotal"], info.get("MemAvailable", info["MemTotal"])
    except (OSError, KeyError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):        # Windows
            return 0, 0
        return total, total // 2


def describe_device(kind: str | None = None, index: int | None = None) -> DeviceInfo:
    """The device of `kind` ("cuda", "mps", "cpu"; default: `default_kind()`; `index`: which
    CUDA device, default the current one), as found now."""
    kind = kind or default_kind()
    if kind == "cuda":
        index = torch.cuda.current_device() if index is None else index
        free, total = torch.cuda.mem_get_info(index)
        major, minor = torch.cuda.get_device_capability(index)
        return DeviceInfo("cuda", torch.cuda.get_device_name(index), total, free, (major, minor),
                          index)
    if kind == "mps":
        total = torch.mps.recommended_max_memory()    # what Metal lets one process use
        free = max(total - torch.mps.driver_allocated_memory(), 0)
        return DeviceInfo("mps", f"Apple GPU (MPS, {platform.machine()})", total, free)
    if kind != "cpu":
        raise ValueError(f"device {kind!r}: expected 'cuda', 'mps' or 'cpu'")
    total, free = _host_memory()
    return DeviceInfo("cpu", _cpu_name(), total, free)


def torch_device(dev: DeviceInfo) -> torch.device:
    if dev.kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device() if dev.index is None
                            else dev.index)
    return torch.device(dev.kind)


def timing_dtype(dev: DeviceInfo) -> torch.dtype:
    """bf16 where the GPU computes it fast (compute capability 8.0 and later); fp16 on older
    GPUs (a T4 is 7.5: bf16 runs there, emulated, far slower than fp16) and on MPS; fp32 on the
    CPU (whose fp16/bf16 matmuls are slower than fp32 on most CPUs)."""
    if dev.kind == "cuda":
        return torch.bfloat16 if (dev.capability or (0, 0)) >= (8, 0) else torch.float16
    if dev.kind == "mps":
        return torch.float16
    return torch.float32


def usable_memory(dev: DeviceInfo) -> int:
    """What a plan may fill: 90% of the free memory, less 512 MiB for the allocator's rounding,
    the library workspaces and the peak measurements' buffers."""
    return max(int(dev.free_memory * 0.9) - 512 * MiB, 0)


def params_bytes(params: dict) -> int:
    """Bytes the weights occupy (a tied LM head, a view of the embedding, counted once)."""
    tensors = [v for v in params.values() if isinstance(v, torch.Tensor)]
    tensors += [t for layer in params.get("layers", ()) for t in layer.values()]
    storages = {(t.device.type, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes()
                for t in tensors}
    return sum(storages.values())


def _activation_bytes(cfg: ModelConfig, tokens: int, batch: int) -> int:
    """An upper bound on the working memory of one forward call over `tokens` new tokens: per
    token a few hidden vectors, the fused Q | K | V and its rotated copy (RoPE works in float32),
    SwiGLU's three intermediate vectors, all taken at 4 bytes; plus B rows of float32 logits."""
    per_token = (4 * cfg.hidden_size + 3 * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
                 + 3 * cfg.ffn_hidden_size)
    return 4 * (tokens * per_token + batch * cfg.vocab_size)


def weights_needed(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes `random_params(cfg, dtype, ...)` allocates (from the layout's shapes)."""
    every = [*block_shapes(cfg).values()] * cfg.n_layers + [*model_shapes(cfg).values()]
    return sum(math.prod(shape) for shape in every) * torch.finfo(dtype).bits // 8


def memory_needed(cfg: ModelConfig, dtype: torch.dtype, phase: str, batch: int,
                  length: int) -> int:
    """Bytes one measured point allocates: the weights, its KV cache and its activations (the
    cache made on the "meta" device and counted)."""
    meta = torch.device("meta")
    weights = weights_needed(cfg, dtype)
    positions = length if phase == "prefill" else length + 1
    cache = gen.KVCache(cfg, batch, positions, dtype=dtype, device=meta).nbytes
    tokens = batch * length if phase == "prefill" else batch
    return weights + cache + _activation_bytes(cfg, tokens, batch)


def fit_points(cfg: ModelConfig, dtype: torch.dtype, dev: DeviceInfo, prefill, decode
               ) -> tuple[tuple, tuple]:
    """The (batch, length) points of each phase that fit in `usable_memory(dev)`."""
    room = usable_memory(dev)
    return (tuple(p for p in prefill if memory_needed(cfg, dtype, "prefill", *p) <= room),
            tuple(p for p in decode if memory_needed(cfg, dtype, "decode", *p) <= room))


# --------------------------------------------------------------------------------------------
# The measurements: the device's peaks, prefill and decode


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
    for timing; N(0, 0.02^2) keeps the activations finite; the norm scales are ones)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def make(name, shape):
        if name.endswith("norm"):
            return torch.ones(shape, dtype=dtype, device=device)
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=g)

    shapes = param_shapes(cfg)
    return {**{k: make(k, v) for k, v in shapes.items() if k != "layers"},
            "layers": [{k: make(k, v) for k, v in layer.items()} for layer in shapes["layers"]]}


def _row(batch, length, timed: Timing, flops, nbytes, tokens) -> dict:
    seconds = timed.median
    return {"batch": batch, "length": length, "seconds": seconds, "repeats": timed.repeats,
            "fastest": timed.fastest, **({"times": timed.times} if timed.times else {}),
            "tokens_per_s": tokens / seconds, "flops": flops, "bytes": nbytes,
            "intensity": flops / nbytes, "flop_per_s": flops / seconds,
            "bytes_per_s": nbytes / seconds}


def time_prefill(params: dict, cfg: ModelConfig, batch: int, prompt_len: int, *,
                 counts: Counts, dtype: torch.dtype, device: torch.device, warmup: int,
                 repeats: int, budget: float | None = None) -> dict:
    """One prefill call of B prompts of P tokens, timed; FLOPs and bytes from `counts`."""
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=device)
    cache = gen.KVCache(cfg, batch, prompt_len, dtype=dtype, device=device)

    def call():
        gen.forward_with_cache(ids, params, cfg, cache, 0, last_only=True)

    timed = measure(call, device, warmup=warmup, repeats=repeats, budget=budget)
    s = torch.finfo(dtype).bits // 8
    return _row(batch, prompt_len, timed, counts.prefill_flops(cfg, batch, prompt_len),
                counts.prefill_bytes(cfg, batch, prompt_len, s), batch * prompt_len)


def time_decode(params: dict, cfg: ModelConfig, batch: int, context_len: int, *,
                counts: Counts, dtype: torch.dtype, device: torch.device, warmup: int,
                repeats: int, budget: float | None = None) -> dict:
    """One decode step (one new token per sequence at position C after C cached), timed. Every
    repeat is the same step: it writes the same slot C and reads the same C + 1 positions."""
    cache = gen.KVCache(cfg, batch, context_len + 1, dtype=dtype, device=device)
    cache.storage.normal_()                     # a filled cache; the values do not matter
    token = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)

    def call():
        gen.forward_with_cache(token, params, cfg, cache, context_len)

    timed = measure(call, device, warmup=warmup, repeats=repeats, budget=budget)
    s = torch.finfo(dtype).bits // 8
    row = _row(batch, context_len, timed, counts.decode_flops(cfg, batch, context_len),
               counts.decode_step_bytes(cfg, batch, context_len, s), batch)
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
    choice: str = ""                       # why this plan, on this device (a line of the table)


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

# At most this share of the usable memory goes to the weights: the rest is for the caches and
# activations of the points, so that a device too small for all 32 layers still runs most of them.
WEIGHT_SHARE = 0.6
# Apple's GPUs compute about a tenth of a data-centre GPU's FLOP/s: fewer layers and shorter
# prompts keep the chapter's run to about a minute there.
MPS_LIMITS = dict(layers=8, prefill=((1, 128), (1, 512), (1, 1024)),
                  decode=((1, 512), (8, 512), (32, 512)))


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
        dtype, str(dtype).removeprefix("torch."))


def _why_dtype(dev: DeviceInfo, dtype: torch.dtype) -> str:
    if dev.kind == "cuda":
        cap = ".".join(map(str, dev.capability or (0, 0)))
        fast = "fast bf16" if dtype == torch.bfloat16 else "no fast bf16"
        return f"compute capability {cap}, {fast}: {_dtype_name(dtype)}"
    return f"{_dtype_name(dtype)} on {'MPS' if dev.kind == 'mps' else 'the CPU'}"


def _layers_that_fit(dtype: torch.dtype, dev: DeviceInfo, most: int) -> int:
    """The most LLaMA-2-7B layers (up to `most`) whose weights take at most WEIGHT_SHARE of the
    usable memory; 0 when not even one does."""
    room = WEIGHT_SHARE * usable_memory(dev)
    fits = [n for n in range(1, most + 1)
            if weights_needed(dataclasses.replace(LLAMA2_7B, n_layers=n), dtype) <= room]
    return max(fits, default=0)


def fitted_7b_plan(dev: DeviceInfo) -> Plan:
    """LLaMA-2-7B's shapes in the device's dtype: as many of its 32 layers as fit, and the
    points whose cache and activations fit beside them. A device too small for even one layer
    and one point of each phase gets the small plan instead (in fp32, as labelled)."""
    base = SIZES["7b"]
    dtype = timing_dtype(dev)
    limits = MPS_LIMITS if dev.kind == "mps" else dict(layers=32, prefill=base.prefill,
                                                       decode=base.decode)
    n = _layers_that_fit(dtype, dev, limits["layers"])
    cfg = dataclasses.replace(LLAMA2_7B, n_layers=max(n, 1))
    prefill, decode = fit_points(cfg, dtype, dev, limits["prefill"], limits["decode"])
    free = f"{dev.free_memory / 1e9:.1f} GB free"
    if n == 0 or not prefill or not decode:
        small = SIZES["small"]
        return dataclasses.replace(small, choice=f"{dev.name}: LLaMA-2-7B's layers do not fit "
                                                 f"in {free}; the small plan instead")
    layers = "all 32 layers" if n == 32 else f"{n} of its 32 layers"
    label = f"LLaMA-2-7B shapes ({layers}, random weights), {_dtype_name(dtype)}"
    left_out = (len(limits["prefill"]) - len(prefill)) + (len(limits["decode"]) - len(decode))
    choice = (f"{dev.name}: {_why_dtype(dev, dtype)}; {layers} in {free}"
              + (f", {left_out} point{'s' if left_out > 1 else ''} left out (too big for it)"
                 if left_out else ""))
    copy_bytes = min(base.copy_bytes, usable_memory(dev) // 8 // MiB * MiB)
    return Plan(label, cfg, dtype, prefill=prefill, decode=decode, matmul_n=base.matmul_n,
                copy_bytes=copy_bytes, choice=choice)


def plan_for(dev: DeviceInfo, size: str | None = None) -> Plan:
    """The random-weights plan for `dev`: `size` "tiny" and "small" as they are (fp32, a few MB);
    "7b" fitted to the device (`fitted_7b_plan`). Default: "7b" on a GPU, "small" on a CPU."""
    why = "as asked" if size else "the CPU's default"
    size = size or ("small" if dev.kind == "cpu" else "7b")
    if size not in SIZES:
        raise ValueError(f"size {size!r}: expected one of {', '.join(SIZES)}")
    if size == "7b":
        return fitted_7b_plan(dev)
    plan = SIZES[size]
    return dataclasses.replace(plan, choice=f"{dev.name}: the {size} plan, {why} "
                                            f"({_dtype_name(plan.dtype)})")


# The real model: SmolLM2-135M-Instruct's weights (checks.smollm), CPU fp32, GPU in its dtype.
SMOLLM_POINTS = {
    "cpu": dict(prefill=((1, 16), (1, 64), (1, 256), (4, 64)),
                decode=((1, 64), (1, 256), (4, 256), (16, 256)), matmul_n=1024,
                copy_bytes=128 * MiB),
    "gpu": dict(prefill=((1, 128), (1, 512), (1, 2048), (8, 2048)),
                decode=((1, 512), (8, 512), (64, 512), (256, 512), (1, 2048)), matmul_n=8192,
                copy_bytes=2048 * MiB),
    "tiny": dict(prefill=((1, 8),), decode=((1, 8),), matmul_n=256, copy_bytes=8 * MiB),
}


def smollm_dtype(dev: DeviceInfo) -> torch.dtype:
    return torch.float32 if dev.kind == "cpu" else timing_dtype(dev)


def smollm_plan(dev: DeviceInfo, cfg: ModelConfig, size: str | None = None) -> Plan:
    """The plan for the real model (of config `cfg`) on `dev` (size "tiny": the smallest run);
    on a GPU only the points that fit its memory."""
    dtype = smollm_dtype(dev)
    points = dict(SMOLLM_POINTS["tiny" if size == "tiny" else
                                ("cpu" if dev.kind == "cpu" else "gpu")])
    points["prefill"], points["decode"] = fit_points(cfg, dtype, dev, points["prefill"],
                                                     points["decode"])
    label = (f"SmolLM2-135M-Instruct, its real weights (H={cfg.hidden_size}, L={cfg.n_layers}, "
             f"N_h={cfg.n_heads}, N_kv={cfg.n_kv_heads}, |V|={cfg.vocab_size}, tied LM head), "
             f"{_dtype_name(dtype)}")
    return Plan(label, cfg, dtype, warmup=1, repeats=3,
                choice=f"{dev.name}: {_why_dtype(dev, dtype)}", **points)


def _device_info(device) -> DeviceInfo:
    if isinstance(device, DeviceInfo):
        return device
    if device is None:
        return describe_device()
    device = torch.device(device)
    return describe_device(device.type, device.index)


def _plan_and_params(dev: DeviceInfo, size: str | None, model: str):
    """(plan, weights or None: drawn after the peaks, size label) for `run`."""
    if model == "smollm":
        from . import smollm

        params, cfg = smollm.load(dtype=smollm_dtype(dev), device=torch_device(dev))
        return smollm_plan(dev, cfg, size), params, f"smollm{'-tiny' if size == 'tiny' else ''}"
    if model == "random":
        plan = plan_for(dev, size)
        return plan, None, size or ("small" if dev.kind == "cpu" else "7b")
    raise ValueError(f"model {model!r}: expected 'random' or 'smollm'")


def run(device: str | torch.device | DeviceInfo | None = None, size: str | None = None, *,
        counts: Counts | None = None, repeats: int | None = None, budget: float | None = None,
        model: str = "random", progress=None) -> dict:
    """Measure the peaks, then prefill and decode for the plan `size` on `device` (default: the
    device found, `describe_device()`, and the plan chosen for it, `plan_for`). Returns plain data.

    `counts`: the FLOPs and bytes set beside each time (`Counts`; default: the course's,
    `reference_counts()`). `budget`: seconds per measured point (as many repeats as fit, at
    least 3) instead of a fixed number of repeats. `model="smollm"`: the real model's weights
    and shapes (`size` "tiny" or None); raises checks.smollm.ModelUnavailable when its package
    is missing."""
    dev = _device_info(device)
    where = torch_device(dev)
    counts = counts or reference_counts()
    plan, params, size = _plan_and_params(dev, size, model)
    reps = plan.repeats if repeats is None else repeats
    warm = min(plan.warmup, reps) if budget is None else max(plan.warmup, 1)
    say = progress or (lambda text: None)
    timing = dict(counts=counts, dtype=plan.dtype, device=where, warmup=warm, repeats=reps,
                  budget=budget)
    started = time.perf_counter()
    with torch.inference_mode():
        say(f"measuring the peaks ({plan.choice})")
        peak_flops = measure_peak_flops(where, plan.dtype, plan.matmul_n, warmup=warm,
                                        repeats=reps, budget=budget)
        peak_bw = measure_peak_bandwidth(where, plan.copy_bytes, warmup=warm, repeats=reps,
                                         budget=budget)
        if where.type == "cuda":
            torch.cuda.empty_cache()            # the peaks' buffers, before the weights
        if params is None:
            params = random_params(plan.cfg, plan.dtype, where)
        weights = params_bytes(params)
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
        "label": plan.label, "choice": plan.choice,
        "device": dev.kind, "device_name": dev.name,
        "device_info": dataclasses.asdict(dev),
        "torch": torch.__version__, "dtype": str(plan.dtype).removeprefix("torch."),
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "weight_bytes": weights,
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
        *([f"chosen for this device: {result['choice']}"] if result.get("choice") else []),
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
    for x, y, _text, _color in points:           # the markers themselves
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
        _fig, ax = plt.subplots(figsize=(8, 5.2))
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
    parser.add_argument("--device", choices=["cpu", "cuda", "mps"],
                        help="default: cuda when available, else mps, else cpu")
    parser.add_argument("--size", choices=list(SIZES),
                        help="random weights: default 7b (as many layers as fit) on a GPU, "
                             "small on a CPU; with --model smollm only tiny (the smallest run) "
                             "is accepted")
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
    if args.device == "mps" and default_kind() != "mps":
        parser.error("--device mps: no Apple MPS device is available here")
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
