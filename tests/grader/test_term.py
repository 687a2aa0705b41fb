"""A term of grading: two assignments (chapters 01 and 03, solution notebooks) with their own due
times (`--assignments FILE`), one student's extension for one of them (`--extensions FILE` with
an assignment column), and a late penalty on the other, graded in one run through
`python -m checks grade`, then again after one due time changed: the lateness and the penalty
are right in the JSON, the gradebook, the exercises CSV, the feedback pages and the class report,
both times. The class has a roster with a student who submitted nothing (the report's student
view lists her) and a student whose work is in `01_notation-Copy1.ipynb` beside the untouched
release (refused, the stub graded, and flagged in the summary, the report and the CSV); the
feedback folder has an index page, and times are shown in the grading machine's zone (TZ),
named. And the files' bad input: one line, exit status 2, nothing graded."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from checks.grader.cli import main

from ..support import submissions as sub

ONE, THREE = "01_notation", "03_architectures"
SOLUTIONS = sub.REPO / "solutions"
# when each submission was handed in (nbgrader's timestamp.txt, UTC)
HANDED_IN = {("ana", ONE): "2026-03-01 12:00:00.000000 UTC",  # on time
             ("ana", THREE): "2026-03-09 10:00:00.000000 UTC",  # 1 d 10 h late: 2 days begun
             ("ben", ONE): "2026-03-03 10:00:00.000000 UTC",  # late, but within his extension
             ("ben", THREE): "2026-03-07 20:00:00.000000 UTC"}  # on time
ASSIGNMENTS = ("assignment,due,penalty_per_day,max_penalty,lms_id\n"
               f"{ONE},2026-03-01T23:59,,,\n"
               f"{THREE},2026-03-08T00:00+01:00,0.1,0.3,4242\n")  # due 03-07 23:00 UTC
EXTENSIONS = f"student,assignment,due\nben,{ONE},2026-03-04T00:00Z\n"
# cy submitted nothing; dia worked in a copy beside the untouched release
ROSTER = ("folder,id,name,section\nana,1,Ana Alves,A\nben,2,Ben Bauer,A\ncy,3,Cy Cruz,B\n"
          "dia,4,Dia Dias,B\n")
COPY = f"{ONE}-Copy1.ipynb"


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    root = tmp_path_factory.mktemp("term")
    for (student, chapter), stamp in HANDED_IN.items():
        folder = root / "submitted" / student / chapter
        sub.write(sub.solution(SOLUTIONS / chapter / f"{chapter}.ipynb"),
                  folder / f"{chapter}.ipynb")
        (folder / "timestamp.txt").write_text(stamp)
    dia = root / "submitted" / "dia" / ONE
    sub.write(sub.release(), dia / f"{ONE}.ipynb")
    sub.write(sub.solution(), dia / COPY)
    (root / "assignments.csv").write_text(ASSIGNMENTS)
    (root / "extensions.csv").write_text(EXTENSIONS)
    (root / "roster.csv").write_text(ROSTER)
    return root


def grade(root, out):
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(root / "submitted"),
         "--assignments", str(root / "assignments.csv"),
         "--extensions", str(root / "extensions.csv"),
         "--due", "2026-01-01T00:00",  # the default: no assignment here falls back on it
         "--json", str(out / "grades.json"), "--csv", str(out / "grades.csv"),
         "--csv-exercises", str(out / "exercises.csv"), "--feedback", str(out / "feedback"),
         "--report", str(out / "class.html"), "--roster", str(root / "roster.csv"),
         "--jobs", "2"],
        capture_output=True, text=True, timeout=900,
        env={**{k: v for k, v in os.environ.items() if k != "LLAMA_COURSE_LANG"},
             "OMP_NUM_THREADS": "1", "TZ": "Europe/Paris"})
    # 2: dia's copy is refused (a second notebook of her chapter), in one line
    assert done.returncode == 2, done.stderr
    (refused,) = [line for line in done.stderr.splitlines() if COPY in line]
    assert "it has work and the one graded has none: --use-copies grades it" in refused
    data = json.loads((out / "grades.json").read_text())
    return {(r["student"], r["chapter"]): r for r in data["notebooks"]}, done


def rows_of(text: str) -> dict[str, dict[str, str]]:
    rows = list(csv.reader(io.StringIO(text)))
    return {row[0]: dict(zip(rows[0], row)) for row in rows[1:]}


def book_rows(text: str) -> dict[str, dict[str, str]]:
    """The gradebook's rows by SIS Login ID (the student's folder: the roster gives no login)."""
    rows = list(csv.reader(io.StringIO(text)))
    return {row[3]: dict(zip(rows[0], row)) for row in rows[2:]}


@pytest.fixture(scope="module")
def graded_twice(term):
    out = term / "out"
    first = grade(term, out)
    saved = {name: (out / name).read_text(encoding="utf-8")
             for name in ("grades.csv", "exercises.csv", "class.html")}
    saved["feedback"] = (out / "feedback" / "ana" / f"{THREE}.html").read_text(encoding="utf-8")
    # The instructor moves chapter 03's due time past ana's submission; nothing else changes.
    (term / "assignments.csv").write_text(
        ASSIGNMENTS.replace("2026-03-08T00:00+01:00", "2026-03-10T00:00Z"))
    second = grade(term, out)
    return first, saved, second, out


def test_the_first_run_marks_each_assignment_by_its_own_due_time(graded_twice):
    (records, _done), saved, _second, _out = graded_twice
    max_three = records["ana", THREE]["max_points"]
    penalty = round(0.2 * max_three, 2)  # two days begun, 0.1 a day (at most 0.3)
    assert records["ana", THREE]["points"] == max_three  # a solution: every point earned
    # JSON: each notebook's due (the student's), late, penalty
    expected = {("ana", ONE): ("2026-03-01T23:59:00+00:00", False, None),
                ("ana", THREE): ("2026-03-07T23:00:00+00:00", True, penalty),
                ("ben", ONE): ("2026-03-04T00:00:00+00:00", False, None),  # the extension
                ("ben", THREE): ("2026-03-07T23:00:00+00:00", False, 0.0)}
    assert {k: (r["due"], r["late"], r["penalty"]) for k, r in records.items()
            if k[0] != "dia"} == expected
    assert records["ana", THREE]["late_by_seconds"] == 35 * 3600
    assert records["ana", THREE]["lms_id"] == "4242" and "lms_id" not in records["ana", ONE]
    # the gradebook: the score after the penalty, a column of the penalty, the LMS id
    book = book_rows(saved["grades.csv"])
    column = f"{THREE} (4242)"
    assert list(book["ana"])[5:] == [ONE, column, f"{THREE} late penalty"]
    assert float(book["ana"][column]) == pytest.approx(max_three - penalty)
    assert float(book["ana"][f"{THREE} late penalty"]) == pytest.approx(penalty)
    assert float(book["ben"][column]) == max_three
    assert book["ana"]["Student"] == "Ana Alves" and book["cy"][column] == ""  # the roster's
    assert book["ben"][f"{THREE} late penalty"] == "0"
    exercises = rows_of(saved["exercises.csv"])
    assert (exercises["ana"][f"{THREE} late"], exercises["ben"][f"{ONE} late"]) == ("yes", "no")
    assert float(exercises["ana"][f"{THREE} score"]) == pytest.approx(max_three - penalty)
    # the feedback page and the class report
    assert "late by 1 d 11 h" in saved["feedback"]
    # in the machine's zone (TZ=Europe/Paris), named: 10:00 UTC is 11:00 CET
    assert "Submitted 2026-03-09 11:00 CET (UTC+01:00) (due 2026-03-08 00:00 CET" in \
        saved["feedback"]
    assert f"late penalty: -{penalty:g} points" in saved["feedback"]
    page = saved["class.html"]
    assert "late by 1 d 11 h</td><td>ana</td>" in page
    assert f"late penalties: {penalty:g} points deducted" in page
    assert page.count("1 late") == 1  # chapter 03's; ben's chapter 01 is within his extension


def test_a_changed_due_time_changes_only_its_assignment(graded_twice):
    (first, _done), _saved, (records, done), out = graded_twice
    assert "5 of 5 notebooks unchanged since they were graded" in done.stderr
    assert records["ana", THREE]["due"] == "2026-03-10T00:00:00+00:00"
    assert (records["ana", THREE]["late"], records["ana", THREE]["penalty"]) == (False, 0.0)
    assert records["ben", THREE]["due"] == "2026-03-10T00:00:00+00:00"  # the assignment's
    for key in (("ana", ONE), ("ben", ONE), ("ben", THREE)):  # the rest as it was
        fields = ("late", "penalty", "submitted_at") + ("due",) * (key[1] == ONE)
        assert {f: records[key][f] for f in fields} == {f: first[key][f] for f in fields}, key
    book = book_rows((out / "grades.csv").read_text())
    assert float(book["ana"][f"{THREE} (4242)"]) == records["ana", THREE]["max_points"]
    assert book["ana"][f"{THREE} late penalty"] == "0"
    feedback = (out / "feedback" / "ana" / f"{THREE}.html").read_text(encoding="utf-8")
    assert "late by" not in feedback and "late penalty" not in feedback
    page = (out / "class.html").read_text(encoding="utf-8")
    assert "late penalties" not in page and "<table class=\"late-work\">" not in page


def test_the_student_view_lists_the_roster_and_the_copy_is_flagged(graded_twice):
    (records, done), saved, _second, out = graded_twice
    page = saved["class.html"]
    view = page.split('<h2 id="students">')[1].split("<h2")[0]
    shown = view.split('class="default"')[1].split("</section>")[0]
    for name in ("Ana Alves", "Ben Bauer", "Cy Cruz", "Dia Dias"):
        assert name in shown
    assert "4 students; 1 submitted nothing" in view
    # needs help: dia (0 points, her copy not graded) and cy (nothing) before ana and ben
    order = [row.split("<code>")[1].split("</code>")[0] for row in shown.split("<tr")[2:]]
    assert order[:2] == ["cy", "dia"] or order[:2] == ["dia", "cy"], order
    assert set(order[2:]) == {"ana", "ben"}
    assert f"graded {ONE}.ipynb; {COPY} beside it has work" in shown
    assert f"{COPY}: a second notebook for dia" in shown  # the refused file, in her row
    assert f"dia's {ONE}: graded {ONE}.ipynb, which has no work; {COPY} beside it has work" \
        in done.stdout
    exercises = rows_of(saved["exercises.csv"])
    assert exercises["dia"][f"{ONE} copy with work"].endswith(f"dia/{ONE}/{COPY}")
    assert exercises["ana"][f"{ONE} copy with work"] == ""
    assert records["dia", ONE]["copies"][0]["has_work"] is True
    index = (out / "feedback" / "index.html").read_text(encoding="utf-8")
    assert f'href="ana/{THREE}.html"' in index and "Ana Alves" in index
    assert "Cy Cruz" not in index  # no page of hers to link


BAD_FILES = {  # case: (which option, the file's text, the words of the one line)
    "unknown column": ("--assignments", "assignment,due,penalty\n01_notation,2026-03-01,0.1\n",
                       "row 1: unknown column 'penalty'"),
    "bad time": ("--assignments", "assignment,due\n01_notation,next friday\n",
                 "row 2: not an ISO time: 'next friday'"),
    "negative penalty": ("--assignments",
                         "assignment,due,penalty_per_day\n01_notation,2026-03-01,-0.1\n",
                         "row 2: penalty_per_day must be a fraction from 0 to 1"),
    "penalty over 1": ("--assignments", "assignment,due,max_penalty\n01_notation,2026-03-01,5\n",
                       "row 2: max_penalty must be a fraction"),
    "no chapter": ("--assignments", "assignment,due\n99_nothing,2026-03-01\n",
                   "--assignments: '99_nothing' is no chapter"),
    "duplicate": ("--assignments", "assignment,due\n01_notation,2026-03-01\n"
                  "01_notation,2026-03-02\n", "row 3: '01_notation' is named twice"),
    "no due column": ("--assignments", "assignment\n01_notation\n",
                      "the columns assignment and due are needed"),
    "empty": ("--assignments", "", "empty"),
    "ragged row": ("--assignments", "assignment,due\n01_notation\n", "row 2: expected 2 cells"),
    "cell over two lines": ("--assignments", "assignment,due\n\"01_\nnotation\",2026-03-01\n",
                            "row 2, column 'assignment': a quoted cell spans several lines"),
    "extension over two lines": ("--extensions", "student,due\n\"ana\nben\",2026-03-01\n",
                                 "row 2, column 'student': a quoted cell spans several lines"),
    "extension of no chapter": ("--extensions", "student,assignment,due\nana,99_x,2026-03-01\n",
                                "--extensions: '99_x' is no chapter"),
    "extension twice": ("--extensions", "ana,01_notation,2026-03-01\nana,01_notation,2026-03-02\n",
                        "row 2: ana 01_notation has an extension already"),
    "extension column": ("--extensions", "student,chapter,due\nana,01_notation,2026-03-01\n",
                         "row 1: unknown column 'chapter'"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_assignments_or_extensions_file_is_one_line(tmp_path, capsys, case):
    option, text, words = BAD_FILES[case]
    table = tmp_path / "table.csv"
    table.write_text(text)
    notebook = sub.write(sub.release(), tmp_path / "ana" / ONE / f"{ONE}.ipynb")
    report = tmp_path / "grades.json"
    try:
        status = main(["grade", str(notebook), option, str(table), "--json", str(report)])
    except SystemExit as exc:  # argparse's
        status = exc.code
    assert status == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert words in lines[0]
    assert not report.exists()  # nothing graded


def test_the_due_time_and_penalty_rules():
    """An extension for the assignment wins over one for every assignment, which wins over the
    assignment's due time, which wins over --due; a penalty counts each day begun, stops at
    max_penalty and never takes more than the points earned."""
    from checks.grader.outputs import late

    t = late.parse_time
    rule = late.Assignment(THREE, t("2026-03-08"), penalty_per_day=0.25, max_penalty=0.6)
    deadlines = late.Deadlines(t("2026-01-01"), {"ana": t("2026-04-01"),
                                                 ("ana", THREE): t("2026-05-01")}, {THREE: rule})
    assert deadlines.due_for("ana", THREE) == t("2026-05-01")
    assert deadlines.due_for("ana", ONE) == t("2026-04-01")
    assert deadlines.due_for("ben", THREE) == t("2026-03-08")
    assert deadlines.due_for("ben", ONE) == t("2026-01-01")
    record = {"points": 8, "max_points": 8, "late": True}
    for seconds, deducted in ((1, 2.0), (86400, 2.0), (86401, 4.0), (10 * 86400, 4.8)):
        assert late.penalty_points({**record, "late_by_seconds": seconds}, rule) == deducted
    assert late.penalty_points({**record, "points": 1, "late_by_seconds": 9e6}, rule) == 1.0
    assert late.penalty_points({**record, "late": False, "late_by_seconds": 0}, rule) == 0.0
    assert late.penalty_points(record, None) is None
