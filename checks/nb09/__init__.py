"""Checks for chapter 09: the feed-forward network (ReLU, GELU, SiLU, FFN, SwiGLU).

Conventions (docs/conventions.md): weights are [in_features, out_features] and applied as
`x @ W`, no biases; GELU is the exact one, x * Phi(x) with the normal CDF written through erf;
SwiGLU(x) = (silu(x @ W_gate) * (x @ W_up)) @ W_down.

The three activations must be written from elementary tensor operations (torch.erf and
torch.sigmoid are fine; the library activations are not), keep the input's dtype, leave the input
unchanged, survive large |x| without overflowing to NaN, and be differentiable by autograd.

Every diagnosis is a `Mistake` declared below (checks.mistakes): its id is
"09.<exercise>.<key>"; relu, gelu and silu share one check, so their ids differ only in the
exercise.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .. import reference as ref
from ..engine import (CallRecord, Check, CheckFailure, builds_on, describe, earlier_failures,
                     fix_first_text, mismatch_text, tolerance, values_close)
from ..i18n import N_, _
from ..mistakes import Mistake, fix_first

# --------------------------------------------------------------------------------------------
# Forbidden shortcuts. The engine matches a torch function's `__name__` exactly; calls through
# `torch.ops.aten` carry overload names such as "relu.default", so those are listed too.

_LIBRARY_ACTIVATIONS = (
    "relu", "relu_", "relu6", "threshold", "threshold_", "_threshold", "hardtanh", "hardtanh_",
    "leaky_relu", "leaky_relu_", "elu", "elu_", "celu", "celu_", "selu", "selu_", "rrelu",
    "rrelu_", "prelu", "gelu", "gelu_", "silu", "silu_", "hardswish", "hardswish_", "mish",
    "mish_",
)

RELU_FORBID = Mistake("calls_library_activation", N_(
    "write ReLU yourself from elementwise tensor operations: `torch.clamp(x, min=0)`, "
    "`torch.maximum(x, torch.zeros_like(x))` or `torch.where(x > 0, x, 0.0)` (library "
    "activations such as F.relu, torch.relu or nn.ReLU are off limits here)"))
GELU_FORBID = Mistake("calls_library_activation", N_(
    "write GELU yourself: x * Phi(x) with Phi(x) = (1 + erf(x / sqrt(2))) / 2, using `torch.erf` "
    "(F.gelu and nn.GELU are off limits here)"))
SILU_FORBID = Mistake("calls_library_activation", N_(
    "write SiLU yourself: x * sigmoid(x), using `torch.sigmoid` (F.silu and nn.SiLU are off "
    "limits here)"))
# The learner called `F.relu` inside their own `relu`: "calls `relu`" alone reads as if their own
# function were meant, so the hint says whose `relu` ran.
_LIBRARY_NAMED = N_("the `{name}` that ran is PyTorch's own (F.{name}, torch.{name} and "
                    "x.{name}() all reach it), not a function of yours; {fix}")


def _forbid(hint: Mistake) -> dict[str, Mistake]:
    # The engine also matches aten overloads ("relu.default") by their base name.
    return {name: hint.with_text(_(_LIBRARY_NAMED).format(name=name.strip("_"), fix=_(hint)))
            for name in _LIBRARY_ACTIVATIONS}


IN_PLACE = Mistake("modified_x_in_place", N_(
    "in-place operations (`x.clamp_(...)`, `x.mul_(...)`, `x[x < 0] = 0`, `out=x`) write into "
    "the caller's tensor; return a new tensor instead (`x.clamp(min=0)`, `torch.where(...)`, "
    "`x * ...`), or work on `x.clone()`"))
PYTHON_SCALAR = Mistake("python_scalar_functions", N_(
    "the `math` module and Python's `max`/`if` work on single numbers, not on whole tensors: use "
    "the elementwise tensor versions (`torch.erf`, `torch.exp`, `torch.sigmoid`, `torch.clamp`, "
    "`torch.where`)"), raises=[("*", r"ambiguous|only one element|must be real number")])
NUMPY = Mistake("uses_numpy", N_(
    "stay in PyTorch: NumPy has no bfloat16 and cuts the computation off from autograd; the same "
    "operations exist on tensors (`torch.clamp`, `torch.where`, `torch.erf`, `torch.sigmoid`)"),
    raises=[("*", r"numpy|ScalarType")])
DETACHED = Mistake("cut_off_from_autograd", N_(
    "the values are right but the gradient is not: part of the computation is cut off from "
    "autograd (`.detach()`, `.data`, `torch.no_grad()`, `.item()`, `.numpy()` or a copy through "
    "`torch.tensor(...)`); build the result from tensor operations on x"))
PRECISION = Mistake("lost_float64_precision", N_(
    "close, but not to float64 precision: a constant was rounded (write `math.sqrt(2)`, "
    "`math.pi`, not 1.414 or 0.7071) or part of the computation ran in float32 "
    "(`torch.tensor(2.0)`, `.float()`); keep everything in x's dtype"))
RETURNED_COMPARISON = Mistake("returned_the_comparison", N_(
    "returned the comparison itself (True/False): ReLU keeps the VALUE of x where x > 0, so "
    "multiply by the mask or use `torch.where(x > 0, x, 0.0)`"))
FLOAT32_HARD_WIRED = Mistake("float32_hard_wired", N_(
    "the result came out in float32 for a {dtype} input: something is hard-wired to float32 "
    "(`.float()`, `torch.zeros(x.shape)`, `torch.tensor(...)` without dtype); make helpers in x's "
    "dtype (`zeros_like`, `.to(x.dtype)`) or use plain Python numbers, which keep x's dtype"))
DTYPE_NOT_KEPT = Mistake("dtype_not_kept", N_(
    "keep the input's dtype: the result should be {dtype}, like x"))
MAX_REDUCTION = Mistake("torch_max_reduction", N_(
    "torch.max(x, 0) is a REDUCTION along axis 0 (the largest entry of each column); for ReLU "
    "compare every entry with 0: `torch.clamp(x, min=0)` or `torch.maximum(x, "
    "torch.zeros_like(x))`"))
SQUEEZED = Mistake("dropped_axes_of_size_one", N_(
    "the output lost the axes of size one (`squeeze()`, `reshape(-1)`, or a loop over the "
    "entries): an activation is elementwise, so its output has exactly x's shape, [1, n, 1] "
    "included"))


def _dtype_hint(got: torch.dtype, want: torch.dtype) -> Mistake:
    if got == torch.bool:
        return RETURNED_COMPARISON
    name = str(want).removeprefix("torch.")
    if got == torch.float32:
        return FLOAT32_HARD_WIRED.with_text(_(FLOAT32_HARD_WIRED).format(dtype=name))
    return DTYPE_NOT_KEPT.with_text(_(DTYPE_NOT_KEPT).format(dtype=want))


def _compare(c: Check, got, want: torch.Tensor, *, what: str, dims=None, wrong=None,
             extra: Callable[[torch.Tensor], str | None] | None = None) -> None:
    """expect_tensor, with a dtype hint and extra diagnoses after the known-wrong variants."""
    if isinstance(got, tuple) and hasattr(got, "values") and hasattr(got, "indices"):
        c.fail(_("{what} should be a torch.Tensor, got a (values, indices) pair.").format(
            what=what), MAX_REDUCTION)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want} (the input's dtype).").format(
            what=what, got=got.dtype, want=want.dtype), _dtype_hint(got.dtype, want.dtype))
    if (isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
            and type(got) in (torch.Tensor, torch.nn.Parameter)):
        atol, rtol = tolerance(want.dtype)
        if not values_close(got, want, atol, rtol):
            hint = c.diagnose(got, wrong, atol, rtol)
            if hint is None and extra is not None:
                hint = extra(got)
            c.fail(_("{what} has the right shape but wrong values; {mismatch}").format(
                what=what, mismatch=mismatch_text(got, want, atol, rtol, dims)), hint)
    c.expect_tensor(got, want, what=what, dims=dims, wrong=wrong)


# --------------------------------------------------------------------------------------------
# The activations

_FIXED = [-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0]
_LARGE = [-1e4, -1000.0, -100.0, -88.8, -20.0, -1.0, 0.0, 1.0, 20.0, 88.8, 100.0, 1000.0, 1e4]
_LARGE_HALF = [-1e4, -1000.0, -100.0, -20.0, -1.0, 0.0, 1.0, 20.0, 100.0, 1000.0, 1e4]


def _random_shape(c: Check) -> tuple[int, ...]:
    ndim = c.randint(1, 5)
    return tuple(c.sizes(ndim, 2, 9))


def _nonfinite_hint(got: torch.Tensor, overflow: Mistake) -> Mistake | None:
    return overflow if bool((~got.detach().isfinite()).any()) else None


def _check_activation(name: str, f, seed, thorough: bool, reference: Callable,
                      mistakes: Callable[[torch.Tensor], dict], forbid_hint: Mistake,
                      overflow_hint: Mistake,
                      grad_mistakes: Callable[[torch.Tensor], dict]) -> None:
    with Check(name, f, seed=seed, forbid=_forbid(forbid_hint), errors=[PYTHON_SCALAR, NUMPY],
               in_place=IN_PLACE) as c:

        def run(x: torch.Tensor, what: str, extra=None) -> None:
            want = reference(x)
            got = c.call(x)
            dims = None if x.dim() != 1 else ("i",)
            wrong = mistakes(x)
            if x.dim() > 1 and 1 in x.shape:
                wrong[SQUEEZED] = lambda: reference(x.squeeze())
            _compare(c, got, want, what=what, dims=dims, wrong=wrong,
                     extra=None if extra is None else (lambda got: extra(got, x)))

        run(torch.tensor(_FIXED), _("{name} at x = {values}").format(
            name=name, values=", ".join(f"{v:g}" for v in _FIXED)))
        # shapes of one: an elementwise function keeps them
        shape = (1, c.randint(2, 9), 1)
        run(c.randn(*shape, scale=3.0), _("{name} of a random {dtype} tensor of shape "
                                          "{shape}").format(name=name, dtype="float32",
                                                            shape=list(shape)))
        for _n in range(4 if thorough else 2):
            shape = _random_shape(c)
            run(c.randn(*shape, scale=3.0),
                _("{name} of a random {dtype} tensor of shape {shape}").format(
                    name=name, dtype="float32", shape=list(shape)))
        c.headline(_("elementwise, any shape"))
        c.headline(_("input left unchanged"))

        def precision(got: torch.Tensor, x: torch.Tensor) -> Mistake | None:
            return PRECISION if values_close(got, reference(x), 1e-5, 1e-4) else None

        # bfloat16 first: a float32 intermediate shows there as a dtype at every seed, while in
        # float64 its rounding can hide inside the tolerance
        dtypes = [torch.bfloat16, torch.float64] + ([torch.float16] if thorough else [])
        for dtype in dtypes:
            shape = _random_shape(c)
            x = c.randn(*shape, scale=3.0, dtype=dtype)
            label = str(dtype).removeprefix("torch.")
            run(x, _("{name} of a random {dtype} tensor of shape {shape}").format(
                name=name, dtype=label, shape=list(shape)),
                extra=precision if dtype == torch.float64 else None)
        c.headline(_("keeps float64 / bfloat16"))

        for dtype in (torch.float32, torch.float64, torch.bfloat16) + (
                (torch.float16,) if thorough else ()):
            values = _LARGE_HALF if dtype == torch.float16 else _LARGE
            x = torch.tensor(values, dtype=dtype)
            label = str(dtype).removeprefix("torch.")
            run(x, _("{name} of large {dtype} inputs x = {values}").format(
                name=name, dtype=label, values=", ".join(f"{v:g}" for v in values)),
                extra=lambda got, x: _nonfinite_hint(got, overflow_hint))
        c.headline(_("no overflow for large |x|"))

        # Derivative through autograd: training needs it, and the figure in the notebook plots it.
        x = c.randn(c.randint(20, 40), scale=3.0, dtype=torch.float64).requires_grad_()
        got = c.call(x)
        if not isinstance(got, torch.Tensor) or not got.requires_grad:
            c.fail(_("{name}'s output does not track gradients back to x (the input had "
                     "requires_grad=True).").format(name=name), DETACHED)
        try:
            (grad,) = torch.autograd.grad(got.sum(), x)
        except RuntimeError as err:
            c.fail(_("autograd could not differentiate {name}: {error}").format(name=name,
                                                                               error=err),
                   DETACHED)
        x_ref = x.detach().clone().requires_grad_()
        (want,) = torch.autograd.grad(reference(x_ref).sum(), x_ref)
        _compare(c, grad, want, what=_("the derivative d {name}(x) / dx (by autograd)").format(
            name=name),
                 dims=("i",), wrong=grad_mistakes(x.detach()),
                 extra=lambda g: PRECISION if values_close(g, want, 1e-5, 1e-4) else None)
        c.headline(_("differentiable"))


RELU_KEPT_NEGATIVE = Mistake("kept_negative_part", N_(
    "kept the negative part instead of the positive one (`min` instead of `max`, or "
    "`clamp(max=0)`): ReLU(x) = max(0, x)"))
RELU_STEP = Mistake("returned_step_function", N_(
    "returned the step function (1 where x > 0, 0 elsewhere), which is ReLU's derivative; ReLU "
    "keeps the value of x"))
RELU_ABS = Mistake("returned_abs", N_(
    "returned |x|: negative inputs must become 0, not flip sign"))
RELU_LEAKY = Mistake("leaky_relu", N_(
    "a leaky ReLU (a small slope for x < 0): plain ReLU sets negative inputs to exactly 0"))
RELU_IDENTITY = Mistake("returned_x_unchanged", N_(
    "returned x unchanged: negative inputs must become 0"))
RELU_CLAMPED_ABOVE = Mistake("clamped_above_too", N_(
    "clamped from above too (`torch.clamp(x, 0, 1)` or `torch.clamp(x, 0, 6)`): ReLU has no upper "
    "bound, only negative inputs change; `torch.clamp(x, min=0)`"))
RELU_OVERFLOW = Mistake("intermediate_overflows", N_(
    "ReLU never needs anything that can overflow: `torch.clamp(x, min=0)`"))


def _relu_mistakes(x: torch.Tensor) -> dict:
    return {
        RELU_KEPT_NEGATIVE: torch.clamp(x, max=0),
        RELU_STEP: (x > 0).to(x.dtype),
        RELU_ABS: x.abs(),
        RELU_LEAKY: torch.where(x > 0, x, 0.01 * x),
        RELU_IDENTITY: x.clone(),
        RELU_CLAMPED_ABOVE: lambda: torch.clamp(x, 0, 1 if float(x.max()) <= 6 else 6),
    }


def _relu_grad_mistakes(x: torch.Tensor) -> dict:
    return {DETACHED: torch.zeros_like(x)}


def check_relu(f, *, seed: int | None = None, thorough: bool = False) -> None:
    _check_activation("relu", f, seed, thorough, ref.relu, _relu_mistakes, RELU_FORBID,
                      RELU_OVERFLOW, _relu_grad_mistakes)


_SQRT2 = math.sqrt(2.0)


def _phi(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1.0 + torch.erf(x / _SQRT2))


GELU_TANH = Mistake("tanh_approximation", N_(
    "used the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); this exercise "
    "asks for the exact GELU, x * Phi(x) with Phi(x) = (1 + erf(x / sqrt(2))) / 2"))
GELU_SIGMOID = Mistake("sigmoid_approximation", N_(
    "used the sigmoid approximation x * sigmoid(1.702 x); this exercise asks for the exact GELU, "
    "x * (1 + erf(x / sqrt(2))) / 2"))
GELU_NO_CUBIC = Mistake("tanh_without_cubic_term", N_(
    "a tanh approximation without the cubic term 0.044715 x^3, and the exact GELU is asked for "
    "anyway: x * (1 + erf(x / sqrt(2))) / 2"))
GELU_TANH_FOR_ERF = Mistake("tanh_instead_of_erf", N_(
    "tanh(x / sqrt(2)) instead of erf(x / sqrt(2)): the two look alike but are different "
    "functions; Phi(x) = (1 + torch.erf(x / sqrt(2))) / 2"))
GELU_NO_HALF = Mistake("forgot_the_half", N_(
    "forgot the 1/2: Phi(x) = (1 + erf(x / sqrt(2))) / 2 runs from 0 to 1"))
GELU_NO_ONE_PLUS = Mistake("forgot_one_plus", N_(
    "forgot the 1 +: erf runs from -1 to 1, and Phi(x) = (1 + erf(x / sqrt(2))) / 2 from 0 to "
    "1"))
GELU_ERF_X = Mistake("erf_of_x", N_(
    "erf(x) instead of erf(x / sqrt(2)): the standard normal CDF is "
    "Phi(x) = (1 + erf(x / sqrt(2))) / 2"))
GELU_ERF_DIVIDED = Mistake("divided_erf_not_its_argument", N_(
    "divided erf(x) by sqrt(2) instead of its argument: the division goes inside, "
    "erf(x / sqrt(2))"))
GELU_BY_2 = Mistake("divided_by_2_inside_erf", N_(
    "divided by 2 instead of sqrt(2) inside erf: Phi(x) = (1 + erf(x / sqrt(2))) / 2"))
GELU_TIMES_SQRT2 = Mistake("multiplied_by_sqrt2_inside_erf", N_(
    "multiplied by sqrt(2) instead of dividing inside erf: Phi(x) = (1 + erf(x / sqrt(2))) / 2"))
GELU_SIGN = Mistake("sign_error", N_(
    "a sign error: 1 - erf(...) gives Phi(-x); GELU(x) = x (1 + erf(x / sqrt(2))) / 2"))
GELU_DENSITY = Mistake("used_normal_density", N_(
    "used the normal DENSITY phi(x) = exp(-x^2/2) / sqrt(2 pi); GELU uses the cumulative "
    "distribution Phi(x) = (1 + erf(x / sqrt(2))) / 2"))
GELU_PHI_ONLY = Mistake("returned_phi_alone", N_(
    "returned Phi(x) alone: GELU multiplies it by x, x * Phi(x)"))
GELU_SILU = Mistake("returned_silu", N_(
    "returned SiLU, x * sigmoid(x): GELU is x * Phi(x), with the normal CDF"))
GELU_RELU = Mistake("returned_relu", N_("returned ReLU: GELU is the smooth x * Phi(x)"))
GELU_OVERFLOW = Mistake("intermediate_overflows", N_(
    "an intermediate overflowed to inf (and inf * 0 or inf / inf is NaN): "
    "x * (1 + torch.erf(x / math.sqrt(2))) / 2 never overflows"))


def _gelu_mistakes(x: torch.Tensor) -> dict:
    return {
        GELU_TANH: F.gelu(x, approximate="tanh"),
        GELU_SIGMOID: x * torch.sigmoid(1.702 * x),
        GELU_NO_CUBIC: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * x)),
        GELU_TANH_FOR_ERF: 0.5 * x * (1 + torch.tanh(x / _SQRT2)),
        GELU_NO_HALF: x * (1 + torch.erf(x / _SQRT2)),
        GELU_NO_ONE_PLUS: 0.5 * x * torch.erf(x / _SQRT2),
        GELU_ERF_X: 0.5 * x * (1 + torch.erf(x)),
        GELU_ERF_DIVIDED: 0.5 * x * (1 + torch.erf(x) / _SQRT2),
        GELU_BY_2: 0.5 * x * (1 + torch.erf(x / 2)),
        GELU_TIMES_SQRT2: 0.5 * x * (1 + torch.erf(x * _SQRT2)),
        GELU_SIGN: 0.5 * x * (1 - torch.erf(x / _SQRT2)),
        GELU_DENSITY: x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi),
        GELU_PHI_ONLY: _phi(x),
        GELU_SILU: x * torch.sigmoid(x),
        GELU_RELU: torch.clamp(x, min=0),
    }


def _gelu_grad_mistakes(x: torch.Tensor) -> dict:
    return {DETACHED: _phi(x)}


def check_gelu(f, *, seed: int | None = None, thorough: bool = False) -> None:
    _check_activation("gelu", f, seed, thorough, ref.gelu, _gelu_mistakes, GELU_FORBID,
                      GELU_OVERFLOW, _gelu_grad_mistakes)


SILU_OVERFLOWING = Mistake("overflowing_formula", N_(
    "x * exp(x) / (1 + exp(x)) overflows: for large x, exp(x) is inf and inf / inf is NaN; use "
    "x * torch.sigmoid(x) or x / (1 + torch.exp(-x))"))
SILU_SIGMOID_ONLY = Mistake("returned_sigmoid_alone", N_(
    "returned sigmoid(x) alone: SiLU multiplies it by x, x * sigmoid(x)"))
SILU_SIGN = Mistake("sign_error_in_exponent", N_(
    "a sign error in the exponent: sigmoid(x) = 1 / (1 + exp(-x)), so SiLU(x) = "
    "x / (1 + exp(-x))"))
SILU_GELU_APPROX = Mistake("gelu_approximation", N_(
    "x * sigmoid(1.702 x) is an approximation of GELU; SiLU is x * sigmoid(x)"))
SILU_TANH = Mistake("tanh_instead_of_sigmoid", N_(
    "tanh instead of sigmoid: SiLU(x) = x * sigmoid(x) = x / (1 + exp(-x))"))
SILU_GELU = Mistake("returned_gelu", N_(
    "returned GELU: SiLU uses the logistic sigmoid, x * sigmoid(x)"))
SILU_SOFTPLUS = Mistake("returned_softplus", N_(
    "returned softplus, log(1 + exp(x)): SiLU is x * sigmoid(x)"))
SILU_RELU = Mistake("returned_relu", N_("returned ReLU: SiLU is the smooth x * sigmoid(x)"))
SILU_OVERFLOW = Mistake("intermediate_overflows", N_(
    "an intermediate overflowed: exp(x) is inf for x above about 89 in float32 (710 in float64), "
    "and inf / inf or 0 * inf is NaN; x * torch.sigmoid(x) and x / (1 + torch.exp(-x)) never "
    "overflow"))


def _silu_mistakes(x: torch.Tensor) -> dict:
    e = torch.exp(x)
    return {
        SILU_OVERFLOWING: x * e / (1 + e),
        SILU_SIGMOID_ONLY: torch.sigmoid(x),
        SILU_SIGN: x * torch.sigmoid(-x),
        SILU_GELU_APPROX: x * torch.sigmoid(1.702 * x),
        SILU_TANH: x * torch.tanh(x),
        SILU_GELU: F.gelu(x, approximate="none"),
        SILU_SOFTPLUS: F.softplus(x),
        SILU_RELU: torch.clamp(x, min=0),
    }


def _silu_grad_mistakes(x: torch.Tensor) -> dict:
    return {DETACHED: torch.sigmoid(x)}


def check_silu(f, *, seed: int | None = None, thorough: bool = False) -> None:
    _check_activation("silu", f, seed, thorough, ref.silu, _silu_mistakes, SILU_FORBID,
                      SILU_OVERFLOW, _silu_grad_mistakes)


# --------------------------------------------------------------------------------------------
# ffn


class _Activation:
    """An activation handed to the learner's ffn, recording the shapes it is applied to."""

    def __init__(self, fn: Callable, name: str):
        self.fn = fn
        self.__name__ = name
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, t):
        self.shapes.append(tuple(t.shape))
        return self.fn(t)


_ACTIVATIONS = {"relu": ref.relu, "gelu": ref.gelu, "silu": ref.silu}

_SHAPE_ERRORS = r"cannot be multiplied|size mismatch|must match the size|mat1 and mat2"
FFN_SHAPES = Mistake("matrix_shapes_do_not_fit", N_(
    "the matrix shapes do not fit: x [..., H] @ w1 [H, H_ff] -> [..., H_ff], the activation, "
    "then @ w2 [H_ff, H] -> [..., H]. Weights are [in, out] and used as `x @ W` without "
    "transposing (F.linear(x, W) would transpose them); check also that w1 comes first and w2 "
    "second"), raises=[("*", _SHAPE_ERRORS)])
LEADING_AXES = Mistake("assumed_three_axes", N_(
    "x may have any number of leading axes, [B, S, H] or [T, H]: the projections act on the last "
    "axis only, so write `x @ w` (or einsum with '...'), without unpacking B, S, H = x.shape"),
    raises=[("*", r"einsum|unpack|not enough values|too many values")])
IN_PLACE_INPUTS = Mistake("modified_input_in_place", N_(
    "in-place operations (`mul_`, `add_`, `+=` on an input, `out=`) write into the caller's "
    "tensors; compute new tensors instead"))
FFN_ACT_AFTER_W2 = Mistake("activation_after_w2", N_(
    "applied the activation after W2, to the output: the activation goes between the two "
    "matrices, activation(x @ w1) @ w2"))
FFN_ACT_BEFORE_W1 = Mistake("activation_before_w1", N_(
    "applied the activation to the input x before W1: FFN(x) = activation(x @ w1) @ w2"))
FFN_RESULT_UNUSED = Mistake("activation_result_unused", N_(
    "the activation's result is not used (x @ w1 @ w2 is a linear map): "
    "h = activation(x @ w1), then h @ w2"))
FFN_TWICE = Mistake("activation_twice", N_("applied the activation twice"))
FFN_NO_W2 = Mistake("forgot_w2", N_(
    "forgot W2: the FFN projects back down to H, activation(x @ w1) @ w2"))
FFN_RESIDUAL = Mistake("added_residual", N_(
    "added x to the output: the residual connection belongs to the block around the FFN "
    "(chapter 10), not to the FFN itself; return activation(x @ w1) @ w2"))
IGNORED_ACTIVATION = Mistake("ignored_activation_argument", N_(
    "apply the activation argument, activation(x @ w1), instead of a fixed activation function"))
_APPLIED_OTHER = N_("ignored the `activation` argument and applied {name}: call the function you "
                    "are given, activation(x @ w1)")
_NEVER_CALLED = N_("never called `activation`: apply the function you are given, "
                   "activation(x @ w1)")


def _weights(c: Check, h: int, h_ff: int, count: int, dtype=torch.float32):
    """count matrices [H, H_ff] ... (the last one [H_ff, H]), scaled to keep outputs O(1)."""
    mats = [c.randn(h, h_ff, dtype=torch.float64) / math.sqrt(h) for _n in range(count - 1)]
    mats.append(c.randn(h_ff, h, dtype=torch.float64) / math.sqrt(h_ff))
    return [m.to(dtype) for m in mats]


def _ffn_mistakes(x, w1, w2, act: Callable, act_name: str) -> dict:
    h = x @ w1
    mistakes = {
        FFN_ACT_AFTER_W2: lambda: act(h @ w2),
        FFN_ACT_BEFORE_W1: lambda: act(x) @ w1 @ w2,
        FFN_RESULT_UNUSED: lambda: h @ w2,
        FFN_TWICE: lambda: act(act(h)) @ w2,
        FFN_NO_W2: lambda: act(h),
        FFN_RESIDUAL: lambda: x + act(h) @ w2,
    }
    for name, fn in _ACTIVATIONS.items():
        if name != act_name:
            mistakes[IGNORED_ACTIVATION.with_text(_(_APPLIED_OTHER).format(name=name))] = (
                lambda fn=fn: fn(h) @ w2)
    return mistakes


def _ffn_what(name: str, dtype, shape, h: int, h_ff: int) -> str:
    """ "ffn of float64 x [3, 4, 5] with H=5, H_ff=9" (no dtype named for float32)."""
    if dtype == torch.float64:
        return _("{name} of float64 x {shape} with H={h}, H_ff={h_ff}").format(
            name=name, shape=list(shape), h=h, h_ff=h_ff)
    return _("{name} of x {shape} with H={h}, H_ff={h_ff}").format(
        name=name, shape=list(shape), h=h, h_ff=h_ff)


def check_ffn(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("ffn", f, seed=seed, errors=[FFN_SHAPES, LEADING_AXES],
               in_place=IN_PLACE_INPUTS) as c:
        b, s, h, h_ff = c.sizes(4, 2, 14)
        h, h_ff = min(h, h_ff), max(h, h_ff)       # the FFN widens: H < H_ff
        names = list(_ACTIVATIONS)
        first = c.choice(names)
        # (x shape, dtype, activation name): every activation at least once, and one the
        # learner cannot have hard-coded (tanh).
        cases = [((b, s, h), torch.float32, first), ((b, s, h), torch.float32, "tanh"),
                 ((b * s, h), torch.float32, c.choice([n for n in names if n != first])),
                 ((b, s, h), torch.float64, c.choice(names))]
        if thorough:
            cases += [((b, s, h), torch.float32, n) for n in names]
            cases += [((s, b, h), torch.float64, "tanh")]
        for shape, dtype, act_name in cases:
            fn = torch.tanh if act_name == "tanh" else _ACTIVATIONS[act_name]
            act = _Activation(fn, act_name)
            x = c.randn(*shape, dtype=dtype)
            w1, w2 = _weights(c, h, h_ff, 2, dtype)
            want = ref.ffn(x, w1, w2, fn)
            got = c.call(x, w1, w2, act)
            dims = ("B", "S", "H") if len(shape) == 3 else ("T", "H")
            what = _ffn_what("ffn", dtype, shape, h, h_ff) + f", activation={act_name}"
            never = (lambda got: IGNORED_ACTIVATION.with_text(_(_NEVER_CALLED))) \
                if not act.shapes else None
            _compare(c, got, want, what=what, dims=dims,
                     wrong=_ffn_mistakes(x, w1, w2, fn, act_name), extra=never)
            if not act.shapes:
                c.fail(_("{what}: never called the `activation` it was given.").format(
                    what=what), IGNORED_ACTIVATION)
        c.headline("activation(x @ w1) @ w2")
        c.headline(_("uses the activation it is given"))
        c.headline(_("[B, S, H] and [T, H] inputs; float64 kept"))


# --------------------------------------------------------------------------------------------
# swiglu_ffn

SWIGLU_PRECEDENCE = Mistake("operator_precedence", N_(
    "`*` and `@` have the same precedence and go left to right: silu(x @ w_gate) * x @ w_up "
    "multiplies silu(x @ w_gate) by x before any projection; put the product in brackets, "
    "(silu(x @ w_gate) * (x @ w_up)) @ w_down"),
    raises=[("RuntimeError", r"must match the size")])
SWIGLU_SHAPES = Mistake("matrix_shapes_do_not_fit", N_(
    "the matrix shapes do not fit: x [..., H] @ w_gate [H, H_ff] and x @ w_up [H, H_ff] give "
    "[..., H_ff]; their gated product @ w_down [H_ff, H] maps back to [..., H]. Weights are "
    "[in, out] and used as `x @ W` without transposing (F.linear(x, W) would transpose them)"),
    raises=[("*", _SHAPE_ERRORS)])
SWIGLU_SWAPPED = Mistake("gate_and_up_swapped", N_(
    "gate and up swapped: SiLU goes on the gate branch x @ W_gate, which then multiplies "
    "x @ W_up"))
SWIGLU_SILU_OF_PRODUCT = Mistake("silu_of_the_product", N_(
    "applied SiLU to the product: only the gate branch goes through SiLU, "
    "(silu(x @ W_gate) * (x @ W_up)) @ W_down"))
SWIGLU_NO_GATE = Mistake("no_gate", N_(
    "no gate: silu(x @ W_up) @ W_down is a plain FFN; multiply silu(x @ W_gate) with x @ W_up"))
SWIGLU_NO_UP = Mistake("dropped_up_branch", N_(
    "dropped the up branch: silu(x @ W_gate) must be multiplied by x @ W_up"))
SWIGLU_GLU = Mistake("sigmoid_instead_of_silu", N_(
    "sigmoid instead of SiLU (that is the original GLU); SwiGLU uses silu(g) = g * sigmoid(g)"))
SWIGLU_REGLU = Mistake("relu_instead_of_silu", N_(
    "ReLU instead of SiLU (that is ReGLU); SwiGLU uses silu"))
SWIGLU_GEGLU = Mistake("gelu_instead_of_silu", N_(
    "GELU instead of SiLU (that is GEGLU); SwiGLU uses silu"))
SWIGLU_BILINEAR = Mistake("no_activation", N_(
    "no activation: (x @ W_gate) * (x @ W_up) is a bilinear layer; apply SiLU to the gate "
    "branch"))
SWIGLU_SILU_BOTH = Mistake("silu_on_both_branches", N_(
    "applied SiLU to both branches: only the gate goes through SiLU"))
SWIGLU_ADDED = Mistake("added_the_branches", N_(
    "added the branches: the gate MULTIPLIES the up branch elementwise"))
SWIGLU_SILU_AFTER = Mistake("silu_after_w_down", N_(
    "applied SiLU after W_down: it belongs on the gate branch, before the product"))
SWIGLU_NO_DOWN = Mistake("forgot_w_down", N_(
    "forgot W_down: the gated product [..., H_ff] is projected back to H by W_down"))
SWIGLU_RESIDUAL = Mistake("added_residual", N_(
    "added x to the output: the residual connection belongs to the block around the FFN "
    "(chapter 10), not to the FFN itself; return (silu(x @ W_gate) * (x @ W_up)) @ W_down"))


def _swiglu_mistakes(x, w_gate, w_up, w_down) -> dict:
    g, u = x @ w_gate, x @ w_up
    silu = ref.silu
    return {
        SWIGLU_SWAPPED: lambda: (silu(u) * g) @ w_down,
        SWIGLU_SILU_OF_PRODUCT: lambda: silu(g * u) @ w_down,
        SWIGLU_NO_GATE: lambda: silu(u) @ w_down,
        SWIGLU_NO_UP: lambda: silu(g) @ w_down,
        SWIGLU_GLU: lambda: (torch.sigmoid(g) * u) @ w_down,
        SWIGLU_REGLU: lambda: (ref.relu(g) * u) @ w_down,
        SWIGLU_GEGLU: lambda: (ref.gelu(g) * u) @ w_down,
        SWIGLU_BILINEAR: lambda: (g * u) @ w_down,
        SWIGLU_SILU_BOTH: lambda: (silu(g) * silu(u)) @ w_down,
        SWIGLU_ADDED: lambda: (silu(g) + u) @ w_down,
        SWIGLU_SILU_AFTER: lambda: silu((g * u) @ w_down),
        SWIGLU_NO_DOWN: lambda: silu(g) * u,
        SWIGLU_RESIDUAL: lambda: x + (silu(g) * u) @ w_down,
    }


# swiglu_ffn is built on silu: a broken silu of the learner's own that swiglu_ffn calls is named
# ("fix silu first"). torch's F.silu is a Python function called `silu` too, and swiglu_ffn may
# use it, so a function from torch (or the standard library) is never blamed.
_SWIGLU_PIECES = {"silu": check_silu}
_LIBRARY_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.__file__) + os.sep)


def _own_silu_first(failure: CheckFailure, record: CallRecord) -> Mistake | None:
    own = {name: fn for name, fn in record.seen.items()
           if not getattr(getattr(fn, "__code__", None), "co_filename", "").startswith(
               _LIBRARY_DIRS)}
    _passed, broken = earlier_failures(own, _SWIGLU_PIECES, failure.seed)
    return None if broken is None else fix_first_text("swiglu_ffn", *broken)


def check_swiglu_ffn(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with builds_on("swiglu_ffn", _SWIGLU_PIECES, hint=_own_silu_first), \
            Check("swiglu_ffn", f, seed=seed, in_place=IN_PLACE_INPUTS,
                  errors=[SWIGLU_PRECEDENCE, SWIGLU_SHAPES, LEADING_AXES]) as c:
        b, s, h, h_ff = c.sizes(4, 2, 14)
        h, h_ff = min(h, h_ff), max(h, h_ff)
        cases = [((b, s, h), torch.float32)] * (3 if thorough else 1)
        cases += [((b * s, h), torch.float32), ((b, s, h), torch.float64)]
        for shape, dtype in cases:
            x = c.randn(*shape, dtype=dtype)
            w_gate, w_up, w_down = _weights(c, h, h_ff, 3, dtype)
            want = ref.swiglu_ffn(x, w_gate, w_up, w_down)
            got = c.call(x, w_gate, w_up, w_down)
            dims = ("B", "S", "H") if len(shape) == 3 else ("T", "H")
            _compare(c, got, want, what=_ffn_what("swiglu_ffn", dtype, shape, h, h_ff),
                     dims=dims, wrong=_swiglu_mistakes(x, w_gate, w_up, w_down))
        c.headline("(silu(x W_gate) * (x W_up)) W_down")
        c.headline(_("[B, S, H] and [T, H] inputs; float64 kept"))


# --------------------------------------------------------------------------------------------
# ffn_param_count

COUNT_FLOAT = Mistake("returned_float", N_("returned a float: return an int"))
COUNT_TENSOR = Mistake("returned_tensor", N_(
    "return a Python int (`int(...)`), not a tensor"))
COUNT_TWO_GATED = Mistake("forgot_third_matrix", N_(
    "forgot the third matrix: a gated FFN has W_gate, W_up and W_down, 3 H H_ff"))
COUNT_THREE_PLAIN = Mistake("three_matrices_for_plain_ffn", N_(
    "counted three matrices for a plain FFN: without a gate there are only W1 and W2, 2 H H_ff"))
COUNT_DOWN_SQUARE = Mistake("down_projection_counted_square", N_(
    "counted W_down as H_ff x H_ff: it maps H_ff back to H, [H_ff, H]"))
COUNT_W2_SQUARE = Mistake("down_projection_counted_square", N_(
    "counted W2 as H_ff x H_ff: it maps H_ff back to H, [H_ff, H]"))
COUNT_BIASES_GATED = Mistake("added_biases", N_(
    "added biases: LLaMA's FFN matrices have no biases"))
COUNT_BIASES_PLAIN = Mistake("added_biases", N_("added biases: the course's FFNs have no biases"))
COUNT_4H = Mistake("assumed_4h", N_("assumed H_ff = 4H: use the ffn_hidden_size you are given"))
COUNT_ONE = Mistake("counted_one_matrix", N_(
    "counted one matrix: each matrix has H x H_ff entries, and there are {count} of them"))


def _count_mistakes(h: int, h_ff: int, gated: bool) -> dict:
    want = ref.ffn_param_count(h, h_ff, gated)
    mistakes = {COUNT_FLOAT: float(want)}
    if gated:
        mistakes[COUNT_TWO_GATED] = 2 * h * h_ff
        mistakes[COUNT_DOWN_SQUARE] = 2 * h * h_ff + h_ff * h_ff
        mistakes[COUNT_BIASES_GATED] = 3 * h * h_ff + 2 * h_ff + h
        mistakes[COUNT_4H] = 12 * h * h
    else:
        mistakes[COUNT_THREE_PLAIN] = 3 * h * h_ff
        mistakes[COUNT_W2_SQUARE] = h * h_ff + h_ff * h_ff
        mistakes[COUNT_BIASES_PLAIN] = 2 * h * h_ff + h_ff + h
        mistakes[COUNT_4H] = 8 * h * h
    mistakes[COUNT_ONE.with_text(_(COUNT_ONE).format(count=3 if gated else 2))] = h * h_ff
    return mistakes


def check_ffn_param_count(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("ffn_param_count", f, seed=seed) as c:
        cases = [(4096, 11008, True), (4096, 16384, False)]
        for _n in range(3 if thorough else 1):
            h, h_ff = c.sizes(2, 16, 400)
            cases += [(h, h_ff, True), (h, h_ff, False)]
        for i, (h, h_ff, gated) in enumerate(cases):
            got = c.call(h, h_ff, gated) if i % 2 == 0 else c.call(h, h_ff, gated=gated)
            what = f"ffn_param_count({h}, {h_ff}, gated={gated})"
            if isinstance(got, torch.Tensor):
                c.fail(_("{what} should be a Python int, got a torch.Tensor ({value}).").format(
                    what=what, value=describe(got)), COUNT_TENSOR)
            c.expect_equal(got, ref.ffn_param_count(h, h_ff, gated), what=what,
                           wrong=_count_mistakes(h, h_ff, gated))
        c.headline("LLaMA-2-7B: 3 x 4096 x 11008 = 135,266,304")
        c.headline(_("gated 3 H H_ff, plain 2 H H_ff"))


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "09.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "relu": (
        RELU_FORBID, RELU_CLAMPED_ABOVE, DETACHED, SQUEEZED, FLOAT32_HARD_WIRED,
        RELU_KEPT_NEGATIVE, RELU_LEAKY, IN_PLACE, PYTHON_SCALAR, RELU_ABS, RELU_STEP,
        RETURNED_COMPARISON, RELU_IDENTITY, MAX_REDUCTION, NUMPY, DTYPE_NOT_KEPT, RELU_OVERFLOW),
    "gelu": (
        GELU_FORBID, GELU_BY_2, GELU_ERF_DIVIDED, GELU_ERF_X, FLOAT32_HARD_WIRED,
        GELU_NO_ONE_PLUS, GELU_NO_HALF, PRECISION, IN_PLACE, PYTHON_SCALAR, GELU_PHI_ONLY,
        GELU_RELU, GELU_SILU, GELU_SIGMOID, GELU_SIGN, GELU_TANH, GELU_TANH_FOR_ERF,
        GELU_NO_CUBIC, GELU_DENSITY, GELU_TIMES_SQRT2, DTYPE_NOT_KEPT, GELU_OVERFLOW),
    "silu": (
        SILU_FORBID, DETACHED, FLOAT32_HARD_WIRED, SILU_GELU_APPROX, IN_PLACE, SILU_OVERFLOWING,
        SILU_GELU, SILU_SIGMOID_ONLY, SILU_SOFTPLUS, SILU_SIGN, SILU_TANH, DTYPE_NOT_KEPT,
        SILU_OVERFLOW, SILU_RELU),
    "ffn": (
        FFN_ACT_AFTER_W2, FFN_ACT_BEFORE_W1, FFN_RESULT_UNUSED, FFN_TWICE, FFN_RESIDUAL,
        LEADING_AXES, FLOAT32_HARD_WIRED, FFN_NO_W2, IGNORED_ACTIVATION, FFN_SHAPES,
        IN_PLACE_INPUTS),
    "swiglu_ffn": (
        SWIGLU_RESIDUAL, SWIGLU_ADDED, LEADING_AXES, SWIGLU_NO_UP, fix_first('silu'),
        FLOAT32_HARD_WIRED, SWIGLU_NO_DOWN, SWIGLU_SWAPPED, SWIGLU_GEGLU, SWIGLU_SHAPES,
        IN_PLACE_INPUTS, SWIGLU_BILINEAR, SWIGLU_NO_GATE, SWIGLU_PRECEDENCE, SWIGLU_REGLU,
        SWIGLU_GLU, SWIGLU_SILU_AFTER, SWIGLU_SILU_OF_PRODUCT, SWIGLU_SILU_BOTH),
    "ffn_param_count": (
        COUNT_BIASES_GATED, COUNT_4H, COUNT_ONE, COUNT_DOWN_SQUARE, COUNT_TWO_GATED, COUNT_FLOAT,
        COUNT_TENSOR, COUNT_THREE_PLAIN),
}
