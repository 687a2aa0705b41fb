"""Chapter 11: the LLaMA decoder block, assembled from the reference pieces of chapters 03-10.

Formulated differently from the notebook, which runs one fused QKV GEMM and splits its output:
here the fused weight is split instead (its column blocks Q | K | V, each head-major), the three
projections go through `F.linear` (which takes [out, in] weights, so the course's [in, out]
matrices are passed transposed), causal grouped-query attention is PyTorch's own
`scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)` (with as many queries as keys
its top-left causal triangle is the course's bottom-right one), the two residual sublayers are
chapter 10's `pre_norm_residual`, and the parameter count adds up the layout's shapes.

Conventions (docs/conventions.md): x [B, S, H]; positions [S] or [B, S]; RoPE (interleaved
pairing, `cfg.rope_base`, `cfg.rotary_dim`) on Q and K, never V; RMSNorm with `cfg.norm_eps`;
U = X + Attention(RMSNorm(X)), X' = U + SwiGLU(RMSNorm(U)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import block_shapes  # the layout's shapes: data, not an answer
from .ffn import swiglu_ffn
from .norms import pre_norm_residual, rms_norm
from .rope import apply_rope

#: The standard deviation of the random weights (LLaMA's and Hugging Face's `initializer_range`).
INIT_STD = 0.02


def init_block_params(cfg, generator: torch.Generator | None = None,
                      dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Norm scales at one; every weight matrix drawn from N(0, INIT_STD**2).

    The numbers are drawn in float32 (so every dtype gets the same draw, rounded) from `generator`
    (the global generator when None), in layout order.
    """
    params = {}
    for name, shape in block_shapes(cfg).items():
        if len(shape) == 1:
            params[name] = torch.ones(shape, dtype=dtype)
        else:
            w = torch.empty(shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=generator)
            params[name] = w.to(dtype)
    return params


def block_param_count(cfg) -> int:
    """Elements in one block's parameters: the layout's shapes multiplied out and added up."""
    return sum(math.prod(shape) for shape in block_shapes(cfg).values())


def _rope(t: torch.Tensor, positions: torch.Tensor, cfg) -> torch.Tensor:
    return apply_rope(t, positions, base=cfg.rope_base, rotary_dim=cfg.rotary_dim)


def attention_sublayer(x: torch.Tensor, layer: dict, cfg, positions: torch.Tensor) -> torch.Tensor:
    """W_O(causal GQA(RoPE(Q), RoPE(K), V)) of RMSNorm(x); no residual. x [B, S, H]."""
    b, s, _ = x.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    positions = torch.as_tensor(positions, device=x.device)
    h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
    w_q, w_k, w_v = layer["wqkv"].split([n_h * d, n_kv * d, n_kv * d], dim=1)

    def heads(w: torch.Tensor, n: int) -> torch.Tensor:   # [B, S, n * d] -> [B, n, S, d]
        return F.linear(h, w.t()).unflatten(-1, (n, d)).permute(0, 2, 1, 3)

    q = _rope(heads(w_q, n_h), positions, cfg)
    k = _rope(heads(w_k, n_kv), positions, cfg)
    v = heads(w_v, n_kv)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.linear(out.permute(0, 2, 1, 3).reshape(b, s, n_h * d), layer["wo"].t())


def decoder_block(x: torch.Tensor, layer: dict, cfg, positions: torch.Tensor) -> torch.Tensor:
    """Pre-norm: U = x + Attention(RMSNorm(x)); return U + SwiGLU(RMSNorm(U))."""
    u = torch.add(x, attention_sublayer(x, layer, cfg, positions))   # the norm is inside
    return pre_norm_residual(
        u, lambda t: swiglu_ffn(t, layer["w_gate"], layer["w_up"], layer["w_down"]),
        lambda t: rms_norm(t, layer["ffn_norm"], cfg.norm_eps))
