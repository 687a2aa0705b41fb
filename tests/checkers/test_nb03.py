"""Chapter 03 checkers: the reference passes at every seed; each known mistake is diagnosed."""

import functools

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from checks import nb03
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import CheckFailure

from ..support.catalogue import Wrong, assert_rejects, exercises, failure_text, implementations

CORRECT = {
    nb03.check_causal_mask: implementations(ref.causal_mask),
    nb03.check_bidirectional_mask: implementations(ref.bidirectional_mask),
    nb03.check_padding_mask: implementations(ref.padding_mask),
    nb03.check_combine_masks: implementations(ref.combine_masks),
    nb03.check_to_additive_mask: implementations(ref.to_additive_mask),
}


# An independent oracle for the reference: PyTorch's own lower-right (bottom-right) causal bias.
@pytest.mark.parametrize("q_len,k_len", [(1, 1), (4, 4), (1, 7), (3, 8), (7, 9), (9, 9)])
def test_reference_causal_mask_is_pytorchs_lower_right(q_len, k_len):
    want = causal_lower_right(q_len, k_len)._materialize()
    assert torch.equal(ref.causal_mask(q_len, k_len), want)
    # and the top-left variant really is what `torch.tril(ones(q, k))` gives
    top_left = causal_upper_left(q_len, k_len)._materialize()
    assert torch.equal(torch.ones(q_len, k_len, dtype=torch.bool).tril(), top_left)


def test_reference_additive_mask_matches_boolean_mask_in_sdpa():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
    mask = ref.combine_masks(ref.causal_mask(4, 6), ref.padding_mask(
        torch.tensor([[True] * 6, [True] * 5 + [False]])))
    F = torch.nn.functional
    by_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    by_add = F.scaled_dot_product_attention(q, k, v, attn_mask=ref.to_additive_mask(mask))
    torch.testing.assert_close(by_bool, by_add)


# ---- causal_mask ----------------------------------------------------------------------------

def _k(q, k):
    return q if k is None else k


def _causal_top_left(q, k=None):
    return torch.tril(torch.ones(q, _k(q, k), dtype=torch.bool))


def _causal_sliced_square(q, k=None):
    k = _k(q, k)
    return torch.tril(torch.ones(k, k, dtype=torch.bool))[:q]  # the first rows, not the last


def _causal_inverted(q, k=None):
    return torch.triu(torch.ones(q, _k(q, k), dtype=torch.bool), diagonal=1)


def _causal_no_diagonal(q, k=None):
    k = _k(q, k)
    return torch.ones(q, k, dtype=torch.bool).tril(k - q - 1)


def _causal_one_ahead(q, k=None):
    k = _k(q, k)
    return torch.arange(k)[None, :] <= torch.arange(k - q, k)[:, None] + 1


def _causal_float(q, k=None):
    k = _k(q, k)
    return torch.ones(q, k).tril(k - q)


def _causal_long(q, k=None):
    return ref.causal_mask(q, k).long()


def _causal_ignores_k_len(q, k=None):
    return torch.tril(torch.ones(q, q, dtype=torch.bool))


def _causal_shift_sign(q, k=None):
    k = _k(q, k)
    return torch.ones(q, k, dtype=torch.bool).tril(q - k)


def _causal_transposed(q, k=None):
    return ref.causal_mask(q, k).T


# ---- bidirectional_mask ---------------------------------------------------------------------

def _bi_causal(q, k=None):
    return ref.causal_mask(q, k)


def _bi_float(q, k=None):
    return torch.ones(q, _k(q, k))


def _bi_ignores_k_len(q, k=None):
    return torch.ones(q, q, dtype=torch.bool)


def _bi_zeros(q, k=None):
    return torch.zeros(q, _k(q, k), dtype=torch.bool)


def _bi_transposed(q, k=None):
    return torch.ones(_k(q, k), q, dtype=torch.bool)


# ---- combine_masks --------------------------------------------------------------------------

def _combine_or(*masks):
    return functools.reduce(torch.logical_or, masks)


def _combine_in_place(*masks):
    out = masks[0]
    for m in masks[1:]:
        out &= m
    return out


def _combine_float_product(*masks):
    return functools.reduce(lambda a, b: a * b, [m.float() for m in masks])


def _combine_stack(*masks):
    return torch.stack(masks).all(0)


def _combine_in_place_clone(*masks):
    out = masks[0].clone()
    for m in masks[1:]:
        out &= m  # the result cannot grow to the broadcast shape
    return out


# ---- to_additive_mask -----------------------------------------------------------------------

def _additive_finite(value):
    def to_additive_mask(mask, dtype=torch.float32):
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, value)
    return to_additive_mask


def _additive_finfo_min(mask, dtype=torch.float32):
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def _additive_bert_style(mask, dtype=torch.float32):
    return (1.0 - mask.float()) * -10000.0


def _additive_inverted(mask, dtype=torch.float32):
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(mask, float("-inf"))


def _additive_ignores_dtype(mask, dtype=torch.float32):
    return torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))


def _additive_times_inf(mask, dtype=torch.float32):
    return (1 - mask.to(dtype)) * float("-inf")


WRONG = {
    nb03.check_causal_mask: [
        Wrong("top-left tril(ones(q, k))", _causal_top_left, '03.causal_mask.top_left_aligned'),
        Wrong("first rows of a square tril", _causal_sliced_square,
              '03.causal_mask.top_left_aligned'),
        Wrong("inverted triu(diagonal=1)", _causal_inverted, '03.causal_mask.inverted'),
        Wrong("diagonal excluded", _causal_no_diagonal, '03.causal_mask.diagonal_excluded'),
        Wrong("one future key", _causal_one_ahead, '03.causal_mask.sees_one_future_key'),
        Wrong("float mask", _causal_float, '03.causal_mask.not_bool'),
        Wrong("int mask", _causal_long, '03.causal_mask.not_bool'),
        Wrong("ignores k_len", _causal_ignores_k_len, '03.causal_mask.ignored_k_len'),
        Wrong("transposed", _causal_transposed, '03.causal_mask.transposed'),
        Wrong("squeezed", lambda q, k=None: ref.causal_mask(q, k).squeeze(),
              '03.causal_mask.squeezed_query_axis'),
        Wrong("diagonal shifted by q - k", _causal_shift_sign,
              '03.causal_mask.diagonal_shifted_wrong_way'),
        Wrong("k_len without a default", lambda q, k: ref.causal_mask(q, k),
              '03.causal_mask.k_len_without_default'),
    ],
    nb03.check_bidirectional_mask: [
        Wrong("causal", _bi_causal, '03.bidirectional_mask.returned_causal'),
        Wrong("float ones", _bi_float, '03.bidirectional_mask.not_bool'),
        Wrong("ignores k_len", _bi_ignores_k_len, '03.bidirectional_mask.ignored_k_len'),
        Wrong("k_len without a default", lambda q, k: torch.ones(q, k, dtype=torch.bool),
              '03.bidirectional_mask.k_len_without_default'),
        Wrong("all False", _bi_zeros, '03.bidirectional_mask.inverted'),
        Wrong("squeezed", lambda q, k=None: torch.ones(q, _k(q, k), dtype=torch.bool).squeeze(),
              '03.bidirectional_mask.squeezed_query_axis'),
        Wrong("transposed", _bi_transposed, '03.bidirectional_mask.transposed'),
    ],
    nb03.check_padding_mask: [
        Wrong("[B, S]", lambda am: am, '03.padding_mask.returned_b_s'),
        Wrong("[B, 1, S, 1] masks queries", lambda am: am[:, None, :, None],
              '03.padding_mask.masked_queries'),
        Wrong("inverted", lambda am: ~am[:, None, None, :], '03.padding_mask.inverted'),
        Wrong("queries and keys [B, 1, S, S]",
              lambda am: am[:, None, :, None] & am[:, None, None, :],
              '03.padding_mask.masked_queries_and_keys'),
        Wrong("float", lambda am: am.float()[:, None, None, :], '03.padding_mask.not_bool'),
        Wrong("[B, 1, S]", lambda am: am.unsqueeze(1), '03.padding_mask.added_one_axis'),
        Wrong("expanded over the queries",
              lambda am: am[:, None, None, :].expand(-1, 1, am.shape[1], -1),
              '03.padding_mask.expanded_over_queries'),
        Wrong("unsqueeze_ in place", lambda am: am.unsqueeze_(1).unsqueeze_(1),
              '03.padding_mask.changed_attention_mask'),
        Wrong("[B, S, 1, 1]", lambda am: am[..., None, None],
              '03.padding_mask.sequence_on_wrong_axis'),
    ],
    nb03.check_combine_masks: [
        Wrong("OR", _combine_or, '03.combine_masks.combined_with_or'),
        Wrong("first mask only", lambda *masks: masks[0], '03.combine_masks.first_mask_only'),
        Wrong("last mask only", lambda *masks: masks[-1], '03.combine_masks.last_mask_only'),
        Wrong("two masks only", lambda a, b: a & b, '03.combine_masks.fixed_number_of_masks'),
        Wrong("float product", _combine_float_product, '03.combine_masks.not_bool'),
        Wrong("in place &=", _combine_in_place, '03.combine_masks.changed_input_mask'),
        Wrong("&= into a copy", _combine_in_place_clone, '03.combine_masks.masks_not_broadcast'),
        Wrong("first two masks only", lambda *masks: masks[0] & masks[1] if len(masks) > 1
              else masks[0], '03.combine_masks.first_two_masks_only'),
        Wrong("Python's and", lambda *masks: functools.reduce(lambda a, b: a and b, masks),
              '03.combine_masks.python_and'),
        Wrong("stack without broadcasting", _combine_stack, '03.combine_masks.masks_not_broadcast'),
    ],
    nb03.check_to_additive_mask: [
        Wrong("-1e9", _additive_finite(-1e9), '03.to_additive_mask.large_finite_number'),
        Wrong("finfo.min", _additive_finfo_min, '03.to_additive_mask.large_finite_number'),
        Wrong("BERT-style (1 - mask) * -10000", _additive_bert_style,
              '03.to_additive_mask.large_finite_number'),
        Wrong("inverted signs", _additive_inverted, '03.to_additive_mask.inverted_signs'),
        Wrong("always float64", lambda mask, dtype=torch.float32: ref.to_additive_mask(
            mask, torch.float64), '03.to_additive_mask.wrong_dtype'),
        Wrong("dtype ignored", _additive_ignores_dtype, '03.to_additive_mask.ignored_dtype'),
        Wrong("(1 - mask) * -inf", _additive_times_inf, '03.to_additive_mask.multiplied_by_inf'),
        Wrong("0/1 numbers", lambda mask, dtype=torch.float32: mask.to(dtype),
              '03.to_additive_mask.returned_0_1_numbers'),
        Wrong("boolean returned", lambda mask, dtype=torch.float32: mask.clone(),
              '03.to_additive_mask.returned_bool'),
        Wrong("+inf", _additive_finite(float("inf")), '03.to_additive_mask.plus_inf'),
    ],
}


EXERCISES = exercises(CORRECT, WRONG)


def test_top_left_decode_step_is_explained():
    """The decode case alone (square masks agree) must still name the alignment."""
    def square_only_right(q, k=None):
        return ref.causal_mask(q, k) if k is None or k == q else _causal_top_left(q, k)
    assert_rejects(nb03.check_causal_mask, Wrong("top-left only when q != k", square_only_right,
                                                 "03.causal_mask.top_left_aligned"), seed=0)


def test_chapter_03_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    text = failure_text(nb03.check_causal_mask, _causal_top_left)
    assert "可能的错误：左上对齐了（`torch.tril(torch.ones(q_len, k_len))`）" in text, text
    assert "likely mistake" not in text and "expected" not in text
    with pytest.raises(CheckFailure) as info:
        nb03.check_to_additive_mask(lambda m, dtype=torch.float32: m.to(dtype), seed=0)
    assert "把 Mask 返回成了 0/1 数值" in str(info.value), str(info.value)


def test_an_exact_mismatch_shows_the_gap_between_near_numbers():
    """Issue 33: a rejected value never reads as equal to the expected one ("-1e+09, expected
    -1e+09")."""
    got = torch.tensor([0.0, -1e9 + 0.5], dtype=torch.float64)
    want = torch.tensor([0.0, -1e9], dtype=torch.float64)
    text = nb03._exact_mismatch(got, want, ("S_q",))
    assert "got -999999999.5, expected -1000000000" in text, text
