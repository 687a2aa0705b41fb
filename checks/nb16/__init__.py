"""Checks for chapter 16: speculative decoding (guess ahead, verify in one forward pass).

The rules the checks hold the learner to are the reference's (`checks.reference.speculative`,
whose docstring states them exactly).

How the checks look inside:
- `lookup_draft`: fixed sequences in which every known mistake gives another draft than the rule
  (the earliest against the latest occurrence, a 2-gram that matches where the 3-gram does not
  and a 1-gram that matches elsewhere, a continuation cut short by the end, k = 0, no match), their
  token ids relabelled at random, then random sequences over a small vocabulary (many matches).
- `early_exit_draft`: small random models (chapter 13's scales, sizes never tied together) of 3
  or 4 blocks, drawn until every greedy choice of the shallow model wins by a clear margin; the
  wrong variants are the same greedy loop on other blocks.
- `verify_draft`: a context is prefilled into the course's cache, then stale keys are written past
  it (a rejected round before); the draft is built token by token with a chosen pattern of
  matches (the model's own choice) and mismatches (its second choice), so that a guess after a
  mismatch can still equal the model's choice there. The cache handed over records every write:
  exactly one forward pass of the last token and the k guesses at start_pos.
- `speculative_generate`: the draft is an oracle with chosen wrong positions (it proposes the
  model's greedy continuation but for those), so every round's acceptance is known. The tokens
  must equal the reference's greedy `generate`; the recorded forward passes (start_pos, T) must be
  the prefill and then one per round, with the next round's last token right after the accepted
  ones. Each mistake is the loop simulated with one rule changed (positions not rolled back, off
  by one after a rejection, the draft not capped), and named when its tokens or its forward passes
  are the learner's.
- `accept_sampled`: certain cases first (p >= q at every guess: all accepted plus a bonus; q = 0
  at a guess with p > 0: accepted, no division by zero; p = 0 at the guess: rejected, and the
  replacement is in the residual's support, which tells resampling from p or from q - p at once;
  the generator makes runs repeat). Then a statistical test: 400 rounds with guesses drawn from
  q; the first output token must follow p[0], the second (after an acceptance) p[1] and the bonus
  (after all k accepted) p[k], each by Pearson's chi-square test at a p-value of 1e-6 (four tests:
  a correct sampler fails the check about 4 times in a million seeds; the seeds are fixed, so a
  given seed always gives the same verdict). A failure names the wrong rule whose distribution
  explains the counts 12 nats better than the right one.
- Every check runs on one CPU thread (`checks.context.one_thread`).
"""

from __future__ import annotations

import torch

from ..context import one_thread as _one_thread
from ..engine import Check, CheckFailure, builds_on
from ..i18n import N_, _
from ..mistakes import fix_first
from ..reference import generation as gen
from ..reference import speculative as spec
from . import mistakes as _m

OWN_WORK = N_("this exercise asks you to write it yourself, not to call checks.reference.{name}")


# --------------------------------------------------------------------------------------------
# Exercise 1: lookup_draft


def _lookup_cases(c: Check, thorough: bool) -> list[tuple[list[int], int, int | None]]:
    """(tokens, k, max_ngram or None for the default): fixed cases that tell the mistakes apart,
    relabelled, then random ones."""
    fixed = [
        ([5, 1, 2, 3, 7, 8, 1, 2, 3, 9, 4, 1, 2, 3], 2, 3),   # earliest vs latest, k cuts it
        ([3, 1, 8, 2, 1, 6, 2, 1], 2, 3),                       # 2-gram matches, 1-gram elsewhere
        ([1, 2, 3, 1, 2], 5, None),                             # the continuation runs out
        ([4, 6, 9, 1, 4, 6, 9, 2, 5, 4, 6, 9], 3, None),        # default max_ngram = 3
        ([1, 2, 3, 4], 3, 3),                                   # no match at all
        ([7], 3, 3),                                            # one token: nothing before it
        ([2, 5, 2, 5, 2], 0, 2),                                # k = 0
        ([6, 3, 6, 3, 1, 6, 3], 4, 1),                          # max_ngram = 1
    ]
    relabel = torch.randperm(10, generator=c.gen).tolist()
    cases = [([relabel[t] for t in tokens], k, n) for tokens, k, n in fixed]
    for _n in range(6 if thorough else 3):
        vocab = c.randint(3, 6)
        tokens = c.randint(0, vocab, (c.randint(8, 30),)).tolist()
        cases.append((tokens, c.randint(1, 7), c.randint(1, 5)))
    return cases


@_one_thread
def check_lookup_draft(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .sims import lookup_variant

    with Check("lookup_draft", f, seed=seed) as c:
        c.forbid_functions([spec.lookup_draft], _(OWN_WORK))
        for tokens, k, max_ngram in _lookup_cases(c, thorough):
            ids = torch.tensor(tokens, dtype=torch.long)
            n = 3 if max_ngram is None else max_ngram
            want = spec.lookup_draft(ids, k, max_ngram=n)
            if max_ngram is None:
                got = c.call(ids.clone(), k)
                call = f"lookup_draft(tensor({tokens}), k={k})"
            else:
                got = c.call(ids.clone(), k, max_ngram=n)
                call = f"lookup_draft(tensor({tokens}), k={k}, max_ngram={n})"
            if isinstance(got, (list, tuple)) or (isinstance(got, torch.Tensor) and (
                    got.dtype != torch.long or got.dim() != 1)):
                c.fail(_("{call} returned {got}; expected a 1-D LongTensor.").format(
                    call=call, got=repr(got)), _m.NOT_LONG_TENSOR)

            def variant(**rule):
                return lambda: lookup_variant(ids, k, n, **rule)

            c.expect_tensor(got, want, what=call, dims=("draft",), wrong={
                _m.MORE_THAN_K: variant(extra=1),
                _m.LATEST_MATCH: variant(latest=True),
                _m.NO_SHORTER_NGRAM: variant(only_longest=True),   # or the n-gram matched itself
                _m.SHORTEST_FIRST: variant(shortest_first=True),
                _m.STARTS_INSIDE_MATCH: variant(shift=-1),
            })
        c.headline(_("the tokens after the earliest earlier occurrence of the last n-gram, at "
                     "most k"))
        c.headline(_("n from max_ngram down to 1; never the last n-gram itself; empty when "
                     "nothing matches"))


# --------------------------------------------------------------------------------------------
# Exercise 2: early_exit_draft


@_one_thread
def check_early_exit_draft(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .sims import _margin, greedy, logits_of, model, shallow

    with Check("early_exit_draft", f, seed=seed) as c:
        c.forbid_functions([spec.early_exit_draft], _(OWN_WORK))
        kinds = ["gqa", "mqa"] + (["mha", "gqa"] if thorough else [])
        for kind in kinds:
            for _n in range(40):
                cfg, params = model(c, kind, n_layers=c.randint(3, 5))
                keep = c.randint(1, cfg.n_layers - 1)      # one block more is not the whole model
                s, k = c.randint(3, 9), c.randint(2, 6)
                tokens = c.randint(0, cfg.vocab_size, (s,))
                small, small_cfg = shallow(params, cfg, list(range(keep)))
                want_seq = greedy(small, small_cfg, tokens, k)
                if _margin(logits_of(small, small_cfg, want_seq)[s - 1:-1]) > 1e-3:
                    break
            want = want_seq[s:]
            layers = cfg.n_layers

            def on(blocks):
                return lambda: greedy(*shallow(params, cfg, blocks), tokens, k)[s:]

            call = (f"early_exit_draft(params, cfg [L={layers}], tokens [S={s}], k={k}, "
                    f"n_layers={keep})")
            got = c.call(params, cfg, tokens.clone(), k, n_layers=keep)
            c.expect_tensor(got, want, what=call, dims=("k",), wrong={
                _m.RETURNS_CONTEXT: lambda: want_seq,
                _m.LAST_LAYERS: on(list(range(layers - keep, layers))),
                _m.WHOLE_MODEL: on(list(range(layers))),
                _m.LAYERS_OFF_BY_ONE: on(list(range(keep + 1))),
            })
        c.headline(_("k greedy tokens of the first n_layers blocks, with the model's final norm "
                     "and LM head"))


# --------------------------------------------------------------------------------------------
# Exercise 3: verify_draft


def _verify_patterns(c: Check, thorough: bool) -> list[list[bool]]:
    # First a case that tells the mistakes apart: two guesses kept, a miss, a guess that matches
    # again after it (so accepting past the miss shows, and no bonus gives two tokens, not one).
    patterns = [[True, True, False, True], [True, True, True], [False, True], []]
    for _n in range(3 if thorough else 1):
        patterns.append([bool(c.randint(0, 4)) for _i in range(c.randint(1, 6))])
    return patterns


@_one_thread
def check_verify_draft(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .sims import _Handle, _margin, _SpyCache, draft_with_pattern, model, verify_variants

    with Check("verify_draft", f, seed=seed) as c:
        c.forbid_functions([spec.verify_draft, spec.speculative_generate], _(OWN_WORK))
        for i, pattern in enumerate(_verify_patterns(c, thorough)):
            kind = ["gqa", "mqa", "mha"][i % 3]
            for _n in range(40):
                cfg, params = model(c, kind)
                s = c.randint(3, 8)
                context = c.randint(0, cfg.vocab_size, (s,))
                last = c.randint(0, cfg.vocab_size)
                draft, logits = draft_with_pattern(params, cfg, context, last, pattern)
                if _margin(logits) > 1e-3:
                    break
            choices = logits.argmax(-1)
            k = len(pattern)
            m = next((j for j, keep in enumerate(pattern) if not keep), k)
            want = torch.cat([draft[:m], choices[m:m + 1]])
            stale = c.randint(1, 4)
            s_max = s + k + 1 + stale
            cache = _SpyCache(cfg, s_max)
            cache.recording = False
            with torch.no_grad():
                # The context is cached; past it lie the keys of a round that was rejected.
                gen.forward_with_cache(context[None], params, cfg, cache, 0)
                junk = c.randint(0, cfg.vocab_size, (1, min(stale + k, s_max - s)))
                gen.forward_with_cache(junk, params, cfg, cache, s)
            cache.recording = True
            call = (f"verify_draft(params, cfg, cache, last_token={last}, "
                    f"draft={draft.tolist()}, start_pos={s})")
            got = c.call(params, cfg, _Handle(cache), last, draft.clone(), s)
            forwards = cache.forwards()
            if not forwards:
                c.fail(_("{call} wrote nothing into the cache it was given: run "
                         "forward_with_cache(..., cache, start_pos) on it.").format(call=call))
            if len(forwards) > 1:
                c.fail(_("{call} ran {n} forward passes (start_pos, T): {calls}; expected one, "
                         "{want}.").format(call=call, n=len(forwards), calls=forwards,
                                           want=[(s, k + 1)]), _m.ONE_FORWARD_PER_TOKEN)
            start, t = forwards[0]
            if (start, t) != (s, k + 1):
                hint = _m.LAST_NOT_FED if t == k else \
                    _m.FED_AT_WRONG_POSITION if t == k + 1 else None
                c.fail(_("{call} fed T={t} tokens at start_pos={start}; expected T={want_t} "
                         "(the last token and the {k} guesses) at start_pos={s}.").format(
                    call=call, t=t, start=start, want_t=k + 1, k=k, s=s), hint)
            wrong = verify_variants(draft, choices)
            c.expect_tensor(got, want, what=call, dims=("m + 1",), wrong={
                _m.NO_BONUS: wrong["no_bonus"],
                _m.PAST_MISMATCH: wrong["past_mismatch"],
                _m.BONUS_FROM_LAST: wrong["bonus_from_last"],
                _m.COMPARES_SHIFTED: wrong["shifted"],
            })
        c.headline(_("one forward pass over the last token and the guesses, at start_pos"))
        c.headline(_("the longest prefix greedy decoding would have produced, then the model's "
                     "own next token"))


# --------------------------------------------------------------------------------------------
# Exercise 4: speculative_generate


def _generate_plans(c: Check, thorough: bool) -> list[tuple]:
    """(kind, P, n, k, cap of the draft or None)."""
    plans = [("gqa", c.randint(3, 7), c.randint(10, 14), 3, None),
             ("mqa", c.randint(2, 6), c.randint(7, 11), c.randint(4, 6), 2),
             ("mha", c.randint(2, 5), c.randint(4, 7), 0, None)]
    for _n in range(2 if thorough else 0):
        plans.append((c.choice(["gqa", "mqa"]), c.randint(2, 8), c.randint(3, 15),
                       c.randint(1, 6), c.choice([None, 1, 3])))
    return plans


@_one_thread
def check_speculative_generate(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .sims import (_Handle, _margin, _SpyCache, OracleDraft, greedy, logits_of, model,
                       simulate)

    earlier = {"verify_draft": check_verify_draft}
    with builds_on("speculative_generate", earlier), Check("speculative_generate", f,
                                                              seed=seed) as c:
        c.forbid_functions([spec.speculative_generate, spec.verify_draft], _(OWN_WORK))
        plans = _generate_plans(c, thorough)
        for kind, p, n, k, cap in plans:
            for _n in range(40):
                cfg, params = model(c, kind, max_seq_len=256)
                prompt = c.randint(0, cfg.vocab_size, (1, p))
                truth = greedy(params, cfg, prompt, n + k + 2)
                if _margin(logits_of(params, cfg, truth)[p - 1:-1]) > 1e-3:
                    break
            wrong = {p + 1 + int(j) for j in torch.randperm(max(n - 1, 1), generator=c.gen)[
                :max(1, n // 3)]}
            s_max = p + n + (n + 1) * (k + 1)
            _check_one_generation(c, params, cfg, prompt, n, k,
                                  OracleDraft(truth, wrong, cfg.vocab_size, cap,
                                              **_runaway_guard(c, n)),
                                  s_max, simulate, _SpyCache, _Handle)
        c.headline(_("the same tokens as greedy generate, whatever the guesses and k"))
        c.headline(_("one prefill, then one forward pass per round, the next one right after "
                     "the accepted tokens (the rejected ones rolled back)"))
        # Nothing to make; a single token (the prefill alone); three tokens with k = 3 (the last
        # round has room for one guess).
        kind, p, n, k, cap = plans[0]
        for _n in range(40):
            cfg, params = model(c, "gqa", max_seq_len=256)
            prompt = c.randint(0, cfg.vocab_size, (1, p))
            truth = greedy(params, cfg, prompt, 6)
            if _margin(logits_of(params, cfg, truth)[p - 1:-1]) > 1e-3:
                break
        for n in (0, 1, 3):
            _check_one_generation(c, params, cfg, prompt, n, 3,
                                  OracleDraft(truth, set(), cfg.vocab_size,
                                              **_runaway_guard(c, n)),
                                  p + 8, simulate, _SpyCache, _Handle)
        c.headline(_("max_new_tokens = 0, 1 and 3; the statistics counted"))


def _runaway_guard(c: Check, n: int) -> dict:
    """Stops a loop whose rounds add no token: every round asks the draft once and adds at least
    one token, so n new tokens need fewer than n rounds after the prefill."""
    def runaway():
        return CheckFailure("speculative_generate", _(
            "asked the draft for guesses more than {calls} times for {n} new tokens: some round "
            "added no token, and the loop would never end.").format(calls=n + 1, n=n),
            hint=_m.NO_PROGRESS, seed=c.seed)
    return {"max_calls": n + 1, "runaway": runaway}


def _check_one_generation(c: Check, params, cfg, prompt, n, k, draft, s_max, simulate,
                          spy_cache, handle) -> None:
    p = prompt.shape[1]
    want, want_stats, want_calls = simulate(params, cfg, prompt, n, draft, k, s_max)
    cache = spy_cache(cfg, s_max)
    call = (f"speculative_generate(params, cfg, prompt [1, P={p}], max_new_tokens={n}, draft, "
            f"k={k}, cache=cache)")
    draft.arm(True)
    try:
        got = c.call(params, cfg, prompt, n, draft, k=k, cache=handle(cache))
    finally:
        draft.arm(False)
    if not (isinstance(got, tuple) and len(got) == 2):
        c.fail(_("{call} returned {got}; expected a pair (tokens, stats).").format(
            call=call, got=type(got).__name__))
    tokens, stats = got
    variants = {}

    def sim(**rule):
        def run():
            return simulate(params, cfg, prompt, n, draft, k, s_max, **rule)
        return run

    rules = {_m.NOT_ROLLED_BACK: [sim(advance="not_rolled_back")],
             _m.POSITIONS_OFF_BY_ONE: [sim(offset=1), sim(offset=-1),
                                       sim(advance="minus_always"),
                                       sim(advance="plus_always"),
                                       sim(advance="minus_after_rejection"),
                                       sim(advance="plus_after_rejection")],
             _m.DRAFT_NOT_CAPPED: [sim(capped=False)]}

    def explained(what_of, got_value):
        """The first mistake one of whose simulations gives `got_value` (a list or tensor)."""
        for mistake, runs in rules.items():
            for run in runs:
                try:
                    value = what_of(run())
                except (ValueError, RuntimeError):
                    continue
                same = torch.equal(value, got_value) if isinstance(value, torch.Tensor) \
                    else value == got_value
                if same:
                    return mistake
        return None

    if n > 0 and not cache.calls:
        c.fail(_("{call} wrote nothing into the cache it was given.").format(call=call),
               _m.IGNORES_CACHE_ARG)
    forwards = cache.forwards()
    if isinstance(tokens, torch.Tensor) and tokens.shape == want.shape and \
            tokens.dtype == want.dtype and not torch.equal(tokens, want):
        variants = {mistake: (lambda got_tokens=tokens: got_tokens)
                    for mistake in [explained(lambda r: r[0], tokens)] if mistake is not None}
    c.expect_tensor(tokens, want, what=_("{call}: the tokens").format(call=call),
                    dims=("B", "P + max_new_tokens"), wrong=variants)
    if forwards != want_calls:
        hint = explained(lambda r: r[2], forwards)
        if hint is None:
            if forwards and forwards[0] != (0, p):
                hint = _m.PREFILL_MISSING
            elif forwards[:-1] == want_calls:
                hint = _m.FORWARD_AFTER_LAST
        c.fail(_("{call} ran the forward passes (start_pos, T) {got}; expected {want}.").format(
            call=call, got=forwards, want=want_calls), hint)
    if not isinstance(stats, dict) or {key: stats.get(key) for key in want_stats} != want_stats:
        c.fail(_("{call} returned the statistics {got}; expected {want}.").format(
            call=call, got=stats, want=want_stats), _m.STATS_MISCOUNTED)


# --------------------------------------------------------------------------------------------
# Exercise 5: accept_sampled


def _distributions(c: Check, vocab: int, rows: int) -> torch.Tensor:
    """`rows` random distributions over `vocab` tokens, none close to uniform."""
    return torch.softmax(c.randn(rows, vocab, dtype=torch.float64) * 1.5, dim=-1)


def _rounds(c: Check, f_call, p, q, n: int, seed: int) -> list[torch.Tensor]:
    """n rounds of the learner's sampler, the guesses drawn from q by the check, round r with a
    generator seeded seed + r."""
    k = q.shape[0]
    draws = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=c.gen)
                         for i in range(k)], dim=1) if k else torch.zeros(n, 0, dtype=torch.long)
    return [f_call(p, q, draws[r], seed + r) for r in range(n)]


def _expect_round(c: Check, got, draft: torch.Tensor, call: str) -> None:
    """1-D LongTensor of 1 .. k + 1 tokens that starts with the draft's accepted guesses."""
    k = draft.numel()
    if not isinstance(got, torch.Tensor) or got.dtype != torch.long or got.dim() != 1 or \
            not 1 <= got.numel() <= k + 1:
        c.fail(_("{call} returned {got}; expected a 1-D LongTensor of 1 to k + 1 = {n} "
                 "tokens.").format(call=call, got=repr(got), n=k + 1))
    if not torch.equal(got[:-1], draft[:got.numel() - 1]):
        c.fail(_("{call} returned {got}: every token but the last must be an accepted guess, "
                 "in order.").format(call=call, got=got.tolist()), _m.KEEPS_REJECTED)


def _test_law(c: Check, counts: torch.Tensor, law: torch.Tensor, what: str,
              candidates: dict) -> None:
    from .sims import chi_square_p_value, log_likelihood

    p_value = chi_square_p_value(counts, law)
    if p_value >= 1e-6:
        c.note(what)
        return
    right = log_likelihood(counts, law)
    scored = [(log_likelihood(counts, other), mistake) for mistake, other in candidates.items()]
    best = max(scored, default=None, key=lambda pair: pair[0])
    hint = best[1] if best is not None and best[0] > right + 12 else None
    c.fail(_("{what}: the counts {counts} of {total} draws do not follow the model's "
             "probabilities {law} (chi-square p-value {p:.1e}; a correct sampler fails this "
             "test about once in a million seeds).").format(
        what=what, counts=counts.long().tolist(), total=int(counts.sum()),
        law=[round(float(x), 3) for x in law], p=p_value), hint)


@_one_thread
def check_accept_sampled(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .sims import first_token_law

    with Check("accept_sampled", f, seed=seed, errors=[_m.DIVIDES_BY_ZERO_Q]) as c:
        c.forbid_functions([spec.accept_sampled], _(OWN_WORK))
        vocab = 5
        perm = torch.randperm(vocab, generator=c.gen)

        def relabel(rows):             # the same distributions under other token ids
            out = torch.zeros_like(rows)
            out[:, perm] = rows
            return out

        def run(p, q, draft, seed):
            # A generator of its own for every call, seeded from the check's seed: each call's
            # draws depend on nothing that ran before it (a failure replays from its seed alone,
            # in a notebook or in the grader's worker).
            return c.call(p, q, draft, generator=torch.Generator().manual_seed(seed))

        # 1. p >= q at every guess: all k accepted, then the bonus.
        k = 3
        p = _distributions(c, vocab, k + 1)
        q = torch.full((k, vocab), 1.0 / vocab, dtype=torch.float64)
        draft = p[:k].argmax(-1)
        call = f"accept_sampled(p, q, draft={draft.tolist()}) with p >= q at every guess"
        outs = [run(p, q, draft.clone(), c.seed + i) for i in range(10)]
        for got in outs:
            _expect_round(c, got, draft, call)
        short = [got for got in outs if got.numel() < k + 1]
        if short:
            c.fail(_("{call} returned {got}; with p >= q every guess is accepted (probability "
                     "min(1, p/q) = 1) and a bonus token follows.").format(
                call=call, got=short[0].tolist()),
                _m.NO_BONUS_SAMPLED if all(torch.equal(got, draft) for got in outs)
                else _m.IGNORES_Q)
        c.headline(_("p >= q: every guess accepted, then a bonus token"))
        # 2. q = 0 at the guess (p > 0): accepted, without dividing by zero.
        p = relabel(torch.tensor([[0.3, 0.3, 0.2, 0.1, 0.1], [0.1, 0.2, 0.3, 0.2, 0.2]],
                                 dtype=torch.float64))
        q = relabel(torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0]], dtype=torch.float64))
        draft = perm[:1].clone()
        for i in range(5):
            got = run(p, q, draft.clone(), c.seed + 100 + i)
            call = "accept_sampled(p, q, draft) with q = 0 and p = 0.3 at the guess"
            _expect_round(c, got, draft, call)
            if got.numel() != 2:
                c.fail(_("{call} rejected the guess: with q = 0 and p > 0 it is accepted "
                         "(min(1, p/q) = 1).").format(call=call), _m.DIVIDES_BY_ZERO_Q)
        c.headline(_("q = 0 at a guess: accepted, no division by zero"))
        # 3. p = 0 at the first guess: rejected; the replacement lies where p > q.
        base_p = torch.tensor([[0.0, 0.2, 0.3, 0.5, 0.0], [0.2] * 5, [0.2] * 5],
                              dtype=torch.float64)
        base_q = torch.tensor([[0.6, 0.2, 0.0, 0.0, 0.2], [0.2] * 5], dtype=torch.float64)
        p, q = relabel(base_p), relabel(base_q)
        draft = perm[:2].clone()
        residual = (p[0] - q[0]).clamp(min=0) > 0
        call = "accept_sampled(p, q, draft) with p = 0 at the first guess"
        for i in range(80):
            got = run(p, q, draft.clone(), c.seed + 200 + i)
            _expect_round(c, got, draft, call)
            if got.numel() != 1:
                c.fail(_("{call} returned {got}: it accepted a guess the model gives probability "
                         "0.").format(call=call, got=got.tolist()),
                       _m.ACCEPTS_ALWAYS if got.numel() == 3 else _m.KEEPS_REJECTED)
            token = int(got[0])
            if not residual[token]:
                hint = _m.RESAMPLED_FROM_P if p[0, token] > 0 else \
                    _m.RESIDUAL_REVERSED if q[0, token] > p[0, token] else None
                c.fail(_("{call} replaced it with token {token}, where p - q <= 0; the "
                         "replacement is drawn from max(0, p - q), normalised.").format(
                    call=call, token=token), hint)
        c.headline(_("a rejected guess is replaced from the residual max(0, p - q)"))
        # 4. The generator makes a run repeat (flat distributions: every run is different).
        p = torch.full((3, vocab), 1.0 / vocab, dtype=torch.float64)
        q = torch.full((2, vocab), 1.0 / vocab, dtype=torch.float64)
        drafts = [torch.multinomial(q, 1, generator=c.gen)[:, 0] for _n in range(12)]
        runs = []
        for _twice in range(2):
            runs.append([run(p, q, d.clone(), c.seed + 300 + i) for i, d in enumerate(drafts)])
        for a, b in zip(*runs):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                    and torch.equal(a, b)):
                c.fail(_("two runs with generators seeded alike gave different tokens."),
                       _m.GENERATOR_IGNORED)
        c.headline(_("reproducible with a generator"))
        # 5. The distribution: a general draft, and a deterministic one (q one-hot).
        rounds = 400
        template_p = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0], dtype=torch.float64)
        template_q = torch.tensor([0.1, 0.3, 0.5, 0.0, 0.1], dtype=torch.float64)
        p = torch.cat([relabel(template_p[None]), _distributions(c, vocab, 1)])
        q = relabel(template_q[None])
        outs = _rounds(c, run, p, q, rounds, c.seed + 1000)
        firsts = torch.bincount(torch.stack([o[0] for o in outs]), minlength=vocab)
        laws = first_token_law(p[0], q[0])
        _test_law(c, firsts, laws["right"],
                  _("the first token of {n} rounds (guesses drawn from q)").format(n=rounds), {
                      _m.RESAMPLED_FROM_P: laws["resampled_from_p"],
                      _m.RESIDUAL_REVERSED: laws["residual_reversed"],
                      _m.ACCEPTS_ALWAYS: laws["accepts_always"],
                      _m.IGNORES_Q: laws["accepts_with_p"]})
        k = 2
        a, b = int(perm[0]), int(perm[1])
        p = _distributions(c, vocab, k + 1)
        p[0] = 0.3 * p[0] / p[0].sum()
        p[0, a] += 0.7
        p[1] = 0.4 * p[1] / p[1].sum()
        p[1, b] += 0.6
        p[2] = relabel(torch.tensor([[0.05, 0.05, 0.1, 0.2, 0.6]], dtype=torch.float64))[0]
        q = torch.zeros(k, vocab, dtype=torch.float64)
        q[0, a] = q[1, b] = 1.0
        outs = _rounds(c, run, p, q, rounds, c.seed + 2000)
        laws = first_token_law(p[0], q[0])
        _test_law(c, torch.bincount(torch.stack([o[0] for o in outs]), minlength=vocab),
                  laws["right"], _("the first token of {n} rounds with a deterministic draft "
                                   "(q one-hot)").format(n=rounds), {
                      _m.RESAMPLED_FROM_P: laws["resampled_from_p"],
                      _m.IGNORES_Q: laws["accepts_with_p"]})
        seconds = [o[1] for o in outs if o.numel() >= 2]
        if seconds:
            second_law = first_token_law(p[1], q[1])
            _test_law(c, torch.bincount(torch.stack(seconds), minlength=vocab), p[1],
                      _("the second token, after the first guess was accepted"), {
                          _m.RESAMPLED_FROM_P: second_law["resampled_from_p"],
                          _m.IGNORES_Q: second_law["accepts_with_p"]})
        bonuses = [o[2] for o in outs if o.numel() == 3]
        if bonuses:
            _test_law(c, torch.bincount(torch.stack(bonuses), minlength=vocab), p[2],
                      _("the bonus token, after every guess was accepted"), {
                          _m.BONUS_SAMPLED_WRONG: p[1]})
        c.headline(_("the tokens follow the model's own distribution (chi-square tests at a "
                     "p-value of 1e-6)"))


__all__ = ["check_accept_sampled", "check_early_exit_draft", "check_lookup_draft",
           "check_speculative_generate", "check_verify_draft"]


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "16.<exercise>.<key>" to
# exactly one of them.

MISTAKES = {
    "lookup_draft": (
        _m.LATEST_MATCH, _m.NO_SHORTER_NGRAM, _m.SHORTEST_FIRST,
        _m.STARTS_INSIDE_MATCH, _m.MORE_THAN_K, _m.NOT_LONG_TENSOR),
    "early_exit_draft": (
        _m.LAST_LAYERS, _m.LAYERS_OFF_BY_ONE, _m.WHOLE_MODEL, _m.RETURNS_CONTEXT),
    "verify_draft": (
        _m.PAST_MISMATCH, _m.NO_BONUS, _m.BONUS_FROM_LAST, _m.COMPARES_SHIFTED,
        _m.ONE_FORWARD_PER_TOKEN, _m.LAST_NOT_FED, _m.FED_AT_WRONG_POSITION),
    "speculative_generate": (
        _m.NOT_ROLLED_BACK, _m.POSITIONS_OFF_BY_ONE, _m.DRAFT_NOT_CAPPED, _m.IGNORES_CACHE_ARG,
        _m.PREFILL_MISSING, _m.FORWARD_AFTER_LAST, _m.STATS_MISCOUNTED, _m.NO_PROGRESS,
        fix_first("verify_draft")),
    "accept_sampled": (
        _m.RESAMPLED_FROM_P, _m.RESIDUAL_REVERSED, _m.ACCEPTS_ALWAYS, _m.IGNORES_Q,
        _m.DIVIDES_BY_ZERO_Q, _m.BONUS_SAMPLED_WRONG, _m.NO_BONUS_SAMPLED, _m.KEEPS_REJECTED,
        _m.GENERATOR_IGNORED),
}
