"""Independent oracle for chapter 11: our decoder block against Hugging Face's `LlamaDecoderLayer`.

`transformers` is a test-only dependency (`pip install -e .[oracle]`); without it these tests are
skipped. Nothing is downloaded: every layer is built from a tiny `LlamaConfig` with random weights.

Two implementations of the block are compared with Hugging Face's: the course's reference
(`checks.reference`) and the solution notebook's own functions, taken from
`solutions/11_decoder_block/11_decoder_block.ipynb` by running its import cell and answer cells.

The conversion between Hugging Face's layout and the course's (transposed matrices, fused QKV
columns, and the Q/K column permutation between RoPE's pairings) is `checks.reference.hf`, shared
with the other oracle tests and the benchmark; its module docstring gives the argument.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from checks import LLAMA2_7B, ModelConfig
from checks import reference as ref

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaDecoderLayer, LlamaRotaryEmbedding)

from checks.reference import hf  # noqa: E402

from ..support.differences import largest_differences  # noqa: E402
from ..support.solutions import solution_namespace  # noqa: E402


# fp32 throughout; the two sides differ only by rounding (summation order, fp32 vs fp64 angles).
ATOL = RTOL = 1e-5

CONFIGS = {
    "GQA N_h=4 N_kv=2": ModelConfig(vocab_size=64, hidden_size=32, n_heads=4, n_kv_heads=2,
                                    ffn_hidden_size=88, n_layers=1, max_seq_len=128),
    "MHA N_h=N_kv=6": ModelConfig(vocab_size=64, hidden_size=48, n_heads=6, n_kv_heads=6,
                                  ffn_hidden_size=128, n_layers=1, max_seq_len=128),
    "MQA N_kv=1, base 500": ModelConfig(vocab_size=64, hidden_size=40, n_heads=5, n_kv_heads=1,
                                        ffn_hidden_size=72, n_layers=1, rope_base=500.0,
                                        max_seq_len=128),
    "GQA G=3, D_h=10 != H/N_h, base 1e6, eps 1e-6": ModelConfig(
        vocab_size=64, hidden_size=36, n_heads=6, n_kv_heads=2, head_dim=10, ffn_hidden_size=60,
        n_layers=1, rope_base=1e6, norm_eps=1e-6, max_seq_len=128),
}


# ------------------------------------------------------------------------------------------------
# The solution notebook's functions




IMPLEMENTATIONS = {
    "reference": lambda name: getattr(ref, name),
    "solution": lambda name: solution_namespace("11_decoder_block")[name],
}


# ------------------------------------------------------------------------------------------------
# Hugging Face's layer, and its weights in the course's layout


def _hf_config(cfg: ModelConfig):
    return hf.hf_config(cfg, num_hidden_layers=1)


def _hf_layer(cfg: ModelConfig, seed: int) -> tuple[LlamaDecoderLayer, LlamaRotaryEmbedding]:
    """A randomly initialised layer (norm scales random too, so that a mix-up would show) and its
    rotary embedding."""
    hf_cfg = _hf_config(cfg)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layer = LlamaDecoderLayer(hf_cfg, layer_idx=0).eval()
        with torch.no_grad():
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.copy_(1.0 + 0.5 * torch.randn(cfg.hidden_size))
    rotary = LlamaRotaryEmbedding(config=hf_cfg)
    # The config really reached the layer (argument names have moved between versions).
    assert layer.self_attn.head_dim == cfg.head_dim
    assert layer.input_layernorm.variance_epsilon == cfg.norm_eps
    torch.testing.assert_close(rotary.inv_freq, ref.rope_frequencies(cfg.head_dim, cfg.rope_base))
    return layer, rotary


_course_layout = hf.block_params_from_hf   # the layer's weights as one `layers` entry


def _inputs(cfg: ModelConfig, seed: int):
    """x [B, S, H] and positions [B, S]: each sequence its own start, with gaps (RoPE depends only
    on differences of positions, so a uniform offset alone would test nothing)."""
    gen = torch.Generator().manual_seed(seed)
    b, s = 3, 7
    x = torch.randn(b, s, cfg.hidden_size, generator=gen)
    steps = torch.randint(1, 4, (b, s), generator=gen)
    steps[:, 0] = torch.randint(0, 20, (b,), generator=gen)
    return x, steps.cumsum(-1)


def _hf_forward(layer, rotary, x: torch.Tensor, positions: torch.Tensor, *,
                sublayer: bool = False) -> torch.Tensor:
    b, s, _ = x.shape
    mask = ref.to_additive_mask(ref.causal_mask(s)).expand(b, 1, s, s)
    cos_sin = rotary(x, positions)
    with torch.no_grad():
        if sublayer:
            out = layer.self_attn(hidden_states=layer.input_layernorm(x),
                                  position_embeddings=cos_sin, attention_mask=mask)
        else:
            out = layer(x, attention_mask=mask, position_ids=positions,
                        position_embeddings=cos_sin)
    return out[0] if isinstance(out, tuple) else out  # transformers 4.x returns a tuple


# ------------------------------------------------------------------------------------------------
# The comparisons

LARGEST = {}  # (test, implementation, config) -> largest |difference|, shown by the last test


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CONFIGS)
def test_decoder_block_matches_hugging_face(name, impl):
    cfg = CONFIGS[name]
    decoder_block = IMPLEMENTATIONS[impl]("decoder_block")
    for seed in (0, 1):
        layer, rotary = _hf_layer(cfg, seed)
        x, positions = _inputs(cfg, seed)
        want = _hf_forward(layer, rotary, x, positions)
        with torch.no_grad():
            got = decoder_block(x, _course_layout(layer, cfg), cfg, positions)
        diff = float((got - want).abs().max())
        key = ("decoder_block", impl, name)
        LARGEST[key] = max(diff, LARGEST.get(key, 0.0))
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CONFIGS)
def test_attention_sublayer_matches_hugging_face(name, impl):
    cfg = CONFIGS[name]
    attention_sublayer = IMPLEMENTATIONS[impl]("attention_sublayer")
    layer, rotary = _hf_layer(cfg, 2)
    x, positions = _inputs(cfg, 2)
    want = _hf_forward(layer, rotary, x, positions, sublayer=True)
    with torch.no_grad():
        got = attention_sublayer(x, _course_layout(layer, cfg), cfg, positions)
    key = ("attention_sublayer", impl, name)
    LARGEST[key] = float((got - want).abs().max())
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_positions_shared_by_the_batch(impl):
    """positions [S], as a whole model passes them, against Hugging Face's position_ids [1, S]."""
    cfg = CONFIGS["GQA N_h=4 N_kv=2"]
    decoder_block = IMPLEMENTATIONS[impl]("decoder_block")
    layer, rotary = _hf_layer(cfg, 3)
    x, _ = _inputs(cfg, 3)
    positions = torch.arange(5, 5 + x.shape[1])
    want = _hf_forward(layer, rotary, x, positions.expand(x.shape[0], -1))
    with torch.no_grad():
        got = decoder_block(x, _course_layout(layer, cfg), cfg, positions)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def test_without_the_permutation_the_pairings_disagree():
    """The negative control: Hugging Face's Q/K columns taken as they are rotate the wrong pairs."""
    cfg = CONFIGS["GQA N_h=4 N_kv=2"]
    layer, rotary = _hf_layer(cfg, 4)
    x, positions = _inputs(cfg, 4)
    want = _hf_forward(layer, rotary, x, positions)
    with torch.no_grad():
        unpermuted = ref.decoder_block(x, _course_layout(layer, cfg, permute_rope_pairs=False),
                                       cfg, positions)
    assert float((unpermuted - want).abs().max()) > 1e-2


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_parameter_count_matches_hugging_face(impl):
    block_param_count = IMPLEMENTATIONS[impl]("block_param_count")
    init_block_params = IMPLEMENTATIONS[impl]("init_block_params")
    for cfg in CONFIGS.values():
        layer, _ = _hf_layer(cfg, 0)
        count = sum(p.numel() for p in layer.parameters())
        assert block_param_count(cfg) == count
        ours = init_block_params(cfg, generator=torch.Generator().manual_seed(0))
        assert sum(t.numel() for t in ours.values()) == count
        assert set(ours) == set(_course_layout(layer, cfg))
        assert all(ours[k].shape == v.shape for k, v in _course_layout(layer, cfg).items())
    # LLaMA-2-7B (MHA) and its GQA variant, built on the meta device: no memory is allocated.
    for cfg, want in ((LLAMA2_7B, 202_383_360),
                      (dataclasses.replace(LLAMA2_7B, n_kv_heads=8), 177_217_536)):
        with torch.device("meta"):
            layer = LlamaDecoderLayer(_hf_config(cfg), layer_idx=0)
        assert sum(p.numel() for p in layer.parameters()) == want == block_param_count(cfg)


def terminal_summary() -> list[str]:
    """The largest differences the comparisons saw, printed at the end of the run
    (tests/conftest.py); nothing when they did not run."""
    return largest_differences("largest |ours - Hugging Face| per comparison (fp32):",
                               LARGEST, (19, 9, 46))
