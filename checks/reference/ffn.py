"""Chapter 09: the feed-forward network (ReLU, GELU, SiLU, the plain FFN, SwiGLU).

Formulated differently from the notebook: the activations are PyTorch's own (`F.relu`,
`F.gelu(approximate="none")`, `F.silu`); the projections go through `F.linear`, which takes
[out, in] weights, so the course's [in, out] matrices are passed transposed; SwiGLU runs the gate
and up projections as one fused GEMM (their weights concatenated, the result split in two), as
fast implementations do; the parameter count adds up the weight shapes.

Conventions (docs/conventions.md): weights are [in_features, out_features] and applied as
`x @ W`, no biases; SwiGLU(x) = (silu(x @ W_gate) * (x @ W_up)) @ W_down.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(0, x), elementwise, in x's dtype."""
    return F.relu(x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """x * Phi(x) with the exact normal CDF (erf form), not the tanh approximation."""
    return F.gelu(x, approximate="none")


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) (also called Swish), elementwise, in x's dtype."""
    return F.silu(x)


def ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
        activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """activation(x @ w1) @ w2 for x [..., H], w1 [H, H_ff], w2 [H_ff, H]."""
    return F.linear(activation(F.linear(x, w1.t())), w2.t())


def swiglu_ffn(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
               w_down: torch.Tensor) -> torch.Tensor:
    """(silu(x @ w_gate) * (x @ w_up)) @ w_down, with gate and up as one fused GEMM."""
    fused = torch.cat([w_gate, w_up], dim=1)                 # [H, 2 H_ff]: gate | up
    gate, up = F.linear(x, fused.t()).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w_down.t())


def ffn_param_count(hidden_size: int, ffn_hidden_size: int, gated: bool) -> int:
    """Weights of one FFN: W_gate, W_up, W_down when gated, else W_1, W_2 (no biases)."""
    h, h_ff = int(hidden_size), int(ffn_hidden_size)
    shapes = [(h, h_ff), (h, h_ff), (h_ff, h)] if gated else [(h, h_ff), (h_ff, h)]
    return sum(math.prod(shape) for shape in shapes)
