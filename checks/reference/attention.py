"""Chapters 04-06: attention, heads and grouped-query attention, built on PyTorch's own kernels."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def project_qkv(x, w_q, w_k, w_v):
    return F.linear(x, w_q.T), F.linear(x, w_k.T), F.linear(x, w_v.T)


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis; fully masked rows give zeros instead of NaN."""
    if mask is None:
        # A row that is all -inf (an additive mask hiding every key) is fully masked too: zeros.
        dead = (scores == float("-inf")).all(-1, keepdim=True)
        return torch.softmax(scores, dim=-1).masked_fill(dead, 0.0)
    mask = mask.bool()
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)   # 0 where masked
    dead = ~mask.any(-1, keepdim=True)          # rows that see no key: softmax gave NaN there
    if dead.device.type != "meta" and not dead.any():
        return weights                          # the usual case (a causal mask): no extra pass
    return weights.masked_fill(dead, 0.0)


def attention(q, k, v, mask=None):
    """(out, weights); `out` from scaled_dot_product_attention, weights from masked_softmax."""
    weights = masked_softmax(attention_scores(q, k), mask)
    if mask is not None:
        # SDPA gives NaN for fully masked rows; the course's convention is zeros.
        full = mask.bool().expand(weights.shape)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
        out = out.masked_fill(~full.any(-1, keepdim=True), 0.0)
    else:
        out = F.scaled_dot_product_attention(q, k, v)
    return out, weights


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    b, s, width = x.shape
    return x.view(b, s, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, n, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, n * d)


def fuse_qkv_weights(w_q, w_k, w_v):
    return torch.cat([w_q, w_k, w_v], dim=1)


def split_qkv(qkv, n_heads: int, n_kv_heads: int, head_dim: int):
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], -1)
    return split_heads(q, n_heads), split_heads(k, n_kv_heads), split_heads(v, n_kv_heads)


def multi_head_attention(x, w_qkv, w_o, n_heads: int, mask=None):
    head_dim = x.shape[-1] // n_heads
    q, k, v = split_qkv(x @ w_qkv, n_heads, n_heads, head_dim)
    out, _ = attention(q, k, v, mask)
    return merge_heads(out) @ w_o


def kv_head_index(q_head: int, n_heads: int, n_kv_heads: int) -> int:
    return q_head // (n_heads // n_kv_heads)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x.repeat_interleave(n_rep, dim=1)


def grouped_query_attention(q, k, v, mask=None):
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    full = mask.bool().expand(*q.shape[:-1], k.shape[-2])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=True)
    return out.masked_fill(~full.any(-1, keepdim=True), 0.0)


def kv_cache_bytes(n_layers, batch, seq_len, n_kv_heads, head_dim, bytes_per_elem) -> int:
    return 2 * n_layers * batch * seq_len * n_kv_heads * head_dim * bytes_per_elem


def torch_mha_reference(x, w_qkv, w_o, n_heads: int, mask=None):
    """Standard multi-head self-attention computed by `torch.nn.MultiheadAttention`.

    Our weights are `[in, out]` and applied as `x @ W`; the module keeps `[out, in]` and applies
    `x @ W.T`, so `in_proj_weight = w_qkv.T` (rows Q | K | V, each head-major, which is the
    module's own split) and `out_proj.weight = w_o.T`. Our boolean mask (True = may attend,
    broadcastable to `[B, N, S, S]`) becomes the module's (True = may NOT attend), one
    `[S, S]` slice per (batch, head), batch-major.

    The module gives NaN for a fully masked query row; the course's convention is zeros. So the
    keys and values get one extra token whose hidden vector is zero (without biases its key and
    value are zero too), visible only to fully masked rows: those rows then average zeros and
    every other row is unchanged.
    """
    b, s, h = x.shape
    # Built on the meta device, so the module's random initialisation leaves torch's RNG alone.
    mha = torch.nn.MultiheadAttention(h, n_heads, bias=False, batch_first=True,
                                      device="meta", dtype=x.dtype).to_empty(device=x.device)
    mha.eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(w_qkv.T)
        mha.out_proj.weight.copy_(w_o.T)
        if mask is None:
            return mha(x, x, x, need_weights=False)[0]
        allowed = mask.to(x.device).bool().expand(b, n_heads, s, s)
        empty = ~allowed.any(-1, keepdim=True)
        kv = torch.cat([x, x.new_zeros(b, 1, h)], dim=1)
        allowed = torch.cat([allowed, empty], dim=-1)
        not_allowed = ~allowed.reshape(b * n_heads, s, s + 1)
        return mha(x, kv, kv, attn_mask=not_allowed, need_weights=False)[0]
