"""Stage 5 of grading: nbgrader's rule for each test cell of the run notebook (full points if it
ran with no error output and nothing on stderr), with the diagnosis the report shows, in the
source's order of test cells. What the run stage learnt besides the cells' outputs (each failed
test's `Verdict`, the cells skipped and why, the tests the notebook tampered with) is handed in
as arguments, never read from the notebook's metadata."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ..engine import SEED_LINE, CheckFailure, NotStarted
from ..i18n import _
from .build import is_graded_test
from .read import grade_id, is_test_cell
from .results import ERROR, FAILED, NOT_STARTED, PASSED, ExerciseResult, Verdict

# Error names (IPython's `ename`) that mean "the check ran and said no". Other exceptions in a
# test cell (NameError, TypeError, SystemExit, ...) are reported as "error".
_NOT_STARTED_NAMES = {"NotStarted", "NotImplementedError"}
_FAILURE_NAMES = {"CheckFailure", "LearnerError", "ForbiddenCall", "AssertionError"}


def exercise_name(test_grade_id: str) -> str:
    return test_grade_id.removeprefix("check_")


def verdict_of(exc: BaseException, exercise: str) -> Verdict:
    """A test cell's failure as data, taken from the exception where it was raised (the grader's
    side): the mistake's id (None when none was recognised), the seed that replays the failing
    case, and the message as the report shows it. A failure of another exercise's check (a hidden
    test that calls an earlier one) keeps that exercise's name in front."""
    if not isinstance(exc, CheckFailure) or isinstance(exc, NotStarted):
        return Verdict()
    lines = exc.report_lines()
    if lines and exc.exercise != exercise:
        lines[0] = f"{exc.exercise}: {lines[0]}"
    return Verdict(exc.mistake, exc.seed, " — ".join(lines) or None)


def score_notebook(nb, source, completed: Collection[int], *,
                   verdicts: Mapping[int, Verdict] | None = None,
                   skipped: Mapping[int, str] | None = None,
                   tampered: Collection[int] = ()) -> list[ExerciseResult]:
    """One result per test cell of the source notebook, in its order. What the run stage
    returned, by index of a cell of `nb`: `completed`, the cells that ran to the end; `verdicts`,
    the failed tests' verdicts; `skipped`, the cells that hung or crashed the worker and why;
    `tampered`, the tests whose run in the worker passed where the grader's failed."""
    verdicts, skipped = verdicts or {}, skipped or {}
    where = {grade_id(c): i for i, c in enumerate(nb.cells) if is_graded_test(c)}
    skipped_answers = {grade_id(c): skipped[i] for i, c in enumerate(nb.cells)
                       if not is_graded_test(c) and grade_id(c) and skipped.get(i)}
    exercises = []
    for test in (c for c in source.cells if is_test_cell(c)):
        index = where[grade_id(test)]
        points = float(test.metadata["nbgrader"].get("points", 0))
        result = score_test_cell(nb.cells[index], ran=index in completed, max_points=points,
                                 verdict=verdicts.get(index), skipped=skipped.get(index),
                                 tampering=index in tampered)
        why = skipped_answers.get(result.name)
        if why and result.status != PASSED:  # say why the exercise's code was missing
            result.status, result.message = ERROR, _("its answer cell was skipped: {why}").format(
                why=why)
        exercises.append(result)
    return exercises


def score_test_cell(cell, *, ran: bool, max_points: float, verdict: Verdict | None = None,
                    skipped: str | None = None, tampering: bool = False) -> ExerciseResult:
    """nbgrader's rule: full points if the cell ran with no error output and nothing on stderr.
    `verdict`: the grader's verdict on the cell when its test failed; `skipped`: why the cell was
    skipped (it hung or crashed the worker); `tampering`: the worker's run of the test passed
    where the grader's failed.

    (nbgrader also gives partial credit for a test cell whose value is a number; the course's
    test cells return nothing, so that case is not implemented.)
    """
    name = exercise_name(grade_id(cell))
    if skipped:  # this test hung or crashed the worker: the cell was stopped and skipped
        return ExerciseResult(name, 0.0, max_points, ERROR,
                              _("{why} (the test was skipped)").format(why=skipped))
    if not ran:
        return ExerciseResult(name, 0.0, max_points, ERROR,
                              _("not run: the notebook stopped before this test"))
    outputs = cell.get("outputs", [])
    errors = [o for o in outputs if o.get("output_type") == "error"]
    if errors:
        verdict = verdict or Verdict()
        status, message = _classify_error(errors[0], name, verdict.message)
        if tampering:
            message = _("tampering suspected: the notebook's own run of this test passed, the "
                        "grader's failed — {diagnosis}").format(diagnosis=message)
        return ExerciseResult(name, 0.0, max_points, status, message, tampering,
                              mistake=verdict.mistake, seed=verdict.seed)
    stderr = "".join(o.get("text", "") for o in outputs
                     if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if stderr.strip():
        return ExerciseResult(name, 0.0, max_points, FAILED,
                              _("wrote to stderr: {line}").format(line=_one_line(stderr)))
    return ExerciseResult(name, max_points, max_points, PASSED)


def _classify_error(error, exercise: str, message: str | None = None) -> tuple[str, str]:
    """(status, message) of a test cell's error output; `message`: the failure's own words when
    the grader's side recorded them (its verdict), so no text needs parsing."""
    ename, evalue = error.get("ename", "Error"), error.get("evalue", "")
    if ename in _NOT_STARTED_NAMES:
        return NOT_STARTED, _("still raises NotImplementedError")
    if ename in _FAILURE_NAMES and message:
        return FAILED, message
    if ename in _FAILURE_NAMES:
        lines = [line.strip() for line in evalue.splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith(_seed_line_starts())]
        if lines:
            lines[0] = lines[0].removeprefix(f"{exercise}: ")
        return FAILED, " — ".join(lines) if lines else _("{error} in a hidden test").format(
            error=ename)
    return ERROR, f"{ename}: {_one_line(evalue)}" if evalue.strip() else ename


def _seed_line_starts() -> tuple[str, ...]:
    """How the checks' "random inputs from seed" line begins, in English and in the language of
    the moment (the submission's, in which its checks wrote it)."""
    return SEED_LINE.split("{")[0], _(SEED_LINE).split("{")[0]


def _one_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
