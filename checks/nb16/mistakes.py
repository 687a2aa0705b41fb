"""The mistakes chapter 16's checks name (checks.mistakes): each declared once, in the words a
failure shows. A mistake's id is "16.<exercise>.<key>"."""

from __future__ import annotations

from ..i18n import N_
from ..mistakes import Mistake

# --------------------------------------------------------------------------------------------
# lookup_draft

LATEST_MATCH = Mistake("latest_match", N_(
    "took the most recent occurrence of the n-gram; the chapter's rule takes the earliest (in a "
    "passage being copied it has the longest continuation)"))
NO_SHORTER_NGRAM = Mistake("no_shorter_ngram", N_(
    "gave up after n = max_ngram: when the last max_ngram tokens never occurred before, try the "
    "last max_ngram - 1, and so on down to a single token (if your search found the last n-gram "
    "itself, nothing follows it: search only the windows that end before the last token)"))
SHORTEST_FIRST = Mistake("shortest_ngram_first", N_(
    "tried the shortest n-gram first: start with n = max_ngram (a longer match is a better "
    "guess) and go down only when it has no earlier occurrence"))
STARTS_INSIDE_MATCH = Mistake("starts_inside_match", N_(
    "the draft starts one token early, with the n-gram's own last token: propose the tokens that "
    "came after the whole match, tokens[i + n : i + n + k]"))
MORE_THAN_K = Mistake("more_than_k", N_(
    "proposed more than k tokens: the draft is at most k long"))
NOT_LONG_TENSOR = Mistake("not_a_long_tensor", N_(
    "return the draft as a 1-D LongTensor of token ids (an empty one when nothing matches)"))

# --------------------------------------------------------------------------------------------
# early_exit_draft

LAST_LAYERS = Mistake("last_layers", N_(
    "ran the last n_layers blocks: the early exit keeps the first ones "
    "(params['layers'][:n_layers]), whose output the final norm and LM head then read"))
LAYERS_OFF_BY_ONE = Mistake("layers_off_by_one", N_(
    "ran one block too many or too few: the draft model is blocks 0 .. n_layers-1"))
WHOLE_MODEL = Mistake("whole_model", N_(
    "ran every block: the draft is the model cut after n_layers blocks (cfg with n_layers = "
    "n_layers, params with layers[:n_layers])"))
RETURNS_CONTEXT = Mistake("returns_context", N_(
    "returned the context with the draft: return only the k new tokens"))

# --------------------------------------------------------------------------------------------
# verify_draft

PAST_MISMATCH = Mistake("accepts_past_mismatch", N_(
    "accepted draft tokens after the first mismatch: once a guess differs from the model's "
    "choice, every later guess was made after a wrong token, so stop at the first mismatch"))
NO_BONUS = Mistake("no_bonus_token", N_(
    "forgot the bonus token: after the m accepted guesses, append the model's own choice at "
    "position m (it is free: its logits came with the same forward pass)"))
BONUS_FROM_LAST = Mistake("bonus_from_last_position", N_(
    "took the extra token from the last position's logits even after a rejection: the model's "
    "own token is its choice right after the accepted ones, at position m"))
COMPARES_SHIFTED = Mistake("compares_shifted", N_(
    "compared each guess with the wrong position's choice: logits at fed position i (the last "
    "token, then the guesses) predict the token after it, so guess i is checked against the "
    "argmax of position i"))
ONE_FORWARD_PER_TOKEN = Mistake("one_forward_per_token", N_(
    "ran several forward passes: verification feeds the last token and all k guesses in ONE call "
    "of forward_with_cache (that is the whole point: it costs about one decode step)"))
LAST_NOT_FED = Mistake("last_token_not_fed", N_(
    "fed only the guesses: feed [last_token, *draft] at start_pos; the last token's logits are "
    "what the first guess is checked against"))
FED_AT_WRONG_POSITION = Mistake("fed_at_wrong_position", N_(
    "fed the tokens at the wrong position: last_token sits at start_pos, guess i at "
    "start_pos + 1 + i"))

# --------------------------------------------------------------------------------------------
# speculative_generate

NOT_ROLLED_BACK = Mistake("cache_not_rolled_back", N_(
    "did not roll the cache back: after m of d guesses were accepted, the next round starts at the "
    "position right after the accepted tokens (start_pos + m + 1), not after every token fed, so "
    "that the rejected guesses' keys are overwritten before anything reads them"))
POSITIONS_OFF_BY_ONE = Mistake("positions_off_by_one", N_(
    "the position is off by one after a round: the next round feeds the newest token at its own "
    "position, (tokens so far) - 1, which is start_pos + m + 1 after m accepted guesses"))
DRAFT_NOT_CAPPED = Mistake("draft_not_capped", N_(
    "drafted more tokens than the generation has room for: ask the draft for at most "
    "min(k, tokens still to make - 1), since the bonus token comes on top"))
IGNORES_CACHE_ARG = Mistake("ignores_cache_argument", N_(
    "made a cache of its own although one was given: use `cache` when it is not None"))
PREFILL_MISSING = Mistake("no_single_prefill", N_(
    "the first forward pass is not one prefill of the whole prompt at start_pos 0"))
FORWARD_AFTER_LAST = Mistake("forward_after_last", N_(
    "ran a forward pass after the last token was chosen: stop once the output has "
    "P + max_new_tokens tokens"))
NO_PROGRESS = Mistake("round_without_progress", N_(
    "a round added no token, so the loop never ends: every round appends the m accepted guesses "
    "and the model's own next token, m + 1 >= 1 tokens"))
STATS_MISCOUNTED = Mistake("stats_miscounted", N_(
    "the statistics are miscounted: 'forwards' counts every forward pass (the prefill too), "
    "'drafted' every token proposed by the draft, 'accepted' the proposed tokens kept (bonus "
    "tokens not included)"))

# --------------------------------------------------------------------------------------------
# accept_sampled

RESAMPLED_FROM_P = Mistake("resampled_from_p", N_(
    "after a rejection it drew the replacement from p: draw it from the residual max(0, p - q), "
    "normalised. p already gave the accepted tokens their chance; drawing from p again counts "
    "them twice"))
RESIDUAL_REVERSED = Mistake("residual_reversed", N_(
    "drew the replacement from max(0, q - p): the residual is max(0, p - q), the mass the model "
    "has and the draft under-proposed"))
ACCEPTS_ALWAYS = Mistake("accepts_always", N_(
    "accepted every guess: accept guess i with probability min(1, p[i, d_i] / q[i, d_i])"))
IGNORES_Q = Mistake("accepts_with_p", N_(
    "accepted a guess with probability p alone: the test is min(1, p / q), so a token the draft "
    "proposes often must also be likely under the model"))
DIVIDES_BY_ZERO_Q = Mistake("divides_by_zero_q", N_(
    "divided by q where q is 0: test u * q < p instead of u < p / q (a token the draft gave "
    "probability 0 is accepted whenever p > 0)"), raises=(
        ("ZeroDivisionError", None), ("RuntimeError", r"p_in|probability tensor contains"),
        ("ValueError", r"nan|NaN")))
BONUS_SAMPLED_WRONG = Mistake("bonus_from_wrong_row", N_(
    "when every guess was accepted, the extra token was drawn from the wrong distribution: draw "
    "it from p[k], the model's distribution after the last guess"))
NO_BONUS_SAMPLED = Mistake("no_bonus_token", N_(
    "forgot the bonus token: when all k guesses are accepted, draw one more token from p[k]"))
KEEPS_REJECTED = Mistake("keeps_rejected", N_(
    "kept the rejected guess (or a guess after it): the output is the accepted guesses, then one "
    "drawn token"))
GENERATOR_IGNORED = Mistake("generator_ignored", N_(
    "ignored the generator: pass generator=generator to torch.rand / torch.multinomial, so that a "
    "seeded run repeats"))
