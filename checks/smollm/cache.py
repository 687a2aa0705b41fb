"""The conversion cache: converted once (seconds to a minute), then memory-mapped (a fraction of a
second). The cache file is named after the model file's SHA-256 and size and the conversion's
format version, searched for in `cache_dirs()`, written to a temporary file and renamed (a reader
never sees half a file), and rebuilt when damaged; where no folder can be written, the conversion
stays in memory for the process. `load` turns it into the course's params.
"""

from __future__ import annotations


import os
import sys
import tempfile
from pathlib import Path

import torch

from ..config import ModelConfig
from ..environment import CACHE_ENV
from ..i18n import _
from .conversion import CACHE_FORMAT, convert
from .file import fingerprint, model_file, reading, tokenizer_fields, verified_fingerprint


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
    name = _cache_name(*fingerprint(path))
    folders = cache_dirs()
    return next((d / name for d in folders if (d / name).is_file()), folders[0] / name)


def _read_cache(target: Path, size: int, sha: str) -> dict | None:
    """The cached conversion, memory-mapped; None when missing, stale or unreadable."""
    if not target.is_file():
        return None
    try:
        payload = torch.load(target, mmap=True, weights_only=True)
    except Exception:  # noqa: BLE001 - a damaged cache is rebuilt, never trusted
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
    size, sha = verified_fingerprint(path)
    name = _cache_name(size, sha)
    for folder in cache_dirs():
        cached = _read_cache(folder / name, size, sha)
        if cached is not None:
            return cached, True
    key = (str(path), sha)
    if key in _IN_MEMORY:
        return _IN_MEMORY[key], False
    # The one slow step a learner meets without a word otherwise (about 15 s, once per machine)
    print(_("Converting SmolLM2's model file into the course's layout (about 15 s, once) ..."),
          flush=True)
    payload = {**convert(path), "source_sha256": sha, "source_size": size}
    if write:
        for folder in cache_dirs():
            if _write_cache(folder / name, payload):
                cached = _read_cache(folder / name, size, sha)
                if cached is not None:
                    return cached, True
    _IN_MEMORY[key] = payload
    return payload, False


def prepare(path: Path | None = None) -> Path:
    """Convert the model once and cache it in the first of `cache_dirs()` (a copy of a cache
    found in a later folder is made there, so that sandboxed graders see it too); returns the
    cache file. Raises OSError when no cache folder can be written."""
    path = Path(path) if path else model_file()
    payload, on_disk = _payload(path)
    first = cache_dirs()[0] / _cache_name(*verified_fingerprint(path))
    if not first.is_file() and not _write_cache(first, payload) and not on_disk:
        raise OSError(f"cannot write the cache folder {first.parent} (set {CACHE_ENV} to a "
                      "writable folder)")
    return cache_file(path)


def cached_tokenizer_fields(path: Path, size: int, sha: str) -> dict:
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
        return tokenizer_fields(GGUFReader(p), p)

    return reading(path, read)


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
