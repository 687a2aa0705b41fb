"""The solution notebooks' own functions, for tests that compare them with outside oracles."""

from __future__ import annotations

import builtins
import contextlib
import functools
import io
import json
from pathlib import Path

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


@functools.lru_cache(maxsize=None)
def solution_namespace(chapter: str) -> dict:
    """Run chapter's import cell (the first code cell) and answer cells in a fresh namespace,
    output swallowed, and return that namespace."""
    notebook = SOLUTIONS / chapter / f"{chapter}.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    # The install cell (id "install-course", first) does nothing here: the course is installed.
    code = [cell for cell in cells
            if cell["cell_type"] == "code" and cell.get("id") != "install-course"]
    answers = [cell for cell in code if cell["metadata"].get("nbgrader", {}).get("solution")]
    assert answers, f"{notebook.name} has no answer cells"
    namespace = {"__name__": f"solution_{chapter}", "__builtins__": builtins}
    for cell in [code[0], *answers]:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile("".join(cell["source"]), f"<{notebook.name}>", "exec"), namespace)
    return namespace
