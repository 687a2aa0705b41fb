"""Checks for chapter 05: multi-head attention (split and merge heads, fused QKV, W_O)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping

import torch
from torch.overrides import TorchFunctionMode

from .. import reference as ref
from ..engine import Check, ForbiddenCall, builds_on, matches
from ..i18n import N_, _
from ..mistakes import Mistake, fix_first
from ..nb04 import DTYPE_CHANGED, FULLY_MASKED_NAN, SCALE_BY_INT_SQRT
from ..reference.attention import torch_mha_reference

HEADS_FIRST = ("B", "N", "S", "D")

# --------------------------------------------------------------------------------------------
# The mistakes this chapter diagnoses, each with the words a failure shows.

SPLIT_NO_TRANSPOSE = Mistake("reshaped_without_transpose", N_(
    "reshaped straight to [B, N, S, D] without a transpose, so each 'head' holds pieces of "
    "several tokens (heads mixing tokens): reshape to [B, S, N, D], then transpose(1, 2)"))
SPLIT_TOKENS_FIRST = Mistake("missing_transpose", N_(
    "forgot the transpose: per-head tensors are heads-first [B, N, S, D], not [B, S, N, D]"))
SPLIT_HEAD_MINOR = Mistake("split_head_minor", N_(
    "split head-minor (head h got features h, h+N, h+2N, ...): each head owns a contiguous "
    "block of D features, so reshape to [B, S, N, D] (head index before feature index)"))
SPLIT_TOKENWISE = Mistake("split_tokens", N_(
    "split the sequence into N chunks of tokens (splitting heads token-wise): heads split the "
    "features of every token, and every head sees all S tokens"))
SPLIT_WRONG_AXES = Mistake("transposed_wrong_axes", N_(
    "transposed the wrong axes: the result must be [B, N, S, D]"))

MERGE_NO_TRANSPOSE = Mistake("merged_without_transpose", N_(
    "merged in the wrong order: reshaped [B, N, S, D] straight to [B, S, N*D] without "
    "transposing back, which mixes tokens: transpose(1, 2) first, then reshape"))
MERGE_HEAD_MINOR = Mistake("merged_head_minor", N_(
    "merged in the wrong order (head-minor: feature d of every head, then d+1, ...): the "
    "concatenation is [head 0's D features | head 1's | ...], i.e. [B, S, N, D] flattened"))
MERGE_UNFLATTENED = Mistake("not_flattened", N_(
    "transposed back but did not flatten the last two axes into N*D"))
MERGE_SUM = Mistake("summed_heads", N_(
    "summed the heads: heads are concatenated along the features, not added"))
VIEW_NOT_CONTIGUOUS = Mistake("view_on_transposed", N_(
    "`.view` needs contiguous memory, and a transposed tensor is not: use `.reshape(...)` (or "
    "`.contiguous().view(...)`)"), raises=[("RuntimeError", "view size is not compatible")])

FUSE_ROWS = Mistake("concatenated_rows", N_(
    "fused weights concatenated along the wrong axis (rows, dim 0): weights are [in, out], so "
    "Q, K and V sit side by side along the output columns (dim=1)"))
FUSE_ORDER = Mistake("blocks_out_of_order", N_(
    "put the blocks in the wrong order (got {order}): the fused columns are Q | K | V"))
FUSE_STACK = Mistake("stacked", N_(
    "stacked the three matrices along a new axis: concatenate them along the output columns "
    "into one [H, (N_h + 2 N_kv) D_h] matrix"))
FUSE_OUT_IN = Mistake("out_in_layout", N_(
    "returned the [out, in] layout of nn.Linear.weight / in_proj_weight: the course keeps "
    "weights [in, out] and concatenates along the output columns"))

VIEW_ON_SLICE = Mistake("viewed_slice_heads_first", N_(
    "`.view` failed on a column slice of qkv: a slice can be viewed as [B, S, N, D] (that "
    "only splits its last axis), but viewing it straight as [B, N, S, D] regroups features "
    "across tokens (heads mixing tokens); view as [B, S, N, D], then transpose(1, 2)"),
    raises=[("RuntimeError", "view size is not compatible")])
QKV_SWAPPED = Mistake("slices_swapped", N_(
    "Q/K/V slices swapped: the columns of qkv are Q | K | V, in that order"))
KV_HEADS = Mistake("kv_sliced_with_n_heads", N_(
    "K and V were sliced (or split) with N_h heads: with grouped-query attention (N_kv < N_h) "
    "K and V have only n_kv_heads heads each, so the column widths are N_h*D_h | N_kv*D_h | "
    "N_kv*D_h"), raises=[("RuntimeError", r"(?i)shape|size")])
KV_REPEATED = Mistake("kv_already_repeated", N_(
    "returned K and V already repeated to N_h heads: split_qkv returns the n_kv_heads KV heads "
    "as they are, [B, N_kv, S, D]; sharing them among the query heads is attention's job"))
CHUNK3 = Mistake("split_in_three_equal_parts", N_(
    "split qkv into three equal parts (`chunk(3)`): with grouped-query attention (N_kv < N_h) "
    "the widths differ, N_h*D_h | N_kv*D_h | N_kv*D_h, so split at those widths: "
    "`qkv.split([...], dim=-1)`"))

MHA_SPLIT_MERGE_NO_TRANSPOSE = Mistake("split_merge_without_transpose", N_(
    "split and merged the heads with plain reshapes ([B, S, H] <-> [B, N, S, D]) and no "
    "transposes, so each 'head' holds pieces of several tokens (heads mixing tokens): split "
    "as [B, S, N, D] then transpose(1, 2); merge by transposing back, then reshaping"))
MHA_SPLIT_HEAD_MINOR_ONLY = Mistake("split_head_minor_only", N_(
    "split head-minor (head h got features h, h+N, ...) but merged head-major: each head owns "
    "a contiguous block of D features"))
MHA_NO_WO = Mistake("missing_w_o", N_(
    "forgot W_O: after concatenating the heads, multiply by w_o (the output projection that "
    "mixes the heads)"))
MHA_WO_T = Mistake("w_o_transposed", N_(
    "applied W_O transposed: weights are [in, out], so the last step is `concat @ w_o`"))
MHA_SCALE_H = Mistake("scaled_by_sqrt_h", N_(
    "scaled the scores by 1/sqrt(H): each head scales by 1/sqrt(D_h), its own width"))
MHA_NO_SCALE = Mistake("missing_scale", N_("forgot the 1/sqrt(D_h) scale of the scores"))
MHA_ONE_HEAD = Mistake("one_big_head", N_(
    "computed one big head over all H features: split Q, K and V into n_heads heads of D_h = "
    "H / N_h features each"))
MHA_MASK_INVERTED = Mistake("mask_inverted", N_("mask inverted: True means 'may attend'"))
MHA_MASK_IGNORED = Mistake("mask_ignored", N_("ignored the mask"))
MHA_OWN_CAUSAL = Mistake("own_causal_mask", N_(
    "applied a causal mask of its own: use the `mask` argument as given (None means every "
    "token may attend to every token)"))

# --------------------------------------------------------------------------------------------
# Known-wrong building blocks (the variants a diagnosis compares with)


def _split(x, n):
    b, s, w = x.shape
    return x.reshape(b, s, n, w // n).transpose(1, 2)


def _split_no_transpose(x, n):
    b, s, w = x.shape
    return x.reshape(b, n, s, w // n)


def _split_tokens_first(x, n):
    b, s, w = x.shape
    return x.reshape(b, s, n, w // n)


def _split_head_minor(x, n):
    b, s, w = x.shape
    return x.reshape(b, s, w // n, n).permute(0, 3, 1, 2)


def _split_tokenwise(x, n):
    b, s, w = x.shape
    return x.reshape(b, n, s // n, w)


def _split_wrong_axes(x, n):
    b, s, w = x.shape
    return x.reshape(b, s, n, w // n).permute(0, 2, 3, 1)


def _merge(x):
    b, n, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, n * d)


def _merge_no_transpose(x):
    b, n, s, d = x.shape
    return x.reshape(b, s, n * d)


def _merge_head_minor(x):
    b, n, s, d = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, s, d * n)


def _split_wrongs(x, n) -> dict:
    return {SPLIT_NO_TRANSPOSE: lambda: _split_no_transpose(x, n),
            SPLIT_TOKENS_FIRST: lambda: _split_tokens_first(x, n),
            SPLIT_HEAD_MINOR: lambda: _split_head_minor(x, n),
            SPLIT_TOKENWISE: lambda: _split_tokenwise(x, n),
            SPLIT_WRONG_AXES: lambda: _split_wrong_axes(x, n)}


def _mha_variant(x, w_qkv, w_o, n, mask=None, *, split=_split, merge=_merge, order=(0, 1, 2),
                 scale=None, w_o_mode="ok", mask_mode="ok"):
    """Multi-head attention written out by hand, with one known mistake switched on."""
    h = x.shape[-1]
    parts = (x @ w_qkv).split(h, dim=-1)
    q, k, v = (split(parts[i], n) for i in order)
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d if scale is None else scale)
    if mask is not None and mask_mode == "inverted":
        mask = ~mask.bool()
    if mask_mode == "causal":
        mask = ref.causal_mask(x.shape[1])
    if mask_mode == "nan":  # the plain softmax: a fully masked row is 0 / 0
        weights = torch.softmax(scores.masked_fill(~mask.bool(), float("-inf")), dim=-1)
    else:
        weights = ref.masked_softmax(scores, None if mask_mode == "ignored" else mask)
    out = merge(weights @ v)
    if w_o_mode == "none":
        return out
    return out @ (w_o.T if w_o_mode == "transposed" else w_o)


# --------------------------------------------------------------------------------------------
# Helpers


def _others(c: Check, count: int, taken, low: int = 2, high: int = 10) -> list[int]:
    """`count` distinct sizes in [low, high) that differ from every size in `taken`."""
    pool = [v for v in range(low, high) if v not in set(taken)]
    perm = torch.randperm(len(pool), generator=c.gen)[:count]
    return [pool[int(i)] for i in perm]


def _as_triple(c: Check, got, what: str):
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        c.fail(_("{what} should return a tuple (q, k, v) of three tensors, got {kind}.").format(
            what=what, kind=_brief(got)))
    return got


def _brief(value) -> str:
    if isinstance(value, torch.Tensor):
        return _("a tensor of shape {shape}").format(shape=list(value.shape))
    if isinstance(value, (tuple, list)):
        return _("a {kind} of {count} items").format(kind=type(value).__name__, count=len(value))
    return type(value).__name__


# --------------------------------------------------------------------------------------------
# Forbidden shortcuts, except inside the course's reference


_REFERENCE_DIR = os.path.dirname(ref.__file__) + os.sep

_MHA_AGAINST = Mistake("calls_torch_multihead_attention", N_(
    "nn.MultiheadAttention is what this check compares against: build the layer from fused "
    "QKV, split_qkv, attention and merge_heads"))
_MHA_FORBIDDEN = {
    "scaled_dot_product_attention": Mistake("calls_sdpa", N_(
        "compute each head's attention yourself (scores, masked softmax, weights @ V) or call "
        "chapter 04's `attention` from checks.reference")),
    "multi_head_attention_forward": _MHA_AGAINST,
    "_native_multi_head_attention": _MHA_AGAINST,
}


class _ForbidOutsideReference(TorchFunctionMode):
    """Reject the forbidden torch functions when the learner's own code calls them.

    Calls made from inside `checks.reference` are allowed: the chapter lets learners use the
    course's `attention` (chapter 04), which is built on scaled_dot_product_attention.
    """

    def __init__(self, c: Check, forbidden: Mapping[str, str]):
        super().__init__()
        self.c = c
        self.forbidden = forbidden

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.forbidden and not _called_from_reference():
            raise ForbiddenCall(self.c.exercise, _("calls `{name}`, which this exercise asks "
                                "you not to use.").format(name=name), hint=self.forbidden[name])
        return func(*args, **(kwargs or {}))


def _called_from_reference() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_REFERENCE_DIR):
            return True
        frame = frame.f_back
    return False


# --------------------------------------------------------------------------------------------
# Exercise 1: split_heads


def check_split_heads(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("split_heads", f, seed=seed) as c:
        cases = [(2, 6, 3, 4),           # S divisible by N: splitting tokens would fit too
                 (1, 5, 32, 128)]        # the article's 4096 = 32 x 128
        for _n in range(6 if thorough else 2):
            cases.append(tuple(c.sizes(4, 2, 9)))
        for b, s, n, d in cases:
            x = c.randn(b, s, n * d)
            got = c.call(x.clone(), n)
            c.expect_tensor(got, ref.split_heads(x, n),
                            what=f"split_heads(x [B={b}, S={s}, H={n * d}], n_heads={n})",
                            dims=HEADS_FIRST, wrong=_split_wrongs(x, n))
        # Labelled input: entry (s, n, d) holds token s's feature n * D + d.
        b, s, n, d = 3, 4, 2, 5
        x = (torch.arange(s)[:, None] * 100 + torch.arange(n * d)).float().repeat(b, 1, 1)
        got = c.call(x.clone(), n)
        c.expect_tensor(got, ref.split_heads(x, n), what=_("split_heads of a labelled input"),
                        dims=HEADS_FIRST, wrong=_split_wrongs(x, n))
        c.note(_("head h of token s holds that token's features h*D .. h*D+D-1"))


# --------------------------------------------------------------------------------------------
# Exercise 2: merge_heads


def check_merge_heads(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("merge_heads", f, seed=seed, errors=[VIEW_NOT_CONTIGUOUS]) as c:
        cases = []
        for _n in range(6 if thorough else 2):
            cases.append(tuple(c.sizes(4, 2, 9)))
        cases.append((1, 5, 32, 128))
        for i, (b, s, n, d) in enumerate(cases):
            x = c.randn(b, n, s, d)
            if i == 1:  # heads-first tensors usually come out of a transpose: not contiguous
                x = c.randn(b, s, n, d).transpose(1, 2)
            got = c.call(x.clone())  # clone() keeps the strides
            c.expect_tensor(got, ref.merge_heads(x), what=f"merge_heads(x [B={b}, N={n}, "
                            f"S={s}, D={d}])", dims=("B", "S", "N*D"),
                            wrong={MERGE_NO_TRANSPOSE: lambda: _merge_no_transpose(x),
                                   MERGE_HEAD_MINOR: lambda: _merge_head_minor(x),
                                   MERGE_UNFLATTENED: lambda: x.transpose(1, 2),
                                   MERGE_SUM: lambda: x.sum(1)})
        c.note(_("a transposed (non-contiguous) input works"))
        b, s, n, d = c.sizes(4, 2, 9)
        x = c.randn(b, s, n * d)
        back = c.call(ref.split_heads(x, n))
        c.expect_tensor(back, x, what=_("merge_heads(split_heads(x)) (should give x back)"),
                        dims=("B", "S", "H"))
        c.note(_("merge_heads undoes split_heads"))


# --------------------------------------------------------------------------------------------
# Exercise 3: fuse_qkv_weights


def check_fuse_qkv_weights(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("fuse_qkv_weights", f, seed=seed) as c:
        # Standard MHA first: three square [H, H] matrices.
        trials = 4 if thorough else 1
        for _n in range(trials):
            n, d = c.sizes(2, 2, 9)
            h = n * d
            w_q, w_k, w_v = c.randn(h, h), c.randn(h, h), c.randn(h, h)
            _expect_fused(c, w_q, w_k, w_v, f"w_q, w_k, w_v [H={h}, {h}]")
        # Grouped-query attention: K and V are narrower than Q.
        for _n in range(trials):
            n_kv = c.choice([1, 2, 3])
            n_h = n_kv * c.choice([2, 4])
            d = _others(c, 1, (n_h, n_kv))[0]
            h = c.choice([n_h * d, n_h * d + 2])  # H need not equal N_h * D_h here
            w_q, w_k, w_v = c.randn(h, n_h * d), c.randn(h, n_kv * d), c.randn(h, n_kv * d)
            _expect_fused(c, w_q, w_k, w_v,
                          _("w_q [H={h}, N_h*D={q}], w_k and w_v [H={h}, N_kv*D={kv}]").format(
                              h=h, q=n_h * d, kv=n_kv * d))
        c.note(_("grouped-query shapes (narrower K and V)"))
        w_q, w_k, w_v = (c.randn(6, 6, dtype=torch.float64) for _n in range(3))
        _expect_fused(c, w_q, w_k, w_v, _("float64 w_q, w_k, w_v [6, 6]"))


def _expect_fused(c, w_q, w_k, w_v, shown):
    want = torch.cat([w_q, w_k, w_v], dim=1)
    got = c.call(w_q.clone(), w_k.clone(), w_v.clone())

    def order(blocks):
        return FUSE_ORDER.with_text(_(FUSE_ORDER).format(order=blocks))
    c.expect_tensor(got, want, what=_("fuse_qkv_weights with {inputs}").format(inputs=shown),
                    dims=("H", "(N_h+2N_kv)*D"),
                    wrong={FUSE_ROWS: lambda: torch.cat([w_q, w_k, w_v], 0),
                           FUSE_STACK: lambda: torch.stack([w_q, w_k, w_v]),
                           FUSE_OUT_IN: lambda: want.T,
                           order("K | Q | V"): lambda: torch.cat([w_k, w_q, w_v], 1),
                           order("Q | V | K"): lambda: torch.cat([w_q, w_v, w_k], 1),
                           order("V | K | Q"): lambda: torch.cat([w_v, w_k, w_q], 1),
                           order("K | V | Q"): lambda: torch.cat([w_k, w_v, w_q], 1),
                           order("V | Q | K"): lambda: torch.cat([w_v, w_q, w_k], 1)})


# --------------------------------------------------------------------------------------------
# Exercise 4: split_qkv


def check_split_qkv(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with builds_on("split_qkv", {"split_heads": check_split_heads}), \
            Check("split_qkv", f, seed=seed) as c:
        cases = []
        for _n in range(3 if thorough else 1):          # standard MHA: N_kv = N_h
            b, s, n, d = c.sizes(4, 2, 9)
            cases.append((b, s, n, n, d))
        # GQA whose widths 12 | 6 | 6 also split into three equal parts of 8, each a whole
        # number of heads: `chunk(3)` runs without an error and shows what it did
        cases.append((*_others(c, 2, (4, 2, 3)), 4, 2, 3))
        for _n in range(3 if thorough else 1):          # GQA: 1 < N_kv < N_h
            n_kv = c.choice([2, 3])
            n_h = n_kv * c.choice([2, 3])
            b, s, d = _others(c, 3, (n_h, n_kv))
            cases.append((b, s, n_h, n_kv, d))
        n_h = c.choice([4, 6])                         # MQA: N_kv = 1
        b, s, d = _others(c, 3, (n_h, 1))
        cases.append((b, s, n_h, 1, d))
        for b, s, n_h, n_kv, d in cases:
            _expect_split_qkv(c, b, s, n_h, n_kv, d)
        c.note(_("N_kv = N_h, 1 < N_kv < N_h and N_kv = 1"))


def _expect_split_qkv(c, b, s, n_h, n_kv, d):
    qkv = c.randn(b, s, (n_h + 2 * n_kv) * d)
    want = ref.split_qkv(qkv, n_h, n_kv, d)
    gqa = n_kv < n_h
    shown = (f"split_qkv(qkv [B={b}, S={s}, (N_h+2N_kv)*D={(n_h + 2 * n_kv) * d}], "
             f"n_heads={n_h}, n_kv_heads={n_kv}, head_dim={d})")
    # What the learner's exception may give away, in this case: with GQA, an error on the
    # size of one of three equal parts is `chunk(3)`; any other, K and V split with N_h heads.
    third = -(-qkv.shape[-1] // 3)  # the size of chunk(3)'s first part
    chunked = Mistake(CHUNK3.key, CHUNK3,
                      raises=[("RuntimeError", rf"input of size {b * s * third}\b")])
    c.errors = (VIEW_ON_SLICE, chunked, KV_HEADS) if gqa else (VIEW_ON_SLICE,)
    got = _as_triple(c, c.call(qkv.clone(), n_h, n_kv, d), shown)
    slices = dict(zip("qkv", qkv.split([n_h * d, n_kv * d, n_kv * d], dim=-1)))
    heads = {"q": n_h, "k": n_kv, "v": n_kv}
    for i, (name, g, w) in enumerate(zip("qkv", got, want)):
        if gqa and name != "q" and isinstance(g, torch.Tensor) and g.dim() == 4 \
                and n_h in (g.shape[1], g.shape[2]) and g.shape != w.shape:
            group = n_h // n_kv
            repeated = any(matches(g, r, 0.0, 0.0) for r in (
                w.repeat_interleave(group, dim=1), w.repeat(1, group, 1, 1)))
            c.fail(_("{name} of {call} has shape {shape}, expected [B={b}, N_kv={n_kv}, S={s}, "
                     "D={d}].").format(name=name, call=shown, shape=list(g.shape), b=b,
                                       n_kv=n_kv, s=s, d=d), KV_REPEATED if repeated else KV_HEADS)
        x, n = slices[name], heads[name]
        wrong = {}
        for other in "qkv":
            if other != name:
                wrong[QKV_SWAPPED.with_text(_("{swapped} ({name} came from the {other} slice)")
                                            .format(swapped=_(QKV_SWAPPED), name=name,
                                                    other=other.upper()))] = \
                    (lambda o=other: _split(slices[o], n))
        wrong.update({SPLIT_NO_TRANSPOSE: lambda: _split_no_transpose(x, n),
                      SPLIT_TOKENS_FIRST: lambda: _split_tokens_first(x, n),
                      SPLIT_HEAD_MINOR: lambda: _split_head_minor(x, n)})
        if gqa:
            wrong[CHUNK3] = lambda i=i, n=n: _split(qkv.chunk(3, dim=-1)[i], n)
        c.expect_tensor(g, w, what=_("{name} from {call}").format(name=name, call=shown),
                        dims=HEADS_FIRST, wrong=wrong)


# --------------------------------------------------------------------------------------------
# Exercise 5: multi_head_attention


def check_multi_head_attention(f, *, seed: int | None = None, thorough: bool = False) -> None:
    # split_heads first: a split_qkv built on a broken split_heads fails because of it
    earlier = {"split_heads": check_split_heads, "merge_heads": check_merge_heads,
               "split_qkv": check_split_qkv}
    with builds_on("multi_head_attention", earlier), \
            Check("multi_head_attention", f, seed=seed) as c:
        for trial in range(3 if thorough else 1):
            b, s, n, d = _mha_sizes(c)
            h = n * d
            x, w_qkv, w_o = _mha_inputs(c, b, s, h)
            masks = {N_("no mask"): None, N_("causal mask"): ref.causal_mask(s),
                     N_("causal + left-padding mask"): _padded_causal(c, b, s),
                     N_("per-head mask"): _per_head_mask(c, b, n, s)}
            for label, mask in masks.items():
                _expect_mha(c, x, w_qkv, w_o, n, mask, label)
        c.note(_("same output as torch.nn.MultiheadAttention with the same weights"))
        c.note(_("no mask, causal, padded (fully masked rows give 0) and per-head masks"))
        b, s, n, d = c.sizes(4, 2, 9)
        x, w_qkv, w_o = _mha_inputs(c, b, s, n * d, dtype=torch.float64)
        _expect_mha(c, x, w_qkv, w_o, n, ref.causal_mask(s), N_("causal mask, float64"))
        c.note(_("float64 stays float64"))


def _mha_sizes(c):
    """Distinct B, S, N, D with D >= 5 and no perfect square, so that a scale by int(sqrt(D))
    differs from the right one and from no scale at all (D = 4 or 9 would hide it)."""
    while True:
        b, s, n, d = c.sizes(4, 2, 9)
        if d >= 5 and math.isqrt(d) ** 2 != d:
            return b, s, n, d


def _mha_inputs(c, b, s, h, dtype=torch.float32):
    scale = 1.5 / math.sqrt(h)  # a little sharper than uniform attention
    return (c.randn(b, s, h, dtype=dtype), c.randn(h, 3 * h, dtype=dtype, scale=scale),
            c.randn(h, h, dtype=dtype, scale=1 / math.sqrt(h)))


def _padded_causal(c, b, s):
    """Causal AND left padding ([B, 1, S, S]); a sequence's leading pads see no key at all."""
    pads = torch.tensor([c.randint(0, s - 1) for _n in range(b)])
    pads[0] = 1
    real = torch.arange(s)[None, :] >= pads[:, None]
    return ref.causal_mask(s)[None, None] & real[:, None, None, :]


def _per_head_mask(c, b, n, s):
    mask = torch.rand(b, n, s, s, generator=c.gen) < 0.6
    mask[0, -1, 0] = False  # one fully masked row in one head only
    return mask


def _expect_mha(c, x, w_qkv, w_o, n, mask, label):
    b, s, h = x.shape
    want = torch_mha_reference(x, w_qkv, w_o, n, mask)
    shown = _(label) if mask is None else f"{_(label)} {list(mask.shape)}"
    what = f"multi_head_attention(x [B={b}, S={s}, H={h}], n_heads={n}, {shown})"
    with _ForbidOutsideReference(c, _MHA_FORBIDDEN):
        got = c.call(x.clone(), w_qkv.clone(), w_o.clone(), n,
                     None if mask is None else mask.clone())

    def v(**kw):
        return lambda: _mha_variant(x, w_qkv, w_o, n, mask, **kw)

    wrong = {
        MHA_NO_WO: v(w_o_mode="none"),
        MHA_WO_T: v(w_o_mode="transposed"),
        SPLIT_NO_TRANSPOSE: v(split=_split_no_transpose),
        MHA_SPLIT_MERGE_NO_TRANSPOSE:
            v(split=_split_no_transpose, merge=_merge_no_transpose),
        MERGE_NO_TRANSPOSE: v(merge=_merge_no_transpose),
        MERGE_HEAD_MINOR: v(merge=_merge_head_minor),
        SPLIT_HEAD_MINOR: v(split=_split_head_minor, merge=_merge_head_minor),
        MHA_SPLIT_HEAD_MINOR_ONLY: v(split=_split_head_minor),
        MHA_SCALE_H: v(scale=h),
        MHA_NO_SCALE: v(scale=1),
        SCALE_BY_INT_SQRT: v(scale=math.isqrt(h // n) ** 2),
        MHA_ONE_HEAD: lambda: _mha_variant(x, w_qkv, w_o, 1, _one_head_mask(mask)),
        MHA_MASK_INVERTED: v(mask_mode="inverted"),
        MHA_MASK_IGNORED: v(mask_mode="ignored"),
        MHA_OWN_CAUSAL: v(mask_mode="causal"),
        FULLY_MASKED_NAN: v(mask_mode="nan"),
    }
    for order in [(1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)]:
        names = "".join("QKV"[i] for i in order)
        wrong[QKV_SWAPPED.with_text(_("{swapped} (used {order})").format(
            swapped=_(QKV_SWAPPED), order=" | ".join(names)))] = v(order=order)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want}.").format(
            what=what, got=got.dtype, want=want.dtype), DTYPE_CHANGED)
    c.expect_tensor(got, want, what=what, dims=("B", "S", "H"), wrong=wrong)


def _one_head_mask(mask):
    if mask is None or mask.dim() < 4 or mask.shape[1] == 1:
        return mask
    raise ValueError("a per-head mask has no one-head counterpart")


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "05.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "split_heads": (
        SPLIT_TOKENS_FIRST, SPLIT_NO_TRANSPOSE, SPLIT_HEAD_MINOR, SPLIT_TOKENWISE,
        SPLIT_WRONG_AXES),
    "merge_heads": (
        MERGE_HEAD_MINOR, MERGE_NO_TRANSPOSE, MERGE_UNFLATTENED, MERGE_SUM, VIEW_NOT_CONTIGUOUS),
    "fuse_qkv_weights": (
        FUSE_ORDER, FUSE_ROWS, FUSE_OUT_IN, FUSE_STACK),
    "split_qkv": (
        fix_first('split_heads'), KV_REPEATED, KV_HEADS, SPLIT_TOKENS_FIRST, SPLIT_NO_TRANSPOSE,
        QKV_SWAPPED, SPLIT_HEAD_MINOR, CHUNK3, VIEW_ON_SLICE),
    "multi_head_attention": (
        *_MHA_FORBIDDEN.values(), _MHA_AGAINST, DTYPE_CHANGED, fix_first('split_heads'),
        fix_first('merge_heads'), fix_first('split_qkv'),
        FULLY_MASKED_NAN, MHA_MASK_IGNORED, MHA_MASK_INVERTED, MERGE_NO_TRANSPOSE, MHA_NO_SCALE,
        MHA_NO_WO, MHA_ONE_HEAD, MHA_OWN_CAUSAL, SPLIT_NO_TRANSPOSE, SCALE_BY_INT_SQRT,
        MHA_SCALE_H, QKV_SWAPPED, SPLIT_HEAD_MINOR, MHA_SPLIT_MERGE_NO_TRANSPOSE, MHA_WO_T,
        MHA_SPLIT_HEAD_MINOR_ONLY, MERGE_HEAD_MINOR),
}
