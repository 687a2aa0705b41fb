"""Stage 4 of grading: run the built notebook's cells, in order, in a walled-in worker
(`worker.Worker`). Each test cell runs twice: first here, in the grading process, with the
grader's own checkers and torch, on the worker's functions (`remote.RemoteFunction`): this run
decides the points. Then in the worker, in the notebook's namespace, as Jupyter would: there the
graded chapter's `check_*` functions echo this run's outcome (its `Echo`: passed, or the error),
so an honest notebook gets the same outcome, and one whose own run passes while the grader's
failed has tampered with something (`tampering suspected` in the report).

The worker never sees a hidden test's source (`worker_source`), but it does get the arguments a
hidden test passes to the learner's functions. So the grader's run compiles the cell with each
statement of a block of hidden tests inside `with __hidden_tests__():` (`grader_code`), which
serves the block from a throwaway fork of the worker (`Worker.fork`, `Worker.join`): what the
learner's code keeps of those arguments in its memory dies with the fork, and no later test can
raise, print or return it. A worker that cannot fork does not run the block (the test fails,
saying so). The fork is made by the worker's own loop, which the notebook can patch: like the
guard below, advice (docs/instructor/trust.md).

What the run learns besides the cells' outputs is returned beside the notebook, in `Execution`,
by cell index: each failed test's `Verdict` (mistake, seed, message), the cells skipped and why,
the tests tampered with. The score stage is handed them; none travels in the notebook's
metadata.

Watching from inside the worker is advice only: the forbidden-library-function guard (chapter
04's "no library softmax") runs in the worker, where the notebook could switch it off; a detection
still fails the test, marked "seen inside the worker"."""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..borrow import BORROWING_CALLS
from ..engine import CheckFailure, NotStarted, earlier_failures, fix_first_text
from ..exercises import chapter_of, chapters, checks_module
from ..environment import GRADING_ENV
from ..i18n import _, language, using_default
from .build import is_graded_test
from .channel import WorkerGone
from .identify import SOURCE_DIR
from .library import WorkerLibrary, defined_names
from .read import Node, grade_id, is_test_cell
from .remote import RemoteFunction
from .results import OUTLIVED, GradingIncident, Verdict, WorkerCannotStart
from .score import exercise_name, verdict_of
from .worker import Echo, HiddenTestsRefused, Worker


@dataclass
class Execution:
    """What running a notebook gave, besides the outputs written into its cells; cells are
    named by their index in the notebook run."""

    completed: set[int]  # indices of the cells that ran to the end
    error: str | None  # what went wrong (cells skipped, an early stop), or None
    isolation: str = ""
    worker_uid: int | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # {cell described: why}
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # the failed tests' verdicts
    skipped_cells: dict[int, str] = field(default_factory=dict)  # {index: why it was skipped}
    tampered: set[int] = field(default_factory=set)  # tests the worker passed, the grader failed


def chapter_namespace(source) -> dict[str, Any]:
    """What the test cells may use, built in the grading process from the source notebook's
    import statements and borrowing statements (`own_functions(...)`, which under a grader
    gives the course's reference functions) in cells that are neither answers nor tests.
    Nothing of the learner's."""
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
    kinds: dict[str, str] = {}
    for cell in source.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if cell.cell_type == "code" and isinstance(meta, dict) and meta.get("solution"):
            kinds.update(defined_names(cell.source))
    return kinds


def _names_from_learner(source: str, namespace: dict[str, Any]) -> list[str]:
    """Names a test cell reads that neither it, the chapter's imports nor builtins define:
    the exercises (and anything else the learner's notebook must provide)."""
    tree = ast.parse(source)
    stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and not isinstance(n.ctx, ast.Load)}
    stored |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    loaded = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Load)]
    return [name for name in dict.fromkeys(loaded) if name not in stored
            and name not in namespace and not hasattr(builtins, name)]


HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def worker_source(cell) -> str:
    """What the worker runs of a test cell: its visible part, each block of hidden tests
    replaced by `pass` (at the block's indentation, so the cell still compiles). The hidden
    tests ran here, on the grader's side; their source never reaches the worker, where the
    learner's code could read it (an audit hook on compile, the cell's frame) and raise it as a
    message. The visible part's checks echo the grader's outcome there, so a notebook whose
    own run passes where the grader's failed is still seen (tampering). A block left open hides
    the rest of the cell."""
    kept: list[str] = []
    hidden = False
    for line in cell.source.splitlines():
        if hidden:
            hidden = HIDDEN_END not in line
        elif HIDDEN_BEGIN in line:
            hidden = HIDDEN_END not in line.split(HIDDEN_BEGIN, 1)[1]
            kept.append(line[:len(line) - len(line.lstrip())] + "pass")
        else:
            kept.append(line)
    return "\n".join(kept) + "\n"


HIDDEN_BLOCK = "__hidden_tests__"  # the name the grader's copy of a test cell enters a block by


def hidden_lines(source: str) -> list[tuple[int, int]]:
    """(first, last) line of each block of hidden tests in a test cell, markers included,
    numbered from 1; the same blocks `worker_source` leaves out (one left open runs to the end
    of the cell)."""
    blocks: list[tuple[int, int]] = []
    start = None
    lines = source.splitlines()
    for number, line in enumerate(lines, 1):
        if start is not None:
            if HIDDEN_END in line:
                blocks.append((start, number))
                start = None
        elif HIDDEN_BEGIN in line:
            if HIDDEN_END in line.split(HIDDEN_BEGIN, 1)[1]:
                blocks.append((number, number))
            else:
                start = number
    if start is not None:
        blocks.append((start, len(lines)))
    return blocks


class _HiddenBlocks(ast.NodeTransformer):
    """Wraps each run of statements that start inside one block of hidden tests (at whatever
    depth: in a loop, a branch, a function the cell defines) in `with __hidden_tests__():`.
    Line numbers stay as they are, so tracebacks name the cell's own lines."""

    def __init__(self, blocks: list[tuple[int, int]]):
        self.blocks = blocks

    def _block(self, node: ast.stmt) -> tuple[int, int] | None:
        return next((b for b in self.blocks if b[0] <= node.lineno <= b[1]), None)

    def generic_visit(self, node):
        for name, value in ast.iter_fields(node):
            if isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value):
                setattr(node, name, self._statements(value))
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)
        return node

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        run: list[ast.stmt] = []
        current = None
        for stmt in body:
            block = self._block(stmt)
            if run and block != current:
                out.append(self._wrapped(run))
                run = []
            current = block
            if block is not None:
                run.append(stmt)  # all of it runs in the block, what it nests included
            else:
                out.append(self.visit(stmt))
        if run:
            out.append(self._wrapped(run))
        return out

    @staticmethod
    def _wrapped(run: list[ast.stmt]) -> ast.With:
        call = ast.Call(func=ast.Name(id=HIDDEN_BLOCK, ctx=ast.Load()), args=[], keywords=[])
        node = ast.With(items=[ast.withitem(context_expr=call)], body=run)
        node.lineno, node.col_offset = run[0].lineno, run[0].col_offset
        node.end_lineno, node.end_col_offset = run[-1].end_lineno, run[-1].end_col_offset
        for part in (call, call.func):
            ast.copy_location(part, node)
        return node


def grader_code(cell):
    """The grader's run of a test cell, compiled: the cell as written, with each statement of a
    block of hidden tests inside `with __hidden_tests__():`, which `_grader_side_test` binds to
    a throwaway fork of the worker (`Worker.fork`, `Worker.join`)."""
    name = f"<test {grade_id(cell)}>"
    blocks = hidden_lines(cell.source)
    if not blocks:
        return compile(cell.source, name, "exec")
    tree = _HiddenBlocks(blocks).visit(ast.parse(cell.source))
    return compile(ast.fix_missing_locations(tree), name, "exec")


def _hidden_block(worker):
    """What `with __hidden_tests__():` does in the grader's run of a test cell: the block's
    calls go to a throwaway fork of the worker, ended however the block ends (an error, a
    failed check, a `return`); not when the worker itself is gone (a time limit, a crash: it
    was killed, the fork with it)."""
    @contextlib.contextmanager
    def block():
        worker.fork()
        try:
            yield
        finally:
            if not worker.dead:
                worker.join()

    return block


def notebook_imports(source) -> list[str]:
    """The modules the chapter's source notebook imports at the top level of its cells that are
    neither answers nor tests (what the learner's notebook imports too)."""
    found: dict[str, None] = {}
    for cell in source.cells:
        if cell.cell_type != "code" or grade_id(cell) is not None:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                found.update(dict.fromkeys(a.name for a in node.names))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found[node.module] = None
    return list(found)


def self_test_source(modules: list[str]) -> str:
    """A cell that imports `modules` and leaves no name behind in the notebook's namespace."""
    return ("def _checks_self_test():\n"
            "    import importlib\n"
            f"    for name in {modules!r}:\n"
            "        importlib.import_module(name)\n"
            "try:\n"
            "    _checks_self_test()\n"
            "finally:\n"
            "    del _checks_self_test\n")


class _WrongKind:
    """Stands for a function exercise that the notebook defines as a class."""

    def __init__(self, name: str):
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        raise TypeError(_("`{name}` is a class in your notebook; this exercise asks for a "
                          "function (def {name}(...))").format(name=self.__name__))


def _grader_side_test(cell, worker, imports: dict[str, Any], kinds: dict[str, str],
                      limits, hung: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a test cell in this process on the worker's functions: {"ok", "ename", "evalue",
    "stderr", and "verdict" when it failed}. Raises WorkerGone when the worker dies or runs out
    of time; a call to an exercise that ran out of time is noted in `hung` ({name: the cell's
    grade id}), so that later cells do not call it again."""
    deadline = worker.deadline()
    worker.begin_test(deadline)
    namespace = dict(imports)
    called: list[str] = []  # the exercises the cell called, in the order of first calls
    for name in _names_from_learner(cell.source, namespace):
        found = worker.lookup(name)
        kind = kinds.get(name)
        if kind is None:  # not an exercise: plain data only, never the learner's code
            if found["found"] == "value":
                namespace[name] = found["value"]
        elif found["found"] == "class" and kind == "function":
            namespace[name] = _WrongKind(name)
        elif found["found"] != "missing":
            namespace[name] = _CountedFunction(worker, name, deadline, called, hung,
                                               grade_id(cell) or "")
    namespace[HIDDEN_BLOCK] = _hidden_block(worker)
    out, err = io.StringIO(), io.StringIO()
    result: dict[str, Any] = {"ok": True}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            exec(grader_code(cell), namespace)
        except Exception as exc:  # noqa: BLE001 - WorkerGone and KeyboardInterrupt are BaseExceptions
            exercise = exercise_name(grade_id(cell))
            exc = knock_on(exc, exercise, called, namespace, worker) or exc
            result.update(ok=False, ename=type(exc).__name__, evalue=str(exc),
                          verdict=verdict_of(exc, exercise))
    stderr = worker.stderr_text + err.getvalue() + "".join(
        f"{w.category.__name__}: {w.message}\n" for w in caught)
    result["stderr"] = stderr[:limits.stderr_kept]
    return result


class _CountedFunction(RemoteFunction):
    """A learner's function that notes, on its first call, that the test cell called it."""

    def __init__(self, worker, name: str, deadline: float, called: list[str],
                 hung: dict[str, str] | None = None, cell: str = ""):
        super().__init__(worker, name, deadline)
        self._called, self._hung, self._cell = called, hung, cell

    def __call__(self, *args, **kwargs):
        if self._name not in self._called:
            self._called.append(self._name)
        try:
            return super().__call__(*args, **kwargs)
        except WorkerGone:
            if self._hung is not None and self._worker.timed_out:
                self._hung.setdefault(self._name, self._cell)
            raise


def knock_on(exc: Exception, exercise: str, called: list[str], namespace: dict[str, Any],
             worker: Worker | None = None) -> CheckFailure | None:
    """A test cell of `exercise` failed with `exc` after calling the learner's other exercises
    (`called`: a hidden test that builds its input with another one, as bpe_decode's calls
    bpe_encode): when one of them does not pass its own check (the grader's checker, quietly,
    in the chapter's order), the failure says "fix <that> first" as the self-checks do (the
    mistake fix_<name>_first). None: the failure stands (a diagnosed mistake of the exercise
    itself, a not-started exercise, or nothing else to blame). With `worker`, those checks run
    in a throwaway fork of it, as hidden tests do (their inputs are the grader's to know); when
    it cannot fork, the failure stands."""
    if isinstance(exc, NotStarted) or (isinstance(exc, CheckFailure) and exc.mistake):
        return None
    chapter = chapter_of(exercise)
    others = [n for n in chapters().get(chapter or "", ()) if n in called and n != exercise]
    if not others:
        return None
    try:
        module = checks_module(chapter or "")
    except ImportError:
        return None
    seed = getattr(exc, "seed", None)
    earlier = {n: getattr(module, f"check_{n}") for n in others
               if callable(getattr(module, f"check_{n}", None))}
    try:
        with _hidden_block(worker)() if worker is not None else contextlib.nullcontext():
            _passed, broken = earlier_failures({n: namespace[n] for n in earlier}, earlier, seed)
    except HiddenTestsRefused:
        return None
    if broken is None:
        return None
    if isinstance(exc, CheckFailure):
        return exc.with_hint(fix_first_text(exercise, *broken))
    return CheckFailure(exercise, f"raised {type(exc).__name__}: {_one_line(str(exc))}",
                        hint=fix_first_text(exercise, *broken), seed=seed)


def _one_line(text: str, limit: int = 300) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


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
    chapter's checks echo this run's outcome.

    `nb` gets the outputs (stderr and the first error; for a test cell, those of the run here);
    the rest is returned: each failed test's verdict, and the tests whose run in the worker
    passed while the run here failed (`Execution.verdicts`, `.tampered`). A cell that runs past
    the time limit, kills the worker or breaks the protocol costs only itself (and what needs
    it), as a restarted Jupyter kernel would: it is skipped (`Execution.skipped_cells`: why), the
    worker restarted, the cells before it run again (their results stand) and the notebook goes
    on. The notebook's budget
    (`limits.notebook_time`) and `MAX_RESTARTS` bound it all. Raises GradingIncident if any of
    a worker's processes survive it, and WorkerCannotStart if the first worker does not start.
    """
    return _NotebookRun(nb, source, limits, Path(workdir), WorkerLibrary(chapter, source_dir),
                        hide).run()


MAX_RESTARTS = 8  # workers started again after a fault, per notebook (the budget bounds it too)


class _NotebookRun:
    """One notebook's run: the cells in order, the worker restarted past a cell that hangs or
    crashes it."""

    def __init__(self, nb, source, limits, workdir: Path, library: WorkerLibrary, hide):
        self.nb, self.limits, self.workdir, self.library, self.hide = \
            nb, limits, workdir, library, hide
        self.imports = chapter_namespace(source)
        self.modules = ["torch", "checks", f"checks.nb{library.chapter[:2]}",
                        *notebook_imports(source)]
        self.kinds = exercise_kinds(source)
        self.budget = time.monotonic() + limits.notebook_time if limits.notebook_time else None
        self.completed: set[int] = set()  # cells that ran to the end (their results stand)
        self.replay: list[int] = []  # of those, the ones a restarted worker runs again
        self.echoes: dict[int, Echo] = {}  # a test cell's outcome, echoed again on a replay
        self.verdicts: dict[int, Verdict] = {}  # the failed tests' verdicts
        self.tampered: set[int] = set()  # tests whose run in the worker passed, here failed
        self.skipped: dict[int, str] = {}  # cells that hung or crashed the worker: why
        self.hung: dict[str, str] = {}  # exercises whose call ran out of time: {name: cell id}
        self.avoided: dict[int, str] = {}  # test cells not run: they call a hung exercise
        self.stop: str | None = None  # why the cells from some point on were not run
        self.restarts = 0
        self.worker: Worker | None = None
        self.mode, self.uid = "", None
        self.left_behind: list[int] = []

    def run(self) -> Execution:
        try:
            self._run_cells()
        finally:
            self._close_worker()
        if self.left_behind:
            raise GradingIncident([], [f"process {pid}" for pid in self.left_behind], OUTLIVED)
        return Execution(self.completed, self._error(), self.mode, self.uid,
                         skipped={_describe_cell(self.nb, i): why for i, why in
                                  sorted({**self.skipped, **self.avoided}.items())},
                         verdicts=dict(self.verdicts),
                         skipped_cells={**self.skipped, **self.avoided},
                         tampered=set(self.tampered))

    def _run_cells(self) -> None:
        try:
            with using_default():  # a failure here is the instructor's to read
                self._start_worker()
                self._self_test()
        except WorkerGone as gone:
            # None of the submission's code has run yet: the grader's own environment failed
            # (the worker's Python, its imports, the walls), and no score is fair.
            raise WorkerCannotStart(str(gone)) from None
        for index, cell in enumerate(self.nb.cells):
            if self.budget is not None and time.monotonic() >= self.budget:
                self.stop = _("Before {cell}: the notebook ran past its {seconds} s budget "
                              "(--notebook-timeout); the cells from there on were not run.").format(
                    cell=_describe_cell(self.nb, index), seconds=f"{self.limits.notebook_time:g}")
                return
            if self._avoid(index, cell):
                continue
            try:
                self._run_cell(index, cell)
            except WorkerGone as gone:
                self.skipped[index] = str(gone)
                cell.outputs = []
                if not self._restart(index):
                    return
                continue
            self.completed.add(index)
            self.replay.append(index)
            if not is_graded_test(cell):  # a new definition gets its own chance
                for name in defined_names(cell.source):
                    self.hung.pop(name, None)

    def _avoid(self, index: int, cell) -> bool:
        """A test cell that calls an exercise whose call already ran out of time is skipped at
        once, saying so (it would only wait for the time limit again)."""
        if not self.hung or not is_graded_test(cell):
            return False
        try:
            names = _names_from_learner(cell.source, self.imports)
        except SyntaxError:
            return False
        name = next((n for n in names if n in self.hung), None)
        if name is None:
            return False
        self.avoided[index] = _("it calls `{name}`, which ran past the time limit in test cell "
                                "{cell}; not called again").format(name=name,
                                                                   cell=self.hung[name])
        cell.outputs = []
        return True

    def _run_cell(self, index: int, cell) -> None:
        worker = self.worker
        if not is_graded_test(cell):
            cell.outputs = _as_outputs(worker.run_cell(index, cell.source))
            return
        here = _grader_side_test(cell, worker, self.imports, self.kinds, self.limits, self.hung)
        echo: Echo = "passed" if here["ok"] else (here["ename"], here["evalue"])
        self.echoes[index] = echo
        inside = worker.run_cell(index, worker_source(cell), echo)
        if inside["ok"] and not here["ok"]:
            self.tampered.add(index)
        # Only this process's run counts: the worker's may fail for reasons of its own (a
        # hidden test that uses a reference function the worker does not have).
        cell.outputs = _as_outputs(here)
        if here.get("verdict"):
            self.verdicts[index] = here["verdict"]

    def _restart(self, broken: int) -> bool:
        """A fresh worker with the notebook's state up to `broken` (without it): the cells that
        completed before it run again, in order; one that fails again this way is left out of
        later replays too. False (and `stop` says why) when the notebook cannot go on."""
        where = _describe_cell(self.nb, broken)
        while True:
            if self.budget is not None and time.monotonic() >= self.budget:
                self.stop = _("After {cell}: the notebook's {seconds} s budget is spent; the "
                              "cells after it were not run.").format(
                    cell=where, seconds=f"{self.limits.notebook_time:g}")
                return False
            if self.restarts >= MAX_RESTARTS:
                self.stop = _("After {cell}: the worker was restarted {count} times, the most "
                              "for one notebook; the cells after it were not run.").format(
                    cell=where, count=MAX_RESTARTS)
                return False
            self.restarts += 1
            self._close_worker()
            try:
                self._start_worker()
            except WorkerGone as gone:
                self.stop = _("After {cell}: {why}; the cells after it were not run.").format(
                    cell=where, why=gone)
                return False
            failed = self._replay()
            if failed is None:
                return True
            self.replay.remove(failed)

    def _replay(self) -> int | None:
        """Run the replayed cells again (outputs discarded); the one that ended the worker, if
        any."""
        for index in self.replay:
            cell = self.nb.cells[index]
            try:
                if is_graded_test(cell):
                    self.worker.begin_test(self.worker.deadline())
                source = worker_source(cell) if is_graded_test(cell) else cell.source
                self.worker.run_cell(index, source, self.echoes.get(index))
            except WorkerGone:
                return index
        return None

    def _self_test(self) -> None:
        """Before any of the submission's code: the worker imports what grading needs (torch,
        the course's package, the graded chapter's checks, what the chapter's notebook itself
        imports), none bound in the notebook's namespace. A failure is the environment's (a
        Python without torch, a wall that hides site-packages), never the submission's: the
        notebook is not scored (WorkerCannotStart)."""
        done = self.worker.run_cell(-1, self_test_source(self.modules))
        if not done["ok"]:
            raise WorkerGone(_("the worker's self-test failed: {error}: {text}").format(
                error=done["ename"], text=_one_line(done["evalue"], 200)))

    def _start_worker(self) -> None:
        self.worker = Worker(self.workdir, self.limits, self.library, hide=self.hide,
                             budget=self.budget)
        self.mode, self.uid = self.worker.mode, self.worker.uid

    def _close_worker(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.left_behind += getattr(self.worker, "left_behind", [])
            self.worker = None

    def _error(self) -> str | None:
        """What went wrong, in order: each skipped cell, then an early stop (sentences)."""
        parts = [_("In {cell}: {why}; that cell was skipped (the worker restarted and the cells "
                   "before it run again).").format(cell=_describe_cell(self.nb, index), why=why)
                 for index, why in sorted(self.skipped.items())]
        parts += [_("{cell} was skipped: {why}.").format(cell=_describe_cell(self.nb, index),
                                                         why=why)
                  for index, why in sorted(self.avoided.items())]
        if self.stop:
            parts.append(self.stop)
        # Chinese sentences follow one another without a space; English ones after one.
        return ("" if language() == "zh" else " ").join(parts) if parts else None


def _describe_cell(nb, index: int | None) -> str:
    """'answer cell head_dim', 'test cell check_head_dim' or 'the cell starting "x = 1"'."""
    if index is None:
        return _("an unknown cell")
    cell = nb.cells[index]
    gid = grade_id(cell)
    if gid:
        kind = _("test cell {id}") if is_graded_test(cell) else _("answer cell {id}")
        return kind.format(id=gid)
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    first = first if len(first) <= 40 else first[:37] + "..."
    return _("the cell starting {code}").format(code=repr(first))
