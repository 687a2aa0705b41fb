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

from .. import reference as ref
from ..engine import Check, builds_on, describe, matches
from ..i18n import N_, _
from ..mistakes import FORBIDDEN_CALL, Mistake, fix_first
from ..reference.tokens import vocab_bytes

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


# --------------------------------------------------------------------------------------------
# Lists of ints, compared element by element (with the first difference in the message)


def _as_int_list(got):
    """`got` as a list of Python ints, or None if it is not a list of integers."""
    if type(got) is not list:
        return None
    if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in got):
        return None
    return [int(x) for x in got]


NOT_A_LIST = Mistake("not_a_list_of_ints", N_("return a plain Python list of ints"))


def _expect_list(c: Check, got, want: list, *, what: str, wrong=None) -> None:
    normal = _as_int_list(got)
    if normal == want:
        c.note(what)
        return
    hint = c.diagnose(got, wrong, 0.0, 0.0)
    if normal is None:
        c.fail(_("{what} should be a list of ints, got {kind}.").format(what=what,
                                                                      kind=describe(got)),
               hint or NOT_A_LIST)
    k = next((i for i, (g, w) in enumerate(zip(normal, want)) if g != w),
             min(len(normal), len(want)))
    got_at = repr(normal[k]) if k < len(normal) else _("the end of the list")
    want_at = repr(want[k]) if k < len(want) else _("the end of the list")
    c.fail(_("{what} is wrong from position {position}: got {got}, expected {want} (length "
             "{length}, expected {want_length}).").format(
        what=what, position=k, got=got_at, want=want_at, length=len(normal),
        want_length=len(want)), hint)


# --------------------------------------------------------------------------------------------
# utf8_bytes


ORD = Mistake("ord_per_character", N_(
    "used ord() per character: a character is one code point, but UTF-8 stores it in 1 to 4 "
    "bytes (3 for a Chinese character); use text.encode('utf-8')"))
BYTES_OBJECT = Mistake("returned_bytes_object", N_(
    "returned a bytes object: return list(...) of it, a list of ints"))
CHARACTERS = Mistake("returned_characters", N_("returned the characters, not their byte values"))
UTF16 = Mistake("encoded_utf16", N_("encoded as UTF-16, not UTF-8"))
UTF16_BOM = Mistake("encoded_utf16_with_bom", N_(
    "encoded as UTF-16 (with its byte-order mark), not UTF-8"))
UTF8_BOM = Mistake("added_byte_order_mark", N_(
    "added a byte-order mark (utf-8-sig): plain UTF-8 has none"))
GBK = Mistake("encoded_gbk", N_(
    "encoded as GBK (2 bytes per Chinese character): byte-level BPE starts from UTF-8, "
    "text.encode('utf-8')"))


def _utf8_mixups(text: str) -> dict:
    return {
        ORD: [ord(ch) for ch in text],
        BYTES_OBJECT: text.encode("utf-8"),
        CHARACTERS: list(text),
        UTF16: list(text.encode("utf-16-le")),
        UTF16_BOM: list(text.encode("utf-16")),
        UTF8_BOM: list(text.encode("utf-8-sig")),
        GBK: lambda: list(text.encode("gbk")),
    }


def check_utf8_bytes(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("utf8_bytes", f, seed=seed) as c:
        texts = [ARTICLE_SENTENCE, "Transformer", "naïve 🙂", "", "\n"]
        texts += [_random_text(c, c.randint(3, 12)) for _n in range(8 if thorough else 3)]
        for text in texts:
            got = c.call(text)
            _expect_list(c, got, ref.utf8_bytes(text), what=f"utf8_bytes({describe(text)})",
                         wrong=_utf8_mixups(text))
        c.headline(_("Chinese, accents and emoji as UTF-8 bytes"))


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
    Mistake("overlapping_occurrences", N_(
        "overlapping occurrences: occurrences may not share an id, so [a, a, a] with the pair "
        "(a, a) becomes [X, a], not [X, X]")): _merge_overlapping,
    Mistake("moves_on_by_one", N_(
        "after a match, skip both ids of the pair (move on by 2, not 1)")): _merge_step_one,
    Mistake("merged_from_the_right", N_(
        "merged from the right: scan left to right, so [a, a, a] becomes [X, a], not [a, X]")):
        _merge_right_to_left,
    Mistake("first_occurrence_only", N_(
        "merged only the first occurrence: replace every occurrence")): _merge_first_only,
    Mistake("dropped_last_id", N_(
        "dropped the last id: an id that starts no pair is copied as it is, the last one too")):
        _merge_drop_last,
}
TUPLE = Mistake("returned_tuple", N_("returned a tuple: return a list"))
TENSOR = Mistake("returned_tensor", N_("returned a tensor: return a list of ints"))
MERGE_IN_PLACE = Mistake("changed_ids_in_place", N_(
    "build and return a new list; the caller's list must stay as it was"))


def _merge_mixups(ids, pair, new_id) -> dict:
    want = ref.bpe_merge(ids, pair, new_id)
    mixups = {k: (lambda m=m: m(ids, pair, new_id)) for k, m in _MERGE_MISTAKES.items()}
    mixups[TUPLE] = tuple(want)
    mixups[TENSOR] = lambda: torch.tensor(want)
    return mixups


def _merge_case(c: Check, ids: list[int], pair: tuple[int, int], new_id: int) -> None:
    got = c.call(list(ids), pair, new_id)
    _expect_list(c, got, ref.bpe_merge(ids, pair, new_id),
                 what=f"bpe_merge({ids}, {pair}, {new_id})", wrong=_merge_mixups(ids, pair, new_id))


def check_bpe_merge(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("bpe_merge", f, seed=seed, in_place=MERGE_IN_PLACE) as c:
        cases = [([5, 5, 5], (5, 5), 256), ([7, 1, 2, 1, 2, 9, 1], (1, 2), 300),
                 ([5, 5, 5, 5], (5, 5), 257), ([3, 4, 1, 2], (1, 2), 999),
                 ([2, 1, 3], (1, 2), 256), ([], (1, 2), 256), ([1], (1, 2), 256)]
        for _n in range(12 if thorough else 4):
            alphabet = [c.randint(0, 400) for _n in range(3)]
            ids = [c.choice(alphabet) for _n in range(c.randint(6, 20))]
            i = c.randint(0, len(ids) - 1)
            cases.append((ids, (ids[i], ids[i + 1]), c.randint(400, 1000)))
        for ids, pair, new_id in cases:
            _merge_case(c, ids, pair, new_id)
        for line in (_("non-overlapping, left to right"), _("every occurrence"),
                     _("input list left unchanged")):
            c.headline(line)


# --------------------------------------------------------------------------------------------
# bpe_train

# The earlier exercises that bpe_train and bpe_encode are built on, in the chapter's order: a
# broken one that the learner's function calls is named ("fix bpe_merge first").
_BUILT_ON = {"utf8_bytes": check_utf8_bytes, "bpe_merge": check_bpe_merge}


def _train_variant(text: str, num_merges: int, *, tie: str = "first", start: int = 256,
                   count: str = "positions", merge=ref.bpe_merge, update: bool = True,
                   codes: Callable = ref.utf8_bytes, min_count: int = 1,
                   rounds: int = 0) -> dict:
    """bpe_train with one rule changed (to reproduce a known mistake)."""
    ids = codes(text)
    merges: dict = {}
    for r in range(num_merges + rounds):
        counts: dict = {}
        if count == "positions":
            for p in zip(ids, ids[1:]):
                counts[p] = counts.get(p, 0) + 1
        else:  # non-overlapping occurrences
            for p in dict.fromkeys(zip(ids, ids[1:])):
                counts[p] = len(ids) - len(ref.bpe_merge(ids, p, -1))
        if not counts or max(counts.values()) < min_count:
            break
        top = min(counts.values()) if tie == "least" else max(counts.values())
        tied = [p for p in counts if counts[p] == top]  # in order of first occurrence
        pair = {"first": tied[0], "least": tied[0], "last": tied[-1], "smallest": min(tied),
                "largest": max(tied), "largest_pair": max(counts),
                "first_id": min(tied, key=lambda p: ids.index(p[0]))}[tie]
        merges[pair] = start + r
        if update:
            ids = merge(ids, pair, start + r)
    return merges


_TRAIN_MISTAKES = {
    Mistake("least_frequent_pair", N_(
        "merged the least frequent pair: each round merges the MOST frequent adjacent pair "
        "(max of the counts, not min)")): dict(tie="least"),
    Mistake("max_of_pairs_not_counts", N_(
        "took max(counts), the largest pair itself: take the pair with the largest count, "
        "max(counts, key=counts.get)")): dict(tie="largest_pair"),
    Mistake("ties_to_smallest_pair", N_(
        "ties went to the smallest pair: among equally frequent pairs take the one that occurs "
        "first in the current sequence")): dict(tie="smallest"),
    Mistake("ties_to_largest_pair", N_(
        "ties went to the largest pair: among equally frequent pairs take the one that occurs "
        "first in the current sequence")): dict(tie="largest"),
    Mistake("ties_to_last_pair", N_(
        "ties went to the pair that occurs last: among equally frequent pairs take the one that "
        "occurs first in the current sequence")): dict(tie="last"),
    Mistake("ties_by_first_id_position", N_(
        "ties went to the pair whose first id occurs first in the sequence (ids.index(pair[0])): "
        "that id may stand first elsewhere, beside another id; among equally frequent pairs take "
        "the one whose two ids first stand side by side, e.g. the first of "
        "zip(ids, ids[1:]) with the top count")): dict(tie="first_id"),
    Mistake("ids_from_255", N_("new ids start at 256 (ids 0-255 are the single bytes), not 255")):
        dict(start=255),
    Mistake("ids_from_0", N_("new ids start at 256 (ids 0-255 are the single bytes), not 0")):
        dict(start=0),
    Mistake("ids_from_257", N_("new ids start at 256 (ids 0-255 are the single bytes), not 257")):
        dict(start=257),
    Mistake("sequence_not_updated", N_(
        "the same pair won every round: merge the chosen pair into the sequence "
        "(ids = bpe_merge(...)) before counting again")): dict(update=False),
    Mistake("counted_non_overlapping", N_(
        "counted non-overlapping occurrences: count every adjacent position, overlapping ones "
        "included ([a, a, a] holds (a, a) twice)")): dict(count="occurrences"),
    Mistake("merged_overlapping", N_(
        "merged overlapping occurrences while training: use bpe_merge's non-overlapping, "
        "left-to-right rule")): dict(merge=_merge_overlapping),
    Mistake("merged_from_the_right", N_(
        "merged from the right while training: use bpe_merge's left-to-right rule")):
        dict(merge=_merge_right_to_left),
    Mistake("ord_code_points", N_(
        "started from ord() code points: byte-level BPE starts from the UTF-8 bytes")):
        dict(codes=lambda t: [ord(ch) for ch in t]),
    Mistake("stops_at_count_one", N_(
        "stopped when the best pair occurs only once: keep merging until num_merges merges are "
        "made or no pair is left")): dict(min_count=2),
    Mistake("one_merge_too_few", N_(
        "made one merge too few: num_merges rounds, each adding one merge "
        "(for k in range(num_merges))")): dict(rounds=-1),
    Mistake("one_merge_too_many", N_(
        "made one merge too many: num_merges rounds, each adding one merge "
        "(for k in range(num_merges))")): dict(rounds=1),
}
NO_PAIR_LEFT = Mistake("no_stop_without_pairs", N_(
    "stop early when the sequence has no pair left (fewer than two ids)"),
    raises=[("ValueError", r"empty"), ("IndexError", None)])
MERGES_ORDER = Mistake("merges_out_of_order", N_(
    "insert each merge when it is learned: the dict's order is the merge order, which encoding "
    "relies on"))
ID_TO_PAIR = Mistake("mapped_id_to_pair", N_(
    "map each pair to its new id: {(a, b): 256, ...}, not new id -> pair"))


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
                   ID_TO_PAIR if isinstance(key, numbers.Integral) else None)
        items.append(((int(key[0]), int(key[1])), int(value)))
    return items


def _train_case(c: Check, text: str, num_merges: int) -> None:
    what = f"bpe_train({describe(text)}, {num_merges})"
    want = list(ref.bpe_train(text, num_merges).items())
    items = _merge_items(c, c.call(text, num_merges), what)
    if items != want and sorted(items) == sorted(want):
        c.fail(_("{what} learned the right merges but the dict is in another order.").format(
            what=what), MERGES_ORDER)
    wrong = {k: (lambda kw=kw: list(_train_variant(text, num_merges, **kw).items()))
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
    with builds_on("bpe_train", _BUILT_ON), Check("bpe_train", f, seed=seed,
                                                  errors=[NO_PAIR_LEFT]) as c:
        # Every mistake in _TRAIN_MISTAKES gives a different result on the first text (found by
        # a search), so that the first failure names it; the third is a five-way tie with
        # first != smallest != largest != last. In the last, (d, y) and (y, d) tie and (d, y)
        # stands first, but y is the first id of the text: a tie broken by where a pair's first
        # id first occurs (ids.index) picks (y, d).
        cases = [("zz学bbb学yz", 7), ("m byyy学m", 6), ("dcabzyme dcabzyme", 4), ("aaa bcbc", 4),
                 (ARTICLE_SENTENCE + " " + ARTICLE_SENTENCE, 8), ("abcd", 3), ("ybdydyd", 2)]
        for _n in range(6 if thorough else 2):
            cases.append((_random_text(c, c.randint(8, 25)), c.randint(5, 25)))
        cases += [("ab", 3), ("a", 2), ("", 2), ("abc", 0)]
        for text, num_merges in cases:
            _train_case(c, text, num_merges)
        for line in (_("most frequent pair, ties to the first occurrence"),
                     _("new ids from 256 in merge order"), _("stops when no pair is left")):
            c.headline(line)


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


_ENCODE_FIX = N_("apply the merges in training order (lowest new id first), whatever the text")
REVERSE_ORDER = Mistake("reverse_order", N_("applied the merges in reverse order: {fix}"))
BY_FREQUENCY = Mistake("most_frequent_pair_first", N_(
    "picked pairs by how often they occur in this text: {fix}"))
LEFTMOST = Mistake("leftmost_pair_first", N_("merged the leftmost learned pair first: {fix}"))
SORTED_ORDER = Mistake("merges_sorted_by_pair", N_(
    "applied the merges sorted by their pair of ids: {fix}"))
ENCODE_FIRST_ONLY = Mistake("first_occurrence_only", N_(
    "merged only the first occurrence of each pair: bpe_merge replaces every occurrence"))
NOT_MERGED = Mistake("merges_not_applied", N_(
    "returned the UTF-8 bytes without applying the merges"))
ENCODE_ORD = Mistake("ord_code_points", N_(
    "started from ord() code points: start from the UTF-8 bytes"))
BYTE_PAIRS_ONLY = Mistake("byte_pairs_only", N_(
    "applied only the merges of two single bytes: a merge's parts can be merged ids (256 and up) "
    "made by earlier merges; apply every merge, in training order"))
RANK_WITHOUT_DEFAULT = Mistake("rank_lookup_without_default", N_(
    "looked up the rank of every pair with merges.get(pair), which is None for a pair that was "
    "never learned: use merges.get(pair, float('inf')) and stop when no pair has a rank"),
    raises=[("TypeError", r"NoneType")])
ENCODE_CHANGED_MERGES = Mistake("changed_merges", N_("read the merges; do not modify them"))


def _encode_mixups(text, merges) -> dict:
    b = ref.utf8_bytes(text)
    fix = _(_ENCODE_FIX)

    def told(mistake: Mistake) -> Mistake:
        return mistake.with_text(_(mistake).format(fix=fix))
    return {
        told(REVERSE_ORDER): lambda: _encode_with(b, merges, list(merges)[::-1]),
        told(BY_FREQUENCY): lambda: _encode_by_frequency(b, merges),
        told(LEFTMOST): lambda: _encode_leftmost(b, merges),
        told(SORTED_ORDER): lambda: _encode_with(b, merges, sorted(merges)),
        ENCODE_FIRST_ONLY: lambda: _encode_with(b, merges, list(merges), _merge_first_only),
        NOT_MERGED: b,
        ENCODE_ORD: lambda: _encode_with([ord(ch) for ch in text], merges, list(merges)),
        BYTE_PAIRS_ONLY: lambda: _encode_with(b, merges, [p for p in merges if max(p) < 256]),
    }


def _encode_case(c: Check, text: str, merges: dict) -> None:
    got = c.call(text, dict(merges))
    _expect_list(c, got, ref.bpe_encode(text, merges),
                 what=_("{call} with {count} merges").format(
                     call=f"bpe_encode({describe(text)})", count=len(merges)),
                 wrong=_encode_mixups(text, merges))


def check_bpe_encode(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with builds_on("bpe_encode", _BUILT_ON), Check("bpe_encode", f, seed=seed,
                                                   errors=[RANK_WITHOUT_DEFAULT],
                                                   in_place=ENCODE_CHANGED_MERGES) as c:
        # Each mistake of _encode_mixups first differs from the answer on the first case, each
        # in its own way (found by a search); the second separates the wrong orders too; in the
        # third, (b, c) was learned before (a, b), so "abcab" encodes as [a, bc, ab].
        cases = [("cba学cc", {(229, 173): 256, (256, 166): 257, (98, 257): 258, (258, 257): 259,
                             (99, 98): 260, (98, 97): 261}),
                 ("baababab", {(97, 97): 256, (98, 97): 257, (257, 98): 258}),
                 ("abcab", {(98, 99): 256, (97, 98): 257})]
        for _n in range(3 if thorough else 1):
            corpus = _random_text(c, c.randint(15, 30))
            merges = ref.bpe_train(corpus, c.randint(10, 30))
            cases += [(corpus, merges), (ARTICLE_SENTENCE, merges),
                      (_random_text(c, c.randint(4, 12)), merges), ("", merges)]
        cases.append((ARTICLE_SENTENCE, {}))
        for text, merges in cases:
            _encode_case(c, text, merges)
        for line in (_("merges applied in training order"), _("Chinese text"),
                     _("no merges: the UTF-8 bytes")):
            c.headline(line)


# --------------------------------------------------------------------------------------------
# bpe_decode


_APART = Mistake("decoded_each_token", N_(
    "decoded each token separately: a character's bytes can be split across tokens; join all "
    "tokens' bytes first, then decode once"), raises=[("UnicodeDecodeError", None)])
DROPPED_INVALID = Mistake("errors_ignore", N_(
    "dropped invalid bytes (errors='ignore'); use errors='replace' so that they show up as "
    "U+FFFD (�)"))
ESCAPED_INVALID = Mistake("errors_backslashreplace", N_(
    "escaped invalid bytes (errors='backslashreplace'); use errors='replace'"))
LATIN1 = Mistake("decoded_latin1", N_(
    "decoded one character per byte (Latin-1): decode the joined bytes as UTF-8"))
APART_IGNORE = Mistake("decoded_each_token_ignoring_errors", N_(
    "decoded each token separately and dropped the broken pieces (errors='ignore'): a "
    "character's bytes can be split across tokens; join all tokens' bytes first, then decode "
    "once"))
DECODE_BYTES = Mistake("returned_bytes", N_(
    "returned the bytes: decode them into a str, b''.join(...).decode('utf-8', "
    "errors='replace')"))
STRICT = Mistake("strict_decoding", N_(
    "decode with errors='replace': invalid bytes become U+FFFD (�) instead of an error"),
    raises=[("UnicodeDecodeError", None)])
_EXPAND_HINT = Mistake("merged_ids_not_expanded", N_(
    "expand each merged id (256 and up) back into its bytes through the merges, recursively: a "
    "merge's two parts can be merged ids themselves"),
    raises=[("ValueError", None), ("KeyError", None), ("IndexError", None)])


VOCAB_OUT_OF_ORDER = Mistake("vocabulary_not_in_merge_order", N_(
    "built the tokens' bytes in another order than the merges were learned (sorted by pair?): "
    "a merge's part can be a merged id whose own merge comes later in that order, so its bytes "
    "are not known yet; go through the merges in training order, "
    "for (a, b), new_id in merges.items() (or expand each id recursively)"),
    raises=[("KeyError", r"^256$")])
# Learned in this order: (x, y) -> 256, then (a, 256) -> 257. Sorted by pair, (a, 256) comes
# first and needs 256's bytes before they exist (KeyError: 256); every other way of not
# expanding 257 fails on 257 itself or on a byte value >= 256 (ValueError).
_NESTED = {(ord("x"), ord("y")): 256, (ord("a"), 256): 257}


def _decode_mixups(ids, merges) -> dict:
    vocab = vocab_bytes(merges)
    pieces = [vocab[i] for i in ids]
    joined = b"".join(pieces)
    # Whole-sequence mistakes first: on valid UTF-8 they cannot match a wrong answer, and on
    # invalid bytes they are the better explanation.
    return {
        DROPPED_INVALID: lambda: joined.decode("utf-8", errors="ignore"),
        ESCAPED_INVALID: lambda: joined.decode("utf-8", errors="backslashreplace"),
        LATIN1: lambda: joined.decode("latin-1"),
        _APART: lambda: "".join(p.decode("utf-8", errors="replace") for p in pieces),
        APART_IGNORE: lambda: "".join(p.decode("utf-8", errors="ignore") for p in pieces),
        DECODE_BYTES: joined,
    }


def _decode_case(c: Check, ids: list[int], merges: dict, *, what: str) -> None:
    got = c.call(list(ids), dict(merges))
    c.expect_equal(got, ref.bpe_decode(ids, merges), what=what,
                   wrong=_decode_mixups(ids, merges))


def check_bpe_decode(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("bpe_decode", f, seed=seed,
               errors=[VOCAB_OUT_OF_ORDER, _APART, _EXPAND_HINT]) as c:
        _decode_case(c, [257, 256], _NESTED, what=f"bpe_decode([257, 256], {_NESTED})")
        c.errors = (_APART, _EXPAND_HINT)  # a KeyError from now on: a merged id not expanded
        # A token that ends inside a character: " " and the first byte of 学 merged, then a
        # token of the other two bytes; decoding token by token cannot give 学 back.
        split = {(32, 0xE5): 256, (0xAD, 0xA6): 257, (256, 257): 258}
        cases = [([256, 257] + ref.utf8_bytes("习"), split, " 学习"),
                 ([258, 0xE5, 257], split, " 学学")]
        for _n in range(3 if thorough else 1):
            corpus = _random_text(c, c.randint(15, 30)) + " " + ARTICLE_SENTENCE
            merges = ref.bpe_train(corpus, c.randint(10, 30))
            for text in (ARTICLE_SENTENCE, corpus, _random_text(c, c.randint(4, 12)), "",
                         "naïve 🙂 模型"):
                cases.append((ref.bpe_encode(text, merges), merges, text))
        cases.append((ref.utf8_bytes(ARTICLE_SENTENCE), {}, ARTICLE_SENTENCE))
        for ids, merges, text in cases:
            _decode_case(c, ids, merges, what=f"bpe_decode(bpe_encode({describe(text)}))")
        # Token sequences that are not valid UTF-8 (a model can generate them): U+FFFD, no error.
        # An error now is strict decoding (token by token would have failed above).
        c.errors = (STRICT, _EXPAND_HINT)
        merges = cases[2][1]
        broken = [ref.utf8_bytes("学")[:2] + ref.utf8_bytes(" ok"), [0xFF, 0x41],
                  ref.utf8_bytes("ok ") + [0x80]]
        for ids in broken:
            _decode_case(c, ids, merges, what=_("{call} (not valid UTF-8)").format(
                call=f"bpe_decode({ids})"))
        for line in (_("round trip, Chinese included"), _("characters split across tokens"),
                     _("invalid UTF-8 becomes U+FFFD")):
            c.headline(line)


# --------------------------------------------------------------------------------------------
# pad_batch


NOT_A_TENSOR = Mistake("returned_lists", N_(
    "return tensors, not Python lists: torch.tensor(rows, dtype=...) or torch.full(...)"))
IDS_NOT_LONG = Mistake("ids_not_long", N_(
    "token ids index the embedding table: make them torch.long (int64)"))
MASK_NOT_BOOL = Mistake("mask_not_bool", N_(
    "the mask is a BoolTensor: build it from a comparison (e.g. position < length) or call "
    ".bool()"))
LEFT_PADDED = Mistake("left_padding", N_(
    "padded on the left; this course pads on the right (real tokens first, padding after them)"))
PADDED_WITH_0 = Mistake("padded_with_zero", N_("padded with 0 instead of pad_id"))
IDS_FLOAT = Mistake("ids_as_floats", N_("returned the ids as floats"))
MASK_INVERTED = Mistake("mask_inverted", N_(
    "the mask is True at padding; True marks the real tokens"))
MASK_FROM_PAD_ID = Mistake("mask_from_pad_id", N_(
    "built the mask as token_ids != pad_id, but a real token can have the id pad_id: build the "
    "mask from the sequence lengths"))
MASK_LEFT = Mistake("mask_left_padded", N_(
    "the mask marks the last positions (left padding); with right padding the real tokens come "
    "first"))
SIZED_BY_FIRST = Mistake("sized_by_first_sequence", N_(
    "sized the batch by the first sequence: the longest one need not come first; pad every row "
    "to max(len(seq) for seq in sequences)"),
    raises=[("RuntimeError", r"(?i)size|shape"), ("ValueError", r"(?i)length|sequence|shape"),
            ("IndexError", None)])
PAD_IN_PLACE = Mistake("extended_input_lists", N_(
    "build new rows (seq + [pad_id] * k) instead of extending the caller's lists: they must "
    "stay as they were"))


def _expect_typed(c: Check, got, want: torch.Tensor, *, what: str, dims, hint: str,
                  wrong=None) -> None:
    """expect_tensor with a specific hint when only the dtype is wrong."""
    if isinstance(got, (list, tuple)):
        c.fail(_("{what} should be a torch.Tensor, got {kind}.").format(
            what=what, kind=type(got).__name__), NOT_A_TENSOR)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want}.").format(what=what, got=got.dtype,
                                                                   want=want.dtype),
               _same_dtype_variant(got, wrong) or hint)
    c.expect_tensor(got, want, what=what, dims=dims, wrong=wrong)


def _same_dtype_variant(got: torch.Tensor, wrong) -> Mistake | None:
    """The wrong variant that `got` reproduces, dtype included (expect_tensor's comparison
    ignores dtypes: returning the ids as floats is its own mistake)."""
    for mistake, variant in (wrong or {}).items():
        try:
            value = variant() if callable(variant) else variant
        except Exception:  # noqa: BLE001 - a variant that cannot be formed for these inputs says nothing
            continue
        if isinstance(value, torch.Tensor) and value.dtype == got.dtype and \
                matches(got, value, 0.0, 0.0):
            return mistake
    return None


def _left_pad(sequences, pad_id, s):
    ids = torch.full((len(sequences), s), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), s, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, s - len(seq):] = torch.tensor(seq)
            mask[row, s - len(seq):] = True
    return ids, mask


def _pad_case(c: Check, sequences: list[list[int]], pad_id: int) -> None:
    out = c.call([list(s) for s in sequences], pad_id)
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
                  hint=IDS_NOT_LONG,
                  wrong={LEFT_PADDED: left_ids,
                         PADDED_WITH_0: lambda: want_ids.masked_fill(~want_mask, 0),
                         IDS_FLOAT: lambda: want_ids.float(),
                         **_by_first(sequences, want_ids)})
    _expect_typed(c, mask, want_mask, what=f"attention_mask {what}", dims=("B", "S"),
                  hint=MASK_NOT_BOOL,
                  wrong={MASK_INVERTED: ~want_mask, MASK_FROM_PAD_ID: want_ids != pad_id,
                         MASK_LEFT: left_mask, **_by_first(sequences, want_mask)})


def _by_first(sequences, want: torch.Tensor) -> dict:
    """The batch cut to the first sequence's length (the longest need not be first)."""
    first = len(sequences[0]) if sequences else 0
    return {SIZED_BY_FIRST: want[:, :first]} if first < want.shape[1] else {}


def check_pad_batch(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("pad_batch", f, seed=seed, in_place=PAD_IN_PLACE) as c:
        # The same rows twice, the longest first and then in the middle: a function that passes
        # the first and fails the second (with an error or a narrower batch) sized the batch by
        # the first sequence, whatever the seed draws next.
        rows = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3]]
        _pad_case(c, rows, 8)
        c.errors = (SIZED_BY_FIRST,)
        _pad_case(c, [rows[1], rows[0], rows[2]], 8)
        c.errors = ()
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
        for line in (_("right padding with pad_id"), _("mask True at real tokens (bool)"),
                     _("a real token equal to pad_id")):
            c.headline(line)


# --------------------------------------------------------------------------------------------
# embed, one_hot, embedding_table_bytes


COLUMNS = Mistake("selected_columns", N_(
    "selected columns (table[:, ids]): each ROW of the table is one token's vector"))
TRANSPOSED_TABLE = Mistake("transposed_table", N_(
    "looked up rows of the transposed table: each ROW of the table is one token's vector"))
NO_BATCH = Mistake("dropped_batch_axis", N_("dropped the batch axis: the result is [B, S, H]"))
SWAPPED_B_S = Mistake("swapped_batch_and_sequence", N_(
    "swapped B and S: keep token_ids' [B, S] layout"))
FLATTENED = Mistake("flattened_ids", N_(
    "flattened the token ids: the result is [B, S, H], not [B * S, H]"))
SUMMED = Mistake("summed_over_sequence", N_(
    "summed over the sequence: every position keeps its own vector"))


def _embed_mixups(ids: torch.Tensor, table: torch.Tensor) -> dict:
    return {
        COLUMNS: lambda: table[:, ids],
        TRANSPOSED_TABLE: lambda: table.T[ids],
        NO_BATCH: lambda: table[ids[0]],
        SWAPPED_B_S: lambda: table[ids.T],
        FLATTENED: lambda: table[ids.reshape(-1)],
        SUMMED: lambda: table[ids].sum(1),
    }


def _forbid(name: str, hint: str) -> dict[str, str]:
    """Forbid a torch function (the engine also matches torch.ops.aten.<name>.<overload>)."""
    return {name: Mistake(FORBIDDEN_CALL, hint)}


_KEEP_DTYPE = Mistake("changed_dtype", N_(
    "keep the table's dtype: the lookup copies rows, it does not convert them"))


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
        for line in (_("rows of the table in [B, S, H]"), _("fp16/bf16 kept"),
                     _("the article's [1, 10] ids")):
            c.headline(line)


NOT_FLOAT32 = Mistake("not_float32", N_(
    "return float32 (torch.float): a one-hot matrix is multiplied with float tables"))
AXIS_MIDDLE = Mistake("one_hot_axis_in_middle", N_(
    "put the one-hot axis in the middle: it is the last axis, [B, S, V]"))
AXIS_FIRST = Mistake("one_hot_axis_first", N_(
    "put the one-hot axis first: it is the last axis, [B, S, V]"))
FROM_MAX = Mistake("vocab_size_from_max_id", N_(
    "used token_ids.max() + 1 as the vocabulary size; use vocab_size"))
ONE_SHORT = Mistake("vocab_size_minus_one", N_(
    "made vocab_size - 1 columns: ids run from 0 to vocab_size - 1, so torch.arange(vocab_size) "
    "gives one column per id"))
POSITION_ROW = Mistake("position_not_token_id", N_(
    "set the row of the position, not of the token id"))


def check_one_hot(f, *, seed: int | None = None, thorough: bool = False) -> None:
    forbid = _forbid("one_hot", N_("compare token_ids[..., None] with "
                                   "torch.arange(vocab_size), then convert to float"))
    with Check("one_hot", f, seed=seed, forbid=forbid) as c:
        # First ids far below vocab_size, so that max() + 1 and vocab_size - 1 differ.
        cases = [(torch.tensor([[0, 2, 1], [3, 0, 2]]), 9)]
        for _trial in range(5 if thorough else 2):
            b, s, v, _h = c.sizes(4, 2, 14)
            v += 3
            cases.append((c.randint(0, v - 1, (b, s)), v))  # the last id unused
        for ids, v in cases:
            (b, s), h = ids.shape, c.randint(2, 14)
            want = ref.one_hot(ids, v)
            got = c.call(ids.clone(), v)
            _expect_typed(c, got, want, what=_("one_hot for token_ids [B={b}, S={s}], "
                                               "vocab_size={v}").format(b=b, s=s, v=v),
                          dims=("B", "S", "V"), hint=NOT_FLOAT32,
                          wrong={AXIS_MIDDLE: lambda: want.transpose(1, 2),
                                 AXIS_FIRST: lambda: want.permute(2, 0, 1),
                                 FROM_MAX: lambda: ref.one_hot(ids, int(ids.max()) + 1),
                                 ONE_SHORT: lambda: want[..., :-1],
                                 POSITION_ROW: lambda: ref.one_hot(torch.arange(s).expand(b, s),
                                                                   v)})
            table = c.randn(v, h)
            c.expect_tensor(got @ table, ref.embed(ids, table), what="one_hot(ids) @ table",
                            dims=("B", "S", "H"))
        c.headline("float32 [B, S, V]")
        c.headline("one_hot(ids) @ table == table[ids]")


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
        c.headline(_("|V| * H * bytes_per_param as an int"))
        c.headline(_("the article's 32000 x 4096"))


PARAMETERS = Mistake("forgot_bytes_per_param", N_(
    "forgot bytes_per_param: |V| * H counts parameters, not bytes"))
BYTES_FLOAT = Mistake("returned_float", N_("returned a float: compute with integers (no `/`)"))
BITS = Mistake("counted_bits", N_("counted bits (times 8); the answer is in bytes"))
DIVIDED = Mistake("divided_by_bytes_per_param", N_(
    "divided by bytes_per_param; multiply by it"))
MIB = Mistake("converted_to_mib", N_("converted to MiB; return plain bytes"))
MIB_FLOOR = Mistake("converted_to_mib_floor", N_("converted to MiB with //; return plain bytes"))
GIB = Mistake("converted_to_gib", N_("converted to GiB; return plain bytes"))
SUM = Mistake("added_sizes", N_("added |V| + H; the table has |V| * H entries"))
PER_BIT = Mistake("divided_by_8", N_(
    "divided by 8: bytes_per_param is already in bytes (2 for fp16), not bits"))


def _bytes_mixups(v: int, h: int, bpp: int) -> dict:
    n = v * h * bpp
    return {PARAMETERS: v * h, BYTES_FLOAT: float(n), BITS: n * 8, DIVIDED: v * h // bpp,
            MIB: n / 2**20, MIB_FLOOR: n // 2**20, GIB: n / 2**30, PER_BIT: n // 8,
            SUM: (v + h) * bpp}


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "02.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "utf8_bytes": (
        UTF8_BOM, GBK, UTF16, UTF16_BOM, NOT_A_LIST, ORD, BYTES_OBJECT, CHARACTERS),
    "bpe_merge": (
        MERGE_IN_PLACE, *_MERGE_MISTAKES, TENSOR, TUPLE),
    "bpe_train": (
        *_TRAIN_MISTAKES, fix_first('utf8_bytes'), fix_first('bpe_merge'), ID_TO_PAIR, MERGES_ORDER,
        NO_PAIR_LEFT),
    "bpe_encode": (
        BYTE_PAIRS_ONLY, ENCODE_CHANGED_MERGES, ENCODE_FIRST_ONLY, fix_first('utf8_bytes'),
        fix_first('bpe_merge'),
        LEFTMOST, NOT_MERGED, SORTED_ORDER, BY_FREQUENCY, ENCODE_ORD, RANK_WITHOUT_DEFAULT,
        REVERSE_ORDER),
    "bpe_decode": (
        _APART, APART_IGNORE, LATIN1, ESCAPED_INVALID, DROPPED_INVALID, _EXPAND_HINT,
        DECODE_BYTES, STRICT, VOCAB_OUT_OF_ORDER),
    "pad_batch": (
        PAD_IN_PLACE, IDS_FLOAT, IDS_NOT_LONG, LEFT_PADDED, MASK_FROM_PAD_ID, MASK_INVERTED,
        MASK_LEFT, MASK_NOT_BOOL, PADDED_WITH_0, NOT_A_TENSOR, SIZED_BY_FIRST),
    "embed": (
        _KEEP_DTYPE, NO_BATCH, FLATTENED, COLUMNS, SUMMED, SWAPPED_B_S, TRANSPOSED_TABLE),
    "one_hot": (
        NOT_FLOAT32, AXIS_FIRST, AXIS_MIDDLE, POSITION_ROW, FROM_MAX, ONE_SHORT),
    "embedding_table_bytes": (
        SUM, GIB, MIB, MIB_FLOOR, BITS, PER_BIT, DIVIDED, PARAMETERS, BYTES_FLOAT),
}
