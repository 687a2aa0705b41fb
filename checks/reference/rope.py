"""Chapter 08: rotary position embeddings (RoPE), by complex multiplication.

Formulated differently from the notebook, which rotates pairs with cos/sin and a 2x2 matrix: here
pair i of a token at position m is the complex number z = x_a + i x_b, and the rotation is the
product z * e^{i m theta_i} (`torch.polar` builds the unit rotors, `torch.view_as_complex` the
numbers). Frequencies come from exp/log in float64, rotation matrices from the matrix exponential
of the rotation generator, and the pairing permutation from a reshape and transpose.

Conventions (docs/conventions.md): theta_i = base ** (-2i / D_r) for i = 0 .. D_r/2 - 1; the
"interleaved" pairing (default) is (2i, 2i+1), the "half" pairing (i, i + D_r/2); with D_r < D
only the first D_r features rotate. Angles are float32 (at least: fp16/bf16 angles are useless
beyond a few hundred positions), the output has x's dtype.
"""

from __future__ import annotations

import math

import torch


def rope_frequencies(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[rotary_dim // 2] float32: theta_i = base ** (-2i / rotary_dim)."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return torch.exp(i * (-2.0 * math.log(base) / rotary_dim)).to(torch.float32)


def rope_angles(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """[..., S, D_r/2]: angle m * theta_i for every position m (positions [S] or [B, S]).

    The product is formed in float64 and rounded once, so the float32 angle is the nearest one to
    the exact product of the position and the (float32) frequency.
    """
    angles = torch.einsum("...s,f->...sf", positions.to(torch.float64), freqs.to(torch.float64))
    return angles.to(freqs.dtype if freqs.is_floating_point() else torch.float32)


def rotation_matrix(alpha) -> torch.Tensor:
    """[2, 2] float32 counter-clockwise rotation by alpha radians.

    The matrix exponential exp(alpha * J) of the generator J = [[0, -1], [1, 0]].
    """
    generator = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
    alpha = torch.as_tensor(alpha, dtype=torch.float64)
    return torch.linalg.matrix_exp(alpha * generator).to(torch.float32)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool = True) -> torch.Tensor:
    """Rotate every feature pair of x [..., D_r] by the angle whose cosine and sine are given.

    cos, sin: [..., D_r/2], one angle per pair, broadcasting against x's pairs. Pair i is the
    complex number z = x_a + i x_b with (a, b) = (2i, 2i+1) (interleaved) or (i, i + D_r/2)
    (half); the rotation is the product z * (cos + i sin), formed in complex128. Returns x's
    shape, in the dtype torch's promotion gives x with cos.
    """
    half = x.shape[-1] // 2
    dtype = torch.promote_types(x.dtype, cos.dtype)
    x64 = x.to(torch.float64)
    if interleaved:   # adjacent floats are (real, imag)
        z = torch.view_as_complex(x64.reshape(*x64.shape[:-1], half, 2).contiguous())
    else:             # real parts first, imaginary parts after
        z = torch.complex(x64[..., :half], x64[..., half:])
    w = z * torch.complex(cos.to(torch.float64), sin.to(torch.float64))
    rotated = torch.view_as_real(w).flatten(-2) if interleaved else torch.cat([w.real, w.imag], -1)
    return rotated.to(dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0,
               rotary_dim: int | None = None, interleaved: bool = True) -> torch.Tensor:
    """Rotate the first rotary_dim features of every head of x [B, N, S, D] by position.

    positions: [S] (shared by the batch) or [B, S]. Returns x's shape and dtype.
    """
    d = x.shape[-1]
    d_r = d if rotary_dim is None else rotary_dim
    half = d_r // 2
    freqs = rope_frequencies(d_r, base).to(x.device)
    angles = rope_angles(positions.to(x.device), freqs)             # [S, half] or [B, S, half]
    if angles.dim() == 3:
        angles = angles.unsqueeze(1)                                # [B, 1, S, half]: every head
    rotors = torch.polar(torch.ones_like(angles), angles)          # e^{i m theta}, complex64
    part = x[..., :d_r].to(torch.float32)
    if interleaved:   # pair i = features (2i, 2i+1): adjacent floats are (real, imag)
        z = torch.view_as_complex(part.reshape(*part.shape[:-1], half, 2).contiguous())
        rotated = torch.view_as_real(z * rotors).flatten(-2)
    else:             # pair i = features (i, i + half): real parts first, imaginary parts after
        z = torch.complex(part[..., :half], part[..., half:])
        w = z * rotors
        rotated = torch.cat([w.real, w.imag], dim=-1)
    return torch.cat([rotated.to(x.dtype), x[..., d_r:]], dim=-1)


def interleaved_to_half_permutation(rotary_dim: int) -> torch.Tensor:
    """LongTensor p = [0, 2, 4, ..., 1, 3, 5, ...]: the even features, then the odd ones.

    apply_rope(x, pos, interleaved=True)[..., p] == apply_rope(x[..., p], pos, interleaved=False).
    """
    return torch.arange(rotary_dim).view(rotary_dim // 2, 2).T.reshape(-1)
