"""Chapter 15 checkers: the reference and the notebook's way pass at every seed; each known mistake
is diagnosed by its id.

The reference (`checks.reference.serving`) is also held to its invariants here: each row of a
left-padded batch equals its prompt run alone, a paged cache reads back what was written through
out-of-order tables, paged attention equals chapter 06's attention over contiguous keys, and the
scheduler serves every request with the tokens it would get alone.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from checks import ModelConfig, nb15
from checks import reference as ref
from checks.reference import generation as gen
from checks.reference import serving as srv
from checks.reference.attention import grouped_query_attention, merge_heads, split_qkv
from checks.reference.masks import causal_mask, combine_masks, padding_mask
from checks.reference.ffn import swiglu_ffn
from checks.reference.norms import rms_norm
from checks.reference.rope import apply_rope
from checks.reference.tokens import embed

from ..support.catalogue import Wrong, exercises


def _copy(fn):
    """The reference under a new code object: the checks refuse a call of the course's own."""
    out = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


def _copy_class(cls, name):
    body = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    return type(name, (), body)


# ------------------------------------------------------------------------------------------------
# The notebook's way (as a learner writes it, from the earlier chapters' pieces)


def pad_left(prompts, pad_id):
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    keep = torch.zeros(len(prompts), longest, dtype=torch.bool)
    for row, p in enumerate(prompts):
        ids[row, longest - len(p):] = torch.tensor(p, dtype=torch.long)
        keep[row, longest - len(p):] = True
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    return ids, keep, positions


def _prefill_with(token_ids, keep, positions, params, cfg, *, pads=True, offset=True,
                  causal=True, rotate_kv=True, repeat=False):
    b, t = token_ids.shape
    mask = causal_mask(t) if causal else torch.ones(t, t, dtype=torch.bool)
    if pads:
        mask = combine_masks(mask, padding_mask(keep))
    pos = positions if offset else torch.arange(t)
    rope = dict(base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    x = embed(token_ids, params["embed"])
    kvs = []
    for layer in params["layers"]:
        h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        q, k_raw, v = split_qkv(h @ layer["wqkv"], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
        q, k = apply_rope(q, pos, **rope), apply_rope(k_raw, pos, **rope)
        g = cfg.n_heads // cfg.n_kv_heads
        kept = k if rotate_kv else k_raw
        kvs.append((kept.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) if repeat
                   else (kept, v))
        x = x + merge_heads(grouped_query_attention(q, k, v, mask)) @ layer["wo"]
        h = rms_norm(x, layer["ffn_norm"], cfg.norm_eps)
        x = x + swiglu_ffn(h, layer["w_gate"], layer["w_up"], layer["w_down"])
    return rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"], kvs


def batched_prefill(token_ids, keep, positions, params, cfg):
    return _prefill_with(token_ids, keep, positions, params, cfg)


class BlockAllocator:
    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks = list(range(num_blocks))
        self.tables, self.lengths = {}, {}

    @property
    def num_free(self):
        return len(self.free_blocks)

    def _blocks_for(self, n):
        return (n + self.block_size - 1) // self.block_size

    def _take(self, n):
        if n > len(self.free_blocks):
            raise MemoryError(f"{n} blocks needed, {len(self.free_blocks)} free")
        taken, self.free_blocks = self.free_blocks[:n], self.free_blocks[n:]
        return taken

    def allocate(self, seq_id, n_tokens):
        if seq_id in self.tables:
            raise ValueError(f"{seq_id} already holds blocks")
        self.tables[seq_id] = self._take(self._blocks_for(n_tokens))
        self.lengths[seq_id] = n_tokens
        return list(self.tables[seq_id])

    def append_token(self, seq_id):
        if self.lengths[seq_id] % self.block_size == 0:
            self.tables[seq_id] = self.tables[seq_id] + self._take(1)
        self.lengths[seq_id] += 1
        return list(self.tables[seq_id])

    def free(self, seq_id):
        self.free_blocks += self.tables.pop(seq_id)
        del self.lengths[seq_id]

    def block_table(self, seq_id):
        return list(self.tables[seq_id])

    def length(self, seq_id):
        return self.lengths[seq_id]


class LifoAllocator(BlockAllocator):
    """Freed blocks are reused first (a stack): block ids come out in another order."""

    def _take(self, n):
        if n > len(self.free_blocks):
            raise MemoryError("out of blocks")
        taken = [self.free_blocks.pop() for _ in range(n)]
        return taken


class PagedKVCache:
    def __init__(self, cfg, num_blocks, block_size, dtype=torch.float32, device=None):
        self.block_size = block_size
        shape = (num_blocks, cfg.n_kv_heads, block_size, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]

    def where(self, block_table, pos):
        return block_table[pos // self.block_size], pos % self.block_size

    def write(self, layer, block_table, start_pos, k, v):
        for i in range(k.shape[1]):
            block, slot = self.where(block_table, start_pos + i)
            self.k[layer][block, :, slot] = k[:, i]
            self.v[layer][block, :, slot] = v[:, i]

    def read(self, layer, block_table, length):
        k = torch.cat([self.k[layer][b] for b in block_table], dim=1)
        v = torch.cat([self.v[layer][b] for b in block_table], dim=1)
        return k[:, :length], v[:, :length]


def _attend(q, k_pool, v_pool, block_tables, lengths, *, order=list, past=False, scale=True,
            tiled=False, first=False):
    outs = []
    for b in range(q.shape[0]):
        table = order(block_tables[0 if first else b])
        n = len(table) * k_pool.shape[2] if past else lengths[0 if first else b]
        k = torch.cat([k_pool[i] for i in table], dim=1)[:, :n]
        v = torch.cat([v_pool[i] for i in table], dim=1)[:, :n]
        g = q.shape[1] // k.shape[0]
        if tiled:
            k, v = k.repeat(g, 1, 1), v.repeat(g, 1, 1)
        else:
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        scores = q[b] @ k.transpose(-1, -2)
        if scale:
            scores = scores / math.sqrt(q.shape[-1])
        outs.append(torch.softmax(scores, -1) @ v)
    return torch.stack(outs)


def paged_attention(q, k_pool, v_pool, block_tables, lengths):
    outs = []
    for b, (table, n) in enumerate(zip(block_tables, lengths)):
        k = torch.cat([k_pool[i] for i in table], dim=1)[:, :n]
        v = torch.cat([v_pool[i] for i in table], dim=1)[:, :n]
        outs.append(grouped_query_attention(q[b:b + 1], k[None], v[None])[0])
    return torch.stack(outs)


def _serve_with(requests, prefill, decode, allocator, *, max_batch=8, stop_id=None,
                clock=None, static=False, over=0, one_by_one=False, lifo=False,
                decode_new=False, stop=True, never_free=False, no_append=False,
                ttft_admit=False, tpot_all=False, reserve=True, extra=0,
                admit_once=False, spin=False):
    import time
    clock = clock or time.perf_counter
    bs = allocator.block_size
    start = clock()
    waiting = list(range(len(requests)))
    running, results, timeline = [], [dict(tokens=[]) for _ in requests], []
    admitted_at = {}

    def need(i):
        return -(-(len(requests[i][0]) + requests[i][1] - 1) // bs)

    def done(i):
        toks = results[i]["tokens"]
        return len(toks) >= requests[i][1] + extra or (stop and stop_id is not None and
                                               toks[-1] == stop_id)

    while waiting or running:
        step_start = clock()
        promised = sum(need(i) - len(allocator.block_table(i)) for i in running) \
            if reserve else 0
        new = []
        queue = waiting[::-1] if lifo else list(waiting)
        while queue and len(running) + len(new) < max_batch + over and \
                not (static and running) and not (admit_once and timeline):
            i = queue[0]
            want = need(i) if reserve else -(-len(requests[i][0]) // bs)
            if want > allocator.num_free - promised:
                if spin:             # waits for blocks inside the step: nothing frees them
                    continue
                break
            queue.pop(0)
            allocator.allocate(i, len(requests[i][0]))
            if reserve:
                promised += need(i) - len(allocator.block_table(i))
            new.append(i)
            waiting.remove(i)
            admitted_at[i] = step_start
        if new:
            for i, tok in zip(new, prefill(new, [list(requests[i][0]) for i in new])):
                results[i]["tokens"].append(int(tok))
                results[i]["first"] = results[i]["last"] = clock()
        old = [i for i in running + (new if decode_new else []) if not done(i)]
        for group in ([[i] for i in old] if one_by_one else [old] if old else []):
            if not no_append:
                for i in group:
                    allocator.append_token(i)
            for i, tok in zip(group, decode(group, [results[i]["tokens"][-1] for i in group])):
                results[i]["tokens"].append(int(tok))
                results[i]["last"] = clock()
        timeline.append({"prefill": new, "decode": old})
        running += new
        for i in [i for i in running if done(i)]:
            running.remove(i)
            if not never_free:
                allocator.free(i)
        if admit_once and not running:
            break
    for i, r in enumerate(results):
        n = len(r["tokens"])
        first, last = r.pop("first", start), r.pop("last", start)
        r["ttft"] = first - (admitted_at.get(i, start) if ttft_admit else start)
        r["tpot"] = (last - first) / (n if tpot_all else max(n - 1, 1))
    return results, timeline


def serve(requests, prefill, decode, allocator, *, max_batch=8, stop_id=None, clock=None):
    return _serve_with(requests, prefill, decode, allocator, max_batch=max_batch,
                       stop_id=stop_id, clock=clock)


# ------------------------------------------------------------------------------------------------
# Wrong implementations


def _wrong_serve(**mistake):
    def fn(requests, prefill, decode, allocator, *, max_batch=8, stop_id=None, clock=None):
        return _serve_with(requests, prefill, decode, allocator, max_batch=max_batch,
                           stop_id=stop_id, clock=clock, **mistake)
    return fn


def _right_padded(prompts, pad_id):
    longest = max(len(p) for p in prompts)
    ids = torch.tensor([list(p) + [pad_id] * (longest - len(p)) for p in prompts])
    keep = ids.new_tensor([[1] * len(p) + [0] * (longest - len(p)) for p in prompts]).bool()
    return ids, keep, (keep.long().cumsum(-1) - 1).clamp(min=0)


def _not_offset(prompts, pad_id):
    ids, keep, _pos = pad_left(prompts, pad_id)
    return ids, keep, torch.arange(ids.shape[1]).expand(ids.shape).clone()


def _from_one(prompts, pad_id):
    ids, keep, _pos = pad_left(prompts, pad_id)
    return ids, keep, keep.long().cumsum(-1)


def _inverted(prompts, pad_id):
    ids, keep, pos = pad_left(prompts, pad_id)
    return ids, ~keep, pos


def _zero_pads(prompts, pad_id):
    return pad_left(prompts, 0)


def _prefill_wrong(**mistake):
    def fn(token_ids, keep, positions, params, cfg):
        return _prefill_with(token_ids, keep, positions, params, cfg, **mistake)
    return fn


class TooMany(BlockAllocator):
    def _blocks_for(self, n):
        return n // self.block_size + 1


class TooFew(BlockAllocator):
    def _blocks_for(self, n):
        return max(n // self.block_size, 1)


class GrowsEarly(BlockAllocator):
    def append_token(self, seq_id):
        if (self.lengths[seq_id] + 1) % self.block_size == 0:
            self.tables[seq_id] = self.tables[seq_id] + self._take(1)
        self.lengths[seq_id] += 1
        return list(self.tables[seq_id])


class NeverGrows(BlockAllocator):
    def append_token(self, seq_id):
        self.lengths[seq_id] += 1
        return list(self.tables[seq_id])


class NotAtomic(BlockAllocator):
    def _take(self, n):
        taken = []
        for _ in range(n):
            if not self.free_blocks:
                raise MemoryError("out of blocks")
            taken.append(self.free_blocks.pop(0))
        return taken


class NotAtomicAppend(BlockAllocator):
    def append_token(self, seq_id):
        self.lengths[seq_id] += 1
        if (self.lengths[seq_id] - 1) % self.block_size == 0:
            self.tables[seq_id] = self.tables[seq_id] + self._take(1)
        return list(self.tables[seq_id])


class NoErrorWhenFull(BlockAllocator):
    def _take(self, n):
        taken, self.free_blocks = self.free_blocks[:n], self.free_blocks[n:]
        return taken


class RuntimeErrorWhenFull(BlockAllocator):
    def _take(self, n):
        if n > len(self.free_blocks):
            raise RuntimeError("out of blocks")
        return super()._take(n)


class FreeTwice(BlockAllocator):
    def free(self, seq_id):
        self.free_blocks += self.tables.get(seq_id, [])
        self.lengths.pop(seq_id, None)


class FreeLoses(BlockAllocator):
    def free(self, seq_id):
        self.tables.pop(seq_id)
        del self.lengths[seq_id]


class GivesTwice(BlockAllocator):
    def _take(self, n):
        if n > len(self.free_blocks):
            raise MemoryError("out of blocks")
        return self.free_blocks[:n]            # never removed from the free list

    @property
    def num_free(self):
        return self.num_blocks - sum(len(t) for t in self.tables.values())


class PoolLayout(PagedKVCache):
    def __init__(self, cfg, num_blocks, block_size, dtype=torch.float32, device=None):
        self.block_size = block_size
        shape = (num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape) for _ in range(cfg.n_layers)]

    def write(self, layer, block_table, start_pos, k, v):
        for i in range(k.shape[1]):
            block, slot = self.where(block_table, start_pos + i)
            self.k[layer][block, slot] = k[:, i]
            self.v[layer][block, slot] = v[:, i]


class SharedPools(PagedKVCache):
    def __init__(self, cfg, num_blocks, block_size, dtype=torch.float32, device=None):
        super().__init__(cfg, num_blocks, block_size)
        self.k = [self.k[0]] * cfg.n_layers
        self.v = [self.v[0]] * cfg.n_layers


class TableIgnored(PagedKVCache):
    def where(self, block_table, pos):
        return pos // self.block_size, pos % self.block_size


class ChunkNotSplit(PagedKVCache):
    def write(self, layer, block_table, start_pos, k, v):
        first = block_table[start_pos // self.block_size] * self.block_size + \
            start_pos % self.block_size
        for i in range(k.shape[1]):
            block, slot = divmod(first + i, self.block_size)
            self.k[layer][block, :, slot] = k[:, i]
            self.v[layer][block, :, slot] = v[:, i]


class ReadPoolOrder(PagedKVCache):
    def read(self, layer, block_table, length):
        return super().read(layer, sorted(block_table), length)


class ReadWholeBlocks(PagedKVCache):
    def read(self, layer, block_table, length):
        return super().read(layer, block_table, len(block_table) * self.block_size)


def _attention_wrong(**mistake):
    def fn(q, k_pool, v_pool, block_tables, lengths):
        return _attend(q, k_pool, v_pool, block_tables, lengths, **mistake)
    return fn


def _calls_reference_attention(q, k_pool, v_pool, block_tables, lengths):
    return ref.paged_attention(q, k_pool, v_pool, block_tables, lengths)


def _calls_reference_pad(prompts, pad_id):
    return srv.pad_left(prompts, pad_id)


def _calls_reference_prefill(token_ids, keep, positions, params, cfg):
    return srv.batched_prefill(token_ids, keep, positions, params, cfg)


def _calls_reference_serve(requests, prefill, decode, allocator, *, max_batch=8, stop_id=None,
                           clock=None):
    return srv.serve(requests, prefill, decode, allocator, max_batch=max_batch, stop_id=stop_id,
                     clock=clock)


WRONG = {
    nb15.check_pad_left: [
        Wrong("right padding", _right_padded, "15.pad_left.padded_on_the_right"),
        Wrong("positions = column", _not_offset, "15.pad_left.positions_not_offset"),
        Wrong("positions from 1", _from_one, "15.pad_left.positions_from_one"),
        Wrong("keep inverted", _inverted, "15.pad_left.keep_inverted"),
        Wrong("pads are 0", _zero_pads, "15.pad_left.pad_id_ignored"),
        Wrong("calls the reference", _calls_reference_pad, "15.pad_left.calls_course_reference"),
    ],
    nb15.check_batched_prefill: [
        Wrong("no padding mask", _prefill_wrong(pads=False), "15.batched_prefill.pads_attended"),
        Wrong("positions ignored", _prefill_wrong(offset=False),
              "15.batched_prefill.positions_ignored"),
        Wrong("no causal mask", _prefill_wrong(causal=False), "15.batched_prefill.no_causal_mask"),
        Wrong("K before RoPE", _prefill_wrong(rotate_kv=False),
              "15.batched_prefill.kv_before_rope"),
        Wrong("K, V repeated", _prefill_wrong(repeat=True),
              "15.batched_prefill.kv_heads_repeated"),
        Wrong("calls the reference", _calls_reference_prefill,
              "15.batched_prefill.calls_course_reference"),
    ],
    nb15.check_BlockAllocator: [
        Wrong("n // bs + 1 blocks", TooMany, "15.BlockAllocator.one_block_too_many"),
        Wrong("n // bs blocks", TooFew, "15.BlockAllocator.one_block_too_few"),
        Wrong("grows one token early", GrowsEarly, "15.BlockAllocator.new_block_one_token_early"),
        Wrong("never grows", NeverGrows, "15.BlockAllocator.never_grows"),
        Wrong("takes blocks one by one", NotAtomic, "15.BlockAllocator.not_atomic_on_failure"),
        Wrong("append counts before taking", NotAtomicAppend,
              "15.BlockAllocator.not_atomic_on_failure"),
        Wrong("no error when full", NoErrorWhenFull, "15.BlockAllocator.no_error_when_full"),
        Wrong("RuntimeError when full", RuntimeErrorWhenFull,
              "15.BlockAllocator.wrong_error_when_full"),
        Wrong("free twice accepted", FreeTwice, "15.BlockAllocator.free_twice_accepted"),
        Wrong("free loses blocks", FreeLoses, "15.BlockAllocator.free_loses_blocks"),
        Wrong("blocks never leave the free list", GivesTwice,
              "15.BlockAllocator.block_given_twice"),
    ],
    nb15.check_PagedKVCache: [
        Wrong("[blocks, bs, N_kv, D_h] pools", PoolLayout, "15.PagedKVCache.pool_layout"),
        Wrong("one pool for all layers", SharedPools, "15.PagedKVCache.one_pool_for_all_layers"),
        Wrong("block table ignored", TableIgnored, "15.PagedKVCache.block_table_ignored"),
        Wrong("chunk runs on in the pool", ChunkNotSplit,
              "15.PagedKVCache.chunk_not_split_at_block_boundary"),
        Wrong("read in pool order", ReadPoolOrder, "15.PagedKVCache.read_in_pool_order"),
        Wrong("read whole blocks", ReadWholeBlocks, "15.PagedKVCache.read_ignores_length"),
    ],
    nb15.check_paged_attention: [
        Wrong("pool order", _attention_wrong(order=sorted),
              "15.paged_attention.blocks_in_pool_order"),
        Wrong("whole last block", _attention_wrong(past=True),
              "15.paged_attention.attends_past_length"),
        Wrong("no scale", _attention_wrong(scale=False), "15.paged_attention.missing_scale"),
        Wrong("repeat, not repeat_interleave", _attention_wrong(tiled=True),
              "15.paged_attention.kv_heads_tiled"),
        Wrong("first table for all", _attention_wrong(first=True),
              "15.paged_attention.one_table_for_all"),
        Wrong("calls the reference", _calls_reference_attention,
              "15.paged_attention.calls_course_reference"),
    ],
    nb15.check_serve: [
        Wrong("static batching", _wrong_serve(static=True), "15.serve.waits_for_batch_to_drain"),
        Wrong("max_batch + 1", _wrong_serve(over=1), "15.serve.batch_over_max"),
        Wrong("prompt blocks only", _wrong_serve(reserve=False), "15.serve.admits_beyond_capacity"),
        Wrong("never frees", _wrong_serve(never_free=True), "15.serve.blocks_never_freed"),
        Wrong("retires one token late", _wrong_serve(extra=1), "15.serve.decodes_finished"),
        Wrong("no append_token", _wrong_serve(no_append=True), "15.serve.cache_not_grown"),
        Wrong("one decode call per request", _wrong_serve(one_by_one=True),
              "15.serve.decodes_one_by_one"),
        Wrong("last come first served", _wrong_serve(lifo=True),
              "15.serve.not_first_come_first_served"),
        Wrong("admits at the first step only", _wrong_serve(admit_once=True),
              "15.serve.starves_waiting"),
        Wrong("stop ignored", _wrong_serve(stop=False), "15.serve.stop_id_ignored"),
        Wrong("waits for blocks inside the step", _wrong_serve(spin=True), "15.serve.stalls"),
        Wrong("ttft from admission", _wrong_serve(ttft_admit=True),
              "15.serve.ttft_from_admission"),
        Wrong("tpot over n", _wrong_serve(tpot_all=True), "15.serve.tpot_over_all_tokens"),
        Wrong("decodes the just admitted", _wrong_serve(decode_new=True),
              "15.serve.decodes_just_admitted"),
        Wrong("calls the reference", _calls_reference_serve, "15.serve.calls_course_reference"),
    ],
}

CORRECT = {
    nb15.check_pad_left: {"reference": _copy(srv.pad_left), "notebook": pad_left},
    nb15.check_batched_prefill: {"reference": _copy(srv.batched_prefill),
                                 "notebook": batched_prefill},
    nb15.check_BlockAllocator: {"reference": _copy_class(srv.BlockAllocator, "BlockAllocator"),
                                "notebook": BlockAllocator, "stack of free blocks": LifoAllocator},
    nb15.check_PagedKVCache: {"reference": _copy_class(srv.PagedKVCache, "PagedKVCache"),
                              "notebook": PagedKVCache},
    nb15.check_paged_attention: {"reference": _copy(srv.paged_attention),
                                 "notebook": paged_attention, "by hand": _attention_wrong()},
    nb15.check_serve: {"reference": _copy(srv.serve), "notebook": serve},
}

EXERCISES = exercises(CORRECT, WRONG)


# ------------------------------------------------------------------------------------------------
# The reference's own invariants

CFG = ModelConfig(vocab_size=61, hidden_size=26, n_heads=6, n_kv_heads=2, head_dim=4,
                  ffn_hidden_size=50, n_layers=3, max_seq_len=64, rope_base=321.0)


def _params(seed=0):
    return ref.init_model_params(CFG, generator=torch.Generator().manual_seed(seed))


def test_reference_padded_rows_equal_their_prompts_alone():
    params = _params()
    prompts = [[5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8], [9]]
    ids, keep, pos = srv.pad_left(prompts, 0)
    logits, kvs = srv.batched_prefill(ids, keep, pos, params, CFG)
    for row, p in enumerate(prompts):
        alone = gen.full_forward(torch.tensor([p]), params, CFG)[0]
        torch.testing.assert_close(logits[row, -len(p):], alone, atol=2e-5, rtol=2e-5)
    assert not torch.isnan(logits).any()       # pad queries see nothing: zeros, not NaN


def test_reference_scheduler_serves_each_request_as_alone():
    """The reference scheduler on the reference pieces of a real (tiny) model: every request's
    tokens equal chapter 13's greedy generate of its prompt alone."""
    params = _params(1)
    requests = [([3, 4, 5], 6), ([7] * 9, 4), ([1, 2], 8), ([8, 9, 10, 11], 5)]
    cache = srv.PagedKVCache(CFG, 12, 4)
    alloc = srv.BlockAllocator(12, 4)

    def prefill(ids, prompts):
        tok, keep, pos = srv.pad_left(prompts, 0)
        logits, kvs = srv.batched_prefill(tok, keep, pos, params, CFG)
        for row, i in enumerate(ids):
            n = len(prompts[row])
            for layer, (k, v) in enumerate(kvs):
                cache.write(layer, alloc.block_table(i), 0, k[row, :, -n:], v[row, :, -n:])
        return logits[:, -1].argmax(-1).tolist()

    def decode(ids, last):
        tables = [alloc.block_table(i) for i in ids]
        lengths = [alloc.length(i) for i in ids]
        pos = torch.tensor(lengths)[:, None] - 1
        x = embed(torch.tensor(last)[:, None], params["embed"])
        for layer_i, layer in enumerate(params["layers"]):
            h = rms_norm(x, layer["attn_norm"], CFG.norm_eps)
            q, k, v = split_qkv(h @ layer["wqkv"], CFG.n_heads, CFG.n_kv_heads, CFG.head_dim)
            q, k = apply_rope(q, pos, base=CFG.rope_base), apply_rope(k, pos, base=CFG.rope_base)
            for row, table in enumerate(tables):
                cache.write(layer_i, table, lengths[row] - 1, k[row], v[row])
            out = srv.paged_attention(q, cache.k[layer_i], cache.v[layer_i], tables, lengths)
            x = x + merge_heads(out) @ layer["wo"]
            h = rms_norm(x, layer["ffn_norm"], CFG.norm_eps)
            x = x + swiglu_ffn(h, layer["w_gate"], layer["w_up"], layer["w_down"])
        logits = rms_norm(x, params["final_norm"], CFG.norm_eps) @ params["lm_head"]
        return logits[:, -1].argmax(-1).tolist()

    results, timeline = srv.serve(requests, prefill, decode, alloc, max_batch=3)
    assert alloc.num_free == 12
    assert max(len(s["prefill"]) + len(s["decode"]) for s in timeline) <= 3 + 3
    for (prompt, n), r in zip(requests, results):
        alone = gen.generate(params, CFG, torch.tensor([prompt]), n)[0, len(prompt):].tolist()
        assert r["tokens"] == alone


def test_reference_allocator_is_atomic():
    alloc = srv.BlockAllocator(4, 3)
    alloc.allocate("a", 7)                     # 3 blocks
    with pytest.raises(MemoryError):
        alloc.allocate("b", 4)
    assert alloc.num_free == 1 and "b" not in alloc._tables
    alloc.append_token("a")
    alloc.append_token("a")                    # 9 tokens: still 3 blocks
    assert alloc.num_free == 1
    alloc.append_token("a")                    # the 10th takes the last block
    with pytest.raises(MemoryError):
        alloc.allocate("c", 1)
    alloc.free("a")
    with pytest.raises(KeyError):
        alloc.free("a")
    assert alloc.num_free == 4
