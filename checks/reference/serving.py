"""Chapter 15: serving many requests at once (batched prefill, paged KV blocks, continuous
batching).

Formulated differently from the notebook, which assembles the padded forward pass from the
earlier chapters' functions and walks block tables token by token: here the padded prefill is
chapter 13's fused layer (`generation._rotate`, PyTorch's attention) with one boolean mask
[B, 1, T, T] built from the keep mask by broadcasting; a paged cache addresses its pool through a
flat slot index (block * block_size + offset) computed for all tokens at once; paged attention
gathers every sequence's blocks in one indexing call ([B, n_blocks, N_kv, bs, D_h]) and masks the
unused tail of each last block; the allocator keeps its free blocks in a set and counts before it
takes; the scheduler is a loop over steps with explicit lists for waiting, running and finished.

Conventions (docs/conventions.md): pools are [num_blocks, N_kv, block_size, D_h] per layer (chapter
13's cache cut into blocks along S), K stored after RoPE, N_kv heads only; boolean masks True =
may attend; a fully masked query row gives zeros.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .generation import _rms_norm, _rope_rotors, _rotate


# --------------------------------------------------------------------------------------------
# Exercise 1: left padding


def pad_left(prompts: Sequence[Sequence[int]], pad_id: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token_ids [B, T] long, keep [B, T] bool, positions [B, T] long) for prompts of different
    lengths, T the longest: each row's tokens at its right end, `pad_id` before them; keep True
    on real tokens; a real token's position counts from 0 at the row's first real token, a pad's
    position is 0."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("pad_left needs at least one prompt, none of them empty")
    t = max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    column = torch.arange(t)[None, :]
    keep = column >= (t - lengths)[:, None]
    ids = torch.full((len(prompts), t), pad_id, dtype=torch.long)
    ids[keep] = torch.tensor([tok for p in prompts for tok in p], dtype=torch.long)
    positions = (column - (t - lengths)[:, None]).clamp(min=0)
    return ids, keep, positions


# --------------------------------------------------------------------------------------------
# Exercise 2: the padded forward pass


def batched_prefill(token_ids: torch.Tensor, keep: torch.Tensor, positions: torch.Tensor,
                    params: dict, cfg) -> tuple[torch.Tensor, list]:
    """(logits [B, T, V], [(k, v) per layer]) with k, v [B, N_kv, T, D_h] (K after RoPE): every
    real token attends to the real tokens of its own row at or before it, at its own position.
    Pad positions' outputs are whatever they are (the caller ignores them)."""
    b, t = token_ids.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    keep = keep.bool()
    causal = torch.ones(t, t, dtype=torch.bool, device=keep.device).tril()
    mask = causal[None, None] & keep[:, None, None, :]               # [B, 1, T, T]
    rotors = _rope_rotors(positions.reshape(-1), cfg).reshape(b, 1, t, -1)
    x = F.embedding(token_ids, params["embed"])
    kvs = []
    for layer in params["layers"]:
        h = _rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        heads = (h @ layer["wqkv"]).unflatten(-1, (n_h + 2 * n_kv, d)).transpose(1, 2)
        qk = _rotate(heads[:, :n_h + n_kv], rotors)
        q, k, v = qk[:, :n_h], qk[:, n_h:], heads[:, n_h + n_kv:]
        kvs.append((k, v))
        full = mask.expand(b, n_h, t, t)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=n_kv != n_h)
        out = out.masked_fill(~full.any(-1, keepdim=True), 0.0)      # pad queries: zeros
        x = x + out.transpose(1, 2).reshape(b, t, n_h * d) @ layer["wo"]
        h = _rms_norm(x, layer["ffn_norm"], cfg.norm_eps)
        x = x + (F.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]
    return _rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"], kvs


# --------------------------------------------------------------------------------------------
# Exercise 3: the block allocator


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks that hold n_tokens: ceil(n / block_size)."""
    return -(-n_tokens // block_size)


class BlockAllocator:
    """Fixed-size KV blocks from one pool of `num_blocks`, `block_size` token slots each.

    allocate(seq_id, n_tokens) -> block table (list of block ids) for a new sequence;
    append_token(seq_id) -> its table after growing by one token (a new block when the last is
    full); free(seq_id) returns its blocks; block_table(seq_id), length(seq_id), num_free.
    Running out raises MemoryError and changes nothing; an unknown sequence raises KeyError; a
    sequence allocated twice raises ValueError.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = set(range(num_blocks))
        self._tables: dict = {}
        self._lengths: dict = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def _take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"out of KV blocks: {n} needed, {len(self._free)} free of "
                              f"{self.num_blocks}")
        taken = sorted(self._free)[:n]
        self._free.difference_update(taken)
        return taken

    def allocate(self, seq_id, n_tokens: int) -> list[int]:
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        if n_tokens < 1:
            raise ValueError("a sequence starts with at least one token")
        self._tables[seq_id] = self._take(blocks_for(n_tokens, self.block_size))
        self._lengths[seq_id] = n_tokens
        return list(self._tables[seq_id])

    def append_token(self, seq_id) -> list[int]:
        if seq_id not in self._tables:
            raise KeyError(seq_id)
        if self._lengths[seq_id] % self.block_size == 0:      # the last block is full
            self._tables[seq_id] += self._take(1)
        self._lengths[seq_id] += 1
        return list(self._tables[seq_id])

    def free(self, seq_id) -> None:
        if seq_id not in self._tables:
            raise KeyError(seq_id)
        self._free.update(self._tables.pop(seq_id))
        del self._lengths[seq_id]

    def block_table(self, seq_id) -> list[int]:
        return list(self._tables[seq_id])

    def length(self, seq_id) -> int:
        return self._lengths[seq_id]


# --------------------------------------------------------------------------------------------
# Exercise 4: the paged KV cache


class PagedKVCache:
    """Per layer one pool of K blocks and one of V blocks, k[l] and v[l], each
    [num_blocks, N_kv, block_size, D_h]. A sequence's position p lives in block
    block_table[p // block_size], slot p % block_size.

    write(layer, block_table, start_pos, k, v): k, v [N_kv, T, D_h] at positions start_pos ..
    start_pos+T-1; read(layer, block_table, length) -> (k, v) [N_kv, length, D_h], in order.
    """

    def __init__(self, cfg, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32,
                 device=None):
        self.block_size = block_size
        shape = (num_blocks, cfg.n_kv_heads, block_size, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]

    def _slots(self, block_table: Sequence[int], start: int, count: int) -> torch.Tensor:
        pos = torch.arange(start, start + count)
        if start < 0 or start + count > len(block_table) * self.block_size:
            raise ValueError(f"positions {start}..{start + count - 1} do not fit a block table "
                             f"of {len(block_table)} blocks of {self.block_size}")
        table = torch.as_tensor(list(block_table), dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _flat(self, pool: torch.Tensor) -> torch.Tensor:      # [num_blocks * bs, N_kv, D_h] view
        return pool.transpose(1, 2).reshape(-1, pool.shape[1], pool.shape[3])

    def write(self, layer: int, block_table: Sequence[int], start_pos: int, k: torch.Tensor,
              v: torch.Tensor) -> None:
        slots = self._slots(block_table, start_pos, k.shape[-2]).to(k.device)
        for pool, x in ((self.k[layer], k), (self.v[layer], v)):
            blocks, offsets = slots // self.block_size, slots % self.block_size
            pool[blocks, :, offsets] = x.transpose(0, 1).to(pool.dtype)

    def read(self, layer: int, block_table: Sequence[int], length: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        slots = self._slots(block_table, 0, length).to(self.k[layer].device)
        return tuple(self._flat(pool)[slots].transpose(0, 1)
                     for pool in (self.k[layer], self.v[layer]))


# --------------------------------------------------------------------------------------------
# Exercise 5: attention through block tables


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    block_tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> torch.Tensor:
    """[B, N_h, 1, D_h]: each sequence's one new query (q [B, N_h, 1, D_h]) attends to the
    `lengths[b]` positions its block table addresses in the pools [num_blocks, N_kv, bs, D_h]
    (grouped-query attention, scaled by 1/sqrt(D_h))."""
    b, n_h, _one, d = q.shape
    _n, n_kv, bs, _d = k_pool.shape
    widest = max(len(t) for t in block_tables)
    tables = torch.zeros(b, widest, dtype=torch.long)
    for i, t in enumerate(block_tables):
        tables[i, :len(t)] = torch.as_tensor(list(t), dtype=torch.long)
    tables = tables.to(k_pool.device)

    def gather(pool):           # [B, widest, N_kv, bs, D] -> [B, N_kv, widest * bs, D]
        return pool[tables].permute(0, 2, 1, 3, 4).reshape(b, n_kv, widest * bs, d)

    lengths = torch.as_tensor(list(lengths), device=q.device)
    mask = (torch.arange(widest * bs, device=q.device)[None, :] < lengths[:, None])
    mask = mask[:, None, None, :].expand(b, n_h, 1, widest * bs)
    return F.scaled_dot_product_attention(q, gather(k_pool), gather(v_pool), attn_mask=mask,
                                          enable_gqa=n_kv != n_h)


# --------------------------------------------------------------------------------------------
# Exercise 6: the continuous-batching scheduler


def serve(requests: Sequence[tuple[Sequence[int], int]], prefill: Callable, decode: Callable,
          allocator, *, max_batch: int = 8, stop_id: int | None = None,
          clock: Callable[[], float] = time.perf_counter) -> tuple[list[dict], list[dict]]:
    """Serve `requests` [(prompt ids, max_new_tokens), ...], all arriving at the start, with
    continuous batching. Request i is sequence i.

    Each step: (1) admit waiting requests first come, first served, while fewer than
    `max_batch` run and the free blocks cover the head of the queue's whole need
    (blocks_for(len(prompt) + max_new_tokens - 1)) beyond what the running requests may still
    claim; allocate their prompts and prefill them together, `prefill(ids, prompts)` -> first
    token of each; (2) for every running request that still needs tokens, grow its cache by one
    token (`allocator.append_token`) and decode them all together, `decode(ids, last_tokens)`
    -> one token each; (3) retire the finished (max_new_tokens reached, or stop_id produced),
    freeing their blocks.

    Returns (results, timeline): results[i] = {"tokens": [...], "ttft": seconds from the start
    to the first token, "tpot": seconds per token after the first (0.0 for a single token)};
    timeline[s] = {"prefill": [ids], "decode": [ids]} for step s.
    """
    bs = allocator.block_size
    start = clock()
    waiting = list(range(len(requests)))
    running: list[int] = []
    tokens = {i: [] for i in waiting}
    first_at, last_at = {}, {}
    timeline = []

    def need(i):
        prompt, n = requests[i]
        return blocks_for(len(prompt) + n - 1, bs)

    def finished(i):
        n = requests[i][1]
        return len(tokens[i]) >= n or (stop_id is not None and tokens[i][-1] == stop_id)

    while waiting or running:
        promised = sum(need(i) - len(allocator.block_table(i)) for i in running)
        admitted = []
        while waiting and len(running) + len(admitted) < max_batch:
            head = waiting[0]
            if need(head) > allocator.num_free - promised:
                break
            allocator.allocate(head, len(requests[head][0]))
            promised += need(head) - len(allocator.block_table(head))
            admitted.append(waiting.pop(0))
        step = {"prefill": admitted, "decode": []}
        if admitted:
            firsts = prefill(admitted, [list(requests[i][0]) for i in admitted])
            now = clock()
            for i, tok in zip(admitted, firsts):
                tokens[i].append(int(tok))
                first_at[i] = last_at[i] = now
        old = [i for i in running if not finished(i)]
        if old:
            for i in old:
                allocator.append_token(i)
            news = decode(old, [tokens[i][-1] for i in old])
            now = clock()
            for i, tok in zip(old, news):
                tokens[i].append(int(tok))
                last_at[i] = now
        step["decode"] = old
        timeline.append(step)
        running += admitted
        for i in [i for i in running if finished(i)]:
            running.remove(i)
            allocator.free(i)
        if not admitted and not old and not running and waiting:
            raise MemoryError(f"request {waiting[0]} needs {need(waiting[0])} blocks; the pool "
                              f"has {allocator.num_blocks}")
    results = [{"tokens": tokens[i], "ttft": first_at[i] - start,
                "tpot": (last_at[i] - first_at[i]) / max(len(tokens[i]) - 1, 1)}
               for i in range(len(requests))]
    return results, timeline


# --------------------------------------------------------------------------------------------
# A model served through the paged cache (the benchmark's and the GPU check's engine)


class ServingEngine:
    """`prefill(ids, prompts)` and `decode(ids, last_tokens)` for `serve`, on the course's
    parameter layout, greedy: one padded prefill per admission, one decode step per call for the
    whole batch, K and V in a `PagedKVCache` addressed by the engine's `BlockAllocator`.
    `blocks_in_use` records the pool after every decode step."""

    def __init__(self, params: dict, cfg, num_blocks: int, block_size: int = 16):
        self.params, self.cfg = params, cfg
        self.device = params["embed"].device
        self.cache = PagedKVCache(cfg, num_blocks, block_size, dtype=params["embed"].dtype,
                                  device=self.device)
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.blocks_in_use: list[int] = []

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> list[int]:
        token_ids, keep, positions = (t.to(self.device) for t in pad_left(prompts, 0))
        logits, kvs = batched_prefill(token_ids, keep, positions, self.params, self.cfg)
        for row, i in enumerate(ids):
            n, table = len(prompts[row]), self.allocator.block_table(i)
            for layer, (k, v) in enumerate(kvs):
                self.cache.write(layer, table, 0, k[row, :, -n:], v[row, :, -n:])
        return logits[:, -1].argmax(-1).tolist()

    @torch.inference_mode()
    def decode(self, ids: Sequence[int], last_tokens: Sequence[int]) -> list[int]:
        cfg, params, bs = self.cfg, self.params, self.cache.block_size
        n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        tables = [self.allocator.block_table(i) for i in ids]
        lengths = [self.allocator.length(i) for i in ids]
        last = torch.tensor([t[(n - 1) // bs] for t, n in zip(tables, lengths)],
                            device=self.device)
        slots = torch.tensor([(n - 1) % bs for n in lengths], device=self.device)
        rotors = _rope_rotors(torch.tensor(lengths, device=self.device) - 1, cfg)[:, None, None]
        b = len(ids)
        x = F.embedding(torch.tensor(list(last_tokens), device=self.device)[:, None],
                        params["embed"])
        for i, layer in enumerate(params["layers"]):
            h = _rms_norm(x, layer["attn_norm"], cfg.norm_eps)
            heads = (h @ layer["wqkv"]).unflatten(-1, (n_h + 2 * n_kv, d)).transpose(1, 2)
            qk = _rotate(heads[:, :n_h + n_kv], rotors)
            q, k, v = qk[:, :n_h], qk[:, n_h:], heads[:, n_h + n_kv:]
            self.cache.k[i][last, :, slots] = k[:, :, 0]       # every sequence's new slot
            self.cache.v[i][last, :, slots] = v[:, :, 0]
            out = paged_attention(q, self.cache.k[i], self.cache.v[i], tables, lengths)
            x = x + out.transpose(1, 2).reshape(b, 1, n_h * d) @ layer["wo"]
            h = _rms_norm(x, layer["ffn_norm"], cfg.norm_eps)
            x = x + (F.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]
        self.blocks_in_use.append(self.allocator.num_blocks - self.allocator.num_free)
        logits = _rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"]
        return logits[:, -1].argmax(-1).tolist()


CHATS = ("What is the capital of France?", "Name three primary colors.",
         "Write a haiku about the sea.", "What is 7 times 8?", "Who wrote Romeo and Juliet?",
         "What does a bee make?", "Give me a synonym for happy.",
         "How many legs does a spider have?")


def serve_chats(params: dict, cfg, prompts: Sequence[Sequence[int]], limits: Sequence[int], *,
                stop_id: int | None, max_batch: int, num_blocks: int = 64,
                block_size: int = 16, sync: Callable[[], None] | None = None) -> dict:
    """One served run: results, timeline, seconds, tokens per second, the engine."""
    engine = ServingEngine(params, cfg, num_blocks, block_size)

    def clock() -> float:
        if sync is not None:
            sync()
        return time.perf_counter()

    start = clock()
    results, timeline = serve([(list(p), n) for p, n in zip(prompts, limits)], engine.prefill,
                              engine.decode, engine.allocator, max_batch=max_batch,
                              stop_id=stop_id, clock=clock)
    seconds = clock() - start
    tokens = sum(len(r["tokens"]) for r in results)
    return {"results": results, "timeline": timeline, "seconds": seconds,
            "tokens": tokens, "tokens_per_s": tokens / seconds, "engine": engine,
            "ttft": sum(r["ttft"] for r in results) / len(results),
            "tpot": sum(r["tpot"] for r in results) / len(results)}
