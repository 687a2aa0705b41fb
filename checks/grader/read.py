"""Stage 1 of grading: what the submissions are (`notebooks_in` the paths given,
`chapter_notebooks` of a folder laid out like notebooks/) and reading each: a notebook file into a
tree of `Node`s (any nbformat 4 minor version), or `GradingError` with one readable line; and the
nbgrader metadata of its cells (`grade_id`, `is_test_cell`), which every later stage uses."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .results import GradingError


class Node(dict):
    """A notebook, cell or metadata dict whose keys also read as attributes, like nbformat's
    NotebookNode (nbformat itself is not imported: it pulls in jsonschema, seconds per process)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value


def as_node(value: Any) -> Any:
    if isinstance(value, dict):
        return Node({k: as_node(v) for k, v in value.items()})
    if isinstance(value, list):
        return [as_node(v) for v in value]
    return value


def new_code_cell(source: str, metadata: dict | None = None) -> Node:
    return Node(cell_type="code", execution_count=None, metadata=as_node(metadata or {}),
                outputs=[], source=source)


def read_notebook(path: str | os.PathLike):
    """Read a notebook (any format-4 minor version) or raise GradingError saying what is wrong."""
    path = Path(path)
    if not path.exists():
        raise GradingError(path, "no such file")
    if path.is_dir():
        raise GradingError(path, "is a folder, not a notebook")
    if path.suffix != ".ipynb":
        raise GradingError(path, "not a notebook (expected a .ipynb file)")
    data = path.read_bytes()
    if not data.strip():
        raise GradingError(path, "empty file, not a notebook")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GradingError(path, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) \
            or raw.get("nbformat") != 4:
        raise GradingError(path, "JSON, but not a Jupyter notebook in format 4")
    try:
        nb = as_node(raw)
        if not isinstance(nb.setdefault("metadata", Node()), dict):
            raise ValueError("metadata that is not a mapping")
        for cell in nb.cells:
            if not isinstance(cell, dict):
                raise ValueError("a cell that is not a mapping")
            source = cell.get("source")
            if isinstance(source, list) and all(isinstance(line, str) for line in source):
                cell["source"] = "".join(source)
            if cell.get("cell_type") not in ("code", "markdown", "raw") or \
                    not isinstance(cell.get("source"), str):
                raise ValueError("a cell without a type or source")
            if not isinstance(cell.setdefault("metadata", Node()), dict):
                raise ValueError("cell metadata that is not a mapping")
    except Exception as exc:  # any malformed structure reads as one line, never a traceback
        raise GradingError(path, f"malformed notebook ({exc})") from None
    return nb


def grade_id(cell) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    gid = meta.get("grade_id") if isinstance(meta, dict) else None
    return gid if isinstance(gid, str) else None


def is_test_cell(cell) -> bool:
    """An autograded test cell: a code cell nbgrader grades that is not an answer cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return (cell.cell_type == "code" and isinstance(meta, dict) and bool(meta.get("grade"))
            and not meta.get("solution") and grade_id(cell) is not None)


# --------------------------------------------------------------------------------------------
# Finding the notebooks to grade


def chapter_notebooks(folder: Path) -> list[Path]:
    """`folder/NN_slug/*.ipynb`, the layout of notebooks/ and solutions/."""
    if not folder.is_dir():
        raise GradingError(folder, "no such folder")
    found = sorted(p for p in folder.glob("[0-9][0-9]_*/*.ipynb") if p.is_file())
    if not found:
        raise GradingError(folder, "no chapter notebooks (NN_slug/*.ipynb) in this folder")
    return found


def notebooks_in(paths: Iterable[Path]) -> list[Path]:
    """Notebook files named directly, and those anywhere under named folders (hidden folders
    such as .ipynb_checkpoints skipped). A missing path or a file that is not a notebook is bad
    input, found before anything runs."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*.ipynb") if p.is_file() and not any(
                part.startswith(".") for part in p.relative_to(path).parts))
            if not inside:
                raise GradingError(path, "no notebooks (.ipynb) in this folder")
            found += inside
        elif not path.exists():
            raise GradingError(path, "no such file or folder")
        elif path.suffix != ".ipynb":
            raise GradingError(path, "not a notebook (expected a .ipynb file)")
        else:
            found.append(path)
    return list(dict.fromkeys(found))
