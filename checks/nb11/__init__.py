"""Checks for chapter 11: the LLaMA decoder block.

Conventions (docs/conventions.md): one block's parameters are the dict
{attn_norm [H], wqkv [H, (N_h + 2 N_kv) D_h] (columns Q | K | V, each head-major),
wo [N_h D_h, H], ffn_norm [H], w_gate [H, H_ff], w_up [H, H_ff], w_down [H_ff, H]};
attention_sublayer(x) = W_O(causal GQA(RoPE(Q), RoPE(K), V)) of RMSNorm(x) (no residual);
decoder_block: U = X + Attention(RMSNorm(X)), X' = U + SwiGLU(RMSNorm(U)).

Known mistakes are recognised by computing them from the same inputs and weights with the
reference pieces of chapters 03-10. The configurations are small and every size is different;
norm scales are random (so attn_norm and ffn_norm cannot be confused unnoticed), and the positions
have gaps: RoPE only sees differences of positions, so positions `start + arange(S)` would give the
same attention as `arange(S)` and could not show that the positions given were ignored.
"""

from __future__ import annotations

import math

import torch

from .. import reference as ref
from ..config import LLAMA2_7B, ModelConfig
from . import init
from ..engine import Check, builds_on, is_remote, values_close
from ..i18n import N_, _
from ..mistakes import Mistake, fix_first

NAMES = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
NORMS = ("attn_norm", "ffn_norm")
MATRICES = ("wqkv", "wo", "w_gate", "w_up", "w_down")
HIDDEN = ("B", "S", "H")
INIT_STD = ref.block.INIT_STD

# --------------------------------------------------------------------------------------------
# The mistakes this chapter diagnoses, in the words a failure shows.

ROPE_ON_V = Mistake("rope_on_v", N_(
    "RoPE also rotated V: positions enter through the queries and keys only (they decide WHO "
    "attends to whom); the values are mixed as they are, so V is not rotated"))
POSITIONS_IGNORED = Mistake("positions_ignored", N_(
    "ignored `positions`: rotated by 0, 1, ..., S-1 (torch.arange(S)) instead of the positions "
    "given; a sequence may start anywhere and its positions need not be consecutive"))
ROPE_Q_ONLY = Mistake("rope_on_q_only", N_(
    "rotated Q but not K: RoPE rotates both, each by its own token's position"))
ROPE_K_ONLY = Mistake("rope_on_k_only", N_(
    "rotated K but not Q: RoPE rotates both, each by its own token's position"))
NO_ROPE = Mistake("no_rope", N_(
    "no RoPE at all: rotate Q and K by their positions after splitting the heads"))
NON_CAUSAL = Mistake("no_causal_mask", N_(
    "non-causal attention: without the causal mask every token also reads the tokens after it; "
    "pass causal_mask(S) to the attention"))
GROUPING = Mistake("kv_heads_tiled", N_(
    "wrong KV grouping: query head h read KV head h % N_kv (as after `k.repeat(1, G, 1, 1)`); "
    "query heads 0..G-1 share KV head 0 (h // G), which grouped_query_attention does by itself "
    "with the N_kv-head K and V"))
NO_NORM = Mistake("no_attn_norm", N_(
    "no RMSNorm before the projections: the attention sublayer normalises its input with "
    "layer['attn_norm'] first (pre-norm)"))
FFN_NORM_IN_ATTN = Mistake("ffn_norm_in_attention", N_(
    "normalised with layer['ffn_norm']; the attention sublayer's scale is layer['attn_norm']"))
EPS_IGNORED = Mistake("norm_eps_ignored", N_(
    "ignored cfg.norm_eps: pass eps=cfg.norm_eps to rms_norm"))
BASE_IGNORED = Mistake("rope_base_ignored", N_(
    "ignored cfg.rope_base: pass base=cfg.rope_base to apply_rope"))
ROTARY_DIM_IGNORED = Mistake("rotary_dim_ignored", N_(
    "ignored cfg.rotary_dim: only the first rotary_dim features of each head rotate; pass "
    "rotary_dim=cfg.rotary_dim to apply_rope"))
HALF_PAIRING = Mistake("half_pairing", N_(
    "rotated with the 'half' pairing (interleaved=False); the course's weights use the default "
    "interleaved pairing (2i, 2i+1)"))
MERGE_NO_TRANSPOSE = Mistake("merged_without_transpose", N_(
    "merged the heads with a plain reshape of [B, N_h, S, D_h]: move the head axis back next to "
    "D_h first ([B, S, N_h, D_h]), as merge_heads does"))
KV_SWAPPED = Mistake("k_and_v_swapped", N_(
    "took K and V from the wrong column blocks: wqkv's columns are Q | K | V, in this order"))
WITH_RESIDUAL = Mistake("residual_in_sublayer", N_(
    "added the residual x: attention_sublayer returns the sublayer's output only; decoder_block "
    "adds x"))
NO_WO = Mistake("no_output_projection", N_(
    "forgot the output projection W_O (layer['wo']) after merging the heads"))
SCALE_BY_H = Mistake("scaled_by_sqrt_h", N_(
    "scaled the scores by 1/sqrt(H), the model width (cfg.hidden_size); each head scales its "
    "scores by 1/sqrt(D_h), its own width (cfg.head_dim)"))
SCALE_BY_HEADS = Mistake("scaled_by_sqrt_heads_width", N_(
    "scaled the scores by 1/sqrt(N_h * D_h), the width of all heads together; each head scales its"
    " scores by 1/sqrt(D_h), its own width (cfg.head_dim)"))
SCALE_BY_H_OVER_N_H = Mistake("scaled_by_sqrt_h_over_n_h", N_(
    "scaled the scores by 1/sqrt(H // N_h): that is a head's width only when D_h = H / N_h; each "
    "head scales its scores by 1/sqrt(D_h), its own width (cfg.head_dim)"))
SCALE_BY_H_HEADS = Mistake("scaled_by_sqrt_h", N_(
    "scaled the scores by 1/sqrt(H) = 1/sqrt(N_h * D_h), the width of all heads together; each "
    "head scales its scores by 1/sqrt(D_h), its own width (cfg.head_dim)"))

NO_ATTN_RESIDUAL = Mistake("no_attention_residual", N_(
    "missing residual around attention: U = X + Attention(RMSNorm(X)), the sublayer's output is "
    "ADDED to X"))
NO_FFN_RESIDUAL = Mistake("no_ffn_residual", N_(
    "missing residual around the FFN: the block returns U + SwiGLU(RMSNorm(U)), not the FFN's "
    "output alone"))
NO_RESIDUALS = Mistake("no_residuals", N_(
    "missing residuals: both sublayers add their output to their input, U = X + Attention(...) and"
    " X' = U + SwiGLU(...)"))
POST_NORM = Mistake("post_norm", N_(
    "post-norm: normalised AFTER the residual add, Norm(X + Sublayer(X)); LLaMA is pre-norm, X + "
    "Sublayer(Norm(X)), and the residual path never passes through a norm"))
POST_NORM_TOO = Mistake("post_norm_on_top", N_(
    "post-norm on top of pre-norm: normalised the sum after each residual add as well; in a "
    "pre-norm block the residual path never passes through a norm, the block returns U + "
    "SwiGLU(RMSNorm(U)) as it is"))
PARALLEL = Mistake("ffn_parallel_to_attention", N_(
    "ran the FFN on X in parallel with attention (X + Attn(X) + FFN(X), GPT-J style); in LLaMA the"
    " FFN reads U, the output of the attention step"))
FFN_RESIDUAL_FROM_X = Mistake("second_residual_adds_x", N_(
    "the second residual adds X; it adds U, the FFN's own input: X' = U + SwiGLU(RMSNorm(U))"))
FFN_NO_NORM = Mistake("no_ffn_norm", N_(
    "no RMSNorm before the FFN: X' = U + SwiGLU(RMSNorm(U)), with layer['ffn_norm']"))
ATTN_NORM_IN_FFN = Mistake("attn_norm_in_ffn", N_(
    "normalised the FFN's input with layer['attn_norm']; each sublayer has its own scale: the "
    "FFN's is layer['ffn_norm']"))
NO_FFN = Mistake("no_ffn", N_(
    "left out the FFN sublayer: after U = X + Attention(...), add SwiGLU(RMSNorm(U))"))
GATE_UP_SWAPPED = Mistake("gate_and_up_swapped", N_(
    "swapped w_gate and w_up: SwiGLU is (silu(x @ w_gate) * (x @ w_up)) @ w_down, the SiLU goes on"
    " the gate"))
AND_POSITIONS_IGNORED = N_("{mistake}; and ignored `positions` (used torch.arange(S))")
IN_SUBLAYER = N_("in the attention sublayer: {mistake}")
RESIDUAL_TWICE = Mistake("residual_in_sublayer", N_(
    "the attention sublayer added the residual x: attention_sublayer returns the sublayer's "
    "output only; so x was added twice"))
IN_PLACE = Mistake("residual_added_in_place", N_(
    "changed x in place (`x += ...` or `x.add_(...)`): the caller still needs x; build the "
    "residual sums as new tensors (`u = x + ...`)"))

# --------------------------------------------------------------------------------------------
# The course's own block is not an answer: calling checks.reference's version of the exercise
# (however it was imported or renamed) is caught by its code object while the learner's function
# runs. The earlier chapters' pieces (rms_norm, apply_rope, ...) stay allowed: they are the
# building blocks this chapter assembles.

_REFERENCE_HINT = N_("this exercise asks you to assemble the block yourself from the earlier "
                     "chapters' pieces (rms_norm, split_qkv, apply_rope, grouped_query_attention, "
                     "swiglu_ffn, ...), not to call the course's finished {name}")


def _no_reference(c: Check, *names: str) -> None:
    """Make `c.call` fail if the learner's function reaches checks.reference's `names`."""
    c.forbid_functions([getattr(ref.block, n) for n in names], _(_REFERENCE_HINT))


# --------------------------------------------------------------------------------------------
# Configurations, weights and positions


def _cfg(c: Check, kind: str = "gqa", *, decoupled: bool = False, partial: bool = False,
         base: float = 10000.0, eps: float = 1e-5) -> ModelConfig:
    """A small config; with `decoupled`, head_dim != hidden_size // n_heads (so that scaling by
    sqrt(H // N_h) shows), and H - N_h * D_h is never -2, -1, 1 or 2 (so that counting W_O as
    H x H is no count of norms)."""
    if kind == "gqa":
        n_kv, g = c.sizes(2, 2, 4)                 # {2, 3} in some order: h % N_kv != h // G
    elif kind == "mqa":
        n_kv, g = 1, c.randint(2, 5)
    else:  # mha
        n_kv, g = c.randint(2, 5), 1
    n_h = n_kv * g
    d = c.choice([4, 6, 8])
    if decoupled:
        h = n_h * d + c.choice([-4, 6, 8])
        h = h if h >= 8 else n_h * d + 4
    else:
        h = n_h * d
    d_r = d - 2 if partial else d
    h_ff = 2 * h + c.randint(1, 9)
    return ModelConfig(vocab_size=97, hidden_size=h, n_heads=n_h, n_kv_heads=n_kv, head_dim=d,
                       ffn_hidden_size=h_ff, n_layers=2, rope_base=base, rotary_dim=d_r,
                       norm_eps=eps, max_seq_len=512)


def random_layer(c: Check, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Random weights of unit-ish scale and random norm scales (not ones: they must matter)."""
    h, d, h_ff = cfg.hidden_size, cfg.head_dim, cfg.ffn_hidden_size
    width = (cfg.n_heads + 2 * cfg.n_kv_heads) * d
    return {
        "attn_norm": 1.0 + 0.4 * c.randn(h),
        "wqkv": c.randn(h, width, scale=1.2 / math.sqrt(h)),
        "wo": c.randn(cfg.n_heads * d, h, scale=1 / math.sqrt(cfg.n_heads * d)),
        "ffn_norm": 1.0 + 0.4 * c.randn(h),
        "w_gate": c.randn(h, h_ff, scale=1 / math.sqrt(h)),
        "w_up": c.randn(h, h_ff, scale=1 / math.sqrt(h)),
        "w_down": c.randn(h_ff, h, scale=1 / math.sqrt(h_ff)),
    }


def random_positions(c: Check, b: int, s: int, *, batched: bool) -> torch.Tensor:
    """Increasing positions from a random start, with at least one gap: [S], or [B, S] (each
    sequence its own)."""
    rows = b if batched else 1
    steps = torch.randint(1, 4, (rows, s), generator=c.gen)
    steps[:, 0] = torch.randint(0, 40, (rows,), generator=c.gen)
    if s > 1:
        steps[:, c.randint(1, s)] = 2 + c.randint(0, 2)
    positions = steps.cumsum(-1)
    return positions if batched else positions[0]


# --------------------------------------------------------------------------------------------
# Known-wrong variants, built from the reference pieces


def _attention(x, layer, cfg, positions, *, norm="attn_norm", eps=None, rope=("q", "k"),
               arange=False, base=None, rotary_dim=-1, interleaved=True, causal=True,
               tile=False, merge_transposed=True, swap_kv=False, wo=True, residual=False,
               scale=None):
    """attention_sublayer with the named mistakes (no keyword: the correct computation);
    `scale`: the scores divided by sqrt(scale) instead of sqrt(D_h)."""
    b, s, _h = x.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    eps = cfg.norm_eps if eps is None else eps
    h = x if norm is None else ref.rms_norm(x, layer[norm], eps)
    q, k, v = ref.split_qkv(h @ layer["wqkv"], n_h, n_kv, d)
    if swap_kv:
        k, v = v, k
    pos = torch.arange(s) if arange else positions
    kw = {"base": cfg.rope_base if base is None else base,
          "rotary_dim": cfg.rotary_dim if rotary_dim == -1 else rotary_dim,
          "interleaved": interleaved}
    q = ref.apply_rope(q, pos, **kw) if "q" in rope else q
    k = ref.apply_rope(k, pos, **kw) if "k" in rope else k
    v = ref.apply_rope(v, pos, **kw) if "v" in rope else v
    if tile:
        k, v = k.repeat(1, n_h // n_kv, 1, 1), v.repeat(1, n_h // n_kv, 1, 1)
    if scale is not None:  # (q * sqrt(D_h / scale)) k^T / sqrt(D_h) = q k^T / sqrt(scale)
        q = q * math.sqrt(d / scale)
    out = ref.grouped_query_attention(q, k, v, ref.causal_mask(s) if causal else None)
    merged = ref.merge_heads(out) if merge_transposed else out.reshape(b, s, n_h * d)
    o = merged @ layer["wo"] if wo else merged
    return x + o if residual else o


def _attention_mixups(x, layer, cfg, positions) -> dict:
    def v(**kw):
        return lambda: _attention(x, layer, cfg, positions, **kw)

    wrong = {
        ROPE_ON_V: v(rope=("q", "k", "v")),
        POSITIONS_IGNORED: v(arange=True),
        NON_CAUSAL: v(causal=False),
        ROPE_Q_ONLY: v(rope=("q",)),
        ROPE_K_ONLY: v(rope=("k",)),
        NO_ROPE: v(rope=()),
        WITH_RESIDUAL: v(residual=True),
        NO_NORM: v(norm=None),
        FFN_NORM_IN_ATTN: v(norm="ffn_norm"),
        HALF_PAIRING: v(interleaved=False),
        MERGE_NO_TRANSPOSE: v(merge_transposed=False),
        KV_SWAPPED: v(swap_kv=True),
        NO_WO: v(wo=False),
        _and_positions_ignored(ROPE_ON_V): v(rope=("q", "k", "v"), arange=True),
        _and_positions_ignored(NON_CAUSAL): v(causal=False, arange=True),
    }
    if 1 < cfg.n_kv_heads < cfg.n_heads:
        wrong[GROUPING] = v(tile=True)
    if cfg.norm_eps != 1e-5:
        wrong[EPS_IGNORED] = v(eps=1e-5)
    if cfg.rope_base != 10000.0:
        wrong[BASE_IGNORED] = v(base=10000.0)
    if cfg.rotary_dim != cfg.head_dim:
        wrong[ROTARY_DIM_IGNORED] = v(rotary_dim=None)
    for mistake, width in _scale_mistakes(cfg):
        wrong[mistake] = v(scale=width)
    return wrong


def _and_positions_ignored(mistake: Mistake) -> Mistake:
    """Two mistakes at once: `mistake`, and the positions given ignored."""
    return Mistake(f"{mistake.key}_and_positions_ignored",
                   _(AND_POSITIONS_IGNORED).format(mistake=_(mistake)))


def _scale_mistakes(cfg: ModelConfig) -> list[tuple[Mistake, int]]:
    """Scores scaled by the width of the model, or of all heads, or H // N_h, instead of one
    head's: in these configs none is D_h when D_h != H / N_h (H // N_h is not D_h either)."""
    h, heads = cfg.hidden_size, cfg.n_heads * cfg.head_dim
    widths = {SCALE_BY_H_HEADS: h} if h == heads else {
        SCALE_BY_H: h, SCALE_BY_HEADS: heads, SCALE_BY_H_OVER_N_H: h // cfg.n_heads}
    return [(m, w) for m, w in widths.items() if w != cfg.head_dim]


def _block(x, layer, cfg, positions, *, structure="pre", **attn):
    """decoder_block with a structural mistake and/or a mistake inside the attention sublayer."""
    eps = cfg.norm_eps

    def attention(t, **more):
        return _attention(t, layer, cfg, positions, **{**attn, **more})

    def ffn(t, swap=False):
        gate, up = (layer["w_up"], layer["w_gate"]) if swap else (layer["w_gate"], layer["w_up"])
        return ref.swiglu_ffn(t, gate, up, layer["w_down"])

    def norm(t, name="ffn_norm"):
        return ref.rms_norm(t, layer[name], eps)

    if structure == "post":        # Norm(X + Sublayer(X)), the sublayers without their own norm
        u = norm(x + attention(x, norm=None), "attn_norm")
        return norm(u + ffn(u))
    if structure == "post_too":    # pre-norm sublayers, and the sums normalised as well
        u = norm(x + attention(x), "attn_norm")
        return norm(u + ffn(norm(u)))
    if structure == "parallel":
        return x + attention(x) + ffn(norm(x))
    u = attention(x) if structure in ("no_attn_residual", "no_residuals") else x + attention(x)
    if structure == "no_ffn":
        return u
    if structure == "ffn_no_norm":
        return u + ffn(u)
    mid = ffn(norm(u, "attn_norm" if structure == "attn_norm_in_ffn" else "ffn_norm"),
              swap=structure == "gate_up_swapped")
    if structure in ("no_ffn_residual", "no_residuals"):
        return mid
    if structure == "ffn_residual_from_x":
        return x + mid
    return u + mid


def _block_mixups(x, layer, cfg, positions) -> dict:
    def v(**kw):
        return lambda: _block(x, layer, cfg, positions, **kw)

    wrong = {
        NO_ATTN_RESIDUAL: v(structure="no_attn_residual"),
        NO_FFN_RESIDUAL: v(structure="no_ffn_residual"),
        NO_RESIDUALS: v(structure="no_residuals"),
        POST_NORM: v(structure="post"),
        POST_NORM_TOO: v(structure="post_too"),
        PARALLEL: v(structure="parallel"),
        FFN_RESIDUAL_FROM_X: v(structure="ffn_residual_from_x"),
        FFN_NO_NORM: v(structure="ffn_no_norm"),
        ATTN_NORM_IN_FFN: v(structure="attn_norm_in_ffn"),
        NO_FFN: v(structure="no_ffn"),
        GATE_UP_SWAPPED: v(structure="gate_up_swapped"),
        # The sublayer's mistakes, seen through the whole block.
        RESIDUAL_TWICE: v(residual=True),
    }
    for mistake, attn in (_attention_mistakes(cfg)):
        wrong.setdefault(mistake.with_text(_(IN_SUBLAYER).format(mistake=_(mistake))), v(**attn))
    return wrong


def _attention_mistakes(cfg):
    mistakes = [(ROPE_ON_V, {"rope": ("q", "k", "v")}), (POSITIONS_IGNORED, {"arange": True}),
                (NON_CAUSAL, {"causal": False}), (NO_ROPE, {"rope": ()}),
                (ROPE_Q_ONLY, {"rope": ("q",)}), (ROPE_K_ONLY, {"rope": ("k",)}),
                (NO_NORM, {"norm": None}), (FFN_NORM_IN_ATTN, {"norm": "ffn_norm"}),
                (HALF_PAIRING, {"interleaved": False}),
                (MERGE_NO_TRANSPOSE, {"merge_transposed": False}),
                (KV_SWAPPED, {"swap_kv": True}), (NO_WO, {"wo": False})]
    if 1 < cfg.n_kv_heads < cfg.n_heads:
        mistakes.append((GROUPING, {"tile": True}))
    if cfg.norm_eps != 1e-5:
        mistakes.append((EPS_IGNORED, {"eps": 1e-5}))
    if cfg.rope_base != 10000.0:
        mistakes.append((BASE_IGNORED, {"base": 10000.0}))
    if cfg.rotary_dim != cfg.head_dim:
        mistakes.append((ROTARY_DIM_IGNORED, {"rotary_dim": None}))
    mistakes += [(mistake, {"scale": width}) for mistake, width in _scale_mistakes(cfg)]
    return mistakes


# --------------------------------------------------------------------------------------------
# Shared by attention_sublayer and decoder_block


def _label(cfg: ModelConfig, b: int, s: int, positions: torch.Tensor, extra: str = "") -> str:
    kind = ("MHA" if cfg.n_kv_heads == cfg.n_heads else
            "MQA" if cfg.n_kv_heads == 1 else "GQA")
    parts = [f"{kind}: B={b}, S={s}, H={cfg.hidden_size}, N_h={cfg.n_heads}, "
             f"N_kv={cfg.n_kv_heads}, D_h={cfg.head_dim}"]
    if cfg.rotary_dim != cfg.head_dim:
        parts.append(f"rotary_dim={cfg.rotary_dim}")
    if cfg.rope_base != 10000.0:
        parts.append(f"rope_base={cfg.rope_base:g}")
    if cfg.norm_eps != 1e-5:
        parts.append(f"norm_eps={cfg.norm_eps:g}")
    parts.append("positions [S] " + str(positions.tolist()) if positions.dim() == 1 else
                 _("positions [B, S], one row per sequence"))
    return ", ".join(parts) + extra


def _run(c: Check, cfg: ModelConfig, *, b: int, s: int, batched: bool, want_fn, mixups_fn,
         what: str, extra: str = ""):
    x = c.randn(b, s, cfg.hidden_size, scale=2.5)
    layer = random_layer(c, cfg)
    positions = random_positions(c, b, s, batched=batched)
    got = c.call(x, layer, cfg, positions)  # an input changed in place: Check(in_place=...)
    with torch.no_grad():
        want = want_fn(x, layer, cfg, positions)
    shown = f"{what} ({_label(cfg, b, s, positions, extra)})"
    c.expect_tensor(got, want, what=shown, dims=HIDDEN, wrong=mixups_fn(x, layer, cfg, positions))
    c.properties.remove(shown)  # the pass summary lists the properties, not every case
    return x, layer, positions, got


def _cases(c: Check, thorough: bool):
    """(cfg, B, S, batched positions, label suffix): GQA, MHA, MQA, decoupled head_dim, partial
    rotation, another base and eps, [S] and [B, S] positions, one token."""
    cases = []
    b, s = c.sizes(2, 2, 8)
    s += 2
    cases.append((_cfg(c, "gqa"), b, s, False))
    cases.append((_cfg(c, "gqa", decoupled=True, partial=True, base=c.choice([500.0, 1e6]),
                       eps=c.choice([0.05, 0.2])), b, s, True))
    cases.append((_cfg(c, "mha"), b, s, False))
    cases.append((_cfg(c, "mqa", base=500.0), b, s, True))
    if thorough:
        for _n in range(4):
            b, s = c.sizes(2, 2, 8)
            cases.append((_cfg(c, c.choice(["gqa", "mha", "mqa"]),
                               decoupled=c.choice([False, True]), partial=c.choice([False, True]),
                               base=c.choice([10000.0, 500.0]), eps=c.choice([1e-5, 0.1])),
                          b, s + 2, c.choice([False, True])))
        cases.append((_cfg(c, "gqa"), 2, 1, False))     # one token: it attends to itself only
    return cases


# --------------------------------------------------------------------------------------------
# Exercise 1: init_block_params (the random-initialisation rules: checks.nb11.init)

TRANSPOSED = Mistake("transposed_weights", N_(
    "transposed: the course's weights are [in_features, out_features] and applied as x @ W "
    "(nn.Linear's own weight is [out, in])"))
KV_WITH_N_H = Mistake("kv_with_n_h_heads", N_(
    "K and V have only N_kv heads: wqkv has (N_h + 2 * N_kv) * D_h columns, Q | K | V"))
HEAD_WIDTH_FROM_H = Mistake("head_width_from_h", N_(
    "used H // N_h for the head width; read cfg.head_dim"))
WO_H_BY_H = Mistake("wo_as_h_by_h", N_(
    "W_O takes the N_h * D_h features of the concatenated heads: [N_h * D_h, H] (which is [H, H] "
    "only when D_h = H / N_h)"))
NORM_NOT_VECTOR = Mistake("norm_not_a_vector", N_(
    "a norm's scale is one number per hidden feature: shape [H]"))
SEPARATE_QKV = Mistake("separate_q_k_v", N_(
    "the layout fuses the three projections into one matrix: wqkv = [W_Q | W_K | W_V], [H, (N_h "
    "+ 2 * N_kv) * D_h]"))
NORM_NAMES = Mistake("norm_names", N_(
    "name the two norm scales attn_norm (before attention) and ffn_norm"))
OTHER_NAMES = Mistake("other_names", N_("use the names of the parameter layout exactly"))
DTYPE_IGNORED = Mistake("dtype_ignored", N_(
    "create every tensor with dtype=dtype (the norms too)"))
NORM_NOT_ONE = Mistake("norm_not_one", N_(
    "a norm's scale starts at exactly one, so that the norm starts out as the plain "
    "normalisation (torch.ones)"))


def _init_cfgs(c: Check) -> list[ModelConfig]:
    """GQA with head_dim != H / N_h (and != H // N_h: the extra width is a multiple of N_h, so a
    head width taken from H shows at every seed), and MHA: every weight matrix has at least 500
    entries."""
    n_kv, g = c.sizes(2, 2, 4)
    d = c.choice([8, 10])
    n_h = n_kv * g
    gqa = ModelConfig(vocab_size=97, hidden_size=n_h * (d + c.choice([1, 2])), n_heads=n_h,
                      n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=80 + c.randint(0, 20),
                      n_layers=2, max_seq_len=64)
    n = c.randint(3, 6)
    mha = ModelConfig(vocab_size=97, hidden_size=8 * n, n_heads=n, n_kv_heads=n,
                      ffn_hidden_size=24 * n + 4, n_layers=2, max_seq_len=64)
    return [gqa, mha]


def _cfg_text(cfg: ModelConfig) -> str:
    return (f"H={cfg.hidden_size}, N_h={cfg.n_heads}, N_kv={cfg.n_kv_heads}, "
            f"D_h={cfg.head_dim}, H_ff={cfg.ffn_hidden_size}")


def _shape_hint(name: str, got: tuple, want: tuple, cfg: ModelConfig) -> Mistake | None:
    h, d, n_h, n_kv = cfg.hidden_size, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    if len(want) == 2 and got == want[::-1]:
        return TRANSPOSED
    if name == "wqkv" and len(got) == 2 and got[0] == h:
        if got[1] == 3 * h or got[1] == 3 * n_h * d:
            return KV_WITH_N_H
        if got[1] == (n_h + 2 * n_kv) * (h // n_h):
            return HEAD_WIDTH_FROM_H
    if name == "wo" and got == (h, h):
        return WO_H_BY_H
    if name in NORMS and len(got) != 1:
        return NORM_NOT_VECTOR
    return None


def _expect_layout(c: Check, got, cfg: ModelConfig, dtype: torch.dtype, label: str) -> None:
    if not isinstance(got, dict):
        c.fail(_("returned {kind}; expected a dict of the 7 tensors of one block ({names}).")
               .format(kind=type(got).__name__, names=", ".join(NAMES)))
    keys = set(got)
    missing = [n for n in NAMES if n not in keys]
    extra = sorted(str(k) for k in keys - set(NAMES))
    if missing or extra:
        hint = OTHER_NAMES
        if {"wq", "wk", "wv"} & keys or {"w_q", "w_k", "w_v"} & keys:
            hint = SEPARATE_QKV
        elif keys & {"gamma", "norm", "norm1", "norm2", "ln_1", "ln_2"}:
            hint = NORM_NAMES
        text = []
        if missing:
            text.append(_("missing {names}").format(names=", ".join(missing)))
        if extra:
            text.append(_("unexpected {names}").format(names=", ".join(extra)))
        c.fail(_("the dict's keys are not the layout's ({problems}); expected exactly {names}.")
               .format(problems="; ".join(text), names=", ".join(NAMES)), hint)
    shapes = ref.block.block_shapes(cfg)
    for name in NAMES:
        t = got[name]
        if not isinstance(t, torch.Tensor):
            c.fail(_("{name} is {kind}; expected a torch.Tensor.").format(
                name=name, kind=type(t).__name__))
        if tuple(t.shape) != shapes[name]:
            c.fail(_("{name} has shape {got}, expected {want} ({case}).").format(
                name=name, got=list(t.shape), want=list(shapes[name]), case=label),
                   _shape_hint(name, tuple(t.shape), shapes[name], cfg))
        if t.dtype != dtype:
            c.fail(_("{name} has dtype {got}, expected {want} ({case}).").format(
                name=name, got=t.dtype, want=dtype, case=label),
                   DTYPE_IGNORED if dtype != torch.float32 else None)
    c.note(_("the layout's 7 tensors, shapes [in, out]"))


def _expect_values(c: Check, got: dict, label: str) -> None:
    for name in NORMS:
        init.expect_ones(c, got[name], name, label, NORM_NOT_ONE)
    for name in MATRICES:
        init.expect_random_matrix(c, got[name], name, label)
    if torch.equal(got["w_gate"], got["w_up"]):
        c.fail(_("{a} and {b} hold the same numbers ({case}).").format(
            a="w_gate", b="w_up", case=label), init.SAME_DRAW)
    init.expect_own_tensors(c, _tensors(got), label)
    c.note(_("norms at one; weights N(0, 0.02^2), all different"))


def _tensors(p: dict) -> list[tuple[str, torch.Tensor]]:
    return [(n, p[n]) for n in NAMES]


def check_init_block_params(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("init_block_params", f, seed=seed) as c:
        _no_reference(c, "init_block_params")
        cfgs = _init_cfgs(c) + ([_init_cfgs(c)[0]] if thorough else [])
        rules = {"values": lambda p, label: _expect_values(c, p, label), "tensors": _tensors,
                 "randoms": lambda p: [(n, p[n]) for n in MATRICES], "local": not is_remote(f)}
        for cfg in cfgs:
            init.expect_generator_use(
                c, cfg, _cfg_text(cfg), layout=lambda p, label, cfg=cfg: _expect_layout(
                    c, p, cfg, torch.float32, label), **rules)
        c.headline(_("reproducible from a seeded generator"))
        cfg = _init_cfgs(c)[0]
        for dtype in ((torch.float64, torch.bfloat16, torch.float16) if thorough
                      else (torch.float64, torch.bfloat16)):
            label = f"{_cfg_text(cfg)}, dtype={str(dtype).removeprefix('torch.')}"
            got = c.call(cfg, generator=torch.Generator().manual_seed(c.randint(0, 1000)),
                         dtype=dtype)
            _expect_layout(c, got, cfg, dtype, label)
            _expect_values(c, got, label)
        c.headline(_("the layout's 7 tensors, shapes [in, out]"))
        c.headline(_("norms at one; weights N(0, 0.02^2), all different"))
        c.headline(_("float64 and bfloat16"))
        init.expect_global_generator(
            c, cfg, _cfg_text(cfg) + ", generator=None",
            layout=lambda p, label: _expect_layout(c, p, cfg, torch.float32, label), **rules)
        c.headline(_("generator=None uses torch's global generator"))


# --------------------------------------------------------------------------------------------
# Exercise 2: attention_sublayer


def check_attention_sublayer(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("attention_sublayer", f, seed=seed) as c:
        _no_reference(c, "attention_sublayer", "decoder_block")
        for cfg, b, s, batched in _cases(c, thorough):
            _run(c, cfg, b=b, s=s, batched=batched, want_fn=ref.attention_sublayer,
                 mixups_fn=_attention_mixups, what=_("attention_sublayer output"))
        c.note(_("GQA, MHA and MQA; D_h != H / N_h; rotary_dim < D_h; rope_base and norm_eps "
                 "from cfg"))
        c.note(_("positions [S] and [B, S], with gaps"))
        # Causality, on the learner's own function: changing the last token changes no earlier
        # output.
        cfg = _cfg(c, "gqa")
        b, s = 2, c.randint(4, 8)
        x, layer = c.randn(b, s, cfg.hidden_size), random_layer(c, cfg)
        positions = random_positions(c, b, s, batched=False)
        y = x.clone()
        y[:, -1] = c.randn(b, cfg.hidden_size)
        out_x, out_y = c.call(x, layer, cfg, positions), c.call(y, layer, cfg, positions)
        if isinstance(out_x, torch.Tensor) and isinstance(out_y, torch.Tensor) and \
                out_x.shape == out_y.shape == x.shape and \
                not values_close(out_x[:, :-1], out_y[:, :-1], 1e-5, 1e-4):
            c.fail(_("changing only the LAST token changed the outputs of earlier tokens."),
                   NON_CAUSAL)
        c.note(_("causal: later tokens never change earlier outputs"))


# --------------------------------------------------------------------------------------------
# Exercise 3: decoder_block


def check_decoder_block(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with builds_on("decoder_block", {"attention_sublayer": check_attention_sublayer}), \
            Check("decoder_block", f, seed=seed, in_place=IN_PLACE) as c:
        _no_reference(c, "decoder_block")
        for cfg, b, s, batched in _cases(c, thorough):
            _run(c, cfg, b=b, s=s, batched=batched, want_fn=ref.decoder_block,
                 mixups_fn=_block_mixups, what=_("decoder_block output"))
        c.note("U = X + Attention(RMSNorm(X)), X' = U + SwiGLU(RMSNorm(U))")
        c.note(_("GQA, MHA, MQA; positions [S] and [B, S]"))
        # Stacking: the block maps [B, S, H] to [B, S, H], so blocks can follow each other.
        cfg = _cfg(c, "gqa")
        b, s = c.sizes(2, 2, 7)
        x = c.randn(b, s, cfg.hidden_size)
        positions = random_positions(c, b, s, batched=False)
        layers = [random_layer(c, cfg) for _n in range(3)]
        got, want = x, x
        for layer in layers:
            got = c.call(got, layer, cfg, positions)
            if not isinstance(got, torch.Tensor):
                break
            want = ref.decoder_block(want, layer, cfg, positions)
        c.expect_tensor(got, want, what=_("three blocks stacked"), dims=HIDDEN,
                        atol=1e-4, rtol=1e-3)
        c.note(_("three blocks stack"))


# --------------------------------------------------------------------------------------------
# Exercise 4: block_param_count


COUNT_FLOAT = Mistake("returned_float", N_(
    "returned a float; a parameter count is an exact int (avoid `/`)"))
NORMS_LEFT_OUT = Mistake("norms_left_out", N_(
    "left out the two RMSNorm scales (2 * H: one per sublayer)"))
ONE_NORM = Mistake("one_norm_counted", N_(
    "counted only one RMSNorm scale; the block has two (attn_norm and ffn_norm)"))
LAYERNORM = Mistake("layernorm_gamma_and_beta", N_(
    "counted each norm as gamma and beta (LayerNorm); RMSNorm has only a scale, H numbers"))
FOUR_H_BY_H = Mistake("four_h_by_h_attention", N_(
    "counted four H x H attention matrices as in MHA: with GQA W_K and W_V have only N_kv * D_h "
    "columns"))
KV_COUNT_N_H = Mistake("kv_with_n_h_heads", N_(
    "counted W_K and W_V with N_h heads: they have N_kv heads (N_kv * D_h columns each)"))
H_AS_HEADS_WIDTH = Mistake("h_as_heads_width", N_(
    "used H for the width of the heads (N_h * D_h): with D_h != H / N_h, W_Q is [H, N_h * D_h] "
    "and W_O is [N_h * D_h, H]"))
WO_COUNT_H_BY_H = Mistake("wo_as_h_by_h", N_(
    "counted W_O as H x H: it takes the N_h * D_h features of the concatenated heads, "
    "[N_h * D_h, H] (H x H only when D_h = H / N_h)"))
TWO_FFN = Mistake("two_ffn_matrices", N_(
    "counted two FFN matrices; SwiGLU has three (W_gate, W_up, W_down)"))
NO_WO_COUNT = Mistake("wo_left_out", N_("forgot W_O (the output projection, N_h * D_h x H)"))
WITH_EMBEDDING = Mistake("embedding_included", N_(
    "added the embedding table (|V| x H): it belongs to the model, not to a block"))


def _count_mixups(cfg: ModelConfig, want: int) -> dict:
    """The counts of known mistakes. The random configs have H - N_h * D_h outside -2..2, so
    that W_O counted as H x H (H * (H - N_h * D_h) off) is never a count of norms."""
    h, d, n_h, n_kv, h_ff = (cfg.hidden_size, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads,
                             cfg.ffn_hidden_size)
    attention = h * (n_h + 2 * n_kv) * d + n_h * d * h
    ffn = 3 * h * h_ff
    return {
        COUNT_FLOAT: float(want),
        WO_COUNT_H_BY_H: want - n_h * d * h + h * h,
        NORMS_LEFT_OUT: want - 2 * h,
        ONE_NORM: want - h,
        LAYERNORM: want + 2 * h,
        FOUR_H_BY_H: 4 * h * h + ffn + 2 * h,
        KV_COUNT_N_H: 4 * h * n_h * d + ffn + 2 * h,
        H_AS_HEADS_WIDTH: h * (h + 2 * n_kv * d) + h * h + ffn + 2 * h,
        TWO_FFN: attention + 2 * h * h_ff + 2 * h,
        NO_WO_COUNT: want - n_h * d * h,
        WITH_EMBEDDING: want + cfg.vocab_size * h,
    }


def check_block_param_count(f, *, seed: int | None = None, thorough: bool = False) -> None:
    # a count may be read off the learner's own init_block_params (on the meta device)
    with builds_on("block_param_count", {"init_block_params": check_init_block_params}), \
            Check("block_param_count", f, seed=seed) as c:
        _no_reference(c, "block_param_count", "init_block_params")
        gqa_7b = ModelConfig(n_kv_heads=8)
        cases = [(LLAMA2_7B, "LLaMA-2-7B")]
        # D_h != H / N_h before LLaMA-2-7B with GQA, where 4 H x H matrices and W_K, W_V with
        # N_h heads are the same count
        for _n in range(4 if thorough else 2):
            cfg = _cfg(c, c.choice(["gqa", "mqa"]), decoupled=True)
            cases.append((cfg, _cfg_text(cfg)))
        cases.append((gqa_7b, _("LLaMA-2-7B shapes with GQA, N_kv = 8")))
        cfg = _cfg(c, "mha")
        cases.append((cfg, _cfg_text(cfg)))
        for cfg, label in cases:
            want = ref.block_param_count(cfg)
            what = f"block_param_count ({label})"
            c.expect_equal(c.call(cfg), want, what=what, wrong=_count_mixups(cfg, want))
            c.properties.remove(what)  # the pass summary lists the properties, not every case
        c.headline(_("the article's 202,383,360 for LLaMA-2-7B"))
        c.headline("GQA, MQA, D_h != H / N_h")


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "11.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "init_block_params": (
        init.CONSTANT, DTYPE_IGNORED, init.FAN_IN, init.FIXED_SEED, init.GENERATOR_IGNORED,
        KV_WITH_N_H, init.NONE_FRESH, init.NORM_ZEROS, NORM_NOT_ONE, init.REPEATED, init.SHARED,
        init.SAME_DRAW, SEPARATE_QKV, init.STD_ONE, TRANSPOSED, init.UNIFORM, WO_H_BY_H,
        HEAD_WIDTH_FROM_H, NORM_NAMES, NORM_NOT_VECTOR, OTHER_NAMES, init.NONE_NOT_GLOBAL,
        init.NONZERO_MEAN, init.UNINITIALISED, init.WRONG_STD),
    "attention_sublayer": (
        FFN_NORM_IN_ATTN, HALF_PAIRING, KV_SWAPPED, GROUPING, MERGE_NO_TRANSPOSE, NO_NORM,
        NON_CAUSAL, NO_WO, NO_ROPE, EPS_IGNORED, POSITIONS_IGNORED, WITH_RESIDUAL, BASE_IGNORED,
        ROPE_K_ONLY, ROPE_Q_ONLY, ROPE_ON_V, ROTARY_DIM_IGNORED, SCALE_BY_H_OVER_N_H,
        SCALE_BY_H_HEADS, SCALE_BY_HEADS),
    "decoder_block": (
        ATTN_NORM_IN_FFN, PARALLEL, GATE_UP_SWAPPED, GROUPING, NO_ATTN_RESIDUAL, NO_NORM,
        NON_CAUSAL, NO_FFN, FFN_NO_NORM, NO_FFN_RESIDUAL, NO_RESIDUALS, POSITIONS_IGNORED,
        POST_NORM, POST_NORM_TOO, IN_PLACE, RESIDUAL_TWICE, ROPE_ON_V, SCALE_BY_H_OVER_N_H,
        FFN_RESIDUAL_FROM_X, SCALE_BY_H_HEADS, SCALE_BY_HEADS, fix_first('attention_sublayer')),
    "block_param_count": (
        WITH_EMBEDDING, FOUR_H_BY_H, H_AS_HEADS_WIDTH, KV_COUNT_N_H, LAYERNORM, NORMS_LEFT_OUT,
        ONE_NORM, COUNT_FLOAT, TWO_FFN, WO_COUNT_H_BY_H, NO_WO_COUNT,
        fix_first('init_block_params')),
}
