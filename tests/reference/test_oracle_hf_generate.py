"""Independent oracle for chapter 13: greedy generation with the KV cache against Hugging Face's
`LlamaForCausalLM.generate` (eager attention, its own default cache), token for token.

`transformers` is a test-only dependency (`pip install -e .[oracle]`); without it these tests are
skipped. Nothing is downloaded: every model is built from a tiny `LlamaConfig` with random weights
(norm scales random too), converted to the course's layout by `checks.reference.hf` (shared with
the other oracle tests and the benchmark; its docstring explains the Q/K column permutation between
Hugging Face's RoPE pairing and the course's). A last test converts the other way, the course's
weights into a Hugging Face model, as the benchmark does.

Two implementations generate: the course's reference (`checks.reference.generate`) and the
solution notebook's own `KVCache`, `forward_with_cache` and `generate`, taken from
`solutions/13_generation_kv_cache/13_generation_kv_cache.ipynb` by running its import cell and its
answer cells. Greedy tokens can only be compared where no choice is a near tie, so every test
also asserts that each of Hugging Face's greedy choices wins by a clear margin.
"""

from __future__ import annotations


import pytest
import torch

from checks import ModelConfig
from checks import reference as ref
from checks.reference import generation as gen

transformers = pytest.importorskip("transformers")
from transformers import LlamaForCausalLM  # noqa: E402

from checks.reference import hf  # noqa: E402

from ..support.solutions import solution_namespace  # noqa: E402

MARGIN = 1e-3        # smallest gap between the best and second-best logit of a greedy choice

CONFIGS = {
    "GQA N_h=4 N_kv=2": ModelConfig(vocab_size=64, hidden_size=32, n_heads=4, n_kv_heads=2,
                                    ffn_hidden_size=88, n_layers=2, max_seq_len=128),
    "MHA N_h=N_kv=4, 3 layers": ModelConfig(vocab_size=80, hidden_size=32, n_heads=4,
                                            n_kv_heads=4, ffn_hidden_size=64, n_layers=3,
                                            max_seq_len=128),
    "MQA, D_h != H/N_h, base 500": ModelConfig(vocab_size=50, hidden_size=36, n_heads=6,
                                               n_kv_heads=1, head_dim=8, ffn_hidden_size=60,
                                               n_layers=2, rope_base=500.0, norm_eps=1e-6,
                                               max_seq_len=128),
}




IMPLEMENTATIONS = {
    "reference": lambda name: getattr(ref, name),
    "solution": lambda name: solution_namespace("13_generation_kv_cache")[name],
}


def _hf_model(cfg: ModelConfig, seed: int) -> LlamaForCausalLM:
    hf_cfg = hf.hf_config(cfg, initializer_range=1.0 / cfg.hidden_size**0.5,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(hf_cfg).eval()
        with torch.no_grad():
            for module in model.modules():
                if type(module).__name__ == "LlamaRMSNorm":
                    module.weight.copy_(1.0 + 0.3 * torch.randn_like(module.weight))
            model.model.embed_tokens.weight.normal_(0.0, 1.0)
    assert model.config._attn_implementation == "eager"
    assert model.model.layers[0].self_attn.head_dim == cfg.head_dim
    return model


_course_params = hf.params_from_hf   # the model's weights in the course's parameter layout


def _hf_greedy(model, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
    """Hugging Face's greedy tokens and the smallest winning margin among its choices."""
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    scores = torch.stack(out.scores, dim=1)                       # [B, n, V]
    top = scores.topk(2, dim=-1).values
    return out.sequences, float((top[..., 0] - top[..., 1]).min())


def _prompt(cfg: ModelConfig, batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (batch, length),
                         generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_hugging_face(name, impl):
    cfg = CONFIGS[name]
    generate = IMPLEMENTATIONS[impl]("generate")
    for seed, (batch, length, n) in enumerate([(1, 6, 24), (3, 9, 16)]):
        model = _hf_model(cfg, seed)
        params = _course_params(model, cfg)
        prompt = _prompt(cfg, batch, length, seed + 10)
        want, margin = _hf_greedy(model, prompt, n)
        assert margin > MARGIN, f"a near tie ({margin:.1e}): pick another seed"
        assert want.shape == (batch, length + n)
        got = generate(params, cfg, prompt, n)
        assert torch.equal(got, want), f"first difference at {(got != want).nonzero()[0].tolist()}"
        assert torch.equal(generate(params, cfg, prompt, n, use_cache=False), want)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CONFIGS)
def test_cached_logits_match_hugging_face(name, impl):
    """Prefill, a chunk and decode steps through the cache, against Hugging Face's logits of the
    whole sequence (fp32, eager): close to 1e-5."""
    cfg = CONFIGS[name]
    kv_cache = IMPLEMENTATIONS[impl]("KVCache")
    forward_with_cache = IMPLEMENTATIONS[impl]("forward_with_cache")
    model = _hf_model(cfg, 5)
    params = _course_params(model, cfg)
    tokens = _prompt(cfg, 2, 14, 6)
    with torch.no_grad():
        want = model(tokens).logits
        cache = kv_cache(cfg, 2, 16)
        got = torch.cat([forward_with_cache(tokens[:, s:e], params, cfg, cache, s)
                         for s, e in ((0, 7), (7, 8), (8, 11), (11, 12), (12, 13), (13, 14))], 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gen.full_forward(tokens, params, cfg), want, atol=1e-5, rtol=1e-5)


def test_without_the_permutation_generation_disagrees():
    """The negative control: Hugging Face's Q/K columns taken as they are pair wrong features."""
    cfg = CONFIGS["GQA N_h=4 N_kv=2"]
    model = _hf_model(cfg, 0)
    params = _course_params(model, cfg)
    d = cfg.head_dim
    unpermute = ref.interleaved_to_half_permutation(d)
    q_k = (cfg.n_heads + cfg.n_kv_heads) * d
    for layer in params["layers"]:
        qk = layer["wqkv"][:, :q_k].unflatten(1, (-1, d))[:, :, unpermute].flatten(1)
        layer["wqkv"] = torch.cat([qk, layer["wqkv"][:, q_k:]], dim=1)
    prompt = _prompt(cfg, 1, 6, 10)
    want, _ = _hf_greedy(model, prompt, 24)
    assert not torch.equal(ref.generate(params, cfg, prompt, 24), want)


@pytest.mark.parametrize("name", CONFIGS)
def test_course_weights_into_hugging_face_generate_alike(name):
    """The other direction (what the benchmark does): the course's weights loaded into a Hugging
    Face model by `hf_model_from_params` give the same logits and the same greedy tokens, and
    converting back gives the weights again."""
    cfg = CONFIGS[name]
    params = _course_params(_hf_model(cfg, 3), cfg)
    model = hf.hf_model_from_params(params, cfg, bos_token_id=None, eos_token_id=None,
                                    pad_token_id=None)
    back = _course_params(model, cfg)
    for mine, theirs in zip([params["embed"], params["final_norm"], params["lm_head"],
                             *(t for layer in params["layers"] for t in layer.values())],
                            [back["embed"], back["final_norm"], back["lm_head"],
                             *(t for layer in back["layers"] for t in layer.values())]):
        assert torch.equal(mine, theirs)
    tokens = _prompt(cfg, 2, 12, 4)
    with torch.no_grad():
        torch.testing.assert_close(gen.full_forward(tokens, params, cfg), model(tokens).logits,
                                   atol=1e-5, rtol=1e-5)
    prompt = _prompt(cfg, 1, 6, 11)
    want, margin = _hf_greedy(model, prompt, 24)
    assert margin > MARGIN, f"a near tie ({margin:.1e}): pick another seed"
    assert torch.equal(ref.generate(params, cfg, prompt, 24), want)
