"""Section `decode_path`: what each change to the decode path buys. One decode step timed at fixed
context lengths for a ladder of variants, from a naive one (a cache grown by concatenation, RoPE
tables recomputed for every position, `torch.no_grad`, Q and K rotated separately with cos/sin on
even and odd features, RMSNorm in four calls, grouped-query attention reading each KV head once
per query head) to the reference, one change at a time; and the prefill with the LM head on every
position against the last one only. Every variant's greedy tokens are checked against the
reference's.

Why a second forward pass here (`variant_forward`) beside `checks.reference`: the ladder needs
the reference's forward with each of its optimisations switchable, and the reference itself must
stay the one plain implementation learners read, with no flags. `variant_forward` reuses the
reference's own pieces (its RoPE rotors and rotation, its RMSNorm, its KVCache) wherever a variant
keeps them, and only spells out the older, slower ways the flags undo. The last rung turns every
change on and must equal the reference: its tokens are compared with `generate`'s, and the
reference's own `forward_with_cache` is timed beside it (REFERENCE_STEP).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ...reference import generation as gen
from ...reference import roofline
from ...reference.norms import rms_norm
from ...reference.rope import rope_frequencies
from .common import Plan, best, prompt_tokens


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
    prompt = prompt_tokens(cfg, plan.prompt_len)
    want = gen.generate(params, cfg, prompt, plan.check_tokens)
    identical = {v.name: torch.equal(variant_generate(params, cfg, prompt, plan.check_tokens, v),
                                     want) for v in VARIANTS}
    token = torch.randint(0, cfg.vocab_size, (1, 1), generator=torch.Generator().manual_seed(2))
    per_context = []
    for context in plan.decode_contexts:
        say(f"decode path: one step after {context} cached positions")
        rounds = _interleaved_rounds(_decode_steps(params, cfg, token, context), plan)
        per_context.append({"context": context,
                            "step_seconds": {name: min(t) for name, t in rounds.items()},
                            "round_medians": rounds,
                            "decode_bytes": roofline.decode_bytes(cfg, 1, context, 4)})
        if after_each:
            after_each()
    say("decode path: prefill, LM head on every position vs the last")
    return {"variants": [asdict(v) for v in VARIANTS], "identical_tokens": identical,
            "contexts": per_context, "prefill_seconds": _prefill_seconds(params, cfg, prompt)}


def _decode_steps(params, cfg, token, context: int) -> dict:
    """name -> (variant, one decode step after `context` cached positions) for every variant and
    the reference; all start from the same random cache, and each step can be repeated (it
    writes position `context` again)."""
    filled = torch.randn(cfg.n_layers, 2, 1, cfg.n_kv_heads, context + 1, cfg.head_dim)
    steps = {}
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
    return steps


def _interleaved_rounds(steps: dict, plan: Plan) -> dict[str, list[float]]:
    """Each step's median time per round, the steps taken in turn within a round and the order
    reversed every other round, so that all of them see the same machine."""
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
    return rounds


def _prefill_seconds(params, cfg, prompt) -> dict[str, float]:
    """The reference's prefill with the LM head on every position and on the last one only."""
    prefill = {}
    for last_only in (False, True):
        def call(last_only=last_only):
            with torch.inference_mode():
                cache = gen.KVCache(cfg, 1, prompt.shape[1])
                gen.forward_with_cache(prompt, params, cfg, cache, 0, last_only=last_only)
        prefill["last_only" if last_only else "every_position"] = best(call, repeats=5)
    return prefill


def format_decode_path(result: dict) -> list[str]:
    """Table (f): ms per decode step of each variant, the speed-up of each change, the
    reference's own step, and the prefill."""
    dp = result.get("decode_path")
    if not dp:
        return []
    contexts = dp["contexts"]
    first, last = dp["variants"][0]["name"], dp["variants"][-1]["name"]
    width = max(len(v["name"]) for v in dp["variants"]) + 2
    head = "".join(f"{'C=' + str(c['context']):>18}" for c in contexts)
    lines = ["", "(f) the decode path, one change at a time: ms per decode step after C "
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
    return lines
