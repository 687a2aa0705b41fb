"""Checks for chapter 02: from text to Transformer input.

Byte-level BPE (UTF-8 bytes, merging, training, encoding, decoding), right padding with an
attention mask, and the embedding lookup (row selection, one-hot products, table size).
Expected values come from `checks.reference.tokens`; the known-wrong variants below reproduce
common mistakes on the same inputs so that a failure can name the mistake.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from . import reference as ref
from .engine import Check, LearnerError, builds_on, describe
from .i18n import N_, _
from .reference.tokens import vocab_bytes

ARTICLE_SENTENCE = "我喜欢学习 AI Infra"

# Random texts: words with shared pieces (so merges repeat), runs of one letter (overlaps),
# Chinese (3 bytes per character), accents (2 bytes) and an emoji (4 bytes).
_WORDS = ("low", "lower", "lowest", "newer", "wider", "the", "then", "AI", "Infra", "token",
          "aaa", "abab", "我", "喜欢", "学习", "模型", "张量", "é", "naïve", "🙂")
_SEPARATORS = (" ", " ", " ", ", ", "\n", "。")


def _random_text(c: Check, n_words: int) -> str:
    parts = []
    for _n in range(n_words):
        parts += [c.choice(_WORDS), c.choice(_SEPARATORS)]
    return "".join(parts[:-1])


def _fail_on_error(c: Check, call: Callable, hints: dict[str, str], what: str):
    """Run `call`; if the learner raised an exception named in `hints`, fail with that hint."""
    try:
        return call()
    except LearnerError as err:
        first = err.message.splitlines()[0]
        for exc_name, hint in hints.items():
            if first.startswith(f"raised {exc_name}"):
                c.fail(f"{what} {err.summary()}", hint)
        raise


# --------------------------------------------------------------------------------------------
# Lists of ints, compared element by element (with the first difference in the message)


def _as_int_list(got):
    """`got` as a list of Python ints, or None if it is not a list of integers."""
    if type(got) is not list:
        return None
    if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in got):
        return None
    return [int(x) for x in got]


def _expect_list(c: Check, got, want: list, *, what: str, wrong=None) -> None:
    normal = _as_int_list(got)
    if normal == want:
        c.note(what)
        return
    hint = c.diagnose(got, wrong, 0.0, 0.0)
    if normal is None:
        c.fail(_("{what} should be a list of ints, got {kind}.").format(what=what,
                                                                      kind=describe(got)),
               hint or _("return a plain Python list of ints"))
    k = next((i for i, (g, w) in enumerate(zip(normal, want)) if g != w),
             min(len(normal), len(want)))
    got_at = repr(normal[k]) if k < len(normal) else _("the end of the list")
    want_at = repr(want[k]) if k < len(want) else _("the end of the list")
    c.fail(_("{what} is wrong from position {position}: got {got}, expected {want} (length "
             "{length}, expected {want_length}).").format(
        what=what, position=k, got=got_at, want=want_at, length=len(normal),
        want_length=len(want)), hint)


def _unchanged(c: Check, before, after, what: str) -> None:
    if before != after:
        c.fail(_("changed its input {what} in place.").format(what=what),
               _("build and return a new list; the caller's list must stay as it was"))


# --------------------------------------------------------------------------------------------
# utf8_bytes


def _utf8_mixups(text: str) -> dict:
    return {
        _("used ord() per character: a character is one code point, but UTF-8 stores it in 1 to "
          "4 bytes (3 for a Chinese character); use text.encode('utf-8')"):
            [ord(ch) for ch in text],
        _("returned a bytes object: return list(...) of it, a list of ints"):
            text.encode("utf-8"),
        _("returned the characters, not their byte values"): list(text),
        _("encoded as UTF-16, not UTF-8"): list(text.encode("utf-16-le")),
        _("encoded as UTF-16 (with its byte-order mark), not UTF-8"):
            list(text.encode("utf-16")),
        _("added a byte-order mark (utf-8-sig): plain UTF-8 has none"):
            list(text.encode("utf-8-sig")),
    }


def check_utf8_bytes(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("utf8_bytes", f, seed=seed) as c:
        texts = [ARTICLE_SENTENCE, "Transformer", "naïve 🙂", "", "\n"]
        texts += [_random_text(c, c.randint(3, 12)) for _n in range(8 if thorough else 3)]
        for text in texts:
            got = c.call(text)
            _expect_list(c, got, ref.utf8_bytes(text), what=f"utf8_bytes({describe(text)})",
                         wrong=_utf8_mixups(text))
        c.properties[:] = [_("Chinese, accents and emoji as UTF-8 bytes")]


# --------------------------------------------------------------------------------------------
# bpe_merge and the wrong ways to merge


def _merge_overlapping(ids, pair, new_id):
    """Every position where the pair starts becomes new_id (occurrences share ids)."""
    starts = {i for i in range(len(ids) - 1) if (ids[i], ids[i + 1]) == pair}
    return [new_id if i in starts else x for i, x in enumerate(ids)
            if i in starts or i - 1 not in starts]


def _merge_step_one(ids, pair, new_id):
    """After a match, moves on by one id instead of two."""
    return [new_id if (x, ids[i + 1] if i + 1 < len(ids) else None) == pair else x
            for i, x in enumerate(ids)]


def _merge_right_to_left(ids, pair, new_id):
    return ref.bpe_merge(ids[::-1], pair[::-1], new_id)[::-1]


def _merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)


def _merge_drop_last(ids, pair, new_id):
    out = ref.bpe_merge(ids, pair, new_id)
    ends_with_pair = len(ids) >= 2 and out[-1] == new_id and (ids[-2], ids[-1]) == pair
    return out if ends_with_pair else out[:-1]


_MERGE_MISTAKES = {
    N_("overlapping occurrences: occurrences may not share an id, so [a, a, a] with the pair "
       "(a, a) becomes [X, a], not [X, X]"): _merge_overlapping,
    N_("after a match, skip both ids of the pair (move on by 2, not 1)"): _merge_step_one,
    N_("merged from the right: scan left to right, so [a, a, a] becomes [X, a], not [a, X]"):
        _merge_right_to_left,
    N_("merged only the first occurrence: replace every occurrence"): _merge_first_only,
    N_("dropped the last id: an id that starts no pair is copied as it is, the last one too"):
        _merge_drop_last,
}


def _merge_mixups(ids, pair, new_id) -> dict:
    want = ref.bpe_merge(ids, pair, new_id)
    mixups = {_(k): (lambda m=m: m(ids, pair, new_id)) for k, m in _MERGE_MISTAKES.items()}
    mixups[_("returned a tuple: return a list")] = tuple(want)
    mixups[_("returned a tensor: return a list of ints")] = lambda: torch.tensor(want)
    return mixups


def check_bpe_merge(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("bpe_merge", f, seed=seed) as c:
        cases = [([5, 5, 5], (5, 5), 256), ([7, 1, 2, 1, 2, 9, 1], (1, 2), 300),
                 ([5, 5, 5, 5], (5, 5), 257), ([3, 4, 1, 2], (1, 2), 999),
                 ([2, 1, 3], (1, 2), 256), ([], (1, 2), 256), ([1], (1, 2), 256)]
        for _n in range(12 if thorough else 4):
            alphabet = [c.randint(0, 400) for _n in range(3)]
            ids = [c.choice(alphabet) for _n in range(c.randint(6, 20))]
            i = c.randint(0, len(ids) - 1)
            cases.append((ids, (ids[i], ids[i + 1]), c.randint(400, 1000)))
        for ids, pair, new_id in cases:
            given = list(ids)
            got = c.call(given, pair, new_id)
            _unchanged(c, ids, given, "ids")
            _expect_list(c, got, ref.bpe_merge(ids, pair, new_id),
                         what=f"bpe_merge({ids}, {pair}, {new_id})",
                         wrong=_merge_mixups(ids, pair, new_id))
        c.properties[:] = [_("non-overlapping, left to right"), _("every occurrence"),
                           _("input list left unchanged")]


# --------------------------------------------------------------------------------------------
# bpe_train

# The earlier exercises that bpe_train and bpe_encode are built on, in the chapter's order: a
# broken one that the learner's function calls is named ("fix bpe_merge first").
_BUILT_ON = {"utf8_bytes": check_utf8_bytes, "bpe_merge": check_bpe_merge}


def _train_variant(text: str, num_merges: int, *, tie: str = "first", start: int = 256,
                   count: str = "positions", merge=ref.bpe_merge, update: bool = True,
                   codes: Callable = ref.utf8_bytes, min_count: int = 1) -> dict:
    """bpe_train with one rule changed (to reproduce a known mistake)."""
    ids = codes(text)
    merges: dict = {}
    for r in range(num_merges):
        counts: dict = {}
        if count == "positions":
            for p in zip(ids, ids[1:]):
                counts[p] = counts.get(p, 0) + 1
        else:  # non-overlapping occurrences
            for p in dict.fromkeys(zip(ids, ids[1:])):
                counts[p] = len(ids) - len(ref.bpe_merge(ids, p, -1))
        if not counts or max(counts.values()) < min_count:
            break
        top = max(counts.values())
        tied = [p for p in counts if counts[p] == top]  # in order of first occurrence
        pair = {"first": tied[0], "last": tied[-1], "smallest": min(tied),
                "largest": max(tied)}[tie]
        merges[pair] = start + r
        if update:
            ids = merge(ids, pair, start + r)
    return merges


_TRAIN_MISTAKES = {
    N_("ties went to the smallest pair: among equally frequent pairs take the one that occurs "
       "first in the current sequence"): dict(tie="smallest"),
    N_("ties went to the largest pair: among equally frequent pairs take the one that occurs "
       "first in the current sequence"): dict(tie="largest"),
    N_("ties went to the pair that occurs last: among equally frequent pairs take the one that "
       "occurs first in the current sequence"): dict(tie="last"),
    N_("new ids start at 256 (ids 0-255 are the single bytes), not 255"): dict(start=255),
    N_("new ids start at 256 (ids 0-255 are the single bytes), not 0"): dict(start=0),
    N_("new ids start at 256 (ids 0-255 are the single bytes), not 257"): dict(start=257),
    N_("the same pair won every round: merge the chosen pair into the sequence "
       "(ids = bpe_merge(...)) before counting again"): dict(update=False),
    N_("counted non-overlapping occurrences: count every adjacent position, overlapping ones "
       "included ([a, a, a] holds (a, a) twice)"): dict(count="occurrences"),
    N_("merged overlapping occurrences while training: use bpe_merge's non-overlapping, "
       "left-to-right rule"): dict(merge=_merge_overlapping),
    N_("merged from the right while training: use bpe_merge's left-to-right rule"):
        dict(merge=_merge_right_to_left),
    N_("started from ord() code points: byte-level BPE starts from the UTF-8 bytes"):
        dict(codes=lambda t: [ord(ch) for ch in t]),
    N_("stopped when the best pair occurs only once: keep merging until num_merges merges are "
       "made or no pair is left"): dict(min_count=2),
}


def _merge_items(c: Check, got, what: str) -> list:
    """The learner's merges as [((a, b), new_id), ...] in insertion order (ints only)."""
    if type(got) is not dict:
        c.fail(_("{what} should return a dict {{(a, b): new_id}}, got {kind}.").format(
            what=what, kind=describe(got)))
    items = []
    for key, value in got.items():
        ok = (type(key) is tuple and len(key) == 2 and
              all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                  for x in (*key, value)))
        if not ok:
            c.fail(_("{what} has the entry {key}: {value}; each key should be a pair of ids "
                     "(a tuple of two ints) and each value the new id (an int).").format(
                what=what, key=repr(key), value=repr(value)),
                   _("map each pair to its new id: {(a, b): 256, ...}, not new id -> pair")
                   if isinstance(key, numbers.Integral) else None)
        items.append(((int(key[0]), int(key[1])), int(value)))
    return items


def _train_case(c: Check, text: str, num_merges: int) -> None:
    what = f"bpe_train({describe(text)}, {num_merges})"
    want = list(ref.bpe_train(text, num_merges).items())
    runs_out = len(want) < num_merges  # the sequence has fewer than two ids before the end
    early = _("stop early when the sequence has no pair left (fewer than two ids)")
    got = _fail_on_error(c, lambda: c.call(text, num_merges),
                         {"ValueError": early, "IndexError": early} if runs_out else {},
                         what=what)
    items = _merge_items(c, got, what)
    if items != want and sorted(items) == sorted(want):
        c.fail(_("{what} learned the right merges but the dict is in another order.").format(
            what=what), _("insert each merge when it is learned: the dict's order is the merge "
                          "order, which encoding relies on"))
    wrong = {_(k): (lambda kw=kw: list(_train_variant(text, num_merges, **kw).items()))
             for k, kw in _TRAIN_MISTAKES.items()}
    if items != want:
        hint = c.diagnose(items, wrong, 0.0, 0.0)
        k = next((i for i, (g, w) in enumerate(zip(items, want)) if g != w),
                 min(len(items), len(want)))
        got_at = f"{items[k][0]} -> {items[k][1]}" if k < len(items) else _("no merge")
        want_at = f"{want[k][0]} -> {want[k][1]}" if k < len(want) else _("no merge")
        c.fail(_("{what}: merge number {number} is {got}, expected {want} ({count} merges in "
                 "all, expected {want_count}).").format(
            what=what, number=k + 1, got=got_at, want=want_at, count=len(items),
            want_count=len(want)), hint)
    c.note(what)


def check_bpe_train(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with builds_on("bpe_train", _BUILT_ON), Check("bpe_train", f, seed=seed) as c:
        # Every mistake in _TRAIN_MISTAKES gives a different result on the first text (found by
        # a search); the second is a five-way tie with first != smallest != largest != last.
        cases = [("m byyy学m", 6), ("dcabzyme dcabzyme", 4), ("aaa bcbc", 4),
                 (ARTICLE_SENTENCE + " " + ARTICLE_SENTENCE, 8), ("abcd", 3)]
        for _n in range(6 if thorough else 2):
            cases.append((_random_text(c, c.randint(8, 25)), c.randint(5, 25)))
        cases += [("ab", 3), ("a", 2), ("", 2), ("abc", 0)]
        for text, num_merges in cases:
            _train_case(c, text, num_merges)
        c.properties[:] = [_("most frequent pair, ties to the first occurrence"),
                           _("new ids from 256 in merge order"), _("stops when no pair is left")]


# --------------------------------------------------------------------------------------------
# bpe_encode


def _encode_by_frequency(ids, merges):
    """Merges chosen by how often their pair occurs in the text being encoded."""
    while True:
        counts: dict = {}
        for p in zip(ids, ids[1:]):
            if p in merges:
                counts[p] = counts.get(p, 0) + 1
        if not counts:
            return ids
        pair = max(counts, key=counts.get)
        ids = ref.bpe_merge(ids, pair, merges[pair])


def _encode_leftmost(ids, merges):
    """Scanning left to right, merging wherever a learned pair shows up first."""
    ids = list(ids)
    while True:
        i = next((i for i in range(len(ids) - 1) if (ids[i], ids[i + 1]) in merges), None)
        if i is None:
            return ids
        ids[i:i + 2] = [merges[ids[i], ids[i + 1]]]


def _encode_with(ids, merges, order, merge=ref.bpe_merge):
    for pair in order:
        ids = merge(ids, pair, merges[pair])
    return ids


def _encode_mixups(text, merges) -> dict:
    b = ref.utf8_bytes(text)
    fix = _("apply the merges in training order (lowest new id first), whatever the text")
    return {
        _("applied the merges in reverse order: {fix}").format(fix=fix):
            lambda: _encode_with(b, merges, list(merges)[::-1]),
        _("picked pairs by how often they occur in this text: {fix}").format(fix=fix):
            lambda: _encode_by_frequency(b, merges),
        _("merged the leftmost learned pair first: {fix}").format(fix=fix):
            lambda: _encode_leftmost(b, merges),
        _("merged only the first occurrence of each pair: bpe_merge replaces every occurrence"):
            lambda: _encode_with(b, merges, list(merges), _merge_first_only),
        _("returned the UTF-8 bytes without applying the merges"): b,
        _("started from ord() code points: start from the UTF-8 bytes"):
            lambda: _encode_with([ord(ch) for ch in text], merges, list(merges)),
    }


def check_bpe_encode(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with builds_on("bpe_encode", _BUILT_ON), Check("bpe_encode", f, seed=seed) as c:
        # Each wrong order gives a different result on the first case (found by a search); in
        # the second, (b, c) was learned before (a, b), so "abcab" encodes as [a, bc, ab].
        cases = [("baababab", {(97, 97): 256, (98, 97): 257, (257, 98): 258}),
                 ("abcab", {(98, 99): 256, (97, 98): 257})]
        for _n in range(3 if thorough else 1):
            corpus = _random_text(c, c.randint(15, 30))
            merges = ref.bpe_train(corpus, c.randint(10, 30))
            cases += [(corpus, merges), (ARTICLE_SENTENCE, merges),
                      (_random_text(c, c.randint(4, 12)), merges), ("", merges)]
        cases.append((ARTICLE_SENTENCE, {}))
        for text, merges in cases:
            given = dict(merges)
            got = c.call(text, given)
            if given != merges or list(given) != list(merges):
                c.fail(_("changed the merges dict it was given."),
                       _("read the merges; do not modify them"))
            _expect_list(c, got, ref.bpe_encode(text, merges),
                         what=_("{call} with {count} merges").format(
                             call=f"bpe_encode({describe(text)})", count=len(merges)),
                         wrong=_encode_mixups(text, merges))
        c.properties[:] = [_("merges applied in training order"), _("Chinese text"),
                           _("no merges: the UTF-8 bytes")]


# --------------------------------------------------------------------------------------------
# bpe_decode


_APART = N_("decoded each token separately: a character's bytes can be split across tokens; "
             "join all tokens' bytes first, then decode once")


def _decode_mixups(ids, merges) -> dict:
    vocab = vocab_bytes(merges)
    pieces = [vocab[i] for i in ids]
    joined = b"".join(pieces)
    # Whole-sequence mistakes first: on valid UTF-8 they cannot match a wrong answer, and on
    # invalid bytes they are the better explanation.
    return {
        _("dropped invalid bytes (errors='ignore'); use errors='replace' so that they show up "
          "as U+FFFD (�)"): lambda: joined.decode("utf-8", errors="ignore"),
        _("escaped invalid bytes (errors='backslashreplace'); use errors='replace'"):
            lambda: joined.decode("utf-8", errors="backslashreplace"),
        _("decoded one character per byte (Latin-1): decode the joined bytes as UTF-8"):
            lambda: joined.decode("latin-1"),
        _(_APART): lambda: "".join(p.decode("utf-8", errors="replace") for p in pieces),
        _("decoded each token separately and dropped the broken pieces (errors='ignore'): a "
          "character's bytes can be split across tokens; join all tokens' bytes first, then "
          "decode once"): lambda: "".join(p.decode("utf-8", errors="ignore") for p in pieces),
    }


_EXPAND_HINT = N_("expand each merged id (256 and up) back into its bytes through the merges, "
                   "recursively: a merge's two parts can be merged ids themselves")


def check_bpe_decode(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("bpe_decode", f, seed=seed) as c:
        cases = []
        for _n in range(3 if thorough else 1):
            corpus = _random_text(c, c.randint(15, 30)) + " " + ARTICLE_SENTENCE
            merges = ref.bpe_train(corpus, c.randint(10, 30))
            for text in (ARTICLE_SENTENCE, corpus, _random_text(c, c.randint(4, 12)), "",
                         "naïve 🙂 模型"):
                cases.append((ref.bpe_encode(text, merges), merges, text))
        cases.append((ref.utf8_bytes(ARTICLE_SENTENCE), {}, ARTICLE_SENTENCE))
        for ids, merges, text in cases:
            what = f"bpe_decode(bpe_encode({describe(text)}))"
            got = _fail_on_error(c, lambda: c.call(list(ids), dict(merges)), {
                "UnicodeDecodeError": _APART, "ValueError": _EXPAND_HINT,
                "KeyError": _EXPAND_HINT, "IndexError": _EXPAND_HINT},
                what=_("on valid UTF-8, {what}").format(what=what))
            c.expect_equal(got, text, what=what, wrong=_decode_mixups(ids, merges))
        c.note(_("round trip, Chinese included"))
        # Token sequences that are not valid UTF-8 (a model can generate them): U+FFFD, no error.
        merges = cases[0][1]
        broken = [ref.utf8_bytes("学")[:2] + ref.utf8_bytes(" ok"), [0xFF, 0x41],
                  ref.utf8_bytes("ok ") + [0x80]]
        for ids in broken:
            what = _("{call} (not valid UTF-8)").format(call=f"bpe_decode({ids})")
            got = _fail_on_error(c, lambda: c.call(list(ids), dict(merges)), {
                "UnicodeDecodeError": _("decode with errors='replace': invalid bytes become "
                                        "U+FFFD (�) instead of an error")}, what=what)
            c.expect_equal(got, ref.bpe_decode(ids, merges), what=what,
                           wrong=_decode_mixups(ids, merges))
        c.properties[:] = [_("round trip, Chinese included"), _("characters split across tokens"),
                           _("invalid UTF-8 becomes U+FFFD")]


# --------------------------------------------------------------------------------------------
# pad_batch


def _expect_typed(c: Check, got, want: torch.Tensor, *, what: str, dims, hint: str,
                  wrong=None) -> None:
    """expect_tensor with a specific hint when only the dtype is wrong."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want}.").format(what=what, got=got.dtype,
                                                                   want=want.dtype), hint)
    c.expect_tensor(got, want, what=what, dims=dims, wrong=wrong)


def _left_pad(sequences, pad_id, s):
    ids = torch.full((len(sequences), s), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), s, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, s - len(seq):] = torch.tensor(seq)
            mask[row, s - len(seq):] = True
    return ids, mask


def _pad_case(c: Check, sequences: list[list[int]], pad_id: int) -> None:
    given = [list(s) for s in sequences]
    out = c.call(given, pad_id)
    _unchanged(c, sequences, given, "sequences")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        c.fail(_("should return a pair (token_ids, attention_mask), got {kind}.").format(
            kind=describe(out)))
    ids, mask = out
    want_ids, want_mask = ref.pad_batch(sequences, pad_id)
    s = want_ids.shape[1]
    left_ids, left_mask = _left_pad(sequences, pad_id, s)
    what = _("for {count} sequences of lengths {lengths}").format(
        count=len(sequences), lengths=[len(q) for q in sequences])
    _expect_typed(c, ids, want_ids, what=f"token_ids {what}", dims=("B", "S"),
                  hint=_("token ids index the embedding table: make them torch.long (int64)"),
                  wrong={_("padded on the left; this course pads on the right (real tokens "
                           "first, padding after them)"): left_ids,
                         _("padded with 0 instead of pad_id"):
                             lambda: want_ids.masked_fill(~want_mask, 0),
                         _("returned the ids as floats"): lambda: want_ids.float()})
    _expect_typed(c, mask, want_mask, what=f"attention_mask {what}", dims=("B", "S"),
                  hint=_("the mask is a BoolTensor: build it from a comparison (e.g. position < "
                         "length) or call .bool()"),
                  wrong={_("the mask is True at padding; True marks the real tokens"):
                             ~want_mask,
                         _("built the mask as token_ids != pad_id, but a real token can have "
                           "the id pad_id: build the mask from the sequence lengths"):
                             want_ids != pad_id,
                         _("the mask marks the last positions (left padding); with right "
                           "padding the real tokens come first"): left_mask})


def check_pad_batch(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("pad_batch", f, seed=seed) as c:
        for _n in range(6 if thorough else 2):
            b, s = c.sizes(2, 2, 9)
            lengths = [s, c.randint(1, s)] + [c.randint(1, s + 1) for _n in range(b - 2)]
            pad_id = c.randint(1, 300)
            seqs = [[c.randint(0, 300) for _n in range(n)] for n in lengths]
            seqs[0][c.randint(0, s)] = pad_id  # a real token that happens to equal pad_id
            order = torch.randperm(b, generator=c.gen).tolist()
            _pad_case(c, [seqs[i] for i in order], pad_id)
        _pad_case(c, [[4, 5, 6], [7, 8, 9]], 0)              # nothing to pad
        _pad_case(c, [[10, 11, 12, 13]], 2)                  # a batch of one
        _pad_case(c, [[3, 1, 4], [], [1, 5]], 0)             # an empty sequence
        c.properties[:] = [_("right padding with pad_id"), _("mask True at real tokens (bool)"),
                           _("a real token equal to pad_id")]


# --------------------------------------------------------------------------------------------
# embed, one_hot, embedding_table_bytes


def _embed_mixups(ids: torch.Tensor, table: torch.Tensor) -> dict:
    return {
        _("selected columns (table[:, ids]): each ROW of the table is one token's vector"):
            lambda: table[:, ids],
        _("looked up rows of the transposed table: each ROW of the table is one token's vector"):
            lambda: table.T[ids],
        _("dropped the batch axis: the result is [B, S, H]"): lambda: table[ids[0]],
        _("swapped B and S: keep token_ids' [B, S] layout"): lambda: table[ids.T],
        _("flattened the token ids: the result is [B, S, H], not [B * S, H]"):
            lambda: table[ids.reshape(-1)],
        _("summed over the sequence: every position keeps its own vector"):
            lambda: table[ids].sum(1),
    }


def _forbid(name: str, hint: str) -> dict[str, str]:
    """Forbid a torch function (the engine also matches torch.ops.aten.<name>.<overload>)."""
    return {name: hint}


_KEEP_DTYPE = N_("keep the table's dtype: the lookup copies rows, it does not convert them")


def check_embed(f, *, seed: int | None = None, thorough: bool = False) -> None:
    forbid = _forbid("embedding", N_("select the rows yourself: indexing the table with the "
                                     "ids (table[token_ids]) is the whole lookup"))
    with Check("embed", f, seed=seed, forbid=forbid) as c:
        trials = 6 if thorough else 2
        for trial, dtype in enumerate([torch.float32] * trials + [torch.float16, torch.bfloat16]):
            b, s, h, v = c.sizes(4, 2, 14)
            high = min(v, h) if trial == 0 else v  # ids < H too: a column lookup has a shape
            ids = c.randint(0, high, (b, s))
            table = c.randn(v, h, dtype=dtype)
            got = c.call(ids.clone(), table.clone())
            _expect_typed(c, got, ref.embed(ids, table),
                          what=_("embed for token_ids [B={b}, S={s}] and a {dtype} table "
                                 "[|V|={v}, H={h}]").format(b=b, s=s, dtype=str(dtype)[6:], v=v,
                                                            h=h), dims=("B", "S", "H"),
                          hint=_KEEP_DTYPE, wrong=_embed_mixups(ids, table))
        # The article's shapes with a narrower table: [1, 10] ids from |V| = 32000.
        ids = c.randint(0, 32000, (1, 10))
        table = c.randn(32000, 8)
        c.expect_tensor(c.call(ids, table), ref.embed(ids, table),
                        what=_("X for the article's token_ids [1, 10] and |V| = 32000"),
                        dims=("B", "S", "H"),
                        wrong=_embed_mixups(ids, table))
        c.properties[:] = [_("rows of the table in [B, S, H]"), _("fp16/bf16 kept"),
                           _("the article's [1, 10] ids")]


def check_one_hot(f, *, seed: int | None = None, thorough: bool = False) -> None:
    forbid = _forbid("one_hot", N_("compare token_ids[..., None] with "
                                   "torch.arange(vocab_size), then convert to float"))
    with Check("one_hot", f, seed=seed, forbid=forbid) as c:
        for trial in range(5 if thorough else 2):
            b, s, v, h = c.sizes(4, 2, 14)
            v += 3
            ids = c.randint(0, v - 1, (b, s))  # the last id unused: V is not ids.max() + 1
            want = ref.one_hot(ids, v)
            got = c.call(ids.clone(), v)
            _expect_typed(c, got, want, what=_("one_hot for token_ids [B={b}, S={s}], "
                                               "vocab_size={v}").format(b=b, s=s, v=v),
                          dims=("B", "S", "V"),
                          hint=_("return float32 (torch.float): a one-hot matrix is multiplied "
                                 "with float tables"),
                          wrong={_("put the one-hot axis in the middle: it is the last axis, "
                                   "[B, S, V]"): lambda: want.transpose(1, 2),
                                 _("put the one-hot axis first: it is the last axis, [B, S, V]"):
                                     lambda: want.permute(2, 0, 1),
                                 _("used token_ids.max() + 1 as the vocabulary size; use "
                                   "vocab_size"): lambda: ref.one_hot(ids, int(ids.max()) + 1),
                                 _("set the row of the position, not of the token id"):
                                     lambda: ref.one_hot(torch.arange(s).expand(b, s), v)})
            table = c.randn(v, h)
            c.expect_tensor(got @ table, ref.embed(ids, table), what="one_hot(ids) @ table",
                            dims=("B", "S", "H"))
        c.properties[:] = ["float32 [B, S, V]", "one_hot(ids) @ table == table[ids]"]


def check_embedding_table_bytes(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("embedding_table_bytes", f, seed=seed) as c:
        cases = [(32000, 4096, 2), (32000, 4096, 4), (128256, 4096, 2)]
        for _n in range(6 if thorough else 2):
            cases.append((c.randint(1000, 200000), 64 * c.randint(4, 128), c.choice([2, 4, 8])))
        cases.append((32000, 4096, 1))
        for v, h, bpp in cases:
            n = v * h * bpp
            c.expect_equal(c.call(v, h, bpp), n, what=f"embedding_table_bytes({v}, {h}, {bpp})",
                           wrong=_bytes_mixups(v, h, bpp))
        c.properties[:] = [_("|V| * H * bytes_per_param as an int"),
                           _("the article's 32000 x 4096")]


def _bytes_mixups(v: int, h: int, bpp: int) -> dict:
    n = v * h * bpp
    return {_("forgot bytes_per_param: |V| * H counts parameters, not bytes"): v * h,
            _("returned a float: compute with integers (no `/`)"): float(n),
            _("counted bits (times 8); the answer is in bytes"): n * 8,
            _("divided by bytes_per_param; multiply by it"): v * h // bpp,
            _("converted to MiB; return plain bytes"): n / 2**20,
            _("converted to MiB with //; return plain bytes"): n // 2**20,
            _("added |V| + H; the table has |V| * H entries"): (v + h) * bpp}
