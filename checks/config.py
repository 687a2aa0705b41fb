"""The one model configuration shared by every chapter, the checks and outside tools."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a LLaMA-style decoder-only Transformer, named as in the course's symbol table.

    `head_dim` defaults to `hidden_size // n_heads` and `rotary_dim` to `head_dim`; pass them
    explicitly for models that decouple them. The dataclass does not validate itself: chapter 01
    asks the learner to write `validate_config`.
    """

    vocab_size: int = 32000  # |V|
    hidden_size: int = 4096  # H
    n_heads: int = 32  # N_h
    n_kv_heads: int = 32  # N_kv
    head_dim: int | None = None  # D_h
    ffn_hidden_size: int = 11008  # H_ff
    n_layers: int = 32  # L
    rope_base: float = 10000.0
    rotary_dim: int | None = None  # D_r
    norm_eps: float = 1e-5
    max_seq_len: int = 4096

    def __post_init__(self) -> None:
        # Frozen dataclass: fill the derived defaults through object.__setattr__.
        if self.head_dim is None and self.n_heads:
            object.__setattr__(self, "head_dim", self.hidden_size // self.n_heads)
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)


#: LLaMA-2-7B, the configuration the article's numbers come from.
LLAMA2_7B = ModelConfig()
