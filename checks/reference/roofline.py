"""Chapter 13's roofline, counted per token: the FLOPs and bytes `checks.timing` sets beside its
measurements (a multiply-add counts as 2 FLOPs).

`checks.reference.generation` writes chapter 13's graded counts per layer and per operation
(`prefill_flops`, `decode_step_bytes`); this module writes the same counts per token, built on the
earlier chapters' sizes (chapter 12's `model_param_count`, chapter 06's `kv_cache_bytes`), and
adds what a timing table needs besides: a decode step's FLOPs and a prefill's bytes. Two
formulations of one count: tests/core/test_timing.py holds these to PyTorch's own FLOP counter,
tests/checkers/test_nb13.py holds the two to each other.

They are answers, so they live here, in the reference, which the grader withholds from a worker
grading chapter 13 (and the earlier chapters) like every other answer; `checks.timing` takes the
counts it prints as arguments (`timing.Counts`): the notebook hands it the learner's own.
"""

from __future__ import annotations

from .attention import kv_cache_bytes
from .model import model_param_count


def matmul_params(cfg) -> int:
    """Weights that every token multiplies: per layer W_qkv, W_O and the three FFN matrices, plus
    the LM head: chapter 12's parameter count without the embedding table (a lookup, not a
    product) and the norm scales (tiny, and no product either)."""
    norms = (2 * cfg.n_layers + 1) * cfg.hidden_size
    return model_param_count(cfg) - cfg.vocab_size * cfg.hidden_size - norms


def weight_bytes(cfg, bytes_per_param: int) -> int:
    """Bytes of weights one forward call reads: every matrix once, and the norm scales."""
    norms = (2 * cfg.n_layers + 1) * cfg.hidden_size
    return (matmul_params(cfg) + norms) * bytes_per_param


def kv_bytes(cfg, batch: int, positions: int, bytes_per_elem: int) -> int:
    """K and V of `positions` tokens in every layer: 2 L B S N_kv D_h s (chapter 06)."""
    return kv_cache_bytes(cfg.n_layers, batch, positions, cfg.n_kv_heads, cfg.head_dim,
                          bytes_per_elem)


def attention_flops(cfg, batch: int, new_tokens: int, cached: int) -> int:
    """Q K^T and the weighted sum of V for `new_tokens` queries after `cached` positions, causal:
    query i sees cached + i + 1 keys; each (query, key) pair costs 2 D_h FLOPs twice, per head."""
    pairs = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    return cfg.n_layers * batch * cfg.n_heads * 4 * cfg.head_dim * pairs


def prefill_flops(cfg, batch: int, prompt_len: int) -> int:
    """The whole prompt through every matrix (the LM head for the last position only)."""
    lm_head = cfg.hidden_size * cfg.vocab_size
    per_token = 2 * (matmul_params(cfg) - lm_head)
    return (batch * prompt_len * per_token + batch * 2 * lm_head
            + attention_flops(cfg, batch, prompt_len, 0))


def prefill_bytes(cfg, batch: int, prompt_len: int, bytes_per_elem: int) -> int:
    """Weights read once, K and V written for every prompt token (activations left out): the
    same traffic as a decode step after prompt_len - 1 cached positions."""
    return weight_bytes(cfg, bytes_per_elem) + kv_bytes(cfg, batch, prompt_len, bytes_per_elem)


def decode_flops(cfg, batch: int, context_len: int) -> int:
    """One new token per sequence, attending to `context_len` cached positions and itself."""
    return batch * 2 * matmul_params(cfg) + attention_flops(cfg, batch, 1, context_len)


def decode_bytes(cfg, batch: int, context_len: int, bytes_per_elem: int) -> int:
    """Every weight read once, the whole cache read, the new token's K and V written."""
    return (weight_bytes(cfg, bytes_per_elem)
            + kv_bytes(cfg, batch, context_len + 1, bytes_per_elem))


__all__ = ["attention_flops", "decode_bytes", "decode_flops", "kv_bytes", "matmul_params",
           "prefill_bytes", "prefill_flops", "weight_bytes"]
