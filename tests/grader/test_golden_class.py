"""The golden class: a fixed class of five students (tests/grader/golden/class/: chapters 11 to 14,
planted mistakes, a correct student, an exercise not started, two in the Chinese release, one
late) graded again with `python -m checks grade --json --csv --report --due --jobs 2`; the JSON
report, the gradebook, the class report and the terminal's table and class summary must be the
golden ones (tests/grader/golden/expected/), once what varies between runs is normalised
(tests/grader/golden/outputs.py says what and why). What an instructor sees must not change
unless a change means it to: then rewrite the golden files with
`PYTHONPATH=$PWD .venv/bin/python -m tests.grader.golden.outputs` and read their diff."""

from __future__ import annotations

import json

import pytest

from .golden import make_class
from .golden import outputs as golden

pytestmark = [pytest.mark.grader_workers, pytest.mark.slow]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    outputs, _done = golden.grade(tmp_path_factory.mktemp("golden"))
    return outputs


@pytest.mark.parametrize("name", golden.OUTPUTS)
def test_the_class_grades_as_the_golden_files_say(graded, name):
    expected = (golden.EXPECTED / name).read_text(encoding="utf-8")
    if graded[name] != expected:
        pytest.fail(f"{name} is not the golden one (tests/grader/golden/expected/{name}); what "
                    f"changed:\n{golden.diff(expected, graded[name], name)}", pytrace=False)


def test_the_golden_files_diagnose_every_planted_mistake():
    """The golden JSON itself carries each mistake make_class.py planted (so a regression cannot
    be written into the golden files unnoticed), and the correct student passed everything."""
    data = json.loads((golden.EXPECTED / "class.json").read_text(encoding="utf-8"))
    found = {(r["student"], r["chapter"], e["name"]): e for r in data["notebooks"]
             for e in r["exercises"]}
    for where, mistake in make_class.expected_mistakes().items():
        exercise = found[where]
        if mistake is None:
            assert exercise["status"] == "not started", where
        else:
            assert (exercise["status"], exercise["mistake"]) == ("failed", mistake), where
    assert all(e["status"] == "passed" for (student, _c, _e), e in found.items()
               if student == "dee")
    langs = {r["student"]: r["lang"] for r in data["notebooks"]}
    assert langs == {s: lang for s, (lang, _chapters) in make_class.STUDENTS.items()}


def test_the_golden_report_lists_every_roster_student_and_counts_not_started_apart():
    """The golden report's student view has a row per roster student, fay (no notebook) among
    them, in its needs-help order first; "not started" is a line apart, after the ranked
    misconceptions, and each mistake id shows its short title."""
    page = (golden.EXPECTED / "class.html").read_text(encoding="utf-8")
    view = page.split('<h2 id="students">')[1].split("<h2")[0]
    shown = view.split('class="default"')[1].split("</section>")[0]
    for student in [*make_class.STUDENTS, "fay"]:
        assert f"<code>{student}</code>" in shown, student
    assert "6 students; 1 submitted nothing" in view
    first = shown.split("<tbody>")[1].split("</tr>")[0]
    assert "<code>fay</code>" in first and "submitted nothing" in first
    evaluate = page.split("<h3>bits_per_byte")[1].split("<h3>")[0]
    assert "Not started by 1: eve" in evaluate and "not started</td>" not in evaluate
    assert ('<code>14.lr_at.warmup_off_by_one</code><br><span class="title">warmup off by one'
            '</span>') in page
