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
        return torch.softmax(scores, dim=-1)
    mask = mask.bool()
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0).masked_fill(~mask, 0.0)


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
