"""Stage 3 of grading: the notebook to run, built from the submission's code cells with every test
cell taken from the chapter's source notebook (`solutions/`), hidden tests included, as nbgrader's
autograde restores them. Only the source's test cells are tests: the submission's own cell
metadata decides nothing, and its outputs are never trusted."""

from __future__ import annotations

import copy

from .read import Node, as_node, grade_id, is_test_cell, new_code_cell


def _fresh_code_cell(cell, *, test: bool = False):
    """A copy of a code cell with no outputs and no execution count (outputs are never trusted).
    A submission's cell keeps only its grade_id (to place missing tests); a source test cell
    keeps its metadata and is marked as the grader's own."""
    if test:
        metadata = copy.deepcopy(dict(cell.metadata))
        metadata["checks_source_test"] = True
    else:
        gid = grade_id(cell)
        metadata = {"nbgrader": {"grade_id": gid}} if gid else {}
    return new_code_cell(cell.source, metadata)


def is_graded_test(cell) -> bool:
    """A test cell of the notebook built for grading: one taken from the source notebook."""
    return bool(cell.get("metadata", {}).get("checks_source_test")) and is_test_cell(cell)


def build_graded_notebook(submission, source):
    """The notebook to execute: the submission's code cells, with the source's test cells.

    - A submission cell whose grade_id names a source test cell is replaced by that test cell
      (edited test cells are restored; hidden tests come back). A second copy is dropped.
    - A source test cell missing from the submission is inserted after the nearest cell before
      it in the source whose grade_id the submission still has (normally its answer cell), else
      before the nearest such cell after it, else at the end.
    - Every other submission cell is ordinary code, whatever its metadata claims (a cell
      marked as a test with a grade_id of its own is not a test and earns nothing).
    - Markdown and raw cells are left out; outputs of the submission are discarded.
    """
    tests = {grade_id(c): c for c in source.cells if is_test_cell(c)}
    cells, seen = [], set()
    for cell in submission.cells:
        if cell.cell_type != "code":
            continue
        gid = grade_id(cell)
        if gid in tests:
            if gid not in seen:
                seen.add(gid)
                cells.append(_fresh_code_cell(tests[gid], test=True))
            continue
        cells.append(_fresh_code_cell(cell))

    source_ids = [grade_id(c) for c in source.cells]
    for position, gid in enumerate(source_ids):
        if gid in tests and gid not in seen:
            at = _insertion_point(cells, source_ids[:position], source_ids[position + 1:])
            cells.insert(at, _fresh_code_cell(tests[gid], test=True))
            seen.add(gid)

    nb = Node(cells=cells, metadata=as_node(copy.deepcopy(dict(source.metadata))), nbformat=4,
              nbformat_minor=5)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def _insertion_point(cells, before: list[str | None], after: list[str | None]) -> int:
    present = [grade_id(c) for c in cells]
    for gid in reversed(before):
        if gid is not None and gid in present:
            return len(present) - present[::-1].index(gid)  # after its last occurrence
    for gid in after:
        if gid is not None and gid in present:
            return present.index(gid)
    return len(cells)
