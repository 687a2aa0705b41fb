"""Checks for chapter 07: position information (permutation equivariance, sinusoidal positions)."""

from __future__ import annotations

import math
import numbers

import torch

from .. import reference as ref
from ..engine import Check, builds_on, describe, numbers_apart
from ..i18n import N_, _
from ..mistakes import Mistake, fix_first

# --------------------------------------------------------------------------------------------
# The mistakes this chapter diagnoses

# permute_tokens
_AXIS_RULE = N_("perm reorders the sequence axis (dim 1) of [B, S, H]: "
                "out[:, i] = x[:, perm[i]], i.e. `x[:, perm]`")
AXIS_ERROR = Mistake("indexed_wrong_axis", _AXIS_RULE,
                     raises=[("*", r"(?i)index|out of bounds")])
INVERSE = Mistake("inverse_permutation", N_(
    "applied the inverse permutation: new position i holds the token that was at position "
    "perm[i] (gather, `x[:, perm]`), not the token sent to perm[i] (scatter, "
    "`x[:, argsort(perm)]`)"))
BATCH_AXIS = Mistake("permuted_batch_axis", N_("permuted the batch axis (dim 0); {rule}"))
FEATURE_AXIS = Mistake("permuted_feature_axis", N_("permuted the feature axis (dim 2); {rule}"))
UNCHANGED = Mistake("returned_x_unchanged", N_("returned x unchanged; {rule}"))
PERMUTED_AXES = Mistake("reordered_axes", N_(
    "`Tensor.permute` reorders the axes of a tensor, not the tokens: index the sequence axis "
    "with the permutation, `x[:, perm]`"),
    raises=[("RuntimeError", r"desired ordering of dimensions"),
            ("TypeError", r"permute\(\)")])
X_IN_PLACE = Mistake("modified_x_in_place", N_(
    "return a new tensor (`x[:, perm]` makes one) and leave x as it was"))

# permutation_matrix
MATRIX_NOT_FLOAT = Mistake("not_float32", N_(
    "the matrix multiplies float hidden states, so make it float32 (`F.one_hot` gives int64: "
    "add `.float()`)"))
MATRIX_TRANSPOSED = Mistake("transposed", N_(
    "transposed: row i needs its single 1 in column perm[i], so that (P @ x)[i] = x[perm[i]]"))
MATRIX_IDENTITY = Mistake("ignores_perm", N_("ignores perm: returned the identity matrix"))

# equivariance_error
RETURNED_TENSOR = Mistake("returned_tensor", N_(
    "returned a tensor: turn the result into a Python float with `.item()` or `float(...)`"))
RETURNED_INT = Mistake("returned_int", N_(
    "returned an int: `int(...)` rounds the error down to a whole number; return "
    "`float(...)` or `.item()`"))
UNPERMUTED = Mistake("compared_without_permuting", N_(
    "compared fn(PX) with fn(X) without permuting fn(X): the identity to test is fn(PX) = P "
    "fn(X)"))
INVERSE_ONE_SIDE = Mistake("inverse_permutation", N_(
    "permuted fn(X) with the inverse permutation: use the same P on both sides, fn(PX) - P "
    "fn(X)"))
TOOK_MEAN = Mistake("took_mean", N_(
    "took the mean: the error is the largest absolute entry (`.abs().max()`)"))
TOOK_NORM = Mistake("took_norm", N_(
    "took the norm of the whole difference: the error is its largest absolute entry "
    "(`.abs().max()`)"))
NO_ABS = Mistake("missing_abs", N_(
    "forgot the absolute value: the largest |entry|, not the largest signed entry"))
NO_ABS_REVERSED = Mistake("missing_abs", N_(
    "forgot the absolute value: the largest |entry|, not the largest signed entry of P fn(X) - "
    "fn(PX)"))

# sinusoidal_positions
TABLE_NOT_FLOAT32 = Mistake("not_float32", N_(
    "return float32, torch's default float type (compute in float64 if you like, then "
    "`.float()`)"))
SIN_COS_SWAPPED = Mistake("sin_cos_swapped", N_(
    "sin and cos swapped: even features (2i) take sin, odd features (2i+1) take cos"))
HALVES = Mistake("sin_cos_in_halves", N_(
    "sin and cos concatenated in two halves: they are interleaved, sin on feature 2i and cos "
    "on feature 2i+1"))
PAIR_EXPONENT = Mistake("exponent_i_over_h", N_(
    "exponent i/H with i the pair index: the exponent is 2i/H (pair i covers features 2i and "
    "2i+1)"))
OWN_EXPONENT = Mistake("odd_feature_own_exponent", N_(
    "feature 2i+1 used its own exponent (2i+1)/H: the sin and cos of pair i share "
    "10000^(2i/H)"))
BASE_1000 = Mistake("base_1000", N_("base 1000: the original Transformer uses 10000"))
FROM_ONE = Mistake("positions_start_at_1", N_(
    "positions start at 1: the first token is position 0 (row 0 is [0, 1, 0, 1, ...])"))
PAIRS_FROM_ONE = Mistake("pair_index_from_1", N_(
    "pair indices start at 1: the first pair (features 0 and 1) is i = 0, with frequency "
    "10000^0 = 1, so feature 0 of row p is sin(p)"))
MULTIPLIED = Mistake("multiplied_by_power", N_(
    "multiplied by 10000^(2i/H): divide the position by it (the frequencies shrink along the "
    "features)"))
TABLE_TRANSPOSED = Mistake("transposed", N_(
    "transposed: rows are positions, columns are features ([S, H])"))

# --------------------------------------------------------------------------------------------
# Shared helpers


def _perm(c: Check, s: int) -> torch.Tensor:
    """A random permutation of range(s) that is not its own inverse (when s >= 3).

    A permutation that undoes itself would make the inverse-permutation mistake invisible.
    """
    identity = torch.arange(s)
    for _n in range(100):
        perm = torch.randperm(s, generator=c.gen)
        if s < 3 or not torch.equal(perm[perm], identity):
            return perm
    return torch.roll(identity, -1)  # a cycle through every position


def _cycle(c: Check, s: int) -> torch.Tensor:
    """A random permutation that is one cycle through all s positions.

    For s >= 4, P X - X and P X - P^-1 X then compare different pairs of tokens, so the two
    mistakes that produce them give different answers.
    """
    order = torch.randperm(s, generator=c.gen)
    perm = torch.empty(s, dtype=torch.long)
    perm[order] = torch.roll(order, -1)
    return perm


def _expect_float(c: Check, got, want: float, *, what: str, wrong: dict,
                  atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """A Python float within tolerance of `want`; a mismatch is compared with the variants."""
    if isinstance(got, torch.Tensor):
        c.fail(_("{what} should be a Python float, got a torch.Tensor ({kind}).").format(
            what=what, kind=describe(got)), hint=RETURNED_TENSOR)
    if not isinstance(got, numbers.Real) or isinstance(got, (bool, numbers.Integral)):
        c.fail(_("{what} should be a Python float, got {kind} {value}.").format(
            what=what, kind=type(got).__name__, value=describe(got)),
            hint=RETURNED_INT if isinstance(got, numbers.Integral) and
            not isinstance(got, bool) else None)
    got = float(got)

    def close(a: float, b: float) -> bool:
        return math.isfinite(a) and abs(a - b) <= atol + rtol * abs(b)

    if close(got, want):
        return
    hint = None
    for mistake, variant in wrong.items():
        try:
            value = float(variant())
        except Exception:  # noqa: BLE001 - a variant that cannot be formed for these inputs says nothing
            continue
        if close(got, value) and not close(value, want):
            hint = mistake
            break
    got_text, want_text = numbers_apart(got, want)
    c.fail(_("{what} is {got}, expected {want}.").format(what=what, got=got_text, want=want_text),
           hint)


def _expect_dtype(c: Check, got, want: torch.Tensor, *, what: str, hint: str) -> None:
    """A dtype mismatch (with the right shape) fails with `hint`; anything else is left to
    `expect_tensor`."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want}.").format(what=what, got=got.dtype,
                                                                   want=want.dtype), hint=hint)


# --------------------------------------------------------------------------------------------
# permute_tokens


def _with_rule(mistake: Mistake) -> Mistake:
    return mistake.with_text(_(mistake).format(rule=_(_AXIS_RULE)))


def _permute_mixups(x: torch.Tensor, perm: torch.Tensor) -> dict:
    return {
        INVERSE: lambda: x[:, torch.argsort(perm)],
        _with_rule(BATCH_AXIS): lambda: x[perm],
        _with_rule(FEATURE_AXIS): lambda: x[..., perm],
        _with_rule(UNCHANGED): x,
        PERMUTED_AXES: lambda: x.permute(*perm.tolist()),
    }


def check_permute_tokens(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("permute_tokens", f, seed=seed, errors=[PERMUTED_AXES, AXIS_ERROR],
               in_place=X_IN_PLACE) as c:
        # Shown in the pass summary (only reached when every comparison below holds).
        c.note("out[:, i] == x[:, perm[i]]")
        c.note(_("dtype kept"))
        c.note(_("input left unchanged"))
        # First S smaller than B and H, so that indexing the wrong axis gives a wrong shape
        # (diagnosed) rather than an index error; then any order, and the edge cases.
        small, *others = sorted(c.sizes(3, 3, 10))
        cases = [(others[0], small, others[1], torch.float32)]
        for _n in range(4 if thorough else 1):
            b, s, h = c.sizes(3, 3, 10)
            cases.append((b, s, h, torch.float32))
        cases += [(2, 5, 3, torch.float64), (1, 1, 4, torch.float32), (3, 2, 4, torch.float32)]
        for b, s, h, dtype in cases:
            x = c.randn(b, s, h, dtype=dtype)
            perm = _perm(c, s)
            want = ref.permute_tokens(x, perm)
            before = x.clone()
            got = c.call(x, perm)
            c.expect_tensor(got, want, what=_("permute_tokens(x, perm) for x of {shape} "
                                              "({dtype}), perm={perm}").format(
                                shape=f"[B={b}, S={s}, H={h}]",
                                dtype=str(dtype).removeprefix('torch.'), perm=perm.tolist()),
                            dims=("B", "S", "H"), wrong=_permute_mixups(before, perm))


# --------------------------------------------------------------------------------------------
# permutation_matrix


def check_permutation_matrix(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("permutation_matrix", f, seed=seed) as c:
        # Shown in the pass summary (only reached when every comparison below holds).
        c.note(_("one 1 per row at column perm[i]"))
        c.note("P @ x == x[perm]")
        c.note("float32")
        sizes = [c.randint(3, 10) for _n in range(4 if thorough else 2)] + [1, 2, 6]
        for s in sizes:
            perm = _perm(c, s)
            want = ref.permutation_matrix(perm)
            got = c.call(perm.clone())
            what = _("permutation_matrix(perm) for perm={perm}").format(perm=perm.tolist())
            _expect_dtype(c, got, want, what=what, hint=MATRIX_NOT_FLOAT)
            c.expect_tensor(got, want, what=what, dims=("row", "col"), wrong={
                MATRIX_TRANSPOSED: lambda: want.T,
                MATRIX_IDENTITY: lambda: torch.eye(s),
            })
            x0 = c.randn(s, c.randint(2, 6))
            if not torch.equal(got @ x0, x0[perm]):  # exact: one 1 per row, zeros elsewhere
                c.fail(_("{what}: P @ x differs from x[perm].").format(what=what))


# --------------------------------------------------------------------------------------------
# equivariance_error


def _equivariance_mixups(fn, x: torch.Tensor, perm: torch.Tensor) -> dict:
    inverse = torch.argsort(perm)

    def diff():
        return fn(x[:, perm]) - fn(x)[:, perm]

    return {
        UNPERMUTED: lambda: (fn(x[:, perm]) - fn(x)).abs().amax(),
        INVERSE_ONE_SIDE: lambda: (fn(x[:, perm]) - fn(x)[:, inverse]).abs().amax(),
        TOOK_MEAN: lambda: diff().abs().mean(),
        TOOK_NORM: lambda: diff().norm(),
        NO_ABS: lambda: diff().amax(),
        NO_ABS_REVERSED: lambda: (-diff()).amax(),
    }


def check_equivariance_error(f, *, seed: int | None = None, thorough: bool = False) -> None:
    # An equivariance_error that reorders with the learner's permute_tokens cannot pass before
    # that does: a broken one it calls is named ("fix permute_tokens first").
    with builds_on("equivariance_error", {"permute_tokens": check_permute_tokens}), \
            Check("equivariance_error", f, seed=seed) as c:
        # Shown in the pass summary (only reached when every comparison below holds).
        c.note(_("near 0 for equivariant functions"))
        c.note(_("the largest |fn(PX) - P fn(X)| for the others"))
        c.note(_("a Python float"))
        for trial in range(3 if thorough else 1):
            b, s, h, h_out = c.sizes(4, 4, 11)
            x = c.randn(b, s, h)
            perm = _cycle(c, s)
            w_q, w_k, w_v = (c.randn(h, h, scale=h ** -0.5) for _n in range(3))
            w_mlp = c.randn(h, h_out, scale=h ** -0.5)
            causal = ref.causal_mask(s)
            positions = ref.sinusoidal_positions(s, h)

            def attend(t, mask=None):
                return ref.attention(t @ w_q, t @ w_k, t @ w_v, mask)[0]

            # Each function's description is a message id (translated where it is shown).
            fns = [
                (N_("attention without a mask"), attend),
                (N_("a token-wise layer tanh(x @ W) with W of [H, H_out]"),
                 lambda t: torch.tanh(t @ w_mlp)),
                (N_("attention with a causal mask"), lambda t: attend(t, causal)),
                (N_("attention over x + sinusoidal positions"), lambda t: attend(t + positions)),
            ]
            shift = torch.roll(torch.arange(s), -1)
            if trial == 0:
                # A cyclic shift gives the exact answer S - 1: the signed differences are +1
                # (S - 1 times) and 1 - S (once), with the signs depending on +/- below.
                index = torch.arange(s, dtype=x.dtype)[:, None]
                fns.append((N_("x minus each token's position index (perm a cyclic shift)"),
                            lambda t: t - index))
                fns.append((N_("x plus each token's position index (perm a cyclic shift)"),
                            lambda t: t + index))
            for desc, fn in fns:
                p = shift if "cyclic shift" in desc else perm  # desc: the English
                want = ref.equivariance_error(fn, x, p)
                got = c.call(fn, x.clone(), p.clone())
                _expect_float(c, got, want,
                              what=_("equivariance_error for fn = {function}, x of {shape}, "
                                     "perm={perm}").format(function=_(desc),
                                                           shape=f"[B={b}, S={s}, H={h}]",
                                                           perm=p.tolist()),
                              wrong=_equivariance_mixups(fn, x, p))


# --------------------------------------------------------------------------------------------
# sinusoidal_positions


def _sinusoid(seq_len: int, hidden: int, *, base: float = 10000.0, first: int = 0,
              exponent=lambda i, j, h: 2 * i / h, swap: bool = False, halves: bool = False,
              multiply: bool = False) -> torch.Tensor:
    """The sinusoidal table with one known mistake switched on (float64 maths, float32 out)."""
    pos = torch.arange(first, first + seq_len, dtype=torch.float64)[:, None]
    i = torch.arange(hidden // 2, dtype=torch.float64)
    sin_power = base ** exponent(i, 2 * i, hidden)
    cos_power = base ** exponent(i, 2 * i + 1, hidden)
    if multiply:
        sin_angle, cos_angle = pos * sin_power, pos * cos_power
    else:
        sin_angle, cos_angle = pos / sin_power, pos / cos_power
    even, odd = torch.sin(sin_angle), torch.cos(cos_angle)
    if swap:
        even, odd = torch.cos(sin_angle), torch.sin(cos_angle)
    if halves:
        table = torch.cat([even, odd], dim=-1)
    else:
        table = torch.stack([even, odd], dim=-1).reshape(seq_len, hidden)
    return table.to(torch.float32)


def _sinusoid_mixups(s: int, h: int, want: torch.Tensor) -> dict:
    return {
        SIN_COS_SWAPPED: lambda: _sinusoid(s, h, swap=True),
        HALVES: lambda: _sinusoid(s, h, halves=True),
        PAIR_EXPONENT: lambda: _sinusoid(s, h, exponent=lambda i, j, hh: i / hh),
        OWN_EXPONENT: lambda: _sinusoid(s, h, exponent=lambda i, j, hh: j / hh),
        BASE_1000: lambda: _sinusoid(s, h, base=1000.0),
        FROM_ONE: lambda: _sinusoid(s, h, first=1),
        PAIRS_FROM_ONE: lambda: _sinusoid(s, h, exponent=lambda i, j, hh: 2 * (i + 1) / hh),
        MULTIPLIED: lambda: _sinusoid(s, h, multiply=True),
        TABLE_TRANSPOSED: lambda: want.T,
    }


def check_sinusoidal_positions(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("sinusoidal_positions", f, seed=seed) as c:
        # Shown in the pass summary (only reached when every comparison below holds).
        c.note(_("sin on even features, cos on odd"))
        c.note(_("frequencies 10000^(-2i/H)"))
        c.note("float32 [S, H]")
        cases = []
        for _n in range(4 if thorough else 2):
            s = c.randint(3, 40)
            h = 2 * c.randint(2, 24)
            cases.append((s, h if h != s else h + 2))
        cases += [(2, 4), (1, 2), (6, 8), (256, 48)]
        for s, h in cases:
            want = ref.sinusoidal_positions(s, h)
            got = c.call(s, h)
            what = f"sinusoidal_positions(seq_len={s}, hidden={h})"
            _expect_dtype(c, got, want, what=what, hint=TABLE_NOT_FLOAT32)
            # float32 angles pos * w carry a relative error ~1e-7, so the absolute error of
            # sin/cos grows with the position.
            c.expect_tensor(got, want, what=what,
                            dims=("pos", "feature"), wrong=_sinusoid_mixups(s, h, want),
                            atol=max(2e-5, 2e-7 * s), rtol=2e-4)


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "07.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "permute_tokens": (
        INVERSE, X_IN_PLACE, BATCH_AXIS, FEATURE_AXIS, PERMUTED_AXES, UNCHANGED, AXIS_ERROR),
    "permutation_matrix": (
        MATRIX_IDENTITY, MATRIX_NOT_FLOAT, MATRIX_TRANSPOSED),
    "equivariance_error": (
        UNPERMUTED, fix_first('permute_tokens'), INVERSE_ONE_SIDE, NO_ABS, RETURNED_INT,
        RETURNED_TENSOR, TOOK_MEAN, TOOK_NORM),
    "sinusoidal_positions": (
        BASE_1000, PAIR_EXPONENT, MULTIPLIED, TABLE_NOT_FLOAT32, OWN_EXPONENT, PAIRS_FROM_ONE,
        FROM_ONE, HALVES, SIN_COS_SWAPPED, TABLE_TRANSPOSED),
}
