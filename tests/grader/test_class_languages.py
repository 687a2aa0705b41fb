"""Every output that names a mistake by its id tells it by the registry's message for the id
(`checks.mistakes.declared`), placeholders shown as "…", in the instructor's language
(`checks grade --lang`), never by one student's words: the class summary (terminal and JSON) and
the class report of a class graded in the English and the Chinese release; the feedback pages and
Gradescope's results put it over each student's own diagnosis, in the page's language."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys

import pytest

from checks import i18n
from checks.environment import LANG_ENV
from checks.grader.gradescope.autograde import gradescope_results
from checks.grader.outputs.class_report import class_report_html
from checks.grader.outputs.feedback import feedback_html
from checks.grader.outputs.headlines import elided, headline
from checks.grader.outputs.summary import class_summary, summary_text

from ..support import submissions as sub

CH01, CH07 = "01_notation", "07_position_information"
SOLUTION_07 = sub.REPO / "solutions" / CH07 / f"{CH07}.ipynb"
FLOAT = "01.head_dim.float_division"
INVERTED = "01.kv_group_size.divided_wrong_way_round"
UNCHANGED = "07.permute_tokens.returned_x_unchanged"  # "returned x unchanged; {rule}"
# Each id's registry message, placeholders elided, in each language: what the outputs must show.
TOLD = {
    "en": {FLOAT: "returned a float: use integer division `//`",
           INVERTED: "divided the wrong way round: G = N_h / N_kv",
           UNCHANGED: "returned x unchanged; …"},
    "zh": {FLOAT: "返回了浮点数：请用整数除法 `//`",
           INVERTED: "除反了：G = N_h / N_kv",
           UNCHANGED: "原样返回了 x；…"},
}
# student: (chapter, answer's grade id, the solution's line, the student's line, the release)
STUDENTS = {
    "ada": (CH01, "head_dim", "return int(cfg.head_dim)", "return cfg.hidden_size / cfg.n_heads",
            "en"),
    "bo": (CH01, "head_dim", "return int(cfg.head_dim)", "return float(cfg.head_dim)", "zh"),
    "chen": (CH01, "kv_group_size", "return cfg.n_heads // cfg.n_kv_heads",
             "return cfg.n_kv_heads // cfg.n_heads", "zh"),
    "dee": (CH07, "permute_tokens", "return x[:, perm]", "return x", "en"),
    "eve": (CH07, "permute_tokens", "return x[:, perm]", "return x", "zh"),
}
WHO = {FLOAT: ["ada", "bo"], INVERTED: ["chen"], UNCHANGED: ["dee", "eve"]}


# --------------------------------------------------------------------------------------------
# The headline: the registry's message, placeholders elided (no grading)


@pytest.mark.parametrize("template, shown", [
    ("normalised over the {axis} axis", "normalised over the … axis"),
    ("{mistake} (and rotated the wrong way)", "… (and rotated the wrong way)"),
    ("{name} received {got}, not {want}", "… received …, not …"),
    ("{} and {0} and {x:>{width}} and {y!r}", "… and … and … and …"),
    ("a set {{like this}}: {n}", "a set {like this}: …"),
    ("no placeholder", "no placeholder"),
    ("a lone { brace", "a lone { brace"),  # not a template: as it is
])
def test_placeholders_are_elided(template, shown):
    assert elided(template) == shown


def test_the_headline_is_the_registry_s_message_in_the_language_asked_for(monkeypatch):
    monkeypatch.delenv(LANG_ENV, raising=False)
    for lang, told in TOLD.items():
        for mistake, text in told.items():
            assert headline(mistake, lang) == text
            with i18n.using(lang):  # without a language: the language of the moment
                assert headline(mistake) == text
    # no message in the registry: a knock-on failure's, an id of no chapter, no id
    for unknown in ("02.bpe_decode.fix_bpe_encode_first", "99.nothing.here", None, ""):
        assert headline(unknown, "zh") is None


# --------------------------------------------------------------------------------------------
# The outputs, from records (no grading)


def _record(student: str, lang: str, mistake: str | None, message: str) -> dict:
    exercise = {"name": "head_dim", "points": 0, "max_points": 1, "status": "failed",
                "message": message, "mistake": mistake, "seed": 7}
    return {"path": f"{student}/{CH01}.ipynb", "chapter": CH01, "student": student, "lang": lang,
            "points": 0, "max_points": 1, "passed": 0, "counted": True, "exercises": [exercise]}


RECORDS = [
    _record("ada", "en", FLOAT, "head_dim(LLAMA2_7B) is 128.0, expected 128. — likely mistake: "
                                "returned a float: use integer division `//`"),
    _record("bo", "zh", FLOAT, "head_dim(LLAMA2_7B) 是 128.0，应为 128。 — 可能的错误："
                               "返回了浮点数"),
    _record("cy", "en", "01.head_dim.fix_kv_group_size_first",  # no message in the registry
            "your kv_group_size does not pass its own check (returned 0)"),
]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_summary_and_the_report_tell_a_mistake_by_the_registry_alone(lang, monkeypatch):
    monkeypatch.delenv(LANG_ENV, raising=False)
    (row,) = class_summary(RECORDS, lang)
    told = {d["mistake"]: d["message"] for d in row["diagnoses"]}
    assert told == {FLOAT: TOLD[lang][FLOAT], "01.head_dim.fix_kv_group_size_first": ""}
    with i18n.using(lang):
        text = summary_text(class_summary(RECORDS, lang), RECORDS)
    assert f"2 × {'未通过' if lang == 'zh' else 'failed'}: [{FLOAT}] {TOLD[lang][FLOAT]}" in text
    assert text.rstrip().endswith("[01.head_dim.fix_kv_group_size_first]")
    page = class_report_html(RECORDS, lang)
    assert f'<html lang="{lang}">' in page and html.escape(TOLD[lang][FLOAT]) in page
    for words in ("128.0", "does not pass its own check"):  # no student's own words
        assert words not in text and words not in page


def test_feedback_and_gradescope_put_the_headline_over_the_student_s_words(monkeypatch,
                                                                            tmp_path):
    """In the page's language (the submission's): one language per page."""
    monkeypatch.delenv(LANG_ENV, raising=False)
    for record in RECORDS[:2]:
        lang, exercise = record["lang"], record["exercises"][0]
        page = feedback_html(record)
        assert (f'<td class="message"><strong class="headline">'
                f'{html.escape(TOLD[lang][FLOAT])}</strong><br>'
                f'{html.escape(exercise["message"])}') in page
        solutions = tmp_path / "course" / "solutions" / CH01
        solutions.mkdir(parents=True, exist_ok=True)
        sub.write(sub.solution(), solutions / f"{CH01}.ipynb")
        results = gradescope_results({"notebooks": [record], "errors": []}, "", 0,
                                     tmp_path / "course", {"chapters": [CH01]})
        output = next(t["output"] for t in results["tests"] if t["name"].endswith("head_dim"))
        assert output.splitlines()[:2] == [TOLD[lang][FLOAT], exercise["message"]]
    page = feedback_html(RECORDS[2])  # no message in the registry: the student's words alone
    assert '<td class="message">your kv_group_size' in page and "headline" not in page


# --------------------------------------------------------------------------------------------
# A class graded in both releases, its outputs asked for in Chinese, then in English


def _submission(student: str):
    chapter, grade_id, solution, line, lang = STUDENTS[student]
    nb = sub.solution(SOLUTION_07 if chapter == CH07 else sub.SOLUTION_01)
    answer = sub.cell(nb, grade_id)
    assert solution in answer.source
    answer.source = answer.source.replace(solution, line)
    nb.metadata.setdefault("course", {})["lang"] = lang
    return nb


def _grade(root, out, lang: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(root), "--json", str(out / "grades.json"),
         "--report", str(out / f"report-{lang}.html"), "--lang", lang, "--jobs", "2"],
        capture_output=True, text=True, timeout=900,
        env={**{k: v for k, v in os.environ.items() if k != LANG_ENV}, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """{lang: (the JSON report, stdout, the class report)}: graded once with --lang zh, then the
    same --json again with --lang en (every record kept: only the outputs are written again)."""
    root = tmp_path_factory.mktemp("class")
    for student, (chapter, *_rest) in STUDENTS.items():
        sub.write(_submission(student), root / student / chapter / f"{chapter}.ipynb")
    out = root / "out"
    out.mkdir()
    runs = {}
    for lang in ("zh", "en"):
        done = _grade(root, out, lang)
        runs[lang] = (json.loads((out / "grades.json").read_text(encoding="utf-8")),
                      done.stdout, (out / f"report-{lang}.html").read_text(encoding="utf-8"))
    assert "5 of 5 notebooks unchanged" in done.stderr  # the English run graded nothing again
    return runs


@pytest.mark.grader_workers
def test_each_student_s_mistake_is_recorded_in_their_own_language(graded):
    data, _stdout, _page = graded["zh"]
    by_student = {r["student"]: r for r in data["notebooks"]}
    for mistake, students in WHO.items():
        for student in students:
            (exercise,) = [e for e in by_student[student]["exercises"] if e["mistake"] == mistake]
            assert by_student[student]["lang"] == STUDENTS[student][4]
            assert exercise["message"] and exercise["message"] not in TOLD["en"].values()


@pytest.mark.grader_workers
@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_summary_and_the_report_tell_each_mistake_in_the_instructor_s_language(graded, lang):
    data, stdout, page = graded[lang]
    other = "en" if lang == "zh" else "zh"
    summary = stdout[stdout.index("全班汇总" if lang == "zh" else "class summary"):]
    diagnoses = {d["mistake"]: d for row in data["summary"] for d in row["diagnoses"]}
    for mistake, told in TOLD[lang].items():
        assert diagnoses[mistake]["message"] == told  # the JSON's summary
        assert diagnoses[mistake]["students"] == WHO[mistake]
        assert f"[{mistake}] {told}" in summary  # the terminal's
        assert summary.count(mistake) == 1
        row = next(r for r in page.split("<tr>") if f"<code>{mistake}</code>" in r)
        assert f"<td>{html.escape(told)}</td>" in row  # the class report's
        assert ", ".join(WHO[mistake]) in row
        assert TOLD[other][mistake] not in summary and html.escape(TOLD[other][mistake]) \
            not in page
    assert f'<html lang="{lang}">' in page
    assert "{rule}" not in summary + page  # a template's placeholder is elided, never shown
    students_words = [e["message"] for r in data["notebooks"] for e in r["exercises"]
                      if e["mistake"]]
    assert not any(words in summary or html.escape(words) in page for words in students_words)
