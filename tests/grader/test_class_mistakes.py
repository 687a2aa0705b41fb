"""A class where several students made the same mistake, each in their own code, with their own
random inputs, in the English and the Chinese release: the grader records one mistake id for
all of them, and the JSON summary, the terminal's class summary and the class report count it
once per student (diagnoses as data, end to end through `python -m checks grade`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import submissions as sub

pytestmark = pytest.mark.grader_workers

CHAPTER = "01_notation"
FLOAT = "01.head_dim.float_division"
# student: (the head_dim answer's return line, the release's language)
STUDENTS = {
    "ada": ("return cfg.hidden_size / cfg.n_heads", "en"),
    "bo": ("return float(cfg.head_dim)", "zh"),
    "chen": ("return cfg.head_dim * 1.0", "zh"),
    "dee": ("return int(cfg.head_dim)", "en"),  # correct
}


def _submission(line: str, lang: str):
    nb = sub.solution()
    answer = sub.cell(nb, "head_dim")
    assert "return int(cfg.head_dim)" in answer.source
    answer.source = answer.source.replace("return int(cfg.head_dim)", line)
    nb.metadata.setdefault("course", {})["lang"] = lang
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    for student, (line, lang) in STUDENTS.items():
        sub.write(_submission(line, lang), root / student / CHAPTER / f"{CHAPTER}.ipynb")
    out = root / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(root), "--json", str(out / "grades.json"),
         "--report", str(out / "report.html"), "--jobs", "2"],
        capture_output=True, text=True, timeout=900,
        env={**{k: v for k, v in os.environ.items() if k != "LLAMA_COURSE_LANG"},
             "OMP_NUM_THREADS": "1"})  # each submission's language decides its diagnoses
    assert done.returncode == 0, done.stderr
    return json.loads((out / "grades.json").read_text()), done.stdout, out


def test_each_record_carries_the_mistake_and_its_seed(graded):
    data, _stdout, _out = graded
    head_dim = {r["student"]: r["exercises"][0] for r in data["notebooks"]}
    assert {s for s, e in head_dim.items() if e["mistake"] == FLOAT} == {"ada", "bo", "chen"}
    assert head_dim["dee"]["status"] == "passed" and head_dim["dee"]["mistake"] is None
    # the Chinese students read Chinese; the id is the same
    assert head_dim["bo"]["message"] != head_dim["ada"]["message"]
    assert all(isinstance(head_dim[s]["seed"], int) for s in ("ada", "bo", "chen"))


def test_the_summary_counts_the_mistake_once_per_student(graded):
    data, _stdout, _out = graded
    row = next(r for r in data["summary"] if r["exercise"] == "head_dim")
    assert (row["passed"], row["graded"]) == (1, 4)
    (diagnosis,) = row["diagnoses"]
    assert diagnosis["mistake"] == FLOAT and diagnosis["count"] == 3
    assert diagnosis["students"] == ["ada", "bo", "chen"]
    # told once, in the instructor's language, by its declared message
    assert diagnosis["message"] == "returned a float: use integer division `//`"


def test_the_terminal_and_the_class_report_show_one_line_for_it(graded):
    _data, stdout, out = graded
    summary = stdout[stdout.index("class summary"):]
    assert summary.count(FLOAT) == 1 and f"3 × failed: [{FLOAT}]" in summary
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count(FLOAT) == 1 and "ada, bo, chen" in page
    assert "head_dim: 1 of 4 passed (25%)" in page


ARTIFACTS = sub.REPO / "build" / "test-artifacts" / "class-report"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))


def test_the_class_report_in_a_browser(graded):
    """Looked at as an instructor would: the charts are drawn (inline SVG with a size), the
    mistake's row reads right, nothing runs; the screenshot is kept in the test artifacts."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    _data, _stdout, out = graded
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.goto((out / "report.html").as_uri())
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
            charts = page.locator("figure svg")
            assert charts.count() == 2
            assert all(charts.nth(i).bounding_box()["height"] > 100 for i in range(2))
            row = page.locator("tr", has_text=FLOAT)
            assert row.count() == 1 and row.inner_text().split("\t")[0].strip() == "3"
        finally:
            browser.close()
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
