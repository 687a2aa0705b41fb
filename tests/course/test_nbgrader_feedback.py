"""nbgrader's path for submissions that hang, crash a name or lose cells, with the real CLI.

In a temporary course directory (the repository's nbgrader_config.py, rooted there, as in
test_nbgrader_roundtrip.py): generate_assignment for chapters 01 and 08, one `nbgrader autograde`
per chapter (chapter 01 with a short cell time limit), `generate_feedback`, `export`:

- hanger (01):          every exercise solved, kv_group_size loops forever -> all but its points;
                        its feedback shows the KeyboardInterrupt, no hidden test, no checker frame
- renamer (08):         every exercise solved, rotation_matrix defined under another name -> all
                        but its points; its feedback shows the NameError, no hidden test
- answer_deleted (01):  validate_config's answer cell deleted            -> all but its points
- both_deleted (01):    validate_config's answer and test cells deleted  -> all but its points
- answer_renamed (01):  tensor_shape's answer cell has another grade id  -> all points (its code
                        is there and passes)

The last two crashed nbgrader 0.9.6's OverwriteCells (`KeyError`) and exported a silent 0.0.
"""

from __future__ import annotations

import copy
import csv
import html
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("nbgrader")  # nbgrader 0.9.6 needs Python 3.11+ (see pyproject.toml)

import nbformat

from checks.grader.nbgrader_plugins import HIDDEN_NOTE, HISTORY_NOTE
from checks.tools import release

pytestmark = pytest.mark.slow

CH01, CH08 = "01_notation", "08_rope"
SOLUTION_MARK = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARK = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
#: Chapter 01's cell time limit here (the course sets 120 s): long enough for any honest cell of
#: chapter 01 on a busy machine (importing torch under load: under 10 s seen with two test
#: processes), short enough for a quick test (the hanging submission costs it twice).
TIMEOUT = 30

HANG = "def kv_group_size(cfg):\n    while True:\n        pass\n"
RENAMED = ("rotation_matrix", "rotation_matrx")
# Round five: a last cell that prints IPython's input history after the tests ran (In, _ih, Out
# and %history, which nbgrader's kernel keeps): the hidden tests' source was in its output.
HISTORY = ("print(In)\nfor _line in _ih:\n    print(_line)\nprint(repr(_ih[-4:]))\n"
           "get_ipython().run_line_magic('history', '')")

# student -> (chapter, what to change; the exercise whose points are lost, if any)
STUDENTS = {
    "hanger": (CH01, {"replace": {"kv_group_size": HANG}}, "kv_group_size"),
    "answer_deleted": (CH01, {"delete": {"validate_config"}}, "validate_config"),
    "both_deleted": (CH01, {"delete": {"validate_config", "check_validate_config"}},
                     "validate_config"),
    "answer_renamed": (CH01, {"rename": {"tensor_shape": "tensor_shape_mine"}}, None),
    "renamer": (CH08, {"typo": RENAMED}, RENAMED[0]),
    "history_reader": (CH01, {"append": HISTORY}, None),
}


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _points(solutions) -> dict[str, float]:
    """exercise (answer cell's grade id) -> points of the test cells after it."""
    points: dict[str, float] = {}
    current = None
    for cell in solutions.cells:
        meta = _meta(cell)
        if meta.get("solution") and not meta.get("grade"):
            current = meta["grade_id"]
            points[current] = 0.0
        elif meta.get("grade") and not meta.get("solution"):
            points[current] += float(meta["points"])
    return points


def _solved(cell) -> str:
    return "\n".join(line for line in cell.source.split("\n") if line.strip() not in SOLUTION_MARK)


def _submission(released, solutions, *, replace=None, delete=(), rename=None, typo=None,
                append=None):
    """The release with every answer solved, then the changes a student made."""
    answers = {_meta(c)["grade_id"]: c for c in solutions.cells if _meta(c).get("solution")}
    nb = copy.deepcopy(released)
    kept = []
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id")
        if gid in answers:
            cell.source = _solved(answers[gid])
        if gid in (replace or {}):
            cell.source = replace[gid]
        if typo and gid == typo[0]:
            cell.source = cell.source.replace(f"def {typo[0]}(", f"def {typo[1]}(")
        if gid in (rename or {}):
            cell.metadata.nbgrader["grade_id"] = rename[gid]
        if gid not in delete:
            kept.append(cell)
    nb.cells = kept + ([nbformat.v4.new_code_cell(append)] if append else [])
    return nb


def _hidden_lines(solutions) -> set[str]:
    """Every line of a hidden-test region (markers included) that appears nowhere else in the
    solutions (where it would not be a secret: the answers are in a solved submission too)."""
    hidden, visible, inside = set(), [], False
    for cell in solutions.cells:
        for line in cell.source.split("\n"):
            if line.strip() == HIDDEN_MARK[0]:
                inside = True
            (hidden.add(line.strip()) if inside else visible.append(line))
            if line.strip() == HIDDEN_MARK[1]:
                inside = False
    visible_text = "\n".join(visible)
    return {line for line in hidden if line and line not in visible_text}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("feedback_course")
    release.write_course_config(root)

    def nbgrader(*args, timeout=900):
        return release.run_nbgrader(root, *args, timeout=timeout)

    books = {}
    for chapter in (CH01, CH08):
        shutil.copytree(release.SOLUTIONS / chapter, root / "solutions" / chapter,
                        ignore=shutil.ignore_patterns(*release.NOT_RELEASED))
        nbgrader("generate_assignment", chapter)
        books[chapter] = {
            "solutions": nbformat.read(root / "solutions" / chapter / f"{chapter}.ipynb", 4),
            "released": nbformat.read(root / "notebooks" / chapter / f"{chapter}.ipynb", 4),
        }
        books[chapter]["points"] = _points(books[chapter]["solutions"])
    for sid, (chapter, how, _) in STUDENTS.items():
        folder = root / "grading" / "submitted" / sid / chapter
        folder.mkdir(parents=True)
        nb = _submission(books[chapter]["released"], books[chapter]["solutions"], **how)
        nbformat.write(nb, folder / f"{chapter}.ipynb")

    log = {
        CH01: nbgrader("autograde", CH01, f"--Execute.timeout={TIMEOUT}"),
        CH08: nbgrader("autograde", CH08),
    }
    for chapter in (CH01, CH08):
        log[chapter] += nbgrader("generate_feedback", chapter)
    csv_path = root / "grades.csv"
    log["export"] = nbgrader("export", f"--to={csv_path}")
    with open(csv_path, newline="", encoding="utf-8") as fh:
        rows = {(row["student_id"], row["assignment"]): row for row in csv.DictReader(fh)}
    return {"root": root, "books": books, "rows": rows, "log": log}


def _path(course, step: str, sid: str, suffix: str) -> Path:
    chapter = STUDENTS[sid][0]
    return course["root"] / "grading" / step / sid / chapter / f"{chapter}{suffix}"


def _text(html_source: str) -> str:
    """What a browser shows of the HTML: no tags, entities decoded (so that syntax highlighting's
    spans do not split a line the test looks for)."""
    body = re.sub(r"(?is)<(script|style)\b.*?</\1>", "", html_source)
    return html.unescape(re.sub(r"(?s)<[^>]+>", "", body))


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def _traceback(nb, grade_id: str) -> str:
    cell = next(c for c in nb.cells if _meta(c).get("grade_id") == grade_id)
    return _plain("\n".join("\n".join(o.get("traceback", [])) for o in cell.outputs
                            if o.get("output_type") == "error"))


@pytest.mark.parametrize("sid", list(STUDENTS))
def test_each_submission_autogrades_to_the_points_its_code_earns(course, sid):
    chapter, _, lost = STUDENTS[sid]
    points = course["books"][chapter]["points"]
    row = course["rows"].get((sid, chapter))
    assert row is not None, f"{sid} missing from the export:\n{course['log'][chapter][-3000:]}"
    want = sum(points.values()) - (points[lost] if lost else 0.0)
    assert float(row["max_score"]) == sum(points.values())
    assert float(row["score"]) == want, (
        f"{sid}: {row['score']} of {row['max_score']}, expected {want}\n"
        + course["log"][chapter][-3000:])


def _feedback(course, sid) -> str:
    return _text(_path(course, "feedback", sid, ".html").read_text(encoding="utf-8"))


def _test_cell_text(feedback: str, grade_id: str) -> str:
    """A test cell's part of the feedback: from its heading ("Grade cell: <id>") to the next
    nbgrader cell's heading."""
    start = feedback.index(f"Grade cell: {grade_id}")
    ends = [feedback.find(mark, start + 1) for mark in ("Grade cell: ", "Student's answer")]
    return feedback[start:min([e for e in ends if e > 0] or [len(feedback)])]


@pytest.mark.parametrize("sid, exercise, shown", [
    ("hanger", "kv_group_size", ["KeyboardInterrupt"]),
    ("renamer", RENAMED[0], ["NameError: name 'rotation_matrix' is not defined"]),
])
def test_feedback_shows_the_exception_but_no_hidden_test(course, sid, exercise, shown):
    chapter = STUDENTS[sid][0]
    graded = nbformat.read(_path(course, "autograded", sid, ".ipynb"), 4)
    instructor = _traceback(graded, f"check_{exercise}")
    # The instructor's copy has IPython's whole traceback: the leak this test is about.
    assert HIDDEN_MARK[0] in instructor, instructor[-2000:]
    feedback = _feedback(course, sid)
    hidden = _hidden_lines(course["books"][chapter]["solutions"])
    assert len(hidden) >= 5, "the chapter should have hidden tests to leak"
    leaked = sorted(line for line in hidden if line in feedback)
    assert not leaked, f"hidden tests in {sid}'s feedback: {leaked}"
    assert HIDDEN_MARK[0] not in feedback
    frames = re.findall(r"\S*checks[/\\]\w+\.py\S*", feedback)
    assert not frames, f"the checker's frames in {sid}'s feedback: {frames[:5]}"
    cell = _test_cell_text(feedback, f"check_{exercise}")
    for text in shown + [HIDDEN_NOTE]:
        assert text in cell, f"{text!r} missing from {sid}'s check_{exercise}:\n{cell[-2000:]}"


def test_a_hang_is_shown_where_the_learner_code_spins(course):
    """The timed-out test cell keeps the frame of the learner's own loop, and only that one."""
    graded = nbformat.read(_path(course, "autograded", "hanger", ".ipynb"), 4)
    assert "checks/nb01/__init__.py" in _traceback(graded, "check_kv_group_size").replace("\\", "/")
    cell = _test_cell_text(_feedback(course, "hanger"), "check_kv_group_size")
    frame = re.search(r"Cell In\[\d+\], line \d+, in kv_group_size", cell)
    assert frame, cell[-2000:]
    assert "while True" in cell[frame.end():]
    assert "check_kv_group_size(kv_group_size)" not in cell[cell.index("KeyboardInterrupt"):]


def test_missing_cells_are_put_back_in_order(course):
    """The test cell deleted with its answer comes back, after the cell before it that is left."""
    graded = nbformat.read(_path(course, "autograded", "both_deleted", ".ipynb"), 4)
    ids = [_meta(c).get("grade_id") for c in graded.cells if _meta(c).get("grade_id")]
    assert "validate_config" not in ids
    assert ids.index("check_validate_config") == ids.index("check_kv_group_size") + 1
    assert "NameError" in _traceback(graded, "check_validate_config")
    renamed = nbformat.read(_path(course, "autograded", "answer_renamed", ".ipynb"), 4)
    ids = [_meta(c).get("grade_id") for c in renamed.cells]
    assert "check_tensor_shape" in ids and "tensor_shape_mine" not in ids
    # the renamed cell stayed, as an ordinary cell, and its function was defined and checked
    assert any(c.source.startswith("def tensor_shape(") and not _meta(c) for c in renamed.cells)


def test_hide_test_code_keeps_diagnoses_and_learner_frames():
    """The rules on a notebook made here: IPython 8.0's frame header ("Input In [N]") too, a
    checker's diagnosis (no frames) as it is, the course's frames dropped outside test cells."""
    from checks.grader.nbgrader_plugins import HideTestCode

    def error(*traceback):
        return nbformat.v4.new_output("error", ename="E", evalue="m", traceback=list(traceback))

    learner = nbformat.v4.new_code_cell("def f():\n    g()", execution_count=3)
    test = nbformat.v4.new_code_cell("f()\n### BEGIN HIDDEN TESTS\nassert f() == 1\n"
                                     "### END HIDDEN TESTS", execution_count=4)
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "check_f",
                                 "points": 1}
    demo = nbformat.v4.new_code_cell("checks.nb01.show(f)", execution_count=5)
    test.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="warning\nassert f() == 1\n"),
        error("E  Traceback (most recent call last)", "Input In [4], in <cell line: 1>()\n"
              "----> 1 f()\n      2 ### BEGIN HIDDEN TESTS", "File /x/site.py:3, in h()",
              "Input In [3], in f()\n----> 2     g()", "E: m"),
        error("\x1b[31m✗ f: returned 2\x1b[0m", "    called with ()"),
    ]
    demo.outputs = [error("Cell In[5], line 1", "File /opt/checks/nb01.py:9, in show(f)",
                          "File /usr/lib/torch/x.py:1, in y()", "E: m")]
    nb = nbformat.v4.new_notebook(cells=[learner, test, demo])
    HideTestCode().preprocess(nb, {})
    assert test.outputs[0].text == "warning\n"
    assert test.outputs[1].traceback == ["E  Traceback (most recent call last)", HIDDEN_NOTE,
                                         "Input In [3], in f()\n----> 2     g()", "E: m"]
    assert test.outputs[2].traceback == ["\x1b[31m✗ f: returned 2\x1b[0m", "    called with ()"]
    assert demo.outputs[0].traceback == ["Cell In[5], line 1", HIDDEN_NOTE,
                                         "File /usr/lib/torch/x.py:1, in y()", "E: m"]


def test_a_cell_printing_the_input_history_shows_no_hidden_test(course):
    """Round five, on nbgrader's own path: the learner's last cell prints In, _ih and %history
    after every test cell ran (the instructor's copy holds the hidden tests' lines there); the
    feedback shows none of them, each line that quoted one replaced by HISTORY_NOTE."""
    graded = nbformat.read(_path(course, "autograded", "history_reader", ".ipynb"), 4)
    printed = "".join(o.get("text", "") for o in graded.cells[-1].outputs)
    assert HIDDEN_MARK[0] in printed, printed[-2000:]  # the leak this test is about
    feedback = _feedback(course, "history_reader")
    hidden = _hidden_lines(course["books"][CH01]["solutions"])
    leaked = sorted(line for line in hidden if line in feedback)
    assert not leaked, f"hidden tests in the feedback: {leaked}"
    assert HIDDEN_MARK[0] not in feedback and HISTORY_NOTE in feedback
