"""Chapter 02: byte-level BPE, padding and the embedding lookup.

An independent formulation of the notebook's exercises: pair counts from `collections.Counter`
with the first-occurrence tie-break found by a separate scan, encoding by applying the merges one
after another in training order, decoding through a table of each token's bytes, padding with
`pad_sequence`, and the lookup and one-hot encoding from `torch.nn.functional`.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

FIRST_MERGE_ID = 256  # ids 0..255 are the raw bytes


def utf8_bytes(text: str) -> list[int]:
    return list(bytes(text, "utf-8"))


def bpe_merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace non-overlapping occurrences of `pair`, scanning left to right."""
    out: list[int] = []
    skip = False
    for i, x in enumerate(ids):
        if skip:
            skip = False
            continue
        if i + 1 < len(ids) and (x, ids[i + 1]) == tuple(pair):
            out.append(new_id)
            skip = True
        else:
            out.append(x)
    return out


def _best_pair(ids: list[int]) -> tuple[int, int] | None:
    """The most frequent adjacent pair (overlapping positions counted); ties: first in `ids`."""
    counts = Counter(zip(ids, ids[1:]))
    if not counts:
        return None
    top = max(counts.values())
    return next(p for p in zip(ids, ids[1:]) if counts[p] == top)


def bpe_train(text: str, num_merges: int) -> dict[tuple[int, int], int]:
    """Learn up to `num_merges` merges; stops early when fewer than two tokens remain."""
    ids = utf8_bytes(text)
    merges: dict[tuple[int, int], int] = {}
    for new_id in range(FIRST_MERGE_ID, FIRST_MERGE_ID + num_merges):
        pair = _best_pair(ids)
        if pair is None:
            break
        merges[pair] = new_id
        ids = bpe_merge(ids, pair, new_id)
    return merges


def bpe_encode(text: str, merges: dict[tuple[int, int], int]) -> list[int]:
    """Apply each merge to the whole sequence, in training (insertion) order.

    A later merge never creates an earlier merge's pair (its new id is larger than every id the
    earlier pair holds), so one pass in training order gives the fully merged sequence.
    """
    ids = utf8_bytes(text)
    for pair, new_id in merges.items():
        ids = bpe_merge(ids, pair, new_id)
    return ids


def vocab_bytes(merges: dict[tuple[int, int], int]) -> dict[int, bytes]:
    """Every token id's bytes: the 256 single bytes, then each merge's two parts concatenated."""
    vocab = {i: bytes([i]) for i in range(FIRST_MERGE_ID)}
    for (a, b), new_id in merges.items():
        vocab[new_id] = vocab[a] + vocab[b]
    return vocab


def bpe_decode(ids: list[int], merges: dict[tuple[int, int], int]) -> str:
    """Join all tokens' bytes, then decode once; invalid UTF-8 becomes U+FFFD."""
    vocab = vocab_bytes(merges)
    return b"".join(vocab[int(i)] for i in ids).decode("utf-8", errors="replace")


def pad_batch(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right padding to the longest sequence; the mask is True at real tokens."""
    rows = [torch.as_tensor(list(s), dtype=torch.long) for s in sequences]
    token_ids = pad_sequence(rows, batch_first=True, padding_value=pad_id)
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.arange(token_ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return token_ids, mask


def embed(token_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.embedding(token_ids, table)


def one_hot(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return F.one_hot(token_ids, vocab_size).to(torch.float32)


def embedding_table_bytes(vocab_size: int, hidden_size: int, bytes_per_param: int) -> int:
    return math.prod((vocab_size, hidden_size, bytes_per_param))
