"""Chapter 08 checkers: the reference and other correct ways of writing RoPE pass at every seed;
each known mistake is diagnosed; the reference agrees with the article's pair-by-pair formula."""

import math

import pytest
import torch

from checks import nb08
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import CheckFailure, LearnerError

from ..support.catalogue import Exercise, Wrong, failure_text
from ..support.cells import learner_cell

CHECKERS = {
    "rope_frequencies": nb08.check_rope_frequencies,
    "rope_angles": nb08.check_rope_angles,
    "rotation_matrix": nb08.check_rotation_matrix,
    "rotate_pairs": nb08.check_rotate_pairs,
    "apply_rope": nb08.check_apply_rope,
    "interleaved_to_half_permutation": nb08.check_interleaved_to_half_permutation,
}


# --------------------------------------------------------------------------------------------
# Learner-style implementations: float32 cos/sin formulas, with one mistake switched on.

def _freqs(d_r, base=10000.0, *, exponent=2.0, first=0, sign=-1.0, int_div=False,
           per_feature=False, dtype=torch.float32):
    if per_feature:
        return base ** (-torch.arange(d_r, dtype=dtype) / d_r)
    i = torch.arange(first, first + d_r // 2)
    if int_div:
        return base ** (sign * (2 * i // d_r)).to(dtype)
    return base ** (sign * exponent * i.to(dtype) / d_r)


def _freqs_exp_log(d_r, base=10000.0):
    """Another correct way: exp(-2i ln(base) / D_r) in float32 (as in many sinusoid codes)."""
    return torch.exp(torch.arange(0, d_r, 2, dtype=torch.float32) * (-math.log(base) / d_r))


def _freqs_hf(d_r, base=10000.0):
    """Hugging Face's: 1 / base ** (arange(0, D, 2) / D)."""
    return 1.0 / (base ** (torch.arange(0, d_r, 2, dtype=torch.int64).float() / d_r))


def _angles(positions, freqs):
    return positions[..., None].float() * freqs


def _rotation(alpha):
    alpha = torch.as_tensor(alpha, dtype=torch.float32)
    c, s = torch.cos(alpha), torch.sin(alpha)
    return torch.stack([torch.stack([c, -s]), torch.stack([s, c])])


def _rope(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True, pairing=None,
          exponent=2.0, first=0, shift=0, arange_positions=False, swap=False, direction=1.0,
          minus=True, all_features=False, freq_dim=None, drop_rest=False, rotate_last=False,
          no_head_axis=False, first_row=False, angle_dtype=None, keep_float32=False,
          in_place=False, use_view=False, freqs_fn=None, b_without_a=False):
    """apply_rope as a learner writes it: split the pairs, a cos - b sin / a sin + b cos."""
    d = x.shape[-1]
    d_r = d if (rotary_dim is None or all_features) else rotary_dim
    if pairing is not None:                       # ignores the argument, always this pairing
        interleaved = pairing == "interleaved"
    half = d_r // 2
    freqs = (freqs_fn(d_r, base) if freqs_fn else
             _freqs(freq_dim or d_r, base, exponent=exponent, first=first)[:half])
    pos = torch.arange(x.shape[-2]) if arange_positions else positions
    if first_row and pos.dim() == 2:
        pos = pos[0]
    pos = pos + shift
    if angle_dtype == "x":                        # the angles in x's dtype (wrong for fp16/bf16)
        angle_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else None
    if angle_dtype is not None:
        angles = pos.to(angle_dtype)[..., None] * freqs.to(angle_dtype)
    else:
        angles = _angles(pos, freqs)
    if angles.dim() == 3 and not no_head_axis:
        angles = angles[:, None]
    cos, sin = torch.cos(angles), torch.sin(angles)
    if swap:
        cos, sin = sin, cos
    sin = sin * direction
    lo = d - d_r if rotate_last else 0
    part = x[..., lo:lo + d_r]
    part = part if angle_dtype is not None else part.float()
    if use_view and interleaved:                  # rows of pairs: [B*N*S*D_r/2, 2]
        pairs = part.view(-1, 2)
        a, b = pairs[:, 0].view(*part.shape[:-1], half), pairs[:, 1].view(*part.shape[:-1], half)
    elif interleaved:
        a, b = part[..., 0::2], part[..., 1::2]
    else:
        a, b = part[..., :half], part[..., half:]
    a2 = a * cos - b * sin if minus else a * cos + b * sin
    b2 = b * cos if b_without_a else a * sin + b * cos
    rotated = (torch.stack([a2, b2], -1).flatten(-2) if interleaved
               else torch.cat([a2, b2], -1))
    if not keep_float32:
        rotated = rotated.to(x.dtype)
    if in_place:
        x[..., lo:lo + d_r] = rotated
        return x
    rest = x[..., d_r:] if not keep_float32 else x[..., d_r:].float()
    if drop_rest:
        return rotated
    if rotate_last:
        return torch.cat([x[..., :lo], rotated], dim=-1)
    return torch.cat([rotated, rest], dim=-1)


def _with(**mistakes):
    def apply_rope(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
        return _rope(x, positions, base=base, rotary_dim=rotary_dim, interleaved=interleaved,
                     **mistakes)
    return apply_rope


def _rope_hf(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True, sign=1.0):
    """Hugging Face's formulation (rotate_half, cos/sin caches in x's dtype); interleaved by
    permuting the features into the half layout and back."""
    d = x.shape[-1]
    d_r = d if rotary_dim is None else rotary_dim
    freqs = _freqs_hf(d_r, base)
    pos = positions if positions.dim() == 2 else positions[None]
    angles = pos[:, :, None].float() * freqs                  # [B or 1, S, d_r/2]
    emb = torch.cat([angles, angles], dim=-1)[:, None]       # [B or 1, 1, S, d_r]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    part, rest = x[..., :d_r], x[..., d_r:]
    perm = torch.cat([torch.arange(0, d_r, 2), torch.arange(1, d_r, 2)])
    if interleaved:
        part = part[..., perm]

    def rotate_half(t):
        return sign * torch.cat([-t[..., d_r // 2:], t[..., :d_r // 2]], dim=-1)

    out = part * cos + rotate_half(part) * sin
    if interleaved:
        out = out[..., torch.argsort(perm)]
    return torch.cat([out, rest], dim=-1)


def _rope_meta(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    """Meta's LLaMA formulation (freqs_cis = polar(1, outer(t, freqs)), view_as_complex)."""
    d = x.shape[-1]
    d_r = d if rotary_dim is None else rotary_dim
    freqs = 1.0 / (base ** (torch.arange(0, d_r, 2)[: d_r // 2].float() / d_r))
    freqs_cis = torch.polar(torch.ones(positions.shape + freqs.shape),
                            positions.float()[..., None] * freqs)
    if freqs_cis.dim() == 3:
        freqs_cis = freqs_cis[:, None]
    part = x[..., :d_r].float()
    if interleaved:
        xc = torch.view_as_complex(part.reshape(*part.shape[:-1], -1, 2).contiguous())
        out = torch.view_as_real(xc * freqs_cis).flatten(3)
    else:
        xc = torch.complex(part[..., : d_r // 2], part[..., d_r // 2:])
        yc = xc * freqs_cis
        out = torch.cat([yc.real, yc.imag], dim=-1)
    return torch.cat([out.type_as(x), x[..., d_r:]], dim=-1)


def _rotate(x, cos, sin, interleaved=True, *, read=None, write=None, direction=1.0, swap=False,
            minus_a=True, minus_b=False, cos_again=False, in_place=False, use_view=False,
            unflattened=False, a_only=False, add_head_axis=False, b_without_a=False):
    """rotate_pairs as a learner writes it: split the pairs, a cos - b sin / a sin + b cos,
    put them back; `read` / `write` force a pairing for reading / writing the features."""
    read = interleaved if read is None else read
    write = read if write is None else write
    half = x.shape[-1] // 2
    if cos_again:
        cos, sin = torch.cos(cos), torch.sin(sin)
    if swap:
        cos, sin = sin, cos
    sin = sin * direction
    if add_head_axis:                             # treats [S, D_r/2] angles as [B, S, D_r/2]
        cos, sin = cos[:, None], sin[:, None]
    if use_view and read:                         # rows of pairs: [everything, 2]
        pairs = x.view(-1, 2)
        a, b = pairs[:, 0].view(*x.shape[:-1], half), pairs[:, 1].view(*x.shape[:-1], half)
    elif read:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :half], x[..., half:]
    a2 = a * cos - b * sin if minus_a else a * cos + b * sin
    b2 = -a * sin + b * cos if minus_b else a * sin + b * cos
    if b_without_a:                               # x'_b = x_b cos: the a * sin term left out
        b2 = b * cos
    if a_only:
        return a2
    if unflattened:
        return torch.stack([a2, b2], dim=-1)
    out = torch.stack([a2, b2], dim=-1).flatten(-2) if write else torch.cat([a2, b2], dim=-1)
    if in_place:
        x.copy_(out)
        return x
    return out


def _rotating(**mistakes):
    def rotate_pairs(x, cos, sin, interleaved=True):
        return _rotate(x, cos, sin, interleaved, **mistakes)
    return rotate_pairs


def _rotate_hf(x, cos, sin, interleaved=True, *, spread_wrong=False):
    """Hugging Face's x * cos + rotate_half(x) * sin, cos and sin spread over the features."""
    half = x.shape[-1] // 2
    by_pairs = interleaved != spread_wrong
    cos2 = cos.repeat_interleave(2, -1) if by_pairs else torch.cat([cos, cos], -1)
    sin2 = sin.repeat_interleave(2, -1) if by_pairs else torch.cat([sin, sin], -1)
    if interleaved:
        turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    else:
        turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos2 + turned * sin2


def _rotate_complex(x, cos, sin, interleaved=True):
    """Meta's way: the pairs as complex numbers, times cos + i sin."""
    half = x.shape[-1] // 2
    if interleaved:
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], half, 2).contiguous())
        return torch.view_as_real(z * torch.complex(cos, sin)).flatten(-2)
    w = torch.complex(x[..., :half], x[..., half:]) * torch.complex(cos, sin)
    return torch.cat([w.real, w.imag], dim=-1)


def _rotate_matrices(x, cos, sin, interleaved=True):
    """The article's 2x2 matrices, one per pair, applied with einsum."""
    half = x.shape[-1] // 2
    r = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
    out = torch.einsum("...pij,...pj->...pi", r, torch.stack([a, b], -1))
    return out.flatten(-2) if interleaved else torch.cat([out[..., 0], out[..., 1]], -1)


def _perm_by_cat(d_r):
    return torch.cat([torch.arange(0, d_r, 2), torch.arange(1, d_r, 2)])


OTHER_CORRECT = [
    ("rope_frequencies", "pow float32", lambda d_r, base=10000.0: _freqs(d_r, base)),
    ("rope_frequencies", "exp/log float32", _freqs_exp_log),
    ("rope_frequencies", "Hugging Face 1/base**", _freqs_hf),
    ("rope_angles", "broadcast product", _angles),
    ("rope_angles", "outer / einsum", lambda p, f: torch.einsum("...s,f->...sf", p.float(), f)),
    ("rotation_matrix", "stacked tensors", _rotation),
    ("rotation_matrix", "math + torch.tensor", lambda a: torch.tensor(
        [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])),
    ("rotate_pairs", "split, formula, stack/cat", _rotating()),
    ("rotate_pairs", "Hugging Face x cos + rotate_half(x) sin", _rotate_hf),
    ("rotate_pairs", "complex numbers", _rotate_complex),
    ("rotate_pairs", "2x2 matrices with einsum", _rotate_matrices),
    ("apply_rope", "cos/sin pair formula", _with()),
    ("apply_rope", "exp/log frequencies", _with(freqs_fn=_freqs_exp_log)),
    ("apply_rope", "Hugging Face rotate_half, cos/sin in x's dtype", _rope_hf),
    ("apply_rope", "Meta complex freqs_cis", _rope_meta),
    ("interleaved_to_half_permutation", "cat of aranges", _perm_by_cat),
    ("interleaved_to_half_permutation", "list comprehension", lambda d: torch.tensor(
        [2 * i for i in range(d // 2)] + [2 * i + 1 for i in range(d // 2)])),
]


# --------------------------------------------------------------------------------------------
# Wrong implementations and the diagnosis each must get

def _rot(alpha, *, clockwise=False, swap=False, minus=True, degrees=False):
    a = math.radians(alpha) if degrees else float(alpha)
    c, s = math.cos(a), math.sin(a)
    if swap:
        c, s = s, c
    m = torch.tensor([[c, -s], [s, c]] if minus else [[c, s], [s, c]])
    return m.T if clockwise else m


def _hf_wrong_sign(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    """rotate_half written as cat([x2, -x1]): Hugging Face's formula, turning the wrong way."""
    return _rope_hf(x, positions, base=base, rotary_dim=rotary_dim, interleaved=interleaved,
                    sign=-1.0)


def _rope_hf_cat(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    """Hugging Face's cos = cat([angles, angles]) kept for both pairings: right for the half
    pairing only (interleaved pairs need each angle twice in a row)."""
    d_r = x.shape[-1] if rotary_dim is None else rotary_dim
    angles = _angles(positions, _freqs_hf(d_r, base))
    angles = angles[:, None] if angles.dim() == 3 else angles
    part = _rotate_hf(x[..., :d_r].float(), angles.cos(), angles.sin(), interleaved,
                      spread_wrong=interleaved)
    return torch.cat([part.to(x.dtype), x[..., d_r:]], dim=-1)


def _rope_hf_repeat_interleave(x, positions, *, base=10000.0, rotary_dim=None,
                               interleaved=True):
    """cos and sin spread with repeat_interleave (each angle twice in a row) for both pairings:
    right for interleaved pairs only (half pairs need cat([angles, angles]))."""
    d_r = x.shape[-1] if rotary_dim is None else rotary_dim
    angles = _angles(positions, _freqs_hf(d_r, base))
    angles = angles[:, None] if angles.dim() == 3 else angles
    part = _rotate_hf(x[..., :d_r].float(), angles.cos(), angles.sin(), interleaved,
                      spread_wrong=not interleaved)
    return torch.cat([part.to(x.dtype), x[..., d_r:]], dim=-1)


def _rope_tokens_first(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    """Takes x as [B, S, N, D]: the angles get an axis for the heads after S."""
    d_r = x.shape[-1] if rotary_dim is None else rotary_dim
    angles = _angles(positions, _freqs(d_r, base))[..., None, :]      # [.., S, 1, D_r/2]
    cos, sin = angles.cos(), angles.sin()
    part = x[..., :d_r].float()
    half = d_r // 2
    a, b = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half],
                                                                   part[..., half:])
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    out = torch.stack([a2, b2], -1).flatten(-2) if interleaved else torch.cat([a2, b2], -1)
    return torch.cat([out.to(x.dtype), x[..., d_r:]], dim=-1)


def _rotate_4d(x, cos, sin, interleaved=True):
    """Indexes x as [B, N, S, D_r] (x[:, :, :, 0::2]): fails for any other number of axes."""
    half = x.shape[-1] // 2
    a, b = ((x[:, :, :, 0::2], x[:, :, :, 1::2]) if interleaved
            else (x[:, :, :, :half], x[:, :, :, half:]))
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    return torch.stack([a2, b2], -1).flatten(-2) if interleaved else torch.cat([a2, b2], -1)


def _rope_rest_first(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    """Concatenates the pass-through features before the rotated ones."""
    d_r = x.shape[-1] if rotary_dim is None else rotary_dim
    out = _rope(x, positions, base=base, rotary_dim=rotary_dim, interleaved=interleaved)
    return torch.cat([out[..., d_r:], out[..., :d_r]], dim=-1)


WRONG = {
    "rope_frequencies": [
        Wrong("exponent 4i/D (arange(0, D, 2) times 2)", lambda d, base=10000.0: base ** (
            -2 * torch.arange(0, d, 2).float() / d), "08.rope_frequencies.exponent_4i_over_d"),
        Wrong("exponent i/D", lambda d, base=10000.0: _freqs(d, base, exponent=1.0)[: d // 2],
              "08.rope_frequencies.exponent_i_over_d"),
        Wrong("index from 1", lambda d, base=10000.0: _freqs(d, base, first=1),
              "08.rope_frequencies.pair_index_from_1"),
        Wrong("positive exponent", lambda d, base=10000.0: _freqs(d, base, sign=1.0),
              "08.rope_frequencies.positive_exponent"),
        Wrong("integer division", lambda d, base=10000.0: _freqs(d, base, int_div=True),
              "08.rope_frequencies.integer_division"),
        Wrong("one per feature", lambda d, base=10000.0: _freqs(d, base, per_feature=True),
              "08.rope_frequencies.one_frequency_per_feature"),
        Wrong("linspace", lambda d, base=10000.0: base ** -torch.linspace(0, 1, d // 2),
              "08.rope_frequencies.linspace_exponents"),
        Wrong("float64", lambda d, base=10000.0: _freqs(d, base, dtype=torch.float64),
              "08.rope_frequencies.not_float32"),
        Wrong("base ignored", lambda d, base=10000.0: _freqs(d),
              "08.rope_frequencies.ignored_base"),
        Wrong("repeat_interleave", lambda d, base=10000.0: _freqs(d, base).repeat_interleave(2),
              "08.rope_frequencies.one_frequency_per_feature"),
    ],
    "rope_angles": [
        Wrong("positions[:, None] * freqs", lambda p, f: p[:, None].float() * f,
              "08.rope_angles.new_axis_not_last"),
        Wrong("arange(S) added to the positions",
              lambda p, f: _angles(p + torch.arange(p.shape[-1]), f),
              "08.rope_angles.added_arange_to_positions"),
        Wrong("torch.outer", lambda p, f: torch.outer(p.float(), f),
              "08.rope_angles.outer_on_batch_positions"),
        Wrong("arange(S)", lambda p, f: _angles(torch.arange(p.shape[-1]), f),
              "08.rope_angles.positions_ignored"),
        Wrong("positions + 1", lambda p, f: _angles(p + 1, f), "08.rope_angles.positions_from_1"),
        Wrong("divided", lambda p, f: p[..., None].float() / f,
              "08.rope_angles.divided_by_frequencies"),
        Wrong("transposed", lambda p, f: f[:, None] * p[..., None, :].float(),
              "08.rope_angles.transposed"),
        Wrong("HF cat(angles, angles)", lambda p, f: torch.cat([_angles(p, f)] * 2, -1),
              "08.rope_angles.one_angle_per_feature"),
        Wrong("repeat_interleave", lambda p, f: _angles(p, f).repeat_interleave(2, -1),
              "08.rope_angles.one_angle_per_feature"),
        Wrong("first row only", lambda p, f: _angles(p.reshape(-1, p.shape[-1])[0], f),
              "08.rope_angles.first_row_of_positions"),
        Wrong("flattened batch", lambda p, f: _angles(p.reshape(-1), f),
              "08.rope_angles.flattened_the_batch"),
        Wrong("float64", lambda p, f: p[..., None].double() * f.double(),
              "08.rope_angles.not_float32"),
    ],
    "rotation_matrix": [
        Wrong("clockwise", lambda a: _rot(a, clockwise=True), "08.rotation_matrix.clockwise"),
        Wrong("sin/cos swapped", lambda a: _rot(a, swap=True),
              "08.rotation_matrix.sin_cos_swapped"),
        Wrong("no minus", lambda a: _rot(a, minus=False), "08.rotation_matrix.minus_sign_missing"),
        Wrong("degrees", lambda a: _rot(a, degrees=True), "08.rotation_matrix.degrees"),
        Wrong("flat [4]", lambda a: _rot(a).reshape(4), "08.rotation_matrix.not_2x2"),
        Wrong("float64", lambda a: _rot(a).double(), "08.rotation_matrix.not_float32"),
    ],
    "rotate_pairs": [
        Wrong("indexes x as 4-D", _rotate_4d, "08.rotate_pairs.assumed_four_axes"),
        Wrong("half pairing always", _rotating(read=False), "08.rotate_pairs.half_pairing"),
        Wrong("interleaved pairing always", _rotating(read=True),
              "08.rotate_pairs.interleaved_pairing"),
        Wrong("pairings swapped", lambda x, c, s, interleaved=True: _rotate(
            x, c, s, not interleaved), "08.rotate_pairs.half_pairing"),
        Wrong("read interleaved, written back as halves", lambda x, c, s, interleaved=True:
              _rotate(x, c, s, interleaved, write=not interleaved),
                "08.rotate_pairs.wrote_back_in_the_other_layout"),
        Wrong("rotates the wrong way", _rotating(direction=-1.0),
              "08.rotate_pairs.rotated_the_wrong_way"),
        Wrong("sin/cos swapped", _rotating(swap=True), "08.rotate_pairs.sin_cos_swapped"),
        Wrong("sin negated, then sin/cos swapped", lambda x, c, s, interleaved=True: _rotate(
            x, c, -s, interleaved, swap=True), "08.rotate_pairs.sin_cos_swapped_and_wrong_way"),
        Wrong("pairings swapped and rotates the wrong way", lambda x, c, s, interleaved=True:
              _rotate(x, c, s, not interleaved, direction=-1.0),
              "08.rotate_pairs.rotated_the_wrong_way_and_other_pairing"),
        Wrong("repeat_interleave cos/sin for half pairs too", lambda x, c, s, interleaved=True:
              _rotate_hf(x, c, s, interleaved, spread_wrong=not interleaved),
              "08.rotate_pairs.spread_cos_sin_as_interleaved"),
        Wrong("x'_b = x_b cos", _rotating(b_without_a=True), "08.rotate_pairs.not_a_rotation"),
        Wrong("computed in float32", lambda x, c, s, interleaved=True: _rotate(
            x.float(), c.float(), s.float(), interleaved), "08.rotate_pairs.changed_the_dtype"),
        Wrong("minus sign missing", _rotating(minus_a=False), "08.rotate_pairs.minus_sign_missing"),
        Wrong("minus sign in both lines", _rotating(minus_b=True),
              "08.rotate_pairs.minus_sign_twice"),
        Wrong("HF formula, cos spread the other pairing's way",
              lambda x, c, s, interleaved=True: _rotate_hf(x, c, s, interleaved,
                                                           spread_wrong=True),
              "08.rotate_pairs.spread_cos_sin_as_half"),
        Wrong("cos of cos", _rotating(cos_again=True), "08.rotate_pairs.cos_of_cos"),
        Wrong("returns x unchanged", lambda x, c, s, interleaved=True: x.clone(),
              "08.rotate_pairs.returned_x_unchanged"),
        Wrong("pairs not flattened", _rotating(unflattened=True),
              "08.rotate_pairs.pairs_not_flattened"),
        Wrong("only x_a returned", _rotating(a_only=True), "08.rotate_pairs.returned_half"),
        Wrong("writes into x", _rotating(in_place=True), "08.rotate_pairs.wrote_into_an_input"),
        Wrong("negates sin in place", lambda x, c, s, interleaved=True: _rotate(
            x, c, s.neg_(), interleaved, direction=-1.0), "08.rotate_pairs.wrote_into_an_input"),
        Wrong(".view on a transposed x", _rotating(use_view=True),
              "08.rotate_pairs.view_of_non_contiguous"),
        Wrong("adds a head axis to cos and sin", _rotating(add_head_axis=True),
              "08.rotate_pairs.reshaped_cos_and_sin"),
    ],
    "apply_rope": [
        Wrong("pass-through features first", _rope_rest_first, "08.apply_rope.pass_through_first"),
        Wrong("arange(S) added to the positions", lambda x, p, **kw: _rope(
            x, p, shift=torch.arange(x.shape[-2]), **kw),
              "08.apply_rope.added_arange_to_positions"),
        Wrong("HF cat([angles, angles]) for interleaved pairs too", _rope_hf_cat,
              "08.apply_rope.spread_cos_sin_as_half"),
        Wrong("x taken as [B, S, N, D]", _rope_tokens_first,
              "08.apply_rope.positions_on_the_heads_axis"),
        Wrong("half pairing when interleaved asked", _with(pairing="half"),
              "08.apply_rope.half_pairing"),
        Wrong("interleaved pairing when half asked", _with(pairing="interleaved"),
              "08.apply_rope.interleaved_pairing"),
        Wrong("pairings swapped", lambda x, p, interleaved=True, **kw: _rope(
            x, p, interleaved=not interleaved, **kw), "08.apply_rope.half_pairing"),
        Wrong("exponent i/D", _with(exponent=1.0), "08.apply_rope.exponent_i_over_d"),
        Wrong("pair index from 1", _with(first=1), "08.apply_rope.pair_index_from_1"),
        Wrong("positions from 1", _with(shift=1), "08.apply_rope.positions_from_1"),
        Wrong("sin/cos swapped", _with(swap=True), "08.apply_rope.sin_cos_swapped"),
        Wrong("sin/cos swapped and rotates the wrong way", _with(swap=True, direction=-1.0),
              "08.apply_rope.sin_cos_swapped_and_wrong_way"),
        Wrong("pairings swapped and rotates the wrong way", lambda x, p, interleaved=True, **kw:
              _rope(x, p, interleaved=not interleaved, direction=-1.0, **kw),
              "08.apply_rope.rotated_the_wrong_way_and_other_pairing"),
        Wrong("repeat_interleave cos/sin for half pairs too", _rope_hf_repeat_interleave,
              "08.apply_rope.spread_cos_sin_as_interleaved"),
        Wrong("x'_b = x_b cos", _with(b_without_a=True), "08.apply_rope.not_a_rotation"),
        Wrong("rotates the wrong way", _with(direction=-1.0),
              "08.apply_rope.rotated_the_wrong_way"),
        Wrong("HF rotate_half with the wrong sign", _hf_wrong_sign,
              "08.apply_rope.rotated_the_wrong_way"),
        Wrong("minus sign missing", _with(minus=False), "08.apply_rope.minus_sign_missing"),
        Wrong("positions ignored: arange(S)", _with(arange_positions=True),
              "08.apply_rope.positions_ignored"),
        Wrong("returns x unchanged", lambda x, p, **kw: x.clone(),
              "08.apply_rope.returned_x_unchanged"),
        Wrong("rotary_dim ignored: whole head rotated", _with(all_features=True),
              "08.apply_rope.ignored_rotary_dim"),
        Wrong("frequencies over the head dim", lambda x, p, rotary_dim=None, **kw: _rope(
            x, p, rotary_dim=rotary_dim, freq_dim=x.shape[-1], **kw),
              "08.apply_rope.frequencies_from_head_dim"),
        Wrong("pass-through features dropped", _with(drop_rest=True),
              "08.apply_rope.pass_through_dropped"),
        Wrong("last rotary_dim features rotated", _with(rotate_last=True),
              "08.apply_rope.rotated_the_last_features"),
        Wrong("[B, S] angles without a head axis", _with(no_head_axis=True),
              "08.apply_rope.no_head_axis_for_batch_positions"),
        Wrong("first row of [B, S] positions", _with(first_row=True),
              "08.apply_rope.first_row_of_positions"),
        Wrong("angles in x's dtype", _with(angle_dtype="x"), "08.apply_rope.low_precision_angles"),
        Wrong("float32 returned for half-precision x", _with(keep_float32=True),
              "08.apply_rope.changed_the_dtype"),
        Wrong("writes into x", _with(in_place=True), "08.apply_rope.rotated_x_in_place"),
        Wrong(".view on a transposed x", _with(use_view=True),
              "08.apply_rope.view_of_non_contiguous"),
        Wrong("base ignored", lambda x, p, base=10000.0, **kw: _rope(x, p, **kw),
              "08.apply_rope.ignored_base"),
    ],
    "interleaved_to_half_permutation": [
        Wrong("inverse", lambda d: torch.argsort(_perm_by_cat(d)),
              "08.interleaved_to_half_permutation.inverse_permutation"),
        Wrong("identity", lambda d: torch.arange(d), "08.interleaved_to_half_permutation.identity"),
        Wrong("odd first", lambda d: torch.cat([torch.arange(1, d, 2), torch.arange(0, d, 2)]),
              "08.interleaved_to_half_permutation.odd_features_first"),
        Wrong("evens only", lambda d: torch.arange(0, d, 2),
              "08.interleaved_to_half_permutation.even_features_only"),
        Wrong("python list", lambda d: _perm_by_cat(d).tolist(),
              "08.interleaved_to_half_permutation.not_a_long_tensor"),
        Wrong("float", lambda d: _perm_by_cat(d).float(),
              "08.interleaved_to_half_permutation.not_a_long_tensor"),
        Wrong("int32", lambda d: _perm_by_cat(d).int(),
              "08.interleaved_to_half_permutation.not_a_long_tensor"),
    ],
}


# The reference and the other correct ways, for each exercise
CORRECT = {name: {"reference": getattr(ref, name),
                  **{label: fn for n, label, fn in OTHER_CORRECT if n == name}}
           for name in CHECKERS}
EXERCISES = [Exercise(CHECKERS[name], CORRECT[name], WRONG[name]) for name in CHECKERS]


def test_broadcast_error_names_the_head_axis():
    """With B != N, angles [B, S, D_r/2] without a head axis raise; the failure explains why."""
    with pytest.raises(LearnerError) as info:
        nb08.check_apply_rope(_with(no_head_axis=True), seed=0)
    assert info.value.mistake == "08.apply_rope.no_head_axis_for_batch_positions", info.value


# --------------------------------------------------------------------------------------------
# The reference against independent formulations


def _article_loop(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    """The article's formula, one pair at a time, in float64."""
    d = x.shape[-1]
    d_r = d if rotary_dim is None else rotary_dim
    out = x.double().clone()
    pos = positions.double()
    for i in range(d_r // 2):
        theta = base ** (-2 * i / d_r)
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d_r // 2)
        alpha = pos * theta
        if alpha.dim() == 2:
            alpha = alpha[:, None]
        c, s = torch.cos(alpha), torch.sin(alpha)
        xa, xb = x[..., a].double(), x[..., b].double()
        out[..., a] = xa * c - xb * s
        out[..., b] = xa * s + xb * c
    return out


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim", [None, 6, 2])
@pytest.mark.parametrize("batched", [False, True])
def test_reference_matches_the_article_formula(interleaved, rotary_dim, batched):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 10, generator=g)
    positions = torch.tensor([[7, 8, 9, 10, 11], [0, 2, 5, 9, 40]]) if batched \
        else torch.arange(5) + 17
    got = ref.apply_rope(x, positions, rotary_dim=rotary_dim, interleaved=interleaved)
    want = _article_loop(x, positions, rotary_dim=rotary_dim, interleaved=interleaved)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert got.dtype == x.dtype


def test_reference_matches_hugging_face_formula_and_meta_formula():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 4, 6, 16, generator=g)
    positions = torch.arange(6) + 100
    for interleaved in (True, False):
        want = ref.apply_rope(x, positions, interleaved=interleaved, base=500000.0)
        for other in (_rope_hf, _rope_meta):
            got = other(x, positions, interleaved=interleaved, base=500000.0)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_reference_pieces_match_closed_forms():
    freqs = ref.rope_frequencies(128)
    assert freqs.shape == (64,) and freqs.dtype == torch.float32
    assert freqs[0] == 1.0
    assert math.isclose(float(freqs[-1]), 10000 ** (-126 / 128), rel_tol=1e-6)
    angles = ref.rope_angles(torch.tensor([[3, 8], [13, 18]]), freqs)
    assert angles.shape == (2, 2, 64)
    assert torch.equal(angles[..., 0], torch.tensor([[3.0, 8.0], [13.0, 18.0]]))
    for a, b in [(0.3, 1.1), (-2.0, 5.5)]:
        torch.testing.assert_close(ref.rotation_matrix(a).T @ ref.rotation_matrix(b),
                                   ref.rotation_matrix(b - a))
    assert torch.allclose(ref.rotation_matrix(math.pi / 2) @ torch.tensor([1.0, 0.0]),
                          torch.tensor([0.0, 1.0]), atol=1e-7)
    assert ref.interleaved_to_half_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_reference_relative_position_and_norm():
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 1, 1, 64, generator=g), torch.randn(1, 1, 1, 64, generator=g)

    def score(m, n):
        return float((ref.apply_rope(q, torch.tensor([m])) *
                      ref.apply_rope(k, torch.tensor([n]))).sum())

    # The article's example: positions (3, 8) and (13, 18) share the offset 5.
    assert math.isclose(score(3, 8), score(13, 18), abs_tol=1e-4)
    assert not math.isclose(score(3, 8), score(3, 9), abs_tol=1e-2)
    x = torch.randn(2, 3, 4, 64, generator=g)
    out = ref.apply_rope(x, torch.arange(4) + 1000)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_reference_keeps_half_precision_dtype_and_accuracy():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 2, 4, 16, generator=g)
    positions = torch.arange(4) + 3000
    want = _article_loop(x, positions)
    for dtype in (torch.float16, torch.bfloat16):
        got = ref.apply_rope(x.to(dtype), positions)
        assert got.dtype == dtype
        assert (got.double() - want).abs().max() < 0.05


@pytest.mark.parametrize("interleaved", [True, False])
def test_reference_rotate_pairs_is_the_article_matrix_pair_by_pair(interleaved):
    """ref.rotate_pairs against R(alpha) @ (x_a, x_b), one pair at a time, in float64."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    alpha = torch.rand(5, 4, generator=g, dtype=torch.float64) * 8 - 4
    got = ref.rotate_pairs(x, torch.cos(alpha), torch.sin(alpha), interleaved)
    assert got.shape == x.shape and got.dtype == x.dtype
    for i in range(4):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + 4)
        for s in range(5):
            r = ref.rotation_matrix(float(alpha[s, i])).double()
            pair = torch.stack([x[..., s, a], x[..., s, b]], -1) @ r.T
            torch.testing.assert_close(got[..., s, a], pair[..., 0], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(got[..., s, b], pair[..., 1], atol=1e-6, rtol=1e-6)



# --------------------------------------------------------------------------------------------
# apply_rope is built on rope_frequencies, rope_angles and rotate_pairs, and the permutation on
# apply_rope: a broken earlier exercise that the learner's function calls is named ("fix X
# first"); with right helpers the function's own mistake is named. The learner's functions are
# written as a notebook cell is: module-level functions of a namespace of their own.

_LEARNER_ROPE = """
def rope_frequencies(rotary_dim, base=10000.0):
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)

def rope_angles(positions, freqs):
    return positions.to(torch.float32)[..., None] * freqs

def rotate_pairs(x, cos, sin, interleaved=True):
    half = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    return torch.stack([a2, b2], -1).flatten(-2) if interleaved else torch.cat([a2, b2], -1)

def apply_rope(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    d_r = x.shape[-1] if rotary_dim is None else rotary_dim
    angles = rope_angles(positions, rope_frequencies(d_r, base))
    if angles.dim() == 3:
        angles = angles[:, None]
    rotated = rotate_pairs(x[..., :d_r].float(), angles.cos(), angles.sin(), interleaved)
    return torch.cat([rotated.to(x.dtype), x[..., d_r:]], dim=-1)

def interleaved_to_half_permutation(rotary_dim):
    x = torch.randn(1, 1, 3, rotary_dim)                # a self-test that calls apply_rope
    apply_rope(x, torch.arange(3))
    return torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)])
"""

_BROKEN = {
    "rope_frequencies": ("/ rotary_dim)", "/ rotary_dim / 2)"),            # exponent i/D_r
    "rope_angles": ("positions.to(torch.float32)[..., None]",              # positions ignored
                    "torch.arange(positions.shape[-1]).float()[:, None]"),
    "rotate_pairs": ("a * cos - b * sin, a * sin + b * cos",               # the wrong way
                     "a * cos + b * sin, -a * sin + b * cos"),
    "apply_rope": ("x[..., d_r:]]", "torch.zeros_like(x[..., d_r:])]"),    # pass-through zeroed
    "interleaved_to_half_permutation": ("return torch.cat([torch.arange(0, rotary_dim, 2), "
                                        "torch.arange(1, rotary_dim, 2)])",
                                        "return torch.arange(rotary_dim)"),  # the identity
}


def _learner_rope(*broken: str) -> dict:
    source = _LEARNER_ROPE
    for name in broken:
        old, new = _BROKEN[name]
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return learner_cell(source)



def test_the_learner_cell_passes_when_nothing_is_broken():
    ns = _learner_rope()
    for name in ("rope_frequencies", "rope_angles", "rotate_pairs", "apply_rope",
                 "interleaved_to_half_permutation"):
        CHECKERS[name](ns[name], seed=0)


def _mistake(checker, fn, seed: int = 0) -> str | None:
    """The id of the mistake the checker names for `fn` (which must fail)."""
    with pytest.raises(CheckFailure) as info:
        checker(fn, seed=seed)
    return info.value.mistake


@pytest.mark.parametrize("helper", ["rope_frequencies", "rope_angles", "rotate_pairs"])
def test_apply_rope_says_fix_its_broken_helper_first(helper):
    ns = _learner_rope(helper)
    assert _mistake(nb08.check_apply_rope, ns["apply_rope"]) == \
        f"08.apply_rope.fix_{helper}_first"


def test_apply_rope_keeps_its_own_diagnosis_when_its_helpers_are_right():
    ns = _learner_rope("apply_rope")
    assert _mistake(nb08.check_apply_rope, ns["apply_rope"]) == "08.apply_rope.pass_through_zeroed"


def test_apply_rope_does_not_blame_a_broken_helper_it_does_not_call():
    ns = _learner_rope("rotate_pairs", "apply_rope")
    ns["apply_rope"] = _apply_rope_inline(ns)
    assert _mistake(nb08.check_apply_rope, ns["apply_rope"]) == "08.apply_rope.pass_through_zeroed"


def _apply_rope_inline(ns: dict):
    """The learner's apply_rope with its own rotation inline (rotate_pairs not called), its
    pass-through still zeroed."""
    source = """
def apply_rope(x, positions, *, base=10000.0, rotary_dim=None, interleaved=True):
    d_r = x.shape[-1] if rotary_dim is None else rotary_dim
    angles = rope_angles(positions, rope_frequencies(d_r, base))
    if angles.dim() == 3:
        angles = angles[:, None]
    cos, sin, part, half = angles.cos(), angles.sin(), x[..., :d_r].float(), d_r // 2
    a, b = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half],
                                                                   part[..., half:])
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    rotated = torch.stack([a2, b2], -1).flatten(-2) if interleaved else torch.cat([a2, b2], -1)
    return torch.cat([rotated.to(x.dtype), torch.zeros_like(x[..., d_r:])], dim=-1)
"""
    exec(compile(source, "<learner cell 2>", "exec"), ns)
    return ns["apply_rope"]


def test_the_permutation_says_fix_apply_rope_first():
    ns = _learner_rope("rope_frequencies", "interleaved_to_half_permutation")
    assert _mistake(nb08.check_interleaved_to_half_permutation,
                    ns["interleaved_to_half_permutation"]) == \
        "08.interleaved_to_half_permutation.fix_apply_rope_first"


def test_the_permutation_keeps_its_own_diagnosis_when_apply_rope_is_right():
    ns = _learner_rope("interleaved_to_half_permutation")
    assert _mistake(nb08.check_interleaved_to_half_permutation,
                    ns["interleaved_to_half_permutation"]) == \
        "08.interleaved_to_half_permutation.identity"


def test_chapter_08_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    ns = _learner_rope("rotate_pairs")
    text = failure_text(nb08.check_rotate_pairs, ns["rotate_pairs"])
    assert "可能的错误：旋转方向反了：sin 的一个符号弄反了" in text, text
    assert "likely mistake" not in text and "expected" not in text
    text = failure_text(nb08.check_apply_rope, ns["apply_rope"])
    assert "apply_rope 建立在它之上，所以请先修好 rotate_pairs" in text, text
