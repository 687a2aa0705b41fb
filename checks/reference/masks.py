"""Chapter 03: attention masks. Boolean masks hold True where a query may attend to a key."""

from __future__ import annotations

import torch


def causal_mask(q_len: int, k_len: int | None = None) -> torch.Tensor:
    """Bottom-right aligned: query i sits at absolute position k_len - q_len + i."""
    k_len = q_len if k_len is None else k_len
    query_pos = torch.arange(k_len - q_len, k_len).unsqueeze(1)
    key_pos = torch.arange(k_len).unsqueeze(0)
    return key_pos <= query_pos


def bidirectional_mask(q_len: int, k_len: int | None = None) -> torch.Tensor:
    k_len = q_len if k_len is None else k_len
    return torch.ones(q_len, k_len, dtype=torch.bool)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] (True = real token) -> [B, 1, 1, S]: every query may attend to real keys only."""
    return attention_mask.bool()[:, None, None, :]


def combine_masks(*masks: torch.Tensor) -> torch.Tensor:
    out = masks[0].bool()
    for m in masks[1:]:
        out = out & m.bool()
    return out


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask.bool(), float("-inf"))
