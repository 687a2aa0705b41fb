"""Chapter 13: autoregressive generation with a KV cache (prefill, then one token per decode step).

Formulated differently from the notebook, which assembles each layer from the earlier chapters'
functions (split_qkv, apply_rope, grouped_query_attention with a causal_mask): here one GEMM makes
Q | K | V and the heads are cut out of its output by `unflatten`; RoPE rotates with cos/sin tables
computed once per forward call for the positions start_pos .. start_pos+T-1 (angles rounded from
float64 as in chapter 08, the rotation in float32) and shared by every layer; attention is
PyTorch's `scaled_dot_product_attention(..., enable_gqa=True)`, with `is_causal=True` when the
chunk starts the sequence (then its top-left triangle is the bottom-right one), no mask for a
single decode query, and an explicit bottom-right boolean mask for a later chunk. The cache keeps
every layer's K and V in one preallocated tensor [L, 2, B, N_kv, S_max, D_h].

The decode path does no per-step reallocation, concatenation or recomputation: the cache is
written in place, the RoPE tables cover only the new positions, `last_only=True` runs the LM head
on the last position alone, and `generate` runs under `torch.inference_mode`.

Conventions (course-spec section 2): the cache stores K after RoPE and V, for the N_kv KV heads
only (not repeated), per layer [B, N_kv, S_max, D_h]; causal masks are bottom-right aligned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .norms import rms_norm
from .rope import rope_frequencies


class KVCache:
    """Preallocated keys (after RoPE) and values of every layer, `k[l]` and `v[l]`, each
    [B, N_kv, S_max, D_h], views into one tensor `storage` [L, 2, B, N_kv, S_max, D_h].

    `update(l, k, v, start_pos)` writes k, v [B, N_kv, T, D_h] at positions start_pos ..
    start_pos+T-1 and returns views of layer l's keys and values for positions 0 .. start_pos+T-1.
    The caller decides the positions (so a generation can also be rewound), the cache keeps no
    length of its own.
    """

    def __init__(self, cfg, batch_size: int, max_seq_len: int, dtype: torch.dtype = torch.float32,
                 device=None):
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.storage = torch.zeros(cfg.n_layers, 2, batch_size, cfg.n_kv_heads, max_seq_len,
                                   cfg.head_dim, dtype=dtype, device=device)
        self.k = list(self.storage[:, 0].unbind(0))   # views into `storage`, one per layer
        self.v = list(self.storage[:, 1].unbind(0))

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor,
               start_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = k.shape[-2]
        end = start_pos + t
        if start_pos < 0 or end > self.max_seq_len:
            raise ValueError(f"cannot write positions {start_pos}..{end - 1}: the cache holds "
                             f"positions 0..{self.max_seq_len - 1} "
                             f"(max_seq_len={self.max_seq_len})")
        want = (self.batch_size, self.n_kv_heads, t, self.head_dim)
        for name, x in (("k", k), ("v", v)):
            if tuple(x.shape) != want:
                raise ValueError(f"{name} has shape {tuple(x.shape)}, expected [B, N_kv, T, D_h] = "
                                 f"{list(want)} (the cache holds the N_kv KV heads, not repeated)")
        self.k[layer_idx].narrow(2, start_pos, t).copy_(k)
        self.v[layer_idx].narrow(2, start_pos, t).copy_(v)
        return self.k[layer_idx].narrow(2, 0, end), self.v[layer_idx].narrow(2, 0, end)


# --------------------------------------------------------------------------------------------
# One forward pass over a chunk of new tokens


def _rope_tables(positions: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, D_r/2] (float32) of the angles m * theta_i for the given positions."""
    freqs = rope_frequencies(cfg.rotary_dim, cfg.rope_base).to(positions.device)
    angles = (positions.to(torch.float64)[:, None] * freqs.to(torch.float64)).to(torch.float32)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (2i, 2i+1) of the first D_r features of x [B, N, T, D_h] (float32 math)."""
    d_r = 2 * cos.shape[-1]
    even = x[..., 0:d_r:2].to(torch.float32)
    odd = x[..., 1:d_r:2].to(torch.float32)
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    if d_r == x.shape[-1]:
        return rotated.to(x.dtype)
    return torch.cat((rotated.to(x.dtype), x[..., d_r:]), dim=-1)


def _forward(token_ids: torch.Tensor, params: dict, cfg, cache: KVCache | None, start_pos: int,
             last_only: bool) -> torch.Tensor:
    b, t = token_ids.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    device = token_ids.device
    end = start_pos + t
    cos, sin = _rope_tables(torch.arange(start_pos, end, device=device), cfg)
    if t == 1 or cache is None or start_pos == 0:
        mask = None                     # one query sees every key; a first chunk: is_causal
    else:                               # a later chunk: query i sits at position start_pos + i
        mask = (torch.arange(end, device=device)[None, :]
                <= torch.arange(start_pos, end, device=device)[:, None])
    causal = t > 1 and mask is None

    x = F.embedding(token_ids, params["embed"])
    for i, layer in enumerate(params["layers"]):
        h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        heads = F.linear(h, layer["wqkv"].t()).unflatten(-1, (n_h + 2 * n_kv, d)).transpose(1, 2)
        q = _rotate(heads[:, :n_h], cos, sin)
        k = _rotate(heads[:, n_h:n_h + n_kv], cos, sin)
        v = heads[:, n_h + n_kv:]
        if cache is not None:
            k, v = cache.update(i, k, v, start_pos)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             enable_gqa=n_kv != n_h)
        x = x + F.linear(out.transpose(1, 2).reshape(b, t, n_h * d), layer["wo"].t())
        h = rms_norm(x, layer["ffn_norm"], cfg.norm_eps)
        gate = F.linear(h, layer["w_gate"].t())
        up = F.linear(h, layer["w_up"].t())
        x = x + F.linear(F.silu(gate) * up, layer["w_down"].t())
    if last_only:
        x = x[:, -1:]
    return F.linear(rms_norm(x, params["final_norm"], cfg.norm_eps), params["lm_head"].t())


def forward_with_cache(token_ids: torch.Tensor, params: dict, cfg, cache: KVCache, start_pos: int,
                       *, last_only: bool = False) -> torch.Tensor:
    """Logits [B, T, V] for the T new tokens at positions start_pos .. start_pos+T-1.

    Their K (after RoPE) and V go into `cache`; attention reads every cached position up to each
    token's own. Prefill: the whole prompt at start_pos=0. Decode: one token per call. With
    `last_only`, the logits of the last position only ([B, 1, V]).
    """
    return _forward(token_ids, params, cfg, cache, start_pos, last_only)


def full_forward(token_ids: torch.Tensor, params: dict, cfg) -> torch.Tensor:
    """Logits [B, S, V] of the whole sequence at positions 0 .. S-1, no cache (model_forward)."""
    return _forward(token_ids, params, cfg, None, 0, False)


# --------------------------------------------------------------------------------------------
# Generation


def _next_token(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """[B] token ids from logits [B, V]: argmax at temperature 0, else a draw from
    softmax(logits / T)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.to(torch.float32) / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def generate(params: dict, cfg, prompt_ids: torch.Tensor, max_new_tokens: int, *,
             use_cache: bool = True, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """LongTensor [B, P + max_new_tokens]: the prompt followed by the generated tokens.

    With the cache: one prefill call over the prompt, then one decode call per new token (the
    last token is sampled but never fed back). Without: the whole sequence so far runs through
    the model for every new token. Greedy (temperature 0) outputs are the same either way.
    """
    b, p = prompt_ids.shape
    with torch.inference_mode():
        out = torch.empty(b, p + max_new_tokens, dtype=torch.long, device=prompt_ids.device)
        out[:, :p] = prompt_ids
        if use_cache and max_new_tokens > 0:
            cache = KVCache(cfg, b, p + max_new_tokens, dtype=params["embed"].dtype,
                            device=prompt_ids.device)
            logits = forward_with_cache(prompt_ids, params, cfg, cache, 0, last_only=True)
        elif max_new_tokens > 0:
            logits = full_forward(prompt_ids, params, cfg)
        for step in range(max_new_tokens):
            out[:, p + step] = _next_token(logits[:, -1], temperature, generator)
            if step + 1 == max_new_tokens:
                break                  # the last new token is never fed back
            if use_cache:
                logits = forward_with_cache(out[:, p + step:p + step + 1], params, cfg, cache,
                                            p + step)
            else:
                logits = full_forward(out[:, :p + step + 1], params, cfg)
    return out.clone()   # a normal tensor (not an inference tensor) for the caller


def kv_cache_nbytes(cfg, batch: int, seq_len: int, bytes_per_elem: int) -> int:
    """2 L B S N_kv D_h s: the size of a cache for `seq_len` positions (chapter 06's formula)."""
    return 2 * cfg.n_layers * batch * seq_len * cfg.n_kv_heads * cfg.head_dim * bytes_per_elem


__all__ = ["KVCache", "forward_with_cache", "full_forward", "generate", "kv_cache_nbytes"]
