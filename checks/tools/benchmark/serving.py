"""Section `serving`: chapter 15's server on the real model, SmolLM2-135M-Instruct (skipped with a
note when it is not installed): eight chats served one after another (`max_batch=1`) and
together (`max_batch=8`) through the paged cache and the continuous-batching scheduler
(`checks.reference.serving`), greedy, each chat with its own limit; tokens per second, mean time
to first token and mean time per output token for both, the throughput ratio (target on 2 CPU
cores: at least 3x), whether every answer is the same token for token both ways, and the KV
memory the blocks held against a cache preallocated for the longest request.
"""

from __future__ import annotations

import torch

from ...reference import serving
from .common import Plan

LIMITS = (12, 40, 48, 24, 32, 36, 28, 44)      # new tokens at most, per chat (the notebook's)


def run_serving(plan: Plan, say) -> dict:
    from ... import smollm

    if not smollm.available():
        return {"missing": str(smollm.ModelUnavailable())}
    say("serving: SmolLM2-135M-Instruct, loading")
    params, cfg = smollm.load()
    tok = smollm.tokenizer()
    chats = serving.CHATS[:plan.serving_chats]
    prompts = [tok.chat_prompt(q) for q in chats]
    limits = [min(n, plan.serving_tokens) for n in LIMITS[:len(chats)]]
    runs = {}
    for label, max_batch in (("one after another", 1), ("together", 8)):
        say(f"serving: {len(chats)} chats, {label}")
        runs[label] = serving.serve_chats(params, cfg, prompts, limits, stop_id=tok.im_end_id,
                                          max_batch=max_batch)
    alone, together = runs["one after another"], runs["together"]
    engine = together["engine"]
    per_block = (2 * cfg.n_layers * cfg.n_kv_heads * engine.cache.block_size * cfg.head_dim
                 * params["embed"].element_size())
    longest = max(len(p) for p in prompts) + max(limits)
    used = engine.blocks_in_use or [0]
    return {
        "chats": len(chats), "limits": limits, "threads": torch.get_num_threads(),
        "runs": {label: {k: run[k] for k in ("seconds", "tokens", "tokens_per_s", "ttft", "tpot")}
                 | {"steps": len(run["timeline"])} for label, run in runs.items()},
        "ratio": together["tokens_per_s"] / alone["tokens_per_s"],
        "same_tokens": [a["tokens"] == b["tokens"]
                        for a, b in zip(alone["results"], together["results"])],
        "kv_bytes_in_use_mean": per_block * sum(used) / len(used),
        "kv_bytes_in_use_max": per_block * max(used),
        "kv_bytes_preallocated": len(chats) * longest * per_block / engine.cache.block_size,
    }


def format_serving(result: dict) -> list[str]:
    """Table (h): chapter 15's server (nothing when the section was skipped)."""
    s = result.get("serving")
    if not s:
        return []
    head = "(h) serving many: chapter 15's paged cache and continuous batching on SmolLM2"
    if "missing" in s:
        return ["", f"{head}: skipped, {s['missing']}"]
    lines = ["", f"{head}: {s['chats']} chats, at most {max(s['limits'])} new tokens each, "
                 f"greedy, {s['threads']} thread(s); target: together / alone >= 3x on 2 cores",
             f"{'':20}{'tokens':>8}{'steps':>7}{'seconds':>9}{'tok/s':>8}{'mean TTFT':>11}"
             f"{'mean TPOT':>11}"]
    for label, r in s["runs"].items():
        lines.append(f"{label:20}{r['tokens']:>8}{r['steps']:>7}{r['seconds']:>9.2f}"
                     f"{r['tokens_per_s']:>8.1f}{r['ttft']:>10.2f}s{1e3 * r['tpot']:>9.0f}ms")
    lines.append(f"    throughput together / one after another: {s['ratio']:.2f}x; the same "
                 f"tokens both ways: {sum(s['same_tokens'])} of {len(s['same_tokens'])}")
    lines.append(f"    KV memory: paged {s['kv_bytes_in_use_mean'] / 2**20:.1f} MiB on average "
                 f"({s['kv_bytes_in_use_max'] / 2**20:.1f} at most), preallocated for the longest "
                 f"request {s['kv_bytes_preallocated'] / 2**20:.1f} MiB "
                 f"({100 * (1 - s['kv_bytes_in_use_mean'] / s['kv_bytes_preallocated']):.0f}% "
                 "of it unused)")
    return lines
