"""Checks for chapter 10: LayerNorm, RMSNorm, pre-norm and post-norm residual connections.

Both norms run over the hidden (last) axis of x [B, S, H]. RMSNorm follows the course's dtype rule:
float32 inside, cast back to x.dtype before the multiplication by gamma. The residual checks pass
in a sublayer and a norm that record what they receive, so a failure can say which tensor went
through the norm.

Every diagnosis is a `Mistake` declared below (checks.mistakes): its id is "10.<exercise>.<key>";
pre- and post-norm share one check, so their ids differ only in the exercise.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .. import reference as ref
from ..engine import Check, CheckFailure, tolerance, values_close
from ..i18n import N_, _
from ..mistakes import Mistake

# --------------------------------------------------------------------------------------------
# Forbidden shortcuts, by torch function name (the engine also catches `torch.ops.aten` overloads
# such as "layer_norm.default").

_NORM_NAMES = ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm",
               "native_group_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
               "_batch_norm_impl_index", "instance_norm", "normalize")
_NORM_HINT = Mistake("calls_library_norm", N_(
    "write the normalisation yourself from means, squares and a square root: library norms "
    "(F.layer_norm, F.rms_norm, nn.LayerNorm, nn.RMSNorm, F.normalize, group/batch/instance norm) "
    "are off limits in this exercise"))


FORBID_NORMS = dict.fromkeys(_NORM_NAMES, _NORM_HINT)

# --------------------------------------------------------------------------------------------
# Shared helpers

_DIMS3 = ("B", "S", "H")
_AXIS_NAMES = {3: (N_("the batch axis B (dim 0)"), N_("the sequence axis S (dim 1)")),
               2: (N_("the token axis (dim 0)"),)}
_OVER_H = N_("each token's H features are normalised on their own: reduce over the last axis, "
             "`mean(dim=-1, keepdim=True)`")
_KEEPDIM = Mistake("mean_without_keepdim", N_(
    "the mean over the hidden axis has shape [B, S]; keep the reduced axis (`keepdim=True`) so "
    "that it broadcasts against x [B, S, H]"), raises=[("*", r"(?i)must match the size|broadcast")])
_LAST_AXIS = Mistake("hard_coded_axis", N_(
    "the hidden axis is the LAST axis whatever the number of dimensions: use dim=-1, not a fixed "
    "dim=2 (the check also passes a 2-D [tokens, H] input)"),
    raises=[("*", r"(?i)dimension out of range")])
_EPS_KEYWORD = Mistake("no_eps_keyword", N_(
    "accept `eps` as a keyword argument with default 1e-5: `def ...(..., eps=1e-5)`"),
    raises=[("TypeError", r"unexpected keyword argument 'eps'")])
# Shown by the engine's own in-place check, and recognised in autograd's complaint about an
# in-place edit of an input that requires grad.
_IN_PLACE_NORM = Mistake("modified_x_in_place", N_(
    "an in-place operation (`x -= ...`, `x /= ...`, `x.mul_(...)`) wrote into the caller's "
    "tensor: compute a new tensor (`x - mean`, `x / rms`) instead"),
    raises=[("*", r"(?i)in-place operation")])
_NORM_ERRORS = (_KEEPDIM, _LAST_AXIS, _EPS_KEYWORD, _IN_PLACE_NORM)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape_text(x: torch.Tensor) -> str:
    if x.dim() == 3:
        return "[" + ", ".join(f"{d}={n}" for d, n in zip(_DIMS3, x.shape)) + "]"
    return "[" + ", ".join(map(str, x.shape)) + "]"


def _dims(x: torch.Tensor):
    return _DIMS3 if x.dim() == 3 else None




def _sizes(c: Check) -> tuple[int, int, int]:
    """Distinct B, S < H, with H large enough that the norm is not degenerate (H=2 LayerNorm
    gives +-1 whatever the input)."""
    b, s = c.sizes(2, 2, 7)
    return b, s, c.randint(7, 17)


def _tokens(c: Check, *shape: int, offset: float = 0.0,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random tokens whose spread (standard deviation over H) is at least 0.5, plus a random
    per-token offset of size `offset`. With no token near zero spread, eps changes the result by
    far less than the tolerance, so a mistake with eps shows only in the cases built for it, and
    there the eps variants are told apart."""
    z = c.randn(*shape, dtype=torch.float64)
    z = z - z.mean(-1, keepdim=True)
    z = z / z.pow(2).mean(-1, keepdim=True).sqrt()
    spread = 0.5 + c.randn(*shape[:-1], 1, dtype=torch.float64).abs()
    return (z * spread + offset * c.randn(*shape[:-1], 1, dtype=torch.float64)).to(dtype)


def _gamma(c: Check, h: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A scale vector far enough from all-ones that ignoring it shows."""
    return (1.0 + 0.5 * c.randn(h, dtype=torch.float64)).to(dtype)


_FLOAT32_KEPT = Mistake("returned_float32_intermediate", N_(
    "returned the float32 intermediate: cast the normalised x back to x.dtype (`.to(x.dtype)`, "
    "{dtype} here) before multiplying by gamma"))
_FLOAT64_KEPT = Mistake("float64_not_cast_back", N_(
    "computed in float64 and did not cast the result back to x.dtype"))
_DTYPE_CHANGED = Mistake("changed_dtype", N_(
    "the output keeps the input's dtype: the norm changes values, not the dtype"))
_CAST_AFTER_GAMMA = Mistake("cast_after_gamma", N_(
    "cast to x.dtype after multiplying by gamma (or cast gamma down to x.dtype): the rule is to "
    "cast the normalised x back to x.dtype and then multiply by gamma as it is, "
    "`normed.to(x.dtype) * gamma`, so a {gamma} gamma gives a {want} result"))
_DETACHED = Mistake("cut_off_from_autograd", N_(
    "avoid .detach(), .data, .item(), .numpy() or torch.no_grad() inside the function: a model "
    "trains by backpropagating through its norms"))
_NO_GRADIENT_TO = Mistake("no_gradient_to_an_input", N_(
    "the output must be computed from {name} with differentiable torch operations"))


def _expect_dtype(c: Check, got, x: torch.Tensor, want: torch.Tensor, *, what: str,
                  rms: bool, gamma: torch.Tensor | None = None) -> None:
    """A dtype mismatch (with the right shape) fails with a hint; the rest is expect_tensor's."""
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape
            and got.dtype != want.dtype):
        return
    if want.dtype != x.dtype:  # x cast back, times a gamma of a wider dtype
        c.fail(_("{what} has dtype {got}, expected {want}: the normalised x is cast back to "
                 "{x_dtype} and then multiplied by a {gamma} gamma, which gives {want}.").format(
                     what=what, got=got.dtype, want=want.dtype, x_dtype=_name(x.dtype),
                     gamma=_name(gamma.dtype)),
               _CAST_AFTER_GAMMA.with_text(_(_CAST_AFTER_GAMMA).format(
                   gamma=_name(gamma.dtype), want=_name(want.dtype)))
               if got.dtype == x.dtype else _DTYPE_CHANGED)
    if rms and got.dtype == torch.float32 and x.dtype != torch.float32:
        hint = _FLOAT32_KEPT.with_text(_(_FLOAT32_KEPT).format(dtype=_name(x.dtype)))
    elif got.dtype == torch.float64 and x.dtype != torch.float64:
        hint = _FLOAT64_KEPT
    else:
        hint = _DTYPE_CHANGED
    c.fail(_("{what} has dtype {got}, expected {want} (the dtype of x).").format(
        what=what, got=got.dtype, want=want.dtype), hint)


def _expect_grads(c: Check, f_args: tuple, ref_fn: Callable, *, what: str,
                  names: tuple[str, ...]) -> None:
    """Gradients of a fixed random projection of the output w.r.t. the listed inputs."""
    leaves = [a.detach().clone().requires_grad_(True) for a in f_args]
    got = c.call(*leaves)
    if not isinstance(got, torch.Tensor):
        c.fail(_("{what} should be a torch.Tensor, got {kind}.").format(
            what=what, kind=type(got).__name__))
    if not got.requires_grad:
        c.fail(_("{what}: the output does not depend on the inputs as far as autograd can tell, "
                 "so no gradient flows back through the norm.").format(what=what), _DETACHED)
    ref_leaves = [a.detach().clone().requires_grad_(True) for a in f_args]
    want = ref_fn(*ref_leaves)
    probe = torch.randn(want.shape, generator=c.gen, dtype=torch.float64).to(want.dtype)
    got_grads = torch.autograd.grad((got * probe).sum(), leaves, allow_unused=True)
    want_grads = torch.autograd.grad((want * probe).sum(), ref_leaves)
    for name, g, w in zip(names, got_grads, want_grads):
        if g is None:
            c.fail(_("{what}: no gradient reaches {name}.").format(what=what, name=name),
                   _NO_GRADIENT_TO.with_text(_(_NO_GRADIENT_TO).format(name=name)))
        c.expect_tensor(g, w, what=_("the gradient with respect to {name} ({what})").format(
            name=name, what=what))


# --------------------------------------------------------------------------------------------
# layer_norm

_UNBIASED = Mistake("unbiased_variance", N_(
    "divided the squared deviations by H - 1: `torch.var` and `torch.std` default to the "
    "unbiased estimate; LayerNorm uses the plain mean over the H features (pass "
    "`unbiased=False`, or `correction=0`, and keep eps inside the square root)"))
_EPS_OUTSIDE = Mistake("eps_outside_sqrt", N_(
    "put eps outside the square root, sqrt(...) + eps: it belongs inside, sqrt(... + eps) (the "
    "difference shows for small inputs)"))
_NO_EPS = Mistake("left_out_eps", N_(
    "left out eps: it keeps the division finite when a token's spread is (nearly) zero, sqrt(var "
    "+ eps)"))
_NO_EPS_RMS = Mistake("left_out_eps", N_(
    "left out eps: it keeps the division finite when a token is (nearly) all zeros, "
    "sqrt(mean(x²) + eps)"))
_EPS_IGNORED = Mistake("ignored_eps_argument", N_(
    "ignored the `eps` argument and used 1e-5 anyway"))
_DEFAULT_EPS = Mistake("default_eps_1e6", N_(
    "the default eps is 1e-5 (`def ...(..., eps=1e-5)`), as the chapter states; yours seems to "
    "be 1e-6 (the value some LLaMA configurations set)"))
_NO_GAMMA = Mistake("left_out_gamma", N_(
    "left out gamma: the normalised x is multiplied elementwise by gamma"))
_NO_BETA = Mistake("left_out_beta", N_(
    "left out beta: LayerNorm adds the shift beta after scaling by gamma"))
_SWAPPED = Mistake("swapped_gamma_and_beta", N_(
    "swapped gamma and beta: gamma scales (multiplies), beta shifts (adds)"))
_BETA_FIRST = Mistake("beta_before_gamma", N_(
    "added beta before scaling: the order is gamma * x_hat + beta"))
_NO_MEAN = Mistake("did_not_subtract_mean", N_(
    "did not subtract the mean: LayerNorm centres each token first, x - mean, and divides by the "
    "standard deviation (without centring it would be RMSNorm)"))
_RMS_OF_X = Mistake("divided_by_rms_of_x", N_(
    "subtracted the mean, but divided by the root mean square of x itself: divide by the "
    "standard deviation, sqrt(mean((x - mean)²) + eps)"))
_NO_SQRT_LN = Mistake("divided_by_variance", N_(
    "divided by the variance: divide by its square root, sqrt(var + eps)"))
_FLOAT32_LN = Mistake("computed_in_float32", N_(
    "computed in float32: layer_norm should keep the precision of its input, so compute in x's "
    "own dtype (float64 here)"))
_CANCELLATION = Mistake("one_pass_variance", N_(
    "the values are off only for tokens whose mean (1e5) is huge compared with their spread (1): "
    "computing the variance as mean(x²) - mean(x)² subtracts two nearly equal large numbers and "
    "loses the difference to rounding (catastrophic cancellation); subtract the mean first and "
    "average (x - mean)²"))


_WRONG_AXIS = Mistake("mean_over_wrong_axis", N_(
    "normalised over {axis} instead of the hidden axis H; {fix}"))
_EVERY_ENTRY = Mistake("mean_over_every_entry", N_(
    "normalised over every entry of x at once; {fix}"))
_NO_GAMMA_NO_BETA = Mistake("left_out_gamma_and_beta", N_(
    "left out both gamma and beta: scale by gamma, then shift by beta"))


def _axis_variants(x: torch.Tensor, formula: Callable) -> dict:
    """`formula(dims)` over each wrong axis, and over every axis at once."""
    variants = {}
    names = _AXIS_NAMES.get(x.dim(), ())
    for axis, name in enumerate(names):
        variants[_WRONG_AXIS.with_text(_(_WRONG_AXIS).format(axis=_(name), fix=_(_OVER_H)))] = (
            lambda axis=axis: formula(axis))
    if x.dim() > 1:
        variants[_EVERY_ENTRY.with_text(_(_EVERY_ENTRY).format(fix=_(_OVER_H)))] = (
            lambda: formula(tuple(range(x.dim()))))
    return variants


def _layer_norm_mixups(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
                       eps: float, *, float32_variant: bool = True) -> dict:
    xd, g, b = x.double(), gamma.double(), beta.double()
    dt = x.dtype
    mu = xd.mean(-1, keepdim=True)
    var = (xd - mu).pow(2).mean(-1, keepdim=True)
    var_unbiased = xd.var(-1, keepdim=True, correction=1)
    ms = xd.pow(2).mean(-1, keepdim=True)
    xhat = (xd - mu) / (var + eps).sqrt()

    def over(dims):
        m = xd.mean(dims, keepdim=True)
        v = (xd - m).pow(2).mean(dims, keepdim=True)
        return ((xd - m) / (v + eps).sqrt() * g + b).to(dt)

    variants = _axis_variants(x, over)
    variants.update({
        _UNBIASED: lambda: ((xd - mu) / (var_unbiased + eps).sqrt() * g + b).to(dt),
        _EPS_OUTSIDE: lambda: ((xd - mu) / (var.sqrt() + eps) * g + b).to(dt),
        _NO_EPS: lambda: ((xd - mu) / var.sqrt() * g + b).to(dt),
        _NO_GAMMA: lambda: (xhat + b).to(dt),
        _NO_BETA: lambda: (xhat * g).to(dt),
        _SWAPPED: lambda: (xhat * b + g).to(dt),
        _BETA_FIRST: lambda: ((xhat + b) * g).to(dt),
        _NO_GAMMA_NO_BETA: lambda: xhat.to(dt),
        _NO_MEAN: lambda: (xd / (ms + eps).sqrt() * g + b).to(dt),
        _RMS_OF_X: lambda: ((xd - mu) / (ms + eps).sqrt() * g + b).to(dt),
        _NO_SQRT_LN: lambda: ((xd - mu) / (var + eps) * g + b).to(dt),
    })
    if eps != 1e-5:
        variants[_EPS_IGNORED] = lambda: ((xd - mu) / (var + 1e-5).sqrt() * g + b).to(dt)
    else:
        variants[_DEFAULT_EPS] = lambda: ((xd - mu) / (var + 1e-6).sqrt() * g + b).to(dt)
    if dt == torch.float64 and float32_variant:
        # A float32 tensor: the engine compares a variant at the variant's own dtype tolerance.
        variants[_FLOAT32_LN] = lambda: ref.layer_norm(x.float(), gamma.float(), beta.float(),
                                                       eps)
    return variants


def _expect_layer_norm(c: Check, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, *,
                       eps: float | None = None, what: str, large_mean: bool = False) -> None:
    """One comparison with the reference. `large_mean`: tokens whose mean dwarfs their spread,
    where a failure that no variant explains is the one-pass variance's cancellation (and where
    that error would also pass for a float32 computation, so that variant is left out)."""
    before = x.clone()
    eps_used = 1e-5 if eps is None else eps
    got = (c.call(x, gamma, beta) if eps is None else c.call(x, gamma, beta, eps=eps))
    want = ref.layer_norm(before, gamma, beta, eps_used)
    _expect_dtype(c, got, before, want, what=what, rms=False)
    try:
        c.expect_tensor(got, want, what=what, dims=_dims(x),
                        wrong=_layer_norm_mixups(before, gamma, beta, eps_used,
                                                 float32_variant=not large_mean))
    except CheckFailure as failure:
        if failure.hint is None and large_mean and type(failure) is CheckFailure:
            raise failure.with_hint(_CANCELLATION) from None
        raise


def check_layer_norm(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("layer_norm", f, seed=seed, forbid=FORBID_NORMS, errors=_NORM_ERRORS,
               in_place=_IN_PLACE_NORM) as c:
        for _n in range(3 if thorough else 1):
            b, s, h = _sizes(c)
            # tokens with their own offset and spread, so that centring and scaling both matter
            x = _tokens(c, b, s, h, offset=2.0)
            _expect_layer_norm(c, x, _gamma(c, h), 0.5 * c.randn(h),
                               what=_("{call} for x {shape}").format(
                                   call="layer_norm(x, gamma, beta)", shape=_shape_text(x)))
        c.headline(_("over the hidden axis of [B, S, H]"))
        c.headline(_("biased variance, eps inside the square root"))
        c.headline(_("gamma scales, beta shifts"))
        t, h = c.sizes(2, 4, 12)
        x = _tokens(c, t, h, offset=1.5)
        _expect_layer_norm(c, x, _gamma(c, h), 0.5 * c.randn(h),
                           what=_("{name} of a 2-D x [{t}, {h}] (tokens, H)").format(
                               name="layer_norm", t=t, h=h))
        c.headline(_("any number of leading axes"))
        # a constant token (variance 0: eps keeps it finite, the output is beta) and tiny spreads,
        # where the place of eps matters
        b, s, h = _sizes(c)
        x = c.randn(b, s, h, scale=1e-3)
        x[0, 0] = 0.75  # exactly representable, so its mean is exact too
        _expect_layer_norm(c, x, _gamma(c, h), 0.5 * c.randn(h),
                           what=_("layer_norm of small-spread tokens (std ~ 1e-3, one "
                                  "constant token) x {shape}").format(shape=_shape_text(x)))
        x = c.randn(b, s, h, scale=0.05)
        _expect_layer_norm(c, x, _gamma(c, h), 0.5 * c.randn(h), eps=1e-2,
                           what=_("{call} for x {shape}").format(
                               call="layer_norm(x, gamma, beta, eps=1e-2)",
                               shape=_shape_text(x)))
        c.headline(_("eps used, and a constant token gives beta"))
        b, s, h = _sizes(c)
        x = c.randn(b, s, h, dtype=torch.float64) * 3.0 + 50.0
        _expect_layer_norm(c, x, _gamma(c, h, torch.float64),
                           0.5 * c.randn(h, dtype=torch.float64),
                           what=_("{name} of a {dtype} x {shape}").format(
                               name="layer_norm", dtype="float64", shape=_shape_text(x)))
        x = c.randn(b, s, h, dtype=torch.float64) + 1e5
        _expect_layer_norm(c, x, _gamma(c, h, torch.float64),
                           0.5 * c.randn(h, dtype=torch.float64),
                           what=_("layer_norm of float64 tokens with mean 1e5 and spread 1, "
                                  "x {shape}").format(shape=_shape_text(x)), large_mean=True)
        c.headline(_("dtype kept; stable for a large mean"))
        b, s, h = _sizes(c)
        _expect_grads(c, (c.randn(b, s, h) + 1.0, _gamma(c, h), 0.5 * c.randn(h)),
                      lambda x, g, bt: ref.layer_norm(x, g, bt), names=("x", "gamma", "beta"),
                      what="layer_norm")
        c.headline(_("gradients flow to x, gamma and beta"))
        c.note(_("input left unchanged"))


# --------------------------------------------------------------------------------------------
# rms_norm

_MEAN_SUBTRACTED = Mistake("subtracted_mean", N_(
    "subtracted the mean: RMSNorm does not centre x, it divides x itself by its root mean square "
    "(subtracting the mean is what LayerNorm does)"))
_GAMMA_ADDED = Mistake("added_gamma", N_(
    "added gamma: it is a scale, multiply the normalised x by it"))
_GAMMA_INSIDE = Mistake("gamma_before_rms", N_(
    "multiplied x by gamma before computing the RMS: normalise x first, then scale the result by "
    "gamma"))
_NO_SQRT = Mistake("divided_by_mean_square", N_(
    "divided by the mean square: divide by its square root, the ROOT mean square, sqrt(mean(x²) "
    "+ eps)"))
_SUM_SQUARES = Mistake("sum_of_squares", N_(
    "used the sum of squares (the L2 norm) instead of their mean: divide by sqrt(mean(x²) + "
    "eps), which is the L2 norm over sqrt(H)"))
_LOW_PRECISION = Mistake("half_precision_inside", N_(
    "squared x in float16: x² overflows float16 (largest value 65504) once |x| > 256, so "
    "mean(x²) becomes inf and the output collapses to 0; convert x to float32 first "
    "(`x.float()`), normalise there, cast back with `.to(x.dtype)`, then multiply by gamma"))
_LARGE_FLOAT16 = Mistake("half_precision_inside", N_(
    "for |x| ~ 1e4 in float16 the intermediate values leave float16's range (x² is far above "
    "65504, 1 / rms far below float16's smallest normal number 6e-5): compute the whole "
    "normalisation in float32 and cast back only its result, before multiplying by gamma"))
# Away from overflow a low-precision RMSNorm is only a rounding step off, inside the bfloat16 and
# float16 tolerances; with gamma = 1 a float32-inside implementation reproduces the reference
# bit for bit (at most 0.1% of the entries differ, at a rounding tie), while a computation that
# runs partly in half precision differs in 12% or more of them (measured over 300 seeds and four
# formulations of each). More than this fraction fails.
_ROUNDING_FRACTION = 0.03
_PARTLY_HALF = Mistake("partly_half_precision", N_(
    "the normalisation seems to run (at least partly) in {dtype}: convert x to float32 first "
    "(`x.float()`), compute x / sqrt(mean(x²) + eps) there, cast back with `.to(x.dtype)`, then "
    "multiply by gamma"))
_SQUARED_MEAN = Mistake("squared_the_mean", N_(
    "squared the mean instead of averaging the squares: RMSNorm divides by "
    "sqrt(mean(x²) + eps), the mean of x², not mean(x)²"))


def _rms_norm_mixups(x: torch.Tensor, gamma: torch.Tensor, eps: float, *,
                     low_precision: bool = False) -> dict:
    xd, g = x.double(), gamma.double()
    dt = x.dtype
    ms = xd.pow(2).mean(-1, keepdim=True)
    normed = xd / (ms + eps).sqrt()
    variants = {}
    if low_precision:  # the whole formula in x's own dtype, as written without an upcast
        variants[_LOW_PRECISION] = lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) +
                                                           eps) * gamma

    def over(dims):
        return (xd / (xd.pow(2).mean(dims, keepdim=True) + eps).sqrt() * g).to(dt)

    variants.update(_axis_variants(x, over))
    mu = xd.mean(-1, keepdim=True)
    var = (xd - mu).pow(2).mean(-1, keepdim=True)
    variants.update({
        _MEAN_SUBTRACTED: lambda: ((xd - mu) / (var + eps).sqrt() * g).to(dt),
        _EPS_OUTSIDE: lambda: (xd / (ms.sqrt() + eps) * g).to(dt),
        _NO_EPS_RMS: lambda: (xd / ms.sqrt() * g).to(dt),
        _NO_GAMMA: lambda: normed.to(dt),
        _GAMMA_ADDED: lambda: (normed + g).to(dt),
        _GAMMA_INSIDE: lambda: (xd * g / ((xd * g).pow(2).mean(-1, keepdim=True) + eps).sqrt()
                                ).to(dt),
        _NO_SQRT: lambda: (xd / (ms + eps) * g).to(dt),
        _SUM_SQUARES: lambda: (xd / (xd.pow(2).sum(-1, keepdim=True) + eps).sqrt() * g).to(dt),
        _SQUARED_MEAN: lambda: (xd / (mu.pow(2) + eps).sqrt() * g).to(dt),
    })
    if eps != 1e-5:
        variants[_EPS_IGNORED] = lambda: (xd / (ms + 1e-5).sqrt() * g).to(dt)
    else:
        variants[_DEFAULT_EPS] = lambda: (xd / (ms + 1e-6).sqrt() * g).to(dt)
    return variants


def _expect_rms_norm(c: Check, x: torch.Tensor, gamma: torch.Tensor, *,
                     eps: float | None = None, what: str, low_precision: bool = False,
                     bitwise: bool = False, hint_if_unknown: Mistake | None = None) -> None:
    before = x.clone()
    eps_used = 1e-5 if eps is None else eps
    got = c.call(x, gamma) if eps is None else c.call(x, gamma, eps=eps)
    want = ref.rms_norm(before, gamma, eps_used)
    _expect_dtype(c, got, before, want, what=what, rms=True, gamma=gamma)
    # With a gamma wider than x the result has gamma's dtype, but its precision is x's.
    atol, rtol = tolerance(before.dtype) if want.dtype != before.dtype else (None, None)
    try:
        c.expect_tensor(got, want, what=what, dims=_dims(x), atol=atol, rtol=rtol,
                        wrong=_rms_norm_mixups(before, gamma, eps_used,
                                               low_precision=low_precision))
    except CheckFailure as failure:
        if failure.hint is None and hint_if_unknown and type(failure) is CheckFailure:
            raise failure.with_hint(hint_if_unknown) from None
        raise
    if bitwise:
        differ = int((got.detach() != want).sum())
        if differ > _ROUNDING_FRACTION * want.numel():
            name = _name(x.dtype)
            c.fail(_("{what}: the values are within {dtype} tolerance, but {count} of {total} "
                     "entries differ by a rounding step from the result computed in float32 and "
                     "cast back.").format(what=what, dtype=name, count=differ,
                                          total=want.numel()),
                   _PARTLY_HALF.with_text(_(_PARTLY_HALF).format(dtype=name)))


def check_rms_norm(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("rms_norm", f, seed=seed, forbid=FORBID_NORMS, errors=_NORM_ERRORS,
               in_place=_IN_PLACE_NORM) as c:
        for _n in range(3 if thorough else 1):
            b, s, h = _sizes(c)
            x = _tokens(c, b, s, h, offset=0.3)
            _expect_rms_norm(c, x, _gamma(c, h),
                             what=_("{call} for x {shape}").format(
                                 call="rms_norm(x, gamma)", shape=_shape_text(x)))
        b, s, h = _sizes(c)
        x = _tokens(c, b, s, h, offset=3.0)  # tokens far from mean zero
        _expect_rms_norm(c, x, _gamma(c, h),
                         what=_("rms_norm of tokens with non-zero means, x {shape}").format(
                             shape=_shape_text(x)))
        c.headline(_("over the hidden axis of [B, S, H], no centring"))
        t, h = c.sizes(2, 4, 12)
        x = _tokens(c, t, h)
        _expect_rms_norm(c, x, _gamma(c, h), what=_("{name} of a 2-D x [{t}, {h}] (tokens, H)")
                         .format(name="rms_norm", t=t, h=h))
        c.headline(_("any number of leading axes"))
        # small inputs (RMS ~ 1e-3, comparable with sqrt(eps)), where the place of eps matters,
        # and an all-zero token, which eps keeps finite
        b, s, h = _sizes(c)
        x = c.randn(b, s, h, scale=1e-3)
        x[-1, 0] = 0.0
        _expect_rms_norm(c, x, _gamma(c, h),
                         what=_("rms_norm of small inputs (RMS ~ 1e-3, one all-zero token), "
                                "x {shape}").format(shape=_shape_text(x)))
        x = c.randn(b, s, h, scale=0.05)
        _expect_rms_norm(c, x, _gamma(c, h), eps=1e-2,
                         what=_("{call} for x {shape}").format(
                             call="rms_norm(x, gamma, eps=1e-2)", shape=_shape_text(x)))
        c.headline(_("eps inside the square root"))
        dtypes = [torch.bfloat16, torch.float16]
        for dtype in dtypes:
            b, s, h = _sizes(c)
            x = c.randn(b, s, h, dtype=dtype)
            _expect_rms_norm(c, x, _gamma(c, h, dtype),
                             what=_("{name} of a {dtype} x {shape}").format(
                                 name="rms_norm", dtype=_name(dtype), shape=_shape_text(x))
                             + f" (gamma {_name(dtype)})")
        # gamma wider than x (float32 weights, half-precision activations): the rule "cast back,
        # then multiply by gamma" gives gamma's dtype; casting after the product gives x's
        for dtype in (dtypes if thorough else [c.choice(dtypes)]):
            b, s, h = _sizes(c)
            x = c.randn(b, s, h, dtype=dtype)
            _expect_rms_norm(c, x, _gamma(c, h),
                             what=_("{name} of a {dtype} x {shape}").format(
                                 name="rms_norm", dtype=_name(dtype), shape=_shape_text(x))
                             + " (gamma float32)")
        # x ~ 1e4 in float16: x² (~1e8) overflows float16, not float32
        b, s, h = _sizes(c)
        x = c.randn(b, s, h, dtype=torch.float16, scale=1e4)
        _expect_rms_norm(c, x, _gamma(c, h, torch.float16), low_precision=True,
                         hint_if_unknown=_LARGE_FLOAT16,
                         what=_("rms_norm of a float16 x ~ 1e4 (x² overflows float16), x "
                                "{shape}").format(shape=_shape_text(x)))
        # wide tokens with gamma = 1: a float32-inside result matches the reference bit for bit
        for dtype in (dtypes if thorough else [c.choice(dtypes)]):
            b, s = c.sizes(2, 3, 8)
            h = c.randint(128, 193)
            x = c.randn(b, s, h, dtype=dtype, scale=0.2 + 3 * c.randn(1).abs().item())
            _expect_rms_norm(c, x, torch.ones(h, dtype=dtype), bitwise=True,
                             what=_("{name} of a {dtype} x {shape}").format(
                                 name="rms_norm", dtype=_name(dtype), shape=_shape_text(x))
                             + ", gamma = 1")
        c.headline(_("bfloat16/float16: float32 inside, dtype kept"))
        c.headline(_("cast back before gamma"))
        b, s, h = _sizes(c)
        _expect_grads(c, (c.randn(b, s, h), _gamma(c, h)), lambda x, g: ref.rms_norm(x, g),
                      names=("x", "gamma"), what="rms_norm")
        c.headline(_("gradients flow to x and gamma"))
        c.note(_("input left unchanged"))


# --------------------------------------------------------------------------------------------
# pre_norm_residual and post_norm_residual


class _Recorder:
    """A sublayer or norm for the check: computes `fn` and keeps a copy of every input."""

    def __init__(self, name: str, fn: Callable):
        self.__name__ = name
        self.fn = fn
        self.inputs: list[torch.Tensor] = []

    def __call__(self, h):
        if not isinstance(h, torch.Tensor):
            raise TypeError(_("{name} expects a tensor [B, S, H], got {kind}").format(
                name=self.__name__, kind=type(h).__name__))
        self.inputs.append(h.detach().clone())
        return self.fn(h)


def _blocks(c: Check, h: int) -> list[tuple[str, Callable, Callable]]:
    """(label, sublayer, norm) pairs: a random MLP sublayer with an RMSNorm and a LayerNorm, and a
    linear sublayer with an RMSNorm. Every mistake gives a different output for each of them."""
    w1, w2 = c.randn(h, h, scale=1.5 / math.sqrt(h)), c.randn(h, h, scale=1 / math.sqrt(h))
    w3 = c.randn(h, h, scale=2 / math.sqrt(h))
    g1, g2, beta = _gamma(c, h), _gamma(c, h), 0.5 * c.randn(h)

    def mlp(z):
        return torch.tanh(z @ w1) @ w2

    def linear(z):
        return z @ w3 + 0.5

    def rms(z):
        return ref.rms_norm(z, g1)

    def layer(z):
        return ref.layer_norm(z, g2, beta)

    return [(_("an MLP sublayer and an RMSNorm"), mlp, rms),
            (_("an MLP sublayer and a LayerNorm"), mlp, layer),
            (_("a linear sublayer and an RMSNorm"), linear, rms)]


_PRE_WANT = "x + sublayer(norm(x))"
_POST_WANT = "norm(x + sublayer(x))"

PRE_NO_RESIDUAL = Mistake("missing_residual", N_(
    "missing residual: the block returns x + sublayer(norm(x)); without `x +` it forgets its "
    "input"))
PRE_IS_POST = Mistake("norm_after_the_add", N_(
    "applied the norm after the residual add: norm(x + sublayer(x)) is post-norm; pre-norm "
    "normalises only the sublayer's input and adds the sublayer's output to x itself"))
PRE_NORMALISED_RESIDUAL = Mistake("normalised_residual", N_(
    "added the normalised x as the residual: the residual path carries x itself, untouched (only "
    "the sublayer's input is normalised): x + sublayer(norm(x))"))
PRE_NORM_ON_OUTPUT = Mistake("norm_on_sublayer_output", N_(
    "normalised the sublayer's output instead of its input: pre-norm is x + sublayer(norm(x))"))
PRE_NORM_BOTH = Mistake("norm_on_input_and_output", N_(
    "normalised both the sublayer's input and its output: only the input is normalised, "
    "x + sublayer(norm(x))"))
PRE_RESIDUAL_TWICE = Mistake("residual_twice", N_(
    "added the residual twice: x + x + sublayer(norm(x)); add x once"))
PRE_NO_NORM = Mistake("forgot_the_norm", N_(
    "forgot the norm: x + sublayer(x) has no normalisation at all; pre-norm is x + "
    "sublayer(norm(x))"))
POST_NO_NORM = Mistake("forgot_the_final_norm", N_(
    "forgot the final norm: post-norm normalises the sum, norm(x + sublayer(x)); x + "
    "sublayer(x) is a plain residual"))
POST_IS_PRE = Mistake("wrote_pre_norm", N_(
    "wrote pre-norm, x + sublayer(norm(x)): post-norm feeds x itself to the sublayer and "
    "normalises after the add, norm(x + sublayer(x))"))
POST_NO_RESIDUAL = Mistake("missing_residual", N_(
    "missing residual: norm(sublayer(x)) forgets the input; post-norm is norm(x + sublayer(x))"))
POST_NORM_THEN_ADD = Mistake("norm_on_sublayer_output", N_(
    "normalised the sublayer's output and then added x: the norm must see the sum, "
    "norm(x + sublayer(x))"))
POST_ADDED_AFTER = Mistake("residual_added_after_the_norm", N_(
    "added the residual again after the norm: norm(x + sublayer(x)) + x adds x twice; return "
    "norm(x + sublayer(x))"))
POST_RESIDUAL_TWICE = Mistake("residual_twice", N_(
    "added the residual twice inside the norm: norm(x + x + sublayer(x)); add x once"))
POST_NORM_INPUT = Mistake("normalised_sublayer_input", N_(
    "normalised the sublayer's input too: post-norm's sublayer gets x itself, "
    "norm(x + sublayer(x))"))
RESIDUAL_IN_PLACE = Mistake("modified_x_in_place", N_(
    "`x += ...` writes into the caller's tensor (the residual stream that the next block still "
    "needs); write `x + ...`, which makes a new tensor"),
    raises=[("*", r"(?i)in-place operation")])
CALLED_TWICE = Mistake("called_more_than_once", N_(
    "in a real block the sublayer is a whole attention or feed-forward layer and the norm has "
    "its own weights: each runs exactly once per block"))
RESIDUAL_PATH_DETACHED = Mistake("residual_path_detached", N_(
    "the values are right but no gradient flows along the residual path: x itself is added "
    "detached (`x.detach()`, `x.data`, a copy through `torch.tensor(x)`); add x as it is, so "
    "that the gradient reaches it both directly and through the sublayer"))
SUBLAYER_PATH_DETACHED = Mistake("sublayer_path_detached", N_(
    "the values are right but no gradient flows through the sublayer: its output is detached "
    "(`.detach()`, `.data` or `torch.no_grad()` around sublayer/norm); only the residual path "
    "carries a gradient back to x"))
RESIDUAL_DETACHED = Mistake("cut_off_from_autograd", N_(
    "avoid .detach(), .data or torch.no_grad() inside the function"))
# What the recorded inputs of the norm and the sublayer tell, when no variant above matches: the
# key names the first thing that went wrong.
_NEVER_CALLED = {"norm": Mistake("norm_never_called", N_("{name} was never called")),
                 "sublayer": Mistake("sublayer_never_called", N_("{name} was never called"))}
_RECEIVED = {"norm": Mistake("norm_got_the_wrong_tensor", N_("{name} received {got}, not {want}")),
             "sublayer": Mistake("sublayer_got_the_wrong_tensor",
                                 N_("{name} received {got}, not {want}"))}
_ASSEMBLED = Mistake("output_assembled_wrongly", N_(
    "norm and sublayer received the right tensors, so the mistake is in how the output is put "
    "together: return {formula}"))


def _pre_mixups(x, s, n) -> dict:
    return {
        PRE_NO_RESIDUAL: lambda: s(n(x)),
        PRE_IS_POST: lambda: n(x + s(x)),
        PRE_NORMALISED_RESIDUAL: lambda: n(x) + s(n(x)),
        PRE_NORM_ON_OUTPUT: lambda: x + n(s(x)),
        PRE_NORM_BOTH: lambda: x + n(s(n(x))),
        PRE_RESIDUAL_TWICE: lambda: 2 * x + s(n(x)),
        PRE_NO_NORM: lambda: x + s(x),
    }


def _post_mixups(x, s, n) -> dict:
    return {
        POST_NO_NORM: lambda: x + s(x),
        POST_IS_PRE: lambda: x + s(n(x)),
        POST_NO_RESIDUAL: lambda: n(s(x)),
        POST_NORM_THEN_ADD: lambda: x + n(s(x)),
        POST_ADDED_AFTER: lambda: n(x + s(x)) + x,
        POST_RESIDUAL_TWICE: lambda: n(2 * x + s(x)),
        POST_NORM_INPUT: lambda: n(x + s(n(x))),
    }


def _identify(t: torch.Tensor, candidates: dict) -> str:
    for name, value in candidates.items():
        if t.shape == value.shape and values_close(t, value, 2e-5, 2e-4):
            return name
    return _("a tensor that is none of x, norm(x), sublayer(x) or their sums")


def _structure_hint(kind: str, x, sub: _Recorder, norm: _Recorder, s, n) -> Mistake:
    """Say what went through the norm and the sublayer, from their recorded inputs."""
    candidates = {_("x itself"): x, "norm(x)": n(x), "sublayer(x)": s(x),
                  "x + sublayer(x)": x + s(x), "sublayer(norm(x))": s(n(x)),
                  "x + sublayer(norm(x))": x + s(n(x))}
    if kind == "pre":
        want, expected = _PRE_WANT, ((norm, "x", x), (sub, "norm(x)", n(x)))
    else:
        want, expected = _POST_WANT, ((norm, "x + sublayer(x)", x + s(x)), (sub, "x", x))
    problems, first = [], None
    for rec, should_name, should in expected:
        if not rec.inputs:
            problems.append(_(_NEVER_CALLED[rec.__name__]).format(name=rec.__name__))
            first = first or _NEVER_CALLED[rec.__name__]
        elif not (rec.inputs[0].shape == should.shape
                  and values_close(rec.inputs[0], should, 2e-5, 2e-4)):
            problems.append(_(_RECEIVED[rec.__name__]).format(
                name=rec.__name__, got=_identify(rec.inputs[0], candidates), want=should_name))
            first = first or _RECEIVED[rec.__name__]
    if problems:
        return first.with_text("; ".join(problems) + "; " + _("{kind}-norm is {formula}").format(
            kind=kind, formula=want))
    return _ASSEMBLED.with_text(_(_ASSEMBLED).format(formula=want))


def _residual_case(c: Check, kind: str, x: torch.Tensor, s: Callable, n: Callable, *,
                   label: str) -> None:
    name = f"{kind}_norm_residual"
    sub, norm = _Recorder("sublayer", s), _Recorder("norm", n)
    before = x.clone()
    got = c.call(x, sub, norm)
    reference = ref.pre_norm_residual if kind == "pre" else ref.post_norm_residual
    want = reference(before, s, n)
    mixups = (_pre_mixups if kind == "pre" else _post_mixups)(before, s, n)
    what = _("{name}(x, sublayer, norm) for x {shape} with {blocks}").format(
        name=name, shape=_shape_text(x), blocks=label)
    try:
        c.expect_tensor(got, want, what=what, dims=_DIMS3, wrong=mixups)
    except CheckFailure as failure:
        if failure.hint is None and type(failure) is CheckFailure:
            raise failure.with_hint(_structure_hint(kind, before, sub, norm, s, n)) from None
        raise
    for rec, should in ((norm, "x" if kind == "pre" else "x + sublayer(x)"),
                        (sub, "norm(x)" if kind == "pre" else "x")):
        if len(rec.inputs) != 1:
            c.fail(_("{name} called {callee} {count} times; call it once, on {formula}, and "
                     "reuse the result.").format(name=name, callee=rec.__name__,
                                                 count=len(rec.inputs), formula=should),
                   CALLED_TWICE)


def _check_residual(kind: str, f, *, seed: int | None, thorough: bool) -> None:
    with Check(f"{kind}_norm_residual", f, seed=seed, in_place=RESIDUAL_IN_PLACE,
               errors=[RESIDUAL_IN_PLACE]) as c:
        for _n in range(2 if thorough else 1):
            b, s, h = _sizes(c)
            for label, sub, norm in _blocks(c, h):
                _residual_case(c, kind, c.randn(b, s, h) * 2.0 + 0.5, sub, norm, label=label)
        c.headline("x + sublayer(norm(x))" if kind == "pre" else "norm(x + sublayer(x))")
        c.note(_("norm and sublayer each called once, on the right tensor"))
        c.note(_("input left unchanged"))
        # gradients flow back to x through both the residual path and the sublayer
        b, s, h = _sizes(c)
        label, sub, norm = _blocks(c, h)[0]
        x = c.randn(b, s, h).requires_grad_(True)
        got = c.call(x, _Recorder("sublayer", sub), _Recorder("norm", norm))
        if not isinstance(got, torch.Tensor) or not got.requires_grad:
            c.fail(_("{name}: no gradient flows back to x.").format(
                name=f"{kind}_norm_residual"), RESIDUAL_DETACHED)
        probe = torch.randn(got.shape, generator=c.gen)

        def grad_of(formula: Callable) -> torch.Tensor:
            z = x.detach().clone().requires_grad_()
            return torch.autograd.grad((formula(z) * probe).sum(), z)[0]

        if kind == "pre":
            w = grad_of(lambda z: ref.pre_norm_residual(z, sub, norm))
            wrong = {RESIDUAL_PATH_DETACHED: lambda: grad_of(lambda z: z.detach() + sub(norm(z))),
                     SUBLAYER_PATH_DETACHED: lambda: grad_of(lambda z: z + sub(norm(z)).detach())}
        else:
            w = grad_of(lambda z: ref.post_norm_residual(z, sub, norm))
            wrong = {RESIDUAL_PATH_DETACHED: lambda: grad_of(lambda z: norm(z.detach() + sub(z))),
                     SUBLAYER_PATH_DETACHED: lambda: grad_of(lambda z: norm(z + sub(z).detach()))}
        (g,) = torch.autograd.grad((got * probe).sum(), x)
        c.expect_tensor(g, w, what=_("the gradient with respect to {name} ({what})").format(
            name="x", what=label), dims=_DIMS3, wrong=wrong)
        c.headline(_("gradients flow back to x"))


def check_pre_norm_residual(f, *, seed: int | None = None, thorough: bool = False) -> None:
    _check_residual("pre", f, seed=seed, thorough=thorough)


def check_post_norm_residual(f, *, seed: int | None = None, thorough: bool = False) -> None:
    _check_residual("post", f, seed=seed, thorough=thorough)


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "10.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "layer_norm": (
        _BETA_FIRST, _FLOAT32_LN, _DETACHED, _DEFAULT_EPS, _NO_MEAN, _RMS_OF_X, _NO_SQRT_LN,
        _EPS_OUTSIDE, _FLOAT64_KEPT, _LAST_AXIS, _EPS_IGNORED, _NO_BETA, _NO_EPS, _NO_GAMMA,
        _EVERY_ENTRY, _WRONG_AXIS, _KEEPDIM, _IN_PLACE_NORM, _EPS_KEYWORD, _CANCELLATION,
        _SWAPPED, _UNBIASED, _NORM_HINT, _NO_GAMMA_NO_BETA, _NO_GRADIENT_TO, _DTYPE_CHANGED),
    "rms_norm": (
        _GAMMA_ADDED, _CAST_AFTER_GAMMA, _DETACHED, _DEFAULT_EPS, _NO_SQRT, _EPS_OUTSIDE,
        _GAMMA_INSIDE, _LOW_PRECISION, _LAST_AXIS, _EPS_IGNORED, _NO_EPS_RMS, _NO_GAMMA,
        _EVERY_ENTRY, _WRONG_AXIS, _KEEPDIM, _IN_PLACE_NORM, _PARTLY_HALF, _FLOAT32_KEPT,
        _SQUARED_MEAN, _MEAN_SUBTRACTED, _SUM_SQUARES, _NORM_HINT, _NO_GRADIENT_TO,
        _DTYPE_CHANGED),
    "pre_norm_residual": (
        CALLED_TWICE, RESIDUAL_DETACHED, PRE_NO_NORM, PRE_NO_RESIDUAL, RESIDUAL_IN_PLACE,
        PRE_IS_POST, PRE_NORM_BOTH, PRE_NORM_ON_OUTPUT, PRE_NORMALISED_RESIDUAL,
        RESIDUAL_PATH_DETACHED, PRE_RESIDUAL_TWICE, _RECEIVED["sublayer"],
        _NEVER_CALLED["sublayer"], SUBLAYER_PATH_DETACHED, _ASSEMBLED),
    "post_norm_residual": (
        CALLED_TWICE, RESIDUAL_DETACHED, POST_NO_NORM, POST_NO_RESIDUAL, RESIDUAL_IN_PLACE,
        _RECEIVED["norm"], POST_NORM_THEN_ADD, POST_NORM_INPUT, POST_ADDED_AFTER,
        RESIDUAL_PATH_DETACHED, POST_RESIDUAL_TWICE, SUBLAYER_PATH_DETACHED, POST_IS_PRE,
        _ASSEMBLED),
}
