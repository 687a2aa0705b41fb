"""The internals of chapter 13's check of generate (the check itself is in checks.nb13): the
counting embedding table's log, greedy generation with one known mistake each, scenarios whose
greedy choices win by a clear margin, and what the forward calls must look like with and without
the cache.
"""

from __future__ import annotations

import math

import torch


from ..engine import Check
from ..i18n import _
from .cache import _FORWARD_MISTAKES, _cfg, _params, _sim_forward
from .mistakes import (EMBED_NOT_SEEN, FIRST_POSITION, GENERATOR_IGNORED, IGNORED_CACHE,
                            NEW_TOKENS_ONLY, NOT_ADVANCED, NO_OFFSET, ONE_TOO_FEW, ONE_TOO_MANY,
                            PREFILL_BY_TOKEN, RECOMPUTED, SKIPPED_SLOT, TEMPERATURE_IGNORED,
                            TOP_LEFT, UNCACHED_USES_CACHE, UNROTATED_STORED, WASTED_FORWARD,
                            WASTED_FORWARD_UNCACHED)
from ..reference import generation as gen


class _Recorder:
    """A callable log. A checks object, so it stays in the grading process when the learner's
    code runs in a worker (each call comes back as a callback)."""

    def __init__(self):
        self.items: list = []

    def __call__(self, item) -> None:
        self.items.append(item)


_GENERATE_MISTAKES = {
    NOT_ADVANCED: dict(advance=0),
    SKIPPED_SLOT: dict(advance=2),
    FIRST_POSITION: dict(first=True),
    NO_OFFSET: dict(forward=_FORWARD_MISTAKES[NO_OFFSET]),
    TOP_LEFT: dict(forward=_FORWARD_MISTAKES[TOP_LEFT]),
    UNROTATED_STORED: dict(forward=_FORWARD_MISTAKES[UNROTATED_STORED]),
    IGNORED_CACHE: dict(forward=_FORWARD_MISTAKES[IGNORED_CACHE]),
}


def _sim_generate(params, cfg, prompt, n, *, advance=1, first=False, forward=None):
    """Greedy generation with the named mistake (advance: how far start_pos moves per step,
    0 = stuck at P, 2 = one slot too far; first: next token from position 0 after prefill)."""
    forward = forward or {}
    b, p = prompt.shape
    out = torch.cat([prompt, torch.zeros(b, n, dtype=torch.long)], dim=1)
    cache = gen.KVCache(cfg, b, p + 2 * n + 1)
    with torch.no_grad():
        logits = _sim_forward(prompt, params, cfg, cache, 0, **forward)
        row = logits[:, 0] if first else logits[:, -1]
        for step in range(n):
            out[:, p + step] = row.argmax(-1)
            if step + 1 < n:
                start = p + (step if advance == 1 else 0 if advance == 0 else step + 1)
                row = _sim_forward(out[:, p + step:p + step + 1], params, cfg, cache, start,
                                   **forward)[:, -1]
    return out


def _greedy_margin(params, cfg, seq: torch.Tensor, p: int) -> float:
    """The smallest gap between the best and second-best logit over the greedy choices."""
    with torch.no_grad():
        logits = gen.full_forward(seq, params, cfg)[:, p - 1:-1]
    top = logits.topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min()) if top.numel() else math.inf


def _scenario(c: Check, kind: str, batch: int, p: int, n: int):
    """cfg, params, prompt and the reference's greedy output, drawn until every greedy choice wins
    by a clear margin and the main mistakes would give other tokens (so none goes unnoticed)."""
    for _n in range(40):
        cfg = _cfg(c, kind)
        params = _params(c, cfg)
        prompt = c.randint(0, cfg.vocab_size, (batch, p))
        want = gen.generate(params, cfg, prompt, n)
        if n and _greedy_margin(params, cfg, want, p) < 1e-3:
            continue
        main = (NOT_ADVANCED, SKIPPED_SLOT, NO_OFFSET, UNROTATED_STORED)
        if n > 1 and any(torch.equal(_sim_generate(params, cfg, prompt, n,
                                                   **_GENERATE_MISTAKES[m]), want) for m in main):
            continue
        return cfg, params, prompt, want
    return cfg, params, prompt, want


def _generate_mixups(params, cfg, prompt, n, want) -> dict:
    mixups = {m: (lambda kw=kw: _sim_generate(params, cfg, prompt, n, **kw))
              for m, kw in _GENERATE_MISTAKES.items()}
    p = prompt.shape[1]
    mixups[NEW_TOKENS_ONLY] = want[:, p:]
    mixups[ONE_TOO_MANY] = lambda: gen.generate(params, cfg, prompt, n + 1)
    mixups[ONE_TOO_FEW] = lambda: gen.generate(params, cfg, prompt, max(n - 1, 0))
    return mixups


def _check_steps(c: Check, log: list[int], batch: int, p: int, n: int, label: str) -> None:
    """With the cache: one prefill call over the prompt, then exactly `batch` tokens per call."""
    if not log:
        c.fail(_("{call}: the check saw no token embeddings being read from params['embed'].")
               .format(call=label),
               EMBED_NOT_SEEN)
    shown = ", ".join(map(str, log[:8])) + (", ..." if len(log) > 8 else "")
    seen = _("tokens looked up per forward call: {counts}").format(counts=f"[{shown}]")
    first, rest = log[0], log[1:]
    if first < batch * (p - 1):
        hint = PREFILL_BY_TOKEN if first == batch else None
        c.fail(_("{call}: the first forward call fed {count} tokens; the prefill feeds the whole "
                 "prompt, B·P = {b}·{p} = {total} ({seen}).").format(
            call=label, count=first, b=batch, p=p, total=batch * p, seen=seen), hint)
    if first > batch * p:
        c.fail(_("{call}: the first forward call fed {count} tokens, more than the prompt's "
                 "B·P = {total} ({seen}).").format(call=label, count=first, total=batch * p,
                                                   seen=seen))
    over = [(i, m) for i, m in enumerate(rest, 1) if m != batch]
    if over:
        i, m = over[0]
        grows = len(rest) > 1 and all(b > a for a, b in zip(rest, rest[1:]))
        c.fail(_("{call}: decode call {i} fed {count} tokens; with the cache each decode step "
                 "feeds exactly one new token per sequence, B = {b} ({seen}).").format(
            call=label, i=i, count=m, b=batch, seen=seen),
               RECOMPUTED if grows or m >= batch * p else None)
    steps = len(rest) - (first == batch * (p - 1) != batch * p)   # fed the last prompt token late
    if steps != n - 1 and n > 0:
        c.fail(_("{call}: {calls} forward calls for {n} new tokens ({seen}); expected the "
                 "prefill and then {steps} decode steps (the last new token is never fed back).")
               .format(call=label, calls=len(log), n=n, seen=seen, steps=n - 1),
               WASTED_FORWARD if steps == n else None)


def _check_uncached_calls(c: Check, log: list[int], batch: int, p: int, n: int,
                          label: str) -> None:
    """Without the cache: one forward pass per new token over the whole sequence so far (B·P,
    B·(P + 1), ... tokens looked up), none after the last."""
    shown = ", ".join(map(str, log[:8])) + (", ..." if len(log) > 8 else "")
    if len(log) > n:
        c.fail(_("{call}: {calls} forward calls for {n} new tokens (tokens looked up per call: "
                 "{counts}); expected {n}, one per new token.").format(
            call=label, calls=len(log), n=n, counts=f"[{shown}]"),
               WASTED_FORWARD_UNCACHED if len(log) == n + 1 else None)
    want = [batch * (p + i) for i in range(n)]
    if log == want:
        return
    if not log:
        c.fail(_("{call}: the check saw no token embeddings being read from params['embed'].")
               .format(call=label), EMBED_NOT_SEEN)
    cached = len(log) > 1 and log[0] >= batch * (p - 1) and all(m == batch for m in log[1:])
    expected = ", ".join(map(str, want[:8])) + (", ..." if len(want) > 8 else "")
    c.fail(_("{call}: tokens looked up per forward call: {counts}; without the cache every step "
             "runs the whole sequence so far, B·(P + t) tokens at step t: expected "
             "{want}.").format(call=label, counts=f"[{shown}]", want=f"[{expected}]"),
           UNCACHED_USES_CACHE if cached else None)


def _check_sampling(c: Check) -> None:
    """temperature > 0: reproducible with the generator, the generator really used, not greedy."""
    cfg, params, prompt, _want = _scenario(c, "gqa", 2, 3, 0)
    n = 8
    greedy = gen.generate(params, cfg, prompt, n)
    label = "generate(..., temperature=1.5, generator=g)"
    outs = []
    for attempt in range(3):
        seed = 1000 + attempt + c.randint(0, 10**6)
        runs = []
        for other in (11, 12):
            with torch.random.fork_rng():
                torch.manual_seed(other)     # the global RNG differs between the two runs
                g = torch.Generator().manual_seed(seed)
                runs.append(c.call(params, cfg, prompt, n, temperature=1.5, generator=g))
        a, b = runs
        if not isinstance(a, torch.Tensor) or a.shape != greedy.shape or a.dtype != torch.long:
            c.expect_tensor(a, greedy, what=label, dims=("B", "P + max_new_tokens"))
        if not torch.equal(a[:, :prompt.shape[1]], prompt):
            c.fail(_("{call} does not start with the prompt.").format(call=label))
        if int(a.min()) < 0 or int(a.max()) >= cfg.vocab_size:
            c.fail(_("{call} produced token ids outside 0 .. {last}.").format(
                call=label, last=cfg.vocab_size - 1))
        if not torch.equal(a, b):
            c.fail(_("{call}: two runs with generators seeded alike gave different tokens.")
                   .format(call=label),
                   GENERATOR_IGNORED)
        outs.append(a)
    if all(torch.equal(o, greedy) for o in outs):
        c.fail(_("{call} gave the greedy tokens three times out of three.").format(call=label),
               TEMPERATURE_IGNORED)


