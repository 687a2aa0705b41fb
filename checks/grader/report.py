"""What the instructor sees: the progress line per graded notebook, the status and grade tables,
the incident report, one line per notebook that cannot be graded, and the JSON report. Results
are shown here and nowhere else, so that another output (a CSV, feedback files) is one more
function beside these."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .grading import peak_memory_mib
from .results import PASSED, GradingError, GradingIncident, NotebookResult

PROG = "python -m checks"


def report_problem(problem: GradingError) -> None:
    """One line on stderr for a notebook that cannot be graded."""
    print(f"{PROG}: {problem}", file=sys.stderr, flush=True)


def progress_line(done: int, total: int, path: Path, outcome: tuple) -> None:
    """One line on stderr per graded notebook (one that cannot be graded gets its error line)."""
    if outcome[0] == "result":
        r = outcome[1]
        print(f"[{done}/{total}] {path}: {pts(r.points)}/{pts(r.max_points)} points "
              f"({r.seconds:.1f} s)", file=sys.stderr, flush=True)


def report_incident(incident: GradingIncident, graded: int, total: int) -> None:
    print(f"{PROG}: INCIDENT: {incident}", file=sys.stderr)
    print(f"{PROG}: grading stopped after {graded} of {total} notebooks; the notebooks named "
          "above were being graded when it was found. Check them and the files before grading "
          "again.", file=sys.stderr, flush=True)


def status_label(path: Path) -> str:
    """The chapter folder, plus the file name when it is not the chapter's own notebook."""
    chapter = path.parent.name
    return chapter if path.stem == chapter else f"{chapter}/{path.name}"


def status_row(result: NotebookResult, width: int) -> str:
    todo = ", ".join(e.name for e in result.exercises if e.status != PASSED)
    if result.error:
        todo = f"{todo}  [{result.error}]" if todo else f"[{result.error}]"
    label = status_label(Path(result.path))
    return f"{label:<{width}}{f'{result.passed}/{len(result.exercises)}':>8}   {todo}".rstrip()


def grade_table(result: NotebookResult) -> str:
    """One notebook: a header line, one line per exercise, the notebook's error if any."""
    width = shutil.get_terminal_size((100, 24)).columns
    name_width = max([len(e.name) for e in result.exercises] + [8]) + 2
    student = f"  [student {result.student}]" if result.student else ""
    lines = [f"{result.chapter}  {result.path}  {pts(result.points)}/{pts(result.max_points)}"
             f" points  ({result.seconds:.1f} s){student}"]
    for e in result.exercises:
        row = f"  {e.name:<{name_width}}{pts(e.points):>5}/{pts(e.max_points):<4} " \
              f"{e.status:<12}{e.message}"
        lines.append(_clip(row.rstrip(), width))
    for warning in result.warnings:
        lines.append(_clip(f"  ! warning: {warning}", width))
    if result.error:
        lines.append(_clip(f"  ! {result.error}", width))
    if result.isolation == "none":
        lines.append(_clip("  ! the worker ran without walls (not root, or no namespaces): its "
                           "code could read the course's files", width))
    return "\n".join(lines) + "\n"


def write_json(target: Path, results: list[NotebookResult], problems: list[GradingError],
                incident: GradingIncident | None = None):
    data = {
        "points": sum(r.points for r in results),
        "max_points": sum(r.max_points for r in results),
        "notebooks": [r.to_dict() for r in results],
        "errors": [{"path": p.path, "error": p.problem} for p in problems],
        "grader_memory_mib": round(max([peak_memory_mib()]
                                        + [r.grader_memory_mib for r in results]), 1),
    }
    if incident is not None:
        data["incident"] = {"what": incident.what, "files": incident.changed,
                            "notebooks": incident.notebooks}
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if target == Path("-"):
        sys.stdout.write(text)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def pts(value: float) -> str:
    return f"{value:g}"


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[:max(width - 1, 20)] + "…"
