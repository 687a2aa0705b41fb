"""Independent oracle on the real model: SmolLM2-135M-Instruct through the course's code against
Hugging Face `transformers` reading the same GGUF file.

Hugging Face builds its own `LlamaForCausalLM` (eager attention, float32) and tokenizer from the
file (`from_pretrained(folder, gguf_file=name)`), with its own dequantisation and its own
conversion of the Q/K rows to its RoPE pairing; the course's side is `checks.smollm` (weights in
the course's layout, no permutation) and two implementations: the reference (`checks.reference`)
and the solution notebooks' own functions (chapter 12's `model_forward`, chapter 13's `generate`,
run from the notebooks by `tests/solutions.py`). Hugging Face is loaded once per module.

Tokenizer: the course's `Tokenizer` (chapter 02's merges, the reference `bpe_encode`) gives the
same ids as Hugging Face's. One known difference is Hugging Face's, not ours: its GGUF loader does
not implement the file's pre-tokenizer `smollm` and falls back to GPT-2's split, which does not cut
digits one by one. SmolLM2 has no merge containing an ASCII digit, so that changes nothing except
where two or more whitespace characters precede a digit (GPT-2's split leaves the last one to the
digit, SmolLM2's keeps the run whole) and for non-ASCII digits; those texts are compared with
Hugging Face's tokenizer given SmolLM2's own pre-tokenizer (`Digits(individual_digits=True)`,
then `ByteLevel`, as in the model's tokenizer.json and llama.cpp).

Generation: three prompts of the same length (a chat, prose, code) in one batch, so that each
implementation generates for all three at once. Greedy tokens can only be compared where no choice
is a near tie, so each test also asserts that every one of Hugging Face's greedy choices wins by a
clear margin.
"""

from __future__ import annotations

import pytest
import torch

from checks import reference as ref
from checks import smollm

from ..support.differences import largest_differences
from ..support.solutions import solution_namespace
from .test_smollm import CORPUS

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
if not smollm.available():
    pytest.skip(str(smollm.ModelUnavailable()), allow_module_level=True)

from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: E402

pytestmark = pytest.mark.slow

NEW_TOKENS = 32
MARGIN = 1e-3        # smallest gap between the best and second-best logit of a greedy choice
# Largest |ours - Hugging Face| logit allowed: float32 through 30 blocks, logits up to ~40
# (measured: about 1e-4).
LOGIT_ATOL = 2e-3

# Texts where the two pre-tokenizers differ (see the module docstring).
DIGITS_AFTER_WHITESPACE = ["in  2024", "x =\n  1", "\t\t42", "١٢٣ ٤", "Ⅻ 7"]

IMPLEMENTATIONS = {
    "reference": {"model_forward": ref.model_forward, "generate": ref.generate},
    "solution": {"model_forward": lambda: solution_namespace("12_lm_head_logits")["model_forward"],
                 "generate": lambda: solution_namespace("13_generation_kv_cache")["generate"]},
}


def _implementation(impl: str, name: str):
    fn = IMPLEMENTATIONS[impl][name]
    return fn() if impl == "solution" else fn


@pytest.fixture(scope="module")
def ours():
    params, cfg = smollm.load()
    return params, cfg, smollm.tokenizer()


@pytest.fixture(scope="module")
def hf_tokenizer():
    path = smollm.model_file()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def hf_model():
    transformers.utils.logging.disable_progress_bar()
    path = smollm.model_file()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    # Plain greedy decoding for exactly NEW_TOKENS tokens: no end-of-sequence token (the file's
    # would stop at <|im_end|>), no other logits processing.
    model.generation_config = GenerationConfig(do_sample=False, num_beams=1, eos_token_id=None,
                                               bos_token_id=None, pad_token_id=None)
    return model


# Three prompts of the same length (37 tokens), so that each implementation generates for all
# three in one batch: a chat, prose and code.
PROMPTS = {
    "France (chat)": None,    # tok.chat_prompt(FRANCE)
    "story": "Once upon a time, in a small village by the sea, there lived an old fisherman who "
             "knew every rock and every wave of the coast. One cold and stormy night, his old",
    "code": 'def is_prime(n: int) -> bool:\n    """Return True when n is a prime number."""\n'
            "    if n < 2:\n        return False\n    for d in",
}
FRANCE = "What is the capital of France?"


def _prompts(tok) -> torch.Tensor:
    """The three prompts as one batch [3, 37]."""
    rows = [tok.chat_prompt(FRANCE) if text is None else tok.encode(text)
            for text in PROMPTS.values()]
    assert len({len(r) for r in rows}) == 1, f"prompt lengths {[len(r) for r in rows]} differ"
    return torch.tensor(rows)


_HF_GREEDY: list[tuple[torch.Tensor, torch.Tensor]] = []


def _hf_greedy(model, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's greedy tokens [3, 37 + NEW_TOKENS] for the batch, and each row's smallest
    winning margin (computed once)."""
    if not _HF_GREEDY:
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                 max_new_tokens=NEW_TOKENS, output_scores=True,
                                 return_dict_in_generate=True)
        top = torch.stack(out.scores, dim=1).topk(2, dim=-1).values      # [3, n, 2]
        _HF_GREEDY.append((out.sequences, (top[..., 0] - top[..., 1]).amin(dim=1)))
    return _HF_GREEDY[0]


_HF_LOGITS: dict[str, torch.Tensor] = {}
_GENERATED: dict[tuple[str, bool], torch.Tensor] = {}   # (impl, use_cache) -> tokens [3, S]
LARGEST: dict[tuple[str, str], float] = {}   # (implementation, prompt) -> largest |difference|


# ------------------------------------------------------------------------------------------------
# The file, read twice


def test_hugging_face_reads_the_same_model(hf_model, ours):
    params, cfg, _ = ours
    c = hf_model.config
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.vocab_size) == (cfg.hidden_size, cfg.n_layers, cfg.n_heads,
                                                   cfg.n_kv_heads, cfg.ffn_hidden_size,
                                                   cfg.vocab_size)
    assert hf_model.lm_head.weight is hf_model.model.embed_tokens.weight     # tied there too
    torch.testing.assert_close(hf_model.model.rotary_emb.inv_freq,
                               ref.rope_frequencies(cfg.head_dim, cfg.rope_base))
    # The same dequantised numbers: the embedding, the norms, and V/O/FFN matrices transposed
    # (Q and K differ by Hugging Face's row permutation, compared through the logits below).
    torch.testing.assert_close(hf_model.model.embed_tokens.weight, params["embed"], atol=0,
                               rtol=0)
    layer, hf_layer = params["layers"][7], hf_model.model.layers[7]
    torch.testing.assert_close(hf_layer.mlp.down_proj.weight.T, layer["w_down"], atol=0, rtol=0)
    torch.testing.assert_close(hf_layer.self_attn.o_proj.weight.T, layer["wo"], atol=0, rtol=0)
    v = layer["wqkv"][:, (cfg.n_heads + cfg.n_kv_heads) * cfg.head_dim:]
    torch.testing.assert_close(hf_layer.self_attn.v_proj.weight.T, v, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------
# The tokenizer


def test_tokenizer_ids_match_hugging_face(ours, hf_tokenizer):
    _, _, tok = ours
    texts = CORPUS + [smollm.chat_text("What is the capital of France?"),
                      "Transformer 架构快速入门：我喜欢学习 AI Infra。"]
    for text in texts:
        want = hf_tokenizer.encode(text, add_special_tokens=False)
        assert tok.encode(text) == want, repr(text)
        assert tok.decode(want) == hf_tokenizer.decode(want)


def test_chapter_02s_recorded_ids_are_hugging_faces(ours, hf_tokenizer):
    _, _, tok = ours
    for text, ids in smollm.HF_IDS.values():
        assert hf_tokenizer.encode(text, add_special_tokens=False) == ids == tok.encode(text)


def test_chat_prompt_matches_hugging_face_chat_template(ours, hf_tokenizer):
    _, _, tok = ours
    for user, system in (("What is the capital of France?", None),
                         ("用一句话介绍你自己。", "Answer in one sentence.")):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        want = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=True)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert tok.chat_prompt(user, system) == list(want)


def test_digits_are_split_as_smollm2_splits_them(ours, hf_tokenizer):
    from tokenizers import Tokenizer, pre_tokenizers

    _, _, tok = ours
    smollm2 = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    smollm2.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    for text in CORPUS + DIGITS_AFTER_WHITESPACE:
        assert tok.encode(text) == smollm2.encode(text, add_special_tokens=False).ids, repr(text)


# ------------------------------------------------------------------------------------------------
# Logits and generation


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_logits_match_hugging_face(impl, ours, hf_model):
    """The batch of three prompts, and a Chinese sentence on its own."""
    params, cfg, tok = ours
    model_forward = _implementation(impl, "model_forward")
    chinese = torch.tensor([tok.encode("我喜欢学习 AI Infra。")])
    inputs = {"batch": _prompts(tok), "Chinese": chinese}
    for key, ids in inputs.items():
        with torch.no_grad():
            if key not in _HF_LOGITS:
                _HF_LOGITS[key] = hf_model(ids).logits
            want = _HF_LOGITS[key]
            got = model_forward(ids, params, cfg)
        names = list(PROMPTS) if key == "batch" else [key]
        for name, row_got, row_want in zip(names, got, want, strict=True):
            LARGEST[(impl, name)] = float((row_got - row_want).abs().max())
        assert float(want.abs().max()) > 10            # real logits, not a degenerate model
        torch.testing.assert_close(got, want, atol=LOGIT_ATOL, rtol=0)


def test_the_other_rope_pairing_would_be_wrong(ours, hf_model):
    """The negative control: the file's Q/K rows taken as Hugging Face's pairing (i, i + D/2),
    that is reordered as `checks.reference.hf` reorders Hugging Face's, give other logits."""
    params, cfg, tok = ours
    d = cfg.head_dim
    order = torch.argsort(ref.interleaved_to_half_permutation(d))
    q_k = (cfg.n_heads + cfg.n_kv_heads) * d
    layers = []
    for layer in params["layers"]:
        qk = layer["wqkv"][:, :q_k].unflatten(1, (-1, d))[:, :, order].flatten(1)
        layers.append({**layer, "wqkv": torch.cat([qk, layer["wqkv"][:, q_k:]], dim=1)})
    ids = torch.tensor([tok.chat_prompt(FRANCE)])
    with torch.no_grad():
        wrong = ref.model_forward(ids, {**params, "layers": layers}, cfg)
        assert float((wrong - hf_model(ids).logits).abs().max()) > 1.0


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no cache"])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_greedy_generation_matches_hugging_face(impl, use_cache, ours, hf_model):
    """NEW_TOKENS greedy tokens for the three prompts (one batch), token for token."""
    params, cfg, tok = ours
    generate = _implementation(impl, "generate")
    prompts = _prompts(tok)
    want, margins = _hf_greedy(hf_model, prompts)
    for name, margin in zip(PROMPTS, margins.tolist()):
        assert margin > MARGIN, f"{name}: a near tie ({margin:.1e}): pick another prompt"
    assert want.shape == (3, prompts.shape[1] + NEW_TOKENS)
    got = generate(params, cfg, prompts, NEW_TOKENS, use_cache=use_cache)
    _GENERATED[(impl, use_cache)] = got
    for name, row_got, row_want in zip(PROMPTS, got, want):
        differ = (row_got != row_want).nonzero()
        assert not len(differ), (f"{name}: first difference at new token "
                                 f"{int(differ[0, 0]) - prompts.shape[1]}")


def test_the_france_prompt_is_answered_with_paris(ours, hf_model):
    params, cfg, tok = ours
    prompts = _prompts(tok)
    out = _GENERATED.get(("reference", True))
    if out is None:
        out = ref.generate(params, cfg, prompts, NEW_TOKENS)
    new = out[0, prompts.shape[1]:].tolist()
    answer = tok.decode(new[:new.index(tok.im_end_id)] if tok.im_end_id in new else new)
    assert "Paris" in answer, answer


def terminal_summary() -> list[str]:
    """The largest differences the comparisons saw, printed at the end of the run
    (tests/conftest.py); nothing when they did not run."""
    lines = largest_differences(
        "SmolLM2-135M-Instruct, largest |ours - Hugging Face| logit (fp32):", LARGEST, (10, 15))
    if lines and _HF_GREEDY:
        margins = ", ".join(f"{name} {m:.1e}"
                            for name, m in zip(PROMPTS, _HF_GREEDY[0][1].tolist()))
        lines.append(f"  smallest greedy margin per prompt: {margins}")
    return lines
