"""Chapter 10: LayerNorm and RMSNorm over the hidden axis, pre-norm and post-norm residuals.

The norms are PyTorch's own kernels, `F.layer_norm` and `F.rms_norm`. RMSNorm follows the course's
dtype rule (the one Hugging Face's LlamaRMSNorm uses): the normalisation runs in float32 and is
cast back to the input dtype before the multiplication by gamma. Every input dtype, float64
included, goes through float32, as the rule says.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
               eps: float = 1e-5) -> torch.Tensor:
    """gamma * (x - mean) / sqrt(var + eps) + beta over the last axis (biased variance)."""
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


def rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x / sqrt(mean(x**2, -1) + eps) in float32, cast back to x.dtype, times gamma."""
    normed = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps)
    return normed.to(x.dtype) * gamma


def pre_norm_residual(x: torch.Tensor, sublayer: Callable, norm: Callable) -> torch.Tensor:
    """x + sublayer(norm(x)): only the sublayer's input is normalised; x itself skips the norm."""
    return torch.add(x, sublayer(norm(x)))


def post_norm_residual(x: torch.Tensor, sublayer: Callable, norm: Callable) -> torch.Tensor:
    """norm(x + sublayer(x)): the original Transformer's order, the norm after the residual add."""
    return norm(torch.add(x, sublayer(x)))
