"""Borrow a function from the learner's own notebook of an earlier chapter, or use the reference.

Later chapters demonstrate ideas on building blocks from earlier ones. `own_or_reference` lets a
demonstration run on the learner's own code when it passes its check, and on the course's
reference otherwise, without ever stopping the notebook:

    attention = own_or_reference("04_self_attention", "attention")

Jupyter runs a notebook in its own folder, so the earlier chapter's notebook is found next to the
current one: `../04_self_attention/04_self_attention.ipynb`. Only that notebook's answer cells up
to the requested one and its import cells run (never its demonstrations, figures or tests), in a
fresh namespace, with their output swallowed. The notebook file is read as last saved.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

from . import reference
from .engine import use_if_passing


class _Unavailable(Exception):
    """The learner's function cannot be used; the message says why, in a few words."""


def own_or_reference(chapter: str, name: str, *, root: str | os.PathLike | None = None,
                     checker: Callable | None = None,
                     fallback: Callable | None = None) -> Callable:
    """The learner's `name` from chapter `chapter` if it passes its check, else the reference.

    chapter:  the earlier chapter's folder, e.g. "04_self_attention" (or just "04").
    name:     the exercise: the answer cell's grade_id and the function it defines.
    root:     the folder holding the chapter folders (default: the parent of the working
              directory, which is the course folder when run from a notebook).
    checker:  the check to pass (default: `checks.nbNN.check_<name>`).
    fallback: what to use otherwise (default: `checks.reference.<name>`).

    Prints one line saying which implementation is used. Any failure on the learner's side (no
    notebook, no such cell, a syntax error, an exception, a failed check) falls back to the
    reference; only a missing reference (a bug in the course) raises.
    """
    if fallback is None:
        fallback = getattr(reference, name, None)
        if fallback is None:
            raise LookupError(f"checks.reference has no `{name}` to fall back on")
    try:
        if checker is None:
            checker = _checker(chapter, name)
        fn = _load(_notebook_path(chapter, root), name)
    except _Unavailable as why:
        print(f"Using the course's reference `{name}` ({why}).")
        return fallback

    # The check calls the learner's function many times: keep whatever it prints out of sight
    # and show only use_if_passing's verdict (its last line).
    shown = io.StringIO()
    try:
        with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(io.StringIO()):
            chosen = use_if_passing(fn, checker, fallback, name=name)
    except Exception as exc:  # a failure that is not a CheckFailure: still never stop the notebook
        print(f"Using the course's reference `{name}` (checking yours raised "
              f"{type(exc).__name__}: {_short(exc)}).")
        return fallback
    lines = shown.getvalue().splitlines()
    print(lines[-1] if lines else f"Using {'your own' if chosen is fn else 'the reference'} "
          f"`{name}`.")
    return chosen


def _checker(chapter: str, name: str) -> Callable:
    number = chapter[:2]
    if not number.isdigit():
        raise _Unavailable(f"cannot tell the chapter number from {chapter!r}")
    try:
        module = importlib.import_module(f".nb{number}", __package__)
    except Exception:  # missing, or broken while being written
        raise _Unavailable(f"the checks of chapter {number} are not available") from None
    check = getattr(module, f"check_{name}", None)
    if check is None:
        raise _Unavailable(f"chapter {number} has no check for `{name}`")
    return check


def _notebook_path(chapter: str, root) -> Path:
    base = Path.cwd().parent if root is None else Path(root)
    if "_" in chapter:
        path = base / chapter / f"{chapter}.ipynb"
    else:  # "04": the one folder 04_* that holds a notebook of its own name
        found = sorted(p for p in base.glob(f"{chapter}_*/{chapter}_*.ipynb")
                       if p.stem == p.parent.name)
        path = found[0] if found else base / f"{chapter}_*" / f"{chapter}_*.ipynb"
    if not path.is_file():
        raise _Unavailable(f"no notebook at {_shown_path(path)}")
    return path


def _load(path: Path, name: str) -> Callable:
    """Run the notebook's import cells and answer cells up to `name`; return what `name` is."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = [(_source(cell), cell.get("metadata", {}).get("nbgrader") or {})
                for cell in cells if cell.get("cell_type") == "code"]
    except Exception as exc:
        raise _Unavailable(f"could not read {path.name}: {type(exc).__name__}") from None
    target = next((i for i, (_, meta) in enumerate(code) if meta.get("grade_id") == name), None)
    if target is None:
        raise _Unavailable(f"{path.name} has no answer cell `{name}`")

    namespace = {"__name__": f"_borrowed_{path.stem}", "__builtins__": builtins}
    for source, meta in code[:target]:
        # Imports, and earlier answers (the requested function may call them). A broken earlier
        # cell is skipped: the check below tells whether the function still works without it.
        if meta.get("solution") or (not meta and _only_imports(source)):
            with contextlib.suppress(Exception, SystemExit):
                _run(source, namespace, f"<{path.name}>")

    source = code[target][0]
    try:
        _run(source, namespace, f"<{path.name}: cell {name}>")
    except SyntaxError as exc:
        raise _Unavailable(f"your cell `{name}` in {path.name} has a syntax error on line "
                           f"{exc.lineno}") from None
    except (Exception, SystemExit) as exc:
        raise _Unavailable(f"running your cell `{name}` in {path.name} raised "
                           f"{type(exc).__name__}: {_short(exc)}") from None
    fn = namespace.get(name)
    if not callable(fn):
        raise _Unavailable(f"your cell `{name}` in {path.name} does not define `{name}`")
    return fn


def _run(source: str, namespace: dict, filename: str) -> None:
    code = compile(source, filename, "exec")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(code, namespace)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _only_imports(source: str) -> bool:
    try:
        body = ast.parse(source).body
    except SyntaxError:  # IPython magics and the like
        return False
    return bool(body) and all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body)


def _shown_path(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if len(text) <= 100 else text[:97] + "..."
