"""Independent oracle for chapter 12: our whole model against Hugging Face's `LlamaForCausalLM`.

`transformers` is a test-only dependency (`pip install -e .[oracle]`); without it these tests are
skipped. Nothing is downloaded: every model is built from a tiny `LlamaConfig` with random weights
(fp32, eager attention).

Two implementations of `model_forward` are compared with Hugging Face's logits: the course's
reference (`checks.reference`) and the solution notebook's own functions, taken from
`solutions/12_lm_head_logits/12_lm_head_logits.ipynb` by running its import cell and answer cells.
The loss is compared too: Hugging Face's `model(input_ids, labels=input_ids).loss` shifts the
labels by itself, which makes it an independent check of `next_token_loss`'s shift and mean.

The conversion to the course's layout (every matrix transposed, the LM head included; q, k and v as
the column blocks of `wqkv`; the Q/K column permutation between RoPE's pairings, V not permuted) is
`checks.reference.hf`, shared with the other oracle tests and the benchmark; its module docstring
gives the argument (tests/reference/test_oracle_hf.py checks it block by block).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from checks import LLAMA2_7B, ModelConfig
from checks import reference as ref

transformers = pytest.importorskip("transformers")
from transformers import LlamaForCausalLM  # noqa: E402

from checks.reference import hf  # noqa: E402

from ..support.differences import largest_differences  # noqa: E402
from ..support.solutions import solution_namespace  # noqa: E402


# fp32 throughout; the two sides differ only by rounding (summation order, fp32 vs fp64 angles).
ATOL = RTOL = 1e-5
# Weights are drawn with this std (instead of LLaMA's 0.02) so that the logits are of order one
# and a tolerance of 1e-5 means something.
WEIGHT_STD = 0.12

CONFIGS = {
    "GQA N_h=4 N_kv=2, L=2": ModelConfig(vocab_size=96, hidden_size=32, n_heads=4, n_kv_heads=2,
                                         ffn_hidden_size=88, n_layers=2, max_seq_len=128),
    "MHA N_h=N_kv=6, L=3": ModelConfig(vocab_size=80, hidden_size=48, n_heads=6, n_kv_heads=6,
                                       ffn_hidden_size=128, n_layers=3, max_seq_len=128),
    "MQA N_kv=1, base 500, L=2": ModelConfig(vocab_size=70, hidden_size=40, n_heads=5,
                                             n_kv_heads=1, ffn_hidden_size=72, n_layers=2,
                                             rope_base=500.0, max_seq_len=128),
    "GQA G=3, D_h=10 != H/N_h, base 1e6, eps 1e-6, L=3": ModelConfig(
        vocab_size=101, hidden_size=36, n_heads=6, n_kv_heads=2, head_dim=10,
        ffn_hidden_size=60, n_layers=3, rope_base=1e6, norm_eps=1e-6, max_seq_len=128),
}


# ------------------------------------------------------------------------------------------------
# The solution notebook's functions




IMPLEMENTATIONS = {
    "reference": lambda name: getattr(ref, name),
    "solution": lambda name: solution_namespace("12_lm_head_logits")[name],
}


# ------------------------------------------------------------------------------------------------
# Hugging Face's model, and its weights in the course's layout


def _hf_config(cfg: ModelConfig, *, tied: bool = False):
    return hf.hf_config(cfg, tie_word_embeddings=tied, initializer_range=WEIGHT_STD)


def _hf_model(cfg: ModelConfig, seed: int, *, tied: bool = False) -> LlamaForCausalLM:
    """A randomly initialised model; every norm scale random too, so that a mix-up shows."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(_hf_config(cfg, tied=tied)).eval()
        with torch.no_grad():
            norms = [model.model.norm] + [n for layer in model.model.layers
                                          for n in (layer.input_layernorm,
                                                    layer.post_attention_layernorm)]
            for norm in norms:
                norm.weight.copy_(1.0 + 0.5 * torch.randn(cfg.hidden_size))
    # The config really reached the model (argument names have moved between versions).
    assert model.model.layers[0].self_attn.head_dim == cfg.head_dim
    assert model.model.norm.variance_epsilon == cfg.norm_eps
    assert len(model.model.layers) == cfg.n_layers
    torch.testing.assert_close(model.model.rotary_emb.inv_freq,
                               ref.rope_frequencies(cfg.head_dim, cfg.rope_base))
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    return model


_course_params = hf.params_from_hf   # the model's weights in the course's parameter layout


def _inputs(cfg: ModelConfig, seed: int, b: int = 3, s: int = 9):
    """token_ids [B, S] and positions [B, S]: each sequence its own start, with gaps (RoPE depends
    only on differences of positions, so a uniform offset alone would test nothing)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (b, s), generator=gen)
    steps = torch.randint(1, 4, (b, s), generator=gen)
    steps[:, 0] = torch.randint(0, 20, (b,), generator=gen)
    return ids, steps.cumsum(-1)


def _hf_logits(model, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, position_ids=positions).logits


# ------------------------------------------------------------------------------------------------
# The comparisons

LARGEST = {}  # (test, implementation, config) -> largest |difference|, shown by the last test


def _record(key, got, want):
    LARGEST[key] = max(float((got - want).abs().max()), LARGEST.get(key, 0.0))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_hugging_face(name, impl):
    """Default positions (0 .. S-1) and explicit [B, S] positions with gaps."""
    cfg = CONFIGS[name]
    model_forward = IMPLEMENTATIONS[impl]("model_forward")
    for seed in (0, 1):
        model = _hf_model(cfg, seed)
        params = _course_params(model, cfg)
        ids, positions = _inputs(cfg, seed)
        want = _hf_logits(model, ids)
        assert float(want.abs().max()) > 1.0    # logits of order one: the tolerance is meaningful
        with torch.no_grad():
            got = model_forward(ids, params, cfg)
        _record(("logits, positions 0..S-1", impl, name), got, want)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
        want = _hf_logits(model, ids, positions)
        with torch.no_grad():
            got = model_forward(ids, params, cfg, positions)
        _record(("logits, positions [B, S] with gaps", impl, name), got, want)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_loss_matches_hugging_face(impl):
    """Hugging Face shifts `labels` itself and averages over every predicted token."""
    next_token_loss = IMPLEMENTATIONS[impl]("next_token_loss")
    for name, cfg in CONFIGS.items():
        model = _hf_model(cfg, 5)
        ids, _ = _inputs(cfg, 5)
        with torch.no_grad():
            out = model(input_ids=ids, labels=ids)
        got = next_token_loss(out.logits, ids)
        _record(("loss", impl, name), got, out.loss)
        torch.testing.assert_close(got, out.loss, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_tied_hugging_face_model_is_the_layout_with_lm_head_embed_t(impl):
    """A tied Hugging Face model is our layout with lm_head = embed.T: the untied layout covers
    it."""
    cfg = CONFIGS["GQA N_h=4 N_kv=2, L=2"]
    model_forward = IMPLEMENTATIONS[impl]("model_forward")
    model = _hf_model(cfg, 6, tied=True)
    params = _course_params(model, cfg)
    torch.testing.assert_close(params["lm_head"], params["embed"].T)
    ids, positions = _inputs(cfg, 6)
    with torch.no_grad():
        got = model_forward(ids, params, cfg, positions)
    torch.testing.assert_close(got, _hf_logits(model, ids, positions), atol=ATOL, rtol=RTOL)


def test_without_the_permutation_the_pairings_disagree():
    """The negative control: Hugging Face's Q/K columns taken as they are rotate the wrong
    pairs."""
    cfg = CONFIGS["GQA N_h=4 N_kv=2, L=2"]
    model = _hf_model(cfg, 7)
    ids, positions = _inputs(cfg, 7)
    with torch.no_grad():
        unpermuted = ref.model_forward(ids, _course_params(model, cfg, permute_rope_pairs=False),
                                       cfg, positions)
    assert float((unpermuted - _hf_logits(model, ids, positions)).abs().max()) > 1e-2


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_parameter_count_matches_hugging_face(impl):
    model_param_count = IMPLEMENTATIONS[impl]("model_param_count")
    init_model_params = IMPLEMENTATIONS[impl]("init_model_params")
    for cfg in CONFIGS.values():
        model = _hf_model(cfg, 0)
        count = sum(p.numel() for p in model.parameters())
        assert model_param_count(cfg) == count
        ours = init_model_params(cfg, generator=torch.Generator().manual_seed(0))
        layout = _course_params(model, cfg)
        assert set(ours) == set(layout) and len(ours["layers"]) == cfg.n_layers
        for key in ("embed", "final_norm", "lm_head"):
            assert ours[key].shape == layout[key].shape
        for mine, theirs in zip(ours["layers"], layout["layers"]):
            assert {k: t.shape for k, t in mine.items()} == {k: t.shape for k, t in theirs.items()}
    # LLaMA-2-7B (MHA, untied) and its GQA variant, built on the meta device: no memory is used.
    for cfg, want in ((LLAMA2_7B, 6_738_415_616),
                      (dataclasses.replace(LLAMA2_7B, n_kv_heads=8), 5_933_109_248)):
        with torch.device("meta"):
            model = LlamaForCausalLM(_hf_config(cfg))
        assert sum(p.numel() for p in model.parameters()) == want == model_param_count(cfg)


def terminal_summary() -> list[str]:
    """The largest differences the comparisons saw, printed at the end of the run
    (tests/conftest.py); nothing when they did not run."""
    return largest_differences("largest |ours - Hugging Face| per comparison (fp32):",
                               LARGEST, (36, 9, 50))
