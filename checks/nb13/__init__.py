"""Checks for chapter 13: the KV cache, prefill and decode, and generation.

Conventions (docs/conventions.md): the cache stores K after RoPE and V, for the N_kv KV heads only
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
  (n tokens: the prefill and n - 1 decode steps); without it, one call per new token, each over
  the whole sequence so far (B·P, B·(P + 1), ... ids: a use_cache=False that uses the cache shows).
- `generate` sampling (temperature > 0): reproducible with a generator, with and without the
  cache; 128 sequences of 4 new tokens each are scored token by token under the model's own
  softmax(logits / T) (the whole sequence re-run without the cache), with the cache at T = 2 and
  without it at T = 0.6; their total log-probability must lie within 6 standard deviations of what
  true draws give (a correct sampler fails about once in 10^9), and a known sampling mistake
  (softmax twice, T twice, T dropped, logits times T, softmax over the batch) is named only when
  it explains the draws 12 nats better than the right distribution and every other mistake; two
  calls with generator=None must differ; an LM head 300 times larger (logits in the hundreds)
  must sample without overflow.
- Configs never tie sizes together: H // N_h is not head_dim, rope_base is not 10000 and norm_eps
  is far from 1e-5, so a size read from the wrong place changes the results at every seed.
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

The checks' internals live in the package's modules cache.py, generate.py and roofline.py, the
mistakes they name in checks/nb13/mistakes.py (and the roofline's module); each check imports
them when it runs. The notebook's `tensor_nbytes` comes from checks/held.py: the worker's copy of
this module holds its top-level imports and none of the package's other modules.
"""

from __future__ import annotations

from collections.abc import Callable
import math
import numbers

import torch
import torch.nn.functional as F

from ..config import LLAMA2_7B, ModelConfig
from ..mistakes import CALLS_COURSE_REFERENCE, fix_first
from . import cache as _cache
from . import generate as _generate
from . import mistakes as _mistakes
from . import roofline as _roofline
from ..context import one_thread as _one_thread
from ..engine import Check, CheckFailure, LearnerError, NotStarted, builds_on
from ..i18n import _
from ..reference import generation as gen
from ..reference import roofline as ref_roofline
from ..held import tensor_nbytes

# --------------------------------------------------------------------------------------------
# The embedding table that counts the tokens looked up in it (generate's check hands it over; the
# grader's worker rebuilds it from this module, so it lives here and not in checks.nb13.generate)


class _CountingTable(torch.Tensor):
    """The embedding table, counting the token ids looked up in it (one entry per lookup call).

    Lookups seen: `table[ids]`, `F.embedding(ids, table)`, `torch.embedding`, `index_select`,
    `one_hot @ table`. Results of other operations with the table's shape (`.to`, `.contiguous`
    ...) count too; everything else comes back as a plain tensor.
    """

    _log: Callable[[int], None]  # checks.nb13.generate._Recorder: told each lookup's count

    @staticmethod
    def wrap(data: torch.Tensor, log: Callable[[int], None]) -> "_CountingTable":
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


def _counting_params(params: dict, log: Callable[[int], None]) -> dict:
    return {**params, "embed": _CountingTable.wrap(params["embed"], log)}


# --------------------------------------------------------------------------------------------
# Exercise 1: KVCache


@_one_thread
def check_KVCache(cls, *, seed: int | None = None, thorough: bool = False) -> None:
    from .cache import (_CACHE_MISTAKES, _cfg, _check_allocation, _construct,
                             _expect_update, _recognising, _SimCache, _update)
    from .mistakes import (DTYPE_IGNORED, FULL_IS_FINE, NO_OVERFLOW, OVERFLOW_IGNORES_T,
                                WRONG_ERROR)

    with Check("KVCache", cls, seed=seed) as c:
        for _trial in range(3 if thorough else 1):
            # L >= 3: a cache for one layer (2 buffers) and one without V (L buffers) differ.
            n_layers = c.randint(3, 5)
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
            # Fill exactly to the end (every position written, none skipped): allowed, so a
            # ValueError here is the `>=` of an overflow test.
            with _recognising(c, FULL_IS_FINE):
                step(prompt + 4, s_max - prompt - 4)
            # Overflow: must raise ValueError; first past the end, then a chunk of two that
            # starts inside the cache and ends past it.
            for start, t in ((s_max, 1), (s_max - 1, 2)):
                k = c.randn(batch, cfg.n_kv_heads, t, cfg.head_dim)
                label = _("{call} with T={t} on a cache with max_seq_len={size}").format(
                    call=f"update(0, k, v, start_pos={start})", t=t, size=s_max)
                chunk = start < s_max      # the first case raised ValueError
                try:
                    cache.update(0, k, k.clone(), start)
                except ValueError:
                    continue
                except NotImplementedError:
                    raise NotStarted("KVCache") from None
                except Exception as exc:  # noqa: BLE001 - the learner's constructor may fail in any way
                    c.fail(_("{call} raised {error}: {text}").format(
                        call=label, error=type(exc).__name__, text=exc),
                           OVERFLOW_IGNORES_T if chunk else WRONG_ERROR.with_text(
                               _(WRONG_ERROR).format(name=type(exc).__name__)))
                c.fail(_("{call} did not raise.").format(call=label),
                       OVERFLOW_IGNORES_T if chunk else NO_OVERFLOW)
            c.headline(_("overflowing max_seq_len raises ValueError"))
        # dtype and device arguments; MQA (one KV head).
        cfg = _cfg(c, "mqa", n_layers=3)
        for dtype in ([torch.float64, torch.bfloat16] if thorough else [torch.float64]):
            batch, s_max = c.sizes(2, 2, 9)
            cache = _construct(c, cls, cfg, batch, s_max, dtype=dtype, device="cpu")
            storages = _check_allocation(c, cache, cfg, batch, s_max, dtype)
            k = c.randn(batch, 1, 2, cfg.head_dim, dtype=dtype)
            v = c.randn(batch, 1, 2, cfg.head_dim, dtype=dtype)
            got = _update(c, cache, 1, k, v, 0)
            if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.Tensor) \
                    and got[0].dtype != dtype:
                c.fail(_("with dtype={dtype} update returned {got} keys.").format(
                    dtype=dtype, got=got[0].dtype), DTYPE_IGNORED)
            _expect_update(c, cache, storages, {}, 0, k, v, 0, k, v, s_max)
        c.headline(_("dtype and device arguments; MQA"))


# --------------------------------------------------------------------------------------------
# Exercise 2: forward_with_cache


@_one_thread
def check_forward_with_cache(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .cache import (_FORWARD_MISTAKES, _CacheHandle, _diagnose_head_dim, _diagnose_raise,
                        _no_reference,
                             _params, _plans, _RecordingCache, _replay)
    from .mistakes import (LAST_ONLY, LAYER_NOT_CACHED, POSITIONS_PLUS_ONE,
                                UNROTATED_RECOMPUTED, UNROTATED_STORED, UPDATE_TWICE)

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
                with torch.no_grad():
                    try:
                        got = c.call(tokens[:, s:e].clone(), params, cfg, handle, s)
                    except LearnerError as err:
                        if mine.failure is not None:
                            raise mine.failure from None
                        _diagnose_head_dim(c, err, cfg)
                        # A square mask raises in a later chunk: replayed to name it.
                        _diagnose_raise(c, err, tokens, params, cfg, batch, s_max, chunks[:n + 1])
                        raise
                    except CheckFailure:
                        if mine.failure is not None:
                            raise mine.failure from None
                        raise
                    if mine.failure is not None:   # a diagnosis the learner's code swallowed
                        raise mine.failure
                    gen.forward_with_cache(tokens[:, s:e], params, cfg, theirs, s)
                layers = sorted(layer for layer, _s, _t in mine.calls)
                if layers != list(range(cfg.n_layers)):
                    missing = sorted(set(range(cfg.n_layers)) - set(layers))
                    c.fail(_("in the call with start_pos={start} (T={t}) cache.update was called "
                             "for layers {layers}; expected each of the {count} layers once.")
                           .format(start=s, t=t, layers=layers, count=cfg.n_layers),
                           LAYER_NOT_CACHED.with_text(
                               _(LAYER_NOT_CACHED).format(layer=missing[0]))
                           if missing else UPDATE_TWICE)
                done = chunks[:n + 1]
                kind = _("prefill") if s == 0 else _("decode") if t == 1 else _("chunk")
                what = _("logits of call {n} ({kind}: T={t} new tokens at start_pos={start}; "
                         "{case})").format(n=n + 1, kind=kind, t=t, start=s, case=label)

                def variant(mistake, done=done):
                    return _replay(tokens, params, cfg, batch, s_max, done, mistake)[0][-1]

                wrong = {m: (lambda m=m: variant(_FORWARD_MISTAKES[m])) for m in _FORWARD_MISTAKES}
                wrong[LAST_ONLY] = full[:, e - 1:e]
                c.expect_tensor(got, full[:, s:e], what=what, dims=("B", "T", "V"), wrong=wrong)
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
                                for m in (UNROTATED_RECOMPUTED, UNROTATED_STORED,
                                          POSITIONS_PLUS_ONE)})
            c.headline(headline)
        c.headline(_("logits equal the uncached forward pass over the whole sequence"))
        c.headline(_("the cache holds K after RoPE and V, N_kv heads"))


# --------------------------------------------------------------------------------------------
# Exercise 3: generate


@_one_thread
def check_generate(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .cache import _no_reference
    from .generate import (_check_sampling, _check_steps, _check_uncached_calls,
                                _generate_mixups, _Recorder, _scenario)
    from .mistakes import BATCH_SQUEEZED, DECODE_IDS_1D, FORWARD_FOR_NOTHING, PROMPT_CHANGED

    earlier = {"KVCache": check_KVCache, "forward_with_cache": check_forward_with_cache}
    with builds_on("generate", earlier), Check(
            "generate", f, seed=seed, errors=[DECODE_IDS_1D, BATCH_SQUEEZED],
            in_place=PROMPT_CHANGED) as c:
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
            label = f"generate(params, cfg, prompt [B={batch}, P={p}], max_new_tokens={n})"
            got = c.call(_counting_params(params, log), cfg, prompt, n)
            c.expect_tensor(got, want,
                            what=_("{call} (greedy, with the cache)").format(call=label),
                            dims=dims, wrong=mixups)
            _check_steps(c, log.items, batch, p, n, label)
            log = _Recorder()
            uncached = f"{label[:-1]}, use_cache=False)"
            got = c.call(_counting_params(params, log), cfg, prompt, n, use_cache=False)
            c.expect_tensor(got, want, what=_("{call} (greedy)").format(call=uncached),
                            dims=dims, wrong=mixups)
            _check_uncached_calls(c, log.items, batch, p, n, uncached)
        c.headline(_("greedy tokens identical with and without the cache"))
        c.headline(_("one prefill over the prompt, then one new token per sequence per step; "
                     "no forward pass after the last token"))
        c.headline(_("without the cache, one pass over the whole sequence so far per new token"))
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
                       FORWARD_FOR_NOTHING)
        c.headline(_("max_new_tokens = 0 and 1"))
        _check_sampling(c)
        c.headline(_("temperature > 0 samples, reproducibly with the generator"))


# --------------------------------------------------------------------------------------------
# Exercises 4-6: the roofline's arithmetic. A multiply-add counts as 2 FLOPs; the chapter's text
# defines what each count includes, and `checks.reference.generation` holds the answers.


@_one_thread
def check_prefill_flops(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .roofline import COUNT_HINT, cfg_text, distinct, prefill_mixups, roofline_cfg

    with Check("prefill_flops", f, seed=seed) as c:
        c.forbid_functions([gen.prefill_flops, ref_roofline.prefill_flops], _(COUNT_HINT))
        cases = [distinct(c, lambda: (roofline_cfg(c), c.randint(2, 7), c.randint(7, 40)),
                          gen.prefill_flops, prefill_mixups)
                 for _n in range(3 if thorough else 2)]
        cfg = roofline_cfg(c)
        cases += [(cfg, c.randint(2, 5), 1), (ModelConfig(**{**vars(cfg), "n_kv_heads": 1}),
                                              3, c.randint(5, 20))]
        cases += [(LLAMA2_7B, 1, 512), (LLAMA2_7B, 4, 2048)]
        for cfg, b, p in cases:
            want = gen.prefill_flops(cfg, b, p)
            name = "LLAMA2_7B" if cfg == LLAMA2_7B else cfg_text(cfg)
            c.expect_equal(c.call(cfg, b, p), want,
                           what=f"prefill_flops({name}, batch={b}, seq_len={p})",
                           wrong=prefill_mixups(cfg, b, p, want))
        c.headline(_("2 FLOPs per multiply-add: every layer's weights for all B·P tokens, "
                     "attention over the causal triangle, the LM head on the last positions"))
        c.headline(_("GQA (N_kv < N_h), MQA, head_dim ≠ H/N_h, a one-token prompt"))
        c.headline("LLaMA-2-7B: B=1, P=512 and B=4, P=2048")


@_one_thread
def check_decode_step_bytes(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .roofline import COUNT_HINT, cfg_text, decode_mixups, distinct, roofline_cfg

    with Check("decode_step_bytes", f, seed=seed) as c:
        c.forbid_functions([gen.decode_step_bytes, ref_roofline.decode_bytes,
                            ref_roofline.prefill_bytes], _(COUNT_HINT))
        cases = []
        # 1 and 4 bytes first (int8, fp32): a hard-coded 2 then stands out.
        for s in [1, 4] + [c.choice([1, 2, 4]) for _n in range(2 if thorough else 0)]:
            cases.append(distinct(
                c, lambda s=s: (roofline_cfg(c), c.randint(2, 9), c.randint(10, 500), s),
                gen.decode_step_bytes, decode_mixups))
        cfg = roofline_cfg(c)
        cases += [(cfg, 3, 0, 4), (ModelConfig(**{**vars(cfg), "n_kv_heads": 1}), 2, 37, 1)]
        cases += [(LLAMA2_7B, 1, 512, 2), (LLAMA2_7B, 64, 512, 2), (LLAMA2_7B, 1, 4095, 2)]
        for cfg, b, c_len, s in cases:
            want = gen.decode_step_bytes(cfg, b, c_len, s)
            name = "LLAMA2_7B" if cfg == LLAMA2_7B else cfg_text(cfg)
            c.expect_equal(c.call(cfg, b, c_len, s), want,
                           what=f"decode_step_bytes({name}, batch={b}, context_len={c_len}, "
                                f"bytes_per_elem={s})",
                           wrong=decode_mixups(cfg, b, c_len, s, want))
        c.headline(_("every weight once per step (LM head and norms, not the embedding table)"))
        c.headline(_("the cache: C positions read and the new one written, K and V, N_kv heads, "
                     "every layer and sequence"))
        c.headline(_("LLaMA-2-7B: B=1 and B=64 at C=512, B=1 at C=4095"))


@_one_thread
def check_arithmetic_intensity(f, *, seed: int | None = None, thorough: bool = False) -> None:
    from .roofline import COUNT_HINT, NOT_A_FLOAT, intensity_mixups

    with Check("arithmetic_intensity", f, seed=seed) as c:
        c.forbid_functions([gen.arithmetic_intensity], _(COUNT_HINT))
        cases = [(c.randint(10**6, 10**9), c.randint(10**6, 10**9)) for _n in range(3)]
        cases += [(c.randint(3, 50) * 7 + 3, 7), (5, 2000)]
        cfg = LLAMA2_7B
        # LLaMA-2-7B in bf16: a 512-token prefill, and a decode step after 511 cached positions
        # (the prefill writes K and V for 512 positions: the same bytes as that decode step).
        cases += [(gen.prefill_flops(cfg, 1, 512), gen.decode_step_bytes(cfg, 1, 511, 2)),
                  (ref_roofline.decode_flops(cfg, 1, 511), gen.decode_step_bytes(cfg, 1, 511, 2))]
        for flops, nbytes in cases:
            got = c.call(flops, nbytes)
            want = flops / nbytes
            what = f"arithmetic_intensity(flops={flops}, num_bytes={nbytes})"
            if isinstance(got, torch.Tensor):      # a number, but in a tensor
                c.fail(_("{what} is {got} of type {kind}; expected a float.").format(
                    what=what, got=repr(got), kind=type(got).__name__), NOT_A_FLOAT)
            if not isinstance(got, numbers.Real) or isinstance(got, bool) or \
                    not math.isclose(float(got), want, rel_tol=1e-9):
                hint = c.diagnose(got, intensity_mixups(flops, nbytes), 0.0, 0.0)
                c.fail(_("{what} is {got}, expected {want}.").format(what=what, got=repr(got),
                                                                     want=repr(want)), hint)
            if not isinstance(got, float):
                c.fail(_("{what} is {got} of type {kind}; expected a float.").format(
                    what=what, got=repr(got), kind=type(got).__name__), NOT_A_FLOAT)
            c.note(what)
        c.headline(_("FLOPs per byte, a float (fractions kept)"))


__all__ = ["check_KVCache", "check_arithmetic_intensity", "check_decode_step_bytes",
           "check_forward_with_cache", "check_generate", "check_prefill_flops", "tensor_nbytes"]


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "13.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "KVCache": (
        _cache.ONE_LAYER, _cache.DTYPE_IGNORED, _cache.KV_SHARE_BUFFER, _cache.SHARED_BUFFER,
        _mistakes.NO_OVERFLOW, _cache.NO_UPDATE_METHOD, _cache.NOT_PREALLOCATED,
        _cache.SHARED_COUNTER, _mistakes.OVERFLOW_IGNORES_T, _cache.OWN_COUNTER,
        _mistakes.FULL_IS_FINE, _cache.REALLOCATED, _cache.COPY, _cache.NEW_ONLY,
        _cache.ONE_SHORT, _cache.UP_TO_START, _cache.RETURNS_REPEATED, _cache.SWAPPED,
        _cache.WHOLE_BUFFER, _cache.CFG_MAX_LEN, _cache.REPEATED_HEADS_ALLOC,
        _cache.SUBCLASSES_REFERENCE, _cache.V_NOT_WRITTEN, _cache.AT_ZERO, _cache.OFFSET_PLUS_ONE,
        _mistakes.WRONG_ERROR, _mistakes.CACHE_HEAD_DIM_FROM_H, _mistakes.K_ONLY),
    "forward_with_cache": (
        _cache.REPEATED_HEADS, _cache.UNROTATED_STORED, _cache.UNROTATED_RECOMPUTED,
        CALLS_COURSE_REFERENCE, _cache.NO_OFFSET, _cache.IGNORED_CACHE, _cache.NOT_HEADS_FIRST,
        _mistakes.LAYER_NOT_CACHED, _cache.NO_MASK, _cache.POSITIONS_PLUS_ONE,
        _mistakes.LAST_ONLY, _cache.SCALE_BY_H, _cache.SQUARE_ALL, _cache.SQUARE_NEW,
        _cache.TOP_LEFT, _cache.UPDATE_START, _mistakes.UPDATE_TWICE,
        _mistakes.FORWARD_HEAD_DIM_FROM_H, _mistakes.ROPE_BASE_FIXED, _mistakes.EPS_FIXED,
        _mistakes.ROTARY_DIM_IGNORED, _mistakes.SQUARE_EITHER),
    "generate": (
        _cache.UNROTATED_STORED, CALLS_COURSE_REFERENCE, _mistakes.PROMPT_CHANGED,
        _cache.NO_OFFSET, _mistakes.DECODE_IDS_1D, fix_first('KVCache'),
        fix_first('forward_with_cache'),
        _generate.WASTED_FORWARD, _mistakes.FORWARD_FOR_NOTHING, _generate.GENERATOR_IGNORED,
        _cache.IGNORED_CACHE, _generate.FIRST_POSITION, _generate.ONE_TOO_FEW,
        _generate.ONE_TOO_MANY, _generate.PREFILL_BY_TOKEN, _generate.RECOMPUTED,
        _generate.NEW_TOKENS_ONLY, _generate.NOT_ADVANCED, _generate.SKIPPED_SLOT,
        _generate.TEMPERATURE_IGNORED, _cache.TOP_LEFT, _generate.WASTED_FORWARD_UNCACHED,
        _generate.UNCACHED_USES_CACHE, _mistakes.SOFTMAX_TWICE, _mistakes.TEMPERATURE_TWICE,
        _mistakes.TEMPERATURE_NOT_APPLIED, _mistakes.TEMPERATURE_MULTIPLIED,
        _mistakes.UNSTABLE_SOFTMAX, _mistakes.FIXED_SEED, _mistakes.GENERATOR_RESEEDED,
        _mistakes.SOFTMAX_OVER_BATCH, _mistakes.BATCH_SQUEEZED, _mistakes.ROPE_BASE_FIXED,
        _mistakes.EMBED_NOT_SEEN),
    "prefill_flops": (
        _roofline.ATTENTION_KV_HEADS, _roofline.EMBED_PRODUCT, _roofline.FULL_SQUARE,
        _roofline.H_FOR_HEADS, _roofline.KV_PROJ_REPEATED, _roofline.LM_HEAD_EVERYWHERE,
        _roofline.MAC_AS_ONE, _roofline.NO_ATTENTION, _roofline.NO_BATCH,
        _roofline.PREFILL_NO_LM_HEAD, _roofline.NO_WO, _roofline.ONE_LAYER_FLOPS,
        _roofline.FLOPS_FLOAT, _roofline.SCORES_ONLY, _roofline.TWO_FFN),
    "decode_step_bytes": (
        _roofline.BITS, _roofline.BYTES_CACHE_ONLY, _roofline.BYTES_WEIGHTS_ONLY,
        _roofline.NO_KV_FACTOR, _roofline.CACHE_N_H, _roofline.CACHE_NO_BATCH, _roofline.ELEMENTS,
        _roofline.HARD_CODED_2, _roofline.NEW_TWICE, _roofline.NO_CACHE_WRITE,
        _roofline.DECODE_NO_LM_HEAD, _roofline.NO_NORMS, _roofline.ONE_LAYER_CACHE,
        _roofline.ONE_LAYER_WEIGHTS, _roofline.GB, _roofline.GIB, _roofline.WEIGHTS_PER_SEQUENCE,
        _roofline.WHOLE_EMBEDDING, _roofline.BYTES_FLOAT),
    "arithmetic_intensity": (
        _roofline.BYTES_PER_FLOP, _roofline.PER_BIT, _roofline.FLOOR_DIVISION,
        _roofline.FLOPS_TWICE, _roofline.RETURNS_INT, _roofline.NOT_A_FLOAT),
}
