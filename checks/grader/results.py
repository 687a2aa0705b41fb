"""What grading produces: `Verdict` per failed test cell (from the run stage to the score
stage), `ExerciseResult` per test cell, `NotebookResult` per notebook (its `to_dict` is the JSON
report's record), and the two ways a notebook's grading ends without one:
`GradingError` (bad input, one readable line) and `GradingIncident` (something no notebook may do
happened; grading stops)."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..i18n import N_, _
from ..mistakes import ID_PATTERN

PASSED, FAILED, NOT_STARTED, ERROR = "passed", "failed", "not started", "error"

CHAPTER_NAME = re.compile(r"\d\d_[A-Za-z0-9_]+")


def printable(text: object) -> str:
    """`text` safe to print and to write as JSON: every character a terminal would act on (ESC,
    CR, other controls, bidirectional overrides) shown escaped (\\x1b, \\r, \\u202e), and each
    byte of a file name that is not UTF-8 (Python's surrogate escapes) shown as \\xNN. Names and
    messages from submissions pass through here before anything shows or stores them, so a file
    name cannot draw a forged line on the instructor's terminal nor break the JSON report."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if ch in "\t\n\r":
        return repr(ch)[1:-1]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 \
        else f"\\U{code:08x}"


class GradingError(Exception):
    """A notebook that cannot be graded at all (bad input). `str()` is one readable line."""

    def __init__(self, path: str | os.PathLike, problem: str, student: str | None = None):
        self.path = printable(os.fsdecode(path))
        self.problem = printable(problem)
        # whose file it is (their folder's name), where known: the class report's student view
        self.student = None if student is None else printable(student)
        super().__init__(f"{self.path}: {self.problem}")


class Refused(GradingError):
    """A file that is not graded because of what it is, not what it holds: a link, a special
    file, a second notebook for one student's chapter, or one past a cap (size, cells, count)."""


class WorkerCannotStart(Exception):
    """The notebook's first worker did not start, before any of its code ran: the grader's
    environment is at fault (the worker's Python cannot import torch or checks, the walls
    cannot be built), never the submission. Grading turns it into a GradingError: no score,
    the notebook listed among the problems (exit status 2), graded when run again."""


# What a GradingIncident says happened (English, marked: translated when shown)
CHANGED = N_("changed")
OUTLIVED = N_("processes of the worker outlived it")


class GradingIncident(Exception):
    """Files that no notebook may change changed, or a worker's processes outlived it, while
    `notebooks` were being graded. Grading stops: what came after cannot be trusted."""

    def __init__(self, notebooks: list[str], changed: list[str], what: str = CHANGED):
        self.notebooks = [printable(n) for n in notebooks]
        self.changed = [printable(c) for c in changed]
        self.what = printable(what)  # English (a marked constant): translated when shown
        super().__init__(self.notebooks, self.changed, self.what)

    def __str__(self) -> str:
        """One line in the language of the moment it is printed (the instructor's terminal),
        not of the submission being graded when it happened."""
        changed = self.changed
        shown = ", ".join(changed[:5]) + (_(" and {count} more").format(count=len(changed) - 5)
                                          if len(changed) > 5 else "")
        where = self.notebooks[0] if self.notebooks else _("a notebook")
        if len(self.notebooks) > 1:  # parallel grading: the others in progress (or just queued)
            where += _(" (at the same time: {others})").format(others=", ".join(self.notebooks[1:]))
        return _("while grading {where}: {what}: {changed}").format(where=where, what=_(self.what),
                                                                     changed=shown)



@dataclass(frozen=True)
class Verdict:
    """The grader's verdict on a test cell that failed, taken from the failure where it was
    raised in the grading process (`score.verdict_of`): the stage that runs the cell (`run`)
    returns it beside the notebook, by cell index, and the stage that scores (`score`) is handed
    it; nothing of it travels in the notebook. `mistake`: the diagnosed mistake's id
    ("04.attention_scores.missing_scale"), None when none was recognised; `seed`: the seed that
    replays the failing case, None when it had no random inputs; `message`: the diagnosis as the
    report shows it, None when the failure was not a check's (the error is classified instead)."""

    mistake: str | None = None
    seed: int | None = None
    message: str | None = None


@dataclass
class ExerciseResult:
    name: str
    points: float
    max_points: float
    status: str  # PASSED, FAILED, NOT_STARTED or ERROR
    message: str = ""
    # The notebook's own run of the test passed and the grader's failed: the notebook changed
    # something the test relies on (a checker, a comparison, the test itself).
    tampering_suspected: bool = False
    # The diagnosed mistake's id ("04.attention_scores.missing_scale", checks.mistakes), None
    # when the exercise passed or no declared mistake was recognised; the seed that replays the
    # failing case (`check_<name>(f, seed=...)`), None when the failure had no random inputs.
    mistake: str | None = None
    seed: int | None = None

    def __post_init__(self):  # a learner's exception message reaches the terminal: escaped
        self.name, self.message = printable(self.name), printable(self.message)
        if self.mistake is not None and not ID_PATTERN.match(str(self.mistake)):
            self.mistake = None  # the grader makes ids; anything else is not one
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            self.seed = None


@dataclass
class NotebookResult:
    path: str
    chapter: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None  # what went wrong: cells skipped (a hang, a crash), an early stop
    seconds: float = 0.0
    student: str | None = None  # the first folder under the root graded (identify.student_of)
    warnings: list[str] = field(default_factory=list)
    # "namespaces" (walled in, own user) or "none" (see checks.grader.isolation)
    isolation: str = ""
    worker_uid: int | None = None  # the walled-in worker's user id (its processes: that user)
    grader_memory_mib: float = 0.0  # peak resident memory of the grading process so far
    # Cells that hung or crashed the worker: each skipped, the worker restarted, the cells before
    # it run again, the notebook went on. [{"cell": "answer cell head_dim", "why": "..."}]
    skipped: list[dict[str, str]] = field(default_factory=list)
    # Why this notebook is kept out of the totals (and the CSV): it was graded as another chapter
    # than its file or folder name says. None: it counts.
    not_counted: str | None = None
    # The submission's language (its metadata.course.lang, checks.i18n.notebook_language): the
    # language of its diagnoses and of its feedback page.
    lang: str = "en"
    # The other notebooks of this student's chapter, not graded (identify.find_submissions):
    # [{"path": ..., "has_work": bool}]; work beside an untouched notebook is flagged.
    copies: list[dict] = field(default_factory=list)
    # The instructor's word that chose this notebook over the one at the standard place
    # ("--use-copy" or "--use-copies"); None: the standard one was graded.
    chosen: str | None = None

    def __post_init__(self):  # names from the disk and messages from the worker: escaped
        self.path, self.chapter = printable(self.path), printable(self.chapter)
        self.student = None if self.student is None else printable(self.student)
        self.error = None if self.error is None else printable(self.error)
        self.warnings = [printable(w) for w in self.warnings]
        self.skipped = [{printable(k): printable(v) for k, v in s.items()} for s in self.skipped]
        if self.not_counted is not None:
            self.not_counted = printable(self.not_counted)

    @property
    def counted(self) -> bool:
        """Whether its points count towards totals (see `not_counted`)."""
        return self.not_counted is None

    @property
    def points(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        return sum(e.max_points for e in self.exercises)

    @property
    def passed(self) -> int:
        return sum(e.status == PASSED for e in self.exercises)

    @property
    def tampering_suspected(self) -> list[str]:
        return [e.name for e in self.exercises if e.tampering_suspected]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(points=self.points, max_points=self.max_points, passed=self.passed,
                    seconds=round(self.seconds, 2), tampering_suspected=self.tampering_suspected,
                    counted=self.counted,
                    grader_memory_mib=round(self.grader_memory_mib, 1))
        return data


# --------------------------------------------------------------------------------------------
# What grading one notebook gave: exactly one of these (they cross from a grading process of
# --jobs to the grader, so plain dataclasses).


@dataclass(frozen=True)
class Graded:
    """The notebook was graded."""

    result: NotebookResult


@dataclass(frozen=True)
class NotGraded:
    """The notebook could not be graded: why, in one line."""

    problem: str


@dataclass(frozen=True)
class Incident:
    """Something no notebook may do happened while grading (a course file changed, a process
    outlived its worker): grading stops."""

    notebooks: list[str]
    changed: list[str]
    what: str

    def with_running(self, running) -> GradingIncident:
        """The incident, naming also the notebooks being graded at the time."""
        return GradingIncident([*self.notebooks, *map(str, running)], self.changed, self.what)


Outcome = Graded | NotGraded | Incident


# --------------------------------------------------------------------------------------------
# What grading many notebooks gave (`checks.grader.api`): the library's answer, from which the
# command line takes its exit status.


@dataclass
class GradeRun:
    """One run of `api.grade_folder` (or `api.status`): the notebooks graded now, those that
    could not be, why grading stopped if it did, and (grade) the report's records and class
    summary as the outputs were written from them."""

    # graded now, in the order given; those that could not be (one line each)
    results: list[NotebookResult] = field(default_factory=list)
    problems: list[GradingError] = field(default_factory=list)
    # refused before grading: links, special files, past the caps, a student's second notebook
    refused: list[GradingError] = field(default_factory=list)
    # grading stopped: something no notebook may do happened
    incident: GradingIncident | None = None
    # the records of an earlier report (--json) kept: their files are unchanged since
    kept: list[dict] = field(default_factory=list)
    # every record of the report (the JSON's `notebooks`), and the class summary of those
    # counted (the JSON's `summary`), as the outputs were written from them
    records: list[dict] = field(default_factory=list)
    summary: list[dict] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """`python -m checks`'s: 3 when grading stopped on an incident, 2 when a notebook could
        not be graded, was refused or does not count, else 0."""
        if self.incident is not None:
            return 3
        if self.problems or self.refused or not all(r.counted for r in self.results):
            return 2
        return 0
