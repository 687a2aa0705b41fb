"""Copies of a chapter's notebook: whether a notebook holds any of the learner's work
(`has_work`), so that a student who worked in `04_self_attention-Copy1.ipynb` beside the
released, untouched `04_self_attention.ipynb` is flagged (the copy is refused and the stub
graded, as for any second notebook), and graded on the instructor's word (`--use-copies`).

An answer cell is untouched when it is what the release gives: its functions' bodies are only a
docstring and `raise NotImplementedError(...)` (comments and blank lines aside), with nothing
else but imports beside them. Every answer cell of every chapter's release is such a stub (the
release's own test says so), whatever its language; anything else is work, a cell that does not
parse included."""

from __future__ import annotations

import ast
import os

from .read import Caps, read_notebook


def has_work(path: str | os.PathLike, caps: Caps = Caps()) -> bool:
    """Whether any answer cell of the notebook at `path` differs from the released stub (False
    for a notebook that cannot be read: there is nothing to grade in it either)."""
    try:
        nb = read_notebook(path, max_bytes=caps.max_bytes, max_cells=caps.max_cells)
    except Exception:  # noqa: BLE001 - unreadable: no work to point the instructor to
        return False
    return any(_is_answer(cell) and not is_stub(cell.source) for cell in nb.cells)


def _is_answer(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader")
    return cell.get("cell_type") == "code" and isinstance(meta, dict) and bool(
        meta.get("solution"))


def is_stub(source: str) -> bool:
    """Whether an answer cell's source is still the release's stub."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # not the release's: work
        return False
    return all(_stub_statement(node) for node in tree.body)


def _stub_statement(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.ClassDef):
        return all(_stub_statement(n) or _docstring(n) for n in node.body)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = node.body[1:] if node.body and _docstring(node.body[0]) else node.body
        return len(body) == 1 and _raises_not_implemented(body[0])
    return _raises_not_implemented(node)


def _docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
        node.value.value, str)


def _raises_not_implemented(node: ast.stmt) -> bool:
    if not isinstance(node, ast.Raise) or node.exc is None:
        return False
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
