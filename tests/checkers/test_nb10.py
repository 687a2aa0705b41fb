"""Chapter 10 checkers: the reference and other correct implementations pass at every seed; each
known mistake is diagnosed; the library norms the chapter forbids are rejected."""

import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from checks import nb10
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import CheckFailure, ForbiddenCall

from ..support.catalogue import (SEEDS, Exercise, Wrong, assert_passes, assert_passes_thorough,
                                 assert_rejects, failure_text, implementations)

CHECKERS = {
    "layer_norm": nb10.check_layer_norm,
    "rms_norm": nb10.check_rms_norm,
    "pre_norm_residual": nb10.check_pre_norm_residual,
    "post_norm_residual": nb10.check_post_norm_residual,
}


# ---- correct implementations, written the way a learner might ------------------------------

def layer_norm_two_pass(x, gamma, beta, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def layer_norm_var_mean(x, gamma, beta, eps=1e-5):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + eps) * gamma + beta


def layer_norm_biased_var(x, gamma, beta, eps=1e-5):
    centred = x - x.mean(-1, keepdim=True)
    return centred / (centred.var(-1, keepdim=True, unbiased=False) + eps).sqrt() * gamma + beta


def rms_norm_rsqrt(x, gamma, eps=1e-5):
    x32 = x.to(torch.float32)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * gamma


def rms_norm_div_sqrt(x, gamma, eps=1e-5):
    x32 = x.float()
    rms = torch.sqrt((x32 * x32).sum(-1, keepdim=True) / x.shape[-1] + eps)
    return (x32 / rms).type_as(x) * gamma


def rms_norm_float64_inside(x, gamma, eps=1e-5):
    x64 = x.double()
    return (x64 / (x64.square().mean(-1, keepdim=True) + eps).sqrt()).to(x.dtype) * gamma


def pre_norm_two_lines(x, sublayer, norm):
    h = norm(x)
    return x + sublayer(h)


def post_norm_two_lines(x, sublayer, norm):
    u = x + sublayer(x)
    return norm(u)


CORRECT = {
    # The reference's layer_norm and rms_norm call the library norms the exercises forbid: they
    # pass with the ban lifted (test_library_references_pass_with_the_ban_lifted).
    "layer_norm": implementations(layer_norm_two_pass, layer_norm_var_mean,
                                  layer_norm_biased_var),
    "rms_norm": implementations(rms_norm_rsqrt, rms_norm_div_sqrt, rms_norm_float64_inside),
    "pre_norm_residual": implementations(ref.pre_norm_residual, pre_norm_two_lines),
    "post_norm_residual": implementations(ref.post_norm_residual, post_norm_two_lines),
}


@pytest.mark.parametrize("seed", [*SEEDS, "thorough"], ids=str)
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_library_references_pass_with_the_ban_lifted(name, seed):
    with mock.patch.object(nb10, "FORBID_NORMS", {}):
        if seed == "thorough":
            assert_passes_thorough(CHECKERS[name], getattr(ref, name))
        else:
            assert_passes(CHECKERS[name], getattr(ref, name), seed)


# ---- the reference against independent formulations -----------------------------------------

def test_reference_rms_norm_follows_the_dtype_rule():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    gamma = (1 + torch.randn(64)).to(torch.bfloat16)
    x32 = x.float()
    want = (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16) * gamma
    got = ref.rms_norm(x, gamma)
    assert got.dtype == torch.bfloat16
    assert (got != want).float().mean() < 0.01  # the same up to a rare rounding tie


def test_reference_rms_norm_matches_torch_module():
    torch.manual_seed(1)
    x, gamma = torch.randn(3, 5, 16), torch.randn(16)
    module = torch.nn.RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(gamma)
    torch.testing.assert_close(ref.rms_norm(x, gamma), module(x).detach())


def test_reference_layer_norm_matches_closed_form():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # mean 2.5, biased variance 1.25
    want = torch.tensor([[-1.5, -0.5, 0.5, 1.5]]) / math.sqrt(1.25 + 1e-5)
    got = ref.layer_norm(x, torch.ones(4), torch.zeros(4))
    torch.testing.assert_close(got, want)


def test_float16_overflow_case_separates_the_two_computations():
    """x ~ 1e4 in float16: x² overflows in float16 but not in float32."""
    x = torch.full((1, 4), 1e4, dtype=torch.float16)
    gamma = torch.ones(4, dtype=torch.float16)
    naive = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
    assert torch.equal(naive, torch.zeros_like(naive))
    assert torch.allclose(ref.rms_norm(x, gamma).float(), torch.ones(1, 4), atol=1e-3)


# ---- wrong implementations: layer_norm ------------------------------------------------------

def _ln(var_fn=None, denom=None, combine=None, mean_fn=None):
    """layer_norm with one piece replaced."""
    def layer_norm(x, gamma, beta, eps=1e-5):
        mean = mean_fn(x) if mean_fn else x.mean(-1, keepdim=True)
        var = var_fn(x, mean) if var_fn else ((x - mean) ** 2).mean(-1, keepdim=True)
        xhat = (x - mean) / (denom(var, eps) if denom else torch.sqrt(var + eps))
        return combine(xhat, gamma, beta) if combine else gamma * xhat + beta
    return layer_norm


def _ln_annotated(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    return gamma * (x - mean) / (x.std(-1, keepdim=True) + eps) + beta


def _ln_over(dims):
    def layer_norm(x, gamma, beta, eps=1e-5):
        mean = x.mean(dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dims, keepdim=True)
        return gamma * (x - mean) / torch.sqrt(var + eps) + beta
    return layer_norm


def _ln_no_keepdim(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1)
    return gamma * (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1) + eps) + beta


def _ln_dim2(x, gamma, beta, eps=1e-5):
    mean = x.mean(2, keepdim=True)
    var = ((x - mean) ** 2).mean(2, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def _ln_no_mean(x, gamma, beta, eps=1e-5):
    return gamma * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) + beta


def _ln_rms_of_x(x, gamma, beta, eps=1e-5):
    return gamma * (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        x.pow(2).mean(-1, keepdim=True) + eps) + beta


def _ln_eps_ignored(x, gamma, beta, eps=1e-5):
    return layer_norm_two_pass(x, gamma, beta)


def _ln_default_eps_1e6(x, gamma, beta, eps=1e-6):
    return layer_norm_two_pass(x, gamma, beta, eps)


def _ln_std_biased_plus_eps(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    return gamma * (x - mean) / (x.std(-1, keepdim=True, unbiased=False) + eps) + beta


def _ln_no_eps_keyword(x, gamma, beta):
    return layer_norm_two_pass(x, gamma, beta)


def _ln_one_pass(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x * x).mean(-1, keepdim=True) - mean * mean
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def _ln_float32(x, gamma, beta, eps=1e-5):
    return layer_norm_two_pass(x.float(), gamma.float(), beta.float(), eps).to(x.dtype)


def _ln_float64_out(x, gamma, beta, eps=1e-5):
    return layer_norm_two_pass(x.double(), gamma.double(), beta.double(), eps)


def _ln_in_place(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    x -= mean
    x /= torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return gamma * x + beta


def _ln_detached(x, gamma, beta, eps=1e-5):
    return layer_norm_two_pass(x, gamma, beta, eps).detach()


# ---- wrong implementations: rms_norm --------------------------------------------------------

def _rms(ms=None, denom=None, combine=None, upcast=True, cast_back=True):
    """rms_norm with one piece replaced."""
    def rms_norm(x, gamma, eps=1e-5):
        xx = x.float() if upcast else x
        mean_square = ms(xx) if ms else xx.pow(2).mean(-1, keepdim=True)
        normed = xx / (denom(mean_square, eps) if denom else torch.sqrt(mean_square + eps))
        if cast_back:
            normed = normed.to(x.dtype)
        return combine(normed, gamma) if combine else normed * gamma
    return rms_norm


def _rms_mean_subtracted(x, gamma, eps=1e-5):
    x32 = x.float()
    centred = x32 - x32.mean(-1, keepdim=True)
    return (centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * gamma


def _rms_gamma_inside(x, gamma, eps=1e-5):
    y = x.float() * gamma
    return (y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rms_default_eps_1e6(x, gamma, eps=1e-6):
    return rms_norm_rsqrt(x, gamma, eps)


def _rms_eps_ignored(x, gamma, eps=1e-5):
    return rms_norm_rsqrt(x, gamma)


def _rms_no_keepdim(x, gamma, eps=1e-5):
    x32 = x.float()
    return (x32 / torch.sqrt(x32.pow(2).mean(-1) + eps)).to(x.dtype) * gamma


def _rms_dim2(x, gamma, eps=1e-5):
    x32 = x.float()
    return (x32 / torch.sqrt(x32.pow(2).mean(2, keepdim=True) + eps)).to(x.dtype) * gamma


def _rms_rsqrt_in_low_precision(x, gamma, eps=1e-5):
    """The mean square in float32, but the scaling x * r in the input's dtype."""
    r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
    return x * r * gamma


def _rms_in_place(x, gamma, eps=1e-5):
    x /= torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
    return x * gamma


def _rms_detached(x, gamma, eps=1e-5):
    return rms_norm_rsqrt(x, gamma, eps).detach()


def _rms_via_linalg_norm_low_precision(x, gamma, eps=1e-5):
    rms = torch.linalg.vector_norm(x, dim=-1, keepdim=True) / math.sqrt(x.shape[-1])
    return x / torch.sqrt(rms * rms + eps) * gamma


def _rms_gamma_in_float32(x, gamma, eps=1e-5):
    """Multiplies by gamma before the cast back: one rounding apart when gamma has x's dtype,
    but a float32 gamma's result comes back in x's dtype instead of float32 (issue 28)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * gamma.float()).to(x.dtype)


def _rms_gamma_cast_down(x, gamma, eps=1e-5):
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * gamma.to(x.dtype)


def _rms_squared_mean(x, gamma, eps=1e-5):
    x32 = x.float()
    return (x32 / torch.sqrt(x32.mean(-1, keepdim=True) ** 2 + eps)).to(x.dtype) * gamma


def _rms_in_place_after_float(x, gamma, eps=1e-5):
    """`.float()` of a float32 tensor is the tensor itself: `h *= ...` writes into x."""
    h = x.float()
    h *= torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.to(x.dtype) * gamma


# ---- wrong implementations: residuals -------------------------------------------------------

def _pre_in_place(x, sublayer, norm):
    x += sublayer(norm(x))
    return x


def _pre_sublayer_twice(x, sublayer, norm):
    h = norm(x)
    print(sublayer(h).shape)  # a leftover debugging line
    return x + sublayer(h)


def _post_in_place(x, sublayer, norm):
    x += sublayer(x)
    return norm(x)


def _pre_residual_detached(x, sublayer, norm):
    return x.detach() + sublayer(norm(x))


def _pre_sublayer_no_grad(x, sublayer, norm):
    with torch.no_grad():
        h = sublayer(norm(x))
    return x + h


def _post_residual_detached(x, sublayer, norm):
    return norm(x.detach() + sublayer(x))


def _post_norm_twice(x, sublayer, norm):
    out = norm(x + sublayer(x))
    assert out.shape == norm(x + sublayer(x)).shape
    return out


WRONG = {
    "layer_norm": [
        Wrong("F.layer_norm", lambda x, gamma, beta, eps=1e-5: F.layer_norm(
            x, x.shape[-1:], gamma, beta, eps), "10.layer_norm.calls_library_norm"),
        Wrong("neither gamma nor beta", _ln(combine=lambda xhat, gamma, beta: xhat),
              "10.layer_norm.left_out_gamma_and_beta"),
        Wrong("gamma.detach()", _ln(combine=lambda xhat, gamma, beta: gamma.detach() * xhat + beta),
              "10.layer_norm.no_gradient_to_an_input"),
        Wrong("beta.data", _ln(combine=lambda xhat, gamma, beta: gamma * xhat + beta.data),
              "10.layer_norm.no_gradient_to_an_input"),
        Wrong("computed in float16", lambda x, gamma, beta, eps=1e-5: _ln()(
            x.half(), gamma.half(), beta.half(), eps), "10.layer_norm.changed_dtype"),
        Wrong("torch.var default (unbiased)", _ln(var_fn=lambda x, m: x.var(-1, keepdim=True)),
              "10.layer_norm.unbiased_variance"),
        Wrong("x.std(-1) + eps (Annotated Transformer)", _ln_annotated,
              "10.layer_norm.unbiased_variance"),
        Wrong("eps outside the sqrt", _ln(denom=lambda v, e: torch.sqrt(v) + e),
              "10.layer_norm.eps_outside_sqrt"),
        Wrong("no eps", _ln(denom=lambda v, e: torch.sqrt(v)), "10.layer_norm.left_out_eps"),
        Wrong("over the sequence axis", _ln_over(1), "10.layer_norm.mean_over_wrong_axis"),
        Wrong("over the batch axis", _ln_over(0), "10.layer_norm.mean_over_wrong_axis"),
        Wrong("over every entry", _ln_over(None), "10.layer_norm.mean_over_every_entry"),
        Wrong("mean without keepdim", _ln_no_keepdim, "10.layer_norm.mean_without_keepdim"),
        Wrong("hard-coded dim=2", _ln_dim2, "10.layer_norm.hard_coded_axis"),
        Wrong("gamma ignored", _ln(combine=lambda xh, g, b: xh + b),
              "10.layer_norm.left_out_gamma"),
        Wrong("beta ignored", _ln(combine=lambda xh, g, b: g * xh), "10.layer_norm.left_out_beta"),
        Wrong("gamma and beta swapped", _ln(combine=lambda xh, g, b: b * xh + g),
              "10.layer_norm.swapped_gamma_and_beta"),
        Wrong("beta before gamma", _ln(combine=lambda xh, g, b: (xh + b) * g),
              "10.layer_norm.beta_before_gamma"),
        Wrong("mean not subtracted", _ln_no_mean, "10.layer_norm.did_not_subtract_mean"),
        Wrong("divides by the RMS of x", _ln_rms_of_x, "10.layer_norm.divided_by_rms_of_x"),
        Wrong("divides by the variance", _ln(denom=lambda v, e: v + e),
              "10.layer_norm.divided_by_variance"),
        Wrong("eps argument ignored", _ln_eps_ignored, "10.layer_norm.ignored_eps_argument"),
        Wrong("default eps 1e-6", _ln_default_eps_1e6, "10.layer_norm.default_eps_1e6"),
        Wrong("std(unbiased=False) + eps", _ln_std_biased_plus_eps,
              "10.layer_norm.eps_outside_sqrt"),
        Wrong("no eps keyword", _ln_no_eps_keyword, "10.layer_norm.no_eps_keyword"),
        Wrong("one-pass variance E[x²] - E[x]²", _ln_one_pass, "10.layer_norm.one_pass_variance"),
        Wrong("float32 inside for float64", _ln_float32, "10.layer_norm.computed_in_float32"),
        Wrong("returns float64", _ln_float64_out, "10.layer_norm.float64_not_cast_back"),
        Wrong("in place", _ln_in_place, "10.layer_norm.modified_x_in_place"),
        Wrong("detached", _ln_detached, "10.layer_norm.cut_off_from_autograd"),
    ],
    "rms_norm": [
        Wrong("F.rms_norm", lambda x, gamma, eps=1e-5: F.rms_norm(
            x.float(), x.shape[-1:], eps=eps).to(x.dtype) * gamma,
              "10.rms_norm.calls_library_norm"),
        Wrong("gamma.detach()", _rms(combine=lambda normed, gamma: normed * gamma.detach()),
              "10.rms_norm.no_gradient_to_an_input"),
        Wrong("cast to float16", _rms(combine=lambda normed, gamma: normed.half() * gamma.half()),
              "10.rms_norm.changed_dtype"),
        Wrong("over the sequence axis", _rms(ms=lambda x: x.pow(2).mean(1, keepdim=True)),
              "10.rms_norm.mean_over_wrong_axis"),
        Wrong("over the batch axis", _rms(ms=lambda x: x.pow(2).mean(0, keepdim=True)),
              "10.rms_norm.mean_over_wrong_axis"),
        Wrong("over every entry", _rms(ms=lambda x: x.pow(2).mean()),
              "10.rms_norm.mean_over_every_entry"),
        Wrong("mean without keepdim", _rms_no_keepdim, "10.rms_norm.mean_without_keepdim"),
        Wrong("hard-coded dim=2", _rms_dim2, "10.rms_norm.hard_coded_axis"),
        Wrong("eps outside the sqrt", _rms(denom=lambda m, e: torch.sqrt(m) + e),
              "10.rms_norm.eps_outside_sqrt"),
        Wrong("no eps", _rms(denom=lambda m, e: torch.sqrt(m)), "10.rms_norm.left_out_eps"),
        Wrong("eps argument ignored", _rms_eps_ignored, "10.rms_norm.ignored_eps_argument"),
        Wrong("default eps 1e-6", _rms_default_eps_1e6, "10.rms_norm.default_eps_1e6"),
        Wrong("mean subtracted", _rms_mean_subtracted, "10.rms_norm.subtracted_mean"),
        Wrong("gamma ignored", _rms(combine=lambda n, g: n), "10.rms_norm.left_out_gamma"),
        Wrong("gamma added", _rms(combine=lambda n, g: n + g), "10.rms_norm.added_gamma"),
        Wrong("gamma before the RMS", _rms_gamma_inside, "10.rms_norm.gamma_before_rms"),
        Wrong("no square root", _rms(denom=lambda m, e: m + e),
              "10.rms_norm.divided_by_mean_square"),
        Wrong("sum of squares", _rms(ms=lambda x: x.pow(2).sum(-1, keepdim=True)),
              "10.rms_norm.sum_of_squares"),
        Wrong("no float32 inside", _rms(upcast=False), "10.rms_norm.half_precision_inside"),
        Wrong("float32 inside, not cast back", _rms(cast_back=False),
              "10.rms_norm.returned_float32_intermediate"),
        Wrong("scaling in low precision", _rms_rsqrt_in_low_precision,
              "10.rms_norm.partly_half_precision"),
        Wrong("vector_norm in low precision", _rms_via_linalg_norm_low_precision,
              "10.rms_norm.half_precision_inside"),
        Wrong("in place", _rms_in_place, "10.rms_norm.modified_x_in_place"),
        Wrong("detached", _rms_detached, "10.rms_norm.cut_off_from_autograd"),
        Wrong("gamma multiplied before the cast back", _rms_gamma_in_float32,
              "10.rms_norm.cast_after_gamma"),
        Wrong("gamma cast down to x's dtype", _rms_gamma_cast_down, "10.rms_norm.cast_after_gamma"),
        Wrong("mean(x)² instead of mean(x²)", _rms_squared_mean, "10.rms_norm.squared_the_mean"),
        Wrong("h = x.float(); h *= ...", _rms_in_place_after_float,
              "10.rms_norm.modified_x_in_place"),
    ],
    "pre_norm_residual": [
        Wrong("residual subtracted", lambda x, s, n: x - s(n(x)),
              "10.pre_norm_residual.output_assembled_wrongly"),
        Wrong("missing residual", lambda x, s, n: s(n(x)),
              "10.pre_norm_residual.missing_residual"),
        Wrong("post-norm", lambda x, s, n: n(x + s(x)), "10.pre_norm_residual.norm_after_the_add"),
        Wrong("normalised residual", lambda x, s, n: n(x) + s(n(x)),
              "10.pre_norm_residual.normalised_residual"),
        Wrong("norm on the output", lambda x, s, n: x + n(s(x)),
              "10.pre_norm_residual.norm_on_sublayer_output"),
        Wrong("norm on input and output", lambda x, s, n: x + n(s(n(x))),
              "10.pre_norm_residual.norm_on_input_and_output"),
        Wrong("residual twice", lambda x, s, n: x + x + s(n(x)),
              "10.pre_norm_residual.residual_twice"),
        Wrong("no norm", lambda x, s, n: x + s(x), "10.pre_norm_residual.forgot_the_norm"),
        Wrong("sublayer never called", lambda x, s, n: x + n(x),
              "10.pre_norm_residual.sublayer_never_called"),
        Wrong("sublayer fed x", lambda x, s, n: n(x) + s(x),
              "10.pre_norm_residual.sublayer_got_the_wrong_tensor"),
        Wrong("x += ...", _pre_in_place, "10.pre_norm_residual.modified_x_in_place"),
        Wrong("sublayer called twice", _pre_sublayer_twice,
              "10.pre_norm_residual.called_more_than_once"),
        Wrong("detached", lambda x, s, n: (x + s(n(x))).detach(),
              "10.pre_norm_residual.cut_off_from_autograd"),
        Wrong("x.detach() + ...", _pre_residual_detached,
              "10.pre_norm_residual.residual_path_detached"),
        Wrong("sublayer under no_grad", _pre_sublayer_no_grad,
              "10.pre_norm_residual.sublayer_path_detached"),
    ],
    "post_norm_residual": [
        Wrong("x subtracted after the norm", lambda x, s, n: n(x + s(x)) - x,
              "10.post_norm_residual.output_assembled_wrongly"),
        Wrong("missing final norm", lambda x, s, n: x + s(x),
              "10.post_norm_residual.forgot_the_final_norm"),
        Wrong("pre-norm", lambda x, s, n: x + s(n(x)), "10.post_norm_residual.wrote_pre_norm"),
        Wrong("missing residual", lambda x, s, n: n(s(x)),
              "10.post_norm_residual.missing_residual"),
        Wrong("norm on the output, then add", lambda x, s, n: x + n(s(x)),
              "10.post_norm_residual.norm_on_sublayer_output"),
        Wrong("x added after the norm", lambda x, s, n: n(x + s(x)) + x,
              "10.post_norm_residual.residual_added_after_the_norm"),
        Wrong("residual twice inside", lambda x, s, n: n(x + x + s(x)),
              "10.post_norm_residual.residual_twice"),
        Wrong("sublayer fed norm(x)", lambda x, s, n: n(x + s(n(x))),
              "10.post_norm_residual.normalised_sublayer_input"),
        Wrong("norm fed x", lambda x, s, n: n(x) + s(x),
              "10.post_norm_residual.norm_got_the_wrong_tensor"),
        Wrong("x += ...", _post_in_place, "10.post_norm_residual.modified_x_in_place"),
        Wrong("norm called twice", _post_norm_twice,
              "10.post_norm_residual.called_more_than_once"),
        Wrong("detached", lambda x, s, n: n(x + s(x)).detach(),
              "10.post_norm_residual.cut_off_from_autograd"),
        Wrong("norm(x.detach() + ...)", _post_residual_detached,
              "10.post_norm_residual.residual_path_detached"),
        Wrong("sublayer output detached", lambda x, s, n: n(x + s(x).detach()),
              "10.post_norm_residual.sublayer_path_detached"),
    ],
}


EXERCISES = [Exercise(CHECKERS[name], CORRECT[name], WRONG[name]) for name in CHECKERS]


def test_pure_low_precision_is_told_to_upcast():
    failure = assert_rejects(nb10.check_rms_norm,
                             Wrong("no float32 inside", _rms(upcast=False),
                                   "10.rms_norm.half_precision_inside"), seed=0)
    assert "x.float()" in str(failure)


# ---- forbidden shortcuts --------------------------------------------------------------------

def _ln_module(x, gamma, beta, eps=1e-5):
    module = torch.nn.LayerNorm(x.shape[-1], eps=eps, dtype=x.dtype)
    with torch.no_grad():
        module.weight.copy_(gamma)
        module.bias.copy_(beta)
    return module(x)


def _rms_module(x, gamma, eps=1e-5):
    module = torch.nn.RMSNorm(x.shape[-1], eps=eps, dtype=torch.float32)
    with torch.no_grad():
        module.weight.fill_(1.0)
    return module(x.float()).to(x.dtype) * gamma


@pytest.mark.parametrize("name,shortcut", [
    ("layer_norm", ref.layer_norm),
    ("layer_norm", lambda x, g, b, eps=1e-5: F.layer_norm(x, x.shape[-1:], g, b, eps)),
    ("layer_norm", _ln_module),
    ("layer_norm", lambda x, g, b, eps=1e-5: torch.ops.aten.native_layer_norm(
        x, x.shape[-1:], g, b, eps)[0]),
    ("layer_norm", lambda x, g, b, eps=1e-5: F.group_norm(
        x.reshape(-1, x.shape[-1], 1), 1, eps=eps).reshape(x.shape) * g + b),
    ("rms_norm", ref.rms_norm),
    ("rms_norm", lambda x, g, eps=1e-5: F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)
     * g),
    ("rms_norm", _rms_module),
    ("rms_norm", lambda x, g, eps=1e-5: (F.normalize(x.float(), dim=-1) * math.sqrt(
        x.shape[-1])).to(x.dtype) * g),
])
def test_forbidden_shortcut_is_rejected(name, shortcut):
    with pytest.raises(ForbiddenCall):
        CHECKERS[name](shortcut, seed=0)


def test_failures_are_check_failures():
    """Every diagnosis above is a CheckFailure, never a raw exception from the checker."""
    with pytest.raises(CheckFailure):
        nb10.check_rms_norm(lambda x, g, eps=1e-5: "not a tensor", seed=0)


def test_chapter_10_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    text = failure_text(nb10.check_layer_norm, _ln_no_mean)
    assert "可能的错误：没有减去均值：LayerNorm 先把每个 token 中心化" in text, text
    assert "likely mistake" not in text and "expected" not in text
    with pytest.raises(CheckFailure) as info:
        nb10.check_pre_norm_residual(lambda x, sublayer, norm: norm(x + sublayer(x)), seed=0)
    assert "在残差相加之后才用 Norm" in str(info.value), str(info.value)


# ---- the chapter's in-place hints are what the engine's in-place check shows ---------------

@pytest.mark.parametrize("name,fn,hint", [
    ("layer_norm", _ln_in_place, nb10._IN_PLACE_NORM),
    ("rms_norm", _rms_in_place_after_float, nb10._IN_PLACE_NORM),
    ("pre_norm_residual", _pre_in_place, nb10.RESIDUAL_IN_PLACE),
    ("post_norm_residual", _post_in_place, nb10.RESIDUAL_IN_PLACE),
])
def test_in_place_edits_get_the_chapters_hint(name, fn, hint):
    failure = assert_rejects(CHECKERS[name], Wrong("in place", fn, f"10.{name}.{hint.key}"),
                             seed=0)
    assert failure.hint == hint and "in place" in failure.message


def test_a_float32_gamma_on_half_precision_x_gives_float32():
    """The contract's rule, cast back to x's dtype, then multiply by gamma: a float32 gamma makes
    the result float32, so multiplying before the cast back shows (issue 28)."""
    x = torch.randn(2, 3, 16).to(torch.bfloat16)
    gamma = 1 + torch.randn(16)
    assert ref.rms_norm(x, gamma).dtype == torch.float32
    assert _rms_gamma_in_float32(x, gamma).dtype == torch.bfloat16
    failure = assert_rejects(nb10.check_rms_norm,
                             Wrong("gamma first", _rms_gamma_in_float32,
                                   "10.rms_norm.cast_after_gamma"), seed=0)
    assert "float32 gamma gives a float32 result" in str(failure), str(failure)
