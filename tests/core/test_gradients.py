"""checks.gradients: a forward and backward through the learner's code, and the function, chapter
and cause it names when gradients do not flow. The wrong pieces here are written as a learner
writes them; each must be named by the id borrowing gives it (checks.borrow) at every input."""

from __future__ import annotations

import pytest
import torch

from checks import gradients
from checks import reference as ref


@torch.no_grad()
def rope_under_no_grad(x, positions, **kwargs):
    return ref.apply_rope(x, positions, **kwargs)


@torch.inference_mode()
def rope_under_inference_mode(x, positions, **kwargs):
    return ref.apply_rope(x, positions, **kwargs)


def norm_detached(x, gamma, eps=1e-5):
    return (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)).detach() * gamma


def norm_through_data(x, gamma, eps=1e-5):
    return x.data / torch.sqrt(x.data.pow(2).mean(-1, keepdim=True) + eps) * gamma


def norm_rebuilt(x, gamma, eps=1e-5):
    out = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma
    return torch.tensor(out.tolist())


def swiglu_in_place(x, w_gate, w_up, w_down):
    h = torch.nn.functional.silu(x @ w_gate) * (x @ w_up)
    out = h @ w_down
    h.mul_(2.0)                          # h is saved for the backward of the last product
    return out


def swiglu_sqrt_at_zero(x, w_gate, w_up, w_down):
    out = ref.swiglu_ffn(x, w_gate, w_up, w_down)
    return out + torch.sqrt((out - out).square())


def attention_with_q_data(q, k, v, mask=None):
    return ref.grouped_query_attention(q.data, k, v, mask)


def block_with_no_grad_inside(x, layer, cfg, positions):
    with torch.no_grad():
        u = x + ref.attention_sublayer(x, layer, cfg, positions)
    return u + ref.swiglu_ffn(ref.rms_norm(u, layer["ffn_norm"], cfg.norm_eps),
                              layer["w_gate"], layer["w_up"], layer["w_down"])


CASES = [
    ("apply_rope", rope_under_no_grad, "rope_under_no_grad", gradients.NO_GRAD,
     "`torch.no_grad()`", "borrowed_without_gradients"),
    ("apply_rope", rope_under_inference_mode, "rope_under_inference_mode", gradients.NO_GRAD,
     "`torch.inference_mode()`", "borrowed_without_gradients"),
    ("rms_norm", norm_detached, "norm_detached", gradients.CUT, "`.detach()`",
     "borrowed_cuts_gradients"),
    ("rms_norm", norm_through_data, "norm_through_data", gradients.CUT, "`.data`",
     "borrowed_cuts_gradients"),
    ("rms_norm", norm_rebuilt, "norm_rebuilt", gradients.CUT, "`torch.tensor(...)`",
     "borrowed_cuts_gradients"),
    ("swiglu_ffn", swiglu_in_place, "swiglu_in_place", gradients.IN_PLACE, "`.mul_(...)`",
     "borrowed_changes_in_place"),
    ("swiglu_ffn", swiglu_sqrt_at_zero, "swiglu_sqrt_at_zero", gradients.NOT_FINITE, "",
     "borrowed_gradient_not_finite"),
    ("grouped_query_attention", attention_with_q_data, "attention_with_q_data", gradients.CUT,
     "`.data`", "borrowed_cuts_gradients"),
    ("decoder_block", block_with_no_grad_inside, "block_with_no_grad_inside", gradients.NO_GRAD,
     "`torch.no_grad()`", "borrowed_without_gradients"),
]
IDS = {"borrowed_without_gradients": "14.train_step.borrowed_without_gradients",
       "borrowed_cuts_gradients": "14.train_step.borrowed_cuts_gradients",
       "borrowed_changes_in_place": "14.train_step.borrowed_changes_in_place",
       "borrowed_gradient_not_finite": "14.train_step.borrowed_gradient_not_finite"}


@pytest.mark.parametrize("name,fn,function,cause,construct,key", CASES,
                         ids=[case[2] for case in CASES])
def test_a_cut_is_named_with_its_function_cause_and_construct(name, fn, function, cause,
                                                              construct, key):
    cut = gradients.probe(name, fn)
    assert cut is not None and cut.cause == cause and cut.function == function, cut
    assert cut.construct == construct
    mistake = gradients.borrowed_mistake(cut)
    assert f"14.train_step.{mistake.key}" == IDS[key]
    assert function in cut.detail()


@pytest.mark.parametrize("name", gradients.PROBED)
def test_the_references_train(name):
    assert gradients.probe(name, getattr(ref, name)) is None


def test_the_chapter_is_read_from_the_notebook_a_function_came_from():
    source = "def apply_rope(x, positions, **kw):\n    return x.detach()\n"
    namespace: dict = {}
    exec(compile(source, "<08_rope.ipynb: cell apply_rope>", "exec"), namespace)
    cut = gradients.probe("apply_rope", namespace["apply_rope"])
    assert cut is not None and cut.chapter == "08" and cut.function == "apply_rope"
    assert "(chapter 08)" in cut.detail()


def rope_with_angles_under_no_grad(x, positions, *, base=10000.0, rotary_dim=None):
    """Gradients off where nothing needs them (the angles): no cut."""
    with torch.no_grad():
        freqs = ref.rope_frequencies(x.shape[-1], base)
        angles = ref.rope_angles(positions, freqs)
    return ref.rotate_pairs(x, angles.cos(), angles.sin())


@torch.no_grad()
def frequencies(rotary_dim, base):
    return ref.rope_frequencies(rotary_dim, base)


def rope_with_a_no_grad_helper(x, positions, *, base=10000.0, rotary_dim=None):
    angles = ref.rope_angles(positions, frequencies(x.shape[-1], base))
    return ref.rotate_pairs(x, angles.cos(), angles.sin())


@pytest.mark.parametrize("fn", [rope_with_angles_under_no_grad, rope_with_a_no_grad_helper])
def test_gradients_turned_off_where_nothing_needs_them_are_no_cut(fn):
    assert torch.allclose(fn(torch.ones(1, 2, 3, 8), torch.arange(3)),
                          ref.apply_rope(torch.ones(1, 2, 3, 8), torch.arange(3)))
    assert gradients.probe("apply_rope", fn) is None
