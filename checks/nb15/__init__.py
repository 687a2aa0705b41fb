"""Checks for chapter 15: serving many requests at once.

Conventions (docs/conventions.md): prompts are left-padded; `keep` [B, T] is True on real tokens;
a real token's position counts from 0 at its row's first real token; a pool is
[num_blocks, N_kv, block_size, D_h] per layer, position p of a sequence in block
block_table[p // block_size], slot p % block_size; K is stored after RoPE, N_kv heads only.

How the checks look inside:
- `pad_left`, `batched_prefill`: each row's real positions are compared with the same prompt run
  alone (chapter 13's uncached forward pass; K after RoPE from chapter 13's cache); pad positions
  are never compared. Prompts of distinct lengths, one of them the longest, one of length 1, and
  a batch without padding; the mistakes are the same forward pass re-run with one thing wrong.
- `BlockAllocator`: a script of allocations, growth across block boundaries, a request that does
  not fit (it must raise MemoryError and change nothing), frees, a double free (KeyError),
  against the counts ceil(n / block_size); the block ids themselves are the allocator's choice,
  only their count, their distinctness and their range are held to.
- `PagedKVCache`: block tables drawn out of order from the pool, interleaved between sequences,
  written with a prefill chunk, single tokens and a chunk across a block boundary; after every
  write, every layer's pools are compared with the course's; reads with the text's order.
- `paged_attention`: sequences of lengths that end inside and at the end of a block, their blocks
  out of order, the pools' unused slots full of noise; compared with chapter 06's grouped-query
  attention over each sequence's keys read in order.
- `serve`: a fake model (its tokens a fixed function of the request and the count, its clock
  moving 1 s per prefill call and 0.25 s per decode call) and the course's allocator, watched; the
  learner's calls are compared step by step with the course's scheduler (and with the scheduler
  with each known mistake), then the tokens, the times to first token and per output token.

Every check runs on one CPU thread (`_one_thread`). The classes' checks call the learner's object
directly (its methods and attributes), in a grader's worker through the worker's proxies.
"""

from __future__ import annotations

import math

import torch

from ..context import one_thread as _one_thread
from ..engine import Check, CheckFailure, NotStarted
from ..i18n import _
from ..mistakes import CALLS_COURSE_REFERENCE
from ..reference import serving as ref
from . import mistakes as _m


def _no_reference(c: Check, fn) -> None:
    c.forbid_functions([fn], _(_m.REFERENCE_HINT))


# --------------------------------------------------------------------------------------------
# Exercise 1: pad_left


@_one_thread
def check_pad_left(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .internals import prompts_of, right_padded

    with Check("pad_left", f, seed=seed) as c:
        _no_reference(c, ref.pad_left)
        cases = []
        for _n in range(3 if thorough else 2):
            lengths = c.sizes(c.randint(3, 5), 2, 9)
            lengths[c.randint(0, len(lengths))] = 1
            cases.append((prompts_of(c, lengths, 100, 999), c.randint(1, 99)))
        cases.append((prompts_of(c, [4, 4], 100, 999), 0))           # nothing to pad
        cases.append((prompts_of(c, [3], 100, 999), 7))               # one prompt
        for prompts, pad_id in cases:
            call = f"pad_left({[len(p) for p in prompts]} tokens, pad_id={pad_id})"
            got = c.call([list(p) for p in prompts], pad_id)
            if not (isinstance(got, tuple) and len(got) == 3):
                c.fail(_("{call} returned {got}; expected a tuple (token_ids, keep, "
                         "positions).").format(call=call, got=type(got).__name__))
            ids, keep, pos = ref.pad_left(prompts, pad_id)
            r_ids, r_keep, r_pos = right_padded(prompts, pad_id)
            zero_pad = ids.masked_fill(~keep, 0)
            c.expect_tensor(got[0], ids, what=_("{call}: token_ids").format(call=call),
                            dims=("B", "T"), wrong={_m.PADDED_RIGHT: r_ids,
                                                    _m.PAD_ID_IGNORED: zero_pad})
            c.expect_tensor(got[1], keep, what=_("{call}: keep").format(call=call),
                            dims=("B", "T"), wrong={_m.PADDED_RIGHT: r_keep,
                                                    _m.KEEP_INVERTED: ~keep})
            t = ids.shape[1]
            columns = torch.arange(t).expand(len(prompts), t)
            c.expect_tensor(got[2], pos, what=_("{call}: positions").format(call=call),
                            dims=("B", "T"), wrong={
                                _m.PADDED_RIGHT: r_pos, _m.POSITIONS_NOT_OFFSET: columns,
                                _m.POSITIONS_FROM_ONE: pos + keep.long()})
        c.headline(_("pads on the left, the last real token in the last column"))
        c.headline(_("keep True on real tokens; positions 0, 1, ... from each row's first real "
                     "token, pads at 0"))


# --------------------------------------------------------------------------------------------
# Exercise 2: batched_prefill


@_one_thread
def check_batched_prefill(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .internals import model_cfg, padded_forward, prompts_of, real_rows, sharp_params
    from ..reference import generation as gen

    with Check("batched_prefill", f, seed=seed) as c:
        _no_reference(c, ref.batched_prefill)
        kinds = ["gqa", "mqa"] + (["gqa"] if thorough else [])
        for kind in kinds:
            cfg = model_cfg(c, kind)
            params = sharp_params(c, cfg)
            lengths = c.sizes(3, 2, 9)
            lengths[c.randint(0, 3)] = 1
            prompts = prompts_of(c, lengths, 0, cfg.vocab_size)
            ids, keep, pos = ref.pad_left(prompts, 0)
            call = f"batched_prefill(prompts of {lengths} tokens, left-padded to {ids.shape[1]})"
            got = c.call(ids, keep, pos, params, cfg)
            if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], (list, tuple))
                    and len(got[1]) == cfg.n_layers):
                c.fail(_("{call} returned {got}; expected (logits, [(k, v) for each of the "
                         "{n} layers]).").format(call=call, got=type(got).__name__,
                                                 n=cfg.n_layers))
            logits, kvs = got
            alone, alone_k, alone_v = [], [], []
            for p in prompts:
                one = torch.tensor([p])
                cache = gen.KVCache(cfg, 1, len(p))
                alone.append(gen.forward_with_cache(one, params, cfg, cache, 0)[0])
                alone_k.append(cache.k)
                alone_v.append(cache.v)
            want = torch.cat(alone, 0)

            def variant(**wrong):
                return padded_forward(ids, keep, pos, params, cfg, **wrong)

            def real(**wrong):
                return lambda: real_rows(variant(**wrong)[0], lengths)

            mistakes = {_m.PADS_ATTENDED: real(pad_mask=False),
                        _m.POSITIONS_IGNORED: real(use_positions=False),
                        _m.NO_CAUSAL: real(causal=False)}
            if not (isinstance(logits, torch.Tensor) and logits.shape[:2] == ids.shape):
                c.expect_tensor(logits, torch.empty(*ids.shape, cfg.vocab_size),
                                what=_("{call}: logits").format(call=call),
                                dims=("B", "T", "V"))
            c.expect_tensor(real_rows(logits, lengths), want,
                            what=_("{call}: the logits of the real tokens, row by row, against "
                                   "each prompt run alone").format(call=call),
                            dims=("real tokens", "V"), wrong=mistakes)
            for layer, pair in enumerate(kvs):
                for idx, name, mine in ((0, "K", alone_k), (1, "V", alone_v)):
                    want_kv = torch.cat([m[layer][0] for m in mine], dim=1)
                    got_kv = pair[idx] if isinstance(pair, (tuple, list)) and len(pair) == 2 \
                        else None
                    if isinstance(got_kv, torch.Tensor) and got_kv.dim() == 4 and \
                            got_kv.shape[0] == len(prompts) and got_kv.shape[2] == ids.shape[1]:
                        got_kv = real_rows(got_kv, lengths)
                    c.expect_tensor(got_kv, want_kv, what=_(
                        "{call}: layer {layer}'s {name}, the real tokens, against each prompt "
                        "run alone").format(call=call, layer=layer, name=name),
                                    dims=("N_kv", "real tokens", "D_h"), wrong={
                        _m.POSITIONS_IGNORED: lambda layer=layer, idx=idx: real_rows(
                            variant(use_positions=False)[1][layer][idx], lengths),
                        _m.KV_BEFORE_ROPE: lambda layer=layer, idx=idx: real_rows(
                            variant(rotate_kv=False)[1][layer][idx], lengths),
                        _m.KV_REPEATED: lambda layer=layer, idx=idx: real_rows(
                            variant(repeat_kv=True)[1][layer][idx], lengths)})
        c.headline(_("every row's logits equal its prompt run alone (pads never compared)"))
        c.headline(_("K (after RoPE) and V of every layer, N_kv heads"))


# --------------------------------------------------------------------------------------------
# Exercise 3: BlockAllocator


@_one_thread
def check_BlockAllocator(cls, *, seed: int | None = None, thorough: bool = False) -> None:
    from .internals import attribute, method

    with Check("BlockAllocator", cls, seed=seed) as c:
        for _trial in range(2 if thorough else 1):
            bs = c.randint(3, 6)
            num_blocks = c.randint(9, 14)
            alloc = c.call(num_blocks, bs)
            expect = {}                       # seq -> (length)
            tables = {}

            def free_now():
                got = attribute(c, alloc, "num_free")
                return got

            def held():
                return sum(ref.blocks_for(n, bs) for n in expect.values())

            def check_table(seq, table, n, what):
                want = ref.blocks_for(n, bs)
                if not isinstance(table, list) or not all(isinstance(b, int) for b in table):
                    c.fail(_("{what} returned {got}; expected the block table, a list of "
                             "ints.").format(what=what, got=type(table).__name__))
                if len(table) != want:
                    hint = None
                    if len(table) == want + 1 and n % bs == 0:
                        hint = _m.BLOCK_TOO_MANY if "allocate" in what else _m.GROWS_EARLY
                    elif len(table) == n // bs:
                        hint = _m.BLOCK_TOO_FEW if "allocate" in what else _m.NEVER_GROWS
                    elif len(table) == want + 1:
                        hint = _m.GROWS_EARLY
                    c.fail(_("{what}: {n} tokens in blocks of {bs} need {want} blocks; the "
                             "table holds {got}.").format(what=what, n=n, bs=bs, want=want,
                                                          got=len(table)), hint)
                others = {b for s, t in tables.items() if s != seq for b in t}
                if len(set(table)) != len(table) or set(table) & others or \
                        any(b < 0 or b >= num_blocks for b in table):
                    c.fail(_("{what}: the table {table} repeats a block, holds one outside "
                             "0..{last}, or one another sequence holds ({others}).").format(
                        what=what, table=table, last=num_blocks - 1, others=sorted(others)),
                           _m.BLOCK_GIVEN_TWICE)
                tables[seq] = list(table)
                free = free_now()
                if free != num_blocks - held():
                    c.fail(_("after {what}, num_free is {got}; {want} of {total} blocks are "
                             "free.").format(what=what, got=free, want=num_blocks - held(),
                                             total=num_blocks))
                c.expect_equal(method(c, alloc, "length", seq), n,
                               what=_("length({seq}) after {what}").format(seq=seq, what=what))

            c.expect_equal(free_now(), num_blocks, what=_("num_free of a new allocator"))
            # A sequence that fills its blocks exactly, one inside a block, one of one token.
            for seq, n in (("a", 2 * bs), ("b", bs + 1 + c.randint(0, bs - 1)), ("c", 1)):
                expect[seq] = n
                what = f"allocate({seq!r}, {n})"
                check_table(seq, method(c, alloc, "allocate", seq, n), n, what)
            c.headline(_("ceil(n / block_size) blocks, distinct, in range"))
            # Grow across block boundaries: "c" takes a new block after bs - 1 tokens, "a" is full
            # (a new block at once).
            for seq, steps in (("c", bs), ("a", bs + 1)):
                for _s in range(steps):
                    expect[seq] += 1
                    what = f"append_token({seq!r}) to {expect[seq]} tokens"
                    before = tables[seq]
                    table = method(c, alloc, "append_token", seq)
                    check_table(seq, table, expect[seq], what)
                    if table[:len(before)] != before:
                        c.fail(_("{what} changed the blocks the sequence already held: {before} "
                                 "became {after}.").format(what=what, before=before, after=table))
            c.headline(_("append_token takes a new block exactly when the last is full"))
            # A request that does not fit: MemoryError, nothing changed.
            free = free_now()
            too_many = (free + 1) * bs
            what = f"allocate('d', {too_many}) with {free} blocks free"
            _expect_full(c, lambda: alloc.allocate("d", too_many), what)
            if free_now() != free:
                c.fail(_("after {what} failed, num_free is {got}, was {want}.").format(
                    what=what, got=free_now(), want=free), _m.NOT_ATOMIC)
            # ... and the pool is whole: its free blocks all go to one sequence.
            if free:
                expect["d"] = free * bs
                check_table("d", method(c, alloc, "allocate", "d", free * bs), free * bs,
                            f"allocate('d', {free * bs}) after the failed one")
            # A full pool: growing a sequence whose last block is full must fail atomically.
            what = "append_token('d') with no block free"
            _expect_full(c, lambda: alloc.append_token("d"), what)
            if free_now() != 0 or method(c, alloc, "length", "d") != expect["d"] or \
                    method(c, alloc, "block_table", "d") != tables["d"]:
                c.fail(_("after {what} failed, the sequence or the pool changed.").format(
                    what=what), _m.NOT_ATOMIC)
            c.headline(_("out of blocks: MemoryError, nothing changed"))
            # Free, then free again.
            method(c, alloc, "free", "b")
            del expect["b"]
            del tables["b"]
            if free_now() != num_blocks - held():
                c.fail(_("after free('b'), num_free is {got}; {want} of {total} blocks are "
                         "free.").format(got=free_now(), want=num_blocks - held(),
                                         total=num_blocks), _m.FREE_LOSES_BLOCKS)
            try:
                alloc.free("b")
            except KeyError:
                pass
            except NotImplementedError:
                raise NotStarted("BlockAllocator") from None
            except Exception as exc:  # noqa: BLE001 - any other error: the learner's choice, told
                c.fail(_("free('b') a second time raised {error}; expected KeyError.").format(
                    error=type(exc).__name__), _m.FREE_TWICE)
            else:
                c.fail(_("free('b') a second time did not raise (num_free is now {got}).").format(
                    got=free_now()), _m.FREE_TWICE)
            n = free_now() * bs
            expect["e"] = n
            check_table("e", method(c, alloc, "allocate", "e", n), n,
                        f"allocate('e', {n}) with the freed blocks")
            c.headline(_("free gives the blocks back; a second free raises KeyError"))


def _expect_full(c: Check, fn, what: str) -> None:
    try:
        fn()
    except MemoryError:
        return
    except NotImplementedError:
        raise NotStarted(c.exercise) from None
    except Exception as exc:  # noqa: BLE001 - the learner's error, told by its class
        c.fail(_("{what} raised {error}: {text}").format(what=what, error=type(exc).__name__,
                                                          text=exc),
               _m.WRONG_ERROR.with_text(_(_m.WRONG_ERROR).format(name=type(exc).__name__)))
    c.fail(_("{what} did not raise.").format(what=what), _m.NO_ERROR_WHEN_FULL)


# --------------------------------------------------------------------------------------------
# Exercise 4: PagedKVCache


@_one_thread
def check_PagedKVCache(cls, *, seed: int | None = None, thorough: bool = False) -> None:
    from .internals import SimPools, attribute, gather, method, model_cfg

    with Check("PagedKVCache", cls, seed=seed) as c:
        for _trial in range(2 if thorough else 1):
            cfg = model_cfg(c, c.choice(["gqa", "mqa"]))
            n_kv, d, n_layers = cfg.n_kv_heads, cfg.head_dim, cfg.n_layers
            bs = c.choice([b for b in (2, 3, 4, 5) if b != n_kv])   # the layouts differ
            num_blocks = c.randint(12, 18)
            cache = c.call(cfg, num_blocks, bs)
            want_shape = (num_blocks, n_kv, bs, d)
            for name in ("k", "v"):
                pools = attribute(c, cache, name)
                if not isinstance(pools, (list, tuple)) or len(pools) != n_layers or any(
                        not isinstance(p, torch.Tensor) or tuple(p.shape) != want_shape
                        for p in pools):
                    shapes = [tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
                              for p in pools] if isinstance(pools, (list, tuple)) else pools
                    c.fail(_("cache.{name} should be a list of {n} pools (one per layer), each "
                             "[num_blocks, N_kv, block_size, D_h] = {want}; got {got}.").format(
                        name=name, n=n_layers, want=list(want_shape), got=shapes),
                           _m.POOL_LAYOUT)
            c.headline(_("one K pool and one V pool per layer, [num_blocks, N_kv, block_size, "
                         "D_h]"))
            # Block tables out of order, interleaved: a random permutation of the pool.
            # (never two neighbours of the pool in a row, and the pool's last two blocks free, so
            # that a chunk written on past its block lands in the pool, somewhere else)
            # (and never block j at place j of a table, where ignoring the table would agree)
            lengths = [3 * bs + 1, 2 * bs, bs + 2]       # ends inside, at, inside a block
            while True:
                order = torch.randperm(num_blocks - 2, generator=c.gen).tolist()
                tables, at = [], 0
                for n in lengths:
                    k = ref.blocks_for(n, bs)
                    tables.append(order[at:at + k])
                    at += k
                if all(b - a != 1 for a, b in zip(order, order[1:])) and \
                        all(b != j for t in tables for j, b in enumerate(t)):
                    break
            modes = {None: None, "ignore_table": _m.TABLE_IGNORED,
                     "chunk_not_split": _m.CHUNK_NOT_SPLIT, "shared": _m.POOLS_SHARED}
            sims = {mode: SimPools(mode, n_layers, num_blocks, n_kv, bs, d) for mode in modes}
            broken = set()
            # The writes: prefill chunks, single tokens, a chunk across a block boundary.
            writes = [(0, 0, bs + 1), (1, 0, 2 * bs - 1), (2, 0, bs), (0, bs + 1, 1),
                      (1, 2 * bs - 1, 1), (2, bs, 2), (0, bs + 2, 2 * bs - 1)]
            for seq, start, t in writes:
                for layer in range(n_layers):
                    k = c.randn(n_kv, t, d)
                    v = c.randn(n_kv, t, d)
                    what = f"write({layer}, {tables[seq]}, {start}, k [N_kv={n_kv}, T={t}, " \
                           f"D_h={d}], v)"
                    method(c, cache, "write", layer, list(tables[seq]), start, k, v)
                    for mode, sim in sims.items():
                        if mode in broken:
                            continue
                        try:
                            sim.write(layer, tables[seq], start, k, v)
                        except IndexError:
                            broken.add(mode)
                    for name, i in (("k", 0), ("v", 1)):
                        pools = attribute(c, cache, name)
                        for check_layer in range(layer + 1):
                            got = pools[check_layer]
                            c.expect_tensor(
                                got, sims[None].pools(check_layer)[i],
                                what=_("after {call}: layer {layer}'s {name} pool").format(
                                    call=what, layer=check_layer, name=name.upper()),
                                dims=("num_blocks", "N_kv", "block_size", "D_h"),
                                wrong={mistake: sims[mode].pools(check_layer)[i]
                                       for mode, mistake in modes.items()
                                       if mistake is not None and mode not in broken})
            c.headline(_("position p in block block_table[p // block_size], slot p % "
                         "block_size, across block boundaries"))
            for seq, n in enumerate(lengths):
                for layer in range(n_layers):
                    what = f"read({layer}, {tables[seq]}, {n})"
                    got = method(c, cache, "read", layer, list(tables[seq]), n)
                    if not (isinstance(got, tuple) and len(got) == 2):
                        c.fail(_("{call} returned {got}; expected a tuple (k, v).").format(
                            call=what, got=type(got).__name__))
                    for i, name in ((0, "K"), (1, "V")):
                        pool = sims[None].pools(layer)[i]
                        c.expect_tensor(got[i], gather(pool, tables[seq], n),
                                        what=_("{call}: {name}").format(call=what, name=name),
                                        dims=("N_kv", "length", "D_h"), wrong={
                            _m.READ_POOL_ORDER: gather(pool, sorted(tables[seq]), n),
                            _m.READ_WHOLE_BLOCKS: gather(pool, tables[seq], len(tables[seq]) * bs)})
            c.headline(_("read returns the positions 0..length-1 in the text's order"))


# --------------------------------------------------------------------------------------------
# Exercise 5: paged_attention


@_one_thread
def check_paged_attention(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .internals import paged_variant

    with Check("paged_attention", f, seed=seed) as c:
        _no_reference(c, ref.paged_attention)
        kinds = ["gqa", "mqa", "mha"] + (["gqa", "gqa"] if thorough else [])
        for kind in kinds:
            n_kv = 1 if kind == "mqa" else c.randint(2, 4)
            g = 1 if kind == "mha" else c.randint(2, 4)
            n_h = n_kv * g
            d = c.choice([4, 6, 8])
            bs = c.randint(2, 5)
            b = c.randint(2, 5)
            lengths = [c.randint(1, 4 * bs) for _ in range(b)]
            lengths[0] = 2 * bs                                  # ends at a block's end
            lengths[1] = 2 * bs + 1                              # one token into a block
            num_blocks = sum(ref.blocks_for(n, bs) for n in lengths) + c.randint(1, 4)
            order = torch.randperm(num_blocks, generator=c.gen).tolist()
            tables, at = [], 0
            for n in lengths:
                k = ref.blocks_for(n, bs)
                tables.append(order[at:at + k])
                at += k
            tables[1].sort(reverse=True)        # surely not in pool order, its last block partial
            k_pool = c.randn(num_blocks, n_kv, bs, d)            # unused slots: noise
            v_pool = c.randn(num_blocks, n_kv, bs, d)
            q = c.randn(b, n_h, 1, d)
            call = (f"paged_attention(q [B={b}, N_h={n_h}, 1, D_h={d}], pools [{num_blocks}, "
                    f"N_kv={n_kv}, block_size={bs}, D_h={d}], tables, lengths={lengths})")
            got = c.call(q, k_pool, v_pool, [list(t) for t in tables], list(lengths))
            want = paged_variant(q, k_pool, v_pool, tables, lengths, None)
            c.expect_tensor(got, want, what=call, dims=("B", "N_h", "1", "D_h"), wrong={
                mistake: (lambda mode=mode: paged_variant(q, k_pool, v_pool, tables, lengths,
                                                          mode))
                for mode, mistake in (("pool_order", _m.ATTN_POOL_ORDER),
                                      ("past_length", _m.ATTENDS_PAST_LENGTH),
                                      ("no_scale", _m.NO_SCALE), ("tiled", _m.HEADS_TILED),
                                      ("one_table", _m.ONE_TABLE))})
        c.headline(_("equal to grouped-query attention over each sequence's keys in order"))
        c.headline(_("blocks out of order in the pool; lengths inside and at a block's end; "
                     "MHA, GQA, MQA"))


# --------------------------------------------------------------------------------------------
# Exercise 6: serve

_SERVE_MISTAKES = {"static": _m.STATIC_BATCHING, "over_batch": _m.BATCH_TOO_LARGE,
                   "one_by_one": _m.ONE_BY_ONE, "lifo": _m.NOT_FCFS,
                   "decode_new": _m.DECODES_NEW, "no_reserve": _m.OVER_CAPACITY,
                   "stop_ignored": _m.STOP_IGNORED}


def _timeline_of(got):
    """The learner's timeline in the reference's form, or None."""
    try:
        return [{"prefill": [int(i) for i in s["prefill"]], "decode": [int(i) for i in s["decode"]]}
                for s in got[1]]
    except Exception:  # noqa: BLE001 - whatever it returned, it is not a timeline
        return None


@_one_thread
def check_serve(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .internals import FakeModel, Watch, WatchedAllocator, serve_variant

    with Check("serve", f, seed=seed, errors=[_m.OVER_CAPACITY, _m.STALLS]) as c:
        _no_reference(c, ref.serve)
        for _trial in range(3 if thorough else 2):
            bs = c.randint(2, 4)
            n_req = c.randint(6, 9)
            requests = [([c.randint(20, 90) for _ in range(c.randint(1, 3 * bs))],
                         c.randint(1, 3 * bs + 2)) for _ in range(n_req)]
            requests[1] = (requests[1][0], 1)                   # one token: the prefill alone
            stops = {i: c.randint(1, 4) for i in range(n_req) if c.randint(0, 3) == 0}
            for i in (0, 2):     # two long requests, which stop early, before max_new_tokens
                requests[i] = ([c.randint(20, 90) for _ in range(c.randint(bs + 1, 2 * bs + 1))],
                               c.randint(2 * bs + 1, 3 * bs + 4))
                stops[i] = c.randint(1, requests[i][1] - 2)
            needs = [ref.blocks_for(len(p) + n - 1, bs) for p, n in requests]
            if _trial == 0:         # room for all: max_batch limits the batch
                num_blocks = sum(needs) + c.randint(0, 3)
            else:                   # the blocks limit it: requests 0 and 2 never run together
                num_blocks = max(needs) + 1
            max_batch = c.randint(2, 4)
            stop_id = 3
            watch = Watch(limit=50 * n_req * 10 + 2000)
            alloc = WatchedAllocator(num_blocks, bs, watch)
            model = FakeModel(requests, alloc, watch, stops, stop_id)
            call = (f"serve({n_req} requests, max_batch={max_batch}, {num_blocks} blocks of "
                    f"{bs}, stop_id={stop_id})")
            try:
                got = c.call([(list(p), n) for p, n in requests], model.prefill, model.decode,
                             alloc, max_batch=max_batch, stop_id=stop_id, clock=model.clock)
            except CheckFailure as failure:
                leaked = [s for s in alloc.holding() if s in model.made and model.done(s)]
                if watch.calls > watch.limit and leaked:
                    c.fail(_("{call}: requests {ids} had finished but still held their blocks, "
                             "and the waiting requests never got any.").format(
                        call=call, ids=leaked), _m.NEVER_FREES)
                raise failure from None
            log, want, timeline = serve_variant(requests, num_blocks, bs, max_batch, stop_id,
                                                stops, None)
            if watch.broken is not None and watch.broken[0] is not None:
                c.fail(_("{call}: {text}.").format(call=call, text=watch.broken[1]),
                       watch.broken[0])
            if watch.log != log:
                variants = {mode: serve_variant(requests, num_blocks, bs, max_batch, stop_id,
                                                stops, mode)
                            for mode in _SERVE_MISTAKES}
                same = [mode for mode, v in variants.items() if v[0] == watch.log]
                if len(same) > 1:        # the same calls: the timeline tells them apart
                    told = _timeline_of(got)
                    same = [m for m in same if variants[m][2] == told] or same
                hint = _SERVE_MISTAKES[same[0]] if same else None
                if hint is None and any(i not in model.made for i in range(n_req)):
                    hint = _m.STARVES
                if hint is None and any(s in alloc.holding() for s in range(n_req)
                                        if s in model.made and model.done(s)):
                    hint = _m.NEVER_FREES
                where = next((s for s, (a, b) in enumerate(zip(watch.log, log)) if a != b),
                             min(len(watch.log), len(log)))
                c.fail(_("{call}: model call {n} was {got}; expected {want} (calls so far: "
                         "{before}).").format(
                    call=call, n=where + 1,
                    got=watch.log[where] if where < len(watch.log) else _("none"),
                    want=log[where] if where < len(log) else _("none"),
                    before=watch.log[max(0, where - 3):where]), hint)
            if watch.broken is not None:
                c.fail(_("{call}: {text}.").format(call=call, text=watch.broken[1]))
            if alloc.holding():
                c.fail(_("{call}: when it returned, the allocator still held blocks for "
                         "requests {ids}.").format(call=call, ids=sorted(alloc.holding())),
                       _m.NEVER_FREES)
            c.headline(_("each step: admit first come first served while slots and blocks "
                         "allow, one decode call for every running request, retire and free"))
            if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], list)
                    and len(got[0]) == n_req):
                c.fail(_("{call} returned {got}; expected (results, timeline), results with "
                         "one dict per request.").format(call=call, got=type(got).__name__))
            results, got_timeline = got
            for i, (mine, right) in enumerate(zip(results, want)):
                if not isinstance(mine, dict):
                    c.fail(_("results[{i}] is {got}; expected a dict with tokens, ttft and "
                             "tpot.").format(i=i, got=type(mine).__name__))
                c.expect_equal([int(t) for t in mine.get("tokens", [])]
                               if isinstance(mine.get("tokens"), (list, tuple)) else
                               mine.get("tokens"), right["tokens"],
                               what=_("{call}: results[{i}]['tokens']").format(call=call, i=i))
                for key, mistake, mode in (("ttft", _m.TTFT_FROM_ADMISSION, "ttft"),
                                           ("tpot", _m.TPOT_OVER_ALL, "tpot")):
                    value = mine.get(key)
                    if not isinstance(value, (int, float)) or not math.isclose(
                            float(value), right[key], rel_tol=1e-9, abs_tol=1e-9):
                        wrong = serve_variant(requests, num_blocks, bs, max_batch, stop_id,
                                              stops, mode)[1][i][key]
                        close = isinstance(value, (int, float)) and math.isclose(
                            float(value), wrong, rel_tol=1e-9, abs_tol=1e-9)
                        c.fail(_("{call}: results[{i}]['{key}'] is {got}, expected {want} (the "
                                 "fake model's clock: 1 s per prefill call, 0.25 s per decode "
                                 "call).").format(call=call, i=i, key=key, got=value,
                                                  want=right[key]),
                               mistake if close else None)
            c.expect_equal([{"prefill": [int(i) for i in s.get("prefill", [])],
                             "decode": [int(i) for i in s.get("decode", [])]}
                            if isinstance(s, dict) else s for s in got_timeline]
                           if isinstance(got_timeline, list) else got_timeline, timeline,
                           what=_("{call}: the timeline").format(call=call))
        c.headline(_("tokens, time to first token and time per output token per request"))


__all__ = ["check_BlockAllocator", "check_PagedKVCache", "check_batched_prefill",
           "check_pad_left", "check_paged_attention", "check_serve"]


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "15.<exercise>.<key>" to
# exactly one of them.

MISTAKES = {
    "pad_left": (_m.PADDED_RIGHT, _m.POSITIONS_NOT_OFFSET, _m.POSITIONS_FROM_ONE,
                 _m.KEEP_INVERTED, _m.PAD_ID_IGNORED, CALLS_COURSE_REFERENCE),
    "batched_prefill": (_m.PADS_ATTENDED, _m.POSITIONS_IGNORED, _m.NO_CAUSAL,
                        _m.KV_BEFORE_ROPE, _m.KV_REPEATED, CALLS_COURSE_REFERENCE),
    "BlockAllocator": (_m.BLOCK_TOO_MANY, _m.BLOCK_TOO_FEW, _m.GROWS_EARLY, _m.NEVER_GROWS,
                       _m.NOT_ATOMIC, _m.NO_ERROR_WHEN_FULL, _m.WRONG_ERROR, _m.FREE_TWICE,
                       _m.FREE_LOSES_BLOCKS, _m.BLOCK_GIVEN_TWICE),
    "PagedKVCache": (_m.POOL_LAYOUT, _m.POOLS_SHARED, _m.TABLE_IGNORED, _m.CHUNK_NOT_SPLIT,
                     _m.READ_POOL_ORDER, _m.READ_WHOLE_BLOCKS),
    "paged_attention": (_m.ATTN_POOL_ORDER, _m.ATTENDS_PAST_LENGTH, _m.NO_SCALE,
                        _m.HEADS_TILED, _m.ONE_TABLE, CALLS_COURSE_REFERENCE),
    "serve": (_m.STATIC_BATCHING, _m.BATCH_TOO_LARGE, _m.OVER_CAPACITY, _m.NEVER_FREES,
              _m.STALLS, _m.DECODES_FINISHED, _m.CACHE_NOT_GROWN, _m.ONE_BY_ONE, _m.NOT_FCFS,
              _m.STARVES, _m.STOP_IGNORED, _m.TTFT_FROM_ADMISSION, _m.TPOT_OVER_ALL,
              _m.DECODES_NEW, CALLS_COURSE_REFERENCE),
}
