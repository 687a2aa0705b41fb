"""Chapter 16's check internals: the recording cache, the scenarios, the wrong variants each
mistake gives (simulated from the reference's pieces), and the statistics of the sampling test.

Every simulation is the reference's rule with one thing changed, so that a learner's wrong
result can be matched to the mistake that produces it.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..engine import Check
from ..reference import generation as gen
from ..reference import speculative as spec
from ..nb13.cache import _cfg, _params

# --------------------------------------------------------------------------------------------
# The cache the checks hand over: the course's, recording every write


class _SpyCache(gen.KVCache):
    """The course's cache (batch 1), recording (layer, start_pos, T) of every update while
    `recording` is on. The learner's function gets a `_Handle` whose `update` is this object's
    bound method: under a grader that runs the learner's code in a worker, the method stays in
    the grading process and is called back, so the records stay here too."""

    def __init__(self, cfg, max_seq_len: int):
        super().__init__(cfg, 1, max_seq_len)
        self.calls: list[tuple[int, int, int]] = []
        self.recording = True

    def update(self, layer_idx, k, v, start_pos):
        if self.recording:
            self.calls.append((int(layer_idx), int(start_pos), int(k.shape[-2])))
        return super().update(layer_idx, k, v, start_pos)

    def forwards(self) -> list[tuple[int, int]]:
        """(start_pos, T) of each forward pass: the writes of layer 0."""
        return [(start, t) for layer, start, t in self.calls if layer == 0]


class _Handle:
    """The cache as the learner's code sees it: `update(layer_idx, k, v, start_pos)` and
    `max_seq_len` (what chapter 13's forward_with_cache uses)."""

    def __init__(self, cache: _SpyCache):
        self.update = cache.update
        self.max_seq_len = cache.max_seq_len


# --------------------------------------------------------------------------------------------
# Models whose greedy choices are never close calls


def _margin(logits: torch.Tensor) -> float:
    """The smallest gap between the best and the second-best logit of any row."""
    top = logits.reshape(-1, logits.shape[-1]).topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min()) if top.numel() else math.inf


def model(c: Check, kind: str = "gqa", *, n_layers: int = 2, max_seq_len: int = 96):
    """A small random model (distinct sizes, chapter 13's scales)."""
    cfg = _cfg(c, kind, n_layers=n_layers, max_seq_len=max_seq_len)
    return cfg, _params(c, cfg)


def logits_of(params, cfg, tokens: torch.Tensor) -> torch.Tensor:
    """[S, V]: the logits of a 1-D sequence, no cache."""
    with torch.no_grad():
        return gen.full_forward(tokens.reshape(1, -1), params, cfg)[0]


def greedy(params, cfg, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """1-D: the prompt and n greedy tokens (the reference's generate)."""
    return gen.generate(params, cfg, prompt.reshape(1, -1), n)[0]


# --------------------------------------------------------------------------------------------
# lookup_draft's wrong variants


def lookup_variant(tokens: torch.Tensor, k: int, max_ngram: int, *, self_match=False,
                   latest=False, only_longest=False, shortest_first=False, shift=0,
                   extra=0) -> torch.Tensor:
    tokens = tokens.reshape(-1)
    length = tokens.numel()
    sizes = list(range(min(max_ngram, length - 1), 0, -1))
    if only_longest:
        sizes = sizes[:1]
    if shortest_first:
        sizes = sizes[::-1]
    for n in sizes:
        end = length if self_match else length - 1
        windows = tokens[:end].unfold(0, n, 1)
        hits = (windows == tokens[length - n:]).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1 if latest else 0]) + n + shift
            return tokens[start:start + k + extra].clone()
    return tokens.new_empty(0)


# --------------------------------------------------------------------------------------------
# verify_draft: a draft with chosen matches, and the wrong variants


def draft_with_pattern(params, cfg, context: torch.Tensor, last: int,
                       pattern: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft, choices): guess i is the model's own choice where pattern[i] is True and its
    second choice where False; choices [k + 1] are the argmax of every fed position."""
    draft: list[int] = []
    for keep in pattern:
        fed = torch.cat([context, torch.tensor([last] + draft)])
        top = logits_of(params, cfg, fed)[-1].topk(2).indices
        draft.append(int(top[0] if keep else top[1]))
    fed = torch.cat([context, torch.tensor([last] + draft)])
    logits = logits_of(params, cfg, fed)[context.numel():]
    return torch.tensor(draft, dtype=torch.long), logits


def verify_variants(draft: torch.Tensor, choices: torch.Tensor) -> dict[str, torch.Tensor]:
    """{name: output} for verify_draft's wrong rules, from the draft and the argmax choices."""
    k = draft.numel()
    lead = 0
    while lead < k and draft[lead] == choices[lead]:
        lead += 1
    matched = [int(d) for d, g in zip(draft, choices[:k]) if d == g]
    shifted = 0
    while shifted < k and draft[shifted] == choices[shifted + 1]:
        shifted += 1
    return {
        "past_mismatch": torch.tensor(matched + [int(choices[len(matched)])]),
        "no_bonus": draft[:lead].clone(),
        "bonus_from_last": torch.cat([draft[:lead], choices[-1:]]),
        "shifted": torch.cat([draft[:shifted], choices[shifted:shifted + 1]]),
    }


# --------------------------------------------------------------------------------------------
# speculative_generate: a draft that knows the answer but for chosen positions, and the loop
# with one rule changed


class OracleDraft:
    """A draft that proposes the model's own greedy tokens, except at the absolute positions in
    `wrong` (there the next token id) and with at most `cap` tokens when `cap` is set: the
    rounds then have known acceptances. It depends only on how long the sequence it gets is,
    so the simulated wrong loops get the same guesses. A checks object: under a grader it stays
    in the grading process (the worker calls it back) and its log of calls stays here."""

    def __init__(self, truth: torch.Tensor, wrong: set[int], vocab: int, cap: int | None = None,
                 *, max_calls: int | None = None, runaway=None):
        """`runaway()`: the exception raised when the draft is asked more than `max_calls`
        times (a loop whose rounds add no token never ends on its own)."""
        self.truth = truth
        self.wrong = set(wrong)
        self.vocab = vocab
        self.cap = cap
        self.max_calls = max_calls
        self.runaway = runaway
        self.log: list[tuple[int, int]] = []
        self.armed = False     # counting the learner's calls (the simulations are not counted)

    def arm(self, on: bool) -> None:
        self.armed = on
        self.log = []

    def __call__(self, tokens, k):
        length = int(torch.as_tensor(tokens).numel())
        k = int(k)
        if self.armed:
            self.log.append((length, k))
            if self.max_calls is not None and len(self.log) > self.max_calls:
                raise self.runaway()
        take = k if self.cap is None else min(k, self.cap)
        out = self.truth[length:length + take].clone()
        for i in range(out.numel()):
            if length + i in self.wrong:
                out[i] = (out[i] + 1) % self.vocab
        return out


def advance_rule(name: str):
    """How far the next round's last token moves, given m accepted of d guesses."""
    return {
        "right": lambda m, d: m + 1,
        "not_rolled_back": lambda m, d: d + 1,
        "minus_after_rejection": lambda m, d: m + 1 if m == d else m,
        "plus_after_rejection": lambda m, d: m + 1 if m == d else m + 2,
        "minus_always": lambda m, d: m,
        "plus_always": lambda m, d: m + 2,
    }[name]


def simulate(params, cfg, prompt: torch.Tensor, n: int, draft, k: int, s_max: int, *,
             advance: str = "right", capped: bool = True, offset: int = 0):
    """(tokens [1, P + n], stats, forwards [(start_pos, T)]) of speculative generation with the
    rule changed as told (`offset`: every round fed that far from its position); ValueError
    when it writes past the cache's s_max positions."""
    p = prompt.shape[1]
    total = p + n
    tokens = [int(t) for t in prompt[0]]
    stats = {"forwards": 0, "drafted": 0, "accepted": 0}
    calls: list[tuple[int, int]] = []
    if n == 0:
        return prompt.clone(), stats, calls
    cache = gen.KVCache(cfg, 1, s_max)
    step = advance_rule(advance)
    with torch.no_grad():
        logits = gen.forward_with_cache(prompt, params, cfg, cache, 0)
        calls.append((0, p))
        stats["forwards"] = 1
        tokens.append(int(logits[0, -1].argmax()))
        pos = p
        while len(tokens) < total:
            room = total - len(tokens) - 1
            ask = min(k, room) if capped else k
            guess = torch.as_tensor(draft(torch.tensor(tokens), ask)).reshape(-1)[:ask]
            fed = torch.tensor([[tokens[-1]] + [int(t) for t in guess]])
            if pos + offset < 0:
                raise ValueError("a negative position")
            choices = gen.forward_with_cache(fed, params, cfg, cache, pos + offset)[0].argmax(-1)
            calls.append((pos + offset, fed.shape[1]))
            m = 0
            while m < guess.numel() and int(guess[m]) == int(choices[m]):
                m += 1
            stats["forwards"] += 1
            stats["drafted"] += guess.numel()
            stats["accepted"] += m
            tokens += [int(t) for t in guess[:m]] + [int(choices[m])]
            pos += step(m, guess.numel())
    return torch.tensor([tokens[:total]]), stats, calls


# --------------------------------------------------------------------------------------------
# accept_sampled: what each wrong rule makes of the first output token, and a chi-square test


def first_token_law(p0: torch.Tensor, q0: torch.Tensor) -> dict[str, torch.Tensor]:
    """The distribution of the first output token under the right rule and the wrong ones,
    when guess 0 is drawn from q0 and the model's distribution there is p0."""
    p0, q0 = p0.double(), q0.double()
    both = torch.minimum(p0, q0)
    rejected = 1 - both.sum()

    def norm(x):
        return x / x.sum() if float(x.sum()) > 0 else p0

    accepted_by_p = q0 * p0
    return {
        "right": p0,
        "resampled_from_p": both + rejected * p0,
        "residual_reversed": both + rejected * norm((q0 - p0).clamp(min=0)),
        "accepts_always": q0,
        "accepts_with_p": accepted_by_p + (1 - accepted_by_p.sum()) * norm(
            (p0 - q0).clamp(min=0)),
    }


def chi_square_p_value(counts: torch.Tensor, law: torch.Tensor) -> float:
    """The p-value of Pearson's chi-square test of `counts` against the distribution `law`
    (0 when a token of probability 0 was seen)."""
    counts, law = counts.double(), law.double()
    total = counts.sum()
    if total == 0:
        return 1.0
    if bool(((law <= 0) & (counts > 0)).any()):
        return 0.0
    seen = law > 0
    expected = law[seen] * total
    stat = float(((counts[seen] - expected) ** 2 / expected).sum())
    dof = int(seen.sum()) - 1
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def log_likelihood(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Log-probability of the counts under `law` (up to the multinomial coefficient)."""
    law = law.double().clamp(min=1e-12)
    return float((counts.double() * law.log()).sum())


def shallow(params, cfg, layers):
    """A model made of the chosen blocks (a list of indices), with the final norm and head."""
    return ({**params, "layers": [params["layers"][i] for i in layers]},
            dataclasses.replace(cfg, n_layers=len(layers)))


__all__ = ["OracleDraft", "chi_square_p_value", "draft_with_pattern", "first_token_law",
           "greedy", "log_likelihood", "logits_of", "lookup_variant", "model", "shallow",
           "simulate", "spec", "verify_variants"]
