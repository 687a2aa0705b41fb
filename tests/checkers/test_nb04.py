"""Chapter 04 checkers: correct implementations pass at every seed; each known mistake is
diagnosed; the library shortcuts the chapter forbids are rejected."""

import contextlib
import functools
import io
import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from checks import nb04
from checks import reference as ref
from checks.engine import CheckFailure, ForbiddenCall

from ..support.catalogue import (SEEDS, Exercise, Wrong, assert_passes, assert_passes_thorough,
                                 assert_rejects, implementations, not_started)
from ..support.cells import learner_cell as _learner_cell

NEG_INF = float("-inf")

# --------------------------------------------------------------------------------------------
# Correct implementations written the way a learner would (no library softmax, no SDPA).


def good_masked_softmax(scores, mask=None):
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp_min(torch.finfo(e.dtype).tiny),
                       torch.zeros_like(e))


def good_masked_softmax_nan_to_num(scores, mask=None):
    """Another correct style: let fully masked rows become NaN, then zero them."""
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    e = (scores - scores.max(dim=-1, keepdim=True).values).exp()
    return (e / e.sum(-1, keepdim=True)).nan_to_num(0.0)


def good_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = good_masked_softmax(scores, mask)
    return weights @ v, weights


def good_attention_einsum(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) * q.shape[-1] ** -0.5
    weights = good_masked_softmax_nan_to_num(scores, mask)
    return torch.einsum("...qk,...kv->...qv", weights, v), weights


CHECKERS = {
    "project_qkv": nb04.check_project_qkv,
    "attention_scores": nb04.check_attention_scores,
    "masked_softmax": nb04.check_masked_softmax,
    "attention": nb04.check_attention,
}

CORRECT = {
    "project_qkv": implementations(
        matmuls=lambda x, wq, wk, wv: (x @ wq, x @ wk, x @ wv),
        torch_matmul=lambda x, wq, wk, wv: tuple(torch.matmul(x, w) for w in (wq, wk, wv))),
    "attention_scores": implementations(
        divided_by_sqrt_d=lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]),
        q_scaled_first=lambda q, k: (q / q.shape[-1] ** 0.5) @ k.mT),
    "masked_softmax": implementations(good_masked_softmax, good_masked_softmax_nan_to_num),
    "attention": implementations(good_attention, good_attention_einsum),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", CHECKERS)
def test_reference_passes(name, seed):
    """The reference uses the library kernels the exercises forbid; lift the ban for it."""
    with mock.patch.multiple(nb04, FORBID_SOFTMAX={}, FORBID_ATTENTION={}):
        assert_passes(CHECKERS[name], getattr(ref, name), seed)


@pytest.mark.parametrize("name", CHECKERS)
def test_reference_passes_thorough(name):
    with mock.patch.multiple(nb04, FORBID_SOFTMAX={}, FORBID_ATTENTION={}):
        assert_passes_thorough(CHECKERS[name], getattr(ref, name))


# --------------------------------------------------------------------------------------------
# Forbidden shortcuts


def _via(softmax_call):
    def masked_softmax(scores, mask=None):
        if mask is not None:
            scores = scores.masked_fill(~mask, NEG_INF)
        return softmax_call(scores).nan_to_num(0.0)
    return masked_softmax


FORBIDDEN_SOFTMAX = {
    "torch.softmax": _via(lambda s: torch.softmax(s, dim=-1)),
    "F.softmax": _via(lambda s: F.softmax(s, dim=-1)),
    "Tensor.softmax": _via(lambda s: s.softmax(-1)),
    "nn.Softmax": _via(lambda s: torch.nn.Softmax(dim=-1)(s)),
    "torch.special.softmax": _via(lambda s: torch.special.softmax(s, -1)),
    "aten.softmax": _via(lambda s: torch.ops.aten.softmax.int(s, -1)),
    "aten._softmax": _via(lambda s: torch.ops.aten._softmax(s, -1, False)),
    "_safe_softmax": _via(lambda s: torch._safe_softmax(s, -1)),
    "log_softmax().exp()": _via(lambda s: F.log_softmax(s, -1).exp()),
    "softmin(-x)": _via(lambda s: F.softmin(-s, -1)),
    "logsumexp": _via(lambda s: (s - s.logsumexp(-1, keepdim=True)).exp()),
    "Categorical.probs": _via(lambda s: torch.distributions.Categorical(logits=s).probs),
    "sdpa with identity values": _via(lambda s: F.scaled_dot_product_attention(
        s, torch.eye(s.shape[-1], dtype=s.dtype).expand(*s.shape[:-2], -1, -1),
        torch.eye(s.shape[-1], dtype=s.dtype).expand(*s.shape[:-2], -1, -1),
        scale=1.0)),
}

FORBIDDEN_ATTENTION = {
    "F.scaled_dot_product_attention": ref.attention,
    "aten.scaled_dot_product_attention": lambda q, k, v, mask=None: (
        torch.ops.aten.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        ref.masked_softmax(ref.attention_scores(q, k), mask)),
    "sdpa math kernel": lambda q, k, v, mask=None: (
        torch._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)[0],
        ref.masked_softmax(ref.attention_scores(q, k), mask)),
}


@pytest.mark.parametrize("name", FORBIDDEN_SOFTMAX)
def test_library_softmax_is_rejected(name):
    with pytest.raises(ForbiddenCall):
        nb04.check_masked_softmax(FORBIDDEN_SOFTMAX[name], seed=0)


@pytest.mark.parametrize("name", FORBIDDEN_ATTENTION)
def test_sdpa_is_rejected(name):
    with pytest.raises(ForbiddenCall):
        nb04.check_attention(FORBIDDEN_ATTENTION[name], seed=0)


def test_forbidden_call_is_diagnosed_with_a_hint():
    with pytest.raises(ForbiddenCall) as info:
        nb04.check_masked_softmax(FORBIDDEN_SOFTMAX["torch.softmax"], seed=0)
    assert info.value.mistake == "04.masked_softmax.calls_library_softmax"
    with pytest.raises(ForbiddenCall) as info:
        nb04.check_attention(FORBIDDEN_ATTENTION["F.scaled_dot_product_attention"], seed=0)
    assert info.value.mistake == "04.attention.calls_library_attention"


# --------------------------------------------------------------------------------------------
# Wrong implementations and the diagnosis each must receive


def _scores_div(scale_of):
    return lambda q, k: q @ k.transpose(-2, -1) / scale_of(q)


def _softmax_mask_fill(fill, *, inverted=False):
    """The usual learner version with a choice of fill value (and mask polarity)."""
    def masked_softmax(scores, mask=None):
        if mask is not None:
            scores = scores.masked_fill(mask if inverted else ~mask, fill)
        e = (scores - scores.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)
    return masked_softmax


def _softmax_own_causal(offset_of):
    """Ignores `mask` and builds its own causal mask with `tril(diagonal=offset_of(S_q, S_k))`."""
    def masked_softmax(scores, mask=None):
        if mask is not None:
            sq, sk = scores.shape[-2:]
            mask = torch.ones(sq, sk, dtype=torch.bool).tril(offset_of(sq, sk))
        return good_masked_softmax(scores, mask)
    return masked_softmax


def _softmax_after(scores, mask=None):
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    w = e / e.sum(-1, keepdim=True)
    return w if mask is None else w * mask


def _softmax_unstable(scores, mask=None):
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    e = scores.exp()
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def _softmax_global_max(scores, mask=None):
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    e = (scores - scores.max()).exp()
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def _softmax_max_before_mask(scores, mask=None):
    row_max = scores.amax(-1, keepdim=True)
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    e = (scores - row_max).exp()
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def _softmax_axis(dim):
    def masked_softmax(scores, mask=None):
        if mask is not None:
            scores = scores.masked_fill(~mask, NEG_INF)
        e = (scores - scores.amax(dim, keepdim=True)).exp()
        return (e / e.sum(dim, keepdim=True)).nan_to_num(0.0)
    return masked_softmax


def _softmax_zeroes_only_boolean_rows(scores, mask=None):
    """Zeros the rows the boolean mask empties, but not rows that arrive as all -inf."""
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    w = e / e.sum(-1, keepdim=True)
    return w if mask is None else w.masked_fill(~mask.any(-1, keepdim=True), 0.0)


def _softmax_in_place(scores, mask=None):
    if mask is not None:
        scores.masked_fill_(~mask, NEG_INF)
    return good_masked_softmax(scores)


def _attention_with(scores_fn=None, softmax=good_masked_softmax, combine=None, pair=None):
    scores_fn = scores_fn or (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    combine = combine or (lambda w, k, v: w @ v)

    def attention(q, k, v, mask=None):
        weights = softmax(scores_fn(q, k), mask)
        out = combine(weights, k, v)
        return pair(out, weights) if pair else (out, weights)
    return attention


def _attention_own_causal(*, top_left=False, and_given=False):
    """Attention that builds a causal mask itself instead of using (only) the one it is given."""
    def attention(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        sq, sk = scores.shape[-2:]
        causal = torch.ones(sq, sk, dtype=torch.bool).tril(0 if top_left else sk - sq)
        if and_given and mask is not None:
            causal = causal & mask
        weights = good_masked_softmax(scores, causal)
        return weights @ v, weights
    return attention


def _softmax_subtracts_max_in_place(scores, mask=None):
    scores -= scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    return good_masked_softmax(scores, mask)


def _scores_scaled_in_place(q, k):
    q /= math.sqrt(q.shape[-1])
    return q @ k.transpose(-2, -1)


def _in_float32(fn):
    """The learner's function computed in float32 whatever the inputs' dtype."""
    def cast(*args):
        return fn(*(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                    for a in args))
    return cast


def _int_sqrt(q):
    return int(math.sqrt(q.shape[-1]))


def _sqrt_h(q):
    return math.sqrt(q.shape[-1] * (q.shape[-3] if q.dim() == 4 else 1))


def _h_itself(q):
    """H = N * D itself (not its square root) for heads-first inputs."""
    return _sqrt_h(q) ** 2 if q.dim() == 4 else math.sqrt(q.shape[-1])


def _attention_scaled_by_sqrt_dv(q, k, v, mask=None):
    weights = good_masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1]), mask)
    return weights @ v, weights


def _attention_scales_q_in_place(q, k, v, mask=None):
    q.mul_(q.shape[-1] ** -0.5)
    weights = good_masked_softmax(q @ k.transpose(-2, -1), mask)
    return weights @ v, weights


WRONG = {
    "project_qkv": [
        Wrong("weights transposed (F.linear)",
              lambda x, wq, wk, wv: (F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)),
              "04.project_qkv.applied_weights_transposed"),
        Wrong("order (q, v, k)", lambda x, wq, wk, wv: (x @ wq, x @ wv, x @ wk),
              "04.project_qkv.used_another_weight"),
        Wrong("w_q everywhere", lambda x, wq, wk, wv: (x @ wq, x @ wq, x @ wq),
              "04.project_qkv.used_another_weight"),
        Wrong("stacked tensor", lambda x, wq, wk, wv: torch.stack([x @ wq, x @ wk, x @ wv]),
              "04.project_qkv.returned_one_tensor"),
        Wrong("W @ x", lambda x, wq, wk, wv: tuple(torch.matmul(w, x) for w in (wq, wk, wv)),
              "04.project_qkv.shapes_do_not_fit"),
        Wrong("in-place scaling of x", lambda x, wq, wk, wv: (x.mul_(1.0) @ wq,
                                                              x.add_(1.0) @ wk, x @ wv),
              "04.project_qkv.modified_input_in_place"),
        # issue 28: a batch of one was never tried
        Wrong("x.squeeze(0)", lambda x, wq, wk, wv: tuple(x.squeeze(0) @ w for w in (wq, wk, wv)),
              "04.project_qkv.dropped_axis_of_one"),
        Wrong("computed in float32", _in_float32(lambda x, wq, wk, wv: (x @ wq, x @ wk, x @ wv)),
              "04.project_qkv.changed_dtype"),
    ],
    "attention_scores": [
        Wrong("no scale", lambda q, k: q @ k.transpose(-2, -1),
              "04.attention_scores.missing_scale"),
        Wrong("divided by D", _scores_div(lambda q: q.shape[-1]),
              "04.attention_scores.divided_by_d"),
        Wrong("scaled by sqrt(H)", _scores_div(_sqrt_h), "04.attention_scores.scaled_by_sqrt_h"),
        Wrong("divided by H", _scores_div(_h_itself), "04.attention_scores.divided_by_h"),
        Wrong("scaled by sqrt(S)", _scores_div(lambda q: math.sqrt(q.shape[-2])),
              "04.attention_scores.scaled_by_sqrt_seq_len"),
        Wrong("multiplied by sqrt(D)", lambda q, k: q @ k.transpose(-2, -1) * q.shape[-1] ** 0.5,
              "04.attention_scores.multiplied_by_sqrt_d"),
        Wrong("K Q^T", lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]),
              "04.attention_scores.q_k_swapped"),
        Wrong("K Q^T unscaled", lambda q, k: k @ q.transpose(-2, -1),
              "04.attention_scores.q_k_swapped_unscaled"),
        Wrong("Q^T K", lambda q, k: q.transpose(-2, -1) @ k / math.sqrt(q.shape[-1]),
              "04.attention_scores.shapes_do_not_fit"),
        # issue 28: passed whenever D was a perfect square, and was told it used a length
        Wrong("scaled by int(sqrt(D))", _scores_div(_int_sqrt),
              "04.attention_scores.scaled_by_int_sqrt"),
        Wrong("k.transpose(0, 1)", lambda q, k: q @ k.transpose(0, 1) / math.sqrt(q.shape[-1]),
              "04.attention_scores.shapes_do_not_fit"),
        Wrong("q scaled in place", _scores_scaled_in_place,
              "04.attention_scores.modified_input_in_place"),
        Wrong("computed in float32", _in_float32(ref.attention_scores),
              "04.attention_scores.changed_dtype"),
    ],
    "masked_softmax": [
        Wrong("query axis", _softmax_axis(-2), "04.masked_softmax.softmax_over_queries"),
        Wrong("whole tensor", lambda s, mask=None: (s - s.max()).exp() / (s - s.max()).exp().sum(),
              "04.masked_softmax.normalised_whole_tensor"),
        Wrong("not normalised", lambda s, mask=None: (
            s if mask is None else s.masked_fill(~mask, NEG_INF)).exp(),
            "04.masked_softmax.not_normalised"),
        Wrong("inverted mask", _softmax_mask_fill(NEG_INF, inverted=True),
              "04.masked_softmax.mask_inverted"),
        Wrong("mask after softmax", _softmax_after, "04.masked_softmax.mask_after_softmax"),
        Wrong("ignores the mask", lambda s, mask=None: good_masked_softmax(s),
              "04.masked_softmax.mask_ignored"),
        Wrong("own causal mask without the diagonal", _softmax_own_causal(lambda q, k: k - q - 1),
              "04.masked_softmax.mask_without_diagonal"),
        Wrong("own causal mask one ahead", _softmax_own_causal(lambda q, k: k - q + 1),
              "04.masked_softmax.mask_one_ahead"),
        Wrong("own top-left causal mask", _softmax_own_causal(lambda q, k: 0),
              "04.masked_softmax.top_left_causal_mask"),
        Wrong("unstable: no max subtracted", _softmax_unstable, "04.masked_softmax.unstable_exp"),
        Wrong("unstable: global max", _softmax_global_max, "04.masked_softmax.unstable_exp"),
        Wrong("max before masking", _softmax_max_before_mask,
              "04.masked_softmax.max_before_mask"),
        Wrong("fully masked rows NaN", _softmax_mask_fill(NEG_INF),
              "04.masked_softmax.fully_masked_row_nan"),
        Wrong("all -inf rows (additive mask) NaN", _softmax_zeroes_only_boolean_rows,
              "04.masked_softmax.fully_masked_row_nan"),
        Wrong("finite fill -1e9", _softmax_mask_fill(-1e9), "04.masked_softmax.finite_fill"),
        Wrong("masked_fill_ in place", _softmax_in_place,
              "04.masked_softmax.modified_input_in_place"),
        Wrong("fill with finfo.min", lambda s, mask=None: _softmax_mask_fill(
            torch.finfo(s.dtype).min)(s, mask), "04.masked_softmax.finite_fill"),
        Wrong("max subtracted in place", _softmax_subtracts_max_in_place,
              "04.masked_softmax.modified_input_in_place"),
        Wrong("computed in float32", _in_float32(good_masked_softmax),
              "04.masked_softmax.changed_dtype"),
        Wrong("boolean mask added", lambda s, mask=None: good_masked_softmax(
            s if mask is None else s + mask), "04.masked_softmax.added_boolean_mask"),
        Wrong("scores times the mask", lambda s, mask=None: good_masked_softmax(
            s if mask is None else s * mask), "04.masked_softmax.multiplied_by_mask"),
    ],
    "attention": [
        Wrong("no scale", _attention_with(lambda q, k: q @ k.transpose(-2, -1)),
              "04.attention.missing_scale"),
        Wrong("divided by D", _attention_with(_scores_div(lambda q: q.shape[-1])),
              "04.attention.divided_by_d"),
        Wrong("scaled by sqrt(H)", _attention_with(_scores_div(_sqrt_h)),
              "04.attention.scaled_by_sqrt_h"),
        Wrong("divided by H", _attention_with(_scores_div(_h_itself)), "04.attention.divided_by_h"),
        Wrong("softmax over queries", _attention_with(softmax=_softmax_axis(-2)),
              "04.attention.softmax_over_queries"),
        Wrong("inverted mask", _attention_with(softmax=_softmax_mask_fill(NEG_INF, inverted=True)),
              "04.attention.mask_inverted"),
        Wrong("mask after softmax", _attention_with(softmax=_softmax_after),
              "04.attention.mask_after_softmax"),
        Wrong("mask off by one", _attention_with(
            softmax=_softmax_own_causal(lambda q, k: k - q - 1)),
            "04.attention.mask_without_diagonal"),
        Wrong("unstable softmax", _attention_with(softmax=_softmax_unstable),
              "04.attention.unstable_exp"),
        Wrong("fully masked rows NaN", _attention_with(softmax=_softmax_mask_fill(NEG_INF)),
              "04.attention.fully_masked_row_nan"),
        Wrong("K Q^T", _attention_with(lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(
            q.shape[-1])), "04.attention.q_k_swapped"),
        Wrong("A^T V", _attention_with(combine=lambda w, k, v: w.transpose(-2, -1) @ v),
              "04.attention.transposed_weights_times_v"),
        Wrong("out transposed", _attention_with(
            combine=lambda w, k, v: (w @ v).transpose(-2, -1)), "04.attention.output_transposed"),
        Wrong("weights @ k", _attention_with(combine=lambda w, k, v: w @ k),
              "04.attention.mixed_keys"),
        Wrong("(weights, out)", _attention_with(pair=lambda out, w: (w, out)),
              "04.attention.pair_order_swapped"),
        Wrong("only out", lambda q, k, v, mask=None: good_attention(q, k, v, mask)[0],
              "04.attention.returned_only_out"),
        # mistakes of the helpers attention is built from, named with their step
        Wrong("scaled by sqrt(S)", _attention_with(_scores_div(lambda q: math.sqrt(q.shape[-2]))),
              "04.attention.scaled_by_sqrt_seq_len"),
        Wrong("multiplied by sqrt(D)", _attention_with(
            lambda q, k: q @ k.transpose(-2, -1) * q.shape[-1] ** 0.5),
            "04.attention.multiplied_by_sqrt_d"),
        Wrong("softmax over the whole tensor", _attention_with(
            softmax=lambda s, mask=None: (s - s.max()).exp() / (s - s.max()).exp().sum()),
            "04.attention.normalised_whole_tensor"),
        Wrong("softmax not normalised", _attention_with(softmax=lambda s, mask=None: (
            s if mask is None else s.masked_fill(~mask, NEG_INF)).exp()),
            "04.attention.not_normalised"),
        Wrong("softmax max before masking", _attention_with(softmax=_softmax_max_before_mask),
              "04.attention.max_before_mask"),
        # issue 28 and new: scales that pass or read as another mistake at some seeds
        Wrong("scaled by int(sqrt(D))", _attention_with(_scores_div(_int_sqrt)),
              "04.attention.scaled_by_int_sqrt"),
        Wrong("scaled by sqrt(D_v)", _attention_scaled_by_sqrt_dv,
              "04.attention.scaled_by_sqrt_dv"),
        Wrong("q scaled in place", _attention_scales_q_in_place,
              "04.attention.modified_input_in_place"),
        Wrong("computed in float32", _in_float32(good_attention), "04.attention.changed_dtype"),
        Wrong("own causal mask", _attention_own_causal(), "04.attention.built_own_causal_mask"),
        Wrong("own top-left causal mask", _attention_own_causal(top_left=True),
              "04.attention.built_own_causal_mask"),
        Wrong("own causal mask and the given one", _attention_own_causal(and_given=True),
              "04.attention.built_own_causal_mask"),
        Wrong("boolean mask added", _attention_with(softmax=lambda s, mask=None: (
            good_masked_softmax(s if mask is None else s + mask))),
            "04.attention.added_boolean_mask"),
    ],
}


EXERCISES = [Exercise(CHECKERS[name], CORRECT[name], WRONG[name]) for name in CHECKERS]


# --------------------------------------------------------------------------------------------
# attention built from the learner's own helpers: the test cell passes them in, and a failing
# attention names the helper that fails its own check


def _softmax_shifted_by_mean(scores, mask=None):
    """A wrong softmax no known variant reproduces: divides by the row mean, not the sum."""
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    e = (scores - scores.amax(-1, keepdim=True)).exp().nan_to_num(0.0)
    return e / e.mean(-1, keepdim=True).clamp_min(1e-30)


def _scores_with_key_bias(q, k):
    """Wrong scores no known variant reproduces (a per-key bias: a per-query one would cancel
    in the softmax)."""
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + 0.5 * k.sum(-1).unsqueeze(-2)


GOOD_SCORES = CORRECT["attention_scores"]["divided_by_sqrt_d"]

# (name, learner's attention_scores, learner's masked_softmax, the mistake named, and the
# helper's own mistake its hint tells, if a known one)
HELPER_CASES = [
    ("unknown softmax mistake", GOOD_SCORES, _softmax_shifted_by_mean,
     "04.attention.fix_masked_softmax_first", None),
    ("unknown scores mistake", _scores_with_key_bias, good_masked_softmax,
     "04.attention.fix_attention_scores_first", None),
    ("softmax over the whole tensor", GOOD_SCORES,
     lambda s, mask=None: (s - s.max()).exp() / (s - s.max()).exp().sum(),
     "04.attention.fix_masked_softmax_first", nb04.WHOLE_TENSOR),
    ("unstable softmax", GOOD_SCORES, _softmax_unstable,
     "04.attention.fix_masked_softmax_first", nb04.OVERFLOW),
    ("unscaled scores", lambda q, k: q @ k.transpose(-2, -1), good_masked_softmax,
     "04.attention.fix_attention_scores_first", nb04.NO_SCALE),
]


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("case", HELPER_CASES, ids=[c[0] for c in HELPER_CASES])
def test_attention_names_the_broken_helper(case, seed):
    _, scores_fn, softmax, mistake, helper_mistake = case
    wrong = Wrong(case[0], _attention_with(scores_fn, softmax), mistake)
    checker = functools.partial(nb04.check_attention, attention_scores=scores_fn,
                                masked_softmax=softmax)
    failure = assert_rejects(checker, wrong, seed)
    if helper_mistake is not None:  # the hint tells the helper's own mistake
        assert str(helper_mistake) in str(failure.hint)
    assert str(nb04.OVERFLOW) not in str(failure.hint) or helper_mistake is nb04.OVERFLOW


def test_unknown_helper_mistake_without_helpers_does_not_blame_overflow():
    with pytest.raises(CheckFailure) as info:
        with contextlib.redirect_stdout(io.StringIO()):
            nb04.check_attention(_attention_with(softmax=_softmax_shifted_by_mean), seed=0)
    assert info.value.mistake == "04.attention.weights_unexplained"


def test_correct_attention_passes_whatever_its_unused_helpers_do():
    checker = functools.partial(nb04.check_attention, attention_scores=_scores_with_key_bias,
                                masked_softmax=_softmax_shifted_by_mean)
    assert_passes(checker, good_attention, 0)


def test_wrong_attention_with_good_helpers_keeps_its_own_diagnosis():
    checker = functools.partial(nb04.check_attention, attention_scores=GOOD_SCORES,
                                masked_softmax=good_masked_softmax)
    wrong = Wrong("A^T V", _attention_with(combine=lambda w, k, v: w.transpose(-2, -1) @ v),
                  "04.attention.transposed_weights_times_v")
    assert_rejects(checker, wrong, 0)


def test_unexplained_failure_with_passing_helpers_points_at_how_they_are_combined():
    checker = functools.partial(nb04.check_attention, attention_scores=GOOD_SCORES,
                                masked_softmax=good_masked_softmax)
    wrong = Wrong("own scores inline", _attention_with(_scores_with_key_bias),
                  "04.attention.helpers_combined_wrongly")
    assert_rejects(checker, wrong, 0)


def test_unstarted_helpers_are_not_blamed():
    checker = functools.partial(nb04.check_attention, attention_scores=not_started,
                                masked_softmax=not_started)
    wrong = Wrong("no scale", _attention_with(lambda q, k: q @ k.transpose(-2, -1)),
                  "04.attention.missing_scale")
    assert_rejects(checker, wrong, 0)


def test_failures_are_check_failures_not_tracebacks():
    # A learner function that crashes reads as a LearnerError naming its input shapes.
    def crashes(q, k, v, mask=None):
        return q @ v, None
    with pytest.raises(CheckFailure) as info:
        nb04.check_attention(crashes, seed=0)
    assert "called with" in str(info.value)


def test_out_that_is_not_weights_at_v_says_the_weights_are_right():
    def attention(q, k, v, mask=None):
        out, weights = good_attention(q, k, v, mask)
        return out + 0.5 * v.mean(-2, keepdim=True), weights
    with pytest.raises(CheckFailure) as info:
        with contextlib.redirect_stdout(io.StringIO()):
            nb04.check_attention(attention, seed=0)
    assert info.value.mistake == "04.attention.output_not_weights_times_v"


@pytest.mark.parametrize("seed", range(0, 400, 7))
def test_sizes_tell_every_scale_mistake_apart(seed):
    """Issue 28: int(sqrt(D)) passed whenever D was a perfect square and read as a scale by a
    sequence length when sqrt(S) = int(sqrt(D)); the sizes are now chosen so that no two scale
    mistakes (nor a mistake and the right scale) divide by the same number."""
    check = nb04.Check("attention_scores", lambda q, k: None, seed=seed)
    b, n, sq, sk, d = nb04._score_sizes(check)
    assert math.isqrt(d) ** 2 != d
    assert not nb04._clashes(nb04._divisors(d, (sq, sk), n=n), d)
    b, n, sq, sk, d, dv, lo, hi = nb04._attention_sizes(check)
    assert not nb04._clashes(nb04._divisors(d, (sq, sk, lo, hi), n=n, dv=dv), d)


# --------------------------------------------------------------------------------------------
# Knock-on failures in the self-check (issue 33): attention built on a catalogued wrong helper
# names that helper ("fix it first"), never the helper's mistake a second time under attention;
# with both helpers wrong, the first one attention calls (attention_scores) is named.

_LEARNER_ATTENTION = '''
def attention(q, k, v, mask=None):
    weights = masked_softmax(attention_scores(q, k), mask)
    return weights @ v, weights
'''


def _self_check_mistake(scores_fn, softmax, seed=0) -> str | None:
    """The mistake the chapter's test cell reports for a learner's attention built, as in the
    notebook, from their own helpers (None: it passes)."""
    ns = _learner_cell(_LEARNER_ATTENTION, attention_scores=scores_fn, masked_softmax=softmax)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nb04.check_attention(ns["attention"], seed=seed, attention_scores=scores_fn,
                                 masked_softmax=softmax)
    except CheckFailure as failure:
        return failure.mistake
    return None


def _passes_attention(helper: str, fn) -> bool:
    """Whether attention built on this wrong helper is right all the same (a helper that calls
    a library softmax, which attention's check allows, or changes the dtype only of inputs
    attention never gives it)."""
    good = {"attention_scores": GOOD_SCORES, "masked_softmax": good_masked_softmax}
    ns = _learner_cell(_LEARNER_ATTENTION, **{**good, helper: fn})
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nb04.check_attention(ns["attention"], seed=0)
    except CheckFailure:
        return False
    return True


@pytest.mark.parametrize("helper", ["attention_scores", "masked_softmax"])
def test_a_catalogued_wrong_helper_is_named_fix_it_first_by_the_self_check(helper):
    good = {"attention_scores": GOOD_SCORES, "masked_softmax": good_masked_softmax}
    named = 0
    for wrong in WRONG[helper]:
        helpers = {**good, helper: wrong.fn}
        mistake = _self_check_mistake(helpers["attention_scores"], helpers["masked_softmax"])
        if mistake is None:
            assert _passes_attention(helper, wrong.fn), wrong.name
            continue
        assert mistake == f"04.attention.fix_{helper}_first", (wrong.name, mistake)
        named += 1
    assert named >= len(WRONG[helper]) - 3


_BROKEN_SCORES = [w for w in WRONG["attention_scores"]
                  if w.mistake in ("04.attention_scores.missing_scale",
                                   "04.attention_scores.q_k_swapped",
                                   "04.attention_scores.divided_by_d")]
_BROKEN_SOFTMAX = [w for w in WRONG["masked_softmax"]
                   if w.mistake in ("04.masked_softmax.unstable_exp",
                                    "04.masked_softmax.softmax_over_queries",
                                    "04.masked_softmax.mask_inverted")]


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_two_wrong_helpers_name_the_first_one_attention_calls(seed):
    assert len(_BROKEN_SCORES) == 3 and len(_BROKEN_SOFTMAX) >= 3
    for scores_fn in _BROKEN_SCORES:
        for softmax in _BROKEN_SOFTMAX:
            mistake = _self_check_mistake(scores_fn.fn, softmax.fn, seed)
            assert mistake == "04.attention.fix_attention_scores_first", (
                scores_fn.name, softmax.name, mistake)
