"""What every section shares: the plans (FULL, QUICK), the random weights, timing a call, the
solution notebooks, the CPU hogs, and number formatting."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import timing
from ...config import ModelConfig, block_shapes, model_shapes

REPO = Path(__file__).resolve().parents[3]
SOLUTIONS = REPO / "solutions"
SECTIONS = ("bandwidth", "generate", "no_cache", "decode_path", "timing", "notebooks", "grading",
            "load", "class", "smollm", "training", "serving", "speculative")
MiB, GiB = 2**20, 2**30


@dataclass(frozen=True)
class Plan:
    label: str
    cfg: ModelConfig
    prompt_len: int
    lengths: tuple[int, ...]            # new tokens per generation
    repeats: int                        # timed generations per implementation and length
    bandwidth_bytes: int                # size of the array read to measure the bandwidth
    no_cache_full_max: int              # no-cache generations up to this length run in full
    no_cache_samples: int               # steps timed to estimate a longer no-cache generation
    decode_contexts: tuple[int, ...]    # cached positions at which decode variants are timed
    decode_rounds: int                  # rounds over all variants (interleaved)
    decode_steps: int                   # timed steps per variant and round
    check_tokens: int                   # new tokens of each variant's correctness check
    timing_size: str                    # checks.timing plan
    timing_repeats: int | None
    notebooks: tuple[str, ...] | None = None   # chapters (NN prefixes); None: all of them
    load_hogs: int = 2                  # CPU hogs alongside the loaded runs of `load`
    class_size: int = 20                # complete submissions graded by `class`
    smollm_lengths: tuple[int, ...] = (128, 512)   # new tokens of the real model's generations
    serving_chats: int = 8              # chapter 15's chats served (section `serving`)
    serving_tokens: int = 48            # new tokens at most per chat


FULL = Plan(
    label="LLaMA-shaped: H=512, L=8, N_h=8, N_kv=2, H_ff=1376, |V|=32000, fp32",
    cfg=ModelConfig(vocab_size=32000, hidden_size=512, n_heads=8, n_kv_heads=2,
                    ffn_hidden_size=1376, n_layers=8, max_seq_len=2048),
    prompt_len=32, lengths=(128, 512, 1024), repeats=3, bandwidth_bytes=GiB,
    no_cache_full_max=128, no_cache_samples=6, decode_contexts=(160, 1056), decode_rounds=10,
    decode_steps=8,
    check_tokens=24, timing_size="small", timing_repeats=None)

QUICK = Plan(
    label="quick: tiny config (H=64, L=2, |V|=512), fp32: proves the command works, "
          "measures nothing",
    cfg=ModelConfig(vocab_size=512, hidden_size=64, n_heads=4, n_kv_heads=2,
                    ffn_hidden_size=176, n_layers=2, max_seq_len=256),
    prompt_len=8, lengths=(8, 24), repeats=1, bandwidth_bytes=16 * MiB,
    no_cache_full_max=8, no_cache_samples=3, decode_contexts=(16,), decode_rounds=1,
    decode_steps=3,
    check_tokens=6, timing_size="tiny", timing_repeats=1, notebooks=("01",), load_hogs=1,
    class_size=2, smollm_lengths=(4,), serving_chats=3, serving_tokens=3)


def best(fn, *, warmup: int = 1, repeats: int = 5) -> float:
    """Seconds of the fastest of `repeats` calls of fn() after `warmup` untimed ones
    (`checks.timing.time_repeats`; the sections that use it run on the CPU: no synchronisation)."""
    return timing.time_repeats(fn, repeats=repeats, warmup=warmup).fastest


def benchmark_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random weights in the course's layout, scaled so that activations and logits are of order
    one (each matrix N(0, 1/fan_in), the LM head twice that, the embedding N(0, 1), norm scales
    around one): greedy choices then win by clear margins, so that two implementations that
    differ by rounding pick the same tokens. (Timing does not depend on the values.)"""
    g = torch.Generator().manual_seed(seed)

    def w(shape, scale=1.0):
        return torch.randn(*shape, generator=g) * (scale / math.sqrt(shape[0]))

    def norm(shape):
        return 1.0 + 0.1 * torch.randn(*shape, generator=g)

    def block():
        return {name: norm(shape) if len(shape) == 1 else w(shape)
                for name, shape in block_shapes(cfg).items()}

    layers = [block() for _ in range(cfg.n_layers)]
    top = model_shapes(cfg)
    return {"embed": torch.randn(*top["embed"], generator=g), "layers": layers,
            "final_norm": norm(top["final_norm"]), "lm_head": w(top["lm_head"], 2.0)}


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first position where two [1, S] token sequences differ (None when equal)."""
    if a.shape == b.shape and torch.equal(a, b):
        return None
    n = min(a.shape[-1], b.shape[-1])
    diff = (a[..., :n] != b[..., :n]).nonzero()
    return int(diff[0, -1]) if len(diff) else n


def prompt_tokens(cfg: ModelConfig, length: int) -> torch.Tensor:
    """The sections' prompt: `length` random tokens, the same in every section and every run."""
    return torch.randint(0, cfg.vocab_size, (1, length),
                         generator=torch.Generator().manual_seed(1))


def gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def solution_notebooks(chapters: tuple[str, ...] | None = None) -> list[Path]:
    """The solution notebooks of `chapters` (NN prefixes or folder names; None: all of them)."""
    found = sorted(SOLUTIONS.glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb"))
    found = [p for p in found if p.stem == p.parent.name]
    if chapters is not None:
        found = [p for p in found if p.parent.name[:2] in chapters
                 or p.parent.name in chapters]
    return found


LOADED_LIMIT = 3600.0   # seconds: the hogs stop by themselves after this, whatever happens


def cpu_hogs(n: int, seconds: float):
    """scripts/with_cpu_hogs.py's hogs as a context manager (the script is the one place that
    knows how to start and always stop them)."""
    spec = importlib.util.spec_from_file_location("with_cpu_hogs",
                                                  REPO / "scripts" / "with_cpu_hogs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cpu_hogs(n, seconds)
