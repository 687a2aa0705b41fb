"""Chapter 02 checkers: correct implementations pass at every seed; known mistakes are diagnosed.

Inputs: random texts of words with shared pieces, runs of one letter, Chinese, accents and an emoji,
plus fixed cases (the article's sentence, a five-way tie, overlapping runs, invalid UTF-8); padding
with distinct B and S and a real token equal to pad_id; lookups with distinct B, S, H, |V| in 2..13,
fp16/bf16 tables, and the article's [1, 10] ids from |V| = 32000.
"""

import contextlib
import io
import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from checks import nb02
from checks import reference as ref
from checks.environment import LANG_ENV
from checks.engine import CheckFailure, ForbiddenCall, NotStarted

from ..support.catalogue import Wrong, exercises, failure_text, implementations
from ..support.cells import learner_cell as _learner_cell

# --------------------------------------------------------------------------------------------
# Correct implementations: the reference, and the notebook's formulations


def merge_while_loop(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def train_with_dict_max(text, num_merges):
    """Counts in a dict filled left to right; `max` returns the first of equal maxima."""
    ids = list(text.encode("utf-8"))
    merges = {}
    for k in range(num_merges):
        counts = {}
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = max(counts, key=counts.get)
        merges[best] = 256 + k
        ids = merge_while_loop(ids, best, 256 + k)
    return merges


def train_with_most_common(text, num_merges):
    """Counter.most_common keeps first-insertion order among equal counts."""
    from collections import Counter
    ids = list(text.encode("utf-8"))
    merges = {}
    for k in range(num_merges):
        if len(ids) < 2:
            break
        (best, _), = Counter(zip(ids, ids[1:])).most_common(1)
        merges[best] = 256 + k
        ids = merge_while_loop(ids, best, 256 + k)
    return merges


def encode_lowest_rank(text, merges):
    """Repeatedly merge the present pair with the lowest new id."""
    ids = list(text.encode("utf-8"))
    while len(ids) >= 2:
        pair = min(zip(ids, ids[1:]), key=lambda p: merges.get(p, float("inf")))
        if pair not in merges:
            break
        ids = merge_while_loop(ids, pair, merges[pair])
    return ids


def decode_by_unmerging(ids, merges):
    parts = {new_id: pair for pair, new_id in merges.items()}
    out, stack = [], list(reversed(ids))
    while stack:
        i = stack.pop()
        if i < 256:
            out.append(i)
        else:
            a, b = parts[i]
            stack += [b, a]
    return bytes(out).decode("utf-8", errors="replace")


def train_ties_by_recorded_position(text, num_merges):
    """Correct: each pair's first position recorded while counting; the earliest wins a tie."""
    ids = list(text.encode("utf-8"))
    merges = {}
    for k in range(num_merges):
        counts, first = {}, {}
        for i, pair in enumerate(zip(ids, ids[1:])):
            counts[pair] = counts.get(pair, 0) + 1
            first.setdefault(pair, i)
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], first[p]))
        merges[best] = 256 + k
        ids = merge_while_loop(ids, best, 256 + k)
    return merges


def decode_rank_order(ids, merges):
    """Correct: the merges sorted by their new id are the merges in training order."""
    vocab = {i: bytes([i]) for i in range(256)}
    for (a, b), new_id in sorted(merges.items(), key=lambda item: item[1]):
        vocab[new_id] = vocab[a] + vocab[b]
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def pad_with_loop(sequences, pad_id):
    s = max((len(q) for q in sequences), default=0)
    token_ids = torch.full((len(sequences), s), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), s, dtype=torch.bool)
    for b, seq in enumerate(sequences):
        token_ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[b, :len(seq)] = True
    return token_ids, mask


def embed_by_indexing(token_ids, table):
    return table[token_ids]


def embed_index_select(token_ids, table):
    return table.index_select(0, token_ids.reshape(-1)).reshape(*token_ids.shape, -1)


def one_hot_by_comparison(token_ids, vocab_size):
    return (token_ids.unsqueeze(-1) == torch.arange(vocab_size)).float()


def one_hot_by_scatter(token_ids, vocab_size):
    out = torch.zeros(*token_ids.shape, vocab_size)
    return out.scatter_(-1, token_ids.unsqueeze(-1), 1.0)


CORRECT = {
    nb02.check_utf8_bytes: implementations(ref.utf8_bytes,
                                           bytes_unpacked=lambda text: [*bytes(text, "utf-8")]),
    nb02.check_bpe_merge: implementations(ref.bpe_merge, merge_while_loop),
    nb02.check_bpe_train: implementations(ref.bpe_train, train_with_dict_max,
                                          train_with_most_common,
                                          train_ties_by_recorded_position),
    nb02.check_bpe_encode: implementations(ref.bpe_encode, encode_lowest_rank),
    nb02.check_bpe_decode: implementations(ref.bpe_decode, decode_by_unmerging,
                                           decode_rank_order),
    nb02.check_pad_batch: implementations(ref.pad_batch, pad_with_loop),
    # The reference's F.embedding / F.one_hot are the shortcuts these two checks forbid.
    nb02.check_embed: implementations(embed_by_indexing, embed_index_select),
    nb02.check_one_hot: implementations(one_hot_by_comparison, one_hot_by_scatter),
    nb02.check_embedding_table_bytes: implementations(ref.embedding_table_bytes,
                                                      product=lambda v, h, b: v * h * b),
}


# --------------------------------------------------------------------------------------------
# The reference itself: independent formulations that agree


def _texts(n, seed=0):
    rnd = random.Random(seed)
    pieces = ["low", "lower", "aaa", "ab", "学习", "喜欢", "AI", "é", "🙂", " ", "\n", "。"]
    return ["".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 40))) for _ in range(n)]


def test_reference_bpe_agrees_with_the_notebook_formulation():
    for i, text in enumerate(_texts(30)):
        merges = ref.bpe_train(text, 5 + i)
        assert merges == train_with_dict_max(text, 5 + i)
        assert list(merges.values()) == list(range(256, 256 + len(merges)))
        for other in _texts(3, seed=i + 1) + [text]:
            ids = ref.bpe_encode(other, merges)
            assert ids == encode_lowest_rank(other, merges)
            assert ref.bpe_decode(ids, merges) == other == decode_by_unmerging(ids, merges)


def test_reference_training_sequence_is_the_encoding():
    """Training merges the text step by step; encoding the text replays those steps."""
    text = "我喜欢学习 AI Infra，也喜欢学习模型。" * 3
    ids = ref.utf8_bytes(text)
    merges = ref.bpe_train(text, 20)
    for pair, new_id in merges.items():
        ids = merge_while_loop(ids, pair, new_id)
    assert ids == ref.bpe_encode(text, merges)
    assert len(ids) < len(ref.utf8_bytes(text))


def test_reference_lookups_match_the_notebook_formulations():
    ids = torch.randint(0, 50, (3, 7))
    table = torch.randn(50, 6)
    assert torch.equal(ref.embed(ids, table), table[ids])
    assert torch.equal(ref.one_hot(ids, 50), one_hot_by_comparison(ids, 50))
    assert torch.allclose(ref.one_hot(ids, 50) @ table, ref.embed(ids, table))
    assert ref.embedding_table_bytes(32000, 4096, 2) == 262_144_000


def test_reference_padding():
    ids, mask = ref.pad_batch([[5, 6, 7], [8], []], 0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[True] * 3, [True, False, False], [False] * 3]


# --------------------------------------------------------------------------------------------
# Forbidden shortcuts


@pytest.mark.parametrize("checker,shortcut", [
    (nb02.check_embed, ref.embed),
    (nb02.check_embed, lambda ids, table: torch.nn.functional.embedding(ids, table)),
    (nb02.check_embed, lambda ids, table: torch.ops.aten.embedding(table, ids)),
    (nb02.check_one_hot, ref.one_hot),
    (nb02.check_one_hot, lambda ids, v: F.one_hot(ids, v).float()),
    (nb02.check_one_hot, lambda ids, v: torch.ops.aten.one_hot.default(ids, v).float()),
])
def test_forbidden_shortcut_is_rejected(checker, shortcut):
    with pytest.raises(ForbiddenCall):
        checker(shortcut, seed=0)


def test_nn_embedding_module_is_a_forbidden_shortcut():
    def embed_with_module(ids, table):
        layer = torch.nn.Embedding(*table.shape, dtype=table.dtype)
        layer.weight.data.copy_(table)
        return layer(ids).detach()
    with pytest.raises(ForbiddenCall):
        nb02.check_embed(embed_with_module, seed=0)


# --------------------------------------------------------------------------------------------
# Wrong implementations


def merge_overlapping(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        elif i > 0 and (ids[i - 1], ids[i]) == pair:
            continue  # second half of a pair
        else:
            out.append(ids[i])
    return out


def merge_step_one(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        else:
            out.append(ids[i])
        i += 1
    return out


def merge_right_to_left(ids, pair, new_id):
    out, i = [], len(ids) - 1
    while i >= 0:
        if i >= 1 and (ids[i - 1], ids[i]) == pair:
            out.insert(0, new_id)
            i -= 2
        else:
            out.insert(0, ids[i])
            i -= 1
    return out


def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2:]
    return ids


def merge_drops_last(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_in_place(ids, pair, new_id):
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            ids[i:i + 2] = [new_id]
        i += 1
    return ids


def _trainer(*, pick=None, start=256, update=True, count=None, merge=merge_while_loop,
             codes=lambda t: list(t.encode("utf-8")), min_count=1, order=None):
    """A learner-style training loop with one thing done differently."""
    def train(text, num_merges):
        ids = codes(text)
        merges = {}
        for k in range(num_merges):
            counts = {}
            if count is None:
                for pair in zip(ids, ids[1:]):
                    counts[pair] = counts.get(pair, 0) + 1
            else:
                counts = count(ids)
            if not counts or max(counts.values()) < min_count:
                break
            best = (pick or (lambda c: max(c, key=c.get)))(counts)
            merges[best] = start + k
            if update:
                ids = merge(ids, best, start + k)
        return order(merges) if order else merges
    return train


def _count_non_overlapping(ids):
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = len(ids) - len(merge_while_loop(ids, pair, -1))
    return counts


def _train_crashes_without_pairs(text, num_merges):
    ids = list(text.encode("utf-8"))
    merges = {}
    for k in range(num_merges):
        counts = {}
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + 1
        best = max(counts, key=counts.get)  # ValueError on an empty dict
        merges[best] = 256 + k
        ids = merge_while_loop(ids, best, 256 + k)
    return merges


def encode_reverse_order(text, merges):
    ids = list(text.encode("utf-8"))
    for pair in reversed(list(merges)):
        ids = merge_while_loop(ids, pair, merges[pair])
    return ids


def encode_most_frequent_first(text, merges):
    ids = list(text.encode("utf-8"))
    while True:
        counts = {}
        for pair in zip(ids, ids[1:]):
            if pair in merges:
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            return ids
        best = max(counts, key=counts.get)
        ids = merge_while_loop(ids, best, merges[best])


def encode_leftmost_first(text, merges):
    ids = list(text.encode("utf-8"))
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) in merges:
            ids[i:i + 2] = [merges[ids[i], ids[i + 1]]]
            i = max(i - 1, 0)
        else:
            i += 1
    return ids


def encode_in_order(text, merges, order):
    ids = list(text.encode("utf-8"))
    for pair in order:
        ids = merge_while_loop(ids, pair, merges[pair])
    return ids


def encode_rank_without_default(text, merges):
    ids = list(text.encode("utf-8"))
    while len(ids) >= 2:
        pair = min(zip(ids, ids[1:]), key=lambda p: merges.get(p))  # None for unknown pairs
        if pair not in merges:
            break
        ids = merge_while_loop(ids, pair, merges[pair])
    return ids


def encode_popping(text, merges):
    ids = list(text.encode("utf-8"))
    while merges:
        pair, new_id = next(iter(merges.items()))
        merges.pop(pair)
        ids = merge_while_loop(ids, pair, new_id)
    return ids


def encode_with_ord(text, merges):
    ids = [ord(ch) for ch in text]
    for pair, new_id in merges.items():
        ids = merge_while_loop(ids, pair, new_id)
    return ids


def encode_first_occurrences(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges.items():
        ids = merge_first_only(ids, pair, new_id)
    return ids


def _vocab(merges):
    vocab = {i: bytes([i]) for i in range(256)}
    for (a, b), new_id in merges.items():
        vocab[new_id] = vocab[a] + vocab[b]
    return vocab


def decode_each_token(ids, merges, errors="replace"):
    vocab = _vocab(merges)
    return "".join(vocab[i].decode("utf-8", errors=errors) for i in ids)


def decode_one_level(ids, merges):
    parts = {new_id: pair for pair, new_id in merges.items()}
    out = []
    for i in ids:
        out += list(parts[i]) if i >= 256 else [i]
    return bytes(out).decode("utf-8", errors="replace")


def decode_vocab_in_pair_order(ids, merges):
    """Each token's bytes built going through the merges sorted by pair, not in merge order."""
    vocab = {i: bytes([i]) for i in range(256)}
    for (a, b), new_id in sorted(merges.items()):
        vocab[new_id] = vocab[a] + vocab[b]
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def decode_vocab_newest_first(ids, merges):
    vocab = {i: bytes([i]) for i in range(256)}
    for (a, b), new_id in reversed(merges.items()):
        vocab[new_id] = vocab[a] + vocab[b]
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def _ties_by_first_id(counts, ids):
    top = max(counts.values())
    return min((p for p in counts if counts[p] == top), key=lambda p: ids.index(p[0]))


def train_ties_by_first_id(text, num_merges):
    """Ties broken by where the pair's first id first occurs, not where the pair does."""
    ids = list(text.encode("utf-8"))
    merges = {}
    for k in range(num_merges):
        counts = {}
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = _ties_by_first_id(counts, ids)
        merges[best] = 256 + k
        ids = merge_while_loop(ids, best, 256 + k)
    return merges


def pad_sized_by_first(sequences, pad_id):
    s = len(sequences[0])
    token_ids = torch.full((len(sequences), s), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), s, dtype=torch.bool)
    for b, seq in enumerate(sequences):
        token_ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)  # fails for a longer one
        mask[b, :len(seq)] = True
    return token_ids, mask


def pad_sized_by_first_cut(sequences, pad_id):
    s = len(sequences[0])
    rows = [(list(seq) + [pad_id] * s)[:s] for seq in sequences]
    masks = [[i < len(seq) for i in range(s)] for seq in sequences]
    return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.bool)


def pad_sized_by_first_lists(sequences, pad_id):
    s = len(sequences[0])
    rows = [list(seq) + [pad_id] * (s - len(seq)) for seq in sequences]  # ragged: ValueError
    masks = [[True] * len(seq) + [False] * (s - len(seq)) for seq in sequences]
    return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.bool)


def _pad(*, left=False, mask_fn=None, ids_dtype=torch.long, fill=None):
    def pad_batch(sequences, pad_id):
        s = max(len(q) for q in sequences)
        rows, masks = [], []
        for seq in sequences:
            padding = [pad_id if fill is None else fill] * (s - len(seq))
            real = [True] * len(seq)
            rows.append(padding + list(seq) if left else list(seq) + padding)
            masks.append([False] * len(padding) + real if left else real + [False] * len(padding))
        token_ids = torch.tensor(rows, dtype=ids_dtype)
        mask = torch.tensor(masks, dtype=torch.bool)
        return token_ids, (mask_fn(mask, token_ids, pad_id) if mask_fn else mask)
    return pad_batch


def pad_extends_inputs(sequences, pad_id):
    s = max(len(q) for q in sequences)
    lengths = torch.tensor([len(q) for q in sequences])
    for seq in sequences:
        seq.extend([pad_id] * (s - len(seq)))
    return torch.tensor(sequences), torch.arange(s)[None, :] < lengths[:, None]


def one_hot_axis_1(token_ids, vocab_size):
    return (token_ids[:, None, :] == torch.arange(vocab_size)[None, :, None]).float()


def one_hot_from_max(token_ids, vocab_size):
    return (token_ids[..., None] == torch.arange(int(token_ids.max()) + 1)).float()


WRONG = {
    nb02.check_utf8_bytes: [
        Wrong("ord per character", lambda text: [ord(ch) for ch in text],
              '02.utf8_bytes.ord_per_character'),
        Wrong("GBK", lambda text: list(text.encode("gbk")), '02.utf8_bytes.encoded_gbk'),
        Wrong("bytes object", lambda text: text.encode("utf-8"),
              '02.utf8_bytes.returned_bytes_object'),
        Wrong("UTF-16", lambda text: list(text.encode("utf-16-le")), '02.utf8_bytes.encoded_utf16'),
        Wrong("UTF-16 with BOM", lambda text: list(text.encode("utf-16")),
              '02.utf8_bytes.encoded_utf16_with_bom'),
        Wrong("BOM", lambda text: list(text.encode("utf-8-sig")),
              '02.utf8_bytes.added_byte_order_mark'),
        Wrong("characters", lambda text: list(text), '02.utf8_bytes.returned_characters'),
        Wrong("tuple", lambda text: tuple(text.encode("utf-8")),
              '02.utf8_bytes.not_a_list_of_ints'),
    ],
    nb02.check_bpe_merge: [
        Wrong("overlapping", merge_overlapping, '02.bpe_merge.overlapping_occurrences'),
        Wrong("moves on by one", merge_step_one, '02.bpe_merge.moves_on_by_one'),
        Wrong("right to left", merge_right_to_left, '02.bpe_merge.merged_from_the_right'),
        Wrong("first occurrence only", merge_first_only, '02.bpe_merge.first_occurrence_only'),
        Wrong("drops the last id", merge_drops_last, '02.bpe_merge.dropped_last_id'),
        Wrong("edits the input", merge_in_place, '02.bpe_merge.changed_ids_in_place'),
        Wrong("tuple", lambda ids, pair, new_id: tuple(merge_while_loop(ids, pair, new_id)),
              '02.bpe_merge.returned_tuple'),
        Wrong("tensor", lambda ids, pair, new_id: torch.tensor(merge_while_loop(ids, pair, new_id),
                                                               dtype=torch.long),
              '02.bpe_merge.returned_tensor'),
    ],
    nb02.check_bpe_train: [
        Wrong("ties to the smallest pair", _trainer(
            pick=lambda c: min(p for p in c if c[p] == max(c.values()))),
              '02.bpe_train.ties_to_smallest_pair'),
        Wrong("ties to the largest pair", _trainer(
            pick=lambda c: max(c.items(), key=lambda kv: (kv[1], kv[0]))[0]),
              '02.bpe_train.ties_to_largest_pair'),
        Wrong("ties to the last pair", _trainer(pick=lambda c: sorted(c, key=c.get)[-1]),
              '02.bpe_train.ties_to_last_pair'),
        Wrong("ties by the first id's position", train_ties_by_first_id,
              '02.bpe_train.ties_by_first_id_position'),
        Wrong("ids from 255", _trainer(start=255), '02.bpe_train.ids_from_255'),
        Wrong("ids from 0", _trainer(start=0), '02.bpe_train.ids_from_0'),
        Wrong("ids from 257", _trainer(start=257), '02.bpe_train.ids_from_257'),
        Wrong("sequence never updated", _trainer(update=False),
              '02.bpe_train.sequence_not_updated'),
        Wrong("non-overlapping counts", _trainer(count=_count_non_overlapping),
              '02.bpe_train.counted_non_overlapping'),
        Wrong("overlapping merge", _trainer(merge=merge_overlapping),
              '02.bpe_train.merged_overlapping'),
        Wrong("right-to-left merge", _trainer(merge=merge_right_to_left),
              '02.bpe_train.merged_from_the_right'),
        Wrong("ord code points", _trainer(codes=lambda t: [ord(ch) for ch in t]),
              '02.bpe_train.ord_code_points'),
        Wrong("least frequent pair", _trainer(pick=lambda c: min(c, key=c.get)),
              '02.bpe_train.least_frequent_pair'),
        Wrong("max of the pairs", _trainer(pick=max), '02.bpe_train.max_of_pairs_not_counts'),
        Wrong("one merge too few", lambda text, n: _trainer()(text, n - 1),
              '02.bpe_train.one_merge_too_few'),
        Wrong("one merge too many", lambda text, n: _trainer()(text, n + 1),
              '02.bpe_train.one_merge_too_many'),
        Wrong("stops at count 1", _trainer(min_count=2), '02.bpe_train.stops_at_count_one'),
        Wrong("crashes without pairs", _train_crashes_without_pairs,
              '02.bpe_train.no_stop_without_pairs'),
        Wrong("sorted dict", _trainer(order=lambda m: dict(sorted(m.items()))),
              '02.bpe_train.merges_out_of_order'),
        Wrong("id -> pair", _trainer(order=lambda m: {v: k for k, v in m.items()}),
              '02.bpe_train.mapped_id_to_pair'),
    ],
    nb02.check_bpe_encode: [
        Wrong("reverse order", encode_reverse_order, '02.bpe_encode.reverse_order'),
        Wrong("most frequent first", encode_most_frequent_first,
              '02.bpe_encode.most_frequent_pair_first'),
        Wrong("leftmost first", encode_leftmost_first, '02.bpe_encode.leftmost_pair_first'),
        Wrong("ord code points", encode_with_ord, '02.bpe_encode.ord_code_points'),
        Wrong("sorted merges", lambda text, merges: encode_in_order(text, merges, sorted(merges)),
              '02.bpe_encode.merges_sorted_by_pair'),
        Wrong("byte pairs only", lambda text, merges: encode_in_order(
            text, merges, [p for p in merges if max(p) < 256]), '02.bpe_encode.byte_pairs_only'),
        Wrong("rank without a default", encode_rank_without_default,
              '02.bpe_encode.rank_lookup_without_default'),
        Wrong("pops the merges", encode_popping, '02.bpe_encode.changed_merges'),
        Wrong("first occurrences", encode_first_occurrences, '02.bpe_encode.first_occurrence_only'),
        Wrong("merges ignored", lambda text, merges: list(text.encode("utf-8")),
              '02.bpe_encode.merges_not_applied'),
    ],
    nb02.check_bpe_decode: [
        Wrong("each token, replace", decode_each_token, '02.bpe_decode.decoded_each_token'),
        Wrong("each token, strict", lambda ids, m: decode_each_token(ids, m, "strict"),
              '02.bpe_decode.decoded_each_token'),
        Wrong("errors='ignore'", lambda ids, m: b"".join(_vocab(m)[i] for i in ids).decode(
            "utf-8", errors="ignore"), '02.bpe_decode.errors_ignore'),
        Wrong("strict", lambda ids, m: b"".join(_vocab(m)[i] for i in ids).decode("utf-8"),
              '02.bpe_decode.strict_decoding'),
        Wrong("Latin-1", lambda ids, m: b"".join(_vocab(m)[i] for i in ids).decode("latin-1"),
              '02.bpe_decode.decoded_latin1'),
        Wrong("merges ignored", lambda ids, m: bytes(ids).decode("utf-8", errors="replace"),
              '02.bpe_decode.merged_ids_not_expanded'),
        Wrong("each token, ignore", lambda ids, m: decode_each_token(ids, m, "ignore"),
              '02.bpe_decode.decoded_each_token_ignoring_errors'),
        Wrong("backslashreplace", lambda ids, m: b"".join(_vocab(m)[i] for i in ids).decode(
            "utf-8", errors="backslashreplace"), '02.bpe_decode.errors_backslashreplace'),
        Wrong("returns bytes", lambda ids, m: b"".join(_vocab(m)[i] for i in ids),
              '02.bpe_decode.returned_bytes'),
        Wrong("one level of unmerging", decode_one_level, '02.bpe_decode.merged_ids_not_expanded'),
        Wrong("vocabulary in pair order", decode_vocab_in_pair_order,
              '02.bpe_decode.vocabulary_not_in_merge_order'),
        Wrong("vocabulary newest first", decode_vocab_newest_first,
              '02.bpe_decode.vocabulary_not_in_merge_order'),
    ],
    nb02.check_pad_batch: [
        Wrong("left padding", _pad(left=True), '02.pad_batch.left_padding'),
        Wrong("mask inverted", _pad(mask_fn=lambda m, ids, p: ~m), '02.pad_batch.mask_inverted'),
        Wrong("mask as 0/1 ints", _pad(mask_fn=lambda m, ids, p: m.long()),
              '02.pad_batch.mask_not_bool'),
        Wrong("mask from pad_id", _pad(mask_fn=lambda m, ids, p: ids != p),
              '02.pad_batch.mask_from_pad_id'),
        Wrong("mask as floats", _pad(mask_fn=lambda m, ids, p: m.float()),
              '02.pad_batch.mask_not_bool'),
        Wrong("float ids", _pad(ids_dtype=torch.float32), '02.pad_batch.ids_as_floats'),
        Wrong("mask of left padding", _pad(mask_fn=lambda m, ids, p: m.flip(-1)),
              '02.pad_batch.mask_left_padded'),
        Wrong("int32 ids", _pad(ids_dtype=torch.int32), '02.pad_batch.ids_not_long'),
        Wrong("pads with 0", _pad(fill=0), '02.pad_batch.padded_with_zero'),
        Wrong("extends the input lists", pad_extends_inputs, '02.pad_batch.extended_input_lists'),
        Wrong("sized by the first sequence", pad_sized_by_first,
              '02.pad_batch.sized_by_first_sequence'),
        Wrong("cut to the first sequence", pad_sized_by_first_cut,
              '02.pad_batch.sized_by_first_sequence'),
        Wrong("ragged lists sized by the first", pad_sized_by_first_lists,
              '02.pad_batch.sized_by_first_sequence'),
        Wrong("lists, not tensors", lambda seqs, pad_id: tuple(
            x.tolist() for x in pad_with_loop(seqs, pad_id)), '02.pad_batch.returned_lists'),
    ],
    nb02.check_embed: [
        Wrong("columns", lambda ids, table: table[:, ids], '02.embed.selected_columns'),
        Wrong("transposed table", lambda ids, table: table.T[ids], '02.embed.transposed_table'),
        Wrong("batch dropped", lambda ids, table: table[ids[0]], '02.embed.dropped_batch_axis'),
        Wrong("B and S swapped", lambda ids, table: table[ids.T],
              '02.embed.swapped_batch_and_sequence'),
        Wrong("flattened", lambda ids, table: table[ids.flatten()], '02.embed.flattened_ids'),
        Wrong("cast to float32", lambda ids, table: table[ids].float(), '02.embed.changed_dtype'),
        Wrong("squeezed", lambda ids, table: table[ids].squeeze(),
              '02.embed.dropped_batch_axis'),
        Wrong("bag of words", lambda ids, table: table[ids].sum(1),
              '02.embed.summed_over_sequence'),
    ],
    nb02.check_one_hot: [
        Wrong("int64", lambda ids, v: (ids[..., None] == torch.arange(v)).long(),
              '02.one_hot.not_float32'),
        Wrong("bool", lambda ids, v: ids[..., None] == torch.arange(v), '02.one_hot.not_float32'),
        Wrong("float64", lambda ids, v: (ids[..., None] == torch.arange(v)).double(),
              '02.one_hot.not_float32'),
        Wrong("axis 1", one_hot_axis_1, '02.one_hot.one_hot_axis_in_middle'),
        Wrong("axis first", lambda ids, v: (ids[None] == torch.arange(v)[:, None, None]).float(),
              '02.one_hot.one_hot_axis_first'),
        Wrong("position rows", lambda ids, v: (torch.arange(ids.shape[1]).expand(ids.shape)[
            ..., None] == torch.arange(v)).float(), '02.one_hot.position_not_token_id'),
        Wrong("arange(V - 1)", lambda ids, v: (ids[..., None] == torch.arange(v - 1)).float(),
              '02.one_hot.vocab_size_minus_one'),
        Wrong("size from ids.max()", one_hot_from_max, '02.one_hot.vocab_size_from_max_id'),
    ],
    nb02.check_embedding_table_bytes: [
        Wrong("parameters, not bytes", lambda v, h, b: v * h,
              '02.embedding_table_bytes.forgot_bytes_per_param'),
        Wrong("float", lambda v, h, b: v * h * b / 1, '02.embedding_table_bytes.returned_float'),
        Wrong("bits", lambda v, h, b: v * h * b * 8, '02.embedding_table_bytes.counted_bits'),
        Wrong("MiB", lambda v, h, b: v * h * b / 1024 / 1024,
              '02.embedding_table_bytes.converted_to_mib'),
        Wrong("divides", lambda v, h, b: v * h // b,
              '02.embedding_table_bytes.divided_by_bytes_per_param'),
        Wrong("MiB with //", lambda v, h, b: v * h * b // 2**20,
              '02.embedding_table_bytes.converted_to_mib_floor'),
        Wrong("GiB", lambda v, h, b: v * h * b / 2**30,
              '02.embedding_table_bytes.converted_to_gib'),
        Wrong("divides by 8", lambda v, h, b: v * h * b // 8,
              '02.embedding_table_bytes.divided_by_8'),
        Wrong("sum of sizes", lambda v, h, b: (v + h) * b, '02.embedding_table_bytes.added_sizes'),
    ],
}


EXERCISES = exercises(CORRECT, WRONG)


# --------------------------------------------------------------------------------------------
# bpe_train and bpe_encode are built on utf8_bytes and bpe_merge: a broken one they call is named


_LEARNER_CELL = '''
def utf8_bytes(text):
    return list(text.encode("utf-8"))

def bpe_merge(ids, pair, new_id):                 # broken: merges only the first occurrence
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)

def bpe_train(text, num_merges):
    ids, merges = utf8_bytes(text), {}
    for k in range(num_merges):
        counts = {}
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = max(counts, key=counts.get)
        merges[best] = 256 + k
        ids = bpe_merge(ids, best, 256 + k)
    return merges

def bpe_encode(text, merges):
    ids = utf8_bytes(text)
    for pair, new_id in merges.items():
        ids = bpe_merge(ids, pair, new_id)
    return ids
'''




@pytest.mark.parametrize("exercise", ["bpe_train", "bpe_encode"])
def test_a_broken_bpe_merge_is_named_fix_it_first(exercise):
    ns = _learner_cell(_LEARNER_CELL)
    with pytest.raises(CheckFailure) as info:
        getattr(nb02, f"check_{exercise}")(ns[exercise], seed=0)
    assert info.value.mistake == f"02.{exercise}.fix_bpe_merge_first"


def test_a_broken_bpe_merge_that_is_not_called_is_not_blamed():
    cell = _LEARNER_CELL.replace("ids = bpe_merge(ids, pair, new_id)", "ids = ids[::-1]")
    ns = _learner_cell(cell)
    with pytest.raises(CheckFailure) as info:
        nb02.check_bpe_encode(ns["bpe_encode"], seed=0)
    assert info.value.mistake != "02.bpe_encode.fix_bpe_merge_first"
    assert "bpe_merge" not in str(info.value).split("likely mistake")[-1]


def test_chapter_02_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    ns = _learner_cell(_LEARNER_CELL)
    text = failure_text(nb02.check_bpe_merge, ns["bpe_merge"])
    assert "可能的错误：只合并了第一次出现：每一次出现都要替换" in text, text
    assert "expected" not in text and "likely mistake" not in text
    with pytest.raises(CheckFailure) as info:
        nb02.check_bpe_train(ns["bpe_train"], seed=0)
    assert "所以请先修好 bpe_merge" in str(info.value), str(info.value)


# --------------------------------------------------------------------------------------------
# A sweep over sizes (issue 33): small alphabets, numbers of merges, batch widths and the
# empty / one-element edges. The notebook's answer and every correct formulation agree with the
# reference at every point; each catalogued wrong implementation differs somewhere (a catalogue
# entry that never differs tests nothing), and wherever it differs, the check's own comparison of
# that case rejects it. (Three wrong ones escaped at some seeds because no fixed case held the
# size that shows them: a longest sequence that is not first, a tie whose pair's first id stands
# first elsewhere, a merge built from a later-sorted one. A sweep like this one finds them.)


def _sweep_texts(per_size: int = 2) -> list[str]:
    """Texts of 0 to 9 characters over alphabets of 1 to 4 symbols (Chinese among them)."""
    rng = random.Random(33)
    texts = ["", "a", "aa", "ab", "我", "a我a我"]
    for alphabet in ("a", "ab", "abc", "abcd", "ab我"):
        for length in range(2, 10):
            texts += ["".join(rng.choice(alphabet) for _n in range(length))
                      for _t in range(per_size)]
    return texts


def _sweep_merge_points() -> list:
    points = [([], (5, 6), 256), ([5], (5, 6), 256), ([5, 5, 5], (5, 5), 300)]
    rng = random.Random(2)
    for size in (1, 2, 3):
        for length in range(2, 9):
            for _t in range(4):
                ids = [5 + rng.randrange(size) for _n in range(length)]
                pair = (5 + rng.randrange(size), 5 + rng.randrange(size))
                points.append((ids, pair, 256 + rng.randrange(100)))
    return points


def _sweep_train_points() -> list:
    return [(text, n) for text in _sweep_texts(per_size=8) for n in (0, 1, 2, 4, 7)]


def _sweep_code_points() -> list:
    """(text, merges) for encoding and (ids, merges) for decoding, merges of every count."""
    points = [("axyxy", {(120, 121): 256, (97, 256): 257})]
    corpus = _sweep_texts()
    for i, text in enumerate(corpus):  # merges learned from this text, and from another one
        points.append((text, ref.bpe_train(corpus[-1 - i] + " " + text, i % 6)))
        points.append((text, ref.bpe_train(corpus[(7 * i) % len(corpus)], 1 + i % 5)))
    return points


def _sweep_pad_points() -> list:
    rng = random.Random(5)
    points = []
    for width in (1, 2, 3):
        for lengths in itertools.product(range(4), repeat=width):
            pad_id = rng.randrange(1, 4)
            points.append(([[rng.randrange(0, 5) for _n in range(n)] for n in lengths], pad_id))
    for _t in range(12):
        lengths = [rng.randrange(6) for _n in range(4)]
        points.append(([[rng.randrange(0, 5) for _n in range(n)] for n in lengths], 2))
    return points


def _same(got, want) -> bool:
    """Equal, with the same types (and dtypes and shapes): what the checks require."""
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want))
    if isinstance(want, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.dtype == want.dtype and
                got.shape == want.shape and torch.equal(got, want))
    if isinstance(want, dict):
        return type(got) is dict and list(got.items()) == list(want.items())
    return type(got) is type(want) and got == want


def _outcome(fn, args):
    """What `fn` returns for copies of `args`, or the exception class it raises; and whether it
    changed them."""
    import copy
    given = copy.deepcopy(args)
    try:
        out = fn(*given)
    except Exception as exc:  # noqa: BLE001 - a wrong implementation may raise anything
        return type(exc), False
    return out, given != args


# exercise: (its checker, its per-case comparison as the check runs it, the sweep's points as
# argument tuples)
_SWEEPS = {
    "bpe_merge": (nb02.check_bpe_merge, nb02._merge_case, _sweep_merge_points),
    "bpe_train": (nb02.check_bpe_train, nb02._train_case, _sweep_train_points),
    "bpe_encode": (nb02.check_bpe_encode, nb02._encode_case, _sweep_code_points),
    "bpe_decode": (nb02.check_bpe_decode,
                   lambda c, ids, merges: nb02._decode_case(c, ids, merges, what="bpe_decode"),
                   lambda: [(ref.bpe_encode(text, merges), merges)
                            for text, merges in _sweep_code_points()]
                   + [([0xE5, 0xAD], {}), ([0x80, 65], {(65, 65): 256})]),
    "pad_batch": (nb02.check_pad_batch, nb02._pad_case, _sweep_pad_points),
}


def _reference_of(name):
    return getattr(ref, name)


def _sweep_case(name: str, fn, args) -> None:
    """Run the check's comparison of one sweep point on `fn` (CheckFailure when rejected)."""
    checker, case, _points = _SWEEPS[name]
    with contextlib.redirect_stdout(io.StringIO()):
        with nb02.Check(name, fn, seed=0, errors=_SWEEP_ERRORS.get(name, ()),
                        in_place=_SWEEP_IN_PLACE.get(name)) as c:
            case(c, *args)


_SWEEP_ERRORS = {"bpe_train": [nb02.NO_PAIR_LEFT], "bpe_decode": [nb02._EXPAND_HINT],
                 "bpe_encode": [nb02.RANK_WITHOUT_DEFAULT]}
_SWEEP_IN_PLACE = {"bpe_merge": nb02.MERGE_IN_PLACE, "bpe_encode": nb02.ENCODE_CHANGED_MERGES,
                   "pad_batch": nb02.PAD_IN_PLACE}


@pytest.mark.parametrize("name", list(_SWEEPS))
def test_sweep_the_answer_and_every_correct_formulation_agree_with_the_reference(name):
    from ..support.solutions import solution_namespace
    checker, _case, points = _SWEEPS[name]
    solution = solution_namespace("02_tokens_to_embeddings")[name]
    reference = _reference_of(name)
    for label, fn in {"the notebook's answer": solution, **CORRECT[checker]}.items():
        for args in points():
            want, _changed = _outcome(reference, args)
            got, changed = _outcome(fn, args)
            assert _same(got, want) and not changed, (label, args, got, want)
        _sweep_case(name, fn, points()[-1])  # and the check's comparison accepts it


@pytest.mark.parametrize("name", list(_SWEEPS))
def test_sweep_every_wrong_implementation_is_rejected_wherever_it_differs(name):
    checker, _case, points = _SWEEPS[name]
    reference = _reference_of(name)
    wants = [(args, _outcome(reference, args)[0]) for args in points()]
    for wrong in WRONG[checker]:
        differs = [args for args, want in wants
                   if not _same(*_pair(_outcome(wrong.fn, args), want))]
        assert differs, f"{wrong.name}: agrees with the reference at every point of the sweep"
        by_size = {_size(args): args for args in reversed(differs)}  # the first of each size
        for args in by_size.values():
            with pytest.raises(CheckFailure) as info:
                _sweep_case(name, wrong.fn, args)
            assert not isinstance(info.value, NotStarted), (wrong.name, args)


def _size(args) -> tuple:
    """A sweep point's size: each argument's length (a text's, a list's, the merges') and its
    number of distinct symbols, or the number itself (num_merges, new_id)."""
    def size(a):
        if isinstance(a, int):
            return a
        items = [len(x) for x in a] if a and isinstance(a, list) and isinstance(a[0], list) \
            else []
        return (len(a), len(set(a)) if isinstance(a, (str, list)) and not items else 0, *items)
    return tuple(size(a) for a in args)


def _pair(outcome, want):
    got, changed = outcome
    return (("changed its input", got), want) if changed else (got, want)


@pytest.mark.parametrize("exercise", ["bpe_train", "bpe_encode"])
def test_a_broken_utf8_bytes_is_named_fix_it_first(exercise):
    """The earlier of two broken helpers is named: utf8_bytes (ord per character) before the
    broken bpe_merge."""
    cell = _LEARNER_CELL.replace('return list(text.encode("utf-8"))',
                                 'return [ord(ch) for ch in text]')
    ns = _learner_cell(cell)
    with pytest.raises(CheckFailure) as info:
        getattr(nb02, f"check_{exercise}")(ns[exercise], seed=0)
    assert info.value.mistake == f"02.{exercise}.fix_utf8_bytes_first"
