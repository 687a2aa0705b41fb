"""Checks for chapter 04: self-attention (projections, scaled scores, masked softmax, attention).

Conventions (docs/conventions.md): weights are [in, out] and applied as `x @ W`; scores are
scaled by 1/sqrt(D), D the last dimension of q; boolean masks hold True where a query may attend;
softmax runs over the last (key) axis; a fully masked query row gets all-zero weights, never NaN;
causal masks are bottom-right aligned.
"""

from __future__ import annotations

import math

import torch

from .. import reference as ref
from ..engine import (CallRecord, Check, CheckFailure, builds_on, earlier_failures,
                     fix_first_text, matches)
from ..i18n import N_, _
from ..mistakes import Mistake, fix_first

# --------------------------------------------------------------------------------------------
# Forbidden shortcuts, by torch function name (the engine also catches `torch.ops.aten` overloads
# such as "softmax.int").


_SOFTMAX_HINT = Mistake("calls_library_softmax", N_(
    "write the softmax yourself: subtract each row's max, exponentiate, divide by the row sum "
    "(library softmax, log_softmax, softmin and logsumexp are off limits here)"))
_SDPA_HINT = Mistake("calls_library_attention", N_(
    "build attention from your own pieces: scores = Q K^T / sqrt(D), weights = "
    "masked_softmax(scores, mask), out = weights @ V"))

_SOFTMAX_NAMES = ("softmax", "_softmax", "log_softmax", "_log_softmax", "softmin",
                  "special_softmax", "special_log_softmax", "_safe_softmax", "_masked_softmax",
                  "_sparse_softmax", "_sparse_log_softmax", "gumbel_softmax",
                  "logsumexp", "special_logsumexp", "logcumsumexp")
_ATTENTION_NAMES = ("scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                    "_scaled_dot_product_attention_math_for_mps",
                    "_scaled_dot_product_flash_attention",
                    "_scaled_dot_product_flash_attention_for_cpu",
                    "_scaled_dot_product_efficient_attention",
                    "_scaled_dot_product_cudnn_attention",
                    "_scaled_dot_product_fused_attention_overrideable",
                    "_efficient_attention_forward", "_flash_attention_forward",
                    "_native_multi_head_attention", "multi_head_attention_forward",
                    "flex_attention")

FORBID_SOFTMAX = {**dict.fromkeys(_SOFTMAX_NAMES, _SOFTMAX_HINT),
                  # attention kernels compute a softmax inside (weights = SDPA(q, k, I))
                  **dict.fromkeys(_ATTENTION_NAMES, _SOFTMAX_HINT)}
FORBID_ATTENTION = dict.fromkeys(_ATTENTION_NAMES, _SDPA_HINT)

# --------------------------------------------------------------------------------------------
# Diagnoses (shared by the checkers so that the same mistake reads the same everywhere)

NO_SCALE = Mistake("missing_scale", N_(
    "forgot the scale: divide the scores by sqrt(D), D = q.shape[-1] (the head dimension)"))
SCALE_BY_D = Mistake("divided_by_d", N_(
    "divided by D instead of sqrt(D): the scale is 1 / sqrt(D_h)"))
SCALE_BY_H = Mistake("scaled_by_sqrt_h", N_(
    "scaled by sqrt(H) = sqrt(N * D), the width of all heads together, instead of sqrt(D_h), "
    "one head's width (the last dimension of q)"))
SCALE_BY_S = Mistake("scaled_by_sqrt_seq_len", N_(
    "scaled by the square root of a sequence length; the scale uses the feature dimension D = "
    "q.shape[-1]"))
SCALE_MULTIPLIED = Mistake("multiplied_by_sqrt_d", N_(
    "multiplied by sqrt(D) instead of dividing by it"))
QK_SWAPPED = Mistake("q_k_swapped", N_(
    "Q and K swapped: scores are Q K^T, shape [..., S_q, S_k] (row = query, column = key), "
    "not K Q^T"))
QUERY_AXIS = Mistake("softmax_over_queries", N_(
    "softmax over the query axis (dim=-2): each query's weights over the keys must sum to 1, "
    "so normalise over the last axis (dim=-1)"))
WHOLE_TENSOR = Mistake("normalised_whole_tensor", N_(
    "normalised over the whole tensor instead of each row (the last axis) separately"))
NOT_NORMALISED = Mistake("not_normalised", N_(
    "exponentiated without dividing by the row sum: weights must sum to 1 per row"))
INVERTED = Mistake("mask_inverted", N_(
    "mask inverted: True means 'may attend', so fill the scores with -inf where the mask is "
    "False (`~mask`), not where it is True"))
AFTER_SOFTMAX = Mistake("mask_after_softmax", N_(
    "mask applied after the softmax: zeroing weights afterwards leaves rows that no longer "
    "sum to 1; fill masked scores with -inf before normalising"))
IGNORED_MASK = Mistake("mask_ignored", N_(
    "ignored the mask argument: masked keys must get weight 0"))
NO_DIAGONAL = Mistake("mask_without_diagonal", N_(
    "mask off by one: the diagonal was masked too, but a token may attend to its own "
    "position; use the mask you are given (True = may attend)"))
ONE_AHEAD = Mistake("mask_one_ahead", N_(
    "mask off by one: each query also sees the next (future) key"))
TOP_LEFT = Mistake("top_left_causal_mask", N_(
    "used a top-left causal mask (`torch.tril(ones(S_q, S_k))`) instead of the mask argument; "
    "causal masks are bottom-right aligned when S_q != S_k"))
FINITE_FILL = Mistake("finite_fill", N_(
    "filled masked scores with a large finite number (like -1e9): a fully masked row then "
    "spreads its weight evenly over keys it may not see; such a row must be all zeros (fill "
    "with -inf and turn the NaN rows into zeros, or zero rows whose mask is all False)"))
FULLY_MASKED_NAN = Mistake("fully_masked_row_nan", N_(
    "a fully masked row gives NaN (its max is -inf, and -inf - (-inf) or 0 / 0 is NaN); "
    "return all-zero weights for such rows, e.g. torch.where on the row sum or nan_to_num"))
OVERFLOW = Mistake("unstable_exp", N_(
    "exp overflowed or underflowed for large scores (exp(1e4) = inf, exp(-1e4) = 0): subtract "
    "each row's own max, `scores.amax(dim=-1, keepdim=True)`, before exp"))
MAX_BEFORE_MASK = Mistake("max_before_mask", N_(
    "took the row max before masking: a masked key with a huge score makes every visible "
    "exp(...) underflow to 0; fill masked scores with -inf first, then take the max over what "
    "remains"))
IN_PLACE = Mistake("modified_input_in_place", N_(
    "modified an input in place (`masked_fill_`, `-=`, `add_`, ...): build new tensors "
    "instead (e.g. the out-of-place `masked_fill`) so the caller's tensors stay unchanged"))
WEIGHTS_T_V = Mistake("transposed_weights_times_v", N_(
    "used the transposed weights (A^T V): the output is weights @ v, row m mixing the values "
    "with query m's weights"))
OUT_TRANSPOSED = Mistake("output_transposed", N_(
    "returned the output transposed ([..., D_v, S_q]): out = weights @ v has shape [..., S_q, "
    "D_v]"))
WEIGHTS_K = Mistake("mixed_keys", N_(
    "mixed the keys instead of the values: out = weights @ v, not weights @ k"))
PAIR_ORDER = Mistake("pair_order_swapped", N_(
    "returned (weights, out) in the wrong order: return (out, weights)"))
# A mistake named with the step (and so the helper) it belongs to: `_step(SCORES_STEP, NO_SCALE)`.
SCORES_STEP = N_("in the scores (attention_scores): {mistake}")
SOFTMAX_STEP = N_("in the softmax (masked_softmax): {mistake}")
QK_SWAPPED_UNSCALED = Mistake("q_k_swapped_unscaled", N_(
    "Q and K swapped: scores are Q K^T, shape [..., S_q, S_k] (row = query, column = key), "
    "not K Q^T (and unscaled)"))
SCALE_BY_H_ITSELF = Mistake("divided_by_h", N_(
    "scaled by sqrt(H) = sqrt(N * D), the width of all heads together, instead of sqrt(D_h), "
    "one head's width (the last dimension of q) (and divided by H itself, not its square "
    "root)"))
UNEXPLAINED = Mistake("weights_unexplained", N_(
    "the weights are not softmax(Q K^T / sqrt(D)) over the keys with masked keys at 0 (the "
    "entry above is one that differs): make attention_scores and masked_softmax pass their own "
    "checks, then build attention from them, weights = masked_softmax(attention_scores(q, k), "
    "mask) and out = weights @ v (when attention calls them, this check names the one to fix "
    "first)"))
OWN_CAUSAL = Mistake("built_own_causal_mask", N_(
    "built a causal mask inside attention: use the mask it is given, masked_softmax(scores, "
    "mask), and with mask=None every key is visible; the caller decides what each query may see "
    "(a decoder passes a causal mask, padding adds its own)"))
SHAPES = Mistake("shapes_do_not_fit", N_(
    "check the shapes: scores = q @ k.transpose(-2, -1) is [..., S_q, S_k] (not k @ q^T), and "
    "out = weights @ v is [..., S_q, D_v]"),
    raises=[("RuntimeError", r"(?i)shape|size|dimension")])
PROJ_SHAPES = Mistake("shapes_do_not_fit", N_(
    "check the shapes: x [..., H] @ W [H, out] -> [..., out]; no transpose needed"),
    raises=[("RuntimeError", r"(?i)shape|size|dimension")])
W_TRANSPOSED = Mistake("applied_weights_transposed", N_(
    "applied the weights transposed (x @ W.T, or F.linear(x, W)): course weights are "
    "[in_features, out_features], applied as x @ W"))
# Mistakes the checks above did not name before (issue 28), and the hints that were free text.
SCALE_BY_INT_SQRT = Mistake("scaled_by_int_sqrt", N_(
    "scaled by int(sqrt(D)), a rounded-down square root: divide by the exact sqrt(D) "
    "(`math.sqrt(d)` or `d ** 0.5`)"))
SCALE_BY_DV = Mistake("scaled_by_sqrt_dv", N_(
    "scaled by sqrt(D_v), the width of the values: the scale uses D = q.shape[-1], the width "
    "of the queries and keys"))
DTYPE_CHANGED = Mistake("changed_dtype", N_(
    "changed the dtype: the output keeps the inputs' dtype (float64 in, float64 out), so "
    "compute in it and do not cast (no `.float()`)"))
SQUEEZED = Mistake("dropped_axis_of_one", N_(
    "dropped an axis of size one (`squeeze`): a batch of one is still a batch; keep every "
    "leading axis, x [..., H] @ W [H, out] -> [..., out]"))
RETURNED_ONE = Mistake("returned_one_tensor", N_(
    "return three separate tensors: `return q, k, v`"))
OTHER_WEIGHT = Mistake("used_another_weight", N_(
    "{name} computed with w_{other}: q = x @ w_q, k = x @ w_k, v = x @ w_v, returned in the "
    "order (q, k, v)"))
ONLY_OUT = Mistake("returned_only_out", N_(
    "returned only the output: attention returns both, `return out, weights`"))
MASK_ADDED = Mistake("added_boolean_mask", N_(
    "added the boolean mask to the scores as if it were an additive one (True counts as 1, "
    "False as 0, so no key is hidden): fill the scores with -inf where the mask is False"))
MASK_MULTIPLIED = Mistake("multiplied_by_mask", N_(
    "multiplied the scores by the mask: a masked score becomes 0, not -inf, so its key still "
    "gets weight; fill the scores with -inf where the mask is False"))
OUT_UNEXPLAINED = Mistake("output_not_weights_times_v", N_(
    "the weights are right, but out is not weights @ v: row m of out mixes the rows of v "
    "with query m's weights, out [..., S_q, D_v]"))
HELPERS_COMBINED = Mistake("helpers_combined_wrongly", N_(
    "your attention_scores and masked_softmax pass their own checks, so look at how attention "
    "puts them together: weights = masked_softmax(attention_scores(q, k), mask), out = weights "
    "@ v"))


# --------------------------------------------------------------------------------------------
# Helpers


def _step(step: str, mistake: Mistake) -> Mistake:
    """A mistake named with its step (SCORES_STEP or SOFTMAX_STEP), in the current language;
    the same mistake (its key) told with the step."""
    return mistake.with_text(_(step).format(mistake=_(mistake)))


def _any_of(got, *candidates):
    """The first candidate that reproduces `got` (so one mistake can have several forms)."""
    for cand in candidates:
        if matches(got, cand, 0.0, 0.0):
            return cand
    return candidates[0]


def _observable(variant, want):
    """A wrong variant that equals the right answer here (up to NaN rows) names no mistake."""
    def value():
        v = variant()
        if isinstance(v, torch.Tensor) and v.shape == want.shape and \
                matches(v.nan_to_num(0.0), want.nan_to_num(0.0), 0.0, 0.0):
            raise ValueError("not observable with these inputs")  # diagnose skips it
        return v
    return value


def _expect(c: Check, got, want, *, what: str, dims, wrong=None, fallback=None, **kw) -> None:
    """expect_tensor, plus a fallback hint (from `fallback(got)`) when no known variant matches;
    the right shape in another dtype is named as a changed dtype."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want}.").format(
            what=what, got=got.dtype, want=want.dtype), DTYPE_CHANGED)
    wrong = {name: _observable(v, want) for name, v in (wrong or {}).items()}
    try:
        c.expect_tensor(got, want, what=what, dims=dims, wrong=wrong, **kw)
    except CheckFailure as failure:
        if failure.hint is None and fallback is not None and isinstance(got, torch.Tensor):
            hint = fallback(got)
            if hint:
                raise CheckFailure(failure.exercise, failure.message, hint=hint,
                                   seed=failure.seed) from None
        raise


def _rows_fully_masked(mask: torch.Tensor | None, shape) -> torch.Tensor | None:
    """[..., S_q, 1] True where a query may attend to no key at all."""
    if mask is None:
        return None
    return ~mask.bool().expand(shape).any(-1, keepdim=True)


def _nonfinite_hint(mask, shape, default: str, *, weights: bool = False):
    """A fallback that explains NaN/inf in the learner's output (for `weights`, also rows that
    should sum to 1 but came out all zero, as a guarded 0 / 0 does)."""
    def hint(got: torch.Tensor) -> str | None:
        bad = ~torch.isfinite(got)
        dead = _rows_fully_masked(mask, shape)
        if not bad.any():
            if weights and got.shape == tuple(shape):
                sums = got.detach().double().sum(-1, keepdim=True)
                live = torch.ones_like(sums, dtype=torch.bool) if dead is None else ~dead
                if bool((sums[live] < 0.5).any()):
                    return default
            return None
        if dead is not None and dead.any() and got.shape[:-1] == dead.shape[:-1]:
            bad_rows = bad.any(-1, keepdim=True)
            if bool(bad_rows[dead].all()) and not bool(bad_rows[~dead].any()):
                return FULLY_MASKED_NAN
        return default
    return hint


def _dims(ndim: int, last: str) -> list[str] | None:
    """Names for [B, N, S_q, last], [B, S_q, last] or [S_q, last]."""
    return {2: ["S_q", last], 3: ["B", "S_q", last], 4: ["B", "N", "S_q", last]}.get(ndim)


def _query_key_sizes(c: Check) -> tuple[int, int]:
    """(short, long) sequence lengths for causal cases: at least 3 and at least 2 apart, so that a
    top-left, a diagonal-less and a one-ahead causal mask all differ from each other and from
    the bottom-right one."""
    short = c.randint(3, 7)
    return short, short + c.randint(2, 5)


def _random_mask(c: Check, *shape: int, fully_masked_rows: bool = False) -> torch.Tensor:
    """Random boolean mask; every row has a True and a False (so the inverted mask has no empty
    row), and with `fully_masked_rows` some rows are entirely False."""
    m = c.randn(*shape) > 0
    m[..., 0] = True
    m[..., -1] = False
    if fully_masked_rows:
        rows = m.view(-1, shape[-2], shape[-1])
        for r in rows:
            r[c.randint(0, shape[-2])] = False
    return m


def _softmax(scores, mask=None, dim=-1):
    """Reference masked softmax along `dim` (for building wrong variants)."""
    if dim in (-1, scores.dim() - 1):
        return ref.masked_softmax(scores, mask)
    mt = None if mask is None else mask.transpose(dim, -1)
    return ref.masked_softmax(scores.transpose(dim, -1), mt).transpose(dim, -1)


def _naive(scores, mask=None, dim=-1):
    """The usual hand-written masked softmax without the fully-masked-row guard (NaN rows)."""
    s = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=dim)


def _both(scores, mask, dim=-1):
    """Zero-row and NaN-row forms of the same masked softmax (a learner may produce either)."""
    return _softmax(scores, mask, dim), _naive(scores, mask, dim)


def _mask_variants(got, scores, mask) -> dict:
    """Wrong masked softmax results for `mask` (boolean, broadcastable to scores)."""
    sq, sk = scores.shape[-2:]
    variants = {
        INVERTED: lambda: _any_of(got, *_both(scores, ~mask)),
        AFTER_SOFTMAX: lambda: ref.masked_softmax(scores) * mask,
        IGNORED_MASK: lambda: ref.masked_softmax(scores),
        QUERY_AXIS: lambda: _any_of(got, *_both(scores, mask, dim=-2)),
        FINITE_FILL: lambda: torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1),
        MASK_ADDED: lambda: ref.masked_softmax(scores + mask),
        MASK_MULTIPLIED: lambda: ref.masked_softmax(scores * mask),
    }
    ones = torch.ones(sq, sk, dtype=torch.bool)
    if mask.dim() == 2 and torch.equal(mask, ref.causal_mask(sq, sk)):
        variants[NO_DIAGONAL] = lambda: _any_of(got, *_both(scores, ones.tril(sk - sq - 1)))
        variants[ONE_AHEAD] = lambda: ref.masked_softmax(scores, ones.tril(sk - sq + 1))
        if sq != sk:
            variants[TOP_LEFT] = lambda: _any_of(got, *_both(scores, ones.tril()))
    return variants


def _attention_hint(mask, shape, *, large: bool, weights: bool = False):
    """What to say when no known variant reproduces attention's output (its weights, or out
    once the weights passed): instability only where the scores are large enough to overflow;
    otherwise which property failed, and how to find the broken piece."""
    unexplained = UNEXPLAINED if weights else OUT_UNEXPLAINED
    default = _step(SOFTMAX_STEP, OVERFLOW) if large else unexplained
    nonfinite = _nonfinite_hint(mask, shape, default, weights=weights)

    def hint(got):
        found = nonfinite(got)
        if found == FULLY_MASKED_NAN:
            return _step(SOFTMAX_STEP, found)
        return unexplained if found is None and not large else found
    return hint


def _whole_tensor(scores, mask):
    """Normalised over every entry at once instead of row by row."""
    s = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    e = (s - s.max()).exp()
    return e / e.sum()


def _max_before_mask(scores, mask):
    """The row max taken over all keys, masked ones included (zero-row and NaN-row forms)."""
    e = (scores.masked_fill(~mask, float("-inf")) - scores.amax(-1, keepdim=True)).exp()
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e)), e / total


def _rows_sum_to_one(c: Check, weights: torch.Tensor, mask) -> None:
    """Every row that may see a key sums to 1; fully masked rows are exactly zero."""
    sums = weights.detach().double().sum(-1, keepdim=True)
    dead = _rows_fully_masked(mask, weights.shape)
    live = torch.ones_like(sums, dtype=torch.bool) if dead is None else ~dead
    if not torch.allclose(sums[live], torch.ones_like(sums[live]), atol=1e-4):
        c.fail(_("weights of a query that may see some key must sum to 1 over the keys."))
    if dead is not None and dead.any():
        c.note(_("fully masked rows are zero"))
    c.note(_("rows sum to 1"))


# --------------------------------------------------------------------------------------------
# project_qkv


def check_project_qkv(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("project_qkv", f, seed=seed, errors=[PROJ_SHAPES], in_place=IN_PLACE) as c:
        # The article's case first: square [H, H] weights, so transposed or swapped weights give
        # the right shapes and wrong values (which names the mistake).
        b, s, h = c.sizes(3, 2, 10)
        cases = [((b, s), h, h, h)]
        for _n in range(3 if thorough else 1):
            b, s, h, dqk, dv = c.sizes(5, 2, 12)
            cases.append(((b, s), h, dqk, dv))
        n = c.sizes(1, 2, 6)[0]
        cases.append(((b, n, s), h, dqk, dv))   # extra leading dims
        cases.append(((s,), h, dqk, dv))        # no batch dim: [S, H]
        cases.append(((1, s), h, dqk, dv))      # a batch of one (squeezing it loses an axis)
        for lead, h, dqk, dv in cases:
            x = c.randn(*lead, h)
            w_q, w_k, w_v = c.randn(h, dqk), c.randn(h, dqk), c.randn(h, dv)
            _check_qkv_once(c, x, w_q, w_k, w_v, lead)
        # float64 stays float64
        x = c.randn(2, 3, 4, dtype=torch.float64)
        ws = [c.randn(4, 4, dtype=torch.float64) for _n in range(3)]
        _check_qkv_once(c, x, *ws, (2, 3))
        c.headline(_("Q = X W_Q, K = X W_K, V = X W_V with [in, out] weights"))
        c.headline(_("[B, S, H], [S, H] and extra leading dims"))
        c.headline(_("float64 kept"))


def _check_qkv_once(c: Check, x, w_q, w_k, w_v, lead) -> None:
    got = c.call(x, w_q, w_k, w_v)
    shown = f"x {list(x.shape)}, w_q {list(w_q.shape)}, w_k {list(w_k.shape)}, " \
            f"w_v {list(w_v.shape)}"
    if isinstance(got, torch.Tensor):
        c.fail(_("returned one tensor {shape}; return the tuple (q, k, v).").format(
            shape=list(got.shape)), RETURNED_ONE)
    if isinstance(got, (tuple, list)) and len(got) != 3:
        c.fail(_("should return a tuple (q, k, v), got {kind} of length {length}.").format(
            kind=type(got).__name__, length=len(got)))
    if not isinstance(got, (tuple, list)):
        c.fail(_("should return a tuple (q, k, v), got {kind}.").format(kind=type(got).__name__))
    weights = {"q": w_q, "k": w_k, "v": w_v}
    lead_dims = [f"L{i}" for i in range(len(lead) - 1)] + ["S"]
    wants = ref.project_qkv(x, w_q, w_k, w_v)
    for (name, w), value, want in zip(weights.items(), got, wants):
        wrong = {W_TRANSPOSED: lambda w=w: x @ w.T}
        for other, w_other in weights.items():
            if other != name:
                wrong[OTHER_WEIGHT.with_text(_(OTHER_WEIGHT).format(name=name, other=other))] = \
                    lambda w_other=w_other: x @ w_other
        wrong[SQUEEZED] = lambda w=w: _any_of(value, (x @ w).squeeze(0), (x @ w).squeeze())
        _expect(c, value, want, what=_("{name} for {inputs}").format(name=name, inputs=shown),
                dims=lead_dims + ["out"], wrong=wrong)


# --------------------------------------------------------------------------------------------
# attention_scores


def _divisors(d: int, lengths, *, n: int | None = None, dv: int | None = None) -> dict:
    """What each scale mistake divides Q K^T by (the right divisor is sqrt(D)), for a head
    dimension D, sequence lengths, N heads (4-d inputs) and a value width D_v (attention)."""
    divisors = {NO_SCALE: [1.0], SCALE_BY_D: [float(d)], SCALE_MULTIPLIED: [d ** -0.5],
                SCALE_BY_INT_SQRT: [float(math.isqrt(d))],
                SCALE_BY_S: sorted({math.sqrt(length) for length in lengths})}
    if dv is not None:
        divisors[SCALE_BY_DV] = [math.sqrt(dv)]
    if n is not None:
        divisors[SCALE_BY_H] = [math.sqrt(n * d)]
        divisors[SCALE_BY_H_ITSELF] = [float(n * d)]
    return divisors


def _clashes(divisors: dict, d: int) -> set:
    """The mistakes whose divisor another mistake (or the right sqrt(D)) shares: with these
    inputs they would look alike."""
    owners: dict[float, set] = {round(math.sqrt(d), 9): {None}}
    for mistake, values in divisors.items():
        for value in values:
            owners.setdefault(round(value, 9), set()).add(mistake)
    return {m for group in owners.values() if len(group) > 1 for m in group} - {None}


def _scale_variants(got, raw, divisors: dict, d: int, then=lambda scores: scores) -> dict:
    """The scale mistakes that these inputs tell apart, each as what it gives (the scores, or
    `then(scores)`)."""
    clash = _clashes(divisors, d)
    return {m: (lambda values=values: _any_of(got, *(then(raw / x) for x in values)))
            for m, values in divisors.items() if m not in clash}


def _scores_wrong(got, q, k) -> dict:
    d = q.shape[-1]
    raw = q @ k.transpose(-2, -1)
    lengths = (q.shape[-2], k.shape[-2])
    divisors = _divisors(d, lengths, n=q.shape[-3] if q.dim() == 4 else None)
    return {
        **_scale_variants(got, raw, divisors, d),
        QK_SWAPPED: lambda: k @ q.transpose(-2, -1) / math.sqrt(d),
        QK_SWAPPED_UNSCALED: lambda: k @ q.transpose(-2, -1),
    }


def check_attention_scores(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("attention_scores", f, seed=seed, errors=[SHAPES], in_place=IN_PLACE) as c:
        cases = [_score_sizes(c) for _n in range(3 if thorough else 1)]
        for b, n, sq, sk, d in cases:
            # the article's single head [B, S, D] @ [B, D, S], with S_q != S_k
            _check_scores_once(c, c.randn(b, sq, d), c.randn(b, sk, d), ("B", "S_q", "S_k"))
            # heads-first [B, N, S, D]
            _check_scores_once(c, c.randn(b, n, sq, d), c.randn(b, n, sk, d),
                               ("B", "N", "S_q", "S_k"))
        b, n, sq, sk, d = cases[0]
        _check_scores_once(c, c.randn(sq, d), c.randn(sk, d), ("S_q", "S_k"))
        _check_scores_once(c, c.randn(b, n, sq, d, dtype=torch.float64),
                           c.randn(b, n, sk, d, dtype=torch.float64), ("B", "N", "S_q", "S_k"))
        c.headline("Q K^T / sqrt(D)")
        c.headline("S_q != S_k")
        c.headline(_("[S, D], [B, S, D] and [B, N, S, D] inputs"))


def _score_sizes(c: Check) -> tuple[int, ...]:
    """Distinct B, N, S_q, S_k, D whose wrong scales differ from each other and from the right
    one, so that every scale mistake shows and is told apart at every seed: D is no perfect
    square (int(sqrt(D)) != sqrt(D)), no S is D^2 or N * D, ..."""
    while True:
        b, n, sq, sk, d = c.sizes(5, 2, 11)
        if not _clashes(_divisors(d, (sq, sk), n=n), d):
            return b, n, sq, sk, d


def _check_scores_once(c: Check, q, k, dims) -> None:
    got = c.call(q, k)
    want = ref.attention_scores(q, k)
    what = _("scores for q {q}, k {k}").format(q=list(q.shape), k=list(k.shape))
    _expect(c, got, want, what=what, dims=dims,
            wrong=_scores_wrong(got, q, k))


# --------------------------------------------------------------------------------------------
# masked_softmax


def check_masked_softmax(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("masked_softmax", f, seed=seed, forbid=FORBID_SOFTMAX, in_place=IN_PLACE) as c:
        for _n in range(3 if thorough else 1):
            # lengths >= 3, so random masks leave rows with a choice among several keys
            b, n, sq, sk = c.sizes(4, 3, 11)
            lo, hi = _query_key_sizes(c)
            # 1. no mask (the default argument): normalise each row over the keys
            scores = c.randn(b, n, sq, sk, scale=2.0)
            got = c.call(scores)
            _expect_weights(c, got, scores, None, what=_("weights without a mask"))
            _rows_sum_to_one(c, got, None)
            # 2. a bottom-right causal mask, S_q < S_k (queries are the last S_q positions)
            scores = c.randn(b, n, lo, hi, scale=2.0)
            _softmax_case(c, scores, ref.causal_mask(lo, hi), _("a causal mask (S_q < S_k)"))
            # 3. a random mask shared by the heads [B, 1, S_q, S_k]
            scores = c.randn(b, n, sq, sk, scale=2.0)
            _softmax_case(c, scores, _random_mask(c, b, 1, sq, sk),
                          _("a random mask [B, 1, S_q, S_k]"))
            # 4. fully masked rows: a causal mask with S_q > S_k (the first queries sit before
            #    the first key) and a random mask with empty rows
            scores = c.randn(b, n, hi, lo, scale=2.0)
            _softmax_case(c, scores, ref.causal_mask(hi, lo),
                          _("a causal mask with S_q > S_k (its first rows see no key)"))
            scores = c.randn(b, n, sq, sk, scale=2.0)
            _softmax_case(c, scores, _random_mask(c, b, n, sq, sk, fully_masked_rows=True),
                          _("a mask with fully masked rows"))
            # 5. a padding mask [B, 1, 1, S_k]
            pad = torch.ones(b, 1, 1, sk, dtype=torch.bool)
            for i in range(b):
                pad[i, ..., c.randint(1, sk + 1):] = False
            _softmax_case(c, c.randn(b, n, sq, sk, scale=2.0), pad,
                          _("a padding mask [B, 1, 1, S_k]"))
        # 6. scores that already hold -inf (an additive mask), no boolean mask: a row of nothing
        #    but -inf is fully masked too
        keep = _random_mask(c, b, n, sq, sk, fully_masked_rows=True)
        scores = c.randn(b, n, sq, sk, scale=2.0).masked_fill(~keep, float("-inf"))
        got = c.call(scores)
        _expect(c, got, ref.masked_softmax(scores), dims=_dims(4, "S_k"),
                what=_("weights for scores that hold -inf (an additive mask, scores "
                       "{shape})").format(shape=list(scores.shape)),
                fallback=_nonfinite_hint(keep, scores.shape, OVERFLOW, weights=True))
        _large_scores(c)
        # float64 stays float64
        scores = c.randn(3, 4, 5, dtype=torch.float64)
        _softmax_case(c, scores, _random_mask(c, 3, 4, 5), _("float64 scores"))
        c.headline(_("softmax over the keys without a library softmax"))
        c.headline(_("causal (S_q != S_k), random and padding masks"))
        c.headline(_("fully masked rows are zeros"))
        c.headline(_("stable for scores ~1e4"))
        c.headline(_("inputs unchanged"))


def _expect_weights(c, got, scores, mask, *, what, fallback=None, variants=True) -> None:
    want = ref.masked_softmax(scores, mask)
    wrong = {
        QUERY_AXIS: lambda: _softmax(scores, mask, dim=-2),
        NOT_NORMALISED: lambda: _any_of(got, _unnormalised(scores, mask, shift=True),
                                        _unnormalised(scores, mask, shift=False)),
        WHOLE_TENSOR: lambda: (scores - scores.max()).exp() / (scores - scores.max()).exp().sum(),
    }
    if mask is not None:
        wrong.update(_mask_variants(got, scores, mask))
    dims = _dims(scores.dim(), "S_k")
    _expect(c, got, want, what=_("{what} (scores {shape})").format(what=what,
                                                                    shape=list(scores.shape)),
            dims=dims,
            wrong=wrong if variants else None,
            fallback=fallback or _nonfinite_hint(mask, want.shape, OVERFLOW, weights=True))


def _unnormalised(scores, mask, *, shift: bool):
    s = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    return (s - s.amax(-1, keepdim=True)).exp() if shift else s.exp()


def _softmax_case(c: Check, scores, mask, what: str, **kwargs) -> torch.Tensor:
    got = c.call(scores, mask)
    _expect_weights(c, got, scores, mask, what=_("weights with {case}").format(case=what),
                    **kwargs)
    _rows_sum_to_one(c, got, mask)
    return got


def _large_scores(c: Check) -> None:
    """Scores around +-1e4: exp overflows (inf/inf = NaN) or underflows (0/0 = NaN) unless the
    row max is subtracted first. The ordinary mistakes were diagnosed on ordinary scores already;
    here a failure is about stability (with one-hot rows, several mistakes look alike)."""
    b, sq, sk = c.sizes(3, 3, 10)
    # masked keys hold the largest scores: the max must be taken after masking
    mask = _random_mask(c, b, sq, sk)
    scores = c.randn(b, sq, sk).masked_fill(~mask, 1e4)
    _softmax_case(c, scores, mask, _("masked keys scoring 1e4 above the visible ones"),
                  variants=False, fallback=_nonfinite_hint(mask, scores.shape, MAX_BEFORE_MASK,
                                                           weights=True))
    # whole rows near +1e4, -1e4, +3e4 and 0: exp(s) overflows or underflows without the max
    offsets = torch.tensor([1e4, -1e4, 3e4, 0.0])[torch.arange(sq) % 4].view(1, sq, 1)
    scores = offsets + c.randn(b, sq, sk, scale=5.0)
    got = c.call(scores)
    _expect_weights(c, got, scores, None, what=_("weights for scores near +-1e4"),
                    variants=False)
    # a spread of 1e4 within each row: (nearly) one-hot weights, still finite
    scores = c.randn(b, sq, sk, scale=1e4)
    _softmax_case(c, scores, ref.causal_mask(sq, sk), _("a causal mask and scores ~1e4"),
                  variants=False)


# --------------------------------------------------------------------------------------------
# attention


def check_attention(f, *, seed: int | None = None, thorough: bool = False,
                    attention_scores=None, masked_softmax=None) -> None:
    """`attention_scores` and `masked_softmax` (optional): the learner's own helpers, which
    their `attention` presumably calls. When `attention` fails, each given helper that it really
    called is checked too, and one that fails its own check is named as the likely cause (a
    helper that `attention` does not call is never blamed)."""
    helpers = {"attention_scores": attention_scores, "masked_softmax": masked_softmax}

    def hint(failure: CheckFailure, record: CallRecord) -> str | None:
        return _helper_hint(failure, record, helpers)

    with builds_on("attention", _HELPER_CHECKS, given=helpers, hint=hint):
        _check_attention(f, seed=seed, thorough=thorough)


def _helper_hint(failure: CheckFailure, record: CallRecord, helpers: dict) -> str | None:
    """A better hint for a failed attention check from the learner's helpers (None: keep the
    failure's own): the first helper that attention really called and that fails its own check
    is named; when every helper passes, an unexplained failure lies in attention itself. A
    helper that is not started yet cannot be what a started attention calls, so it is not
    blamed."""
    called, broken = earlier_failures(record.seen, _HELPER_CHECKS, failure.seed)
    if broken is not None:
        return fix_first_text("attention", *broken)
    if failure.hint != UNEXPLAINED:
        return None
    others = {name: h for name, h in helpers.items() if name not in called}
    passed, broken = earlier_failures(others, _HELPER_CHECKS, failure.seed)
    if broken is None and len(called) + len(passed) == len(_HELPER_CHECKS):
        return HELPERS_COMBINED
    return None


_HELPER_CHECKS = {"attention_scores": check_attention_scores,
                  "masked_softmax": check_masked_softmax}


def _check_attention(f, *, seed: int | None, thorough: bool) -> None:
    with Check("attention", f, seed=seed, forbid=FORBID_ATTENTION, errors=[SHAPES],
               in_place=IN_PLACE) as c:
        for _n in range(3 if thorough else 1):
            b, n, sq, sk, d, dv, lo, hi = _attention_sizes(c)
            # 1. the article's single head, self-attention (S_q == S_k), no mask, D != D_v
            q, k, v = c.randn(b, sq, d), c.randn(b, sq, d), c.randn(b, sq, dv)
            _attention_case(c, q, k, v, None, _("self-attention [B, S, D], no mask"))
            # 2. heads-first, cached-decoding shapes: S_q < S_k with a bottom-right causal mask
            q, k, v = c.randn(b, n, lo, d), c.randn(b, n, hi, d), c.randn(b, n, hi, dv)
            _attention_case(c, q, k, v, ref.causal_mask(lo, hi), _("a causal mask, S_q < S_k"))
            # 3. a random mask [B, 1, S_q, S_k] with some fully masked rows
            q, k, v = c.randn(b, n, sq, d), c.randn(b, n, sk, d), c.randn(b, n, sk, dv)
            _attention_case(c, q, k, v, _random_mask(c, b, 1, sq, sk, fully_masked_rows=True),
                            _("a mask with fully masked rows"))
            # 4. S_q > S_k causal: the first queries see no key at all
            q, k, v = c.randn(b, n, hi, d), c.randn(b, n, lo, d), c.randn(b, n, lo, dv)
            _attention_case(c, q, k, v, ref.causal_mask(hi, lo), _("a causal mask, S_q > S_k"))
        # 5. huge scores (float64, so both sides round the same way): ~1e4 and beyond
        b, n, sq, sk, d, dv = c.sizes(6, 2, 11)
        q = c.randn(b, n, sq, d, dtype=torch.float64, scale=100.0)
        k = c.randn(b, n, sk, d, dtype=torch.float64, scale=100.0)
        v = c.randn(b, n, sk, dv, dtype=torch.float64)
        _attention_case(c, q, k, v, None, _("scores ~1e4 (float64)"), large=True)
        _attention_case(c, q, k, v, _random_mask(c, b, n, sq, sk, fully_masked_rows=True),
                        _("scores ~1e4 and fully masked rows (float64)"), large=True)
        c.headline(_("out and weights agree with scaled_dot_product_attention"))
        c.headline(_("S_q != S_k, D != D_v, causal and random masks"))
        c.headline(_("fully masked rows give zeros"))
        c.headline(_("stable for scores ~1e4"))


def _attention_sizes(c: Check) -> tuple[int, ...]:
    """B, N, S_q, S_k, D, D_v (distinct) and causal lengths whose wrong scales differ from each
    other and from the right one (as in `_score_sizes`; D_v too: scaling by sqrt(D_v))."""
    while True:
        b, n, sq, sk, d, dv = c.sizes(6, 3, 12)
        lo, hi = _query_key_sizes(c)
        if not _clashes(_divisors(d, (sq, sk, lo, hi), n=n, dv=dv), d):
            return b, n, sq, sk, d, dv, lo, hi


def _own_causal(got, scaled, mask):
    """The weights of an attention that builds its own causal mask (bottom-right or top-left,
    and with or without the mask it was given)."""
    sq, sk = scaled.shape[-2:]
    candidates = []
    for causal in (ref.causal_mask(sq, sk), torch.ones(sq, sk, dtype=torch.bool).tril()):
        candidates += [*_both(scaled, causal)]
        if mask is not None:
            candidates += [*_both(scaled, causal & mask)]
    return _any_of(got, *candidates)


def _attention_case(c: Check, q, k, v, mask, what: str, *, large: bool = False) -> None:
    """One call of attention. Only with `large` scores can exp overflow, so only then does an
    unexplained failure point at stability."""
    args = (q, k, v) if mask is None else (q, k, v, mask)
    got = c.call(*args)
    want_out, want_w = ref.attention(q, k, v, mask)
    shapes = f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}" + \
        ("" if mask is None else f", mask {list(mask.shape)}")
    if isinstance(got, torch.Tensor):
        c.fail(_("returned one tensor {shape} for {inputs}; return the pair (out, weights).")
               .format(shape=list(got.shape), inputs=shapes), ONLY_OUT)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        c.fail(_("should return a pair (out, weights), got {kind} for {inputs}.").format(
            kind=type(got).__name__, inputs=shapes))
    out, weights = got
    if (isinstance(out, torch.Tensor) and isinstance(weights, torch.Tensor) and
            want_w.shape != want_out.shape and
            out.shape == want_w.shape and weights.shape == want_out.shape):
        c.fail(_("the first returned tensor has the weights' shape {shape} for {inputs}.")
               .format(shape=list(want_w.shape), inputs=shapes), PAIR_ORDER)
    nd = q.dim()
    w_dims, o_dims = _dims(nd, "S_k"), _dims(nd, "D_v")

    # Wrong weights, each from the same inputs.
    raw = q @ k.transpose(-2, -1)
    d = q.shape[-1]
    scaled = raw / math.sqrt(d)

    def sm(s, m=mask, dim=-1):
        return _any_of(weights, *_both(s, m, dim)) if m is not None else _softmax(s, None, dim)

    # Each mistake is named with the step (and so the helper) it belongs to.
    divisors = _divisors(d, (q.shape[-2], k.shape[-2]), n=q.shape[-3] if nd == 4 else None,
                         dv=v.shape[-1])
    scores_wrong = {**_scale_variants(weights, raw, divisors, d, then=sm),
                    QK_SWAPPED: lambda: sm(k @ q.transpose(-2, -1) / math.sqrt(d))}
    softmax_wrong = {QUERY_AXIS: lambda: sm(scaled, dim=-2)}
    if not large:  # with (nearly) one-hot rows these look like an unstable softmax
        softmax_wrong[WHOLE_TENSOR] = lambda: _any_of(weights, _whole_tensor(scaled, mask),
                                                      _whole_tensor(scaled, None))
        softmax_wrong[NOT_NORMALISED] = lambda: _any_of(
            weights, _unnormalised(scaled, mask, shift=True),
            _unnormalised(scaled, mask, shift=False))
    if mask is not None:
        softmax_wrong[MAX_BEFORE_MASK] = lambda: _any_of(weights,
                                                         *_max_before_mask(scaled, mask))
        softmax_wrong.update(_mask_variants(weights, scaled, mask))
    w_wrong = {**{_step(SCORES_STEP, hint): v for hint, v in scores_wrong.items()},
               **{_step(SOFTMAX_STEP, hint): v for hint, v in softmax_wrong.items()},
               OWN_CAUSAL: lambda: _own_causal(weights, scaled, mask)}
    dead = _rows_fully_masked(mask, want_w.shape)
    _expect(c, weights, want_w, what=_("weights for {inputs}").format(inputs=shapes),
            dims=w_dims, wrong=w_wrong,
            fallback=_attention_hint(mask, want_w.shape, large=large, weights=True))

    o_wrong = {
        OUT_TRANSPOSED: lambda: (want_w @ v).transpose(-2, -1),
        WEIGHTS_T_V: lambda: want_w.transpose(-2, -1) @ v,
        WEIGHTS_K: lambda: want_w @ k,
        PAIR_ORDER: lambda: want_w,
    }
    for mistake, variant in w_wrong.items():
        o_wrong.setdefault(mistake, lambda variant=variant: variant() @ v)
    _expect(c, out, want_out, what=_("out for {inputs}").format(inputs=shapes), dims=o_dims,
            wrong=o_wrong,
            fallback=_attention_hint(mask, want_w.shape, large=large))
    if dead is not None and dead.any():
        c.note(_("fully masked rows give zeros"))


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "04.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "project_qkv": (
        W_TRANSPOSED, DTYPE_CHANGED, SQUEEZED, IN_PLACE, RETURNED_ONE, OTHER_WEIGHT, PROJ_SHAPES),
    "attention_scores": (
        DTYPE_CHANGED, SCALE_BY_D, NO_SCALE, IN_PLACE, SCALE_MULTIPLIED, QK_SWAPPED,
        SCALE_BY_INT_SQRT, SCALE_BY_H, SCALE_BY_S, SHAPES, QK_SWAPPED_UNSCALED, SCALE_BY_H_ITSELF),
    "masked_softmax": (
        MASK_ADDED, _SOFTMAX_HINT, DTYPE_CHANGED, FINITE_FILL, FULLY_MASKED_NAN, AFTER_SOFTMAX,
        IGNORED_MASK, INVERTED, ONE_AHEAD, NO_DIAGONAL, MAX_BEFORE_MASK, IN_PLACE,
        MASK_MULTIPLIED, WHOLE_TENSOR, NOT_NORMALISED, QUERY_AXIS, TOP_LEFT, OVERFLOW),
    "attention": (
        MASK_ADDED, _SDPA_HINT, DTYPE_CHANGED, SCALE_BY_D, fix_first('attention_scores'),
        fix_first('masked_softmax'), FULLY_MASKED_NAN, HELPERS_COMBINED, AFTER_SOFTMAX, INVERTED,
        NO_DIAGONAL, MAX_BEFORE_MASK, NO_SCALE, WEIGHTS_K, IN_PLACE, SCALE_MULTIPLIED,
        WHOLE_TENSOR, NOT_NORMALISED, OUT_UNEXPLAINED, OUT_TRANSPOSED, PAIR_ORDER, QK_SWAPPED,
        ONLY_OUT, SCALE_BY_INT_SQRT, SCALE_BY_DV, SCALE_BY_H, SCALE_BY_S, QUERY_AXIS, WEIGHTS_T_V,
        OVERFLOW, UNEXPLAINED, SCALE_BY_H_ITSELF, OWN_CAUSAL),
}
