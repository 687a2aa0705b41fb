"""Chapter 12's sampling check, its statistics and the mistakes it names (checks.nb12 holds
`check_sample_next_token` itself).

Each distribution is sampled N times (N rows of the same logits, so the batch rows must be
independent draws) and every empirical frequency must lie within a Hoeffding bound of its
probability; the bound is chosen so that a correct sampler fails a run with probability below
1e-10 (a union bound over every token of every distribution a run compares).

Top-k follows the contract's tie rule: every token whose logit equals the k-th largest is kept
(`scores < kth` is dropped). Fixed cases make each known mistake show at every seed: logits tied
with the k-th largest (a top-k keeping exactly k tokens), top_k larger than the vocabulary, and a
batch of different rows whose k-th largest logits differ (one threshold for the whole batch).
"""

from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from ..engine import Check, LearnerError, is_remote
from ..i18n import N_, _
from ..mistakes import Mistake
from ..reference import model as ref_model

#: Samples drawn from each distribution that is compared with its expected probabilities.
N_SAMPLES = 40_000
#: The most distributions one run compares (thorough included), for the union bound.
MAX_COMPARISONS = 16
#: The most tokens in one compared distribution.
MAX_VOCAB = 9
#: A correct sampler fails one check run with probability at most this.
FAILURE_PROBABILITY = 1e-10


def frequency_tolerance(n: int = N_SAMPLES) -> float:
    """Largest allowed |frequency - probability| for any token.

    Hoeffding: P(|count / n - p| >= t) <= 2 exp(-2 n t^2) for one token; a union bound over the
    MAX_VOCAB tokens of MAX_COMPARISONS distributions puts the chance that a correct sampler
    exceeds t anywhere in a run at FAILURE_PROBABILITY or less.
    """
    events = MAX_VOCAB * MAX_COMPARISONS
    return math.sqrt(math.log(2 * events / FAILURE_PROBABILITY) / (2 * n))


TOL = frequency_tolerance()

GREEDY_ERROR = Mistake("divided_by_zero_temperature", N_(
    "temperature 0 means greedy decoding: return logits.argmax(-1) without sampling (dividing by "
    "0 gives inf and NaN probabilities)"),
    raises=[("RuntimeError", None), ("ZeroDivisionError", None), ("ValueError", None)])
GREEDY_ARGMIN = Mistake("greedy_argmin", N_(
    "took the argmin: greedy decoding picks the LARGEST logit, argmax"))
GREEDY_AXIS = Mistake("argmax_over_batch_axis", N_(
    "took the argmax over the batch axis (dim=0): each row is one sequence's logits over the "
    "vocabulary, so take argmax(dim=-1)"))
NAN_PROBS = Mistake("nan_probabilities", N_(
    "the probabilities hold NaN, inf or negative numbers: take the softmax over the vocabulary "
    "axis (dim=-1) of logits / T, after setting the dropped logits to -inf (a softmax over "
    "another axis gives NaN where a whole column is -inf)"),
    raises=[("RuntimeError", r"probability tensor")])
KEEPDIM = Mistake("returned_b_by_1", N_(
    "returned [B, 1]: return one token id per row, shape [B] (squeeze the last axis, e.g. "
    "torch.multinomial(...).squeeze(-1) or argmax(dim=-1) without keepdim)"))
TEMP_IGNORED = Mistake("temperature_ignored", N_(
    "ignored the temperature: divide the logits by T before the softmax"))
TEMP_MULTIPLIED = Mistake("temperature_multiplied", N_(
    "multiplied the logits by T: temperature DIVIDES them, softmax(logits / T), so T < 1 sharpens "
    "and T > 1 flattens the distribution"))
TOPK_IGNORED = Mistake("top_k_ignored", N_(
    "ignored top_k: keep only the k largest logits (set the others to -inf)"))
TOPK_SMALLEST = Mistake("kept_k_smallest", N_(
    "kept the k SMALLEST logits: top-k keeps the k largest (torch.topk's default)"))
TOPK_PLUS_ONE = Mistake("kept_k_plus_one", N_(
    "kept k + 1 tokens: top_k keeps the k largest logits (and more only when they tie with the "
    "k-th largest)"))
TOPK_MINUS_ONE = Mistake("kept_k_minus_one", N_(
    "kept k - 1 tokens (a mask with `<=` drops the k-th largest logit itself): top_k keeps the k "
    "largest logits and drops only those below the k-th, scores < kth"))
TOPK_ZERO_FILL = Mistake("dropped_logits_set_to_zero", N_(
    "set the dropped logits to 0 instead of -inf: exp(0) = 1 still gives them weight; fill with "
    "float('-inf') so that their probability is exactly 0"))
TIES_DROPPED = Mistake("ties_dropped", N_(
    "kept exactly k tokens although a logit ties with the k-th largest: the tie rule keeps every "
    "token whose logit equals the k-th largest (drop scores < kth, with kth = torch.topk(scores, "
    "k).values[..., -1:]; torch.topk's indices choose among tied tokens arbitrarily)"))
ONE_THRESHOLD = Mistake("one_threshold_for_the_batch", N_(
    "used one top-k threshold for the whole batch (row 0's k-th largest logit): each row keeps its "
    "own k largest logits; kth = torch.topk(scores, k).values[..., -1:] gives one threshold per "
    "row"))
THRESHOLD_NO_KEEPDIM = Mistake("threshold_without_keepdim", N_(
    "compared the [B, |V|] scores with a [B] threshold (topk(...).values[..., -1] drops the last "
    "axis): keep it, values[..., -1:], so that each row's threshold broadcasts over its own row"),
    raises=[("RuntimeError", r"must match the size of tensor")])
TOPK_TOO_LARGE = Mistake("top_k_larger_than_vocabulary", N_(
    "top_k may be larger than the vocabulary, and then every token is kept: torch.topk raises "
    "for k > |V|, so use min(top_k, |V|) or skip the filter when top_k >= |V|"),
    raises=[("RuntimeError", r"selected index k out of range|k \(\d+\) is too big|out of range")])
EVERY_LOGIT_MASKED = Mistake("every_logit_masked", N_(
    "set every logit of a row to -inf, so its softmax is NaN: with top_k=1 the k-th largest logit "
    "is the largest itself, and it must stay (drop scores < kth, not scores <= kth)"),
    raises=[("RuntimeError", r"probability tensor")])
NOT_GREEDY_AT_K1 = Mistake("top_k_1_not_argmax", N_(
    "keep the k largest logits and set every other logit to -inf before the softmax"))
UNIFORM = Mistake("uniform_over_vocabulary", N_(
    "sampled uniformly over the vocabulary: draw in proportion to softmax(logits / T) "
    "(torch.multinomial(probs, 1)); a softmax over the batch axis (dim=0) also looks like this "
    "when the rows are alike"))
UNIFORM_TOPK = Mistake("uniform_among_top_k", N_(
    "sampled uniformly among the k kept tokens: weight them by softmax(logits / T)"))
SAME_ROW = Mistake("one_draw_for_all_rows", N_(
    "every row of the batch got the same token: each row is its own sequence and needs its own "
    "draw (torch.multinomial(probs, 1) draws one per row)"))
GENERATOR_IGNORED = Mistake("generator_ignored", N_(
    "draw the random numbers from the `generator` argument: torch.multinomial(probs, 1, "
    "generator=generator) (torch.distributions' .sample() cannot take a generator)"))
FIXED_SEED = Mistake("fixed_seed_inside", N_(
    "the samples must come from the `generator` argument; a fixed seed (or a new "
    "torch.Generator()) inside the function makes them the same every time"))
OUT_OF_TOP_K = Mistake("token_outside_top_k", N_(
    "top-k must drop every token outside the k largest logits: set their logits to -inf before "
    "the softmax (e.g. below torch.topk(logits, k).values[..., -1:])"))
NONE_FRESH = Mistake("new_generator_when_none", N_(
    "with generator=None draw from torch's global generator (torch.multinomial(..., "
    "generator=None) does), which moves on after every draw"))
NONE_NOT_GLOBAL = Mistake("none_not_global_generator", N_(
    "with generator=None draw from torch's global generator"))
NOT_INT64 = Mistake("token_ids_not_int64", N_(
    "token ids are integers: return the int64 tensor argmax or torch.multinomial gives, as it is "
    "(no .float(), no arithmetic on it in floating point)"))
SQUEEZED = Mistake("squeezed_batch_of_one", N_(
    "returned a 0-dim tensor for a batch of one row: .squeeze() drops EVERY axis of size 1, the "
    "batch axis too; squeeze only the last axis, .squeeze(-1), so that one row gives shape [1]"))
TEMP_AFTER_SOFTMAX = Mistake("temperature_after_softmax", N_(
    "divided the probabilities by T after the softmax: sampling normalises the weights again "
    "(torch.multinomial draws in proportion to them), so T changes nothing; divide the LOGITS by "
    "T before the softmax, softmax(logits / T)"))
TEMP_TWICE = Mistake("temperature_applied_twice", N_(
    "divided the logits by T twice (the samples follow softmax(logits / T**2)): divide once, "
    "softmax(logits / T)"))
TEMP_SQRT = Mistake("temperature_square_root", N_(
    "divided the logits by sqrt(T), not by T (the samples follow softmax(logits / sqrt(T))): "
    "the temperature divides the logits themselves, softmax(logits / T) (the 1 / sqrt(D) of "
    "attention's scores is another scale)"))
TOPK_FLAT = Mistake("top_k_over_flattened_batch", N_(
    "took the top k over the whole batch at once (torch.topk of the flattened logits, or without "
    "dim=-1 on a view): its k-th largest value is one threshold for every row, and with many "
    "rows it keeps little more than the largest logit; take each row's own k largest, "
    "torch.topk(scores, k, dim=-1).values[..., -1:]"))
TOPK_INDEX = Mistake("returned_position_among_top_k", N_(
    "returned the position of the drawn token among the k kept ones (0 .. k-1), not its token "
    "id: map it back through the indices torch.topk gave, indices.gather(-1, choice)"))
ALWAYS_GREEDY = Mistake("greedy_at_every_temperature", N_(
    "returned the argmax although temperature > 0: only temperature 0 is greedy; otherwise draw "
    "from softmax(logits / T) with torch.multinomial(probs, 1, generator=generator)"))
TOPK_COVERS_DROPPED = Mistake("token_dropped_when_top_k_covers_vocabulary", N_(
    "with top_k >= |V| one token (the smallest logit) was never drawn: top_k >= |V| keeps every "
    "token; a mask `scores <= kth` drops the k-th largest itself, and min(top_k, |V| - 1) drops "
    "one token too (use min(top_k, |V|) and drop only scores < kth)"))
SOFTMAX_OVERFLOW = Mistake("softmax_overflows_for_large_logits", N_(
    "the sampler breaks on large logits (about ±1000): a softmax written by hand, exp(s) / "
    "exp(s).sum(), overflows to inf (and inf / inf is NaN), and subtracting ONE maximum for the "
    "whole batch underflows the other rows to 0; use torch.softmax(scores, dim=-1), which "
    "subtracts each row's own largest score"),
    raises=[("RuntimeError", r"probability tensor|invalid multinomial|sum of probabilities"),
            ("ValueError", r"probs|Categorical")])
IN_PLACE = Mistake("logits_changed_in_place", N_(
    "`logits /= temperature` or `logits[...] = -inf` writes into the caller's tensor; compute "
    "into a new tensor (`scores = logits / temperature`, `masked_fill`)"))

#: What an exception of the learner's sampler means, by phase of the check.
GREEDY_ERRORS = (GREEDY_ERROR,)
SAMPLING_ERRORS = (THRESHOLD_NO_KEEPDIM, TOPK_TOO_LARGE, NAN_PROBS)
TOP_1_ERRORS = (THRESHOLD_NO_KEEPDIM, EVERY_LOGIT_MASKED)


def spread_logits(c: Check, v: int, shift: float = 0.0) -> torch.Tensor:
    """One row of well-separated logits in random order: distinct, spread from about -2 to 2.5
    (plus `shift`), so that every mistake changes some token's probability by a lot."""
    values = torch.linspace(-2.0, 2.5, v, dtype=torch.float64) + shift
    values = values + (torch.rand(v, generator=c.gen, dtype=torch.float64) - 0.5) * 0.2
    return values[torch.randperm(v, generator=c.gen)].to(torch.float32)


def tied_logits(c: Check, v: int, k: int) -> torch.Tensor:
    """Spread logits whose (k+1)-th largest equals the k-th largest: the tie rule keeps k + 1."""
    row = spread_logits(c, v)
    order = row.argsort(descending=True)
    row[order[k]] = row[order[k - 1]]
    return row


def probs(row: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    return ref_model.next_token_probs(row[None], temperature=temperature, top_k=top_k)[0]


def keep(row: torch.Tensor, k: int, largest: bool = True) -> torch.Tensor:
    """The tokens top-k keeps under the tie rule: the k largest (or smallest) logits, and every
    logit equal to the k-th."""
    kth = torch.topk(row, k, largest=largest).values[-1]
    return row >= kth if largest else row <= kth


def _keep_exactly(row: torch.Tensor, k: int, drop_tied: int | None = None) -> torch.Tensor:
    """Exactly k tokens: those above the k-th largest logit and, among the tied ones, all but
    `drop_tied` (the choice torch.topk's indices or a sort might make)."""
    kth = torch.topk(row, k).values[-1]
    out = row > kth
    tied = (row == kth).nonzero().flatten().tolist()
    for j in tied:
        if j != drop_tied and int(out.sum()) < k:
            out[j] = True
    return out


def _masked_softmax(scores: torch.Tensor, kept: torch.Tensor, fill: float = float("-inf")):
    return torch.softmax(scores.double().masked_fill(~kept, fill), dim=-1)


def sampling_mixups(row: torch.Tensor, temperature: float, top_k: int | None,
                    first_row: torch.Tensor | None = None) -> list[tuple[Mistake, torch.Tensor]]:
    """(mistake, the distribution it would sample from), in the order they are tried;
    `first_row`: the batch's row 0, whose threshold a sampler with one threshold for the batch
    applies to `row`."""
    v = row.shape[-1]
    k = v if top_k is None else min(top_k, v)
    kept = keep(row, k)
    scaled = row.double() / temperature
    wrong = {}
    if temperature != 1:
        wrong[TEMP_IGNORED] = _masked_softmax(row, kept)
        wrong[TEMP_MULTIPLIED] = _masked_softmax(row.double() * temperature, kept)
        wrong[TEMP_TWICE] = _masked_softmax(row.double() / temperature ** 2, kept)
        wrong[TEMP_SQRT] = _masked_softmax(row.double() / math.sqrt(temperature), kept)
    if top_k is None:
        wrong[ALWAYS_GREEDY] = _masked_softmax(scaled, keep(row, 1))
    elif top_k >= v:
        wrong[TOPK_COVERS_DROPPED] = _masked_softmax(scaled, keep(row, v - 1))
    if k < v:
        wrong[TOPK_IGNORED] = torch.softmax(scaled, -1)
        wrong[TOPK_SMALLEST] = _masked_softmax(scaled, keep(row, k, largest=False))
        if first_row is not None:
            kth = torch.topk(first_row, k).values[-1]
            if bool((row >= kth).any()):
                wrong[ONE_THRESHOLD] = _masked_softmax(scaled, row >= kth)
        wrong[TOPK_PLUS_ONE] = _masked_softmax(scaled, keep(row, k + 1))
        if k > 1:
            wrong[TOPK_MINUS_ONE] = _masked_softmax(scaled, keep(row, k - 1))
        wrong[TOPK_ZERO_FILL] = _masked_softmax(scaled, kept, fill=0.0)
        wrong[UNIFORM_TOPK] = kept.double() / kept.sum()
    if top_k is not None and k > 1:
        top = torch.softmax(torch.sort(scaled, descending=True).values[:k], -1)
        wrong[TOPK_INDEX] = torch.cat([top, torch.zeros(v - k, dtype=torch.float64)])
    if top_k is not None and k > 1 and first_row is None:
        # N copies of one row: the k-th largest of the flattened batch is the row's largest
        wrong[TOPK_FLAT] = _masked_softmax(scaled, keep(row, 1))
    wrong[UNIFORM] = torch.full((v,), 1.0 / v, dtype=torch.float64)
    pairs = list(wrong.items())
    if k < v and int(kept.sum()) > k:   # tied with the k-th largest: each choice of k tokens
        tied = (row == torch.topk(row, k).values[-1]).nonzero().flatten().tolist()
        pairs[:0] = [(TIES_DROPPED, _masked_softmax(scaled, _keep_exactly(row, k, drop_tied=j)))
                     for j in tied]
    return pairs


def sample(c: Check, logits: torch.Tensor, label: str, **kwargs) -> torch.Tensor:
    """Call the learner; check the output's type, shape, dtype and range (an exception names the
    mistake of the check's current `errors`, an input changed in place its `in_place`)."""
    got = c.call(logits, **kwargs)
    b, v = logits.shape
    if not isinstance(got, torch.Tensor) or type(got) not in (torch.Tensor, torch.nn.Parameter):
        c.fail(_("returned {kind} ({case}); expected a LongTensor [B] of token ids.").format(
            kind=type(got).__name__, case=label))
    if got.shape != (b,):
        hint = KEEPDIM if tuple(got.shape) == (b, 1) else (
            GREEDY_AXIS if tuple(got.shape) == (v,) else
            SQUEEZED if b == 1 and got.dim() == 0 else None)
        c.fail(_("returned shape {shape} ({case}); expected [B={b}], one token id per row.")
               .format(shape=list(got.shape), case=label, b=b), hint)
    if got.dtype != torch.int64:
        c.fail(_("returned dtype {dtype} ({case}); expected torch.int64 (token ids, as argmax "
                 "and multinomial return them).").format(dtype=got.dtype, case=label),
               NOT_INT64)
    if bool(((got < 0) | (got >= v)).any()):
        c.fail(_("returned token ids outside 0 .. |V|-1 = {last} ({case}).").format(
            last=v - 1, case=label))
    return got


def _closest(freq: torch.Tensor, wrong: list, tol: float) -> Mistake | None:
    """The mistake whose distribution the frequencies are closest to, among those within `tol`
    (the first listed of equally close ones: some mistakes give the same distribution)."""
    best, best_dev = None, tol
    for mistake, q in wrong:
        dev = float((freq - q).abs().max())
        if dev < best_dev - 1e-9 or (best is None and dev <= tol):
            best, best_dev = mistake, dev
    return best


class _ProbabilitiesDivided(TorchFunctionMode):
    """Watches for a division of a probability tensor (rows >= 0 summing to 1) by `temperature`."""

    _DIVISIONS = {torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.div_,
                  torch.Tensor.__truediv__, torch.Tensor.__itruediv__}

    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._DIVISIONS and len(args) >= 2 and isinstance(args[0], torch.Tensor) and \
                isinstance(args[1], (int, float)) and float(args[1]) == self.temperature:
            with torch._C.DisableTorchFunction():
                t = args[0].detach()
                if t.is_floating_point() and t.numel() and bool((t >= 0).all()) and \
                        bool(((t.sum(-1) - 1).abs() < 1e-3).all()):
                    self.seen = True
        return func(*args, **kwargs)


def temperature_after_softmax(c: Check, temperature: float, top_k: int | None) -> bool:
    """Whether the learner's sampler divides probabilities (not logits) by the temperature,
    which samples exactly as a sampler that ignores it. Told by what the function does: here, a
    division of a probability tensor by T is watched on one small call; in another process (the
    grader's worker), a call with T = 1e300 tells it: float32 probabilities divided by it are all
    0, which torch.multinomial refuses, while a sampler that ignores T cannot fail on it, and one
    that divides the logits samples almost uniformly."""
    logits = torch.linspace(-2.0, 2.5, 7).repeat(4, 1)
    if not is_remote(c.fn):
        watch = _ProbabilitiesDivided(temperature)
        try:
            with watch:
                c.fn(logits, temperature=temperature, top_k=top_k,
                     generator=torch.Generator().manual_seed(0))
        except Exception:   # noqa: BLE001 - the probe only refines a diagnosis
            return False
        return watch.seen
    try:
        c.call(logits, temperature=1e300, top_k=top_k, generator=torch.Generator().manual_seed(0))
    except LearnerError:
        return True
    return False


def expect_distribution(c: Check, samples: torch.Tensor, want: torch.Tensor, wrong: list,
                        label: str, fallback: Mistake | None = None,
                        refine=None) -> None:
    """Empirical frequencies of `samples` against `want` [V], within TOL for every token;
    `fallback`: the mistake a mismatch no known mistake explains means in this case; `refine`:
    a function that may turn the mistake found into a more precise one."""
    v = want.shape[-1]
    n = samples.numel()
    tol = frequency_tolerance(n)
    freq = torch.bincount(samples, minlength=v).double() / n
    dev = (freq - want).abs()
    if float(dev.max()) <= tol:
        return
    hint = _closest(freq, wrong, tol) or fallback
    if refine is not None and hint is not None:
        hint = refine(hint)
    if hint is None and n > 1 and bool((samples == samples[0]).all()) and \
            float(want.max()) < 0.9:
        c.fail(_("all {count} rows of the same logits got the same token {token} ({case}).")
               .format(count=n, token=int(samples[0]), case=label), SAME_ROW)
    worst = int(dev.argmax())
    c.fail(_("sampled token {token} with frequency {freq} in {count} draws, but its probability "
             "is {prob} ({case}; a correct sampler stays within ±{tol} of every probability "
             "except with probability < {bound}).\n  expected: {expected}\n  observed: "
             "{observed}").format(
        token=worst, freq=f"{float(freq[worst]):.3f}", count=n, prob=f"{float(want[worst]):.3f}",
        case=label, tol=f"{tol:.3f}", bound=f"{FAILURE_PROBABILITY:g}",
        expected=[round(float(p), 3) for p in want], observed=[round(float(p), 3) for p in freq]),
        hint)


def case_label(v: int, temperature: float, top_k: int | None, defaults: bool = False,
               ties: bool = False) -> str:
    if defaults:
        return _("{count} tokens, defaults (temperature=1.0, top_k=None)").format(count=v)
    label = (_("{count} tokens, temperature={temperature}, top_k={top_k}, two logits tied with "
               "the k-th largest") if ties else
             _("{count} tokens, temperature={temperature}, top_k={top_k}"))
    return label.format(count=v, temperature=f"{temperature:g}", top_k=top_k)


def _always_argmax(c: Check, row: torch.Tensor, temperature: float, top_k: int | None) -> bool:
    """Whether the sampler returns the argmax for every row whatever the generator's seed (a
    sampler that draws once for the whole batch returns the same token too, but not always the
    argmax)."""
    logits = row.repeat(64, 1)
    for seed in range(1, 9):
        got = c.call(logits, temperature=temperature, top_k=top_k,
                     generator=torch.Generator().manual_seed(seed))
        if not isinstance(got, torch.Tensor) or not bool((got == row.argmax()).all()):
            return False
    return True


def _refine(c: Check, row: torch.Tensor, temperature: float, top_k: int | None):
    """Tells apart mistakes whose samples look alike, by what the learner's function does."""
    def refine(hint: Mistake) -> Mistake:
        if hint == TEMP_IGNORED and temperature_after_softmax(c, temperature, top_k):
            return TEMP_AFTER_SOFTMAX
        if hint == ALWAYS_GREEDY and not _always_argmax(c, row, temperature, top_k):
            return SAME_ROW
        return hint
    return refine


def statistical_case(c: Check, v: int, temperature: float, top_k: int | None, *,
                     defaults: bool = False, ties: bool = False) -> None:
    """Sample N_SAMPLES rows of one row of logits (tied at the k-th largest with `ties`)."""
    row = tied_logits(c, v, top_k) if ties else spread_logits(c, v)
    logits = row.repeat(N_SAMPLES, 1)
    label = case_label(v, temperature, top_k, defaults, ties)
    gen = torch.Generator().manual_seed(c.randint(0, 2**31 - 1))
    kwargs = {"generator": gen} if defaults else {"temperature": temperature, "top_k": top_k,
                                                  "generator": gen}
    got = sample(c, logits, label, **kwargs)
    wrong = sampling_mixups(row, temperature, top_k)
    if top_k is not None and top_k < v:
        outside = got[~keep(row, top_k)[got]]
        if outside.numel():
            freq = torch.bincount(got, minlength=v).double() / got.numel()
            c.fail(_("returned token {token}, which is not among the top_k={top_k} largest "
                     "logits ({case}).").format(token=int(outside[0]), top_k=top_k, case=label),
                   _closest(freq, wrong, frequency_tolerance(got.numel())) or OUT_OF_TOP_K)
    expect_distribution(c, got, probs(row, temperature, top_k), wrong, label,
                        refine=_refine(c, row, temperature, top_k))


def batch_case(c: Check, thorough: bool) -> None:
    """A batch cycling through 3 different rows, each shifted (softmax does not see a shift, a
    threshold does): each row samples from its own distribution, with its own top-k threshold."""
    v = c.randint(6, MAX_VOCAB + 1)
    rows = torch.stack([spread_logits(c, v, shift=1.2 * i) for i in range(3)])
    logits = rows.repeat(N_SAMPLES, 1)                        # rows 0, 1, 2, 0, 1, 2, ...
    temperature, top_k = 1.4, c.randint(2, 4)
    label = _("a batch that cycles through 3 different rows, {count} tokens, "
              "temperature=1.4, top_k={top_k}").format(count=v, top_k=top_k)
    got = sample(c, logits, label, temperature=temperature, top_k=top_k,
                 generator=torch.Generator().manual_seed(c.randint(0, 2**31 - 1)))
    for i in (1, 0, 2)[:3 if thorough else 2]:
        expect_distribution(c, got[i::3], probs(rows[i], temperature, top_k),
                            sampling_mixups(rows[i], temperature, top_k, rows[0]),
                            _("{case}: row pattern {i}").format(case=label, i=i))


def huge_case(c: Check) -> None:
    """Large logits on the sampling paths: a batch whose rows alternate around +1000 and -1000
    with top_k >= |V| (every token kept), then rows around +1000 with top_k < |V|. A softmax
    shifted by each row's own largest score samples exactly as for small logits; exp without a
    shift overflows, one shift for the whole batch underflows the other rows. (T = 2 gives the
    smallest logit a probability that a sampler dropping it cannot hide.)"""
    v = c.randint(6, MAX_VOCAB + 1)
    rows = torch.stack([spread_logits(c, v, shift=1000.0), spread_logits(c, v, shift=-1000.0)])
    temperature, top_k = 2.0, v + c.randint(0, 2)
    label = _("{count} tokens, temperature={temperature}, top_k={top_k}, rows alternating "
              "around +1000 and -1000").format(count=v, temperature=f"{temperature:g}",
                                               top_k=top_k)
    got = sample(c, rows.repeat(N_SAMPLES // 2, 1), label, temperature=temperature, top_k=top_k,
                 generator=torch.Generator().manual_seed(c.randint(0, 2**31 - 1)))
    for i in (0, 1):
        expect_distribution(c, got[i::2], probs(rows[i], temperature, top_k),
                            sampling_mixups(rows[i], temperature, top_k, rows[0]),
                            _("{case}: row pattern {i}").format(case=label, i=i),
                            fallback=SOFTMAX_OVERFLOW)
    top_k = c.randint(2, v - 1)
    row = spread_logits(c, v, shift=1000.0)
    label = _("{count} tokens, temperature=1, top_k={top_k}, logits around +1000").format(
        count=v, top_k=top_k)
    got = sample(c, row.repeat(N_SAMPLES // 2, 1), label, temperature=1.0, top_k=top_k,
                 generator=torch.Generator().manual_seed(c.randint(0, 2**31 - 1)))
    expect_distribution(c, got, probs(row, 1.0, top_k), [], label, fallback=SOFTMAX_OVERFLOW)
