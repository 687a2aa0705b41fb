"""The grading engine: chapter lookup, rebuilding the notebook, nbgrader's scoring rule, and real
runs of chapter 01 submissions (each run starts a kernel, so each fixture grades once)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from checks import grading
from checks.grading import GradingError

from . import submissions as sub


def snapshot(path: Path) -> tuple[bytes, list[str]]:
    """A notebook's bytes and its folder's listing, to prove grading changed neither."""
    return path.read_bytes(), sorted(os.listdir(path.parent))


def grade_untouched(path: Path, **kwargs) -> grading.NotebookResult:
    before = snapshot(path)
    result = grading.grade_notebook(path, **kwargs)
    assert snapshot(path) == before, "grading changed the input file or its folder"
    return result


def by_name(result: grading.NotebookResult) -> dict[str, grading.ExerciseResult]:
    return {e.name: e for e in result.exercises}


# --------------------------------------------------------------------------------------------
# Reading and identifying notebooks (no kernel)


@pytest.mark.parametrize("name, content, problem", [
    ("missing.ipynb", None, "no such file"),
    ("notes.txt", "{}", "not a notebook"),
    ("empty.ipynb", "", "empty file"),
    ("broken.ipynb", '{"cells": [', "not valid JSON"),
    ("list.ipynb", "[1, 2]", "not a Jupyter notebook"),
    ("cellless.ipynb", '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{}]}',
     "malformed notebook"),
])
def test_unreadable_notebooks_raise_one_line(tmp_path, name, content, problem):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(GradingError) as info:
        grading.read_notebook(path)
    assert problem in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("where, chapter_metadata", [
    ("renamed.ipynb", "01_notation"),  # metadata wins over any name
    ("01_notation.ipynb", None),  # file name
    ("01_notation/submission.ipynb", None),  # folder name
    ("01_notation.ipynb", "99_nonexistent"),  # unknown metadata, known name
])
def test_chapter_from_metadata_then_file_then_folder(tmp_path, where, chapter_metadata):
    nb = new_notebook(metadata={"course": {"chapter": chapter_metadata}} if chapter_metadata
                      else {})
    assert grading.identify_chapter(nb, tmp_path / where) == "01_notation"


@pytest.mark.parametrize("where, chapter_metadata, problem", [
    ("99_nonexistent.ipynb", None, "unknown chapter '99_nonexistent'"),
    ("homework.ipynb", "99_nonexistent", "unknown chapter '99_nonexistent'"),
    ("homework.ipynb", None, "cannot tell which chapter"),
])
def test_unknown_chapter_is_a_grading_error(tmp_path, where, chapter_metadata, problem):
    nb = new_notebook(metadata={"course": {"chapter": chapter_metadata}} if chapter_metadata
                      else {})
    with pytest.raises(GradingError, match=problem):
        grading.identify_chapter(nb, tmp_path / where)


# --------------------------------------------------------------------------------------------
# Rebuilding the notebook to run (no kernel)


def grade_ids(nb) -> list[str | None]:
    return [grading.grade_id(c) for c in nb.cells]


def test_test_cells_come_from_the_source_and_deleted_ones_return():
    source = sub.solution()
    submission = sub.release_like(source)
    sub.delete(submission, "check_head_dim")
    sub.cell(submission, "check_kv_group_size").source = "pass  # edited"
    duplicate = nbformat.from_dict(dict(sub.cell(submission, "check_tensor_shape")))
    submission.cells.append(duplicate)
    sub.cell(submission, "check_tensor_shape").outputs = [
        new_output("stream", name="stdout", text="✓ tensor_shape passed")]  # a faked output

    built = grading.build_graded_notebook(submission, source)

    assert all(c.cell_type == "code" and not c.outputs for c in built.cells)
    ids = grade_ids(built)
    assert ids.count("check_tensor_shape") == 1
    for name in sub.EXERCISES_01:
        assert ids.index(f"check_{name}") == ids.index(name) + 1, "test right after answer"
        assert sub.cell(built, f"check_{name}").source == sub.cell(source, f"check_{name}").source
    assert "### BEGIN HIDDEN TESTS" in sub.cell(built, "check_head_dim").source
    assert sub.cell(built, "head_dim").source == sub.cell(submission, "head_dim").source


def test_a_test_whose_answer_cell_is_gone_goes_before_the_next_exercise():
    source = sub.solution()
    submission = sub.delete(sub.delete(sub.solution(), "check_head_dim"), "head_dim")
    ids = grade_ids(grading.build_graded_notebook(submission, source))
    assert ids.index("check_head_dim") == ids.index("kv_group_size") - 1


# --------------------------------------------------------------------------------------------
# Scoring one test cell: nbgrader's rule (no kernel)


def graded_cell(*outputs):
    cell = new_code_cell("check_head_dim(head_dim)",
                         metadata={"nbgrader": {"grade": True, "grade_id": "check_head_dim"}})
    cell.outputs = list(outputs)
    return cell


def error(ename, evalue):
    return new_output("error", ename=ename, evalue=evalue, traceback=[])


@pytest.mark.parametrize("outputs, ran, status, points, message", [
    ([new_output("stream", name="stdout", text="✓ head_dim passed")], True, "passed", 2, ""),
    ([], False, "error", 0, "not run"),
    ([new_output("stream", name="stderr", text="UserWarning: careful\n")], True, "failed", 0,
     "wrote to stderr: UserWarning: careful"),
    ([error("NotStarted", "head_dim: not started yet: ...")], True, "not started", 0,
     "NotImplementedError"),
    ([error("CheckFailure", "head_dim: returned 64, expected 128.\nlikely mistake: used "
            "n_kv_heads\n(random inputs from seed 7; pass seed=7 ...)")], True, "failed", 0,
     "returned 64, expected 128. — likely mistake: used n_kv_heads"),
    ([error("ForbiddenCall", "head_dim: calls `softmax`")], True, "failed", 0, "calls `softmax`"),
    ([error("AssertionError", "")], True, "failed", 0, "AssertionError in a hidden test"),
    ([error("NameError", "name 'head_dim' is not defined")], True, "error", 0,
     "NameError: name 'head_dim' is not defined"),
])
def test_scoring_rule(outputs, ran, status, points, message):
    result = grading.score_test_cell(graded_cell(*outputs), ran=ran, max_points=2)
    assert (result.name, result.status, result.points, result.max_points) == \
        ("head_dim", status, points, 2)
    assert message in result.message and "\n" not in result.message


# --------------------------------------------------------------------------------------------
# Real runs (one kernel each)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("submissions")


def test_solution_gets_full_marks_and_stays_untouched():
    result = grade_untouched(sub.SOLUTION_01)
    assert result.chapter == "01_notation" and result.error is None
    assert {e.name: (e.status, e.points) for e in result.exercises} == \
        {name: ("passed", points) for name, points in sub.EXERCISES_01.items()}
    assert result.points == result.max_points == 6
    data = json.loads(json.dumps(result.to_dict()))
    assert data["points"] == 6 and data["passed"] == 4 and len(data["exercises"]) == 4


def test_fresh_release_scores_zero_not_started(folder):
    path = sub.RELEASE_01 if sub.RELEASE_01.is_file() else \
        sub.write(sub.release(), folder / "release" / "01_notation.ipynb")
    result = grade_untouched(path)
    assert result.error is None and result.points == 0 and result.max_points == 6
    assert {e.status for e in result.exercises} == {"not started"}


def test_tampered_tests_are_restored_and_sys_exit_costs_only_its_exercise(folder):
    nb = sub.solution()
    sub.delete(nb, "check_head_dim")  # correct answer, test deleted: restored, still earns
    sub.cell(nb, "kv_group_size").source = sub.cell(nb, "kv_group_size").source.replace(
        "cfg.n_heads // cfg.n_kv_heads", "cfg.n_heads")  # wrong answer ...
    sub.cell(nb, "check_kv_group_size").source = "pass"  # ... hidden behind an edited test
    sub.prepend(nb, "validate_config", "import sys\nsys.exit()")  # the def never runs
    sub.cell(nb, "check_tensor_shape").metadata["nbgrader"]["points"] = 20  # points inflated
    path = sub.write(nb, folder / "tampered" / "01_notation.ipynb")

    result = by_name(grade_untouched(path))
    assert (result["head_dim"].status, result["head_dim"].points) == ("passed", 1)
    assert result["kv_group_size"].status == "failed"
    assert "expected 4" in result["kv_group_size"].message
    assert result["validate_config"].status == "error"
    assert "validate_config" in result["validate_config"].message  # NameError: not defined
    assert (result["tensor_shape"].status, result["tensor_shape"].points,
            result["tensor_shape"].max_points) == ("passed", 2, 2)


def test_a_dying_worker_ends_the_notebook_and_keeps_earlier_points(folder):
    nb = sub.prepend(sub.solution(), "tensor_shape", "import os\nos._exit(1)")
    path = sub.write(nb, folder / "crash" / "01_notation.ipynb")
    result = grade_untouched(path)
    assert "In answer cell tensor_shape: the worker process died (exit status 1)" in result.error
    assert result.points == 4
    assert by_name(result)["tensor_shape"].status == "error"
    assert by_name(result)["tensor_shape"].message.startswith("not run")
