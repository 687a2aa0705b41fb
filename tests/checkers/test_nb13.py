"""Chapter 13 checkers: the reference passes at every seed; each known mistake is diagnosed.

The reference (`checks.reference.generation`) is also held to its invariants here: cached logits
equal the uncached forward pass (and chapter 12's `model_forward`), chunk by chunk, and greedy
generation gives the same tokens with and without the cache. The roofline's counts
(`prefill_flops`, `decode_step_bytes`) equal `checks.timing`'s, whose own tests hold them to
PyTorch's FLOP counter; their wrong implementations are written the way a learner would write the
count, each with one term wrong.
"""

from __future__ import annotations

import dataclasses
import math
import types

import pytest
import torch
import torch.nn.functional as F

from checks import ModelConfig, nb13
from checks.nb13 import cache as nb13_cache
from checks.nb13 import generate as nb13_generate
from checks import reference as ref
from checks.engine import ForbiddenCall
from checks.reference import generation as gen
from checks.reference.model import (init_model_params, model_forward, model_param_count,
                                    sample_next_token)

from ..support.catalogue import Wrong, exercises

REFERENCE = {
    nb13.check_KVCache: ref.KVCache,
    nb13.check_forward_with_cache: ref.forward_with_cache,
    nb13.check_generate: ref.generate,
    nb13.check_prefill_flops: ref.prefill_flops,
    nb13.check_decode_step_bytes: ref.decode_step_bytes,
    nb13.check_arithmetic_intensity: ref.arithmetic_intensity,
}


def _correct(checker):
    """The reference under new code objects: the checks refuse the course's own answer (the
    reference class itself, or a call of the reference function), so a copy stands in for it."""
    if checker is nb13.check_KVCache:
        body = {k: v for k, v in vars(ref.KVCache).items() if k not in ("__dict__", "__weakref__")}
        return type("KVCache", (), body)
    fn = REFERENCE[checker]
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


# ------------------------------------------------------------------------------------------------
# The reference's own invariants

def _model(cfg: ModelConfig, seed: int) -> dict:
    gen_ = torch.Generator().manual_seed(seed)
    params = init_model_params(cfg, generator=gen_)
    with torch.no_grad():   # larger weights than the init's, so that attention is not uniform
        for layer in params["layers"]:
            for name in ("wqkv", "wo", "w_gate", "w_up", "w_down"):
                layer[name].mul_(0.9 / (0.02 * math.sqrt(layer[name].shape[0])))
        params["embed"].mul_(50.0)
        params["lm_head"].mul_(2 / (0.02 * math.sqrt(cfg.hidden_size)))
    return params


CFGS = [
    ModelConfig(vocab_size=61, hidden_size=24, n_heads=6, n_kv_heads=2, ffn_hidden_size=50,
                n_layers=3, max_seq_len=64),
    ModelConfig(vocab_size=53, hidden_size=20, n_heads=4, n_kv_heads=1, head_dim=6,
                ffn_hidden_size=44, n_layers=2, rotary_dim=4, rope_base=500.0, max_seq_len=64),
]


@pytest.mark.parametrize("cfg", CFGS, ids=["GQA", "MQA partial rotary"])
def test_reference_cached_logits_equal_the_whole_sequence(cfg):
    params = _model(cfg, 0)
    tokens = torch.randint(0, cfg.vocab_size, (3, 13), generator=torch.Generator().manual_seed(1))
    full = gen.full_forward(tokens, params, cfg)
    torch.testing.assert_close(full, model_forward(tokens, params, cfg), atol=2e-5, rtol=2e-5)
    cache = ref.KVCache(cfg, 3, 20)
    pieces = [ref.forward_with_cache(tokens[:, s:e], params, cfg, cache, s)
              for s, e in ((0, 5), (5, 6), (6, 10), (10, 11), (11, 12), (12, 13))]
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=2e-5, rtol=2e-5)
    last = ref.forward_with_cache(tokens[:, 12:13], params, cfg, cache, 12, last_only=True)
    torch.testing.assert_close(last, full[:, -1:], atol=2e-5, rtol=2e-5)
    # The cache holds K after RoPE: chapter 08's apply_rope of the projected keys (layer 0).
    h = ref.rms_norm(F.embedding(tokens, params["embed"]), params["layers"][0]["attn_norm"])
    _, k, v = ref.split_qkv(h @ params["layers"][0]["wqkv"], cfg.n_heads, cfg.n_kv_heads,
                            cfg.head_dim)
    k = ref.apply_rope(k, torch.arange(13), base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    torch.testing.assert_close(cache.k[0][:, :, :13], k, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(cache.v[0][:, :, :13], v, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("cfg", CFGS, ids=["GQA", "MQA partial rotary"])
def test_reference_greedy_generation_same_with_and_without_cache(cfg):
    params = _model(cfg, 2)
    prompt = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(3))
    cached = ref.generate(params, cfg, prompt, 12)
    assert torch.equal(cached, ref.generate(params, cfg, prompt, 12, use_cache=False))
    assert torch.equal(cached[:, :5], prompt) and cached.dtype == torch.long
    assert not cached.is_inference()
    # and the same tokens as argmax over chapter 12's model_forward, one step at a time
    seq = prompt
    for _ in range(12):
        nxt = model_forward(seq, params, cfg)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(seq, cached)


def test_reference_cache_layout_and_overflow():
    cfg = CFGS[0]
    cache = ref.KVCache(cfg, 2, 7, dtype=torch.float64)
    assert [tuple(t.shape) for t in cache.k] == [(2, 2, 7, 4)] * 3
    assert cache.nbytes == ref.kv_cache_bytes(3, 2, 7, 2, 4, 8)
    k = torch.randn(2, 2, 7, 4, dtype=torch.float64)
    k_all, _ = cache.update(1, k, k, 0)
    assert k_all.data_ptr() == cache.k[1].data_ptr()
    with pytest.raises(ValueError, match="max_seq_len"):
        cache.update(0, k[:, :, :1], k[:, :, :1], 7)
    with pytest.raises(ValueError, match="N_kv"):
        cache.update(0, k.repeat_interleave(3, 1), k.repeat_interleave(3, 1), 0)


# ------------------------------------------------------------------------------------------------
# KVCache: correct variants that must pass, and the catalogue of mistakes

class ListCache:
    """Correct: one tensor per layer for K and one for V, zero-initialised."""

    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        shape = (batch_size, cfg.n_kv_heads, max_seq_len, cfg.head_dim)
        self.max_seq_len = max_seq_len
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]

    def _span(self, k, start_pos):
        end = start_pos + k.shape[2]
        if start_pos < 0 or end > self.max_seq_len:
            raise ValueError("overflow")
        return end

    def write(self, layer_idx, k, v, start_pos, end):
        self.k[layer_idx][:, :, start_pos:end] = k
        self.v[layer_idx][:, :, start_pos:end] = v

    def update(self, layer_idx, k, v, start_pos):
        end = self._span(k, start_pos)
        self.write(layer_idx, k, v, start_pos, end)
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]


class EmptyDictCache(ListCache):
    """Correct: torch.empty buffers (garbage in unwritten slots) kept in a dict."""

    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_seq_len, cfg.head_dim)
        self.max_seq_len = max_seq_len
        self.buffers = {"k": torch.empty(shape, dtype=dtype, device=device).fill_(float("nan")),
                        "v": torch.empty(shape, dtype=dtype, device=device).fill_(float("nan"))}

    def update(self, layer_idx, k, v, start_pos):
        end = self._span(k, start_pos)
        self.buffers["k"][layer_idx, :, :, start_pos:end] = k
        self.buffers["v"][layer_idx, :, :, start_pos:end] = v
        return (self.buffers["k"][layer_idx].narrow(2, 0, end),
                self.buffers["v"][layer_idx].narrow(2, 0, end))


class CatCache:
    """Grows by concatenation: nothing preallocated."""

    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        self.max_seq_len = max_seq_len
        self.k = [None] * cfg.n_layers
        self.v = [None] * cfg.n_layers

    def update(self, layer_idx, k, v, start_pos):
        if start_pos + k.shape[2] > self.max_seq_len:
            raise ValueError("overflow")
        old_k, old_v = self.k[layer_idx], self.v[layer_idx]
        self.k[layer_idx] = k if old_k is None else torch.cat([old_k[:, :, :start_pos], k], 2)
        self.v[layer_idx] = v if old_v is None else torch.cat([old_v[:, :, :start_pos], v], 2)
        return self.k[layer_idx], self.v[layer_idx]


class CloneCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        k_all, v_all = super().update(layer_idx, k, v, start_pos)
        return k_all.clone(), v_all.clone()


class RepeatedHeadsCache(ListCache):
    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        super().__init__(cfg, batch_size, max_seq_len, dtype, device)
        self.rep = cfg.n_heads // cfg.n_kv_heads
        shape = (batch_size, cfg.n_heads, max_seq_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]

    def write(self, layer_idx, k, v, start_pos, end):
        super().write(layer_idx, k.repeat_interleave(self.rep, 1),
                      v.repeat_interleave(self.rep, 1), start_pos, end)


class OffByOneWriteCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        end = self._span(k, start_pos)
        stop = min(end + 1, self.max_seq_len)
        self.k[layer_idx][:, :, start_pos + 1:stop] = k[:, :, :stop - start_pos - 1]
        self.v[layer_idx][:, :, start_pos + 1:stop] = v[:, :, :stop - start_pos - 1]
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]


class AtZeroCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        end = self._span(k, start_pos)
        self.write(layer_idx, k, v, 0, k.shape[2])
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]


class OwnCounterCache(ListCache):
    """Appends at its own per-layer length and ignores start_pos."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.length = [0] * len(self.k)

    def update(self, layer_idx, k, v, start_pos):
        pos = self.length[layer_idx]
        end = self._span(k, pos)
        self.write(layer_idx, k, v, pos, end)
        self.length[layer_idx] = end
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]


class SharedCounterCache(ListCache):
    """One counter for the whole cache, advanced by every layer's update."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.length = 0

    def update(self, layer_idx, k, v, start_pos):
        pos = self.length
        end = min(pos + k.shape[2], self.max_seq_len)
        if start_pos + k.shape[2] > self.max_seq_len:
            raise ValueError("overflow")
        self.write(layer_idx, k[:, :, :end - pos], v[:, :, :end - pos], pos, end)
        self.length = end
        stop = start_pos + k.shape[2]
        return self.k[layer_idx][:, :, :stop], self.v[layer_idx][:, :, :stop]


class OneLayerCache(ListCache):
    """Every layer writes into the same buffer."""

    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        super().__init__(cfg, batch_size, max_seq_len, dtype, device)
        self.k = [self.k[0]] * cfg.n_layers
        self.v = [self.v[0]] * cfg.n_layers


class NewOnlyCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        super().update(layer_idx, k, v, start_pos)
        return k, v


class WholeBufferCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        super().update(layer_idx, k, v, start_pos)
        return self.k[layer_idx], self.v[layer_idx]


class SwappedCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        k_all, v_all = super().update(layer_idx, k, v, start_pos)
        return v_all, k_all


class NoOverflowCheckCache(ListCache):
    def _span(self, k, start_pos):
        return start_pos + k.shape[2]

    def write(self, layer_idx, k, v, start_pos, end):
        # slicing past the end silently writes fewer positions (or fails to broadcast)
        room = max(0, min(end, self.max_seq_len) - start_pos)
        super().write(layer_idx, k[:, :, :room], v[:, :, :room], start_pos, start_pos + room)


class RuntimeErrorCache(ListCache):
    def _span(self, k, start_pos):
        end = start_pos + k.shape[2]
        if end > self.max_seq_len:
            raise IndexError("cache full")
        return end


class GreaterEqualCache(ListCache):
    def _span(self, k, start_pos):
        end = start_pos + k.shape[2]
        if end >= self.max_seq_len:
            raise ValueError("cache full")
        return end


class IgnoresDtypeCache(ListCache):
    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        super().__init__(cfg, batch_size, max_seq_len, torch.float32, device)


class CfgLengthCache(ListCache):
    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        super().__init__(cfg, batch_size, cfg.max_seq_len, dtype, device)
        self.max_seq_len = max_seq_len


class ReallocatingCache(ListCache):
    """Preallocated, but every update replaces the layer's buffer by an updated copy."""

    def write(self, layer_idx, k, v, start_pos, end):
        self.k[layer_idx] = self.k[layer_idx].index_copy(2, torch.arange(start_pos, end), k)
        self.v[layer_idx] = self.v[layer_idx].index_copy(2, torch.arange(start_pos, end), v)


class SubclassedReference(ref.KVCache):
    pass


class SharedKVCache(ListCache):
    """K and V in one buffer per layer: writing V overwrites the keys just written."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.v = self.k


class OneTensorForKAndVCache(ListCache):
    """One [L, B, N_kv, S_max, D_h] tensor, given out as both K and V."""

    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        super().__init__(cfg, batch_size, max_seq_len, dtype, device)
        buffer = torch.zeros(cfg.n_layers, *self.k[0].shape, dtype=dtype)
        self.k, self.v = buffer, buffer


class KPreallocatedVCatCache(ListCache):
    """Preallocates the K buffers only; V grows by torch.cat."""

    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        super().__init__(cfg, batch_size, max_seq_len, dtype, device)
        self.v = [None] * cfg.n_layers

    def write(self, layer_idx, k, v, start_pos, end):
        self.k[layer_idx][:, :, start_pos:end] = k
        old = self.v[layer_idx]
        self.v[layer_idx] = v if old is None else torch.cat([old[:, :, :start_pos], v], 2)

    def update(self, layer_idx, k, v, start_pos):
        end = self._span(k, start_pos)
        self.write(layer_idx, k, v, start_pos, end)
        return self.k[layer_idx][:, :, :end], self.v[layer_idx]


class ContiguousCache(ListCache):
    """Returns `.contiguous()` slices: copies, since a slice of the position axis is not."""

    def update(self, layer_idx, k, v, start_pos):
        k_all, v_all = super().update(layer_idx, k, v, start_pos)
        return k_all.contiguous(), v_all.contiguous()


class CatReturnCache(ListCache):
    """Writes in place, but returns the cached part and the new K/V glued by torch.cat."""

    def update(self, layer_idx, k, v, start_pos):
        super().update(layer_idx, k, v, start_pos)
        return (torch.cat([self.k[layer_idx][:, :, :start_pos], k], 2),
                torch.cat([self.v[layer_idx][:, :, :start_pos], v], 2))


class RepeatedReturnCache(ListCache):
    """Stores the N_kv heads, but returns them repeated for the N_h query heads."""

    def __init__(self, cfg, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        self.groups = cfg.n_heads // cfg.n_kv_heads

    def update(self, layer_idx, k, v, start_pos):
        k_all, v_all = super().update(layer_idx, k, v, start_pos)
        return (k_all.repeat_interleave(self.groups, 1),
                v_all.repeat_interleave(self.groups, 1))


class KOnlyWrittenCache(ListCache):
    def write(self, layer_idx, k, v, start_pos, end):
        self.k[layer_idx][:, :, start_pos:end] = k


class AppendOnlyCache(ListCache):
    """Named its method `append` (as for a list) instead of `update`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.append = super().update

    update = None


class LayerZeroCache(ListCache):
    """Allocates every layer, but reads and writes layer 0's buffers whatever layer_idx says."""

    def update(self, layer_idx, k, v, start_pos):
        return super().update(0, k, v, start_pos)


class UpToStartCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        super().update(layer_idx, k, v, start_pos)
        return self.k[layer_idx][:, :, :start_pos], self.v[layer_idx][:, :, :start_pos]


class OneShortCache(ListCache):
    def update(self, layer_idx, k, v, start_pos):
        k_all, v_all = super().update(layer_idx, k, v, start_pos)
        return k_all[:, :, :-1], v_all[:, :, :-1]


class OverflowStartOnlyCache(ListCache):
    """Tests only where a chunk starts: one that runs past the end meets a slice too short."""

    def _span(self, k, start_pos):
        if start_pos >= self.max_seq_len:
            raise ValueError("cache full")
        return start_pos + k.shape[2]


KV_WRONG = [
    Wrong("grows with torch.cat", CatCache, "13.KVCache.nothing_preallocated"),
    Wrong("returns clones", CloneCache, "13.KVCache.returns_copies"),
    Wrong("stores N_h repeated heads", RepeatedHeadsCache, "13.KVCache.stores_repeated_heads"),
    Wrong("writes at start_pos + 1", OffByOneWriteCache, "13.KVCache.writes_one_position_too_far"),
    Wrong("writes at 0", AtZeroCache, "13.KVCache.writes_at_position_zero"),
    Wrong("own length counter", OwnCounterCache, "13.KVCache.own_length_counter"),
    Wrong("one counter for all layers", SharedCounterCache,
          "13.KVCache.one_counter_for_all_layers"),
    Wrong("one buffer for all layers", OneLayerCache, "13.KVCache.allocated_one_layer_only"),
    Wrong("returns the new K/V only", NewOnlyCache, "13.KVCache.returns_new_kv_only"),
    Wrong("returns the whole buffer", WholeBufferCache, "13.KVCache.returns_whole_buffer"),
    Wrong("returns (v, k)", SwappedCache, "13.KVCache.returns_values_and_keys_swapped"),
    Wrong("no overflow check", NoOverflowCheckCache, "13.KVCache.no_overflow_check"),
    Wrong("IndexError on overflow", RuntimeErrorCache, "13.KVCache.wrong_overflow_error"),
    Wrong(">= instead of >", GreaterEqualCache, "13.KVCache.raises_when_exactly_full"),
    Wrong("ignores dtype", IgnoresDtypeCache, "13.KVCache.ignores_dtype"),
    Wrong("sized by cfg.max_seq_len", CfgLengthCache, "13.KVCache.sized_by_cfg_max_seq_len"),
    Wrong("reallocates in update", ReallocatingCache, "13.KVCache.replaces_buffers_in_update"),
    Wrong("subclasses the reference", SubclassedReference, "13.KVCache.subclasses_reference"),
    Wrong("K and V share one buffer", SharedKVCache, "13.KVCache.k_and_v_share_one_buffer"),
    Wrong("K preallocated, V by torch.cat", KPreallocatedVCatCache,
          "13.KVCache.no_separate_v_buffer"),
    Wrong("one tensor as K and V", OneTensorForKAndVCache,
          "13.KVCache.k_and_v_share_one_buffer"),
    Wrong("method named append", AppendOnlyCache, "13.KVCache.no_update_method"),
    Wrong("every layer in layer 0's buffers", LayerZeroCache,
          "13.KVCache.layers_share_one_buffer"),
    Wrong("returns positions before start_pos", UpToStartCache,
          "13.KVCache.returns_positions_before_start"),
    Wrong("returns one position short", OneShortCache, "13.KVCache.returns_one_position_short"),
    Wrong("returns .contiguous() copies", ContiguousCache, "13.KVCache.returns_copies"),
    Wrong("returns torch.cat of cached and new", CatReturnCache, "13.KVCache.returns_copies"),
    Wrong("returns repeated KV heads", RepeatedReturnCache, "13.KVCache.returns_repeated_heads"),
    Wrong("writes K only", KOnlyWrittenCache, "13.KVCache.v_not_written"),
    Wrong("overflow test on start_pos only", OverflowStartOnlyCache,
          "13.KVCache.overflow_check_ignores_t"),
]


# ------------------------------------------------------------------------------------------------
# forward_with_cache: plausible wrong implementations, from the earlier chapters' pieces

def _forward(token_ids, params, cfg, cache, start_pos, *, offset=True, mask="bottom_right",
             store="rotated", use_returned=True, repeat=False, update_start=None,
             only_layer=None, scale_h=False, first_position=0, last_only=False,
             tokens_first=False, update_twice=False, embed=ref.embed,
             attend=ref.grouped_query_attention):
    t = token_ids.shape[1]
    end = start_pos + t
    positions = torch.arange(start_pos, end) if offset else torch.arange(t)
    positions = positions + first_position   # 1: positions counted from 1
    rope = dict(base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    x = embed(token_ids, params["embed"])
    for i, layer in enumerate(params["layers"]):
        h = ref.rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        q, k, v = ref.split_qkv(h @ layer["wqkv"], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
        q = ref.apply_rope(q, positions, **rope)
        k_rot = ref.apply_rope(k, positions, **rope)
        stored = k_rot if store == "rotated" else k
        if repeat:
            g = cfg.n_heads // cfg.n_kv_heads
            stored, v = stored.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        if tokens_first:   # [B, T, N_kv, D_h], the layout before split_heads' transpose
            stored, v = stored.transpose(1, 2), v.transpose(1, 2)
        if only_layer is None or i == only_layer:
            k_all, v_all = cache.update(i if only_layer is None else 0, stored, v,
                                        start_pos if update_start is None else update_start)
        if update_twice:   # once for K, once again "for V"
            _, v_all = cache.update(i, stored, v, start_pos)
        if store == "rerotate":
            k_all = ref.apply_rope(k_all, torch.arange(end), **rope)
        if not use_returned:
            k_all, v_all = k_rot, v
        keys = k_all.shape[2]
        m = {"bottom_right": ref.causal_mask(t, keys),
             "top_left": torch.ones(t, keys, dtype=torch.bool).tril(),
             "top_left_chunks": None if t == 1 else torch.ones(t, keys, dtype=torch.bool).tril(),
             "square_new": ref.causal_mask(t),
             "square_all": ref.causal_mask(keys),
             "none": None}[mask]
        if scale_h:   # scores / sqrt(H): attention's own 1/sqrt(D_h) times sqrt(D_h / H)
            q = q * math.sqrt(cfg.head_dim / cfg.hidden_size)
        out = attend(q, k_all, v_all, m)
        x = x + ref.merge_heads(out) @ layer["wo"]
        x = x + ref.swiglu_ffn(ref.rms_norm(x, layer["ffn_norm"], cfg.norm_eps),
                               layer["w_gate"], layer["w_up"], layer["w_down"])
    if last_only:   # chapter 12's last_only, where every position's logits are asked for
        x = x[:, -1:]
    return ref.rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"]


def _own_attention(q, k, v, mask=None):
    """Attention written out: K/V repeated, the mask added as 0 / -inf."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _fwd(**mistake):
    def forward_with_cache(token_ids, params, cfg, cache, start_pos):
        return _forward(token_ids, params, cfg, cache, start_pos, **mistake)
    return forward_with_cache


def _calls_reference(token_ids, params, cfg, cache, start_pos):
    return ref.forward_with_cache(token_ids, params, cfg, cache, start_pos)


FORWARD_WRONG = [
    Wrong("positions 0..T-1", _fwd(offset=False),
          "13.forward_with_cache.decode_positions_not_offset"),
    Wrong("top-left mask", _fwd(mask="top_left"), "13.forward_with_cache.top_left_mask"),
    Wrong("top-left mask for chunks only", _fwd(mask="top_left_chunks"),
          "13.forward_with_cache.top_left_mask"),
    Wrong("no mask", _fwd(mask="none"), "13.forward_with_cache.no_causal_mask"),
    Wrong("square causal_mask(T)", _fwd(mask="square_new"),
          "13.forward_with_cache.square_mask_of_new_tokens"),
    # its own attention raises another error than the replays of either square mask
    Wrong("square causal_mask(T), own attention", _fwd(mask="square_new", attend=_own_attention),
          "13.forward_with_cache.square_mask"),
    Wrong("square causal_mask(start_pos + T)", _fwd(mask="square_all"),
          "13.forward_with_cache.square_mask_of_all_keys"),
    Wrong("ignores the cache", _fwd(use_returned=False),
          "13.forward_with_cache.ignores_the_cache"),
    Wrong("stores K before RoPE", _fwd(store="raw"),
          "13.forward_with_cache.cache_stores_k_before_rope"),
    Wrong("stores K before RoPE, re-rotates", _fwd(store="rerotate"),
          "13.forward_with_cache.cache_stores_k_before_rope_rotates_again"),
    Wrong("repeated heads into the cache", _fwd(repeat=True),
          "13.forward_with_cache.cache_gets_repeated_heads"),
    Wrong("update at start_pos 0", _fwd(update_start=0),
          "13.forward_with_cache.update_at_wrong_start_pos"),
    Wrong("only layer 0 cached", _fwd(only_layer=0), "13.forward_with_cache.layer_not_cached"),
    Wrong("calls the reference", _calls_reference,
          "13.forward_with_cache.calls_course_reference"),
    Wrong("scores scaled by sqrt(H)", _fwd(scale_h=True),
          "13.forward_with_cache.scaled_by_sqrt_h"),
    Wrong("positions counted from 1", _fwd(first_position=1),
          "13.forward_with_cache.positions_one_too_far"),
    Wrong("logits of the last position only", _fwd(last_only=True),
          "13.forward_with_cache.returns_last_position_only"),
    Wrong("K/V tokens-first into the cache", _fwd(tokens_first=True),
          "13.forward_with_cache.kv_not_heads_first"),
    Wrong("update called twice per layer", _fwd(update_twice=True),
          "13.forward_with_cache.update_not_once_per_layer"),
]


# ------------------------------------------------------------------------------------------------
# generate: plausible wrong implementations

def _generate(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True, temperature=0.0,
              generator=None, mistake=None, forward=None):
    forward = forward or ref.forward_with_cache
    use_cache = use_cache or mistake == "uncached uses cache"
    b, p = prompt_ids.shape
    tokens = prompt_ids.clone()
    seed = generator.initial_seed() if generator is not None else None
    if mistake == "fresh generator per call" and generator is not None:
        generator = torch.Generator().manual_seed(seed)
    n = max_new_tokens + (mistake == "one too many") - (mistake == "one too few")
    cache = ref.KVCache(cfg, b, p + 2 * n + 2)
    with torch.no_grad():
        for step in range(n):
            if mistake == "prefill by token" and step == 0 and use_cache:
                for j in range(p):
                    logits = forward(prompt_ids[:, j:j + 1], params, cfg, cache, j)
            elif not use_cache or mistake == "recompute":
                logits = model_forward(tokens, params, cfg) if not use_cache else \
                    forward(tokens, params, cfg, cache, 0)
            elif step == 0:
                logits = forward(prompt_ids, params, cfg, cache, 0)
            else:
                start = {"not advanced": p, "skip": p + step}.get(mistake, p + step - 1)
                last = tokens[:, -1] if mistake == "1-D decode tokens" else tokens[:, -1:]
                logits = forward(last, params, cfg, cache, start)
            row = logits[:, 0] if mistake == "first position" and step == 0 else logits[:, -1]
            generator = _reseeded(generator, mistake, seed)
            nxt = sample_next_token(
                row, temperature=0.0 if mistake == "greedy always" else temperature,
                generator=None if mistake == "global rng" else generator)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
        if n and mistake == "wasted forward" and use_cache:    # feeds the last token back
            forward(tokens[:, -1:], params, cfg, cache, tokens.shape[1] - 1)
        if n and mistake in ("wasted forward", "wasted forward uncached") and not use_cache:
            model_forward(tokens, params, cfg)
        if not n and mistake == "prefill anyway" and use_cache:
            forward(prompt_ids, params, cfg, cache, 0)
    return tokens[:, p:] if mistake == "new only" else tokens


def _reseeded(generator, mistake, seed):
    """The generator a re-seeding generate draws with at this step."""
    if generator is None or mistake not in ("reseed every step", "new generator every step"):
        return generator
    if mistake == "reseed every step":
        return generator.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _gen(mistake=None, forward=None):
    def generate(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True, temperature=0.0,
                 generator=None):
        return _generate(params, cfg, prompt_ids, max_new_tokens, use_cache=use_cache,
                         temperature=temperature, generator=generator, mistake=mistake,
                         forward=forward)
    return generate


def _late_last_token(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True,
                     temperature=0.0, generator=None):
    """Correct too: prefill P-1 tokens, then feed the last prompt token as the first step."""
    b, p = prompt_ids.shape
    tokens = prompt_ids.clone()
    cache = ref.KVCache(cfg, b, p + max_new_tokens)
    with torch.no_grad():
        if max_new_tokens and p > 1 and use_cache:
            ref.forward_with_cache(prompt_ids[:, :-1], params, cfg, cache, 0)
        for step in range(max_new_tokens):
            pos = tokens.shape[1] - 1
            if use_cache:
                logits = ref.forward_with_cache(tokens[:, -1:], params, cfg, cache, pos)
            else:
                logits = model_forward(tokens, params, cfg)
            nxt = sample_next_token(logits[:, -1], temperature=temperature,
                                        generator=generator)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
    return tokens


def _uncached_by_fresh_caches(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True,
                              temperature=0.0, generator=None):
    """Correct too: without the cache, each step runs forward_with_cache over the whole sequence
    with a fresh cache (the same work as model_forward)."""
    if use_cache:
        return _generate(params, cfg, prompt_ids, max_new_tokens, temperature=temperature,
                         generator=generator)
    tokens = prompt_ids.clone()
    with torch.no_grad():
        for _step in range(max_new_tokens):
            cache = ref.KVCache(cfg, tokens.shape[0], tokens.shape[1])
            logits = ref.forward_with_cache(tokens, params, cfg, cache, 0)
            nxt = sample_next_token(logits[:, -1], temperature=temperature, generator=generator)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
    return tokens


def _rolls_the_prompt(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True,
                      temperature=0.0, generator=None):
    """Right tokens, but the prompt's tensor doubles as a rolling window of the last P tokens."""
    out = _generate(params, cfg, prompt_ids, max_new_tokens, use_cache=use_cache,
                    temperature=temperature, generator=generator)
    if max_new_tokens:
        prompt_ids.copy_(out[:, -prompt_ids.shape[1]:])
    return out


def _calls_reference_generate(params, cfg, prompt_ids, max_new_tokens, **kwargs):
    return ref.generate(params, cfg, prompt_ids, max_new_tokens, **kwargs)


GENERATE_WRONG = [
    Wrong("whole sequence every step", _gen("recompute"), "13.generate.recomputes_whole_sequence"),
    Wrong("embedding by a one-hot einsum", _gen(forward=lambda *a: _forward(
        *a, embed=_embed_by_einsum)), "13.generate.embedding_not_read_from_params"),
    Wrong("start_pos stuck at P", _gen("not advanced"), "13.generate.start_pos_not_advanced"),
    Wrong("start_pos one too far", _gen("skip"), "13.generate.start_pos_one_too_far"),
    Wrong("logits of position 0", _gen("first position"), "13.generate.logits_of_first_position"),
    Wrong("returns new tokens only", _gen("new only"), "13.generate.returns_new_tokens_only"),
    Wrong("one token too many", _gen("one too many"), "13.generate.one_token_too_many"),
    Wrong("one token too few", _gen("one too few"), "13.generate.one_token_too_few"),
    Wrong("feeds the last token back (wasted forward)", _gen("wasted forward"),
          "13.generate.forward_after_last_token"),
    Wrong("wasted forward without the cache", _gen("wasted forward uncached"),
          "13.generate.uncached_forward_after_last_token"),
    Wrong("prefill for max_new_tokens=0", _gen("prefill anyway"),
          "13.generate.forward_for_zero_tokens"),
    Wrong("prompt one token at a time", _gen("prefill by token"),
          "13.generate.prefill_one_token_at_a_time"),
    Wrong("always greedy", _gen("greedy always"), "13.generate.temperature_not_passed_on"),
    Wrong("global RNG", _gen("global rng"), "13.generate.generator_not_passed_on"),
    Wrong("re-seeds the generator every step", _gen("reseed every step"),
          "13.generate.generator_reseeded"),
    Wrong("a new generator from its seed every step", _gen("new generator every step"),
          "13.generate.generator_reseeded"),
    Wrong("a new generator from its seed every call", _gen("fresh generator per call"),
          "13.generate.generator_reseeded"),
    Wrong("forward without offset", _gen(forward=_fwd(offset=False)),
          "13.generate.decode_positions_not_offset"),
    Wrong("forward with top-left mask", _gen(forward=_fwd(mask="top_left")),
          "13.generate.top_left_mask"),
    Wrong("calls the reference", _calls_reference_generate,
          "13.generate.calls_course_reference"),
    Wrong("use_cache=False uses the cache anyway", _gen("uncached uses cache"),
          "13.generate.uncached_path_uses_the_cache"),
    Wrong("forward stores K before RoPE", _gen(forward=_fwd(store="raw")),
          "13.generate.cache_stores_k_before_rope"),
    Wrong("forward ignores the cache", _gen(forward=_fwd(use_returned=False)),
          "13.generate.ignores_the_cache"),
    Wrong("keeps a rolling window in prompt_ids", _rolls_the_prompt,
          "13.generate.changes_prompt_in_place"),
    Wrong("decode tokens as [B]", _gen("1-D decode tokens"),
          "13.generate.decode_tokens_without_sequence_axis"),
    Wrong("decode tokens as [B], solution-style forward", _gen("1-D decode tokens", _fwd()),
          "13.generate.decode_tokens_without_sequence_axis"),
]


# ------------------------------------------------------------------------------------------------
# generate's sampling path and configurations whose sizes are not tied together: samplers and
# shortcuts a learner writes without the solution at hand

def _s_multinomial(row, t, g):
    return torch.multinomial(torch.softmax(row / t, -1), 1, generator=g)[:, 0]


def _s_inverse_cdf(row, t, g):
    p = torch.softmax(row.double() / t, -1)
    u = torch.rand(p.shape[0], 1, generator=g, dtype=torch.float64)
    return torch.searchsorted(p.cumsum(-1), u)[:, 0].clamp(max=p.shape[-1] - 1)


def _s_power(row, t, g):      # softmax(logits) ** (1/T), renormalised: softmax(logits / T) too
    return torch.multinomial(torch.softmax(row, -1) ** (1 / t), 1, generator=g)[:, 0]


SAMPLERS = {
    "reference": lambda row, t, g: sample_next_token(row, temperature=t, generator=g),
    "multinomial": _s_multinomial,
    "inverse_cdf": _s_inverse_cdf,
    "power": _s_power,
    "softmax twice": lambda row, t, g: torch.multinomial(
        torch.softmax(torch.softmax(row / t, -1), -1), 1, generator=g)[:, 0],
    "T twice": lambda row, t, g: sample_next_token(row / t, temperature=t, generator=g),
    "T ignored": lambda row, t, g: torch.multinomial(torch.softmax(row, -1), 1,
                                                     generator=g)[:, 0],
    "T after softmax": lambda row, t, g: torch.multinomial(torch.softmax(row, -1) / t, 1,
                                                           generator=g)[:, 0],
    "T times": lambda row, t, g: torch.multinomial(torch.softmax(row * t, -1), 1,
                                                   generator=g)[:, 0],
    "exp without max": lambda row, t, g: torch.multinomial(
        torch.exp(row / t) / torch.exp(row / t).sum(-1, keepdim=True), 1, generator=g)[:, 0],
    "softmax dim 0": lambda row, t, g: torch.multinomial(torch.softmax(row / t, 0), 1,
                                                         generator=g)[:, 0],
    "fixed seed when None": lambda row, t, g: sample_next_token(
        row, temperature=t, generator=g or torch.Generator().manual_seed(0)),
    "greedy": lambda row, t, g: row.argmax(-1),
    "no generator": lambda row, t, g: sample_next_token(row, temperature=t),
}


def _sampling(sampler, uncached=None, *, none_seeded=None, squeeze=False):
    """generate with its own sampler (`uncached`: another one without the cache); none_seeded:
    "generator" (a seeded one stands in for None) or "global" (torch.manual_seed(0))."""
    def generate(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True, temperature=0.0,
                 generator=None):
        if none_seeded == "global" and generator is None:
            torch.manual_seed(0)
        if none_seeded == "generator" and generator is None:
            generator = torch.Generator().manual_seed(1234)
        b, p = prompt_ids.shape
        tokens = prompt_ids.clone()
        cache = ref.KVCache(cfg, b, p + max_new_tokens + 1)
        draw = SAMPLERS[sampler if use_cache or uncached is None else uncached]
        with torch.no_grad():
            for step in range(max_new_tokens):
                if not use_cache:
                    logits = model_forward(tokens, params, cfg)
                elif step == 0:
                    logits = _forward(prompt_ids, params, cfg, cache, 0)
                else:
                    logits = _forward(tokens[:, -1:], params, cfg, cache, p + step - 1)
                row = logits[:, -1].squeeze() if squeeze else logits[:, -1]
                nxt = row.argmax(-1) if temperature == 0 else draw(row, temperature, generator)
                tokens = torch.cat([tokens, nxt[:, None]], 1)
        return tokens
    return generate


def _with_cfg(**changes):
    """forward_with_cache reading some sizes its own way (a callable: from the config)."""
    def forward_with_cache(token_ids, params, cfg, cache, start_pos):
        mine = dataclasses.replace(cfg, **{k: v(cfg) if callable(v) else v
                                           for k, v in changes.items()})
        return _forward(token_ids, params, mine, cache, start_pos)
    return forward_with_cache


def _embed_by_einsum(token_ids, table):
    """The embedding as a one-hot einsum, which the check cannot count as a lookup."""
    return torch.einsum("bsv,vh->bsh", F.one_hot(token_ids, table.shape[0]).to(table.dtype),
                        table)


def _gen_with_cfg(**changes):
    return _gen(forward=_with_cfg(**changes))


def _head_dim_from_h(cfg):
    return cfg.hidden_size // cfg.n_heads


class HeadDimFromHCache(_correct(nb13.check_KVCache)):
    """Sizes the head dimension as H // N_h."""

    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):
        super().__init__(dataclasses.replace(cfg, head_dim=_head_dim_from_h(cfg)), batch_size,
                         max_seq_len, dtype=dtype, device=device)


SAMPLING_WRONG = [
    Wrong("samples a softmax of the softmax", _sampling("softmax twice"),
          "13.generate.softmax_of_probabilities"),
    Wrong("temperature applied twice", _sampling("T twice"),
          "13.generate.temperature_applied_twice"),
    Wrong("temperature dropped", _sampling("T ignored"), "13.generate.sampled_at_temperature_one"),
    Wrong("temperature dropped without the cache", _sampling("reference", "T ignored"),
          "13.generate.sampled_at_temperature_one"),
    Wrong("temperature after the softmax", _sampling("T after softmax"),
          "13.generate.sampled_at_temperature_one"),
    Wrong("logits times the temperature", _sampling("T times"),
          "13.generate.logits_times_temperature"),
    Wrong("softmax without subtracting the max", _sampling("exp without max"),
          "13.generate.softmax_overflows"),
    Wrong("softmax over the batch axis", _sampling("softmax dim 0"),
          "13.generate.softmax_over_batch_axis"),
    Wrong("seeded generator when None", _sampling("reference", none_seeded="generator"),
          "13.generate.fixed_seed_without_generator"),
    Wrong("torch.manual_seed(0) when None", _sampling("reference", none_seeded="global"),
          "13.generate.fixed_seed_without_generator"),
    Wrong("sampler seeds its own generator", _sampling("fixed seed when None"),
          "13.generate.fixed_seed_without_generator"),
    Wrong("greedy without the cache", _sampling("reference", "greedy"),
          "13.generate.temperature_not_passed_on"),
    Wrong("generator dropped without the cache", _sampling("reference", "no generator"),
          "13.generate.generator_not_passed_on"),
    Wrong("logits row squeezed", _sampling("multinomial", squeeze=True),
          "13.generate.batch_axis_squeezed"),
    Wrong("forward with rope base 10000", _gen_with_cfg(rope_base=10000.0),
          "13.generate.rope_base_ignored"),
]
FORWARD_WRONG += [
    Wrong("rope base 10000", _with_cfg(rope_base=10000.0),
          "13.forward_with_cache.rope_base_ignored"),
    Wrong("eps 1e-5", _with_cfg(norm_eps=1e-5), "13.forward_with_cache.norm_eps_ignored"),
    Wrong("head_dim = H // N_h", _with_cfg(head_dim=_head_dim_from_h),
          "13.forward_with_cache.head_dim_from_hidden_size"),
    Wrong("rotary over the whole head", _with_cfg(rotary_dim=lambda cfg: cfg.head_dim),
          "13.forward_with_cache.rotary_dim_ignored"),
]
KV_WRONG += [
    Wrong("head_dim = H // N_h", HeadDimFromHCache, "13.KVCache.head_dim_from_hidden_size"),
]
GENERATE_WRONG += SAMPLING_WRONG

# ------------------------------------------------------------------------------------------------
# The roofline's arithmetic: the count a learner writes, with one mistake each

def _learner_prefill(mistake=None):
    """Prefill FLOPs written per token, the way the chapter's text counts, with `mistake`."""
    def prefill_flops(cfg, batch, seq_len):
        h, d, n_h, h_ff = cfg.hidden_size, cfg.head_dim, cfg.n_heads, cfg.ffn_hidden_size
        n_kv = n_h if mistake == "repeated KV heads" else cfg.n_kv_heads
        heads_width = h if mistake == "H for N_h D_h" else n_h * d
        per_token = (h * heads_width + 2 * h * n_kv * d          # W_Q, W_K, W_V
                     + (0 if mistake == "no W_O" else heads_width * h)
                     + (2 if mistake == "two FFN matrices" else 3) * h * h_ff)
        tokens = seq_len if mistake == "no batch" else batch * seq_len
        b = 1 if mistake == "no batch" else batch
        pairs = seq_len * seq_len if mistake == "square" else seq_len * (seq_len + 1) // 2
        products = {"no attention": 0, "scores only": 1}.get(mistake, 2)
        attn_heads = cfg.n_kv_heads if mistake == "attention on KV heads" else n_h
        attention = products * b * attn_heads * pairs * d
        layers = 1 if mistake == "one layer" else cfg.n_layers
        lm_rows = {"LM head everywhere": tokens, "no LM head": 0}.get(mistake, b)
        total = layers * (tokens * per_token + attention) + lm_rows * h * cfg.vocab_size
        if mistake == "embedding as a product":
            total += tokens * cfg.vocab_size * h
        if mistake == "float":
            return 2.0 * total
        return total if mistake == "no factor 2" else 2 * total
    return prefill_flops


def _learner_decode(mistake=None):
    """Decode-step bytes: chapter 12's parameter count without the embedding table, plus
    chapter 06's cache size for C + 1 positions; with `mistake`."""
    def decode_step_bytes(cfg, batch, context_len, bytes_per_elem):
        s = 2 if mistake == "hard-coded 2 bytes" else bytes_per_elem
        weights = model_param_count(cfg) - cfg.vocab_size * cfg.hidden_size
        if mistake == "whole embedding table":
            weights += cfg.vocab_size * cfg.hidden_size
        if mistake == "no LM head":
            weights -= cfg.hidden_size * cfg.vocab_size
        if mistake == "no norms":
            weights -= (2 * cfg.n_layers + 1) * cfg.hidden_size
        if mistake == "weights per sequence":
            weights *= batch
        if mistake == "one layer's weights":
            per_layer = (model_param_count(cfg) - 2 * cfg.vocab_size * cfg.hidden_size
                         - cfg.hidden_size) // cfg.n_layers
            weights -= (cfg.n_layers - 1) * per_layer
        positions = {"no cache write": context_len,
                     "new position twice": context_len + 2}.get(mistake, context_len + 1)
        heads = cfg.n_heads if mistake == "repeated KV heads" else cfg.n_kv_heads
        b = 1 if mistake == "cache without batch" else batch
        layers = 1 if mistake == "one layer's cache" else cfg.n_layers
        cache = ref.kv_cache_bytes(layers, b, positions, heads, cfg.head_dim, 1)
        if mistake == "K only":
            cache //= 2
        if mistake == "elements":
            return weights + cache
        if mistake == "bytes for the weights only":
            return weights * s + cache
        if mistake == "bytes for the cache only":
            return weights + cache * s
        total = (weights + cache) * s
        if mistake == "GiB":
            return total / 2**30
        if mistake == "GB":
            return total / 1e9
        return total * 8 if mistake == "bits" else total
    return decode_step_bytes


def _learner_intensity(mistake=None):
    def arithmetic_intensity(flops, num_bytes):
        if mistake == "tensor":
            return torch.tensor(flops) / num_bytes
        if mistake == "inverted":
            return num_bytes / flops
        if mistake == "floor division":
            return flops // num_bytes
        if mistake == "floor division, then float":
            return float(flops // num_bytes)
        if mistake == "bits":
            return flops / (8 * num_bytes)
        if mistake == "doubled":
            return 2 * flops / num_bytes
        return flops / num_bytes
    return arithmetic_intensity


PREFILL_WRONG = [
    Wrong("no factor 2", _learner_prefill("no factor 2"),
          "13.prefill_flops.multiply_add_as_one_flop"),
    Wrong("no attention", _learner_prefill("no attention"),
          "13.prefill_flops.no_attention_products"),
    Wrong("full square, not the causal triangle", _learner_prefill("square"),
          "13.prefill_flops.full_square_of_scores"),
    Wrong("scores only", _learner_prefill("scores only"), "13.prefill_flops.scores_only"),
    Wrong("attention on the KV heads", _learner_prefill("attention on KV heads"),
          "13.prefill_flops.attention_on_kv_heads"),
    Wrong("repeated KV heads", _learner_prefill("repeated KV heads"),
          "13.prefill_flops.kv_projections_for_n_h_heads"),
    Wrong("H for N_h·D_h", _learner_prefill("H for N_h D_h"),
          "13.prefill_flops.h_for_n_h_times_d_h"),
    Wrong("LM head on every position", _learner_prefill("LM head everywhere"),
          "13.prefill_flops.lm_head_on_every_position"),
    Wrong("no LM head", _learner_prefill("no LM head"), "13.prefill_flops.no_lm_head"),
    Wrong("no batch", _learner_prefill("no batch"), "13.prefill_flops.no_batch"),
    Wrong("one layer", _learner_prefill("one layer"), "13.prefill_flops.one_layer"),
    Wrong("two FFN matrices", _learner_prefill("two FFN matrices"),
          "13.prefill_flops.two_ffn_matrices"),
    Wrong("no W_O", _learner_prefill("no W_O"), "13.prefill_flops.no_w_o"),
    Wrong("embedding as a product", _learner_prefill("embedding as a product"),
          "13.prefill_flops.embedding_as_a_product"),
    Wrong("returns a float", _learner_prefill("float"), "13.prefill_flops.returns_float"),
]

DECODE_WRONG = [
    Wrong("K only in the cache", _learner_decode("K only"), "13.decode_step_bytes.cache_k_only"),
    Wrong("divided by 1 (a float)", lambda *args: _learner_decode()(*args) / 1,
          "13.decode_step_bytes.returns_float"),
    Wrong("forgot the cache write", _learner_decode("no cache write"),
          "13.decode_step_bytes.no_cache_write"),
    Wrong("repeated KV heads", _learner_decode("repeated KV heads"),
          "13.decode_step_bytes.cache_with_n_h_heads"),
    Wrong("elements, not bytes", _learner_decode("elements"),
          "13.decode_step_bytes.elements_not_bytes"),
    Wrong("bits", _learner_decode("bits"), "13.decode_step_bytes.bits_not_bytes"),
    Wrong("whole embedding table", _learner_decode("whole embedding table"),
          "13.decode_step_bytes.whole_embedding_table"),
    Wrong("no LM head", _learner_decode("no LM head"), "13.decode_step_bytes.no_lm_head"),
    Wrong("no norm scales", _learner_decode("no norms"), "13.decode_step_bytes.no_norm_scales"),
    Wrong("weights once per sequence", _learner_decode("weights per sequence"),
          "13.decode_step_bytes.weights_once_per_sequence"),
    Wrong("cache without the batch", _learner_decode("cache without batch"),
          "13.decode_step_bytes.cache_without_batch"),
    Wrong("hard-coded 2 bytes", _learner_decode("hard-coded 2 bytes"),
          "13.decode_step_bytes.hard_coded_2_bytes"),
    Wrong("returns GiB", _learner_decode("GiB"), "13.decode_step_bytes.returns_gib"),
    Wrong("returns GB", _learner_decode("GB"), "13.decode_step_bytes.returns_gb"),
    Wrong("one layer's cache", _learner_decode("one layer's cache"),
          "13.decode_step_bytes.one_layer_of_cache"),
    Wrong("one layer's weights", _learner_decode("one layer's weights"),
          "13.decode_step_bytes.one_layer_of_weights"),
    Wrong("bytes_per_elem for the weights only", _learner_decode("bytes for the weights only"),
          "13.decode_step_bytes.bytes_per_elem_for_weights_only"),
    Wrong("new position counted twice", _learner_decode("new position twice"),
          "13.decode_step_bytes.new_position_twice"),
    Wrong("bytes_per_elem for the cache only", _learner_decode("bytes for the cache only"),
          "13.decode_step_bytes.bytes_per_elem_for_cache_only"),
]

INTENSITY_WRONG = [
    Wrong("bytes per FLOP", _learner_intensity("inverted"),
          "13.arithmetic_intensity.bytes_per_flop"),
    Wrong("floor division", _learner_intensity("floor division"),
          "13.arithmetic_intensity.returns_int"),
    Wrong("FLOPs doubled", _learner_intensity("doubled"),
          "13.arithmetic_intensity.flops_counted_twice"),
    Wrong("floor division, then float", _learner_intensity("floor division, then float"),
          "13.arithmetic_intensity.floor_division"),
    Wrong("returns a tensor", _learner_intensity("tensor"),
          "13.arithmetic_intensity.returns_no_float"),
    Wrong("divided by bits", _learner_intensity("bits"),
          "13.arithmetic_intensity.divided_by_bits"),
]


def _calls_timing(cfg, batch, seq_len):
    from checks.reference import roofline
    return roofline.prefill_flops(cfg, batch, seq_len)


def test_calling_the_course_formulas_is_a_forbidden_call():
    with pytest.raises(ForbiddenCall):
        nb13.check_prefill_flops(_calls_timing, seed=0)
    with pytest.raises(ForbiddenCall):
        nb13.check_decode_step_bytes(lambda *a: ref.decode_step_bytes(*a), seed=0)


def test_the_reference_counts_agree_with_the_roofline_module():
    """Two formulations of the same counts (per operation here, per token in
    checks.reference.roofline, whose tests hold it to PyTorch's FLOP counter)."""
    from checks import LLAMA2_7B
    from checks.reference import roofline as timing

    cfgs = CFGS + [LLAMA2_7B, ModelConfig(vocab_size=49152, hidden_size=576, n_heads=9,
                                          n_kv_heads=3, ffn_hidden_size=1536, n_layers=30)]
    for cfg in cfgs:
        for batch, length in ((1, 1), (3, 17), (8, 512)):
            assert ref.prefill_flops(cfg, batch, length) == timing.prefill_flops(cfg, batch,
                                                                                length)
            for s in (1, 2, 4):
                assert ref.decode_step_bytes(cfg, batch, length, s) == \
                    timing.decode_bytes(cfg, batch, length, s)
    # The chapter's worked numbers: LLaMA-2-7B, bf16.
    flops = ref.prefill_flops(LLAMA2_7B, 1, 512)
    assert flops == 6_700_545_343_488
    assert ref.decode_step_bytes(LLAMA2_7B, 1, 512, 2) == 13_483_646_976
    assert 0.9 < ref.arithmetic_intensity(timing.decode_flops(LLAMA2_7B, 1, 511),
                                          ref.decode_step_bytes(LLAMA2_7B, 1, 511, 2)) < 1.0


WRONG = {
    nb13.check_KVCache: KV_WRONG,
    nb13.check_forward_with_cache: FORWARD_WRONG,
    nb13.check_generate: GENERATE_WRONG,
    nb13.check_prefill_flops: PREFILL_WRONG,
    nb13.check_decode_step_bytes: DECODE_WRONG,
    nb13.check_arithmetic_intensity: INTENSITY_WRONG,
}


# The correct answers: the reference (a copy), and the ways a learner might write them
CORRECT = {
    nb13.check_KVCache: {"reference": _correct(nb13.check_KVCache), "ListCache": ListCache,
                         "EmptyDictCache": EmptyDictCache},
    nb13.check_forward_with_cache: {"reference": _correct(nb13.check_forward_with_cache),
                                    "solution_style": _fwd()},
    nb13.check_generate: {"reference": _correct(nb13.check_generate),
                          "solution_style": _gen(), "late_token": _late_last_token,
                          "uncached_by_fresh_caches": _uncached_by_fresh_caches,
                          "multinomial sampler": _sampling("multinomial"),
                          "inverse-CDF sampler": _sampling("inverse_cdf"),
                          "softmax ** (1/T) sampler": _sampling("power")},
    nb13.check_prefill_flops: {"reference": _correct(nb13.check_prefill_flops),
                               "learner_style": _learner_prefill()},
    nb13.check_decode_step_bytes: {"reference": _correct(nb13.check_decode_step_bytes),
                                   "learner_style": _learner_decode()},
    nb13.check_arithmetic_intensity: {"reference": _correct(nb13.check_arithmetic_intensity),
                                      "learner_style": _learner_intensity()},
}
EXERCISES = exercises(CORRECT, WRONG)


def test_calling_the_reference_is_a_forbidden_call():
    with pytest.raises(ForbiddenCall):
        nb13.check_forward_with_cache(_calls_reference, seed=0)
    with pytest.raises(ForbiddenCall):
        nb13.check_generate(_calls_reference_generate, seed=0)


def test_counting_table_sees_every_kind_of_lookup():
    recorder = nb13_generate._Recorder()
    log = recorder.items
    table = nb13._CountingTable.wrap(torch.randn(10, 4), recorder)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    F.embedding(ids, table)
    _ = table[ids]
    _ = table.to(torch.float32).contiguous()[ids[:, -1:]]
    _ = torch.index_select(table, 0, ids.flatten())
    _ = F.one_hot(ids, 10).float() @ table
    _ = ref.embed(ids, table)
    assert log == [6, 6, 2, 6, 6, 6]
    assert type(F.embedding(ids, table)) is torch.Tensor
    assert table.shape == (10, 4) and table.dtype == torch.float32


def test_recorders_stay_in_the_grading_process():
    """When grading runs the learner's code in a worker, what the checks hand over is pickled,
    except what must stay in the grader (bound methods, the checks' callables), which is lent
    and called back: the cache handle's `update` and the counting table's log must be such."""
    import io

    from checks.grader import worker as sandbox  # Worker and its pickler: worker.py

    class Library:                      # the worker's copy of `checks` has every module
        def has(self, module, qualname):
            return True

    lent = []

    class Session:
        def lend(self, obj):
            lent.append(obj)
            return len(lent)

    worker = types.SimpleNamespace(library=Library(), session=Session())
    worker._stays_here = lambda obj: sandbox.Worker._stays_here(worker, obj)
    cfg = CFGS[0]
    cache = nb13_cache._RecordingCache(None, cfg, 2, 5)
    handle = nb13_cache._CacheHandle(cache)
    recorder = nb13_generate._Recorder()
    table = nb13._CountingTable.wrap(torch.randn(4, 3), recorder)
    with torch._C.DisableTorchFunction():
        sandbox._ArgPickler(io.BytesIO(), worker, False).dump(((handle, {"embed": table}), {}))
    assert any(obj == cache.update for obj in lent)
    assert any(obj is recorder for obj in lent)


def test_chapter_13_reads_in_chinese(monkeypatch):
    from checks.environment import LANG_ENV
    from checks.engine import CheckFailure
    monkeypatch.setenv(LANG_ENV, "zh")
    with pytest.raises(CheckFailure) as info:
        nb13.check_KVCache(GreaterEqualCache, seed=1)
    text = str(info.value)
    assert info.value.mistake == "13.KVCache.raises_when_exactly_full"
    assert "引发了 ValueError" in text and "恰好写到最后一个位置时报错了" in text, text
    assert "likely mistake" not in text and "raised" not in text
    wrong = {w.name: w for w in GENERATE_WRONG}
    failure = next(w for name, w in wrong.items() if "stuck" in name)
    with pytest.raises(CheckFailure) as info:
        nb13.check_generate(failure.fn, seed=1)
    assert info.value.mistake == "13.generate.start_pos_not_advanced"
    assert "缓存没有前进" in str(info.value), str(info.value)


# ------------------------------------------------------------------------------------------------
# Knock-on failures in the self-check (issue 33): generate built, as the notebook builds it, on
# the learner's own KVCache and forward_with_cache names a broken one "fix it first" (KVCache,
# the earlier exercise, when both are broken), never its mistake a second time under generate.

_LEARNER_GENERATE = '''
class KVCache(_Cache):
    def update(self, layer_idx, k, v, start_pos):
        return super().update(layer_idx, k, v, start_pos)

def forward_with_cache(token_ids, params, cfg, cache, start_pos):
    return _forward_with_cache(token_ids, params, cfg, cache, start_pos)

def generate(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True, temperature=0.0,
             generator=None):
    tokens = prompt_ids.clone()
    if max_new_tokens == 0:
        return tokens
    with torch.no_grad():
        if use_cache:
            cache = KVCache(cfg, tokens.shape[0], tokens.shape[1] + max_new_tokens)
            logits = forward_with_cache(tokens, params, cfg, cache, 0)
        else:
            logits = model_forward(tokens, params, cfg)
        for step in range(max_new_tokens):
            nxt = sample_next_token(logits[:, -1], temperature=temperature, generator=generator)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            if step + 1 == max_new_tokens:
                break
            if use_cache:
                logits = forward_with_cache(tokens[:, -1:], params, cfg, cache,
                                            tokens.shape[1] - 1)
            else:
                logits = model_forward(tokens, params, cfg)
    return tokens
'''


def _learner_generate(cache=ListCache, forward=None):
    from ..support.cells import learner_cell
    ns = learner_cell(_LEARNER_GENERATE, _Cache=cache, _forward_with_cache=forward or _fwd(),
                      model_forward=model_forward, sample_next_token=sample_next_token)
    return ns["generate"]


def _generate_mistake(cache=ListCache, forward=None, seed=0) -> str | None:
    import contextlib
    import io

    from checks.engine import CheckFailure
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nb13.check_generate(_learner_generate(cache, forward), seed=seed)
    except CheckFailure as failure:
        return failure.mistake
    return None


def test_generate_on_the_learners_own_right_pieces_passes():
    assert _generate_mistake() is None


def test_generate_on_a_broken_kv_cache_is_named_fix_it_first():
    assert _generate_mistake(cache=OffByOneWriteCache) == "13.generate.fix_kvcache_first"


def test_generate_on_a_broken_forward_with_cache_is_named_fix_it_first():
    assert _generate_mistake(forward=_fwd(offset=False)) == \
        "13.generate.fix_forward_with_cache_first"


def test_generate_on_two_broken_pieces_names_the_earlier_exercise():
    assert _generate_mistake(cache=AtZeroCache, forward=_fwd(offset=False)) == \
        "13.generate.fix_kvcache_first"
