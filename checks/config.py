"""The one model configuration shared by every chapter, the checks and outside tools, and the
parameter layout it gives: every tensor's name and shape (`block_shapes`, `model_shapes`,
`param_shapes`)."""

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


# --------------------------------------------------------------------------------------------
# The parameter layout (docs/conventions.md, "The configuration and the parameters"), defined
# once: every tensor's name and shape for a config. Matrices are [in, out]; the norms are [H].
#
#     {"embed": [|V|, H], "layers": [one block_shapes(cfg) per layer], "final_norm": [H],
#      "lm_head": [H, |V|]}


def qkv_widths(cfg: ModelConfig) -> tuple[int, int, int]:
    """The widths of `wqkv`'s column blocks Q | K | V (each head-major): N_h D_h, N_kv D_h and
    N_kv D_h."""
    return (cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim,
            cfg.n_kv_heads * cfg.head_dim)


def block_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of one `layers` entry, in layout order."""
    h, h_ff = cfg.hidden_size, cfg.ffn_hidden_size
    return {
        "attn_norm": (h,),
        "wqkv": (h, sum(qkv_widths(cfg))),
        "wo": (cfg.n_heads * cfg.head_dim, h),
        "ffn_norm": (h,),
        "w_gate": (h, h_ff),
        "w_up": (h, h_ff),
        "w_down": (h_ff, h),
    }


def model_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of the top-level tensors (the blocks' are `block_shapes`): embed, final_norm,
    lm_head (an untied LM head; a tied one is a view of the embedding)."""
    return {"embed": (cfg.vocab_size, cfg.hidden_size), "final_norm": (cfg.hidden_size,),
            "lm_head": (cfg.hidden_size, cfg.vocab_size)}


def param_shapes(cfg: ModelConfig) -> dict:
    """The whole layout's shapes, nested as the parameters are: {"embed", "layers": [one dict
    per layer], "final_norm", "lm_head"}."""
    top = model_shapes(cfg)
    return {"embed": top["embed"], "layers": [block_shapes(cfg) for _ in range(cfg.n_layers)],
            "final_norm": top["final_norm"], "lm_head": top["lm_head"]}
