"""Chapter 02 checkers: correct implementations pass at every seed; known mistakes are diagnosed.

Inputs: random texts of words with shared pieces, runs of one letter, Chinese, accents and an emoji,
plus fixed cases (the article's sentence, a five-way tie, overlapping runs, invalid UTF-8); padding
with distinct B and S and a real token equal to pad_id; lookups with distinct B, S, H, |V| in 2..13,
fp16/bf16 tables, and the article's [1, 10] ids from |V| = 32000.
"""

import random

import pytest
import torch
import torch.nn.functional as F

from checks import nb02
from checks import reference as ref
from checks.context import LANG_ENV
from checks.engine import CheckFailure, ForbiddenCall

from ..support.catalogue import Wrong, exercises, failure_text, implementations

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
                                          train_with_most_common),
    nb02.check_bpe_encode: implementations(ref.bpe_encode, encode_lowest_rank),
    nb02.check_bpe_decode: implementations(ref.bpe_decode, decode_by_unmerging),
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
        Wrong("ord per character", lambda text: [ord(ch) for ch in text], "ord()"),
        Wrong("bytes object", lambda text: text.encode("utf-8"), "bytes object"),
        Wrong("UTF-16", lambda text: list(text.encode("utf-16-le")), "UTF-16"),
        Wrong("BOM", lambda text: list(text.encode("utf-8-sig")), "byte-order mark"),
        Wrong("characters", lambda text: list(text), "characters"),
        Wrong("tuple", lambda text: tuple(text.encode("utf-8")), "list of ints"),
    ],
    nb02.check_bpe_merge: [
        Wrong("overlapping", merge_overlapping, "overlapping"),
        Wrong("moves on by one", merge_step_one, "move on by 2"),
        Wrong("right to left", merge_right_to_left, "from the right"),
        Wrong("first occurrence only", merge_first_only, "every occurrence"),
        Wrong("drops the last id", merge_drops_last, "last id"),
        Wrong("edits the input", merge_in_place, "in place"),
        Wrong("tuple", lambda ids, pair, new_id: tuple(merge_while_loop(ids, pair, new_id)),
              "return a list"),
    ],
    nb02.check_bpe_train: [
        Wrong("ties to the smallest pair", _trainer(
            pick=lambda c: min(p for p in c if c[p] == max(c.values()))), "smallest pair"),
        Wrong("ties to the largest pair", _trainer(
            pick=lambda c: max(c.items(), key=lambda kv: (kv[1], kv[0]))[0]), "largest pair"),
        Wrong("ties to the last pair", _trainer(pick=lambda c: sorted(c, key=c.get)[-1]),
              "occurs last"),
        Wrong("ids from 255", _trainer(start=255), "start at 256"),
        Wrong("ids from 0", _trainer(start=0), "start at 256"),
        Wrong("sequence never updated", _trainer(update=False), "before counting again"),
        Wrong("non-overlapping counts", _trainer(count=_count_non_overlapping),
              "overlapping ones included"),
        Wrong("overlapping merge", _trainer(merge=merge_overlapping), "overlapping occurrences"),
        Wrong("right-to-left merge", _trainer(merge=merge_right_to_left), "from the right"),
        Wrong("ord code points", _trainer(codes=lambda t: [ord(ch) for ch in t]), "UTF-8 bytes"),
        Wrong("stops at count 1", _trainer(min_count=2), "occurs only once"),
        Wrong("crashes without pairs", _train_crashes_without_pairs, "no pair left"),
        Wrong("sorted dict", _trainer(order=lambda m: dict(sorted(m.items()))), "merge order"),
        Wrong("id -> pair", _trainer(order=lambda m: {v: k for k, v in m.items()}),
              "not new id -> pair"),
    ],
    nb02.check_bpe_encode: [
        Wrong("reverse order", encode_reverse_order, "reverse order"),
        Wrong("most frequent first", encode_most_frequent_first, "how often"),
        Wrong("leftmost first", encode_leftmost_first, "leftmost"),
        Wrong("ord code points", encode_with_ord, "UTF-8 bytes"),
        Wrong("first occurrences", encode_first_occurrences, "every occurrence"),
        Wrong("merges ignored", lambda text, merges: list(text.encode("utf-8")),
              "without applying the merges"),
    ],
    nb02.check_bpe_decode: [
        Wrong("each token, replace", decode_each_token, "each token separately"),
        Wrong("each token, strict", lambda ids, m: decode_each_token(ids, m, "strict"),
              "each token separately"),
        Wrong("errors='ignore'", lambda ids, m: b"".join(_vocab(m)[i] for i in ids).decode(
            "utf-8", errors="ignore"), "errors='replace'"),
        Wrong("strict", lambda ids, m: b"".join(_vocab(m)[i] for i in ids).decode("utf-8"),
              "errors='replace'"),
        Wrong("Latin-1", lambda ids, m: b"".join(_vocab(m)[i] for i in ids).decode("latin-1"),
              "as UTF-8"),
        Wrong("merges ignored", lambda ids, m: bytes(ids).decode("utf-8", errors="replace"),
              "through the merges"),
        Wrong("one level of unmerging", decode_one_level, "recursively"),
    ],
    nb02.check_pad_batch: [
        Wrong("left padding", _pad(left=True), "pads on the right"),
        Wrong("mask inverted", _pad(mask_fn=lambda m, ids, p: ~m), "true at padding"),
        Wrong("mask as 0/1 ints", _pad(mask_fn=lambda m, ids, p: m.long()), "torch.bool"),
        Wrong("mask from pad_id", _pad(mask_fn=lambda m, ids, p: ids != p), "lengths"),
        Wrong("int32 ids", _pad(ids_dtype=torch.int32), "torch.long"),
        Wrong("pads with 0", _pad(fill=0), "instead of pad_id"),
        Wrong("extends the input lists", pad_extends_inputs, "in place"),
        Wrong("lists, not tensors", lambda seqs, pad_id: tuple(
            x.tolist() for x in pad_with_loop(seqs, pad_id)), "torch.tensor"),
    ],
    nb02.check_embed: [
        Wrong("columns", lambda ids, table: table[:, ids], "columns"),
        Wrong("transposed table", lambda ids, table: table.T[ids], "transposed table"),
        Wrong("batch dropped", lambda ids, table: table[ids[0]], "batch axis"),
        Wrong("B and S swapped", lambda ids, table: table[ids.T], "swapped b and s"),
        Wrong("flattened", lambda ids, table: table[ids.flatten()], "flattened"),
        Wrong("cast to float32", lambda ids, table: table[ids].float(), "table's dtype"),
        Wrong("bag of words", lambda ids, table: table[ids].sum(1), "summed over the sequence"),
    ],
    nb02.check_one_hot: [
        Wrong("int64", lambda ids, v: (ids[..., None] == torch.arange(v)).long(), "float32"),
        Wrong("bool", lambda ids, v: ids[..., None] == torch.arange(v), "float32"),
        Wrong("float64", lambda ids, v: (ids[..., None] == torch.arange(v)).double(),
              "float32"),
        Wrong("axis 1", one_hot_axis_1, "last axis"),
        Wrong("size from ids.max()", one_hot_from_max, "max() + 1"),
    ],
    nb02.check_embedding_table_bytes: [
        Wrong("parameters, not bytes", lambda v, h, b: v * h, "forgot bytes_per_param"),
        Wrong("float", lambda v, h, b: v * h * b / 1, "float"),
        Wrong("bits", lambda v, h, b: v * h * b * 8, "bits"),
        Wrong("MiB", lambda v, h, b: v * h * b / 1024 / 1024, "MiB"),
        Wrong("divides", lambda v, h, b: v * h // b, "divided by bytes_per_param"),
        Wrong("sum of sizes", lambda v, h, b: (v + h) * b, "|V| * H entries"),
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


def _learner_cell(source: str) -> dict:
    """Run `source` as a notebook cell would: its functions module-level in a namespace of their
    own, their code in no file of the package."""
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<learner cell>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("exercise", ["bpe_train", "bpe_encode"])
def test_a_broken_bpe_merge_is_named_fix_it_first(exercise):
    ns = _learner_cell(_LEARNER_CELL)
    text = failure_text(getattr(nb02, f"check_{exercise}"), ns[exercise])
    assert "your bpe_merge does not pass its own check (merged only the first occurrence" \
        in text
    assert f"{exercise} is built on it, so fix bpe_merge first" in text


def test_a_broken_bpe_merge_that_is_not_called_is_not_blamed():
    cell = _LEARNER_CELL.replace("ids = bpe_merge(ids, pair, new_id)", "ids = ids[::-1]")
    ns = _learner_cell(cell)
    with pytest.raises(CheckFailure) as info:
        nb02.check_bpe_encode(ns["bpe_encode"], seed=0)
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
