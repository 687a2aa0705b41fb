"""Section `training`: tokens per second of chapter 14's training step, the course's way (the
functional reference model, a params dict, the hand-written AdamW and clipping of
`checks.reference.training`) against a plain PyTorch `nn.Module` LLaMA of the same size and the
same initial weights with `torch.optim.AdamW` and `torch.nn.utils.clip_grad_norm_`, in one
process, alternating, on the same batches; printed as a ratio (goal: at least 0.8), with the MFU
of each (training FLOPs per token, `checks.training_run.train_flops_per_token`, times tokens per
second, over the measured float32 matmul peak).

And the chapter's default run, timed whole (`--run`): `checks.training_run.run_reference` with
the settings the notebook uses, on every core (`checks.training_run.training_threads`), its wall
time, the seconds of its steps and its validation loss.

    python -m checks.tools.benchmark.training [--size cpu|ablation|grading|gpu] [--steps N]
                                              [--threads N] [--run [--forward solutions]]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from ...reference import training as tr
from ...reference.rope import apply_rope
from ... import timing, training_run
from .common import SOLUTIONS


class _Block(nn.Module):
    """One LLaMA block as a module, computed as plainly as PyTorch users write it."""

    def __init__(self, cfg):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.attn_norm = nn.RMSNorm(h, eps=cfg.norm_eps)
        self.wqkv = nn.Linear(h, (cfg.n_heads + 2 * cfg.n_kv_heads) * d, bias=False)
        self.wo = nn.Linear(cfg.n_heads * d, h, bias=False)
        self.ffn_norm = nn.RMSNorm(h, eps=cfg.norm_eps)
        self.w_gate = nn.Linear(h, cfg.ffn_hidden_size, bias=False)
        self.w_up = nn.Linear(h, cfg.ffn_hidden_size, bias=False)
        self.w_down = nn.Linear(cfg.ffn_hidden_size, h, bias=False)

    def forward(self, x, positions):
        cfg = self.cfg
        b, s, _ = x.shape
        n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv = self.wqkv(self.attn_norm(x))
        q, k, v = qkv.split([n_h * d, n_kv * d, n_kv * d], dim=-1)
        q = apply_rope(q.view(b, s, n_h, d).transpose(1, 2), positions, base=cfg.rope_base)
        k = apply_rope(k.view(b, s, n_kv, d).transpose(1, 2), positions, base=cfg.rope_base)
        v = v.view(b, s, n_kv, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(out.transpose(1, 2).reshape(b, s, n_h * d))
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class ModuleLlama(nn.Module):
    """The same model as `checks.reference.model_forward` on the same weights, as an nn.Module
    (nn.Linear keeps [out, in] weights: the course's [in, out] matrices are copied transposed)."""

    def __init__(self, cfg, params: dict):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(_Block(cfg) for _n in range(cfg.n_layers))
        self.final_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        with torch.no_grad():
            self.embed.weight.copy_(params["embed"])
            for block, layer in zip(self.blocks, params["layers"]):
                block.attn_norm.weight.copy_(layer["attn_norm"])
                block.ffn_norm.weight.copy_(layer["ffn_norm"])
                for name in ("wqkv", "wo", "w_gate", "w_up", "w_down"):
                    getattr(block, name).weight.copy_(layer[name].t())
            self.final_norm.weight.copy_(params["final_norm"])
            self.lm_head.weight.copy_(params["lm_head"].t())

    def forward(self, token_ids):
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = self.embed(token_ids)
        for block in self.blocks:
            x = block(x, positions)
        return self.lm_head(self.final_norm(x))


@contextlib.contextmanager
def _threads(n: int | None):
    """Torch on `n` threads inside the block (None: as it is), the caller's setting after."""
    saved = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def run_training(kind: str = "ablation", steps: int | None = None, say=None,
                 device: str = "cpu", threads: int | None = None) -> dict:
    """Both training steps on the same batches, alternating in rounds; tokens/s of each, their
    ratio (course / module), the MFU of each, and the first step's losses (equal: same model).
    `threads`: torch's threads while measuring (None: the process's setting)."""
    with _threads(threads):
        return _run_training(kind, steps, say or (lambda text: None), device)


def _run_training(kind: str, steps: int | None, say, device: str) -> dict:
    s = training_run.settings(kind)
    steps = steps or min(s.steps, 60)
    cfg = s.config()
    params = tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0))
    module = ModuleLlama(cfg, params).to(device)
    params = training_run.to_device(params, device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=s.max_lr, betas=(0.9, 0.95),
                                  eps=1e-8, weight_decay=s.weight_decay)
    data = torch.randint(0, 256, (200_000,), generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    batches = [tr.get_batch(data, s.batch_size, s.context_len, generator=gen)
               for _n in range(steps + 2)]
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    def sync():
        timing.synchronize(device)

    state: dict = {}

    def course(x, y):
        return tr.train_step(params, cfg, x, y, state, lr=s.max_lr, max_norm=s.max_norm,
                             weight_decay=s.weight_decay)

    def plain(x, y):
        logits = module(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), s.max_norm)
        optimizer.step()
        return loss.item()

    first = (course(*batches[0]), plain(*batches[0]))      # warm-up, and the same loss
    course(*batches[1])
    plain(*batches[1])
    times = {"course": 0.0, "module": 0.0}
    say(f"training step: {steps} steps each, {cfg.hidden_size}-wide, {cfg.n_layers} layers")
    for x, y in batches[2:]:
        for name, step in (("course", course), ("module", plain)):
            sync()
            t0 = time.perf_counter()
            step(x, y)
            sync()
            times[name] += time.perf_counter() - t0
    tokens = steps * s.tokens_per_step()
    per_token = training_run.train_flops_per_token(cfg, s.context_len)
    peak = training_run.matmul_peak(device)
    speed = {name: tokens / seconds for name, seconds in times.items()}
    return {"kind": kind, "steps": steps, "cfg": str(cfg), "device": device,
            "tokens_per_s": speed, "ratio": speed["course"] / speed["module"],
            "train_flops_per_token": per_token, "matmul_peak": peak,
            "mfu": {name: per_token * v / peak for name, v in speed.items()},
            "first_loss": {"course": first[0], "module": first[1]},
            "threads": torch.get_num_threads(), "load_average": os.getloadavg()}


def format_training(result: dict) -> list[str]:
    """The section's lines (none when it was skipped)."""
    t = result.get("training", result if "ratio" in result else None)
    if not t or "ratio" not in t:
        return []
    return ["", f"training step ({t['kind']} size, {t['steps']} steps each, {t['device']}, "
                f"{t['threads']} threads, load {t['load_average'][0]:.1f})",
            f"  course (functional model, hand-written AdamW): "
            f"{t['tokens_per_s']['course']:,.0f} tokens/s, MFU {100 * t['mfu']['course']:.2f} %",
            f"  nn.Module LLaMA with torch.optim.AdamW:        "
            f"{t['tokens_per_s']['module']:,.0f} tokens/s, MFU {100 * t['mfu']['module']:.2f} %",
            f"  ratio course / module: {t['ratio']:.2f} (goal >= 0.8); first-step losses "
            f"{t['first_loss']['course']:.4f} and {t['first_loss']['module']:.4f}; matmul peak "
            f"{t['matmul_peak'] / 1e9:.1f} GFLOP/s"]


@contextlib.contextmanager
def _as_a_learner():
    """Without the grading flags while the notebooks load: under a grader (the test suite sets
    the flag) borrowing gives the course's reference functions, at every level of the chain."""
    from ...environment import _NBGRADER_ENV, GRADING_ENV

    saved = {name: os.environ.pop(name) for name in (GRADING_ENV, _NBGRADER_ENV)
             if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def solutions_forward():
    """The `model_forward` of the solution notebooks (chapter 12's, built on chapters 02-11's),
    borrowed as chapter 14 borrows a learner's: what the chapter's stated time is for."""
    from ...borrow import own_functions

    if not (SOLUTIONS / "12_lm_head_logits").is_dir():
        raise SystemExit(f"--forward solutions needs the course's solutions/ folder ({SOLUTIONS})")
    with contextlib.redirect_stdout(io.StringIO()), _as_a_learner():
        borrowed = own_functions({"model_forward": "12_lm_head_logits"}, root=SOLUTIONS)
    if borrowed.whose["model_forward"] != "yours":
        raise SystemExit("the solutions' model_forward did not pass its check: "
                         f"{borrowed.why['model_forward']}")
    return borrowed.functions["model_forward"]


def run_default(kind: str = "cpu", *, threads: int | None = None, steps: int | None = None,
                device: str = "cpu", forward: str = "reference") -> dict:
    """The chapter's run, timed whole: the wall time from the first step to the final validation
    loss, the seconds of the steps alone, the loss, the threads. `forward`: "reference" (the
    course's functions) or "solutions" (the solution notebooks' own, as a learner's)."""
    from ... import shakespeare

    s = training_run.settings(kind)
    if steps is not None:
        s = dataclasses.replace(s, steps=steps, warmup_steps=min(s.warmup_steps, steps))
    train, valid = shakespeare.load()
    model_forward = solutions_forward() if forward == "solutions" else None   # not timed
    with _threads(threads):
        start = time.perf_counter()
        out = training_run.run_reference(s, train, valid, device=device, forward=model_forward)
        wall = time.perf_counter() - start
        used = torch.get_num_threads()
    return {"kind": kind, "steps": s.steps, "device": device, "threads": used, "forward": forward,
            "wall_seconds": wall, "step_seconds": out["seconds"], "final_val": out["final_val"],
            "tokens": out["tokens"], "load_average": os.getloadavg()}


def format_default_run(t: dict | None) -> list[str]:
    """The default run's lines (none when it was not run)."""
    if not t:
        return []
    functions = {"reference": "reference functions",
                 "solutions": "the solutions' functions"}[t.get("forward", "reference")]
    return ["", f"the chapter's default run ({t['kind']} settings, {functions}, "
                f"{t['device']}, {t['threads']} threads, load {t['load_average'][0]:.1f})",
            f"  {t['steps']} steps ({t['tokens']:,} tokens) in {t['step_seconds']:.1f} s, "
            f"{t['wall_seconds']:.1f} s with the final evaluation; validation "
            f"{t['final_val']:.3f} nats per byte"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.tools.benchmark.training",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="cpu",
                        choices=["grading", "ablation", "cpu", "gpu"])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--device", default=None, help="cpu, cuda or mps (default: the best)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: every available core, as the chapter)")
    parser.add_argument("--run", action="store_true",
                        help="also time the chapter's default run of that size, whole")
    parser.add_argument("--forward", default="reference", choices=["reference", "solutions"],
                        help="the run's model_forward: the course's reference, or the solution "
                             "notebooks' own (as a learner's: what the chapter's time is for)")
    args = parser.parse_args(argv)
    device = args.device or training_run.choose_device()
    threads = args.threads or training_run.training_threads(grading=False)
    print("\n".join(format_training(run_training(args.size, args.steps, device=device,
                                                 threads=threads))), flush=True)
    if args.run:
        print("\n".join(format_default_run(run_default(args.size, threads=threads,
                                                       device=device, forward=args.forward))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
