"""The solution notebooks' own functions, for tests that compare them with outside oracles."""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import io
import json
from pathlib import Path

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


@functools.lru_cache(maxsize=None)
def solution_namespace(chapter: str) -> dict:
    """Run chapter's import cell (the first code cell), its answer cells and the helpers the
    other cells define (their functions, classes and imports only: chapter 14's `parameters`) in
    a fresh namespace, in order, output swallowed, and return that namespace."""
    notebook = SOLUTIONS / chapter / f"{chapter}.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    # The install cell (id "install-course", first) does nothing here: the course is installed.
    code = [cell for cell in cells
            if cell["cell_type"] == "code" and cell.get("id") != "install-course"]
    answers = [cell for cell in code if cell["metadata"].get("nbgrader", {}).get("solution")]
    assert answers, f"{notebook.name} has no answer cells"
    namespace = {"__name__": f"solution_{chapter}", "__builtins__": builtins}
    for cell in code:
        source = "".join(cell["source"])
        if cell is code[0] or cell in answers:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(source, f"<{notebook.name}>", "exec"), namespace)
            continue
        for definition in _definitions(source):  # one that needs the cell's own state is left
            with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
                exec(compile(definition, f"<{notebook.name}>", "exec"), namespace)
    return namespace


def _definitions(source: str) -> list[str]:
    """The functions, classes and imports a cell defines, without the code it runs."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in body if isinstance(
        node, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))]
