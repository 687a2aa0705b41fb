"""Checks for chapter 03: architectures and their attention masks.

Boolean masks hold True where a query may attend to a key; rows are queries, columns are keys.
Causal masks are bottom-right aligned (query i sits at absolute position k_len - q_len + i).
"""

from __future__ import annotations

import torch

from .. import reference as ref
from ..engine import Check, numbers_apart
from ..i18n import N_, _
from ..mistakes import Mistake

_NOT_BOOL = Mistake("not_bool", N_(
    "a mask is boolean (True = may attend): build it from a comparison such as `<=`, or pass "
    "dtype=torch.bool; 0/1 integers or floats are a different kind of mask"))
_NO_DEFAULT = Mistake("k_len_without_default", N_(
    "k_len is optional: `def f(q_len, k_len=None)`, and k_len = q_len when it is not given"),
    raises=[("TypeError", r"missing 1 required positional argument")])
_TOP_LEFT = Mistake("top_left_aligned", N_(
    "top-left aligned (`torch.tril(torch.ones(q_len, k_len))`): the queries are the LAST q_len "
    "of the k_len positions, so query i sits at position k_len - q_len + i and sees keys 0 ..= "
    "k_len - q_len + i; shift the diagonal by k_len - q_len"))
_SHIFT_SIGN = Mistake("diagonal_shifted_wrong_way", N_(
    "shifted the diagonal the wrong way: query i sits at position k_len - q_len + i, so the "
    "diagonal is k_len - q_len (`torch.tril(ones, diagonal=k_len - q_len)`), not q_len - k_len"))
_INVERTED = Mistake("inverted", N_(
    "inverted: True must mean 'may attend' (the past and the query's own position), not "
    "'blocked'; `torch.triu(..., diagonal=1)` marks the blocked future instead"))
_NO_DIAGONAL = Mistake("diagonal_excluded", N_(
    "off by one: a query may also attend to its own position, so the diagonal must be True "
    "(use `<=`, not `<`)"))
_ONE_AHEAD = Mistake("sees_one_future_key", N_(
    "off by one: each query also sees the next, future key; the last key query i may see is "
    "its own position k_len - q_len + i"))
_TRANSPOSED = Mistake("transposed", N_(
    "transposed: rows are queries and columns are keys, so the mask is [q_len, k_len] and row i "
    "is True up to and including query i's own position"))
_SQUEEZED = Mistake("squeezed_query_axis", N_(
    "squeezed the mask of one query: it is still [q_len, k_len] = [1, k_len], one row per "
    "query; drop the .squeeze()"))
_IGNORED_K_LEN = Mistake("ignored_k_len", N_(
    "ignored k_len: the mask has one row per query and one column per key, [q_len, k_len]"))


def _expect_mask(c: Check, got, want: torch.Tensor, *, what: str, dims, wrong=None) -> None:
    """expect_tensor for boolean masks, with a specific hint when the dtype is not bool."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != torch.bool:
        c.fail(_("{what} has dtype {got}, expected torch.bool.").format(what=what,
                                                                       got=got.dtype),
               _NOT_BOOL)
    c.expect_tensor(got, want, what=what, dims=dims, wrong=wrong)




def _random_bool(c: Check, *shape: int) -> torch.Tensor:
    """A random boolean tensor with at least one True and one False."""
    m = c.randn(*shape) > 0
    flat = m.view(-1)
    flat[0], flat[-1] = True, False
    return m


def _lengths_to_mask(lengths: list[int], s: int, *, left: bool = False) -> torch.Tensor:
    pos = torch.arange(s).unsqueeze(0)
    lens = torch.tensor(lengths).unsqueeze(1)
    return pos >= s - lens if left else pos < lens


def _padded_batch(c: Check, b: int, s: int, *, left: bool = False) -> torch.Tensor:
    """attention_mask [B, S]: one full row, one padded row, the rest random lengths >= 1."""
    lengths = [s, c.randint(1, s)] + [c.randint(1, s + 1) for _n in range(b - 2)]
    order = torch.randperm(b, generator=c.gen).tolist()
    return _lengths_to_mask([lengths[i] for i in order], s, left=left)


# --------------------------------------------------------------------------------------------
# causal_mask


def _causal_mixups(q: int, k: int) -> dict:
    want = ref.causal_mask(q, k)
    ones = torch.ones(q, k, dtype=torch.bool)
    mixups = {
        _TOP_LEFT: ones.tril(),
        _INVERTED: ~want,
        _NO_DIAGONAL: ones.tril(k - q - 1),
        _ONE_AHEAD: ones.tril(k - q + 1),
        _TRANSPOSED: want.T.contiguous(),
    }
    if q != k:
        mixups[_IGNORED_K_LEN] = ref.causal_mask(q)
        mixups[_SHIFT_SIGN] = ones.tril(q - k)
    if q == 1:
        mixups[_SQUEEZED] = want.squeeze()
    return mixups


def check_causal_mask(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("causal_mask", f, seed=seed, errors=[_NO_DEFAULT]) as c:
        # The article's example, 我 喜欢 学习 AI: four tokens, k_len left to its default.
        _expect_mask(c, c.call(4), ref.causal_mask(4), what="causal_mask(4)",
                     dims=("S_q", "S_k"), wrong=_causal_mixups(4, 4))
        c.headline(_("the article's 4-token example"))
        for _n in range(3 if thorough else 1):
            s = c.randint(5, 12)
            _expect_mask(c, c.call(s, s), ref.causal_mask(s), what=f"causal_mask({s}, {s})",
                         dims=("S_q", "S_k"), wrong=_causal_mixups(s, s))
        _expect_mask(c, c.call(1), ref.causal_mask(1), what="causal_mask(1)",
                     dims=("S_q", "S_k"), wrong=_causal_mixups(1, 1))
        c.headline(_("square masks"))
        # Chunked prefill: fewer queries than keys; the queries are the last q_len positions.
        for _n in range(4 if thorough else 2):
            q = c.randint(2, 7)
            k = q + c.randint(2, 7)
            _expect_mask(c, c.call(q, k), ref.causal_mask(q, k),
                         what=_("{call} (q_len < k_len, as in chunked prefill)").format(
                             call=f"causal_mask({q}, {k})"),
                         dims=("S_q", "S_k"), wrong=_causal_mixups(q, k))
        c.headline(_("bottom-right aligned for q_len < k_len"))
        # A decode step: one query, the newest token, sees every cached key.
        k = c.randint(3, 12)
        _expect_mask(c, c.call(1, k), ref.causal_mask(1, k),
                     what=_("{call} (one decode step over {count} keys)").format(
                         call=f"causal_mask(1, {k})", count=k),
                     dims=("S_q", "S_k"), wrong=_causal_mixups(1, k))
        c.headline(_("a decode query sees every key"))


# --------------------------------------------------------------------------------------------
# bidirectional_mask


_BI_CAUSAL = Mistake("returned_causal", N_(
    "returned a causal mask: in bidirectional attention (an encoder, or cross-attention) every "
    "query sees every key"))
_BI_INVERTED = Mistake("inverted", N_(
    "inverted: True means 'may attend', so a bidirectional mask is all True"))
_BI_K_LEN = Mistake("ignored_k_len", N_("ignored k_len: the mask is [q_len, k_len]"))
_BI_TRANSPOSED = Mistake("transposed", N_(
    "transposed: rows are queries and columns are keys, [q_len, k_len]"))


def _bidirectional_mixups(q: int, k: int) -> dict:
    mixups = {
        _BI_CAUSAL: ref.causal_mask(q, k),
        _BI_INVERTED: torch.zeros(q, k, dtype=torch.bool),
        _BI_K_LEN: torch.ones(q, q, dtype=torch.bool),
        _BI_TRANSPOSED: torch.ones(k, q, dtype=torch.bool),
    }
    if q == 1:
        mixups[_SQUEEZED] = torch.ones(q, k, dtype=torch.bool).squeeze()
    return mixups


def check_bidirectional_mask(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("bidirectional_mask", f, seed=seed, errors=[_NO_DEFAULT]) as c:
        s = c.randint(3, 10)
        _expect_mask(c, c.call(s), ref.bidirectional_mask(s), what=f"bidirectional_mask({s})",
                     dims=("S_q", "S_k"), wrong=_bidirectional_mixups(s, s))
        for _n in range(3 if thorough else 1):
            # cross-attention: target queries against source keys, both ways round
            q, k = c.sizes(2, 2, 11)
            for a, b in ((q, k), (k, q)):
                _expect_mask(c, c.call(a, b), ref.bidirectional_mask(a, b),
                             what=f"bidirectional_mask({a}, {b})", dims=("S_q", "S_k"),
                             wrong=_bidirectional_mixups(a, b))
        c.headline(_("q_len != k_len (cross-attention)"))
        k = c.randint(2, 10)
        _expect_mask(c, c.call(1, k), ref.bidirectional_mask(1, k),
                     what=f"bidirectional_mask(1, {k})", dims=("S_q", "S_k"),
                     wrong=_bidirectional_mixups(1, k))
        c.headline(_("every query sees every key"))


# --------------------------------------------------------------------------------------------
# padding_mask


_PAD_2D = Mistake("returned_b_s", N_(
    "returned [B, S]: add a head axis and a query axis, [B, 1, 1, S], so that the mask "
    "broadcasts against scores [B, N, S_q, S_k]"))
_PAD_QUERIES = Mistake("masked_queries", N_(
    "masked queries instead of keys ([B, 1, S, 1]): padding hides padded KEYS, so the sequence "
    "axis must be the last one, [B, 1, 1, S]"))
_PAD_BOTH = Mistake("masked_queries_and_keys", N_(
    "masked padded queries as well as keys ([B, 1, S, S]): only the keys are masked, "
    "[B, 1, 1, S]; a padded query's output is simply ignored later"))
_PAD_EXPANDED = Mistake("expanded_over_queries", N_(
    "expanded the mask over the queries ([B, 1, S, S]): keep the query axis of size 1, "
    "[B, 1, 1, S]; broadcasting repeats it for every query"))
_PAD_WRONG_AXIS = Mistake("sequence_on_wrong_axis", N_(
    "put the sequence on the wrong axis ([B, S, 1, 1]): keys are the last axis, [B, 1, 1, S]"))
_PAD_ONE_AXIS = Mistake("added_one_axis", N_(
    "added only one axis ([B, 1, S]): scores are [B, N, S_q, S_k], so the mask needs a head "
    "axis and a query axis, [B, 1, 1, S]"))
_PAD_INVERTED = Mistake("inverted", N_(
    "inverted: True marks real tokens (may attend); padding positions are False"))
_PAD_IN_PLACE = Mistake("changed_attention_mask", N_(
    "build a new tensor (or a view) instead of writing into the input"))


def _padding_mixups(am: torch.Tensor) -> dict:
    return {
        _PAD_2D: am.clone(),
        _PAD_QUERIES: am[:, None, :, None],
        _PAD_BOTH: am[:, None, :, None] & am[:, None, None, :],
        _PAD_EXPANDED: am[:, None, None, :].expand(-1, 1, am.shape[1], -1),
        _PAD_WRONG_AXIS: am[:, :, None, None],
        _PAD_ONE_AXIS: am[:, None, :],
        _PAD_INVERTED: ~am[:, None, None, :],
    }


def check_padding_mask(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("padding_mask", f, seed=seed, in_place=_PAD_IN_PLACE) as c:
        cases = [(_("the article's sentence and a shorter one, right-padded"),
                  _lengths_to_mask([4, 3], 4))]
        for _n in range(3 if thorough else 1):
            b, s = c.sizes(2, 2, 10)
            cases.append((_("a right-padded batch"), _padded_batch(c, b, s)))
        b, s = c.sizes(2, 2, 10)
        cases.append((_("a left-padded batch"), _padded_batch(c, b, s, left=True)))
        for label, am in cases:
            got = c.call(am.clone())
            b, s = am.shape
            _expect_mask(c, got, ref.padding_mask(am),
                         what=_("padding_mask of {case} (attention_mask [B={b}, S={s}])")
                         .format(case=label, b=b, s=s),
                         dims=("B", "N", "S_q", "S_k"), wrong=_padding_mixups(am))
        c.headline(_("padded keys masked, shape [B, 1, 1, S]"))
        c.headline(_("right and left padding"))


# --------------------------------------------------------------------------------------------
# combine_masks


_OR = Mistake("combined_with_or", N_(
    "combined with OR: a query may attend to a key only if EVERY mask allows it, so combine "
    "with AND (`&`)"))
_FIRST_ONLY = Mistake("first_mask_only", N_("kept only the first mask: AND all of them together"))
_LAST_ONLY = Mistake("last_mask_only", N_("kept only the last mask: AND all of them together"))
_FIRST_TWO = Mistake("first_two_masks_only", N_(
    "combined only the first two masks: AND every mask given, `for m in masks[1:]: out = out & m`"))
_VARARGS = Mistake("fixed_number_of_masks", N_(
    "accept any number of masks, `def combine_masks(*masks)`, and AND them all together (one "
    "mask alone comes back unchanged)"), raises=[("TypeError", r"positional argument")])
_BROADCAST = Mistake("masks_not_broadcast", N_(
    "masks of different shapes must broadcast against each other: `a & b` broadcasts; stacking "
    "them, or writing into the first one with `&=`, does not"),
    raises=[("RuntimeError", r"broadcast|equal size|must match")])
_PYTHON_AND = Mistake("python_and", N_(
    "combined with Python's `and` (or `all()`), which asks each whole mask for one True or "
    "False: combine the masks element by element with `&`"),
    raises=[("RuntimeError", r"ambiguous")])
_COMBINE_IN_PLACE = Mistake("changed_input_mask", N_(
    "`&=` (or `logical_and_`) writes into the first mask, which the caller still uses; build a "
    "new tensor with `&`"))


def _combine_mixups(masks: list[torch.Tensor]) -> dict:
    ored = masks[0]
    for m in masks[1:]:
        ored = ored | m
    mixups = {_OR: ored, _FIRST_ONLY: masks[0], _LAST_ONLY: masks[-1]}
    if len(masks) > 2:
        mixups[_FIRST_TWO] = masks[0] & masks[1]
    return mixups


def check_combine_masks(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("combine_masks", f, seed=seed, errors=[_VARARGS, _BROADCAST, _PYTHON_AND],
               in_place=_COMBINE_IN_PLACE) as c:
        b, n, sq, sk = c.sizes(4, 2, 10)
        s = sk

        def run(masks: list[torch.Tensor], label: str, dims) -> None:
            _expect_mask(c, c.call(*masks), ref.combine_masks(*masks),
                         what=f"combine_masks({label})", dims=dims, wrong=_combine_mixups(masks))

        # Same shapes first, so that writing into the first mask shows up; first two masks
        # whose AND and OR differ from either of them (random ones may nest).
        x = torch.tensor([[True, True, False, False], [True, False, True, False]])
        run([x, x.flip(0)], _("two {shape} masks").format(shape="[2, 4]"), ("S_q", "S_k"))
        for _n in range(3 if thorough else 1):
            x, y = _random_bool(c, sq, sk), _random_bool(c, sq, sk)
            run([x, y], _("two random {shape} masks").format(shape=f"[{sq}, {sk}]"),
                ("S_q", "S_k"))
        c.headline(_("AND of two masks"))
        am = _padded_batch(c, b, s)
        run([ref.causal_mask(s), ref.padding_mask(am)],
            _("causal {causal}, padding {padding}").format(causal=f"[{s}, {s}]",
                                                            padding=f"[{b}, 1, 1, {s}]"),
            ("B", "N", "S_q", "S_k"))
        c.headline(_("causal & padding broadcast to [B, 1, S, S]"))
        am = _padded_batch(c, b, sk)
        heads = _random_bool(c, 1, n, sq, sk)
        run([ref.causal_mask(sq, sk), ref.padding_mask(am), heads],
            _("three masks: {shapes}").format(
                shapes=f"[{sq}, {sk}], [{b}, 1, 1, {sk}], [1, {n}, {sq}, {sk}]"),
            ("B", "N", "S_q", "S_k"))
        c.headline(_("three masks"))
        one = _random_bool(c, b, 1, sq, sk)
        run([one], _("a single {shape} mask").format(shape=f"[{b}, 1, {sq}, {sk}]"),
            ("B", "N", "S_q", "S_k"))
        c.headline(_("a single mask"))


# --------------------------------------------------------------------------------------------
# to_additive_mask


_ADD_INVERTED = Mistake("inverted_signs", N_(
    "inverted signs: 0 where the mask is True (may attend) and -inf where it is False"))
_ADD_NUMBERS = Mistake("returned_0_1_numbers", N_(
    "returned the mask as 0/1 numbers: the additive mask is 0 where True and -inf where False"))
_ADD_TIMES_INF = Mistake("multiplied_by_inf", N_(
    "multiplied by -inf: 0 * -inf is NaN; use `masked_fill` or `torch.where` instead"))
_ADD_PLUS_INF = Mistake("plus_inf", N_(
    "+inf instead of -inf: blocked scores must go to -inf so that exp() gives 0"))
_ADD_BOOL = Mistake("returned_bool", N_(
    "returned a boolean mask: the additive mask holds numbers, 0 where the mask is True and -inf "
    "where it is False"))
_ADD_IGNORED_DTYPE = Mistake("ignored_dtype", N_(
    "ignored the `dtype` argument: create the additive mask in the requested dtype, the dtype of "
    "the scores it is added to"))
_ADD_OTHER_DTYPE = Mistake("wrong_dtype", N_(
    "create the additive mask with the requested dtype (`dtype=dtype`)"))
_ADD_FINITE = Mistake("large_finite_number", N_(
    "used a large finite number (such as -1e9 or the dtype's minimum) instead of -inf: the "
    "convention is exactly float('-inf'), so exp() gives exactly 0 and a fully masked row cannot "
    "pass unnoticed"))


def _additive_mixups(mask: torch.Tensor, dtype: torch.dtype) -> dict:
    m = mask.bool()
    zero = torch.zeros(m.shape, dtype=dtype)
    return {
        _ADD_INVERTED: zero.masked_fill(m, float("-inf")),
        _ADD_NUMBERS: m.to(dtype),
        _ADD_TIMES_INF: (1 - m.to(dtype)) * float("-inf"),
        _ADD_PLUS_INF: zero.masked_fill(~m, float("inf")),
    }


def _expect_additive(c: Check, got, mask: torch.Tensor, dtype: torch.dtype, *, what: str,
                     dims) -> None:
    want = ref.to_additive_mask(mask, dtype)
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        if got.dtype != want.dtype:
            if got.dtype == torch.bool:
                hint = _ADD_BOOL
            elif got.dtype == torch.float32:
                hint = _ADD_IGNORED_DTYPE
            else:
                hint = _ADD_OTHER_DTYPE
            c.fail(_("{what} has dtype {got}, expected {want} (the dtype asked for).").format(
                what=what, got=got.dtype, want=want.dtype), hint)
        if got.is_floating_point():
            blocked = ~mask.bool()
            vals = got.detach()[blocked]
            if (vals.numel() and bool(torch.isfinite(vals).all()) and bool((vals < 0).all())
                    and bool((got.detach()[~blocked] == 0).all())):
                c.fail(_("{what} holds {value} at blocked positions, expected -inf.").format(
                    what=what, value=f"{float(vals.max()):g}"), _ADD_FINITE)
        # Exact comparison: the engine's relative tolerance would call any finite number
        # close to -inf (|got - want| = inf <= rtol * |want| = inf).
        if got.dtype == want.dtype and not _same_exactly(got, want):
            mixups = _additive_mixups(mask, dtype)
            hint = next((m for m, v in mixups.items() if _same_exactly(got, v)), None)
            c.fail(_("{what} has the right shape but wrong values; {mismatch}").format(
                what=what, mismatch=_exact_mismatch(got, want, dims)), hint)
    c.expect_tensor(got, want, what=what, dims=dims, wrong=_additive_mixups(mask, dtype))


def _same_exactly(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal entry by entry, infinities included (NaN equals NaN)."""
    if got.shape != want.shape:
        return False
    got, want = got.detach().double(), want.detach().double()
    return bool(((got == want) | (got.isnan() & want.isnan())).all())


def _exact_mismatch(got: torch.Tensor, want: torch.Tensor, dims) -> str:
    got, want = got.detach().double(), want.detach().double()
    bad = ~((got == want) | (got.isnan() & want.isnan()))
    index = tuple(int(i) for i in bad.nonzero()[0])
    where = ", ".join(f"{d}={i}" for d, i in zip(dims, index))
    shown_got, shown_want = numbers_apart(float(got[index]), float(want[index]))
    return _("{count} of {total} entries differ; first at [{where}]: got {got}, expected "
             "{want}.").format(count=int(bad.sum()), total=bad.numel(), where=where,
                               got=shown_got, want=shown_want)


def check_to_additive_mask(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("to_additive_mask", f, seed=seed) as c:
        b, sq, sk = c.sizes(3, 2, 10)
        causal = ref.causal_mask(4)
        _expect_additive(c, c.call(causal), causal, torch.float32,
                         what="to_additive_mask(causal_mask(4))", dims=("S_q", "S_k"))
        c.headline(_("0 where True, -inf where False"))
        for _n in range(3 if thorough else 1):
            m = _random_bool(c, sq, sk)
            _expect_additive(c, c.call(m, dtype=torch.float32), m, torch.float32,
                             what=_("to_additive_mask of a random {shape} mask").format(
                                 shape=f"[{sq}, {sk}]"),
                             dims=("S_q", "S_k"))
        combined = ref.combine_masks(ref.causal_mask(sk),
                                     ref.padding_mask(_padded_batch(c, b, sk)))
        dtypes = [torch.float16, torch.bfloat16, torch.float64]
        for dtype in dtypes if thorough else [c.choice(dtypes[:2]), torch.float64]:
            name = str(dtype).removeprefix("torch.")
            _expect_additive(c, c.call(combined, dtype=dtype), combined, dtype,
                             what=_("to_additive_mask(causal & padding {shape}, "
                                    "dtype={dtype})").format(shape=f"[{b}, 1, {sk}, {sk}]",
                                                             dtype=name),
                             dims=("B", "N", "S_q", "S_k"))
        c.headline(_("the requested dtype"))


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "03.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "causal_mask": (
        _NO_DIAGONAL, _SHIFT_SIGN, _IGNORED_K_LEN, _INVERTED, _NO_DEFAULT, _NOT_BOOL, _ONE_AHEAD,
        _SQUEEZED, _TOP_LEFT, _TRANSPOSED),
    "bidirectional_mask": (
        _BI_K_LEN, _BI_INVERTED, _NO_DEFAULT, _NOT_BOOL, _BI_CAUSAL, _SQUEEZED, _BI_TRANSPOSED),
    "padding_mask": (
        _PAD_ONE_AXIS, _PAD_IN_PLACE, _PAD_EXPANDED, _PAD_INVERTED, _PAD_QUERIES, _PAD_BOTH,
        _NOT_BOOL, _PAD_2D, _PAD_WRONG_AXIS),
    "combine_masks": (
        _COMBINE_IN_PLACE, _OR, _FIRST_ONLY, _FIRST_TWO, _VARARGS, _LAST_ONLY, _BROADCAST,
        _NOT_BOOL, _PYTHON_AND),
    "to_additive_mask": (
        _ADD_IGNORED_DTYPE, _ADD_INVERTED, _ADD_FINITE, _ADD_TIMES_INF, _ADD_PLUS_INF,
        _ADD_NUMBERS, _ADD_BOOL, _ADD_OTHER_DTYPE),
}
