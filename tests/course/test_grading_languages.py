"""Grading is language-blind: the Chinese release (notebooks-zh/) with the solutions' answers
pasted in earns exactly what the English release earns with the same answers, under
`python -m checks grade`; a wrong answer loses the same points in both, and its diagnosis is in
the language asked for (LLAMA_COURSE_LANG).

The answers are the solution notebooks' own answer cells (solution regions included), pasted
into the release notebooks by grade id; nothing else of the release changes. nbgrader's own
autograde of the Chinese release is not run here (tests/course/test_nbgrader_roundtrip.py runs
it on the English one): its test cells come from the gradebook built from solutions/, the same
for both releases, and the Chinese notebooks' graded cells are byte-identical to the English
ones (tests/tools/test_release.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from checks.environment import LANG_ENV
from checks.tools import release

pytestmark = [pytest.mark.slow, pytest.mark.grader_workers]

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = release.chapters()
WRONG_CHAPTER, WRONG_EXERCISE = "04_self_attention", "attention_scores"


def _answers(chapter: str) -> dict[str, str]:
    source = nbformat.read(release.SOLUTIONS / chapter / f"{chapter}.ipynb", as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def _paste(chapter: str, lang: str, dest: Path, *, unscaled: bool = False) -> Path:
    """The `lang` release of `chapter` with the solutions' answers in its answer cells (with
    `unscaled`, chapter 04's attention_scores forgets its 1/sqrt(D))."""
    nb = nbformat.read(release.RELEASES[lang] / chapter / f"{chapter}.ipynb", as_version=4)
    answers = _answers(chapter)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[grade_id]
            if unscaled and grade_id == WRONG_EXERCISE:
                assert " / math.sqrt(d)" in cell.source
                cell.source = cell.source.replace(" / math.sqrt(d)", "")
    path = dest / f"{chapter}.ipynb"
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _grade(folder: Path, report: Path, lang: str | None) -> dict[str, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(LANG_ENV, None)
    if lang:
        env[LANG_ENV] = lang
    done = subprocess.run([sys.executable, "-m", "checks", "grade", str(folder), "--jobs", "2",
                           "--json", str(report)], capture_output=True, text=True, timeout=1500,
                          cwd=folder.parent, env=env)
    assert done.returncode in (0, 1) and report.is_file(), done.stderr[-2000:]
    notebooks = json.loads(report.read_text(encoding="utf-8"))["notebooks"]
    return {nb["chapter"]: nb for nb in notebooks}


_SUMMARY: list[str] = []


def terminal_summary() -> list[str]:
    """Printed at the end of the run (tests/conftest.py): the points each release earned."""
    return _SUMMARY


def _scores(notebook: dict) -> list[tuple]:
    return [(e["name"], e["points"], e["max_points"], e["status"])
            for e in notebook["exercises"]]


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """Both releases with every answer right, except chapter 04's attention_scores in a second
    copy of chapter 04 (graded on its own), each graded once."""
    base = tmp_path_factory.mktemp("languages")
    out = {}
    for lang in ("en", "zh"):
        for chapter in CHAPTERS:
            _paste(chapter, lang, base / lang)
        out[lang] = _grade(base / lang, base / f"{lang}.json", lang)
        _paste(WRONG_CHAPTER, lang, base / f"{lang}-wrong", unscaled=True)
        out[f"{lang}-wrong"] = _grade(base / f"{lang}-wrong", base / f"{lang}-wrong.json", lang)
    _paste(WRONG_CHAPTER, "zh", base / "zh-wrong-unset", unscaled=True)
    out["zh-wrong-unset"] = _grade(base / "zh-wrong-unset", base / "zh-wrong-unset.json", None)
    return out


def test_both_releases_earn_full_marks_and_the_same_points(graded):
    en, zh = graded["en"], graded["zh"]
    assert sorted(en) == sorted(zh) == sorted(CHAPTERS)
    for chapter in CHAPTERS:
        assert _scores(zh[chapter]) == _scores(en[chapter]), chapter
        assert en[chapter]["points"] == en[chapter]["max_points"], _scores(en[chapter])
    total = sum(nb["points"] for nb in zh.values())
    assert total == sum(nb["max_points"] for nb in en.values()) == \
        sum(nb["points"] for nb in en.values())
    _SUMMARY.append(f"grading languages: notebooks/ {sum(nb['points'] for nb in en.values()):g}/"
                    f"{sum(nb['max_points'] for nb in en.values()):g}, notebooks-zh/ {total:g}/"
                    f"{sum(nb['max_points'] for nb in zh.values()):g} points, "
                    f"{len(CHAPTERS)} chapters, the same per exercise")


def test_a_wrong_answer_loses_the_same_points_with_its_diagnosis_in_each_language(graded):
    en = graded["en-wrong"][WRONG_CHAPTER]
    zh = graded["zh-wrong"][WRONG_CHAPTER]
    assert _scores(zh) == _scores(en)
    assert en["points"] < en["max_points"]
    wrong_en = next(e for e in en["exercises"] if e["name"] == WRONG_EXERCISE)
    wrong_zh = next(e for e in zh["exercises"] if e["name"] == WRONG_EXERCISE)
    assert wrong_en["status"] == wrong_zh["status"] == "failed"
    assert "likely mistake: forgot the scale" in wrong_en["message"]
    assert "可能的错误：忘了缩放" in wrong_zh["message"]
    assert "likely mistake" not in wrong_zh["message"]


def test_a_chinese_submission_is_reported_in_chinese_without_the_variable(graded):
    zh = graded["zh-wrong-unset"][WRONG_CHAPTER]
    wrong = next(e for e in zh["exercises"] if e["name"] == WRONG_EXERCISE)
    assert "可能的错误：忘了缩放" in wrong["message"]
