"""`GradeOutputs`: every file `checks grade` writes (--json, --csv, --csv-exercises, --report,
--feedback), checked before grading starts and brought up to date after each notebook, so that
an interrupted run keeps every result it finished. With --json, the report of an earlier run is
merged: its records stay, those graded again are replaced, and a submission whose file has not
changed since it was graded is not graded again (unless --regrade)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..grading import peak_memory_mib
from ...i18n import _
from ..identify import SOURCE_DIR
from ..results import GradingError, GradingIncident, NotebookResult
from ..options import OutputOptions
from .class_report import class_report_html
from .feedback import folder_names, write_feedback, write_index
from .gradebook import counted, exercises_csv, gradebook_csv, student_label
from .late import Deadlines, apply_deadlines, lateness, not_a_chapter, refresh_lateness
from .store import (atomic_write, check_writable_file, check_writable_folder, file_hash,
                    grader_fingerprint, load_records, record_key, unchanged)
from .summary import class_summary


@dataclass(frozen=True)
class FileOutput:
    """One output file made from all the records, rewritten whole (atomically) after each
    notebook: `option` names its OutputOptions field, `what` names it in a refusal."""

    option: str
    what: str
    render: Callable[[list[dict]], str]
    as_each_finishes: bool = True  # else only once grading ends (drawing charts takes a while)
    with_roster: bool = False  # render(records, roster=...): the --roster table as well
    with_lang: bool = False  # render(records, lang=...): in the instructor's language (--lang)
    with_problems: bool = False  # render(records, problems=...): the files refused, not graded


# Every output that is one file made from the records, in the order they are written. The JSON
# report (merged with an earlier run's, or on stdout) and the feedback pages (one per record)
# are written by GradeOutputs itself.
FILE_OUTPUTS = (
    FileOutput("csv", "CSV", gradebook_csv, with_roster=True),
    FileOutput("csv_exercises", "CSV", exercises_csv),
    FileOutput("report", "HTML", class_report_html, as_each_finishes=False, with_roster=True,
               with_lang=True, with_problems=True),
)


class GradeOutputs:
    def __init__(self, options: OutputOptions, paths: list[Path], students=()):
        """`students`: the names of the students whose notebooks are given (their feedback
        folders are named knowing every name, `feedback.folder_names`)."""
        self.options = options
        self.json = options.json
        self.feedback = options.feedback
        self.due = options.due
        self.extensions = options.extensions  # {student or (student, assignment): due}
        self.assignments = options.assignments  # {chapter: late.Assignment}
        self.deadlines = Deadlines(self.due, self.extensions or {}, self.assignments or {})
        self.roster = options.roster  # {folder: id, name, login, section}
        self.regrade = options.regrade
        self.lang = options.lang  # the instructor's language (None: LLAMA_COURSE_LANG, English)
        self.source = Path(options.source or SOURCE_DIR).resolve()
        self.regraded: list[Path] = []  # unchanged submissions graded again: the grader changed
        self._check_assignments()
        self._refuse_overwriting_inputs(paths)
        self._check_writable()
        self.records: dict[str, dict] = load_records(self.json) if self._merging else {}
        for record in self.records.values():  # every record: this run's deadlines
            apply_deadlines(record, self.deadlines)
        self.kept: list[dict] = []
        # The report's order: the earlier report's, then this run's in the order given (results
        # arrive in the order they finish)
        self._order = [*self.records, *(record_key(p) for p in paths)]
        self._given = {record_key(p) for p in paths}
        self._students = [*(self.roster or {}), *students]
        self.folders: dict[str, str] = {}
        self._name_folders()

    def _name_folders(self) -> None:
        """Each student's feedback folder, knowing every student so far (`folder_names`)."""
        names = [*self._students, *(student_label(r) for r in self.records.values())]
        if set(names) - set(self.folders):
            self.folders = folder_names(names)

    @property
    def _merging(self) -> bool:
        return self.json is not None and self.json != Path("-")

    def _files(self) -> list[tuple[Path, str]]:
        files = [(self.json, "JSON")] + [(getattr(self.options, out.option), out.what)
                                         for out in FILE_OUTPUTS]
        return [(path, what) for path, what in files if path is not None and path != Path("-")]

    def _check_assignments(self) -> None:
        """An assignment of --assignments or --extensions that is no chapter: one line."""
        for option, names in (("--assignments", list(self.assignments or {})),
                              ("--extensions", [k[1] for k in self.extensions or {}
                                                if isinstance(k, tuple)])):
            problem = not_a_chapter(names, self.source)
            if problem:
                raise GradingError(option, problem)

    def _refuse_overwriting_inputs(self, paths: list[Path]) -> None:
        inputs = {p.resolve() for p in paths}
        for path, what in self._files():
            if path.resolve() in inputs:
                raise GradingError(path, _("the {what} output would overwrite a notebook being "
                                           "graded").format(what=what))

    def _check_writable(self) -> None:
        for path, what in self._files():
            check_writable_file(path, what)
        if self.feedback is not None:
            check_writable_folder(self.feedback, _("feedback"))

    def to_grade(self, paths: list[Path]) -> list[Path]:
        """The submissions to grade now: all, or (merging) those new or changed since the
        report's records of them; the others' records are kept (`self.kept`)."""
        if not self._merging or self.regrade:
            return list(paths)
        todo = []
        for path in paths:
            record, grader_changed = unchanged(path, self.records, self.fingerprint)
            if record is None:
                todo.append(path)
                if grader_changed:
                    self.regraded.append(path)
            else:  # kept, with its lateness for this run's --due and --extensions
                self.kept.append(refresh_lateness(record, self.due, self.extensions,
                                                  self.assignments))
        return todo

    def fingerprint(self, chapter: str) -> str:
        return grader_fingerprint(self.source, chapter)

    def record(self, result: NotebookResult) -> dict:
        """The JSON record of a result: its fields, the submission's hash, its lateness."""
        data = result.to_dict()
        path = Path(result.path)
        data["sha256"] = file_hash(path) if path.is_file() else None
        data["grader"] = self.fingerprint(result.chapter)
        data.update(lateness(path, self.due, result.student, self.extensions, result.chapter,
                             self.assignments))
        if data.get("late_warning"):
            data["warnings"] = [*data["warnings"], data.pop("late_warning")]
        return apply_deadlines(data, self.deadlines)

    def add(self, result: NotebookResult) -> dict:
        """One notebook finished: into the records, and every output rewritten (atomically)."""
        earlier = self.records.get(record_key(result.path))
        if result.student is None and earlier is not None and earlier.get("student"):
            # The same file graded alone (its folder or itself given): still that student's
            result.student = earlier["student"]
        record = self.record(result)
        self.records[record_key(result.path)] = record
        self._name_folders()
        if self.feedback is not None:
            write_feedback(self.feedback, record, self.folders)
        self.write(final=False)
        return record

    def record_of(self, result: NotebookResult) -> dict:
        return self.records[record_key(result.path)]

    def all_records(self) -> list[dict]:
        order = {key: i for i, key in reversed(list(enumerate(self._order)))}
        return sorted(self.records.values(),
                      key=lambda r: order.get(record_key(r["path"]), len(order)))

    def summary(self) -> list[dict]:
        return class_summary(self.all_records(), self.lang)

    def write(self, problems: list[GradingError] = (), incident: GradingIncident | None = None,
              *, final: bool = True, every_output: bool = False) -> None:
        """Every output from the records so far. `final`: grading ended (the JSON says it is
        complete); before that, the outputs that take a while (the class report's charts) only
        with `every_output`."""
        records = self.all_records()
        if self.json is not None and (final or self._merging):
            text = json.dumps(report_data(records, problems, incident, complete=final,
                                          lang=self.lang), indent=2, ensure_ascii=False) + "\n"
            if self.json == Path("-"):
                sys.stdout.write(text)
            else:
                atomic_write(self.json, text)
        if self.feedback is not None:
            write_index(self.feedback, records, self.folders, self.roster)
        for output in FILE_OUTPUTS:
            target = getattr(self.options, output.option)
            if target is not None and (final or every_output or output.as_each_finishes):
                extras = {"lang": self.lang} if output.with_lang else {}
                if output.with_problems:
                    extras["problems"] = problem_data(problems)
                if output.with_roster:
                    extras["roster"] = self.roster
                atomic_write(target, output.render(records, **extras))

    def write_interrupted(self, problems: list[GradingError] = ()) -> None:
        """Grading was stopped (Ctrl-C, SIGTERM): every output of the notebooks finished, the
        class report included (the JSON stays marked incomplete). A failure here is one line on
        stderr: the interruption is what the caller reports."""
        try:
            self.write(problems, final=False, every_output=True)
        except Exception as exc:  # noqa: BLE001 - the interruption goes on either way
            print(_("could not write the outputs of the notebooks finished: {why}").format(
                why=exc), file=sys.stderr, flush=True)

    def write_kept_feedback(self) -> None:
        """Feedback pages for the records kept from the earlier run (they may be new here),
        and, in a run with deadlines, for the records of notebooks not given this time (their
        lateness and penalty are this run's)."""
        if self.feedback is not None:
            others = [record for key, record in self.records.items()
                      if key not in self._given] if self.deadlines else []
            for record in [*self.kept, *others]:
                write_feedback(self.feedback, record, self.folders)


def problem_data(problems) -> list[dict]:
    """The JSON report's errors: each file refused or not graded, {path, error}, and `student`
    where the file is known to be a student's (their folder's name)."""
    return [{"path": p.path, "error": p.problem,
             **({"student": p.student} if getattr(p, "student", None) else {})}
            for p in problems]


def report_data(records: list[dict], problems, incident: GradingIncident | None, *,
                complete: bool = True, lang: str | None = None) -> dict:
    """The JSON report. `complete` is false while grading is still going on (or was stopped);
    `lang`: the language of the summary's mistakes (None: the language of the moment)."""
    mine = counted(records)
    data = {
        "points": sum(r["points"] for r in mine),
        "max_points": sum(r["max_points"] for r in mine),
        "complete": complete,
        "notebooks": records,
        "errors": problem_data(problems),
        "summary": class_summary(records, lang),
        "grader_memory_mib": round(max([peak_memory_mib()]
                                       + [r.get("grader_memory_mib", 0) for r in records]), 1),
    }
    if incident is not None:
        data["incident"] = {"what": incident.what, "files": incident.changed,
                            "notebooks": incident.notebooks}
    return data
