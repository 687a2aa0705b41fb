"""Section `grading`: the wall time of `python -m checks grade` on one complete submission (a copy
of the thirteen solution notebooks), timed from the outside; also what sections `load` and
`class` use to grade."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import LOADED_LIMIT, REPO, cpu_hogs, solution_notebooks


def copy_submission(paths: list[Path], folder: Path) -> None:
    """One complete submission: each solution notebook in its chapter's folder under `folder`."""
    for path in paths:
        (folder / path.parent.name).mkdir(parents=True)
        shutil.copy2(path, folder / path.parent.name / path.name)


def grade_timed(folder: Path, out: Path, *options: str) -> dict:
    """`python -m checks grade [options] folder`, timed from the outside (interpreter start-up
    included); its JSON report is read back."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "checks", "grade", *options, "--json", str(out),
                           str(folder)], capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    grades = json.loads(out.read_text()) if out.exists() else {}
    return {"seconds": seconds, "returncode": done.returncode,
            "points": grades.get("points"), "max_points": grades.get("max_points"),
            "graded": len(grades.get("notebooks", [])), "grades": grades.get("notebooks", []),
            "stderr_tail": done.stderr[-2000:] if done.returncode else ""}


def run_grading(chapters, say, *, hogs: int = 0) -> dict:
    """`python -m checks grade` on a copy of the solution notebooks (one complete submission),
    with `hogs` CPU hogs alongside."""
    paths = solution_notebooks(chapters)
    say(f"grading {len(paths)} notebooks with python -m checks grade"
        + (f", {hogs} CPU hogs alongside" if hogs else ""))
    with tempfile.TemporaryDirectory(prefix="checks-benchmark-") as tmp:
        submission = Path(tmp) / "submission"
        copy_submission(paths, submission)
        with cpu_hogs(hogs, LOADED_LIMIT) as load:
            graded = grade_timed(submission, Path(tmp) / "grades.json")
    grades = graded.pop("grades")
    return {"notebooks": len(paths), **graded, "hogs": hogs,
            "hog_cpu_seconds": load["cpu_seconds"],
            "per_notebook_seconds": {Path(n["path"]).parent.name: n["seconds"] for n in grades}}


def points(run: dict) -> str:
    """A grading run's points and exit status, and the first line it wrote to stderr if it
    failed."""
    said = ""
    if run["returncode"]:
        lines = [line for line in run["stderr_tail"].splitlines()
                 if line.strip() and not line.startswith("[")]       # not a progress line
        said = f": {lines[-1][:160]}" if lines else ""
    if run["points"] is None:
        return f"no result (exit status {run['returncode']}{said})"
    return f"{run['points']:g}/{run['max_points']:g} points, exit status {run['returncode']}{said}"


def format_grading(result: dict) -> list[str]:
    """Table (e), one submission's grading."""
    g = result.get("grading")
    if not g:
        return []
    pts = (f"{g['points']:g}/{g['max_points']:g} points" if g["points"] is not None
           else "no result")
    lines = ["", f"(e) python -m checks grade, one complete submission ({g['notebooks']} "
                 f"solution notebooks): {g['seconds']:.1f} s wall, {pts}, exit status "
                 f"{g['returncode']}"]
    if g["per_notebook_seconds"]:
        lines.append("    per notebook: " + ", ".join(
            f"{name[:2]} {s:.1f}" for name, s in g["per_notebook_seconds"].items()))
    return lines
