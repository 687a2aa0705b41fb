"""The instructor's views of a class, rendered from records (no grading workers: fast): the class
report's student view (every roster student, those who submitted nothing too, in a needs-help
order and sortable without JavaScript, looked at in Chromium), real misconceptions ranked with
their short titles and "not started" apart, knock-on failures counted once under their root
(the ids chapter 04's own checkers give a wrong masked_softmax and the attention that calls
it), a copy with work beside an untouched stub flagged and chosen with --use-copies, feedback
folders for any name with an index page, and times shown in the local zone, named."""

from __future__ import annotations

import csv
import io
import math
import os
import time
import unicodedata
from pathlib import Path

import pytest

from checks import nb04
from checks.engine import CheckFailure
from checks.grader.copies import has_work
from checks.grader.identify import find_submissions
from checks.grader.outputs.class_report import class_report_html
from checks.grader.outputs.feedback import (INDEX, feedback_html, feedback_path, folder_names,
                                            readable_name, write_feedback, write_index)
from checks.grader.outputs.gradebook import exercises_csv
from checks.grader.outputs.headlines import short_title
from checks.grader.outputs.late import local_time
from checks.grader.outputs.students import needs_help, student_rows
from checks.grader.outputs.summary import class_summary, summary_text

from ..support import submissions as sub

CH04 = "04_self_attention"
EXERCISES = ("project_qkv", "attention_scores", "masked_softmax", "attention")
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))


# --------------------------------------------------------------------------------------------
# Real diagnoses: chapter 04's checkers on a learner's masked_softmax that masks after the
# softmax, and on the attention that calls it


def _softmax_masked_after(scores, mask=None):
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    w = e / e.sum(-1, keepdim=True)
    return w if mask is None else w * mask


def _attention_on(softmax):
    def attention(q, k, v, mask=None):
        w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w
    return attention


def _diagnosed(check) -> tuple[str, int, str]:
    with pytest.raises(CheckFailure) as info:
        check()
    return info.value.mistake, info.value.seed, str(info.value)


@pytest.fixture(scope="module")
def knock_on_ids():
    helper = _diagnosed(lambda: nb04.check_masked_softmax(_softmax_masked_after, seed=3))
    caller = _diagnosed(lambda: nb04.check_attention(
        _attention_on(_softmax_masked_after), seed=3, masked_softmax=_softmax_masked_after))
    assert helper[0] == "04.masked_softmax.mask_after_softmax"
    assert caller[0] == "04.attention.fix_masked_softmax_first"
    return helper, caller


def exercise(name, status="passed", mistake=None, seed=None, message=""):
    return {"name": name, "points": 1.0 if status == "passed" else 0.0, "max_points": 1.0,
            "status": status, "message": message or ("" if status == "passed" else status),
            "mistake": mistake, "seed": seed}


def record(student, exercises, **fields):
    data = {"path": f"/class/{student}/{CH04}/{CH04}.ipynb", "chapter": CH04,
            "student": student, "exercises": exercises, "counted": True, "skipped": [],
            "copies": [], "lang": "en", "error": None,
            "points": sum(e["points"] for e in exercises),
            "max_points": sum(e["max_points"] for e in exercises),
            "passed": sum(e["status"] == "passed" for e in exercises)}
    data.update(fields)
    return data


def untouched(student, **fields):
    return record(student, [exercise(n, "not started", message="still raises "
                                     "NotImplementedError") for n in EXERCISES], **fields)


@pytest.fixture(scope="module")
def the_class(knock_on_ids):
    (helper, h_seed, h_text), (caller, c_seed, c_text) = knock_on_ids
    wrong = [exercise("project_qkv"), exercise("attention_scores"),
             exercise("masked_softmax", "failed", helper, h_seed, h_text),
             exercise("attention", "failed", caller, c_seed, c_text)]
    # bo's attention repeats the helper's mistake under its own id (same key)
    repeated = [*wrong[:3], exercise("attention", "failed", "04.attention.mask_after_softmax", 5,
                                     "masked after")]
    scaled = [exercise("project_qkv"),
              exercise("attention_scores", "failed", "04.attention_scores.missing_scale", 9,
                       "no scale"), exercise("masked_softmax"), exercise("attention")]
    copy = f"/class/chen/{CH04}/{CH04}-Copy1.ipynb"
    records = [
        record("ada", wrong),
        record("bo", repeated),
        untouched("chen", copies=[{"path": copy, "has_work": True}]),
        record("dee", scaled, late=True, late_by_seconds=90_000, penalty=0.5,
               due="2026-03-01T22:59:00+00:00", submitted_at="2026-03-03T00:00:00+00:00",
               skipped=[{"cell": "answer cell attention", "why": "it ran past 120 s"}]),
        untouched("fay"),
        untouched("gus"),
    ]
    roster = {name: {"id": str(i), "name": full, "login": "", "section": "A"}
              for i, (name, full) in enumerate([("ada", "Ada Lovelace"), ("chen", "Chen Li"),
                                                ("eve", "Ève Absent"), ("dee", "Dee")])}
    problems = [{"path": copy, "error": "a second notebook for chen's 04_self_attention",
                 "student": "chen"}]
    return records, roster, problems


def test_a_knock_on_failure_is_counted_once_under_its_root(the_class):
    records, _roster, _problems = the_class
    rows = {r["exercise"]: r for r in class_summary(records)}
    (root, *others) = rows["masked_softmax"]["diagnoses"]
    assert root["mistake"] == "04.masked_softmax.mask_after_softmax"
    assert root["students"] == ["ada", "bo"] and root["count"] == 2
    assert [k["exercise"] for k in root["knock_on"]] == ["attention"]
    assert root["knock_on"][0]["students"] == ["ada", "bo"]
    assert root["knock_on"][0]["mistakes"] == ["04.attention.fix_masked_softmax_first",
                                               "04.attention.mask_after_softmax"]
    attention = rows["attention"]
    assert (attention["passed"], attention["graded"]) == (1, 6)  # the failures still fail
    # no second misconception under attention: only its "not started" and the pointer
    assert [d["status"] for d in attention["diagnoses"]] == ["not started"]
    assert attention["knock_on"][0]["root"] == "masked_softmax"
    assert attention["knock_on"][0]["count"] == 2
    text = summary_text(class_summary(records), records)
    assert "04.attention.fix_masked_softmax_first" in text.split("04_self_attention/attention ")[0]
    assert "2 × fails because masked_softmax fails (counted under masked_softmax)" in text
    page = class_report_html(records)
    assert page.count("<code>04.masked_softmax.mask_after_softmax</code>") == 1
    assert "↳ also fails attention (counted here)" in page
    assert "2 failed because masked_softmax fails" in page


def test_not_started_is_listed_apart_after_the_misconceptions(the_class):
    records, _roster, _problems = the_class
    rows = {r["exercise"]: r for r in class_summary(records)}
    statuses = [d["status"] for d in rows["masked_softmax"]["diagnoses"]]
    assert statuses == ["failed", "not started"]  # 3 not started, 2 failed: failed first
    assert rows["masked_softmax"]["diagnoses"][1]["count"] == 3
    page = class_report_html(records)
    block = page.split("<h3>masked_softmax")[1].split("<h3>")[0]
    assert block.index("mask_after_softmax") < block.index("Not started by 3: chen, fay, gus")
    assert "not started</td>" not in block  # not a row of the ranked table


def test_each_mistake_shows_its_short_title(the_class):
    records, _roster, _problems = the_class
    title = short_title("04.attention_scores.missing_scale")
    assert title == "forgot the scale"
    assert short_title("11.block_param_count.norms_left_out", "zh").endswith("每个子层一个）")
    page = class_report_html(records)
    assert ('<code>04.attention_scores.missing_scale</code><br><span class="title">forgot the '
            'scale</span>') in page
    row = next(r for r in class_summary(records) if r["exercise"] == "attention_scores")
    assert row["diagnoses"][0]["title"] == "forgot the scale"


def test_the_student_view_lists_every_roster_student(the_class):
    records, roster, problems = the_class
    rows = student_rows(records, roster, problems)
    assert [r.student for r in rows] == ["ada", "chen", "eve", "dee", "bo", "fay", "gus"]
    eve = next(r for r in rows if r.student == "eve")
    assert eve.submitted_nothing and eve.not_started == 4 and eve.points == 0
    order = [r.student for r in needs_help(rows)]
    # 0 points and 4 unfinished first (by name), then 2 points, then dee's 3 less her penalty
    assert order == ["chen", "eve", "fay", "gus", "ada", "bo", "dee"]
    dee = next(r for r in rows if r.student == "dee")
    assert (dee.points, dee.late, dee.crashed) == (2.5, 1, 1)
    page = class_report_html(records, roster=roster, problems=problems)
    view = page.split('<h2 id="students">')[1].split("<h2")[0]
    shown = view.split('class="default"')[1]
    assert "Ève Absent" in shown and "submitted nothing" in shown
    assert "late by 1 d 1 h (-0.5)" in shown and "1 crashed or timed out" in shown
    assert f"{CH04}-Copy1.ipynb: a second notebook" in shown  # the refused file, in its row
    assert f"graded {CH04}.ipynb; {CH04}-Copy1.ipynb beside it has work" in shown
    assert "<script" not in page


def test_the_student_view_sorts_without_javascript_in_chromium(the_class, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    records, roster, problems = the_class
    target = tmp_path / "report.html"
    target.write_text(class_report_html(records, roster=roster, problems=problems),
                      encoding="utf-8")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(java_script_enabled=False)
            page.goto(target.as_uri())

            def shown():
                tables = page.locator(".orderings > section")
                return [tables.nth(i).get_attribute("id") for i in range(tables.count())
                        if tables.nth(i).is_visible()]

            def first_students(anchor):
                cells = page.locator(f"#{anchor} tbody tr td:nth-child(2)")
                return [cells.nth(i).inner_text().split("\n")[0] for i in range(3)]

            assert shown() == ["students-needs-help"]
            assert first_students("students-needs-help")[0].startswith("Chen Li")
            page.click("a[href='#students-by-points']")
            assert shown() == ["students-by-points"]
            assert first_students("students-by-points")[0].startswith("Dee")  # 2.5 points
            page.click("a[href='#students-needs-help']")
            assert shown() == ["students-needs-help"]
        finally:
            browser.close()


def test_a_copy_with_work_beside_a_stub_is_flagged(the_class):
    records, _roster, _problems = the_class
    text = summary_text(class_summary(records), records)
    assert (f"chen's {CH04}: graded {CH04}.ipynb, which has no work; {CH04}-Copy1.ipynb beside "
            "it has work (--use-copies grades it)") in text
    rows = list(csv.DictReader(io.StringIO(exercises_csv(records))))
    chen = next(r for r in rows if r["student"] == "chen")
    assert chen[f"{CH04} graded file"].endswith(f"chen/{CH04}/{CH04}.ipynb")
    assert chen[f"{CH04} copy with work"].endswith(f"{CH04}-Copy1.ipynb")
    assert all(r[f"{CH04} copy with work"] == "" for r in rows if r["student"] != "chen")
    # the stub graded because the instructor named it (--use-copy): no hint to --use-copies
    named = [dict(r, chosen="--use-copy") if r.get("student") == "chen" else r for r in records]
    text = summary_text(class_summary(named), named)
    assert (f"chen's {CH04}: graded {CH04}.ipynb on your word (--use-copy), which has no work; "
            f"{CH04}-Copy1.ipynb beside it has work") in text
    assert "--use-copies grades it" not in text


def _stub_and_copy(root: Path) -> tuple[Path, Path]:
    release = sub.REPO / "notebooks" / CH04 / f"{CH04}.ipynb"
    solution = sub.REPO / "solutions" / CH04 / f"{CH04}.ipynb"
    folder = root / "submitted" / "chen" / CH04
    stub = sub.write(sub.solution(release), folder / f"{CH04}.ipynb")
    copy = sub.write(sub.solution(solution), folder / f"{CH04}-Copy1.ipynb")
    return stub, copy


def test_use_copies_grades_the_copy_on_the_instructor_s_word(tmp_path):
    stub, copy = _stub_and_copy(tmp_path)
    assert not has_work(stub) and has_work(copy)
    found = find_submissions([tmp_path / "submitted"])
    assert found.paths == [stub]
    assert found.submissions[0].copies == [{"path": str(copy), "has_work": True}]
    (refusal,) = found.refused
    assert refusal.student == "chen" and "--use-copies grades it" in refusal.problem
    chosen = find_submissions([tmp_path / "submitted"], use_copies=True)
    assert chosen.paths == [copy] and chosen.submissions[0].chosen == "--use-copies"
    assert chosen.submissions[0].copies == [{"path": str(stub), "has_work": False}]
    # work at the standard place: the flag changes nothing
    sub.write(sub.solution(sub.REPO / "solutions" / CH04 / f"{CH04}.ipynb"), stub)
    assert find_submissions([tmp_path / "submitted"], use_copies=True).paths == [stub]



def test_use_copy_grades_the_file_named_on_the_instructor_s_word(tmp_path):
    """--use-copy PATH: the notebook named counts for its student's chapter, whatever holds work
    (here both do, where --use-copies changes nothing); the other is refused saying so, without
    pointing to --use-copies; the record names the other as a copy, as --use-copies' does."""
    stub, copy = _stub_and_copy(tmp_path)
    relative = Path("chen") / CH04 / copy.name
    chosen = find_submissions([tmp_path / "submitted"], use_copy=[relative])
    assert chosen.paths == [copy]
    assert chosen.submissions[0].copies == [{"path": str(stub), "has_work": False}]
    (refusal,) = chosen.refused
    assert refusal.path == str(stub) and refusal.student == "chen"
    assert f"graded on your word, --use-copy: {copy}" in refusal.problem, refusal.problem
    assert "--use-copies" not in refusal.problem
    sub.write(sub.solution(sub.REPO / "solutions" / CH04 / f"{CH04}.ipynb"), stub)  # work too
    assert find_submissions([tmp_path / "submitted"], use_copies=True).paths == [stub]
    for given, choice in ((tmp_path / "submitted", relative),
                          (tmp_path, relative),  # the course folder: relative to submitted/
                          (tmp_path / "submitted", copy)):  # absolute
        found = find_submissions([given], use_copy=[choice], use_copies=True)
        assert found.paths == [copy], (given, choice)
    by_word = find_submissions([tmp_path], use_copy=[stub])
    assert by_word.paths == [stub] and by_word.submissions[0].chosen == "--use-copy"
    assert find_submissions([tmp_path]).submissions[0].chosen is None


def test_a_use_copy_that_is_no_choice_is_refused_before_grading(tmp_path, capsys):
    """A path that is not a student's submitted notebook, or a second choice for one student's
    chapter: one line, exit status 2, nothing graded."""
    from checks.grader.cli import main

    stub, copy = _stub_and_copy(tmp_path)
    loose = sub.write(sub.release(), tmp_path / "submitted" / "loose.ipynb")
    (tmp_path / "submitted" / "chen" / "notes.txt").write_text("not a notebook")
    cases = [(["nobody/x.ipynb"], "--use-copy: not a notebook submitted in"),
             (["chen/notes.txt"], "--use-copy: not a notebook submitted in"),
             ([str(loose)], "belongs to no student's chapter"),
             ([str(stub), f"chen/{CH04}/{copy.name}"],
              f"a second choice for chen's {CH04} (the first: {stub})")]
    report = tmp_path / "grades.json"
    for choices, words in cases:
        argv = ["grade", str(tmp_path / "submitted"), "--json", str(report)]
        for choice in choices:
            argv += ["--use-copy", choice]
        assert main(argv) == 2, choices
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1 and words in lines[0], (choices, captured.err)
        assert not report.exists()  # nothing graded


def test_what_counts_as_work():
    from checks.grader.copies import is_stub

    stub = 'def f(x):\n    """Doc."""\n    # YOUR CODE HERE\n    raise NotImplementedError()\n'
    assert is_stub(stub) and is_stub("import torch\n" + stub)
    assert not is_stub(stub.replace("raise", "return 1  #"))
    assert not is_stub(stub + "y = 1\n") and not is_stub("def f(:\n")
    assert not is_stub("(" * 10_000 + ")" * 10_000)  # the parser gives up: not the release's
    assert not is_stub("x = 1\x00")


def test_every_released_answer_is_a_stub_and_every_solution_is_work():
    for folder in ("notebooks", "notebooks-zh"):
        for path in sorted((sub.REPO / folder).glob("*/*.ipynb")):
            assert not has_work(path), path
    for path in sorted((sub.REPO / "solutions").glob("*/*.ipynb")):
        assert has_work(path), path


# --------------------------------------------------------------------------------------------
# Feedback folders, the index page, local times


def test_feedback_folders_are_readable_for_any_name():
    nfd = unicodedata.normalize("NFD", "chloé.dubois")
    names = ["Chloé Dubois", "李雷", "alice@uni.edu", "bob", "Bob", "chloé.dubois", nfd,
             "index.html", "..", "ann\u202egpj.exe", "x" * 150]
    folders = folder_names(names)
    assert folders["Chloé Dubois"] == "Chloé_Dubois" and folders["李雷"] == "李雷"
    assert folders["alice@uni.edu"] == "alice_uni.edu"  # changed, but alone: no hash
    assert folders["ann\u202egpj.exe"] == "ann_gpj.exe"  # no bidirectional override
    # collisions (case-blind, NFC, the index page's name): a hash each
    for name in ("bob", "Bob", "chloé.dubois", nfd, "index.html"):
        assert folders[name].startswith(readable_name(name) + "-"), name
    assert len({f.casefold() for f in folders.values()}) == len(names)
    for folder in folders.values():
        assert "/" not in folder and not folder.startswith(".") and len(folder) <= 113
        assert unicodedata.is_normalized("NFC", folder)


def test_the_index_page_maps_students_to_their_pages(tmp_path):
    records = [record("Chloé Dubois", [exercise("project_qkv")]),
               record("alice@uni.edu", [exercise("project_qkv", "failed")])]
    roster = {"alice@uni.edu": {"id": "7", "name": "Alice Martin", "login": "", "section": ""}}
    folders = folder_names(r["student"] for r in records)
    for r in records:
        write_feedback(tmp_path, r, folders)
    index = write_index(tmp_path, records, folders, roster)
    assert index == tmp_path / INDEX
    page = index.read_text(encoding="utf-8")
    assert "Alice Martin" in page and "Chloé Dubois" in page
    assert 'href="Chlo%C3%A9_Dubois/04_self_attention.html"' in page
    for r in records:
        assert feedback_path(tmp_path, r, folders).is_file()
    assert (tmp_path / "Chloé_Dubois" / f"{CH04}.html").is_file()


@pytest.fixture
def paris(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_times_are_local_with_their_zone(paris):
    assert local_time("2026-03-02T10:05:00.123456+00:00") == "2026-03-02 11:05 CET (UTC+01:00)"
    assert local_time(None) == "" and local_time("not a time") == "not a time"
    page = feedback_html(record("dee", [exercise("project_qkv")],
                                submitted_at="2026-03-03T00:00:00.654321+00:00",
                                due="2026-03-01T22:59:00+00:00"))
    assert "Submitted 2026-03-03 01:00 CET (UTC+01:00) (due 2026-03-01 23:59 CET" in page
    assert ".654321" not in page
