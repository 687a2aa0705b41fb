"""Grade a notebook the way nbgrader's autograde does, without a gradebook database, in a way the
submission cannot tamper with: `grade_notebook` runs the pipeline's stages in order, like
nbgrader's preprocessors.

1. `read.read_notebook`: the submitted file, or `GradingError` with one readable line.
2. `identify.identify_chapter`: which chapter (metadata, answer cells, name); its source notebook.
3. `build.build_graded_notebook`: the submission's code cells + the source's test cells.
4. `run.execute_notebook`: its cells in a walled-in worker (time, memory and output limits; a dead
   worker is survived); each test decided here, on the worker's functions.
5. `score.score_notebook`: nbgrader's rule for each test cell -> `ExerciseResult`s, handed what
   the run returned beside the notebook (each failed test's `Verdict`, the cells skipped).

Around them, `tripwire.Tripwire`: the course's code, the sources and the submissions, hashed before
and compared after each notebook; a change is a `GradingIncident` that stops the run.

Nothing is ever written to the submitted file or its folder: the worker runs in a temporary working
directory that is removed afterwards.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from ..i18n import _, notebook_language, using
from .build import build_graded_notebook
from .identify import SOURCE_DIR, identify_chapter, name_warnings, source_notebook_path, student_of
from .isolation import python_startup_files
from .limits import Limits
from .read import read_notebook
from .results import GradingError, GradingIncident, NotebookResult, WorkerCannotStart
from .run import Execution, execute_notebook
from .score import score_notebook
from .tripwire import Tripwire, course_files, short_path

DEFAULT_CELL_TIMEOUT = 120.0  # seconds per cell, as nbgrader_config.py (c.Execute.timeout)


def grade_notebook(path: str | os.PathLike, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT,
                   source_dir: str | os.PathLike = SOURCE_DIR, limits: Limits | None = None,
                   protect: list[Path] | tuple = (), hide: list | tuple | None = None,
                   tripwire: Tripwire | None = None) -> NotebookResult:
    """Grade one submitted notebook. Raises GradingError when it cannot be graded at all (bad
    input, or a worker that does not start before any of its code ran), and
    GradingIncident when a file no notebook may change changed while it was graded.

    Each test cell of the chapter's source notebook becomes one exercise result (in source
    order). A cell that hangs or crashes the worker costs only itself and the exercises whose
    code needs it (`run.execute_notebook`); `NotebookResult.error` says what happened. `limits`
    overrides `cell_timeout`. `hide`: folders the worker must not see (default: the notebook's
    folder and those of `protect`; the course and the sources are always hidden). `tripwire`
    (default: the course's code, the sources, this notebook and `protect`) is checked after the
    notebook.
    """
    started = time.monotonic()
    limits = limits or Limits(cell_timeout=cell_timeout)
    submission = read_notebook(path)
    chapter = identify_chapter(submission, path, source_dir)
    source = read_notebook(source_notebook_path(chapter, source_dir))
    nb = build_graded_notebook(submission, source)
    if tripwire is None:
        tripwire = Tripwire([*course_files(source_dir), *python_startup_files(), path,
                             *protect])
    if hide is None:
        hide = [Path(p).resolve().parent for p in (path, *protect)]
    hide = [*hide, Path(source_dir).resolve()]
    # The diagnoses in the submission's language (the Chinese release says so in its metadata);
    # LLAMA_COURSE_LANG, when set, still decides. Points never depend on it.
    lang = notebook_language(submission)
    try:
        with using(lang):
            run = _run_in_scratch(path, nb, source, limits, chapter, source_dir, hide)
            exercises = score_notebook(nb, source, run.completed, verdicts=run.verdicts,
                                       skipped=run.skipped_cells, tampered=run.tampered)
    except WorkerCannotStart as failure:  # said to the instructor, in the terminal's language
        raise GradingError(path, _("not graded: {why}; the grader's environment is at fault, "
                                   "not the submission: fix it and grade again").format(
            why=failure)) from None
    changed = tripwire.changed()
    if changed:
        raise GradingIncident([str(path)], [short_path(p) for p in changed])
    return NotebookResult(str(path), chapter, exercises,
                          run.error, time.monotonic() - started, student=student_of(path),
                          warnings=name_warnings(path, chapter, source_dir),
                          isolation=run.isolation, worker_uid=run.worker_uid,
                          grader_memory_mib=peak_memory_mib(),
                          skipped=[{"cell": cell, "why": why} for cell, why in run.skipped.items()],
                          lang=lang)


def _run_in_scratch(path, nb, source, limits: Limits, chapter: str, source_dir, hide
                    ) -> Execution:
    """Stage 4 in a temporary working folder; an incident names the notebook."""
    with tempfile.TemporaryDirectory(prefix="checks-grade-", ignore_cleanup_errors=True) as tmp:
        try:
            return execute_notebook(nb, source, limits=limits, workdir=tmp, chapter=chapter,
                                    source_dir=source_dir, hide=hide)
        except GradingIncident as incident:
            raise GradingIncident([str(path)], incident.changed, incident.what) from None


def peak_memory_mib() -> float:
    """This process's peak resident memory. Linux's VmHWM belongs to the process image, so it
    starts afresh at exec; `ru_maxrss` does not (getrusage(2): usage is preserved across execve),
    and a grader started from a big process (a test runner holding models) would report that
    process's peak instead of its own."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource  # POSIX only, and needed only where /proc is missing

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
