"""Section `class`: a class of `--students` complete submissions (default 20; copies of the
solutions in nbgrader's `submitted/<student>/<chapter>/` layout) graded with `--jobs 1` and with
`--jobs 2`: both wall times, the speed-up, and whether both runs gave every notebook the same
results. (The module is not called `class`: that is Python's keyword.)"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .common import solution_notebooks
from .grading import copy_submission, grade_timed, points


def _outcome(grades: list[dict]) -> dict:
    """What a grading run decided for each notebook (its timings left out), by
    student/chapter/file."""
    return {"/".join(Path(n["path"]).parts[-3:]):
            (n.get("points"), n.get("error"),
             [(e.get("name"), e.get("status"), e.get("points"),
               (e.get("message") or "").strip().split("\n")[0][:300])
              for e in n.get("exercises", [])])
            for n in grades}


def run_class(chapters, say, students: int) -> dict:
    """`students` complete submissions in nbgrader's submitted/<student>/<chapter>/ layout,
    graded with `--jobs 1` and then with `--jobs 2`."""
    paths = solution_notebooks(chapters)
    result: dict = {"students": students, "notebooks": students * len(paths), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="checks-benchmark-class-") as tmp:
        submitted = Path(tmp) / "submitted"
        for s in range(1, students + 1):
            copy_submission(paths, submitted / f"student{s:02d}")
        outcomes = {}
        for jobs in (1, 2):
            say(f"grading a class of {students} submissions ({result['notebooks']} notebooks) "
                f"with --jobs {jobs}")
            run = grade_timed(submitted, Path(tmp) / f"grades-{jobs}.json", "--jobs", str(jobs))
            outcomes[jobs] = _outcome(run.pop("grades"))
            result["runs"][str(jobs)] = run
    one, two = result["runs"]["1"], result["runs"]["2"]
    # Notebooks graded per second: the same as the ratio of wall times when both runs graded
    # the whole class (a run that stopped early, say on an incident, still gives a rate).
    result["complete"] = one["graded"] == two["graded"] == result["notebooks"]
    result["speedup"] = (two["graded"] / two["seconds"]) / max(one["graded"] / one["seconds"],
                                                               1e-12)
    both = outcomes[1].keys() & outcomes[2].keys()   # every notebook, unless a run stopped
    result["same_results"] = bool(both) and all(outcomes[1][k] == outcomes[2][k] for k in both)
    result["differences"] = _differences(outcomes, sorted(both))
    return result


def _differences(outcomes: dict, notebooks: list[str]) -> list[dict]:
    """For each notebook graded differently by the two runs: what each run said of the
    exercises that differ (status, points, the first line of the message)."""
    found = []
    for key in notebooks:
        one, two = outcomes[1][key], outcomes[2][key]
        if one == two:
            continue
        runs = {}
        for jobs, outcome in ((1, one), (2, two)):
            other = two if jobs == 1 else one
            runs[str(jobs)] = {"error": outcome[1], "exercises": [
                e for e in outcome[2] if e not in other[2]]}
        found.append({"notebook": key, "runs": runs})
    return found


def format_class(result: dict) -> list[str]:
    """Table (e), the class graded with --jobs 1 and --jobs 2."""
    c = result.get("class")
    if not c:
        return []
    lines = ["", f"(e) a class of {c['students']} complete submissions ({c['notebooks']} "
                 "notebooks, nbgrader's submitted/<student>/<chapter>/ layout) graded by "
                 "python -m checks grade",
             f"{'':>4}{'--jobs':<8}{'graded':>8}{'seconds':>9}{'per notebook':>14}  result"]
    for jobs, run in c["runs"].items():
        lines.append(f"{'':>4}{jobs:<8}{run['graded']:>8}{run['seconds']:>9.1f}"
                     f"{run['seconds'] / max(run['graded'], 1):>14.2f}  {points(run)}")
    how = "" if c["complete"] else " (notebooks per second: a run stopped early)"
    lines.append(f"    --jobs 2 against --jobs 1: {c['speedup']:.2f}x faster{how} (target: at "
                 f"least 1.6x); same result for every notebook: "
                 f"{'yes' if c['same_results'] else 'NO'}")
    for d in c.get("differences", []):
        for jobs, run in d["runs"].items():
            said = "; ".join(f"{name} {status} ({points:g} points)" + (f": {why}" if why else "")
                             for name, status, points, why in run["exercises"])
            lines.append(f"    {d['notebook']}, --jobs {jobs}: "
                         f"{run['error'] or said or 'the same exercises'}")
    return lines
