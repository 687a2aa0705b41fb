"""Chapter 07 checkers: the reference passes at every seed; each known mistake is diagnosed."""

import math

import pytest
import torch
import torch.nn.functional as F

from checks import nb07
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import CheckFailure
from checks.i18n import _

from ..support.catalogue import Wrong, assert_passes, exercises, failure_text, implementations
from ..support.cells import learner_cell as _learner_cell


# ---- correct ways of writing each exercise: the reference, and the way a learner might -----

def _permute_gather(x, perm):
    return torch.gather(x, 1, perm[None, :, None].expand(x.shape[0], -1, x.shape[2]))


def _permute_by_matrix(x, perm):
    return ref.permutation_matrix(perm).to(x.dtype) @ x


def _matrix_from_eye(perm):
    return torch.eye(len(perm))[perm]


def _matrix_loop(perm):
    p = torch.zeros(len(perm), len(perm))
    for i, j in enumerate(perm.tolist()):
        p[i, j] = 1.0
    return p


def _equivariance_indexing(fn, x, perm):
    return (fn(x[:, perm]) - fn(x)[:, perm]).abs().max().item()


def _equivariance_numpy_float(fn, x, perm):
    return (fn(x[:, perm]) - fn(x)[:, perm]).abs().max().numpy().astype("float64")[()]


def _sin_float32_pow(seq_len, hidden):
    pos = torch.arange(seq_len).float()[:, None]
    i = torch.arange(0, hidden, 2).float()
    angle = pos / 10000 ** (i / hidden)
    pe = torch.zeros(seq_len, hidden)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe


def _sin_float32_exp(seq_len, hidden):  # the "annotated Transformer" way
    position = torch.arange(seq_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, hidden, 2) * (-math.log(10000.0) / hidden))
    angle = position * div_term
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)


def _sin_python_loops(seq_len, hidden):
    rows = [[f(pos / 10000 ** (2 * (j // 2) / hidden)) for j, f in
             zip(range(hidden), [math.sin, math.cos] * hidden)] for pos in range(seq_len)]
    return torch.tensor(rows, dtype=torch.float32)


CORRECT = {
    nb07.check_permute_tokens: implementations(
        ref.permute_tokens, _permute_gather, _permute_by_matrix,
        index_clone=lambda x, perm: x[:, perm, :].clone()),
    nb07.check_permutation_matrix: implementations(ref.permutation_matrix, _matrix_from_eye,
                                                   _matrix_loop),
    nb07.check_equivariance_error: implementations(ref.equivariance_error,
                                                   _equivariance_indexing,
                                                   _equivariance_numpy_float),
    nb07.check_sinusoidal_positions: implementations(ref.sinusoidal_positions, _sin_float32_pow,
                                                     _sin_float32_exp, _sin_python_loops),
}


# ---- the catalogue of wrong implementations ------------------------------------------------

def _scatter(x, perm):
    out = torch.empty_like(x)
    out[:, perm] = x
    return out


def _in_place(x, perm):
    x[:] = x[:, perm]
    return x


def _equivariance(mode):
    def error(fn, x, perm):
        lhs, out = fn(x[:, perm]), fn(x)
        if mode == "unpermuted":
            return (lhs - out).abs().max().item()
        if mode == "inverse":
            return (lhs - out[:, torch.argsort(perm)]).abs().max().item()
        diff = lhs - out[:, perm]
        if mode == "mean":
            return diff.abs().mean().item()
        if mode == "tensor":
            return diff.abs().max()
        if mode == "no abs":
            return diff.max().item()
        if mode == "no abs, reversed":
            return (out[:, perm] - lhs).max().item()
        if mode == "norm":
            return diff.norm().item()
        if mode == "int":
            return int(diff.abs().max())
        if mode == "abs after max":
            return diff.max().abs().item()
        raise ValueError(mode)
    return error


def _sinusoid(seq_len, hidden, *, base=10000.0, pair_exponent=False, swap=False, halves=False,
              first=0, multiply=False, own_exponent=False, pairs_from=0):
    """Written as a learner would, with one mistake switched on."""
    pe = torch.zeros(seq_len, hidden)
    for pos in range(first, first + seq_len):
        for i in range(hidden // 2):
            pair = i + pairs_from
            power = base ** ((pair if pair_exponent else 2 * pair) / hidden)
            angle = pos * power if multiply else pos / power
            cos_angle = pos / base ** ((2 * i + 1) / hidden) if own_exponent else angle
            a, b = (math.cos(angle), math.sin(cos_angle)) if swap else \
                (math.sin(angle), math.cos(cos_angle))
            if halves:
                pe[pos - first, i], pe[pos - first, hidden // 2 + i] = a, b
            else:
                pe[pos - first, 2 * i], pe[pos - first, 2 * i + 1] = a, b
    return pe


WRONG = {
    nb07.check_permute_tokens: [
        Wrong("batch axis", lambda x, perm: x[perm], "07.permute_tokens.permuted_batch_axis"),
        Wrong("feature axis", lambda x, perm: x[..., perm],
              "07.permute_tokens.permuted_feature_axis"),
        Wrong("feature axis via transpose", lambda x, perm: x.transpose(1, 2)[:, perm]
              .transpose(1, 2), "07.permute_tokens.permuted_feature_axis"),
        Wrong("inverse permutation", lambda x, perm: x[:, torch.argsort(perm)],
              "07.permute_tokens.inverse_permutation"),
        Wrong("scatter instead of gather", _scatter, "07.permute_tokens.inverse_permutation"),
        Wrong("unchanged", lambda x, perm: x, "07.permute_tokens.returned_x_unchanged"),
        # x[arange(B), perm] pairs batch i with perm[i]: the index tensors do not broadcast
        Wrong("batch index paired with perm", lambda x, perm: x[torch.arange(x.shape[0]), perm],
              "07.permute_tokens.indexed_wrong_axis"),
        Wrong("gather with the 1-d perm", lambda x, perm: torch.gather(x, 1, perm),
              "07.permute_tokens.indexed_wrong_axis"),
        Wrong("in place", _in_place, "07.permute_tokens.modified_x_in_place"),
        # new: the tailored hints of Tensor.permute, which reorders axes, not tokens
        Wrong("Tensor.permute with a list", lambda x, perm: x.permute(perm.tolist()),
              "07.permute_tokens.reordered_axes"),
        Wrong("Tensor.permute with the tensor", lambda x, perm: x.permute(perm),
              "07.permute_tokens.reordered_axes"),
    ],
    nb07.check_permutation_matrix: [
        Wrong("transposed", lambda perm: ref.permutation_matrix(perm).T.contiguous(),
              "07.permutation_matrix.transposed"),
        Wrong("columns permuted", lambda perm: torch.eye(len(perm))[:, perm],
              "07.permutation_matrix.transposed"),
        Wrong("one_hot without float", lambda perm: F.one_hot(perm, len(perm)),
              "07.permutation_matrix.not_float32"),
        Wrong("bool matrix", lambda perm: F.one_hot(perm, len(perm)).bool(),
              "07.permutation_matrix.not_float32"),
        Wrong("identity", lambda perm: torch.eye(len(perm)), "07.permutation_matrix.ignores_perm"),
        Wrong("float64 matrix", lambda perm: torch.eye(len(perm), dtype=torch.float64)[perm],
              "07.permutation_matrix.not_float32"),
    ],
    nb07.check_equivariance_error: [
        Wrong("fn(X) - fn(PX) without permuting", _equivariance("unpermuted"),
              "07.equivariance_error.compared_without_permuting"),
        Wrong("inverse permutation on one side", _equivariance("inverse"),
              "07.equivariance_error.inverse_permutation"),
        Wrong("mean instead of max", _equivariance("mean"), "07.equivariance_error.took_mean"),
        Wrong("returns a tensor", _equivariance("tensor"),
              "07.equivariance_error.returned_tensor"),
        Wrong("no abs", _equivariance("no abs"), "07.equivariance_error.missing_abs"),
        Wrong("no abs, reversed difference", _equivariance("no abs, reversed"),
              "07.equivariance_error.missing_abs"),
        Wrong("abs after the max", _equivariance("abs after max"),
              "07.equivariance_error.missing_abs"),
        Wrong("norm of the difference", _equivariance("norm"), "07.equivariance_error.took_norm"),
        Wrong("int(...)", _equivariance("int"), "07.equivariance_error.returned_int"),
    ],
    nb07.check_sinusoidal_positions: [
        Wrong("sin and cos swapped", lambda s, h: _sinusoid(s, h, swap=True),
              "07.sinusoidal_positions.sin_cos_swapped"),
        Wrong("exponent i/H", lambda s, h: _sinusoid(s, h, pair_exponent=True),
              "07.sinusoidal_positions.exponent_i_over_h"),
        Wrong("halves instead of interleaved", lambda s, h: _sinusoid(s, h, halves=True),
              "07.sinusoidal_positions.sin_cos_in_halves"),
        Wrong("base 1000", lambda s, h: _sinusoid(s, h, base=1000.0),
              "07.sinusoidal_positions.base_1000"),
        Wrong("positions from 1", lambda s, h: _sinusoid(s, h, first=1),
              "07.sinusoidal_positions.positions_start_at_1"),
        Wrong("multiplied by the power", lambda s, h: _sinusoid(s, h, multiply=True),
              "07.sinusoidal_positions.multiplied_by_power"),
        Wrong("cos with its own exponent", lambda s, h: _sinusoid(s, h, own_exponent=True),
              "07.sinusoidal_positions.odd_feature_own_exponent"),
        Wrong("transposed", lambda s, h: ref.sinusoidal_positions(s, h).T,
              "07.sinusoidal_positions.transposed"),
        Wrong("float64", lambda s, h: ref.sinusoidal_positions(s, h).double(),
              "07.sinusoidal_positions.not_float32"),
        Wrong("pair index from 1", lambda s, h: _sinusoid(s, h, pairs_from=1),
              "07.sinusoidal_positions.pair_index_from_1"),
    ],
}


EXERCISES = exercises(CORRECT, WRONG)


def test_reference_matches_the_formula():
    pe = ref.sinusoidal_positions(50, 16).double()
    pos, i = 37, 5
    angle = pos / 10000 ** (2 * i / 16)
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert pe[0].tolist() == [0.0, 1.0] * 8


def test_reference_permutations_agree():
    x = torch.randn(2, 5, 3)
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert torch.equal(ref.permute_tokens(x, perm), x[:, perm])
    assert torch.equal(ref.permutation_matrix(perm) @ x[0], x[0][perm])
    assert ref.equivariance_error(torch.tanh, x, perm) == 0.0
    # a causal running sum is not permutation-equivariant
    assert ref.equivariance_error(lambda t: t.cumsum(1), x, perm) > 0.1


def test_chapter_07_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    text = failure_text(nb07.check_permute_tokens, lambda x, perm: x[perm])
    assert "可能的错误：重排了 batch 轴（dim 0）；perm 重排的是 [B, S, H] 的序列轴（dim 1）" in text
    assert "likely mistake" not in text and "expected" not in text, text
    text = failure_text(nb07.check_equivariance_error, _equivariance("mean"))
    assert "fn = 带因果 Mask 的注意力" in text and "取了平均值" in text, text


_PERMUTE_CELL = '''
def permute_tokens(x, perm):                      # broken: reorders the batch axis
    return x[perm]

def equivariance_error(fn, x, perm):
    return float((fn(permute_tokens(x, perm)) - permute_tokens(fn(x), perm)).abs().max())
'''




def test_a_broken_permute_tokens_that_equivariance_error_calls_is_named_fix_it_first():
    ns = _learner_cell(_PERMUTE_CELL)
    with pytest.raises(CheckFailure) as info:
        nb07.check_equivariance_error(ns["equivariance_error"], seed=0)
    assert info.value.mistake == "07.equivariance_error.fix_permute_tokens_first"
    # the hint tells the helper's own mistake
    assert _(nb07.BATCH_AXIS).format(rule=_(nb07._AXIS_RULE)) in str(info.value.hint)


def test_equivariance_error_built_on_a_right_permute_tokens_passes():
    ns = _learner_cell(_PERMUTE_CELL.replace("return x[perm]", "return x[:, perm]"))
    assert_passes(nb07.check_equivariance_error, ns["equivariance_error"], 0)
