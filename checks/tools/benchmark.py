"""Benchmarks: the course's reference model against Hugging Face, the KV cache against no cache,
and the course's own speed, measured side by side in one process on this machine.

    python -m checks.tools.benchmark [--json FILE] [--quick] [--lengths 128,512,1024] [--repeats N]
                               [--threads N] [--skip SECTIONS] [--notebooks 01,13] [--students N]

prints a table of ratios and (with --json) writes every number. `--quick` runs every section at a
tiny size in seconds (the test suite uses it to prove the command works; its numbers mean
nothing). A benchmark is not a test: nothing here asserts a speed.

Sections (`--skip` takes their names, comma-separated):
- `bandwidth`: this machine's memory read bandwidth, measured several ways on an array far larger
  than the caches (a sum, and a matrix-vector product each way round), sampled at the start,
  after each generation length and after each decode-path context length; the best sample counts
  (the memory bus is shared with whatever else runs: the samples move by a quarter).
- `generate`: greedy generation at batch 1 with 32-token prompts: the reference
  (`checks.reference.generate`, KV cache) against Hugging Face's `LlamaForCausalLM.generate` on the
  same weights (eager attention, its default cache, `do_sample=False`); tokens/s, their ratio, and
  whether the tokens are identical. Decode's achieved bandwidth: the bytes of weights and KV cache
  each decode step must read (`checks.timing.decode_bytes`) over the decode time (the generation
  minus its prefill, timed on its own), against the measured read bandwidth; and the same for
  single decode steps of the reference (from `decode_path`), which catch less of the noise.
- `no_cache`: the reference with its cache against recomputing the whole sequence for every new
  token (`generate(..., use_cache=False)`), at the same lengths. Up to `no_cache_full_max` new
  tokens the no-cache generation runs in full (and its tokens are compared); beyond, its time is
  the sum over every step of one step's time interpolated from steps timed at evenly spaced
  lengths (a full run at 1024 tokens would take minutes). Both are shown where both exist.
- `decode_path`: what each change to the decode path buys: one decode step timed at fixed
  context lengths for a ladder of variants, from a naive one (a cache grown by concatenation,
  RoPE tables recomputed for every position, `torch.no_grad`, Q and K rotated separately with
  cos/sin on even and odd features, RMSNorm in four calls, grouped-query attention reading each
  KV head once per query head) to the reference, one change at a time; and the prefill with the
  LM head on every position against the last one only. Every variant's greedy tokens are checked
  against the reference's.
- `timing`: chapter 13's prefill/decode measurements (`checks.timing.run`, its CPU plan).
- `notebooks`: the execution time of each solution notebook (nbclient, a fresh kernel each;
  kernel start-up reported apart from running the cells).
- `grading`: the wall time of `python -m checks grade` on one complete submission (a copy of the
  thirteen solution notebooks).
- `load`: the same two measurements quiet and with CPU hogs alongside (two busy processes,
  `scripts/with_cpu_hogs.py`, running only during the loaded run), each notebook's pair back to
  back so that both see the same machine; their ratio is the figure that matters (two hogs on two
  cores leave a third of the CPU to the work). When this section runs, its quiet runs are the
  numbers of `notebooks` and `grading` (measured once).
- `class`: a class of `--students` complete submissions (default 20; copies of the solutions in
  nbgrader's `submitted/<student>/<chapter>/` layout) graded with `--jobs 1` and with `--jobs 2`:
  both wall times, the speed-up, and whether both runs gave every notebook the same results.
- `smollm`: the real model, SmolLM2-135M-Instruct (`checks.smollm`; skipped with a note when it
  is not installed): `generate`'s measurement on it, from its chat prompt, at 128 and 512 new
  tokens (fp32, batch 1), with decode's share of the measured read bandwidth.

Timing: warm-up first, then repeats; generation runs alternate between the two implementations
(and the order alternates between rounds) so that both see the same machine, and the fastest
repeat counts (on a shared machine the noise only ever adds time). Ratios are always of numbers
measured in this one process. torch's thread count is reported (`--threads` changes it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import timing
from ..config import ModelConfig
from ..reference import generation as gen
from ..reference.norms import rms_norm
from ..reference.rope import rope_frequencies

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
SECTIONS = ("bandwidth", "generate", "no_cache", "decode_path", "timing", "notebooks", "grading",
            "load", "class", "smollm")
MiB, GiB = 2**20, 2**30


@dataclass(frozen=True)
class Plan:
    label: str
    cfg: ModelConfig
    prompt_len: int
    lengths: tuple[int, ...]            # new tokens per generation
    repeats: int                        # timed generations per implementation and length
    bandwidth_bytes: int                # size of the array read to measure the bandwidth
    no_cache_full_max: int              # no-cache generations up to this length run in full
    no_cache_samples: int               # steps timed to estimate a longer no-cache generation
    decode_contexts: tuple[int, ...]    # cached positions at which decode variants are timed
    decode_rounds: int                  # rounds over all variants (interleaved)
    decode_steps: int                   # timed steps per variant and round
    check_tokens: int                   # new tokens of each variant's correctness check
    timing_size: str                    # checks.timing plan
    timing_repeats: int | None
    notebooks: tuple[str, ...] | None = None   # chapters (NN prefixes); None: all of them
    load_hogs: int = 2                  # CPU hogs alongside the loaded runs of `load`
    class_size: int = 20                # complete submissions graded by `class`
    smollm_lengths: tuple[int, ...] = (128, 512)   # new tokens of the real model's generations


FULL = Plan(
    label="LLaMA-shaped: H=512, L=8, N_h=8, N_kv=2, H_ff=1376, |V|=32000, fp32",
    cfg=ModelConfig(vocab_size=32000, hidden_size=512, n_heads=8, n_kv_heads=2,
                    ffn_hidden_size=1376, n_layers=8, max_seq_len=2048),
    prompt_len=32, lengths=(128, 512, 1024), repeats=3, bandwidth_bytes=GiB,
    no_cache_full_max=128, no_cache_samples=6, decode_contexts=(160, 1056), decode_rounds=10,
    decode_steps=8,
    check_tokens=24, timing_size="small", timing_repeats=None)

QUICK = Plan(
    label="quick: tiny config (H=64, L=2, |V|=512), fp32: proves the command works, "
          "measures nothing",
    cfg=ModelConfig(vocab_size=512, hidden_size=64, n_heads=4, n_kv_heads=2,
                    ffn_hidden_size=176, n_layers=2, max_seq_len=256),
    prompt_len=8, lengths=(8, 24), repeats=1, bandwidth_bytes=16 * MiB,
    no_cache_full_max=8, no_cache_samples=3, decode_contexts=(16,), decode_rounds=1,
    decode_steps=3,
    check_tokens=6, timing_size="tiny", timing_repeats=1, notebooks=("01",), load_hogs=1,
    class_size=2, smollm_lengths=(4,))


# --------------------------------------------------------------------------------------------
# Helpers


def _best(fn, *, warmup: int = 1, repeats: int = 5) -> float:
    """Seconds of the fastest of `repeats` calls of fn() after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def benchmark_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random weights in the course's layout, scaled so that activations and logits are of order
    one (each matrix N(0, 1/fan_in), the LM head twice that, the embedding N(0, 1), norm scales
    around one): greedy choices then win by clear margins, so that two implementations that
    differ by rounding pick the same tokens. (Timing does not depend on the values.)"""
    g = torch.Generator().manual_seed(seed)
    h, d, h_ff = cfg.hidden_size, cfg.head_dim, cfg.ffn_hidden_size

    def w(rows, cols, scale=1.0):
        return torch.randn(rows, cols, generator=g) * (scale / math.sqrt(rows))

    def norm():
        return 1.0 + 0.1 * torch.randn(h, generator=g)

    layers = [{"attn_norm": norm(), "wqkv": w(h, (cfg.n_heads + 2 * cfg.n_kv_heads) * d),
               "wo": w(cfg.n_heads * d, h), "ffn_norm": norm(), "w_gate": w(h, h_ff),
               "w_up": w(h, h_ff), "w_down": w(h_ff, h)} for _ in range(cfg.n_layers)]
    return {"embed": torch.randn(cfg.vocab_size, h, generator=g), "layers": layers,
            "final_norm": norm(), "lm_head": w(h, cfg.vocab_size, 2.0)}


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first position where two [1, S] token sequences differ (None when equal)."""
    if a.shape == b.shape and torch.equal(a, b):
        return None
    n = min(a.shape[-1], b.shape[-1])
    diff = (a[..., :n] != b[..., :n]).nonzero()
    return int(diff[0, -1]) if len(diff) else n


# --------------------------------------------------------------------------------------------
# The machine's memory read bandwidth


def measure_read_bandwidth(nbytes: int, *, repeats: int = 5) -> dict:
    """Bytes/s of reading one float32 array of `nbytes` (far larger than the caches), three ways:
    a sum, a vector-matrix product v @ A (decode's x @ W) and a matrix-vector product A @ u; each
    reads the array once. The fastest repeat of each way; the best way counts."""
    n = nbytes // 4
    cols = 4096 if n >= 4096 * 16 else 64
    rows = n // cols
    a = torch.ones(rows, cols)
    flat = a.view(-1)
    v, u = torch.ones(rows), torch.ones(cols)
    size = a.numel() * 4
    ways = {"sum": lambda: flat.sum(),
            "vector @ matrix": lambda: torch.matmul(v, a),
            "matrix @ vector": lambda: torch.mv(a, u)}
    with torch.inference_mode():
        measured = {name: size / _best(fn, repeats=repeats) for name, fn in ways.items()}
    best = max(measured, key=measured.get)
    return {"bytes": size, "ways": measured, "best_way": best, "bytes_per_s": measured[best]}


# --------------------------------------------------------------------------------------------
# Generation: the reference against Hugging Face


def _hf_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def hf_model(params: dict, cfg: ModelConfig):
    """Hugging Face's LlamaForCausalLM holding `params` (eager attention; no special tokens, so
    that generation never stops early)."""
    from ..reference.hf import hf_model_from_params

    model = hf_model_from_params(params, cfg, bos_token_id=None, eos_token_id=None,
                                 pad_token_id=None)
    model.generation_config.pad_token_id = None
    model.generation_config.eos_token_id = None
    return model


def _hf_model_if_available(params: dict, cfg: ModelConfig, out: dict, say):
    """Hugging Face's model on `params`, or None with `out["hf_missing"]` saying why."""
    if not _hf_available():
        out["hf_missing"] = "transformers is not installed (pip install -e .[oracle])"
        return None
    say("building Hugging Face's model from the same weights")
    return hf_model(params, cfg)


def hf_generate(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Hugging Face's greedy generation as its users call it (its own no_grad, default cache)."""
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                          do_sample=False)


def _prefill_seconds(params, cfg, prompt, *, repeats: int) -> float:
    """The reference's prefill alone (cache allocation included), fastest repeat."""
    def call():
        with torch.inference_mode():
            cache = gen.KVCache(cfg, 1, prompt.shape[1] + 1)
            gen.forward_with_cache(prompt, params, cfg, cache, 0, last_only=True)
    return _best(call, repeats=repeats)


def _hf_prefill_seconds(model, prompt, *, repeats: int) -> float:
    def call():
        with torch.no_grad():
            model(prompt, attention_mask=torch.ones_like(prompt), use_cache=True,
                  logits_to_keep=1)
    return _best(call, repeats=repeats)


def decode_bytes_total(cfg: ModelConfig, prompt_len: int, n: int, bytes_per_elem: int = 4) -> int:
    """Bytes the n - 1 decode steps of an n-token generation must read: every weight once per
    step, and the cache as it stands (the step at position P + s reads P + s + 1 positions)."""
    return sum(timing.decode_bytes(cfg, 1, prompt_len + s, bytes_per_elem) for s in range(n - 1))


def run_generate(params, cfg, plan: Plan, model, say, after_each=None,
                 prompt: torch.Tensor | None = None) -> list[dict]:
    """Both implementations at every length (alternating, the order swapped every round); the
    reference's prefill timed on its own to take it out of the decode time. `after_each()` runs
    after each length (the bandwidth is sampled there, under the same conditions). The prompt
    is random tokens of `plan.prompt_len` unless given."""
    if prompt is None:
        prompt = torch.randint(0, cfg.vocab_size, (1, plan.prompt_len),
                               generator=torch.Generator().manual_seed(1))
    ours = lambda n: gen.generate(params, cfg, prompt, n)              # noqa: E731
    theirs = (lambda n: hf_generate(model, prompt, n)) if model is not None else None
    ours(4)                                                              # warm-up
    if theirs:
        theirs(4)
    prefill = _prefill_seconds(params, cfg, prompt, repeats=5)
    hf_prefill = _hf_prefill_seconds(model, prompt, repeats=5) if model is not None else None
    rows = []
    for n in plan.lengths:
        say(f"generate: {n} new tokens")
        times = {"ours": [], "hf": []}
        tokens = {}
        for r in range(plan.repeats):
            order = [("ours", ours), ("hf", theirs)]
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                if fn is None:
                    continue
                start = time.perf_counter()
                tokens[name] = fn(n)
                times[name].append(time.perf_counter() - start)
        row = {"new_tokens": n, "prompt_len": prompt.shape[1], "ours_seconds": times["ours"],
               "ours_tokens_per_s": n / min(times["ours"]), "ours_prefill_seconds": prefill}
        nbytes = decode_bytes_total(cfg, prompt.shape[1], n)
        row["decode_bytes_per_step"] = nbytes / max(n - 1, 1)
        decode = max(min(times["ours"]) - prefill, 1e-9)
        row["ours_decode_bytes_per_s"] = nbytes / decode
        row["ours_decode_tokens_per_s"] = (n - 1) / decode
        if theirs:
            row.update(hf_seconds=times["hf"], hf_tokens_per_s=n / min(times["hf"]),
                       hf_prefill_seconds=hf_prefill)
            row["ratio"] = row["ours_tokens_per_s"] / row["hf_tokens_per_s"]
            row["paired_ratios"] = [h / o for o, h in zip(times["ours"], times["hf"])]
            diff = _first_difference(tokens["ours"], tokens["hf"])
            row["identical_tokens"] = diff is None
            row["first_difference"] = diff
            hf_decode = max(min(times["hf"]) - hf_prefill, 1e-9)
            row["hf_decode_bytes_per_s"] = nbytes / hf_decode
        rows.append(row)
        if after_each:
            after_each()
    return rows


# --------------------------------------------------------------------------------------------
# The real model: SmolLM2-135M-Instruct

SMOLLM_QUESTION = "What is the capital of France?"


def run_smollm(plan: Plan, say, after_each=None) -> dict:
    """The `generate` section's measurement on SmolLM2-135M-Instruct (`checks.smollm`, fp32,
    memory-mapped from its cache) from its chat prompt: the reference against Hugging Face's
    `generate` on the same weights (converted by `checks.reference.hf`, eager attention, no
    end-of-sequence token, so both generate every token asked for)."""
    from .. import smollm

    if not smollm.available():
        return {"missing": str(smollm.ModelUnavailable())}
    say("SmolLM2-135M-Instruct: loading")
    params, cfg = smollm.load()
    prompt = torch.tensor([smollm.tokenizer().chat_prompt(SMOLLM_QUESTION)])
    out = {"config": asdict(cfg), "prompt": smollm.chat_text(SMOLLM_QUESTION),
           "weight_bytes": timing.weight_bytes(cfg, 4)}
    model = _hf_model_if_available(params, cfg, out,
                                   lambda text: say(f"SmolLM2-135M-Instruct: {text}"))
    smollm_plan = replace(plan, lengths=plan.smollm_lengths)
    out["generate"] = run_generate(params, cfg, smollm_plan, model,
                                   lambda text: say(f"SmolLM2-135M-Instruct {text}"),
                                   after_each=after_each, prompt=prompt)
    return out


# --------------------------------------------------------------------------------------------
# The cache against recomputing everything


def run_no_cache(params, cfg, plan: Plan, cached: dict[int, float], say) -> list[dict]:
    """For each length: the cached generation's time (from the `generate` section, else timed
    here) against the no-cache one, measured in full and/or estimated from sampled steps."""
    prompt = torch.randint(0, cfg.vocab_size, (1, plan.prompt_len),
                           generator=torch.Generator().manual_seed(1))
    p = plan.prompt_len
    step_cache: dict[int, float] = {}

    def step_seconds(length: int) -> float:
        """One no-cache step: the whole sequence of `length` tokens through the model, the LM
        head on its last position (what `generate(..., use_cache=False)` does per token)."""
        if length not in step_cache:
            ids = torch.randint(0, cfg.vocab_size, (1, length),
                                generator=torch.Generator().manual_seed(length))
            with torch.inference_mode():
                step_cache[length] = _best(
                    lambda: gen.full_forward(ids, params, cfg, last_only=True), warmup=1,
                    repeats=2)
        return step_cache[length]

    rows = []
    for n in plan.lengths:
        say(f"no cache: {n} new tokens")
        if n not in cached:
            cached[n] = _best(lambda: gen.generate(params, cfg, prompt, n), repeats=plan.repeats)
        row = {"new_tokens": n, "cache_seconds": cached[n]}
        # Step s runs P + s tokens (s = 0 .. n-1): time a few lengths, interpolate the rest.
        k = max(2, min(plan.no_cache_samples, n))
        sampled = sorted({p + round(i * (n - 1) / (k - 1)) for i in range(k)})
        times = [step_seconds(length) for length in sampled]
        estimate = sum(_interp(p + s, sampled, times) for s in range(n))
        row.update(sampled_lengths=sampled, sampled_step_seconds=times,
                   no_cache_estimated_seconds=estimate)
        if n <= plan.no_cache_full_max:
            with_cache = gen.generate(params, cfg, prompt, n)
            start = time.perf_counter()
            without = gen.generate(params, cfg, prompt, n, use_cache=False)
            row["no_cache_measured_seconds"] = time.perf_counter() - start
            row["identical_tokens"] = torch.equal(with_cache, without)
        row["no_cache_seconds"] = row.get("no_cache_measured_seconds", estimate)
        row["speedup"] = row["no_cache_seconds"] / cached[n]
        rows.append(row)
    return rows


def _interp(x: float, xs: list[int], ys: list[float]) -> float:
    if len(xs) == 1:
        return ys[0]
    for i in range(len(xs) - 1):
        if x <= xs[i + 1] or i == len(xs) - 2:
            x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# The decode path, one change at a time


@dataclass(frozen=True)
class Variant:
    """A decode path: each flag is one of the changes the reference makes."""
    name: str
    preallocated: bool = True     # cache written in place (else grown by torch.cat every step)
    rope_new_only: bool = True    # RoPE tables for the new positions (else all, then sliced)
    last_only: bool = True        # prefill's LM head on the last position (else on every one)
    inference_mode: bool = True   # torch.inference_mode (else torch.no_grad)
    qk_together: bool = True      # Q and K rotated in one call (else one call each)
    complex_rope: bool = True     # a pair times its complex rotor (else cos/sin on even/odd)
    fused_norm: bool = True       # float32 RMSNorm with gamma inside F.rms_norm (else 4 calls)
    folded_groups: bool = True    # decode attention: a group's G query heads as G queries of
    #                               their KV head (else SDPA enable_gqa, each KV head read G times)


def _ladder(*steps: tuple[str, str]) -> tuple[Variant, ...]:
    """Variants from everything off to everything on, turning one flag on per step."""
    off = {flag: False for _, flag in steps if flag}
    variants = []
    for name, flag in steps:
        if flag:
            off.pop(flag)
        variants.append(Variant(name, **off))
    return tuple(variants)


VARIANTS = _ladder(
    ("naive: torch.cat cache, RoPE tables of all positions, no_grad, SDPA enable_gqa", ""),
    ("+ preallocated cache written in place", "preallocated"),
    ("+ RoPE tables for the new positions only", "rope_new_only"),
    ("+ LM head on the last position only (prefill: see below)", "last_only"),
    ("+ torch.inference_mode instead of no_grad", "inference_mode"),
    ("+ Q and K rotated in one call", "qk_together"),
    ("+ RoPE as one complex multiplication (not cos/sin on halves)", "complex_rope"),
    ("+ RMSNorm's scale inside F.rms_norm (one call, float32)", "fused_norm"),
    ("+ decode attention reads each KV head once (= the reference)", "folded_groups"),
)


def _cos_sin(positions: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's earlier RoPE tables: cos and sin [T, D_r/2] of the angles."""
    freqs = rope_frequencies(cfg.rotary_dim, cfg.rope_base)
    angles = (positions.to(torch.float64)[:, None] * freqs.to(torch.float64)).to(torch.float32)
    return angles.cos(), angles.sin()


def _rotate_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The reference's earlier rotation: even and odd features, four products, stacked back."""
    d_r = 2 * cos.shape[-1]
    even = x[..., 0:d_r:2].to(torch.float32)
    odd = x[..., 1:d_r:2].to(torch.float32)
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    if d_r == x.shape[-1]:
        return rotated.to(x.dtype)
    return torch.cat((rotated.to(x.dtype), x[..., d_r:]), dim=-1)


class ConcatCache:
    """The naive cache: each layer's K and V grown by torch.cat (a new tensor every step).
    `update` keeps the positions before start_pos, like KVCache, so a step can be repeated."""

    def __init__(self, cfg, k0: torch.Tensor | None = None, v0: torch.Tensor | None = None):
        self.k = [k0[i] if k0 is not None else None for i in range(cfg.n_layers)]
        self.v = [v0[i] if v0 is not None else None for i in range(cfg.n_layers)]

    def update(self, i, k, v, start_pos):
        if start_pos == 0:
            self.k[i], self.v[i] = k, v
        else:
            self.k[i] = torch.cat([self.k[i][:, :, :start_pos], k], dim=2)
            self.v[i] = torch.cat([self.v[i][:, :, :start_pos], v], dim=2)
        return self.k[i], self.v[i]


def variant_forward(token_ids, params, cfg, cache, start_pos: int, var: Variant, *,
                    last_only: bool = False) -> torch.Tensor:
    """The reference's forward pass (`checks.reference.generation._forward`) with the changes
    that `var` turns off undone."""
    b, t = token_ids.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    end = start_pos + t
    positions = torch.arange(start_pos if var.rope_new_only else 0, end)
    if var.complex_rope:
        rotors = gen._rope_rotors(positions, cfg)[-t:]
        rotate = lambda x: gen._rotate(x, rotors)                       # noqa: E731
    else:
        cos, sin = (table[-t:] for table in _cos_sin(positions, cfg))
        rotate = lambda x: _rotate_cos_sin(x, cos, sin)                 # noqa: E731
    norm = gen._rms_norm if var.fused_norm else rms_norm
    mask = None
    if t > 1 and start_pos > 0:
        mask = torch.arange(end)[None, :] <= torch.arange(start_pos, end)[:, None]
    causal = t > 1 and mask is None
    x = F.embedding(token_ids, params["embed"])
    for i, layer in enumerate(params["layers"]):
        h = norm(x, layer["attn_norm"], cfg.norm_eps)
        heads = (h @ layer["wqkv"]).unflatten(-1, (n_h + 2 * n_kv, d)).transpose(1, 2)
        if var.qk_together:
            qk = rotate(heads[:, :n_h + n_kv])
            q, k = qk[:, :n_h], qk[:, n_h:]
        else:
            q, k = rotate(heads[:, :n_h]), rotate(heads[:, n_h:n_h + n_kv])
        v = heads[:, n_h + n_kv:]
        k, v = cache.update(i, k, v, start_pos)
        if t == 1 and var.folded_groups:
            out = F.scaled_dot_product_attention(q.reshape(b, n_kv, n_h // n_kv, d), k, v)
            out = out.reshape(b, n_h, 1, d)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                 enable_gqa=n_kv != n_h)
        x = x + out.transpose(1, 2).reshape(b, t, n_h * d) @ layer["wo"]
        h = norm(x, layer["ffn_norm"], cfg.norm_eps)
        x = x + (F.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]
    if last_only:
        x = x[:, -1:]
    return norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"]


def _mode(var: Variant):
    return torch.inference_mode() if var.inference_mode else torch.no_grad()


def variant_generate(params, cfg, prompt, n: int, var: Variant) -> torch.Tensor:
    """Greedy generation (batch 1) along the variant's decode path."""
    p = prompt.shape[1]
    with _mode(var):
        cache = gen.KVCache(cfg, 1, p + n) if var.preallocated else ConcatCache(cfg)
        logits = variant_forward(prompt, params, cfg, cache, 0, var, last_only=var.last_only)
        out = [prompt]
        for step in range(n):
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(token)
            if step + 1 < n:
                logits = variant_forward(token, params, cfg, cache, p + step, var)
        return torch.cat(out, dim=1).clone()


REFERENCE_STEP = "checks.reference forward_with_cache"


def run_decode_path(params, cfg, plan: Plan, say, after_each=None) -> dict:
    """Per-step decode time of each variant, and of the reference's own forward_with_cache, at
    fixed context lengths (all interleaved round by round, in alternating order; the median step
    of each round; the fastest round counts); the prefill with and without `last_only`; and each
    variant's greedy tokens against the reference's."""
    prompt = torch.randint(0, cfg.vocab_size, (1, plan.prompt_len),
                           generator=torch.Generator().manual_seed(1))
    want = gen.generate(params, cfg, prompt, plan.check_tokens)
    identical = {v.name: torch.equal(variant_generate(params, cfg, prompt, plan.check_tokens, v),
                                     want) for v in VARIANTS}
    token = torch.randint(0, cfg.vocab_size, (1, 1), generator=torch.Generator().manual_seed(2))
    per_context = []
    for context in plan.decode_contexts:
        say(f"decode path: one step after {context} cached positions")
        filled = torch.randn(cfg.n_layers, 2, 1, cfg.n_kv_heads, context + 1, cfg.head_dim)
        steps = {}                              # name -> (grad mode, one decode step)
        for var in VARIANTS:
            if var.preallocated:
                cache = gen.KVCache(cfg, 1, context + 1)
                cache.storage.copy_(filled)
            else:
                cache = ConcatCache(cfg, filled[:, 0, :, :, :context].clone(),
                                    filled[:, 1, :, :, :context].clone())
            steps[var.name] = (var, lambda var=var, cache=cache: variant_forward(
                token, params, cfg, cache, context, var))
        ref_cache = gen.KVCache(cfg, 1, context + 1)
        ref_cache.storage.copy_(filled)
        steps[REFERENCE_STEP] = (VARIANTS[-1], lambda: gen.forward_with_cache(
            token, params, cfg, ref_cache, context))
        rounds: dict[str, list[float]] = {name: [] for name in steps}
        names = list(steps)
        for r in range(plan.decode_rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                var, step = steps[name]
                with _mode(var):
                    step()                                           # warm-up
                    times = []
                    for _ in range(plan.decode_steps):
                        start = time.perf_counter()
                        step()
                        times.append(time.perf_counter() - start)
                rounds[name].append(statistics.median(times))
        per_context.append({"context": context,
                            "step_seconds": {name: min(t) for name, t in rounds.items()},
                            "round_medians": rounds,
                            "decode_bytes": timing.decode_bytes(cfg, 1, context, 4)})
        if after_each:
            after_each()
    say("decode path: prefill, LM head on every position vs the last")
    prefill = {}
    for last_only in (False, True):
        def call(last_only=last_only):
            with torch.inference_mode():
                cache = gen.KVCache(cfg, 1, plan.prompt_len)
                gen.forward_with_cache(prompt, params, cfg, cache, 0, last_only=last_only)
        prefill["last_only" if last_only else "every_position"] = _best(call, repeats=5)
    return {"variants": [asdict(v) for v in VARIANTS], "identical_tokens": identical,
            "contexts": per_context, "prefill_seconds": prefill}


# --------------------------------------------------------------------------------------------
# The course's own speed: notebooks and grading


def solution_notebooks(chapters: tuple[str, ...] | None = None) -> list[Path]:
    found = sorted(SOLUTIONS.glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb"))
    found = [p for p in found if p.stem == p.parent.name]
    if chapters is not None:
        found = [p for p in found if p.parent.name[:2] in chapters
                 or p.parent.name in chapters]
    return found


def time_notebook(path: Path, *, timeout: float = 600) -> dict:
    """Execute one notebook in a fresh kernel (in its own folder, as nbval and nbconvert do):
    seconds to start the kernel (until it answers), to run the cells, to shut it down."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.reset_execution_trackers()
    error = None
    start = time.perf_counter()
    with client.setup_kernel(stderr=subprocess.DEVNULL):   # the kernel's own log lines
        started = time.perf_counter()
        try:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        except CellExecutionError as exc:
            error = str(exc).strip().splitlines()[-1][:200]
        ran = time.perf_counter()
    stopped = time.perf_counter()
    stderr = sum(1 for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.get("outputs", [])
                 if out.get("output_type") == "stream" and out.get("name") == "stderr")
    return {"notebook": str(path.relative_to(REPO)), "kernel_start_seconds": started - start,
            "cells_seconds": ran - started, "shutdown_seconds": stopped - ran,
            "total_seconds": stopped - start, "stderr_outputs": stderr, "error": error}


def run_notebooks(chapters, say) -> list[dict]:
    rows = []
    for path in solution_notebooks(chapters):
        say(f"notebook {path.parent.name}")
        rows.append(time_notebook(path))
    return rows


def copy_submission(paths: list[Path], folder: Path) -> None:
    """One complete submission: each solution notebook in its chapter's folder under `folder`."""
    for path in paths:
        (folder / path.parent.name).mkdir(parents=True)
        shutil.copy2(path, folder / path.parent.name / path.name)


def grade_timed(folder: Path, out: Path, *options: str) -> dict:
    """`python -m checks grade [options] folder`, timed from the outside (interpreter start-up
    included); its JSON report is read back."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "checks", "grade", *options, "--json", str(out),
                           str(folder)], capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    grades = json.loads(out.read_text()) if out.exists() else {}
    return {"seconds": seconds, "returncode": done.returncode,
            "points": grades.get("points"), "max_points": grades.get("max_points"),
            "graded": len(grades.get("notebooks", [])), "grades": grades.get("notebooks", []),
            "stderr_tail": done.stderr[-2000:] if done.returncode else ""}


def run_grading(chapters, say, *, hogs: int = 0) -> dict:
    """`python -m checks grade` on a copy of the solution notebooks (one complete submission),
    with `hogs` CPU hogs alongside."""
    paths = solution_notebooks(chapters)
    say(f"grading {len(paths)} notebooks with python -m checks grade"
        + (f", {hogs} CPU hogs alongside" if hogs else ""))
    with tempfile.TemporaryDirectory(prefix="checks-benchmark-") as tmp:
        submission = Path(tmp) / "submission"
        copy_submission(paths, submission)
        with cpu_hogs(hogs, LOADED_LIMIT) as load:
            graded = grade_timed(submission, Path(tmp) / "grades.json")
    grades = graded.pop("grades")
    return {"notebooks": len(paths), **graded, "hogs": hogs,
            "hog_cpu_seconds": load["cpu_seconds"],
            "per_notebook_seconds": {Path(n["path"]).parent.name: n["seconds"] for n in grades}}


# --------------------------------------------------------------------------------------------
# The same under load, and a class graded one notebook at a time against two at a time

LOADED_LIMIT = 3600.0   # seconds: the hogs stop by themselves after this, whatever happens


def cpu_hogs(n: int, seconds: float):
    """scripts/with_cpu_hogs.py's hogs as a context manager (the script is the one place that
    knows how to start and always stop them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("with_cpu_hogs",
                                                  REPO / "scripts" / "with_cpu_hogs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cpu_hogs(n, seconds)


def run_under_load(chapters, say, hogs: int) -> dict:
    """Each notebook quiet and with `hogs` CPU hogs alongside, back to back (the order swapped
    from one notebook to the next, so that a drift of the machine's load favours neither), then
    one complete submission's grading both ways."""
    rows = []
    for i, path in enumerate(solution_notebooks(chapters)):
        say(f"notebook {path.parent.name}, quiet and with {hogs} CPU hogs")
        row: dict = {"notebook": str(path.relative_to(REPO))}
        for loaded in ((False, True) if i % 2 == 0 else (True, False)):
            with cpu_hogs(hogs if loaded else 0, LOADED_LIMIT) as load:
                row["loaded" if loaded else "quiet"] = time_notebook(path)
            if loaded:
                row["hog_cpu_seconds"] = load["cpu_seconds"]
        row["ratio"] = row["loaded"]["total_seconds"] / row["quiet"]["total_seconds"]
        rows.append(row)
    quiet = run_grading(chapters, say)
    loaded = run_grading(chapters, say, hogs=hogs)
    return {"hogs": hogs, "notebooks": rows,
            "grading": {"quiet": quiet, "loaded": loaded,
                        "ratio": loaded["seconds"] / quiet["seconds"]}}


def _outcome(grades: list[dict]) -> dict:
    """What a grading run decided for each notebook (its timings left out), by
    student/chapter/file."""
    return {"/".join(Path(n["path"]).parts[-3:]):
            (n.get("points"), n.get("error"),
             [(e.get("name"), e.get("status"), e.get("points"),
               (e.get("message") or "").strip().split("\n")[0][:300])
              for e in n.get("exercises", [])])
            for n in grades}


def run_class(chapters, say, students: int) -> dict:
    """`students` complete submissions in nbgrader's submitted/<student>/<chapter>/ layout,
    graded with `--jobs 1` and then with `--jobs 2`."""
    paths = solution_notebooks(chapters)
    result: dict = {"students": students, "notebooks": students * len(paths), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="checks-benchmark-class-") as tmp:
        submitted = Path(tmp) / "submitted"
        for s in range(1, students + 1):
            copy_submission(paths, submitted / f"student{s:02d}")
        outcomes = {}
        for jobs in (1, 2):
            say(f"grading a class of {students} submissions ({result['notebooks']} notebooks) "
                f"with --jobs {jobs}")
            run = grade_timed(submitted, Path(tmp) / f"grades-{jobs}.json", "--jobs", str(jobs))
            outcomes[jobs] = _outcome(run.pop("grades"))
            result["runs"][str(jobs)] = run
    one, two = result["runs"]["1"], result["runs"]["2"]
    # Notebooks graded per second: the same as the ratio of wall times when both runs graded
    # the whole class (a run that stopped early, say on an incident, still gives a rate).
    result["complete"] = one["graded"] == two["graded"] == result["notebooks"]
    result["speedup"] = (two["graded"] / two["seconds"]) / max(one["graded"] / one["seconds"],
                                                               1e-12)
    both = outcomes[1].keys() & outcomes[2].keys()   # every notebook, unless a run stopped
    result["same_results"] = bool(both) and all(outcomes[1][k] == outcomes[2][k] for k in both)
    result["differences"] = _differences(outcomes, sorted(both))
    return result


def _differences(outcomes: dict, notebooks: list[str]) -> list[dict]:
    """For each notebook graded differently by the two runs: what each run said of the
    exercises that differ (status, points, the first line of the message)."""
    found = []
    for key in notebooks:
        one, two = outcomes[1][key], outcomes[2][key]
        if one == two:
            continue
        runs = {}
        for jobs, outcome in ((1, one), (2, two)):
            other = two if jobs == 1 else one
            runs[str(jobs)] = {"error": outcome[1], "exercises": [
                e for e in outcome[2] if e not in other[2]]}
        found.append({"notebook": key, "runs": runs})
    return found


# --------------------------------------------------------------------------------------------
# Running it all


def run(plan: Plan = FULL, *, skip: tuple[str, ...] = (), progress=None) -> dict:
    say = progress or (lambda text: None)
    started = time.perf_counter()
    cfg = plan.cfg
    result: dict = {
        "plan": {**asdict(replace(plan, cfg=None)), "cfg": asdict(cfg)},
        "label": plan.label,
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "load_average_start": os.getloadavg()},
        "skipped": list(skip),
    }
    if _hf_available():
        from transformers import __version__ as hf_version
        result["machine"]["transformers"] = hf_version
    torch.manual_seed(0)
    params = benchmark_params(cfg)
    samples: list[dict] = []

    def sample_bandwidth(repeats: int = 3) -> None:
        samples.append(measure_read_bandwidth(plan.bandwidth_bytes, repeats=repeats))

    if "bandwidth" not in skip:
        say(f"memory read bandwidth ({plan.bandwidth_bytes // MiB} MiB array)")
        sample_bandwidth(repeats=5)
    cached: dict[int, float] = {}
    if "generate" not in skip:
        model = _hf_model_if_available(params, cfg, result, say)
        result["generate"] = run_generate(
            params, cfg, plan, model, say,
            after_each=sample_bandwidth if "bandwidth" not in skip else None)
        cached = {row["new_tokens"]: min(row["ours_seconds"]) for row in result["generate"]}
        del model
    if "no_cache" not in skip:
        result["no_cache"] = run_no_cache(params, cfg, plan, cached, say)
    if "decode_path" not in skip:
        result["decode_path"] = run_decode_path(
            params, cfg, plan, say,
            after_each=sample_bandwidth if "bandwidth" not in skip else None)
    if "smollm" not in skip:   # compared with the best bandwidth sample of the other sections
        result["smollm"] = run_smollm(plan, say)
    if samples:
        # The machine's read bandwidth: the best sample of the run (at the start, after each
        # generation length and after each decode-path context), so that decode is compared with
        # the best the memory gave while this ran.
        best = max(samples, key=lambda s: s["bytes_per_s"])
        result["bandwidth"] = {**best, "samples_bytes_per_s": [s["bytes_per_s"] for s in samples]}
        for row in result.get("generate", []) + result.get("smollm", {}).get("generate", []):
            for who in ("ours", "hf"):
                if f"{who}_decode_bytes_per_s" in row:
                    row[f"{who}_bandwidth_fraction"] = (row[f"{who}_decode_bytes_per_s"]
                                                        / best["bytes_per_s"])
        for c in result.get("decode_path", {}).get("contexts", []):
            c["reference_bytes_per_s"] = c["decode_bytes"] / c["step_seconds"][REFERENCE_STEP]
            c["reference_bandwidth_fraction"] = c["reference_bytes_per_s"] / best["bytes_per_s"]
    if "timing" not in skip:
        say(f"chapter 13 timing ({plan.timing_size} plan)")
        result["timing"] = timing.run("cpu", plan.timing_size, repeats=plan.timing_repeats)
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
    result["machine"]["load_average_end"] = os.getloadavg()
    result["seconds_total"] = time.perf_counter() - started
    return result


# --------------------------------------------------------------------------------------------
# The table


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def format_table(result: dict) -> str:
    m = result["machine"]
    lines = [f"benchmark: {result['label']}",
             f"machine: {m['cpu']}, {m['cpu_count']} cores, torch {m['torch']} with "
             f"{m['torch_threads']} threads"
             + (f", transformers {m['transformers']}" if "transformers" in m else "")
             + f"; load average {m['load_average_start'][0]:.1f} at the start, "
             f"{m['load_average_end'][0]:.1f} at the end",
             "every ratio: two numbers measured in this process (fastest repeat of each)"]
    bw = result.get("bandwidth")
    if bw:
        ways = ", ".join(f"{name} {_gb(v)}" for name, v in bw["ways"].items())
        got = bw["samples_bytes_per_s"]
        lines += ["", f"memory read bandwidth ({bw['bytes'] // MiB} MiB array): "
                      f"{_gb(bw['bytes_per_s'])} GB/s, the best of {len(got)} samples "
                      f"({_gb(min(got))}-{_gb(max(got))} GB/s) taken through the run; its "
                      f"ways: {ways} GB/s"]
    rows = result.get("generate")
    if rows:
        p = result["plan"]
        lines += ["", f"(a) greedy generation, batch 1, {p['prompt_len']}-token prompt, best of "
                      f"{p['repeats']} alternating runs: the reference (KV cache) vs Hugging "
                      "Face generate (eager, DynamicCache)"]
        if result.get("hf_missing"):
            lines.append(f"    Hugging Face skipped: {result['hf_missing']}")
        lines.append(f"{'new tokens':>12}{'ours tok/s':>12}{'HF tok/s':>10}{'ours/HF':>9}"
                     f"{'same tokens':>13}")
        for r in rows:
            hf = (f"{r['hf_tokens_per_s']:>10.1f}{r['ratio']:>8.2f}x"
                  f"{('yes' if r['identical_tokens'] else 'NO @' + str(r['first_difference'])):>13}"
                  if "hf_tokens_per_s" in r else f"{'-':>10}{'-':>9}{'-':>13}")
            lines.append(f"{r['new_tokens']:>12}{r['ours_tokens_per_s']:>12.1f}{hf}")
        lines += ["", "(b) decode's achieved bandwidth: bytes of weights + KV read per decode "
                      "step x decode steps/s, against the read bandwidth above",
                  "    in the generations of (a) (prefill timed apart and taken out):",
                  f"{'new tokens':>12}{'MB/step':>9}{'ours GB/s':>11}{'% of read BW':>14}"
                  f"{'HF GB/s':>9}{'% of read BW':>14}"]
        for r in rows:
            frac = (f"{100 * r['ours_bandwidth_fraction']:>13.0f}%"
                    if "ours_bandwidth_fraction" in r else f"{'-':>14}")
            hf = ""
            if "hf_decode_bytes_per_s" in r:
                hf = f"{_gb(r['hf_decode_bytes_per_s']):>9}" + (
                    f"{100 * r['hf_bandwidth_fraction']:>13.0f}%"
                    if "hf_bandwidth_fraction" in r else f"{'-':>14}")
            lines.append(f"{r['new_tokens']:>12}{r['decode_bytes_per_step'] / 1e6:>9.1f}"
                         f"{_gb(r['ours_decode_bytes_per_s']):>11}{frac}{hf}")
    contexts = result.get("decode_path", {}).get("contexts", [])
    if contexts and "reference_bytes_per_s" in contexts[0]:
        lines += ["    one decode step of the reference after C cached positions (fastest of the "
                  "interleaved rounds of (f)):",
                  f"{'C':>12}{'MB/step':>9}{'ours GB/s':>11}{'% of read BW':>14}"]
        for c in contexts:
            lines.append(f"{c['context']:>12}{c['decode_bytes'] / 1e6:>9.1f}"
                         f"{_gb(c['reference_bytes_per_s']):>11}"
                         f"{100 * c['reference_bandwidth_fraction']:>13.0f}%")
    lines += _smollm_table(result.get("smollm"), result["plan"]["repeats"])
    rows = result.get("no_cache")
    if rows:
        lines += ["", "(c) the reference with its KV cache vs recomputing the whole sequence per "
                      "token (use_cache=False)",
                  f"{'new tokens':>12}{'cache s':>10}{'no cache s':>12}{'speed-up':>10}  how"]
        for r in rows:
            how = f"estimated from {len(r['sampled_lengths'])} timed steps"
            if "no_cache_measured_seconds" in r:
                how = (f"measured (estimate {r['no_cache_estimated_seconds']:.2f} s); same "
                       f"tokens: {'yes' if r['identical_tokens'] else 'NO'}")
            lines.append(f"{r['new_tokens']:>12}{r['cache_seconds']:>10.2f}"
                         f"{r['no_cache_seconds']:>12.2f}{r['speedup']:>9.1f}x  {how}")
    t = result.get("timing")
    if t:
        lines += ["", "(d) chapter 13's prefill/decode measurements (python -m checks.timing "
                      f"--size {t['size']})", timing.format_table(t)]
    nbs = result.get("notebooks")
    if nbs:
        lines += ["", "(e) solution notebooks, each in a fresh kernel (seconds)",
                  f"{'notebook':<28}{'kernel start':>13}{'cells':>8}{'total':>8}  status"]
        for r in nbs:
            status = "ok" if not r["error"] else f"ERROR {r['error']}"
            if r["stderr_outputs"]:
                status += f", {r['stderr_outputs']} stderr outputs"
            lines.append(f"{Path(r['notebook']).parent.name:<28}{r['kernel_start_seconds']:>13.1f}"
                         f"{r['cells_seconds']:>8.1f}{r['total_seconds']:>8.1f}  {status}")
        lines.append(f"{'slowest':<28}{'':>13}{max(r['cells_seconds'] for r in nbs):>8.1f}"
                     f"{max(r['total_seconds'] for r in nbs):>8.1f}")
    g = result.get("grading")
    if g:
        pts = (f"{g['points']:g}/{g['max_points']:g} points" if g["points"] is not None
               else "no result")
        lines += ["", f"(e) python -m checks grade, one complete submission ({g['notebooks']} "
                      f"solution notebooks): {g['seconds']:.1f} s wall, {pts}, exit status "
                      f"{g['returncode']}"]
        if g["per_notebook_seconds"]:
            lines.append("    per notebook: " + ", ".join(
                f"{name[:2]} {s:.1f}" for name, s in g["per_notebook_seconds"].items()))
    if result.get("load"):
        lines += ["", *format_load(result["load"])]
    if result.get("class"):
        lines += ["", *format_class(result["class"])]
    dp = result.get("decode_path")
    if dp:
        contexts = dp["contexts"]
        first, last = dp["variants"][0]["name"], dp["variants"][-1]["name"]
        width = max(len(v["name"]) for v in dp["variants"]) + 2
        head = "".join(f"{'C=' + str(c['context']):>18}" for c in contexts)
        lines += ["", "(f) the decode path, one change at a time: ms per decode step after C "
                      "cached positions (fastest of "
                      f"{len(contexts[0]['round_medians'][first])} interleaved rounds' medians; "
                      "x: speed-up over the previous line)",
                  f"{'variant':<{width}}{head}  same tokens"]
        prev = None
        for v in dp["variants"]:
            cells = ""
            for c in contexts:
                s = c["step_seconds"][v["name"]]
                gain = "" if prev is None else f"{c['step_seconds'][prev] / s:.2f}x"
                cells += f"{1000 * s:>11.2f}{gain:>7}"
            same = "yes" if dp["identical_tokens"][v["name"]] else "NO"
            lines.append(f"{v['name']:<{width}}{cells}  {same}")
            prev = v["name"]
        lines.append(f"{'all changes together':<{width}}" + "".join(
            f"{'':>11}{c['step_seconds'][first] / c['step_seconds'][last]:>6.2f}x"
            for c in contexts))
        lines.append(f"{REFERENCE_STEP:<{width}}" + "".join(
            f"{1000 * c['step_seconds'][REFERENCE_STEP]:>11.2f}{'':>7}" for c in contexts))
        pf = dp["prefill_seconds"]
        lines.append(f"prefill ({result['plan']['prompt_len']} tokens): LM head on every "
                     f"position {1000 * pf['every_position']:.1f} ms, on the last only "
                     f"{1000 * pf['last_only']:.1f} ms "
                     f"({pf['every_position'] / pf['last_only']:.2f}x)")
    lines += ["", f"total benchmark time: {result['seconds_total']:.0f} s"]
    return "\n".join(lines)


def _points(run: dict) -> str:
    """A grading run's points and exit status, and the first line it wrote to stderr if it
    failed."""
    said = ""
    if run["returncode"]:
        lines = [line for line in run["stderr_tail"].splitlines()
                 if line.strip() and not line.startswith("[")]       # not a progress line
        said = f": {lines[-1][:160]}" if lines else ""
    if run["points"] is None:
        return f"no result (exit status {run['returncode']}{said})"
    return f"{run['points']:g}/{run['max_points']:g} points, exit status {run['returncode']}{said}"


def format_load(load: dict) -> list[str]:
    """Section `load`: quiet against loaded, per notebook and for one submission's grading."""
    n = load["hogs"]
    lines = [f"(e) under load: each solution notebook (fresh kernel, start-up included) and one "
             f"submission's grading, quiet and with {n} CPU hog{'s' * (n != 1)} alongside "
             "(seconds; back to back)",
             f"{'notebook':<28}{'quiet':>8}{'loaded':>8}{'ratio':>7}{'hogs CPU s':>12}  status"]
    for r in load["notebooks"]:
        errors = [r[k]["error"] for k in ("quiet", "loaded") if r[k]["error"]]
        stderr = sum(r[k]["stderr_outputs"] for k in ("quiet", "loaded"))
        status = "ok" if not errors else f"ERROR {errors[0]}"
        if stderr:
            status += f", {stderr} stderr outputs"
        lines.append(f"{Path(r['notebook']).parent.name:<28}{r['quiet']['total_seconds']:>8.1f}"
                     f"{r['loaded']['total_seconds']:>8.1f}{r['ratio']:>6.2f}x"
                     f"{r['hog_cpu_seconds']:>12.0f}  {status}")
    slowest = max(load["notebooks"], key=lambda r: r["loaded"]["total_seconds"])
    lines.append(f"{'slowest loaded':<28}{'':>8}{slowest['loaded']['total_seconds']:>8.1f}"
                 f"  ({Path(slowest['notebook']).parent.name}; target: under 30 s)")
    g = load["grading"]
    lines += [f"    python -m checks grade, one complete submission: quiet "
              f"{g['quiet']['seconds']:.1f} s ({_points(g['quiet'])}), loaded "
              f"{g['loaded']['seconds']:.1f} s ({_points(g['loaded'])}; the hogs used "
              f"{g['loaded']['hog_cpu_seconds']:.0f} CPU s)",
              f"    loaded/quiet: {g['ratio']:.2f}x (target: at most 2.5)"
              + ("" if g["quiet"]["graded"] == g["loaded"]["graded"] == g["quiet"]["notebooks"]
                 else "; not comparable: a run stopped early")]
    return lines


def format_class(c: dict) -> list[str]:
    """Section `class`: the class graded with --jobs 1 and --jobs 2."""
    lines = [f"(e) a class of {c['students']} complete submissions ({c['notebooks']} notebooks, "
             "nbgrader's submitted/<student>/<chapter>/ layout) graded by python -m checks grade",
             f"{'':>4}{'--jobs':<8}{'graded':>8}{'seconds':>9}{'per notebook':>14}  result"]
    for jobs, run in c["runs"].items():
        lines.append(f"{'':>4}{jobs:<8}{run['graded']:>8}{run['seconds']:>9.1f}"
                     f"{run['seconds'] / max(run['graded'], 1):>14.2f}  {_points(run)}")
    how = "" if c["complete"] else " (notebooks per second: a run stopped early)"
    lines.append(f"    --jobs 2 against --jobs 1: {c['speedup']:.2f}x faster{how} (target: at "
                 f"least 1.6x); same result for every notebook: "
                 f"{'yes' if c['same_results'] else 'NO'}")
    for d in c.get("differences", []):
        for jobs, run in d["runs"].items():
            said = "; ".join(f"{name} {status} ({points:g} points)" + (f": {why}" if why else "")
                             for name, status, points, why in run["exercises"])
            lines.append(f"    {d['notebook']}, --jobs {jobs}: "
                         f"{run['error'] or said or 'the same exercises'}")
    return lines


def _smollm_table(s: dict | None, repeats: int) -> list[str]:
    """Section (g): the real model's generation table (empty when the section was skipped)."""
    if not s:
        return []
    head = "(g) the real model, SmolLM2-135M-Instruct"
    if "missing" in s:
        return ["", f"{head}: skipped, {s['missing']}"]
    rows = s["generate"]
    lines = ["", f"{head} (fp32, {s['weight_bytes'] / 1e6:.0f} MB of weights read per decode "
                 f"step): greedy generation at batch 1 from its {rows[0]['prompt_len']}-token "
                 f"chat prompt, best of {repeats} alternating runs; the reference (KV cache) vs "
                 "Hugging Face generate (eager, DynamicCache) on the same weights; target: "
                 "ours/HF >= 1.5x"]
    if s.get("hf_missing"):
        lines.append(f"    Hugging Face skipped: {s['hf_missing']}")
    lines.append(f"{'new tokens':>12}{'ours tok/s':>12}{'HF tok/s':>10}{'ours/HF':>9}"
                 f"{'same tokens':>13}{'ours decode':>13}{'HF decode':>11}")
    for r in rows:
        def bw(who):
            key = f"{who}_bandwidth_fraction"
            return f"{100 * r[key]:.0f}% BW" if key in r else (
                f"{_gb(r[f'{who}_decode_bytes_per_s'])} GB/s" if f"{who}_decode_bytes_per_s"
                in r else "-")
        hf = (f"{r['hf_tokens_per_s']:>10.1f}{r['ratio']:>8.2f}x"
              f"{('yes' if r['identical_tokens'] else 'NO @' + str(r['first_difference'])):>13}"
              if "hf_tokens_per_s" in r else f"{'-':>10}{'-':>9}{'-':>13}")
        lines.append(f"{r['new_tokens']:>12}{r['ours_tokens_per_s']:>12.1f}{hf}{bw('ours'):>13}"
                     f"{bw('hf'):>11}")
    lines.append("    decode: weights + KV cache read per decode step x decode steps/s (prefill "
                 "timed apart), as a share of the read bandwidth above (GB/s without it)")
    return lines


def _lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"not a list of positive lengths: {text!r}")
    return values


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {', '.join(unknown)}; the sections "
                                         f"are {', '.join(SECTIONS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.tools.benchmark",
        description="Benchmark the reference model against Hugging Face, the KV cache against "
                    "no cache, and the course's notebooks and grading; print ratios measured in "
                    "this process.")
    parser.add_argument("--json", metavar="FILE", help="write every number to FILE")
    parser.add_argument("--quick", action="store_true",
                        help="everything at a tiny size, in seconds (proves it works)")
    parser.add_argument("--lengths", type=_lengths, metavar="N,N,...",
                        help="new tokens per generation (default 128,512,1024)")
    parser.add_argument("--repeats", type=int, help="timed runs per implementation and length")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's default)")
    parser.add_argument("--skip", type=_sections, default=(), metavar="SECTIONS",
                        help=f"comma-separated sections to leave out: {', '.join(SECTIONS)}")
    parser.add_argument("--notebooks", type=lambda s: tuple(x.strip() for x in s.split(",")),
                        metavar="NN,NN", help="chapters for the notebook and grading sections "
                                              "(default: all thirteen)")
    parser.add_argument("--students", type=int, metavar="N",
                        help="complete submissions in the class of section `class` (default 20)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.lengths:
        plan = replace(plan, lengths=args.lengths,
                       cfg=replace(plan.cfg, max_seq_len=max(plan.cfg.max_seq_len,
                                                             plan.prompt_len + max(args.lengths))))
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        plan = replace(plan, repeats=args.repeats)
    if args.notebooks is not None:
        plan = replace(plan, notebooks=args.notebooks)
    if args.students is not None:
        if args.students < 1:
            parser.error("--students must be at least 1")
        plan = replace(plan, class_size=args.students)
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    result = run(plan, skip=args.skip,
                 progress=lambda text: print(f"... {text}", file=sys.stderr, flush=True))
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, default=str)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
