"""Synthetic submissions for the grader's tests, made from a chapter's solution notebook."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]
SOLUTION_01 = REPO / "solutions" / "01_notation" / "01_notation.ipynb"
RELEASE_01 = REPO / "notebooks" / "01_notation" / "01_notation.ipynb"
EXERCISES_01 = {"head_dim": 1, "kv_group_size": 1, "validate_config": 2, "tensor_shape": 2}

_SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[ \t]*$",
                       re.MULTILINE | re.DOTALL)
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?",
                     re.MULTILINE | re.DOTALL)


def solution(path: Path = SOLUTION_01):
    return nbformat.read(path, as_version=4)


def release():
    """Chapter 01 as learners get it: the committed release, or a release-like copy of the
    solution while there is none."""
    if RELEASE_01.is_file():
        return nbformat.read(RELEASE_01, as_version=4)
    return release_like(solution())


def release_like(nb):
    """What nbgrader releases: solutions replaced by `raise NotImplementedError()`, hidden
    tests stripped, outputs cleared."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.source = _HIDDEN.sub("", _SOLUTION.sub(r"\1raise NotImplementedError()",
                                                    cell.source)).rstrip("\n")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def cell(nb, grade_id: str):
    """The cell with this nbgrader grade_id."""
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def prepend(nb, grade_id: str, code: str):
    """Put `code` at the top of a cell (for example a fault before an answer's `def`)."""
    target = cell(nb, grade_id)
    target.source = code + "\n" + target.source
    return nb


def delete(nb, grade_id: str):
    nb.cells.remove(cell(nb, grade_id))
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
