"""What grading produces: `ExerciseResult` per test cell, `NotebookResult` per notebook (its
`to_dict` is the JSON report's record), and the two ways a notebook's grading ends without one:
`GradingError` (bad input, one readable line) and `GradingIncident` (something no notebook may do
happened; grading stops)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

PASSED, FAILED, NOT_STARTED, ERROR = "passed", "failed", "not started", "error"


class GradingError(Exception):
    """A notebook that cannot be graded at all (bad input). `str()` is one readable line."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class GradingIncident(Exception):
    """Files that no notebook may change changed, or a worker's processes outlived it, while
    `notebooks` were being graded. Grading stops: what came after cannot be trusted."""

    def __init__(self, notebooks: list[str], changed: list[str], what: str = "changed"):
        self.notebooks = list(notebooks)
        self.changed = list(changed)
        self.what = what
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5
                                          else "")
        where = notebooks[0] if notebooks else "a notebook"
        if len(notebooks) > 1:  # parallel grading: the others in progress (or just queued)
            where += f" (at the same time: {', '.join(notebooks[1:])})"
        super().__init__(f"while grading {where}: {what}: {shown}")


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


@dataclass
class NotebookResult:
    path: str
    chapter: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None  # what went wrong: cells skipped (a hang, a crash), an early stop
    seconds: float = 0.0
    student: str | None = None  # from nbgrader's submitted/<student>/<assignment>/ layout
    warnings: list[str] = field(default_factory=list)
    isolation: str = ""  # "namespaces" (walled in, own user) or "none" (see checks.grader.isolation)
    worker_uid: int | None = None  # the walled-in worker's user id (its processes: that user)
    grader_memory_mib: float = 0.0  # peak resident memory of the grading process so far
    # Cells that hung or crashed the worker: each skipped, the worker restarted, the cells before
    # it run again, the notebook went on. [{"cell": "answer cell head_dim", "why": "..."}]
    skipped: list[dict[str, str]] = field(default_factory=list)

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
                    grader_memory_mib=round(self.grader_memory_mib, 1))
        return data
