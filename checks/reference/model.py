"""Chapter 12: the whole model, its logits, the next-token loss, the parameter count and sampling.

Formulated differently from the notebook: the embedding lookup is `F.embedding`, the LM head
`F.linear` (which takes an [out, in] weight, so the course's [H, |V|] matrix is passed transposed),
the loss PyTorch's own `F.cross_entropy` on the [B, |V|, S-1] layout it accepts for sequences,
the parameter count the layout's shapes multiplied out, and sampling the Gumbel-max trick
(argmax of logits / T plus Gumbel noise draws exactly from softmax(logits / T)) instead of
`torch.multinomial` on probabilities.

Conventions (docs/conventions.md): token_ids [B, S] (long); params as in the parameter layout,
lm_head [H, |V|] untied from embed [|V|, H]; positions [S] or [B, S], default arange(S);
logits [B, S, |V|]; the loss at position t predicts token t + 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import block_shapes, model_shapes  # the layout's shapes: data, not answers
from .block import INIT_STD, block_param_count, decoder_block, init_block_params
from .norms import rms_norm


def init_model_params(cfg, generator: torch.Generator | None = None,
                      dtype: torch.dtype = torch.float32) -> dict:
    """embed and lm_head from N(0, INIT_STD**2), L blocks from `init_block_params`, the final norm
    at one.

    Every number is drawn from `generator` (torch's global generator when None), in layout order:
    embed, the blocks one after another, lm_head.
    """
    def normal(shape):
        return torch.empty(shape, dtype=torch.float32).normal_(0.0, INIT_STD,
                                                               generator=generator).to(dtype)

    shapes = model_shapes(cfg)
    embed = normal(shapes["embed"])
    layers = [init_block_params(cfg, generator=generator, dtype=dtype)
              for _ in range(cfg.n_layers)]
    return {"embed": embed, "layers": layers,
            "final_norm": torch.ones(shapes["final_norm"], dtype=dtype),
            "lm_head": normal(shapes["lm_head"])}


def model_forward(token_ids: torch.Tensor, params: dict, cfg,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """Embedding, the L blocks in order, the final RMSNorm, the LM head: logits [B, S, |V|]."""
    if positions is None:
        positions = torch.arange(token_ids.shape[-1], device=token_ids.device)
    x = F.embedding(token_ids, params["embed"])
    for layer in params["layers"]:
        x = decoder_block(x, layer, cfg, positions)
    x = rms_norm(x, params["final_norm"], cfg.norm_eps)
    return F.linear(x, params["lm_head"].t())


def next_token_loss(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits[:, t] against token_ids[:, t + 1] over all B * (S - 1) pairs."""
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), token_ids[:, 1:])


def model_param_count(cfg) -> int:
    """Elements of every tensor in the layout: embed, L blocks, final norm, an untied LM head."""
    top = sum(math.prod(shape) for shape in model_shapes(cfg).values())
    return top + cfg.n_layers * block_param_count(cfg)


def next_token_probs(logits: torch.Tensor, *, temperature: float = 1.0,
                     top_k: int | None = None) -> torch.Tensor:
    """The distribution `sample_next_token` draws from, in float64: softmax(logits / T) over the
    top_k largest logits (zero elsewhere); one-hot on the argmax for temperature 0."""
    logits = logits.detach().to(torch.float64)
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float64)
    scores = _top_k_filter(logits / temperature, top_k)
    return torch.softmax(scores, dim=-1)


def _top_k_filter(scores: torch.Tensor, top_k: int | None) -> torch.Tensor:
    if top_k is None or top_k >= scores.shape[-1]:
        return scores
    kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, float("-inf"))


def sample_next_token(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of logits [B, |V|]: LongTensor [B].

    temperature 0 is greedy (argmax, no randomness); otherwise a draw from softmax(logits / T)
    restricted to the top_k largest logits, by the Gumbel-max trick: argmax(scores + G) with
    G = -log(-log(U)), U uniform from `generator`, is distributed as softmax(scores).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scores = _top_k_filter(logits.detach().to(torch.float64) / temperature, top_k)
    uniform = torch.rand(scores.shape, generator=generator, dtype=torch.float64,
                         device=scores.device)
    gumbel = -torch.log(-torch.log(uniform))
    return (scores + gumbel).argmax(dim=-1)


__all__ = ["init_model_params", "model_forward", "next_token_loss", "model_param_count",
           "sample_next_token", "next_token_probs", "model_shapes", "block_shapes"]
