"""Section `no_cache`: the reference with its cache against recomputing the whole sequence for
every new token (`generate(..., use_cache=False)`), at the same lengths. Up to `no_cache_full_max`
new tokens the no-cache generation runs in full (and its tokens are compared); beyond, its time is
the sum over every step of one step's time interpolated from steps timed at evenly spaced lengths
(a full run at 1024 tokens would take minutes). Both are shown where both exist.
"""

from __future__ import annotations

import time

import torch

from ...reference import generation as gen
from .common import Plan, best, prompt_tokens


def run_no_cache(params, cfg, plan: Plan, cached: dict[int, float], say) -> list[dict]:
    """For each length: the cached generation's time (from the `generate` section, else timed
    here) against the no-cache one, measured in full and/or estimated from sampled steps."""
    prompt = prompt_tokens(cfg, plan.prompt_len)
    p = plan.prompt_len
    step_cache: dict[int, float] = {}

    def step_seconds(length: int) -> float:
        """One no-cache step: the whole sequence of `length` tokens through the model, the LM
        head on its last position (what `generate(..., use_cache=False)` does per token)."""
        if length not in step_cache:
            ids = torch.randint(0, cfg.vocab_size, (1, length),
                                generator=torch.Generator().manual_seed(length))
            with torch.inference_mode():
                step_cache[length] = best(
                    lambda: gen.full_forward(ids, params, cfg, last_only=True), warmup=1,
                    repeats=2)
        return step_cache[length]

    rows = []
    for n in plan.lengths:
        say(f"no cache: {n} new tokens")
        if n not in cached:
            cached[n] = best(lambda: gen.generate(params, cfg, prompt, n), repeats=plan.repeats)
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


def format_no_cache(result: dict) -> list[str]:
    """Table (c)."""
    rows = result.get("no_cache")
    if not rows:
        return []
    lines = ["", "(c) the reference with its KV cache vs recomputing the whole sequence per "
                 "token (use_cache=False)",
             f"{'new tokens':>12}{'cache s':>10}{'no cache s':>12}{'speed-up':>10}  how"]
    for r in rows:
        how = f"estimated from {len(r['sampled_lengths'])} timed steps"
        if "no_cache_measured_seconds" in r:
            how = (f"measured (estimate {r['no_cache_estimated_seconds']:.2f} s); same "
                   f"tokens: {'yes' if r['identical_tokens'] else 'NO'}")
        lines.append(f"{r['new_tokens']:>12}{r['cache_seconds']:>10.2f}"
                     f"{r['no_cache_seconds']:>12.2f}{r['speedup']:>9.1f}x  {how}")
    return lines
