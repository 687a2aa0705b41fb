"""Chapter 16's measurement: speculative decoding against plain greedy generation, on tasks where
prompt lookup pays (the answer copies a passage of the prompt) and where it does not (open chat).

One function measures (`measure`), one prints (`format_table`), one draws (`plot`); the chapter
calls them with the learner's own `generate` and `speculative_generate`, and
`python -m checks.tools.benchmark --only speculative` and `python -m checks.gpu_check` with the
course's. Each row: the task, the draft, k, the acceptance rate (guesses kept / guesses made),
new tokens per forward pass, the seconds of both, the speed-up, and whether the tokens are
identical (they must be: greedy speculative decoding changes nothing but the time).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable

import torch

PASSAGE = ("The lighthouse keeper climbed the narrow stairs every evening at dusk. He wiped the "
           "salt from the great lens, trimmed the wick, and lit the lamp that warned ships away "
           "from the rocks. For thirty years he never missed a night, even when storms shook the "
           "tower and the sea rose over the lower windows.")

# name: (the user's message, whether the answer is expected to copy the prompt)
TASKS: dict[str, tuple[str, bool]] = {
    "quote": ("Repeat the following passage exactly, word for word:\n\n" + PASSAGE, True),
    "edit": ("Correct the spelling in this passage and change nothing else:\n\n"
             + PASSAGE.replace("climbed", "climbd").replace("windows", "windowes"), True),
    "chat": ("Write a short poem about autumn leaves.", False),
}


def _timed(fn: Callable[[], object], sync: Callable[[], None] | None) -> tuple[object, float]:
    if sync is not None:
        sync()
    start = time.perf_counter()
    out = fn()
    if sync is not None:
        sync()
    return out, time.perf_counter() - start


def measure(params: dict, cfg, prompt_ids: torch.Tensor, max_new_tokens: int, *,
            drafts: dict[str, Callable], ks: Iterable[int], generate: Callable,
            speculative_generate: Callable, task: str = "",
            sync: Callable[[], None] | None = None) -> list[dict]:
    """One row per (draft, k): speculative_generate against generate on the same prompt."""
    with torch.no_grad():
        generate(params, cfg, prompt_ids, 2)                    # warm-up (allocations, kernels)
        want, plain = _timed(lambda: generate(params, cfg, prompt_ids, max_new_tokens), sync)
    rows = []
    for name, draft in drafts.items():
        for k in ks:
            (got, stats), seconds = _timed(lambda k=k, draft=draft: speculative_generate(
                params, cfg, prompt_ids, max_new_tokens, draft, k=k), sync)
            rows.append({
                "task": task, "draft": name, "k": k,
                "acceptance": stats["accepted"] / stats["drafted"] if stats["drafted"] else 0.0,
                "tokens_per_forward": max_new_tokens / max(stats["forwards"], 1),
                "seconds": seconds, "plain_seconds": plain, "speedup": plain / seconds,
                "identical": bool(torch.equal(got.cpu(), want.cpu())),
            })
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'task':<6} {'draft':<12} {'k':>2} {'accepted':>9} {'tok/fwd':>8} "
             f"{'plain s':>8} {'spec s':>7} {'speed-up':>8} identical"]
    for r in rows:
        lines.append(f"{r['task']:<6} {r['draft']:<12} {r['k']:>2} {r['acceptance']:>8.0%} "
                     f"{r['tokens_per_forward']:>8.2f} {r['plain_seconds']:>8.2f} "
                     f"{r['seconds']:>7.2f} {r['speedup']:>7.2f}x {r['identical']}")
    return "\n".join(lines)


def plot(rows: list[dict], *, draft: str = "lookup"):
    """Acceptance, tokens per forward pass and speed-up against k, one line per task."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    tasks = list(dict.fromkeys(r["task"] for r in rows if r["draft"] == draft))
    for task in tasks:
        mine = sorted((r for r in rows if r["task"] == task and r["draft"] == draft),
                      key=lambda r: r["k"])
        ks = [r["k"] for r in mine]
        for ax, key in zip(axes, ("acceptance", "tokens_per_forward", "speedup")):
            ax.plot(ks, [r[key] for r in mine], marker="o", label=task)
    for ax, title in zip(axes, ("acceptance rate", "new tokens per forward pass",
                                "speed-up over generate")):
        ax.set_xlabel("k (guesses per round)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[2].axhline(1.0, color="grey", lw=0.8)
    axes[0].legend()
    fig.tight_layout()
    return fig


def lookup(lookup_draft: Callable, max_ngram: int = 3) -> Callable:
    """The draft `speculative_generate` calls: `draft(tokens, k)` by prompt lookup."""
    return functools.partial(lookup_draft, max_ngram=max_ngram)


def early_exit(early_exit_draft: Callable, params: dict, cfg, n_layers: int) -> Callable:
    """The draft `speculative_generate` calls: the first `n_layers` blocks, greedy."""
    def draft(tokens, k):
        return early_exit_draft(params, cfg, tokens.to(params["embed"].device), k,
                                n_layers=n_layers)
    return draft


def run_smollm(*, quick: bool = False, device: str = "cpu", say=lambda text: None) -> dict:
    """The chapter's table with the course's functions (the reference's `generate` and
    `speculative_generate`) on SmolLM2-135M-Instruct: every task with prompt lookup at
    k = 2, 4, 8 and 64 new tokens (`quick`: k = 2, 4 tokens), and the first 8 blocks as an
    early-exit draft on the quote task. {"missing": why} when the model is not installed.
    The benchmark's section `speculative` and `python -m checks.gpu_check` print it."""
    from . import smollm
    from .reference import generation as gen
    from .reference import speculative as spec

    if not smollm.available():
        return {"missing": str(smollm.ModelUnavailable())}
    new_tokens, ks = (4, (2,)) if quick else (64, (2, 4, 8))
    say("SmolLM2-135M-Instruct: speculative decoding")
    params, cfg = smollm.load(device=device)
    tok = smollm.tokenizer()
    sync = torch.cuda.synchronize if device == "cuda" else None
    common = {"generate": gen.generate, "speculative_generate": spec.speculative_generate,
              "sync": sync}
    rows = []
    for task, (message, _copies) in TASKS.items():
        say(f"speculative decoding: {task}")
        prompt = torch.tensor([tok.chat_prompt(message)], device=device)
        rows += measure(params, cfg, prompt, new_tokens, ks=ks, task=task,
                        drafts={"lookup": lookup(spec.lookup_draft)}, **common)
    first = min(8, cfg.n_layers - 1)
    prompt = torch.tensor([tok.chat_prompt(TASKS["quote"][0])], device=device)
    rows += measure(params, cfg, prompt, min(new_tokens, 16), ks=(2,), task="quote",
                    drafts={f"first {first}": early_exit(spec.early_exit_draft, params, cfg,
                                                         first)}, **common)
    return {"device": device, "new_tokens": new_tokens, "rows": rows}


def format_section(section: dict) -> list[str]:
    """`run_smollm`'s result as lines."""
    if "missing" in section:
        return [f"skipped: {section['missing']}"]
    return [f"{section['new_tokens']} new tokens on {section['device']}",
            format_table(section["rows"])]
