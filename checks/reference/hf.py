"""The course's parameter layout <-> Hugging Face's `LlamaForCausalLM`, both ways.

Used by the oracle tests (Hugging Face's model is the independent implementation the reference is
compared with) and by the benchmark (`python -m checks.tools.benchmark`, the same weights in both).
`transformers` is an optional dependency (`pip install -e .[oracle]`): it is imported only when a
function here is called. Nothing is ever downloaded.

The two layouts:
- `nn.Linear` weights are [out, in] and applied as x @ W.T; the course's are [in, out] and applied
  as x @ W, so every matrix (the LM head included) is transposed. q, k and v become the column
  blocks Q | K | V of `wqkv`. The embedding table is [|V|, H] on both sides.
- Hugging Face checkpoints pair RoPE features (i, i + D/2) ("half"); the course pairs (2i, 2i+1)
  ("interleaved"). With p = interleaved_to_half_permutation(D), rotating interleaved and then
  reordering by p equals reordering by p and then rotating half-paired. So if the course's Q and K
  columns of every head are Hugging Face's in the order argsort(p), the course's rotated q (and k)
  are Hugging Face's with the features of each head reordered, all heads and q and k alike: every
  dot product q.k, hence the attention weights and everything after them, is the same. V is not
  rotated and not permuted. (This is the permutation Meta's LLaMA checkpoints went through, in
  reverse, when they were converted to Hugging Face's format.) Going back, Hugging Face's columns
  are the course's in the order p.
"""

from __future__ import annotations

import torch

from .rope import interleaved_to_half_permutation


def hf_config(cfg, **overrides):
    """A `LlamaConfig` with the shapes of the course's `ModelConfig` (eager attention, no biases,
    untied LM head); keyword arguments override or add `LlamaConfig` fields."""
    from transformers import LlamaConfig

    fields = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                  intermediate_size=cfg.ffn_hidden_size, num_attention_heads=cfg.n_heads,
                  num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                  num_hidden_layers=cfg.n_layers, rms_norm_eps=cfg.norm_eps,
                  rope_theta=cfg.rope_base, max_position_embeddings=cfg.max_seq_len,
                  hidden_act="silu", attention_bias=False, mlp_bias=False,
                  tie_word_embeddings=False, attn_implementation="eager")
    fields.update(overrides)
    return LlamaConfig(**fields)


def _reorder_heads(w_t: torch.Tensor, n_heads: int, head_dim: int,
                   order: torch.Tensor) -> torch.Tensor:
    """[H, n * d] head-major columns with each head's features taken in `order`."""
    return w_t.unflatten(1, (n_heads, head_dim))[:, :, order].flatten(1)


def block_params_from_hf(layer, cfg, *, permute_rope_pairs: bool = True) -> dict:
    """A Hugging Face `LlamaDecoderLayer`'s weights as one `layers` entry of the course's layout
    (copies). `permute_rope_pairs=False` takes the Q/K columns as they are: the negative control,
    which pairs the wrong features."""
    d = cfg.head_dim
    p = interleaved_to_half_permutation(d)
    order = torch.argsort(p) if permute_rope_pairs else torch.arange(d)
    attn, mlp = layer.self_attn, layer.mlp
    with torch.no_grad():
        w_q = _reorder_heads(attn.q_proj.weight.T, cfg.n_heads, d, order)
        w_k = _reorder_heads(attn.k_proj.weight.T, cfg.n_kv_heads, d, order)
        return {
            "attn_norm": layer.input_layernorm.weight.clone(),
            "wqkv": torch.cat([w_q, w_k, attn.v_proj.weight.T], dim=1).contiguous(),
            "wo": attn.o_proj.weight.T.contiguous(),
            "ffn_norm": layer.post_attention_layernorm.weight.clone(),
            "w_gate": mlp.gate_proj.weight.T.contiguous(),
            "w_up": mlp.up_proj.weight.T.contiguous(),
            "w_down": mlp.down_proj.weight.T.contiguous(),
        }


def params_from_hf(model, cfg, *, permute_rope_pairs: bool = True) -> dict:
    """A Hugging Face `LlamaForCausalLM`'s weights in the course's parameter layout (copies)."""
    with torch.no_grad():
        return {
            "embed": model.model.embed_tokens.weight.clone(),
            "layers": [block_params_from_hf(layer, cfg, permute_rope_pairs=permute_rope_pairs)
                       for layer in model.model.layers],
            "final_norm": model.model.norm.weight.clone(),
            "lm_head": model.lm_head.weight.T.contiguous(),
        }


def hf_model_from_params(params: dict, cfg, **config_overrides):
    """A `LlamaForCausalLM` (eval mode, eager attention) holding the course's weights `params`
    (copied, in their dtype). The inverse of `params_from_hf`: greedy generation with either gives
    the same tokens. Built on the meta device first, so no random initialisation runs and torch's
    global random state is left alone."""
    from transformers import LlamaForCausalLM

    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    dtype = params["embed"].dtype
    device = params["embed"].device
    with torch.device("meta"):
        model = LlamaForCausalLM(hf_config(cfg, **config_overrides))
    model = model.to_empty(device=device).to(dtype).eval()
    p = interleaved_to_half_permutation(d).to(device)

    def copy(dst: torch.nn.Parameter, src: torch.Tensor) -> None:
        assert dst.shape == src.shape, (dst.shape, src.shape)
        dst.copy_(src)

    with torch.no_grad():
        copy(model.model.embed_tokens.weight, params["embed"])
        for hf_layer, layer in zip(model.model.layers, params["layers"], strict=True):
            w_q, w_k, w_v = layer["wqkv"].split([n_h * d, n_kv * d, n_kv * d], dim=1)
            attn, mlp = hf_layer.self_attn, hf_layer.mlp
            copy(attn.q_proj.weight, _reorder_heads(w_q, n_h, d, p).T)
            copy(attn.k_proj.weight, _reorder_heads(w_k, n_kv, d, p).T)
            copy(attn.v_proj.weight, w_v.T)
            copy(attn.o_proj.weight, layer["wo"].T)
            copy(hf_layer.input_layernorm.weight, layer["attn_norm"])
            copy(hf_layer.post_attention_layernorm.weight, layer["ffn_norm"])
            copy(mlp.gate_proj.weight, layer["w_gate"].T)
            copy(mlp.up_proj.weight, layer["w_up"].T)
            copy(mlp.down_proj.weight, layer["w_down"].T)
        copy(model.model.norm.weight, params["final_norm"])
        copy(model.lm_head.weight, params["lm_head"].T)
    # to_empty left the buffers (RoPE's inverse frequencies) uninitialised: build them anew.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config).to(device)
    return model


__all__ = ["block_params_from_hf", "hf_config", "hf_model_from_params", "params_from_hf"]
