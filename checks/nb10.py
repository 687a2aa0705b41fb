"""Checks for chapter 10: LayerNorm, RMSNorm, pre-norm and post-norm residual connections.

Both norms run over the hidden (last) axis of x [B, S, H]. RMSNorm follows the course's dtype rule:
float32 inside, cast back to x.dtype before the multiplication by gamma. The residual checks pass
in a sublayer and a norm that record what they receive, so a failure can say which tensor went
through the norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import reference as ref
from .engine import Check, CheckFailure, LearnerError, values_close
from .i18n import N_, _

# --------------------------------------------------------------------------------------------
# Forbidden shortcuts, by torch function name (the engine also catches `torch.ops.aten` overloads
# such as "layer_norm.default").

_NORM_NAMES = ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm",
               "native_group_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
               "_batch_norm_impl_index", "instance_norm", "normalize")
_NORM_HINT = N_("write the normalisation yourself from means, squares and a square root: library "
                "norms (F.layer_norm, F.rms_norm, nn.LayerNorm, nn.RMSNorm, F.normalize, group/"
                "batch/instance norm) are off limits in this exercise")


FORBID_NORMS = dict.fromkeys(_NORM_NAMES, _NORM_HINT)

# --------------------------------------------------------------------------------------------
# Shared helpers

_DIMS3 = ("B", "S", "H")
_AXIS_NAMES = {3: (N_("the batch axis B (dim 0)"), N_("the sequence axis S (dim 1)")),
               2: (N_("the token axis (dim 0)"),)}
_OVER_H = N_("each token's H features are normalised on their own: reduce over the last axis, "
             "`mean(dim=-1, keepdim=True)`")
_KEEPDIM = N_("the mean over the hidden axis has shape [B, S]; keep the reduced axis "
              "(`keepdim=True`) so that it broadcasts against x [B, S, H]")
_LAST_AXIS = N_("the hidden axis is the LAST axis whatever the number of dimensions: use dim=-1, "
                "not a fixed dim=2 (the check also passes a 2-D [tokens, H] input)")
_EPS_KEYWORD = N_("accept `eps` as a keyword argument with default 1e-5: `def ...(..., eps=1e-5)`")
_IN_PLACE_NORM = N_("an in-place operation (`x -= ...`, `x /= ...`, `x.mul_(...)`) wrote into the "
                    "caller's tensor: compute a new tensor (`x - mean`, `x / rms`) instead")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape_text(x: torch.Tensor) -> str:
    if x.dim() == 3:
        return "[" + ", ".join(f"{d}={n}" for d, n in zip(_DIMS3, x.shape)) + "]"
    return "[" + ", ".join(map(str, x.shape)) + "]"


def _dims(x: torch.Tensor):
    return _DIMS3 if x.dim() == 3 else None




def _call(c: Check, *args, **kwargs):
    """c.call, adding a hint to the usual errors of a norm (keepdim, fixed axis, eps keyword)."""
    try:
        return c.call(*args, **kwargs)
    except LearnerError as err:
        text = err.message.splitlines()[0].lower()
        hint = None
        if "must match the size" in text or "broadcast" in text:
            hint = _KEEPDIM
        elif "dimension out of range" in text:
            hint = _LAST_AXIS
        elif "unexpected keyword argument 'eps'" in text:
            hint = _EPS_KEYWORD
        elif "in-place operation" in text:
            hint = _IN_PLACE_NORM
        if hint and err.hint is None:
            raise err.with_hint(hint) from None
        raise


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


def _expect_dtype(c: Check, got, x: torch.Tensor, want: torch.Tensor, *, what: str,
                  rms: bool) -> None:
    """A dtype mismatch (with the right shape) fails with a hint; the rest is expect_tensor's."""
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape
            and got.dtype != want.dtype):
        return
    if rms and got.dtype == torch.float32 and x.dtype != torch.float32:
        hint = _("returned the float32 intermediate: cast the normalised x back to x.dtype "
                 "(`.to(x.dtype)`, {dtype} here) before multiplying by gamma").format(
                     dtype=_name(x.dtype))
    elif got.dtype == torch.float64 and x.dtype != torch.float64:
        hint = _("computed in float64 and did not cast the result back to x.dtype")
    else:
        hint = _("the output keeps the input's dtype: the norm changes values, not the dtype")
    c.fail(_("{what} has dtype {got}, expected {want} (the dtype of x).").format(
        what=what, got=got.dtype, want=want.dtype), hint)


def _expect_unchanged(c: Check, x: torch.Tensor, before: torch.Tensor, name: str) -> None:
    if not torch.equal(x, before):
        c.fail(_("{name} changed its input x in place.").format(name=name), _IN_PLACE_NORM)


def _expect_grads(c: Check, f_args: tuple, ref_fn: Callable, *, what: str,
                  names: tuple[str, ...]) -> None:
    """Gradients of a fixed random projection of the output w.r.t. the listed inputs."""
    leaves = [a.detach().clone().requires_grad_(True) for a in f_args]
    got = _call(c, *leaves)
    if not isinstance(got, torch.Tensor):
        c.fail(_("{what} should be a torch.Tensor, got {kind}.").format(
            what=what, kind=type(got).__name__))
    if not got.requires_grad:
        c.fail(_("{what}: the output does not depend on the inputs as far as autograd can tell, "
                 "so no gradient flows back through the norm.").format(what=what),
               _("avoid .detach(), .data, .item(), .numpy() or torch.no_grad() inside the "
                 "function: a model trains by backpropagating through its norms"))
    ref_leaves = [a.detach().clone().requires_grad_(True) for a in f_args]
    want = ref_fn(*ref_leaves)
    probe = torch.randn(want.shape, generator=c.gen, dtype=torch.float64).to(want.dtype)
    got_grads = torch.autograd.grad((got * probe).sum(), leaves, allow_unused=True)
    want_grads = torch.autograd.grad((want * probe).sum(), ref_leaves)
    for name, g, w in zip(names, got_grads, want_grads):
        if g is None:
            c.fail(_("{what}: no gradient reaches {name}.").format(what=what, name=name),
                   _("the output must be computed from {name} with differentiable torch "
                     "operations").format(name=name))
        c.expect_tensor(g, w, what=_("the gradient with respect to {name} ({what})").format(
            name=name, what=what))


# --------------------------------------------------------------------------------------------
# layer_norm

_UNBIASED = N_("divided the squared deviations by H - 1: `torch.var` and `torch.std` default to "
               "the unbiased estimate; LayerNorm uses the plain mean over the H features (pass "
               "`unbiased=False`, or `correction=0`, and keep eps inside the square root)")
_EPS_OUTSIDE = N_("put eps outside the square root, sqrt(...) + eps: it belongs inside, "
                  "sqrt(... + eps) (the difference shows for small inputs)")
_NO_EPS = N_("left out eps: it keeps the division finite when a token's spread is (nearly) zero, "
             "sqrt(var + eps)")
_NO_EPS_RMS = N_("left out eps: it keeps the division finite when a token is (nearly) all zeros, "
                 "sqrt(mean(x²) + eps)")
_EPS_IGNORED = N_("ignored the `eps` argument and used 1e-5 anyway")
_NO_GAMMA = N_("left out gamma: the normalised x is multiplied elementwise by gamma")
_NO_BETA = N_("left out beta: LayerNorm adds the shift beta after scaling by gamma")
_SWAPPED = N_("swapped gamma and beta: gamma scales (multiplies), beta shifts (adds)")
_BETA_FIRST = N_("added beta before scaling: the order is gamma * x_hat + beta")
_NO_MEAN = N_("did not subtract the mean: LayerNorm centres each token first, x - mean, and "
              "divides by the standard deviation (without centring it would be RMSNorm)")
_RMS_OF_X = N_("subtracted the mean, but divided by the root mean square of x itself: divide by "
               "the standard deviation, sqrt(mean((x - mean)²) + eps)")
_NO_SQRT_LN = N_("divided by the variance: divide by its square root, sqrt(var + eps)")
_FLOAT32_LN = N_("computed in float32: layer_norm should keep the precision of its input, so "
                 "compute in x's own dtype (float64 here)")
_CANCELLATION = N_("the values are off only for tokens whose mean (1e5) is huge compared with "
                   "their spread (1): computing the variance as mean(x²) - mean(x)² subtracts two "
                   "nearly equal large numbers and loses the difference to rounding (catastrophic "
                   "cancellation); subtract the mean first and average (x - mean)²")


def _axis_variants(x: torch.Tensor, formula: Callable) -> dict:
    """`formula(dims)` over each wrong axis, and over every axis at once."""
    variants = {}
    names = _AXIS_NAMES.get(x.dim(), ())
    for axis, name in enumerate(names):
        variants[_("normalised over {axis} instead of the hidden axis H; {fix}").format(
            axis=_(name), fix=_(_OVER_H))] = (lambda axis=axis: formula(axis))
    if x.dim() > 1:
        variants[_("normalised over every entry of x at once; {fix}").format(fix=_(_OVER_H))] = (
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
        _("left out both gamma and beta: scale by gamma, then shift by beta"): lambda: xhat.to(dt),
        _NO_MEAN: lambda: (xd / (ms + eps).sqrt() * g + b).to(dt),
        _RMS_OF_X: lambda: ((xd - mu) / (ms + eps).sqrt() * g + b).to(dt),
        _NO_SQRT_LN: lambda: ((xd - mu) / (var + eps) * g + b).to(dt),
    })
    if eps != 1e-5:
        variants[_EPS_IGNORED] = lambda: ((xd - mu) / (var + 1e-5).sqrt() * g + b).to(dt)
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
    got = (_call(c, x, gamma, beta) if eps is None else _call(c, x, gamma, beta, eps=eps))
    want = ref.layer_norm(before, gamma, beta, eps_used)
    _expect_dtype(c, got, before, want, what=what, rms=False)
    try:
        c.expect_tensor(got, want, what=what, dims=_dims(x),
                        wrong=_layer_norm_mixups(before, gamma, beta, eps_used,
                                                 float32_variant=not large_mean))
    except CheckFailure as failure:
        if failure.hint is None and large_mean and type(failure) is CheckFailure:
            raise CheckFailure(failure.exercise, failure.message, hint=_CANCELLATION,
                               seed=failure.seed) from None
        raise
    _expect_unchanged(c, x, before, "layer_norm")


def check_layer_norm(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("layer_norm", f, seed=seed, forbid=FORBID_NORMS) as c:
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

_MEAN_SUBTRACTED = N_("subtracted the mean: RMSNorm does not centre x, it divides x itself by its "
                      "root mean square (subtracting the mean is what LayerNorm does)")
_GAMMA_ADDED = N_("added gamma: it is a scale, multiply the normalised x by it")
_GAMMA_INSIDE = N_("multiplied x by gamma before computing the RMS: normalise x first, then scale "
                   "the result by gamma")
_NO_SQRT = N_("divided by the mean square: divide by its square root, the ROOT mean square, "
              "sqrt(mean(x²) + eps)")
_SUM_SQUARES = N_("used the sum of squares (the L2 norm) instead of their mean: divide by "
                  "sqrt(mean(x²) + eps), which is the L2 norm over sqrt(H)")
_LOW_PRECISION = N_("squared x in float16: x² overflows float16 (largest value 65504) once |x| > "
                    "256, so mean(x²) becomes inf and the output collapses to 0; convert x to "
                    "float32 first (`x.float()`), normalise there, cast back with `.to(x.dtype)`, "
                    "then multiply by gamma")
_LARGE_FLOAT16 = N_("for |x| ~ 1e4 in float16 the intermediate values leave float16's range "
                    "(x² is far above 65504, 1 / rms far below float16's smallest normal number "
                    "6e-5): compute the whole normalisation in float32 and cast back only its "
                    "result, before multiplying by gamma")
# Away from overflow a low-precision RMSNorm is only a rounding step off, inside the bfloat16 and
# float16 tolerances; with gamma = 1 a float32-inside implementation reproduces the reference
# bit for bit (at most 0.1% of the entries differ, at a rounding tie), while a computation that
# runs partly in half precision differs in 12% or more of them (measured over 300 seeds and four
# formulations of each). More than this fraction fails.
_ROUNDING_FRACTION = 0.03


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
    })
    if eps != 1e-5:
        variants[_EPS_IGNORED] = lambda: (xd / (ms + 1e-5).sqrt() * g).to(dt)
    return variants


def _expect_rms_norm(c: Check, x: torch.Tensor, gamma: torch.Tensor, *,
                     eps: float | None = None, what: str, low_precision: bool = False,
                     bitwise: bool = False, hint_if_unknown: str | None = None) -> None:
    before = x.clone()
    eps_used = 1e-5 if eps is None else eps
    got = _call(c, x, gamma) if eps is None else _call(c, x, gamma, eps=eps)
    want = ref.rms_norm(before, gamma, eps_used)
    _expect_dtype(c, got, before, want, what=what, rms=True)
    try:
        c.expect_tensor(got, want, what=what, dims=_dims(x),
                        wrong=_rms_norm_mixups(before, gamma, eps_used,
                                               low_precision=low_precision))
    except CheckFailure as failure:
        if failure.hint is None and hint_if_unknown and type(failure) is CheckFailure:
            raise CheckFailure(failure.exercise, failure.message, hint=hint_if_unknown,
                               seed=failure.seed) from None
        raise
    if bitwise:
        differ = int((got.detach() != want).sum())
        if differ > _ROUNDING_FRACTION * want.numel():
            name = _name(x.dtype)
            c.fail(_("{what}: the values are within {dtype} tolerance, but {count} of {total} "
                     "entries differ by a rounding step from the result computed in float32 and "
                     "cast back.").format(what=what, dtype=name, count=differ,
                                          total=want.numel()),
                   _("the normalisation seems to run (at least partly) in {dtype}: convert x to "
                     "float32 first (`x.float()`), compute x / sqrt(mean(x²) + eps) there, cast "
                     "back with `.to(x.dtype)`, then multiply by gamma").format(dtype=name))
    _expect_unchanged(c, x, before, "rms_norm")


def check_rms_norm(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("rms_norm", f, seed=seed, forbid=FORBID_NORMS) as c:
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


def _pre_mixups(x, s, n) -> dict:
    return {
        _("missing residual: the block returns x + sublayer(norm(x)); without `x +` it forgets its "
          "input"): lambda: s(n(x)),
        _("applied the norm after the residual add: norm(x + sublayer(x)) is post-norm; pre-norm "
          "normalises only the sublayer's input and adds the sublayer's output to x itself"):
            lambda: n(x + s(x)),
        _("added the normalised x as the residual: the residual path carries x itself, untouched "
          "(only the sublayer's input is normalised): x + sublayer(norm(x))"):
            lambda: n(x) + s(n(x)),
        _("normalised the sublayer's output instead of its input: pre-norm is x + "
          "sublayer(norm(x))"): lambda: x + n(s(x)),
        _("normalised both the sublayer's input and its output: only the input is normalised, "
          "x + sublayer(norm(x))"): lambda: x + n(s(n(x))),
        _("added the residual twice: x + x + sublayer(norm(x)); add x once"):
            lambda: 2 * x + s(n(x)),
        _("forgot the norm: x + sublayer(x) has no normalisation at all; pre-norm is x + "
          "sublayer(norm(x))"): lambda: x + s(x),
    }


def _post_mixups(x, s, n) -> dict:
    return {
        _("forgot the final norm: post-norm normalises the sum, norm(x + sublayer(x)); x + "
          "sublayer(x) is a plain residual"): lambda: x + s(x),
        _("wrote pre-norm, x + sublayer(norm(x)): post-norm feeds x itself to the sublayer and "
          "normalises after the add, norm(x + sublayer(x))"): lambda: x + s(n(x)),
        _("missing residual: norm(sublayer(x)) forgets the input; post-norm is norm(x + "
          "sublayer(x))"): lambda: n(s(x)),
        _("normalised the sublayer's output and then added x: the norm must see the sum, "
          "norm(x + sublayer(x))"): lambda: x + n(s(x)),
        _("added the residual again after the norm: norm(x + sublayer(x)) + x adds x twice; "
          "return norm(x + sublayer(x))"): lambda: n(x + s(x)) + x,
        _("added the residual twice inside the norm: norm(x + x + sublayer(x)); add x once"):
            lambda: n(2 * x + s(x)),
        _("normalised the sublayer's input too: post-norm's sublayer gets x itself, "
          "norm(x + sublayer(x))"): lambda: n(x + s(n(x))),
    }


def _identify(t: torch.Tensor, candidates: dict) -> str:
    for name, value in candidates.items():
        if t.shape == value.shape and values_close(t, value, 2e-5, 2e-4):
            return name
    return _("a tensor that is none of x, norm(x), sublayer(x) or their sums")


def _structure_hint(kind: str, x, sub: _Recorder, norm: _Recorder, s, n) -> str:
    """Say what went through the norm and the sublayer, from their recorded inputs."""
    candidates = {_("x itself"): x, "norm(x)": n(x), "sublayer(x)": s(x),
                  "x + sublayer(x)": x + s(x), "sublayer(norm(x))": s(n(x)),
                  "x + sublayer(norm(x))": x + s(n(x))}
    if kind == "pre":
        want, expected = _PRE_WANT, ((norm, "x", x), (sub, "norm(x)", n(x)))
    else:
        want, expected = _POST_WANT, ((norm, "x + sublayer(x)", x + s(x)), (sub, "x", x))
    problems = []
    for rec, should_name, should in expected:
        if not rec.inputs:
            problems.append(_("{name} was never called").format(name=rec.__name__))
        elif not (rec.inputs[0].shape == should.shape
                  and values_close(rec.inputs[0], should, 2e-5, 2e-4)):
            problems.append(_("{name} received {got}, not {want}").format(
                name=rec.__name__, got=_identify(rec.inputs[0], candidates), want=should_name))
    if problems:
        return "; ".join(problems) + "; " + _("{kind}-norm is {formula}").format(kind=kind,
                                                                                formula=want)
    return _("norm and sublayer received the right tensors, so the mistake is in how the output "
             "is put together: return {formula}").format(formula=want)


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
            raise CheckFailure(failure.exercise, failure.message,
                               hint=_structure_hint(kind, before, sub, norm, s, n),
                               seed=failure.seed) from None
        raise
    if not torch.equal(x, before):
        c.fail(_("{name} changed its input x in place.").format(name=name),
               _("`x += ...` writes into the caller's tensor (the residual stream that the next "
                 "block still needs); write `x + ...`, which makes a new tensor"))
    for rec, should in ((norm, "x" if kind == "pre" else "x + sublayer(x)"),
                        (sub, "norm(x)" if kind == "pre" else "x")):
        if len(rec.inputs) != 1:
            c.fail(_("{name} called {callee} {count} times; call it once, on {formula}, and "
                     "reuse the result.").format(name=name, callee=rec.__name__,
                                                 count=len(rec.inputs), formula=should),
                   _("in a real block the sublayer is a whole attention or feed-forward layer "
                     "and the norm has its own weights: each runs exactly once per block"))


def _check_residual(kind: str, f, *, seed: int | None, thorough: bool) -> None:
    with Check(f"{kind}_norm_residual", f, seed=seed) as c:
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
                name=f"{kind}_norm_residual"),
                   _("avoid .detach(), .data or torch.no_grad() inside the function"))
        x_ref = x.detach().clone().requires_grad_(True)
        want = (ref.pre_norm_residual if kind == "pre" else ref.post_norm_residual)(x_ref, sub,
                                                                                      norm)
        probe = torch.randn(want.shape, generator=c.gen)
        (g,) = torch.autograd.grad((got * probe).sum(), x)
        (w,) = torch.autograd.grad((want * probe).sum(), x_ref)
        c.expect_tensor(g, w, what=_("the gradient with respect to {name} ({what})").format(
            name="x", what=label), dims=_DIMS3)
        c.headline(_("gradients flow back to x"))


def check_pre_norm_residual(f, *, seed: int | None = None, thorough: bool = False) -> None:
    _check_residual("pre", f, seed=seed, thorough=thorough)


def check_post_norm_residual(f, *, seed: int | None = None, thorough: bool = False) -> None:
    _check_residual("post", f, seed=seed, thorough=thorough)
