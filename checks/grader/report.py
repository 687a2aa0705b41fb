"""What the instructor sees: the progress line per graded notebook, the status and grade tables,
the incident report, one line per notebook that cannot be graded, and the class summary. The
files written (the JSON report, CSVs, feedback pages) are `checks.grader.outputs`'s.

The lines are in the current language (LLAMA_COURSE_LANG; checks.i18n). A column is padded by
the width a terminal gives its text (a Chinese character takes two columns), so that the tables
stay aligned in Chinese; the English lines are unchanged."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import unicodedata
from pathlib import Path

from ..i18n import N_, _
from .results import PASSED, GradingError, GradingIncident, NotebookResult, printable

PROG = "python -m checks"
HEARTBEAT = 30.0  # seconds without a notebook finishing before a "still grading" line
# The words shown for a status (results keep the English word: it is data).
_STATUS_WORD = {"passed": N_("passed"), "failed": N_("failed"), "not started": N_("not started"),
                "error": N_("error")}


def report_problem(problem: GradingError) -> None:
    """One line on stderr for a notebook that cannot be graded."""
    print(f"{PROG}: {problem}", file=sys.stderr, flush=True)


class Progress:
    """The progress lines on stderr: one per graded notebook with an estimate of the time left,
    and, while no notebook has finished for `HEARTBEAT` seconds, a line naming the notebooks
    still being graded (a slow or hanging cell), so that a quiet run is not mistaken for a dead
    one. `start` before grading, `stop` after."""

    def __init__(self, paths: list[Path], jobs: int, heartbeat: float = HEARTBEAT):
        self.paths, self.jobs, self.heartbeat = list(paths), max(1, jobs), heartbeat
        self.finished: set[Path] = set()
        self.started = self.last = time.monotonic()
        self._stop = threading.Event()
        # The terminal's stream, kept now: a one-job run grades in this process, where a test
        # cell's run swaps sys.stderr for its capture (any stderr fails a test, nbgrader's rule),
        # and this thread's line must never land there.
        self.stream = sys.stderr
        self._thread = threading.Thread(target=self._watch, name="progress", daemon=True)

    def start(self) -> "Progress":
        global _progress
        _progress = self
        self._thread.start()
        return self

    def stop(self) -> None:
        global _progress
        _progress = None
        self._stop.set()

    def finish(self, path: Path) -> str:
        """Note a finished notebook; the estimate of the time left ('' before one is known)."""
        self.finished.add(path)
        self.last = time.monotonic()
        done, left = len(self.finished), len(self.paths) - len(self.finished)
        if not left:
            return ""
        return _(", about {duration} left").format(
            duration=_duration((self.last - self.started) / done * left))

    def running(self) -> list[Path]:
        """The notebooks being graded now: the first `jobs` not finished (they start in order)."""
        return [p for p in self.paths if p not in self.finished][: self.jobs]

    def _watch(self) -> None:
        while not self._stop.wait(min(self.heartbeat, 5.0)):
            quiet = time.monotonic() - self.last
            if quiet >= self.heartbeat and self.running():
                names = ", ".join(shown_path(p) for p in self.running())
                print(_("… still grading {names} ({done} of {total} done): {duration} since the "
                        "last notebook finished (a slow cell, or one that will be stopped at its "
                        "time limit)").format(names=names, done=len(self.finished),
                                              total=len(self.paths), duration=_duration(quiet)),
                      file=self.stream, flush=True)
                self.last = time.monotonic()


_progress: Progress | None = None


def progress_line(done: int, total: int, path: Path, outcome) -> None:
    """One line on stderr per graded notebook (one that cannot be graded gets its error line)."""
    eta = _progress.finish(path) if _progress is not None else ""
    r = getattr(outcome, "result", None)  # a results.Graded
    if r is not None:
        print(f"[{done}/{total}] {shown_path(path)}: " + _(
            "{points}/{max_points} points ({seconds} s{eta})").format(
                points=pts(r.points), max_points=pts(r.max_points), seconds=f"{r.seconds:.1f}",
                eta=eta), file=sys.stderr, flush=True)


def shown_path(path) -> str:
    """A submission's path as it may be printed: a file name is the student's, and control
    characters in it (ESC, CR) could draw on the instructor's terminal."""
    return printable(os.fsdecode(path))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return _("{seconds} s").format(seconds=seconds)
    return _("{minutes} min {seconds} s").format(minutes=seconds // 60,
                                                 seconds=f"{seconds % 60:02d}")


def report_incident(incident: GradingIncident, graded: int, total: int) -> None:
    print(f"{PROG}: " + _("INCIDENT: {incident}").format(incident=incident), file=sys.stderr)
    print(f"{PROG}: " + _("grading stopped after {graded} of {total} notebooks; the notebooks "
                          "named above were being graded when it was found. Check them and the "
                          "files before grading again.").format(graded=graded, total=total),
          file=sys.stderr, flush=True)


def status_label(path: Path) -> str:
    """The chapter folder, plus the file name when it is not the chapter's own notebook."""
    chapter = path.parent.name
    return chapter if path.stem == chapter else f"{chapter}/{path.name}"


def status_header(width: int) -> str:
    """The status table's first line: chapter, passed, what is not passing yet."""
    chapter, passed = _("chapter"), _("passed")  # outside the f-string: Babel finds them
    return _fit(chapter, width) + _fit(passed, 8, right=True) + "   " + _("not passing yet")


def status_total(width: int, passed: int, total: int) -> str:
    """The status table's last line: the exercises passed of all."""
    return _fit(_("total"), width) + f"{f'{passed}/{total}':>8}"


def status_row(result: NotebookResult, width: int) -> str:
    todo = ", ".join(e.name for e in result.exercises if e.status != PASSED)
    if result.error:
        todo = f"{todo}  [{result.error}]" if todo else f"[{result.error}]"
    label = status_label(Path(result.path))
    return f"{label:<{width}}{f'{result.passed}/{len(result.exercises)}':>8}   {todo}".rstrip()


def grade_table(result: NotebookResult, late: str = "") -> str:
    """One notebook: a header line, one line per exercise, the notebook's error if any. Lines
    are cut at the terminal's width on a terminal only: redirected, every message is whole."""
    width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 0
    name_width = max([len(e.name) for e in result.exercises] + [8]) + 2
    student = "  [" + _("student {student}").format(student=result.student) + "]" \
        if result.student else ""
    student += f"  [{late.upper()}]" if late else ""
    lines = [f"{result.chapter}  {result.path}  " + _(
        "{points}/{max_points} points  ({seconds} s)").format(
            points=pts(result.points), max_points=pts(result.max_points),
            seconds=f"{result.seconds:.1f}") + student]
    for e in result.exercises:
        row = f"  {e.name:<{name_width}}{pts(e.points):>5}/{pts(e.max_points):<4} " \
              f"{_fit(status_word(e.status), 12)}{e.message}"
        lines.append(_clip(row.rstrip(), width))
    for warning in result.warnings:
        lines.append(_clip("  ! " + _("warning: {warning}").format(warning=warning), width))
    if result.error:
        lines.append(_clip(f"  ! {result.error}", width))
    if result.isolation == "none":
        lines.append(_clip("  ! " + _("the worker ran without walls (not root, or no "
                                      "namespaces): its code could read the course's files"),
                           width))
    elif result.isolation == "user":
        lines.append(_clip("  ! " + _("the worker ran as a user of its own without namespaces "
                                      "(no CAP_SYS_ADMIN): it could read what every user may "
                                      "read and reach the network"), width))
    return "\n".join(lines) + "\n"


def replay_text(exercise: dict) -> str:
    """How a student sees the failing case again, from an exercise's record: its check with the
    seed of the random inputs it failed on ("" when the failure had none)."""
    seed = exercise.get("seed")
    if seed is None or exercise.get("status") == "passed":
        return ""
    name = exercise["name"]
    return _("To see the same inputs again, run in your notebook: check_{name}({name}, "
             "seed={seed})").format(name=name, seed=seed)


def status_word(status: str) -> str:
    """A status as the reader reads it ("passed", "通过"); an unknown one as it is."""
    return _(_STATUS_WORD[status]) if status in _STATUS_WORD else status


def pts(value: float) -> str:
    return f"{value:g}"


def _fit(text: str, width: int, right: bool = False) -> str:
    """`text` padded with spaces to `width` terminal columns (a wide character counts two)."""
    shown = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    pad = " " * max(width - shown, 0)
    return pad + text if right else text + pad


def _clip(line: str, width: int) -> str:
    """`line` cut to `width` (0: not cut)."""
    return line if not width or len(line) <= width else line[:max(width - 1, 20)] + "…"
