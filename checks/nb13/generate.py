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
from .mistakes import (FIXED_SEED, GENERATOR_RESEEDED, SOFTMAX_OVER_BATCH, SOFTMAX_TWICE,
                       TEMPERATURE_MULTIPLIED, TEMPERATURE_NOT_APPLIED, TEMPERATURE_TWICE,
                       UNSTABLE_SOFTMAX)
from .mistakes import ROPE_BASE_FIXED
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
    ROPE_BASE_FIXED: dict(forward=_FORWARD_MISTAKES[ROPE_BASE_FIXED]),
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
    by a clear margin and the main mistakes would give other tokens (so none goes unnoticed, and
    none is taken for another)."""
    for _n in range(40):
        cfg = _cfg(c, kind)
        params = _params(c, cfg)
        prompt = c.randint(0, cfg.vocab_size, (batch, p))
        want = gen.generate(params, cfg, prompt, n)
        if n and _greedy_margin(params, cfg, want, p) < 1e-3:
            continue
        # The main mistakes give other tokens than the right ones and than one another (a
        # stuck start_pos and a top-left mask can agree, and then the first would be named).
        main = (NOT_ADVANCED, SKIPPED_SLOT, NO_OFFSET, UNROTATED_STORED, ROPE_BASE_FIXED,
                TOP_LEFT)
        if n > 1:
            outs = [want]
            for m in main:
                out = _sim_generate(params, cfg, prompt, n, **_GENERATE_MISTAKES[m])
                if any(torch.equal(out, o) for o in outs):
                    break
                outs.append(out)
            if len(outs) <= len(main):
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
    """temperature > 0: reproducible with the generator (with and without the cache), the
    generator really used, not greedy; the draws distributed as softmax(logits / T) at every step
    (with and without the cache); two calls with generator=None differ; huge logits sampled
    without overflow."""
    cfg, params, prompt, _want = _scenario(c, "gqa", 2, 3, 0)
    n = 8
    greedy = gen.generate(params, cfg, prompt, n)
    outs = []
    for attempt in range(3):
        use_cache = attempt != 1          # the second attempt without the cache
        label = "generate(..., temperature=1.5, generator=g{more})".format(
            more="" if use_cache else ", use_cache=False")
        seed = 1000 + attempt + c.randint(0, 10**6)
        runs = []
        for other in (11, 12):
            with torch.random.fork_rng():
                torch.manual_seed(other)     # the global RNG differs between the two runs
                g = torch.Generator().manual_seed(seed)
                runs.append(c.call(params, cfg, prompt, n, temperature=1.5, generator=g,
                                   use_cache=use_cache))
        a, b = runs
        _expect_tokens(c, a, greedy, prompt, cfg, label)
        if not torch.equal(a, b):
            c.fail(_("{call}: two runs with generators seeded alike gave different tokens.")
                   .format(call=label),
                   GENERATOR_IGNORED)
        outs.append(a)
    if all(torch.equal(o, greedy) for o in outs):
        c.fail(_("{call} gave the greedy tokens three times out of three.").format(
            call="generate(..., temperature=1.5, generator=g)"), TEMPERATURE_IGNORED)
    # The draws' distribution, with the cache at T = 2 and without it at T = 0.6 (T = 1 would
    # hide a temperature dropped or applied twice).
    for use_cache, temperature in ((True, 2.0), (False, 0.6)):
        _check_distribution(c, cfg, params, use_cache, temperature)
    _check_fresh_draws(c, cfg, params)
    _check_generator_moves_on(c, cfg, params)
    _check_huge_logits(c, cfg, params)


def _expect_tokens(c: Check, got, like: torch.Tensor, prompt: torch.Tensor, cfg,
                   label: str) -> None:
    """A LongTensor shaped like `like` that starts with the prompt, every id in the vocabulary."""
    if not isinstance(got, torch.Tensor) or got.shape != like.shape or got.dtype != torch.long:
        c.expect_tensor(got, like, what=label, dims=("B", "P + max_new_tokens"))
    if not torch.equal(got[:, :prompt.shape[1]], prompt):
        c.fail(_("{call} does not start with the prompt.").format(call=label))
    if int(got.min()) < 0 or int(got.max()) >= cfg.vocab_size:
        c.fail(_("{call} produced token ids outside 0 .. {last}.").format(
            call=label, last=cfg.vocab_size - 1))


# How the draws' log-probability may stray from its expectation (in standard deviations) before
# the check says they do not follow softmax(logits / T): a correct sampler strays this far about
# once in 10^9 checks. A named mistake must also explain the draws better by this many nats.
_Z_LIMIT = 6.0
_NATS = 12.0


def _sampling_variants(logits: torch.Tensor, temperature: float) -> dict:
    """log-probabilities [.., V] of the draws of each known sampling mistake."""
    t = temperature
    return {
        SOFTMAX_TWICE: torch.log_softmax(torch.softmax(logits / t, -1), -1),
        TEMPERATURE_TWICE: torch.log_softmax(logits / (t * t), -1),
        TEMPERATURE_NOT_APPLIED: torch.log_softmax(logits, -1),
        TEMPERATURE_MULTIPLIED: torch.log_softmax(logits * t, -1),
        # softmax over the rows of each step's [B, V] logits, renormalised per row by the sampler
        SOFTMAX_OVER_BATCH: torch.log_softmax(torch.log_softmax(logits / t, 0), -1),
    }


def _fit(logp: torch.Tensor, drawn: torch.Tensor) -> tuple[float, float]:
    """(the draws' total log-probability under `logp`, how far it is from what draws of `logp`
    itself would give, in standard deviations)."""
    ll = float(logp.gather(-1, drawn[..., None]).sum())
    mean = float((logp.exp() * logp).sum())
    return ll, (ll - mean) / _spread(logp)


def _check_distribution(c: Check, cfg, params, use_cache: bool, temperature: float) -> None:
    """Many sequences (random prompts), four new tokens each: every draw is scored under the
    model's own softmax(logits / T) given the tokens before it (the whole sequence re-run
    without the cache), so every step of the loop is tested, not only the first."""
    rows, p, n = 128, 3, 4
    prompt = c.randint(0, cfg.vocab_size, (rows, p))
    g = torch.Generator().manual_seed(c.randint(0, 10**6))
    label = (f"generate(params, cfg, prompt [B={rows}, P={p}], max_new_tokens={n}, "
             f"temperature={temperature}, generator=g{'' if use_cache else ', use_cache=False'})")
    got = c.call(params, cfg, prompt.clone(), n, temperature=temperature, generator=g,
                 use_cache=use_cache)
    _expect_tokens(c, got, torch.zeros(rows, p + n, dtype=torch.long), prompt, cfg, label)
    with torch.no_grad():
        logits = gen.full_forward(got[:, :-1], params, cfg)[:, p - 1:].double()
    drawn = got[:, p:]
    if torch.equal(drawn, logits.argmax(-1)):
        c.fail(_("{call} gave the greedy token in every one of its {count} draws.").format(
            call=label, count=rows * n), TEMPERATURE_IGNORED)
    right = torch.log_softmax(logits / temperature, -1)
    ll, z = _fit(right, drawn)
    fits = {m: _fit(lp, drawn) for m, lp in _sampling_variants(logits, temperature).items()}
    best, *others = sorted(fits, key=lambda m: -fits[m][0])
    if abs(z) <= _Z_LIMIT and fits[best][0] - ll < _NATS:
        return
    # Named only when that mistake explains the draws as well as draws of its own would, and
    # clearly better than the right distribution and every other mistake.
    lead = min([fits[best][0] - ll] + [fits[best][0] - fits[m][0] for m in others])
    hint = best if lead >= _NATS and abs(fits[best][1]) <= _Z_LIMIT else None
    draws = rows * n
    c.fail(_("{call}: the {count} sampled tokens do not follow softmax(logits / T) of the "
             "model's own logits: their mean log-probability under it is {got:.3f} per token, "
             "while draws from it average {want:.3f} ± {spread:.3f} ({z:+.1f} standard "
             "deviations).").format(
        call=label, count=draws, got=ll / draws, want=(ll - z * _spread(right)) / draws,
        spread=_spread(right) / draws, z=z), hint)


def _spread(logp: torch.Tensor) -> float:
    """The standard deviation of the total log-probability of one draw per row of `logp`."""
    p = logp.exp()
    mean = (p * logp).sum(-1)
    return math.sqrt(max(float(((p * logp.square()).sum(-1) - mean.square()).sum()), 1e-12))


def _check_fresh_draws(c: Check, cfg, params) -> None:
    """generator=None, called twice (the global random state moved on in between): the tokens
    differ (two alike would happen about once in 10^20 for a correct sampler)."""
    rows, p, n = 16, 3, 4
    prompt = c.randint(0, cfg.vocab_size, (rows, p))
    label = f"generate(params, cfg, prompt [B={rows}, P={p}], max_new_tokens={n}, " \
            "temperature=1.5)"
    runs = []
    with torch.random.fork_rng():
        torch.manual_seed(c.randint(0, 10**6))
        for _n in range(2):
            runs.append(c.call(params, cfg, prompt.clone(), n, temperature=1.5))
    for got in runs:
        _expect_tokens(c, got, torch.zeros(rows, p + n, dtype=torch.long), prompt, cfg, label)
    if torch.equal(*runs):
        c.fail(_("{call}, called twice without a generator, gave the same {count} tokens both "
                 "times.").format(call=label, count=rows * n), FIXED_SEED)


def _check_generator_moves_on(c: Check, cfg, params) -> None:
    """One generator, two calls in a row: the second goes on from where the first left the
    generator, so the tokens differ (about once in 10^20 alike for a correct sampler). A
    generate that re-seeds the generator (every step, or from its initial seed every call)
    starts both calls from the same seed and repeats itself."""
    rows, p, n = 16, 3, 4
    prompt = c.randint(0, cfg.vocab_size, (rows, p))
    g = torch.Generator().manual_seed(c.randint(0, 10**6))
    label = f"generate(params, cfg, prompt [B={rows}, P={p}], max_new_tokens={n}, " \
            "temperature=1.5, generator=g)"
    runs = [c.call(params, cfg, prompt.clone(), n, temperature=1.5, generator=g)
            for _n in range(2)]
    for got in runs:
        _expect_tokens(c, got, torch.zeros(rows, p + n, dtype=torch.long), prompt, cfg, label)
    if torch.equal(*runs):
        c.fail(_("{call}, called twice with the same generator g, gave the same {count} tokens "
                 "both times.").format(call=label, count=rows * n), GENERATOR_RESEEDED)


def _check_huge_logits(c: Check, cfg, params) -> None:
    """An LM head 300 times larger: logits in the hundreds, whose exp overflows float32 unless
    the row's maximum is subtracted first. Where the best logit leads by more than 40·T, the
    draw is (all but surely: e^-40) the greedy token."""
    big = {**params, "lm_head": params["lm_head"] * 300}
    rows, p, n, t = 4, 3, 3, 1.5
    prompt = c.randint(0, cfg.vocab_size, (rows, p))
    label = (f"generate(params with logits in the hundreds, cfg, prompt [B={rows}, P={p}], "
             f"max_new_tokens={n}, temperature={t}, generator=g)")
    saved = c.errors
    c.errors = saved + (UNSTABLE_SOFTMAX,)
    try:
        got = c.call(big, cfg, prompt.clone(), n, temperature=t,
                     generator=torch.Generator().manual_seed(c.randint(0, 10**6)))
    finally:
        c.errors = saved
    _expect_tokens(c, got, torch.zeros(rows, p + n, dtype=torch.long), prompt, cfg, label)
    with torch.no_grad():
        logits = gen.full_forward(got[:, :-1], big, cfg)[:, p - 1:]
    top = logits.topk(2, dim=-1)
    sure = (top.values[..., 0] - top.values[..., 1]) > 40 * t
    wrong = sure & (got[:, p:] != top.indices[..., 0])
    if wrong.any():
        row, step = (int(i) for i in wrong.nonzero()[0])
        overflows = float(logits.abs().max()) / t > 88
        c.fail(_("{call}: new token {step} of sequence {row} is {got}, while token {want}'s logit "
                 "leads every other by more than 40·T (it is drawn with probability above "
                 "1 - e^-40).").format(call=label, step=step, row=row,
                                       got=int(got[row, p + step]),
                                       want=int(top.indices[row, step, 0])),
               UNSTABLE_SOFTMAX if overflows else None)
