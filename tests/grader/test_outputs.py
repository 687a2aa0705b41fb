"""What `python -m checks grade` writes for instructors, end to end on a class folder (complete,
blank, partial and wrong students, one named like an attack): the JSON rewritten as each
notebook finishes and merged on a re-run (only new or changed submissions graded again), the two
CSVs, feedback pages (escaped, nothing of the hidden tests, looked at in Chromium), the class
summary, late marking from nbgrader's timestamp.txt, the table not cut when redirected, outputs
that cannot be written refused before grading, and Ctrl-C / SIGTERM keeping what finished."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import nbformat
import pytest

from checks.environment import LANG_ENV
from checks.grader import report
from checks.grader.outputs import gradebook, late
from checks.grader.outputs.feedback import feedback_html, folder_names, safe_name
from checks.grader.outputs.store import atomic_write
from checks.grader.outputs.summary import class_summary, summary_text

from ..support import submissions as sub

pytestmark = [pytest.mark.slow, pytest.mark.grader_workers]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "build" / "test-artifacts" / "feedback"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHAPTER = "01_notation"
ZH_RELEASE_01 = REPO / "notebooks-zh" / CHAPTER / f"{CHAPTER}.ipynb"
HOSTILE = "<img src=x onerror=alert(1)>&eve"  # a student folder's name is the student's to choose
DUE = "2026-03-01T23:59:00+00:00"
EXPECTED = {  # student: points per exercise
    "complete": {"head_dim": 1, "kv_group_size": 1, "validate_config": 2, "tensor_shape": 2},
    "blank": {"head_dim": 0, "kv_group_size": 0, "validate_config": 0, "tensor_shape": 0},
    "partial": {"head_dim": 1, "kv_group_size": 1, "validate_config": 0, "tensor_shape": 0},
    "wrong": {"head_dim": 0, "kv_group_size": 1, "validate_config": 2, "tensor_shape": 2},
    HOSTILE: {"head_dim": 0, "kv_group_size": 1, "validate_config": 2, "tensor_shape": 2},
}
STAMPS = {"complete": "2026-03-01 10:00:00.000000 UTC",  # on time
          "wrong": "2026-03-02 10:05:00.123456 UTC"}     # 10 h 6 min late


def class_notebooks() -> dict[str, object]:
    """The class's submissions of chapter 01, by student."""
    solution = sub.solution()
    partial = sub.release()
    for gid in ("head_dim", "kv_group_size"):
        sub.cell(partial, gid).source = sub.cell(solution, gid).source
    wrong = sub.solution()
    answer = sub.cell(wrong, "head_dim")
    assert "return int(cfg.head_dim)" in answer.source
    answer.source = answer.source.replace("return int(cfg.head_dim)", "return int(cfg.dim)")
    return {"complete": solution, "blank": sub.release(), "partial": partial, "wrong": wrong,
            HOSTILE: wrong}


def make_class(root: Path, *, nbgrader_layout: bool = True) -> Path:
    """submitted/<student>/01_notation/01_notation.ipynb (+ timestamp.txt for two), or the plain
    <student>/01_notation/01_notation.ipynb."""
    base = root / "submitted" if nbgrader_layout else root
    for student, nb in class_notebooks().items():
        path = sub.write(nb, base / student / CHAPTER / f"{CHAPTER}.ipynb")
        if nbgrader_layout and student in STAMPS:
            (path.parent / "timestamp.txt").write_text(STAMPS[student])
    return base


def grade(*args, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "checks", "grade", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def points_of(records: list[dict]) -> dict[str, dict[str, float]]:
    return {r["student"]: {e["name"]: e["points"] for e in r["exercises"]} for r in records}


def hidden_test_lines() -> set[str]:
    """Every line of the source notebooks' hidden tests (chapter 01's are the ones graded)."""
    lines = set()
    for notebook in (REPO / "solutions").glob("*/*.ipynb"):
        for cell in sub.solution(notebook).cells:
            for block in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS",
                                    cell.source, re.DOTALL):
                lines |= {line.strip() for line in block.splitlines() if len(line.strip()) > 10}
    return lines


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once with every output; (folder, outputs folder, the run)."""
    root = tmp_path_factory.mktemp("class")
    base = make_class(root / "course")
    out = root / "out"
    done = grade(base, "--json", out / "grades.json", "--csv", out / "gradebook.csv",
                 "--csv-exercises", out / "exercises.csv", "--feedback", out / "feedback",
                 "--report", out / "report.html", "--due", DUE, "--jobs", "2")
    assert done.returncode == 0, done.stderr
    return base, out, done


def test_json_has_every_student_lateness_and_the_summary(graded):
    base, out, done = graded
    data = json.loads((out / "grades.json").read_text())
    assert data["complete"] is True
    assert points_of(data["notebooks"]) == EXPECTED
    by_student = {r["student"]: r for r in data["notebooks"]}
    assert by_student["wrong"]["late"] is True
    assert by_student["wrong"]["late_by_seconds"] == 10 * 3600 + 6 * 60
    assert by_student["complete"]["late"] is False
    assert by_student["blank"]["late"] is None and by_student["blank"]["submitted_at"] is None
    assert all(len(r["sha256"]) == 64 for r in data["notebooks"])
    summary = {row["exercise"]: row for row in data["summary"]}
    for exercise in EXPECTED["complete"]:
        passed = sum(points[exercise] > 0 for points in EXPECTED.values())
        assert (summary[exercise]["passed"], summary[exercise]["graded"]) == (passed, 5)
    diagnoses = summary["head_dim"]["diagnoses"]
    assert diagnoses[0]["count"] == 2 and "has no attribute 'dim'" in diagnoses[0]["message"]
    assert diagnoses[0]["students"] == sorted(["wrong", HOSTILE])
    assert diagnoses[1] == {"mistake": None, "status": "not started", "count": 1,
                            "students": ["blank"], "message": "still raises NotImplementedError",
                            "title": "", "knock_on": []}
    # every exercise has the two new fields; a failure without a declared mistake has none
    assert all({"mistake", "seed"} <= set(e) for r in data["notebooks"] for e in r["exercises"])
    assert by_student["wrong"]["exercises"][0]["mistake"] is None


def test_class_report_is_one_static_page(graded):
    """--report: one HTML page, charts inline as SVG, no script, the students' names escaped."""
    _, out, _ = graded
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()
    assert page.count("<svg") == 2  # one chapter: its pass rates and its scores
    assert "head_dim: 2 of 5 passed (40%)" in page
    assert "onerror=alert(1)" not in page.replace("&lt;img src=x onerror=alert(1)&gt;", "")


def test_table_is_whole_when_redirected_and_ends_with_the_summary(graded):
    _, _, done = graded
    assert "…" not in done.stdout
    long_lines = [line for line in done.stdout.splitlines() if len(line) > 100]
    assert any("has no attribute 'dim'" in line for line in long_lines)  # not cut at 100
    assert "[LATE BY 10 H 6 MIN]" in done.stdout
    summary = done.stdout[done.stdout.index("class summary: 5 notebooks, 1 submitted late"):]
    assert "01_notation/head_dim" in summary and "2 × failed" in summary
    assert "total: 18/30 points in 5 notebooks" in done.stdout
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 5 and "left)" in progress[0] and "left" not in progress[-1]


def test_gradebook_csv_is_canvas_shaped(graded):
    _, out, _ = graded
    rows = list(csv.reader(io.StringIO((out / "gradebook.csv").read_text())))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", CHAPTER]
    assert rows[1] == ["    Points Possible", "", "", "", "", "6"]
    body = {row[0]: row for row in rows[2:]}
    assert set(body) == set(EXPECTED)
    for student, points in EXPECTED.items():
        assert body[student] == [student, "", "", student, "", f"{sum(points.values()):g}"]


def test_exercises_csv_has_a_column_per_exercise_and_lateness(graded):
    _, out, _ = graded
    rows = list(csv.DictReader(io.StringIO((out / "exercises.csv").read_text())))
    assert {row["student"] for row in rows} == set(EXPECTED)
    for row in rows:
        points = EXPECTED[row["student"]]
        assert {name: float(row[f"{CHAPTER}/{name}"]) for name in points} == points
        assert float(row[f"{CHAPTER} total"]) == sum(points.values())
    late_column = {row["student"]: row[f"{CHAPTER} late"] for row in rows}
    assert late_column == {"complete": "no", "wrong": "yes", "blank": "", "partial": "",
                           HOSTILE: ""}


def test_feedback_pages_are_escaped_and_hold_no_hidden_test(graded):
    _, out, _ = graded
    pages = sorted((out / "feedback").glob("*/*.html"))
    assert [p.relative_to(out / "feedback").as_posix() for p in pages] == sorted(
        f"{safe_name(s)}/{CHAPTER}.html" for s in EXPECTED)
    hidden = hidden_test_lines()
    assert "assert head_dim(LLAMA2_7B) == 128" in hidden  # the check below can see a leak
    for page in pages:
        text = page.read_text()
        assert not [line for line in hidden if line in text], page
        assert "<img" not in text and "<script" not in text
    hostile = (out / "feedback" / safe_name(HOSTILE) / f"{CHAPTER}.html").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;&amp;eve" in hostile
    wrong = (out / "feedback" / "wrong" / f"{CHAPTER}.html").read_text()
    assert "5 / 6 points" in wrong and "late by 10 h 6 min" in wrong
    assert '<html lang="en">' in wrong and "<td class=\"no\">failed</td>" in wrong
    assert "has no attribute &#x27;dim&#x27;" in wrong


def chinese_submission(dest: Path) -> Path:
    """Chapter 01 of the Chinese release with the solutions' answers pasted in, head_dim wrong
    (cfg.dim), handed in 10 h 6 min late."""
    nb = sub.solution(ZH_RELEASE_01)
    answers = {gid: sub.cell(sub.solution(), gid).source for gid in EXPECTED["complete"]}
    for gid, source in answers.items():
        sub.cell(nb, gid).source = source
    answer = sub.cell(nb, "head_dim")
    answer.source = answer.source.replace("return int(cfg.head_dim)", "return int(cfg.dim)")
    assert nb.metadata["course"]["lang"] == "zh" and "cfg.dim" in answer.source
    path = sub.write(nb, dest / "submitted" / "lin" / CHAPTER / f"{CHAPTER}.ipynb")
    (path.parent / "timestamp.txt").write_text(STAMPS["wrong"])
    return dest / "submitted"


def test_a_chinese_submission_gets_its_feedback_in_chinese(tmp_path):
    base = chinese_submission(tmp_path / "course")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != LANG_ENV}
    done = subprocess.run([sys.executable, "-m", "checks", "grade", str(base), "--json",
                           str(out / "g.json"), "--feedback", str(out / "feedback"), "--due", DUE],
                          capture_output=True, text=True, timeout=600,
                          env=dict(env, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "g.json").read_text())["notebooks"][0]
    assert record["lang"] == "zh" and record["points"] == 5
    page = (out / "feedback" / "lin" / f"{CHAPTER}.html").read_text(encoding="utf-8")
    for chinese in ('<html lang="zh">', f"<h1>{CHAPTER}：给 lin 的反馈</h1>",
                    "5 / 6 分，4 个练习中通过了 3 个", "迟交 10 小时 6 分钟", "<th>诊断</th>",
                    '<td class="no">未通过</td>', '<td class="ok">通过</td>', "提交于 "):
        assert chinese in page
    for english in ("feedback for", " points", "exercises passed", "late by", "Submitted",
                    ">failed<", ">passed<", "<th>diagnosis</th>"):
        assert english not in page
    # the diagnosis: the grader's, in Chinese, around the error Python raised
    assert "引发了 AttributeError" in page and "has no attribute &#x27;dim&#x27;" in page


def test_status_lines_stay_aligned_in_chinese(monkeypatch):
    def columns(text):
        return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)

    monkeypatch.delenv(LANG_ENV, raising=False)
    assert report.status_header(14) == f"{'chapter':<14}{'passed':>8}   not passing yet"
    assert report.status_total(14, 3, 4) == f"{'total':<14}{'3/4':>8}"
    monkeypatch.setenv(LANG_ENV, "zh")
    header, total = report.status_header(14), report.status_total(14, 3, 4)
    assert header.startswith("章节") and total.startswith("合计") and "尚未通过" in header
    assert columns(header.rsplit("   ", 1)[0]) == columns(total) == 14 + 8
    assert report.status_word("failed") == "未通过" and report.status_word("odd") == "odd"
    from checks.grader.results import ExerciseResult, NotebookResult
    result = NotebookResult("p.ipynb", CHAPTER, [ExerciseResult("head_dim", 1, 1, "passed"),
                                                 ExerciseResult("tensor_shape", 0, 2,
                                                                "not started", "msg")])
    table = report.grade_table(result).splitlines()
    assert "1/3 分" in table[0] and "通过" in table[1] and "尚未开始" in table[2]
    monkeypatch.delenv(LANG_ENV)
    english = report.grade_table(result).splitlines()
    assert "not started " in english[2]  # the message starts in the same column in both
    assert columns(table[2].split("msg")[0]) == len(english[2].split("msg")[0])


def test_feedback_page_in_a_browser(graded):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    _, out, _ = graded
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 600})
            alerts = []
            page.on("dialog", lambda dialog: (alerts.append(dialog.message), dialog.dismiss()))
            for student in ("wrong", HOSTILE):
                page.goto((out / "feedback" / safe_name(student) / f"{CHAPTER}.html").as_uri())
                page.screenshot(path=str(ARTIFACTS / f"{safe_name(student)}.png"),
                                full_page=True)
                assert page.locator("h1").inner_text() == f"{CHAPTER}: feedback for {student}"
                rows = page.locator("tbody tr")
                assert rows.count() == 4
                assert "0 / 1" in rows.nth(0).inner_text()
                assert page.locator("img").count() == 0
        finally:
            browser.close()
    assert alerts == []


def test_a_rerun_grades_only_what_changed_and_merges(graded, tmp_path):
    base, out, _ = graded
    report_file = tmp_path / "grades.json"
    report_file.write_text((out / "grades.json").read_text())
    before = json.loads(report_file.read_text())

    again = grade(base, "--json", report_file, "--jobs", "2")  # nothing changed: nothing graded
    assert again.returncode == 0, again.stderr
    assert "5 of 5 notebooks unchanged" in again.stderr
    assert not [line for line in again.stderr.splitlines() if line.startswith("[")]
    assert json.loads(report_file.read_text())["notebooks"] == before["notebooks"]

    fixed = base / "wrong" / CHAPTER / f"{CHAPTER}.ipynb"  # the student hands in a fix
    sub.write(sub.solution(), fixed)
    one = grade(fixed.parent, "--json", report_file)  # one student's folder alone
    assert one.returncode == 0, one.stderr
    merged = json.loads(report_file.read_text())
    # the folder given names no student (the notebook is at its top): the file is still wrong's
    assert points_of(merged["notebooks"]) == {**EXPECTED, "wrong": EXPECTED["complete"]}
    assert merged["points"] == 18 + 1
    assert "[student wrong]" in one.stdout

    rest = grade(base, "--json", report_file, "--jobs", "2")  # the class: nothing new
    assert "5 of 5 notebooks unchanged" in rest.stderr


def test_a_changed_grader_regrades_unchanged_submissions(tmp_path):
    """A fix to the chapter's source notebook (or to the course's code) changes the records'
    `grader` fingerprint: a re-run grades those submissions again without --regrade."""
    import shutil

    base = tmp_path / "course" / "submitted"  # two students are enough here
    for student in ("complete", "wrong"):
        sub.write(class_notebooks()[student], base / student / CHAPTER / f"{CHAPTER}.ipynb")
    source = tmp_path / "source"
    shutil.copytree(sub.SOLUTION_01.parent, source / CHAPTER)
    report_file = tmp_path / "grades.json"
    first = grade(base, "--json", report_file, "--source", source, "--jobs", "2")
    assert first.returncode == 0, first.stderr
    before = json.loads(report_file.read_text())["notebooks"]

    same = grade(base, "--json", report_file, "--source", source)  # nothing changed
    assert same.returncode == 0 and "2 of 2 notebooks unchanged" in same.stderr, same.stderr
    assert "graded again" not in same.stderr

    nb = sub.solution(source / CHAPTER / f"{CHAPTER}.ipynb")
    nb.cells.append(nbformat.v4.new_markdown_cell("An instructor's note."))  # prose: no regrade
    sub.write(nb, source / CHAPTER / f"{CHAPTER}.ipynb")
    prose = grade(base, "--json", report_file, "--source", source)
    assert "2 of 2 notebooks unchanged" in prose.stderr, prose.stderr
    sub.cell(nb, "check_head_dim").source += "\n# checked again"  # a test cell changed
    sub.write(nb, source / CHAPTER / f"{CHAPTER}.ipynb")
    again = grade(base, "--json", report_file, "--source", source, "--jobs", "2")
    assert again.returncode == 0, again.stderr
    assert "2 unchanged notebooks graded again: the course's checks or their chapter's source " \
        "notebook changed" in again.stderr and "notebooks unchanged since" not in again.stderr
    after = json.loads(report_file.read_text())["notebooks"]
    assert points_of(after) == points_of(before) == \
        {s: EXPECTED[s] for s in ("complete", "wrong")}
    assert {r["grader"] for r in after} != {r["grader"] for r in before}
    assert len({r["grader"] for r in after}) == 1


def test_the_grader_fingerprint_follows_what_scores(tmp_path, monkeypatch):
    """The scoring code and the chapter's graded cells change it; the tools, the outputs, the
    message catalogue, the prose, and where the course lies do not."""
    import shutil

    from checks.grader.outputs import store

    package, source = tmp_path / "a" / "checks", tmp_path / "a" / "solutions"
    for name in ("nb01.py", "tools/release.py", "grader/outputs/feedback.py",
                 ".ipynb_checkpoints/nb01-checkpoint.py"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text("X = 1\n")
    (package / "locale").mkdir()
    (package / "locale" / "checks.mo").write_bytes(b"\0")
    notebook = source / CHAPTER / f"{CHAPTER}.ipynb"
    sub.write(sub.solution(), notebook)

    def fingerprint(where=package, chapter=CHAPTER, solutions=source):
        monkeypatch.setattr(store, "PACKAGE", where)
        store._scoring_code_hash.cache_clear()
        store.grader_fingerprint.cache_clear()
        return store.grader_fingerprint(solutions, chapter)

    def changed(edit) -> bool:
        before = fingerprint()
        edit()
        return fingerprint() != before

    try:
        first = fingerprint()
        assert fingerprint() == first and len(first) == 16
        assert fingerprint(chapter="04_self_attention") != first  # no such notebook here
        shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same course elsewhere
        assert fingerprint(tmp_path / "b" / "checks", solutions=tmp_path / "b" / "solutions") \
            == first
        for path in ("tools/release.py", "grader/outputs/feedback.py",
                     ".ipynb_checkpoints/nb01-checkpoint.py"):
            assert not changed(lambda: (package / path).write_text("X = 2\n")), path
        assert not changed(lambda: (package / "locale" / "checks.mo").write_bytes(b"\1"))
        nb = sub.solution(notebook)
        prose = next(c for c in nb.cells if c.cell_type == "markdown")
        prose.source += "\n\nMore prose."
        assert not changed(lambda: sub.write(nb, notebook))
        assert changed(lambda: (package / "nb01.py").write_text("X = 2\n"))  # a checker
        assert changed(lambda: (package / "grader" / "score.py").write_text("Y = 1\n"))  # new
        sub.cell(nb, "check_head_dim").source += "\n# again"
        assert changed(lambda: sub.write(nb, notebook))  # a test cell
        sub.cell(nb, "check_head_dim").metadata["nbgrader"]["points"] = 5
        assert changed(lambda: sub.write(nb, notebook))  # its points
    finally:
        monkeypatch.undo()
        store._scoring_code_hash.cache_clear()
        store.grader_fingerprint.cache_clear()


def test_the_plain_layout_gets_every_output(tmp_path):
    base = make_class(tmp_path / "submissions", nbgrader_layout=False)
    students = ["complete", "wrong"]
    paths = [base / s / CHAPTER / f"{CHAPTER}.ipynb" for s in students]
    out = tmp_path / "out"
    done = grade(*paths, "--json", out / "g.json", "--csv", out / "g.csv", "--feedback",
                 out / "fb", "--due", DUE, "--jobs", "2")
    assert done.returncode == 0, done.stderr
    records = json.loads((out / "g.json").read_text())["notebooks"]
    assert [r["points"] for r in records] == [6, 5]
    assert all(r["late"] is None for r in records)  # no timestamp.txt: lateness unknown
    rows = list(csv.reader(io.StringIO((out / "g.csv").read_text())))[2:]
    assert [row[0] for row in rows] == sorted(gradebook.student_label(r) for r in records)
    assert [row[-1] for row in rows] == [
        f"{gradebook.by_student(records)[row[0]][CHAPTER]['points']:g}" for row in rows]
    assert len(list((out / "fb").glob(f"*/{CHAPTER}.html"))) == 2


UNWRITABLE = {  # option: a target that cannot be written (we may be root: permissions mean
    # nothing to root, so the targets are under a file, or in a file system nobody writes)
    "--json": "{file}/grades.json",
    "--csv": "/proc/h6/gradebook.csv",
    "--csv-exercises": "{file}/x.csv",
    "--feedback": "{file}",
}


@pytest.mark.parametrize("option, target", UNWRITABLE.items(), ids=UNWRITABLE.keys())
def test_an_unwritable_output_is_refused_before_grading(tmp_path, option, target):
    notebook = sub.write(sub.solution(), tmp_path / CHAPTER / f"{CHAPTER}.ipynb")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    started = time.monotonic()
    done = grade(notebook, option, target.format(file=a_file), timeout=60)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot write" in lines[0] or "not a folder" in lines[0] or "a file" in lines[0]
    assert done.stdout == ""  # nothing graded
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_keeps_every_finished_result(tmp_path, how):
    base = make_class(tmp_path / "course")
    report_file = tmp_path / "grades.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "checks", "grade", str(base), "--json", str(report_file),
         "--jobs", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 300
    finished = []
    while time.monotonic() < deadline and not finished:
        time.sleep(0.2)
        if report_file.exists():
            finished = json.loads(report_file.read_text())["notebooks"]
    assert finished, "no notebook finished in time"
    process.send_signal(how)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode != 0  # stopped, not finished: the class has 5 notebooks
    data = json.loads(report_file.read_text())  # whole and valid, never half written
    assert data["complete"] is False
    kept = points_of(data["notebooks"])
    assert 1 <= len(kept) < 5
    assert all(kept[student] == EXPECTED[student] for student in kept)
    assert not list(tmp_path.glob(".grades.json.*.tmp"))  # no temporary file left behind

    rerun = grade(base, "--json", report_file, "--jobs", "2")  # the rest, merged
    assert f"{len(kept)} of 5 notebooks unchanged" in rerun.stderr
    assert points_of(json.loads(report_file.read_text())["notebooks"]) == EXPECTED


def test_with_jobs_a_notebook_is_saved_when_it_finishes_not_when_those_before_it_do(tmp_path):
    """--jobs 2: the first notebook hangs, the second finishes; the second is in the JSON while
    the first is still running (its table waits, its result does not), and survives Ctrl-C."""
    base = tmp_path / "submitted"
    sub.write(sub.prepend(sub.release(), "head_dim", "while True: pass"),
              base / "a_hangs" / CHAPTER / f"{CHAPTER}.ipynb")
    sub.write(sub.solution(), base / "b_done" / CHAPTER / f"{CHAPTER}.ipynb")
    report_file = tmp_path / "grades.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "checks", "grade", str(base), "--json", str(report_file),
         "--jobs", "2", "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 300
    saved = []
    while time.monotonic() < deadline and not saved and process.poll() is None:
        time.sleep(0.2)
        if report_file.exists():
            saved = json.loads(report_file.read_text())["notebooks"]
    assert [r["student"] for r in saved] == ["b_done"]
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=180)
    assert "b_done" not in stdout  # its table waited for a_hangs, which never finished
    data = json.loads(report_file.read_text())
    assert [(r["student"], r["points"]) for r in data["notebooks"]] == [("b_done", 6)]
    assert data["complete"] is False


# --------------------------------------------------------------------------------------------
# the pieces, without workers


def test_times_and_lateness(tmp_path):
    assert late.parse_time("2026-03-01 10:00:00.5 UTC").isoformat() == \
        "2026-03-01T10:00:00.500000+00:00"
    assert late.parse_time("2026-03-01T11:00+01:00") == late.parse_time("2026-03-01T10:00")
    with pytest.raises(Exception, match="not an ISO time"):
        late.due_argument("next friday")
    notebook = tmp_path / "01_notation.ipynb"
    (tmp_path / "timestamp.txt").write_text("garbage")
    fields = late.lateness(notebook, late.parse_time(DUE))
    assert fields["late"] is None and "submission time unknown" in fields["late_warning"]
    (tmp_path / "timestamp.txt").write_text("2026-03-03 23:59:30 UTC")
    fields = late.lateness(notebook, late.parse_time(DUE))
    assert fields["late"] is True and fields["late_by_seconds"] == 2 * 86400 + 30
    assert late.late_text(fields) == "late by 2 d"


def _hard_link(path: Path) -> None:
    other = path.parent.parent / "elsewhere.txt"
    other.write_text("2026-03-01 10:00:00 UTC")
    os.link(other, path)


def _sparse(size: int):
    def make(path: Path) -> None:
        with open(path, "wb") as stream:
            stream.truncate(size)
    return make


@pytest.mark.parametrize("make, why", [
    (lambda p: p.write_text("9999-12-31T23:59:59-23:59"), "does not hold a time"),
    (lambda p: p.symlink_to("/proc/kmsg"), "is a link"),
    (lambda p: p.symlink_to(p.parent / "real.txt"), "is a link"),
    (_sparse(192 * 2**20), "larger than a time"),
    (_sparse(65), "larger than a time"),
    (lambda p: p.write_bytes(b"\xff\xfe garbage"), "does not hold a time"),
    (lambda p: p.write_text("x" * 60), "does not hold a time"),
    (_hard_link, "more than one name"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "not a regular file"),
], ids=["overflow", "kmsg", "link", "192 MiB", "65 bytes", "binary", "text", "hard link",
        "fifo", "folder"])
def test_a_timestamp_that_cannot_be_believed_is_unknown_in_one_line(tmp_path, make, why):
    """Any problem with timestamp.txt: no time, one short line, never a crash, a hang (a FIFO, a
    link to /proc/kmsg) or a read of more than a few bytes."""
    assignment = tmp_path / "submitted" / "alice" / CHAPTER
    assignment.mkdir(parents=True)
    (assignment / "real.txt").write_text("2026-03-01 10:00:00 UTC")
    make(assignment / "timestamp.txt")
    fields = late.lateness(assignment / f"{CHAPTER}.ipynb", late.parse_time(DUE), "alice")
    assert fields["late"] is None and fields["submitted_at"] is None
    assert fields["late_warning"] == f"submission time unknown: timestamp.txt {why}" or \
        why in fields["late_warning"]
    assert "\n" not in fields["late_warning"] and len(fields["late_warning"]) < 100


def test_the_time_is_the_assignment_folder_s_however_deep_the_notebook(tmp_path):
    """A notebook one folder down, beside an on-time timestamp.txt of its own: the time is
    nbgrader's, in the assignment folder (late); a folder inside a submission named like the
    student changes nothing."""
    assignment = tmp_path / "submitted" / "alice" / CHAPTER
    (assignment / "alice" / "x").mkdir(parents=True)
    (assignment / "timestamp.txt").write_text("2026-03-05 10:00:00 UTC")
    for inner in (assignment / "alice", assignment / "alice" / "x"):
        (inner / "timestamp.txt").write_text("2026-03-01 10:00:00 UTC")
        fields = late.lateness(inner / f"{CHAPTER}.ipynb", late.parse_time(DUE), "alice")
        assert fields["submitted_at"] == "2026-03-05T10:00:00+00:00" and fields["late"] is True
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "timestamp.txt").write_text("2026-03-01 10:00:00 UTC")
    assert late.lateness(loose / "x.ipynb", late.parse_time(DUE))["late"] is False


def test_extensions_give_a_student_their_own_due_time(tmp_path):
    table = tmp_path / "extensions.csv"
    table.write_text("student,due\nalice,2026-03-10T12:00+01:00\n\nbob, 2026-03-02\n")
    extensions = late.extensions_argument(str(table))
    assert extensions["alice"].isoformat() == "2026-03-10T12:00:00+01:00"
    assert set(extensions) == {"alice", "bob"}
    assignment = tmp_path / "submitted" / "alice" / CHAPTER
    assignment.mkdir(parents=True)
    (assignment / "timestamp.txt").write_text("2026-03-05 10:00:00 UTC")
    notebook = assignment / f"{CHAPTER}.ipynb"
    assert late.lateness(notebook, late.parse_time(DUE), "alice")["late"] is True
    fields = late.lateness(notebook, late.parse_time(DUE), "alice", extensions)
    assert fields["late"] is False and fields["due"] == "2026-03-10T11:00:00+00:00"
    for text, words in [("alice\n", "row 1: expected student,due"),
                        ("alice,next friday\n", "row 1: not an ISO time"),
                        ("alice,9999-12-31T23:59:59-23:59\n", "row 1: not an ISO time")]:
        table.write_text(text)
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            late.extensions_argument(str(table))
    with pytest.raises(argparse.ArgumentTypeError, match="No such file"):
        late.extensions_argument(str(tmp_path / "missing.csv"))
    with pytest.raises(argparse.ArgumentTypeError, match="not an ISO time"):
        late.due_argument("9999-12-31T23:59:59-23:59")


def test_a_re_run_with_another_due_time_recomputes_lateness(graded, tmp_path):
    """Kept records (notebooks unchanged since they were graded) get this run's lateness: a
    new --due and an extension change who is late, without grading anything again."""
    base, out, _ = graded
    report = tmp_path / "grades.json"
    shutil.copyfile(out / "grades.json", report)
    extensions = tmp_path / "extensions.csv"
    extensions.write_text("student,due\nwrong,2026-03-03T00:00Z\n")
    done = grade(base, "--json", report, "--due", "2026-03-01T09:00:00+00:00",
                 "--extensions", extensions)
    assert done.returncode == 0, done.stderr
    assert "notebooks unchanged since they were graded" in done.stderr  # kept ones are there
    by_student = {r["student"]: r for r in json.loads(report.read_text())["notebooks"]}
    assert (by_student["complete"]["late"], by_student["complete"]["late_by_seconds"]) == \
        (True, 3600)
    assert by_student["wrong"]["late"] is False
    assert by_student["wrong"]["due"] == "2026-03-03T00:00:00+00:00"
    assert by_student["blank"]["late"] is None


def test_a_roster_gives_the_gradebook_lms_ids_names_and_every_student(tmp_path):
    from checks.grader.outputs import roster as rosters

    table = tmp_path / "roster.csv"
    table.write_text("Folder,ID,Name,Section\ncomplete,1001,Ada Lovelace,A\n"
                     "absent,1002,Alan Turing,B\n")
    roster = rosters.roster_argument(str(table))
    records = [{"student": s, "chapter": CHAPTER, "points": p, "max_points": 6, "path": s,
                "exercises": []} for s, p in (("complete", 6), ("stranger", 2))]
    rows = list(csv.reader(io.StringIO(gradebook.gradebook_csv(records, roster))))
    assert rows[0] == gradebook.CANVAS_COLUMNS + [CHAPTER]
    assert rows[2:] == [["Ada Lovelace", "", "1001", "complete", "A", "6"],
                        ["Alan Turing", "", "1002", "absent", "B", ""],
                        ["stranger", "", "", "stranger", "", "2"]]
    assert gradebook.gradebook_csv(records) == gradebook.gradebook_csv(records, None)
    for text, words in [("name,id\nx,1\n", "no folder column"), ("", "empty"),
                        ("folder\na\na\n", "row 3: 'a' is named twice"),
                        ("folder,id\n,5\n", "row 2: no folder")]:
        table.write_text(text)
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            rosters.roster_argument(str(table))


def test_a_roster_on_a_re_run(graded, tmp_path):
    base, out, _ = graded
    report = tmp_path / "grades.json"
    shutil.copyfile(out / "grades.json", report)
    table = tmp_path / "roster.csv"
    table.write_text("folder,id,name,section\ncomplete,1001,Ada Lovelace,A\n"
                     "absent,1002,Alan Turing,B\n")
    done = grade(base, "--json", report, "--csv", tmp_path / "gradebook.csv", "--roster", table)
    assert done.returncode == 0, done.stderr
    rows = list(csv.reader((tmp_path / "gradebook.csv").open()))
    assert rows[2][:6] == ["Ada Lovelace", "", "1001", "complete", "A", "6"]
    assert rows[3][:6] == ["Alan Turing", "", "1002", "absent", "B", ""]
    assert len(rows) == 2 + 2 + 4  # the roster's two, then the other four graded folders


def test_the_late_tag_and_the_class_summary_in_chinese(monkeypatch):
    """What the instructor's terminal shows after the grades, under LLAMA_COURSE_LANG=zh: the
    grade table's late tag and the class summary (numbers, names and diagnoses as they are)."""
    record = {"chapter": CHAPTER, "late": True, "late_by_seconds": 86400 + 5 * 3600 + 6 * 60,
              "exercises": [{"name": "head_dim", "status": "failed", "message": "返回 64"}]}
    others = [{"chapter": CHAPTER, "late": False,
               "exercises": [{"name": "head_dim", "status": "passed", "message": ""}]}]
    monkeypatch.delenv(LANG_ENV, raising=False)
    english = summary_text(class_summary([record, *others]), [record, *others])
    assert late.late_text(record) == "late by 1 d 5 h 6 min"
    assert english.splitlines()[0] == "class summary: 2 notebooks, 1 submitted late"
    assert english.splitlines()[2] == "        1 × failed: 返回 64"
    monkeypatch.setenv(LANG_ENV, "zh")
    assert late.late_text(record) == "迟交 1 天 5 小时 6 分钟"
    chinese = summary_text(class_summary([record, *others]), [record, *others]).splitlines()
    assert chinese[0] == "全班汇总：2 个 notebook，1 个迟交"
    assert chinese[1] == english.splitlines()[1].replace("passed", "通过")
    assert chinese[2] == "        1 × 未通过: 返回 64"


def test_feedback_escapes_every_field():
    record = {"student": "<b>x</b>", "chapter": "01_notation", "points": 1, "max_points": 2,
              "passed": 1, "error": "<script>alert(1)</script>",
              "skipped": [{"cell": "<i>c</i>", "why": "<u>w</u>"}],
              "submitted_at": "<s>", "due": None, "late": False,
              "exercises": [{"name": "<n>", "points": 1, "max_points": 2, "status": "failed",
                             "message": "\"'<&>"}]}
    page = feedback_html(record)
    for raw in ("<b>x", "<script>", "<i>c", "<u>w", "<s>", "<n>", "\"'<&>"):
        assert raw not in page
    assert "&quot;&#x27;&lt;&amp;&gt;" in page
    assert safe_name("../../etc") == "etc" and safe_name("..") == "unnamed"
    assert "/" not in safe_name("../../etc") and safe_name("alice") == "alice"


def test_a_skipped_cell_is_named_once_in_the_feedback():
    why = "the worker process died (exit status 1)"
    record = {"student": "s", "chapter": CHAPTER, "points": 5, "max_points": 6, "passed": 3,
              "skipped": [{"cell": "answer cell head_dim", "why": why}],
              "error": f"In answer cell head_dim: {why}; that cell was skipped (the worker "
                       "restarted and the cells before it run again).",
              "exercises": [{"name": "head_dim", "points": 0, "max_points": 1,
                             "status": "error", "message": "its answer cell was skipped"}]}
    assert feedback_html(record).count("answer cell head_dim") == 1
    record["error"] = None
    assert feedback_html(record).count("answer cell head_dim") == 1


def test_feedback_paths_never_collide():
    """Names that differ only where the folder's name escapes them get a folder each (a hash of
    the name added only then); a plain name keeps its own; a name shaped like another's hashed
    folder is hashed in its turn."""
    names = ["alice@uni.edu", "alice_uni.edu", "alice uni.edu", "alice/uni.edu", ".alice_uni.edu",
             "x" * 121, "x" * 120 + "y", "..", "unnamed", ""]
    names.append(folder_names(names)["alice@uni.edu"])
    folders = folder_names(names)
    assert len({f.casefold() for f in folders.values()}) == len(names), folders
    assert folders["alice_uni.edu"] == "alice_uni.edu" and folders["unnamed"] == "unnamed"
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", f) and len(f) <= 113
               for f in folders.values())


def test_csv_cells_that_a_spreadsheet_would_run_are_defused():
    record = {"student": "=HYPERLINK(\"http://x\")", "chapter": CHAPTER, "points": 1,
              "max_points": 6, "path": "p", "exercises": []}
    rows = list(csv.reader(io.StringIO(gradebook.gradebook_csv([record]))))
    assert rows[2][0] == "'=HYPERLINK(\"http://x\")"


def test_the_table_is_cut_only_on_a_terminal(monkeypatch):
    from checks.grader.results import ExerciseResult, NotebookResult
    result = NotebookResult("p.ipynb", CHAPTER, [ExerciseResult("head_dim", 0, 1, "failed",
                                                                "x" * 300)])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert "x" * 300 in report.grade_table(result)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(report.shutil, "get_terminal_size", lambda *a: os.terminal_size((80, 24)))
    assert max(map(len, report.grade_table(result).splitlines())) == 80


def test_progress_says_what_is_still_running(capsys):
    paths = [Path("a.ipynb"), Path("b.ipynb"), Path("c.ipynb")]
    progress = report.Progress(paths, jobs=2, heartbeat=0.3).start()
    try:
        progress.finish(paths[0])
        time.sleep(5.5)  # the watch looks at most every 5 s
    finally:
        progress.stop()
    err = capsys.readouterr().err
    assert "… still grading b.ipynb, c.ipynb (1 of 3 done)" in err


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "grades.json"
    target.write_text("old")

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        atomic_write(target, "new")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
