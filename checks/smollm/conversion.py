"""The conversion of SmolLM2's GGUF file into the course's layout: the config from its metadata,
every tensor's shape checked, the quantised blocks turned back into float32, the matrices
transposed to [in, out], Q | K | V joined into `wqkv` (no RoPE permutation: see the package's
docstring), and the tokenizer's fields. The result is the cache's contents (`checks.smollm.cache`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from ..config import ModelConfig, block_shapes, model_shapes, qkv_widths
from .file import ModelFileError, field, reading, tokenizer_fields


# Bump when the cache's contents or layout change: older cache files are then ignored.
CACHE_FORMAT = 2


def _config_from_gguf(reader, path: Path) -> ModelConfig:
    import numpy as np

    arch = field(reader, "general.architecture", path)
    if arch != "llama":
        raise ModelFileError(f"{path}: architecture {arch!r}, expected 'llama'")

    def num(key):
        return field(reader, f"llama.{key}", path)

    n_heads = int(num("attention.head_count"))
    hidden = int(num("embedding_length"))
    # eps is stored as float32 (9.9999997e-06): take the shortest decimal that rounds to it.
    eps = float(str(np.float32(num("attention.layer_norm_rms_epsilon"))))
    return ModelConfig(vocab_size=int(num("vocab_size")), hidden_size=hidden, n_heads=n_heads,
                       n_kv_heads=int(num("attention.head_count_kv")),
                       head_dim=hidden // n_heads, ffn_hidden_size=int(num("feed_forward_length")),
                       n_layers=int(num("block_count")),
                       rope_base=float(num("rope.freq_base")),
                       rotary_dim=int(num("rope.dimension_count")), norm_eps=eps,
                       max_seq_len=int(num("context_length")))


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """numpy shapes ([out, in], as stored) of every tensor the file must hold: the course's
    layout (`checks.config`) with each matrix transposed and `wqkv` as its blocks Q, K and V."""
    block, top = block_shapes(cfg), model_shapes(cfg)
    h = cfg.hidden_size

    def stored(name: str) -> tuple[int, ...]:      # the course's [in, out] -> GGUF's [out, in]
        return block[name][::-1]

    q, k, v = ((width, h) for width in qkv_widths(cfg))
    per_block = {"attn_norm": block["attn_norm"], "attn_q": q, "attn_k": k, "attn_v": v,
                 "attn_output": stored("wo"), "ffn_norm": block["ffn_norm"],
                 "ffn_gate": stored("w_gate"), "ffn_up": stored("w_up"),
                 "ffn_down": stored("w_down")}
    shapes = {"token_embd.weight": top["embed"], "output_norm.weight": top["final_norm"]}
    for i in range(cfg.n_layers):
        shapes.update({f"blk.{i}.{name}.weight": s for name, s in per_block.items()})
    return shapes


def convert(path: Path) -> dict:
    """Everything the course needs from the file, as one dict of plain data and float32 tensors
    (the cache's contents). Raises ModelFileError naming the file if any of it is unreadable."""
    return reading(path, _convert_unchecked)


def _convert_unchecked(path: Path) -> dict:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    cfg = _config_from_gguf(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    size = path.stat().st_size
    for name, shape in _expected_shapes(cfg).items():
        t = tensors.get(name)
        if t is None:
            raise ModelFileError(f"{path}: the GGUF file has no tensor {name!r}")
        if tuple(int(x) for x in reversed(t.shape)) != shape:
            raise ModelFileError(f"{path}: tensor {name!r} has shape "
                                 f"{list(reversed(t.shape))}, expected {list(shape)}")
        if t.data_offset + t.n_bytes > size:
            raise ModelFileError(f"{path}: the file ends inside tensor {name!r} "
                                 f"({size:,} bytes; truncated)")

    def weight(name: str) -> torch.Tensor:
        t = tensors[name]
        array = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        array = array.reshape(tuple(int(x) for x in reversed(t.shape)))
        if not array.flags.writeable:          # float32 tensors come back as views of the file
            array = array.copy()
        if not np.isfinite(array).all():
            raise ModelFileError(f"{path}: tensor {name!r} holds non-finite numbers (corrupt)")
        return torch.from_numpy(np.ascontiguousarray(array))

    def matrix(name: str) -> torch.Tensor:      # GGUF [out, in] -> the course's [in, out]
        return weight(name).T

    layers = []
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        layers.append({
            "attn_norm": weight(b + "attn_norm.weight"),
            # Q | K | V columns, each head-major; Q and K rows already in Meta's interleaved
            # RoPE order, so no permutation.
            "wqkv": torch.cat([matrix(b + "attn_q.weight"), matrix(b + "attn_k.weight"),
                               matrix(b + "attn_v.weight")], dim=1).contiguous(),
            "wo": matrix(b + "attn_output.weight").contiguous(),
            "ffn_norm": weight(b + "ffn_norm.weight"),
            "w_gate": matrix(b + "ffn_gate.weight").contiguous(),
            "w_up": matrix(b + "ffn_up.weight").contiguous(),
            "w_down": matrix(b + "ffn_down.weight").contiguous(),
        })
    return {"format": CACHE_FORMAT, "config": asdict(cfg),
            "tensors": {"embed": weight("token_embd.weight"), "layers": layers,
                        "final_norm": weight("output_norm.weight")},
            "tokenizer": tokenizer_fields(reader, path)}

