"""Grade a notebook the way nbgrader's autograde does, without a gradebook database, in a way
the submission cannot tamper with.

`grade_notebook(path)` reads a submitted notebook, finds its chapter, rebuilds the notebook to run
from the submission's code cells with every test cell taken from the chapter's source notebook,
runs its cells in a walled-in worker process (`checks.grader.sandbox`), runs each test cell in this
process on the worker's functions (this run decides), and scores each test cell.

The pieces, in the order `grade_notebook` uses them:

- `read_notebook`: a notebook file, or `GradingError` with one readable line.
- `identify_chapter` / `source_notebook_path`: which chapter (metadata, answer cells, name).
- `build_graded_notebook`: submission cells + source test cells -> the notebook to run. Only the
  source's test cells are tests: the submission's own cell metadata decides nothing.
- `execute_notebook`: runs it (time, memory and output limits; a dead worker is survived).
- `score_test_cell`: nbgrader's rule for one test cell -> `ExerciseResult`.
- `Tripwire`: the course's code, the sources and the submissions, hashed before and compared
  after each notebook; a change is a `GradingIncident` that stops the run.

Test cells come from the *source* notebook (`solutions/`), hidden tests included (nbgrader's
autograde also restores test cells with their hidden tests from the source).

Nothing is ever written to the submitted file or its folder: the worker runs in a temporary
working directory that is removed afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
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


# --------------------------------------------------------------------------------------------
# Results


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
    error: str | None = None  # what stopped the notebook early (timeout, dead kernel, ...)
    seconds: float = 0.0
    student: str | None = None  # from nbgrader's submitted/<student>/<assignment>/ layout
    warnings: list[str] = field(default_factory=list)
    isolation: str = ""  # "namespaces" (walled in, own user) or "none" (see checks.grader.sandbox)
    worker_uid: int | None = None  # the walled-in worker's user id (its processes: that user)
    grader_memory_mib: float = 0.0  # peak resident memory of the grading process so far

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


# --------------------------------------------------------------------------------------------
# Reading notebooks and finding the chapter


class Node(dict):
    """A notebook, cell or metadata dict whose keys also read as attributes, like nbformat's
    NotebookNode (nbformat itself is not imported: it pulls in jsonschema, seconds per process)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value


def _node(value: Any) -> Any:
    if isinstance(value, dict):
        return Node({k: _node(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_node(v) for v in value]
    return value


def new_code_cell(source: str, metadata: dict | None = None) -> Node:
    return Node(cell_type="code", execution_count=None, metadata=_node(metadata or {}),
                outputs=[], source=source)


def read_notebook(path: str | os.PathLike):
    """Read a notebook (any format-4 minor version) or raise GradingError saying what is wrong."""
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
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GradingError(path, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) \
            or raw.get("nbformat") != 4:
        raise GradingError(path, "JSON, but not a Jupyter notebook in format 4")
    try:
        nb = _node(raw)
        if not isinstance(nb.setdefault("metadata", Node()), dict):
            raise ValueError("metadata that is not a mapping")
        for cell in nb.cells:
            if not isinstance(cell, dict):
                raise ValueError("a cell that is not a mapping")
            source = cell.get("source")
            if isinstance(source, list) and all(isinstance(line, str) for line in source):
                cell["source"] = "".join(source)
            if cell.get("cell_type") not in ("code", "markdown", "raw") or \
                    not isinstance(cell.get("source"), str):
                raise ValueError("a cell without a type or source")
            if not isinstance(cell.setdefault("metadata", Node()), dict):
                raise ValueError("cell metadata that is not a mapping")
    except Exception as exc:  # any malformed structure reads as one line, never a traceback
        raise GradingError(path, f"malformed notebook ({exc})") from None
    return nb


def identify_chapter(nb, path: str | os.PathLike, source_dir: str | os.PathLike = SOURCE_DIR
                     ) -> str:
    """The chapter a notebook belongs to: metadata `course.chapter`, else the chapter whose
    answer cells (grade_ids) it has, else its file or folder name.

    The first of these that names a chapter present in `source_dir` wins, so a renamed notebook
    is recognised by its metadata or content, and a chapter 01 notebook saved under chapter 04's
    name is graded as chapter 01 (the report shows the chapter).
    """
    path = Path(path)
    course = nb.metadata.get("course")
    named = course.get("chapter") if isinstance(course, dict) else None
    candidates = [c for c in (named, _chapter_by_content(nb, source_dir), path.stem,
                              path.parent.name)
                  if isinstance(c, str) and CHAPTER_NAME.fullmatch(c)]
    for chapter in candidates:
        if source_notebook_path(chapter, source_dir).is_file():
            return chapter
    if candidates:
        raise GradingError(path, f"unknown chapter {candidates[0]!r} (no "
                                 f"{source_notebook_path(candidates[0], source_dir)})")
    raise GradingError(path, "cannot tell which chapter this is (no course.chapter metadata, "
                             "and neither the file nor its folder is named like 01_notation)")


def _answer_ids(nb) -> set[str]:
    return {gid for c in nb.cells if (gid := grade_id(c)) is not None
            and isinstance(c.metadata.get("nbgrader"), dict)
            and c.metadata["nbgrader"].get("solution")}


def _chapter_by_content(nb, source_dir) -> str | None:
    """The one chapter whose answer cells (by grade_id) the notebook shares most, if any."""
    mine = _answer_ids(nb)
    if not mine:
        return None
    overlap = {}
    for source in sorted(Path(source_dir).glob("*/*.ipynb")):
        if source.stem != source.parent.name:
            continue
        try:
            overlap[source.stem] = len(mine & _answer_ids(read_notebook(source)))
        except GradingError:
            continue
    best = max(overlap.values(), default=0)
    winners = [chapter for chapter, n in overlap.items() if n == best]
    return winners[0] if best and len(winners) == 1 else None


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


def _fresh_code_cell(cell, *, test: bool = False):
    """A copy of a code cell with no outputs and no execution count (outputs are never trusted).
    A submission's cell keeps only its grade_id (to place missing tests); a source test cell
    keeps its metadata and is marked as the grader's own."""
    if test:
        metadata = copy.deepcopy(dict(cell.metadata))
        metadata["checks_source_test"] = True
    else:
        gid = grade_id(cell)
        metadata = {"nbgrader": {"grade_id": gid}} if gid else {}
    return new_code_cell(cell.source, metadata)


def is_graded_test(cell) -> bool:
    """A test cell of the notebook built for grading: one taken from the source notebook."""
    return bool(cell.get("metadata", {}).get("checks_source_test")) and is_test_cell(cell)


def build_graded_notebook(submission, source):
    """The notebook to execute: the submission's code cells, with the source's test cells.

    - A submission cell whose grade_id names a source test cell is replaced by that test cell
      (edited test cells are restored; hidden tests come back). A second copy is dropped.
    - A source test cell missing from the submission is inserted after the nearest cell before
      it in the source whose grade_id the submission still has (normally its answer cell), else
      before the nearest such cell after it, else at the end.
    - Every other submission cell is ordinary code, whatever its metadata claims (a cell
      marked as a test with a grade_id of its own is not a test and earns nothing).
    - Markdown and raw cells are left out; outputs of the submission are discarded.
    """
    tests = {grade_id(c): c for c in source.cells if is_test_cell(c)}
    cells, seen = [], set()
    for cell in submission.cells:
        if cell.cell_type != "code":
            continue
        gid = grade_id(cell)
        if gid in tests:
            if gid not in seen:
                seen.add(gid)
                cells.append(_fresh_code_cell(tests[gid], test=True))
            continue
        cells.append(_fresh_code_cell(cell))

    source_ids = [grade_id(c) for c in source.cells]
    for position, gid in enumerate(source_ids):
        if gid in tests and gid not in seen:
            at = _insertion_point(cells, source_ids[:position], source_ids[position + 1:])
            cells.insert(at, _fresh_code_cell(tests[gid], test=True))
            seen.add(gid)

    nb = Node(cells=cells, metadata=_node(copy.deepcopy(dict(source.metadata))), nbformat=4,
              nbformat_minor=5)
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
# Running it: the learner's code in a worker; each test here first (it decides), then there


@dataclass
class Execution:
    completed: set[int]  # indices of the cells that ran to the end
    error: str | None  # why the notebook stopped early, or None
    isolation: str = ""
    worker_uid: int | None = None


def chapter_namespace(source) -> dict[str, Any]:
    """What the test cells may use, built in the grading process from the source notebook's
    import statements and borrowing statements (`own_functions(...)`, which under a grader
    gives the course's reference functions) in cells that are neither answers nor tests.
    Nothing of the learner's."""
    import ast
    import builtins
    import io

    from ..borrow import BORROWING_CALLS
    from ..context import GRADING_ENV

    def borrowing(node) -> bool:
        call = getattr(node, "value", None)
        func = getattr(call, "func", None)
        name = getattr(func, "id", None) or getattr(func, "attr", None)
        return isinstance(node, ast.Assign) and isinstance(call, ast.Call) and \
            name in BORROWING_CALLS

    def bound(node) -> set[str]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return {(a.asname or a.name).split(".")[0] for a in node.names}
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}

    used: set[str] = set()  # only what the test cells read is imported (not figures' modules)
    for cell in source.cells:
        if cell.cell_type == "code" and is_test_cell(cell):
            with contextlib.suppress(SyntaxError):
                used |= {n.id for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Name)}
    candidates = []
    for cell in source.cells:
        if cell.cell_type != "code" or grade_id(cell) is not None:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        candidates += [node for node in tree.body
                       if isinstance(node, (ast.Import, ast.ImportFrom)) or borrowing(node)]
    for node in candidates:  # what the borrowing statements need is imported too
        if borrowing(node) and bound(node) & used:
            used |= {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    kept = [node for node in candidates if bound(node) & used]
    namespace: dict[str, Any] = {"__name__": "__grading__", "__builtins__": builtins}
    flag = os.environ.get(GRADING_ENV)
    os.environ[GRADING_ENV] = "1"  # borrowing gives the reference, never a learner's notebook
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(ast.Module(body=kept, type_ignores=[]), "<imports>", "exec"), namespace)
    finally:
        if flag is None:
            os.environ.pop(GRADING_ENV, None)
        else:
            os.environ[GRADING_ENV] = flag
    return namespace


def exercise_kinds(source) -> dict[str, str]:
    """{name: "function" | "class"} for what the source notebook's answer cells define: whether
    an exercise is a class comes from the source, never from the submission."""
    from .sandbox import defined_names

    kinds: dict[str, str] = {}
    for cell in source.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if cell.cell_type == "code" and isinstance(meta, dict) and meta.get("solution"):
            kinds.update(defined_names(cell.source))
    return kinds


def _names_from_learner(source: str, namespace: dict[str, Any]) -> list[str]:
    """Names a test cell reads that neither it, the chapter's imports nor builtins define:
    the exercises (and anything else the learner's notebook must provide)."""
    import ast
    import builtins

    tree = ast.parse(source)
    stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and not isinstance(n.ctx, ast.Load)}
    stored |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    loaded = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Load)]
    return [name for name in dict.fromkeys(loaded) if name not in stored
            and name not in namespace and not hasattr(builtins, name)]


class _WrongKind:
    """Stands for a function exercise that the notebook defines as a class."""

    def __init__(self, name: str):
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        raise TypeError(f"`{self.__name__}` is a class in your notebook; this exercise asks for "
                        f"a function (def {self.__name__}(...))")


def _grader_side_test(cell, worker, imports: dict[str, Any], kinds: dict[str, str],
                      limits) -> dict[str, Any]:
    """Run a test cell in this process on the worker's functions: {"ok", "ename", "evalue",
    "stderr"}. Raises WorkerGone when the worker dies or runs out of time."""
    import io
    import warnings

    from .sandbox import RemoteFunction

    deadline = time.monotonic() + limits.cell_timeout
    worker.begin_test(deadline)
    namespace = dict(imports)
    for name in _names_from_learner(cell.source, namespace):
        found = worker.lookup(name)
        kind = kinds.get(name)
        if kind is None:  # not an exercise: plain data only, never the learner's code
            if found["found"] == "value":
                namespace[name] = found["value"]
        elif found["found"] == "class" and kind == "function":
            namespace[name] = _WrongKind(name)
        elif found["found"] != "missing":
            namespace[name] = RemoteFunction(worker, name, deadline)
    out, err = io.StringIO(), io.StringIO()
    result: dict[str, Any] = {"ok": True}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            exec(compile(cell.source, f"<test {grade_id(cell)}>", "exec"), namespace)
        except Exception as exc:  # WorkerGone and KeyboardInterrupt are BaseExceptions
            result.update(ok=False, ename=type(exc).__name__, evalue=str(exc))
    stderr = worker.stderr_text + err.getvalue() + "".join(
        f"{w.category.__name__}: {w.message}\n" for w in caught)
    result["stderr"] = stderr[:limits.stderr_kept]
    return result


def _as_outputs(*results: dict[str, Any]) -> list:
    """nbformat outputs for a cell from its run results: the first error, and any stderr."""
    outputs = []
    for result in results:
        if result.get("stderr"):
            outputs.append(Node(output_type="stream", name="stderr", text=str(result["stderr"])))
    for result in results:
        if not result.get("ok", False):
            outputs.append(Node(output_type="error", ename=str(result.get("ename", "Error")),
                                evalue=str(result.get("evalue", "")), traceback=[]))
            break
    return outputs


def execute_notebook(nb, source, *, limits, workdir: str | os.PathLike, chapter: str,
                     source_dir: str | os.PathLike = SOURCE_DIR,
                     hide: list | tuple = ()) -> Execution:
    """Run the cells of `nb` in a worker, in order. Each test cell (from the source) runs first
    here, on the worker's functions (this run decides), then in the worker, where the graded
    chapter's checks repeat this run's verdict.

    `nb` gets the outputs (stderr and the first error; for a test cell, those of the run here)
    and, on a test cell whose run in the worker passed while the run here failed,
    `checks_tampering` metadata. A cell that runs past the time limit, a worker that dies or
    breaks the protocol stop the run; the cells run until then keep their outputs. Raises
    GradingIncident if any of the worker's processes survive it.
    """
    from .sandbox import Worker, WorkerGone, WorkerLibrary

    completed: set[int] = set()
    current: int | None = None
    imports = chapter_namespace(source)
    kinds = exercise_kinds(source)
    worker = None
    try:
        worker = Worker(Path(workdir), limits, WorkerLibrary(chapter, source_dir), hide=hide)
        for index, cell in enumerate(nb.cells):
            current = index
            if is_graded_test(cell):
                here = _grader_side_test(cell, worker, imports, kinds, limits)
                verdict = "passed" if here["ok"] else (here["ename"], here["evalue"])
                inside = worker.run_cell(index, cell.source, verdict)
                if inside["ok"] and not here["ok"]:
                    cell.metadata["checks_tampering"] = True
                # Only this process's run counts: the worker's may fail for reasons of its own
                # (a hidden test that uses a reference function the worker does not have).
                cell.outputs = _as_outputs(here)
            else:
                cell.outputs = _as_outputs(worker.run_cell(index, cell.source))
            completed.add(index)
        error = None
    except WorkerGone as gone:
        where = "before the first cell" if current is None else \
            f"in {_describe_cell(nb, current)}"
        error = f"{where}: {gone}; the cells after it were not run"
        error = error[0].upper() + error[1:]
    finally:
        if worker is not None:
            worker.close()
    left = getattr(worker, "left_behind", [])
    if left:
        raise GradingIncident([], [f"process {pid}" for pid in left],
                              "processes of the worker outlived it")
    return Execution(completed, error, worker.mode if worker is not None else "",
                     getattr(worker, "uid", None))


def _describe_cell(nb, index: int | None) -> str:
    """'answer cell head_dim', 'test cell check_head_dim' or 'the cell starting "x = 1"'."""
    if index is None:
        return "an unknown cell"
    cell = nb.cells[index]
    gid = grade_id(cell)
    if gid:
        return f"{'test' if is_graded_test(cell) else 'answer'} cell {gid}"
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    first = first if len(first) <= 40 else first[:37] + "..."
    return f"the cell starting {first!r}"


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
    tampering = bool(cell.get("metadata", {}).get("checks_tampering"))
    if errors:
        status, message = _classify_error(errors[0], name)
        if tampering:
            message = ("tampering suspected: the notebook's own run of this test passed, the "
                       f"grader's failed — {message}")
        return ExerciseResult(name, 0.0, max_points, status, message, tampering)
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
# What no notebook may change


def course_files(source_dir: str | os.PathLike = SOURCE_DIR) -> list[Path]:
    """The course's code (the `checks` package the grader runs) and the chapters' source
    notebooks: no submission may change them."""
    package = Path(__file__).resolve().parent
    return sorted([*package.rglob("*.py"), *Path(source_dir).glob("[0-9][0-9]_*/*.ipynb")])


class Tripwire:
    """Files hashed once; `changed()` lists those whose contents changed (or that vanished).

    A file whose size, times and inode are unchanged is not read again (any write changes its
    modification or status-change time); one whose status changed is hashed again."""

    def __init__(self, paths):
        self.files: dict[Path, tuple[tuple, str]] = {}
        for path in dict.fromkeys(Path(p).resolve() for p in paths):
            with contextlib.suppress(OSError):
                self.files[path] = (self._stat(path), self._hash(path))

    @staticmethod
    def _stat(path: Path) -> tuple:
        st = path.stat()
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev

    @staticmethod
    def _hash(path: Path) -> str:
        return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()

    def changed(self) -> list[Path]:
        found = []
        for path, (stat, digest) in self.files.items():
            try:
                now = self._stat(path)
                if now == stat:
                    continue
                if path.is_file() and self._hash(path) == digest:
                    self.files[path] = (now, digest)
                    continue
            except OSError:
                pass
            found.append(path)
        return found


# --------------------------------------------------------------------------------------------
# Putting it together


def student_of(path: str | os.PathLike) -> str | None:
    """The student in nbgrader's layout `.../submitted/<student>/<assignment>/<file>.ipynb`."""
    parts = Path(path).parts
    return parts[-3] if len(parts) >= 4 and parts[-4] == "submitted" else None


def name_warnings(path: str | os.PathLike, chapter: str,
                  source_dir: str | os.PathLike = SOURCE_DIR) -> list[str]:
    """A warning for each name (file or folder) that names a different chapter."""
    path = Path(path)
    found = []
    for what, name in (("file", path.stem), ("folder", path.parent.name)):
        if CHAPTER_NAME.fullmatch(name) and name != chapter and \
                source_notebook_path(name, source_dir).is_file():
            found.append(f"its {what} name says {name}, but the notebook is chapter {chapter} "
                         f"(graded as {chapter})")
    return found


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
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def grade_notebook(path: str | os.PathLike, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT,
                   source_dir: str | os.PathLike = SOURCE_DIR, limits=None,
                   protect: list[Path] | tuple = (), hide: list | tuple | None = None,
                   tripwire: Tripwire | None = None) -> NotebookResult:
    """Grade one submitted notebook. Raises GradingError when it cannot be graded at all, and
    GradingIncident when a file no notebook may change changed while it was graded.

    Each test cell of the chapter's source notebook becomes one exercise result (in source
    order). A timeout or a dead worker ends the notebook: the cells run before it keep their
    points, the rest score zero, and `NotebookResult.error` says what happened. `limits`
    (a `checks.grader.sandbox.Limits`) overrides `cell_timeout`. `hide`: folders the worker must not
    see (default: the notebook's folder and those of `protect`; the course and the sources are
    always hidden). `tripwire` (default: the course's code, the sources, this notebook and
    `protect`) is checked after the notebook.
    """
    from .sandbox import Limits

    started = time.monotonic()
    limits = limits or Limits(cell_timeout=cell_timeout)
    submission = read_notebook(path)
    chapter = identify_chapter(submission, path, source_dir)
    source = read_notebook(source_notebook_path(chapter, source_dir))
    nb = build_graded_notebook(submission, source)
    if tripwire is None:
        tripwire = Tripwire([*course_files(source_dir), path, *protect])
    if hide is None:
        hide = [Path(p).resolve().parent for p in (path, *protect)]
    hide = [*hide, Path(source_dir).resolve()]

    with tempfile.TemporaryDirectory(prefix="checks-grade-", ignore_cleanup_errors=True) as tmp:
        try:
            run = execute_notebook(nb, source, limits=limits, workdir=tmp, chapter=chapter,
                                   source_dir=source_dir, hide=hide)
        except GradingIncident as incident:
            raise GradingIncident([str(path)], incident.changed, incident.what) from None
    changed = tripwire.changed()
    if changed:
        raise GradingIncident([str(path)], [_short_path(p) for p in changed])

    where = {grade_id(c): i for i, c in enumerate(nb.cells) if is_graded_test(c)}
    exercises = []
    for test in (c for c in source.cells if is_test_cell(c)):
        index = where[grade_id(test)]
        points = float(test.metadata["nbgrader"].get("points", 0))
        exercises.append(score_test_cell(nb.cells[index], ran=index in run.completed,
                                         max_points=points))
    return NotebookResult(str(path), chapter, exercises, run.error, time.monotonic() - started,
                          student=student_of(path),
                          warnings=name_warnings(path, chapter, source_dir),
                          isolation=run.isolation, worker_uid=run.worker_uid,
                          grader_memory_mib=peak_memory_mib())


def _short_path(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)
