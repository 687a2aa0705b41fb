"""The internals of chapter 13's roofline checks (prefill_flops, decode_step_bytes,
arithmetic_intensity; the checks themselves are in checks.nb13): each known mistake is the
count with one term changed, declared here with its words, and the sizes are drawn so that the
mistakes give different numbers. A multiply-add counts as 2 FLOPs; the chapter's text defines
what each count includes, and `checks.reference.generation` holds the answers.
"""

from __future__ import annotations

import functools

from ..config import ModelConfig
from ..engine import Check
from ..i18n import N_
from ..mistakes import Mistake

COUNT_HINT = N_("this exercise asks you to write the formula yourself; the course's {name} (in "
                "checks.reference) is what your answer is compared with")

# --------------------------------------------------------------------------------------------
# prefill_flops

MAC_AS_ONE = Mistake("multiply_add_as_one_flop", N_(
    "counted a multiply-add as 1 FLOP: it is 2 (a multiply and an add), so a [in, out] weight "
    "costs 2·in·out per token"))
NO_ATTENTION = Mistake("no_attention_products", N_(
    "left out attention's own products: the scores Q Kᵀ and the weighted sum of V are matrix "
    "products too (2·D_h FLOPs each per query-key pair and query head)"))
FULL_SQUARE = Mistake("full_square_of_scores", N_(
    "counted the full P x P score matrix: under the causal mask query i meets only keys 0..i, "
    "P(P+1)/2 pairs"))
SCORES_ONLY = Mistake("scores_only", N_(
    "counted only Q Kᵀ: the weighted sum of V (weights @ V) costs as much again"))
ATTENTION_KV_HEADS = Mistake("attention_on_kv_heads", N_(
    "counted attention for the N_kv KV heads: every one of the N_h query heads computes its own "
    "scores and weighted sum"))
KV_PROJ_REPEATED = Mistake("kv_projections_for_n_h_heads", N_(
    "counted the K and V projections for N_h heads (K/V repeated for every query head): with GQA, "
    "W_K and W_V have N_kv·D_h columns each"))
H_FOR_HEADS = Mistake("h_for_n_h_times_d_h", N_(
    "used H where N_h·D_h belongs (W_Q's columns, W_O's rows): they differ when head_dim is set "
    "explicitly"))
LM_HEAD_EVERYWHERE = Mistake("lm_head_on_every_position", N_(
    "ran the LM head on every prompt position: prefill needs only the last position's logits (the "
    "next token), B rows"))
PREFILL_NO_LM_HEAD = Mistake("no_lm_head", N_(
    "left out the LM head (B·H·|V| multiply-adds for the last positions)"))
NO_BATCH = Mistake("no_batch", N_(
    "left out the batch B: all B·P tokens go through every weight"))
ONE_LAYER_FLOPS = Mistake("one_layer", N_(
    "counted one layer: every one of the L layers does the same work"))
TWO_FFN = Mistake("two_ffn_matrices", N_(
    "counted two FFN matrices: SwiGLU has three (W_gate, W_up, W_down)"))
NO_WO = Mistake("no_w_o", N_("left out W_O, the attention output projection"))
EMBED_PRODUCT = Mistake("embedding_as_a_product", N_(
    "counted the embedding lookup as a product: it reads rows of the table, no FLOPs"))
FLOPS_FLOAT = Mistake("returns_float", N_(
    "returned a float; the FLOP count is an exact int (avoid `/` and float factors)"))

# --------------------------------------------------------------------------------------------
# decode_step_bytes

NO_KV_FACTOR = Mistake("cache_k_only", N_(
    "forgot the factor 2 of the cache: it holds K and V"))
NO_CACHE_WRITE = Mistake("no_cache_write", N_(
    "left out the cache write: the step reads the C cached positions and writes the new token's K "
    "and V, C + 1 positions in all"))
NEW_TWICE = Mistake("new_position_twice", N_(
    "counted the new position twice (written, then read again): count each cache entry the step "
    "touches once, C + 1 positions"))
CACHE_N_H = Mistake("cache_with_n_h_heads", N_(
    "counted N_h heads in the cache (K/V repeated for every query head): it holds the N_kv KV "
    "heads only"))
ELEMENTS = Mistake("elements_not_bytes", N_(
    "counted elements, not bytes: multiply by bytes_per_elem"))
BYTES_CACHE_ONLY = Mistake("bytes_per_elem_for_cache_only", N_(
    "multiplied only the cache by bytes_per_elem: the weights are stored in the same dtype"))
BYTES_WEIGHTS_ONLY = Mistake("bytes_per_elem_for_weights_only", N_(
    "multiplied only the weights by bytes_per_elem: the cache is stored in the same dtype"))
BITS = Mistake("bits_not_bytes", N_("counted bits, not bytes (multiplied by 8)"))
WHOLE_EMBEDDING = Mistake("whole_embedding_table", N_(
    "counted the whole embedding table: a decode step looks up only B of its rows (left out); the "
    "LM head is read in full"))
DECODE_NO_LM_HEAD = Mistake("no_lm_head", N_(
    "left out the LM head [H, |V|], read in full at every step"))
NO_NORMS = Mistake("no_norm_scales", N_(
    "left out the norm scales (2 per layer and the final one, H numbers each)"))
WEIGHTS_PER_SEQUENCE = Mistake("weights_once_per_sequence", N_(
    "read the weights once per sequence: one read serves the whole batch"))
CACHE_NO_BATCH = Mistake("cache_without_batch", N_(
    "left out the batch B in the cache: every sequence has its own K and V"))
ONE_LAYER_CACHE = Mistake("one_layer_of_cache", N_(
    "counted one layer's cache: every layer keeps its own K and V"))
ONE_LAYER_WEIGHTS = Mistake("one_layer_of_weights", N_(
    "counted one layer's weights: every layer's matrices are read"))
HARD_CODED_2 = Mistake("hard_coded_2_bytes", N_(
    "hard-coded 2 bytes per element (bf16); use bytes_per_elem"))
GIB = Mistake("returns_gib", N_("returned GiB; return the exact number of bytes as an int"))
GB = Mistake("returns_gb", N_("returned GB; return the exact number of bytes as an int"))
BYTES_FLOAT = Mistake("returns_float", N_(
    "returned a float; the byte count is an exact int (avoid `/` and float factors)"))

# --------------------------------------------------------------------------------------------
# arithmetic_intensity

BYTES_PER_FLOP = Mistake("bytes_per_flop", N_(
    "divided bytes by FLOPs: the intensity is FLOPs per byte"))
FLOOR_DIVISION = Mistake("floor_division", N_(
    "used // (floor division), which drops the fraction: use /"))
RETURNS_INT = Mistake("returns_int", N_(
    "returned an int: the intensity is a ratio, return a float (flops / num_bytes)"))
FLOPS_TWICE = Mistake("flops_counted_twice", N_(
    "counted each FLOP twice: the FLOP count already has 2 per multiply-add"))
PER_BIT = Mistake("divided_by_bits", N_("divided by bits (8 per byte)"))
NOT_A_FLOAT = Mistake("returns_no_float", N_("return a Python float: flops / num_bytes"))


# --------------------------------------------------------------------------------------------
# Sizes and counts


def roofline_cfg(c: Check) -> ModelConfig:
    """Sizes that tell the mistakes apart: distinct, GQA (N_kv >= 2, G >= 2), and a head_dim
    other than H / N_h, so that N_h·D_h, N_kv·D_h and H are three different numbers."""
    n_kv, g = c.sizes(2, 2, 5)
    n_h = n_kv * g
    d = c.choice([6, 10, 14])
    h = c.choice([40, 56, 72])
    return ModelConfig(vocab_size=c.randint(300, 900), hidden_size=h, n_heads=n_h,
                       n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=c.randint(100, 200),
                       n_layers=c.randint(3, 7), max_seq_len=4096)


def prefill_count(cfg: ModelConfig, b: int, p: int, *, per_mac: int = 2, kv_heads=None,
                  ffn: int = 3, wo: bool = True, attn: str = "triangle", attn_heads=None,
                  lm_head_rows=None, layers=None, width=None, embed: bool = False) -> int:
    """Prefill FLOPs with the named mistake (no keyword: the correct count). kv_heads / width /
    attn_heads: the heads of the K/V projections, the width used for N_h·D_h, the heads that
    compute attention; attn: "triangle", "square", "scores" (Q K^T only) or "none";
    lm_head_rows: positions through the LM head (default: the last of each prompt)."""
    h, d = cfg.hidden_size, cfg.head_dim
    q_width = cfg.n_heads * d if width is None else width
    kv_width = (cfg.n_kv_heads if kv_heads is None else kv_heads) * d
    tokens = b * p
    weights = h * q_width + 2 * h * kv_width + (q_width * h if wo else 0) + \
        ffn * h * cfg.ffn_hidden_size
    pairs = {"triangle": p * (p + 1) // 2, "square": p * p, "scores": p * (p + 1) // 2,
             "none": 0}[attn]
    products = 1 if attn == "scores" else 2
    heads = cfg.n_heads if attn_heads is None else attn_heads
    attention = products * b * heads * pairs * d
    rows = b if lm_head_rows is None else lm_head_rows
    lm_head = rows * h * cfg.vocab_size
    n_layers = cfg.n_layers if layers is None else layers
    total = n_layers * (tokens * weights + attention) + lm_head
    if embed:
        total += tokens * h * cfg.vocab_size
    return per_mac * total


def prefill_mixups(cfg: ModelConfig, b: int, p: int, want: int) -> dict:
    h = cfg.hidden_size
    f = functools.partial(prefill_count, cfg, b, p)
    return {
        MAC_AS_ONE: f(per_mac=1),
        NO_ATTENTION: f(attn="none"),
        FULL_SQUARE: f(attn="square"),
        SCORES_ONLY: f(attn="scores"),
        ATTENTION_KV_HEADS: f(attn_heads=cfg.n_kv_heads),
        KV_PROJ_REPEATED: f(kv_heads=cfg.n_heads),
        H_FOR_HEADS: f(width=h),
        LM_HEAD_EVERYWHERE: f(lm_head_rows=b * p),
        PREFILL_NO_LM_HEAD: f(lm_head_rows=0),
        NO_BATCH: prefill_count(cfg, 1, p),
        ONE_LAYER_FLOPS: f(layers=1),
        TWO_FFN: f(ffn=2),
        NO_WO: f(wo=False),
        EMBED_PRODUCT: f(embed=True),
        FLOPS_FLOAT: float(want),
    }


def decode_count(cfg: ModelConfig, b: int, c_len: int, s: int, *, kv_factor: int = 2,
                 new: int = 1, kv_heads=None, weight_s=None, cache_s=None, embed: bool = False,
                 lm_head: bool = True, norms: bool = True, weight_copies: int = 1,
                 cache_batch=None, layers_w=None, layers_kv=None, ffn: int = 3) -> int:
    """Decode-step bytes with the named mistake (no keyword: the correct count)."""
    h, d = cfg.hidden_size, cfg.head_dim
    nl = cfg.n_layers
    per_layer = (h * (cfg.n_heads + 2 * cfg.n_kv_heads) * d + cfg.n_heads * d * h
                 + ffn * h * cfg.ffn_hidden_size + (2 * h if norms else 0))
    weights = (nl if layers_w is None else layers_w) * per_layer + (h if norms else 0) + \
        (h * cfg.vocab_size if lm_head else 0) + (cfg.vocab_size * h if embed else 0)
    heads = cfg.n_kv_heads if kv_heads is None else kv_heads
    cache = kv_factor * (nl if layers_kv is None else layers_kv) * \
        (b if cache_batch is None else cache_batch) * (c_len + new) * heads * d
    return (weight_copies * weights * (s if weight_s is None else weight_s)
            + cache * (s if cache_s is None else cache_s))


def decode_mixups(cfg: ModelConfig, b: int, c_len: int, s: int, want: int) -> dict:
    f = functools.partial(decode_count, cfg, b, c_len, s)
    return {
        NO_KV_FACTOR: f(kv_factor=1),
        NO_CACHE_WRITE: f(new=0),
        NEW_TWICE: f(new=2),
        CACHE_N_H: f(kv_heads=cfg.n_heads),
        ELEMENTS: f(weight_s=1, cache_s=1),
        BYTES_CACHE_ONLY: f(weight_s=1),
        BYTES_WEIGHTS_ONLY: f(cache_s=1),
        BITS: want * 8,
        WHOLE_EMBEDDING: f(embed=True),
        DECODE_NO_LM_HEAD: f(lm_head=False),
        NO_NORMS: f(norms=False),
        WEIGHTS_PER_SEQUENCE: f(weight_copies=b),
        CACHE_NO_BATCH: f(cache_batch=1),
        ONE_LAYER_CACHE: f(layers_kv=1),
        ONE_LAYER_WEIGHTS: f(layers_w=1),
        TWO_FFN: f(ffn=2),
        HARD_CODED_2: f(weight_s=2, cache_s=2) if s != 2 else None,
        GIB: want / 2**30,
        GB: want / 1e9,
        BYTES_FLOAT: float(want),
    }


def intensity_mixups(flops, nbytes) -> dict:
    return {
        BYTES_PER_FLOP: nbytes / flops,
        FLOOR_DIVISION: float(flops // nbytes),
        RETURNS_INT: flops // nbytes,
        FLOPS_TWICE: 2 * flops / nbytes,
        PER_BIT: flops / (8 * nbytes),
    }


def distinct(c: Check, draw, answer, mixups) -> tuple:
    """A case from `draw()` whose known mistakes give different numbers, so that a wrong answer
    is named for what it is (redrawn until so; rarely needed). A mistake that gives the right
    answer here (for example bytes as elements at 1 byte each) is caught by another case."""
    for _n in range(50):
        case = draw()
        want = repr(answer(*case))
        values = [repr(v) for v in mixups(*case, answer(*case)).values() if v is not None]
        values = [v for v in values if v != want]
        if len(set(values)) == len(values):
            return case
    return case


def cfg_text(cfg: ModelConfig) -> str:
    return (f"cfg(V={cfg.vocab_size}, H={cfg.hidden_size}, N_h={cfg.n_heads}, "
            f"N_kv={cfg.n_kv_heads}, D_h={cfg.head_dim}, H_ff={cfg.ffn_hidden_size}, "
            f"L={cfg.n_layers})")
