"""Chapter 14: training the functional model: batches, the learning-rate schedule, gradient
clipping, AdamW by hand, a training step, an evaluation without gradients, bits per byte.

Formulated differently from the notebook: batches index the data with one [B, T] matrix of
positions (starts plus an arange) instead of stacking slices; the schedule is written as a
piecewise function of the progress through the cosine phase; the global norm is the norm of the
per-tensor norms (as torch.nn.utils.clip_grad_norm_ computes it) and clipping always multiplies by
the clamped coefficient; AdamW keeps its moments in a dict keyed by position and divides by the
bias-corrected second moment's root the way torch.optim.AdamW's single-tensor path does.

Conventions (docs/conventions.md, and chapter 14's exercises as its notebook states them): data
is a 1-D LongTensor of token ids; x, y [B, T] with y the next tokens of x; `params` in the layout
of docs/conventions.md ("The configuration and the parameters"), its tensors requiring gradients
for training; `adamw_step` runs under torch.no_grad() and updates in place, with the decoupled
weight decay applied to every tensor it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .model import init_model_params, model_forward


# --------------------------------------------------------------------------------------------
# The parameters as one list, made trainable


def param_list(params: dict) -> list[torch.Tensor]:
    """Every tensor of the layout in layout order: embed, each block's tensors, final_norm,
    lm_head (a tied LM head, one tensor under two names, is listed once)."""
    out = [params["embed"]]
    for layer in params["layers"]:
        out += list(layer.values())
    out += [params["final_norm"], params["lm_head"]]
    seen, unique = set(), []
    for t in out:
        if id(t) not in seen:
            seen.add(id(t))
            unique.append(t)
    return unique


def trainable(params: dict) -> dict:
    """The same dict with every tensor made a leaf that requires gradients (in place: the tensors
    are the same objects; call it on weights no one else differentiates through)."""
    for t in param_list(params):
        t.requires_grad_(True)
    return params


def init_training_params(cfg, generator: torch.Generator | None = None) -> dict:
    """Chapter 12's random initialisation, trainable (float32)."""
    return trainable(init_model_params(cfg, generator=generator))


# --------------------------------------------------------------------------------------------
# The four exercises of the contract


def get_batch(data: torch.Tensor, batch_size: int, context_len: int, *,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y), LongTensors [batch_size, context_len] on data's device: rows start at
    torch.randint(0, len(data) - context_len, (batch_size,), generator=generator); y is x shifted
    by one token."""
    starts = torch.randint(0, len(data) - context_len, (batch_size,), generator=generator)
    index = (starts.unsqueeze(1) + torch.arange(context_len).unsqueeze(0)).to(data.device)
    return data[index].long(), data[index + 1].long()


def lr_at(step: int, *, max_lr: float, min_lr: float, warmup_steps: int,
          total_steps: int) -> float:
    """Linear warmup to max_lr over warmup_steps (step 0 already at max_lr / warmup_steps), then
    a half cosine from max_lr down to min_lr at total_steps; min_lr after."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float) -> float:
    """The global L2 norm of all `grads` before clipping; scales them in place by
    min(1, max_norm / (norm + 1e-6))."""
    grads = [g for g in grads if g is not None]
    if not grads:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(g.detach(), 2.0) for g in grads])
    total = torch.linalg.vector_norm(norms, 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.detach().mul_(coef.to(g.dtype))
    return float(total)


def adamw_step(params: list[torch.Tensor], grads: list[torch.Tensor], state: dict, *, lr: float,
               betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
               weight_decay: float = 0.1) -> None:
    """One AdamW step, in place, as torch.optim.AdamW(foreach=False): decoupled decay
    p <- p (1 - lr wd), then p <- p - lr m_hat / (sqrt(v_hat) + eps) with the bias-corrected
    moments; `state` keeps the step count and the moments between calls."""
    beta1, beta2 = betas
    step = state.get("step", 0) + 1
    state["step"] = step
    moments = state.setdefault("moments", {})
    bias1 = 1.0 - beta1 ** step
    bias2_root = math.sqrt(1.0 - beta2 ** step)
    with torch.no_grad():
        for i, (p, g) in enumerate(zip(params, grads)):
            if g is None:
                continue
            m, v = moments.setdefault(i, (torch.zeros_like(p), torch.zeros_like(p)))
            p.mul_(1.0 - lr * weight_decay)
            m.lerp_(g, 1.0 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
            denom = (v.sqrt() / bias2_root).add_(eps)
            p.addcdiv_(m, denom, value=-lr / bias1)


# --------------------------------------------------------------------------------------------
# The chapter's own exercises: a training step, an evaluation, bits per byte


def batch_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [B, T, V] against the next tokens y [B, T] (already shifted:
    no further shift)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def train_step(params: dict, cfg, x: torch.Tensor, y: torch.Tensor, state: dict, *, lr: float,
               max_norm: float = 1.0, weight_decay: float = 0.1,
               forward: Callable | None = None) -> float:
    """One step: the loss of the batch (forward(x, params, cfg), default model_forward), its
    gradients, clip_grad_norm to max_norm, adamw_step with lr and weight_decay, the gradients
    cleared; returns the loss before the update, a float."""
    forward = model_forward if forward is None else forward
    tensors = param_list(params)
    loss = batch_loss(forward(x, params, cfg), y)
    grads = list(torch.autograd.grad(loss, tensors, allow_unused=True))
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads)]
    clip_grad_norm(grads, max_norm)
    with torch.no_grad():
        adamw_step(tensors, grads, state, lr=lr, weight_decay=weight_decay)
    for t in tensors:
        t.grad = None
    return float(loss.detach())


def evaluate(params: dict, cfg, data: torch.Tensor, *, batch_size: int, context_len: int,
             n_batches: int, generator: torch.Generator | None = None,
             forward: Callable | None = None) -> float:
    """The mean loss over `n_batches` batches of get_batch(data, batch_size, context_len,
    generator=generator), moved to the parameters' device (the model may be on a GPU, the data
    on the CPU), without gradients (torch.no_grad()); a float."""
    forward = model_forward if forward is None else forward
    device = params["embed"].device
    total = 0.0
    with torch.no_grad():
        for _ in range(n_batches):
            x, y = get_batch(data, batch_size, context_len, generator=generator)
            total += float(batch_loss(forward(x.to(device), params, cfg), y.to(device)))
    return total / n_batches


def bits_per_byte(loss: float, n_tokens: int, n_bytes: int) -> float:
    """A mean loss in nats per token as bits per byte of text: loss * n_tokens / n_bytes / ln 2
    (byte-level tokens: n_tokens == n_bytes)."""
    return loss * n_tokens / (n_bytes * math.log(2.0))


__all__ = ["adamw_step", "batch_loss", "bits_per_byte", "clip_grad_norm", "evaluate",
           "get_batch", "init_training_params", "lr_at", "param_list", "train_step", "trainable"]
