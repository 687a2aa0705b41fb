"""Inside Gradescope's container (run_autograder): grade `<root>/submission/` with
`python -m checks grade` (the sandboxed grader, in its own process), and write
`<root>/results/results.json` in Gradescope's format: one test per exercise of the chapters this
autograder was built for (`score`, `max_score`, `name`, `number`, `output`: the grader's
diagnosis, under the registry's message for its mistake when one was diagnosed, then the
mistake's id and the line that replays the failing case, `status`, `visibility`, and
`extra_data`: {"mistake": the id, "seed": the replay seed}, each null when there is none), the
overall `score`, and the grader's table as `output`; the top level's `extra_data` gathers each
failed test's mistake id and seed by test name, for an instructor's export.

A chapter whose notebook is missing from the submission scores zero with a test per exercise
saying so; a submission that cannot be graded at all (an incident) scores zero and says why.
results.json is always written: without it Gradescope shows only "autograder failed".

Gradescope's container runs this as root, usually without CAP_SYS_ADMIN (Docker's default): no
namespaces, so the grader runs each worker as a user id of its own ("user" isolation). Before
grading, what that user must not read is closed to other users (the zip's folder, the submission,
an installed copy of the course: `close_private_folders`); this process makes itself the reaper
of every orphan below it, and after grading kills every process still below it before it writes
results.json, so nothing a submission started can write it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...i18n import N_, _, using
from ..outputs.headlines import headline
from ..isolation import become_subreaper, isolation_mode, private_folders, readable_by_others
from ..memory import descendants
from ..read import is_test_cell, read_notebook
from ..report import replay_text, status_word
from ..score import exercise_name

CONFIG = "gradescope.json"  # in source/course/: the chapters, the grader's options
PASSED = "passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_autograder")
    parser.add_argument("--root", type=Path, default=Path("/autograder"))
    root = parser.parse_args(argv).root
    course = root / "source" / "course"
    config = json.loads((course / CONFIG).read_text(encoding="utf-8"))
    started = time.monotonic()
    become_subreaper()
    closed = close_private_folders(root)
    report, table, status = grade_submission(root / "submission", course, config)
    survivors = end_every_descendant()
    results = gradescope_results(report, table, status, course, config)
    if survivors:
        table += "\n" + _("{count} process(es) the submission started outlived the grader and "
                          "were killed before results.json was written").format(count=survivors)
    if closed:
        table += "\n" + _("closed to other users for grading: {folders}").format(
            folders=", ".join(closed))
    results["execution_time"] = round(time.monotonic() - started)
    target = root / "results" / "results.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(table)  # Gradescope shows the autograder's stdout to instructors only
    return 0


def close_private_folders(root: Path) -> list[str]:
    """Without namespaces (the worker then runs as a user of its own, see isolation_mode), make
    what it must not read private to root: the zip's folder (sources with hidden tests, the
    course's package), the submission, and any installed copy of the course. Nothing is changed
    where namespaces work (the worker does not see them at all). The folders closed."""
    if isolation_mode() != "user":
        return []
    closed = []
    folders = [root / "source", root / "submission",
               *(Path(p) for p in private_folders([]))]
    for folder in folders:
        if folder.exists() and readable_by_others(folder):
            os.chmod(folder, stat.S_IMODE(os.stat(folder).st_mode) & ~0o007)
            closed.append(str(folder))
    return closed


def end_every_descendant(wait: float = 10.0) -> int:
    """Kill every process below this one (a submission's process that outlived the grader
    comes here: this process is their reaper) and wait until they are gone; how many there
    were."""
    seen: set[int] = set()
    deadline = time.monotonic() + wait
    while (alive := descendants(os.getpid())) and time.monotonic() < deadline:
        seen |= set(alive)
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in alive:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.02)
    return len(seen)


def grade_submission(submission: Path, course: Path, config: dict) -> tuple[dict, str, int]:
    """(the JSON report of `checks grade`, its printed table and stderr, its exit status)."""
    with tempfile.TemporaryDirectory(prefix="checks-gradescope-") as scratch:
        report_path = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "checks", "grade", str(submission),
                   "--json", str(report_path), "--source", str(course / "solutions"),
                   *config.get("grade_options", [])]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(course), *filter(None, [os.environ.get("PYTHONPATH")])]))
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=scratch)
        table = (done.stdout + done.stderr).strip()
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            report = {"notebooks": [], "errors": []}
    return report, table, done.returncode


NO_NOTEBOOK = N_("no notebook of this chapter in the submission")


def gradescope_results(report: dict, table: str, status: int, course: Path,
                       config: dict) -> dict:
    best = _best_record_per_chapter(report.get("notebooks", []))
    # What the student reads, in the submission's language (LLAMA_COURSE_LANG still decides).
    lang = next((r["lang"] for r in best.values() if r.get("lang")), None)
    with using(lang):
        return _results(report, status, course, config, best)


def _results(report: dict, status: int, course: Path, config: dict, best: dict) -> dict:
    tests, notes = [], []
    for chapter in config["chapters"]:
        record = best.get(chapter)
        if record is None:
            notes.append(f"{chapter}: " + _(NO_NOTEBOOK))
        tests += _chapter_tests(chapter, record, course, len(tests))
        if record is not None and record.get("error"):
            notes.append(f"{chapter}: {record['error']}")
    notes += [f"{e['path'].rsplit('/', 1)[-1]}: {e['error']}" for e in report.get("errors", [])]
    if status not in (0, 2, 3):
        notes.append(_("the grader itself failed (exit status {status}); the instructor sees its "
                       "output").format(status=status))
    if "incident" in report or status == 3:
        notes.append(_("grading stopped: the submission changed files it may not change; the "
                       "instructor will look at it"))
        for test in tests:
            test.update(score=0.0, status="failed")
    score = sum(t["score"] for t in tests)
    failures = {t["name"]: t["extra_data"] for t in tests
                if t["status"] != PASSED and any(v is not None for v in t["extra_data"].values())}
    visibility = config.get("visibility", "visible")
    for test in tests:
        test["visibility"] = visibility
    return {"score": score, "output": "\n".join([points_summary(tests, config), *notes]),
            "visibility": visibility, "stdout_visibility": "hidden",
            "extra_data": {"failures": failures}, "tests": tests}


def points_summary(tests: list[dict], config: dict) -> str:
    """The output's first line: the points of the whole submission, and per chapter when the
    autograder grades several ("6 / 14 points (01_notation 6 / 6, 04_self_attention 0 / 8)")."""
    def pair(chosen: list[dict]) -> str:
        return _("{score} / {max_score} points").format(
            score=_pts(sum(t["score"] for t in chosen)),
            max_score=_pts(sum(t["max_score"] for t in chosen)))

    line = pair(tests)
    if len(config["chapters"]) > 1:
        line += " (" + ", ".join(
            f"{chapter} " + pair([t for t in tests if t["name"].startswith(f"{chapter}: ")])
            for chapter in config["chapters"]) + ")"
    return line


def _pts(value: float) -> str:
    return f"{value:g}"


def _best_record_per_chapter(records: list[dict]) -> dict[str, dict]:
    best: dict[str, dict] = {}
    for record in records:
        if not record.get("counted", True):
            continue
        known = best.get(record["chapter"])
        if known is None or record["points"] > known["points"]:
            best[record["chapter"]] = record
    return best


def _chapter_tests(chapter: str, record: dict | None, course: Path, before: int) -> list[dict]:
    """One Gradescope test per exercise of the chapter, in the notebook's order."""
    graded = {e["name"]: e for e in (record or {}).get("exercises", [])}
    tests = []
    for number, (name, max_points) in enumerate(chapter_exercises(chapter, course), 1):
        exercise = graded.get(name)
        mistake = seed = None
        if exercise is None:
            why = _(NO_NOTEBOOK) if record is None else _("not graded")
            score, status, output = 0.0, "failed", why
        else:
            score = float(exercise["points"])
            status = PASSED if exercise["status"] == PASSED else "failed"
            output = exercise["message"] or status_word(exercise["status"])
            told = headline(exercise.get("mistake")) if status != PASSED else None
            if told:  # the registry's message over the student's own diagnosis
                output = f"{told}\n{output}"
            if status != PASSED:
                mistake, seed = exercise.get("mistake"), exercise.get("seed")
            if mistake:
                output += "\n" + _("mistake: {id}").format(id=mistake)
            if replay_text(exercise):
                output += "\n" + replay_text(exercise)
        tests.append({"name": f"{chapter}: {name}", "number": f"{chapter[:2]}.{number}",
                      "score": score, "max_score": float(max_points), "status": status,
                      "output": output, "visibility": "visible",
                      "extra_data": {"mistake": mistake, "seed": seed}})
    return tests


def chapter_exercises(chapter: str, course: Path) -> list[tuple[str, float]]:
    """(exercise, points) of a chapter, from its source notebook's test cells."""
    source = read_notebook(course / "solutions" / chapter / f"{chapter}.ipynb")
    return [(exercise_name(c.metadata["nbgrader"]["grade_id"]),
             float(c.metadata["nbgrader"].get("points", 0)))
            for c in source.cells if is_test_cell(c)]


if __name__ == "__main__":
    sys.exit(main())
