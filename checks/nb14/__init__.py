"""Checks for chapter 14: training (beyond the article).

The contract's four exercises (`get_batch`, `lr_at`, `clip_grad_norm`, `adamw_step`) and the
chapter's own three (`train_step`, `evaluate`, `bits_per_byte`). Expected values come from
`checks.reference.training`, whose tests hold AdamW to torch.optim.AdamW(foreach=False) and
clipping to torch.nn.utils.clip_grad_norm_.

How the checks look inside:
- `get_batch`: the data are distinct numbers (each token says where it sits), so every row of x
  tells its start; the starts must be the contract's draw from the given generator. An edge case
  with len(data) == context_len + 1 and a large batch makes windows that run past the end show
  at every seed. Starts that are not the draw are compared with the usual wrong draws (bound
  off by one either way, randperm, another seed gives the same batch); two calls with
  generator=None must give two different batches.
- `lr_at`: the whole schedule (step 0 to past total_steps) is compared at once, with whole wrong
  schedules (warmup off by one or by the wrong divisor, the schedule shifted a step, the cosine
  over the wrong span or period, ...); the message tells the phase of the first wrong step.
- `clip_grad_norm`, `adamw_step`, `train_step` change their inputs in place by design: they are
  called with the arguments in a box, which the engine's in-place guard does not open.
  `adamw_step` is run for several steps with one `state` (all of them before a difference is
  told), and the parameters after each step are compared with the reference's and with whole
  wrong trajectories (coupled L2 decay, no bias correction, moments not kept, the step count off
  by one, eps inside the root, ...), computed only when a failure asks; one case's large eps
  shows the eps mistakes. `clip_grad_norm`'s last case has one outlier gradient (clamping each
  value shows, and unchanged gradients are told apart by it), and a wrong returned norm (RMS,
  L1, norm of the sums, ...) is named from its value.
- `train_step` and `evaluate` get a `forward` of the check's own (chapter 12's reference forward
  with a different logit scale per call, so gradient norms differ from step to step and clipping
  matters to AdamW): the check knows every batch and every logit, so the learner's results are
  compared with exact replays, and `evaluate`'s forward records whether gradients were tracked
  (the parameters' requires_grad flags are checked after the call, which the in-place guard
  does not compare). `train_step` has a second, two-step case with max_norm above every
  gradient norm, where a clip to norm 1 shows. `evaluate` ends with the parameters on PyTorch's
  meta device (standing in for a GPU; the data stay on the CPU): each batch must reach the
  forward, and the loss, on the parameters' device (not where it runs remotely: meta tensors do
  not travel to a grader's worker).
- `adamw_step`: a trajectory no listed mistake explains is tried against every bias correction
  with other step counts for m and v (0 .. call + 2), each call from the learner's own previous
  parameters: t used before it was incremented, or t + 1 for one moment, is named so.
- Every check runs on one CPU thread (`_one_thread`), as chapter 13's.
"""

from __future__ import annotations

import functools
import math
import numbers

import torch
import torch.nn.functional as F

from .. import gradients
from ..config import ModelConfig
from ..context import one_thread as _one_thread
from ..engine import Check, describe, is_remote, writes_back
from ..i18n import N_, _
from ..mistakes import Mistake
from ..reference import training as tr
from ..reference.model import init_model_params, model_forward

# --------------------------------------------------------------------------------------------
# The mistakes this chapter diagnoses

# get_batch
NOT_SHIFTED = Mistake("targets_not_shifted", N_(
    "y equals x: the targets are the NEXT tokens, y = data[i + 1 : i + context_len + 1]; the "
    "model at position t learns to predict token t + 1"))
SHIFTED_BACK = Mistake("targets_shifted_back", N_(
    "y is x shifted the wrong way (the previous tokens): y = data[i + 1 : i + context_len + 1]"))
X_Y_SWAPPED = Mistake("x_and_y_swapped", N_(
    "returned (y, x): return (x, y), the inputs first and the next tokens second"))
SAME_WINDOW = Mistake("same_window_every_row", N_(
    "every row is the same window: draw batch_size starts, one per row, "
    "torch.randint(0, len(data) - context_len, (batch_size,), generator=generator)"))
PAST_END = Mistake("windows_past_the_end", N_(
    "a window ran past the end of the data: the last start that still has context_len + 1 "
    "tokens (x and its shifted y) is len(data) - context_len - 1, so draw the starts with "
    "torch.randint(0, len(data) - context_len, ...) (randint's upper bound is excluded)"),
    raises=(("RuntimeError", r"stack expects each tensor to be equal size|out of bounds|"
             r"size of tensor|shape"), ("IndexError", None)))
IGNORED_GENERATOR = Mistake("ignored_generator", N_(
    "the same generator state gave different batches: pass generator=generator to "
    "torch.randint, so that a seeded generator gives the same batches again"))
OTHER_STARTS = Mistake("starts_not_as_specified", N_(
    "each row is a right window of the data, but the starts are not the contract's draw: "
    "starts = torch.randint(0, len(data) - context_len, (batch_size,), generator=generator), "
    "one call, in that order"))
GENERATOR_NOT_USED = Mistake("generator_not_used", N_(
    "two different generators gave the same batch: the starts do not come from the generator "
    "given (one made inside get_batch?); draw them with torch.randint(0, len(data) - "
    "context_len, (batch_size,), generator=generator)"))
FIXED_GENERATOR = Mistake("fixed_generator_when_none", N_(
    "called twice with generator=None, it gave the same batch both times (a generator made and "
    "seeded inside get_batch?): with no generator, draw from PyTorch's global one, "
    "torch.randint(..., generator=None), so that every training step gets a new batch"))
LAST_START = Mistake("last_start_never_drawn", N_(
    "the starts were drawn below len(data) - context_len - 1, so the last window is never "
    "drawn: randint's upper bound is already excluded, torch.randint(0, len(data) - "
    "context_len, (batch_size,), generator=generator)"),
    raises=(("RuntimeError", r"expects 'from' to be less than 'to'"),))
WITHOUT_REPLACEMENT = Mistake("starts_without_replacement", N_(
    "the starts were drawn without replacement (torch.randperm): draw them independently, "
    "torch.randint(0, len(data) - context_len, (batch_size,), generator=generator); two rows "
    "may share a start, and batch_size may exceed the number of starts"))
WRONG_LENGTH = Mistake("window_wrong_length", N_(
    "the rows of x or y are not context_len tokens long: x = data[i : i + context_len] and y = "
    "data[i + 1 : i + context_len + 1] (a slice's end is excluded)"))
TRANSPOSED = Mistake("transposed", N_(
    "x and y are [context_len, batch_size], one window per column: stack the windows as rows "
    "(torch.stack(windows), dim=0), so that x and y are [batch_size, context_len]"))
SIZES_SWAPPED = Mistake("sizes_swapped", N_(
    "batch_size and context_len were swapped: the batch has batch_size rows, each a window of "
    "context_len tokens (check the order of the arguments)"))

# lr_at
WARMUP_OFF_BY_ONE = Mistake("warmup_off_by_one", N_(
    "warmup off by one: steps 0 .. warmup_steps-1 warm up with max_lr * (step + 1) / "
    "warmup_steps (step 0 already trains, at max_lr / warmup_steps, and the last warmup step "
    "reaches max_lr); the cosine starts at step warmup_steps, at max_lr"))
COSINE_TO_ZERO = Mistake("cosine_ends_at_zero", N_(
    "the cosine ends at zero: it goes from max_lr down to min_lr, min_lr + (max_lr - min_lr) * "
    "(1 + cos(pi * progress)) / 2, and stays at min_lr after total_steps"))
COSINE_PAST_TOTAL = Mistake("cosine_past_total_steps", N_(
    "after total_steps the rate went on along the cosine (back up): from total_steps on it is "
    "min_lr"))
COSINE_FROM_ZERO = Mistake("cosine_ignores_warmup", N_(
    "the cosine's progress counted from step 0: it starts after the warmup, progress = "
    "(step - warmup_steps) / (total_steps - warmup_steps)"))
LINEAR_DECAY = Mistake("linear_decay", N_(
    "decayed linearly: after the warmup the rate follows half a cosine, min_lr + (max_lr - "
    "min_lr) * (1 + cos(pi * progress)) / 2"))
WARMUP_DIVISOR = Mistake("warmup_wrong_divisor", N_(
    "the warmup divides by the wrong count (warmup_steps - 1 or warmup_steps + 1): step s < "
    "warmup_steps has max_lr * (s + 1) / warmup_steps, so step 0 is at max_lr / warmup_steps and "
    "step warmup_steps - 1 reaches max_lr"))
SHIFTED_SCHEDULE = Mistake("schedule_shifted_by_one_step", N_(
    "the whole schedule is one step off (steps counted from 1?): steps start at 0, and lr_at(0) "
    "is already max_lr / warmup_steps; do not add or subtract one from step"))
WRONG_SPAN = Mistake("cosine_over_wrong_span", N_(
    "the cosine runs over the wrong number of steps: progress = (step - warmup_steps) / "
    "(total_steps - warmup_steps), 0 at the end of the warmup and 1 at total_steps"))
COSINE_OFF_BY_ONE = Mistake("cosine_off_by_one", N_(
    "the cosine is one step off: at step warmup_steps its progress is 0 (the rate is max_lr); "
    "progress = (step - warmup_steps) / (total_steps - warmup_steps)"))
INTEGER_DIVISION = Mistake("integer_division", N_(
    "the progress was computed with integer division (//), so it stays 0 and the rate stays at "
    "max_lr: divide with /, (step - warmup_steps) / (total_steps - warmup_steps)"))
FULL_PERIOD = Mistake("full_cosine_period", N_(
    "a whole period of the cosine (cos(2 * pi * progress)) goes down and back up: the decay is "
    "half a period, cos(pi * progress)"))
AMPLITUDE = Mistake("cosine_amplitude_wrong", N_(
    "the cosine does not go from max_lr to min_lr: min_lr + (max_lr - min_lr) * (1 + "
    "cos(pi * progress)) / 2 (mind the difference max_lr - min_lr and the / 2)"))
WARMUP_FROM_MIN = Mistake("warmup_from_min_lr", N_(
    "the warmup starts from min_lr: it goes linearly from 0, max_lr * (step + 1) / "
    "warmup_steps; min_lr is only the end of the cosine"))
AFTER_TOTAL = Mistake("wrong_rate_after_total", N_(
    "the rate at and after total_steps is not min_lr: from total_steps on, return min_lr"))
NOT_A_FLOAT = Mistake("returned_tensor", N_(
    "return a Python float (float(...) or .item()), not a tensor or an int"))

# clip_grad_norm
NORM_AFTER = Mistake("norm_after_clipping", N_(
    "returned the norm after clipping (about max_norm): return the global norm measured before "
    "the gradients are scaled, as torch.nn.utils.clip_grad_norm_ does (it is what a training "
    "log shows)"))
PER_TENSOR = Mistake("per_tensor_clip", N_(
    "clipped each tensor by its own norm: the norm is global, sqrt of the sum of every "
    "gradient's squares over all tensors, and every gradient is scaled by the same "
    "max_norm / (norm + 1e-6)"))
NOT_IN_PLACE_CLIP = Mistake("not_in_place", N_(
    "the gradients in the list are unchanged: scale them in place (g.mul_(scale)); rebinding a "
    "name (g = g * scale) changes nothing the caller sees"))
SCALED_UP = Mistake("scaled_up_small_gradients", N_(
    "scaled gradients whose norm is already below max_norm: clip only when the norm exceeds "
    "max_norm (the scale is min(1, max_norm / (norm + 1e-6)))"))
SQUARED_NORM = Mistake("forgot_square_root", N_(
    "returned the sum of squares: the L2 norm is its square root"))
TORCH_CLIP = Mistake("torch_clip_on_gradients", N_(
    "torch.nn.utils.clip_grad_norm_ was given the gradients: it takes parameters and clips "
    "their .grad, which the gradient tensors do not have, so it measured 0 and changed nothing; "
    "compute the global norm of the gradients yourself and scale them in place"))
CLAMPED = Mistake("clamped_each_value", N_(
    "clamped each value to [-max_norm, max_norm]: clipping by norm scales every gradient by "
    "the same factor, max_norm / (norm + 1e-6), keeping their direction"))
RMS_NORM = Mistake("rms_not_l2_norm", N_(
    "measured the root mean square (divided by the number of values): the global L2 norm is "
    "sqrt of the SUM of every gradient's squares, with no division"))
NORM_OF_SUMS = Mistake("norm_of_sums", N_(
    "squared each tensor's sum: the global norm sums the squares of the values, "
    "sqrt(sum over tensors of (g ** 2).sum()), not the squares of the sums"))
SUMMED_NORMS = Mistake("summed_tensor_norms", N_(
    "added the tensors' norms: the global norm is sqrt of the sum of their SQUARED norms, "
    "sqrt(sum(g.norm() ** 2 for g in grads))"))
L1_NORM = Mistake("l1_norm", N_(
    "measured the sum of absolute values (the L1 norm): the global L2 norm is "
    "sqrt(sum over tensors of (g ** 2).sum())"))
ONE_TENSOR = Mistake("norm_of_one_tensor", N_(
    "measured the norm of one tensor only: the global norm covers every gradient in the list"))
INVERTED_SCALE = Mistake("inverted_scale", N_(
    "scaled by norm / max_norm, which makes the gradients larger: the scale is max_norm / "
    "(norm + 1e-6)"))

# adamw_step
COUPLED_DECAY = Mistake("coupled_l2_decay", N_(
    "coupled L2 decay: added weight_decay * p to the gradient (Adam with L2), which then goes "
    "through the moments; AdamW decays the weights directly, p <- p * (1 - lr * weight_decay), "
    "apart from the gradient"))
NO_BIAS_CORRECTION = Mistake("no_bias_correction", N_(
    "no bias correction: divide m by (1 - beta1**t) and v by (1 - beta2**t), t the step count "
    "starting at 1; without it the first steps are far too small"))
MOMENTS_NOT_KEPT = Mistake("moments_not_kept", N_(
    "the moments were not kept between calls: store m, v and the step count in `state` (it is "
    "the same dict at every call) and update them, instead of starting from zero each step"))
STEP_NOT_KEPT = Mistake("step_count_not_kept", N_(
    "the step count did not advance between calls (the bias correction used t = 1 every "
    "time): keep t in `state` and add one per call"))
EPS_INSIDE = Mistake("eps_inside_sqrt", N_(
    "eps inside the square root: the denominator is sqrt(v_hat) + eps, not sqrt(v_hat + eps)"))
DECAY_WITHOUT_LR = Mistake("decay_not_scaled_by_lr", N_(
    "decayed by weight_decay alone: the decoupled decay is p <- p * (1 - lr * weight_decay), "
    "scaled by the learning rate"))
BETAS_SWAPPED = Mistake("betas_swapped", N_(
    "betas swapped: m (the mean of the gradients) uses beta1, v (the mean of their squares) "
    "uses beta2"))
SQRT_BIAS = Mistake("second_bias_correction_without_sqrt", N_(
    "divided sqrt(v) by (1 - beta2**t) itself: v_hat = v / (1 - beta2**t), and its square "
    "root divides by sqrt(1 - beta2**t)"))
NOT_IN_PLACE_ADAM = Mistake("not_in_place", N_(
    "the parameters are unchanged: update the tensors in `params` in place (p.mul_, "
    "p.addcdiv_, p -= ...); `p = p - ...` makes a new tensor the caller never sees"))
BIAS_STEP = Mistake("bias_correction_step_off_by_one", N_(
    "the bias correction used the step count plus one (t = 2 on the first call): the first "
    "call is t = 1, so increment the count kept in `state` (starting from 0) once, then use it "
    "in 1 - beta1**t and 1 - beta2**t"))
BIAS_COUNT = Mistake("bias_correction_wrong_step", N_(
    "the bias correction used another step count than the call's: t counts the calls to "
    "adamw_step, 1 on the first, 2 on the second; keep it in `state` (starting from 0), add one "
    "at the start of each call, then use that same t in both 1 - beta1**t and 1 - beta2**t "
    "(not t + 1, and not the count before it was incremented)"))
STEP_PER_TENSOR = Mistake("step_counted_per_tensor", N_(
    "the step count advanced once per tensor: it counts calls, so add one per call, before the "
    "loop over the parameters"))
NO_DECAY = Mistake("no_weight_decay", N_(
    "no weight decay: every parameter also decays, p <- p * (1 - lr * weight_decay), before the "
    "Adam update"))
DECAY_SIGN = Mistake("decay_wrong_sign", N_(
    "the decay made the weights grow: p <- p * (1 - lr * weight_decay), a minus sign"))
DECAY_AFTER = Mistake("decay_after_update", N_(
    "decayed after the Adam update: decay first, p <- p * (1 - lr * weight_decay), then "
    "subtract lr * m_hat / (sqrt(v_hat) + eps), as torch.optim.AdamW does"))
NO_ONE_MINUS = Mistake("moments_without_one_minus_beta", N_(
    "the moments add the whole gradient: they are moving averages, m = beta1 * m + (1 - beta1) "
    "* g and v = beta2 * v + (1 - beta2) * g * g"))
NOT_SQUARED = Mistake("second_moment_not_squared", N_(
    "the second moment averages |g| (or g): it is the average of the squares, v = beta2 * v + "
    "(1 - beta2) * g * g"))
PARTIAL_BIAS = Mistake("partial_bias_correction", N_(
    "only one moment was bias-corrected: m_hat = m / (1 - beta1**t) AND v_hat = v / (1 - "
    "beta2**t)"))
NO_LR = Mistake("update_not_scaled_by_lr", N_(
    "the Adam update was not multiplied by the learning rate: p <- p - lr * m_hat / "
    "(sqrt(v_hat) + eps)"))

# train_step
GRADS_NOT_RESET = Mistake("gradients_not_reset", N_(
    "the gradients of one step were added to the next one's: loss.backward() accumulates into "
    "p.grad, so clear it after the update (p.grad = None), or take the gradients with "
    "torch.autograd.grad"))
NO_CLIP = Mistake("no_clipping", N_(
    "the gradients were not clipped before the update: call clip_grad_norm(grads, max_norm) "
    "between backward and adamw_step (clipping after the update has no effect on it)"))
IGNORED_DECAY = Mistake("ignored_weight_decay", N_(
    "the weight_decay argument was not passed on to adamw_step"))
SHIFTED_TWICE = Mistake("targets_shifted_twice", N_(
    "shifted the targets again: y already holds the next tokens (get_batch shifted them), so "
    "the loss is F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)), every position against "
    "y at the same position; next_token_loss would shift a second time"))
LOSS_AFTER = Mistake("loss_after_update", N_(
    "returned the loss after the update: return the loss of the batch the gradients came from, "
    "computed before adamw_step"))
SUMMED_LOSS = Mistake("summed_loss", N_(
    "the loss is a sum over positions: take the mean cross-entropy (the default reduction)"))
IGNORED_FORWARD = Mistake("ignored_forward", N_(
    "ignored the forward argument: compute the logits with forward(x, params, cfg) when it is "
    "given (model_forward when it is None); the ablations pass their own forward"))
TRACKED_UPDATE = Mistake("update_tracked_by_autograd", N_(
    "updated the parameters with gradients tracked: PyTorch refuses to change a leaf that "
    "requires grad in place; run clipping and adamw_step inside `with torch.no_grad():`"),
    raises=(("RuntimeError", r"leaf Variable that requires grad|in-place operation"),))
TRAIN_NOT_IN_PLACE = Mistake("parameters_unchanged", N_(
    "the parameters are unchanged after the step: adamw_step must update the tensors of "
    "`params` themselves, in place"))
IGNORED_MAX_NORM = Mistake("ignored_max_norm", N_(
    "the gradients were clipped to norm 1 whatever max_norm was given: pass max_norm on, "
    "clip_grad_norm(grads, max_norm)"))
STATE_NOT_PASSED = Mistake("state_not_passed", N_(
    "AdamW started afresh at every step (its moments and step count lost): pass train_step's "
    "own `state` to adamw_step, the same dict at every call, not a new one"))
NOT_FLATTENED = Mistake("logits_not_flattened", N_(
    "F.cross_entropy takes logits [N, V] and targets [N]: flatten them, "
    "F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)); on [B, T, V] it reads T as the "
    "classes"), raises=(("RuntimeError", r"Expected target size|Expected input batch_size"),
                        ("ValueError", r"Expected target size|Expected input batch_size")))

# evaluate
GRADIENTS_TRACKED = Mistake("gradients_tracked", N_(
    "the forward passes ran with gradients tracked: wrap the evaluation in `with "
    "torch.no_grad():` (no graph is built, so it takes less memory and time)"))
SAME_BATCH = Mistake("same_batch_repeated", N_(
    "evaluated the same batch n_batches times: draw a new batch with get_batch for every one"))
BATCH_COUNT = Mistake("wrong_number_of_batches", N_(
    "evaluated a different number of batches than n_batches"))
SUMMED_BATCHES = Mistake("summed_not_averaged", N_(
    "returned the sum of the batches' losses: return their mean (divide by n_batches)"))
EVAL_CHANGED = Mistake("changed_parameters", N_(
    "the evaluation changed its inputs (a training step inside evaluate?): an evaluation only "
    "measures the loss; it never updates the parameters"))
FLAGS_OFF = Mistake("requires_grad_left_off", N_(
    "the parameters no longer require gradients after the evaluation (requires_grad_(False) "
    "not undone): training after it would fail; use `with torch.no_grad():` instead, which "
    "changes no parameter"))
ARGS_SWAPPED = Mistake("batch_arguments_swapped", N_(
    "the batches are [context_len, batch_size]: get_batch(data, batch_size, context_len, "
    "generator=generator), in that order"))
NOT_GET_BATCH = Mistake("batches_not_from_get_batch", N_(
    "the batches are not get_batch's: draw each one with get_batch(data, batch_size, "
    "context_len, generator=generator), so that the evaluation sees random windows (the same "
    "ones for the same generator)"))
BATCH_DEVICE = Mistake("batches_not_on_the_model_device", N_(
    "the batches stayed where the data are while the model is on another device (a GPU): move "
    "each batch to the parameters' device, x.to(device) and y.to(device) with device = "
    "params[\"embed\"].device, before the forward and the loss"),
    raises=(("RuntimeError", r"(not on the expected device|same device|Expected all tensors)"),))
SUMMED_TOKENS = Mistake("summed_over_tokens", N_(
    "the batch losses are sums over the tokens (reduction='sum'): take each batch's mean "
    "cross-entropy, then the mean over the batches"))

# bits_per_byte
FORGOT_LN2 = Mistake("forgot_ln2", N_(
    "returned nats, not bits: a loss in nats becomes bits when divided by ln 2 (math.log(2))"))
TIMES_LN2 = Mistake("multiplied_by_ln2", N_(
    "multiplied by ln 2: bits = nats / ln 2 (one bit is ln 2 ≈ 0.693 nats)"))
PER_TOKEN = Mistake("per_token_not_per_byte", N_(
    "bits per token, not per byte: multiply by n_tokens / n_bytes (a BPE token holds several "
    "bytes, a byte-level token one)"))
INVERTED_RATIO = Mistake("inverted_ratio", N_(
    "the ratio is upside down: bits per byte = loss * n_tokens / n_bytes / ln 2 (the loss is "
    "per token; there are n_tokens of them in n_bytes bytes)"))
LOG10 = Mistake("log10", N_("divided by ln 10: bits are log base 2, so divide by ln 2"))


# --------------------------------------------------------------------------------------------
# Small helpers


class _Arguments:
    """The arguments of a call whose job is to change them in place (clipping, an optimiser
    step): the engine's in-place guard looks only inside tensors, lists, tuples and dicts, so a
    box keeps it out; the box shows the arguments in messages."""

    def __init__(self, args: tuple, kwargs: dict):
        self.args, self.kwargs = args, kwargs

    def __repr__(self) -> str:
        return ", ".join([describe(a) for a in self.args] +
                         [f"{k}={describe(v)}" for k, v in self.kwargs.items()])


def _call_in_place(c: Check, *args, **kwargs):
    """`c.call(*args, **kwargs)` for a function that may change its arguments."""
    fn = c.fn

    def unpack(box: _Arguments):
        return fn(*box.args, **box.kwargs)

    unpack.__name__ = getattr(fn, "__name__", c.exercise)
    c.fn = unpack
    # Graded in a worker, the arguments come back as the learner's function left them.
    token = writes_back.set(True)
    try:
        return c.call(_Arguments(args, kwargs))
    finally:
        writes_back.reset(token)
        c.fn = fn


def _is_float(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)) \
        and not isinstance(value, torch.Tensor)


def _expect_float(c: Check, got, want: float, what: str, wrong=(), rel: float = 1e-6,
                  abs_tol: float = 1e-9) -> None:
    """A float equal to `want`; else the first (mistake, value) of `wrong` that `got` matches."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        c.fail(_("{what} is a tensor ({value}); expected a Python float.").format(
            what=what, value=describe(got)), NOT_A_FLOAT)
    if not isinstance(got, numbers.Real) or isinstance(got, bool):
        c.fail(_("{what} is {got}; expected a float.").format(what=what, got=describe(got)),
               NOT_A_FLOAT)
    if not math.isclose(float(got), want, rel_tol=rel, abs_tol=abs_tol):
        hint = None
        for mistake, value in wrong:
            try:
                v = value() if callable(value) else value
            except Exception:  # noqa: BLE001 - a variant that cannot be formed names nothing
                continue
            if v is not None and math.isclose(float(got), v, rel_tol=max(rel, 1e-5),
                                              abs_tol=abs_tol):
                hint = mistake
                break
        shown_got, shown_want = _digits(float(got), want, 8)
        c.fail(_("{what} is {got}, expected {want}.").format(
            what=what, got=shown_got, want=shown_want), hint)
    if not _is_float(got):
        c.fail(_("{what} is {got} of type {kind}; expected a float.").format(
            what=what, got=repr(got), kind=type(got).__name__), NOT_A_FLOAT)
    c.note(what)


class _Lazy(dict):
    """{kind: a wrong variant}, each computed when a failure first asks for it (a correct
    implementation never pays for the wrong ones)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, kind):
        value = self[kind] = self.make(kind)
        return value


def _digits(got: float, want: float, least: int = 6) -> tuple[str, str]:
    """`got` and `want` with as many significant digits as it takes to tell them apart (at least
    `least`, at most 17), so that a message never shows two equal numbers for a gap it rejects."""
    for digits in range(least, 18):
        a, b = f"{got:.{digits}g}", f"{want:.{digits}g}"
        if a != b:
            return a, b
    return a, b


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float = 1e-5) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=atol,
                                                      rtol=rtol))


def _all_close(xs, ys, atol: float, rtol: float = 1e-5) -> bool:
    return len(xs) == len(ys) and all(_close(a, b, atol, rtol) for a, b in zip(xs, ys))


def _mostly_close(xs, ys, atol: float, rtol: float, far: float) -> bool:
    """All entries close, except a few (at most 0.2 % of them, and at most `far` apart): AdamW's
    first steps move an entry by about lr whatever its gradient's size, so an entry whose gradient
    is within rounding of zero may move either way (two correct ways of computing the same loss
    differ there); a mistake moves most entries."""
    if len(xs) != len(ys) or any(a.shape != b.shape for a, b in zip(xs, ys)):
        return False
    off, total = 0, 0
    for a, b in zip(xs, ys):
        a64, b64 = a.double(), b.double()
        diff = (a64 - b64).abs()
        bad = diff > atol + rtol * b64.abs()
        if bool((diff[bad] > far).any()) or not bool(a64.isfinite().all()):
            return False
        off += int(bad.sum())
        total += a.numel()
    return off <= max(2, total // 500)


# --------------------------------------------------------------------------------------------
# get_batch


def _windows(data: torch.Tensor, x: torch.Tensor) -> list[int] | None:
    """The start of every row of x in `data` (distinct values), or None where a row is not a
    window of the data."""
    where = {int(v): i for i, v in enumerate(data.tolist())}
    starts = []
    for row in x.tolist():
        i = where.get(int(row[0])) if row else None
        if i is None or data[i:i + len(row)].tolist() != row:
            return None
        starts.append(i)
    return starts


@_one_thread
def check_get_batch(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("get_batch", f, seed=seed, errors=[PAST_END, LAST_START]) as c:
        cases = []
        for _n in range(6 if thorough else 3):
            b, t = c.sizes(2, 3, 12)
            n = t + 1 + c.randint(5, 60)
            cases.append((n, b, t, c.randint(0, 2**31)))
        # The edge case: one start only (0); a window past the end shows at every seed.
        t = c.randint(4, 9)
        cases.append((t + 1, 64, t, c.randint(0, 2**31)))
        for n, b, t, gseed in cases:
            data = torch.randperm(1000, generator=c.gen)[:n] + 1000  # distinct token ids
            what = f"get_batch(data [{n}], batch_size={b}, context_len={t})"
            got = c.call(data, b, t, generator=torch.Generator().manual_seed(gseed))
            x_want, y_want = tr.get_batch(data, b, t,
                                          generator=torch.Generator().manual_seed(gseed))
            if not isinstance(got, tuple) or len(got) != 2:
                c.fail(_("{what} returned {got}; expected a tuple (x, y) of two tensors.").format(
                    what=what, got=describe(got)))
            x, y = got
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and \
                    x.shape == y.shape == x_want.shape and torch.equal(x, y_want) and \
                    torch.equal(y, x_want):
                c.fail(_("{what}: x and y are the wrong way round.").format(what=what),
                       X_Y_SWAPPED)
            for name, got_t, want_t in (("x", x, x_want), ("y", y, y_want)):
                if isinstance(got_t, torch.Tensor) and got_t.shape != want_t.shape and \
                        got_t.dim() == 2 and got_t.shape[0] == b and n == t + 1:
                    c.fail(_("{what}: {name} has shape {got}, expected {want}.").format(
                        what=what, name=name, got=list(got_t.shape), want=list(want_t.shape)),
                           PAST_END)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and \
                    x.dim() == y.dim() == 2 and (x.shape != x_want.shape or
                                                 y.shape != y_want.shape):
                hint = None
                if tuple(x.shape) == (t, b):
                    hint = SIZES_SWAPPED if _windows(data, x) is not None else \
                        TRANSPOSED if _windows(data, x.T) is not None else None
                elif x.shape[0] == y.shape[0] == b:
                    hint = WRONG_LENGTH
                elif x.shape[0] == min(b, n - t) < b:
                    hint = WITHOUT_REPLACEMENT
                if hint is not None:
                    c.fail(_("{what}: x has shape {got_x} and y {got_y}, expected {want} for "
                             "both.").format(what=what, got_x=list(x.shape), got_y=list(y.shape),
                                             want=list(x_want.shape)), hint)
            for name, got_t, want_t in (("x", x, x_want), ("y", y, y_want)):
                if not isinstance(got_t, torch.Tensor) or got_t.shape != want_t.shape or \
                        got_t.dtype != want_t.dtype:
                    c.expect_tensor(got_t, want_t, what=f"{name} of {what}", dims=["B", "T"])
            if torch.equal(x, y):
                c.fail(_("{what}: y equals x.").format(what=what), NOT_SHIFTED)
            starts = _windows(data, x)
            if starts is None:
                c.fail(_("{what}: a row of x is not {count} consecutive tokens of data.").format(
                    what=what, count=t), TRANSPOSED if _windows(data, x.T) is not None
                    else PAST_END if n == t + 1 else None)
            back = any(st >= 1 and torch.equal(y[row], data[st - 1:st + t - 1])
                       for row, st in enumerate(starts))
            for row, st in enumerate(starts):
                if st + t + 1 > n:
                    c.fail(_("{what}: row {row} starts at {start}; its y would need token "
                             "{last}, past the end of the data.").format(
                                 what=what, row=row, start=st, last=st + t), PAST_END)
                if not torch.equal(y[row], data[st + 1:st + t + 1]):
                    c.fail(_("{what}: row {row} of y is not row {row} of x shifted by one token "
                             "(data[i + 1 : i + context_len + 1]).").format(what=what, row=row),
                           SHIFTED_BACK if back else None)
            if b > 1 and len(set(starts)) == 1 and len(set(x_want[:, 0].tolist())) > 1:
                c.fail(_("{what}: every row of x is the same window.").format(what=what),
                       SAME_WINDOW)
            if not torch.equal(x, x_want):
                again = c.call(data, b, t, generator=torch.Generator().manual_seed(gseed))
                other = c.call(data, b, t, generator=torch.Generator().manual_seed(gseed + 1))
                hint = IGNORED_GENERATOR if not (isinstance(again, tuple) and torch.equal(
                    again[0], x)) else GENERATOR_NOT_USED if isinstance(other, tuple) and \
                    torch.equal(other[0], x) else OTHER_STARTS
                for high, mistake in ((n - t + 1, PAST_END), (n, PAST_END),
                                      (n - t - 1, LAST_START)):
                    if high > 0 and torch.randint(0, high, (b,), generator=torch.Generator()
                                                  .manual_seed(gseed)).tolist() == starts:
                        hint = mistake
                if torch.randperm(n - t, generator=torch.Generator().manual_seed(gseed))[
                        :b].tolist() == starts:
                    hint = WITHOUT_REPLACEMENT
                position = {int(v): i for i, v in enumerate(data.tolist())}
                c.fail(_("{what}: the rows start at {got}, expected {want} (the contract's "
                         "draw from the generator).").format(
                             what=what, got=starts[:6],
                             want=[position[int(v)] for v in x_want[:6, 0]]), hint)
            c.note(_("x and y [B, T], y shifted by one, the contract's starts"))
        # No generator: every call a new draw (from the global generator), never a fixed one.
        data = torch.randperm(1000, generator=c.gen)[:400] + 1000
        first, second = c.call(data, 8, 6), c.call(data, 8, 6)
        if isinstance(first, tuple) and isinstance(second, tuple) and \
                torch.equal(first[0], second[0]):
            c.fail(_("get_batch(data [400], batch_size=8, context_len=6) without a generator "
                     "gave the same batch twice."), FIXED_GENERATOR)
        c.note(_("without a generator: a new batch at every call"))
        c.headline(_("windows of the data, targets shifted by one, the generator's starts"))


# --------------------------------------------------------------------------------------------
# lr_at


def _schedules(max_lr, min_lr, w, total):
    """(mistake, schedule) pairs: whole wrong schedules, step -> rate."""
    def cos_part(step, lo, start=w, span=None):
        span = (total - w) if span is None else span
        p = (step - start) / span
        return lo + 0.5 * (max_lr - lo) * (1 + math.cos(math.pi * p))

    def right(step):
        return tr.lr_at(step, max_lr=max_lr, min_lr=min_lr, warmup_steps=w, total_steps=total)

    def warm_late(step):
        return max_lr * (step + 1) / w if step <= w else right(step)

    def warm_zero(step):
        return max_lr * step / w if step < w else right(step)

    def warm_zero_late(step):
        return max_lr * step / w if step <= w else right(step)

    def to_zero(step):
        if step < w:
            return max_lr * (step + 1) / w
        return cos_part(step, 0.0) if step < total else 0.0

    def to_zero_min_after(step):
        return to_zero(step) if step < total else min_lr

    def past_total(step):
        return right(step) if step < total else cos_part(step, min_lr)

    def from_zero(step):
        return right(step) if step < w else (cos_part(step, min_lr, 0, total) if step < total
                                             else min_lr)

    def linear(step):
        if step < w:
            return right(step)
        if step >= total:
            return min_lr
        return max_lr - (max_lr - min_lr) * (step - w) / (total - w)

    def formula(step, *, warm=lambda s: max_lr * (s + 1) / w, lo=min_lr, amp=None, half=0.5,
                period=math.pi, progress=None, after=None):
        if step < w:
            return warm(step)
        if step >= total:
            return min_lr if after is None else after
        p = (step - w) / (total - w) if progress is None else progress(step)
        amp = (max_lr - lo) if amp is None else amp
        return lo + half * amp * (1 + math.cos(period * p))

    def shifted(delta):
        return lambda step: formula(step + delta)

    variants = [
        (WARMUP_DIVISOR, lambda s: formula(s, warm=lambda k: max_lr * k / (w - 1))
         if w > 1 else None),
        (WARMUP_DIVISOR, lambda s: formula(s, warm=lambda k: max_lr * (k + 1) / (w + 1))),
        (SHIFTED_SCHEDULE, shifted(1)), (SHIFTED_SCHEDULE, shifted(-1)),
        (WRONG_SPAN, lambda s: formula(s, progress=lambda k: (k - w) / total)),
        (WRONG_SPAN, lambda s: formula(s, progress=lambda k: (k - w) / (total - w + 1))),
        (WRONG_SPAN, lambda s: formula(s, progress=lambda k: (k - w) / max(total - w - 1, 1))),
        (COSINE_OFF_BY_ONE, lambda s: formula(s, progress=lambda k: (k - w + 1) / (total - w))),
        (COSINE_OFF_BY_ONE, lambda s: formula(s, progress=lambda k: (k - w - 1) / (total - w))),
        (INTEGER_DIVISION, lambda s: formula(s, progress=lambda k: (k - w) // (total - w))),
        (FULL_PERIOD, lambda s: formula(s, period=2 * math.pi)),
        (AMPLITUDE, lambda s: formula(s, amp=max_lr)),
        (AMPLITUDE, lambda s: formula(s, half=1.0)),
        (WARMUP_FROM_MIN, lambda s: formula(
            s, warm=lambda k: min_lr + (max_lr - min_lr) * (k + 1) / w)),
        (WARMUP_FROM_MIN, lambda s: formula(s, warm=lambda k: min_lr + (max_lr - min_lr) * k / w)),
        (AFTER_TOTAL, lambda s: formula(s, after=0.0)),
        (AFTER_TOTAL, lambda s: formula(s, after=max_lr))]

    return [(WARMUP_OFF_BY_ONE, warm_late), (WARMUP_OFF_BY_ONE, warm_zero),
            (WARMUP_OFF_BY_ONE, warm_zero_late), (COSINE_TO_ZERO, to_zero),
            (COSINE_TO_ZERO, to_zero_min_after), (COSINE_PAST_TOTAL, past_total),
            (COSINE_FROM_ZERO, from_zero), (LINEAR_DECAY, linear)] + variants


@_one_thread
def check_lr_at(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("lr_at", f, seed=seed) as c:
        cases = []
        for _n in range(4 if thorough else 2):
            max_lr = float(c.choice([1e-3, 3e-3, 6e-4, 1e-2])) * (1 + c.randint(0, 9) / 10)
            min_lr = max_lr * c.choice([0.05, 0.1, 0.2])
            w = c.randint(2, 12)
            total = w + c.randint(8, 40)
            cases.append((max_lr, min_lr, w, total))
        for max_lr, min_lr, w, total in cases:
            kw = dict(max_lr=max_lr, min_lr=min_lr, warmup_steps=w, total_steps=total)
            steps = list(range(0, total + 6))
            got = {}
            for step in steps:
                value = c.call(step, **kw)
                if isinstance(value, torch.Tensor) or not isinstance(value, numbers.Real) or \
                        isinstance(value, bool):
                    c.fail(_("lr_at({step}, ...) is {got}; expected a float.").format(
                        step=step, got=describe(value)), NOT_A_FLOAT)
                got[step] = float(value)
            want = {s: tr.lr_at(s, **kw) for s in steps}
            bad = [s for s in steps if not math.isclose(got[s], want[s], rel_tol=1e-9,
                                                        abs_tol=1e-15)]
            if bad:
                def fits(sched):
                    try:
                        return all(math.isclose(got[s], sched(s), rel_tol=1e-9, abs_tol=1e-15)
                                   for s in steps)
                    except (TypeError, ZeroDivisionError):  # a variant these sizes cannot form
                        return False

                hint = next((m for m, sched in _schedules(max_lr, min_lr, w, total)
                             if fits(sched)), None)
                s = bad[0]
                phase = (_("in the warmup") if s < w else _("in the cosine") if s < total
                         else _("at or after total_steps"))
                shown_got, shown_want = _digits(got[s], want[s])
                c.fail(_("lr_at({step}, max_lr={max_lr:g}, min_lr={min_lr:g}, warmup_steps="
                         "{warmup}, total_steps={total}) is {got}, expected {want} (the first "
                         "wrong step, {phase}; {count} of the {steps} steps 0 .. {last} differ).")
                       .format(step=s, max_lr=max_lr, min_lr=min_lr, warmup=w, total=total,
                               got=shown_got, want=shown_want, phase=phase, count=len(bad),
                               steps=len(steps), last=steps[-1]), hint)
            c.note(f"lr_at(0 .. {total + 5}, warmup {w}, total {total})")
        c.headline(_("warmup, cosine to min_lr, min_lr after total_steps"))


# --------------------------------------------------------------------------------------------
# clip_grad_norm


@_one_thread
def check_clip_grad_norm(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("clip_grad_norm", f, seed=seed) as c:
        cases = []
        for n_case, clip in enumerate([True, False, True] * (2 if thorough else 1) + [True]):
            shapes = [(c.randint(2, 6), c.randint(2, 6)), (c.randint(2, 9),),
                      (c.randint(2, 4), c.randint(2, 4), c.randint(2, 4))][:c.randint(2, 4)]
            # one tensor much larger than the others, so per-tensor clipping differs clearly
            grads = [c.randn(*s) * (5.0 if i == 0 else 0.3) for i, s in enumerate(shapes)]
            if n_case == (6 if thorough else 3):
                # the outlier case: one value above max_norm, so that clamping each value shows
                rest = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
                grads[0].view(-1)[0] = 3.0 * rest
            norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
            max_norm = norm * (c.choice([0.2, 0.4, 0.6]) if clip else c.choice([1.5, 3.0]))
            cases.append((grads, max_norm))
        outlier = cases[-1]

        def clamps() -> bool:
            """Whether the function clamps each value (tried on the outlier case)."""
            grads, max_norm = [g.clone() for g in outlier[0]], outlier[1]
            _call_in_place(c, grads, max_norm)
            clamped = [g.clamp(-max_norm, max_norm) for g in outlier[0]]
            return _all_close(grads, clamped, 1e-6, 1e-5) and \
                not _all_close(grads, outlier[0], 1e-7, 0.0)

        for grads, max_norm in cases:
            before = [g.clone() for g in grads]
            want_grads = [g.clone() for g in grads]
            want = tr.clip_grad_norm(want_grads, max_norm)
            what = _("clip_grad_norm({count} gradients, max_norm={max_norm:.4g})").format(
                count=len(grads), max_norm=max_norm)
            got = _call_in_place(c, grads, max_norm)
            scale = max_norm / (want + 1e-6)
            per_tensor = [g * min(1.0, max_norm / (float(g.norm()) + 1e-6)) for g in before]
            scaled_up = [g * scale for g in before]
            # norms measured the wrong way (and what clip_grad_norm_ on gradients measures)
            wrong_norms = [
                (RMS_NORM, want / math.sqrt(sum(g.numel() for g in before))),
                (NORM_OF_SUMS, math.sqrt(sum(float(g.sum()) ** 2 for g in before))),
                (SUMMED_NORMS, sum(float(g.norm()) for g in before)),
                (L1_NORM, sum(float(g.abs().sum()) for g in before)),
                (ONE_TENSOR, float(before[0].norm())), (TORCH_CLIP, 0.0)]
            value = float(got) if isinstance(got, numbers.Real) and not isinstance(got, bool) \
                or isinstance(got, torch.Tensor) and got.numel() == 1 else None
            value_hint = None
            if value is not None and not math.isclose(value, want, rel_tol=1e-5):
                value_hint = next((m for m, v in wrong_norms
                                   if math.isclose(value, v, rel_tol=1e-5, abs_tol=1e-9)), None)
            if not _all_close(grads, want_grads, 1e-6, 1e-5):
                if _all_close(grads, per_tensor, 1e-6, 1e-5):
                    hint = PER_TENSOR
                elif not _all_close(grads, before, 1e-7, 0.0) and _all_close(
                        grads, [g.clamp(-max_norm, max_norm) for g in before], 1e-6, 1e-5):
                    hint = CLAMPED
                elif want > max_norm and _all_close(
                        grads, [g * (want / max_norm) for g in before], 1e-6, 1e-5):
                    hint = INVERTED_SCALE
                elif value_hint is not None:
                    hint = value_hint
                elif _all_close(grads, before, 1e-7, 0.0):
                    # unchanged: not in place, or each value clamped with none above max_norm
                    hint = CLAMPED if clamps() else NOT_IN_PLACE_CLIP
                elif want < max_norm and _all_close(grads, scaled_up, 1e-6, 1e-5):
                    hint = SCALED_UP
                else:
                    hint = None
                told = _("{what}: the gradients after the call are not the expected ones "
                         "(the norm is {norm:.6g}; expected them {how}).").format(
                             what=what, norm=want,
                             how=_("scaled by {scale:.6g}").format(scale=scale)
                             if want > max_norm else _("unchanged"))
                if value is not None and not math.isclose(value, want, rel_tol=1e-5):
                    told += " " + _("It returned {got:.6g} as the norm.").format(got=value)
                c.fail(told, hint)
            # a norm measured the wrong way first: with one tensor much larger than the others,
            # its norm is also the largest per-tensor norm
            _expect_float(c, got, want, what, wrong=(
                [(value_hint, 0.0 if value is None else value)] if value_hint else []) + [
                (NORM_AFTER, min(want, max_norm * want / (want + 1e-6))),
                (SQUARED_NORM, want ** 2),
                (PER_TENSOR, max((float(g.norm()) for g in before), default=0.0))],
                rel=1e-5)
        c.headline(_("the global norm before clipping; every gradient scaled in place only "
                     "above max_norm"))


# --------------------------------------------------------------------------------------------
# adamw_step


def _adamw_variant(kind: str | None, params0, grads_seq, lrs, betas, eps, wd):
    """The parameters after each step of AdamW written with one mistake (None: correct)."""
    params = [p.clone() for p in params0]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2 = (betas[1], betas[0]) if kind == "betas_swapped" else betas
    out = []
    for t, (grads, lr) in enumerate(zip(grads_seq, lrs), start=1):
        step = 1 if kind in ("moments", "step") else t + 1 if kind == "t_plus_one" else t
        if kind in ("moments", "moments_t"):
            m = [torch.zeros_like(p) for p in params]
            v = [torch.zeros_like(p) for p in params]
        new = []
        for i, (p, g) in enumerate(zip(params, grads)):
            p = p.clone()
            if kind == "per_tensor_t":
                step = (t - 1) * len(params) + i + 1
            if kind == "coupled":
                g = g + wd * p
            elif kind == "decay_no_lr":
                p = p * (1 - wd)
            elif kind == "decay_sign":
                p = p * (1 + lr * wd)
            elif kind not in ("no_decay", "decay_after"):
                p = p * (1 - lr * wd)
            if kind == "no_one_minus":
                m[i] = b1 * m[i] + g
                v[i] = b2 * v[i] + g * g
            else:
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * (g.abs() if kind == "abs_v" else g * g)
            if kind == "no_bias":
                m_hat, v_hat = m[i], v[i]
            else:
                m_hat, v_hat = m[i] / (1 - b1 ** step), v[i] / (1 - b2 ** step)
                if kind == "only_m":
                    v_hat = v[i]
                elif kind == "only_v":
                    m_hat = m[i]
            if kind == "eps_inside":
                denom = torch.sqrt(v_hat + eps)
            elif kind == "sqrt_bias":
                denom = v[i].sqrt() / (1 - b2 ** step) + eps
            else:
                denom = v_hat.sqrt() + eps
            p = p - (1.0 if kind == "no_lr" else lr) * m_hat / denom
            new.append(p * (1 - lr * wd) if kind == "decay_after" else p)
        params = new
        out.append([p.clone() for p in params])
    return out


def _bias_steps(params0, grads_seq, lrs, betas, eps, wd, got_steps) -> list | None:
    """The bias-correction steps (t for m, t for v) that explain each call of the learner's,
    when everything else is AdamW's: each call's parameters are one correct step from the
    learner's own previous ones, with the moments right and only the two t's chosen among
    0 .. call + 2. None when some call is not explained so."""
    b1, b2 = betas
    m = [torch.zeros_like(p) for p in params0]
    v = [torch.zeros_like(p) for p in params0]
    previous, found = params0, []
    for n, (grads, lr, now) in enumerate(zip(grads_seq, lrs, got_steps), start=1):
        m = [b1 * a + (1 - b1) * g for a, g in zip(m, grads)]
        v = [b2 * a + (1 - b2) * g * g for a, g in zip(v, grads)]
        candidates = [(n, n)] + [(t1, t2) for t1 in range(n + 3) for t2 in range(n + 3)]
        with torch.no_grad():
            for t1, t2 in candidates:
                want = [p.double() * (1 - lr * wd) - lr * (a.double() / (1 - b1 ** t1)) / (
                    (b.double() / (1 - b2 ** t2)).sqrt() + eps)
                    for p, a, b in zip(previous, m, v)]
                if all(torch.allclose(x.double(), w, atol=1e-6, rtol=1e-5, equal_nan=True)
                       for x, w in zip(now, want)):
                    found.append((n, t1, t2))
                    break
            else:
                return None
        previous = now
    return found


_ADAM_MISTAKES = [("coupled", COUPLED_DECAY), ("no_bias", NO_BIAS_CORRECTION),
                  ("moments", MOMENTS_NOT_KEPT), ("step", STEP_NOT_KEPT),
                  ("eps_inside", EPS_INSIDE), ("decay_no_lr", DECAY_WITHOUT_LR),
                  ("betas_swapped", BETAS_SWAPPED), ("sqrt_bias", SQRT_BIAS),
                  ("moments_t", MOMENTS_NOT_KEPT), ("t_plus_one", BIAS_STEP),
                  ("per_tensor_t", STEP_PER_TENSOR), ("no_decay", NO_DECAY),
                  ("decay_sign", DECAY_SIGN), ("decay_after", DECAY_AFTER),
                  ("no_one_minus", NO_ONE_MINUS), ("abs_v", NOT_SQUARED),
                  ("only_m", PARTIAL_BIAS), ("only_v", PARTIAL_BIAS), ("no_lr", NO_LR)]


@_one_thread
def check_adamw_step(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("adamw_step", f, seed=seed) as c:
        cases = []
        for big_eps in ([False, True] * (2 if thorough else 1)):
            shapes = [(c.randint(2, 6), c.randint(2, 6)), (c.randint(2, 9),)]
            params0 = [c.randn(*s) for s in shapes]
            n_steps = c.randint(3, 6)
            # gradients of very different sizes from step to step (as with clipping off)
            grads_seq = [[c.randn(*s) * float(c.choice([0.01, 0.1, 1.0, 3.0])) for s in shapes]
                         for _n in range(n_steps)]
            lrs = [float(c.choice([1e-2, 3e-2, 5e-3])) for _n in range(n_steps)]
            betas = (c.choice([0.8, 0.85, 0.9]), c.choice([0.95, 0.98, 0.999]))
            eps = c.choice([1e-2, 3e-2]) if big_eps else 1e-8
            wd = c.choice([0.1, 0.2, 0.3])
            cases.append((params0, grads_seq, lrs, betas, eps, wd))
        for params0, grads_seq, lrs, betas, eps, wd in cases:
            want = _adamw_variant(None, params0, grads_seq, lrs, betas, eps, wd)
            variants = _Lazy(lambda kind, args=(params0, grads_seq, lrs, betas, eps, wd):
                             _adamw_variant(kind, *args))
            params = [p.clone().requires_grad_(True) for p in params0]
            state: dict = {}
            got_steps, unchanged = [], []
            for t, (grads, lr) in enumerate(zip(grads_seq, lrs)):
                kwargs = dict(lr=lr, betas=betas, weight_decay=wd)
                if eps != 1e-8:
                    kwargs["eps"] = eps
                before = [p.detach().clone() for p in params]
                with torch.no_grad():
                    result = _call_in_place(c, params, [g.clone() for g in grads], state,
                                            **kwargs)
                now = [p.detach().clone() for p in params]
                got_steps.append(now)
                unchanged.append(_all_close(now, before, 0.0, 0.0))
                del result  # a return value is allowed, and ignored
                if t == 0 and unchanged[0]:
                    break  # nothing changed: no need to run the other steps
            # All the steps run before a difference is told: a mistake that matches a wrong
            # variant at one step may be another's at the next (no decay and coupled decay
            # look alike while the gradients are large).
            for t, lr in enumerate(lrs[:len(got_steps)]):
                now = got_steps[t]
                what = _("the parameters after adamw_step call {n} (lr={lr:g}, betas={betas}, "
                         "eps={eps:g}, weight_decay={wd:g})").format(
                             n=t + 1, lr=lr, betas=betas, eps=eps, wd=wd)
                if not _all_close(now, want[t], 1e-6, 1e-5):
                    if unchanged[t]:
                        hint = NOT_IN_PLACE_ADAM
                    else:
                        hint = next((m for kind, m in _ADAM_MISTAKES if all(
                            _all_close(got_steps[s], variants[kind][s], 1e-6, 1e-5)
                            for s in range(len(got_steps)))), None)
                    steps = None if hint is not None else _bias_steps(
                        params0, grads_seq, lrs, betas, eps, wd, got_steps)
                    used = [f for f in steps or [] if f[1:] != (f[0], f[0])]
                    if used:
                        hint = BIAS_COUNT
                        what += _(" (call {n} used t = {t1} for m and t = {t2} for v)").format(
                            n=used[0][0], t1=used[0][1], t2=used[0][2])
                    bad = next(i for i, (a, b) in enumerate(zip(now, want[t]))
                               if not _close(a, b, 1e-6, 1e-5))
                    diff = (now[bad].double() - want[t][bad].double()).abs()
                    where = int(diff.nan_to_num(float("inf")).argmax())
                    c.fail(_("{what}: tensor {index} differs from torch.optim.AdamW's by up to "
                             "{diff:.3g} (element {element}: {got}, expected {want}; call {n} "
                             "is step t = {n} of the bias correction).").format(
                                 what=what, index=bad, diff=float(diff.max()), element=where,
                                 got=f"{float(now[bad].flatten()[where]):.8g}",
                                 want=f"{float(want[t][bad].flatten()[where]):.8g}", n=t + 1),
                           hint)
            c.note(_("{count} steps with one state").format(count=len(lrs)))
        c.headline(_("equal to torch.optim.AdamW step for step (decoupled decay, bias "
                     "correction, moments kept in state)"))


# --------------------------------------------------------------------------------------------
# train_step and evaluate: a small model and a forward of the check's own


def _cfg(c: Check) -> ModelConfig:
    n_kv, g = c.choice([(1, 2), (2, 2), (2, 1)])
    n_h = n_kv * g
    d = c.choice([4, 6])
    return ModelConfig(vocab_size=c.randint(20, 40), hidden_size=n_h * d, n_heads=n_h,
                       n_kv_heads=n_kv, ffn_hidden_size=2 * n_h * d + c.randint(1, 5),
                       n_layers=c.randint(1, 3), max_seq_len=64)


def _params(c: Check, cfg: ModelConfig) -> dict:
    params = init_model_params(cfg, generator=torch.Generator().manual_seed(c.randint(0, 2**31)))
    with torch.no_grad():  # weights of unit-ish scale: the decay and the steps show clearly
        for t in tr.param_list(params):
            if t.dim() == 2:
                t.mul_(0.5 / (0.02 * math.sqrt(t.shape[0])))
    return params


def _copy(params: dict, grad: bool = True) -> dict:
    out = {"embed": params["embed"].detach().clone(),
           "layers": [{k: v.detach().clone() for k, v in layer.items()}
                      for layer in params["layers"]],
           "final_norm": params["final_norm"].detach().clone(),
           "lm_head": params["lm_head"].detach().clone()}
    return tr.trainable(out) if grad else out


class _Forward:
    """The check's forward: chapter 12's reference with the logits scaled by the call's factor
    (so the gradients' sizes differ from step to step). Records each call's batch and whether
    gradients were tracked."""

    def __init__(self, scales, batches=None):
        self.scales = list(scales)
        self.batches = batches  # when given, each batch's own scale (else the call's)
        self.calls: list[tuple[torch.Tensor, bool]] = []

    def __call__(self, x, params, cfg):
        if self.batches is not None:
            scale = next((s for (bx, _y), s in zip(self.batches, self.scales)
                          if bx.shape == x.shape and torch.equal(bx, x)), 1.0)
        else:
            scale = self.scales[min(len(self.calls), len(self.scales) - 1)]
        self.calls.append((x.detach().clone(), torch.is_grad_enabled()))
        return model_forward(x, params, cfg) * scale

    __name__ = "forward"


def _train_replay(params0, cfg, batches, scales, lrs, *, max_norm, wd, kind=None):
    """(losses, parameter lists after each step) of train_step written with one mistake."""
    params = _copy(params0)
    tensors = tr.param_list(params)
    state: dict = {}
    losses, after = [], []
    kept = None
    for t, ((x, y), scale, lr) in enumerate(zip(batches, scales, lrs)):
        logits = (model_forward(x, params, cfg) if kind == "ignored_forward"
                  else model_forward(x, params, cfg) * scale)
        if kind == "shifted_twice":
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), y[:, 1:].flatten())
        elif kind == "summed":
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        grads = list(torch.autograd.grad(loss, tensors))
        if kind == "not_reset" and kept is not None:
            grads = [g + k for g, k in zip(grads, kept)]
        kept = [g.clone() for g in grads]
        if kind != "no_clip":
            tr.clip_grad_norm(grads, 1.0 if kind == "max_norm_one" else max_norm)
        if kind == "not_reset":
            kept = [g.clone() for g in grads]  # backward accumulates into the clipped .grad
        decay = {"default_decay": 0.1, "no_decay": 0.0}.get(kind, wd)
        with torch.no_grad():
            tr.adamw_step(tensors, grads, {} if kind == "fresh_state" else state, lr=lr,
                          weight_decay=decay)
        if kind == "loss_after":
            with torch.no_grad():
                loss = F.cross_entropy((model_forward(x, params, cfg) * scale).flatten(0, 1),
                                       y.flatten())
        losses.append(float(loss.detach()))
        after.append([p.detach().clone() for p in tensors])
    return losses, after


def _train_replay_of(params0, cfg, batches, scales, lrs, max_norm, wd, kind):
    return _train_replay(params0, cfg, batches, scales, lrs, max_norm=max_norm, wd=wd, kind=kind)


_TRAIN_MISTAKES = [("not_reset", GRADS_NOT_RESET), ("no_clip", NO_CLIP),
                   ("default_decay", IGNORED_DECAY), ("no_decay", IGNORED_DECAY),
                   ("shifted_twice", SHIFTED_TWICE), ("summed", SUMMED_LOSS),
                   ("ignored_forward", IGNORED_FORWARD), ("loss_after", LOSS_AFTER),
                   ("fresh_state", STATE_NOT_PASSED), ("max_norm_one", IGNORED_MAX_NORM)]


@_one_thread
def check_train_step(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("train_step", f, seed=seed, errors=[TRACKED_UPDATE, NOT_FLATTENED]) as c:
        for _case in range(2 if thorough else 1):
            cfg = _cfg(c)
            params0 = _params(c, cfg)
            b, t = c.sizes(2, 3, 9)
            n_steps = 3
            batches = [(c.randint(0, cfg.vocab_size, (b, t)), c.randint(0, cfg.vocab_size, (b, t)))
                       for _n in range(n_steps)]
            local = not is_remote(f)
            # The check's own forward changes the gradients' sizes from step to step; a function
            # graded in a worker runs its own forward (the reference's there), at scale 1.
            scales = [1.0, 3.0, 0.4] if local else [1.0, 1.0, 1.0]
            lrs = [float(c.choice([1e-2, 2e-2])) for _n in range(n_steps)]
            wd = float(c.choice([0.3, 0.5]))
            # max_norm well below the gradients' norm, so that every step is clipped
            probe = _copy(params0)
            loss = F.cross_entropy(model_forward(batches[0][0], probe, cfg).flatten(0, 1),
                                   batches[0][1].flatten())
            norm = float(torch.linalg.vector_norm(torch.cat(
                [g.flatten() for g in torch.autograd.grad(loss, tr.param_list(probe))])))
            max_norm = norm * 0.1
            want_losses, want_params = _train_replay(params0, cfg, batches, scales, lrs,
                                                     max_norm=max_norm, wd=wd)
            variants = _Lazy(functools.partial(_train_replay_of, params0, cfg, batches, scales,
                                               lrs, max_norm, wd))
            params = _copy(params0)
            tensors = tr.param_list(params)
            forward = _Forward(scales, batches)
            state: dict = {}
            got_losses, got_params = [], []
            for step, ((x, y), lr) in enumerate(zip(batches, lrs)):
                before = [p.detach().clone() for p in tensors]
                got = _call_in_place(c, params, cfg, x, y, state, lr=lr, max_norm=max_norm,
                                     weight_decay=wd, **({"forward": forward} if local else {}))
                now = [p.detach().clone() for p in tensors]
                what = _("train_step call {n} (B={b}, T={t}, lr={lr:g}, max_norm={max_norm:.3g}, "
                         "weight_decay={wd:g})").format(n=step + 1, b=b, t=t, lr=lr,
                                                         max_norm=max_norm, wd=wd)
                got_params.append(now)
                if isinstance(got, torch.Tensor) or not isinstance(got, numbers.Real) or \
                        isinstance(got, bool):
                    c.fail(_("{what} returned {got}; expected the loss as a Python float.")
                           .format(what=what, got=describe(got)), NOT_A_FLOAT)
                got_losses.append(float(got))

                far = 2.5 * max(lrs)

                def matching(upto=step, with_params=True):
                    fits = [(kind, m) for kind, m in _TRAIN_MISTAKES if all(
                        math.isclose(got_losses[i], variants[kind][0][i], rel_tol=1e-4)
                        and (not with_params or i == upto or _mostly_close(
                            got_params[i], variants[kind][1][i], 1e-5, 1e-4, far))
                        for i in range(upto + 1)) and (not with_params or _mostly_close(
                            got_params[upto], variants[kind][1][upto], 1e-5, 1e-4, far))]
                    if len(fits) > 1 and with_params:
                        # several wrong steps within tolerance: the closest one
                        fits.sort(key=lambda km: sum(
                            float((a.double() - b.double()).abs().sum()) for a, b in
                            zip(got_params[upto], variants[km[0]][1][upto])))
                    return fits[0][1] if fits else None

                if not math.isclose(got_losses[-1], want_losses[step], rel_tol=1e-4,
                                    abs_tol=1e-6):
                    hint = matching(with_params=False)
                    if hint is None and local and not forward.calls:
                        hint = IGNORED_FORWARD
                    shown_got, shown_want = _digits(got_losses[-1], want_losses[step])
                    c.fail(_("{what} returned the loss {got}, expected {want}.").format(
                        what=what, got=shown_got, want=shown_want), hint)
                if not _mostly_close(now, want_params[step], 1e-5, 1e-4, far):
                    hint = TRAIN_NOT_IN_PLACE if _all_close(now, before, 0.0, 0.0) else matching()
                    diffs = [float((a.double() - b.double()).abs().nan_to_num(float("inf"))
                                   .max()) if a.shape == b.shape else float("inf")
                             for a, b in zip(now, want_params[step])]
                    worst = max(range(len(diffs)), key=diffs.__getitem__) if diffs else 0
                    c.fail(_("{what}: the parameters after the step differ from one step of "
                             "AdamW on the clipped gradients of the batch's mean loss (most in "
                             "tensor {index} of the layout, by up to {diff:.3g}).").format(
                                 what=what, index=worst,
                                 diff=diffs[worst] if diffs else float("nan")), hint)
            c.note(_("{count} steps: the loss before each update, the parameters after it")
                   .format(count=n_steps))
            if local and _case == 0:
                # max_norm far above the gradients' norms (about 3 and 9): nothing is clipped,
                # and a clip to norm 1 (max_norm ignored) changes the second step's update.
                k = max(1.0, 3.0 / max(norm, 1e-6))
                big = [k, 3.0 * k]
                two, max_norm = batches[:2], 1e3
                want_losses, want_params = _train_replay(params0, cfg, two, big, lrs, wd=wd,
                                                         max_norm=max_norm)
                params = _copy(params0)
                tensors, forward, state = tr.param_list(params), _Forward(big, two), {}
                for step, (x, y) in enumerate(two):
                    _call_in_place(c, params, cfg, x, y, state, lr=lrs[step], max_norm=max_norm,
                                   weight_decay=wd, forward=forward)
                now = [p.detach().clone() for p in tensors]
                if not _mostly_close(now, want_params[1], 1e-5, 1e-4, 2.5 * max(lrs)):
                    one = _train_replay(params0, cfg, two, big, lrs, wd=wd, max_norm=max_norm,
                                        kind="max_norm_one")[1][1]
                    c.fail(_("train_step with max_norm={max_norm:g}, above the gradients' norms "
                             "(nothing to clip): the parameters after the second step differ "
                             "from AdamW's on the unclipped gradients.").format(
                                 max_norm=max_norm),
                           IGNORED_MAX_NORM if _mostly_close(now, one, 1e-5, 1e-4,
                                                             2.5 * max(lrs)) else None)
        c.headline(_("mean loss, gradients, clipping, AdamW in place, gradients cleared"))


@_one_thread
def check_evaluate(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("evaluate", f, seed=seed, in_place=EVAL_CHANGED) as c:
        for _case in range(2 if thorough else 1):
            cfg = _cfg(c)
            params = _copy(_params(c, cfg))
            n = c.randint(60, 120)
            data = c.randint(0, cfg.vocab_size, (n,))
            b, t = c.sizes(2, 3, 9)
            n_batches = c.randint(3, 6)
            gseed = c.randint(0, 2**31)
            local = not is_remote(f)
            scales = [1.0 + 0.5 * i if local else 1.0 for i in range(n_batches + 4)]
            want_forward = _Forward(scales)
            want = tr.evaluate(params, cfg, data, batch_size=b, context_len=t,
                               n_batches=n_batches, generator=torch.Generator().manual_seed(gseed),
                               forward=want_forward)
            forward = _Forward(scales)
            what = _("evaluate(data [{n}], batch_size={b}, context_len={t}, n_batches={k})")\
                .format(n=n, b=b, t=t, k=n_batches)
            got = c.call(params, cfg, data, batch_size=b, context_len=t, n_batches=n_batches,
                         generator=torch.Generator().manual_seed(gseed),
                         **({"forward": forward} if local else {}))
            # The in-place guard compares values; the flags are the parameters' too.
            off = [i for i, p in enumerate(tr.param_list(params)) if not p.requires_grad]
            if local and off:
                c.fail(_("{what}: after the call, {count} of the {total} parameter tensors no "
                         "longer require gradients.").format(
                             what=what, count=len(off), total=len(tr.param_list(params))),
                       FLAGS_OFF)
            if local and not forward.calls:
                c.fail(_("{what} never called the forward it was given.").format(what=what),
                       IGNORED_FORWARD)
            if local and any(grad for _x, grad in forward.calls):
                c.fail(_("{what} ran its forward passes with gradients tracked.").format(
                    what=what), GRADIENTS_TRACKED)
            if local and len(forward.calls) != n_batches:
                c.fail(_("{what} ran {got} forward passes, expected {want}.").format(
                    what=what, got=len(forward.calls), want=n_batches), BATCH_COUNT)
            if local and n_batches > 1 and all(torch.equal(forward.calls[0][0], x)
                                               for x, _g in forward.calls):
                c.fail(_("{what} evaluated one batch {count} times.").format(
                    what=what, count=n_batches), SAME_BATCH)
            if local and b != t and forward.calls and all(
                    tuple(x.shape) == (t, b) for x, _g in forward.calls):
                c.fail(_("{what}: the batches are {got}, expected [{b}, {t}].").format(
                    what=what, got=list(forward.calls[0][0].shape), b=b, t=t), ARGS_SWAPPED)
            if local and not all(torch.equal(a[0], w[0]) for a, w in zip(forward.calls,
                                                                       want_forward.calls)):
                # The same generator state again: other batches, the generator was not used;
                # the same ones, they were not get_batch's draws.
                again = _Forward(scales)
                c.call(params, cfg, data, batch_size=b, context_len=t, n_batches=n_batches,
                       generator=torch.Generator().manual_seed(gseed), forward=again)
                same = len(again.calls) == len(forward.calls) and all(
                    torch.equal(a[0], w[0]) for a, w in zip(again.calls, forward.calls))
                c.fail(_("{what}: the batches are not get_batch's draws from the generator "
                         "given.").format(what=what), NOT_GET_BATCH if same else
                       IGNORED_GENERATOR)

            def replay(kind):
                total = 0.0
                g = torch.Generator().manual_seed(gseed)
                with torch.no_grad():
                    for i in range(n_batches):
                        x, y = tr.get_batch(data, b, t, generator=g)
                        logits = model_forward(x, params, cfg) * scales[i]
                        if kind == "shifted":
                            total += float(F.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                           y[:, 1:].flatten()))
                        else:
                            total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten()))
                return total

            _expect_float(c, got, want, what, rel=1e-5, wrong=[
                (SUMMED_BATCHES, want * n_batches), (SUMMED_TOKENS, want * b * t),
                (SHIFTED_TWICE, lambda: replay("shifted") / n_batches)])
        if not is_remote(f):     # meta tensors do not travel to a grader's worker
            _device_case(c, f)
        c.headline(_("the mean loss of n_batches batches, without gradients, on the model's "
                     "device"))


_META_VALUE = "cannot be called on meta tensors"


def _device_case(c: Check, f) -> None:
    """The model on another device than the data, as in the chapter's run on a GPU: PyTorch's
    meta device stands in (tensors with shapes and a device, no values). Every batch must reach
    the forward, and the loss, on the parameters' device; reading the loss's value is where a
    meta evaluation ends, so that error is the expected end of the call."""
    cfg = _cfg(c)
    params = {"embed": torch.empty(cfg.vocab_size, cfg.hidden_size, device="meta"),
              "layers": [], "final_norm": torch.empty(cfg.hidden_size, device="meta"),
              "lm_head": torch.empty(cfg.hidden_size, cfg.vocab_size, device="meta")}
    data = c.randint(0, cfg.vocab_size, (c.randint(30, 60),))
    seen: list[torch.device] = []

    def forward(x, params, cfg):
        seen.append(x.device)
        return torch.zeros(*x.shape, cfg.vocab_size, device=x.device)

    what = _("evaluate with the parameters on another device than the data (PyTorch's meta "
             "device standing in for a GPU)")
    try:
        f(params, cfg, data, batch_size=2, context_len=c.randint(3, 7), n_batches=2,
          generator=torch.Generator().manual_seed(c.randint(0, 2**31)), forward=forward)
    except RuntimeError as exc:
        if BATCH_DEVICE.recognises("RuntimeError", str(exc)):
            c.fail(_("{what}: the loss mixed devices ({error}).").format(
                what=what, error=str(exc).splitlines()[0][:120]), BATCH_DEVICE)
        if _META_VALUE not in str(exc):
            return          # another way of reading the loss; this case cannot tell
    except Exception:  # noqa: BLE001 - the values cases above told the learner's own errors
        return
    if any(device != torch.device("meta") for device in seen):
        c.fail(_("{what}: the forward got its batch on {got}, the parameters are on {want}.")
               .format(what=what, got=next(d for d in seen if d.type != "meta"), want="meta"),
               BATCH_DEVICE)
    c.note(_("batches moved to the parameters' device"))


# --------------------------------------------------------------------------------------------
# bits_per_byte


@_one_thread
def check_bits_per_byte(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("bits_per_byte", f, seed=seed) as c:
        cases = []
        for _n in range(4 if thorough else 2):
            n_tokens = c.randint(100, 10_000)
            cases.append((0.5 + 4 * float(torch.rand((), generator=c.gen)), n_tokens,
                          n_tokens * c.randint(2, 5) + c.randint(1, 50)))
        cases.append((1.5 + float(torch.rand((), generator=c.gen)), 4096, 4096))  # bytes
        cases.append((math.log(256), 1000, 1000))   # uniform over 256 bytes: 8 bits
        for loss, n_tokens, n_bytes in cases:
            got = c.call(loss, n_tokens, n_bytes)
            want = loss * n_tokens / (n_bytes * math.log(2))
            nats = loss * n_tokens / n_bytes
            _expect_float(c, got, want, f"bits_per_byte({loss:.4g}, n_tokens={n_tokens}, "
                          f"n_bytes={n_bytes})", rel=1e-9, wrong=[
                              (FORGOT_LN2, nats), (TIMES_LN2, nats * math.log(2)),
                              (PER_TOKEN, loss / math.log(2)),
                              (INVERTED_RATIO, loss * n_bytes / (n_tokens * math.log(2))),
                              (LOG10, nats / math.log(10))])
        c.headline(_("nats per token as bits per byte (8 bits for a uniform byte)"))


__all__ = ["check_adamw_step", "check_bits_per_byte", "check_clip_grad_norm",
           "check_evaluate", "check_get_batch", "check_lr_at", "check_train_step"]


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "14.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "get_batch": (
        IGNORED_GENERATOR, SAME_WINDOW, OTHER_STARTS, NOT_SHIFTED, SHIFTED_BACK, PAST_END,
        X_Y_SWAPPED, FIXED_GENERATOR, GENERATOR_NOT_USED, LAST_START, WITHOUT_REPLACEMENT,
        WRONG_LENGTH, TRANSPOSED, SIZES_SWAPPED),
    "lr_at": (
        COSINE_TO_ZERO, COSINE_FROM_ZERO, COSINE_PAST_TOTAL, LINEAR_DECAY, NOT_A_FLOAT,
        WARMUP_OFF_BY_ONE, WARMUP_DIVISOR, SHIFTED_SCHEDULE, WRONG_SPAN, COSINE_OFF_BY_ONE,
        INTEGER_DIVISION, FULL_PERIOD, AMPLITUDE, WARMUP_FROM_MIN, AFTER_TOTAL),
    "clip_grad_norm": (
        SQUARED_NORM, NORM_AFTER, NOT_IN_PLACE_CLIP, PER_TENSOR, NOT_A_FLOAT, SCALED_UP,
        TORCH_CLIP, CLAMPED, RMS_NORM, NORM_OF_SUMS, SUMMED_NORMS, L1_NORM, ONE_TENSOR,
        INVERTED_SCALE),
    "adamw_step": (
        BETAS_SWAPPED, COUPLED_DECAY, DECAY_WITHOUT_LR, EPS_INSIDE, MOMENTS_NOT_KEPT,
        NO_BIAS_CORRECTION, NOT_IN_PLACE_ADAM, SQRT_BIAS, STEP_NOT_KEPT, BIAS_STEP,
        STEP_PER_TENSOR, NO_DECAY, DECAY_SIGN, DECAY_AFTER, NO_ONE_MINUS, NOT_SQUARED,
        PARTIAL_BIAS, NO_LR, BIAS_COUNT),
    "train_step": (
        GRADS_NOT_RESET, IGNORED_FORWARD, IGNORED_DECAY, LOSS_AFTER, NO_CLIP, TRAIN_NOT_IN_PLACE,
        NOT_A_FLOAT, SUMMED_LOSS, SHIFTED_TWICE, TRACKED_UPDATE, STATE_NOT_PASSED, IGNORED_MAX_NORM,
        NOT_FLATTENED,
        # told by borrowing (checks.borrow), not by this check: an earlier chapter's function
        # that the training step would run through, and gradients do not flow through it
        *gradients.BORROWED),
    "evaluate": (
        EVAL_CHANGED, GRADIENTS_TRACKED, IGNORED_FORWARD, IGNORED_GENERATOR, NOT_A_FLOAT,
        SAME_BATCH, SUMMED_BATCHES, SHIFTED_TWICE, BATCH_COUNT, FLAGS_OFF, ARGS_SWAPPED,
        NOT_GET_BATCH, SUMMED_TOKENS, BATCH_DEVICE),
    "bits_per_byte": (
        FORGOT_LN2, INVERTED_RATIO, LOG10, TIMES_LN2, PER_TOKEN, NOT_A_FLOAT),
}
