"""Checks for chapter 13: the KV cache, prefill and decode, and generation.

Conventions (course-spec section 2): the cache stores K after RoPE and V, for the N_kv KV heads only
(not repeated), per layer [B, N_kv, S_max, D_h]; `update(l, k, v, start_pos)` writes positions
start_pos .. start_pos+T-1 and returns views of positions 0 .. start_pos+T-1; causal masks are
bottom-right aligned (a chunk of T queries against start_pos+T keys: query i sits at position
start_pos + i).

How the checks look inside:
- `KVCache`: the cache object's tensors are found by walking its attributes (lists, tuples and
  dicts included), right after construction; their storages must hold exactly 2 L B N_kv S_max D_h
  numbers, and every tensor `update` returns must live in one of those storages (a view). Wrong
  caches (wrong offset, own length counter, one buffer for all layers, ...) are simulated step by
  step alongside the learner's, so a wrong result can be matched to its mistake.
- `forward_with_cache`: the learner's function gets a handle whose `update` is the course's cache
  with a recorder (calls, start_pos, how many heads), and its logits are compared with the logits
  of the whole sequence computed without any cache (`checks.reference.generation.full_forward`).
  After each call the cache's contents are compared with the reference's (K after RoPE). Known
  mistakes are re-run from the first call with the mistake, from the earlier chapters' pieces.
- `forward_with_cache` raising: when the learner's call fails in a later chunk, the square-mask
  mistakes (`causal_mask(T)`, `causal_mask(start_pos + T)`) are replayed; if one raises there too
  and the learner's error names the same exception and sizes, the failure names that mask.
- `generate`: the token embedding table is handed over as a tensor subclass that counts the token
  ids looked up in it, call by call: with the cache, the prompt goes through once, every later
  call carries exactly one new token per sequence, and nothing is fed after the last new token
  (n tokens: the prefill and n - 1 decode steps); without it, one call per new token.
- `prefill_flops`, `decode_step_bytes`, `arithmetic_intensity`: exact numbers compared with the
  reference's counts (`checks.reference.generation`). Each known mistake is the count with one
  term changed, and every random case is drawn so that the mistakes give different numbers, so a
  wrong answer is named for what it is; LLaMA-2-7B's own numbers are among the cases.
- Every check runs on one CPU thread (`_one_thread`): the models are tiny, and on a busy machine
  two threads made a check many times slower.
- When `python -m checks grade` runs the learner's code in a worker process, the cache handle's
  `update` (a bound method) and the counting table's log (a callable of this package) stay in the
  grading process and are called back, so the forward_with_cache and generate checks see the
  same things there. The KVCache check needs the learner's object itself (its tensors, whether a
  result is a view): it runs where the class lives, in the notebook's kernel.
Random weights have unit-ish scale (attention is far from uniform, so position and mask mistakes
change the logits clearly), and greedy generation checks only use weights whose every greedy
choice wins by a clear margin, so that rounding can never flip a token.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import re

import torch
import torch.nn.functional as F

from . import reference as ref
from .config import LLAMA2_7B, ModelConfig
from .engine import Check, CheckFailure, LearnerError, NotStarted, builds_on
from .i18n import N_, _
from .reference import generation as gen
from .reference import roofline

# --------------------------------------------------------------------------------------------
# The mistakes this chapter diagnoses, in the words a failure shows.

NOT_PREALLOCATED = N_("the cache allocated no tensors when it was created: preallocate each "
                      "layer's K and V, [B, N_kv, max_seq_len, D_h], in __init__ (torch.zeros), "
                      "and write into them; growing the cache with torch.cat copies every cached "
                      "key at every step")
REPEATED_HEADS_ALLOC = N_("the cache holds N_h heads: it stores the N_kv KV heads only (not "
                          "repeated for every query head); that is the whole memory saving of GQA "
                          "(chapter 06)")
REPEATED_HEADS = N_("passed K/V with N_h heads (repeated for every query head) to cache.update: "
                    "the cache stores the N_kv KV heads only, and grouped_query_attention shares "
                    "them among the query heads by itself")
CFG_MAX_LEN = N_("sized the cache with cfg.max_seq_len; use the max_seq_len argument (a generation "
                 "needs only P + max_new_tokens positions)")
ONE_LAYER = N_("allocated K and V for one layer only: every layer keeps its own cache")
K_ONLY = N_("allocated room for K only (or K and V sharing a buffer): K and V are stored "
            "separately")
COPY = N_("returned a copy ({what} lives in new memory), not a view of the preallocated buffer: "
          "slice it, `buffer[:, :, :start_pos + T]`; torch.cat, .clone() or indexing with a list "
          "copies every cached position at every step")
REALLOCATED = N_("replaced its buffers during update (new tensors after the call): write into the "
                 "preallocated tensors in place (`buffer[:, :, start_pos:start_pos + T] = k`)")
OFFSET_PLUS_ONE = N_("wrote the new K/V one position too far (at start_pos + 1): the T new tokens "
                     "occupy positions start_pos .. start_pos+T-1")
AT_ZERO = N_("wrote the new K/V at position 0 every time: write them at start_pos .. start_pos+T-1")
OWN_COUNTER = N_("kept a length counter of its own and ignored start_pos: the caller says where "
                 "the new tokens go (which also lets it overwrite, to rewind a generation)")
SHARED_COUNTER = N_("advanced one position counter on every update, for all layers together: all "
                    "L layers write the same positions start_pos .. start_pos+T-1, each in its own "
                    "buffer")
SHARED_BUFFER = N_("all layers share one buffer: each layer needs its own K and V")
NEW_ONLY = N_("returned only the new K/V ([B, N_kv, T, D_h]): return every position so far, "
              "0 .. start_pos+T-1, which the new queries attend to")
WHOLE_BUFFER = N_("returned the whole preallocated buffer (max_seq_len positions, empty slots "
                  "included): slice it to the filled part, 0 .. start_pos+T-1")
UP_TO_START = N_("returned positions 0 .. start_pos-1, without the tokens just written")
ONE_SHORT = N_("returned one position too few: positions 0 .. start_pos+T-1 are start_pos+T of "
               "them")
SWAPPED = N_("returned (values, keys): update returns (k_all, v_all), keys first")
NO_OVERFLOW = N_("wrote past max_seq_len without raising: check `start_pos + T > max_seq_len` and "
                 "raise ValueError (slicing silently stops at the end of the buffer)")
WRONG_ERROR = N_("raised {name} on overflow; raise ValueError with a message that names the "
                 "positions and max_seq_len")
FULL_IS_FINE = N_("raised an error when writing exactly up to the last position: the cache holds "
                  "positions 0 .. max_seq_len-1, so only start_pos + T > max_seq_len overflows "
                  "(use `>`, not `>=`)")
DTYPE_IGNORED = N_("ignored the dtype argument: allocate the buffers with dtype=dtype")

NO_OFFSET = N_("decode positions not offset: rotated the new tokens by positions 0 .. T-1 "
               "(torch.arange(T)); they sit at start_pos .. start_pos+T-1, so "
               "positions = torch.arange(start_pos, start_pos + T)")
TOP_LEFT = N_("causal mask top-left aligned (`causal_mask(T)` or `tril(ones(T, S_k))`): the T new "
              "queries are the LAST T of the start_pos+T keys, so query i sits at position "
              "start_pos + i; use the bottom-right mask causal_mask(T, start_pos + T)")
SQUARE_NEW = N_("built the mask with causal_mask(T): a [T, T] square, while the T new queries meet "
                "start_pos + T keys (the scores are [T, start_pos + T]); use the bottom-right "
                "causal_mask(T, start_pos + T). A decode step hides the mistake: there a [1, 1] "
                "mask broadcasts")
SQUARE_ALL = N_("built the mask with causal_mask(start_pos + T): one row per key, while only the T "
                "new tokens are queries (the scores are [T, start_pos + T]); use the bottom-right "
                "causal_mask(T, start_pos + T)")
SQUARE_EITHER = N_("a square causal mask against a longer cache (causal_mask(T) or "
                   "causal_mask(start_pos + T)): the scores of T new queries against the "
                   "start_pos + T keys are [T, start_pos + T]; use causal_mask(T, start_pos + T)")
NO_MASK = N_("no causal mask: within a chunk of several new tokens each may attend only up to its "
             "own position; pass causal_mask(T, start_pos + T)")
IGNORED_CACHE = N_("ignored the cache: attended to the new tokens' own K and V only; attend to the "
                   "(k_all, v_all) that cache.update returns, every position so far")
UNROTATED_STORED = N_("the cache stores K before RoPE: rotate K by its positions first, then store "
                      "it (the rotated keys never change, so each is rotated exactly once)")
UNROTATED_RECOMPUTED = N_("the cache stores K before RoPE (and every cached key is rotated again "
                          "at every step): rotate the new K first, then store it; cached keys are "
                          "already rotated and are used as they are")
NOT_ADVANCED = N_("cache not advanced: every decode step used start_pos = P, so each new token "
                  "overwrote the previous one's slot; the token generated at step t sits at "
                  "position P + t")
SKIPPED_SLOT = N_("start_pos one too far in the decode steps (P + t + 1): the token generated at "
                  "step t sits at position P + t, the slot right after the previous one")
FIRST_POSITION = N_("took the logits of the first position after the prefill: the next token comes "
                    "from the LAST position's logits, logits[:, -1]")
RECOMPUTED = N_("recomputed the whole sequence each step: with use_cache=True, feed only the "
                "newest token (one per sequence) at start_pos = its position; the cache holds the "
                "keys and values of everything before it")
PREFILL_BY_TOKEN = N_("pushed the prompt through one token at a time: prefill runs the whole "
                      "prompt in one call, forward_with_cache(prompt_ids, ..., start_pos=0)")
NEW_TOKENS_ONLY = N_("returned only the new tokens: return the prompt followed by them, [B, P + n]")
WASTED_FORWARD = N_("fed the last new token back through the model: its logits are never used, so "
                    "that forward pass is wasted (a whole pass over every weight); n new tokens "
                    "need the prefill and n - 1 decode steps; stop the loop once the last token is "
                    "chosen")
WASTED_FORWARD_UNCACHED = N_("fed the last new token back through the model: its logits are never "
                             "used, so that pass is wasted; without the cache, n new tokens need n "
                             "passes (over P, P + 1, ..., P + n - 1 tokens)")
ONE_TOO_MANY = N_("generated max_new_tokens + 1 tokens")
ONE_TOO_FEW = N_("generated max_new_tokens - 1 tokens")

SCALE_BY_H = N_("scaled the scores by 1/sqrt(H) = 1/sqrt(N_h * D_h), the width of all heads "
                "together; each head scales its scores by 1/sqrt(D_h), its own width "
                "(cfg.head_dim)")

_FORWARD_HINT = N_("this exercise asks you to write the cached forward pass yourself from the "
                   "earlier chapters' pieces (rms_norm, split_qkv, apply_rope, "
                   "grouped_query_attention, causal_mask, swiglu_ffn), not to call the course's "
                   "finished {name}")


# --------------------------------------------------------------------------------------------
# Small helpers


def _one_thread(check):
    """Run a check on one CPU thread. Its models are tiny, so their time goes into the fixed cost
    of each operation, which more threads do not shorten; on a busy machine the threads of each
    small operation also wait for one another (measured beside two busy processes on 2 cores:
    check_generate took 0.8 s on one thread, 28 s on two). The caller's setting comes back after."""
    @functools.wraps(check)
    def run(*args, **kwargs):
        saved = torch.get_num_threads()
        if saved == 1:
            return check(*args, **kwargs)
        torch.set_num_threads(1)
        try:
            return check(*args, **kwargs)
        finally:
            torch.set_num_threads(saved)
    return run






@contextlib.contextmanager
def _calling(c: Check, fn):
    """Let `c.call` call `fn` (a method of the learner's object) instead of the exercise itself."""
    saved = c.fn
    c.fn = fn
    try:
        yield
    finally:
        c.fn = saved


def _no_reference(c: Check, *fns) -> None:
    """Make `c.call` fail if the learner's function runs the course's own answer (`fns`)."""
    c.forbid_functions(fns, _(_FORWARD_HINT))



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
    h = n_h * d
    return ModelConfig(vocab_size=c.randint(40, 70), hidden_size=h, n_heads=n_h,
                       n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=2 * h + c.randint(1, 9),
                       n_layers=n_layers, rope_base=c.choice([100.0, 10000.0]),
                       rotary_dim=d - 2 if partial else d, norm_eps=1e-5,
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
                 store_rotated=True, rerotate=False, use_cache=True, scale_width=False):
    """forward_with_cache with the named mistake (no keyword: the correct computation).

    offset=False: RoPE positions 0..T-1; mask: "bottom_right", "top_left", "none", or a square
    mask that cannot fit a later chunk's scores: "square_new" (causal_mask(T)) or "square_all"
    (causal_mask(start_pos + T));
    store_rotated=False: K goes into the cache before RoPE (and is used from there as it is,
    or, with rerotate, rotated again by 0..end-1); use_cache=False: attends to the new tokens only;
    scale_width: the scores divided by sqrt(H) (here N_h * D_h), not by sqrt(D_h).
    """
    b, t = token_ids.shape
    end = start_pos + t
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pos = torch.arange(start_pos, end) if offset else torch.arange(t)
    rope = dict(base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    x = F.embedding(token_ids, params["embed"])
    for i, layer in enumerate(params["layers"]):
        h = ref.rms_norm(x, layer["attn_norm"], cfg.norm_eps)
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
        if scale_width:  # (q / sqrt(N_h)) k^T / sqrt(D_h) = q k^T / sqrt(N_h * D_h)
            q = q / math.sqrt(n_h)
        out = ref.grouped_query_attention(q, k_all, v_all, m)
        x = x + ref.merge_heads(out) @ layer["wo"]
        x = x + ref.swiglu_ffn(ref.rms_norm(x, layer["ffn_norm"], cfg.norm_eps),
                               layer["w_gate"], layer["w_up"], layer["w_down"])
    return ref.rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"]


_FORWARD_MISTAKES = {
    NO_OFFSET: dict(offset=False),
    TOP_LEFT: dict(mask="top_left"),
    NO_MASK: dict(mask="none"),
    IGNORED_CACHE: dict(use_cache=False),
    UNROTATED_STORED: dict(store_rotated=False),
    UNROTATED_RECOMPUTED: dict(store_rotated=False, rerotate=True),
    SCALE_BY_H: dict(scale_width=True),
}


def _replay(tokens, params, cfg, batch, s_max, chunks, mistake: dict) -> tuple[list, gen.KVCache]:
    """Run the calls `chunks` [(start, end), ...] with a mistake; (logits per call, the cache)."""
    cache = gen.KVCache(cfg, batch, s_max)
    with torch.no_grad():
        out = [_sim_forward(tokens[:, s:e], params, cfg, cache, s, **mistake) for s, e in chunks]
    return out, cache


# --------------------------------------------------------------------------------------------
# Exercise 1: KVCache


def _storages(obj, depth: int = 0, seen: set | None = None) -> dict[int, torch.Tensor]:
    """The floating-point tensors reachable from obj's attributes, one per distinct storage."""
    seen = set() if seen is None else seen
    found: dict[int, torch.Tensor] = {}
    if id(obj) in seen or depth > 5:
        return found
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            found[obj.untyped_storage().data_ptr()] = obj
        return found
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and \
            type(obj).__module__.split(".")[0] not in ("torch", "builtins"):
        items = list(vars(obj).values())
    else:
        return found
    for item in items:
        found.update(_storages(item, depth + 1, seen))
    return found


def _numbers_held(storages: dict[int, torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() // t.element_size() for t in storages.values())


def tensor_nbytes(obj) -> int:
    """Bytes of memory held by the floating-point tensors reachable from obj's attributes (lists,
    tuples and dicts included), each underlying storage counted once: what a cache object costs."""
    return sum(t.untyped_storage().nbytes() for t in _storages(obj).values())


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
    SWAPPED: "swapped",
}


def _construct(c: Check, cls, cfg, batch, s_max, **kwargs):
    cache = c.call(cfg, batch, s_max, **kwargs)
    if isinstance(cache, ref.KVCache):
        c.fail(_("KVCache is (or derives from) the course's reference checks.reference.KVCache."),
               _("write the cache yourself: preallocated tensors and an update method"))
    if not callable(getattr(cache, "update", None)):
        c.fail(_("KVCache(...) has no update method (got {kind}).").format(
            kind=type(cache).__name__),
               _("define `def update(self, layer_idx, k, v, start_pos)` in the class"))
    return cache


def _check_allocation(c: Check, cache, cfg, batch, s_max, dtype) -> dict[int, torch.Tensor]:
    storages = _storages(cache)
    held = _numbers_held(storages)
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
    }
    hint = next((m for m, n in mixups.items() if n == held), None)
    c.fail(_("the cache's tensors hold {held} numbers; expected 2·L·B·N_kv·S_max·D_h = {want} "
             "({sizes}).").format(held=held, want=want, sizes=sizes), hint)
    return storages


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
        c.expect_tensor(t, want, what=_("{what} from {call}").format(what=what, call=label),
                        dims=dims,
                        wrong={m: (lambda s=s, i=i: s.last[i]) for m, s in sims.items()})
    if set(_storages(cache)) != set(storages):
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
                   NEW_ONLY if same else _(COPY).format(what=what))


@_one_thread
def check_KVCache(cls, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("KVCache", cls, seed=seed) as c:
        for trial in range(3 if thorough else 1):
            n_layers = c.randint(2, 4)
            cfg = _cfg(c, "gqa", n_layers=n_layers, max_seq_len=c.randint(70, 90))
            batch, prompt, extra = c.sizes(3, 2, 7)
            s_max = prompt + 3 + 2 + extra + 4      # prefill, 3 decodes, a chunk of 2, room
            cache = _construct(c, cls, cfg, batch, s_max)
            storages = _check_allocation(c, cache, cfg, batch, s_max, torch.float32)
            c.headline(_("preallocated: 2·L·B·N_kv·S_max·D_h numbers, N_kv heads only"))
            sims = {m: _SimCache(mode, n_layers, batch, cfg.n_kv_heads, s_max, cfg.head_dim)
                    for m, mode in _CACHE_MISTAKES.items()}
            # The expected contents: what was written last at every position, per layer.
            kv = torch.zeros(n_layers, 2, batch, cfg.n_kv_heads, s_max, cfg.head_dim)

            def step(start: int, t: int) -> None:
                for layer in range(n_layers):
                    k = c.randn(batch, cfg.n_kv_heads, t, cfg.head_dim)
                    v = c.randn(batch, cfg.n_kv_heads, t, cfg.head_dim)
                    kv[layer, 0, :, :, start:start + t] = k
                    kv[layer, 1, :, :, start:start + t] = v
                    end = start + t
                    _expect_update(c, cache, storages, sims, layer, k, v, start,
                                   kv[layer, 0, :, :, :end], kv[layer, 1, :, :, :end], s_max)

            step(0, prompt)                                 # prefill
            c.headline(_("prefill writes positions 0..P-1 of every layer"))
            for i in range(3):                              # decode steps
                step(prompt + i, 1)
            c.headline(_("decode steps write at start_pos and return views of 0..start_pos"))
            step(prompt + 3, 2)                             # a chunk of two
            step(prompt + 2, 2)                             # rewind: overwrite from start_pos
            c.headline(_("writes where start_pos says (rewinding too)"))
            # Fill exactly to the end (every position written, none skipped): allowed.
            start = prompt + 4
            try:
                step(start, s_max - start)
            except LearnerError as err:
                if "ValueError" in err.message.splitlines()[0]:
                    c.fail(_("update raised ValueError when writing positions {first}..{last} "
                             "of a cache with max_seq_len={size}.").format(
                        first=start, last=s_max - 1, size=s_max), FULL_IS_FINE)
                raise
            # Overflow: must raise ValueError.
            for start, t in ((s_max - 1, 2), (s_max, 1)):
                k = c.randn(batch, cfg.n_kv_heads, t, cfg.head_dim)
                label = _("{call} with T={t} on a cache with max_seq_len={size}").format(
                    call=f"update(0, k, v, start_pos={start})", t=t, size=s_max)
                try:
                    cache.update(0, k, k.clone(), start)
                except ValueError:
                    continue
                except NotImplementedError:
                    raise NotStarted("KVCache") from None
                except Exception as exc:
                    c.fail(_("{call} raised {error}: {text}").format(
                        call=label, error=type(exc).__name__, text=exc),
                           _(WRONG_ERROR).format(name=type(exc).__name__))
                c.fail(_("{call} did not raise.").format(call=label), NO_OVERFLOW)
            c.headline(_("overflowing max_seq_len raises ValueError"))
        # dtype and device arguments; MQA (one KV head).
        cfg = _cfg(c, "mqa", n_layers=2)
        for dtype in ([torch.float64, torch.bfloat16] if thorough else [torch.float64]):
            batch, s_max = c.sizes(2, 2, 9)
            cache = _construct(c, cls, cfg, batch, s_max, dtype=dtype, device="cpu")
            storages = _check_allocation(c, cache, cfg, batch, s_max, dtype)
            sims = {}
            k = c.randn(batch, 1, 2, cfg.head_dim, dtype=dtype)
            v = c.randn(batch, 1, 2, cfg.head_dim, dtype=dtype)
            got = _update(c, cache, 1, k, v, 0)
            if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.Tensor) \
                    and got[0].dtype != dtype:
                c.fail(_("with dtype={dtype} update returned {got} keys.").format(
                    dtype=dtype, got=got[0].dtype), DTYPE_IGNORED)
            _expect_update(c, cache, storages, sims, 0, k, v, 0, k, v, s_max)
        c.headline(_("dtype and device arguments; MQA"))


# --------------------------------------------------------------------------------------------
# Exercise 2: forward_with_cache


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
                   REPEATED_HEADS if heads == cfg.n_heads else
                   _("pass K and V heads-first, [B, N_kv, T, D_h] (split_qkv gives that "
                     "layout)"))
        if tuple(k.shape) != tuple(v.shape) or k.shape[2] != t or k.shape[3] != cfg.head_dim:
            c.fail(_("{call} got k {k} and v {v}; expected [B, N_kv, T, D_h] with T={t}, the "
                     "new tokens.").format(call=f"cache.update(layer_idx={layer_idx}, ...)",
                                           k=list(k.shape), v=list(v.shape), t=t))
        if start_pos != start:
            c.fail(_("called {call} in a call with start_pos={start}.").format(
                call=f"cache.update(layer_idx={layer_idx}, k, v, start_pos={start_pos})",
                start=start),
                   _("the new tokens' K and V go to positions start_pos .. start_pos+T-1: pass "
                     "the start_pos you were given"))
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


class _Recorder:
    """A callable log. A checks object, so it stays in the grading process when the learner's
    code runs in a worker (each call comes back as a callback)."""

    def __init__(self):
        self.items: list = []

    def __call__(self, item) -> None:
        self.items.append(item)


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
    except Exception as exc:
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


@_one_thread
def check_forward_with_cache(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("forward_with_cache", f, seed=seed) as c:
        _no_reference(c, gen.forward_with_cache, gen.generate)
        for label, cfg, batch, chunks, headline in _plans(c, thorough):
            params = _params(c, cfg)
            total = chunks[-1][1]
            s_max = total + c.randint(1, 5)
            tokens = c.randint(0, cfg.vocab_size, (batch, total))
            with torch.no_grad():
                full = gen.full_forward(tokens, params, cfg)
            mine = _RecordingCache(c, cfg, batch, s_max)
            handle = _CacheHandle(mine)
            theirs = gen.KVCache(cfg, batch, s_max)
            for n, (s, e) in enumerate(chunks):
                t = e - s
                mine.expected, mine.calls = (s, t), []
                ids = tokens[:, s:e].clone()
                with torch.no_grad():
                    try:
                        got = c.call(ids, params, cfg, handle, s)
                    except LearnerError as err:
                        if mine.failure is not None:
                            raise mine.failure from None
                        _diagnose_raise(c, err, tokens, params, cfg, batch, s_max, chunks[:n + 1])
                        raise
                    except CheckFailure:
                        if mine.failure is not None:
                            raise mine.failure from None
                        raise
                    if mine.failure is not None:   # a diagnosis the learner's code swallowed
                        raise mine.failure
                    gen.forward_with_cache(ids, params, cfg, theirs, s)
                if not torch.equal(ids, tokens[:, s:e]):
                    c.fail(_("changed token_ids in place."))
                layers = sorted(layer for layer, _s, _t in mine.calls)
                if layers != list(range(cfg.n_layers)):
                    missing = sorted(set(range(cfg.n_layers)) - set(layers))
                    c.fail(_("in the call with start_pos={start} (T={t}) cache.update was called "
                             "for layers {layers}; expected each of the {count} layers once.")
                           .format(start=s, t=t, layers=layers, count=cfg.n_layers),
                           _("layer {layer}'s K and V never reached the cache: call "
                             "cache.update(layer_idx, k, v, start_pos) once in every layer")
                           .format(layer=missing[0])
                           if missing else _("call cache.update once per layer and call"))
                done = chunks[:n + 1]
                kind = _("prefill") if s == 0 else _("decode") if t == 1 else _("chunk")
                what = _("logits of call {n} ({kind}: T={t} new tokens at start_pos={start}; "
                         "{case})").format(n=n + 1, kind=kind, t=t, start=s, case=label)

                def variant(mistake, done=done):
                    return _replay(tokens, params, cfg, batch, s_max, done, mistake)[0][-1]

                c.expect_tensor(got, full[:, s:e], what=what, dims=("B", "T", "V"),
                                wrong={m: (lambda m=m: variant(_FORWARD_MISTAKES[m]))
                                       for m in _FORWARD_MISTAKES})
                # What the call left in the cache: K after RoPE and V, positions 0 .. e-1.
                for layer in range(cfg.n_layers):
                    for i, name in ((0, "K"), (1, "V")):
                        c.expect_tensor(
                            mine.storage[layer, i, :, :, :e].clone(),
                            theirs.storage[layer, i, :, :, :e],
                            what=_("the cache's {name} of layer {layer}, positions 0..{last}, "
                                   "after call {n} ({case})").format(
                                name=name, layer=layer, last=e - 1, n=n + 1, case=label),
                            dims=("B", "N_kv", "S", "D_h"),
                            wrong={m: (lambda m=m, layer=layer, i=i, done=done: _replay(
                                tokens, params, cfg, batch, s_max, done,
                                _FORWARD_MISTAKES[m])[1].storage[layer, i, :, :, :e])
                                for m in (UNROTATED_RECOMPUTED, UNROTATED_STORED)})
            c.headline(headline)
        c.headline(_("logits equal the uncached forward pass over the whole sequence"))
        c.headline(_("the cache holds K after RoPE and V, N_kv heads"))


# --------------------------------------------------------------------------------------------
# Exercise 3: generate


class _CountingTable(torch.Tensor):
    """The embedding table, counting the token ids looked up in it (one entry per lookup call).

    Lookups seen: `table[ids]`, `F.embedding(ids, table)`, `torch.embedding`, `index_select`,
    `one_hot @ table`. Results of other operations with the table's shape (`.to`, `.contiguous`
    ...) count too; everything else comes back as a plain tensor.
    """

    _log: "_Recorder"

    @staticmethod
    def wrap(data: torch.Tensor, log: "_Recorder") -> "_CountingTable":
        table = torch.Tensor._make_subclass(_CountingTable, data.detach(), False)
        table._log = log
        return table

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        table = next((a for a in list(args) + list(kwargs.values())
                      if isinstance(a, _CountingTable)), None)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
            n = _looked_up(func, args, kwargs)
            if table is not None and n is not None:
                table._log(n)
            elif (table is not None and isinstance(out, torch.Tensor) and out is not table
                  and out.shape == table.shape):
                out = cls.wrap(out, table._log)
            elif isinstance(out, _CountingTable) and out is not table:
                out = out.as_subclass(torch.Tensor)
        return out


def _ids_count(ids) -> int | None:
    if isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.dtype != torch.bool:
        return ids.numel()
    if isinstance(ids, (list, tuple)) and ids and all(isinstance(i, int) for i in ids):
        return len(ids)
    return None


def _looked_up(func, args, kwargs) -> int | None:
    """How many token ids this call looks up in the table (None: not a lookup)."""
    def arg(i, name):
        return args[i] if len(args) > i else kwargs.get(name)

    first = arg(0, "input")
    if func is F.embedding:
        return _ids_count(first)
    if func is torch.embedding:
        return _ids_count(arg(1, "indices"))
    if func is torch.Tensor.__getitem__ and isinstance(first, _CountingTable):
        index = args[1]
        if isinstance(index, tuple):
            index = index[0] if index else None
        return _ids_count(index)
    if func in (torch.index_select, torch.Tensor.index_select) and \
            isinstance(first, _CountingTable):
        return _ids_count(arg(2, "index"))
    if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
                torch.Tensor.mm) and len(args) > 1 and \
            isinstance(args[1], _CountingTable) and isinstance(first, torch.Tensor):
        return math.prod(first.shape[:-1])
    return None


def _counting_params(params: dict, log: _Recorder) -> dict:
    return {**params, "embed": _CountingTable.wrap(params["embed"], log)}


_GENERATE_MISTAKES = {
    NOT_ADVANCED: dict(advance=0),
    SKIPPED_SLOT: dict(advance=2),
    FIRST_POSITION: dict(first=True),
    NO_OFFSET: dict(forward=_FORWARD_MISTAKES[NO_OFFSET]),
    TOP_LEFT: dict(forward=_FORWARD_MISTAKES[TOP_LEFT]),
    UNROTATED_STORED: dict(forward=_FORWARD_MISTAKES[UNROTATED_STORED]),
    IGNORED_CACHE: dict(forward=_FORWARD_MISTAKES[IGNORED_CACHE]),
}


def _sim_generate(params, cfg, prompt, n, *, advance=1, first=False, forward=None):
    """Greedy generation with the named mistake (advance: how far start_pos moves per step,
    0 = stuck at P, 2 = one slot too far; first: next token from position 0 after prefill)."""
    forward = forward or {}
    b, p = prompt.shape
    out = torch.cat([prompt, torch.zeros(b, n, dtype=torch.long)], dim=1)
    cache = gen.KVCache(cfg, b, p + 2 * n + 1)
    with torch.no_grad():
        logits = _sim_forward(prompt, params, cfg, cache, 0, **forward)
        row = logits[:, 0] if first else logits[:, -1]
        for step in range(n):
            out[:, p + step] = row.argmax(-1)
            if step + 1 < n:
                start = p + (step if advance == 1 else 0 if advance == 0 else step + 1)
                row = _sim_forward(out[:, p + step:p + step + 1], params, cfg, cache, start,
                                   **forward)[:, -1]
    return out


def _greedy_margin(params, cfg, seq: torch.Tensor, p: int) -> float:
    """The smallest gap between the best and second-best logit over the greedy choices."""
    with torch.no_grad():
        logits = gen.full_forward(seq, params, cfg)[:, p - 1:-1]
    top = logits.topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min()) if top.numel() else math.inf


def _scenario(c: Check, kind: str, batch: int, p: int, n: int):
    """cfg, params, prompt and the reference's greedy output, drawn until every greedy choice wins
    by a clear margin and the main mistakes would give other tokens (so none goes unnoticed)."""
    for _n in range(40):
        cfg = _cfg(c, kind)
        params = _params(c, cfg)
        prompt = c.randint(0, cfg.vocab_size, (batch, p))
        want = gen.generate(params, cfg, prompt, n)
        if n and _greedy_margin(params, cfg, want, p) < 1e-3:
            continue
        if n > 1 and any(torch.equal(_sim_generate(params, cfg, prompt, n, **_GENERATE_MISTAKES[m]),
                                     want) for m in (NOT_ADVANCED, SKIPPED_SLOT, NO_OFFSET)):
            continue
        return cfg, params, prompt, want
    return cfg, params, prompt, want


def _generate_mixups(params, cfg, prompt, n, want) -> dict:
    mixups = {m: (lambda kw=kw: _sim_generate(params, cfg, prompt, n, **kw))
              for m, kw in _GENERATE_MISTAKES.items()}
    p = prompt.shape[1]
    mixups[NEW_TOKENS_ONLY] = want[:, p:]
    mixups[ONE_TOO_MANY] = lambda: gen.generate(params, cfg, prompt, n + 1)
    mixups[ONE_TOO_FEW] = lambda: gen.generate(params, cfg, prompt, max(n - 1, 0))
    return mixups


def _check_steps(c: Check, log: list[int], batch: int, p: int, n: int, label: str) -> None:
    """With the cache: one prefill call over the prompt, then exactly `batch` tokens per call."""
    if not log:
        c.fail(_("{call}: the check saw no token embeddings being read from params['embed'].")
               .format(call=label),
               _("look the tokens up with params['embed'][token_ids] or F.embedding(token_ids, "
                 "params['embed']) (or chapter 02's embed), which the check can count"))
    shown = ", ".join(map(str, log[:8])) + (", ..." if len(log) > 8 else "")
    seen = _("tokens looked up per forward call: {counts}").format(counts=f"[{shown}]")
    first, rest = log[0], log[1:]
    if first < batch * (p - 1):
        hint = PREFILL_BY_TOKEN if first == batch else None
        c.fail(_("{call}: the first forward call fed {count} tokens; the prefill feeds the whole "
                 "prompt, B·P = {b}·{p} = {total} ({seen}).").format(
            call=label, count=first, b=batch, p=p, total=batch * p, seen=seen), hint)
    if first > batch * p:
        c.fail(_("{call}: the first forward call fed {count} tokens, more than the prompt's "
                 "B·P = {total} ({seen}).").format(call=label, count=first, total=batch * p,
                                                   seen=seen))
    over = [(i, m) for i, m in enumerate(rest, 1) if m != batch]
    if over:
        i, m = over[0]
        grows = len(rest) > 1 and all(b > a for a, b in zip(rest, rest[1:]))
        c.fail(_("{call}: decode call {i} fed {count} tokens; with the cache each decode step "
                 "feeds exactly one new token per sequence, B = {b} ({seen}).").format(
            call=label, i=i, count=m, b=batch, seen=seen),
               RECOMPUTED if grows or m >= batch * p else None)
    steps = len(rest) - (first == batch * (p - 1) != batch * p)   # fed the last prompt token late
    if steps != n - 1 and n > 0:
        c.fail(_("{call}: {calls} forward calls for {n} new tokens ({seen}); expected the "
                 "prefill and then {steps} decode steps (the last new token is never fed back).")
               .format(call=label, calls=len(log), n=n, seen=seen, steps=n - 1),
               WASTED_FORWARD if steps == n else None)


def _check_uncached_calls(c: Check, log: list[int], n: int, label: str) -> None:
    """Without the cache: one forward pass per new token, none after the last."""
    if len(log) > n:
        shown = ", ".join(map(str, log[:8])) + (", ..." if len(log) > 8 else "")
        c.fail(_("{call}: {calls} forward calls for {n} new tokens (tokens looked up per call: "
                 "{counts}); expected {n}, one per new token.").format(
            call=label, calls=len(log), n=n, counts=f"[{shown}]"),
               WASTED_FORWARD_UNCACHED if len(log) == n + 1 else None)


@_one_thread
def check_generate(f, *, seed: int | None = None, thorough: bool = False) -> None:
    earlier = {"KVCache": check_KVCache, "forward_with_cache": check_forward_with_cache}
    with builds_on("generate", earlier), Check("generate", f, seed=seed) as c:
        _no_reference(c, gen.generate)
        batch, p = c.sizes(2, 2, 5)
        trials = [("gqa", batch, p + 2, c.randint(5, 8)), ("mqa", 1, c.randint(2, 6),
                                                           c.randint(4, 7))]
        for _n in range(2 if thorough else 0):
            trials.append((c.choice(["gqa", "mha", "mqa"]), c.randint(1, 4), c.randint(1, 7),
                           c.randint(2, 9)))
        for kind, batch, p, n in trials:
            cfg, params, prompt, want = _scenario(c, kind, batch, p, n)
            mixups = _generate_mixups(params, cfg, prompt, n, want)
            dims = ("B", "P + max_new_tokens")
            log = _Recorder()
            before = prompt.clone()
            label = f"generate(params, cfg, prompt [B={batch}, P={p}], max_new_tokens={n})"
            got = c.call(_counting_params(params, log), cfg, prompt, n)
            if not torch.equal(prompt, before):
                c.fail(_("{call} changed prompt_ids in place.").format(call=label),
                       _("write the tokens into a new tensor"))
            c.expect_tensor(got, want,
                            what=_("{call} (greedy, with the cache)").format(call=label), dims=dims,
                            wrong=mixups)
            _check_steps(c, log.items, batch, p, n, label)
            log = _Recorder()
            got = c.call(_counting_params(params, log), cfg, prompt, n, use_cache=False)
            c.expect_tensor(got, want, what=_("{call} (greedy)").format(
                call=f"{label[:-1]}, use_cache=False)"),
                            dims=dims, wrong=mixups)
            _check_uncached_calls(c, log.items, n, f"{label[:-1]}, use_cache=False)")
        c.headline(_("greedy tokens identical with and without the cache"))
        c.headline(_("one prefill over the prompt, then one new token per sequence per step; "
                     "no forward pass after the last token"))
        # Edge cases: nothing to generate; a single token (the prefill alone).
        cfg, params, prompt, _want = _scenario(c, "gqa", 2, 3, 0)
        for n in (0, 1):
            want = gen.generate(params, cfg, prompt, n)
            log = _Recorder()
            got = c.call(_counting_params(params, log), cfg, prompt, n)
            c.expect_tensor(got, want, what=_("{call} (greedy)").format(
                call=f"generate(..., max_new_tokens={n})"),
                            dims=("B", "P + max_new_tokens"),
                            wrong=_generate_mixups(params, cfg, prompt, n, want))
            if n == 1:
                _check_steps(c, log.items, 2, 3, 1, "generate(..., max_new_tokens=1)")
            elif log.items:
                c.fail(_("generate(..., max_new_tokens=0) ran {calls} forward call(s) (tokens "
                         "looked up per call: {counts}).").format(calls=len(log.items),
                                                                counts=log.items[:8]),
                       _("with nothing to generate, no forward pass is needed: return the "
                         "prompt"))
        c.headline(_("max_new_tokens = 0 and 1"))
        _check_sampling(c)
        c.note(_("temperature > 0 samples, reproducibly with the generator"))


def _check_sampling(c: Check) -> None:
    """temperature > 0: reproducible with the generator, the generator really used, not greedy."""
    cfg, params, prompt, _want = _scenario(c, "gqa", 2, 3, 0)
    n = 8
    greedy = gen.generate(params, cfg, prompt, n)
    label = "generate(..., temperature=1.5, generator=g)"
    outs = []
    for attempt in range(3):
        seed = 1000 + attempt + c.randint(0, 10**6)
        runs = []
        for other in (11, 12):
            with torch.random.fork_rng():
                torch.manual_seed(other)     # the global RNG differs between the two runs
                g = torch.Generator().manual_seed(seed)
                runs.append(c.call(params, cfg, prompt, n, temperature=1.5, generator=g))
        a, b = runs
        if not isinstance(a, torch.Tensor) or a.shape != greedy.shape or a.dtype != torch.long:
            c.expect_tensor(a, greedy, what=label, dims=("B", "P + max_new_tokens"))
        if not torch.equal(a[:, :prompt.shape[1]], prompt):
            c.fail(_("{call} does not start with the prompt.").format(call=label))
        if int(a.min()) < 0 or int(a.max()) >= cfg.vocab_size:
            c.fail(_("{call} produced token ids outside 0 .. {last}.").format(
                call=label, last=cfg.vocab_size - 1))
        if not torch.equal(a, b):
            c.fail(_("{call}: two runs with generators seeded alike gave different tokens.")
                   .format(call=label),
                   _("pass `generator` on to the sampler (sample_next_token(..., "
                     "generator=generator)); the global random state must not matter"))
        outs.append(a)
    if all(torch.equal(o, greedy) for o in outs):
        c.fail(_("{call} gave the greedy tokens three times out of three.").format(call=label),
               _("pass `temperature` on to the sampler: temperature 0 is greedy, above 0 it "
                 "samples from softmax(logits / temperature)"))


# --------------------------------------------------------------------------------------------
# Exercises 4-6: the roofline's arithmetic. A multiply-add counts as 2 FLOPs; the chapter's text
# defines what each count includes, and `checks.reference.generation` holds the answers.

_COUNT_HINT = N_("this exercise asks you to write the formula yourself; the course's {name} (in "
                 "checks.reference) is what your answer is compared with")


def _roofline_cfg(c: Check) -> ModelConfig:
    """Sizes that tell the mistakes apart: distinct, GQA (N_kv >= 2, G >= 2), and a head_dim
    other than H / N_h, so that N_h·D_h, N_kv·D_h and H are three different numbers."""
    n_kv, g = c.sizes(2, 2, 5)
    n_h = n_kv * g
    d = c.choice([6, 10, 14])
    h = c.choice([40, 56, 72])
    return ModelConfig(vocab_size=c.randint(300, 900), hidden_size=h, n_heads=n_h,
                       n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=c.randint(100, 200),
                       n_layers=c.randint(3, 7), max_seq_len=4096)


def _prefill_count(cfg: ModelConfig, b: int, p: int, *, per_mac: int = 2, kv_heads=None,
                   ffn: int = 3, wo: bool = True, attn: str = "triangle", attn_heads=None,
                   lm_head_rows=None, layers=None, width=None, embed: bool = False) -> int:
    """Prefill FLOPs with the named mistake (no keyword: the correct count). kv_heads / width /
    attn_heads: the heads of the K/V projections, the width used for N_h·D_h, the heads that
    compute attention; attn: "triangle", "square", "scores" (Q K^T only) or "none";
    lm_head_rows: positions through the LM head (default: the last of each prompt)."""
    h, d = cfg.hidden_size, cfg.head_dim
    q_width = cfg.n_heads * d if width is None else width
    kv_width = (cfg.n_kv_heads if kv_heads is None else kv_heads) * d
    tokens = b * p
    weights = h * q_width + 2 * h * kv_width + (q_width * h if wo else 0) + \
        ffn * h * cfg.ffn_hidden_size
    pairs = {"triangle": p * (p + 1) // 2, "square": p * p, "scores": p * (p + 1) // 2,
             "none": 0}[attn]
    products = 1 if attn == "scores" else 2
    heads = cfg.n_heads if attn_heads is None else attn_heads
    attention = products * b * heads * pairs * d
    rows = b if lm_head_rows is None else lm_head_rows
    lm_head = rows * h * cfg.vocab_size
    n_layers = cfg.n_layers if layers is None else layers
    total = n_layers * (tokens * weights + attention) + lm_head
    if embed:
        total += tokens * h * cfg.vocab_size
    return per_mac * total


def _prefill_mixups(cfg: ModelConfig, b: int, p: int, want: int) -> dict:
    h, d = cfg.hidden_size, cfg.head_dim
    f = functools.partial(_prefill_count, cfg, b, p)
    return {
        _("counted a multiply-add as 1 FLOP: it is 2 (a multiply and an add), so a [in, out] "
          "weight costs 2·in·out per token"): f(per_mac=1),
        _("left out attention's own products: the scores Q Kᵀ and the weighted sum of V are "
          "matrix products too (2·D_h FLOPs each per query-key pair and query head)"):
            f(attn="none"),
        _("counted the full P x P score matrix: under the causal mask query i meets only keys "
          "0..i, P(P+1)/2 pairs"): f(attn="square"),
        _("counted only Q Kᵀ: the weighted sum of V (weights @ V) costs as much again"):
            f(attn="scores"),
        _("counted attention for the N_kv KV heads: every one of the N_h query heads computes its "
          "own scores and weighted sum"): f(attn_heads=cfg.n_kv_heads),
        _("counted the K and V projections for N_h heads (K/V repeated for every query head): "
          "with GQA, W_K and W_V have N_kv·D_h columns each"): f(kv_heads=cfg.n_heads),
        _("used H where N_h·D_h belongs (W_Q's columns, W_O's rows): they differ when head_dim "
          "is set explicitly"): f(width=h),
        _("ran the LM head on every prompt position: prefill needs only the last position's "
          "logits (the next token), B rows"): f(lm_head_rows=b * p),
        _("left out the LM head (B·H·|V| multiply-adds for the last positions)"): f(lm_head_rows=0),
        _("left out the batch B: all B·P tokens go through every weight"):
            _prefill_count(cfg, 1, p),
        _("counted one layer: every one of the L layers does the same work"): f(layers=1),
        _("counted two FFN matrices: SwiGLU has three (W_gate, W_up, W_down)"): f(ffn=2),
        _("left out W_O, the attention output projection"): f(wo=False),
        _("counted the embedding lookup as a product: it reads rows of the table, no FLOPs"):
            f(embed=True),
        _("returned a float; the FLOP count is an exact int (avoid `/` and float factors)"):
            float(want),
    }


def _decode_count(cfg: ModelConfig, b: int, c_len: int, s: int, *, kv_factor: int = 2,
                  new: int = 1, kv_heads=None, weight_s=None, cache_s=None, embed: bool = False,
                  lm_head: bool = True, norms: bool = True, weight_copies: int = 1,
                  cache_batch=None, layers_w=None, layers_kv=None, ffn: int = 3) -> int:
    """Decode-step bytes with the named mistake (no keyword: the correct count)."""
    h, d = cfg.hidden_size, cfg.head_dim
    nl = cfg.n_layers
    per_layer = (h * (cfg.n_heads + 2 * cfg.n_kv_heads) * d + cfg.n_heads * d * h
                 + ffn * h * cfg.ffn_hidden_size + (2 * h if norms else 0))
    weights = (nl if layers_w is None else layers_w) * per_layer + (h if norms else 0) + \
        (h * cfg.vocab_size if lm_head else 0) + (cfg.vocab_size * h if embed else 0)
    heads = cfg.n_kv_heads if kv_heads is None else kv_heads
    cache = kv_factor * (nl if layers_kv is None else layers_kv) * \
        (b if cache_batch is None else cache_batch) * (c_len + new) * heads * d
    return (weight_copies * weights * (s if weight_s is None else weight_s)
            + cache * (s if cache_s is None else cache_s))


def _decode_mixups(cfg: ModelConfig, b: int, c_len: int, s: int, want: int) -> dict:
    f = functools.partial(_decode_count, cfg, b, c_len, s)
    return {
        _("forgot the factor 2 of the cache: it holds K and V"): f(kv_factor=1),
        _("left out the cache write: the step reads the C cached positions and writes the new "
          "token's K and V, C + 1 positions in all"): f(new=0),
        _("counted the new position twice (written, then read again): count each cache entry the "
          "step touches once, C + 1 positions"): f(new=2),
        _("counted N_h heads in the cache (K/V repeated for every query head): it holds the N_kv "
          "KV heads only"): f(kv_heads=cfg.n_heads),
        _("counted elements, not bytes: multiply by bytes_per_elem"): f(weight_s=1, cache_s=1),
        _("multiplied only the cache by bytes_per_elem: the weights are stored in the same "
          "dtype"): f(weight_s=1),
        _("multiplied only the weights by bytes_per_elem: the cache is stored in the same "
          "dtype"): f(cache_s=1),
        _("counted bits, not bytes (multiplied by 8)"): want * 8,
        _("counted the whole embedding table: a decode step looks up only B of its rows (left "
          "out); the LM head is read in full"): f(embed=True),
        _("left out the LM head [H, |V|], read in full at every step"): f(lm_head=False),
        _("left out the norm scales (2 per layer and the final one, H numbers each)"):
            f(norms=False),
        _("read the weights once per sequence: one read serves the whole batch"):
            f(weight_copies=b),
        _("left out the batch B in the cache: every sequence has its own K and V"):
            f(cache_batch=1),
        _("counted one layer's cache: every layer keeps its own K and V"): f(layers_kv=1),
        _("counted one layer's weights: every layer's matrices are read"): f(layers_w=1),
        _("counted two FFN matrices: SwiGLU has three (W_gate, W_up, W_down)"): f(ffn=2),
        _("hard-coded 2 bytes per element (bf16); use bytes_per_elem"):
            f(weight_s=2, cache_s=2) if s != 2 else None,
        _("returned GiB; return the exact number of bytes as an int"): want / 2**30,
        _("returned GB; return the exact number of bytes as an int"): want / 1e9,
        _("returned a float; the byte count is an exact int (avoid `/` and float factors)"):
            float(want),
    }


@_one_thread
def check_prefill_flops(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("prefill_flops", f, seed=seed) as c:
        c.forbid_functions([gen.prefill_flops, roofline.prefill_flops], _(_COUNT_HINT))
        cases = [_distinct(c, lambda: (_roofline_cfg(c), c.randint(2, 7), c.randint(7, 40)),
                           gen.prefill_flops, _prefill_mixups)
                 for _n in range(3 if thorough else 2)]
        cfg = _roofline_cfg(c)
        cases += [(cfg, c.randint(2, 5), 1), (ModelConfig(**{**vars(cfg), "n_kv_heads": 1}),
                                              3, c.randint(5, 20))]
        cases += [(LLAMA2_7B, 1, 512), (LLAMA2_7B, 4, 2048)]
        for cfg, b, p in cases:
            want = gen.prefill_flops(cfg, b, p)
            name = "LLAMA2_7B" if cfg == LLAMA2_7B else _cfg_text(cfg)
            c.expect_equal(c.call(cfg, b, p), want,
                           what=f"prefill_flops({name}, batch={b}, seq_len={p})",
                           wrong=_prefill_mixups(cfg, b, p, want))
        c.headline(_("2 FLOPs per multiply-add: every layer's weights for all B·P tokens, "
                     "attention over the causal triangle, the LM head on the last positions"))
        c.headline(_("GQA (N_kv < N_h), MQA, head_dim ≠ H/N_h, a one-token prompt"))
        c.headline("LLaMA-2-7B: B=1, P=512 and B=4, P=2048")


@_one_thread
def check_decode_step_bytes(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("decode_step_bytes", f, seed=seed) as c:
        c.forbid_functions([gen.decode_step_bytes, roofline.decode_bytes,
                            roofline.prefill_bytes], _(_COUNT_HINT))
        cases = []
        # 1 and 4 bytes first (int8, fp32): a hard-coded 2 then stands out.
        for s in [1, 4] + [c.choice([1, 2, 4]) for _n in range(2 if thorough else 0)]:
            cases.append(_distinct(
                c, lambda s=s: (_roofline_cfg(c), c.randint(2, 9), c.randint(10, 500), s),
                gen.decode_step_bytes, _decode_mixups))
        cfg = _roofline_cfg(c)
        cases += [(cfg, 3, 0, 4), (ModelConfig(**{**vars(cfg), "n_kv_heads": 1}), 2, 37, 1)]
        cases += [(LLAMA2_7B, 1, 512, 2), (LLAMA2_7B, 64, 512, 2), (LLAMA2_7B, 1, 4095, 2)]
        for cfg, b, c_len, s in cases:
            want = gen.decode_step_bytes(cfg, b, c_len, s)
            name = "LLAMA2_7B" if cfg == LLAMA2_7B else _cfg_text(cfg)
            c.expect_equal(c.call(cfg, b, c_len, s), want,
                           what=f"decode_step_bytes({name}, batch={b}, context_len={c_len}, "
                                f"bytes_per_elem={s})",
                           wrong=_decode_mixups(cfg, b, c_len, s, want))
        c.headline(_("every weight once per step (LM head and norms, not the embedding table)"))
        c.headline(_("the cache: C positions read and the new one written, K and V, N_kv heads, "
                     "every layer and sequence"))
        c.headline(_("LLaMA-2-7B: B=1 and B=64 at C=512, B=1 at C=4095"))


def _intensity_mixups(flops, nbytes) -> dict:
    return {
        _("divided bytes by FLOPs: the intensity is FLOPs per byte"): nbytes / flops,
        _("used // (floor division), which drops the fraction: use /"): float(flops // nbytes),
        _("returned an int: the intensity is a ratio, return a float (flops / num_bytes)"):
            flops // nbytes,
        _("counted each FLOP twice: the FLOP count already has 2 per multiply-add"):
            2 * flops / nbytes,
        _("divided by bits (8 per byte)"): flops / (8 * nbytes),
    }


@_one_thread
def check_arithmetic_intensity(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("arithmetic_intensity", f, seed=seed) as c:
        c.forbid_functions([gen.arithmetic_intensity], _(_COUNT_HINT))
        cases = [(c.randint(10**6, 10**9), c.randint(10**6, 10**9)) for _n in range(3)]
        cases += [(c.randint(3, 50) * 7 + 3, 7), (5, 2000)]
        cfg = LLAMA2_7B
        # LLaMA-2-7B in bf16: a 512-token prefill, and a decode step after 511 cached positions
        # (the prefill writes K and V for 512 positions: the same bytes as that decode step).
        cases += [(gen.prefill_flops(cfg, 1, 512), gen.decode_step_bytes(cfg, 1, 511, 2)),
                  (roofline.decode_flops(cfg, 1, 511), gen.decode_step_bytes(cfg, 1, 511, 2))]
        for flops, nbytes in cases:
            got = c.call(flops, nbytes)
            want = flops / nbytes
            what = f"arithmetic_intensity(flops={flops}, num_bytes={nbytes})"
            wrong = _intensity_mixups(flops, nbytes)
            if not isinstance(got, numbers.Real) or isinstance(got, bool) or \
                    not math.isclose(float(got), want, rel_tol=1e-9):
                hint = c.diagnose(got, wrong, 0.0, 0.0)
                c.fail(_("{what} is {got}, expected {want}.").format(what=what, got=repr(got),
                                                                     want=repr(want)), hint)
            if not isinstance(got, float):
                c.fail(_("{what} is {got} of type {kind}; expected a float.").format(
                    what=what, got=repr(got), kind=type(got).__name__),
                       _("return a Python float: flops / num_bytes"))
            c.note(what)
        c.headline(_("FLOPs per byte, a float (fractions kept)"))


def _distinct(c: Check, draw, answer, mixups) -> tuple:
    """A case from `draw()` whose known mistakes give different numbers, so that a wrong answer
    is named for what it is (redrawn until so; rarely needed). A mistake that gives the right
    answer here (for example bytes as elements at 1 byte each) is caught by another case."""
    for _n in range(50):
        case = draw()
        want = repr(answer(*case))
        values = [repr(v) for v in mixups(*case, answer(*case)).values() if v is not None]
        values = [v for v in values if v != want]
        if len(set(values)) == len(values):
            return case
    return case


def _cfg_text(cfg: ModelConfig) -> str:
    return (f"cfg(V={cfg.vocab_size}, H={cfg.hidden_size}, N_h={cfg.n_heads}, "
            f"N_kv={cfg.n_kv_heads}, D_h={cfg.head_dim}, H_ff={cfg.ffn_hidden_size}, "
            f"L={cfg.n_layers})")


__all__ = ["check_KVCache", "check_arithmetic_intensity", "check_decode_step_bytes",
           "check_forward_with_cache", "check_generate", "check_prefill_flops", "tensor_nbytes"]
