"""Chapter 14's run: the sizes and settings of the training runs, the device they run on, and the
arithmetic of their cost, as plain functions (the chapter, its tests, the benchmark and
`python -m checks.gpu_check` share them; the training loop itself is the learner's, in the
chapter).

- `settings(kind)`: "grading" (the smallest run that exercises the code: a grader runs it, decided
  by steps, never by time), "cpu" (the default run: about a minute on two cores), "gpu" (a larger
  model for CUDA or MPS), "ablation" (seconds each).
- `choose_device()` and `autocast_dtype(device)`: CUDA, then MPS, then the CPU; bf16 autocast
  where the device runs it fast (CUDA with bf16 support), else none.
- `train_flops_per_token(cfg, context_len)`: three times the forward pass (the backward pass
  costs about twice the forward), the forward from chapter 13's prefill count.
- `matmul_peak(device)`: the FLOP/s of a large float32 matrix product, the roof an MFU is measured
  against.

Measuring and the words for a duration are `checks.timing`'s (`choose_device` is its
`default_kind`, `seconds_text` its own, `matmul_peak` its `measure_peak_flops`); this module
keeps what is the training run's.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from . import timing
from .config import ModelConfig
from .timing import default_kind as choose_device
from .timing import seconds_text


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """One training run: the model, the batches, the schedule."""

    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden_size: int
    context_len: int
    batch_size: int
    steps: int
    max_lr: float
    min_lr: float
    warmup_steps: int
    max_norm: float = 1.0
    weight_decay: float = 0.1
    eval_batches: int = 8
    eval_every: int = 50
    seed: int = 0

    def config(self, **changes) -> ModelConfig:
        """The model's ModelConfig (byte-level vocabulary of 256); `changes` override fields."""
        fields = dict(vocab_size=256, hidden_size=self.hidden_size, n_heads=self.n_heads,
                      n_kv_heads=self.n_kv_heads, ffn_hidden_size=self.ffn_hidden_size,
                      n_layers=self.n_layers, max_seq_len=self.context_len)
        fields.update(changes)
        return ModelConfig(**fields)

    def tokens_per_step(self) -> int:
        return self.batch_size * self.context_len


_SETTINGS = {
    # A grader's run: every line of the loop runs, in a couple of seconds.
    "grading": RunSettings(hidden_size=32, n_layers=1, n_heads=4, n_kv_heads=2,
                           ffn_hidden_size=96, context_len=32, batch_size=4, steps=6,
                           max_lr=3e-3, min_lr=3e-4, warmup_steps=2, eval_batches=2,
                           eval_every=3),
    # The default: 0.8 M parameters, 500 steps of 16 x 128 bytes, about a minute on two cores.
    "cpu": RunSettings(hidden_size=128, n_layers=4, n_heads=8, n_kv_heads=2,
                       ffn_hidden_size=352, context_len=128, batch_size=16, steps=500,
                       max_lr=4e-3, min_lr=4e-4, warmup_steps=25, eval_batches=8,
                       eval_every=50),
    # On a GPU: 10 M parameters, 1000 steps of 32 x 256 bytes.
    "gpu": RunSettings(hidden_size=384, n_layers=6, n_heads=6, n_kv_heads=2,
                       ffn_hidden_size=1024, context_len=256, batch_size=32, steps=1000,
                       max_lr=2e-3, min_lr=2e-4, warmup_steps=50, eval_batches=16,
                       eval_every=100),
    # One ablation: a few seconds on two cores.
    "ablation": RunSettings(hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                            ffn_hidden_size=176, context_len=64, batch_size=16, steps=150,
                            max_lr=5e-3, min_lr=5e-4, warmup_steps=10, eval_batches=4,
                            eval_every=50),
    "ablation-grading": RunSettings(hidden_size=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                    ffn_hidden_size=96, context_len=32, batch_size=4, steps=3,
                                    max_lr=3e-3, min_lr=3e-4, warmup_steps=1, eval_batches=1,
                                    eval_every=3),
}


def settings(kind: str) -> RunSettings:
    """The settings of a run: "grading", "cpu", "gpu", "ablation" or "ablation-grading"."""
    try:
        return _SETTINGS[kind]
    except KeyError:
        raise ValueError(f"no run called {kind!r}; one of {sorted(_SETTINGS)}") from None


def run_kind(device: str, grading: bool) -> str:
    """Which settings a run uses: the grading run under a grader whatever the device, the GPU's
    on CUDA or MPS, else the CPU's."""
    if grading:
        return "grading"
    return "gpu" if device in ("cuda", "mps") else "cpu"


def autocast_dtype(device: str, bf16_supported: bool | None = None) -> torch.dtype | None:
    """bf16 for autocast on CUDA devices that support it (Ampere and later); None elsewhere (the
    CPU's bf16 matmuls are slower than its float32 ones at these sizes; MPS stays float32)."""
    if device != "cuda":
        return None
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16_supported else None


def forward_flops_per_token(cfg: ModelConfig, context_len: int) -> float:
    """FLOPs of the forward pass per token of a training batch: chapter 13's prefill count over
    `context_len` tokens (2 per multiply-add), with the LM head at every position (a prefill
    needs it at the last one only, training at all of them)."""
    from .reference.roofline import prefill_flops

    lm_head = 2 * cfg.hidden_size * cfg.vocab_size
    return (prefill_flops(cfg, 1, context_len) - lm_head) / context_len + lm_head


def train_flops_per_token(cfg: ModelConfig, context_len: int) -> float:
    """About three forward passes per token: the forward, and a backward pass that costs twice
    as much (a gradient for the activations and one for the weights). For a large model this is
    the familiar 6 N FLOPs per token (N parameters)."""
    return 3.0 * forward_flops_per_token(cfg, context_len)


def matmul_peak(device: str = "cpu", size: int = 1024, seconds: float = 0.5,
                dtype: torch.dtype = torch.float32) -> float:
    """Measured FLOP/s of `size` x `size` matrix products on `device` (the fastest of the
    repeats within `seconds`: `checks.timing.measure_peak_flops`, chapter 13's peak): the roof a
    model's FLOP/s is compared with (its MFU)."""
    return timing.measure_peak_flops(torch.device(device), dtype, size, budget=seconds)


def llama2_7b_training_flops(tokens: float = 2e12) -> float:
    """6 N D: LLaMA-2-7B's 6.74 billion parameters, `tokens` training tokens (2 trillion)."""
    return 6.0 * 6_738_415_616 * tokens


__all__ = ["FINAL_EVAL_BATCHES", "FINAL_EVAL_SEED", "RunSettings", "autocast_dtype",
           "choose_device", "forward_flops_per_token", "run_reference", "to_device",
           "llama2_7b_training_flops", "matmul_peak", "run_kind", "seconds_text", "settings",
           "train_flops_per_token"]


FINAL_EVAL_BATCHES = 32
FINAL_EVAL_SEED = 1234


def run_reference(s: RunSettings, train: torch.Tensor, valid: torch.Tensor, *,
                  device: str = "cpu", log=None) -> dict:
    """The chapter's run with the course's reference functions (what the chapter's loop does
    with the learner's): the same seeds, batches, schedule and evaluations. Returns the losses,
    the final validation loss (FINAL_EVAL_BATCHES batches from FINAL_EVAL_SEED), the seconds the
    steps took and the parameters."""
    from .reference import training as tr

    cfg = s.config()
    params = tr.init_training_params(cfg, generator=torch.Generator().manual_seed(s.seed))
    if device != "cpu":
        params = to_device(params, device)
    gen = torch.Generator().manual_seed(s.seed)
    state: dict = {}
    losses = []
    amp = autocast_dtype(device)
    start = time.perf_counter()
    for step in range(s.steps):
        x, y = tr.get_batch(train, s.batch_size, s.context_len, generator=gen)
        lr = tr.lr_at(step, max_lr=s.max_lr, min_lr=s.min_lr, warmup_steps=s.warmup_steps,
                      total_steps=s.steps)
        with torch.autocast(device, dtype=amp, enabled=amp is not None):
            loss = tr.train_step(params, cfg, x.to(device), y.to(device), state, lr=lr,
                                 max_norm=s.max_norm, weight_decay=s.weight_decay)
        losses.append(loss)
        if log is not None and (step % s.eval_every == 0 or step == s.steps - 1):
            log(step, loss, time.perf_counter() - start)
    timing.synchronize(device)
    seconds = time.perf_counter() - start
    final = tr.evaluate(params, cfg, valid,     # on the model's device: evaluate moves batches
                        batch_size=s.batch_size, context_len=s.context_len,
                        n_batches=FINAL_EVAL_BATCHES,
                        generator=torch.Generator().manual_seed(FINAL_EVAL_SEED))
    return {"losses": losses, "final_val": final, "seconds": seconds, "params": params,
            "cfg": cfg, "tokens": s.steps * s.tokens_per_step()}


def to_device(params: dict, device: str) -> dict:
    """The parameter dict on `device` (new leaves that require gradients where the old did)."""
    def move(t):
        return t.detach().to(device).requires_grad_(t.requires_grad)
    return {"embed": move(params["embed"]),
            "layers": [{k: move(v) for k, v in layer.items()} for layer in params["layers"]],
            **{k: move(params[k]) for k in ("final_norm", "lm_head") if k in params}}
