"""Chapter 09 checkers: correct implementations pass at every seed; each known mistake is
diagnosed; the library activations the chapter asks learners to write are rejected."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from checks import nb09
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import ForbiddenCall

from ..support.catalogue import (Wrong, assert_passes, assert_rejects, exercises, failure_text,
                                 implementations)
from ..support.cells import learner_cell as _learner

SQRT2 = math.sqrt(2.0)

# --------------------------------------------------------------------------------------------
# Correct implementations written the way a learner would (the reference's activations call
# F.relu / F.gelu / F.silu, which the activation checks forbid).


def good_relu(x):
    return torch.clamp(x, min=0)


def good_relu_where(x):
    return torch.where(x > 0, x, 0.0)


def good_relu_mask(x):
    return x * (x > 0)


def good_relu_abs(x):
    return (x + x.abs()) / 2


def good_relu_maximum(x):
    return torch.maximum(x, torch.zeros_like(x))


def good_gelu(x):
    return 0.5 * x * (1 + torch.erf(x / SQRT2))


def good_gelu_erfc(x):
    return 0.5 * x * torch.erfc(-x / SQRT2)


def good_gelu_ndtr(x):
    return x * torch.special.ndtr(x)


def good_silu(x):
    return x * torch.sigmoid(x)


def good_silu_exp(x):
    return x / (1 + torch.exp(-x))


def good_ffn(x, w1, w2, activation):
    return activation(x @ w1) @ w2


def good_ffn_einsum(x, w1, w2, activation):
    return torch.einsum("...f,fh->...h", activation(torch.einsum("...h,hf->...f", x, w1)), w2)


def good_swiglu(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


def good_swiglu_own_silu(x, w_gate, w_up, w_down):
    gate = x @ w_gate
    return (gate * torch.sigmoid(gate) * (x @ w_up)) @ w_down


def good_param_count(hidden_size, ffn_hidden_size, gated):
    return (3 if gated else 2) * hidden_size * ffn_hidden_size


CORRECT = {
    nb09.check_relu: implementations(good_relu, good_relu_where, good_relu_mask, good_relu_abs,
                                     good_relu_maximum),
    nb09.check_gelu: implementations(good_gelu, good_gelu_erfc, good_gelu_ndtr),
    nb09.check_silu: implementations(good_silu, good_silu_exp),
    nb09.check_ffn: implementations(ref.ffn, good_ffn, good_ffn_einsum),
    nb09.check_swiglu_ffn: implementations(ref.swiglu_ffn, good_swiglu, good_swiglu_own_silu),
    nb09.check_ffn_param_count: implementations(ref.ffn_param_count, good_param_count),
}


# Independent oracles for the reference.

def test_reference_activations_match_closed_forms():
    x = torch.linspace(-12, 12, 2001, dtype=torch.float64)
    torch.testing.assert_close(ref.relu(x), x.clamp(min=0))
    phi = torch.tensor([0.5 * math.erfc(-v / SQRT2) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(ref.gelu(x), x * phi)
    torch.testing.assert_close(ref.silu(x), x / (1 + torch.exp(-x)))
    one = torch.tensor(1.0, dtype=torch.float64)
    assert ref.gelu(one).item() == pytest.approx(0.8413447460685429, abs=1e-15)


def test_reference_ffn_is_nn_linear_layers():
    torch.manual_seed(0)
    h, h_ff = 6, 10
    up = torch.nn.Linear(h, h_ff, bias=False, dtype=torch.float64)
    down = torch.nn.Linear(h_ff, h, bias=False, dtype=torch.float64)
    gate = torch.nn.Linear(h, h_ff, bias=False, dtype=torch.float64)
    x = torch.randn(2, 3, h, dtype=torch.float64)
    with torch.no_grad():
        # nn.Linear stores [out, in]; the course's matrices are [in, out].
        torch.testing.assert_close(ref.ffn(x, up.weight.T, down.weight.T, torch.nn.GELU()),
                                   down(torch.nn.GELU()(up(x))))
        torch.testing.assert_close(ref.swiglu_ffn(x, gate.weight.T, up.weight.T, down.weight.T),
                                   down(F.silu(gate(x)) * up(x)))


def test_reference_param_count_llama2_7b():
    assert ref.ffn_param_count(4096, 11008, True) == 135_266_304
    assert ref.ffn_param_count(4096, 16384, False) == 134_217_728
    layer = [torch.nn.Linear(64, 172, bias=False), torch.nn.Linear(64, 172, bias=False),
             torch.nn.Linear(172, 64, bias=False)]
    assert ref.ffn_param_count(64, 172, True) == sum(p.numel() for m in layer
                                                      for p in m.parameters())


# --------------------------------------------------------------------------------------------
# Wrong implementations

# ---- relu ----


def _relu_in_place(x):
    return x.clamp_(min=0)


def _relu_masked_assign(x):
    x[x < 0] = 0
    return x


def _relu_float_mask(x):
    return (x > 0).float() * x


def _relu_zeros_float32(x):
    return torch.maximum(x, torch.zeros(x.shape))


def _relu_python_max(x):
    return max(x, 0)


def _relu_numpy(x):
    return torch.from_numpy(np.maximum(x.numpy(), 0))


def _relu_detached(x):
    return torch.clamp(x.detach(), min=0)


def _relu_float32_zeros_where(x):
    return torch.where(x > 0, x, torch.zeros(1))


def _relu_list_comprehension(x):
    return torch.tensor([max(v, 0.0) for v in x.flatten().tolist()]).reshape(x.shape)


# ---- gelu ----


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_in_place(x):
    return x.mul_(0.5 * (1 + torch.erf(x / SQRT2)))


def _gelu_rounded_constant(x):
    return 0.5 * x * (1 + torch.erf(x * 0.7071))


def _gelu_float32_inside(x):
    x32 = x.float()
    return (0.5 * x32 * (1 + torch.erf(x32 / SQRT2))).to(x.dtype)


def _gelu_returns_float32(x):
    x32 = x.float()
    return 0.5 * x32 * (1 + torch.erf(x32 / SQRT2))


def _gelu_math_erf(x):
    return 0.5 * x * (1 + math.erf(x / SQRT2))


def _gelu_no_one_plus(x):
    return 0.5 * x * torch.erf(x / SQRT2)


# ---- silu ----


def _silu_overflow(x):
    return x * torch.exp(x) / (1 + torch.exp(x))


def _silu_in_place(x):
    return x.mul_(torch.sigmoid(x))


def _silu_detached(x):
    return x * torch.sigmoid(x).detach()


def _silu_sigmoid_float32(x):
    return x * torch.sigmoid(x.float())


def _silu_sigmoid_in_place(x):
    return x * x.sigmoid_()


def _silu_float32_one(x):
    return x / (torch.ones(1) + torch.exp(-x))


# ---- ffn ----


def _ffn_act_after_w2(x, w1, w2, activation):
    return activation(x @ w1 @ w2)


def _ffn_swapped(x, w1, w2, activation):
    return activation(x @ w2) @ w1


def _ffn_transposed(x, w1, w2, activation):
    return activation(x @ w1.T) @ w2.T


def _ffn_linear(x, w1, w2, activation):
    return F.linear(activation(F.linear(x, w1)), w2)


def _ffn_hard_relu(x, w1, w2, activation):
    return torch.relu(x @ w1) @ w2


def _ffn_hard_silu(x, w1, w2, activation):
    return F.silu(x @ w1) @ w2


def _ffn_result_unused(x, w1, w2, activation):
    h = x @ w1
    activation(h)
    return h @ w2


def _ffn_act_first(x, w1, w2, activation):
    return activation(x) @ w1 @ w2


def _ffn_no_w2(x, w1, w2, activation):
    return activation(x @ w1)


def _ffn_three_axes(x, w1, w2, activation):
    return torch.einsum("bsf,fh->bsh", activation(torch.einsum("bsh,hf->bsf", x, w1)), w2)


def _ffn_float32(x, w1, w2, activation):
    return activation(x.float() @ w1.float()) @ w2.float()


def _ffn_residual(x, w1, w2, activation):
    return x + activation(x @ w1) @ w2


def _ffn_twice(x, w1, w2, activation):
    return activation(activation(x @ w1)) @ w2


# ---- swiglu ----


def _swiglu(act_gate, combine=lambda a, b: a * b, after=lambda t: t):
    def swiglu_ffn(x, w_gate, w_up, w_down):
        return after(combine(act_gate(x @ w_gate), x @ w_up) @ w_down)
    return swiglu_ffn


def _swiglu_swapped(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_up) * (x @ w_gate)) @ w_down


def _swiglu_silu_of_product(x, w_gate, w_up, w_down):
    return F.silu((x @ w_gate) * (x @ w_up)) @ w_down


def _swiglu_plain_ffn(x, w_gate, w_up, w_down):
    return F.silu(x @ w_up) @ w_down


def _swiglu_silu_both(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate) * F.silu(x @ w_up)) @ w_down


def _swiglu_no_down(x, w_gate, w_up, w_down):
    return F.silu(x @ w_gate) * (x @ w_up)


def _swiglu_down_transposed(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down.T


def _swiglu_linear(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _swiglu_unpacks(x, w_gate, w_up, w_down):
    b, s, h = x.shape
    flat = x.reshape(b * s, h)
    return ((F.silu(flat @ w_gate) * (flat @ w_up)) @ w_down).reshape(b, s, h)


def _swiglu_precedence(x, w_gate, w_up, w_down):
    return F.silu(x @ w_gate) * x @ w_up @ w_down


def _swiglu_residual(x, w_gate, w_up, w_down):
    return x + (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


def _swiglu_float32(x, w_gate, w_up, w_down):
    x, w_gate, w_up, w_down = x.float(), w_gate.float(), w_up.float(), w_down.float()
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


# ---- ffn_param_count ----


def _count(fn):
    def ffn_param_count(hidden_size, ffn_hidden_size, gated):
        return fn(hidden_size, ffn_hidden_size, gated)
    return ffn_param_count


def _in_float64(good):
    """Computes in float64 "for accuracy" and forgets to cast back to x's dtype."""
    return lambda x: good(x.double())


def _times_exp_over_exp(good):
    """A right formula with a factor exp(x) / exp(x) that cancels on paper: for large |x| it is
    inf / inf or 0 / 0, NaN, an overflow no known variant explains."""
    return lambda x: good(x) * torch.exp(x) / torch.exp(x)


WRONG = {
    nb09.check_relu: [
        Wrong("clamp(max=0)", lambda x: torch.clamp(x, max=0), "09.relu.kept_negative_part"),
        Wrong("step function", lambda x: (x > 0).to(x.dtype), "09.relu.returned_step_function"),
        Wrong("abs", lambda x: x.abs(), "09.relu.returned_abs"),
        Wrong("leaky", lambda x: torch.where(x > 0, x, 0.01 * x), "09.relu.leaky_relu"),
        Wrong("identity", lambda x: x.clone(), "09.relu.returned_x_unchanged"),
        Wrong("computed in float64", _in_float64(good_relu), "09.relu.dtype_not_kept"),
        Wrong("exp(x) / exp(x) factor", _times_exp_over_exp(good_relu),
              "09.relu.intermediate_overflows"),
        Wrong("in place clamp_", _relu_in_place, "09.relu.modified_x_in_place"),
        Wrong("x[x < 0] = 0", _relu_masked_assign, "09.relu.modified_x_in_place"),
        Wrong("float32 mask", _relu_float_mask, "09.relu.float32_hard_wired"),
        Wrong("maximum with float32 zeros", _relu_zeros_float32, "09.relu.float32_hard_wired"),
        Wrong("returns the comparison", lambda x: x > 0, "09.relu.returned_the_comparison"),
        Wrong("torch.max(x, 0)", lambda x: torch.max(x, 0), "09.relu.torch_max_reduction"),
        Wrong("Python max", _relu_python_max, "09.relu.python_scalar_functions"),
        Wrong("numpy", _relu_numpy, "09.relu.uses_numpy"),
        Wrong("detached", _relu_detached, "09.relu.cut_off_from_autograd"),
        Wrong("clamp(x, 0, 1)", lambda x: torch.clamp(x, 0, 1), "09.relu.clamped_above_too"),
        Wrong("clamp(x, 0, 6)", lambda x: torch.clamp(x, 0, 6), "09.relu.clamped_above_too"),
        Wrong("squeezed", lambda x: torch.clamp(x, min=0).squeeze(),
              "09.relu.dropped_axes_of_size_one"),
        Wrong("where with float32 zeros(1)", _relu_float32_zeros_where,
              "09.relu.float32_hard_wired"),
        Wrong("list comprehension", _relu_list_comprehension, "09.relu.float32_hard_wired"),
    ],
    nb09.check_gelu: [
        Wrong("tanh approximation", _gelu_tanh, "09.gelu.tanh_approximation"),
        Wrong("sigmoid(1.702 x)", lambda x: x * torch.sigmoid(1.702 * x),
              "09.gelu.sigmoid_approximation"),
        Wrong("tanh without the cubic term",
              lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * x)),
              "09.gelu.tanh_without_cubic_term"),
        Wrong("no 1/2", lambda x: x * (1 + torch.erf(x / SQRT2)), "09.gelu.forgot_the_half"),
        Wrong("erf(x)", lambda x: 0.5 * x * (1 + torch.erf(x)), "09.gelu.erf_of_x"),
        Wrong("erf(x / 2)", lambda x: 0.5 * x * (1 + torch.erf(x / 2)),
              "09.gelu.divided_by_2_inside_erf"),
        Wrong("1 - erf", lambda x: 0.5 * x * (1 - torch.erf(x / SQRT2)), "09.gelu.sign_error"),
        Wrong("density", lambda x: x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi),
              "09.gelu.used_normal_density"),
        Wrong("Phi only", lambda x: 0.5 * (1 + torch.erf(x / SQRT2)),
              "09.gelu.returned_phi_alone"),
        Wrong("silu", lambda x: x * torch.sigmoid(x), "09.gelu.returned_silu"),
        Wrong("in place", _gelu_in_place, "09.gelu.modified_x_in_place"),
        Wrong("rounded constant 0.7071", _gelu_rounded_constant, "09.gelu.lost_float64_precision"),
        Wrong("float32 inside", _gelu_float32_inside, "09.gelu.lost_float64_precision"),
        Wrong("returns float32", _gelu_returns_float32, "09.gelu.float32_hard_wired"),
        Wrong("math.erf", _gelu_math_erf, "09.gelu.python_scalar_functions"),
        Wrong("tanh(x / sqrt 2)", lambda x: 0.5 * x * (1 + torch.tanh(x / SQRT2)),
              "09.gelu.tanh_instead_of_erf"),
        Wrong("erf(x) / sqrt 2", lambda x: 0.5 * x * (1 + torch.erf(x) / SQRT2),
              "09.gelu.divided_erf_not_its_argument"),
        Wrong("no 1 +", _gelu_no_one_plus, "09.gelu.forgot_one_plus"),
        Wrong("relu", lambda x: torch.clamp(x, min=0), "09.gelu.returned_relu"),
        Wrong("erf(x * sqrt 2)", lambda x: 0.5 * x * (1 + torch.erf(x * SQRT2)),
              "09.gelu.multiplied_by_sqrt2_inside_erf"),
        Wrong("computed in float64", _in_float64(good_gelu), "09.gelu.dtype_not_kept"),
        Wrong("exp(x) / exp(x) factor", _times_exp_over_exp(good_gelu),
              "09.gelu.intermediate_overflows"),
    ],
    nb09.check_silu: [
        Wrong("x e^x / (1 + e^x)", _silu_overflow, "09.silu.overflowing_formula"),
        Wrong("sigmoid only", lambda x: torch.sigmoid(x), "09.silu.returned_sigmoid_alone"),
        Wrong("x / (1 + exp(x))", lambda x: x / (1 + torch.exp(x)),
              "09.silu.sign_error_in_exponent"),
        Wrong("sigmoid(1.702 x)", lambda x: x * torch.sigmoid(1.702 * x),
              "09.silu.gelu_approximation"),
        Wrong("tanh", lambda x: x * torch.tanh(x), "09.silu.tanh_instead_of_sigmoid"),
        Wrong("softplus", lambda x: F.softplus(x), "09.silu.returned_softplus"),
        Wrong("in place", _silu_in_place, "09.silu.modified_x_in_place"),
        Wrong("detached sigmoid", _silu_detached, "09.silu.cut_off_from_autograd"),
        Wrong("float32 sigmoid", _silu_sigmoid_float32, "09.silu.float32_hard_wired"),
        Wrong("x.sigmoid_()", _silu_sigmoid_in_place, "09.silu.modified_x_in_place"),
        Wrong("float32 ones(1)", _silu_float32_one, "09.silu.float32_hard_wired"),
        Wrong("gelu", good_gelu, "09.silu.returned_gelu"),
        Wrong("relu", lambda x: torch.clamp(x, min=0), "09.silu.returned_relu"),
        Wrong("computed in float64", _in_float64(good_silu), "09.silu.dtype_not_kept"),
        Wrong("exp(x) / exp(x) factor", _times_exp_over_exp(good_silu),
              "09.silu.intermediate_overflows"),
    ],
    nb09.check_ffn: [
        Wrong("activation after W2", _ffn_act_after_w2, "09.ffn.activation_after_w2"),
        Wrong("W1 and W2 swapped", _ffn_swapped, "09.ffn.matrix_shapes_do_not_fit"),
        Wrong("transposed weights", _ffn_transposed, "09.ffn.matrix_shapes_do_not_fit"),
        Wrong("F.linear with [in, out] weights", _ffn_linear, "09.ffn.matrix_shapes_do_not_fit"),
        Wrong("hard-coded relu", _ffn_hard_relu, "09.ffn.ignored_activation_argument"),
        Wrong("hard-coded silu", _ffn_hard_silu, "09.ffn.ignored_activation_argument"),
        Wrong("activation result unused", _ffn_result_unused, "09.ffn.activation_result_unused"),
        Wrong("activation before W1", _ffn_act_first, "09.ffn.activation_before_w1"),
        Wrong("no W2", _ffn_no_w2, "09.ffn.forgot_w2"),
        Wrong("only [B, S, H]", _ffn_three_axes, "09.ffn.assumed_three_axes"),
        Wrong("float32 inside", _ffn_float32, "09.ffn.float32_hard_wired"),
        Wrong("adds the residual", _ffn_residual, "09.ffn.added_residual"),
        Wrong("activation twice", _ffn_twice, "09.ffn.activation_twice"),
    ],
    nb09.check_swiglu_ffn: [
        Wrong("gate and up swapped", _swiglu_swapped, "09.swiglu_ffn.gate_and_up_swapped"),
        Wrong("SiLU of the product", _swiglu_silu_of_product, "09.swiglu_ffn.silu_of_the_product"),
        Wrong("plain FFN, no gate", _swiglu_plain_ffn, "09.swiglu_ffn.no_gate"),
        Wrong("up branch dropped", _swiglu(F.silu, combine=lambda a, b: a),
              "09.swiglu_ffn.dropped_up_branch"),
        Wrong("sigmoid (GLU)", _swiglu(torch.sigmoid), "09.swiglu_ffn.sigmoid_instead_of_silu"),
        Wrong("ReLU (ReGLU)", _swiglu(torch.relu), "09.swiglu_ffn.relu_instead_of_silu"),
        Wrong("GELU (GEGLU)", _swiglu(F.gelu), "09.swiglu_ffn.gelu_instead_of_silu"),
        Wrong("no activation (bilinear)", _swiglu(lambda t: t), "09.swiglu_ffn.no_activation"),
        Wrong("SiLU on both", _swiglu_silu_both, "09.swiglu_ffn.silu_on_both_branches"),
        Wrong("added", _swiglu(F.silu, combine=lambda a, b: a + b),
              "09.swiglu_ffn.added_the_branches"),
        Wrong("SiLU after W_down", _swiglu(lambda t: t, after=F.silu),
              "09.swiglu_ffn.silu_after_w_down"),
        Wrong("no W_down", _swiglu_no_down, "09.swiglu_ffn.forgot_w_down"),
        Wrong("W_down transposed", _swiglu_down_transposed,
              "09.swiglu_ffn.matrix_shapes_do_not_fit"),
        Wrong("F.linear with [in, out] weights", _swiglu_linear,
              "09.swiglu_ffn.matrix_shapes_do_not_fit"),
        Wrong("unpacks B, S, H", _swiglu_unpacks, "09.swiglu_ffn.assumed_three_axes"),
        Wrong("* and @ precedence", _swiglu_precedence, "09.swiglu_ffn.operator_precedence"),
        Wrong("adds the residual", _swiglu_residual, "09.swiglu_ffn.added_residual"),
        Wrong("float32 inside", _swiglu_float32, "09.swiglu_ffn.float32_hard_wired"),
    ],
    nb09.check_ffn_param_count: [
        Wrong("forgot the third matrix", _count(lambda h, f, g: 2 * h * f),
              "09.ffn_param_count.forgot_third_matrix"),
        Wrong("always three matrices", _count(lambda h, f, g: 3 * h * f),
              "09.ffn_param_count.three_matrices_for_plain_ffn"),
        Wrong("W_down as H_ff x H_ff",
              _count(lambda h, f, g: (2 if g else 1) * h * f + f * f),
              "09.ffn_param_count.down_projection_counted_square"),
        Wrong("with biases", _count(lambda h, f, g: (3 * h * f + 2 * f + h) if g
                                    else (2 * h * f + f + h)), "09.ffn_param_count.added_biases"),
        Wrong("H_ff = 4H", _count(lambda h, f, g: (3 if g else 2) * h * 4 * h),
              "09.ffn_param_count.assumed_4h"),
        Wrong("float", _count(lambda h, f, g: (3.0 if g else 2.0) * h * f),
              "09.ffn_param_count.returned_float"),
        Wrong("tensor", _count(lambda h, f, g: torch.tensor((3 if g else 2) * h * f)),
              "09.ffn_param_count.returned_tensor"),
        Wrong("one matrix", _count(lambda h, f, g: h * f),
              "09.ffn_param_count.counted_one_matrix"),
    ],
}


EXERCISES = exercises(CORRECT, WRONG)


# --------------------------------------------------------------------------------------------
# Forbidden shortcuts: the library activations, however they are reached.

FORBIDDEN = [
    (nb09.check_relu, "F.relu", lambda x: F.relu(x)),
    (nb09.check_relu, "torch.relu", lambda x: torch.relu(x)),
    (nb09.check_relu, "Tensor.relu", lambda x: x.relu()),
    (nb09.check_relu, "nn.ReLU", lambda x: torch.nn.ReLU()(x)),
    (nb09.check_relu, "relu_ on a copy", lambda x: x.clone().relu_()),
    (nb09.check_relu, "aten.relu.default", lambda x: torch.ops.aten.relu.default(x)),
    (nb09.check_relu, "F.threshold", lambda x: F.threshold(x, 0.0, 0.0)),
    (nb09.check_relu, "F.hardtanh", lambda x: F.hardtanh(x, 0.0, float("inf"))),
    (nb09.check_gelu, "F.gelu", lambda x: F.gelu(x)),
    (nb09.check_gelu, "F.gelu tanh", lambda x: F.gelu(x, approximate="tanh")),
    (nb09.check_gelu, "nn.GELU", lambda x: torch.nn.GELU()(x)),
    (nb09.check_silu, "F.silu", lambda x: F.silu(x)),
    (nb09.check_silu, "nn.SiLU", lambda x: torch.nn.SiLU()(x)),
    (nb09.check_silu, "aten.silu", lambda x: torch.ops.aten.silu(x)),
]


@pytest.mark.parametrize("checker,name,fn", FORBIDDEN, ids=[n for _, n, _ in FORBIDDEN])
def test_library_activations_are_forbidden(checker, name, fn):
    exercise = checker.__name__.removeprefix("check_")
    failure = assert_rejects(checker, Wrong(name, fn, f"09.{exercise}.calls_library_activation"),
                             seed=0)
    assert isinstance(failure, ForbiddenCall)
    # the learner called F.relu inside their own relu: the hint says whose function that is
    assert "is PyTorch's own" in str(failure) and "not a function of yours" in str(failure)


def test_reference_activations_are_rejected_by_the_activation_checks():
    """The reference uses the library activations: exactly what the learner may not call."""
    for checker, fn in [(nb09.check_relu, ref.relu), (nb09.check_gelu, ref.gelu),
                        (nb09.check_silu, ref.silu)]:
        exercise = checker.__name__.removeprefix("check_")
        failure = assert_rejects(
            checker, Wrong("reference", fn, f"09.{exercise}.calls_library_activation"), seed=0)
        assert isinstance(failure, ForbiddenCall)


def test_ffn_and_swiglu_may_use_library_activations():
    assert_passes(nb09.check_ffn, lambda x, w1, w2, act: act(x @ w1) @ w2, seed=0)
    assert_passes(nb09.check_swiglu_ffn, good_swiglu, seed=0)  # calls F.silu


def test_silu_overflow_is_named_on_large_inputs():
    failure = assert_rejects(nb09.check_silu,
                             Wrong("overflow", _silu_overflow, "09.silu.overflowing_formula"),
                             seed=1)
    assert "large" in str(failure)


# --------------------------------------------------------------------------------------------
# swiglu_ffn is built on silu: a broken silu of the learner's own that swiglu_ffn calls is named
# ("fix silu first"); torch's F.silu (a Python function called `silu` too) never is. The
# learner's functions are written as a notebook cell is: module-level functions of a namespace
# of their own.

_LEARNER_SWIGLU = """
def silu(x):
    return x * torch.sigmoid(x)

def swiglu_ffn(x, w_gate, w_up, w_down):
    return (silu(x @ w_gate) * (x @ w_up)) @ w_down
"""





def test_swiglu_ffn_built_on_a_right_silu_passes():
    ns = _learner(_LEARNER_SWIGLU)
    assert_passes(nb09.check_silu, ns["silu"], seed=0)
    assert_passes(nb09.check_swiglu_ffn, ns["swiglu_ffn"], seed=0)


def test_swiglu_ffn_says_fix_silu_first():
    ns = _learner(_LEARNER_SWIGLU.replace("x * torch.sigmoid(x)", "torch.sigmoid(x)"))
    failure = assert_rejects(nb09.check_swiglu_ffn,
                             Wrong("broken silu", ns["swiglu_ffn"], "09.swiglu_ffn.fix_silu_first"),
                             seed=0)
    # the helper's own mistake is told with it
    assert nb09.SILU_SIGMOID_ONLY in str(failure), str(failure)


def test_swiglu_ffn_keeps_its_own_diagnosis_when_silu_is_right():
    ns = _learner(_LEARNER_SWIGLU.replace("(silu(x @ w_gate) * (x @ w_up))",
                                          "(silu(x @ w_up) * (x @ w_gate))"))
    assert_rejects(nb09.check_swiglu_ffn,
                   Wrong("swapped", ns["swiglu_ffn"], "09.swiglu_ffn.gate_and_up_swapped"), seed=0)


def test_swiglu_ffn_does_not_blame_a_broken_silu_it_does_not_call():
    ns = _learner(_LEARNER_SWIGLU.replace("x * torch.sigmoid(x)", "torch.sigmoid(x)")
                  .replace("(silu(x @ w_gate) * (x @ w_up))", "(F.silu(x @ w_up) * (x @ w_gate))"))
    assert_rejects(nb09.check_swiglu_ffn,
                   Wrong("swapped", ns["swiglu_ffn"], "09.swiglu_ffn.gate_and_up_swapped"), seed=0)


def test_chapter_09_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    ns = _learner(_LEARNER_SWIGLU.replace("x * torch.sigmoid(x)", "torch.sigmoid(x)"))
    text = failure_text(nb09.check_silu, ns["silu"])
    assert "可能的错误：只返回了 sigmoid(x)：SiLU 还要乘以 x" in text, text
    assert "likely mistake" not in text and "expected" not in text
    text = failure_text(nb09.check_swiglu_ffn, ns["swiglu_ffn"])
    assert "swiglu_ffn 建立在它之上，所以请先修好 silu" in text, text
    with pytest.raises(ForbiddenCall) as info:
        nb09.check_relu(F.relu, seed=0)
    assert "请用逐元素的张量运算自己写 ReLU" in str(info.value), str(info.value)


# --------------------------------------------------------------------------------------------
# The chapter's own in-place hints are what the engine's in-place check shows.


def _ffn_scales_x_in_place(x, w1, w2, activation):
    x *= 1.0 + 1e-3
    return activation(x @ w1) @ w2


def _swiglu_scales_w_up_in_place(x, w_gate, w_up, w_down):
    w_up.mul_(1.0 + 1e-3)
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


@pytest.mark.parametrize("checker,fn,hint,mistake", [
    (nb09.check_relu, _relu_in_place, nb09.IN_PLACE, "09.relu.modified_x_in_place"),
    (nb09.check_ffn, _ffn_scales_x_in_place, nb09.IN_PLACE_INPUTS,
     "09.ffn.modified_input_in_place"),
    (nb09.check_swiglu_ffn, _swiglu_scales_w_up_in_place, nb09.IN_PLACE_INPUTS,
     "09.swiglu_ffn.modified_input_in_place"),
])
def test_in_place_edits_get_the_chapters_hint(checker, fn, hint, mistake):
    failure = assert_rejects(checker, Wrong("in place", fn, mistake), seed=0)
    assert failure.hint == hint and "in place" in failure.message
