"""Grade a notebook the way nbgrader's autograde does, without a gradebook database.

`grade_notebook(path)` reads a submitted notebook, finds its chapter, rebuilds the notebook to run
from the submission's code cells with every test cell taken from the chapter's source notebook,
executes it in a fresh kernel process inside a temporary folder, and scores each test cell.

The pieces, in the order `grade_notebook` uses them:

- `read_notebook`: a notebook file, or `GradingError` with one readable line.
- `identify_chapter` / `source_notebook_path`: which chapter, and its source notebook.
- `build_graded_notebook`: submission cells + source test cells -> the notebook to run.
- `execute_notebook`: runs it (per-cell time limit, errors allowed, kernel death survived).
- `score_test_cell`: nbgrader's rule for one test cell -> `ExerciseResult`.

Test cells come from the *source* notebook (`solutions/`), hidden tests included. The
architecture note says "test cells from the release"; the release lacks the hidden tests, and
nbgrader's autograde also restores test cells with their hidden tests (it saves them from the
source when the assignment is generated), so the source is the right copy to restore from.

Nothing is ever written to the submitted file or its folder: the kernel runs in a temporary
working directory that is removed afterwards.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO / "solutions"
DEFAULT_CELL_TIMEOUT = 120.0  # seconds per cell, as nbgrader_config.py (c.Execute.timeout)

CHAPTER_NAME = re.compile(r"\d\d_[A-Za-z0-9_]+")

PASSED, FAILED, NOT_STARTED, ERROR = "passed", "failed", "not started", "error"

# Error names (IPython's `ename`) that mean "the check ran and said no". Other exceptions in a
# test cell (NameError, TypeError, SystemExit, ...) are reported as "error".
_NOT_STARTED_NAMES = {"NotStarted", "NotImplementedError"}
_FAILURE_NAMES = {"CheckFailure", "LearnerError", "ForbiddenCall", "AssertionError"}


class GradingError(Exception):
    """A notebook that cannot be graded at all (bad input). `str()` is one readable line."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class ExerciseResult:
    name: str
    points: float
    max_points: float
    status: str  # PASSED, FAILED, NOT_STARTED or ERROR
    message: str = ""


@dataclass
class NotebookResult:
    path: str
    chapter: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None  # what stopped the notebook early (timeout, dead kernel, ...)
    seconds: float = 0.0

    @property
    def points(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        return sum(e.max_points for e in self.exercises)

    @property
    def passed(self) -> int:
        return sum(e.status == PASSED for e in self.exercises)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(points=self.points, max_points=self.max_points, passed=self.passed,
                    seconds=round(self.seconds, 2))
        return data


# --------------------------------------------------------------------------------------------
# Reading notebooks and finding the chapter


def read_notebook(path: str | os.PathLike):
    """Read a notebook (any format-4 minor version) or raise GradingError saying what is wrong."""
    import nbformat

    path = Path(path)
    if not path.exists():
        raise GradingError(path, "no such file")
    if path.is_dir():
        raise GradingError(path, "is a folder, not a notebook")
    if path.suffix != ".ipynb":
        raise GradingError(path, "not a notebook (expected a .ipynb file)")
    data = path.read_bytes()
    if not data.strip():
        raise GradingError(path, "empty file, not a notebook")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GradingError(path, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) \
            or raw.get("nbformat") != 4:
        raise GradingError(path, "JSON, but not a Jupyter notebook in format 4")
    try:
        nb = nbformat.reader.reads(data.decode("utf-8"))
        nb = nbformat.convert(nb, 4)
        nb.setdefault("metadata", nbformat.NotebookNode())
        for cell in nb.cells:
            if cell.get("cell_type") not in ("code", "markdown", "raw") or \
                    not isinstance(cell.get("source"), str):
                raise ValueError("a cell without a type or source")
            cell.setdefault("metadata", nbformat.NotebookNode())
    except Exception as exc:  # any malformed structure reads as one line, never a traceback
        raise GradingError(path, f"malformed notebook ({exc})") from None
    return nb


def identify_chapter(nb, path: str | os.PathLike, source_dir: str | os.PathLike = SOURCE_DIR
                     ) -> str:
    """The chapter a notebook belongs to: metadata `course.chapter`, else its file or folder name.

    The first of these that names a chapter present in `source_dir` wins, so a renamed notebook
    is still recognised by its metadata and a notebook without metadata by its name.
    """
    path = Path(path)
    course = nb.metadata.get("course")
    named = course.get("chapter") if isinstance(course, dict) else None
    candidates = [c for c in (named, path.stem, path.parent.name)
                  if isinstance(c, str) and CHAPTER_NAME.fullmatch(c)]
    for chapter in candidates:
        if source_notebook_path(chapter, source_dir).is_file():
            return chapter
    if candidates:
        raise GradingError(path, f"unknown chapter {candidates[0]!r} (no "
                                 f"{source_notebook_path(candidates[0], source_dir)})")
    raise GradingError(path, "cannot tell which chapter this is (no course.chapter metadata, "
                             "and neither the file nor its folder is named like 01_notation)")


def source_notebook_path(chapter: str, source_dir: str | os.PathLike = SOURCE_DIR) -> Path:
    return Path(source_dir) / chapter / f"{chapter}.ipynb"


# --------------------------------------------------------------------------------------------
# The notebook to run


def grade_id(cell) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    gid = meta.get("grade_id") if isinstance(meta, dict) else None
    return gid if isinstance(gid, str) else None


def is_test_cell(cell) -> bool:
    """An autograded test cell: a code cell nbgrader grades that is not an answer cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return (cell.cell_type == "code" and isinstance(meta, dict) and bool(meta.get("grade"))
            and not meta.get("solution") and grade_id(cell) is not None)


def exercise_name(test_grade_id: str) -> str:
    return test_grade_id.removeprefix("check_")


def _fresh_code_cell(cell):
    """A copy of a code cell with no outputs and no execution count (outputs are never trusted)."""
    import nbformat

    return nbformat.v4.new_code_cell(source=cell.source, metadata=copy.deepcopy(cell.metadata))


def build_graded_notebook(submission, source):
    """The notebook to execute: the submission's code cells, with the source's test cells.

    - A submission cell whose grade_id names a source test cell is replaced by that test cell
      (edited test cells are restored; hidden tests come back). A second copy is dropped.
    - A source test cell missing from the submission is inserted after the nearest cell before
      it in the source whose grade_id the submission still has (normally its answer cell), else
      before the nearest such cell after it, else at the end.
    - Markdown and raw cells are left out; outputs of the submission are discarded.
    """
    import nbformat

    tests = {grade_id(c): c for c in source.cells if is_test_cell(c)}
    cells, seen = [], set()
    for cell in submission.cells:
        if cell.cell_type != "code":
            continue
        gid = grade_id(cell)
        if gid in tests:
            if gid in seen:
                continue
            seen.add(gid)
            cell = tests[gid]
        cells.append(_fresh_code_cell(cell))

    source_ids = [grade_id(c) for c in source.cells]
    for position, gid in enumerate(source_ids):
        if gid in tests and gid not in seen:
            at = _insertion_point(cells, source_ids[:position], source_ids[position + 1:])
            cells.insert(at, _fresh_code_cell(tests[gid]))
            seen.add(gid)

    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(source.metadata))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def _insertion_point(cells, before: list[str | None], after: list[str | None]) -> int:
    present = [grade_id(c) for c in cells]
    for gid in reversed(before):
        if gid is not None and gid in present:
            return len(present) - present[::-1].index(gid)  # after its last occurrence
    for gid in after:
        if gid is not None and gid in present:
            return present.index(gid)
    return len(cells)


# --------------------------------------------------------------------------------------------
# Running it


@dataclass
class Execution:
    completed: set[int]  # indices of the cells that ran to the end
    error: str | None  # why the notebook stopped early, or None


class _Progress:
    """What nbclient's hooks report while a notebook runs."""

    def __init__(self):
        self.completed: set[int] = set()
        self.current: int | None = None  # the cell running now (or last)
        self.process = None  # the kernel's subprocess.Popen

    def kernel_started(self, client) -> None:
        self.process = getattr(client.km.provisioner, "process", None)

    def cell_started(self, cell_index: int, **_) -> None:
        self.current = cell_index

    def cell_done(self, cell_index: int, **_) -> None:
        self.completed.add(cell_index)


def execute_notebook(nb, *, cell_timeout: float, workdir: str | os.PathLike) -> Execution:
    """Run every code cell in a fresh kernel of this interpreter; `nb` gets the outputs.

    Errors in cells are allowed. A cell that runs past `cell_timeout`, a kernel that dies and a
    kernel that does not start stop the run; the cells run until then keep their outputs.
    The kernel's working directory is `workdir/cwd`; its own stdout/stderr go to
    `workdir/kernel.log`.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    cwd = Path(workdir) / "cwd"
    cwd.mkdir()
    kernel_log = Path(workdir) / "kernel.log"
    progress = _Progress()
    client = NotebookClient(
        nb, timeout_func=lambda cell: cell_timeout, allow_errors=True, interrupt_on_timeout=False,
        kernel_name="python3", kernel_manager_class=_this_interpreter_kernel(),
        shutdown_kernel="immediate", record_timing=False, log=_silent_logger(),
        resources={"metadata": {"path": str(cwd)}},
        on_notebook_start=lambda **_: progress.kernel_started(client),
        on_cell_start=progress.cell_started, on_cell_executed=progress.cell_done)

    with open(kernel_log, "wb") as log:
        try:
            client.execute(env=_kernel_env(), stdout=log, stderr=log)
            error = None
        except CellTimeoutError:
            error = (f"{_describe_cell(nb, progress.current)} ran longer than the "
                     f"{cell_timeout:g} s limit; the cells after it were not run")
        except DeadKernelError:
            error = (f"the kernel died in {_describe_cell(nb, progress.current)}"
                     f"{_exit_text(progress.process)}; the cells after it were not run")
        except Exception as exc:  # e.g. the kernel did not start: this notebook only
            where = "before the first cell" if progress.current is None \
                else f"in {_describe_cell(nb, progress.current)}"
            error = (f"execution stopped {where}: {type(exc).__name__}: {_first_line(exc)}"
                     f"{_log_tail(kernel_log)}")
    return Execution(progress.completed, error)


def _this_interpreter_kernel():
    """A kernel manager that always starts ipykernel under this interpreter.

    The submission's kernelspec and any other `python3` kernel installed elsewhere are ignored:
    the kernel must import the same `checks` and torch as the grader.
    """
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    class ThisInterpreterKernel(AsyncKernelManager):
        @property
        def kernel_spec(self):
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    return ThisInterpreterKernel


def _kernel_env() -> dict[str, str]:
    """The grader's environment; when the course package is not installed (a plain checkout),
    the checkout goes on PYTHONPATH so that the kernel imports the same `checks`."""
    from importlib import metadata

    env = dict(os.environ)
    try:
        metadata.distribution("llama-course-checks")
    except metadata.PackageNotFoundError:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _silent_logger() -> logging.Logger:
    """nbclient logs timeouts and dead kernels itself; the grader reports them instead."""
    logger = logging.getLogger("checks.grading.nbclient")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def _describe_cell(nb, index: int | None) -> str:
    """'answer cell head_dim', 'test cell check_head_dim' or 'the cell starting "x = 1"'."""
    if index is None:
        return "an unknown cell"
    cell = nb.cells[index]
    gid = grade_id(cell)
    if gid:
        return f"{'test' if is_test_cell(cell) else 'answer'} cell {gid}"
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    first = first if len(first) <= 40 else first[:37] + "..."
    return f"the cell starting {first!r}"


def _exit_text(process) -> str:
    """How the kernel process ended: ' (killed by SIGSEGV)', ' (exit status 1)' or ''."""
    code = process.poll() if process is not None else None
    if code is None:
        return ""
    if code < 0:
        try:
            return f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f" (killed by signal {-code})"
    return f" (exit status {code})"


def _log_tail(kernel_log: Path) -> str:
    """The kernel process's last line on stdout/stderr (why it did not start, say), or ''."""
    try:
        lines = [line.strip() for line in kernel_log.read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return ""
    return f" (kernel: {lines[-1][:120]})" if lines else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


# --------------------------------------------------------------------------------------------
# Scoring


def score_test_cell(cell, *, ran: bool, max_points: float) -> ExerciseResult:
    """nbgrader's rule: full points if the cell ran with no error output and nothing on stderr.

    (nbgrader also gives partial credit for a test cell whose value is a number; the course's
    test cells return nothing, so that case is not implemented.)
    """
    name = exercise_name(grade_id(cell))
    if not ran:
        return ExerciseResult(name, 0.0, max_points, ERROR, "not run: the notebook stopped "
                                                            "before this test")
    outputs = cell.get("outputs", [])
    errors = [o for o in outputs if o.get("output_type") == "error"]
    if errors:
        status, message = _classify_error(errors[0], name)
        return ExerciseResult(name, 0.0, max_points, status, message)
    stderr = "".join(o.get("text", "") for o in outputs
                     if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if stderr.strip():
        return ExerciseResult(name, 0.0, max_points, FAILED,
                              f"wrote to stderr: {_one_line(stderr)}")
    return ExerciseResult(name, max_points, max_points, PASSED)


def _classify_error(error, exercise: str) -> tuple[str, str]:
    ename, evalue = error.get("ename", "Error"), error.get("evalue", "")
    if ename in _NOT_STARTED_NAMES:
        return NOT_STARTED, "still raises NotImplementedError"
    if ename in _FAILURE_NAMES:
        lines = [line.strip() for line in evalue.splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("(random inputs from seed")]
        if lines:
            lines[0] = lines[0].removeprefix(f"{exercise}: ")
        return FAILED, " — ".join(lines) if lines else f"{ename} in a hidden test"
    return ERROR, f"{ename}: {_one_line(evalue)}" if evalue.strip() else ename


def _one_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


# --------------------------------------------------------------------------------------------
# Putting it together


def grade_notebook(path: str | os.PathLike, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT,
                   source_dir: str | os.PathLike = SOURCE_DIR) -> NotebookResult:
    """Grade one submitted notebook. Raises GradingError when it cannot be graded at all.

    Each test cell of the chapter's source notebook becomes one exercise result (in source
    order). A timeout or a dead kernel ends the notebook: the cells run before it keep their
    points, the rest score zero, and `NotebookResult.error` says what happened.
    """
    started = time.monotonic()
    submission = read_notebook(path)
    chapter = identify_chapter(submission, path, source_dir)
    source = read_notebook(source_notebook_path(chapter, source_dir))
    nb = build_graded_notebook(submission, source)

    with tempfile.TemporaryDirectory(prefix="checks-grade-", ignore_cleanup_errors=True) as tmp:
        run = execute_notebook(nb, cell_timeout=cell_timeout, workdir=tmp)

    where = {grade_id(c): i for i, c in enumerate(nb.cells) if is_test_cell(c)}
    exercises = []
    for test in (c for c in source.cells if is_test_cell(c)):
        index = where[grade_id(test)]
        points = float(test.metadata["nbgrader"].get("points", 0))
        exercises.append(score_test_cell(nb.cells[index], ran=index in run.completed,
                                         max_points=points))
    return NotebookResult(str(path), chapter, exercises, run.error,
                          time.monotonic() - started)
