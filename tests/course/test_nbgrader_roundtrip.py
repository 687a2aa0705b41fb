"""The instructor's round trip, for real, with the nbgrader command line and the course's config.

In a temporary course directory (the repository's nbgrader_config.py, rooted there):
generate_assignment for chapter 01, add students with `nbgrader db student add`, drop their
submissions into grading/submitted/, run ONE `nbgrader autograde`, `nbgrader export` to CSV, and
compare each student's score with the points of the test cells their code earns:

- complete:  every answer from the solution notebook            -> all points
- untouched: the release as handed out                          -> 0
- half:      the first half of the exercises solved             -> their points
- tamperer:  some exercises solved; locked test cells replaced by `pass` (one of a solved, one of
             an unsolved exercise) and a test cell's points raised -> exactly the solved points
- deleter:   all but the last exercise solved; the test cells of the first and the last exercise
             deleted                                            -> exactly the solved points
- complete_zh, half_zh: as complete and half, in the Chinese release (notebooks-zh/)
                                                                -> the same points as in English
- wrong_zh:  the Chinese release, every exercise solved but head_dim returning a float
                                                                -> all but head_dim's points, and
             head_dim's test cell shows its diagnosis in Chinese (the notebook chose Chinese)
"""

from __future__ import annotations

import copy
import csv
import shutil
from pathlib import Path

import pytest

pytest.importorskip("nbgrader")  # nbgrader 0.9.6 needs Python 3.11+ (see pyproject.toml)

import nbformat
from traitlets.config.loader import PyFileConfigLoader

from checks.exercises import SYLLABUS
from checks.tools import release

pytestmark = pytest.mark.slow

CHAPTER = "01_notation"
SOLUTION_MARK = ("### BEGIN SOLUTION", "### END SOLUTION")


def test_course_config():
    """solutions/ -> notebooks/, grading under the ignored grading/, the stub the checks read as
    "not started", a finite cell time limit, deleted test cells put back."""
    cfg = PyFileConfigLoader("nbgrader_config.py", str(release.ROOT)).load_config()
    course = cfg.CourseDirectory
    assert Path(course.root) == release.ROOT
    assert (course.source_directory, course.release_directory) == ("solutions", "notebooks")
    for step in ("submitted", "autograded", "feedback"):
        assert Path(getattr(course, f"{step}_directory")).parts[0] == "grading"
    assert course.db_url == "sqlite:///" + str(release.ROOT / "grading" / "gradebook.db")
    ignored = (release.ROOT / ".gitignore").read_text().split()
    assert "grading/" in ignored
    assert cfg.ClearSolutions.code_stub["python"].splitlines()[-1] == "raise NotImplementedError()"
    assert 10 <= cfg.Execute.timeout <= 600
    assert cfg.OverwriteCells.add_missing_cells is True


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _exercises(nb) -> list[dict]:
    """[{name, answer: grade_id, test: grade_id, points}] in notebook order."""
    out = []
    for cell in nb.cells:
        meta = _meta(cell)
        if meta.get("solution") and not meta.get("grade"):
            out.append({"name": meta["grade_id"], "tests": [], "points": 0.0})
        elif meta.get("grade") and not meta.get("solution"):
            assert out, f"test cell {meta['grade_id']} before any answer cell"
            out[-1]["tests"].append(meta["grade_id"])
            out[-1]["points"] += float(meta["points"])
    for ex in out:
        assert ex["tests"] == [f"check_{ex['name']}"], f"{ex['name']}: test cell naming convention"
    return out


def _solved_source(cell) -> str:
    """The instructor's answer, as a learner would type it (without the nbgrader markers)."""
    return "\n".join(line for line in cell.source.split("\n")
                     if line.strip() not in SOLUTION_MARK)


WRONG_HEAD_DIM = "def head_dim(cfg):\n    return cfg.hidden_size / cfg.n_heads\n"


def _submission(released, solutions, *, solve=(), replace_tests=None, delete_tests=(),
                points=None, wrong=None):
    nb = copy.deepcopy(released)
    answers = {_meta(c)["grade_id"]: c for c in solutions.cells if _meta(c).get("solution")}
    kept = []
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id")
        if gid in solve:
            cell.source = _solved_source(answers[gid])
        if gid in (wrong or {}):
            cell.source = wrong[gid]
        if gid in (replace_tests or {}):
            cell.source = replace_tests[gid]
        if gid in (points or {}):
            cell.metadata.nbgrader["points"] = points[gid]
        if gid not in delete_tests:
            kept.append(cell)
    nb.cells = kept
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course with chapter 01 released, five submissions, autograded and exported once."""
    root = tmp_path_factory.mktemp("course")
    release.write_course_config(root)
    shutil.copytree(release.SOLUTIONS / CHAPTER, root / "solutions" / CHAPTER,
                    ignore=shutil.ignore_patterns(*release.JUNK))

    def nbgrader(*args, timeout=600):
        return release.run_nbgrader(root, *args, timeout=timeout)

    log = {"generate": nbgrader("generate_assignment", CHAPTER)}
    released_path = root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
    released = nbformat.read(released_path, as_version=4)
    solutions = nbformat.read(root / "solutions" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    exercises = _exercises(solutions)
    names = [ex["name"] for ex in exercises]
    points = {ex["name"]: ex["points"] for ex in exercises}
    assert len(names) >= 3, "the round trip needs at least three exercises"

    half = names[: len(names) // 2]
    tamper_solved = names[0::2]                      # 1st, 3rd, ...
    tamper_unsolved = [n for n in names if n not in tamper_solved]
    students = {
        "complete": ({"solve": names}, sum(points.values())),
        "untouched": ({}, 0.0),
        "half": ({"solve": half}, sum(points[n] for n in half)),
        "tamperer": ({
            "solve": tamper_solved,
            # `pass` instead of the check of an unsolved exercise would earn its points; `pass`
            # instead of the check of a solved one must not cost them; nor may points be inflated.
            "replace_tests": {f"check_{tamper_unsolved[0]}": "pass",
                              f"check_{tamper_solved[-1]}": "pass"},
            "points": {f"check_{tamper_solved[0]}": 100},
        }, sum(points[n] for n in tamper_solved)),
        "deleter": ({
            "solve": names[:-1],
            "delete_tests": {f"check_{names[0]}", f"check_{names[-1]}"},
        }, sum(points[n] for n in names[:-1])),
        "complete_zh": ({"solve": names, "lang": "zh"}, sum(points.values())),
        "half_zh": ({"solve": half, "lang": "zh"}, sum(points[n] for n in half)),
        "wrong_zh": ({"solve": names, "wrong": {"head_dim": WRONG_HEAD_DIM}, "lang": "zh"},
                     sum(points.values()) - points["head_dim"]),
    }
    # The Chinese release as committed (generated from the same source: the same answer and test
    # cells, grade ids and checksums; tests/tools/test_release.py).
    released_zh = nbformat.read(release.NOTEBOOKS_ZH / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    # The gradebook's student list: one with `db student add`, the others from a CSV in one call
    # (each nbgrader command costs a few seconds of start-up).
    first, *rest = students
    nbgrader("db", "student", "add", first, f"--last-name={first.title()}", "--first-name=Learner")
    roster = root / "students.csv"
    roster.write_text("id,last_name,first_name,email\n" + "".join(
        f"{sid},{sid.title()},Learner,{sid}@example.org\n" for sid in rest), encoding="utf-8")
    nbgrader("db", "student", "import", str(roster))
    for sid, (how, _) in students.items():
        folder = root / "grading" / "submitted" / sid / CHAPTER
        folder.mkdir(parents=True)
        how = dict(how)
        base = released_zh if how.pop("lang", "en") == "zh" else released
        nbformat.write(_submission(base, solutions, **how), folder / f"{CHAPTER}.ipynb")

    log["autograde"] = nbgrader("autograde", CHAPTER)  # every submitted student, one call
    csv_path = root / "grades.csv"
    log["export"] = nbgrader("export", f"--to={csv_path}")
    with open(csv_path, newline="", encoding="utf-8") as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    return {"root": root, "rows": rows, "students": students, "log": log,
            "solutions": solutions, "released": released, "exercises": exercises,
            "total": sum(points.values())}


def _autograded(course, sid):
    path = course["root"] / "grading" / "autograded" / sid / CHAPTER / f"{CHAPTER}.ipynb"
    return nbformat.read(path, as_version=4)


def _cell_report(course, sid) -> str:
    """Each test cell of a student's autograded notebook with the error it raised, if any."""
    lines = []
    for cell in _autograded(course, sid).cells:
        meta = _meta(cell)
        if meta.get("grade") and cell.cell_type == "code":
            errors = [f"{o.get('ename')}: {str(o.get('evalue'))[:120]}" for o in cell.outputs
                      if o.output_type == "error"]
            errors += [f"stderr: {o.get('text', '')[:120]!r}" for o in cell.outputs
                       if o.output_type == "stream" and o.get("name") == "stderr"]
            lines.append(f"  {meta['grade_id']} ({meta.get('points')}): "
                         + ("; ".join(errors) or "ok"))
    return "\n".join(lines)


STUDENTS = ["complete", "untouched", "half", "tamperer", "deleter", "complete_zh", "half_zh",
            "wrong_zh"]


@pytest.mark.parametrize("sid", STUDENTS)
def test_each_student_gets_exactly_what_their_code_earns(course, sid):
    row = course["rows"].get(sid)
    assert row is not None, f"{sid} missing from the export:\n{course['log']['export'][-2000:]}"
    want = course["students"][sid][1]
    assert float(row["max_score"]) == course["total"]
    assert float(row["score"]) == want, (
        f"{sid}: scored {row['score']} of {row['max_score']}, expected {want}\n"
        + _cell_report(course, sid) + "\n--- autograde log (tail) ---\n"
        + course["log"]["autograde"][-3000:])


def test_export_lists_every_student_once(course):
    assert sorted(course["rows"]) == sorted(STUDENTS)
    # names come from the gradebook's student list (db student add / import)
    assert {sid: row["last_name"] for sid, row in course["rows"].items()} == \
        {sid: sid.title() for sid in STUDENTS}
    assert {row["assignment"] for row in course["rows"].values()} == {CHAPTER}


def test_the_generated_assignment_is_the_committed_release(course):
    """generate_assignment with the gradebook gives the same notebook as checks.tools.release."""
    committed = release.NOTEBOOKS / CHAPTER / f"{CHAPTER}.ipynb"
    generated = course["root"] / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
    assert generated.read_bytes() == committed.read_bytes(), "run `make release`"


def _test_cells(nb) -> dict[str, str]:
    return {_meta(c)["grade_id"]: c.source for c in nb.cells
            if _meta(c).get("grade") and not _meta(c).get("solution")}


def test_tampered_test_cells_are_restored_with_hidden_tests(course):
    source_tests = _test_cells(course["solutions"])
    graded = _autograded(course, "tamperer")
    assert _test_cells(graded) == source_tests, "locked test cells must be graded as written"
    assert all("BEGIN HIDDEN TESTS" in src for src in source_tests.values())
    first = f"check_{course['exercises'][0]['name']}"
    inflated = [c for c in graded.cells if _meta(c).get("grade_id") == first]
    assert float(_meta(inflated[0])["points"]) == course["exercises"][0]["points"], \
        "points edited in the submission must be reset to the gradebook's"


def test_deleted_test_cells_come_back_after_their_answer(course):
    graded = _autograded(course, "deleter")
    order = [_meta(c).get("grade_id") for c in graded.cells if _meta(c).get("grade_id")]
    expected = [gid for ex in course["exercises"] for gid in (ex["name"], *ex["tests"])]
    assert order == expected, "every test cell present, right after its answer cell"
    source_tests = _test_cells(course["solutions"])
    for gid, src in _test_cells(graded).items():
        # A re-inserted cell starts with nbgrader's one-line notice (a comment), then the source.
        assert src == source_tests[gid] or src.endswith("\n" + source_tests[gid]), gid


def test_a_chinese_submission_reads_its_diagnosis_in_chinese(course):
    """nbgrader runs the Chinese notebook's own first code cell, which chose Chinese: the failed
    test cell's error is the checker's diagnosis in Chinese, and so is "not started"."""
    def error_of(sid: str) -> str:
        cell = next(c for c in _autograded(course, sid).cells
                    if _meta(c).get("grade_id") == "check_head_dim")
        return " ".join(str(o.get("evalue", "")) + " ".join(o.get("traceback", []))
                        for o in cell.outputs if o.output_type == "error")
    text = error_of("wrong_zh")
    assert "可能的错误：返回了浮点数" in text, text[-1500:]
    assert "likely mistake" not in text
    assert "尚未开始" in _cell_report(course, "half_zh")  # its unsolved exercises


# The two newest chapters of the syllabus (15 and 16 today), on the same path:
# generate_assignment, a complete submission (the solution's answers typed into the release) and
# an untouched one, one autograde, export.
NEWEST = [chapter.folder for chapter in SYLLABUS[-2:]]


@pytest.mark.parametrize("chapter", NEWEST)
def test_the_newest_chapters_round_trip(tmp_path, chapter):
    root = tmp_path / "course"
    release.write_course_config(root)
    shutil.copytree(release.SOLUTIONS / chapter, root / "solutions" / chapter,
                    ignore=shutil.ignore_patterns(*release.JUNK))
    release.run_nbgrader(root, "generate_assignment", chapter, timeout=600)
    released = nbformat.read(root / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    solutions = nbformat.read(root / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    exercises = _exercises(solutions)
    total = sum(ex["points"] for ex in exercises)
    students = {"complete": ({"solve": [ex["name"] for ex in exercises]}, total),
                "untouched": ({}, 0.0)}
    roster = root / "students.csv"
    roster.write_text("id,last_name,first_name,email\n" + "".join(
        f"{sid},{sid.title()},Learner,{sid}@example.org\n" for sid in students), encoding="utf-8")
    release.run_nbgrader(root, "db", "student", "import", str(roster))
    for sid, (how, _points) in students.items():
        folder = root / "grading" / "submitted" / sid / chapter
        folder.mkdir(parents=True)
        nbformat.write(_submission(released, solutions, **how), folder / f"{chapter}.ipynb")
    log = release.run_nbgrader(root, "autograde", chapter, timeout=900)
    csv_path = root / "grades.csv"
    release.run_nbgrader(root, "export", f"--to={csv_path}")
    with open(csv_path, newline="", encoding="utf-8") as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    for sid, (_how, points) in students.items():
        row = rows[sid]
        assert float(row["score"]) == points, \
            f"{sid}: {row['score']} of {row['max_score']}, expected {points}\n{log[-3000:]}"
    assert total > 0
