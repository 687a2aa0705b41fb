"""Chapter 16 checkers: the reference and the notebook's way pass at every seed; each known
mistake is diagnosed by its id.

The reference (`checks.reference.speculative`) is also held to its invariants here: speculative
generation gives chapter 13's greedy tokens for every draft and draft length, and the sampled
acceptance's first token follows the model's distribution.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types

import pytest
import torch

from checks import ModelConfig, nb16
from checks import reference as ref
from checks.engine import ForbiddenCall
from checks.nb16 import sims
from checks.reference import generation as gen
from checks.reference import speculative as spec

from ..support.catalogue import Wrong, exercises


def _copy(fn, **globals_):
    """`fn` under a new code object (the checks refuse the course's own answer), its globals
    overridden by `globals_`."""
    copy = types.FunctionType(fn.__code__.replace(), {**fn.__globals__, **globals_},
                              fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


# ------------------------------------------------------------------------------------------------
# The reference's own invariants

CFG = ModelConfig(vocab_size=61, hidden_size=24, n_heads=6, n_kv_heads=2, ffn_hidden_size=50,
                  n_layers=3, max_seq_len=128)


def _model(cfg: ModelConfig, seed: int) -> dict:
    params = ref.init_model_params(cfg, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():   # larger weights than the init's, so that attention is not uniform
        for layer in params["layers"]:
            for name in ("wqkv", "wo", "w_gate", "w_up", "w_down"):
                layer[name].mul_(0.9 / (0.02 * math.sqrt(layer[name].shape[0])))
        params["embed"].mul_(50.0)
        params["lm_head"].mul_(2 / (0.02 * math.sqrt(cfg.hidden_size)))
    return params


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_reference_speculative_equals_greedy(k):
    params = _model(CFG, 0)
    prompt = torch.randint(0, 61, (1, 7), generator=torch.Generator().manual_seed(1))
    prompt = torch.cat([prompt, prompt], dim=1)
    want = gen.generate(params, CFG, prompt, 25)
    drafts = [spec.lookup_draft,
              lambda t, n: spec.early_exit_draft(params, CFG, t, n, n_layers=1),
              lambda t, n: torch.randint(0, 61, (n,))]
    for draft in drafts:
        got, stats = spec.speculative_generate(params, CFG, prompt, 25, draft, k=k)
        assert torch.equal(got, want)
        assert stats["forwards"] + stats["accepted"] == 25


def test_reference_sampling_keeps_the_distribution():
    gen_ = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 6, generator=gen_, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(1, 6, generator=gen_, dtype=torch.float64) * 2, -1)
    counts = torch.zeros(6)
    for _n in range(4000):
        d = torch.multinomial(q[0], 1, generator=gen_)
        counts[int(spec.accept_sampled(p, q, d, generator=gen_)[0])] += 1
    assert sims.chi_square_p_value(counts, p[0]) > 1e-4


def test_lookup_examples():
    t = torch.tensor
    assert spec.lookup_draft(t([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3]), 4).tolist() == [9, 1, 2, 3]
    assert spec.lookup_draft(t([3, 1, 8, 2, 1, 6, 2, 1]), 2).tolist() == [6, 2]
    assert spec.lookup_draft(t([1, 2, 3]), 4).tolist() == []
    assert spec.lookup_draft(t([7]), 4).tolist() == []


# ------------------------------------------------------------------------------------------------
# The notebook's way (loops), which the solution uses


def nb_lookup_draft(tokens, k, *, max_ngram=3):
    tokens = tokens.tolist()
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), 0, -1):
        pattern = tokens[-n:]
        for i in range(length - n):           # windows that end before the last token
            if tokens[i:i + n] == pattern:
                return torch.tensor(tokens[i + n:i + n + k], dtype=torch.long)
    return torch.tensor([], dtype=torch.long)


def nb_early_exit_draft(params, cfg, tokens, k, *, n_layers):
    small = {**params, "layers": params["layers"][:n_layers]}
    small_cfg = dataclasses.replace(cfg, n_layers=n_layers)
    return gen.generate(small, small_cfg, tokens.reshape(1, -1), k)[0, tokens.numel():]


def nb_verify_draft(params, cfg, cache, last_token, draft, start_pos):
    fed = torch.tensor([[int(last_token)] + draft.tolist()], device=params["embed"].device)
    with torch.no_grad():
        logits = gen.forward_with_cache(fed, params, cfg, cache, start_pos)
    choices = logits[0].argmax(dim=-1)
    draft = draft.to(choices.device)
    m = 0
    while m < len(draft) and draft[m] == choices[m]:
        m += 1
    return torch.cat([draft[:m], choices[m:m + 1]])


def nb_speculative_generate(params, cfg, prompt_ids, max_new_tokens, draft, *, k=4, cache=None):
    p = prompt_ids.shape[1]
    total = p + max_new_tokens
    tokens = prompt_ids[0].tolist()
    stats = {"forwards": 0, "drafted": 0, "accepted": 0}
    if max_new_tokens == 0:
        return prompt_ids.clone(), stats
    if cache is None:
        cache = gen.KVCache(cfg, 1, total, dtype=params["embed"].dtype,
                            device=prompt_ids.device)
    with torch.no_grad():
        logits = gen.forward_with_cache(prompt_ids, params, cfg, cache, 0)
    stats["forwards"] += 1
    tokens.append(int(logits[0, -1].argmax()))
    while len(tokens) < total:
        room = min(k, total - len(tokens) - 1)
        guess = draft(torch.tensor(tokens), room)[:room]
        new = verify_draft(params, cfg, cache, tokens[-1], guess, len(tokens) - 1)
        stats["forwards"] += 1
        stats["drafted"] += len(guess)
        stats["accepted"] += len(new) - 1
        tokens += new.tolist()
    return torch.tensor([tokens], device=prompt_ids.device), stats


def nb_accept_sampled(p, q, draft, *, generator=None):
    k = len(draft)
    for i in range(k):
        d = int(draft[i])
        u = float(torch.rand(1, generator=generator))
        if u * q[i, d] < p[i, d]:             # probability min(1, p/q), and no division
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        fix = torch.multinomial(residual / residual.sum(), 1, generator=generator)
        return torch.cat([draft[:i], fix])
    return torch.cat([draft, torch.multinomial(p[k], 1, generator=generator)])


verify_draft = nb_verify_draft    # what nb_speculative_generate calls, as in the notebook


def _accept_ratio(p, q, draft, *, generator=None):
    """Correct too: the ratio p/q in torch (q = 0 gives inf, accepted), clamped to 1."""
    for i, d in enumerate(draft.tolist()):
        ratio = torch.clamp(p[i, d] / q[i, d], max=1.0)
        if torch.rand((), generator=generator, dtype=torch.float64) < ratio:
            continue
        residual = torch.clamp(p[i] - q[i], min=0)
        return torch.cat([draft[:i], torch.multinomial(residual, 1, generator=generator)])
    return torch.cat([draft, torch.multinomial(p[len(draft)], 1, generator=generator)])


# ------------------------------------------------------------------------------------------------
# Wrong implementations


def _lookup(*, self_match=False, latest=False, only_longest=False, shortest_first=False,
            shift=0, extra=0, as_list=False):
    def lookup_draft(tokens, k, *, max_ngram=3):
        tokens = tokens.tolist()
        length = len(tokens)
        sizes = list(range(min(max_ngram, length - 1), 0, -1))
        if only_longest:
            sizes = sizes[:1]
        if shortest_first:
            sizes = sizes[::-1]
        for n in sizes:
            starts = range(length - n + (1 if self_match else 0))
            for i in (reversed(starts) if latest else starts):
                if tokens[i:i + n] == tokens[-n:]:
                    out = tokens[i + n + shift:i + n + shift + k + extra]
                    return out if as_list else torch.tensor(out, dtype=torch.long)
        return [] if as_list else torch.tensor([], dtype=torch.long)
    return lookup_draft


LOOKUP_WRONG = [
    Wrong("counts the last n-gram as its own match", _lookup(self_match=True),
          "16.lookup_draft.no_shorter_ngram"),
    Wrong("most recent occurrence", _lookup(latest=True), "16.lookup_draft.latest_match"),
    Wrong("only n = max_ngram", _lookup(only_longest=True), "16.lookup_draft.no_shorter_ngram"),
    Wrong("n = 1 first", _lookup(shortest_first=True), "16.lookup_draft.shortest_ngram_first"),
    Wrong("starts with the match's last token", _lookup(shift=-1),
          "16.lookup_draft.starts_inside_match"),
    Wrong("k + 1 tokens", _lookup(extra=1), "16.lookup_draft.more_than_k"),
    Wrong("returns a list", _lookup(as_list=True), "16.lookup_draft.not_a_long_tensor"),
]


def _early(which):
    def early_exit_draft(params, cfg, tokens, k, *, n_layers):
        layers = {"last": params["layers"][-n_layers:], "more": params["layers"][:n_layers + 1],
                  "all": params["layers"], "context": params["layers"][:n_layers]}[which]
        small = {**params, "layers": layers}
        out = gen.generate(small, dataclasses.replace(cfg, n_layers=len(layers)),
                           tokens.reshape(1, -1), k)[0]
        return out if which == "context" else out[tokens.numel():]
    return early_exit_draft


EARLY_WRONG = [
    Wrong("the last blocks", _early("last"), "16.early_exit_draft.last_layers"),
    Wrong("one block more", _early("more"), "16.early_exit_draft.layers_off_by_one"),
    Wrong("every block", _early("all"), "16.early_exit_draft.whole_model"),
    Wrong("context and draft", _early("context"), "16.early_exit_draft.returns_context"),
]


def _verify(mistake):
    def verify_draft(params, cfg, cache, last_token, draft, start_pos):
        k = len(draft)
        if mistake == "one forward per token":
            fed = [int(last_token)] + draft.tolist()
            rows = [gen.forward_with_cache(torch.tensor([[t]]), params, cfg, cache,
                                           start_pos + i)[0, 0] for i, t in enumerate(fed)]
            choices = torch.stack(rows).argmax(-1)
        elif mistake == "guesses only":
            logits = gen.forward_with_cache(draft[None], params, cfg, cache, start_pos + 1)
            choices = torch.cat([draft[:1], logits[0].argmax(-1)])
        else:
            at = start_pos + (1 if mistake == "one late" else 0)
            fed = torch.tensor([[int(last_token)] + draft.tolist()])
            choices = gen.forward_with_cache(fed, params, cfg, cache, at)[0].argmax(-1)
        if mistake == "past mismatch":
            kept = [int(d) for d, g in zip(draft, choices) if d == g]
            return torch.tensor(kept + [int(choices[len(kept)])])
        shift = 1 if mistake == "shifted" else 0
        m = 0
        while m < k and draft[m] == choices[m + shift]:
            m += 1
        if mistake == "no bonus":
            return draft[:m].clone()
        if mistake == "bonus from last":
            return torch.cat([draft[:m], choices[-1:]])
        return torch.cat([draft[:m], choices[m:m + 1]])
    return verify_draft


VERIFY_WRONG = [
    Wrong("accepts after a mismatch", _verify("past mismatch"),
          "16.verify_draft.accepts_past_mismatch"),
    Wrong("forgets the bonus token", _verify("no bonus"), "16.verify_draft.no_bonus_token"),
    Wrong("bonus from the last position", _verify("bonus from last"),
          "16.verify_draft.bonus_from_last_position"),
    Wrong("guess i against choice i + 1", _verify("shifted"), "16.verify_draft.compares_shifted"),
    Wrong("one forward per token", _verify("one forward per token"),
          "16.verify_draft.one_forward_per_token"),
    Wrong("feeds the guesses only", _verify("guesses only"),
          "16.verify_draft.last_token_not_fed"),
    Wrong("fed one position late", _verify("one late"), "16.verify_draft.fed_at_wrong_position"),
]


def _spec(mistake):
    def speculative_generate(params, cfg, prompt_ids, max_new_tokens, draft, *, k=4,
                             cache=None):
        p = prompt_ids.shape[1]
        total = p + max_new_tokens
        tokens = prompt_ids[0].tolist()
        stats = {"forwards": 0, "drafted": 0, "accepted": 0}
        if max_new_tokens == 0:
            return prompt_ids.clone(), stats
        if cache is None or mistake == "own cache":
            cache = gen.KVCache(cfg, 1, total + (total + 1) * (k + 1))
        first = p - 1 if mistake == "prefill short" else p
        logits = gen.forward_with_cache(prompt_ids[:, :first], params, cfg, cache, 0)
        stats["forwards"] += 1
        if mistake == "prefill short":
            logits = gen.forward_with_cache(prompt_ids[:, first:], params, cfg, cache, first)
        tokens.append(int(logits[0, -1].argmax()))
        pos = p
        while len(tokens) < total + (1 if mistake == "one forward more" else 0):
            room = max(min(k, total - len(tokens) - 1), 0)
            ask = k if mistake == "not capped" else room
            guess = draft(torch.tensor(tokens), ask)[:ask]
            start = {"len": len(tokens), "pos": pos}.get(
                {"off by one": "len", "not rolled back": "pos"}.get(mistake, ""), len(tokens) - 1)
            new = nb_verify_draft(params, cfg, cache, tokens[-1], guess, start)
            pos += len(guess) + 1
            stats["forwards"] += 1
            stats["drafted"] += len(guess)
            stats["accepted"] += len(new) - (0 if mistake == "counts bonus" else 1)
            tokens += new.tolist()[:-1] if mistake == "drops bonus" else new.tolist()
        return torch.tensor([tokens[:total]]), stats
    return speculative_generate


def _with_own_verify(verify):
    """nb_speculative_generate calling `verify` under the name verify_draft, found there by the
    check's record of calls (as a learner's notebook defines it)."""
    scope = dict(verify.__globals__)
    code = verify.__code__.replace(co_name="verify_draft", co_qualname="verify_draft")
    named = types.FunctionType(code, scope, "verify_draft", verify.__defaults__,
                               verify.__closure__)
    scope["verify_draft"] = named
    return _copy(nb_speculative_generate, verify_draft=named)


SPEC_WRONG = [
    Wrong("next round after every token fed", _spec("not rolled back"),
          "16.speculative_generate.cache_not_rolled_back"),
    Wrong("start_pos = number of tokens", _spec("off by one"),
          "16.speculative_generate.positions_off_by_one"),
    Wrong("asks for k guesses to the end", _spec("not capped"),
          "16.speculative_generate.draft_not_capped"),
    Wrong("its own cache", _spec("own cache"), "16.speculative_generate.ignores_cache_argument"),
    Wrong("prefill without the last prompt token", _spec("prefill short"),
          "16.speculative_generate.no_single_prefill"),
    Wrong("one round too many", _spec("one forward more"),
          "16.speculative_generate.forward_after_last"),
    Wrong("accepted counts the bonus", _spec("counts bonus"),
          "16.speculative_generate.stats_miscounted"),
    Wrong("drops the bonus token itself", _spec("drops bonus"),
          "16.speculative_generate.round_without_progress"),
    Wrong("calls a verify_draft without the bonus",
          _with_own_verify(_verify("no bonus")),
          "16.speculative_generate.fix_verify_draft_first"),
]


def _sampled(mistake):
    def accept_sampled(p, q, draft, *, generator=None):
        rng = None if mistake == "generator ignored" else generator
        k = len(draft)
        for i in range(k):
            d = int(draft[i])
            u = float(torch.rand(1, generator=rng))
            if mistake == "accepts always":
                continue
            if mistake == "divides":
                accept = u < min(1.0, float(p[i, d]) / float(q[i, d]))
            elif mistake == "accepts with p":
                accept = u < float(p[i, d])
            else:
                accept = u * float(q[i, d]) < float(p[i, d])
            if accept:
                continue
            residual = {"from p": p[i], "reversed": (q[i] - p[i]).clamp(min=0)}.get(
                mistake, (p[i] - q[i]).clamp(min=0))
            fix = torch.multinomial(residual / residual.sum(), 1, generator=rng)
            keep = i + 1 if mistake == "keeps rejected" else i
            return torch.cat([draft[:keep], fix])
        if mistake == "no bonus":
            return draft.clone()
        row = k - 1 if mistake == "bonus row" else k
        return torch.cat([draft, torch.multinomial(p[row], 1, generator=rng)])
    return accept_sampled


SAMPLED_WRONG = [
    Wrong("replacement from p", _sampled("from p"), "16.accept_sampled.resampled_from_p"),
    Wrong("replacement from q - p", _sampled("reversed"), "16.accept_sampled.residual_reversed"),
    Wrong("accepts every guess", _sampled("accepts always"), "16.accept_sampled.accepts_always"),
    Wrong("accepts with probability p", _sampled("accepts with p"),
          "16.accept_sampled.accepts_with_p"),
    Wrong("p / q in Python floats", _sampled("divides"), "16.accept_sampled.divides_by_zero_q"),
    Wrong("bonus from p[k - 1]", _sampled("bonus row"), "16.accept_sampled.bonus_from_wrong_row"),
    Wrong("no bonus token", _sampled("no bonus"), "16.accept_sampled.no_bonus_token"),
    Wrong("keeps the rejected guess", _sampled("keeps rejected"),
          "16.accept_sampled.keeps_rejected"),
    Wrong("global random numbers", _sampled("generator ignored"),
          "16.accept_sampled.generator_ignored"),
]


WRONG = {
    nb16.check_lookup_draft: LOOKUP_WRONG,
    nb16.check_early_exit_draft: EARLY_WRONG,
    nb16.check_verify_draft: VERIFY_WRONG,
    nb16.check_speculative_generate: SPEC_WRONG,
    nb16.check_accept_sampled: SAMPLED_WRONG,
}

_ref_verify = _copy(spec.verify_draft)

CORRECT = {
    nb16.check_lookup_draft: {"reference": _copy(spec.lookup_draft),
                              "loops": nb_lookup_draft},
    nb16.check_early_exit_draft: {"reference": _copy(spec.early_exit_draft),
                                  "by_generate": nb_early_exit_draft},
    nb16.check_verify_draft: {"reference": _ref_verify, "loops": nb_verify_draft},
    nb16.check_speculative_generate: {
        "reference": _copy(spec.speculative_generate, verify_draft=_ref_verify),
        "loops": nb_speculative_generate},
    nb16.check_accept_sampled: {"reference": _copy(spec.accept_sampled),
                                "loops": nb_accept_sampled, "torch_ratio": _accept_ratio},
}
EXERCISES = exercises(CORRECT, WRONG)


def test_calling_the_reference_is_a_forbidden_call():
    with pytest.raises(ForbiddenCall):
        nb16.check_verify_draft(spec.verify_draft, seed=0)
    with pytest.raises(ForbiddenCall):
        nb16.check_lookup_draft(functools.partial(spec.lookup_draft), seed=0)


def test_chapter_16_reads_in_chinese(monkeypatch):
    from checks.engine import CheckFailure
    from checks.environment import LANG_ENV
    monkeypatch.setenv(LANG_ENV, "zh")
    wrong = {w.name: w for w in VERIFY_WRONG}["forgets the bonus token"]
    with pytest.raises(CheckFailure) as info:
        nb16.check_verify_draft(wrong.fn, seed=1)
    text = str(info.value)
    assert info.value.mistake == "16.verify_draft.no_bonus_token"
    assert "忘了额外的 token" in text and "likely mistake" not in text, text
