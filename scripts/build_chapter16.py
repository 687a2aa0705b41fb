"""Writes solutions/16_speculative/16_speculative.ipynb from the cells below (a one-off builder
kept so that the chapter's first version can be regenerated; edit the notebook itself from now
on, and delete this file once the chapter is merged)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "solutions" / "16_speculative" / "16_speculative.ipynb"


def md(cell_id, text):
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": _lines(text)}


def code(cell_id, text, grade_id=None, points=None):
    meta = {}
    if grade_id and points is None:
        meta = {"nbgrader": {"grade": False, "grade_id": grade_id, "locked": False,
                             "schema_version": 3, "solution": True, "task": False}}
    elif grade_id:
        meta = {"nbgrader": {"grade": True, "grade_id": grade_id, "locked": True,
                             "points": points, "schema_version": 3, "solution": False,
                             "task": False}}
    return {"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": meta,
            "outputs": [], "source": _lines(text)}


def _lines(text):
    text = text.strip("\n")
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


CELLS = []
A = CELLS.append

A(md("16-000", r"""
# 16 · Guess ahead: speculative decoding

*Beyond the article · 超出原文*

Chapter 13 found that a decode step is memory-bound: to choose **one** token it reads every weight
of the model once and does little arithmetic on each. Feeding it five tokens instead of one reads
the same weights and costs hardly more. **Speculative decoding** turns that into speed: guess
several next tokens cheaply, check all the guesses in **one** forward pass, and keep the ones the
model would have chosen itself, plus the model's own next token, which that pass gives for free.

Under greedy decoding the output is the model's own **token for token**; when sampling, a careful
acceptance rule keeps the model's own **distribution** (Leviathan et al. 2023; Chen et al. 2023).
gpt-fast, llama.cpp, vLLM and Hugging Face all ship it. Here you build it on your own model from
chapters 02-13, prove it exact, and measure when it pays.

**You will write:** two drafts, `lookup_draft` (prompt lookup) and `early_exit_draft` (the first
blocks of the same model), `verify_draft` (one forward pass checks every guess),
`speculative_generate` (the whole loop) and `accept_sampled` (the sampling form).

**Letters used here.** $P$ is the prompt's length; $k$ the most guesses a round may make; $d$ the
guesses one round really made ($d \le k$); $m$ how many of them were accepted ($0 \le m \le d$);
$n$ is `max_new_tokens`. $p$ is the model's probability distribution over the next token, $q$ the
draft's.

**How the exercises work.** Each exercise is a function with `raise NotImplementedError()`. Replace
that line with your code and run the cell, then run the self-check cell right below it. A green ✓
means it passes; a red ✗ says what went wrong and, where it can tell, the likely mistake. Each
check draws new random inputs every run; a failure prints its seed so that you can replay it with
`check_...(your_function, seed=...)`.
"""))

A(code("16-001", r"""
import dataclasses
import time

import matplotlib.pyplot as plt
import torch

import checks
from checks import ModelConfig, smollm, speculation
from checks.borrow import own_functions
from checks.context import demo_size
from checks.nb16 import (check_accept_sampled, check_early_exit_draft, check_lookup_draft,
                         check_speculative_generate, check_verify_draft)

# Building blocks from earlier chapters: yours where they pass their checks, else the course's.
(init_model_params, KVCache, forward_with_cache, generate) = own_functions({
    "init_model_params": "12_lm_head_logits",
    "KVCache": "13_generation_kv_cache",
    "forward_with_cache": "13_generation_kv_cache",
    "generate": "13_generation_kv_cache",
})
"""))

A(md("16-002", r"""
**The building blocks.** The import cell took each of these from your own notebook of that
chapter when it passes that chapter's check, and from the course's reference otherwise; the line
it printed says which.

| function | chapter | what it does here |
|---|---|---|
| `init_model_params(cfg, generator)` | 12 | a small random model to try things on |
| `KVCache(cfg, batch_size, max_seq_len)` | 13 | the preallocated cache; `update` writes at `start_pos` |
| `forward_with_cache(token_ids, params, cfg, cache, start_pos)` | 13 | logits of $T$ new tokens at positions `start_pos .. start_pos+T-1` |
| `generate(params, cfg, prompt_ids, n)` | 13 | greedy generation: the answer speculative decoding must reproduce |

## Why a guess can be checked for free

In a decode step the time goes into reading the weights. Feed $T$ tokens instead of one and the
same weights are read once and used $T$ times: the step barely gets slower until $T$ is large
enough to make the arithmetic, not the memory, the limit (chapter 13's ridge point). So if we had
$k$ guesses for the next tokens, one forward pass over them would tell us, at every position at
once, what the model would have chosen there. Every guess the model agrees with is a token we got
without a decode step of its own.

The tiny random model of chapter 13, and a prompt that repeats itself (as a text does when an
answer quotes its question):
"""))

A(code("16-003", r"""
tiny = ModelConfig(vocab_size=256, hidden_size=64, n_heads=8, n_kv_heads=2, ffn_hidden_size=176,
                   n_layers=4, max_seq_len=256)


def sharp_params(cfg, seed=0):
    # Chapter 13's random weights, every matrix rescaled to std 1/sqrt(fan-in).
    params = init_model_params(cfg, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for layer in params["layers"]:
            for name in ("wqkv", "wo", "w_gate", "w_up", "w_down"):
                layer[name] /= 0.02 * layer[name].shape[0] ** 0.5
        params["lm_head"] /= 0.02 * cfg.hidden_size ** 0.5
    return params


params = sharp_params(tiny)
text = "the cat sat on the mat. the cat sat on the"
prompt = torch.tensor([list(text.encode())])                # raw UTF-8 bytes as token ids
print(f"prompt: {text!r} ({prompt.shape[1]} tokens)")
"""))

A(md("16-004", r"""
## Exercise 1 · `lookup_draft`: guess from the context

The cheapest draft needs no model at all. When an answer quotes, summarises or edits a passage of
its prompt, the next tokens have often appeared before: after "the cat sat on the", the text so
far says "mat" comes next. **Prompt lookup** (Saxena 2023; Hugging Face's
`prompt_lookup_num_tokens`, vLLM's n-gram proposer) takes the last $n$ tokens, finds where they
occurred earlier, and proposes the tokens that followed them there.

`lookup_draft(tokens, k, *, max_ngram=3)` takes `tokens`, a 1-D `LongTensor` (the whole sequence
so far), and returns a 1-D `LongTensor` of at most `k` guesses:

1. For $n$ = `max_ngram`, `max_ngram - 1`, ..., 1: look for the last $n$ tokens among the earlier
   windows of $n$ tokens, the windows that **end before the last token** (the last $n$-gram itself
   is no match: nothing follows it yet).
2. The **earliest** match wins: in a passage being copied it has the longest continuation. The
   guesses are the up to $k$ tokens right after it, `tokens[i + n : i + n + k]` for a match at
   `i`; fewer when the sequence ends sooner.
3. The longest $n$ with a match decides; with no match for any $n$, return an empty `LongTensor`.

Example: `tokens = [5, 1, 2, 3, 7, 8, 1, 2, 3]`, `k = 2`: the last 3-gram `1, 2, 3` first occurs at
index 1, so the guesses are `[7, 8]`.
"""))

A(code("16-005", r"""
def lookup_draft(tokens: torch.Tensor, k: int, *, max_ngram: int = 3) -> torch.Tensor:
    # At most k guesses: what followed the earliest earlier occurrence of the last n-gram.
    ### BEGIN SOLUTION
    tokens = tokens.tolist()
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), 0, -1):
        pattern = tokens[-n:]
        for i in range(length - n):              # windows that end before the last token
            if tokens[i:i + n] == pattern:
                return torch.tensor(tokens[i + n:i + n + k], dtype=torch.long)
    return torch.tensor([], dtype=torch.long)
    ### END SOLUTION
""", "lookup_draft"))

A(code("16-006", r"""
from checks.nb16 import check_lookup_draft
check_lookup_draft(lookup_draft)
### BEGIN HIDDEN TESTS
check_lookup_draft(lookup_draft, thorough=True)
assert lookup_draft(torch.tensor([5, 1, 2, 3, 7, 8, 1, 2, 3]), 2).tolist() == [7, 8]
assert lookup_draft(torch.tensor([4]), 3).numel() == 0
### END HIDDEN TESTS
""", "check_lookup_draft", 2))

A(code("16-007", r"""
# Here every byte is a token, so a 3-gram is three letters ("the" occurs first at the start);
# six bytes, "on the", find the passage.
for n in (3, 6):
    guess = lookup_draft(prompt[0], 6, max_ngram=n)
    print(f"max_ngram={n}: after {text!r} prompt lookup guesses "
          f"{bytes(guess.tolist()).decode()!r}")
"""))

A(md("16-008", r"""
## Exercise 2 · `early_exit_draft`: a smaller model made of the same weights

The classic draft is a second, smaller model trained on the same data. Without a second file we
can still make one: the **first few blocks** of the model itself, followed by its own final norm
and LM head (an "early exit", as in LayerSkip, Elhoushi et al. 2024). It costs a fraction of a
full step and needs no extra memory.

`early_exit_draft(params, cfg, tokens, k, *, n_layers)` returns a 1-D `LongTensor` of exactly `k`
guesses: the greedy tokens of the model cut after its first `n_layers` blocks, continuing
`tokens` (1-D). Hint: a model is its parameter dictionary and its config; chapter 13's `generate`
runs any model, and `dataclasses.replace(cfg, n_layers=...)` copies a config with one field
changed.
"""))

A(code("16-009", r"""
def early_exit_draft(params: dict, cfg: ModelConfig, tokens: torch.Tensor, k: int, *,
                     n_layers: int) -> torch.Tensor:
    # k greedy tokens of the first n_layers blocks, with the model's final norm and LM head.
    ### BEGIN SOLUTION
    small = {**params, "layers": params["layers"][:n_layers]}
    small_cfg = dataclasses.replace(cfg, n_layers=n_layers)
    out = generate(small, small_cfg, tokens.reshape(1, -1), k)
    return out[0, tokens.numel():]
    ### END SOLUTION
""", "early_exit_draft"))

A(code("16-010", r"""
from checks.nb16 import check_early_exit_draft
check_early_exit_draft(early_exit_draft)
### BEGIN HIDDEN TESTS
check_early_exit_draft(early_exit_draft, thorough=True)
assert early_exit_draft(params, tiny, prompt[0], 3, n_layers=1).shape == (3,)
### END HIDDEN TESTS
""", "check_early_exit_draft", 2))

A(md("16-011", r"""
## Exercise 3 · `verify_draft`: every guess checked in one forward pass

The sequence so far ends with a token the cache has not seen yet, `last_token`, at position
`start_pos` (positions `0 .. start_pos-1` are cached). The draft guessed $d$ tokens
$g_0 \dots g_{d-1}$. Feed all of it, `[last_token, g_0, ..., g_{d-1}]`, $d + 1$ tokens, in **one**
call of `forward_with_cache` at `start_pos`. Row $i$ of the logits belongs to the token fed at
position `start_pos + i`, so its argmax $c_i$ is what greedy decoding would choose **after** it:

| fed | `last_token` | $g_0$ | $g_1$ | ... | $g_{d-1}$ |
|---|---|---|---|---|---|
| position | `start_pos` | `start_pos + 1` | `start_pos + 2` | ... | `start_pos + d` |
| argmax of its logits | $c_0$ | $c_1$ | $c_2$ | ... | $c_d$ |
| checks | $g_0 = c_0$? | $g_1 = c_1$? | $g_2 = c_2$? | ... | (none: the bonus) |

Accept guesses while $g_i = c_i$ and **stop at the first mismatch**: every later guess was made
after a token greedy decoding would not have produced, so its logits answer a question nobody
asked. With $m$ accepted, return `draft[:m]` followed by $c_m$: the model's own choice right after
the accepted guesses. That extra token is free (its logits came with the same pass) and is why a
round always makes progress, $m + 1 \ge 1$ tokens, even when every guess is wrong.

**Rolling the cache back.** The pass wrote K and V for all $d + 1$ positions, but only positions up
to `start_pos + m` belong to the sequence now; the rejected guesses' keys lie past it. Chapter 13's
cache keeps no length of its own: the caller says where to write, and attention reads positions
`0 .. start_pos + T - 1` only. So rolling back is nothing more than starting the next round at
`start_pos + m + 1`, where $c_m$ will be fed: its write overwrites the stale keys before anything
reads them.

`verify_draft(params, cfg, cache, last_token, draft, start_pos)` takes `last_token` an `int`,
`draft` a 1-D `LongTensor` of $d \ge 0$ guesses, and returns the 1-D `LongTensor` of $m + 1$ tokens.
"""))

A(code("16-012", r"""
def verify_draft(params: dict, cfg: ModelConfig, cache, last_token: int, draft: torch.Tensor,
                 start_pos: int) -> torch.Tensor:
    # The accepted guesses, then the model's own next token: m + 1 tokens, from ONE forward pass.
    ### BEGIN SOLUTION
    fed = torch.tensor([[int(last_token)] + draft.tolist()], device=params["embed"].device)
    with torch.no_grad():
        logits = forward_with_cache(fed, params, cfg, cache, start_pos)     # [1, d + 1, V]
    choices = logits[0].argmax(dim=-1)        # choices[i]: greedy's token after fed token i
    draft = draft.to(choices.device)
    m = 0
    while m < len(draft) and draft[m] == choices[m]:
        m += 1
    return torch.cat([draft[:m], choices[m:m + 1]])
    ### END SOLUTION
""", "verify_draft"))

A(code("16-013", r"""
from checks.nb16 import check_verify_draft
check_verify_draft(verify_draft)
### BEGIN HIDDEN TESTS
check_verify_draft(verify_draft, thorough=True)
_cache = checks.reference.KVCache(tiny, 1, 32)
_ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(16))
checks.reference.forward_with_cache(_ids[:, :5], params, tiny, _cache, 0)
assert verify_draft(params, tiny, _cache, int(_ids[0, 5]), torch.tensor([], dtype=torch.long),
                    5).shape == (1,)
### END HIDDEN TESTS
""", "check_verify_draft", 3))

A(md("16-014", r"""
## Exercise 4 · `speculative_generate`: the whole loop

`speculative_generate(params, cfg, prompt_ids, max_new_tokens, draft, *, k=4, cache=None)` returns
`(tokens, stats)`: `tokens` the `LongTensor` $[1, P + n]$ that chapter 13's greedy `generate` would
return, and `stats` a dict of three counts: `"forwards"` (forward passes, the prefill included),
`"drafted"` (guesses made) and `"accepted"` (guesses kept; the bonus tokens are not guesses).
One sequence (batch 1); `draft(tokens, k)` is any function of the sequence so far (1-D) and a
number of guesses, such as `lambda t, j: lookup_draft(t, j)`.

1. **Prefill** the whole prompt in one call at `start_pos = 0` (into `cache` when one is given,
   else into a new `KVCache` for $P + n$ positions); its last logits give new token 0.
2. **Rounds**, until the sequence holds $P + n$ tokens: ask the draft for at most
   $\min(k,\ \text{tokens still to make} - 1)$ guesses (the bonus token comes on top, so the output
   never overshoots and the cache never overflows; with no room, zero guesses make the round an
   ordinary decode step); verify them with the last token at its position, the sequence's length
   minus one; append the $m + 1$ tokens that come back.
3. No forward pass after the last token; `max_new_tokens = 0` returns the prompt without one.

The position of each round is the only bookkeeping there is, and it is the rollback: the next
round's last token sits right after the accepted ones. Advance by every token fed instead, and
the next round attends to rejected keys and leaves a gap in the positions.
"""))

A(code("16-015", r"""
def speculative_generate(params: dict, cfg: ModelConfig, prompt_ids: torch.Tensor,
                         max_new_tokens: int, draft, *, k: int = 4, cache=None):
    # (tokens [1, P + max_new_tokens], stats): greedy generate's tokens, k guesses at a time.
    ### BEGIN SOLUTION
    p = prompt_ids.shape[1]
    total = p + max_new_tokens
    tokens = prompt_ids[0].tolist()
    stats = {"forwards": 0, "drafted": 0, "accepted": 0}
    if max_new_tokens == 0:
        return prompt_ids.clone(), stats
    if cache is None:
        cache = KVCache(cfg, 1, total, dtype=params["embed"].dtype, device=prompt_ids.device)
    with torch.no_grad():
        logits = forward_with_cache(prompt_ids, params, cfg, cache, 0)      # prefill
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
    ### END SOLUTION
""", "speculative_generate"))

A(code("16-016", r"""
from checks.nb16 import check_speculative_generate
check_speculative_generate(speculative_generate)
### BEGIN HIDDEN TESTS
check_speculative_generate(speculative_generate, thorough=True)
_out, _stats = speculative_generate(params, tiny, prompt, 0, lookup_draft)
assert torch.equal(_out, prompt) and _stats["forwards"] == 0
### END HIDDEN TESTS
""", "check_speculative_generate", 3))

A(md("16-017", r"""
On the tiny model: for every $k$ and both drafts, the tokens equal chapter 13's `generate`, while
the number of forward passes falls wherever the guesses are right. (The random model repeats
itself, so lookup guesses well; its first block alone is a poor guide to the whole model.)
"""))

A(code("16-018", r"""
spec_gen = checks.use_if_passing(speculative_generate, check_speculative_generate,
                                 checks.reference.speculative_generate)
n_new = demo_size(40, 6)
want = generate(params, tiny, prompt, n_new)
print(f"{'draft':<12} {'k':>2}  identical  forwards (generate: {n_new})  accepted")
for name, draft in [("lookup", lookup_draft),
                    ("first block", lambda t, j: early_exit_draft(params, tiny, t, j, n_layers=1))]:
    for k in demo_size([0, 2, 4, 8], [2]):
        out, stats = spec_gen(params, tiny, prompt, n_new, draft, k=k)
        share = stats["accepted"] / max(stats["drafted"], 1)
        print(f"{name:<12} {k:>2}  {str(torch.equal(out, want)):<9}  {stats['forwards']:>8}"
              f"{'':>19}{share:>8.0%}")
"""))

A(md("16-019", r"""
## On a real model: when does guessing pay?

**SmolLM2-135M-Instruct** (chapter 13) runs on your functions. Three tasks: two whose answer copies
a passage of the prompt (quote it; correct two misspellings in it) and one open chat, where the
answer is new text. For each, chapter 13's `generate` and your `speculative_generate` with prompt
lookup for several $k$, and the first 8 of the 30 blocks as a draft (on fewer tokens: it is slow). Reported: the acceptance rate
(guesses kept / guesses made), new tokens per forward pass, the seconds of both and the speed-up,
and whether the tokens are identical (they must be). Timings depend on the machine and on what
else runs on it; the counts do not.
"""))

A(code("16-020", r"""
device = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if device == "cuda" else None      # time GPU work to its end
try:
    real_params, real_cfg = smollm.load(device=device)
    tok = smollm.tokenizer()
except (smollm.ModelUnavailable, smollm.ModelFileError) as why:
    real_params = real_cfg = tok = None
    print(f"{why}. The rest of this chapter runs on the tiny random model.")
if real_params is None:
    m_params, m_cfg = params, tiny
    prompts = {"quote": prompt, "chat": prompt[:, :12]}
else:
    m_params, m_cfg = real_params, real_cfg
    prompts = {name: torch.tensor([tok.chat_prompt(message)], device=device)
               for name, (message, _copies) in speculation.TASKS.items()}
n_real = demo_size(32, 3)
ks = demo_size([2, 4, 8], [2])
rows = []
for task, ids in demo_size(prompts, dict(list(prompts.items())[:1])).items():
    rows += speculation.measure(m_params, m_cfg, ids, n_real,
                                drafts={"lookup": speculation.lookup(lookup_draft)}, ks=ks,
                                generate=generate, speculative_generate=spec_gen, task=task,
                                sync=sync)
# The early exit, on fewer tokens: each round runs the first blocks over the whole context.
first = min(8, m_cfg.n_layers - 1)
rows += speculation.measure(m_params, m_cfg, prompts["quote"], demo_size(12, 3),
                            drafts={f"first {first}": speculation.early_exit(
                                early_exit_draft, m_params, m_cfg, first)},
                            ks=[2], generate=generate, speculative_generate=spec_gen,
                            task="quote", sync=sync)
print(speculation.format_table(rows))
"""))

A(code("16-021", r"""
speculation.plot([r for r in rows if r["draft"] == "lookup"])
plt.show()
if tok is not None:
    out, _ = spec_gen(m_params, m_cfg, prompts["quote"], n_real, speculation.lookup(lookup_draft),
                      k=4)
    print("quote:", repr(tok.decode(out[0, prompts["quote"].shape[1]:].tolist())))
"""))

A(md("16-022", r"""
How to read it:

- **Quoting** is where lookup shines: almost every guess is right, so a round makes close to
  $k + 1$ tokens, and the speed-up grows with $k$ until a wide verification pass stops being
  nearly free. The output is the same as `generate`'s, to the token.
- **Editing** a passage accepts guesses between the edits and rejects them at each change; once
  the answer is past an edit, lookup finds the passage again.
- **Open chat** rarely repeats its prompt: guesses are few and mostly wrong, and each rejected
  guess still widened a forward pass. Speculation then costs a little instead of saving; a server
  turns it off or lowers $k$ when the acceptance rate drops.
- **The early exit** without training is a poor guesser: the first blocks' output is not yet what
  the LM head expects (chapter 12's logit lens sees the same). LayerSkip trains the model so that
  early layers predict well; Medusa and EAGLE train small extra heads. Each pays only if its
  acceptance times the tokens per round beats its own cost.

On a GPU the same code runs on `device = "cuda"`; `python -m checks.tools.benchmark --only
speculative` prints the same table for the course's functions.
"""))

A(md("16-023", r"""
## Exercise 5 · `accept_sampled`: the sampling form

With sampling (temperature > 0) "the token greedy decoding would choose" no longer exists; the
output must instead be **distributed** as the model's own. Let $p_i$ be the model's distribution
at fed position $i$ (the rows of `softmax(logits / T)`) and $q_i$ the draft's, from which guess
$g_i$ was drawn. The rule (Leviathan et al. 2023, Chen et al. 2023):

1. For $i = 0, 1, \dots$: draw $u$ uniform in $[0, 1)$ and **accept** $g_i$ when
   $u \cdot q_i(g_i) < p_i(g_i)$, that is with probability $\min\!\big(1, p_i(g_i) / q_i(g_i)\big)$.
   Written this way there is no division: a guess the draft gave probability 0 is accepted
   whenever $p > 0$.
2. At the first **rejection**, draw the replacement from the **residual**
   $\max(0,\ p_i - q_i)$, normalised, and stop.
3. If all $k$ guesses are accepted, draw a **bonus** token from $p_k$.

Why it is exact, for one position: the guess $x$ comes out accepted with probability
$q(x) \min(1, p(x)/q(x)) = \min(p(x), q(x))$. A rejection happens with probability
$\beta = 1 - \sum_x \min(p(x), q(x))$ and then gives $x$ with probability
$\max(0, p(x) - q(x)) / \beta$ (the residual's total is $\beta$ too). Together:
$\min(p, q) + \max(0, p - q) = p$. Drawing the replacement from $p$ instead would give the tokens
the draft already proposes a second chance.

`accept_sampled(p, q, draft, *, generator=None)` takes `p` $[k + 1, |V|]$, `q` $[k, |V|]$, `draft`
a 1-D `LongTensor` of $k$ guesses, and returns the 1-D `LongTensor` of the accepted guesses and one
drawn token. Use `generator` for every random number (`torch.rand(..., generator=generator)`,
`torch.multinomial(..., generator=generator)`). The check runs it hundreds of times and tests the
distribution of what comes out.
"""))

A(code("16-024", r"""
def accept_sampled(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, *,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    # One round of speculative sampling: accepted guesses, then one token drawn.
    ### BEGIN SOLUTION
    k = len(draft)
    for i in range(k):
        g = int(draft[i])
        u = float(torch.rand(1, generator=generator))
        if u * q[i, g] < p[i, g]:              # probability min(1, p/q), and no division
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        fix = torch.multinomial(residual / residual.sum(), 1, generator=generator)
        return torch.cat([draft[:i], fix])
    return torch.cat([draft, torch.multinomial(p[k], 1, generator=generator)])
    ### END SOLUTION
""", "accept_sampled"))

A(code("16-025", r"""
from checks.nb16 import check_accept_sampled
check_accept_sampled(accept_sampled)
### BEGIN HIDDEN TESTS
check_accept_sampled(accept_sampled, thorough=True)
_p = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
_q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
assert accept_sampled(_p, _q, torch.tensor([0])).tolist() == [1]
### END HIDDEN TESTS
""", "check_accept_sampled", 3))

A(md("16-026", r"""
The proof, as an experiment: a model distribution $p$ and a draft $q$ that disagree, many rounds
with guesses drawn from $q$, and how often each token comes out first. Your sampler's frequencies
sit on $p$; the rule with the replacement drawn from $p$ instead of the residual does not.
"""))

A(code("16-027", r"""
sampler = checks.use_if_passing(accept_sampled, check_accept_sampled,
                                checks.reference.accept_sampled)
p_demo = torch.tensor([[0.5, 0.3, 0.1, 0.1, 0.0], [0.2] * 5], dtype=torch.float64)
q_demo = torch.tensor([[0.1, 0.3, 0.5, 0.0, 0.1]], dtype=torch.float64)
rounds = demo_size(20000, 200)
g = torch.Generator().manual_seed(0)
guesses = torch.multinomial(q_demo[0], rounds, replacement=True, generator=g)
firsts = [int(sampler(p_demo, q_demo, guesses[i:i + 1], generator=g)[0]) for i in range(rounds)]
yours = torch.bincount(torch.tensor(firsts), minlength=5) / rounds
both = torch.minimum(p_demo[0], q_demo[0])
from_p = both + (1 - both.sum()) * p_demo[0]          # the mistake's distribution, worked out
x = torch.arange(5)
plt.figure(figsize=(7, 3))
plt.bar(x - 0.27, p_demo[0], width=0.27, label="the model's p")
plt.bar(x, yours, width=0.27, label=f"your sampler ({rounds} rounds)")
plt.bar(x + 0.27, from_p, width=0.27, label="replacement drawn from p (wrong)")
plt.plot(x, q_demo[0], "k.", label="the draft's q")
plt.xlabel("token")
plt.ylabel("share of first tokens")
plt.legend(fontsize=8)
plt.show()
print("largest gap to p:", f"{float((yours - p_demo[0]).abs().max()):.3f}")
"""))

A(md("16-028", r"""
## What you built, and what else there is

- A round costs one forward pass over $d + 1$ tokens and yields $m + 1$ tokens: the speed-up is
  roughly $(m + 1)$ divided by the cost of the wider pass plus the draft's. It needs guesses that
  are both cheap and right.
- Greedy speculative decoding is exactly greedy decoding; the sampling form is exactly sampling.
  Neither trades quality for speed, which is why every serving stack ships one.
- Drafts in the wild: prompt lookup (what you wrote), a small model of the same family, extra heads
  (Medusa, EAGLE) that guess several positions from the last hidden state, and self-speculation
  with early exits trained for it (LayerSkip). Tree attention verifies several guessed branches in
  the same pass.
- With a batch of requests the weights are already shared across sequences, so decode is less
  memory-bound and speculation pays less; serving systems (chapter 15) weigh the two.
"""))


def main() -> None:
    base = json.loads((ROOT / "solutions" / "13_generation_kv_cache" /
                       "13_generation_kv_cache.ipynb").read_text(encoding="utf-8"))
    nb = {"cells": [base["cells"][0]] + CELLS,
          "metadata": {**base["metadata"], "course": {"chapter": "16_speculative"}},
          "nbformat": base["nbformat"], "nbformat_minor": base["nbformat_minor"]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                   encoding="utf-8")


if __name__ == "__main__":
    main()
