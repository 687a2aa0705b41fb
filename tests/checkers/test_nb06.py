"""Chapter 06 checkers: correct implementations pass at every seed; each known mistake is
diagnosed; materialising the repeated K/V is rejected however it is done."""

import math

import pytest
import torch
import torch.nn.functional as F

from checks import nb06
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import CheckFailure, ForbiddenCall

from ..support.catalogue import Wrong, assert_passes, exercises, failure_text, implementations
from ..support.cells import learner_cell as _learner_cell

# --------------------------------------------------------------------------------------------
# Correct implementations. The reference GQA calls scaled_dot_product_attention, which the
# chapter forbids, so the attention exercise is passed by independent formulations instead.


def _softmax_zero_rows(scores, mask):
    """Masked softmax over the last axis; fully masked rows give zeros."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask.bool(), float("-inf"))
    top = scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = (scores - top).exp()
    return e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)


def gqa_folded(q, k, v, mask=None):
    """The notebook's approach: the G query heads of a group become rows of one matrix."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    g = n_h // n_kv
    scores = q.reshape(b, n_kv, g * s_q, d) @ k.transpose(-2, -1) / math.sqrt(d)
    w = _softmax_zero_rows(scores.view(b, n_h, s_q, s_k), mask)
    return (w.reshape(b, n_kv, g * s_q, s_k) @ v).view(b, n_h, s_q, v.shape[-1])


def gqa_einsum(q, k, v, mask=None):
    """q viewed as [B, N_kv, G, S_q, D]; einsum contracts without expanding K or V."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    q5 = q.view(b, n_kv, n_h // n_kv, s_q, d)
    scores = torch.einsum("bjgqd,bjkd->bjgqk", q5, k) / math.sqrt(d)
    w = _softmax_zero_rows(scores.reshape(b, n_h, s_q, s_k), mask)
    out = torch.einsum("bjgqk,bjkd->bjgqd", w.view(b, n_kv, n_h // n_kv, s_q, s_k), v)
    return out.reshape(b, n_h, s_q, v.shape[-1])


def gqa_per_head_loop(q, k, v, mask=None):
    """One query head at a time, reading KV head h // G through a view; outputs stacked."""
    n_h, n_kv = q.shape[1], k.shape[1]
    g = n_h // n_kv
    full = None if mask is None else mask.bool().expand(q.shape[0], n_h, q.shape[2], k.shape[2])
    outs = []
    for h in range(n_h):
        scores = q[:, h] @ k[:, h // g].transpose(-2, -1) / math.sqrt(q.shape[-1])
        w = _softmax_zero_rows(scores, None if full is None else full[:, h])
        outs.append(w @ v[:, h // g])
    return torch.stack(outs, dim=1)


def gqa_group_loop_folded(q, k, v, mask=None):
    """One KV head at a time; its G query heads folded into rows; F.softmax + nan_to_num."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    g = n_h // n_kv
    allowed = None if mask is None else mask.bool().expand(b, n_h, s_q, s_k)
    outs = []
    for j in range(n_kv):
        rows = q[:, j * g:(j + 1) * g].reshape(b, g * s_q, d)
        scores = (rows @ k[:, j].transpose(-1, -2) / d ** 0.5).view(b, g, s_q, s_k)
        if allowed is not None:
            scores = torch.where(allowed[:, j * g:(j + 1) * g], scores, float("-inf"))
        w = F.softmax(scores, dim=-1).nan_to_num(0.0)
        outs.append((w.reshape(b, g * s_q, s_k) @ v[:, j]).view(b, g, s_q, -1))
    return torch.cat(outs, dim=1)


def repeat_kv_expand(x, n_rep):
    b, n_kv, s, d = x.shape
    return x[:, :, None].expand(b, n_kv, n_rep, s, d).reshape(b, n_kv * n_rep, s, d)


CORRECT = {
    nb06.check_kv_head_index: implementations(
        ref.kv_head_index, scaled_down=lambda h, n_h, n_kv: h * n_kv // n_h),
    nb06.check_repeat_kv: implementations(ref.repeat_kv, repeat_kv_expand),
    nb06.check_grouped_query_attention: implementations(
        gqa_folded, gqa_einsum, gqa_per_head_loop, gqa_group_loop_folded),
    nb06.check_kv_cache_bytes: implementations(ref.kv_cache_bytes),
}


def test_reference_gqa_agrees_with_explicit_repetition():
    """The reference (SDPA with enable_gqa) equals MHA on repeat-interleaved K/V."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 12, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 7, 6, generator=g, dtype=torch.float64)
    mask = ref.causal_mask(5, 7)
    want, _ = ref.attention(q, ref.repeat_kv(k, 4), ref.repeat_kv(v, 4), mask)
    torch.testing.assert_close(ref.grouped_query_attention(q, k, v, mask), want)
    torch.testing.assert_close(gqa_folded(q, k, v, mask), want)


# --------------------------------------------------------------------------------------------
# Wrong implementations


def _attend(q, k, v, mask=None, *, scale=None):
    """Plain attention (no SDPA) on heads that already match."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _softmax_zero_rows(q @ k.transpose(-2, -1) * scale, mask) @ v


def _gqa_with_map(head_map):
    """GQA where query head h reads KV head head_map(h, N_h, N_kv), by per-head views."""
    def gqa(q, k, v, mask=None):
        n_h, n_kv = q.shape[1], k.shape[1]
        full = None if mask is None else mask.bool().expand(q.shape[0], n_h, q.shape[2],
                                                             k.shape[2])
        outs = []
        for h in range(n_h):
            j = head_map(h, n_h, n_kv)
            outs.append(_attend(q[:, h], k[:, j], v[:, j], None if full is None else full[:, h]))
        return torch.stack(outs, dim=1)
    return gqa


def gqa_group_view_swapped(q, k, v, mask=None):
    """Views q as [B, G, N_kv, ...]: no copy, but head h then reads KV head h % N_kv."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    g = n_h // n_kv
    q_rows = q.view(b, g, n_kv, s_q, d).transpose(1, 2).reshape(b, n_kv, g * s_q, d)
    scores = (q_rows @ k.transpose(-2, -1) / math.sqrt(d)).view(b, n_kv, g, s_q, s_k)
    scores = scores.transpose(1, 2).reshape(b, n_h, s_q, s_k)
    w = _softmax_zero_rows(scores, mask)
    w_rows = w.view(b, g, n_kv, s_q, s_k).transpose(1, 2).reshape(b, n_kv, g * s_q, s_k)
    out = (w_rows @ v).view(b, n_kv, g, s_q, -1).transpose(1, 2)
    return out.reshape(b, n_h, s_q, v.shape[-1])


def gqa_broadcast_matmul(q, k, v, mask=None):
    """[B, N_kv, G, S_q, D] @ [B, N_kv, 1, D, S_k]: matmul copies K (and V) for each head."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    g = n_h // n_kv
    scores = q.view(b, n_kv, g, s_q, d) @ k[:, :, None].transpose(-2, -1) / math.sqrt(d)
    w = _softmax_zero_rows(scores.view(b, n_h, s_q, s_k), mask)
    return (w.view(b, n_kv, g, s_q, s_k) @ v[:, :, None]).view(b, n_h, s_q, v.shape[-1])


def gqa_group_loop_broadcast(q, k, v, mask=None):
    """One KV head at a time, its G query heads broadcast against it: matmul copies it G times."""
    b, n_h, s_q, d = q.shape
    n_kv = k.shape[1]
    g = n_h // n_kv
    full = None if mask is None else mask.bool().expand(b, n_h, s_q, k.shape[2])
    outs = []
    for j in range(n_kv):
        scores = q[:, j * g:(j + 1) * g] @ k[:, j:j + 1].transpose(-2, -1) / math.sqrt(d)
        w = _softmax_zero_rows(scores, None if full is None else full[:, j * g:(j + 1) * g])
        outs.append(w @ v[:, j:j + 1])
    return torch.stack(outs, dim=1).reshape(b, n_h, s_q, v.shape[-1])


def _g(q, k):
    return q.shape[1] // k.shape[1]


def gqa_repeat_interleave(q, k, v, mask=None):
    return _attend(q, k.repeat_interleave(_g(q, k), 1), v.repeat_interleave(_g(q, k), 1), mask)


def gqa_expand_reshape(q, k, v, mask=None):
    return _attend(q, repeat_kv_expand(k, _g(q, k)), repeat_kv_expand(v, _g(q, k)), mask)


def gqa_index(q, k, v, mask=None):
    idx = torch.arange(q.shape[1]) // _g(q, k)
    return _attend(q, k[:, idx], v[:, idx], mask)


def gqa_loop_cat(q, k, v, mask=None):
    g = _g(q, k)
    k_rep = torch.cat([k[:, j:j + 1] for j in range(k.shape[1]) for _ in range(g)], dim=1)
    v_rep = torch.cat([v[:, j:j + 1] for j in range(v.shape[1]) for _ in range(g)], dim=1)
    return _attend(q, k_rep, v_rep, mask)


def gqa_preallocated(q, k, v, mask=None):
    """Copies K/V into a preallocated [B, N_h, S_k, D] buffer head by head."""
    g = _g(q, k)
    k_rep = torch.empty(k.shape[0], q.shape[1], k.shape[2], k.shape[3], dtype=k.dtype)
    v_rep = torch.empty(v.shape[0], q.shape[1], v.shape[2], v.shape[3], dtype=v.dtype)
    for h in range(q.shape[1]):
        k_rep[:, h] = k[:, h // g]
        v_rep[:, h] = v[:, h // g]
    return _attend(q, k_rep, v_rep, mask)


def gqa_sdpa(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def gqa_no_scale(q, k, v, mask=None):
    b, n_h, s_q, d = q.shape
    return gqa_folded(q * math.sqrt(d), k, v, mask)


def gqa_scaled_by_h(q, k, v, mask=None):
    """Divides the scores by sqrt(H) = sqrt(N_h * D_h), the width of all heads together."""
    b, n_h, s_q, d = q.shape
    return gqa_folded(q * math.sqrt(d) / math.sqrt(n_h * d), k, v, mask)


def gqa_nan_rows(q, k, v, mask=None):
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    scores = (q.reshape(b, n_kv, -1, d) @ k.transpose(-2, -1) / math.sqrt(d))
    scores = scores.view(b, n_h, s_q, s_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return (w.reshape(b, n_kv, -1, s_k) @ v).view(b, n_h, s_q, -1)


def gqa_finite_fill(q, k, v, mask=None):
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    scores = (q.reshape(b, n_kv, -1, d) @ k.transpose(-2, -1) / math.sqrt(d))
    scores = scores.view(b, n_h, s_q, s_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    w = torch.softmax(scores, dim=-1)
    return (w.reshape(b, n_kv, -1, s_k) @ v).view(b, n_h, s_q, -1)


def gqa_unstable_softmax(q, k, v, mask=None):
    """exp(scores) / sum without subtracting the maximum (fully masked rows handled)."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    scores = (q.reshape(b, n_kv, -1, d) @ k.transpose(-2, -1) / math.sqrt(d))
    scores = scores.view(b, n_h, s_q, s_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = scores.exp()
    w = e / e.sum(-1, keepdim=True)
    if mask is not None:
        w = torch.where(mask.any(-1, keepdim=True), w, 0.0)
    return (w.reshape(b, n_kv, -1, s_k) @ v).view(b, n_h, s_q, -1)


def gqa_scaled_by_d(q, k, v, mask=None):
    """Divides the scores by D_h instead of sqrt(D_h)."""
    d = q.shape[-1]
    return gqa_folded(q * math.sqrt(d) / d, k, v, mask)


def gqa_inverted_mask(q, k, v, mask=None):
    return gqa_folded(q, k, v, None if mask is None else ~mask)


def gqa_added_mask(q, k, v, mask=None):
    """Adds the boolean mask to the scores (+1 / +0) instead of filling with -inf."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    scores = (q.reshape(b, n_kv, -1, d) @ k.transpose(-2, -1) / math.sqrt(d))
    scores = scores.view(b, n_h, s_q, s_k)
    if mask is not None:
        scores = scores + mask
    w = torch.softmax(scores, dim=-1)
    return (w.reshape(b, n_kv, -1, s_k) @ v).view(b, n_h, s_q, -1)


def gqa_scales_expanded_k(q, k, v, mask=None):
    """Expands K and V to [B, N_kv, G, S_k, D] views (no copy yet), then scales the expanded
    K: the division reads the view once per query head."""
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    g = n_h // n_kv
    q5 = q.view(b, n_kv, g, s_q, d)
    k5 = k[:, :, None].expand(b, n_kv, g, s_k, d) / math.sqrt(d)
    v5 = v[:, :, None].expand(b, n_kv, g, s_k, v.shape[-1])
    w = _softmax_zero_rows((q5 @ k5.transpose(-2, -1)).reshape(b, n_h, s_q, s_k), mask)
    return (w.view(b, n_kv, g, s_q, s_k) @ v5).reshape(b, n_h, s_q, -1)


def gqa_ignores_mask(q, k, v, mask=None):
    return gqa_folded(q, k, v, None)


def gqa_float32(q, k, v, mask=None):
    return gqa_folded(q.float(), k.float(), v.float(), mask)


def gqa_query_axis_softmax(q, k, v, mask=None):
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    scores = (q.reshape(b, n_kv, -1, d) @ k.transpose(-2, -1) / math.sqrt(d))
    w = torch.softmax(scores.view(b, n_h, s_q, s_k), dim=-2)
    return (w.reshape(b, n_kv, -1, s_k) @ v).view(b, n_h, s_q, -1)


def gqa_int_sqrt_scale(q, k, v, mask=None):
    """Scales by 1/int(sqrt(D)): right only when D is a perfect square."""
    d = q.shape[-1]
    return gqa_folded(q * math.sqrt(d) / int(math.sqrt(d)), k, v, mask)


def gqa_value_width_scale(q, k, v, mask=None):
    """Scales by 1/sqrt(D_v), v's width."""
    return gqa_folded(q * math.sqrt(q.shape[-1]) / math.sqrt(v.shape[-1]), k, v, mask)


def _gqa_weights(q, k, mask, *, scale=True, mask_after=False):
    b, n_h, s_q, d = q.shape
    n_kv, s_k = k.shape[1], k.shape[2]
    scores = (q.reshape(b, n_kv, -1, d) @ k.transpose(-2, -1)).view(b, n_h, s_q, s_k)
    if scale:
        scores = scores / math.sqrt(d)
    if mask_after:
        w = torch.softmax(scores, dim=-1)
        return w if mask is None else w * mask
    return _softmax_zero_rows(scores, mask)


def _gqa_out(w, v):
    b, n_h, s_q, s_k = w.shape
    return (w.reshape(b, v.shape[1], -1, s_k) @ v).view(b, n_h, s_q, v.shape[-1])


def gqa_scaled_after_softmax(q, k, v, mask=None):
    return _gqa_out(_gqa_weights(q, k, mask, scale=False) / math.sqrt(q.shape[-1]), v)


def gqa_mask_after_softmax(q, k, v, mask=None):
    """Softmax over every key, then the blocked weights zeroed (no renormalisation)."""
    return _gqa_out(_gqa_weights(q, k, mask, mask_after=True), v)


def gqa_scales_q_in_place(q, k, v, mask=None):
    q /= math.sqrt(q.shape[-1])
    return _gqa_out(_gqa_weights(q, k, mask, scale=False), v)


def gqa_squeezed(q, k, v, mask=None):
    """Squeezes the output (meaning to drop a group axis of one): a batch of one goes too."""
    return gqa_folded(q, k, v, mask).squeeze()


def gqa_masked_rows_see_key_0(q, k, v, mask=None):
    """Lets every query see key 0, so that no row is fully masked (no NaN)."""
    if mask is not None:
        mask = mask.clone().expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]).clone()
        mask[..., 0] = True
    return gqa_folded(q, k, v, mask)


def gqa_mask_on_folded_scores(q, k, v, mask=None):
    """Masks the folded [B, N_kv, G * S_q, S_k] scores directly."""
    b, n_h, s_q, d = q.shape
    n_kv = k.shape[1]
    scores = q.reshape(b, n_kv, -1, d) @ k.transpose(-2, -1) / math.sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (w @ v).view(b, n_h, s_q, v.shape[-1])


def gqa_mask_of_head_0(q, k, v, mask=None):
    """Takes the mask's head axis as one to pick from: every head gets head 0's mask."""
    if mask is not None and mask.dim() == 4:
        mask = mask[:, :1]
    return gqa_folded(q, k, v, mask)


def _index_float(h, n_h, n_kv):
    return h / (n_h // n_kv)


def _cache(extra=1, *, drop=None, as_float=False):
    def kv_cache_bytes(n_layers, batch, seq_len, n_kv_heads, head_dim, bytes_per_elem):
        factors = dict(two=2, n_layers=n_layers, batch=batch, seq_len=seq_len,
                       n_kv_heads=n_kv_heads, head_dim=head_dim, bytes_per_elem=bytes_per_elem)
        if drop:
            factors.pop(drop)
        total = math.prod(factors.values()) * extra
        return float(total) if as_float else total
    return kv_cache_bytes


def _repeat_tiled_cat(x, n_rep):
    return torch.cat([x] * n_rep, dim=1)


WRONG = {
    nb06.check_kv_head_index: [
        Wrong("h % N_kv", lambda h, n_h, n_kv: h % n_kv, "06.kv_head_index.round_robin_groups"),
        Wrong("h // N_kv", lambda h, n_h, n_kv: h // n_kv,
              "06.kv_head_index.divided_by_n_kv_heads"),
        Wrong("N_h instead of N_kv (identity)", lambda h, n_h, n_kv: h,
              "06.kv_head_index.returned_the_query_head"),
        Wrong("divides by N_h", lambda h, n_h, n_kv: h // n_h,
              "06.kv_head_index.divided_by_n_heads"),
        Wrong("1-based", lambda h, n_h, n_kv: h // (n_h // n_kv) + 1,
              "06.kv_head_index.counted_heads_from_1"),
        Wrong("float", _index_float, "06.kv_head_index.float_division"),
        Wrong("rounded", lambda h, n_h, n_kv: round(h / (n_h // n_kv)),
              "06.kv_head_index.rounded_to_nearest"),
        Wrong("tensor", lambda h, n_h, n_kv: torch.tensor(h // (n_h // n_kv)),
              "06.kv_head_index.returned_a_tensor"),
        Wrong("ceil", lambda h, n_h, n_kv: math.ceil(h / (n_h // n_kv)),
              "06.kv_head_index.rounded_up"),
        Wrong("group size N_kv // N_h", lambda h, n_h, n_kv: h // (n_kv // n_h),
              "06.kv_head_index.group_size_inverted"),
    ],
    nb06.check_repeat_kv: [
        Wrong("tiling with repeat", lambda x, n: x.repeat(1, n, 1, 1),
              "06.repeat_kv.tiled_instead_of_interleaved"),
        Wrong("tiling with cat", _repeat_tiled_cat, "06.repeat_kv.tiled_instead_of_interleaved"),
        Wrong("tiling with expand", lambda x, n: x[:, None].expand(
            x.shape[0], n, *x.shape[1:]).reshape(x.shape[0], -1, *x.shape[2:]),
              "06.repeat_kv.tiled_instead_of_interleaved"),
        Wrong("sequence axis", lambda x, n: x.repeat_interleave(n, dim=2),
              "06.repeat_kv.repeated_sequence_axis"),
        Wrong("feature axis", lambda x, n: x.repeat_interleave(n, dim=-1),
              "06.repeat_kv.repeated_feature_axis"),
        Wrong("no dim", lambda x, n: x.repeat_interleave(n),
              "06.repeat_kv.repeat_interleave_without_dim"),
        Wrong("unchanged", lambda x, n: x, "06.repeat_kv.returned_x_unchanged"),
        Wrong("float32", lambda x, n: repeat_kv_expand(x, n).float(),
              "06.repeat_kv.changed_the_dtype"),
        Wrong("in place", lambda x, n: repeat_kv_expand(x.mul_(1.5), n),
              "06.repeat_kv.changed_x_in_place"),
        Wrong("expand without reshape", lambda x, n: x[:, :, None].expand(
            x.shape[0], x.shape[1], n, *x.shape[2:]), "06.repeat_kv.kept_the_repeat_axis"),
        Wrong(".view of an expanded x", lambda x, n: x[:, :, None].expand(
            x.shape[0], x.shape[1], n, *x.shape[2:]).view(x.shape[0], -1, *x.shape[2:]),
              "06.repeat_kv.viewed_an_expanded_tensor"),
        Wrong("KV heads reversed", lambda x, n: x.flip(1).repeat_interleave(n, dim=1),
              "06.repeat_kv.heads_in_another_order"),
        Wrong("batch tiled", lambda x, n: x.repeat(n, 1, 1, 1), "06.repeat_kv.repeated_batch_axis"),
    ],
    nb06.check_grouped_query_attention: [
        Wrong("repeat_interleave", gqa_repeat_interleave,
              "06.grouped_query_attention.copied_kv_per_query_head"),
        Wrong("expand + reshape", gqa_expand_reshape,
              "06.grouped_query_attention.made_expanded_kv_contiguous"),
        Wrong("broadcast matmul", gqa_broadcast_matmul,
              "06.grouped_query_attention.broadcast_kv_in_matmul"),
        Wrong("per-group broadcast matmul", gqa_group_loop_broadcast,
              "06.grouped_query_attention.broadcast_kv_in_matmul"),
        Wrong("advanced indexing", gqa_index, "06.grouped_query_attention.indexed_kv_heads"),
        Wrong("cat of slices", gqa_loop_cat, "06.grouped_query_attention.copied_kv_per_query_head"),
        Wrong("preallocated buffer", gqa_preallocated,
              "06.grouped_query_attention.filled_a_repeated_kv_tensor"),
        Wrong("SDPA", gqa_sdpa, "06.grouped_query_attention.calls_scaled_dot_product_attention"),
        Wrong("tiling order (h % N_kv)", _gqa_with_map(lambda h, n_h, n_kv: h % n_kv),
              "06.grouped_query_attention.round_robin_groups"),
        Wrong("q viewed as [B, G, N_kv]", gqa_group_view_swapped,
              "06.grouped_query_attention.round_robin_groups"),
        Wrong("h // N_kv", _gqa_with_map(lambda h, n_h, n_kv: h // n_kv),
              "06.grouped_query_attention.divided_by_n_kv_heads"),
        Wrong("no scale", gqa_no_scale, "06.grouped_query_attention.missing_scale"),
        Wrong("scaled by sqrt(H)", gqa_scaled_by_h, "06.grouped_query_attention.scaled_by_sqrt_h"),
        Wrong("scaled by D", gqa_scaled_by_d, "06.grouped_query_attention.scaled_by_d"),
        Wrong("inverted mask", gqa_inverted_mask, "06.grouped_query_attention.mask_inverted"),
        Wrong("boolean mask added", gqa_added_mask,
              "06.grouped_query_attention.added_the_boolean_mask"),
        Wrong("expanded K scaled", gqa_scales_expanded_k,
              "06.grouped_query_attention.computed_on_expanded_kv"),
        Wrong("softmax over queries", gqa_query_axis_softmax,
              "06.grouped_query_attention.softmax_over_queries"),
        Wrong("unstable softmax", gqa_unstable_softmax,
              "06.grouped_query_attention.unstable_softmax"),
        Wrong("ignores the mask", gqa_ignores_mask, "06.grouped_query_attention.ignored_the_mask"),
        Wrong("NaN rows", gqa_nan_rows, "06.grouped_query_attention.fully_masked_rows_nan"),
        Wrong("finite fill", gqa_finite_fill,
              "06.grouped_query_attention.fully_masked_rows_mean_of_v"),
        Wrong("float32 for float64", gqa_float32, "06.grouped_query_attention.changed_the_dtype"),
        Wrong("returns (out, weights)", lambda q, k, v, mask=None: (gqa_folded(q, k, v, mask),
                                                                    None),
              "06.grouped_query_attention.returned_out_and_weights"),
        Wrong("scaled by 1/int(sqrt(D))", gqa_int_sqrt_scale,
              "06.grouped_query_attention.scale_rounded_to_int"),
        Wrong("scaled by sqrt(D_v)", gqa_value_width_scale,
              "06.grouped_query_attention.scaled_by_value_width"),
        Wrong("scale after the softmax", gqa_scaled_after_softmax,
              "06.grouped_query_attention.scaled_after_softmax"),
        Wrong("mask applied after the softmax", gqa_mask_after_softmax,
              "06.grouped_query_attention.masked_after_softmax"),
        Wrong("q scaled in place", gqa_scales_q_in_place,
              "06.grouped_query_attention.changed_inputs_in_place"),
        Wrong("fully masked rows see key 0", gqa_masked_rows_see_key_0,
              "06.grouped_query_attention.fully_masked_rows_not_zero"),
        Wrong("mask applied to the folded scores", gqa_mask_on_folded_scores,
              "06.grouped_query_attention.mask_on_folded_scores"),
        Wrong("head 0's mask for every head", gqa_mask_of_head_0,
              "06.grouped_query_attention.some_query_heads_wrong"),
        Wrong("squeezed output", gqa_squeezed, "06.grouped_query_attention.squeezed_size_one_axes"),
    ],
    nb06.check_kv_cache_bytes: [
        Wrong("no factor 2", _cache(drop="two"), "06.kv_cache_bytes.forgot_k_and_v"),
        Wrong("bits", _cache(8), "06.kv_cache_bytes.counted_bits"),
        Wrong("GiB", lambda *a: ref.kv_cache_bytes(*a) / 2**30, "06.kv_cache_bytes.returned_gib"),
        Wrong("MiB", lambda *a: ref.kv_cache_bytes(*a) / 2**20, "06.kv_cache_bytes.returned_mib"),
        Wrong("bytes_per_elem twice", lambda L, B, S, n, d, s: 2 * L * B * S * n * d * s * s,
              "06.kv_cache_bytes.bytes_per_elem_twice"),
        Wrong("float", _cache(as_float=True), "06.kv_cache_bytes.returned_a_float"),
        Wrong("no layers", _cache(drop="n_layers"), "06.kv_cache_bytes.left_out_layers"),
        Wrong("no batch", _cache(drop="batch"), "06.kv_cache_bytes.left_out_batch"),
        Wrong("hard-coded fp16", lambda L, B, S, n, d, s: 2 * L * B * S * n * d * 2,
              "06.kv_cache_bytes.hard_coded_fp16"),
        Wrong("elements, not bytes", _cache(drop="bytes_per_elem"),
              "06.kv_cache_bytes.counted_elements"),
        Wrong("no sequence length", _cache(drop="seq_len"), "06.kv_cache_bytes.left_out_seq_len"),
        Wrong("seq_len + 1", lambda L, B, S, n, d, s: 2 * L * B * (S + 1) * n * d * s,
              "06.kv_cache_bytes.off_by_a_factor"),
        Wrong("GB", lambda *a: ref.kv_cache_bytes(*a) / 10**9, "06.kv_cache_bytes.returned_gb"),
    ],
}


EXERCISES = exercises(CORRECT, WRONG)


@pytest.mark.parametrize("fn", [gqa_sdpa, gqa_repeat_interleave, gqa_loop_cat],
                         ids=lambda f: f.__name__)
def test_forbidden_shortcuts_are_rejected_as_forbidden(fn):
    with pytest.raises(ForbiddenCall):
        nb06.check_grouped_query_attention(fn, seed=0)


def test_chapter_06_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    text = failure_text(nb06.check_grouped_query_attention, gqa_scaled_by_h)
    assert "可能的错误：按 1/sqrt(H) = 1/sqrt(N_h * D_h)（所有 Query head 合起来的宽度）缩放了" \
        in text
    assert "likely mistake" not in text and "expected" not in text, text
    with pytest.raises(CheckFailure) as info:
        nb06.check_grouped_query_attention(gqa_expand_reshape, seed=0)
    assert "实际生成了重复的 K/V" in str(info.value), str(info.value)


_KV_INDEX_CELL = '''
def kv_head_index(h, n_heads, n_kv_heads):        # broken: round-robin groups
    return h % n_kv_heads

def grouped_query_attention(q, k, v, mask=None):  # one query head at a time, no copy of K/V
    n_h, n_kv = q.shape[1], k.shape[1]
    outs = []
    for h in range(n_h):
        j = kv_head_index(h, n_h, n_kv)
        scores = q[:, h] @ k[:, j].transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask.expand(q.shape[0], n_h, *scores.shape[-2:])[:, h],
                                        float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        outs.append(weights @ v[:, j])
    return torch.stack(outs, dim=1)
'''




def test_a_broken_kv_head_index_that_gqa_calls_is_named_fix_it_first():
    ns = _learner_cell(_KV_INDEX_CELL)
    with pytest.raises(CheckFailure) as info:
        nb06.check_grouped_query_attention(ns["grouped_query_attention"], seed=0)
    assert info.value.mistake == "06.grouped_query_attention.fix_kv_head_index_first", info.value


def test_gqa_built_on_a_right_kv_head_index_passes():
    ns = _learner_cell(_KV_INDEX_CELL.replace("return h % n_kv_heads",
                                              "return h // (n_heads // n_kv_heads)"))
    assert_passes(nb06.check_grouped_query_attention, ns["grouped_query_attention"], 0)
