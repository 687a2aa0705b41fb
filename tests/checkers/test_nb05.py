"""Chapter 05 checkers: correct implementations pass at every seed; known mistakes are diagnosed.

Sizes: the checkers draw distinct B, S, N, D in 2..8 (H = N * D up to 56), plus fixed cases
(B=2, S=6, N=3, D=4 where splitting tokens would also fit; the article's 32 x 128 = 4096;
GQA with N_kv in {2, 3} and MQA with N_kv = 1).
"""

import contextlib
import io
import math

import pytest
import torch
import torch.nn.functional as F

from checks import nb05
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import CheckFailure, ForbiddenCall
from checks.reference.attention import torch_mha_reference

from ..support.catalogue import Wrong, exercises, failure_text, implementations

# --------------------------------------------------------------------------------------------
# Correct implementations: the reference, and second formulations


def mha_from_reference_parts(x, w_qkv, w_o, n_heads, mask=None):
    """What the notebook suggests: fused GEMM, split, chapter 04's `attention`, merge, W_O."""
    d = w_qkv.shape[1] // (3 * n_heads)
    q, k, v = ref.split_qkv(x @ w_qkv, n_heads, n_heads, d)
    out, _ = ref.attention(q, k, v, mask)
    return ref.merge_heads(out) @ w_o


def mha_by_hand(x, w_qkv, w_o, n_heads, mask=None):
    """Per-head loop with an explicit softmax: no fused kernel anywhere."""
    b, s, h = x.shape
    d = h // n_heads
    q_all, k_all, v_all = (x @ w_qkv).split(h, dim=-1)
    heads = []
    for i in range(n_heads):
        cols = slice(i * d, (i + 1) * d)
        scores = q_all[..., cols] @ k_all[..., cols].transpose(-2, -1) / math.sqrt(d)
        if mask is not None:
            m = mask.bool().expand(b, n_heads, s, s)[:, i]
            scores = scores.masked_fill(~m, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        heads.append(weights @ v_all[..., cols])
    return torch.cat(heads, dim=-1) @ w_o


def split_heads_unflatten(x, n_heads):
    return x.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3)


def merge_heads_permute(x):
    return x.permute(0, 2, 1, 3).flatten(2)


def split_qkv_by_index(qkv, n_heads, n_kv_heads, head_dim):
    q_end = n_heads * head_dim
    k_end = q_end + n_kv_heads * head_dim
    return (split_heads_unflatten(qkv[..., :q_end], n_heads),
            split_heads_unflatten(qkv[..., q_end:k_end], n_kv_heads),
            split_heads_unflatten(qkv[..., k_end:], n_kv_heads))


CORRECT = {
    nb05.check_split_heads: implementations(ref.split_heads, split_heads_unflatten),
    nb05.check_merge_heads: implementations(ref.merge_heads, merge_heads_permute),
    nb05.check_fuse_qkv_weights: implementations(
        ref.fuse_qkv_weights, hstack=lambda q, k, v: torch.hstack([q, k, v])),
    nb05.check_split_qkv: implementations(ref.split_qkv, split_qkv_by_index),
    nb05.check_multi_head_attention: implementations(ref.multi_head_attention,
                                                     mha_from_reference_parts, mha_by_hand),
}


# --------------------------------------------------------------------------------------------
# The torch.nn.MultiheadAttention reference itself


def test_torch_mha_reference_agrees_with_sdpa_reference():
    gen = torch.Generator().manual_seed(0)
    b, s, n, d = 3, 7, 4, 5
    h = n * d
    x = torch.randn(b, s, h, generator=gen)
    w_qkv = torch.randn(h, 3 * h, generator=gen) / math.sqrt(h)
    w_o = torch.randn(h, h, generator=gen) / math.sqrt(h)
    per_head = torch.rand(b, n, s, s, generator=gen) < 0.5
    per_head[1, 2, 3] = False  # one fully masked row in one head
    for mask in (None, ref.causal_mask(s), per_head):
        want = ref.multi_head_attention(x, w_qkv, w_o, n, mask)
        got = torch_mha_reference(x, w_qkv, w_o, n, mask)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
        assert not got.isnan().any()
    state = torch.random.get_rng_state()
    torch_mha_reference(x, w_qkv, w_o, n)
    assert torch.equal(state, torch.random.get_rng_state()), "must leave the global RNG alone"


# --------------------------------------------------------------------------------------------
# Wrong implementations, written as a learner would write them and not copied from the checker's
# own variants (checks/nb05.py's `wrong={...}`): a variant of the checker that computed something
# else than its mistake would then fail here instead of agreeing with itself.


def split_view_no_transpose(x, n_heads):
    """`.view` straight to [B, N, S, D] (the input is contiguous, so the view succeeds)."""
    b, s, h = x.shape
    return x.view(b, n_heads, s, h // n_heads)


def split_reshape_no_transpose(x, n_heads):
    """The same mistake with `.reshape`, which also takes a column slice of qkv."""
    b, s, h = x.shape
    head_dim = h // n_heads
    return x.reshape(b, n_heads, s, head_dim)


def split_tokens_first(x, n_heads):
    return x.unflatten(-1, (n_heads, -1))  # [B, S, N, D]: the transpose forgotten


def split_head_minor(x, n_heads):
    """Head h takes every N-th feature, starting at h."""
    return torch.stack([x[..., h::n_heads] for h in range(n_heads)], dim=1)


def split_tokenwise(x, n_heads):
    """N chunks of consecutive tokens, one per head."""
    return torch.stack(x.chunk(n_heads, dim=1), dim=1)


def split_wrong_axes(x, n_heads):
    """One transpose too many: [B, S, N, D] -> [B, N, S, D] -> [B, N, D, S]."""
    b, s, h = x.shape
    return x.view(b, s, n_heads, h // n_heads).transpose(1, 2).transpose(2, 3)


def split_qkv_view_no_transpose(qkv, n_heads, n_kv_heads, head_dim):
    b, s, _ = qkv.shape
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], -1)
    return (q.view(b, n_heads, s, head_dim), k.view(b, n_kv_heads, s, head_dim),
            v.view(b, n_kv_heads, s, head_dim))


def merge_view_no_transpose(x):
    b, n, s, d = x.shape
    return x.contiguous().view(b, s, n * d)


def merge_head_minor(x):
    """Feature d of every head, then feature d + 1 of every head, ..."""
    b, n, s, d = x.shape
    return torch.stack([x[:, h] for h in range(n)], dim=-1).reshape(b, s, d * n)


def merge_sum_heads(x):
    out = x[:, 0]
    for h in range(1, x.shape[1]):
        out = out + x[:, h]
    return out


def merge_transpose_view(x):
    b, n, s, d = x.shape
    return x.transpose(1, 2).view(b, s, n * d)


def qkv_kv_with_n_heads(qkv, n_heads, n_kv_heads, head_dim):
    w = n_heads * head_dim
    q, k, v = qkv[..., :w], qkv[..., w:2 * w], qkv[..., 2 * w:]
    b, s, _ = qkv.shape
    return tuple(t.reshape(b, s, n_heads, head_dim).transpose(1, 2) for t in (q, k, v))


def qkv_chunk3(qkv, n_heads, n_kv_heads, head_dim):
    return tuple(ref.split_heads(t, n) for t, n in
                 zip(qkv.chunk(3, dim=-1), (n_heads, n_kv_heads, n_kv_heads)))


def qkv_kv_repeated(qkv, n_heads, n_kv_heads, head_dim):
    q, k, v = ref.split_qkv(qkv, n_heads, n_kv_heads, head_dim)
    group = n_heads // n_kv_heads
    return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def qkv_chunk3_head_dim(qkv, n_heads, n_kv_heads, head_dim):
    b, s, _ = qkv.shape
    return tuple(t.reshape(b, s, n, head_dim).transpose(1, 2) for t, n in
                 zip(qkv.chunk(3, dim=-1), (n_heads, n_kv_heads, n_kv_heads)))


def qkv_swapped(qkv, n_heads, n_kv_heads, head_dim):
    sizes = [n_kv_heads * head_dim, n_heads * head_dim, n_kv_heads * head_dim]
    k, q, v = qkv.split(sizes, dim=-1)  # K | Q | V
    return ref.split_heads(q, n_heads), ref.split_heads(k, n_kv_heads), \
        ref.split_heads(v, n_kv_heads)


def qkv_returned_q_v_k(qkv, n_heads, n_kv_heads, head_dim):
    q, k, v = ref.split_qkv(qkv, n_heads, n_kv_heads, head_dim)
    return q, v, k


def qkv_reshape_no_transpose(qkv, n_heads, n_kv_heads, head_dim):
    b, s, _ = qkv.shape
    q_end, k_end = n_heads * head_dim, (n_heads + n_kv_heads) * head_dim
    return (qkv[..., :q_end].reshape(b, n_heads, s, head_dim),
            qkv[..., q_end:k_end].reshape(b, n_kv_heads, s, head_dim),
            qkv[..., k_end:].reshape(b, n_kv_heads, s, head_dim))


def qkv_with(split):
    def split_qkv(qkv, n_heads, n_kv_heads, head_dim):
        sizes = [n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim]
        q, k, v = qkv.split(sizes, dim=-1)
        return split(q, n_heads), split(k, n_kv_heads), split(v, n_kv_heads)
    return split_qkv


def mha_with(*, split=ref.split_heads, merge=ref.merge_heads, order=(0, 1, 2), scale=None,
             use_wo=True, wo_transposed=False, invert_mask=False, one_head=False,
             ignore_mask=False, own_causal=False, nan_rows=False):
    def mha(x, w_qkv, w_o, n_heads, mask=None):
        h = x.shape[-1]
        n = 1 if one_head else n_heads
        parts = (x @ w_qkv).split(h, dim=-1)
        q, k, v = (split(parts[i], n) for i in order)
        d = q.shape[-1]
        scores = q @ k.transpose(-2, -1) / math.sqrt(scale or d)
        if own_causal:
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        if mask is not None and not ignore_mask:
            m = ~mask.bool() if invert_mask else mask.bool()
            scores = scores.masked_fill(~m, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = merge((weights if nan_rows else weights.nan_to_num(0.0)) @ v)
        if not use_wo:
            return out
        return out @ (w_o.T if wo_transposed else w_o)
    return mha


def mha_calls_sdpa(x, w_qkv, w_o, n_heads, mask=None):
    d = x.shape[-1] // n_heads
    q, k, v = ref.split_qkv(x @ w_qkv, n_heads, n_heads, d)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return ref.merge_heads(out) @ w_o


def mha_uses_torch_module(x, w_qkv, w_o, n_heads, mask=None):
    h = x.shape[-1]
    layer = torch.nn.MultiheadAttention(h, n_heads, bias=False, batch_first=True)
    with torch.no_grad():
        layer.in_proj_weight.copy_(w_qkv.T)
        layer.out_proj.weight.copy_(w_o.T)
    return layer(x, x, x, need_weights=False)[0]


WRONG = {
    nb05.check_split_heads: [
        Wrong("view [B, N, S, D] without transpose", split_view_no_transpose,
              "05.split_heads.reshaped_without_transpose"),
        Wrong("no transpose (tokens-first)", split_tokens_first,
              "05.split_heads.missing_transpose"),
        Wrong("head-minor split", split_head_minor, "05.split_heads.split_head_minor"),
        Wrong("splits the sequence token-wise", split_tokenwise, "05.split_heads.split_tokens"),
        Wrong("transposes the wrong axes", split_wrong_axes,
              "05.split_heads.transposed_wrong_axes"),
    ],
    nb05.check_merge_heads: [
        Wrong("reshape without transposing back", merge_view_no_transpose,
              "05.merge_heads.merged_without_transpose"),
        Wrong("head-minor merge", merge_head_minor, "05.merge_heads.merged_head_minor"),
        Wrong("transpose but no flatten", lambda x: x.permute(0, 2, 1, 3),
              "05.merge_heads.not_flattened"),
        Wrong("sums the heads", merge_sum_heads, "05.merge_heads.summed_heads"),
        Wrong("view after transpose", merge_transpose_view, "05.merge_heads.view_on_transposed"),
    ],
    nb05.check_fuse_qkv_weights: [
        Wrong("concatenated along rows (no dim)", lambda q, k, v: torch.cat((q, k, v)),
              "05.fuse_qkv_weights.concatenated_rows"),
        Wrong("order K | Q | V", lambda q, k, v: torch.hstack([k, q, v]),
              "05.fuse_qkv_weights.blocks_out_of_order"),
        Wrong("order Q | V | K", lambda q, k, v: torch.cat((q, v, k), dim=-1),
              "05.fuse_qkv_weights.blocks_out_of_order"),
        Wrong("stacked", lambda q, k, v: torch.cat([w.unsqueeze(0) for w in (q, k, v)]),
              "05.fuse_qkv_weights.stacked"),
        Wrong("[out, in] layout", lambda q, k, v: torch.cat([q.T, k.T, v.T], dim=0),
              "05.fuse_qkv_weights.out_in_layout"),
    ],
    nb05.check_split_qkv: [
        Wrong("slices K | Q | V", qkv_swapped, "05.split_qkv.slices_swapped"),
        Wrong("returns (q, v, k)", qkv_returned_q_v_k, "05.split_qkv.slices_swapped"),
        Wrong("reshape without transpose", qkv_reshape_no_transpose,
              "05.split_qkv.reshaped_without_transpose"),
        Wrong("view without transpose on a slice (raises)", split_qkv_view_no_transpose,
              "05.split_qkv.viewed_slice_heads_first"),
        Wrong("tokens-first", qkv_with(split_tokens_first), "05.split_qkv.missing_transpose"),
        Wrong("head-minor", qkv_with(split_head_minor), "05.split_qkv.split_head_minor"),
        Wrong("K/V sliced with N_h heads", qkv_kv_with_n_heads,
              "05.split_qkv.kv_sliced_with_n_heads"),
        Wrong("chunk(3)", qkv_chunk3, "05.split_qkv.split_in_three_equal_parts"),
        # issue 28: K and V repeated to N_h heads were told the slicing was wrong
        Wrong("K/V already repeated", qkv_kv_repeated, "05.split_qkv.kv_already_repeated"),
        Wrong("chunk(3), then reshape with head_dim", qkv_chunk3_head_dim,
              "05.split_qkv.split_in_three_equal_parts"),
    ],
    nb05.check_multi_head_attention: [
        Wrong("forgot W_O", mha_with(use_wo=False), "05.multi_head_attention.missing_w_o"),
        Wrong("W_O transposed", mha_with(wo_transposed=True),
              "05.multi_head_attention.w_o_transposed"),
        Wrong("split without transpose", mha_with(split=split_reshape_no_transpose),
              "05.multi_head_attention.reshaped_without_transpose"),
        Wrong("split and merge without transpose",
              mha_with(split=split_reshape_no_transpose, merge=merge_view_no_transpose),
              "05.multi_head_attention.split_merge_without_transpose"),
        Wrong("merge without transpose", mha_with(merge=merge_view_no_transpose),
              "05.multi_head_attention.merged_without_transpose"),
        Wrong("head-minor heads", mha_with(split=split_head_minor, merge=merge_head_minor),
              "05.multi_head_attention.split_head_minor"),
        Wrong("head-minor split only", mha_with(split=split_head_minor),
              "05.multi_head_attention.split_head_minor_only"),
        Wrong("head-minor merge only", mha_with(merge=merge_head_minor),
              "05.multi_head_attention.merged_head_minor"),
        Wrong("Q and K swapped", mha_with(order=(1, 0, 2)),
              "05.multi_head_attention.slices_swapped"),
        Wrong("K and V swapped", mha_with(order=(0, 2, 1)),
              "05.multi_head_attention.slices_swapped"),
        Wrong("scaled by sqrt(H)", lambda x, wqkv, wo, n, mask=None:
              mha_with(scale=x.shape[-1])(x, wqkv, wo, n, mask),
              "05.multi_head_attention.scaled_by_sqrt_h"),
        Wrong("one big head", mha_with(one_head=True), "05.multi_head_attention.one_big_head"),
        Wrong("mask inverted", mha_with(invert_mask=True),
              "05.multi_head_attention.mask_inverted"),
        Wrong("no scale", mha_with(scale=1), "05.multi_head_attention.missing_scale"),
        Wrong("scaled by int(sqrt(D_h))", lambda x, wqkv, wo, n, mask=None: mha_with(
            scale=math.isqrt(x.shape[-1] // n) ** 2)(x, wqkv, wo, n, mask),
            "05.multi_head_attention.scaled_by_int_sqrt"),
        Wrong("ignores the mask", mha_with(ignore_mask=True),
              "05.multi_head_attention.mask_ignored"),
        Wrong("own causal mask", mha_with(own_causal=True),
              "05.multi_head_attention.own_causal_mask"),
        Wrong("fully masked rows NaN", mha_with(nan_rows=True),
              "05.multi_head_attention.fully_masked_row_nan"),
        Wrong("computed in float32", lambda x, wqkv, wo, n, mask=None: mha_by_hand(
            x.float(), wqkv.float(), wo.float(), n, mask),
            "05.multi_head_attention.changed_dtype"),
        Wrong("calls scaled_dot_product_attention", mha_calls_sdpa,
              "05.multi_head_attention.calls_sdpa"),
        Wrong("uses nn.MultiheadAttention", mha_uses_torch_module,
              "05.multi_head_attention.calls_torch_multihead_attention"),
    ],
}


EXERCISES = exercises(CORRECT, WRONG)


@pytest.mark.parametrize("shortcut", [mha_calls_sdpa, mha_uses_torch_module],
                         ids=["sdpa", "nn.MultiheadAttention"])
def test_forbidden_shortcuts_are_rejected(shortcut):
    with pytest.raises(ForbiddenCall):
        nb05.check_multi_head_attention(shortcut, seed=0)


def test_chapter_05_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")

    def no_transpose(x, n_heads):
        b, s, w = x.shape
        return x.reshape(b, n_heads, s, w // n_heads)

    text = failure_text(nb05.check_split_heads, no_transpose)
    assert "可能的错误：没有转置就直接 reshape 成了 [B, N, S, D]" in text, text
    assert "likely mistake" not in text and "expected" not in text
    with pytest.raises(CheckFailure) as info:
        nb05.check_fuse_qkv_weights(lambda q, k, v: torch.cat([k, q, v], dim=1), seed=0)
    assert "各块顺序错了（得到 K | Q | V）" in str(info.value), str(info.value)
    with pytest.raises(ForbiddenCall) as info:
        nb05.check_multi_head_attention(mha_calls_sdpa, seed=0)
    assert "调用了 `scaled_dot_product_attention`，而这个练习要求不要使用它。" in str(info.value)


# --------------------------------------------------------------------------------------------
# The drawing helpers behind this chapter's picture of heads (and chapters 01, 04, 06, 08)


def test_diagram_matrix_is_placed_by_its_top_left_corner_and_returns_its_box():
    import matplotlib

    matplotlib.use("Agg")
    from checks import diagrams

    fig, ax = diagrams.canvas(4, 3)
    colors = [[diagrams.HEAD_COLORS[c] for c in range(3)] for _ in range(2)]  # 2 rows, 3 cols
    left, bottom, right, top = diagrams.matrix(ax, 0.5, 2.5, colors, cell=0.25, label="x",
                                               shape="[S, H]")
    assert (left, right, top) == (0.5, 1.25, 2.5) and math.isclose(bottom, 2.0)
    assert len(ax.patches) == 6 and {t.get_text() for t in ax.texts} == {"x", "[S, H]"}
    matplotlib.pyplot.close(fig)


def test_diagram_colors_mark_blocked_entries_and_keep_signs_apart():
    from checks import diagrams

    values = torch.tensor([[-2.0, 0.0], [2.0, float("-inf")]])
    colors = diagrams.values_to_colors(values, blocked=torch.isinf(values))
    assert colors[1][1] == diagrams.BLOCKED_COLOR
    assert colors[0][0] != colors[1][0]                   # -2 and +2 differ
    assert diagrams.shade("#000000", 0.0) == (1.0, 1.0, 1.0)  # amount 0 is white


# --------------------------------------------------------------------------------------------
# Knock-on failures in the self-check (issue 33): multi_head_attention built, as the notebook
# builds it, on the learner's split_qkv (itself on split_heads) and merge_heads names a broken
# one "fix it first", never its mistake a second time; with two broken, the earlier exercise.

_LEARNER_MHA = '''
def split_heads(x, n_heads):
    return _split_heads(x, n_heads)

def merge_heads(x):
    return _merge_heads(x)

def split_qkv(qkv, n_heads, n_kv_heads, head_dim):
    return _split_qkv(qkv, n_heads, n_kv_heads, head_dim, split_heads)

def multi_head_attention(x, w_qkv, w_o, n_heads, mask=None):
    d = w_qkv.shape[1] // (3 * n_heads)
    q, k, v = split_qkv(x @ w_qkv, n_heads, n_heads, d)
    out, _weights = attention(q, k, v, mask)
    return merge_heads(out) @ w_o
'''


def _split_qkv_on(qkv, n_heads, n_kv_heads, head_dim, split_heads):
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], -1)
    return split_heads(q, n_heads), split_heads(k, n_kv_heads), split_heads(v, n_kv_heads)


def _mha_mistake(split_heads=ref.split_heads, merge_heads=ref.merge_heads,
                 split_qkv=_split_qkv_on, seed=0) -> str | None:
    from ..support.cells import learner_cell
    ns = learner_cell(_LEARNER_MHA, _split_heads=split_heads, _merge_heads=merge_heads,
                      _split_qkv=split_qkv, attention=ref.attention)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nb05.check_multi_head_attention(ns["multi_head_attention"], seed=seed)
    except CheckFailure as failure:
        return failure.mistake
    return None


def _swapped_qkv(qkv, n_heads, n_kv_heads, head_dim, split_heads):
    q, k, v = _split_qkv_on(qkv, n_heads, n_kv_heads, head_dim, split_heads)
    return k, q, v


def test_the_learners_own_pieces_pass_when_right():
    assert _mha_mistake() is None


@pytest.mark.parametrize("helper", ["split_heads", "merge_heads"])
def test_a_catalogued_wrong_helper_is_named_fix_it_first_by_the_self_check(helper):
    checker = getattr(nb05, f"check_{helper}")
    for wrong in WRONG[checker]:
        mistake = _mha_mistake(**{helper: wrong.fn})
        assert mistake == f"05.multi_head_attention.fix_{helper}_first", (wrong.name, mistake)


def test_a_wrong_split_qkv_on_a_right_split_heads_is_named_fix_it_first():
    assert _mha_mistake(split_qkv=_swapped_qkv) == \
        "05.multi_head_attention.fix_split_qkv_first"


@pytest.mark.parametrize("seed", [0, 1])
def test_two_wrong_helpers_name_the_earlier_exercise(seed):
    split = WRONG[nb05.check_split_heads][0].fn
    merge = WRONG[nb05.check_merge_heads][1].fn
    assert _mha_mistake(split_heads=split, merge_heads=merge, seed=seed) == \
        "05.multi_head_attention.fix_split_heads_first"
    assert _mha_mistake(merge_heads=merge, split_qkv=_swapped_qkv, seed=seed) == \
        "05.multi_head_attention.fix_merge_heads_first"
