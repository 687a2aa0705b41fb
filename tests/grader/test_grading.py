"""The grading engine: chapter lookup, rebuilding the notebook, nbgrader's scoring rule, the
worker's messages and its copy of `checks`, the memory limit, and real runs of chapter 01
submissions (each run starts a worker, so each test grades once)."""

from __future__ import annotations

import json
import os
import struct
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook, new_output

from checks import i18n
from checks.environment import LANG_ENV
from checks.grader import build, grading, identify, library, read, results, run, score
from checks.grader.cli import main
from checks.grader import wire as _wire
from checks.grader.channel import WorkerGone
from checks.grader.limits import Limits
from checks.grader.memory import MemoryCgroup
from checks.grader.results import GradingError
from checks.grader.worker import Worker

from ..support import submissions as sub


def snapshot(path: Path) -> tuple[bytes, list[str]]:
    """A notebook's bytes and its folder's listing, to prove grading changed neither."""
    return path.read_bytes(), sorted(os.listdir(path.parent))


def grade_untouched(path: Path, **kwargs) -> results.NotebookResult:
    before = snapshot(path)
    result = grading.grade_notebook(path, **kwargs)
    assert snapshot(path) == before, "grading changed the input file or its folder"
    return result


def by_name(result: results.NotebookResult) -> dict[str, results.ExerciseResult]:
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
        read.read_notebook(path)
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
    assert identify.identify_chapter(nb, tmp_path / where) == "01_notation"


@pytest.mark.parametrize("where, chapter_metadata, problem", [
    ("99_nonexistent.ipynb", None, "unknown chapter '99_nonexistent'"),
    ("homework.ipynb", "99_nonexistent", "unknown chapter '99_nonexistent'"),
    ("homework.ipynb", None, "cannot tell which chapter"),
])
def test_unknown_chapter_is_a_grading_error(tmp_path, where, chapter_metadata, problem):
    nb = new_notebook(metadata={"course": {"chapter": chapter_metadata}} if chapter_metadata
                      else {})
    with pytest.raises(GradingError, match=problem):
        identify.identify_chapter(nb, tmp_path / where)


# --------------------------------------------------------------------------------------------
# Rebuilding the notebook to run (no kernel)


def grade_ids(nb) -> list[str | None]:
    return [read.grade_id(c) for c in nb.cells]


def test_test_cells_come_from_the_source_and_deleted_ones_return():
    source = sub.solution()
    submission = sub.release_like(source)
    sub.delete(submission, "check_head_dim")
    sub.cell(submission, "check_kv_group_size").source = "pass  # edited"
    duplicate = nbformat.from_dict(dict(sub.cell(submission, "check_tensor_shape")))
    submission.cells.append(duplicate)
    sub.cell(submission, "check_tensor_shape").outputs = [
        new_output("stream", name="stdout", text="✓ tensor_shape passed")]  # a faked output

    built = build.build_graded_notebook(submission, source)

    assert all(c.cell_type == "code" and not c.outputs for c in built.cells)
    ids = grade_ids(built)
    assert ids.count("check_tensor_shape") == 1
    for name in sub.EXERCISES_01:
        assert ids.index(f"check_{name}") == ids.index(name) + 1, "test right after answer"
        assert sub.cell(built, f"check_{name}").source == sub.cell(source, f"check_{name}").source
    assert "### BEGIN HIDDEN TESTS" in sub.cell(built, "check_head_dim").source
    assert sub.cell(built, "head_dim").source == sub.cell(submission, "head_dim").source


def test_cells_a_submission_marks_as_tests_are_plain_code():
    source = sub.solution()
    submission = sub.solution()
    extra = new_code_cell("import os", metadata={"nbgrader": {
        "grade": True, "grade_id": "check_bonus", "points": 50, "locked": True,
        "solution": False}})
    submission.cells.append(extra)
    built = build.build_graded_notebook(submission, source)
    tests = [read.grade_id(c) for c in built.cells if build.is_graded_test(c)]
    assert tests == [f"check_{name}" for name in sub.EXERCISES_01]
    bonus = next(c for c in built.cells if c.source == "import os")
    assert not build.is_graded_test(bonus) and "grade" not in bonus.metadata["nbgrader"]


def test_a_test_whose_answer_cell_is_gone_goes_before_the_next_exercise():
    source = sub.solution()
    submission = sub.delete(sub.delete(sub.solution(), "check_head_dim"), "head_dim")
    ids = grade_ids(build.build_graded_notebook(submission, source))
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
    result = score.score_test_cell(graded_cell(*outputs), ran=ran, max_points=2)
    assert (result.name, result.status, result.points, result.max_points) == \
        ("head_dim", status, points, 2)
    assert message in result.message and "\n" not in result.message


SCORED_IN_CHINESE = [  # (outputs, ran, the message in Chinese); statuses and points as above
    ([], False, "没有运行：notebook 在这个测试之前就停止了"),
    ([new_output("stream", name="stderr", text="UserWarning: careful\n")], True,
     "向 stderr 写了内容：UserWarning: careful"),
    ([error("NotStarted", "head_dim: 尚未开始")], True, "仍然引发 NotImplementedError"),
    ([error("CheckFailure", "head_dim: 返回 64，应为 128。\n可能的错误：用了 n_kv_heads\n"
            "（随机输入来自种子 7；给检查传入 seed=7 即可再次看到同样的输入）")], True,
     "返回 64，应为 128。 — 可能的错误：用了 n_kv_heads"),
    ([error("AssertionError", "")], True, "隐藏测试中出现 AssertionError"),
]


@pytest.mark.parametrize("outputs, ran, message", SCORED_IN_CHINESE)
def test_scoring_says_it_in_the_submissions_language(outputs, ran, message, monkeypatch):
    """Inside grading's `using(lang)` of a Chinese submission: the grader's words in Chinese,
    the seed line of a Chinese diagnosis left out as the English one is."""
    monkeypatch.delenv(LANG_ENV, raising=False)
    with i18n.using("zh"):
        result = score.score_test_cell(graded_cell(*outputs), ran=ran, max_points=2)
    assert result.message == message


def test_an_incident_is_told_in_the_language_it_is_printed_in(monkeypatch):
    """Raised while a Chinese submission was graded, printed on the instructor's terminal: its
    words are the terminal's (LLAMA_COURSE_LANG), and the JSON keeps the English key."""
    monkeypatch.delenv(LANG_ENV, raising=False)
    with i18n.using("zh"):
        incident = results.GradingIncident(["a.ipynb", "b.ipynb"], [f"f{i}" for i in range(7)],
                                           results.OUTLIVED)
    assert str(incident) == ("while grading a.ipynb (at the same time: b.ipynb): processes of the "
                             "worker outlived it: f0, f1, f2, f3, f4 and 2 more")
    assert incident.what == "processes of the worker outlived it"
    monkeypatch.setenv(LANG_ENV, "zh")
    assert str(incident) == ("评分「a.ipynb（同时在评分：b.ipynb）」时：worker 的进程在它结束后仍"
                             "在运行：f0, f1, f2, f3, f4，以及另外 2 个")
    import pickle
    assert str(pickle.loads(pickle.dumps(incident))) == str(incident)


# --------------------------------------------------------------------------------------------
# A worker that cannot start: the grader's environment, never the submission's doing

NO_TORCH = ("the worker did not start: the worker process died (exit status 1) "
            "(ModuleNotFoundError: No module named 'torch')")


class _NoWorker:
    """A worker whose Python cannot import torch: it never gets to say it is ready."""

    def __init__(self, *args, **kwargs):
        raise WorkerGone(NO_TORCH)


def test_a_worker_that_cannot_start_gives_no_score(monkeypatch, tmp_path, capsys):
    """Before the first cell ran, nothing the submission did can be at fault: no record with
    zero points (as there was before), but one line naming the cause and exit status 2; the
    notebook is graded when the class is graded again."""
    monkeypatch.setattr(run, "Worker", _NoWorker)
    with pytest.raises(GradingError) as info:
        grading.grade_notebook(sub.SOLUTION_01)
    assert str(info.value) == (f"{sub.SOLUTION_01}: not graded: {NO_TORCH}; the grader's "
                               "environment is at fault, not the submission: fix it and grade "
                               "again")
    report = tmp_path / "grades.json"
    assert main(["grade", str(sub.SOLUTION_01), "--json", str(report)]) == 2
    data = json.loads(report.read_text())
    assert data["notebooks"] == [] and data["points"] == 0
    assert [e["error"] for e in data["errors"]] == [info.value.problem]
    assert "not graded: the worker did not start" in capsys.readouterr().err


class _NoWorkerSaysWhy:
    """A worker that does not start, with the worker's own (translated) words for why."""

    def __init__(self, *args, **kwargs):
        died = i18n._("the worker process died{exit}").format(
            exit=i18n._(" (exit status {code})").format(code=1))
        raise WorkerGone(i18n._("the worker did not start: {why}{log}").format(why=died, log=""))


def test_a_worker_that_cannot_start_is_told_in_the_instructors_language(monkeypatch, tmp_path):
    """A Chinese submission, an English terminal: the whole line is English (it is the
    instructor's problem, not the student's); with LLAMA_COURSE_LANG=zh, all Chinese."""
    monkeypatch.setattr(run, "Worker", _NoWorkerSaysWhy)
    monkeypatch.delenv(LANG_ENV, raising=False)
    path = sub.write(chinese_solution("01_notation"), tmp_path / "01_notation.ipynb")
    with pytest.raises(GradingError) as info:
        grading.grade_notebook(path)
    assert info.value.problem == ("not graded: the worker did not start: the worker process died "
                                  "(exit status 1); the grader's environment is at fault, not "
                                  "the submission: fix it and grade again")
    monkeypatch.setenv(LANG_ENV, "zh")
    with pytest.raises(GradingError) as info:
        grading.grade_notebook(path)
    assert info.value.problem.startswith(
        "未评分：worker 没有启动：worker 进程已退出（退出状态 1）；")


# --------------------------------------------------------------------------------------------
# Real runs (one kernel each)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("submissions")


@pytest.mark.grader_workers
def test_solution_gets_full_marks_and_stays_untouched():
    result = grade_untouched(sub.SOLUTION_01)
    assert result.chapter == "01_notation" and result.error is None
    assert {e.name: (e.status, e.points) for e in result.exercises} == \
        {name: ("passed", points) for name, points in sub.EXERCISES_01.items()}
    assert result.points == result.max_points == 6
    data = json.loads(json.dumps(result.to_dict()))
    assert data["points"] == 6 and data["passed"] == 4 and len(data["exercises"]) == 4


@pytest.mark.grader_workers
def test_fresh_release_scores_zero_not_started(folder):
    path = sub.RELEASE_01 if sub.RELEASE_01.is_file() else \
        sub.write(sub.release(), folder / "release" / "01_notation.ipynb")
    result = grade_untouched(path)
    assert result.error is None and result.points == 0 and result.max_points == 6
    assert {e.status for e in result.exercises} == {"not started"}


@pytest.mark.grader_workers
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


@pytest.mark.grader_workers
def test_a_cell_that_kills_the_worker_costs_only_its_exercise(folder):
    """The worker dies in head_dim's answer cell: that cell is skipped, a fresh worker runs the
    cells before it again, and the exercises after it keep their points."""
    nb = sub.prepend(sub.solution(), "head_dim", "import os\nos._exit(1)")
    path = sub.write(nb, folder / "crash" / "01_notation.ipynb")
    result = grade_untouched(path)
    assert "In answer cell head_dim: the worker process died (exit status 1)" in result.error
    assert "that cell was skipped" in result.error
    assert result.skipped == [{"cell": "answer cell head_dim",
                               "why": "the worker process died (exit status 1)"}]
    assert {e.name: e.points for e in result.exercises} == {**sub.EXERCISES_01, "head_dim": 0}
    assert by_name(result)["head_dim"].status == "error"
    assert by_name(result)["head_dim"].message == \
        "its answer cell was skipped: the worker process died (exit status 1)"


@pytest.mark.grader_workers
def test_a_learner_s_exception_keeps_its_type_and_message(folder):
    """Carried as type name and text, never re-instantiated from its arguments: a
    UnicodeDecodeError (five arguments to build) stays one, its text the learner's, not
    "TypeError: function takes exactly 5 arguments"; KeyError and OSError likewise."""
    nb = sub.solution()
    sub.cell(nb, "head_dim").source = \
        "def head_dim(cfg):\n    return int(bytes([255]).decode('utf-8'))"
    sub.cell(nb, "kv_group_size").source = "def kv_group_size(cfg):\n    return {}[25105]"
    sub.cell(nb, "validate_config").source = \
        "def validate_config(cfg):\n    open('/nonexistent/x')"
    nb = sub.write(nb, folder / "unicode" / "01_notation.ipynb")
    result = by_name(grade_untouched(nb))
    assert "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0" in \
        result["head_dim"].message, result["head_dim"].message
    assert "TypeError" not in result["head_dim"].message
    assert "KeyError: 25105" in result["kv_group_size"].message
    assert "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/x'" in \
        result["validate_config"].message, result["validate_config"].message


@pytest.mark.grader_workers
def test_a_hidden_test_that_calls_a_broken_exercise_says_fix_it_first(folder):
    """bpe_decode is right, bpe_encode (code points, not UTF-8 bytes) is not: bpe_decode's
    hidden test decodes bpe_encode's output and meets KeyError: 25105. As the self-checks do,
    the grader says to fix bpe_encode first (the mistake 02.bpe_decode.fix_bpe_encode_first)."""
    chapter = "02_tokens_to_embeddings"
    nb = sub.solution(sub.REPO / "solutions" / chapter / f"{chapter}.ipynb")
    sub.cell(nb, "bpe_encode").source = \
        "def bpe_encode(text, merges):\n    return [ord(c) for c in text]"
    path = sub.write(nb, folder / "knock-on" / f"{chapter}.ipynb")
    result = by_name(grade_untouched(path))
    assert result["bpe_encode"].status == "failed"
    decode = result["bpe_decode"]
    assert decode.points == 0 and decode.status == "failed", decode
    assert "KeyError: 25105" in decode.message
    assert "fix bpe_encode first" in decode.message, decode.message
    assert decode.mistake == "02.bpe_decode.fix_bpe_encode_first"


@pytest.mark.grader_workers
def test_hidden_tests_never_reach_the_worker(folder):
    """A submission that records the source of everything compiled in its worker (an audit hook
    on compile) and raises what it saw of the hidden tests as a message: nothing of them was
    there (the grader runs them; the worker gets the visible part), and what a diagnosis quotes
    of a learner's message is capped."""
    nb = sub.solution()
    sub.prepend(nb, "head_dim", (
        "import sys\n_seen = []\n"
        "sys.addaudithook(lambda event, args: event == 'compile' and _seen.append(\n"
        "    args[0].decode() if isinstance(args[0], bytes) else str(args[0])))"))
    sub.cell(nb, "tensor_shape").source = (
        "def tensor_shape(*args, **kwargs):\n"
        "    marks = ('### BEGIN ' + 'HIDDEN', 'thor' + 'ough=')\n"
        "    hidden = [s for s in _seen if any(m in s for m in marks)]\n"
        "    raise ValueError('SEEN ' + str(len(hidden)) + ' ' + ' | '.join(hidden) + 'x' * 5000)")
    path = sub.write(nb, folder / "audit-compile" / "01_notation.ipynb")
    result = grade_untouched(path)
    message = by_name(result)["tensor_shape"].message
    assert "SEEN 0 " in message, message[:500]
    assert "thorough" not in message and "HIDDEN" not in message
    assert len(message) < 800 and "x" * 400 not in message
    assert result.points == 4  # the other exercises keep their points


def test_the_worker_gets_the_visible_part_of_a_test_cell():
    from types import SimpleNamespace

    source = ("from checks.nb01 import check_head_dim\ncheck_head_dim(head_dim)\n"
              "### BEGIN HIDDEN TESTS\ncheck_head_dim(head_dim, thorough=True)\n"
              "assert head_dim(cfg) == 64\n### END HIDDEN TESTS\nfor i in range(2):\n"
              "    ### BEGIN HIDDEN TESTS\n    assert i < 2\n    ### END HIDDEN TESTS\n"
              "### BEGIN HIDDEN TESTS\nsecret = 1\n")
    sent = run.worker_source(SimpleNamespace(source=source))
    assert sent == ("from checks.nb01 import check_head_dim\ncheck_head_dim(head_dim)\npass\n"
                    "for i in range(2):\n    pass\npass\n")
    compile(sent, "<test>", "exec")


def test_rebuilt_exceptions_are_the_learner_s_type_and_text():
    from checks.grader.remote import rebuild_exception

    exc = rebuild_exception({"type": "UnicodeDecodeError", "args": (), "text": "bad byte"})
    assert type(exc).__name__ == "UnicodeDecodeError" and str(exc) == "bad byte"
    assert isinstance(exc, UnicodeDecodeError)
    assert isinstance(rebuild_exception({"type": "KeyError", "args": (1,), "text": "1"}),
                      KeyError)
    odd = rebuild_exception({"type": "SystemExit", "args": (1,), "text": "1"})
    assert type(odd).__name__ == "SystemExit" and not isinstance(odd, SystemExit)
    assert isinstance(odd, Exception)


@pytest.mark.grader_workers
def test_the_notebook_budget_ends_a_notebook_of_slow_cells(folder):
    """Cells that each stay under the cell limit cannot add up past the notebook's budget."""
    nb = sub.solution()
    at = nb.cells.index(sub.cell(nb, "tensor_shape"))
    nb.cells[at:at] = [new_code_cell("import time\ntime.sleep(2)") for _ in range(20)]
    path = sub.write(nb, folder / "sleeper" / "01_notation.ipynb")
    started = time.monotonic()
    result = grade_untouched(path, limits=Limits(cell_timeout=5, notebook_time=12))
    assert time.monotonic() - started < 12 + 30  # the budget, start-up and scoring
    assert "ran past its 12 s budget" in result.error or "12 s budget" in result.error
    assert {e.name: e.points for e in result.exercises} == {**sub.EXERCISES_01, "tensor_shape": 0}
    assert by_name(result)["tensor_shape"].message.startswith("not run")


# --------------------------------------------------------------------------------------------
# What the worker sends: decoded without running its code, within bounds (no worker)


def frame(tree, table=(), blob=b"") -> bytes:
    header = json.dumps({"v": tree, "s": list(table)}).encode()
    return struct.pack(">I", len(header)) + header + blob


def test_plain_values_round_trip_and_shared_storage_stays_shared():
    buffer = torch.arange(12.0).reshape(3, 4)
    value = {"a": [1, 2.5, None, True, "x", b"\x00"], "b": (buffer, buffer[1:], buffer.T),
             "c": torch.float16, "d": torch.Size([2, 3]), ("k", 1): 3 + 4j}
    got = _wire.decode(_wire.encode(value))
    assert got["a"] == value["a"] and got["c"] is torch.float16 and got["d"] == (2, 3)
    assert got[("k", 1)] == 3 + 4j
    whole, rows, transposed = got["b"]
    assert torch.equal(whole, buffer) and torch.equal(rows, buffer[1:])
    assert torch.equal(transposed, buffer.T)
    assert whole.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()


def test_objects_that_are_not_plain_data_become_handles_or_markers():
    class Liar:
        def __eq__(self, other):
            return True

    handles = []
    got = _wire.decode(_wire.encode([Liar()], lambda obj: handles.append(obj) or 7))
    assert isinstance(got[0], _wire.RemoteRef) and got[0].handle == 7 and handles
    marker = _wire.decode(_wire.encode([Liar()]))[0]
    assert isinstance(marker, _wire.Unsendable) and marker != marker


@pytest.mark.parametrize("tree, table, blob, words", [
    ({"d": [[k * (2**61 - 1), 0] for k in range(1, 30_001)]}, [], b"", "dict key"),
    ({"d": [[[1], 0]]}, [], b"", "dict key"),
    ({"x": [1, "float32", 0, [2**28], [0], False]}, [[1, 4]], b"\0" * 4, "expanded"),
    ({"x": [1, "float32", 0, [4, 4], [1, 1], False]}, [[1, 64]], b"\0" * 64, "overlapping"),
    ({"x": [1, "float32", 0, [1000], [1], False]}, [[1, 4]], b"\0" * 4, "outside"),
    ({"x": [1, "float32", 2**30, [1], [1], False]}, [[1, 4]], b"\0" * 4, "outside"),
    ({"x": [1, "object", 0, [1], [1], False]}, [[1, 4]], b"\0" * 4, "malformed"),
    ({"q": 1}, [], b"", "unknown"),
    (json.loads("[" * (_wire.MAX_DEPTH + 2) + "]" * (_wire.MAX_DEPTH + 2)), [], b"",
     "nested"),
    (list(range(_wire.MAX_NODES + 1)), [], b"", "values"),
])
def test_hostile_messages_are_refused_quickly(tree, table, blob, words):
    started = time.process_time()  # CPU time: what the decoder spends, whatever the load
    with pytest.raises(_wire.ProtocolError, match=words):
        _wire.decode(frame(tree, table, blob))
    assert time.process_time() - started < 2


def test_malformed_bytes_are_refused():
    import pickle

    for data in (b"", pickle.dumps({"kind": "cell"}), struct.pack(">I", 2**31) + b"{}",
                 frame(1)[:-1] + b"x", b"\x00\x00\x00\x02[" + b"1"):
        with pytest.raises(_wire.ProtocolError):
            _wire.decode(data)
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(_wire.ProtocolError):
        _wire.decode(struct.pack(">I", len(deep) + 13) + b'{"v": ' + deep + b', "s": []}')


def test_tensor_data_per_test_is_capped():
    storages = _wire.Storages(budget=100)
    big = _wire.encode(torch.zeros(16))  # 64 bytes
    _wire.decode(big, storages)
    with pytest.raises(_wire.ProtocolError, match="more tensor data"):
        _wire.decode(_wire.encode(torch.ones(16)), storages)


# --------------------------------------------------------------------------------------------
# The worker's copy of `checks` (no worker)


def test_the_worker_library_holds_no_answers_of_the_graded_chapter():
    copy = library.WorkerLibrary("04_self_attention", identify.SOURCE_DIR)
    files = copy.files
    assert "nb04/__init__.py" in files
    assert not any(name.startswith(f"nb{n:02d}/") for n in range(5, 15) for name in files)
    nb04 = files["nb04/__init__.py"].decode()
    assert "_verdict_check('check_attention')" in nb04 and "ref." not in nb04
    attention = files["reference/attention.py"].decode()
    for name in ("attention", "masked_softmax", "multi_head_attention", "repeat_kv",
                 "torch_mha_reference"):
        assert f"def {name}(*args, **kwargs):\n    raise RuntimeError" in attention, name
    assert "scaled_dot_product_attention" not in attention and ".softmax(" not in attention
    masks = library.PACKAGE / "reference" / "masks.py"
    assert files["reference/masks.py"] == masks.read_bytes()  # chapter 03's: kept whole
    assert copy.has("checks.reference.masks", "causal_mask")
    assert not copy.has("checks.reference.attention", "attention")
    assert not copy.has("checks.nb04", "check_attention_internals")


@pytest.mark.parametrize("chapter", ["05_multi_head", "11_decoder_block",
                                     "13_generation_kv_cache"])
def test_what_is_withheld_does_not_depend_on_the_source_notebooks_present(
        tmp_path, monkeypatch, chapter):
    """A source folder with only the graded chapter (a Gradescope zip for one chapter) and no
    course solutions/ (a wheel) withholds exactly what the whole course's folder withholds: the
    list of exercises is the course's (checks.exercises), so chapter 05 keeps 04's attention."""
    import shutil

    whole = library.WorkerLibrary(chapter, identify.SOURCE_DIR)
    alone = tmp_path / "source"
    shutil.copytree(identify.SOURCE_DIR / chapter, alone / chapter)
    monkeypatch.setattr(library, "COURSE_SOURCE", tmp_path / "no-solutions")
    library._library_plans.clear()
    single = library.WorkerLibrary(chapter, alone)
    assert single.available == whole.available
    assert single.files == whole.files


# What of grader/ the worker may have: its main loop and what that imports. Named here, not read
# from the code, so that adding a grader-side module to the library fails this file.
WORKER_SIDE = {"grader/__init__.py", "grader/worker_side.py", "grader/channel.py",
               "grader/wire.py", "grader/tensors.py", "grader/audit.py"}


def _grader_modules_imported(rel: str) -> set[str]:
    """The grader/ modules that checks/`rel` imports (relative or absolute, anywhere in it)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse((library.PACKAGE / rel).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:                      # from .x import y / from . import x
                names = [module] if module else [a.name for a in node.names]
                found |= {f"grader/{n}.py" for n in names}
            elif module.startswith("checks.grader."):
                found.add(f"grader/{module.split('.')[2]}.py")
        elif isinstance(node, ast.Import):
            found |= {f"grader/{a.name.split('.')[2]}.py" for a in node.names
                      if a.name.startswith("checks.grader.")}
    return found


@pytest.mark.parametrize("chapter", ["01_notation", "04_self_attention", "13_generation_kv_cache"])
def test_the_worker_library_holds_only_what_the_layout_allows(chapter):
    import fnmatch

    files = set(library.WorkerLibrary(chapter, identify.SOURCE_DIR).files)
    assert not [n for n in files if n.startswith("tools/")]
    assert "registry.py" not in files  # it imports every chapter's checks
    assert {n for n in files if n.startswith("grader/")} == WORKER_SIDE
    assert set(library.WORKER_GRADER_MODULES) == WORKER_SIDE
    allowed = {p.relative_to(library.PACKAGE).as_posix() for p in library.worker_module_paths()}
    for name in files:
        assert name in allowed or any(fnmatch.fnmatch(name, pattern)
                                      for pattern in library.WORKER_DATA), name
    # The worker side imports nothing of grader/ beyond itself, and needs all of it.
    reached, todo = {"grader/__init__.py"}, ["grader/worker_side.py"]
    while todo:
        rel = todo.pop()
        reached.add(rel)
        todo += [m for m in _grader_modules_imported(rel) if m not in reached]
    assert reached == WORKER_SIDE


def test_the_worker_side_imports_from_its_library_alone(tmp_path):
    """A fresh Python with only the built library on its path imports the worker's main loop,
    and every `checks` module it loads comes from the library (none from the grader's copy)."""
    import subprocess
    import sys

    lib = library.WorkerLibrary("04_self_attention", identify.SOURCE_DIR).build(tmp_path)
    code = (f"import sys; sys.path.insert(0, {str(lib)!r})\n"
            "from checks.grader.worker_side import worker_main\n"
            "outside = [m for m, mod in sys.modules.items() if m.split('.')[0] == 'checks'\n"
            f"           and not (getattr(mod, '__file__', None) or '').startswith({str(lib)!r})]\n"
            "print('outside:', sorted(outside))\n")
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "outside: []", done.stdout


def test_helpers_the_notebook_imports_travel_without_the_checks():
    copy = library.WorkerLibrary("13_generation_kv_cache", identify.SOURCE_DIR)
    nb13 = copy.files["nb13/__init__.py"].decode()
    assert "from ..held import tensor_nbytes" in nb13 and "class _CountingTable" in nb13
    assert "def tensor_nbytes" in copy.files["held.py"].decode()
    assert "_SimCache" not in nb13 and "def _check_steps" not in nb13
    # the chapter's internals stay with the grader
    assert [name for name in copy.files if name.startswith("nb13/")] == ["nb13/__init__.py"]
    assert "nb12/forward.py" in copy.files  # an earlier chapter's internals travel whole
    generation = copy.files["reference/generation.py"].decode()
    assert "scaled_dot_product_attention" not in generation


# --------------------------------------------------------------------------------------------
# Memory: counted as memory used, never as address space reserved (one worker each)

# 64 GiB of address space, never touched (as CUDA builds of torch reserve it)
RESERVE = ("import mmap\n"
           "reserved = mmap.mmap(-1, 64 << 30, prot=mmap.PROT_READ,\n"
           "                     flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)")


def test_the_reservation_is_what_an_address_space_limit_refuses():
    """So the test below tells the two mechanisms apart: under `RLIMIT_AS` (the grader's old
    `--memory`) this reservation fails, as importing PyPI's CUDA build of torch did."""
    import subprocess
    import sys

    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            + RESERVE)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "Cannot allocate memory" in done.stderr


@pytest.mark.grader_workers
def test_a_generator_moves_on_across_calls_into_the_worker():
    """The worker draws from a copy of the caller's generator; the caller's generator ends where
    the copy ended, so two calls with one generator draw different numbers, as they do in a
    notebook (chapter 13's check calls generate twice with one generator)."""
    from checks.grader.remote import RemoteFunction

    copy = library.WorkerLibrary("01_notation", identify.SOURCE_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker(tmp, Limits(cell_timeout=60), copy)
        try:
            assert worker.run_cell(0, "import torch\n"
                                      "def draw(g):\n    return torch.rand(3, generator=g)")["ok"]
            draw = RemoteFunction(worker, "draw", time.monotonic() + 60)
            g = torch.Generator().manual_seed(7)
            first, second = draw(g), draw(g)
        finally:
            worker.close()
    here = torch.Generator().manual_seed(7)
    assert torch.equal(first, torch.rand(3, generator=here))
    assert torch.equal(second, torch.rand(3, generator=here))
    assert torch.equal(g.get_state(), here.get_state())


@pytest.mark.parametrize("memory_by, isolation", [("cgroup", "auto"), ("rss", "auto"),
                                                   ("rss", "none")])
@pytest.mark.grader_workers
def test_memory_limit_counts_memory_used_not_address_space(memory_by, isolation):
    if memory_by == "cgroup":
        cgroup = MemoryCgroup.create(2**30)
        if cgroup is None:
            pytest.skip("no memory cgroup can be made here")
        cgroup.kill_all()
    limits = Limits(memory=900 * 2**20, memory_by=memory_by, cell_timeout=60,
                    isolation=isolation)
    copy = library.WorkerLibrary("01_notation", identify.SOURCE_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker(tmp, limits, copy)
        try:
            assert worker.run_cell(0, RESERVE)["ok"]
            # 2 GiB touched: over the limit, the worker is killed and the report says why
            with pytest.raises(WorkerGone, match="memory limit"):
                worker.run_cell(1, "import torch\nhog = torch.ones(2**31, dtype=torch.uint8)")
        finally:
            worker.close()
        assert worker.left_behind == []


# --------------------------------------------------------------------------------------------
# Fairness: a hang or crash costs only the exercise it is in, and those whose code calls it
# (one graded class folder: every kind of fault in chapters 01, 04, 08 and 13)

FAULTS = {  # code put at the top of the exercise's function body, and the report's words
    "hang": ("while True:\n    pass", "ran longer than the"),
    "segfault": ("import ctypes\nctypes.string_at(0)", "killed by SIGSEGV"),
    "os_exit": ("import os\nos._exit(3)", "exit status 3"),
    "memory": ("import torch\n_hog = torch.ones(2**31, dtype=torch.uint8)", "memory limit"),
}
BROKEN = {  # chapter: (the exercise broken, the exercises whose code calls it)
    "01_notation": ("kv_group_size", set()),
    "04_self_attention": ("attention_scores", {"attention"}),
    "08_rope": ("rotation_matrix", set()),
    "13_generation_kv_cache": ("generate", set()),
}
# Chapter 01 of the Chinese release, broken by two fast faults (a hang would add its timeout)
ZH_CHAPTER, ZH_FAULTS = "01_notation", ("segfault", "os_exit")
ZH_WORDS = {"segfault": "被 SIGSEGV 终止", "os_exit": "（退出状态 3）"}
FAULT_TIMEOUT = 20  # seconds per cell: room for the memory hog to be killed on a loaded machine
FAULT_BUDGET = 150  # seconds per notebook (--notebook-timeout)


def break_function(nb, name: str, code: str):
    """`code` as the first statements of function `name`'s body in its answer cell."""
    import ast

    target = sub.cell(nb, name)
    lines = target.source.split("\n")
    node = next(n for n in ast.parse(target.source).body
                if isinstance(n, ast.FunctionDef) and n.name == name)
    first = node.body[0].lineno - 1
    if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
        first = node.body[0].end_lineno  # after the docstring
    indent = " " * node.body[0].col_offset
    lines[first:first] = [indent + line for line in code.split("\n")]
    target.source = "\n".join(lines)
    return nb


def chinese_solution(chapter: str):
    """The chapter of the Chinese release (notebooks-zh/) with the solutions' answer cells."""
    nb = sub.solution(sub.REPO / "notebooks-zh" / chapter / f"{chapter}.ipynb")
    source = sub.solution(identify.SOURCE_DIR / chapter / f"{chapter}.ipynb")
    for answer in source.cells:
        gid = read.grade_id(answer)
        if gid and answer.metadata["nbgrader"].get("solution"):
            sub.cell(nb, gid).source = answer.source
    return nb


def solution_points(chapter: str) -> dict[str, float]:
    nb = sub.solution(identify.SOURCE_DIR / chapter / f"{chapter}.ipynb")
    return {score.exercise_name(read.grade_id(c)): float(c.metadata["nbgrader"]["points"])
            for c in nb.cells if read.is_test_cell(c)}


@pytest.fixture(scope="module")
def faults_graded(tmp_path_factory):
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("faults")
    for chapter, (name, _) in BROKEN.items():
        for kind, (code, _) in FAULTS.items():
            nb = sub.solution(identify.SOURCE_DIR / chapter / f"{chapter}.ipynb")
            sub.write(break_function(nb, name, code), folder / kind / chapter / f"{chapter}.ipynb")
    for kind in ZH_FAULTS:  # the Chinese release, the solutions' answers pasted in
        name = BROKEN[ZH_CHAPTER][0]
        nb = break_function(chinese_solution(ZH_CHAPTER), name, FAULTS[kind][0])
        sub.write(nb, folder / f"zh-{kind}" / ZH_CHAPTER / f"{ZH_CHAPTER}.ipynb")
    report = folder / "grades.json"
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(folder), "--timeout", str(FAULT_TIMEOUT),
         "--notebook-timeout", str(FAULT_BUDGET), "--memory", "1500M", "--jobs", "2",
         "--json", str(report)], capture_output=True, text=True, timeout=1500,
        env={**{k: v for k, v in os.environ.items() if k != LANG_ENV}, "OMP_NUM_THREADS": "1"})
    assert report.is_file(), done.stderr[-3000:]
    data = json.loads(report.read_text())
    return done, {(Path(nb["path"]).parts[-3], nb["chapter"]): nb for nb in data["notebooks"]}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FAULTS))
@pytest.mark.parametrize("chapter", sorted(BROKEN))
@pytest.mark.grader_workers
def test_a_fault_costs_only_its_exercise_and_those_that_call_it(faults_graded, chapter, kind):
    done, graded = faults_graded
    assert done.returncode == 0, done.stderr[-3000:]
    nb = graded[(kind, chapter)]
    broken, callers = BROKEN[chapter]
    lost = {broken, *callers}
    expected = {name: 0.0 if name in lost else points
                for name, points in solution_points(chapter).items()}
    assert {e["name"]: e["points"] for e in nb["exercises"]} == expected, nb["error"]
    words = FAULTS[kind][1]
    for e in nb["exercises"]:
        if e["name"] == broken or (e["name"] in callers and kind != "hang"):
            assert e["status"] == "error" and words in e["message"], e
        elif e["name"] in callers:  # a function that hung is not called again: no second wait
            assert e["status"] == "error" and f"it calls `{broken}`, which ran past the time " \
                "limit" in e["message"] and "not called again" in e["message"], e
    assert [s["cell"] for s in nb["skipped"]] == \
        [f"test cell check_{name}" for name in expected if name in lost]
    assert all(words in s["why"] or "not called again" in s["why"] for s in nb["skipped"]), \
        nb["skipped"]
    assert words in nb["error"] and "that cell was skipped" in nb["error"]
    assert nb["seconds"] < FAULT_BUDGET + 30


@pytest.mark.slow
@pytest.mark.parametrize("kind", ZH_FAULTS)
@pytest.mark.grader_workers
def test_a_fault_in_a_chinese_submission_costs_the_same_and_reads_in_chinese(faults_graded, kind):
    """The same points as the English release, and the grader's own words (why the cell was
    skipped, what the worker did) in the submission's language."""
    done, graded = faults_graded
    zh, en = graded[(f"zh-{kind}", ZH_CHAPTER)], graded[(kind, ZH_CHAPTER)]
    assert zh["lang"] == "zh" and en["lang"] == "en"
    assert [(e["name"], e["points"], e["status"]) for e in zh["exercises"]] == \
        [(e["name"], e["points"], e["status"]) for e in en["exercises"]]
    broken = BROKEN[ZH_CHAPTER][0]
    message = next(e["message"] for e in zh["exercises"] if e["name"] == broken)
    assert ZH_WORDS[kind] in message and message.endswith("（这个测试被跳过）"), message
    assert [s["cell"] for s in zh["skipped"]] == [f"测试单元格 check_{broken}"]
    assert zh["error"].startswith(f"「测试单元格 check_{broken}」中：") and \
        "这个单元格被跳过（worker 已重启，之前的单元格重新运行）。" in zh["error"], zh["error"]
    for english in ("killed by", "exit status", "the test was skipped", "that cell was skipped",
                    "test cell"):
        assert english not in message + zh["error"] + zh["skipped"][0]["cell"]
