"""The grading library's options, with their defaults: the command line (`checks.grader.cli`)
maps its flags onto these (a field is named like its flag: `--max-size` is `max_size`), and a
program or a test grades with them directly through the library (`checks.grader.api`):

    from pathlib import Path
    from checks.grader.api import grade_folder
    from checks.grader.options import GradeOptions, OutputOptions
    run = grade_folder([Path("submitted")], GradeOptions(jobs=1),
                       OutputOptions(json=Path("grades.json")))

`GradeOptions` decides which notebooks are graded and how (the same for `status` and `grade`;
`status` has no caps); `OutputOptions` what `grade` writes
(checks.grader.outputs.writer.GradeOutputs)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path

from .grading import DEFAULT_CELL_TIMEOUT
from .identify import SOURCE_DIR
from .limits import Limits, cores
from .read import Caps

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
    max_size: int = Caps.max_bytes  # largest notebook file graded (checked before it is read)
    max_cells: int = Caps.max_cells  # most cells a notebook may have
    max_notebooks: int = Caps.max_notebooks  # most notebooks graded for one student
    # grade a student's one copy with work where their notebook at its place is the untouched
    # release (identify.find_submissions); without it the copy is refused and flagged
    use_copies: bool = False
    # the instructor's word for single files (--use-copy): the notebook that counts for its
    # student's chapter, relative to the submissions folder or absolute
    use_copy: list[Path] = field(default_factory=list)

    def caps(self) -> Caps:
        """The caps on what one submission may be (`identify.find_submissions`)."""
        return Caps(self.max_size, self.max_cells, self.max_notebooks)


@dataclass
class OutputOptions:
    json: Path | None = None  # the JSON report ("-": stdout), merged with its earlier results
    regrade: bool = False  # grade unchanged submissions again
    csv: Path | None = None  # the gradebook: a row per student, a column per chapter
    csv_exercises: Path | None = None  # a row per student, a column per exercise
    feedback: Path | None = None  # a folder of feedback pages, one per student and chapter
    report: Path | None = None  # the class report, one HTML page
    due: datetime | None = None  # the deadline: later submissions are marked late
    # {student: their own due time, for every assignment; (student, assignment): for one}
    extensions: dict | None = None
    # {chapter: Assignment}: each assignment's own due time and late penalty (outputs/late.py)
    assignments: dict | None = None
    roster: dict[str, dict[str, str]] | None = None  # {folder: id, name, login, section}
    source: Path = SOURCE_DIR  # (the library grades with GradeOptions.source's)
    # The instructor's language ("en", "zh"): the class summary, the class report and the
    # mistakes' messages in them. None: LLAMA_COURSE_LANG's, else English.
    lang: str | None = None


def from_namespace(kind: type, namespace) -> object:
    """`kind` (GradeOptions or OutputOptions) from argparse's namespace: each field that the
    namespace has, the default for the others."""
    return kind(**{f.name: getattr(namespace, f.name) for f in fields(kind)
                   if hasattr(namespace, f.name)})
