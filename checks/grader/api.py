"""Grading as a library: what `python -m checks status` and `python -m checks grade` do, as
functions that a program (an instructor's script or notebook, a test, another tool) calls, in
the shape of otter-grader's API. The command line (`cli`) only parses its flags into the options
(`options.GradeOptions`, `options.OutputOptions`), calls one of these, and turns what it returns
into the exit status (`GradeRun.exit_status`).

    from pathlib import Path
    from checks.grader.api import grade_folder, grade_notebook
    from checks.grader.options import GradeOptions, OutputOptions

    run = grade_folder([Path("grading/submitted")], GradeOptions(jobs=4),
                       OutputOptions(json=Path("grades.json"), report=Path("class.html")))
    run.exit_status, run.records, run.summary            # 0, the JSON's notebooks and summary
    result = grade_notebook(Path("alice/01_notation/01_notation.ipynb"))   # a NotebookResult

- `grade_folder(paths, options, outputs, *, echo=True) -> GradeRun`: `checks grade`. The files of
  `outputs` (the JSON report, the gradebooks, the class report, the feedback pages) are written
  here, as each notebook finishes (`outputs.writer.GradeOutputs`), exactly as the command writes
  them.
- `grade_notebook(path, options) -> NotebookResult`: one notebook, graded in this process; no
  output is written. Raises `GradingError` (it cannot be graded, or was refused) and
  `GradingIncident`.
- `status(folder, options, *, echo=True) -> GradeRun`: `checks status`.

`echo` (the command's way): the tables, the progress lines, the notes and the class summary are
printed as the command prints them; with `echo=False` only the lines of notebooks that cannot be
graded and an incident's report are (on stderr). Bad input (a missing folder, an output that
cannot be written, no source notebooks) raises `GradingError` before anything is graded; Ctrl-C
and SIGTERM (`batch.Terminated`) end every process grading started and raise.

Every call makes this process the grader (as the command does): the variable that makes the
checks behave as under a grader is set (`GRADING_ENV`), and the process becomes undumpable, so
that a worker running as this user cannot read its memory.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Iterable

from ..environment import GRADING_ENV
from ..i18n import _, using
from . import grading
from .batch import grade_each, grading_plan, sigterm_as_interrupt
from .identify import SOURCE_DIR, find_submissions
from .isolation import make_undumpable
from .limits import cores
from .options import GradeOptions, OutputOptions
from .outputs.gradebook import counted
from .outputs.late import late_text, penalty_text
from .outputs.summary import summary_text
from .outputs.writer import GradeOutputs
from .read import chapter_notebooks
from .report import (PROG, Progress, grade_table, pts, report_incident, report_problem,
                     status_header, status_label, status_row, status_total)
from .results import GradeRun, GradingError, NotebookResult
from .visible import status_without_sources


def grade_folder(paths: str | os.PathLike | Iterable[str | os.PathLike],
                 options: GradeOptions | None = None, outputs: OutputOptions | None = None, *,
                 echo: bool = True) -> GradeRun:
    """Grade the notebooks under `paths` (notebooks, or folders searched for them: a class's
    `submitted/`, one student's folder), `options.jobs` at a time, and write the outputs that
    `outputs` names as each notebook finishes (with `outputs.json`, an earlier report is merged
    and its unchanged submissions are not graded again). `outputs.source` is `options.source`.
    `outputs.lang`: the instructor's language, of what is printed and of the class summary and
    report (each submission's diagnoses and feedback stay in its own language). What
    `python -m checks grade` does; see the module's docstring for `echo`."""
    options = options or GradeOptions()
    outputs = replace(outputs or OutputOptions(), source=options.source)
    paths = _paths(paths)
    _become_the_grader()
    with sigterm_as_interrupt(), using(outputs.lang):
        _require_sources(options.source)
        return _grade(paths, options, outputs, echo)


def grade_notebook(path: str | os.PathLike, options: GradeOptions | None = None
                   ) -> NotebookResult:
    """Grade one notebook in this process (its own walled-in worker, as always) and return its
    result, with its student and whether it counts as `grade_folder` gives them. Nothing is
    written or printed. Raises GradingError when it is refused (a link, past a cap) or cannot
    be graded, and GradingIncident when a file no notebook may change changed meanwhile."""
    options = options or GradeOptions()
    _become_the_grader()
    with sigterm_as_interrupt():
        _require_sources(options.source)
        found = find_submissions([Path(path)], options.caps(), options.source)
        if found.refused:
            raise found.refused[0]
        (notebook,) = found.paths
        plan = grading_plan(options, [Path(path)], threads=cores())
        result = grading.grade_notebook(notebook, source_dir=plan["source"],
                                        limits=plan["limits"], hide=plan["hide"])
        return found.adopt(result)


def status(folder: str | os.PathLike = "notebooks", options: GradeOptions | None = None, *,
           echo: bool = True) -> GradeRun:
    """A learner's progress: each chapter notebook of `folder` (`NN_slug/*.ipynb`) graded
    against the sources (where the course has none, a wheel's install, against the learner's
    own notebooks' visible checks). What `python -m checks status` does."""
    options = options or GradeOptions()
    folder = Path(folder)
    _become_the_grader()
    with sigterm_as_interrupt():
        if not Path(options.source).is_dir() and Path(options.source) == SOURCE_DIR:
            return status_without_sources(  # a wheel: no solutions/
                folder, options, lambda where, chosen: _status(where, chosen, echo))
        _require_sources(options.source)
        return _status(folder, options, echo)


# --------------------------------------------------------------------------------------------


def _paths(paths) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def _become_the_grader() -> None:
    os.environ[GRADING_ENV] = "1"  # checks behave as under a grader, here and in the workers
    make_undumpable()  # a worker running as this user cannot read this process's memory


def _require_sources(source: Path) -> None:
    if not Path(source).is_dir():
        raise GradingError(source, _("no such folder of source notebooks"))


def _status(folder: Path, options: GradeOptions, echo: bool) -> GradeRun:
    paths = chapter_notebooks(folder)
    width = max(len(status_label(p)) for p in paths) + 2
    if echo:
        print(status_header(width), flush=True)

    def show(result):  # each row is printed as soon as it is known
        if echo:
            print(status_row(result, width), flush=True)

    results, problems, incident = grade_each(paths, options, show, roots=[folder],
                                             progress=False)
    run = GradeRun(results, problems, incident=incident)
    if incident is not None:
        report_incident(incident, len(results) + len(problems), len(paths))
        return run
    if echo:
        passed = sum(r.passed for r in results)
        total = sum(len(r.exercises) for r in results)
        print(status_total(width, passed, total))
    return run


def output_paths(outputs: OutputOptions) -> list[Path]:
    """The files and folders the grader writes (not stdout): after each write they are watched
    like the course's files, so that a process a notebook started cannot change a classmate's
    feedback page or the gradebook while the run goes on."""
    chosen = [outputs.json, outputs.csv, outputs.csv_exercises, outputs.feedback, outputs.report]
    return [Path(p) for p in chosen if p is not None and str(p) != "-"]


def _grade(paths: list[Path], options: GradeOptions, outputs: OutputOptions,
           echo: bool) -> GradeRun:
    if outputs.feedback is not None:  # the feedback folder is out of the workers' reach too
        options = dataclasses.replace(options, hide=[*options.hide, Path(outputs.feedback)])
    # links, special files, caps, second notebooks (and copies): one line each, here
    found = find_submissions(paths, options.caps(), options.source, options.use_copies,
                             options.use_copy)
    # unwritable outputs are refused here, before grading
    writer = GradeOutputs(outputs, found.paths, [s.student for s in found.submissions
                                                 if s.student])
    for refusal in found.refused:
        report_problem(refusal)
    todo = writer.to_grade(found.paths)
    if writer.kept:
        if echo:
            print(f"{PROG}: " + _("{kept} of {count} notebooks unchanged since they were graded: "
                                  "their results in {json} are kept (--regrade grades them "
                                  "again)").format(kept=len(writer.kept), count=len(found.paths),
                                                   json=outputs.json),
                  file=sys.stderr, flush=True)
    writer.write_kept_feedback()  # and those of notebooks not given, with this run's deadlines
    if writer.regraded and echo:
        print(f"{PROG}: " + _("{count} unchanged notebooks graded again: the course's checks or "
                              "their chapter's source notebook changed since their results in "
                              "{json}").format(count=len(writer.regraded), json=outputs.json),
              file=sys.stderr, flush=True)
    to_stdout = outputs.json == Path("-")

    def save(result):  # as each notebook finishes, in the order they finish: nothing is lost
        found.adopt(result)  # its student, and whether it counts, before any output sees it
        writer.add(result)  # every output brought up to date

    def show(result):  # in the order given
        if echo and not to_stdout:
            record = writer.record_of(result)
            late = ", ".join(t for t in (late_text(record), penalty_text(record)) if t)
            print(grade_table(result, late), flush=True)

    progress = Progress(todo, options.jobs).start() if echo else None
    try:
        results, problems, incident = (
            grade_each(todo, options, show, roots=paths, progress=echo, on_result=save,
                       outputs=output_paths(outputs))
            if todo else ([], [], None))
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: every process is ended; the notebooks
        writer.write_interrupted(found.refused)  # finished keep every output, the report too
        raise
    finally:
        if progress is not None:
            progress.stop()
    writer.write(found.refused + problems, incident)
    run = GradeRun(results, problems, found.refused, incident, kept=writer.kept,
                   records=writer.all_records(), summary=writer.summary())
    records = counted(run.records)
    if echo and not to_stdout and incident is None and len(records) > 1:
        print(_("total: {points}/{max_points} points in {count} notebooks").format(
            points=pts(sum(r["points"] for r in records)),
            max_points=pts(sum(r["max_points"] for r in records)), count=len(records)))
        print(summary_text(run.summary, records), end="")
    if incident is not None:
        report_incident(incident, len(results) + len(problems), len(todo))
    return run
