"""Chapter 15's checks, inside: random models and prompts, the wrong variants each mistake
would produce (simulated beside the learner's code), and the fake model and allocator the
scheduler's check runs the learner's `serve` against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..engine import Check, NotStarted
from ..i18n import _
from ..reference import generation as gen
from ..reference import serving as ref
from ..reference.model import init_model_params
from .mistakes import CACHE_NOT_GROWN, DECODES_FINISHED, OVER_CAPACITY, STOP_IGNORED


# --------------------------------------------------------------------------------------------
# Small models whose sizes are all distinct


def model_cfg(c: Check, kind: str = "gqa") -> ModelConfig:
    n_kv = 1 if kind == "mqa" else c.randint(2, 4)
    g = c.randint(2, 4)
    d = c.choice([6, 8, 10])
    n_h = n_kv * g
    return ModelConfig(vocab_size=c.randint(40, 70), hidden_size=n_h * d + c.choice([2, 4]),
                       n_heads=n_h, n_kv_heads=n_kv, head_dim=d,
                       ffn_hidden_size=c.randint(30, 50), n_layers=c.randint(2, 4),
                       max_seq_len=64, rope_base=float(c.randint(200, 900)),
                       norm_eps=1e-3)


def sharp_params(c: Check, cfg: ModelConfig) -> dict:
    """Random weights with std 1/sqrt(fan-in) (attention far from uniform)."""
    params = init_model_params(cfg, generator=torch.Generator().manual_seed(c.randint(0, 10**6)))
    with torch.no_grad():
        for layer in params["layers"]:
            for name in ("wqkv", "wo", "w_gate", "w_up", "w_down"):
                layer[name].mul_(1 / (0.02 * math.sqrt(layer[name].shape[0])))
        params["embed"].mul_(50.0)
        params["lm_head"].mul_(1 / (0.02 * math.sqrt(cfg.hidden_size)))
    return params


def prompts_of(c: Check, lengths: list[int], low: int, high: int) -> list[list[int]]:
    return [[c.randint(low, high) for _ in range(n)] for n in lengths]


# --------------------------------------------------------------------------------------------
# pad_left: what the mistakes return


def right_padded(prompts, pad_id):
    t = max(len(p) for p in prompts)
    ids = torch.tensor([list(p) + [pad_id] * (t - len(p)) for p in prompts])
    keep = torch.tensor([[True] * len(p) + [False] * (t - len(p)) for p in prompts])
    pos = torch.tensor([list(range(len(p))) + [0] * (t - len(p)) for p in prompts])
    return ids, keep, pos


# --------------------------------------------------------------------------------------------
# batched_prefill: the padded forward pass with a mistake


def padded_forward(ids, keep, positions, params, cfg, *, pad_mask=True, use_positions=True,
                   causal=True, rotate_kv=True, repeat_kv=False):
    b, t = ids.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    mask = torch.ones(b, 1, t, t, dtype=torch.bool)
    if causal:
        mask &= torch.ones(t, t, dtype=torch.bool).tril()
    if pad_mask:
        mask &= keep.bool()[:, None, None, :]
    pos = positions if use_positions else torch.arange(t).expand(b, t)
    rotors = gen._rope_rotors(pos.reshape(-1), cfg).reshape(b, 1, t, -1)
    x = F.embedding(ids, params["embed"])
    kvs = []
    for layer in params["layers"]:
        h = gen._rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        heads = (h @ layer["wqkv"]).unflatten(-1, (n_h + 2 * n_kv, d)).transpose(1, 2)
        qk = gen._rotate(heads[:, :n_h + n_kv], rotors)
        q, k, v = qk[:, :n_h], qk[:, n_h:], heads[:, n_h + n_kv:]
        k_out = k if rotate_kv else heads[:, n_h:n_h + n_kv]
        if repeat_kv:
            kvs.append((k_out.repeat_interleave(n_h // n_kv, 1),
                        v.repeat_interleave(n_h // n_kv, 1)))
        else:
            kvs.append((k_out, v))
        full = mask.expand(b, n_h, t, t)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=n_kv != n_h)
        out = out.masked_fill(~full.any(-1, keepdim=True), 0.0)
        x = x + out.transpose(1, 2).reshape(b, t, n_h * d) @ layer["wo"]
        h = gen._rms_norm(x, layer["ffn_norm"], cfg.norm_eps)
        x = x + (F.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]
    return gen._rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"], kvs


def real_rows(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The real (right-end) positions of every row of x [B, (N,) T, ...], concatenated along T
    (axis -2 for [B, N, T, D], axis 1 for [B, T, V])."""
    if x.dim() == 4:      # [B, N, T, D]
        return torch.cat([x[b, :, x.shape[2] - n:] for b, n in enumerate(lengths)], dim=1)
    return torch.cat([x[b, x.shape[1] - n:] for b, n in enumerate(lengths)], dim=0)


# --------------------------------------------------------------------------------------------
# Calling a method of the learner's object


def method(c: Check, obj, name: str, *args):
    """obj.name(*args), the learner's exceptions turned into a failure that names the call."""
    shown = f"{name}({', '.join(repr(a) for a in args)})"
    try:
        fn = getattr(obj, name)
    except AttributeError:
        c.fail(_("the object has no method {name}.").format(name=name))
    try:
        return fn(*args)
    except NotImplementedError:
        raise NotStarted(c.exercise) from None
    except Exception as exc:  # noqa: BLE001 - the learner's code may fail in any way
        c.fail(_("{call} raised {error}: {text}").format(call=shown, error=type(exc).__name__,
                                                        text=exc))


def attribute(c: Check, obj, name: str):
    try:
        return getattr(obj, name)
    except NotImplementedError:
        raise NotStarted(c.exercise) from None
    except Exception as exc:  # noqa: BLE001 - a property of the learner's may fail in any way
        c.fail(_("reading {name} raised {error}: {text}").format(
            name=name, error=type(exc).__name__, text=exc))


# --------------------------------------------------------------------------------------------
# PagedKVCache: the pools after the same writes, addressed rightly or wrongly


class SimPools:
    """Pools [num_blocks, N_kv, bs, D_h] per layer, written as `mode` says: None (right),
    "ignore_table", "chunk_not_split", "shared" (one pool for every layer)."""

    def __init__(self, mode, n_layers, num_blocks, n_kv, bs, d):
        self.mode, self.bs = mode, bs
        count = 1 if mode == "shared" else n_layers
        self.k = [torch.zeros(num_blocks, n_kv, bs, d) for _ in range(count)]
        self.v = [torch.zeros(num_blocks, n_kv, bs, d) for _ in range(count)]

    def pools(self, layer):
        i = 0 if self.mode == "shared" else layer
        return self.k[i], self.v[i]

    def write(self, layer, table, start, k, v):
        kp, vp = self.pools(layer)
        n_blocks = kp.shape[0]
        for j in range(k.shape[1]):
            p = start + j
            if self.mode == "ignore_table":
                block, slot = p // self.bs, p % self.bs
            elif self.mode == "chunk_not_split":
                flat = table[start // self.bs] * self.bs + start % self.bs + j
                block, slot = flat // self.bs, flat % self.bs
            else:
                block, slot = table[p // self.bs], p % self.bs
            if block >= n_blocks:
                raise IndexError("past the pool")
            kp[block, :, slot] = k[:, j]
            vp[block, :, slot] = v[:, j]


def gather(pool: torch.Tensor, table, length: int) -> torch.Tensor:
    """[N_kv, length, D_h]: positions 0..length-1 of a sequence, read through its table."""
    return torch.cat([pool[b] for b in table], dim=1)[:, :length]


# --------------------------------------------------------------------------------------------
# paged_attention's variants


def paged_variant(q, k_pool, v_pool, tables, lengths, mode):
    b, n_h, _one, d = q.shape
    n_kv, bs = k_pool.shape[1], k_pool.shape[2]
    outs = []
    for i in range(b):
        table, length = tables[i], lengths[i]
        if mode == "one_table":
            table, length = tables[0], lengths[0]
        if mode == "pool_order":
            table = sorted(table)
        if mode == "past_length":
            length = len(table) * bs
        k, v = gather(k_pool, table, length), gather(v_pool, table, length)
        if mode == "tiled":
            k, v = k.repeat(n_h // n_kv, 1, 1), v.repeat(n_h // n_kv, 1, 1)
        else:
            k, v = k.repeat_interleave(n_h // n_kv, 0), v.repeat_interleave(n_h // n_kv, 0)
        scores = q[i] @ k.transpose(-1, -2)
        if mode != "no_scale":
            scores = scores / math.sqrt(d)
        outs.append(torch.softmax(scores, -1) @ v)
    return torch.stack(outs)


# --------------------------------------------------------------------------------------------
# serve: a fake model that keeps time and watches the rules, and the reference with mistakes


class SchedulerStalled(RuntimeError):
    """The learner's scheduler called the model or the allocator far more often than serving
    the requests needs."""


class Watch:
    """What the fake model and allocator saw: the calls in order and the first broken rule."""

    def __init__(self, limit: int):
        self.log: list[tuple[str, list[int]]] = []
        self.broken: tuple[str, str] | None = None       # (mistake, text)
        self.calls = 0
        self.limit = limit

    def tick(self):
        self.calls += 1
        if self.calls > self.limit:
            raise SchedulerStalled(_("the scheduler made {n} calls of the model and the "
                                     "allocator without finishing").format(n=self.limit))

    def breaks(self, mistake, text):
        if self.broken is None:
            self.broken = (mistake, text)


class WatchedAllocator:
    """The course's allocator, counting calls; running out while a request grows is recorded as
    admitting beyond capacity."""

    def __init__(self, num_blocks, block_size, watch: Watch):
        self._a = ref.BlockAllocator(num_blocks, block_size)
        self._watch = watch
        self.num_blocks, self.block_size = num_blocks, block_size

    @property
    def num_free(self):
        self._watch.tick()
        return self._a.num_free

    def allocate(self, seq_id, n_tokens):
        self._watch.tick()
        return self._a.allocate(seq_id, n_tokens)

    def append_token(self, seq_id):
        self._watch.tick()
        try:
            return self._a.append_token(seq_id)
        except MemoryError:
            self._watch.breaks(OVER_CAPACITY, _("allocator.append_token({i}) ran out of blocks "
                                                "while request {i} grew").format(i=seq_id))
            raise

    def free(self, seq_id):
        self._watch.tick()
        return self._a.free(seq_id)

    def block_table(self, seq_id):
        self._watch.tick()
        return self._a.block_table(seq_id)

    def length(self, seq_id):
        self._watch.tick()
        return self._a.length(seq_id)

    def holding(self):
        return dict(self._a._lengths)


def next_token(i: int, n: int, stops: dict) -> int:
    """The fake model's n-th new token (n from 0) of request i."""
    if stops.get(i) == n:
        return 3                       # the stop id
    return 10 + (7 * i + 3 * n) % 41


class FakeModel:
    """prefill(ids, prompts) and decode(ids, last_tokens) of a fake model: the tokens are a fixed
    function of (request, count), the clock moves only inside them (1 s per prefill call, 0.25 s
    per decode call), and every call is checked against the allocator and the requests."""

    def __init__(self, requests, allocator: WatchedAllocator, watch: Watch, stops: dict,
                 stop_id):
        self.requests, self.allocator, self.watch = requests, allocator, watch
        self.stops, self.stop_id = stops, stop_id
        self.now = 0.0
        self.made: dict[int, list[int]] = {}

    def clock(self) -> float:
        return self.now

    def done(self, i) -> bool:
        toks, n = self.made[i], self.requests[i][1]
        return len(toks) >= n or (self.stop_id is not None and toks[-1] == self.stop_id)

    def prefill(self, ids, prompts):
        self.watch.tick()
        ids = [int(i) for i in ids]
        self.watch.log.append(("prefill", ids))
        self.now += 1.0
        out = []
        for i, prompt in zip(ids, prompts):
            if list(prompt) != list(self.requests[i][0]):
                self.watch.breaks(None, _("prefill got request {i} with another prompt").format(
                    i=i))
            self.made[i] = [next_token(i, 0, self.stops)]
            out.append(self.made[i][0])
        return out

    def decode(self, ids, last):
        self.watch.tick()
        ids = [int(i) for i in ids]
        self.watch.log.append(("decode", ids))
        self.now += 0.25
        holding = self.allocator.holding()
        out = []
        for i, tok in zip(ids, last):
            if i not in self.made:
                self.watch.breaks(None, _("decode got request {i} before its prefill").format(i=i))
                out.append(0)
                continue
            if len(self.made[i]) >= self.requests[i][1]:
                self.watch.breaks(DECODES_FINISHED, _(
                    "decode got request {i}, which had all its {n} tokens").format(
                    i=i, n=len(self.made[i])))
            elif self.done(i):
                self.watch.breaks(STOP_IGNORED, _(
                    "decode got request {i}, which had produced stop_id").format(i=i))
            want = len(self.requests[i][0]) + len(self.made[i])
            if holding.get(i) != want:
                self.watch.breaks(CACHE_NOT_GROWN, _(
                    "decode got request {i} while the allocator held {got} tokens for it; "
                    "feeding its token {n} needs {want}").format(
                    i=i, got=holding.get(i), n=len(self.made[i]), want=want))
            self.made[i].append(next_token(i, len(self.made[i]), self.stops))
            out.append(self.made[i][-1])
        return out


def serve_variant(requests, num_blocks, bs, max_batch, stop_id, stops, mode):
    """The call log and results of the reference scheduler with one mistake (`mode`), on the fake
    model: None, "static", "over_batch", "one_by_one", "lifo", "decode_new", "ttft", "tpot",
    "stop_ignored"."""
    watch = Watch(10**6)
    alloc = WatchedAllocator(num_blocks, bs, watch)
    model = FakeModel(requests, alloc, watch, stops, stop_id)
    if mode in (None, "ttft", "tpot"):
        results, timeline = ref.serve(requests, model.prefill, model.decode, alloc,
                                      max_batch=max_batch, stop_id=stop_id, clock=model.clock)
        admitted_at = {}
        t = 0.0
        for step in timeline:           # the time each step started (prefill 1 s, decode 0.25)
            for i in step["prefill"]:
                admitted_at[i] = t
            t += (1.0 if step["prefill"] else 0) + (0.25 if step["decode"] else 0)
        if mode == "ttft":
            for i, r in enumerate(results):
                r["ttft"] -= admitted_at[i]
        if mode == "tpot":
            for r in results:
                n = len(r["tokens"])
                r["tpot"] = r["tpot"] * max(n - 1, 1) / n
        return watch.log, results, timeline
    return _scheduler_with(mode, requests, model, alloc, max_batch, stop_id, watch)


def _scheduler_with(mode, requests, model, alloc, max_batch, stop_id, watch):
    """ref.serve's loop with one mistake, written out."""
    bs = alloc.block_size
    start = model.clock()
    waiting = list(range(len(requests)))
    running, tokens, first, last, timeline = [], {i: [] for i in waiting}, {}, {}, []
    cap = max_batch + 1 if mode == "over_batch" else max_batch
    stop = None if mode == "stop_ignored" else stop_id

    def need(i):
        return ref.blocks_for(len(requests[i][0]) + requests[i][1] - 1, bs)

    def finished(i):
        return len(tokens[i]) >= requests[i][1] or (stop is not None and tokens[i][-1] == stop)

    while waiting or running:
        promised = sum(need(i) - len(alloc._a.block_table(i)) for i in running)
        admitted = []
        may_admit = not running if mode == "static" else True
        queue = list(reversed(waiting)) if mode == "lifo" else list(waiting)
        while may_admit and queue and len(running) + len(admitted) < cap:
            head = queue[0]
            if mode == "no_reserve":
                if ref.blocks_for(len(requests[head][0]), bs) > alloc._a.num_free:
                    break
            elif need(head) > alloc._a.num_free - promised:
                break
            alloc._a.allocate(head, len(requests[head][0]))
            if mode != "no_reserve":
                promised += need(head) - len(alloc._a.block_table(head))
            admitted.append(head)
            queue.pop(0)
            waiting.remove(head)
        if admitted:
            firsts = model.prefill(admitted, [list(requests[i][0]) for i in admitted])
            for i, tok in zip(admitted, firsts):
                tokens[i].append(int(tok))
                first[i] = last[i] = model.clock()
        old = list(running) + (admitted if mode == "decode_new" else [])
        old = [i for i in old if not finished(i)]
        groups = [[i] for i in old] if mode == "one_by_one" else ([old] if old else [])
        try:
            for group in groups:
                for i in group:
                    alloc._a.append_token(i)
                for i, tok in zip(group, model.decode(group, [tokens[i][-1] for i in group])):
                    tokens[i].append(int(tok))
                    last[i] = model.clock()
        except MemoryError:               # admitted beyond capacity: the run ends here
            break
        timeline.append({"prefill": admitted, "decode": old})
        running += admitted
        for i in [i for i in running if finished(i)]:
            running.remove(i)
            alloc._a.free(i)
        if not admitted and not old and not running and waiting:
            break
        if len(watch.log) > 10**4:
            break
    results = [{"tokens": tokens[i], "ttft": first.get(i, 0.0) - start,
                "tpot": (last.get(i, 0.0) - first.get(i, 0.0)) / max(len(tokens[i]) - 1, 1)}
               for i in range(len(requests))]
    return watch.log, results, timeline
