"""Chapter 14's run: the sizes and settings of the training runs, the device they run on, and the
arithmetic of their cost, as plain functions (the chapter, its tests, the benchmark and
`python -m checks.gpu_check` share them; the training loop itself is the learner's, in the
chapter).

- `settings(kind)`: "grading" (the smallest run that exercises the code: a grader runs it, decided
  by steps, never by time), "cpu" (the default run: about 90 s on two cores), "gpu" (a larger
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
import math
import os
import time

import torch

from . import timing
from .config import ModelConfig
from .context import quick_demos_asked
from .environment import THREADS_ENV
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
    # The default: 0.8 M parameters, 600 steps of 32 x 64 bytes, about 90 s on two cores.
    # (A context of 64 instead of 128 at the same tokens per step: a lower validation loss
    # after 500 steps, 1.82 against 1.84, and a quarter less time a step with the learner's
    # own attention, whose masked softmax costs more per position pair than PyTorch's.)
    "cpu": RunSettings(hidden_size=128, n_layers=4, n_heads=8, n_kv_heads=2,
                       ffn_hidden_size=352, context_len=64, batch_size=32, steps=600,
                       max_lr=4e-3, min_lr=4e-4, warmup_steps=30, eval_batches=8,
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
    """Which settings a run uses: the grading run under a grader (or with
    `LLAMA_COURSE_QUICK_DEMOS`) whatever the device, the GPU's on CUDA or MPS, else the CPU's."""
    if grading or quick_demos_asked():
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


__all__ = ["FINAL_EVAL_BATCHES", "FINAL_EVAL_SEED", "Progress", "RunSettings", "autocast_dtype",
           "available_cores", "checkpoint", "choose_device", "fastest_threads",
           "forward_flops_per_token",
           "llama2_7b_training_flops", "matmul_peak", "resume", "run_kind", "run_reference",
           "seconds_text", "settings", "to_device", "train_flops_per_token", "training_threads"]


FINAL_EVAL_BATCHES = 32
FINAL_EVAL_SEED = 1234


def run_reference(s: RunSettings, train: torch.Tensor, valid: torch.Tensor, *,
                  device: str = "cpu", log=None, forward=None) -> dict:
    """The chapter's run with the course's reference functions (what the chapter's loop does
    with the learner's): the same seeds, batches, schedule and evaluations. Returns the losses,
    the final validation loss (FINAL_EVAL_BATCHES batches from FINAL_EVAL_SEED), the seconds the
    steps took and the parameters. `forward`: another `model_forward` to train (the one a
    learner's chapter 12 gives), for timing a learner's run; default the reference's."""
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
                                 max_norm=s.max_norm, weight_decay=s.weight_decay,
                                 forward=forward)
        losses.append(loss)
        if log is not None and (step % s.eval_every == 0 or step == s.steps - 1):
            log(step, loss, time.perf_counter() - start)
    timing.synchronize(device)
    seconds = time.perf_counter() - start
    final = tr.evaluate(params, cfg, valid,     # on the model's device: evaluate moves batches
                        batch_size=s.batch_size, context_len=s.context_len,
                        n_batches=FINAL_EVAL_BATCHES,
                        generator=torch.Generator().manual_seed(FINAL_EVAL_SEED), forward=forward)
    return {"losses": losses, "final_val": final, "seconds": seconds, "params": params,
            "cfg": cfg, "tokens": s.steps * s.tokens_per_step()}


def to_device(params: dict, device: str) -> dict:
    """The parameter dict on `device` (new leaves that require gradients where the old did)."""
    def move(t):
        return t.detach().to(device).requires_grad_(t.requires_grad)
    return {"embed": move(params["embed"]),
            "layers": [{k: move(v) for k, v in layer.items()} for layer in params["layers"]],
            **{k: move(params[k]) for k in ("final_norm", "lm_head") if k in params}}


# --------------------------------------------------------------------------------------------
# Threads: every core the run may use


def available_cores() -> int:
    """The CPU cores this process may run on: its affinity where the system reports one (a
    container or `taskset` may allow fewer than the machine has), else `os.cpu_count()`."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def training_threads(grading: bool, *, probe: bool = True) -> int:
    """Torch threads for the training run: one under a grader (its runs are tiny and decided by
    steps, and graders run several processes side by side); else the number the environment
    gives (`LLAMA_COURSE_THREADS`, then `OMP_NUM_THREADS`: the test suite pins one thread that
    way); else every available core, if they pay: with `probe`, a product of the default run's
    size is timed on every core and on one (`fastest_threads`), and one thread wins only where
    it is faster. On two quiet cores every core is faster (the reference step 1.6x); on a busy
    machine each parallel operation waits for a descheduled thread, and one thread was 8 times
    faster (beside nine other busy processes on 2 cores)."""
    if grading:
        return 1
    for name in (THREADS_ENV, "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    cores = available_cores()
    if cores == 1 or not probe:
        return cores
    return fastest_threads([cores, 1], _probe_work())


def _probe_work():
    """One layer's worth of the default run's matrix products, forward and backward shapes."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2048, 128, generator=g), torch.randn(128, 352, generator=g)

    def work():
        h = torch.nn.functional.silu(x @ w)
        return (h @ w.T).sum() + (x.T @ h).sum()
    return work


def fastest_threads(candidates: list[int], work, *, rounds: int = 3, calls: int = 5) -> int:
    """The thread count among `candidates` that runs `calls` calls of `work()` fastest (the best
    of `rounds` rounds, the candidates alternating so that a change in the machine's load
    touches each alike); ties go to the first. Torch's threads are restored afterwards."""
    if not candidates:
        raise ValueError("no thread counts to choose from")
    saved = torch.get_num_threads()
    best = {n: math.inf for n in candidates}
    try:
        for _round in range(rounds):
            for n in candidates:
                torch.set_num_threads(n)
                work()                                  # the first call at a new count warms up
                start = time.perf_counter()
                for _call in range(calls):
                    work()
                best[n] = min(best[n], time.perf_counter() - start)
    finally:
        torch.set_num_threads(saved)
    return min(candidates, key=lambda n: (best[n], candidates.index(n)))


# --------------------------------------------------------------------------------------------
# The progress line's arithmetic


class Progress:
    """Tokens per second and the time left, from what has been timed so far. The first `skip`
    training steps of a run are left out (they allocate memory and warm caches, and run several
    times slower than the rest), and so are evaluations: they are timed apart and counted at
    their own cost. Until a step has been timed after those, there is no estimate (None)."""

    def __init__(self, tokens_per_step: int, skip: int = 5):
        if tokens_per_step <= 0 or skip < 0:
            raise ValueError(f"tokens_per_step must be positive and skip at least 0, got "
                             f"{tokens_per_step} and {skip}")
        self.tokens_per_step, self.skip = tokens_per_step, skip
        self.steps_seen, self.evals_seen = 0, 0
        self.timed_steps, self.step_seconds = 0, 0.0
        self.timed_evals, self.eval_seconds = 0, 0.0

    def step(self, seconds: float) -> None:
        """One training step took `seconds`."""
        self.steps_seen += 1
        if self.steps_seen > self.skip:
            self.timed_steps += 1
            self.step_seconds += seconds

    def evaluation(self, seconds: float) -> None:
        """One evaluation took `seconds` (the first is left out: it warms up the no-grad path)."""
        self.evals_seen += 1
        if self.evals_seen > 1:
            self.timed_evals += 1
            self.eval_seconds += seconds

    def tokens_per_s(self) -> float | None:
        if not self.timed_steps:
            return None
        return self.timed_steps * self.tokens_per_step / self.step_seconds

    def seconds_left(self, steps_left: int, evals_left: int) -> float | None:
        """The time `steps_left` more steps and `evals_left` more evaluations take at the rates
        measured; None before any step has been timed."""
        if not self.timed_steps:
            return None
        per_eval = self.eval_seconds / self.timed_evals if self.timed_evals > 0 else 0.0
        return steps_left * self.step_seconds / self.timed_steps + evals_left * per_eval


# --------------------------------------------------------------------------------------------
# Save and resume


def _tensors_to(value, device):
    """`value` (tensors inside dicts, lists and tuples, anything else kept) with every tensor
    detached and moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, dict):
        return {k: _tensors_to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors_to(v, device) for v in value)
    return value


def checkpoint(cfg: ModelConfig, params: dict, state: dict, step: int,
               generator: torch.Generator) -> dict:
    """What a run needs to go on exactly where it stopped, on the CPU and without autograd:
    the configuration, the parameters, the optimizer's state (AdamW's step count and both
    moments, however `adamw_step` keeps them), the number of steps done (the schedule's
    position) and the batch generator's state (the next batches). `torch.save` writes it;
    `torch.load(..., weights_only=True)` reads it back."""
    return {"config": dataclasses.asdict(cfg),
            "params": _tensors_to(params, "cpu"),
            "optimizer": _tensors_to(state, "cpu"),
            "step": int(step),
            "generator": generator.get_state()}


def resume(saved: dict, device: str = "cpu"):
    """The run a `checkpoint` saved: (cfg, params, state, step, generator), the parameters
    trainable leaves and the optimizer's tensors on `device`."""
    missing = {"config", "params", "optimizer", "step", "generator"} - set(saved)
    if missing:
        raise ValueError(f"not a training checkpoint: {', '.join(sorted(missing))} missing")
    cfg = ModelConfig(**saved["config"])
    params = to_device(saved["params"], device)
    for t in _leaves(params):
        t.requires_grad_(True)
    generator = torch.Generator()
    generator.set_state(saved["generator"])
    return cfg, params, _tensors_to(saved["optimizer"], device), saved["step"], generator


def _leaves(params: dict) -> list[torch.Tensor]:
    return [params["embed"], *(t for layer in params["layers"] for t in layer.values()),
            *(params[k] for k in ("final_norm", "lm_head") if k in params)]
