"""Chapter 14's reference (checks.reference.training) against PyTorch: AdamW equals
torch.optim.AdamW(foreach=False) step for step, clipping equals clip_grad_norm_, the batches and
the schedule are the contract's, and a tiny model's loss falls."""

from __future__ import annotations

import math

import pytest
import torch

from checks import ModelConfig
from checks.reference import training as tr
from checks.reference.model import model_forward


@pytest.mark.parametrize("weight_decay", [0.0, 0.1, 0.5])
def test_adamw_equals_torch_step_for_step(weight_decay):
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (7,), (2, 4, 3)]
    ours = [torch.randn(s, generator=gen) for s in shapes]
    theirs = [p.clone().requires_grad_() for p in ours]
    opt = torch.optim.AdamW(theirs, lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=weight_decay, foreach=False)
    state: dict = {}
    for step in range(25):
        grads = [torch.randn(s, generator=gen) * (1 + step) for s in shapes]
        lr = 3e-3 * (0.5 + 0.5 * math.cos(step / 5))
        for group in opt.param_groups:
            group["lr"] = lr
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        opt.step()
        tr.adamw_step(ours, grads, state, lr=lr, weight_decay=weight_decay)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b.detach(), atol=1e-6, rtol=1e-6)


def test_clip_equals_torch():
    gen = torch.Generator().manual_seed(1)
    for max_norm in (0.1, 1.0, 1e3):
        grads = [torch.randn(4, 5, generator=gen), torch.randn(3, generator=gen)]
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        want = torch.nn.utils.clip_grad_norm_(params, max_norm)
        got = tr.clip_grad_norm(grads, max_norm)
        assert isinstance(got, float) and math.isclose(got, float(want), rel_tol=1e-6)
        for p, g in zip(params, grads):
            torch.testing.assert_close(g, p.grad)


def test_batches_and_schedule_follow_the_contract():
    data = torch.arange(100)
    x, y = tr.get_batch(data, 6, 9, generator=torch.Generator().manual_seed(3))
    starts = torch.randint(0, 91, (6,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(x[:, 0], starts) and torch.equal(y, x + 1) and x.shape == (6, 9)
    kw = dict(max_lr=1.0, min_lr=0.1, warmup_steps=10, total_steps=110)
    assert tr.lr_at(0, **kw) == 0.1 and tr.lr_at(9, **kw) == 1.0 and tr.lr_at(10, **kw) == 1.0
    assert math.isclose(tr.lr_at(60, **kw), 0.55) and tr.lr_at(110, **kw) == 0.1
    assert tr.lr_at(500, **kw) == 0.1


def test_a_tiny_model_learns_a_repeating_text():
    cfg = ModelConfig(vocab_size=256, hidden_size=32, n_heads=4, n_kv_heads=2,
                      ffn_hidden_size=64, n_layers=2, max_seq_len=64)
    params = tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0))
    data = torch.tensor(list(b"to be or not to be, that is the question. " * 40))
    gen = torch.Generator().manual_seed(0)
    state: dict = {}
    before = tr.evaluate(params, cfg, data, batch_size=4, context_len=32, n_batches=2,
                         generator=torch.Generator().manual_seed(9))
    for step in range(60):
        x, y = tr.get_batch(data, 8, 32, generator=gen)
        tr.train_step(params, cfg, x, y, state, lr=1e-2)
    after = tr.evaluate(params, cfg, data, batch_size=4, context_len=32, n_batches=2,
                        generator=torch.Generator().manual_seed(9))
    assert before > 5.0 and after < 1.5, (before, after)
    assert all(p.grad is None for p in tr.param_list(params))
    assert math.isclose(tr.bits_per_byte(after, 10, 10), after / math.log(2))
    with torch.no_grad():
        logits = model_forward(x, params, cfg)
    assert logits.shape == (8, 32, 256)
