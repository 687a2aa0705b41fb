"""Chapter 14 checkers: correct implementations (the reference and the way a learner writes them)
pass at every seed; each plausible mistake is named by its id at every seed
(tests/checkers/test_contract.py runs the catalogue below)."""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from checks import nb14
from checks.reference import training as tr
from checks.reference.model import model_forward, next_token_loss

from ..support.catalogue import Wrong, exercises


# --------------------------------------------------------------------------------------------
# get_batch

def batch_solution(data, batch_size, context_len, *, generator=None):
    starts = torch.randint(0, len(data) - context_len, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + context_len] for i in starts])
    y = torch.stack([data[i + 1:i + context_len + 1] for i in starts])
    return x, y


def _batch(kind):
    def get_batch(data, batch_size, context_len, *, generator=None):
        high = {"past_end": len(data) - context_len + 1, "way_past": len(data)}.get(
            kind, len(data) - context_len)
        if kind == "same_window":
            i = int(torch.randint(0, high, (1,), generator=generator))
            starts = torch.full((batch_size,), i)
        elif kind == "ignored_generator":
            starts = torch.randint(0, high, (batch_size,))
        elif kind == "one_at_a_time_reversed":
            starts = torch.randint(0, high, (batch_size,), generator=generator).flip(0)
        else:
            starts = torch.randint(0, high, (batch_size,), generator=generator)
        x = torch.stack([data[i:i + context_len] for i in starts])
        if kind == "not_shifted":
            y = x.clone()
        elif kind == "shifted_back":
            y = torch.stack([data[max(i - 1, 0):max(i - 1, 0) + context_len] for i in starts])
        else:
            y = torch.stack([data[i + 1:i + context_len + 1] for i in starts])
        return (y, x) if kind == "swapped" else (x, y)
    return get_batch


GET_BATCH_WRONG = [
    Wrong("targets not shifted", _batch("not_shifted"), "14.get_batch.targets_not_shifted"),
    Wrong("targets shifted back", _batch("shifted_back"), "14.get_batch.targets_shifted_back"),
    Wrong("x and y swapped", _batch("swapped"), "14.get_batch.x_and_y_swapped"),
    Wrong("same window every row", _batch("same_window"), "14.get_batch.same_window_every_row"),
    Wrong("windows one past the end", _batch("past_end"), "14.get_batch.windows_past_the_end"),
    Wrong("windows anywhere", _batch("way_past"), "14.get_batch.windows_past_the_end"),
    Wrong("global generator", _batch("ignored_generator"), "14.get_batch.ignored_generator"),
    Wrong("starts reversed", _batch("one_at_a_time_reversed"),
          "14.get_batch.starts_not_as_specified"),
]


# --------------------------------------------------------------------------------------------
# lr_at

def lr_solution(step, *, max_lr, min_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    ratio = (step - warmup_steps) / (total_steps - warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (max_lr - min_lr)


def _lr(kind):
    def lr_at(step, *, max_lr, min_lr, warmup_steps, total_steps):
        w, total = warmup_steps, total_steps
        if kind == "warmup_from_zero" and step < w:
            return max_lr * step / w
        if kind == "warmup_le" and step <= w:
            return max_lr * (step + 1) / w
        if step < w:
            return max_lr * (step + 1) / w
        lo = 0.0 if kind == "to_zero" else min_lr
        if step >= total and kind != "past_total":
            return lo
        start, span = (0, total) if kind == "from_zero" else (w, total - w)
        p = (step - start) / span
        if kind == "linear":
            return max_lr - (max_lr - min_lr) * p
        if kind == "tensor":
            return torch.tensor(lo + 0.5 * (max_lr - lo) * (1 + math.cos(math.pi * p)))
        return lo + 0.5 * (max_lr - lo) * (1 + math.cos(math.pi * p))
    return lr_at


LR_WRONG = [
    Wrong("warmup from zero", _lr("warmup_from_zero"), "14.lr_at.warmup_off_by_one"),
    Wrong("warmup one step long", _lr("warmup_le"), "14.lr_at.warmup_off_by_one"),
    Wrong("cosine to zero", _lr("to_zero"), "14.lr_at.cosine_ends_at_zero"),
    Wrong("cosine past total", _lr("past_total"), "14.lr_at.cosine_past_total_steps"),
    Wrong("cosine from step 0", _lr("from_zero"), "14.lr_at.cosine_ignores_warmup"),
    Wrong("linear decay", _lr("linear"), "14.lr_at.linear_decay"),
    Wrong("returns a tensor", _lr("tensor"), "14.lr_at.returned_tensor"),
]


# --------------------------------------------------------------------------------------------
# clip_grad_norm

def clip_solution(grads, max_norm):
    total = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    if total > max_norm:
        for g in grads:
            g.mul_(max_norm / (total + 1e-6))
    return total


def _clip(kind):
    def clip_grad_norm(grads, max_norm):
        total = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
        if kind == "per_tensor":
            for g in grads:
                n = float(g.norm())
                if n > max_norm:
                    g.mul_(max_norm / (n + 1e-6))
            return total
        if kind == "not_in_place":
            if total > max_norm:
                grads = [g * (max_norm / (total + 1e-6)) for g in grads]
            return total
        if kind == "always" or total > max_norm:
            for g in grads:
                g.mul_(max_norm / (total + 1e-6))
        if kind == "after":
            return math.sqrt(sum(float((g ** 2).sum()) for g in grads))
        if kind == "squared":
            return total ** 2
        if kind == "tensor":
            return torch.tensor(total)
        return total
    return clip_grad_norm


CLIP_WRONG = [
    Wrong("norm after clipping", _clip("after"), "14.clip_grad_norm.norm_after_clipping"),
    Wrong("per-tensor clip", _clip("per_tensor"), "14.clip_grad_norm.per_tensor_clip"),
    Wrong("not in place", _clip("not_in_place"), "14.clip_grad_norm.not_in_place"),
    Wrong("always scales", _clip("always"), "14.clip_grad_norm.scaled_up_small_gradients"),
    Wrong("sum of squares", _clip("squared"), "14.clip_grad_norm.forgot_square_root"),
    Wrong("returns a tensor", _clip("tensor"), "14.clip_grad_norm.returned_tensor"),
]


# --------------------------------------------------------------------------------------------
# adamw_step

def adamw_solution(params, grads, state, *, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
    beta1, beta2 = betas
    if not state:
        state["t"] = 0
        state["m"] = [torch.zeros_like(p) for p in params]
        state["v"] = [torch.zeros_like(p) for p in params]
    state["t"] += 1
    t = state["t"]
    for p, g, m, v in zip(params, grads, state["m"], state["v"]):
        p -= lr * weight_decay * p
        m.mul_(beta1).add_((1 - beta1) * g)
        v.mul_(beta2).add_((1 - beta2) * g * g)
        m_hat = m / (1 - beta1 ** t)
        v_hat = v / (1 - beta2 ** t)
        p -= lr * m_hat / (v_hat.sqrt() + eps)


def _adamw(kind):
    def adamw_step(params, grads, state, *, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        beta1, beta2 = (betas[1], betas[0]) if kind == "swapped" else betas
        if not state or kind == "moments":
            state["t"] = state.get("t", 0) if kind == "moments" else 0
            state["m"] = [torch.zeros_like(p) for p in params]
            state["v"] = [torch.zeros_like(p) for p in params]
        if kind != "step":
            state["t"] += 1
        t = 1 if kind in ("step", "moments") else state["t"]
        for i, (p, g) in enumerate(zip(params, grads)):
            m, v = state["m"][i], state["v"][i]
            if kind == "coupled":
                g = g + weight_decay * p
            elif kind == "decay_no_lr":
                p.mul_(1 - weight_decay)
            else:
                p.mul_(1 - lr * weight_decay)
            m.mul_(beta1).add_((1 - beta1) * g)
            v.mul_(beta2).add_((1 - beta2) * g * g)
            if kind == "no_bias":
                m_hat, v_hat = m, v
            else:
                m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
            if kind == "eps_inside":
                denom = (v_hat + eps).sqrt()
            elif kind == "sqrt_bias":
                denom = v.sqrt() / (1 - beta2 ** t) + eps
            else:
                denom = v_hat.sqrt() + eps
            if kind == "not_in_place":
                p = p - lr * m_hat / denom
            else:
                p.sub_(lr * m_hat / denom)
    return adamw_step


def _no_decay_on_not_in_place(params, grads, state, **kw):
    """Rebinds every parameter: nothing changes for the caller."""
    new = [p.clone() for p in params]
    adamw_solution(new, grads, state, **kw)


ADAMW_WRONG = [
    Wrong("coupled L2 decay", _adamw("coupled"), "14.adamw_step.coupled_l2_decay"),
    Wrong("no bias correction", _adamw("no_bias"), "14.adamw_step.no_bias_correction"),
    Wrong("moments not kept", _adamw("moments"), "14.adamw_step.moments_not_kept"),
    Wrong("step count not kept", _adamw("step"), "14.adamw_step.step_count_not_kept"),
    Wrong("eps inside the sqrt", _adamw("eps_inside"), "14.adamw_step.eps_inside_sqrt"),
    Wrong("decay without lr", _adamw("decay_no_lr"), "14.adamw_step.decay_not_scaled_by_lr"),
    Wrong("betas swapped", _adamw("swapped"), "14.adamw_step.betas_swapped"),
    Wrong("sqrt of the bias correction", _adamw("sqrt_bias"),
          "14.adamw_step.second_bias_correction_without_sqrt"),
    Wrong("new tensors", _no_decay_on_not_in_place, "14.adamw_step.not_in_place"),
]


# --------------------------------------------------------------------------------------------
# train_step

def _all_params(params):
    out = [params["embed"]]
    for layer in params["layers"]:
        out += [layer[k] for k in ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate", "w_up",
                                   "w_down")]
    return out + [params["final_norm"], params["lm_head"]]


def train_solution(params, cfg, x, y, state, *, lr, max_norm=1.0, weight_decay=0.1,
                   forward=None):
    forward = forward or model_forward
    logits = forward(x, params, cfg)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    tensors = _all_params(params)
    grads = [p.grad for p in tensors]
    with torch.no_grad():
        clip_solution(grads, max_norm)
        adamw_solution(tensors, grads, state, lr=lr, weight_decay=weight_decay)
    for p in tensors:
        p.grad = None
    return loss.item()


def _train(kind):
    def train_step(params, cfg, x, y, state, *, lr, max_norm=1.0, weight_decay=0.1,
                   forward=None):
        if kind == "ignored_forward" or forward is None:
            forward = model_forward
        logits = forward(x, params, cfg)
        if kind == "shifted_twice":
            loss = next_token_loss(logits, y)
        elif kind == "summed":
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   reduction="sum")
        else:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        tensors = _all_params(params)
        grads = [p.grad for p in tensors]
        wd = {"default_decay": 0.1, "no_decay": 0.0}.get(kind, weight_decay)
        if kind == "tracked":
            clip_solution(grads, max_norm)
            adamw_solution(tensors, grads, state, lr=lr, weight_decay=wd)
        else:
            with torch.no_grad():
                if kind != "no_clip":
                    clip_solution(grads, max_norm)
                if kind == "not_in_place":
                    _no_decay_on_not_in_place(tensors, grads, state, lr=lr, weight_decay=wd)
                else:
                    adamw_solution(tensors, grads, state, lr=lr, weight_decay=wd)
        if kind != "not_reset":
            for p in tensors:
                p.grad = None
        if kind == "tensor":
            return loss.detach()
        if kind == "loss_after":
            with torch.no_grad():
                logits = forward(x, params, cfg)
                return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       y.reshape(-1)).item()
        return loss.item()
    return train_step


TRAIN_WRONG = [
    Wrong("gradients not reset", _train("not_reset"), "14.train_step.gradients_not_reset"),
    Wrong("no clipping", _train("no_clip"), "14.train_step.no_clipping"),
    Wrong("default weight decay", _train("default_decay"), "14.train_step.ignored_weight_decay"),
    Wrong("no weight decay", _train("no_decay"), "14.train_step.ignored_weight_decay"),
    Wrong("targets shifted twice", _train("shifted_twice"),
          "14.train_step.targets_shifted_twice"),
    Wrong("summed loss", _train("summed"), "14.train_step.summed_loss"),
    Wrong("ignored forward", _train("ignored_forward"), "14.train_step.ignored_forward"),
    Wrong("loss after the update", _train("loss_after"), "14.train_step.loss_after_update"),
    Wrong("update tracked", _train("tracked"), "14.train_step.update_tracked_by_autograd"),
    Wrong("returns a tensor", _train("tensor"), "14.train_step.returned_tensor"),
    Wrong("parameters unchanged", _train("not_in_place"), "14.train_step.parameters_unchanged"),
]


# --------------------------------------------------------------------------------------------
# evaluate

def evaluate_solution(params, cfg, data, *, batch_size, context_len, n_batches, generator=None,
                      forward=None, move=True):
    forward = forward or model_forward
    device = params["embed"].device
    losses = []
    with torch.no_grad():
        for _n in range(n_batches):
            x, y = batch_solution(data, batch_size, context_len, generator=generator)
            if move:
                x, y = x.to(device), y.to(device)
            logits = forward(x, params, cfg)
            losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


def evaluate_on_the_data_device(params, cfg, data, **kwargs):
    """Right on a CPU, and what the chapter's run on a GPU stops at."""
    return evaluate_solution(params, cfg, data, move=False, **kwargs)


def evaluate_moves_only_x(params, cfg, data, *, batch_size, context_len, n_batches,
                          generator=None, forward=None):
    forward = forward or model_forward
    total = 0.0
    with torch.no_grad():
        for _n in range(n_batches):
            x, y = batch_solution(data, batch_size, context_len, generator=generator)
            logits = forward(x.to(params["embed"].device), params, cfg)
            total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten()))
    return total / n_batches


def _evaluate(kind):
    def evaluate(params, cfg, data, *, batch_size, context_len, n_batches, generator=None,
                 forward=None):
        if kind != "ignored_forward":
            forward = forward or model_forward
        else:
            forward = model_forward
        total = 0.0
        count = n_batches - 1 if kind == "one_short" else n_batches
        context = torch.enable_grad() if kind == "grad" else torch.no_grad()
        x, y = batch_solution(data, batch_size, context_len, generator=generator)
        with context:
            for i in range(count):
                if kind != "same_batch" and i > 0:
                    x, y = batch_solution(data, batch_size, context_len,
                                          generator=None if kind == "global" else generator)
                logits = forward(x, params, cfg)
                if kind == "shifted":
                    total += next_token_loss(logits, y).item()
                else:
                    total += F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
        if kind == "train":
            with torch.no_grad():
                params["final_norm"].mul_(1.01)
        if kind == "tensor":
            return torch.tensor(total / count)
        return total if kind == "summed" else total / count
    return evaluate


EVALUATE_WRONG = [
    Wrong("gradients tracked", _evaluate("grad"), "14.evaluate.gradients_tracked"),
    Wrong("same batch", _evaluate("same_batch"), "14.evaluate.same_batch_repeated"),
    Wrong("one batch short", _evaluate("one_short"), "14.evaluate.wrong_number_of_batches"),
    Wrong("global generator", _evaluate("global"), "14.evaluate.ignored_generator"),
    Wrong("summed", _evaluate("summed"), "14.evaluate.summed_not_averaged"),
    Wrong("targets shifted twice", _evaluate("shifted"), "14.evaluate.targets_shifted_twice"),
    Wrong("ignored forward", _evaluate("ignored_forward"), "14.evaluate.ignored_forward"),
    Wrong("changes the parameters", _evaluate("train"), "14.evaluate.changed_parameters"),
    Wrong("returns a tensor", _evaluate("tensor"), "14.evaluate.returned_tensor"),
    Wrong("batches left on the data's device", evaluate_on_the_data_device,
          "14.evaluate.batches_not_on_the_model_device"),
    Wrong("only x moved to the model's device", evaluate_moves_only_x,
          "14.evaluate.batches_not_on_the_model_device"),
]


# --------------------------------------------------------------------------------------------
# bits_per_byte

def bpb_solution(loss, n_tokens, n_bytes):
    return loss / math.log(2) * n_tokens / n_bytes


BPB_WRONG = [
    Wrong("nats", lambda loss, n, b: loss * n / b, "14.bits_per_byte.forgot_ln2"),
    Wrong("times ln 2", lambda loss, n, b: loss * n / b * math.log(2),
          "14.bits_per_byte.multiplied_by_ln2"),
    Wrong("per token", lambda loss, n, b: loss / math.log(2),
          "14.bits_per_byte.per_token_not_per_byte"),
    Wrong("inverted", lambda loss, n, b: loss * b / n / math.log(2),
          "14.bits_per_byte.inverted_ratio"),
    Wrong("log10", lambda loss, n, b: loss * n / b / math.log(10), "14.bits_per_byte.log10"),
    Wrong("tensor", lambda loss, n, b: torch.tensor(loss * n / b / math.log(2)),
          "14.bits_per_byte.returned_tensor"),
]


# --------------------------------------------------------------------------------------------
# Fresh wrong implementations (issue 33), written as a learner who has not read the solution
# would: each named by its id at every seed, and a few unusual correct ones.

# Fresh wrong implementations, as learners write them: get_batch
def gb_fresh_generator(data, batch_size, context_len, *, generator=None):
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    return batch_solution(data, batch_size, context_len, generator=generator)

def gb_python_random(data, batch_size, context_len, *, generator=None):
    starts = [random.randint(0, len(data) - context_len - 1) for _ in range(batch_size)]
    x = torch.stack([data[i:i + context_len] for i in starts])
    y = torch.stack([data[i + 1:i + context_len + 1] for i in starts])
    return x, y

def gb_bound_one_short(data, batch_size, context_len, *, generator=None):
    starts = torch.randint(0, len(data) - context_len - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + context_len] for i in starts])
    y = torch.stack([data[i + 1:i + context_len + 1] for i in starts])
    return x, y

def gb_randperm(data, batch_size, context_len, *, generator=None):
    starts = torch.randperm(len(data) - context_len, generator=generator)[:batch_size]
    x = torch.stack([data[i:i + context_len] for i in starts])
    y = torch.stack([data[i + 1:i + context_len + 1] for i in starts])
    return x, y

def gb_y_one_short(data, batch_size, context_len, *, generator=None):
    starts = torch.randint(0, len(data) - context_len, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + context_len] for i in starts])
    y = torch.stack([data[i + 1:i + context_len] for i in starts])
    return x, y

def gb_transposed(data, batch_size, context_len, *, generator=None):
    starts = torch.randint(0, len(data) - context_len, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + context_len] for i in starts], dim=1)
    y = torch.stack([data[i + 1:i + context_len + 1] for i in starts], dim=1)
    return x, y

def gb_sizes_swapped(data, batch_size, context_len, *, generator=None):
    starts = torch.randint(0, len(data) - batch_size, (context_len,), generator=generator)
    x = torch.stack([data[i:i + batch_size] for i in starts])
    y = torch.stack([data[i + 1:i + batch_size + 1] for i in starts])
    return x, y

def gb_loop_draws(data, batch_size, context_len, *, generator=None):
    xs, ys = [], []
    for _ in range(batch_size):
        i = int(torch.randint(0, len(data) - context_len, (1,), generator=generator))
        xs.append(data[i:i + context_len])
        ys.append(data[i + 1:i + context_len + 1])
    return torch.stack(xs), torch.stack(ys)

def gb_seeded_inside(data, batch_size, context_len, *, generator=None):
    g = torch.Generator().manual_seed(1337)
    return batch_solution(data, batch_size, context_len, generator=g)

# Fresh wrong implementations, as learners write them: lr_at
def _lr_kind(kind):
    def lr_at(step, *, max_lr, min_lr, warmup_steps, total_steps):
        w, total = warmup_steps, total_steps
        if kind == "from_one":
            step = step + 1
        if kind == "from_minus_one":
            step = step - 1
        if step < w:
            if kind == "w_minus_1":
                return max_lr * step / (w - 1)
            if kind == "w_plus_1":
                return max_lr * (step + 1) / (w + 1)
            if kind == "from_min":
                return min_lr + (max_lr - min_lr) * (step + 1) / w
            return max_lr * (step + 1) / w
        if step >= total:
            return 0.0 if kind == "zero_after" else (max_lr if kind == "max_after" else min_lr)
        span = {"span_total": total, "span_plus_1": total - w + 1,
                "span_minus_1": total - w - 1}.get(kind, total - w)
        p = (step - w) / span
        if kind == "int_div":
            p = (step - w) // (total - w)
        if kind == "cos_late":
            p = (step - w + 1) / (total - w)
        if kind == "full_cos":
            return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(2 * math.pi * p))
        if kind == "min_on_top":
            return min_lr + 0.5 * max_lr * (1 + math.cos(math.pi * p))
        if kind == "min_ignored":
            return 0.5 * max_lr * (1 + math.cos(math.pi * p))
        if kind == "no_half":
            return min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * p))
        return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * p))
    return lr_at

# Fresh wrong implementations, as learners write them: clip
def _clip_kind(kind):
    def clip_grad_norm(grads, max_norm):
        if kind == "torch":
            return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
        if kind == "clamp":
            total = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
            for g in grads:
                g.clamp_(-max_norm, max_norm)
            return total
        if kind == "rms":
            n = sum(g.numel() for g in grads)
            total = math.sqrt(sum(float((g ** 2).sum()) for g in grads) / n)
        elif kind == "square_of_sums":
            total = math.sqrt(sum(float(g.sum()) ** 2 for g in grads))
        elif kind == "sum_of_norms":
            total = sum(float(g.norm()) for g in grads)
        elif kind == "l1":
            total = sum(float(g.abs().sum()) for g in grads)
        elif kind == "first_only":
            total = float(grads[0].norm())
        else:
            total = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
        if total > max_norm:
            scale = total / max_norm if kind == "inverted" else max_norm / (total + 1e-6)
            for g in grads:
                g.mul_(scale)
        return total
    return clip_grad_norm

# Fresh wrong implementations, as learners write them: adamw
def _adam_kind(kind):
    def adamw_step(params, grads, state, *, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        b1, b2 = betas
        if kind == "local_moments":   # the commonest: moments in the loop, never stored
            state["t"] = state.get("t", 0) + 1
            t = state["t"]
            for p, g in zip(params, grads):
                m = torch.zeros_like(p)
                v = torch.zeros_like(p)
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                p.mul_(1 - lr * weight_decay)
                p.sub_(lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps))
            return
        if kind == "rebound":          # m = b1 * m + ...: the list in state never changes
            if not state:
                state["t"] = 0
                state["m"] = [torch.zeros_like(p) for p in params]
                state["v"] = [torch.zeros_like(p) for p in params]
            state["t"] += 1
            t = state["t"]
            for i, (p, g) in enumerate(zip(params, grads)):
                m, v = state["m"][i], state["v"][i]
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                p.mul_(1 - lr * weight_decay)
                p.sub_(lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps))
            return
        if kind == "fresh_torch":
            opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps,
                                    weight_decay=weight_decay)
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
            for p in params:
                p.grad = None
            return
        if not state:
            state["t"] = 1 if kind == "t_from_one" else 0
            state["m"] = [torch.zeros_like(p) for p in params]
            state["v"] = [torch.zeros_like(p) for p in params]
        if kind == "t_after":
            t = state["t"] + 1 + 1
            state["t"] += 1
        elif kind == "t_before_increment":      # t = 0 on the first call: 1 - beta**0 = 0
            t = state["t"]
            state["t"] += 1
        elif kind in ("m_from_t_plus_one", "v_from_t_plus_one"):
            state["t"] += 1
            t = state["t"]
        elif kind != "per_tensor_t":
            state["t"] += 1
            t = state["t"]
        for i, (p, g) in enumerate(zip(params, grads)):
            if kind == "per_tensor_t":
                state["t"] += 1
                t = state["t"]
            m, v = state["m"][i], state["v"][i]
            if kind == "no_decay":
                pass
            elif kind == "decay_sign":
                p.mul_(1 + lr * weight_decay)
            elif kind != "decay_after":
                p.mul_(1 - lr * weight_decay)
            if kind == "no_one_minus":
                m.mul_(b1).add_(g)
                v.mul_(b2).add_(g * g)
            elif kind == "v_not_squared":
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g.abs())
            else:
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
            m_hat = m / (1 - b1 ** (t + 1 if kind == "m_from_t_plus_one" else t))
            v_hat = v if kind == "only_m_corrected" else \
                v / (1 - b2 ** (t + 1 if kind == "v_from_t_plus_one" else t))
            if kind == "only_v_corrected":
                m_hat = m
            step = m_hat / (v_hat.sqrt() + eps)
            if kind == "eps_squared_inside":
                step = m_hat / (v_hat + eps ** 2).sqrt()
            if kind == "no_lr":
                p.sub_(step)
            else:
                p.sub_(lr * step)
            if kind == "decay_after":
                p.mul_(1 - lr * weight_decay)
    return adamw_step

def adam_state_rebound(params, grads, state, **kw):
    state = {}
    adamw_solution(params, grads, state, **kw)

# Fresh wrong implementations, as learners write them: train_step
def _train_kind(kind):
    def train_step(params, cfg, x, y, state, *, lr, max_norm=1.0, weight_decay=0.1,
                   forward=None):
        forward = forward or model_forward
        logits = forward(x, params, cfg)
        if kind == "unflattened":
            loss = F.cross_entropy(logits, y)
        else:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        tensors = _all_params(params)
        if kind == "clear_before":
            for p in tensors:
                p.grad = None
        loss.backward()
        grads = [p.grad for p in tensors]
        with torch.no_grad():
            if kind == "clip_after":
                adamw_solution(tensors, grads, state, lr=lr, weight_decay=weight_decay)
                clip_solution(grads, max_norm)
            else:
                clip_solution(grads, 1.0 if kind == "ignored_max_norm" else max_norm)
                adamw_solution(tensors, grads, {} if kind == "fresh_state" else state, lr=lr,
                               weight_decay=weight_decay)
        for p in tensors:
            p.grad = None
        return loss.item()
    return train_step

# Fresh wrong implementations, as learners write them: evaluate
def _eval_kind(kind):
    def evaluate(params, cfg, data, *, batch_size, context_len, n_batches, generator=None,
                 forward=None):
        forward = forward or model_forward
        tensors = _all_params(params)
        if kind in ("flags_off", "flags_on"):
            for p in tensors:
                p.requires_grad_(False)
        total = 0.0
        with torch.no_grad():
            for i in range(n_batches):
                if kind == "swapped":
                    x, y = batch_solution(data, context_len, batch_size, generator=generator)
                elif kind == "sequential":
                    s = i * context_len
                    x = torch.stack([data[s + j:s + j + context_len] for j in range(batch_size)])
                    y = torch.stack([data[s + j + 1:s + j + context_len + 1]
                                     for j in range(batch_size)])
                else:
                    x, y = batch_solution(data, batch_size, context_len, generator=generator)
                x, y = x.to(tensors[0].device), y.to(tensors[0].device)
                logits = forward(x, params, cfg)
                total += F.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                         reduction="sum" if kind == "token_sum" else "mean").item()
        if kind == "flags_on":
            for p in tensors:
                p.requires_grad_(True)
        return total / n_batches
    return evaluate

def eval_inference_mode(params, cfg, data, *, batch_size, context_len, n_batches,
                        generator=None, forward=None):
    forward = forward or model_forward
    device = params["lm_head"].device
    with torch.inference_mode():
        losses = [F.cross_entropy(forward(x.to(device), params, cfg).flatten(0, 1),
                                  y.to(device).flatten())
                  for x, y in (batch_solution(data, batch_size, context_len,
                                              generator=generator) for _ in range(n_batches))]
    return float(sum(losses) / n_batches)

def clip_data_assign(grads, max_norm):
    total = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    if total >= max_norm:
        for g in grads:
            g.data = g.data * (max_norm / total)
    return total

def lr_le_total(step, *, max_lr, min_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))

FRESH_WRONG = {
 "get_batch": [
  Wrong("fresh generator when none", gb_fresh_generator, "14.get_batch.fixed_generator_when_none"),
  Wrong("seeded inside", gb_seeded_inside, "14.get_batch.generator_not_used"),
  Wrong("python random", gb_python_random, "14.get_batch.ignored_generator"),
  Wrong("upper bound one short", gb_bound_one_short, "14.get_batch.last_start_never_drawn"),
  Wrong("randperm starts", gb_randperm, "14.get_batch.starts_without_replacement"),
  Wrong("y one token short", gb_y_one_short, "14.get_batch.window_wrong_length"),
  Wrong("stacked along dim 1", gb_transposed, "14.get_batch.transposed"),
  Wrong("batch size and context swapped", gb_sizes_swapped, "14.get_batch.sizes_swapped"),
 ],
 "lr_at": [Wrong(f"lr {k}", _lr_kind(k), i) for k, i in [
  ("w_minus_1", "14.lr_at.warmup_wrong_divisor"), ("w_plus_1", "14.lr_at.warmup_wrong_divisor"),
  ("from_one", "14.lr_at.schedule_shifted_by_one_step"),
  ("from_minus_one", "14.lr_at.schedule_shifted_by_one_step"),
  ("span_total", "14.lr_at.cosine_over_wrong_span"),
  ("span_plus_1", "14.lr_at.cosine_over_wrong_span"),
  ("span_minus_1", "14.lr_at.cosine_over_wrong_span"),
  ("int_div", "14.lr_at.integer_division"),
  ("cos_late", "14.lr_at.cosine_off_by_one"),
  ("full_cos", "14.lr_at.full_cosine_period"),
  ("min_on_top", "14.lr_at.cosine_amplitude_wrong"),
  ("min_ignored", "14.lr_at.cosine_ends_at_zero"),
  ("no_half", "14.lr_at.cosine_amplitude_wrong"),
  ("from_min", "14.lr_at.warmup_from_min_lr"),
  ("zero_after", "14.lr_at.wrong_rate_after_total"),
  ("max_after", "14.lr_at.wrong_rate_after_total")]],
 "clip_grad_norm": [Wrong(f"clip {k}", _clip_kind(k), i) for k, i in [
  ("torch", "14.clip_grad_norm.torch_clip_on_gradients"),
  ("clamp", "14.clip_grad_norm.clamped_each_value"),
  ("rms", "14.clip_grad_norm.rms_not_l2_norm"),
  ("square_of_sums", "14.clip_grad_norm.norm_of_sums"),
  ("sum_of_norms", "14.clip_grad_norm.summed_tensor_norms"),
  ("l1", "14.clip_grad_norm.l1_norm"),
  ("first_only", "14.clip_grad_norm.norm_of_one_tensor"),
  ("inverted", "14.clip_grad_norm.inverted_scale")]],
 "adamw_step": [Wrong(f"adamw {k}", _adam_kind(k), i) for k, i in [
  ("local_moments", "14.adamw_step.moments_not_kept"),
  ("rebound", "14.adamw_step.moments_not_kept"),
  ("fresh_torch", "14.adamw_step.moments_not_kept"),
  ("t_from_one", "14.adamw_step.bias_correction_step_off_by_one"),
  ("t_after", "14.adamw_step.bias_correction_step_off_by_one"),
  ("t_before_increment", "14.adamw_step.bias_correction_wrong_step"),
  ("m_from_t_plus_one", "14.adamw_step.bias_correction_wrong_step"),
  ("v_from_t_plus_one", "14.adamw_step.bias_correction_wrong_step"),
  ("per_tensor_t", "14.adamw_step.step_counted_per_tensor"),
  ("no_decay", "14.adamw_step.no_weight_decay"),
  ("decay_sign", "14.adamw_step.decay_wrong_sign"),
  ("decay_after", "14.adamw_step.decay_after_update"),
  ("no_one_minus", "14.adamw_step.moments_without_one_minus_beta"),
  ("v_not_squared", "14.adamw_step.second_moment_not_squared"),
  ("only_m_corrected", "14.adamw_step.partial_bias_correction"),
  ("only_v_corrected", "14.adamw_step.partial_bias_correction"),
  ("no_lr", "14.adamw_step.update_not_scaled_by_lr"),
 ]] + [Wrong("adamw state rebound", adam_state_rebound, "14.adamw_step.moments_not_kept")],
 "train_step": [Wrong(f"train {k}", _train_kind(k), i) for k, i in [
  ("unflattened", "14.train_step.logits_not_flattened"),
  ("clip_after", "14.train_step.no_clipping"),
  ("fresh_state", "14.train_step.state_not_passed"),
  ("ignored_max_norm", "14.train_step.ignored_max_norm")]],
 "evaluate": [Wrong(f"eval {k}", _eval_kind(k), i) for k, i in [
  ("flags_off", "14.evaluate.requires_grad_left_off"),
  ("swapped", "14.evaluate.batch_arguments_swapped"),
  ("sequential", "14.evaluate.batches_not_from_get_batch"),
  ("token_sum", "14.evaluate.summed_over_tokens")]],
}


CORRECT = {
    nb14.check_get_batch: {"reference": tr.get_batch, "solution_style": batch_solution,
                           "one draw per row": gb_loop_draws},
    nb14.check_lr_at: {"reference": tr.lr_at, "solution_style": lr_solution,
                       "progress clamped at 1": lr_le_total},
    nb14.check_clip_grad_norm: {"reference": tr.clip_grad_norm, "solution_style": clip_solution,
                                "assigns g.data": clip_data_assign},
    nb14.check_adamw_step: {"reference": tr.adamw_step, "solution_style": adamw_solution},
    nb14.check_train_step: {"reference": tr.train_step, "solution_style": train_solution,
                            "gradients cleared before backward": _train_kind("clear_before")},
    nb14.check_evaluate: {"reference": tr.evaluate, "solution_style": evaluate_solution,
                          "inference mode": eval_inference_mode,
                          "flags off, then back on": _eval_kind("flags_on")},
    nb14.check_bits_per_byte: {"reference": tr.bits_per_byte, "solution_style": bpb_solution},
}
WRONG = {
    nb14.check_get_batch: GET_BATCH_WRONG + FRESH_WRONG["get_batch"],
    nb14.check_lr_at: LR_WRONG + FRESH_WRONG["lr_at"],
    nb14.check_clip_grad_norm: CLIP_WRONG + FRESH_WRONG["clip_grad_norm"],
    nb14.check_adamw_step: ADAMW_WRONG + FRESH_WRONG["adamw_step"],
    nb14.check_train_step: TRAIN_WRONG + FRESH_WRONG["train_step"],
    nb14.check_evaluate: EVALUATE_WRONG + FRESH_WRONG["evaluate"],
    nb14.check_bits_per_byte: BPB_WRONG,
}
EXERCISES = exercises(CORRECT, WRONG)


def test_the_reference_adamw_is_torchs():
    """The checker's expected values are torch.optim.AdamW's (foreach=False), step for step."""
    gen = torch.Generator().manual_seed(5)
    params = [torch.randn(4, 3, generator=gen), torch.randn(6, generator=gen)]
    theirs = [p.clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(theirs, lr=1e-2, betas=(0.85, 0.98), eps=1e-2, weight_decay=0.2,
                            foreach=False)
    grads_seq = [[torch.randn_like(p) for p in params] for _n in range(4)]
    want = nb14._adamw_variant(None, params, grads_seq, [1e-2] * 4, (0.85, 0.98), 1e-2, 0.2)
    for t, grads in enumerate(grads_seq):
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        opt.step()
        for a, b in zip(want[t], theirs):
            torch.testing.assert_close(a, b.detach(), atol=1e-6, rtol=1e-6)
