"""Chapter 01: the symbol table as code."""

from __future__ import annotations

from ..config import ModelConfig


def head_dim(cfg: ModelConfig) -> int:
    return int(cfg.head_dim)


def kv_group_size(cfg: ModelConfig) -> int:
    return cfg.n_heads // cfg.n_kv_heads


_SIZES = ("vocab_size", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden_size",
          "n_layers", "rotary_dim", "max_seq_len")


def validate_config(cfg: ModelConfig) -> None:
    for name in _SIZES:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if cfg.hidden_size % cfg.n_heads:
        raise ValueError(f"hidden_size ({cfg.hidden_size}) must be divisible by n_heads "
                         f"({cfg.n_heads})")
    if cfg.n_heads % cfg.n_kv_heads:
        raise ValueError(f"n_heads ({cfg.n_heads}) must be divisible by n_kv_heads "
                         f"({cfg.n_kv_heads})")
    if cfg.rotary_dim % 2 or cfg.rotary_dim > cfg.head_dim:
        raise ValueError(f"rotary_dim ({cfg.rotary_dim}) must be even and at most head_dim "
                         f"({cfg.head_dim})")


def tensor_shape(name: str, cfg: ModelConfig, batch: int, seq_len: int) -> tuple[int, ...]:
    b, s = batch, seq_len
    nh, nkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    shapes = {
        "token_ids": (b, s),
        "hidden": (b, s, cfg.hidden_size),
        "q": (b, nh, s, d),
        "k": (b, nkv, s, d),
        "v": (b, nkv, s, d),
        "scores": (b, nh, s, s),
        "attn_weights": (b, nh, s, s),
        "attn_out": (b, s, nh * d),
        "ffn_mid": (b, s, cfg.ffn_hidden_size),
        "logits": (b, s, cfg.vocab_size),
        "kv_cache_layer": (2, b, nkv, s, d),
    }
    if name not in shapes:
        raise KeyError(f"unknown tensor name {name!r}; known: {', '.join(shapes)}")
    return shapes[name]
