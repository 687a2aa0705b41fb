"""The internals of chapter 13's checks of KVCache and forward_with_cache (the checks themselves
are in checks.nb13, whose docstring says how they look inside): random configs and weights,
caches and cached forward passes with one known mistake each, simulated step by step beside the
learner's, and the recording cache the learner's forward_with_cache is handed.
"""

from __future__ import annotations

import contextlib
import math
import re

import torch
import torch.nn.functional as F

from .. import reference as ref
from ..config import ModelConfig
from ..engine import Check, CheckFailure, LearnerError
from ..i18n import N_, _
from ..held import numbers_held
from ..held import storages as storages_of
from .mistakes import (CACHE_HEAD_DIM_FROM_H, EPS_FIXED, FORWARD_HEAD_DIM_FROM_H,
                       ROPE_BASE_FIXED, ROTARY_DIM_IGNORED)
from .mistakes import (AT_ZERO, CFG_MAX_LEN, COPY, DTYPE_IGNORED, IGNORED_CACHE,
                            KV_SHARE_BUFFER, K_ONLY, NEW_ONLY, NOT_HEADS_FIRST, NOT_PREALLOCATED,
                            NO_MASK, NO_OFFSET, NO_UPDATE_METHOD, OFFSET_PLUS_ONE, ONE_LAYER,
                            ONE_SHORT, OWN_COUNTER, POSITIONS_PLUS_ONE, REALLOCATED,
                            REPEATED_HEADS, REPEATED_HEADS_ALLOC, RETURNS_REPEATED, SCALE_BY_H,
                            SHARED_BUFFER, SHARED_COUNTER, SQUARE_ALL, SQUARE_EITHER, SQUARE_NEW,
                            SUBCLASSES_REFERENCE, SWAPPED, TOP_LEFT, UNROTATED_RECOMPUTED,
                            UNROTATED_STORED, UPDATE_START, UP_TO_START, V_NOT_WRITTEN,
                            WHOLE_BUFFER)
from ..reference import generation as gen

FORWARD_HINT = N_("this exercise asks you to write the cached forward pass yourself from the "
                  "earlier chapters' pieces (rms_norm, split_qkv, apply_rope, "
                  "grouped_query_attention, causal_mask, swiglu_ffn), not to call the course's "
                  "finished {name}")


@contextlib.contextmanager
def _calling(c: Check, fn):
    """Let `c.call` call `fn` (a method of the learner's object) instead of the exercise itself."""
    saved = c.fn
    c.fn = fn
    try:
        yield
    finally:
        c.fn = saved


@contextlib.contextmanager
def _recognising(c: Check, *mistakes):
    """Let `c` recognise `mistakes` from the learner's exceptions within the block only (where
    the exception says what was done: a ValueError for a write that fits)."""
    saved = c.errors
    c.errors = saved + mistakes
    try:
        yield
    finally:
        c.errors = saved


def _no_reference(c: Check, *fns) -> None:
    """Make `c.call` fail if the learner's function runs the course's own answer (`fns`)."""
    c.forbid_functions(fns, _(FORWARD_HINT))


def _cfg(c: Check, kind: str = "gqa", *, partial: bool = False, n_layers: int = 2,
         max_seq_len: int = 64) -> ModelConfig:
    """A small config with distinct sizes (N_kv >= 2 and G >= 2 for GQA)."""
    if kind == "gqa":
        n_kv, g = c.sizes(2, 2, 4)
    elif kind == "mqa":
        n_kv, g = 1, c.randint(2, 5)
    else:  # mha
        n_kv, g = c.randint(2, 4), 1
    n_h = n_kv * g
    d = c.choice([4, 6, 8])
    # Sizes never tied together as in LLaMA-2: H = N_h (D_h + 1 or 3), so H // N_h is not D_h
    # (and, being odd, not a multiple of it either); a base other than 10000 and an eps far from
    # 1e-5, so that a default or a hard-coded value changes the logits at every seed.
    h = n_h * (d + c.choice([1, 3]))
    return ModelConfig(vocab_size=c.randint(40, 70), hidden_size=h, n_heads=n_h,
                       n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=2 * h + c.randint(1, 9),
                       n_layers=n_layers, rope_base=c.choice([100.0, 500.0]),
                       rotary_dim=d - 2 if partial else d, norm_eps=c.choice([0.1, 0.25]),
                       max_seq_len=max_seq_len)


def _params(c: Check, cfg: ModelConfig) -> dict:
    """Random weights of unit-ish scale (attention far from uniform), random norm scales."""
    h, d, h_ff, v = cfg.hidden_size, cfg.head_dim, cfg.ffn_hidden_size, cfg.vocab_size
    width = (cfg.n_heads + 2 * cfg.n_kv_heads) * d
    layers = []
    for _n in range(cfg.n_layers):
        layers.append({
            "attn_norm": 1.0 + 0.3 * c.randn(h),
            "wqkv": c.randn(h, width, scale=1.3 / math.sqrt(h)),
            "wo": c.randn(cfg.n_heads * d, h, scale=1 / math.sqrt(cfg.n_heads * d)),
            "ffn_norm": 1.0 + 0.3 * c.randn(h),
            "w_gate": c.randn(h, h_ff, scale=1 / math.sqrt(h)),
            "w_up": c.randn(h, h_ff, scale=1 / math.sqrt(h)),
            "w_down": c.randn(h_ff, h, scale=1 / math.sqrt(h_ff)),
        })
    return {"embed": c.randn(v, h), "layers": layers, "final_norm": 1.0 + 0.3 * c.randn(h),
            "lm_head": c.randn(h, v, scale=2 / math.sqrt(h))}


# --------------------------------------------------------------------------------------------
# A cached forward pass with known mistakes, from the earlier chapters' reference pieces


def _sim_forward(token_ids, params, cfg, cache, start_pos, *, offset=True, mask="bottom_right",
                 store_rotated=True, rerotate=False, use_cache=True, scale_width=False,
                 shift=0, rope_base=None, eps=None, full_rotary=False):
    """forward_with_cache with the named mistake (no keyword: the correct computation).

    offset=False: RoPE positions 0..T-1; mask: "bottom_right", "top_left", "none", or a square
    mask that cannot fit a later chunk's scores: "square_new" (causal_mask(T)) or "square_all"
    (causal_mask(start_pos + T));
    store_rotated=False: K goes into the cache before RoPE (and is used from there as it is,
    or, with rerotate, rotated again by 0..end-1); use_cache=False: attends to the new tokens only;
    scale_width: the scores divided by sqrt(H) (here N_h * D_h), not by sqrt(D_h);
    shift: every position `shift` too far (which only the cache's keys show: RoPE is relative);
    rope_base, eps: a fixed base or eps instead of the config's; full_rotary: every feature of a
    head rotated (rotary_dim ignored).
    """
    b, t = token_ids.shape
    end = start_pos + t
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pos = torch.arange(start_pos + shift, end + shift) if offset else torch.arange(t)
    rope = dict(base=cfg.rope_base if rope_base is None else rope_base,
                rotary_dim=d if full_rotary else cfg.rotary_dim)
    eps = cfg.norm_eps if eps is None else eps
    x = F.embedding(token_ids, params["embed"])
    for i, layer in enumerate(params["layers"]):
        h = ref.rms_norm(x, layer["attn_norm"], eps)
        q, k, v = ref.split_qkv(h @ layer["wqkv"], n_h, n_kv, d)
        q = ref.apply_rope(q, pos, **rope)
        k_rot = ref.apply_rope(k, pos, **rope)
        k_all, v_all = cache.update(i, k_rot if store_rotated else k, v, start_pos)
        if not store_rotated and rerotate:
            k_all = ref.apply_rope(k_all, torch.arange(end), **rope)
        keys = end
        if not use_cache:
            k_all, v_all, keys = k_rot, v, t
        if mask == "bottom_right":
            m = ref.causal_mask(t, keys)
        elif mask == "top_left":
            m = torch.ones(t, keys, dtype=torch.bool).tril()
        elif mask == "square_new":
            m = ref.causal_mask(t)
        elif mask == "square_all":
            m = ref.causal_mask(keys)
        else:
            m = None
        if scale_width:  # (q sqrt(D_h / H)) k^T / sqrt(D_h) = q k^T / sqrt(H)
            q = q * math.sqrt(d / cfg.hidden_size)
        out = ref.grouped_query_attention(q, k_all, v_all, m)
        x = x + ref.merge_heads(out) @ layer["wo"]
        x = x + ref.swiglu_ffn(ref.rms_norm(x, layer["ffn_norm"], eps),
                               layer["w_gate"], layer["w_up"], layer["w_down"])
    return ref.rms_norm(x, params["final_norm"], eps) @ params["lm_head"]


_FORWARD_MISTAKES = {
    NO_OFFSET: dict(offset=False),
    TOP_LEFT: dict(mask="top_left"),
    NO_MASK: dict(mask="none"),
    IGNORED_CACHE: dict(use_cache=False),
    UNROTATED_STORED: dict(store_rotated=False),
    UNROTATED_RECOMPUTED: dict(store_rotated=False, rerotate=True),
    SCALE_BY_H: dict(scale_width=True),
    POSITIONS_PLUS_ONE: dict(shift=1),
    ROPE_BASE_FIXED: dict(rope_base=10000.0),
    EPS_FIXED: dict(eps=1e-5),
    ROTARY_DIM_IGNORED: dict(full_rotary=True),
}


def _replay(tokens, params, cfg, batch, s_max, chunks, mistake: dict) -> tuple[list, gen.KVCache]:
    """Run the calls `chunks` [(start, end), ...] with a mistake; (logits per call, the cache)."""
    cache = gen.KVCache(cfg, batch, s_max)
    with torch.no_grad():
        out = [_sim_forward(tokens[:, s:e], params, cfg, cache, s, **mistake) for s, e in chunks]
    return out, cache



# --------------------------------------------------------------------------------------------
# KVCache


class _SimCache:
    """A KV cache with one known mistake (`mode`), fed the same updates as the learner's."""

    def __init__(self, mode: str, n_layers, batch, n_kv, s_max, d, dtype=torch.float32):
        self.mode = mode
        self.buf = torch.zeros(n_layers, 2, batch, n_kv, s_max, d, dtype=dtype)
        self.counters = [0] * n_layers
        self.counter = 0
        self.last = None

    def update(self, layer, k, v, start):
        t, s_max = k.shape[2], self.buf.shape[4]
        mode = self.mode
        slot = 0 if mode == "shared_buffer" else layer
        pos = {"offset_plus_one": start + 1, "at_zero": 0, "own_counter": self.counters[layer],
               "shared_counter": self.counter}.get(mode, start)
        end = start + t
        if mode == "own_counter":
            end = pos + t
        self.counters[layer] += t
        self.counter += t
        stop = min(pos + t, s_max)
        if stop > pos:
            self.buf[slot, 0, :, :, pos:stop] = k[:, :, :stop - pos]
            if mode != "v_not_written":
                self.buf[slot, 1, :, :, pos:stop] = v[:, :, :stop - pos]
        keys, values = self.buf[slot, 0], self.buf[slot, 1]
        if mode == "new_only":
            out = (k, v)
        elif mode == "whole_buffer":
            out = (keys, values)
        elif mode == "up_to_start":
            out = (keys[:, :, :start], values[:, :, :start])
        elif mode == "one_short":
            out = (keys[:, :, :end - 1], values[:, :, :end - 1])
        elif mode == "swapped":
            out = (values[:, :, :end], keys[:, :, :end])
        else:
            out = (keys[:, :, :end], values[:, :, :end])
        self.last = tuple(o.clone() for o in out)
        return self.last


_CACHE_MISTAKES = {
    OFFSET_PLUS_ONE: "offset_plus_one", AT_ZERO: "at_zero", OWN_COUNTER: "own_counter",
    SHARED_COUNTER: "shared_counter", SHARED_BUFFER: "shared_buffer", NEW_ONLY: "new_only",
    WHOLE_BUFFER: "whole_buffer", UP_TO_START: "up_to_start", ONE_SHORT: "one_short",
    SWAPPED: "swapped", V_NOT_WRITTEN: "v_not_written",
}


def _construct(c: Check, cls, cfg, batch, s_max, **kwargs):
    cache = c.call(cfg, batch, s_max, **kwargs)
    if isinstance(cache, ref.KVCache):
        c.fail(_("KVCache is (or derives from) the course's reference checks.reference.KVCache."),
               SUBCLASSES_REFERENCE)
    if not callable(getattr(cache, "update", None)):
        c.fail(_("KVCache(...) has no update method (got {kind}).").format(
            kind=type(cache).__name__),
               NO_UPDATE_METHOD)
    return cache


def _check_allocation(c: Check, cache, cfg, batch, s_max, dtype) -> dict[int, torch.Tensor]:
    storages = storages_of(cache)
    held = numbers_held(storages)
    per = batch * s_max * cfg.head_dim
    want = 2 * cfg.n_layers * cfg.n_kv_heads * per
    sizes = f"L={cfg.n_layers}, B={batch}, N_kv={cfg.n_kv_heads}, S_max={s_max}, D_h={cfg.head_dim}"
    if held == want:
        bad = [t for t in storages.values() if t.dtype != dtype]
        if bad:
            c.fail(_("the cache's buffers have dtype {got}, expected {want}.").format(
                got=bad[0].dtype, want=dtype),
                   DTYPE_IGNORED)
        return storages
    if held == 0:
        c.fail(_("right after KVCache(cfg, batch_size, max_seq_len) the cache holds no "
                 "tensors."),
               NOT_PREALLOCATED)
    mixups = {
        REPEATED_HEADS_ALLOC: 2 * cfg.n_layers * cfg.n_heads * per,
        CFG_MAX_LEN: 2 * cfg.n_layers * cfg.n_kv_heads * batch * cfg.max_seq_len * cfg.head_dim,
        ONE_LAYER: 2 * cfg.n_kv_heads * per,
        K_ONLY: cfg.n_layers * cfg.n_kv_heads * per,
        CACHE_HEAD_DIM_FROM_H: 2 * cfg.n_layers * cfg.n_kv_heads * batch * s_max
        * (cfg.hidden_size // cfg.n_heads),
    }
    named = [m for m, n in mixups.items() if n == held]    # the check's sizes keep them apart
    hint = named[0] if len(named) == 1 else None
    if hint is K_ONLY and _k_is_v(cache, cfg, batch, dtype):
        hint = KV_SHARE_BUFFER
    c.fail(_("the cache's tensors hold {held} numbers; expected 2·L·B·N_kv·S_max·D_h = {want} "
             "({sizes}).").format(held=held, want=want, sizes=sizes), hint)
    return storages


def _k_is_v(cache, cfg, batch, dtype) -> bool:
    """Whether the cache's update returns the same numbers for K and V (one buffer for both):
    a probe of a cache already known to be wrong, whose own errors say nothing."""
    k = torch.zeros(batch, cfg.n_kv_heads, 1, cfg.head_dim, dtype=dtype)
    try:
        got = cache.update(0, k, k + 1, 0)
        return torch.equal(got[0], got[1])
    except Exception:  # noqa: BLE001 - a cache that cannot even do this shares nothing
        return False


def _update(c: Check, cache, layer, k, v, start):
    with _calling(c, cache.update):
        return c.call(layer, k, v, start)


def _expect_update(c: Check, cache, storages, sims, layer, k, v, start, want_k, want_v, s_max):
    """One update call: values, views of the preallocated buffers, no reallocation."""
    got = _update(c, cache, layer, k, v, start)
    for sim in sims.values():
        sim.update(layer, k, v, start)
    label = _("{call} with T={t}").format(
        call=f"update(layer_idx={layer}, k, v, start_pos={start})", t=k.shape[2])
    if not isinstance(got, tuple) or len(got) != 2:
        c.fail(_("{call} returned {kind}; expected a tuple (k_all, v_all).").format(
            call=label, kind=type(got).__name__))
    dims = ("B", "N_kv", "S", "D_h")
    t_new, end = k.shape[2], start + k.shape[2]
    for i, (what, t, want) in enumerate((("k_all", got[0], want_k), ("v_all", got[1], want_v))):
        if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[2] != end and \
                t.shape[:2] == want.shape[:2]:
            # Named from the length alone: empty slots of a torch.empty buffer hold anything.
            hint = {t_new: NEW_ONLY, start: UP_TO_START, end - 1: ONE_SHORT}.get(t.shape[2])
            if hint is None and t.shape[2] == s_max:
                hint = WHOLE_BUFFER
            if hint is not None:
                c.fail(_("{what} from {call} has shape {got}, expected {want} (positions "
                         "0..{last}).").format(
                    what=what, call=label, got=list(t.shape), last=end - 1,
                    want=f"[B={want.shape[0]}, N_kv={want.shape[1]}, S={end}, "
                         f"D_h={want.shape[3]}]"), hint)
        wrong = {m: (lambda s=s, i=i: s.last[i]) for m, s in sims.items()}
        if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] > want.shape[1] and \
                t.shape[1] % want.shape[1] == 0:    # the KV heads, repeated for the query heads
            wrong[RETURNS_REPEATED] = want.repeat_interleave(t.shape[1] // want.shape[1], 1)
        c.expect_tensor(t, want, what=_("{what} from {call}").format(what=what, call=label),
                        dims=dims, wrong=wrong)
    if set(storages_of(cache)) != set(storages):
        c.fail(_("after {call} the cache holds different tensors than it was created with.")
               .format(call=label),
               REALLOCATED)
    for what, t, given in (("k_all", got[0], k), ("v_all", got[1], v)):
        if t.untyped_storage().data_ptr() not in storages:
            same = t.untyped_storage().data_ptr() == given.untyped_storage().data_ptr()
            text = (_("{what} from {call} is not a view of the cache's preallocated tensors (it "
                      "is the tensor update was given).") if same else
                    _("{what} from {call} is not a view of the cache's preallocated tensors."))
            c.fail(text.format(what=what, call=label),
                   NEW_ONLY if same else COPY.with_text(_(COPY).format(what=what)))


# --------------------------------------------------------------------------------------------
# forward_with_cache


class _RecordingCache(gen.KVCache):
    """The course's cache, recording each update and stopping at a misuse with a diagnosis.

    The learner's function gets a `_CacheHandle` whose `update` is this object's bound method.
    When grading runs the learner's code in a worker process, a bound method stays in the grading
    process (the worker calls it back), so the cache, its records and any diagnosis stay here;
    a diagnosis is also kept in `failure`, since it reaches the grader only as the learner's error.
    """

    def __init__(self, c: Check, cfg, batch, s_max):
        super().__init__(cfg, batch, s_max)
        self.check = c
        self.cfg = cfg
        self.calls: list[tuple[int, int, int]] = []
        self.expected: tuple[int, int] | None = None   # (start_pos, T) of the current call
        self.failure: CheckFailure | None = None

    def update(self, layer_idx, k, v, start_pos):
        try:
            return self._update(layer_idx, k, v, start_pos)
        except CheckFailure as failure:
            self.failure = self.failure or failure
            raise

    def _update(self, layer_idx, k, v, start_pos):
        c, cfg = self.check, self.cfg
        start, t = self.expected
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.dim() != 4:
            c.fail(_("{call} got k of {kind} {shape}; expected [B, N_kv, T, D_h].").format(
                call=f"cache.update(layer_idx={layer_idx}, ...)", kind=type(k).__name__,
                shape=tuple(getattr(k, "shape", ()))))
        if k.shape[1] != cfg.n_kv_heads or v.shape[1] != cfg.n_kv_heads:
            heads = k.shape[1] if k.shape[1] != cfg.n_kv_heads else v.shape[1]
            c.fail(_("{call} got K/V with {heads} heads ({shapes}); the cache holds N_kv = "
                     "{n_kv}.").format(call=f"cache.update(layer_idx={layer_idx}, ...)",
                                       heads=heads, n_kv=cfg.n_kv_heads,
                                       shapes=f"k {list(k.shape)}, v {list(v.shape)}"),
                   NOT_HEADS_FIRST if k.shape[1] == t and k.dim() == 4 and
                   k.shape[2] == cfg.n_kv_heads else     # [B, T, N_kv, D_h]
                   REPEATED_HEADS if heads == cfg.n_heads else NOT_HEADS_FIRST)
        if tuple(k.shape) != tuple(v.shape) or k.shape[2] != t or k.shape[3] != cfg.head_dim:
            c.fail(_("{call} got k {k} and v {v}; expected [B, N_kv, T, D_h] with T={t}, the "
                     "new tokens.").format(call=f"cache.update(layer_idx={layer_idx}, ...)",
                                           k=list(k.shape), v=list(v.shape), t=t))
        if start_pos != start:
            c.fail(_("called {call} in a call with start_pos={start}.").format(
                call=f"cache.update(layer_idx={layer_idx}, k, v, start_pos={start_pos})",
                start=start),
                   UPDATE_START)
        if not isinstance(layer_idx, int) or not 0 <= layer_idx < cfg.n_layers:
            c.fail(_("called cache.update with layer_idx={index}; layers are 0 .. {last}.")
                   .format(index=repr(layer_idx), last=cfg.n_layers - 1))
        self.calls.append((layer_idx, start_pos, t))
        return super().update(layer_idx, k, v, start_pos)


class _CacheHandle:
    """The cache as the learner's forward_with_cache sees it: `update(layer_idx, k, v,
    start_pos) -> (k_all, v_all)` and `max_seq_len`."""

    def __init__(self, cache: _RecordingCache):
        self.update = cache.update
        self.max_seq_len = cache.max_seq_len


def _plans(c: Check, thorough: bool) -> list[tuple]:
    """(label, cfg, batch, chunks [(start, end), ...], headline): prefill + decode steps; chunked
    prefill; MQA; with `thorough`, random chunkings."""
    plans = []
    cfg = _cfg(c, "gqa")
    batch, prompt = c.sizes(2, 2, 8)
    prompt += 2
    chunks = [(0, prompt)] + [(prompt + i, prompt + i + 1) for i in range(3)]
    plans.append((_("prefill, then 3 decode steps"), cfg, batch, chunks,
                  _("prefill, then one token per decode step")))
    cfg = _cfg(c, c.choice(["gqa", "mha"]), partial=True)
    a, b2 = c.sizes(2, 2, 6)
    batch = c.randint(1, 4)
    chunks = [(0, a), (a, a + b2), (a + b2, a + b2 + 1)]
    plans.append((_("chunked prefill ({a} then {b} tokens), then a decode step").format(
        a=a, b=b2), cfg, batch, chunks,
                  _("chunked prefill (bottom-right mask); rotary_dim < head_dim")))
    cfg = _cfg(c, "mqa", n_layers=3)
    a, b2 = c.sizes(2, 2, 6)
    chunks = [(0, a), (a, a + 1), (a + 1, a + 1 + b2), (a + 1 + b2, a + 2 + b2)]
    plans.append((_("MQA: prefill, decode, a chunk of {count}, decode").format(count=b2), cfg,
                  c.randint(1, 3), chunks, _("MQA (one KV head)")))
    for _n in range(2 if thorough else 0):
        cfg = _cfg(c, c.choice(["gqa", "mqa", "mha"]), partial=c.choice([False, True]))
        sizes = [c.randint(1, 6) for _n in range(4)]
        chunks, s = [], 0
        for n in sizes:
            chunks.append((s, s + n))
            s += n
        plans.append((_("random chunks {sizes}").format(sizes="+".join(map(str, sizes))), cfg,
                      c.randint(1, 4), chunks, _("random chunkings")))
    return plans


def _replay_error(tokens, params, cfg, batch, s_max, chunks, mistake: dict) -> str | None:
    """'Type: message' of the exception a mistake's replay raises (None: it runs)."""
    try:
        _replay(tokens, params, cfg, batch, s_max, chunks, mistake)
    except Exception as exc:  # noqa: BLE001 - the replay's own error is what is compared
        return f"{type(exc).__name__}: {exc}"
    return None


def _diagnose_raise(c: Check, err: LearnerError, tokens, params, cfg, batch, s_max,
                    chunks) -> None:
    """The learner's call `chunks[-1]` raised. Fail naming a square mask when that mistake raises
    there too and the learner's error names the same exception and the same sizes (T and
    start_pos + T); otherwise return, and the raw error is reported as it is."""
    s, e = chunks[-1]
    t = e - s
    if s == 0:
        return
    text = err.message.splitlines()[0]
    numbers = {int(n) for n in re.findall(r"\d+", text)}
    found = []
    for hint, mask in ((SQUARE_NEW, "square_new"), (SQUARE_ALL, "square_all")):
        raised = _replay_error(tokens, params, cfg, batch, s_max, chunks, dict(mask=mask))
        if raised is None or raised.split(":")[0] not in text:
            continue
        if raised in text:
            found = [hint]                      # the very same error: no doubt left
            break
        if {t, e} <= numbers:
            found.append(hint)
    if found:
        kind = _("decode") if t == 1 else _("chunk")
        c.fail(_("call {n} ({kind}: T={t} new tokens at start_pos={start}, so {keys} keys) "
                 "{error}").format(n=len(chunks), kind=kind, t=t, start=s, keys=e,
                                   error=err.summary()),
               found[0] if len(found) == 1 else SQUARE_EITHER)




def _diagnose_head_dim(c: Check, err: LearnerError, cfg) -> None:
    """The learner's call raised. Fail naming head_dim = H // N_h when the check's config sets
    head_dim apart and the error's sizes are those of heads that wide: split sizes N_h·(H // N_h)
    or (N_h + 2 N_kv)·(H // N_h), or a shape with H // N_h beside N_h; otherwise return."""
    wide = cfg.hidden_size // cfg.n_heads
    if wide == cfg.head_dim or err.error not in ("RuntimeError", "ValueError"):
        return
    numbers = {int(n) for n in re.findall(r"\d+", err.error_text)}
    sizes = {cfg.n_heads * wide, (cfg.n_heads + 2 * cfg.n_kv_heads) * wide}
    if numbers & sizes or ("shape" in err.error_text and {wide, cfg.n_heads} <= numbers):
        c.fail(_("{error} (the config's head_dim is {d}, while hidden_size // n_heads is {wide})")
               .format(error=err.summary(), d=cfg.head_dim, wide=wide), FORWARD_HEAD_DIM_FROM_H)
