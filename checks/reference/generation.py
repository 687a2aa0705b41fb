"""Chapter 13: autoregressive generation with a KV cache (prefill, then one token per decode step).

Formulated differently from the notebook, which assembles each layer from the earlier chapters'
functions (split_qkv, apply_rope, grouped_query_attention with a causal_mask): here one GEMM makes
Q | K | V and the heads are cut out of its output by `unflatten`; RoPE multiplies each pair of
features, taken as a complex number, by its rotor e^{i m theta}, the rotors computed once per
forward call for the positions start_pos .. start_pos+T-1 (angles rounded from float64 as in
chapter 08, the rotation in float32), shared by every layer, and Q and K rotated in one call
(their heads are adjacent); attention is PyTorch's `scaled_dot_product_attention`: with
`enable_gqa=True` and `is_causal=True` when the chunk starts the sequence (then its top-left
triangle is the bottom-right one), with an explicit bottom-right boolean mask for a later chunk,
and for a single decode query with the G query heads of each group stacked as G queries of their
shared KV head (one query sees every cached key, so no mask; each KV head is read once, not G
times). The cache keeps every layer's K and V in one preallocated tensor
[L, 2, B, N_kv, S_max, D_h].

The decode path does no per-step reallocation, concatenation or recomputation: the cache is
written in place, the rotors cover only the new positions, `last_only=True` runs the LM head on
the last position alone, and `generate` runs under `torch.inference_mode`. Decoding one token at
batch 1 reads every weight once and does little arithmetic on it: its speed is the memory
bandwidth, plus PyTorch's fixed cost per operation (a few microseconds each, some forty per
layer), which is why the layer is written with few operations. What each change buys is
measured by `python -m checks.tools.benchmark` (its "decode path" section).

Conventions (docs/conventions.md): the cache stores K after RoPE and V, for the N_kv KV heads
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


def _rope_rotors(positions: torch.Tensor, cfg) -> torch.Tensor:
    """e^{i m theta_i} [T, D_r/2] (complex64) for the given positions m: the angles formed in
    float64 and rounded once to float32, as in chapter 08. Apple's GPUs (MPS) have no float64:
    there the angles are formed on the CPU."""
    device = positions.device
    if device.type == "mps":
        positions = positions.cpu()
    freqs = rope_frequencies(cfg.rotary_dim, cfg.rope_base).to(positions.device)
    angles = (positions.to(torch.float64)[:, None] * freqs.to(torch.float64)).to(torch.float32)
    return torch.polar(torch.ones_like(angles), angles).to(device)


def _rotate(x: torch.Tensor, rotors: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (2i, 2i+1) of the first D_r features of x [B, N, T, D_h]: each pair is
    the complex number x_2i + i x_2i+1, multiplied by its rotor (float32 math, x's dtype out)."""
    d_r = 2 * rotors.shape[-1]
    pairs = x[..., :d_r].to(torch.float32).unflatten(-1, (-1, 2)).contiguous()
    rotated = torch.view_as_real(torch.view_as_complex(pairs) * rotors).flatten(-2).to(x.dtype)
    return rotated if d_r == x.shape[-1] else torch.cat((rotated, x[..., d_r:]), dim=-1)


def _rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """Chapter 10's RMSNorm. In float32 the cast back is a no-op, so the scale can go into
    PyTorch's kernel (one call instead of four, the same numbers); other dtypes keep the
    course's rule (normalise in float32, cast back, then multiply by gamma)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), gamma, eps)
    return rms_norm(x, gamma, eps)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, causal: bool,
               n_kv: int) -> torch.Tensor:
    """[B, N_h, T, D_h]: causal grouped-query attention of q [B, N_h, T, D_h] over k, v
    [B, N_kv, S, D_h]."""
    b, n_h, t, d = q.shape
    if t == 1:   # one query per head sees every key: a group's G heads are G queries of one head
        out = F.scaled_dot_product_attention(q.reshape(b, n_kv, n_h // n_kv, d), k, v)
        return out.reshape(b, n_h, 1, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=n_kv != n_h)


def _forward(token_ids: torch.Tensor, params: dict, cfg, cache: KVCache | None, start_pos: int,
             last_only: bool) -> torch.Tensor:
    b, t = token_ids.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    device = token_ids.device
    end = start_pos + t
    rotors = _rope_rotors(torch.arange(start_pos, end, device=device), cfg)
    if t == 1 or cache is None or start_pos == 0:
        mask = None                     # one query sees every key; a first chunk: is_causal
    else:                               # a later chunk: query i sits at position start_pos + i
        mask = (torch.arange(end, device=device)[None, :]
                <= torch.arange(start_pos, end, device=device)[:, None])
    causal = t > 1 and mask is None

    x = F.embedding(token_ids, params["embed"])
    for i, layer in enumerate(params["layers"]):
        h = _rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        heads = (h @ layer["wqkv"]).unflatten(-1, (n_h + 2 * n_kv, d)).transpose(1, 2)
        qk = _rotate(heads[:, :n_h + n_kv], rotors)           # RoPE on Q and K, never V
        q, k, v = qk[:, :n_h], qk[:, n_h:], heads[:, n_h + n_kv:]
        if cache is not None:
            k, v = cache.update(i, k, v, start_pos)
        out = _attention(q, k, v, mask, causal, n_kv)
        x = x + out.transpose(1, 2).reshape(b, t, n_h * d) @ layer["wo"]
        h = _rms_norm(x, layer["ffn_norm"], cfg.norm_eps)
        x = x + (F.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]
    if last_only:
        x = x[:, -1:]
    return _rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"]


def forward_with_cache(token_ids: torch.Tensor, params: dict, cfg, cache: KVCache, start_pos: int,
                       *, last_only: bool = False) -> torch.Tensor:
    """Logits [B, T, V] for the T new tokens at positions start_pos .. start_pos+T-1.

    Their K (after RoPE) and V go into `cache`; attention reads every cached position up to each
    token's own. Prefill: the whole prompt at start_pos=0. Decode: one token per call. With
    `last_only`, the logits of the last position only ([B, 1, V]).
    """
    return _forward(token_ids, params, cfg, cache, start_pos, last_only)


def full_forward(token_ids: torch.Tensor, params: dict, cfg, *,
                 last_only: bool = False) -> torch.Tensor:
    """Logits [B, S, V] of the whole sequence at positions 0 .. S-1, no cache (model_forward).
    With `last_only`, the logits of the last position only ([B, 1, V])."""
    return _forward(token_ids, params, cfg, None, 0, last_only)


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
    the model for every new token (the LM head on its last position only, in both cases). Greedy
    (temperature 0) outputs are the same either way.
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
            logits = full_forward(prompt_ids, params, cfg, last_only=True)
        for step in range(max_new_tokens):
            out[:, p + step] = _next_token(logits[:, -1], temperature, generator)
            if step + 1 == max_new_tokens:
                break                  # the last new token is never fed back
            if use_cache:
                logits = forward_with_cache(out[:, p + step:p + step + 1], params, cfg, cache,
                                            p + step)
            else:
                logits = full_forward(out[:, :p + step + 1], params, cfg, last_only=True)
    return out.clone()   # a normal tensor (not an inference tensor) for the caller


def kv_cache_nbytes(cfg, batch: int, seq_len: int, bytes_per_elem: int) -> int:
    """2 L B S N_kv D_h s: the size of a cache for `seq_len` positions (chapter 06's formula)."""
    return 2 * cfg.n_layers * batch * seq_len * cfg.n_kv_heads * cfg.head_dim * bytes_per_elem


# --------------------------------------------------------------------------------------------
# The roofline's arithmetic (chapter 13's last three exercises). A multiply-add is 2 FLOPs.
# Written per layer and per operation here; `checks.reference.roofline` has the same counts
# written per token (its tests hold them to PyTorch's FlopCounterMode), and the tests compare
# the two.


def _layer_matmul_flops(cfg, tokens: int) -> int:
    """One layer's weight products for `tokens` tokens: Q, K and V projections, W_O, and
    SwiGLU's gate, up and down matrices, each [in, out] costing 2 * in * out per token."""
    h, d = cfg.hidden_size, cfg.head_dim
    q = 2 * tokens * h * cfg.n_heads * d
    k = v = 2 * tokens * h * cfg.n_kv_heads * d
    o = 2 * tokens * cfg.n_heads * d * h
    gate = up = down = 2 * tokens * h * cfg.ffn_hidden_size
    return q + k + v + o + gate + up + down


def prefill_flops(cfg, batch: int, seq_len: int) -> int:
    """FLOPs of one prefill call over `batch` prompts of `seq_len` tokens: every layer's weight
    products for every token; attention's scores (Q K^T) and weighted sum of V over the causal
    triangle (query i meets keys 0..i), for each of the N_h query heads; the LM head on the last
    position only (generation needs no other logits). Norms, RoPE, softmax, SiLU, residual adds
    and the embedding lookup are left out (no weight products; a few FLOPs per feature)."""
    s = seq_len
    pairs = s * (s + 1) // 2                         # (query, key) pairs under the causal mask
    scores = mixing = 2 * batch * cfg.n_heads * pairs * cfg.head_dim
    layer = _layer_matmul_flops(cfg, batch * s) + scores + mixing
    lm_head = 2 * batch * cfg.hidden_size * cfg.vocab_size
    return cfg.n_layers * layer + lm_head


def decode_step_bytes(cfg, batch: int, context_len: int, bytes_per_elem: int) -> int:
    """Bytes one decode step moves, `context_len` positions already cached: every weight read
    once for the whole batch (each layer's matrices and norm scales, the final norm, the LM head;
    of the embedding table only B rows, left out), plus the KV cache: the `context_len` cached
    positions' K and V read and the new token's written, N_kv heads, every layer and sequence."""
    h, d = cfg.hidden_size, cfg.head_dim
    per_layer = (h * (cfg.n_heads + 2 * cfg.n_kv_heads) * d + cfg.n_heads * d * h
                 + 3 * h * cfg.ffn_hidden_size + 2 * h)
    weights = cfg.n_layers * per_layer + h + h * cfg.vocab_size
    cache = kv_cache_nbytes(cfg, batch, context_len + 1, 1)
    return (weights + cache) * bytes_per_elem


def arithmetic_intensity(flops: int | float, num_bytes: int | float) -> float:
    """FLOPs per byte moved."""
    return float(flops) / float(num_bytes)


__all__ = ["KVCache", "arithmetic_intensity", "decode_step_bytes", "forward_with_cache",
           "full_forward", "generate", "kv_cache_nbytes", "prefill_flops"]
