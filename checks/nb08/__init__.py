"""Checks for chapter 08: RoPE (frequencies, angles, the 2x2 rotation, rotating the pairs of a
vector, both pairing conventions).

Conventions (docs/conventions.md): theta_i = base ** (-2i / D_r) for i = 0 .. D_r/2 - 1; a token
at position m rotates pair i by m * theta_i (counter-clockwise); the default pairing is the
article's (2i, 2i+1) ("interleaved"), `interleaved=False` pairs (i, i + D_r/2) ("half", as in
Hugging Face checkpoints); with D_r < D only the first D_r features of each head rotate. Angles are
computed in float32; apply_rope returns x's dtype.

Positions in the checks start at an offset (a decode step or a later chunk starts at start_pos),
so that "used arange(S) instead of positions" gives wrong answers.
"""

from __future__ import annotations

import math

import torch

from .. import reference as ref
from ..engine import Check, CheckFailure, builds_on, describe, tolerance
from ..i18n import N_, _
from ..mistakes import Mistake, fix_first

HEADS_FIRST = ("B", "N", "S", "D")
# What a broadcast of tensors that do not fit says (recognised as a mistake where one is known).
_BROADCAST = r"(?i)must match|broadcast|size of tensor|expanded size"

# --------------------------------------------------------------------------------------------
# The mistakes this chapter diagnoses, in the words a failure shows.

EXPONENT_I = Mistake("exponent_i_over_d", N_("exponent i/D_r instead of 2i/D_r: pair i holds "
    "features 2i and 2i+1, so theta_i = base ** (-2i / D_r) (step 2 in `torch.arange(0, D_r, "
    "2)`)"))
INDEX_FROM_1 = Mistake("pair_index_from_1", N_("pair index counted from 1: i runs 0 .. D_r/2 - "
    "1, so the first pair has theta_0 = 1 (one radian per position) and the last base ** (-(D_r "
    "- 2) / D_r)"))
LINSPACE = Mistake("linspace_exponents", N_("exponents spread over 0 .. 1 (`linspace(0, 1, "
    "D_r/2)`): they are 2i/D_r, which stops at (D_r - 2)/D_r, so the last frequency is base ** "
    "(-(D_r - 2)/D_r), not 1/base"))
POSITIVE_EXPONENT = Mistake("positive_exponent", N_("forgot the minus sign in the exponent: "
    "theta_i = base ** (-2i / D_r) = 1 / base ** (2i / D_r) shrinks from 1 towards 1/base"))
INT_DIVISION = Mistake("integer_division", N_("integer division: `torch.arange(0, D_r, 2) // "
    "D_r` is all zeros, so every frequency came out as 1; divide as floats"))
PER_FEATURE = Mistake("one_frequency_per_feature", N_("one frequency per feature: RoPE has one "
    "frequency per PAIR of features, D_r // 2 of them"))
IGNORED_BASE = Mistake("ignored_base", N_("ignored the `base` argument (used 10000)"))
FLOAT_DTYPE = Mistake("not_float32", N_("return float32 (compute in float64 if you like, then "
    "`.float()`)"))
POSITIONS_IGNORED = Mistake("positions_ignored", N_("ignored `positions`: used torch.arange(S) "
    "(0, 1, 2, ...) instead of the positions given; a decode step or a later chunk starts at "
    "start_pos, not 0"))
POSITIONS_FROM_1 = Mistake("positions_from_1", N_("positions counted from 1 (m + 1): use the "
    "positions exactly as given; the first token of a sequence is position 0"))
ADDED_ARANGE = Mistake("added_arange_to_positions", N_("added arange(S) to the positions: they "
    "are absolute already (a later chunk's are start_pos + arange(S)); use them as given"))
DIVIDED = Mistake("divided_by_frequencies", N_("divided the positions by the frequencies: the "
    "angle is m * theta_i, a product"))
TRANSPOSED = Mistake("transposed", N_("transposed: angles are [..., S, D_r/2], one row per "
    "position and one column per pair (`positions[..., None] * freqs`)"))
PER_FEATURE_ANGLE = Mistake("one_angle_per_feature", N_("one angle per feature: return one "
    "angle per PAIR, [..., S, D_r/2]; both features of pair i share m * theta_i (repeat it "
    "inside apply_rope if your rotation needs it)"))
BATCH_LOST = Mistake("first_row_of_positions", N_("positions [B, S] give angles [B, S, D_r/2]: "
    "every sequence keeps its own row of positions"))
BATCH_FLAT = Mistake("flattened_the_batch", N_("flattened the batch: positions [B, S] give "
    "angles [B, S, D_r/2], not [B * S, D_r/2]"))
ROT_CLOCKWISE = Mistake("clockwise", N_("rotates the wrong way (clockwise): R(alpha) = [[cos, "
    "-sin], [sin, cos]], the minus sign belongs in the top-right entry, so that R(pi/2) turns "
    "(1, 0) into (0, 1)"))
ROT_SWAPPED = Mistake("sin_cos_swapped", N_("sin and cos swapped: the diagonal holds "
    "cos(alpha), the off-diagonal -sin(alpha) (top right) and sin(alpha) (bottom left)"))
ROT_NO_MINUS = Mistake("minus_sign_missing", N_("not a rotation: the minus sign is missing; "
    "R(alpha) = [[cos, -sin], [sin, cos]]"))
ROT_DEGREES = Mistake("degrees", N_("alpha is in radians: torch.cos and torch.sin take radians, "
    "do not convert"))
ROT_SHAPE = Mistake("not_2x2", N_("return the matrix as a [2, 2] tensor: [[cos, -sin], [sin, "
    "cos]]"))
OTHER_PAIRING_HALF = Mistake("half_pairing", N_("used the other pairing convention: with "
    "interleaved=True pair i is the ADJACENT features (2i, 2i+1) (the article's); you paired "
    "(i, i + D_r/2), the 'half' convention of Hugging Face checkpoints"))
OTHER_PAIRING_INTERLEAVED = Mistake("interleaved_pairing", N_("used the other pairing "
    "convention: with interleaved=False pair i is features (i, i + D_r/2) (the first half with "
    "the second half); you paired adjacent features (2i, 2i+1)"))
WRONG_WAY = Mistake("rotated_the_wrong_way", N_("rotated the wrong way: a sign of sin is "
    "flipped; x'_a = x_a cos - x_b sin, x'_b = x_a sin + x_b cos (with (x_a, x_b) the pair, in "
    "this order)"))
SIN_COS_SWAPPED = Mistake("sin_cos_swapped", N_("sin and cos swapped: x'_a = x_a cos(m theta) - "
    "x_b sin(m theta), x'_b = x_a sin(m theta) + x_b cos(m theta)"))
NO_MINUS = Mistake("minus_sign_missing", N_("not a rotation (lengths change): the minus sign is "
    "missing in x'_a = x_a cos - x_b sin"))
ALL_FEATURES = Mistake("ignored_rotary_dim", N_("ignored rotary_dim: only the first rotary_dim "
    "features of each head rotate, the other D - rotary_dim pass through unchanged"))
FREQ_FROM_HEAD = Mistake("frequencies_from_head_dim", N_("took the frequencies from the head "
    "size D: with rotary_dim = D_r the frequencies are base ** (-2i / D_r), i < D_r / 2"))
ROTATED_LAST = Mistake("rotated_the_last_features", N_("rotated the LAST rotary_dim features: "
    "the first rotary_dim features rotate, the rest pass through"))
PASS_ZEROED = Mistake("pass_through_zeroed", N_("zeroed the features beyond rotary_dim: they "
    "pass through unchanged (concatenate them back)"))
PASS_DROPPED = Mistake("pass_through_dropped", N_("dropped the features beyond rotary_dim: the "
    "output has x's shape; the last D - rotary_dim features pass through unchanged (concatenate "
    "them back)"))
BATCH_HEADS = Mistake("no_head_axis_for_batch_positions", N_("positions [B, S] give angles [B, "
    "S, D_r/2]: insert a head axis ([B, 1, S, D_r/2], e.g. `angles[:, None]`) so that each "
    "sequence's positions apply to all N of its heads"),
    raises=[("RuntimeError", _BROADCAST)])
BATCH_FIRST_ROW = Mistake("first_row_of_positions", N_("used the first row of positions [B, S] "
    "for every sequence: each sequence has its own positions (angles [B, 1, S, D_r/2])"))
KEEP_DTYPE = Mistake("changed_the_dtype", N_("return x's dtype: compute in float32 if you like "
    "(good for the angles), then cast the result back with `.to(x.dtype)`"))
LOW_PRECISION_ANGLES = Mistake("low_precision_angles", N_("computed the angles (positions x "
    "frequencies) in {dtype}: it has too few bits for positions in the thousands (near 2000, "
    "bfloat16 numbers are 8 apart, so positions 2000 to 2003 become one number). Compute the "
    "angles and their cos/sin in float32, and only then cast the result to x's dtype"))
NOT_A_ROTATION = Mistake("not_a_rotation", N_("not a rotation: the length of each token's "
    "vector changed; every pair (x_a, x_b) must keep its length, x'_a = x_a cos - x_b sin, x'_b "
    "= x_a sin + x_b cos"))
VIEW_NOT_CONTIGUOUS = Mistake("view_of_non_contiguous", N_("`.view` needs contiguous memory, "
    "and x (heads-first tensors usually come from a transpose) or a slice of it such as x[..., "
    ":rotary_dim] may not be contiguous: use `.reshape(...)` instead of `.view(...)`, and "
    "`.contiguous()` before `torch.view_as_complex`"),
    raises=[("RuntimeError", r"(?i)view size|stride")])
RETURNED_X = Mistake("returned_x_unchanged", N_("returned x unchanged: every pair of the first "
    "rotary_dim features turns by m * theta_i"))
IN_PLACE = Mistake("rotated_x_in_place", N_("changed its input x in place: build a new tensor "
    "(the caller still needs x, and slices such as x[..., :D_r] are views into it)"))
ANGLES_AS_GIVEN = Mistake("reshaped_cos_and_sin", N_("cos and sin come ready to broadcast "
    "against x's pairs ([..., D_r/2] against x's [..., D_r] features, one angle per pair): use "
    "them as they are, without adding or moving axes"),
    raises=[("RuntimeError", _BROADCAST)])
LAYOUT_BACK = Mistake("wrote_back_in_the_other_layout", N_("rotated the right pairs but wrote "
    "them back in the other layout: with interleaved=True the results go back to features (2i, "
    "2i+1) (`torch.stack([a, b], dim=-1).flatten(-2)`), with interleaved=False to (i, i + "
    "D_r/2) (`torch.cat([a, b], dim=-1)`)"))
SPREAD_INTERLEAVED = Mistake("spread_cos_sin_as_half", N_("cos and sin reached the wrong "
    "features: pair i's angle belongs to both of its features, and with interleaved=True those "
    "are 2i and 2i+1 (`cos.repeat_interleave(2, dim=-1)`), not i and i + D_r/2 "
    "(`torch.cat([cos, cos], dim=-1)`)"))
SPREAD_HALF = Mistake("spread_cos_sin_as_interleaved", N_("cos and sin reached the wrong "
    "features: pair i's angle belongs to both of its features, and with interleaved=False those "
    "are i and i + D_r/2 (`torch.cat([cos, cos], dim=-1)`), not 2i and 2i+1 "
    "(`cos.repeat_interleave(2, dim=-1)`)"))
COS_OF_COS = Mistake("cos_of_cos", N_("cos and sin are already the cosines and sines of the "
    "angles: use them as they are (you applied torch.cos / torch.sin to them once more)"))
MINUS_TWICE = Mistake("minus_sign_twice", N_("not a rotation: the minus sign belongs only in "
    "x'_a = x_a cos - x_b sin; the second line, x'_b = x_a sin + x_b cos, has none"))
NOT_FLATTENED = Mistake("pairs_not_flattened", N_("return x's shape [..., D_r]: put the rotated "
    "pairs back into one feature axis (`torch.stack([a, b], dim=-1).flatten(-2)` for "
    "interleaved, `torch.cat([a, b], dim=-1)` for half)"))
HALF_RETURNED = Mistake("returned_half", N_("return both members of every pair: x's shape [..., "
    "D_r], the rotated x_a and x_b put back together, not [..., D_r/2]"))
ROTATE_IN_PLACE = Mistake("wrote_into_an_input", N_("build new tensors instead of writing into "
    "the inputs: apply_rope passes a slice of its own input, x[..., :D_r], which is a view, and "
    "cos and sin are shared by every head and every layer"))
ROTATE_DTYPE = Mistake("changed_the_dtype", N_("return x's dtype (cos and sin have it too)"))
ROTATE_RETURNED_X = Mistake("returned_x_unchanged", N_("returned x unchanged: every pair turns "
    "by its angle, the one whose cosine and sine cos[..., i] and sin[..., i] hold"))
ANGLES_DTYPE = Mistake("not_float32", N_("angles are float32 (the dtype of the frequencies): an "
    "integer position times a float32 frequency already is"))
ROT_DTYPE = Mistake("not_float32", N_("return float32, torch's default float type (torch.tensor "
    "of Python floats gives float32)"))
RELATIVE = Mistake("rotations_do_not_compose", N_("rotate q by m theta_i and k by n theta_i "
    "with the same frequencies and the same pairing, so that R(m theta)^T R(n theta) = R((n - "
    "m) theta)"))
_YOU_RETURNED = N_("{mistake} (you returned {shape})")
DOUBLED_EXPONENT = Mistake("exponent_4i_over_d", N_("exponent 4i/D_r: `torch.arange(0, D_r, 2)` "
    "already steps by 2 (its entries are 2i), so divide it by D_r without multiplying by 2 again"))
OUTER_ON_BATCH = Mistake("outer_on_batch_positions", N_("torch.outer takes two 1-D vectors, and "
    "positions may be [B, S]: `positions[..., None] * freqs` gives [..., S, D_r/2] for both"),
    raises=[("RuntimeError", r"(?i)outer|1D|1-D")])
SEQUENCE_AXIS = Mistake("positions_on_the_heads_axis", N_("x is heads-first, [B, N, S, D]: the "
    "positions run along dim 2, so angles [S, D_r/2] broadcast against x's last two axes as "
    "they are (no axis added between S and the pairs)"),
    raises=[("RuntimeError", _BROADCAST)])
FIXED_AXES = Mistake("assumed_four_axes", N_("x may have any number of leading axes, [..., "
    "D_r] (one token is [D_r]): index the last axis only, `x[..., 0::2]`, and keep `...` in "
    "shapes"), raises=[("IndexError", r"too many indices"), ("ValueError", r"values to unpack")])
NEW_AXIS_NOT_LAST = Mistake("new_axis_not_last", N_("positions[:, None] adds the new axis after "
    "the first one: positions [B, S] become [B, 1, S]; add it last, `positions[..., None] * "
    "freqs`"), raises=[("RuntimeError", _BROADCAST)])
PASS_FIRST = Mistake("pass_through_first", N_("put the pass-through features first: the output "
    "keeps x's feature order, the rotated first rotary_dim features, then the others"))
BOTH = N_("{first}; and {second}")  # two mistakes at once
WRONG_WAY_AND_PAIRING = Mistake("rotated_the_wrong_way_and_other_pairing", BOTH)
SWAPPED_AND_WRONG_WAY = Mistake("sin_cos_swapped_and_wrong_way", N_("{mistake} (and rotated the "
    "wrong way)"))
PERM_INVERSE = Mistake("inverse_permutation", N_("returned the inverse permutation (half -> "
    "interleaved): p lists, for each position of the half layout, the interleaved feature that "
    "goes there: the even features first, then the odd ones, [0, 2, 4, ..., 1, 3, 5, ...]"))
PERM_IDENTITY = Mistake("identity", N_("returned the identity: the two conventions pair "
    "different features, so the feature order must change: p = [0, 2, 4, ..., 1, 3, 5, ...]"))
PERM_ODD_FIRST = Mistake("odd_features_first", N_("odd features first: the first half of the "
    "half layout holds the first member of every pair, the even features 0, 2, 4, ...; then the "
    "odd ones"))
PERM_HALF_ONLY = Mistake("even_features_only", N_("p is a full permutation of all rotary_dim "
    "features: the even features, then the odd ones (rotary_dim entries)"))
PERM_DTYPE = Mistake("not_a_long_tensor", N_("return a LongTensor (int64), the dtype of index "
    "tensors: e.g. `torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])`"))


# --------------------------------------------------------------------------------------------
# Shared helpers


def _told(known: Mistake, template: str | None = None, **values) -> Mistake:
    """`known` (its key) told with `template` (default: its own message) filled with
    `values`, in the current language; {mistake} is its own message unless given."""
    values.setdefault("mistake", _(known))
    return known.with_text(_(template or known).format(**values))


def _headlines(c: Check, props: list) -> None:
    for prop in props:
        c.headline(prop)


def _expect_dtype(c: Check, got, want: torch.Tensor, *, what: str, hint: Mistake) -> None:
    """A dtype mismatch with the right shape fails with `hint` (expect_tensor does the rest)."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want}.").format(what=what, got=got.dtype,
                                                                     want=want.dtype), hint)


def _offset_positions(c: Check, s: int, *, low: int = 3, high: int = 60) -> torch.Tensor:
    """start_pos + arange(S), start_pos >= low: the positions of a later chunk."""
    return c.randint(low, high) + torch.arange(s)


def _batch_positions(c: Check, b: int, s: int, *, high: int = 60) -> torch.Tensor:
    """[B, S]: each row its own offset, one row with gaps (positions need not be contiguous)."""
    rows = [c.randint(2, high) + torch.arange(s) for _n in range(b)]
    gaps = torch.randint(1, 4, (s,), generator=c.gen).cumsum(0)
    rows[c.randint(0, b)] = c.randint(0, high) + gaps
    return torch.stack(rows)


# --------------------------------------------------------------------------------------------
# Float64 RoPE with one known mistake switched on (the variants a diagnosis compares with)


def _freqs64(d_r: int, base: float, *, exponent: float = 2.0, first: int = 0,
             linspace: bool = False) -> torch.Tensor:
    i = torch.arange(first, first + d_r // 2, dtype=torch.float64)
    if linspace:
        return base ** -torch.linspace(0, 1, d_r // 2, dtype=torch.float64)
    return base ** (-exponent * i / d_r)


def _rope64(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0,
            rotary_dim: int | None = None, interleaved: bool = True, exponent: float = 2.0,
            first: int = 0, freq_dim: int | None = None, shift: int | torch.Tensor = 0,
            ignore_positions: bool = False, first_row: bool = False, batch_on_heads: bool = False,
            direction: float = 1.0, swap: bool = False, minus: bool = True,
            rotate_last: bool = False, angle_dtype: torch.dtype | None = None,
            angle_cast: bool = False) -> torch.Tensor:
    """RoPE computed pair by pair in float64 (the article's formula), cast to x's dtype."""
    d = x.shape[-1]
    d_r = d if rotary_dim is None else rotary_dim
    half = d_r // 2
    freqs = base ** (-exponent * torch.arange(first, first + half, dtype=torch.float64)
                     / (freq_dim or d_r))
    pos = torch.arange(x.shape[-2]) if ignore_positions else positions
    pos = pos[0] if first_row and pos.dim() == 2 else pos
    pos = pos.to(torch.float64) + shift             # an int, or arange(S) added
    if angle_dtype is not None and angle_cast:      # float32 product, then angles cast down
        angles = (pos.float()[..., None] * freqs.float()).to(angle_dtype).double()
    elif angle_dtype is not None:                   # everything in the low dtype
        angles = (pos.to(angle_dtype)[..., None] * freqs.to(angle_dtype)).double()
    else:
        angles = pos[..., None] * freqs             # [S, half] or [B, S, half]
    if angles.dim() == 3:
        angles = angles[None] if batch_on_heads else angles[:, None]
    cos, sin = torch.cos(angles), torch.sin(angles)
    cos, sin = (sin, cos) if swap else (cos, sin)
    sin = sin * direction
    start = d - d_r if rotate_last else 0
    i = torch.arange(half)
    a, b = (start + 2 * i, start + 2 * i + 1) if interleaved else (start + i, start + half + i)
    x64 = x.detach().to(torch.float64)
    out, xa, xb = x64.clone(), x64[..., a], x64[..., b]
    out[..., a] = xa * cos - xb * sin if minus else xa * cos + xb * sin
    out[..., b] = xa * sin + xb * cos
    return out.to(x.dtype)


def _rope_tolerance(x: torch.Tensor, positions: torch.Tensor) -> tuple[float, float]:
    """The dtype's, widened for fp16/bf16 (a few roundings) and long positions: float32 angles
    m * theta carry a relative error of a few 1e-7, so the output's grows with m and |x|."""
    scale = max(float(x.detach().abs().max()), 1e-3)
    atol, rtol = tolerance(x.dtype)
    if x.dtype == torch.float16:
        atol = 2 ** -7 * scale
    elif x.dtype == torch.bfloat16:
        atol = 2 ** -5 * scale
    atol = max(atol, 5e-7 * (float(positions.abs().max()) + 1) * scale)
    return atol, rtol


# --------------------------------------------------------------------------------------------
# rope_frequencies


def _freq_mixups(d_r: int, base: float) -> dict:
    half = d_r // 2
    mixups = {
        EXPONENT_I: lambda: _freqs64(d_r, base, exponent=1.0).float(),
        INDEX_FROM_1: lambda: _freqs64(d_r, base, first=1).float(),
        LINSPACE: lambda: _freqs64(d_r, base, linspace=True).float(),
        POSITIVE_EXPONENT: lambda: _freqs64(d_r, base, exponent=-2.0).float(),
        INT_DIVISION: lambda: torch.ones(half),
        _told(PER_FEATURE, N_("{mistake} (base ** (-j / D_r) for every feature j)")):
            lambda: (base ** (-torch.arange(d_r, dtype=torch.float64) / d_r)).float(),
        _told(PER_FEATURE, N_("{mistake} (each frequency repeated for both features of its "
                              "pair)")): lambda: _freqs64(d_r, base).float().repeat_interleave(2),
        _told(PER_FEATURE, N_("{mistake} (the frequencies concatenated twice, as Hugging Face's "
                              "cos/sin cache does later)")):
            lambda: _freqs64(d_r, base).float().repeat(2),
        DOUBLED_EXPONENT: lambda: _freqs64(d_r, base, exponent=4.0).float(),
    }
    if base != 10000.0:
        mixups[IGNORED_BASE] = lambda: _freqs64(d_r, 10000.0).float()
    return mixups


def check_rope_frequencies(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("rope_frequencies", f, seed=seed) as c:
        cases = [(128, None), (8, None)]                   # the article's D_h = 128; 4 pairs
        for _n in range(4 if thorough else 2):
            cases.append((2 * c.randint(3, 17), None))
        cases.append((2 * c.randint(3, 33), c.choice([500000.0, 1e6, 2000.0])))
        cases.append((64, 500000.0))                       # LLaMA-3's base
        cases.append((2, None))                            # a single pair: theta_0 = 1
        for d_r, base in cases:
            want = ref.rope_frequencies(d_r, 10000.0 if base is None else base)
            got = c.call(d_r) if base is None else c.call(d_r, base=base)
            what = (f"rope_frequencies({d_r})" if base is None
                    else f"rope_frequencies({d_r}, base={base:g})")
            _expect_dtype(c, got, want, what=what, hint=FLOAT_DTYPE)
            c.expect_tensor(got, want, what=what, dims=("pair",),
                            wrong=_freq_mixups(d_r, 10000.0 if base is None else base))
        _headlines(c, ["theta_i = base ** (-2i / D_r)", _("D_r // 2 pairs, float32"),
                       _("the base argument"), _("the article's D_r = 128")])


# --------------------------------------------------------------------------------------------
# rope_angles


def _angle_mixups(positions: torch.Tensor, freqs: torch.Tensor) -> dict:
    pos = positions.to(torch.float64)
    f64 = freqs.to(torch.float64)
    s = positions.shape[-1]

    def out(t):
        return t.to(torch.float32)

    mixups = {
        POSITIONS_IGNORED: lambda: out(torch.arange(s, dtype=torch.float64)[:, None] * f64),
        _told(POSITIONS_IGNORED, N_("{mistake} (for every sequence)")): lambda: out(
            (torch.arange(s, dtype=torch.float64)[:, None] * f64).expand(*pos.shape, -1)),
        POSITIONS_FROM_1: lambda: out((pos + 1)[..., None] * f64),
        ADDED_ARANGE: lambda: out((pos + torch.arange(s))[..., None] * f64),
        DIVIDED: lambda: out(pos[..., None] / f64),
        TRANSPOSED: lambda: out(f64[:, None] * pos[..., None, :]),
        _told(PER_FEATURE_ANGLE, N_("{mistake} (repeat_interleave)")): lambda: out(
            (pos[..., None] * f64).repeat_interleave(2, dim=-1)),
        _told(PER_FEATURE_ANGLE, N_("{mistake} (concatenated twice)")): lambda: out(
            torch.cat([pos[..., None] * f64] * 2, dim=-1)),
    }
    if positions.dim() == 2:
        mixups[BATCH_LOST] = lambda: out(pos[0][:, None] * f64)
        mixups[BATCH_FLAT] = lambda: out(pos.reshape(-1)[:, None] * f64)
    return mixups


def check_rope_angles(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("rope_angles", f, seed=seed, errors=[OUTER_ON_BATCH, NEW_AXIS_NOT_LAST]) as c:
        cases = []
        for trial in range(3 if thorough else 1):
            b, s, half = c.sizes(3, 2, 9)
            freqs = ref.rope_frequencies(2 * half, c.choice([10000.0, 500000.0]))
            cases.append((_("positions start_pos + arange(S) [S={s}]").format(s=s),
                          _offset_positions(c, s), freqs))
            cases.append((_("positions [B={b}, S={s}], one row per sequence").format(b=b, s=s),
                          _batch_positions(c, b, s), freqs))
        s, half = c.sizes(2, 3, 9)
        gaps = torch.sort(torch.randperm(60, generator=c.gen)[:s]).values
        cases.append((_("non-contiguous positions {positions}").format(positions=gaps.tolist()),
                      gaps,
                       c.randn(half).abs() + 0.05))
        m = c.randint(5, 300)
        cases.append((_("one decode step at position {m}").format(m=m), torch.tensor([m]),
                      ref.rope_frequencies(2 * c.randint(2, 9))))
        cases.append((_("the article's D_r = 128 at positions 0, 1, 2, 4095"),
                      torch.tensor([0, 1, 2, 4095]), ref.rope_frequencies(128)))
        for label, positions, freqs in cases:
            want = ref.rope_angles(positions, freqs)
            got = c.call(positions.clone(), freqs.clone())
            dims = ("B", "S", "pair") if positions.dim() == 2 else ("S", "pair")
            what = _("rope_angles for {case} and {count} frequencies").format(
                case=label, count=freqs.numel())
            _expect_dtype(c, got, want, what=what, hint=ANGLES_DTYPE)
            c.expect_tensor(got, want, what=what, dims=dims,
                            wrong=_angle_mixups(positions, freqs))
        _headlines(c, [_("angle m * theta_i"), _("positions [S] and [B, S]"),
                       _("offset and decode positions"), "float32"])


# --------------------------------------------------------------------------------------------
# rotation_matrix


def _rotation64(alpha: float, *, clockwise: bool = False, swap: bool = False,
                minus: bool = True) -> torch.Tensor:
    c, s = math.cos(alpha), math.sin(alpha)
    if swap:
        c, s = s, c
    m = [[c, -s], [s, c]] if minus else [[c, s], [s, c]]
    t = torch.tensor(m, dtype=torch.float64)
    return (t.T if clockwise else t).float()


def _rotation_mixups(alpha: float) -> dict:
    return {
        ROT_CLOCKWISE: lambda: _rotation64(alpha, clockwise=True),
        ROT_SWAPPED: lambda: _rotation64(alpha, swap=True),
        _told(ROT_SWAPPED, N_("{mistake} (and clockwise)")):
            lambda: _rotation64(alpha, swap=True, clockwise=True),
        ROT_NO_MINUS: lambda: _rotation64(alpha, minus=False),
        ROT_DEGREES: lambda: _rotation64(math.radians(alpha)),
        ROT_SHAPE: lambda: _rotation64(alpha).reshape(4),
        _told(ROT_SHAPE, N_("{mistake} (not [1, 2, 2])")):
            lambda: _rotation64(alpha)[None],
    }


def check_rotation_matrix(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("rotation_matrix", f, seed=seed) as c:
        alphas = [math.pi / 2, 0.3]
        for _n in range(5 if thorough else 2):
            alphas.append(float(torch.empty(()).uniform_(-7.0, 7.0, generator=c.gen)))
        alphas.append(-1.2)
        got_by_alpha = {}
        for k, alpha in enumerate(alphas):
            want = ref.rotation_matrix(alpha)
            as_tensor = k % 2 == 1                     # Python floats and 0-dim tensors
            arg = torch.tensor(alpha, dtype=torch.float32) if as_tensor else alpha
            shown = f"torch.tensor({alpha:.4g})" if as_tensor else f"{alpha:.4g}"
            got = c.call(arg)
            what = f"rotation_matrix({shown})"
            _expect_dtype(c, got, want, what=what, hint=ROT_DTYPE)
            c.expect_tensor(got, want, what=what, dims=("row", "col"),
                            wrong=_rotation_mixups(alpha))
            got_by_alpha[alpha] = got.detach().double()
        # R(pi/2) turns the x-axis into the y-axis (counter-clockwise), and the article's
        # identity R(a)^T R(b) = R(b - a) holds for the learner's matrices.
        e0 = got_by_alpha[math.pi / 2] @ torch.tensor([1.0, 0.0], dtype=torch.float64)
        if not torch.allclose(e0, torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-6):
            c.fail(_("R(pi/2) @ (1, 0) is {got}, expected (0, 1).").format(got=e0.tolist()),
                   ROT_CLOCKWISE)
        a, b = alphas[2], alphas[3]
        rel = c.call(b - a)
        c.expect_tensor(rel, ref.rotation_matrix(b - a), what=f"rotation_matrix({b - a:.4g})",
                        dims=("row", "col"), wrong=_rotation_mixups(b - a))
        rel = rel.detach().double()
        if not torch.allclose(got_by_alpha[a].T @ got_by_alpha[b], rel, atol=1e-5):
            c.fail(_("R({a})^T R({b}) differs from R({difference}).").format(
                a=f"{a:.4g}", b=f"{b:.4g}", difference=f"{b - a:.4g}"))
        _headlines(c, ["[[cos, -sin], [sin, cos]]", _("counter-clockwise"),
                       "R(a)^T R(b) = R(b - a)", _("float and tensor angles")])


# --------------------------------------------------------------------------------------------
# rotate_pairs


def _pairs64(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_a, x_b) of every pair, float64, [..., D_r/2] each."""
    x64 = x.detach().to(torch.float64)
    half = x.shape[-1] // 2
    return (x64[..., 0::2], x64[..., 1::2]) if interleaved else (x64[..., :half], x64[..., half:])


def _join64(a: torch.Tensor, b: torch.Tensor, interleaved: bool) -> torch.Tensor:
    return torch.stack([a, b], dim=-1).flatten(-2) if interleaved else torch.cat([a, b], dim=-1)


def _rotate64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = True,
              write_interleaved: bool | None = None, direction: float = 1.0, swap: bool = False,
              minus_a: bool = True, minus_b: bool = False) -> torch.Tensor:
    """The pair formula in float64 with one known mistake switched on, in x's dtype."""
    c, s = cos.to(torch.float64), sin.to(torch.float64) * direction
    if swap:
        c, s = s, c
    a, b = _pairs64(x, interleaved)
    a2 = a * c - b * s if minus_a else a * c + b * s
    b2 = -a * s + b * c if minus_b else a * s + b * c
    back = interleaved if write_interleaved is None else write_interleaved
    return _join64(a2, b2, back).to(x.dtype)


def _spread64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
              interleaved: bool) -> torch.Tensor:
    """x * cos + rotate(x) * sin with cos and sin spread over the features the other pairing's
    way (repeat_interleave for half pairs, cat for interleaved ones), in x's dtype."""
    half = x.shape[-1] // 2
    j = torch.arange(2 * half)
    index = j % half if interleaved else j // 2                   # the wrong pair for feature j
    c, s = cos.to(torch.float64)[..., index], sin.to(torch.float64)[..., index]
    a, b = _pairs64(x, interleaved)
    turned = _join64(-b, a, interleaved)                          # (x_a, x_b) -> (-x_b, x_a)
    return (x.detach().to(torch.float64) * c + turned * s).to(x.dtype)


def _rotate_mixups(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   interleaved: bool) -> dict:
    def v(**changes):
        return lambda: _rotate64(x, cos, sin, **{"interleaved": interleaved, **changes})

    want = ref.rotate_pairs(x, cos, sin, interleaved)
    half = x.shape[-1] // 2
    other = OTHER_PAIRING_HALF if interleaved else OTHER_PAIRING_INTERLEAVED
    return {
        other: v(interleaved=not interleaved),
        LAYOUT_BACK: v(write_interleaved=not interleaved),
        _told(LAYOUT_BACK, N_("{mistake} (and read the pairs the other way as well)")):
            v(interleaved=not interleaved, write_interleaved=interleaved),
        WRONG_WAY: v(direction=-1.0),
        _told(WRONG_WAY_AND_PAIRING, first=_(WRONG_WAY), second=_(other)):
            v(direction=-1.0, interleaved=not interleaved),
        SIN_COS_SWAPPED: v(swap=True),
        _told(SWAPPED_AND_WRONG_WAY, mistake=_(SIN_COS_SWAPPED)): v(swap=True, direction=-1.0),
        NO_MINUS: v(minus_a=False),
        MINUS_TWICE: v(minus_b=True),
        (SPREAD_INTERLEAVED if interleaved else SPREAD_HALF):
            lambda: _spread64(x, cos, sin, interleaved=interleaved),
        COS_OF_COS: lambda: _rotate64(x, torch.cos(cos.double()), torch.sin(sin.double()),
                                      interleaved=interleaved),
        ROTATE_RETURNED_X: x,
        _told(NOT_FLATTENED, _YOU_RETURNED, shape="[..., D_r/2, 2]"): lambda: _join64(
            *_pairs64(want, interleaved), True).unflatten(-1, (half, 2)).to(x.dtype),
        _told(NOT_FLATTENED, _YOU_RETURNED, shape="[..., 2, D_r/2]"): lambda: _join64(
            *_pairs64(want, interleaved), False).unflatten(-1, (2, half)).to(x.dtype),
        _told(HALF_RETURNED, N_("{mistake} (you returned only the new x_a)")):
            lambda: _pairs64(want, interleaved)[0].to(x.dtype),
    }


def _angles_for(c: Check, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of random angles in [-4, 4] radians (every quadrant), float32."""
    angles = (torch.rand(*shape, generator=c.gen, dtype=torch.float64) * 8 - 4).float()
    return torch.cos(angles), torch.sin(angles)


def _expect_rotated(c: Check, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                    interleaved: bool | None, label: str) -> torch.Tensor:
    """Call rotate_pairs (without `interleaved` when None: the default), then compare."""
    pairing = True if interleaved is None else interleaved
    kwargs = {} if interleaved is None else {"interleaved": interleaved}
    got = c.call(x, cos, sin, **kwargs)  # the engine names an input changed in place
    want = ref.rotate_pairs(x, cos, sin, pairing)
    shown = [f"x {describe(x)}",
             _("cos and sin {value}").format(value=describe(cos))] + [
        f"{k}={v}" for k, v in kwargs.items()]
    what = _("rotate_pairs for {case} ({inputs})").format(case=label, inputs=", ".join(shown))
    _expect_dtype(c, got, want, what=what, hint=ROTATE_DTYPE)
    try:
        dims = {1: ("feature",), 2: ("S", "feature"), 4: ("B", "N", "S", "feature")}
        c.expect_tensor(got, want, what=what, dims=dims.get(x.dim()),
                        wrong=_rotate_mixups(x, cos, sin, pairing))
    except CheckFailure as failure:
        if failure.hint is not None:
            raise
        raise CheckFailure(failure.exercise, failure.message, hint=_norm_hint(x, got),
                           seed=failure.seed) from None
    return got


def check_rotate_pairs(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("rotate_pairs", f, seed=seed,
               errors=[VIEW_NOT_CONTIGUOUS, FIXED_AXES, ANGLES_AS_GIVEN],
               in_place=ROTATE_IN_PLACE) as c:
        for _n in range(3 if thorough else 1):
            b, n, s = c.sizes(3, 2, 8)
            d_r = 2 * c.randint(3, 9)
            # angles [S, D_r/2] (positions shared by the batch), both pairings and the default
            for interleaved in (None, True, False):
                cos, sin = _angles_for(c, s, d_r // 2)
                _expect_rotated(c, c.randn(b, n, s, d_r), cos, sin, interleaved=interleaved,
                                label=_("x [B, N, S, D_r] with cos, sin [S, D_r/2]"))
            # angles [B, 1, S, D_r/2] (positions per sequence, shared by the heads)
            for interleaved in ((True, False) if thorough else (c.choice([True, False]),)):
                cos, sin = _angles_for(c, b, 1, s, d_r // 2)
                _expect_rotated(c, c.randn(b, n, s, d_r), cos, sin, interleaved=interleaved,
                                label=_("x [B, N, S, D_r] with cos, sin [B, 1, S, D_r/2]"))
        # a quarter turn of every pair: (1, 0) becomes (0, 1), wherever the pair's features are.
        for interleaved in (True, False):
            x = torch.tensor([1.0, 0.0, 1.0, 0.0]) if interleaved else \
                torch.tensor([1.0, 1.0, 0.0, 0.0])
            _expect_rotated(c, x, torch.zeros(2), torch.ones(2), interleaved=interleaved,
                            label=_("a quarter turn of the pairs (1, 0), one token, D_r = 4"))
        # any leading shape: tokens of a plain [S, D_r] matrix, one angle per token and pair
        s, half = c.sizes(2, 2, 9)
        cos, sin = _angles_for(c, s, half)
        _expect_rotated(c, c.randn(s, 2 * half), cos, sin, interleaved=c.choice([True, False]),
                        label="x [S, D_r]")
        # a single pair (both pairings coincide) and the article's head, D_r = 128
        cos, sin = _angles_for(c, 3, 1)
        _expect_rotated(c, c.randn(2, 3, 2), cos, sin, interleaved=None, label="D_r = 2")
        cos, sin = _angles_for(c, 4, 64)
        for interleaved in (True, False):
            _expect_rotated(c, c.randn(1, 2, 4, 128), cos, sin, interleaved=interleaved,
                            label=_("the article's D_h = 128, 64 pairs"))
        # heads-first tensors come out of a transpose: not contiguous
        b, n, s = c.sizes(3, 2, 8)
        cos, sin = _angles_for(c, s, 5)
        x = c.randn(b, s, n, 10).transpose(1, 2)
        _expect_rotated(c, x, cos, sin, interleaved=True, label=_("a non-contiguous x"))
        # float64 in, float64 out
        cos, sin = (t.double() for t in _angles_for(c, s, 3))
        _expect_rotated(c, c.randn(b, n, s, 6, dtype=torch.float64), cos, sin,
                        interleaved=c.choice([True, False]), label=_("float64 x, cos and sin"))
        # a rotation keeps every pair's length
        cos, sin = _angles_for(c, s, 8)
        x = c.randn(b, n, s, 16)
        got = _expect_rotated(c, x, cos, sin, interleaved=False, label=_("the length test"))
        pair_len = _pairs64(got, False)[0] ** 2 + _pairs64(got, False)[1] ** 2
        want_len = _pairs64(x, False)[0] ** 2 + _pairs64(x, False)[1] ** 2
        if not torch.allclose(pair_len, want_len, rtol=1e-5, atol=1e-6):
            c.fail(_("rotate_pairs changed the length of a pair; a rotation keeps it."),
                   NOT_A_ROTATION)
        _headlines(c, ["x'_a = x_a cos - x_b sin, x'_b = x_a sin + x_b cos",
                       _("both pairings, results back in place"), _("cos, sin broadcast"),
                       _("x's dtype and shape"), _("input untouched")])


# --------------------------------------------------------------------------------------------
# apply_rope


def _rope_mixups(x: torch.Tensor, positions: torch.Tensor, base: float, rotary_dim: int | None,
                 interleaved: bool) -> dict:
    d = x.shape[-1]
    d_r = d if rotary_dim is None else rotary_dim
    kw = dict(base=base, rotary_dim=d_r, interleaved=interleaved)

    def v(**changes):
        return lambda: _rope64(x, positions, **{**kw, **changes})

    mixups = {
        (OTHER_PAIRING_HALF if interleaved else OTHER_PAIRING_INTERLEAVED):
            v(interleaved=not interleaved),
        POSITIONS_IGNORED: v(ignore_positions=True),
        EXPONENT_I: v(exponent=1.0),
        INDEX_FROM_1: v(first=1),
        POSITIONS_FROM_1: v(shift=1),
        ADDED_ARANGE: v(shift=torch.arange(x.shape[-2])),
        WRONG_WAY: v(direction=-1.0),
        SIN_COS_SWAPPED: v(swap=True),
        _told(SWAPPED_AND_WRONG_WAY, mistake=_(SIN_COS_SWAPPED)): v(swap=True, direction=-1.0),
        NO_MINUS: v(minus=False),
        POSITIVE_EXPONENT: v(exponent=-2.0),
        RETURNED_X: x,
        (SPREAD_INTERLEAVED if interleaved else SPREAD_HALF): lambda: _rope_spread(
            x, positions, base, d_r, interleaved),
    }
    other = OTHER_PAIRING_HALF if interleaved else OTHER_PAIRING_INTERLEAVED
    mixups[_told(WRONG_WAY_AND_PAIRING, first=_(WRONG_WAY), second=_(other))] = v(
        direction=-1.0, interleaved=not interleaved)
    if base != 10000.0:
        mixups[IGNORED_BASE] = v(base=10000.0)
    if d_r < d:
        mixups[ALL_FEATURES] = v(rotary_dim=d)
        mixups[FREQ_FROM_HEAD] = v(freq_dim=d)
        mixups[ROTATED_LAST] = v(rotate_last=True)
        want = ref.apply_rope(x, positions, base=base, rotary_dim=d_r, interleaved=interleaved)
        mixups[PASS_ZEROED] = lambda: torch.cat([want[..., :d_r],
                                                 torch.zeros_like(want[..., d_r:])], dim=-1)
        mixups[PASS_DROPPED] = lambda: want[..., :d_r]
        mixups[PASS_FIRST] = lambda: torch.cat([want[..., d_r:], want[..., :d_r]], dim=-1)
    if positions.dim() == 2:
        mixups[BATCH_FIRST_ROW] = v(first_row=True)
        if x.shape[0] == x.shape[1]:
            mixups[BATCH_HEADS] = v(batch_on_heads=True)
    if x.dtype in (torch.float16, torch.bfloat16):
        name = str(x.dtype).removeprefix("torch.")
        hint = _told(LOW_PRECISION_ANGLES, dtype=name)
        mixups[hint] = v(angle_dtype=x.dtype)
        mixups[hint.with_text(_("{mistake} (yours formed them in float32, then cast them down)")
                              .format(mistake=hint))] = v(angle_dtype=x.dtype, angle_cast=True)
    return mixups


def _rope_spread(x, positions, base, d_r, interleaved) -> torch.Tensor:
    """RoPE with cos and sin spread over the features the other pairing's way."""
    angles = ref.rope_angles(positions, ref.rope_frequencies(d_r, base)).double()
    angles = angles[:, None] if angles.dim() == 3 else angles
    part = _spread64(x[..., :d_r], angles.cos(), angles.sin(), interleaved=interleaved)
    return torch.cat([part, x[..., d_r:]], dim=-1)


def _norm_hint(x: torch.Tensor, got: torch.Tensor) -> Mistake | None:
    """NOT_A_ROTATION when the learner's output changed the length of a token's vector."""
    if not isinstance(got, torch.Tensor) or got.shape != x.shape or not got.is_floating_point():
        return None
    n_in = x.detach().double().norm(dim=-1)
    n_out = got.detach().double().norm(dim=-1)
    atol, rtol = tolerance(x.dtype)
    slack = 4 * max(rtol, 2 ** -7 if x.dtype in (torch.float16, torch.bfloat16) else 0.0)
    if not torch.allclose(n_out, n_in, atol=10 * atol, rtol=slack):
        return NOT_A_ROTATION
    return None


def _expect_rope(c: Check, f_args: tuple, f_kwargs: dict, *, label: str,
                 fallback_hint: Mistake | None = None) -> torch.Tensor:
    """Call apply_rope, then compare with the reference: dtype, shape, values (an input changed
    in place the engine names). A broadcast that fails names the axis the angles missed."""
    x, positions = f_args
    c.errors = (VIEW_NOT_CONTIGUOUS, BATCH_HEADS if positions.dim() == 2 else SEQUENCE_AXIS)
    got = c.call(x, positions.clone(), **f_kwargs)
    base = f_kwargs.get("base", 10000.0)
    rotary_dim = f_kwargs.get("rotary_dim")
    interleaved = f_kwargs.get("interleaved", True)
    want = ref.apply_rope(x, positions, base=base, rotary_dim=rotary_dim, interleaved=interleaved)
    shown = [f"x {describe(x)} [B, N, S, D]", f"positions {describe(positions)}"]
    shown += [f"{k}={v}" for k, v in f_kwargs.items()]
    what = _("apply_rope for {case} ({inputs})").format(case=label, inputs=", ".join(shown))
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want} (x's dtype).").format(
            what=what, got=got.dtype, want=want.dtype), KEEP_DTYPE)
    atol, rtol = _rope_tolerance(x, positions)
    wrong = _rope_mixups(x, positions, base, rotary_dim, interleaved)
    try:
        c.expect_tensor(got, want, what=what, dims=HEADS_FIRST, wrong=wrong, atol=atol,
                        rtol=rtol)
    except CheckFailure as failure:
        if failure.hint is not None:
            raise
        hint = _norm_hint(x, got) or fallback_hint
        raise CheckFailure(failure.exercise, failure.message, hint=hint,
                           seed=failure.seed) from None
    return got


def _relative_position_property(c: Check, *, d: int, rotary_dim: int | None,
                                interleaved: bool) -> None:
    """q.k after RoPE depends on n - m only: the same offset at several absolute positions."""
    q, k = c.randn(1, 1, 1, d), c.randn(1, 1, 1, d)
    starts = torch.tensor([0, c.randint(1, 10), c.randint(10, 100), c.randint(100, 1000)])
    offset = c.choice([-1, 1]) * c.randint(1, 20)
    m = starts + 20
    n = m + offset
    kwargs = {"interleaved": interleaved}
    if rotary_dim is not None:
        kwargs["rotary_dim"] = rotary_dim
    q_rot = _expect_rope(c, (q.expand(1, 1, len(m), d).clone(), m), kwargs,
                         label=_("one query content at several positions m"))
    k_rot = _expect_rope(c, (k.expand(1, 1, len(n), d).clone(), n), kwargs,
                         label=_("one key content at the positions n = m + {offset}").format(
                             offset=offset))
    scores = (q_rot.detach().double() * k_rot.detach().double()).sum(-1).view(-1)
    # float32 angles m * theta carry an error of a few 1e-7 * m radians
    size = float(q.norm() * k.norm()) * (1e-4 + 1e-6 * float(n.abs().max()))
    if not torch.allclose(scores, scores[0].expand_as(scores), atol=size, rtol=0):
        pairs = ", ".join(f"(m={int(a)}, n={int(b)}): {float(s):.4f}"
                          for a, b, s in zip(m, n, scores))
        c.fail(_("the score q'.k' for fixed q and k changed with the absolute position "
                 "although n - m = {offset} stayed the same: {scores}.").format(
                     offset=offset, scores=pairs),
               RELATIVE)


# The earlier exercises apply_rope is built on, in the chapter's order: a broken one that the
# learner's apply_rope calls is named ("fix rope_angles first").
_ROPE_PIECES = {"rope_frequencies": check_rope_frequencies, "rope_angles": check_rope_angles,
                "rotate_pairs": check_rotate_pairs}


def check_apply_rope(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with builds_on("apply_rope", _ROPE_PIECES), \
            Check("apply_rope", f, seed=seed, in_place=IN_PLACE) as c:
        trials = 3 if thorough else 1
        for _n in range(trials):
            b, n, s = c.sizes(3, 2, 8)
            d = 2 * c.randint(4, 9)
            # start_pos + arange(S): the positions of a later chunk, shared by the batch
            for interleaved in (True, False):
                x = c.randn(b, n, s, d)
                kwargs = {} if interleaved else {"interleaved": False}
                _expect_rope(c, (x, _offset_positions(c, s)), kwargs,
                             label=_("positions start_pos + arange(S)"))
            # one row of positions per sequence (left padding, packed sequences)
            for interleaved in ((True, False) if thorough else (c.choice([True, False]),)):
                x = c.randn(b, n, s, d)
                _expect_rope(c, (x, _batch_positions(c, b, s)), {"interleaved": interleaved},
                             label=_("positions [B, S], one row per sequence"))
            # partial rotation: only the first rotary_dim features turn
            d = 2 * c.randint(5, 9)
            d_r = 2 * c.randint(1, d // 2)
            if 2 * d_r == d:      # then base ** (-2i / D) == base ** (-i / D_r): two mistakes agree
                d_r -= 2
            for interleaved in (True, False):
                x = c.randn(b, n, s, d)
                _expect_rope(c, (x, _offset_positions(c, s)),
                             {"rotary_dim": d_r, "interleaved": interleaved},
                             label=_("rotary_dim {d_r} < D {d}").format(d_r=d_r, d=d))
        # a different base (LLaMA-3 uses 500000)
        b, n, s = c.sizes(3, 2, 8)
        x = c.randn(b, n, s, 8)
        base = c.choice([100.0, 500000.0, 1e6])
        _expect_rope(c, (x, _offset_positions(c, s)), {"base": base},
                     label=_("base {base}").format(base=f"{base:g}"))
        # a decode step: one new token at position start_pos
        x = c.randn(b, n, 1, 10)
        _expect_rope(c, (x, torch.tensor([c.randint(5, 300)])), {},
                     label=_("one decode step (S = 1)"))
        # heads-first tensors usually come out of a transpose: not contiguous
        x = c.randn(b, s, n, 12).transpose(1, 2)
        _expect_rope(c, (x, _offset_positions(c, s)), {},
                     label=_("a non-contiguous x (a transposed view)"))
        # B == N: angles [B, S, D_r/2] without a head axis broadcast silently (and wrongly)
        x = c.randn(3, 3, 5, 8)
        _expect_rope(c, (x, _batch_positions(c, 3, 5)), {},
                     label=_("positions [B, S] with B == N"))
        # the article's head: D_h = 128, 64 pairs
        x = c.randn(1, 2, 4, 128)
        _expect_rope(c, (x, torch.tensor([3, 8, 13, 18])), {},
                     label=_("the article's D_h = 128 at positions 3, 8, 13, 18"))
        # half precision at long positions: the angles must be float32
        for dtype in ((torch.bfloat16, torch.float16) if thorough
                      else (c.choice([torch.bfloat16, torch.float16]),)):
            name = str(dtype).removeprefix("torch.")
            x = c.randn(b, n, s, 16, dtype=dtype)
            _expect_rope(c, (x, _offset_positions(c, s, low=2000, high=4000)),
                         {"rotary_dim": 12},
                         label=_("{dtype} x at positions past 2000").format(dtype=name),
                         fallback_hint=_told(LOW_PRECISION_ANGLES, dtype=name))
        # invariants, on the learner's own function
        x = c.randn(b, n, s, 16)
        got = _expect_rope(c, (x, _offset_positions(c, s)), {},
                           label=_("the norm test")).detach().double()
        if not torch.allclose(got.norm(dim=-1), x.double().norm(dim=-1), rtol=1e-5, atol=1e-6):
            c.fail(_("apply_rope changed the length of a token's vector; a rotation keeps it."),
                   NOT_A_ROTATION)
        for interleaved, rotary_dim in ((True, None), (False, None), (True, 8)):
            _relative_position_property(c, d=16, rotary_dim=rotary_dim, interleaved=interleaved)
        _headlines(c, [_("both pairings"), _("offset and [B, S] positions"),
                       "rotary_dim < D", _("x's dtype kept"), _("norms preserved"),
                       _("q.k depends only on n - m")])


# --------------------------------------------------------------------------------------------
# interleaved_to_half_permutation


def _perm_mixups(d_r: int, want: torch.Tensor) -> dict:
    return {
        PERM_INVERSE: lambda: torch.argsort(want),
        PERM_IDENTITY: lambda: torch.arange(d_r),
        PERM_ODD_FIRST: lambda: torch.cat([torch.arange(1, d_r, 2), torch.arange(0, d_r, 2)]),
        _told(PERM_HALF_ONLY, N_("{mistake} (you returned only the even features)")):
            lambda: torch.arange(0, d_r, 2),
    }


def check_interleaved_to_half_permutation(f, *, seed: int | None = None,
                                          thorough: bool = False) -> None:
    with builds_on("interleaved_to_half_permutation", {"apply_rope": check_apply_rope}), \
            Check("interleaved_to_half_permutation", f, seed=seed) as c:
        sizes = [8, 128] + [2 * c.randint(3, 20) for _n in range(4 if thorough else 2)] + [2, 6]
        for d_r in sizes:
            want = ref.interleaved_to_half_permutation(d_r)
            got = c.call(d_r)
            what = f"interleaved_to_half_permutation({d_r})"
            if isinstance(got, (list, tuple)):
                c.fail(_("{what} should be a torch.Tensor, got a {kind}.").format(
                    what=what, kind=type(got).__name__), PERM_DTYPE)
            _expect_dtype(c, got, want, what=what, hint=PERM_DTYPE)
            c.expect_tensor(got, want, what=what, dims=("feature",),
                            wrong=_perm_mixups(d_r, want))
        # The defining identity, with the reference's apply_rope (this exercise does not depend
        # on yours): rotating then reordering equals reordering then rotating the other way.
        b, n, s = c.sizes(3, 2, 7)
        d_r = 2 * c.randint(4, 12)
        p = c.call(d_r)
        c.expect_tensor(p, ref.interleaved_to_half_permutation(d_r),
                        what=f"interleaved_to_half_permutation({d_r})", dims=("feature",),
                        wrong=_perm_mixups(d_r, ref.interleaved_to_half_permutation(d_r)))
        x = c.randn(b, n, s, d_r)
        pos = _offset_positions(c, s)
        lhs = ref.apply_rope(x, pos, interleaved=True)[..., p]
        rhs = ref.apply_rope(x[..., p], pos, interleaved=False)
        if not torch.allclose(lhs, rhs, atol=1e-5, rtol=1e-4):
            c.fail(_("apply_rope(x, pos, interleaved=True)[..., p] differs from "
                     "apply_rope(x[..., p], pos, interleaved=False) for rotary_dim {d_r}.")
                   .format(d_r=d_r))
        _headlines(c, ["[0, 2, 4, ..., 1, 3, 5, ...]", "LongTensor",
                       _("rotate-then-permute == permute-then-rotate")])


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "08.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "rope_frequencies": (
        DOUBLED_EXPONENT, EXPONENT_I, IGNORED_BASE, INT_DIVISION, LINSPACE, FLOAT_DTYPE,
        PER_FEATURE, INDEX_FROM_1, POSITIVE_EXPONENT),
    "rope_angles": (
        ADDED_ARANGE, DIVIDED, BATCH_LOST, BATCH_FLAT, NEW_AXIS_NOT_LAST, ANGLES_DTYPE,
        PER_FEATURE_ANGLE, OUTER_ON_BATCH, POSITIONS_FROM_1, POSITIONS_IGNORED, TRANSPOSED),
    "rotation_matrix": (
        ROT_CLOCKWISE, ROT_DEGREES, ROT_NO_MINUS, ROT_SHAPE, ROT_DTYPE, ROT_SWAPPED),
    "rotate_pairs": (
        FIXED_AXES, COS_OF_COS, OTHER_PAIRING_HALF, OTHER_PAIRING_INTERLEAVED, NO_MINUS,
        MINUS_TWICE, NOT_FLATTENED, ANGLES_AS_GIVEN, HALF_RETURNED, ROTATE_RETURNED_X, WRONG_WAY,
        SIN_COS_SWAPPED, SPREAD_INTERLEAVED, VIEW_NOT_CONTIGUOUS, LAYOUT_BACK, ROTATE_IN_PLACE,
        SWAPPED_AND_WRONG_WAY, WRONG_WAY_AND_PAIRING, SPREAD_HALF, NOT_A_ROTATION, ROTATE_DTYPE),
    "apply_rope": (
        ADDED_ARANGE, KEEP_DTYPE, EXPONENT_I, BATCH_FIRST_ROW, fix_first('rope_angles'),
        fix_first('rope_frequencies'), fix_first('rotate_pairs'), FREQ_FROM_HEAD,
        OTHER_PAIRING_HALF, IGNORED_BASE, ALL_FEATURES, OTHER_PAIRING_INTERLEAVED,
        LOW_PRECISION_ANGLES, NO_MINUS, BATCH_HEADS, INDEX_FROM_1, PASS_DROPPED, PASS_FIRST,
        PASS_ZEROED, POSITIONS_FROM_1, POSITIONS_IGNORED, SEQUENCE_AXIS, RETURNED_X, ROTATED_LAST,
        WRONG_WAY, IN_PLACE, SIN_COS_SWAPPED, SPREAD_INTERLEAVED, VIEW_NOT_CONTIGUOUS,
        SWAPPED_AND_WRONG_WAY, WRONG_WAY_AND_PAIRING, SPREAD_HALF, NOT_A_ROTATION),
    "interleaved_to_half_permutation": (
        PERM_HALF_ONLY, fix_first('apply_rope'), PERM_IDENTITY, PERM_INVERSE, PERM_DTYPE,
        PERM_ODD_FIRST),
}
