"""The grading library's options, with their defaults: the command line (`checks.grader.cli`)
maps its flags onto these, and a program or a test grades with them directly:

    from checks.grader.options import GradeOptions, OutputOptions
    from checks.grader.batch import grade_each
    results, problems, incident = grade_each(paths, GradeOptions(jobs=1), show=print)

`GradeOptions` decides how notebooks are graded (the same for `status` and `grade`);
`OutputOptions` what `grade` writes (checks.grader.outputs.writer.GradeOutputs)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path

from .grading import DEFAULT_CELL_TIMEOUT
from .identify import SOURCE_DIR
from .limits import Limits, cores

_LIMITS = Limits()


@dataclass
class GradeOptions:
    timeout: float = DEFAULT_CELL_TIMEOUT  # seconds per cell
    notebook_timeout: float = _LIMITS.notebook_time  # seconds per notebook, 0: none
    memory: int = _LIMITS.memory  # bytes a worker may hold resident, 0: no limit
    memory_by: str = _LIMITS.memory_by  # "auto", "cgroup" or "rss"
    jobs: int = field(default_factory=cores)  # notebooks graded at once
    hide: list[Path] = field(default_factory=list)  # more folders the workers must not see
    cpu_time: int = _LIMITS.cpu  # CPU seconds per notebook, 0: no limit
    max_output: int = _LIMITS.output  # largest file a notebook may write
    source: Path = SOURCE_DIR  # the chapters' source notebooks


@dataclass
class OutputOptions:
    json: Path | None = None  # the JSON report ("-": stdout), merged with its earlier results
    regrade: bool = False  # grade unchanged submissions again
    csv: Path | None = None  # the gradebook: a row per student, a column per chapter
    csv_exercises: Path | None = None  # a row per student, a column per exercise
    feedback: Path | None = None  # a folder of feedback pages, one per student and chapter
    report: Path | None = None  # the class report, one HTML page
    due: datetime | None = None  # the deadline: later submissions are marked late
    extensions: dict[str, datetime] | None = None  # {student: their own due time}
    roster: dict[str, dict[str, str]] | None = None  # {folder: id, name, login, section}
    source: Path = SOURCE_DIR


def from_namespace(kind: type, namespace) -> object:
    """`kind` (GradeOptions or OutputOptions) from argparse's namespace: each field that the
    namespace has, the default for the others."""
    return kind(**{f.name: getattr(namespace, f.name) for f in fields(kind)
                   if hasattr(namespace, f.name)})
