"""Chapter 07: permutations of the sequence axis, and the original Transformer's sinusoidal
positions.

Formulated differently from the notebook: permutations go through `index_select` and one-hot
matrices, the equivariance error through matrix products with the permutation matrix, and the
sinusoidal table through complex exponentials e^{i pos w} = cos(pos w) + i sin(pos w), in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def permute_tokens(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """[B, S, H] -> [B, S, H] with out[:, i] = x[:, perm[i]]."""
    return torch.index_select(x, 1, perm.long())


def permutation_matrix(perm: torch.Tensor) -> torch.Tensor:
    """[S, S] float32 with row i one-hot at column perm[i], so that P @ x == x[perm]."""
    return F.one_hot(perm.long(), num_classes=perm.numel()).to(torch.float32)


def equivariance_error(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                       perm: torch.Tensor) -> float:
    """max |fn(P X) - P fn(X)| over all entries, as a Python float."""
    p = permutation_matrix(perm)
    out = fn(x)
    out_of_permuted = fn(torch.matmul(p.to(x.dtype), x))  # P is exact: one 1 per row
    return float((out_of_permuted - torch.matmul(p.to(out.dtype), out)).abs().amax())


def sinusoidal_positions(seq_len: int, hidden: int) -> torch.Tensor:
    """[S, H] float32: feature 2i holds sin(pos w_i) and feature 2i+1 cos(pos w_i), with
    w_i = 10000^(-2i/H)."""
    pairs = (hidden + 1) // 2
    step = -2.0 * math.log(10000.0) / hidden
    rates = torch.exp(torch.arange(pairs, dtype=torch.float64) * step)   # w_i = e^(i * step)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), rates)
    rotor = torch.polar(torch.ones_like(angles), angles)           # cos + i sin, [S, H/2]
    table = torch.stack([rotor.imag, rotor.real], dim=-1)          # (sin, cos) per pair
    return table.reshape(seq_len, 2 * pairs)[:, :hidden].to(torch.float32)
