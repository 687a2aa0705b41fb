"""Chapter 16: speculative decoding (guess several tokens, check them in one forward pass).

Formulated differently from the notebook, which loops over positions: the n-gram search compares
every window of the context at once (`unfold`), the greedy acceptance is a cumulative product of
the matches, and the sampled acceptance draws all its uniforms before looking at any of them.

The rules (the chapter's contract, after Leviathan et al. 2023 and Chen et al. 2023):

- `lookup_draft(tokens, k, *, max_ngram=3)`: for n = max_ngram, max_ngram - 1, ..., 1, the last n
  tokens are searched for among the earlier windows of n tokens (a window that ends before the
  last token; never the final n-gram itself); the earliest match wins (as in Hugging Face's prompt
  lookup: in a passage being copied it has the longest continuation), and the draft is the up to k
  tokens that followed it. The longest n-gram with a match decides; no match at all: an empty
  draft.
- `early_exit_draft(params, cfg, tokens, k, *, n_layers)`: k greedy tokens of the model cut after
  its first `n_layers` blocks, with its own final norm and LM head (a smaller model made of the
  same weights).
- `verify_draft(params, cfg, cache, last_token, draft, start_pos)`: one forward pass over
  [last_token, *draft] at start_pos; greedy choice i is the argmax of position i's logits. Draft
  token i is accepted while it equals greedy choice i; with m accepted, the result is
  draft[:m] followed by greedy choice m (the model's own next token, the "bonus").
- `speculative_generate(params, cfg, prompt_ids, max_new_tokens, draft, *, k=4)`: the prompt is
  prefilled (one forward) and gives new token 0; then each round drafts at most
  min(k, tokens still to make - 1) tokens from the sequence so far and verifies them with the
  last token at its position; the next round's last token sits right after the accepted ones
  (the rejected positions of the cache are overwritten, never read). No forward pass after the
  last token. Returns the tokens and {"forwards", "drafted", "accepted"} (forward passes, the
  prefill included; tokens proposed; tokens proposed and kept). Batch 1; `cache=` hands it a cache
  (chapter 13's KVCache) instead of making one.
- `accept_sampled(p, q, draft, *, generator=None)`: draft token i is accepted when
  u_i * q[i, d_i] < p[i, d_i] (u_i uniform in [0, 1): probability min(1, p/q), and q = 0 accepts
  whenever p > 0, no division); at the first rejection the replacement is drawn from
  max(0, p[i] - q[i]) normalised; with all k accepted a bonus token is drawn from p[k].
"""

from __future__ import annotations

import dataclasses

import torch

from .generation import KVCache, forward_with_cache, generate


def lookup_draft(tokens: torch.Tensor, k: int, *, max_ngram: int = 3) -> torch.Tensor:
    """LongTensor [<= k]: what followed the earliest occurrence of the last n-gram."""
    tokens = torch.as_tensor(tokens).reshape(-1)
    length = tokens.numel()
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = tokens[:length - 1].unfold(0, n, 1)          # windows ending before the last
        hits = (windows == tokens[length - n:]).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[0]) + n
            return tokens[start:start + k].clone()
    return tokens.new_empty(0)


def shallow_model(params: dict, cfg, n_layers: int) -> tuple[dict, object]:
    """The model's first n_layers blocks with its own final norm and LM head."""
    return ({**params, "layers": params["layers"][:n_layers]},
            dataclasses.replace(cfg, n_layers=n_layers))


def early_exit_draft(params: dict, cfg, tokens: torch.Tensor, k: int, *,
                     n_layers: int) -> torch.Tensor:
    """LongTensor [k]: k greedy tokens of the first n_layers blocks, the final norm and head."""
    small_params, small_cfg = shallow_model(params, cfg, n_layers)
    tokens = torch.as_tensor(tokens).reshape(1, -1)
    return generate(small_params, small_cfg, tokens, k)[0, tokens.shape[1]:]


def verify_draft(params: dict, cfg, cache, last_token: int, draft: torch.Tensor,
                 start_pos: int) -> torch.Tensor:
    """LongTensor [m + 1]: the accepted draft tokens, then the model's own next token."""
    draft = torch.as_tensor(draft).reshape(-1)
    fed = torch.cat([draft.new_tensor([int(last_token)]), draft])[None]
    with torch.no_grad():
        choices = forward_with_cache(fed, params, cfg, cache, start_pos)[0].argmax(dim=-1)
    accepted = int((draft == choices[:-1]).long().cumprod(dim=0).sum())
    return choices[:accepted + 1].clone()        # equal to the draft where it was accepted


def speculative_generate(params: dict, cfg, prompt_ids: torch.Tensor, max_new_tokens: int,
                         draft, *, k: int = 4, cache=None) -> tuple[torch.Tensor, dict]:
    """(LongTensor [1, P + max_new_tokens], stats): greedy generation, checked k guesses at a time.
    `cache`: a KVCache of batch 1 with room for P + max_new_tokens positions (None: a new one)."""
    p = prompt_ids.shape[1]
    total = p + max_new_tokens
    out = torch.empty(1, total, dtype=torch.long, device=prompt_ids.device)
    out[:, :p] = prompt_ids
    stats = {"forwards": 0, "drafted": 0, "accepted": 0}
    if max_new_tokens == 0:
        return out, stats
    if cache is None:
        cache = KVCache(cfg, 1, total, dtype=params["embed"].dtype, device=prompt_ids.device)
    with torch.no_grad():
        logits = forward_with_cache(prompt_ids, params, cfg, cache, 0)
    stats["forwards"] = 1
    out[0, p] = logits[0, -1].argmax()
    length = p + 1                               # tokens known; the last one is not cached yet
    while length < total:
        room = total - length - 1                # the bonus token always comes on top
        guess = torch.as_tensor(draft(out[0, :length].clone(), min(k, room))).reshape(-1)
        guess = guess[:min(k, room)].to(out.device, torch.long)
        new = verify_draft(params, cfg, cache, int(out[0, length - 1]), guess, length - 1)
        stats["forwards"] += 1
        stats["drafted"] += guess.numel()
        stats["accepted"] += new.numel() - 1
        out[0, length:length + new.numel()] = new
        length += new.numel()
    return out, stats


def accept_sampled(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, *,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """LongTensor [m + 1]: speculative sampling of one round. p [k + 1, V] the model's
    probabilities at each fed position, q [k, V] the draft's, draft [k] the drafted tokens."""
    draft = torch.as_tensor(draft).reshape(-1)
    k = draft.numel()
    u = torch.rand(k, generator=generator, dtype=torch.float64, device=p.device)
    rows = torch.arange(k, device=p.device)
    p_tok = p[rows, draft].to(torch.float64)
    q_tok = q[rows, draft].to(torch.float64)
    rejected = (u * q_tok >= p_tok).nonzero().flatten()
    if rejected.numel() == 0:
        bonus = torch.multinomial(p[k].to(torch.float64), 1, generator=generator)
        return torch.cat([draft, bonus.to(draft.dtype)])
    i = int(rejected[0])
    residual = (p[i].to(torch.float64) - q[i].to(torch.float64)).clamp(min=0)
    if float(residual.sum()) <= 0:               # p = q: only a token p never gives was rejected
        residual = p[i].to(torch.float64)
    fix = torch.multinomial(residual / residual.sum(), 1, generator=generator)
    return torch.cat([draft[:i], fix.to(draft.dtype)])
