"""The grading trust boundary: the learner's code runs in a worker process that the grader
controls, walls in, and never trusts.

Two processes:

- the grader (trusted): the source notebooks (which cells are tests, their points, which
  exercises are functions and which are classes), the course's checkers and reference;
- a worker per submission (untrusted): runs the submission's code cells, and the learner's
  functions when the grader asks for them.

What decides a grade happens in the grader. Each exercise name a test cell uses is, in the
grader, a `RemoteFunction`: calling it sends the arguments to the worker, calls the learner's
function there, and brings the result back as data that `checks.grader.wire` decodes without running
any of the worker's code (plain types, capped sizes, no expanded tensors, bounded decoding time).
Objects that are not plain data come back as `RemoteObject` handles (a class exercise's
instances: attributes and methods are fetched and called in the worker). Tensors that track
gradients cross too: the grader's autograd calls the worker for the backward pass (and the
worker calls the grader back for callables the grader handed it). Callables and objects of the
checkers that the learner's function receives stay in the grader; the worker gets stubs whose
calls come back as callbacks.

The worker cannot reach the answers:

- it imports a copy of `checks` made for the chapter it runs (`WorkerLibrary`): the graded
  chapter's checkers are stubs, and every `checks.reference` function of that chapter and of the
  later ones is withheld (a stub that raises), so neither the checkers nor the answers are in
  its memory. Modules that hold answers must live in `checks/reference/`;
- run as root (CI, an instructor's grading box), the worker is started by `checks/grader/jail.py`:
  its own memory cgroup, PID, mount, network and IPC namespaces, an unprivileged user id, and a
  view of the file system in which the repository, the source notebooks, the submissions, the
  grader's home and every temporary folder are empty (only the Python installation is bound
  back, read-only). When its PID namespace's first process ends, the kernel kills everything the
  worker started; the grader also kills the cgroup's processes and checks that none is left.
  Workers are forked from a zygote, a process that has imported torch and nothing of the course,
  so that a worker starts in a fraction of a second.
- without root (or without these kernel features), the worker runs as the same user with
  resource limits, its own session, a private folder, a minimal environment and its memory
  watched; the files of the course stay readable to it, which the report says.

Each test cell runs twice. First here, with the grader's own checkers and torch; this run decides
the points. Then in the worker, in the notebook's namespace, as Jupyter would: there the graded
chapter's `check_*` functions are stubs that repeat the grader's verdict, so an honest notebook
gets the same outcome, and a notebook whose own run passes while the grader's failed has tampered
with something (`tampering suspected` in the report).

Watching from inside the worker is advice only: the forbidden-library-function guard (for
example chapter 04's "no library softmax") runs in the worker, where the notebook could switch it
off; a detection still fails the test, marked "seen inside the worker".
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import functools
import io
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..context import AUDIT_ENV, PROTECT_ENV
from ..engine import calling as engine_calling
from . import wire as _wire
from .wire import ProtocolError, RemoteRef, Unsendable

PACKAGE = Path(__file__).resolve().parents[1]  # checks/
MAX_MESSAGE = 64 * 2**20  # bytes in one message from the worker; more ends the worker
MAX_TEXT = 64 * 1024  # characters of any text the grader keeps from one reply
WORKER_UID_BASE = 61000  # unprivileged user ids for workers (root only); none may exist
LIB_TARGET = "/tmp/.checks-lib"  # where the worker sees its copy of `checks` (namespaces)
SCRATCH = "/tmp/work"  # the worker's home, working and temporary folder (namespaces)

__all__ = ["Limits", "Worker", "WorkerGone", "WorkerLibrary", "RemoteFunction", "RemoteObject",
           "Unsendable", "isolation_mode"]


@dataclass(frozen=True)
class Limits:
    """Resource limits for one submission's worker. Defaults fit a 2-core, 8 GiB grading box."""

    cell_timeout: float = 120.0  # wall-clock seconds per cell (and per test cell's calls)
    memory: int = 3 * 2**30  # bytes of memory the worker and its processes may use; 0: none
    cpu: int = 900  # CPU seconds for the whole worker (RLIMIT_CPU)
    output: int = 64 * 2**20  # bytes the worker may write to any file, its log included
    stderr_kept: int = 4000  # characters of a cell's stderr kept for the report
    threads: int = 0  # torch / OpenMP threads in the worker; 0: every core this process has
    memory_by: str = "auto"  # "cgroup" (the kernel counts and limits), "rss" (watched), "auto"
    isolation: str = "auto"  # "namespaces" (root: walls, own user), "none", "auto"


# --------------------------------------------------------------------------------------------
# Framing: 8-byte big-endian length + payload


def _send(fd: int, payload: bytes) -> None:
    view = memoryview(struct.pack(">Q", len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None = None, limit: int = MAX_MESSAGE) -> bytes:
    (size,) = struct.unpack(">Q", _read_exact(fd, 8, deadline))
    if size > limit:
        raise OverflowError(size)
    return _read_exact(fd, size, deadline)




class WorkerGone(BaseException):
    """The worker died, ran past a limit or broke the protocol. A BaseException, so that no
    checker's `except Exception` turns it into an ordinary failure."""


def _flat_tensors(value: Any, out: list | None = None, depth: int = 0) -> list:
    """The tensors in nested lists, tuples and dict values, in order (both sides agree)."""
    import torch

    out = [] if out is None else out
    if depth > _wire.MAX_DEPTH:
        return out
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flat_tensors(v, out, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            _flat_tensors(v, out, depth + 1)
    return out


def _map_leaves(value: Any, leaf, max_depth: int, depth: int = 0) -> Any:
    """`value` rebuilt with `leaf(x)` for everything that is not a plain list, tuple or dict
    (exact types: subclasses are leaves), front to back; below `max_depth`, left as it is."""
    if depth > max_depth:
        return value
    if type(value) is list:
        return [_map_leaves(v, leaf, max_depth, depth + 1) for v in value]
    if type(value) is tuple:
        return tuple(_map_leaves(v, leaf, max_depth, depth + 1) for v in value)
    if type(value) is dict:
        return {k: _map_leaves(v, leaf, max_depth, depth + 1) for k, v in value.items()}
    return leaf(value)


def _replace_tensors(value: Any, new: list) -> Any:
    """`value` with its tensors (in `_flat_tensors` order) taken from `new`, front first."""
    import torch

    return _map_leaves(value, lambda x: new.pop(0) if isinstance(x, torch.Tensor) else x,
                       _wire.MAX_DEPTH)


def _grad_leaf(t):
    """Unpickling helper: a tensor that tracks gradients from here on (a leaf)."""
    return t.requires_grad_(True) if t.is_floating_point() else t


def _attach_autograd(value: Any, flags: list[bool], leaves: list, backward) -> Any:
    """`value` whose flagged tensors become outputs of an autograd node over `leaves`, with
    `backward(grads of the flagged outputs) -> grads of the leaves` (computed elsewhere)."""
    import torch

    outs = _flat_tensors(value)
    wanted = [o for o, f in zip(outs, flags) if f]
    if not leaves or not wanted:
        return value

    class Remote(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.set_materialize_grads(False)
            return tuple(o.view_as(o) for o in wanted)

        @staticmethod
        def backward(ctx, *grads):
            got = backward(list(grads))
            if len(got) != len(leaves):
                raise RuntimeError("the gradients that came back do not match the inputs")
            checked = []
            for g, leaf in zip(got, leaves):
                if g is not None and (not isinstance(g, torch.Tensor) or g.shape != leaf.shape):
                    raise RuntimeError("a gradient that came back has the wrong shape")
                checked.append(None if g is None else g.to(leaf.dtype))
            return tuple(checked)

    attached = list(Remote.apply(*leaves))
    replaced = [attached.pop(0) if f else o for o, f in zip(outs, flags)]
    return _replace_tensors(value, replaced)


# --------------------------------------------------------------------------------------------
# The worker's copy of `checks`

# What the worker may import, by path under checks/ (an allow-list: a module added later stays
# with the grader until it is named here). The learner-facing core, the reference (answers of the
# graded chapter and later ones withheld), the model loader, and the worker's side of the wire.
WORKER_GRADER_MODULES = ("grader/__init__.py", "grader/sandbox.py", "grader/wire.py")
WORKER_MODULES = ("__init__.py", "config.py", "context.py", "display.py", "engine.py",
                  "borrow.py", "figures.py", "diagrams.py", "timing.py", "nb[0-9][0-9].py",
                  "reference/*.py", "smollm/*.py", *WORKER_GRADER_MODULES)
_library_plans: dict[tuple, tuple[dict[str, bytes], dict[str, set[str] | None]]] = {}


def _chapter_number(chapter: str) -> int:
    return int(chapter[:2])


def _answer_names(source_dir: Path) -> dict[str, int]:
    """Every exercise name (answer cells' grade_ids and the functions and classes they
    define) with the chapter that asks for it."""
    names: dict[str, int] = {}
    for path in sorted(Path(source_dir).glob("[0-9][0-9]_*/*.ipynb")):
        if path.stem != path.parent.name:
            continue
        number = _chapter_number(path.stem)
        for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
            meta = cell.get("metadata", {}).get("nbgrader") or {}
            if cell.get("cell_type") != "code" or not meta.get("solution"):
                continue
            found = {meta.get("grade_id")} | set(defined_names("".join(cell.get("source", ""))))
            for name in filter(None, found):
                names[name] = min(number, names.get(name, number))
    return names


def defined_names(source: str) -> dict[str, str]:
    """Top-level functions and classes a cell defines: {name: "function" | "class"}."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {node.name: "class" if isinstance(node, ast.ClassDef) else "function"
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _imported_from(source_dir: Path, chapter: str, module: str) -> set[str]:
    """Names the chapter's source notebook imports from `module` outside its test cells."""
    path = Path(source_dir) / chapter / f"{chapter}.ipynb"
    names: set[str] = set()
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if cell.get("cell_type") != "code" or meta.get("grade"):
            continue
        try:
            tree = ast.parse("".join(cell.get("source", "")))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                names |= {alias.name for alias in node.names}
    return names


def _top_defs(tree: ast.Module) -> dict[str, ast.stmt]:
    defs: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defs[name.id] = node
    return defs


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _withheld_reference(answers: dict[str, int], graded: int
                        ) -> tuple[dict[str, bytes], dict[str, set[str]]]:
    """checks/reference/*.py for a worker grading chapter `graded`: every function or class of
    that chapter and of the later ones replaced by a stub that raises.

    A definition's chapter: an exercise's own; a helper's, the earliest chapter whose exercise
    uses it (directly or through other helpers); a helper no exercise uses, the latest chapter
    its module serves (a module serving none counts as beyond every chapter)."""
    folder = PACKAGE / "reference"
    trees = {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py"))
             if p.stem != "__init__"}
    defs = {(m, n): node for m, tree in trees.items() for n, node in _top_defs(tree).items()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    aliases: dict[tuple[str, str], tuple[str, str]] = {}
    for m, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in trees:
                for alias in node.names:
                    aliases[(m, alias.asname or alias.name)] = (node.module, alias.name)
    uses = {}
    for (m, n), node in defs.items():
        found = set()
        for name in _names_used(node):
            target = (m, name) if (m, name) in defs else aliases.get((m, name))
            if target in defs and target != (m, n):
                found.add(target)
        uses[(m, n)] = found
    chapter: dict[tuple[str, str], int] = {key: answers[key[1]] for key in defs
                                           if key[1] in answers}
    module_last = {m: max([c for (mm, _), c in chapter.items() if mm == m], default=99)
                   for m in trees}
    for key in defs:
        if key in chapter:
            continue
        reached = [c for start, c in chapter.items() if key in _closure(start, uses)]
        chapter[key] = min(reached) if reached else module_last[key[0]]
    files: dict[str, bytes] = {}
    withheld: dict[str, set[str]] = {}
    for m, tree in trees.items():
        names = {n for (mm, n), c in chapter.items() if mm == m and c >= graded}
        withheld[f"checks.reference.{m}"] = names
        if names:
            body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) and \
                isinstance(tree.body[0].value, ast.Constant) else tree.body  # no docstring
            tree.body = [_stub(node, graded) if getattr(node, "name", None) in names else node
                         for node in body]
            files[f"reference/{m}.py"] = (ast.unparse(tree) + "\n").encode()
    return files, withheld


def _closure(start, uses) -> set:
    seen, todo = set(), [start]
    while todo:
        for nxt in uses.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _stub(node: ast.stmt, graded: int) -> ast.stmt:
    message = (f"checks.reference.{node.name} is withheld while chapter {graded:02d} is graded: "
               "the grader keeps the course's answers to itself")
    raise_ = ast.Raise(exc=ast.Call(func=ast.Name("RuntimeError", ast.Load()),
                                    args=[ast.Constant(message)], keywords=[]), cause=None)
    args = ast.arguments(posonlyargs=[], args=[], vararg=ast.arg("args"), kwonlyargs=[],
                         kw_defaults=[], kwarg=ast.arg("kwargs"), defaults=[])
    if isinstance(node, ast.ClassDef):
        init = ast.FunctionDef(name="__init__", args=ast.arguments(
            posonlyargs=[], args=[ast.arg("self")], vararg=ast.arg("args"), kwonlyargs=[],
            kw_defaults=[], kwarg=ast.arg("kwargs"), defaults=[]), body=[raise_],
            decorator_list=[], returns=None, type_comment=None)
        return ast.fix_missing_locations(ast.ClassDef(
            name=node.name, bases=[], keywords=[], body=[init], decorator_list=[]))
    return ast.fix_missing_locations(ast.FunctionDef(
        name=node.name, args=args, body=[raise_], decorator_list=[], returns=None,
        type_comment=None))


def _checker_stub(module: str, graded_chapter: str, source_dir: Path) -> tuple[bytes, set[str]]:
    """checks/nbNN.py for the worker grading chapter NN: each `check_*` repeats the grader's
    verdict (`verdict_check`); the helpers the notebook imports from the module, and tensor
    subclasses the checkers hand to the learner's functions, are copied with what they use."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    defs = _top_defs(tree)
    checks = [n for n, node in defs.items() if n.startswith("check_")
              and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    wanted = {n for n in _imported_from(source_dir, graded_chapter, f"checks.{module}")
              if n in defs and not n.startswith("check_")}
    wanted |= {n for n, node in defs.items() if isinstance(node, ast.ClassDef) and any(
        ast.unparse(b).endswith("Tensor") for b in node.bases)}
    keep = set(wanted)
    todo = list(wanted)
    while todo:
        for name in _names_used(defs[todo.pop()]):
            if name in defs and name not in keep and not name.startswith("check_"):
                keep.add(name)
                todo.append(name)
    body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    seen: set[int] = set()
    for node in tree.body:
        names = [n for n, d in defs.items() if d is node]
        if any(n in keep for n in names) and id(node) not in seen:
            seen.add(id(node))
            body.append(node)
    lines = [f'"""Chapter {graded_chapter[:2]}\'s checks, withheld from the worker that runs a '
             f'chapter {graded_chapter[:2]} notebook for the grader: each check repeats the '
             'grader\'s verdict."""', "from __future__ import annotations",
             ast.unparse(ast.Module(body=body, type_ignores=[])),
             "from checks.grader.sandbox import verdict_check as _verdict_check"]
    lines += [f"{name} = _verdict_check({name!r})" for name in checks]
    return ("\n".join(lines) + "\n").encode(), keep | set(checks)


def worker_module_paths() -> list[Path]:
    """The files of `checks` that the worker's copy is built from (WORKER_MODULES)."""
    found = {path for pattern in WORKER_MODULES for path in PACKAGE.glob(pattern)}
    return sorted(found)


class WorkerLibrary:
    """The worker's copy of `checks` for one chapter (see the module docstring).

    `build(folder)` writes it to `folder/checks`; `has(module, name)` says whether the worker can
    import `module.name` (what cannot stays in the grader when it is handed to the learner)."""

    def __init__(self, chapter: str, source_dir: str | os.PathLike):
        self.chapter = chapter
        self.source_dir = Path(source_dir)
        stamp = tuple(sorted((str(p), p.stat().st_mtime_ns) for p in [
            *PACKAGE.rglob("*.py"), *self.source_dir.glob("*/*.ipynb")]))
        key = (chapter, str(self.source_dir), stamp)
        if key not in _library_plans:
            _library_plans.clear()
            _library_plans[key] = self._plan()
        self.files, self.available = _library_plans[key]

    def _plan(self) -> tuple[dict[str, bytes], dict[str, set[str] | None]]:
        graded = _chapter_number(self.chapter)
        # Which chapter asks for which function: from every chapter's source (a --source folder
        # may hold only some chapters; the course's own solutions/ fill in the rest).
        answers = _answer_names(PACKAGE.parent / "solutions")
        for name, number in _answer_names(self.source_dir).items():
            answers[name] = min(number, answers.get(name, number))
        files: dict[str, bytes] = {}
        available: dict[str, set[str] | None] = {}
        reference, withheld = _withheld_reference(answers, graded)
        for path in worker_module_paths():
            rel = path.relative_to(PACKAGE).as_posix()
            module = "checks." + rel.removesuffix(".py").replace("/", ".").removesuffix(
                ".__init__")
            if rel.startswith("nb") and rel[2:4].isdigit() and "/" not in rel:
                number = int(rel[2:4])
                if number > graded:
                    continue
                if number == graded:
                    files[rel], names = _checker_stub(rel[:-3], self.chapter, self.source_dir)
                    available[module] = names
                    continue
            files[rel] = reference.get(rel, path.read_bytes())
            available[module] = None
            if module in withheld:
                available[module] = {n for n in _top_defs(ast.parse(path.read_bytes()))
                                     if n not in withheld[module]}
        return files, available

    def has(self, module: str, name: str) -> bool:
        if module not in self.available:
            return not module.startswith("checks.") and module != "checks"
        names = self.available[module]
        return names is None or name.split(".")[0] in names

    def build(self, folder: Path) -> Path:
        for rel, data in self.files.items():
            target = folder / "checks" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(target.parent, 0o755)
            target.write_bytes(data)
            os.chmod(target, 0o644)
        os.chmod(folder, 0o755)
        return folder


# --------------------------------------------------------------------------------------------
# Walls: namespaces (root), memory cgroups, a watch on resident memory


def isolation_mode(requested: str = "auto") -> str:
    """"namespaces" when workers can be walled in (Linux, root, the kernel allows it), else
    "none". Asking for "namespaces" where it is impossible is an error."""
    if requested == "none":
        return "none"
    works = _namespaces_work()
    if requested == "namespaces" and not works:
        raise RuntimeError("workers cannot be walled in here (needs Linux, root and namespaces)")
    return "namespaces" if works else "none"


@functools.lru_cache(maxsize=1)
def _namespaces_work() -> bool:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory(prefix="checks-probe-") as tmp:
        config = {"grader": os.getpid(), "probe": True, "hide": [tmp], "reveal": [],
                  "lib": tmp, "lib_target": LIB_TARGET, "scratch": SCRATCH, "uid": 65534,
                  "gid": 65534, "tmp_size": 2**20, "cgroup_procs": None}
        try:
            done = subprocess.run([sys.executable, "-I", "-S", str(PACKAGE / "grader" / "jail.py"),
                                   json.dumps(config)], capture_output=True, timeout=30, env={})
        except (OSError, subprocess.SubprocessError):
            return False
    return done.returncode == 0


_uid_lock = None


def _worker_uid() -> int:
    """An unprivileged user id no account and no other grading process uses (held per
    process, so that parallel graders' workers never share one)."""
    import fcntl
    import pwd

    global _uid_lock
    if _uid_lock is not None:
        return _uid_lock[0]
    for uid in range(WORKER_UID_BASE, WORKER_UID_BASE + 4000):
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        handle = open(Path(tempfile.gettempdir()) / f".checks-worker-uid-{uid}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _uid_lock = (uid, handle)
        return uid
    raise RuntimeError("no free user id for grading workers")


class MemoryCgroup:
    """A memory cgroup for one worker (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`):
    the kernel counts the memory the worker and its processes use (not address space reserved)
    and kills within the group at the limit."""

    _count = 0

    def __init__(self, path: Path, version: int):
        self.path = path
        self.version = version

    @classmethod
    def create(cls, limit: int) -> "MemoryCgroup | None":
        found = _own_memory_cgroup()
        if found is None:
            return None
        base, version = found
        cls._count += 1
        path = base / f"checks-worker-{os.getpid()}-{cls._count}"
        try:
            path.mkdir()
            if version == 2:
                (path / "memory.max").write_text(str(limit))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    with contextlib.suppress(OSError):
                        (path / name).write_text(value)
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path, version)

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in self.procs.read_text().split()]
        except OSError:
            return []

    def oom_killed(self) -> bool:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
            if self.version == 1:
                return int((self.path / "memory.failcnt").read_text()) > 0 and \
                    int((self.path / "memory.max_usage_in_bytes").read_text()) >= \
                    int((self.path / "memory.limit_in_bytes").read_text())
        except (OSError, ValueError):
            pass
        return False

    def kill_all(self, timeout: float = 10.0) -> bool:
        """SIGKILL every process in the group until none is left; remove the group. True when
        it is empty."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")
        while True:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        for _ in range(100):
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
        return True


def _own_memory_cgroup() -> tuple[Path, int] | None:
    """This process's memory cgroup folder, if a child can be made in it, and its version."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    where: dict[str, tuple[str, str]] = {}
    for line in mounts:
        fields = line.split()
        if " - " not in line:
            continue
        fstype, _, options = line.split(" - ", 1)[1].split(" ")[:3]
        if fstype == "cgroup2":
            where["v2"] = (fields[4], fields[3])
        elif fstype == "cgroup" and "memory" in options.split(","):
            where["v1"] = (fields[4], fields[3])
    for line in lines:
        ident, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if ident == "0" and "v2" in where:
            mount, root = where["v2"]
            base = Path(mount) / path.removeprefix(root).lstrip("/")
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "memory" in enabled and os.access(base, os.W_OK):
                return base, 2
    for line in lines:
        ident, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(",") and "v1" in where:
            mount, root = where["v1"]
            base = Path(mount) / path.removeprefix(root).lstrip("/")
            if (base / "memory.limit_in_bytes").exists() and os.access(base, os.W_OK):
                return base, 1
    return None


def _processes() -> list[tuple[int, int, int, int, int]]:
    """(pid, ppid, session, uid, resident bytes) of every process this one can see."""
    page = os.sysconf("SC_PAGE_SIZE")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            uid = os.stat(f"/proc/{name}").st_uid
            with open(f"/proc/{name}/statm", "rb") as f:
                resident = int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        found.append((int(name), int(stat[1]), int(stat[3]), uid, resident))
    return found


def _tree(root: int, uid: int | None) -> list[tuple[int, int]]:
    """(pid, resident bytes) of `root`'s processes: those of user `uid` (a worker's own user
    id), else those in its session or descending from it."""
    procs = _processes()
    if uid is not None:
        return [(p, rss) for p, _, _, u, rss in procs if u == uid]
    parent = {p: pp for p, pp, _, _, _ in procs}
    mine = []
    for p, _, sid, _, rss in procs:
        q, steps = p, 0
        while q not in (0, 1, root) and steps < 64:
            q, steps = parent.get(q, 0), steps + 1
        if sid == root or q == root:
            mine.append((p, rss))
    return mine


class _MemoryWatch(threading.Thread):
    """Where no cgroup can be made: sums the resident memory of the worker's processes several
    times a second and kills them all above the limit."""

    def __init__(self, root: int, uid: int | None, limit: int):
        super().__init__(daemon=True)
        self.root, self.uid, self.limit = root, uid, limit
        self.exceeded = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            tree = _tree(self.root, self.uid)
            used = sum(rss for _, rss in tree)
            if used > self.limit:
                self.exceeded = used
                for pid, _ in tree:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                return


def _installed_course() -> set[str]:
    """Where an installed `checks` package lives: the folder an editable install points at
    (its finder in site-packages names it) and a regular install's package folder."""
    import re
    import site

    found: set[str] = set()
    for folder in {*site.getsitepackages(), *sys.path}:
        if not folder or not os.path.isdir(folder):
            continue
        if os.path.isdir(os.path.join(folder, "checks", "reference")):
            found.add(os.path.realpath(os.path.join(folder, "checks")))
        for name in os.listdir(folder):
            if name.startswith("__editable__") and name.endswith(".py"):
                with contextlib.suppress(OSError):
                    text = Path(folder, name).read_text(encoding="utf-8", errors="replace")
                    found |= {os.path.realpath(os.path.dirname(p)) for p in re.findall(
                        r"'checks': '([^']+)'", text)}
    return {p for p in found if os.path.isdir(p)}


def worker_environment(threads: int, lib: str, scratch: str, audit: bool = False
                       ) -> dict[str, str]:
    """The worker's whole environment: nothing of the grader's (no secret an instructor set),
    the grading flag, its thread share, and its copy of `checks`."""
    from ..context import THREADS_ENV, grading_environment

    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
           "USER": "grader", "LOGNAME": "grader", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONPATH": lib,
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": os.path.join(scratch, ".matplotlib"),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           THREADS_ENV: str(threads)}
    if audit:
        env[AUDIT_ENV] = "1"
    return grading_environment(env)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------
# The grader's side


class _Session:
    """What one test shares with the worker: storages received, grader objects lent, graphs."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.storages = _wire.Storages()
        self.lent: dict[int, Any] = {}
        self.ident: dict[int, int] = {}
        self.graphs: dict[int, tuple[list, list]] = {}

    def lend(self, obj) -> int:
        key = id(obj)
        if key not in self.ident:
            self.ident[key] = len(self.lent) + 1
            self.lent[self.ident[key]] = obj
        return self.ident[key]


class _ArgPickler(pickle.Pickler):
    """Pickles what the grader sends (the worker trusts the grader): the worker's own objects
    go back by handle; what the worker cannot or must not have stays here as a stub."""

    def __init__(self, file, worker: "Worker", keep_grad: bool):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.worker = worker
        self.keep_grad = keep_grad

    def persistent_id(self, obj):
        if isinstance(obj, RemoteObject):
            return ("worker", obj._handle)
        if isinstance(obj, RemoteFunction):
            return ("name", obj._name)
        if self.worker._stays_here(obj):
            return ("grader", self.worker.session.lend(obj),
                    str(getattr(obj, "__name__", type(obj).__name__)))
        return None

    def reducer_override(self, obj):
        import torch

        if isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter) \
                and obj.requires_grad and (not self.keep_grad or obj.grad_fn is not None
                                           or type(obj) is not torch.Tensor):
            return (_grad_leaf, (obj.detach(),)) if self.keep_grad else \
                (_identity, (obj.detach(),))
        return NotImplemented


def _identity(x):
    return x


class Worker:
    """One submission's worker process, seen from the grader."""

    def __init__(self, workdir: str | os.PathLike, limits: Limits, library: WorkerLibrary, *,
                 hide: list | tuple = ()):
        self.limits = limits
        self.library = library
        self.stderr_text = ""  # stderr the learner's code wrote during the current test's calls
        self.dead: str | None = None
        self.cgroup: MemoryCgroup | None = None
        self.watch: _MemoryWatch | None = None
        self.session = _Session(time.monotonic() + limits.cell_timeout)
        self.mode = isolation_mode(limits.isolation)
        self.uid = _worker_uid() if self.mode == "namespaces" else None
        workdir = Path(workdir)
        threads = max(1, limits.threads or cores())
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        fds = (to_worker_r, from_worker_w)
        self.log = workdir / "worker.log"
        lib = library.build(workdir / "lib")
        seen_lib = LIB_TARGET if self.mode == "namespaces" else str(lib)
        argv = [sys.executable, "-I", "-c",
                f"import sys; sys.path.insert(0, {seen_lib!r}); from checks.grader.sandbox import "
                f"worker_main; worker_main({to_worker_r}, {from_worker_w})"]
        self.process = None
        try:
            if limits.memory and limits.memory_by in ("auto", "cgroup"):
                self.cgroup = MemoryCgroup.create(limits.memory)
                if self.cgroup is None and limits.memory_by == "cgroup":
                    raise RuntimeError("no memory cgroup can be made here (--memory-by cgroup)")
            with open(self.log, "wb") as log, open(os.devnull, "rb") as null:
                if self.mode == "namespaces":
                    config = self._jail_config(argv, threads, lib, fds, hide)
                    self.process = _zygote_spawn(config, [*fds, log.fileno()])
                    if self.process is None:  # no zygote: a fresh Python behind the walls
                        self.process = subprocess.Popen(
                            [sys.executable, "-I", "-S", str(PACKAGE / "grader" / "jail.py"),
                             json.dumps(config)],
                            stdin=null, stdout=log, stderr=log, pass_fds=fds, env={},
                            start_new_session=True, preexec_fn=_no_core)
                else:
                    scratch = workdir / "cwd"
                    scratch.mkdir(exist_ok=True)
                    env = worker_environment(threads, str(lib), str(scratch), audit=True)
                    env[PROTECT_ENV] = os.pathsep.join(
                        str(Path(p).resolve()) for p in [*hide, PACKAGE.parent])
                    self.process = subprocess.Popen(
                        argv, stdin=null, stdout=log, stderr=log, cwd=scratch, env=env,
                        pass_fds=fds, preexec_fn=functools.partial(_rlimits, limits),
                        start_new_session=True)
        except BaseException:
            self.close()  # the cgroup made for it goes too
            raise
        finally:
            os.close(to_worker_r)
            os.close(from_worker_w)
        if limits.memory and self.cgroup is None:
            self.watch = _MemoryWatch(self.process.pid, self.uid, limits.memory)
            self.watch.start()
        try:
            self._serve("ready", time.monotonic() + max(60.0, limits.cell_timeout))
        except WorkerGone as gone:
            raise WorkerGone(f"the worker did not start: {gone}{self._log_tail()}") from None

    def _jail_config(self, argv, threads, lib: Path, fds, hide) -> dict:
        limits = self.limits
        runtime = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                  sys.base_exec_prefix)}
        runtime |= {sys.prefix, os.path.dirname(os.path.dirname(os.path.realpath(
            sys.executable)))}
        hidden = {os.path.realpath(p) for p in hide if Path(p).exists()}
        hidden |= _installed_course()
        hidden |= {str(PACKAGE.parent), str(PACKAGE), os.path.realpath(os.path.expanduser("~")),
                   os.path.realpath(tempfile.gettempdir())}
        hidden = {p for p in hidden if p not in ("/", "/usr", "/etc", "/lib", "/bin", "/proc",
                                                 "/sys", "/dev", "/var", "/run")}
        reveal = sorted(p for p in runtime if any(p == h or p.startswith(h.rstrip("/") + "/")
                                                  for h in hidden | {"/tmp", "/var/tmp"}))
        rlimits = {"RLIMIT_CORE": 0, "RLIMIT_NPROC": 1024}
        if limits.cpu:
            rlimits["RLIMIT_CPU"] = int(limits.cpu)
        if limits.output:
            rlimits["RLIMIT_FSIZE"] = int(limits.output)
        return {"grader": os.getpid(), "python": sys.executable, "argv": argv,
                "env": worker_environment(threads, LIB_TARGET, SCRATCH), "uid": self.uid,
                "gid": self.uid, "cgroup_procs": str(self.cgroup.procs) if self.cgroup else None,
                "hide": sorted(hidden), "reveal": reveal, "lib": str(lib),
                "lib_target": LIB_TARGET, "scratch": SCRATCH,
                "tmp_size": max(limits.output or 0, 64 * 2**20), "rlimits": rlimits,
                "keep_fds": list(fds)}

    # ---- plumbing ----
    def _post(self, message: tuple) -> None:
        if self.dead:
            raise WorkerGone(self.dead)
        buffer = io.BytesIO()
        _ArgPickler(buffer, self, keep_grad=message[0] == "call").dump(message)
        try:
            _send(self._to_worker, buffer.getvalue())
        except OSError:
            self._gone(f"the worker stopped reading{self._exit_text()}")

    def _receive_reply(self, deadline: float) -> dict:
        try:
            data = _receive(self._from_worker, deadline)
        except TimeoutError:
            self._gone(f"ran longer than the {self.limits.cell_timeout:g} s limit")
        except EOFError:
            self._gone(f"the worker process died{self._exit_text()}")
        except OverflowError as size:
            self._gone(f"sent back {int(str(size)) / 2**20:.0f} MiB in one answer (limit "
                       f"{MAX_MESSAGE / 2**20:.0f} MiB)")
        try:
            reply = _wire.decode(data, self.session.storages)
        except ProtocolError as exc:
            self._gone(f"broke the grading protocol: {exc}")
        except Exception as exc:  # noqa: BLE001 - any decoding surprise ends the worker
            self._gone(f"broke the grading protocol ({type(exc).__name__})")
        finally:
            del data
        if not isinstance(reply, dict) or not isinstance(reply.get("kind"), str):
            self._gone("broke the grading protocol (not a reply)")
        return reply

    def _serve(self, expected: str, deadline: float) -> dict:
        """Wait for the reply, answering the worker's requests (callbacks) meanwhile."""
        while True:
            reply = self._receive_reply(deadline)
            kind = reply["kind"]
            if kind == expected:
                return reply
            if kind == "callback":
                self._answer(lambda: self._callback(reply))
            elif kind == "gattr":
                self._answer(lambda: self._grader_attribute(reply))
            elif kind == "cbackward":
                self._answer(lambda: self._callback_backward(reply))
            else:
                self._gone(f"broke the grading protocol (a {kind[:40]!r} reply)")

    def _lent(self, reply: dict):
        ident = reply.get("ident")
        if type(ident) is not int or ident not in self.session.lent:
            raise LookupError("an object the grader lent for an earlier test is gone")
        return self.session.lent[ident]

    def _grader_attribute(self, reply: dict):
        """A public attribute of an object the grader lent (a cache handle's `update`). Names
        starting with `_` are refused: they would lead from the object to the checker's state
        and the course's answers (`__self__`, `__class__`, `__globals__` ...)."""
        name = reply.get("name")
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise AttributeError(f"{str(name)[:40]!r} is not readable from the worker")
        return getattr(self._lent(reply), name)

    def _answer(self, compute) -> None:
        try:
            answer = ("result", True, compute())
        except (WorkerGone, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - the worker gets the error, not the grader
            answer = ("result", False, (type(exc).__name__, str(exc)[:2000]))
        try:
            self._post(answer)
        except (pickle.PicklingError, TypeError, AttributeError):
            self._post(("result", False, ("TypeError", "the grader could not send the result")))

    def _callback(self, reply: dict):
        import torch

        target = self._lent(reply)
        args, kwargs = _grader_value(reply.get("args"), self), _grader_value(
            reply.get("kwargs"), self)
        if not isinstance(args, tuple) or not isinstance(kwargs, dict) or \
                not all(type(k) is str for k in kwargs):
            raise TypeError("bad callback arguments")
        if reply.get("grad") is not True:
            return target(*args, **kwargs)
        leaves = [t for t in _flat_tensors((args, kwargs)) if t.requires_grad]
        with torch.enable_grad():
            value = target(*args, **kwargs)
        outs = _flat_tensors(value)
        flags = [bool(o.requires_grad) for o in outs]
        gid = None
        if leaves and any(flags):
            gid = len(self.session.graphs) + 1
            self.session.graphs[gid] = ([o for o, f in zip(outs, flags) if f], leaves)
        return (_replace_tensors(value, [o.detach() for o in outs]), gid, flags)

    def _callback_backward(self, reply: dict):
        import torch

        gid = reply.get("graph")
        grads = reply.get("grads")
        if type(gid) is not int or gid not in self.session.graphs or type(grads) is not list:
            raise TypeError("bad backward request")
        outs, leaves = self.session.graphs[gid]
        if len(grads) != len(outs):
            raise TypeError("bad backward request")
        pairs = [(o, g) for o, g in zip(outs, grads) if isinstance(g, torch.Tensor)
                 and g.shape == o.shape]
        if not pairs:
            return [None] * len(leaves)
        got = torch.autograd.grad([o for o, _ in pairs], leaves, [g.to(o.dtype) for o, g in pairs],
                                  retain_graph=True, allow_unused=True)
        return [None if g is None else g.detach() for g in got]

    def _stays_here(self, obj) -> bool:
        """Objects the learner's function receives that must stay in the grader: bound
        methods, closures and lambdas, the checkers' callables and objects, and anything the
        worker's copy of `checks` does not have (the withheld reference functions)."""
        import torch

        if isinstance(obj, (torch.Tensor, torch.dtype, torch.device, torch.Size,
                            torch.Generator, type(None), bool, int, float, complex, str, bytes,
                            list, tuple, dict, set, frozenset)):
            return False
        if isinstance(obj, (types.MethodType, functools.partial)):
            return True
        if isinstance(obj, (types.FunctionType, type)):
            module = sys.modules.get(obj.__module__ or "")
            if "<" in obj.__qualname__ or getattr(module, obj.__qualname__, None) is not obj:
                return True
            return not self.library.has(obj.__module__, obj.__qualname__)
        module = type(obj).__module__ or ""
        if module.split(".")[0] != "checks":
            return False
        return callable(obj) or not self.library.has(module, type(obj).__qualname__)

    def _gone(self, why: str):
        self.close()
        if self.watch is not None and self.watch.exceeded:
            why = (f"used {self.watch.exceeded / 2**20:.0f} MiB, over the "
                   f"{self.limits.memory / 2**20:.0f} MiB memory limit")
        self.dead = why
        raise WorkerGone(why)

    def _exit_text(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        memory = (self.cgroup is not None and self.cgroup.oom_killed()) or (
            self.watch is not None and self.watch.exceeded)
        if memory:
            return f" (over the {self.limits.memory / 2**20:.0f} MiB memory limit)"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            extra = {"SIGKILL": ", killed", "SIGXCPU": ", over the CPU time limit"}.get(name, "")
            return f" (killed by {name}{extra})"
        if code == 97:
            return f" (it could not be started{self._log_tail()})"
        return f" (exit status {code})"

    def _log_tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log) - 2000))
                lines = [x.strip() for x in f.read().decode(errors="replace").splitlines()
                         if x.strip()]
        except OSError:
            return ""
        return f" ({lines[-1][:160]})" if lines else ""

    def close(self) -> None:
        """End the worker and everything it started; `left_behind` lists any process that
        could not be killed (the grader treats that as an incident)."""
        self.left_behind: list[int] = []
        if self.process is None:
            if self.cgroup is not None:
                self.cgroup.kill_all()
            return
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                _send(self._to_worker, pickle.dumps(("quit",)))
            try:
                self.process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        for fd in (self._to_worker, self._from_worker):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._to_worker = self._from_worker = -1
        if self.watch is not None:
            self.watch.stopped.set()
        left = []
        if self.cgroup is not None and not self.cgroup.kill_all():
            left = self.cgroup.pids()
        if self.uid is not None:
            deadline = time.monotonic() + 10
            while (mine := [p for p, _ in _tree(0, self.uid)]) and time.monotonic() < deadline:
                for pid in mine:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
            left += mine
        self.left_behind = sorted(set(left))

    # ---- requests ----
    def begin_test(self, deadline: float) -> None:
        """A fresh session: the storages, lent objects and graphs of the previous test go."""
        self.session = _Session(deadline)
        self.stderr_text = ""

    def run_cell(self, index: int, source: str, verdict: Any = None) -> dict:
        """Execute one cell in the notebook's namespace: {"ok", "ename", "evalue", "stderr"}.
        `verdict` (for a test cell: "passed" or (ename, evalue)) is what the graded chapter's
        check stubs repeat."""
        self._post(("cell", index, source, verdict))
        reply = self._serve("cell", time.monotonic() + self.limits.cell_timeout)
        return {"ok": reply.get("ok") is True,
                "ename": _text(reply.get("ename"), 200) or "Error",
                "evalue": _text(reply.get("evalue"), self.limits.stderr_kept),
                "stderr": _text(reply.get("stderr"), self.limits.stderr_kept)}

    def lookup(self, name: str) -> dict:
        """{"found": "missing" | "class" | "function" | "callable" | "value", "value": ...}."""
        self._post(("lookup", name))
        reply = self._serve("lookup", self.session.deadline)
        return {"found": _text(reply.get("found"), 20),
                "value": _grader_value(reply.get("value"), self)}

    def call(self, target: tuple, args: tuple, kwargs: dict, deadline: float):
        import torch

        exercise, forbid = engine_calling.get() or (None, None)
        grad = torch.is_grad_enabled()
        leaves = [t for t in _flat_tensors((args, kwargs)) if t.requires_grad] if grad else []
        self._post(("call", target, (args, kwargs), dict(forbid or {}), torch.get_rng_state(),
                    grad))
        reply = self._serve("call", deadline)
        rng = reply.get("rng")
        if type(rng) is torch.Tensor and rng.dtype == torch.uint8 and \
                rng.shape == torch.get_rng_state().shape:
            torch.set_rng_state(rng.clone())
        self.stderr_text = (self.stderr_text + _text(reply.get("stderr"), MAX_TEXT))[-MAX_TEXT:]
        name = target[1] if target[0] == "name" else "your function"
        if isinstance(reply.get("forbidden"), str):
            from ..engine import ForbiddenCall

            fname = _text(reply["forbidden"], 100)
            raise ForbiddenCall(exercise or name, f"calls `{fname}`, which this exercise asks "
                                "you to write yourself (seen inside the worker).",
                                hint=(forbid or {}).get(fname))
        if "error" in reply:
            raise _rebuild_exception(reply["error"])
        changed = reply.get("changed")
        if isinstance(changed, list) and changed:
            from ..engine import in_place_failure

            raise in_place_failure(exercise or name, [_text(c, 100) for c in changed[:8]])
        value = _grader_value(reply.get("value"), self)
        flags = reply.get("flags")
        if leaves and isinstance(flags, list) and type(reply.get("graph")) is int:
            if reply.get("leaves") != len(leaves) or \
                    len(flags) != len(_flat_tensors(value)) or \
                    not all(type(f) is bool for f in flags):
                self._gone("broke the grading protocol (gradients that do not match)")
            gid = reply["graph"]
            return _attach_autograd(value, flags, leaves,
                                    lambda grads: self._backward(gid, grads, deadline))
        return value

    def _backward(self, gid: int, grads: list, deadline: float) -> list:
        self._post(("backward", gid, [None if g is None else g.detach() for g in grads]))
        reply = self._serve("backward", deadline)
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            raise RuntimeError(_text(error.get("message"), 500) or
                               "the backward pass failed in the worker")
        got = reply.get("grads")
        if not isinstance(got, list):
            self._gone("broke the grading protocol (no gradients)")
        return got

    def getattr(self, handle: int, name: str, deadline: float):
        self._post(("getattr", handle, name))
        reply = self._serve("getattr", deadline)
        if "error" in reply:
            raise _rebuild_exception(reply["error"])
        return _grader_value(reply.get("value"), self)

    def vars(self, handle: int, deadline: float) -> dict:
        self._post(("vars", handle))
        reply = self._serve("vars", deadline)
        value = _grader_value(reply.get("value"), self)
        if not isinstance(value, dict):
            raise TypeError("vars() argument must have __dict__ attribute")
        return value


class _Zygote:
    """A process that has imported torch and forks walled-in workers on request (see
    `checks/grader/jail.py`): a worker starts in a fraction of a second instead of importing torch
    again. One per grading process, started when the first worker is."""

    def __init__(self):
        import socket

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.channel = ours
        self.exited: dict[int, int] = {}
        self.buffer = b""
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(PACKAGE / "grader" / "jail.py"), "--zygote", str(theirs.fileno()),
             str(os.getpid())], pass_fds=(theirs.fileno(),), env={}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_no_core)
        theirs.close()

    def alive(self) -> bool:
        return self.process.poll() is None

    def spawn(self, config: dict, fds: list[int]) -> int:
        import socket

        socket.send_fds(self.channel, [json.dumps(config).encode()], fds)
        while True:
            message = self.read(time.monotonic() + 60)
            if "spawned" in message:
                return int(message["spawned"])

    def read(self, deadline: float) -> dict:
        """The next message from the zygote (exit reports are filed on the way)."""
        while b"\n" not in self.buffer:
            wait = max(0.0, deadline - time.monotonic())
            if not select.select([self.channel], [], [], wait)[0]:
                raise TimeoutError
            chunk = self.channel.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json.loads(line)
        if "exited" in message:
            self.exited[int(message["exited"])] = int(message["code"])
        return message


_zygote: _Zygote | None = None
_zygote_failed = False


def _zygote_spawn(config: dict, fds: list[int]) -> "_ZygoteChild | None":
    """A worker forked by this process's zygote, or None when there is no zygote to ask."""
    global _zygote, _zygote_failed
    if _zygote_failed:
        return None
    try:
        if _zygote is None or not _zygote.alive():
            _zygote = _Zygote()
        return _ZygoteChild(_zygote, _zygote.spawn(config, fds))
    except (OSError, TimeoutError, EOFError, ValueError):
        _zygote_failed = True
        return None


class _ZygoteChild:
    """The part of `subprocess.Popen` a Worker uses, for a process the zygote started."""

    def __init__(self, zygote: _Zygote, pid: int):
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with contextlib.suppress(TimeoutError, EOFError):
            self._wait(time.monotonic())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        try:
            self._wait(time.monotonic() + (timeout if timeout is not None else 3600))
        except (TimeoutError, EOFError):
            if self.returncode is None:
                raise subprocess.TimeoutExpired("worker", timeout) from None
        return self.returncode

    def _wait(self, deadline: float) -> None:
        while self.returncode is None:
            if self.pid in self.zygote.exited:
                self.returncode = self.zygote.exited.pop(self.pid)
                return
            self.zygote.read(deadline)


def _no_core() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _rlimits(limits: Limits) -> None:  # runs in the worker's process before exec (no walls)
    import resource

    for kind, value in ((resource.RLIMIT_CPU, limits.cpu),
                        (resource.RLIMIT_FSIZE, limits.output), (resource.RLIMIT_CORE, 0)):
        if value or kind == resource.RLIMIT_CORE:
            resource.setrlimit(kind, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead


def _text(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _grader_value(value: Any, worker: Worker) -> Any:
    """A decoded value with the worker's object references turned into `RemoteObject`s."""
    def leaf(x):
        if isinstance(x, RemoteRef):
            return RemoteObject(worker, x.handle, x.type_name, worker.session.deadline)
        return x

    return _map_leaves(value, leaf, _wire.MAX_DEPTH + 2)


class RemoteFunction:
    """A learner's function (or class) living in the worker, callable from the grader."""

    _checks_remote = True  # checks.engine.is_remote

    def __init__(self, worker: Worker, name: str, deadline: float):
        self._worker = worker
        self._name = name
        self.deadline = deadline
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self._worker.call(("name", self._name), args, kwargs, self.deadline)

    def __repr__(self) -> str:
        return f"<your function {self._name}>"


class RemoteObject:
    """An object that lives in the worker (an instance of the learner's class, a bound method):
    attribute reads and calls go to the worker; equal only to itself."""

    __slots__ = ("_worker", "_handle", "_type", "_deadline")

    def __init__(self, worker: Worker, handle: int, type_name: str, deadline: float):
        object.__setattr__(self, "_worker", worker)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_deadline", deadline)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._worker.getattr(self._handle, name, self._deadline)

    def __setattr__(self, name, value):
        raise AttributeError("objects in the worker are read-only from the grader")

    @property
    def __dict__(self):  # noqa: PLE0237 - vars(obj) reads the worker's object's attributes
        return self._worker.vars(self._handle, self._deadline)

    def __call__(self, *args, **kwargs):
        return self._worker.call(("object", self._handle), args, kwargs, self._deadline)

    def __repr__(self) -> str:
        return f"<{self._type} object in the worker>"

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return id(self)

    def __bool__(self):
        return True


_EXCEPTIONS: dict[str, type] = {}


def _rebuild_exception(error: Any) -> Exception:
    """An exception of the same built-in class (ValueError, KeyError, NotImplementedError ...),
    or of a new class with the learner's class name. Never a BaseException or a CheckFailure."""
    import builtins

    if not isinstance(error, dict):
        return RuntimeError("an error the grader could not read")
    name = _text(error.get("type"), 100) or "Exception"
    args = error.get("args") if isinstance(error.get("args"), tuple) else ()
    args = tuple(a[:2000] if isinstance(a, str) else a if type(a) in (int, float, bool)
                 or a is None else "?" for a in args[:4])
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)) or name in (
            "StopIteration", "StopAsyncIteration"):
        key = name if name.isidentifier() else "LearnerException"
        cls = _EXCEPTIONS.setdefault(key, type(key, (Exception,), {"__module__": "learner"}))
    try:
        exc = cls(*args)
    except Exception:  # noqa: BLE001
        exc = cls(str(args))
    where = _text(error.get("where"), 300)
    if where:
        exc.add_note(f"at {where}")
    return exc


# --------------------------------------------------------------------------------------------
# The worker's side (python -I -c "...; from checks.grader.sandbox import worker_main; ...")

_worker_state: dict[str, Any] = {}


def verdict_check(name: str):
    """In the worker: the graded chapter's `check_*`, which repeats the grader's verdict on the
    test cell being run (the grader has already run the real check)."""
    def check(*args, **kwargs):
        verdict = _worker_state.get("verdict")
        if verdict is None:
            raise RuntimeError(f"{name} runs only in the test cells while this chapter is graded")
        if verdict == "passed":
            return None
        ename, evalue = verdict
        cls = _EXCEPTIONS.setdefault(f"verdict:{ename}", type(str(ename), (AssertionError,), {}))
        raise cls(evalue)

    check.__name__ = check.__qualname__ = name
    return check


class _CappedText(io.TextIOBase):
    """A stream that keeps the first `keep` characters and counts the rest."""

    def __init__(self, keep: int):
        self.keep = keep
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        text = str(text)
        self.total += len(text)
        if self.kept < self.keep:
            piece = text[:self.keep - self.kept]
            self.parts.append(piece)
            self.kept += len(piece)
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts)


def _learner_where(tb) -> str:
    import traceback

    last = None
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith("<cell"):
            last = frame
    return f"line {last.lineno}: {(last.line or '').strip()}" if last else ""


def _error_dict(exc: BaseException) -> dict:
    args = [a if type(a) in (str, int, float, bool) or a is None else repr(a)[:500]
            for a in exc.args[:4]]
    args = [a[:2000] if isinstance(a, str) else a for a in args]
    return {"type": type(exc).__name__, "args": tuple(args),
            "where": _learner_where(exc.__traceback__)}


class _GraderObject:
    """In the worker: a stand-in for an object the grader kept (a recorder, a bound method, a
    cache handle). Calls and attribute reads go to the grader."""

    def __init__(self, ident: int, name: str):
        self._ident = ident
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return _worker_state["side"].callback(self._ident, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _worker_state["side"].grader_getattr(self._ident, name)

    def __repr__(self) -> str:
        return f"<{self.__name__}>"


class _ArgUnpickler(pickle.Unpickler):
    def __init__(self, file, side: "_WorkerSide"):
        super().__init__(file)
        self.side = side

    def persistent_load(self, pid):
        kind = pid[0]
        if kind == "grader":
            return _GraderObject(pid[1], str(pid[2]))
        if kind == "worker":
            return self.side.objects[pid[1]]
        if kind == "name":
            return self.side.namespace[pid[1]]
        raise pickle.UnpicklingError("unknown reference")


class _WorkerSide:
    def __init__(self, read_fd: int, write_fd: int):
        import builtins

        self.read_fd, self.write_fd = read_fd, write_fd
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.objects: dict[int, Any] = {}
        self.graphs: dict[int, tuple[list, list]] = {}
        self.kept: list = []  # everything sent during a test: storage ids stay unique
        self.real = (sys.stdout, sys.stderr)

    def register(self, obj) -> int:
        handle = len(self.objects) + 1
        self.objects[handle] = obj
        return handle

    def clear(self) -> None:
        self.objects.clear()
        self.graphs.clear()
        self.kept.clear()

    def send(self, **message) -> None:
        self.kept.append(message)
        try:
            data = _wire.encode(message, self.register)
        except Exception as exc:  # noqa: BLE001 - a value the encoder cannot write
            data = _wire.encode({"kind": message["kind"], "error": {
                "type": "TypeError", "args": (f"returned a value the grader cannot receive "
                                              f"({type(exc).__name__})",)}})
        _send(self.write_fd, data)

    def receive(self):
        return _ArgUnpickler(io.BytesIO(_receive(self.read_fd, None, limit=1 << 40)), self).load()

    def serve_until(self, expected: str | None):
        while True:
            message = self.receive()
            if message[0] == expected:
                return message
            if message[0] == "quit":
                os._exit(0)
            handler = getattr(self, f"do_{message[0]}", None)
            if handler is None:
                raise RuntimeError("grading protocol out of step")
            handler(*message[1:])

    @contextlib.contextmanager
    def captured(self):
        out, err = _CappedText(0), _CappedText(4000)
        sys.stdout, sys.stderr = out, err
        try:
            yield err
        finally:
            sys.stdout, sys.stderr = self.real

    # ---- the grader's requests ----
    def do_cell(self, index: int, source: str, verdict) -> None:
        self.clear()
        _worker_state["verdict"] = verdict
        result: dict[str, Any] = {"kind": "cell", "ok": True}
        with self.captured() as err:
            try:
                exec(compile(source, f"<cell {index}>", "exec"), self.namespace)
            except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
                result.update(ok=False, ename=type(exc).__name__, evalue=str(exc)[:4000])
        _worker_state["verdict"] = None
        result.update(stderr=err.getvalue(), stderr_total=err.total)
        self.send(**result)

    def do_lookup(self, name: str) -> None:
        value = self.namespace.get(name, self)
        if value is self:
            self.send(kind="lookup", found="missing")
        elif isinstance(value, type):
            self.send(kind="lookup", found="class")
        elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            self.send(kind="lookup", found="function")
        elif callable(value):
            self.send(kind="lookup", found="callable")
        else:
            self.send(kind="lookup", found="value", value=value)

    def do_call(self, target, arguments, forbid, rng, grad) -> None:
        import torch

        from checks.engine import CheckFailure, _Forbid, changed_inputs, snapshot_inputs

        args, kwargs = arguments
        result: dict[str, Any] = {"kind": "call"}
        leaves = [t for t in _flat_tensors((args, kwargs)) if t.requires_grad] if grad else []
        before = snapshot_inputs(args, kwargs)
        torch.set_rng_state(rng)
        with self.captured() as err:
            try:
                fn = self.namespace[target[1]] if target[0] == "name" else self.objects[target[1]]
                guard = _Forbid(_Exercise(str(target[1])), forbid) if forbid else \
                    contextlib.nullcontext()
                with guard, torch.set_grad_enabled(bool(grad)):
                    value = fn(*args, **kwargs)
                result["value"] = value
                if leaves:
                    outs = _flat_tensors(value)
                    flags = [bool(o.requires_grad) for o in outs]
                    if any(flags):
                        gid = len(self.graphs) + 1
                        self.graphs[gid] = ([o for o, f in zip(outs, flags) if f], leaves)
                        result.update(graph=gid, flags=flags, leaves=len(leaves))
            except CheckFailure as exc:
                if type(exc).__name__ == "ForbiddenCall":
                    called = str(exc).split("`")
                    result["forbidden"] = called[1] if len(called) > 2 else "?"
                else:
                    result["error"] = _error_dict(exc)
            except BaseException as exc:  # noqa: BLE001
                result["error"] = _error_dict(exc)
        result["changed"] = changed_inputs(before)
        result["stderr"] = err.getvalue()
        with contextlib.suppress(Exception):
            result["rng"] = torch.get_rng_state()
        self.send(**result)

    def do_getattr(self, handle: int, name: str) -> None:
        with self.captured():
            try:
                value = getattr(self.objects[handle], name)
            except BaseException as exc:  # noqa: BLE001
                self.send(kind="getattr", error=_error_dict(exc))
                return
        self.send(kind="getattr", value=value)

    def do_vars(self, handle: int) -> None:
        try:
            found = vars(self.objects[handle])
            value = {k: v for k, v in dict.items(found) if type(k) is str}
        except BaseException:  # noqa: BLE001
            value = None
        self.send(kind="vars", value=value)

    def do_backward(self, gid: int, grads: list) -> None:
        import torch

        try:
            outs, leaves = self.graphs[gid]
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
            if pairs:
                got = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                          retain_graph=True, allow_unused=True)
            else:
                got = [None] * len(leaves)
            self.send(kind="backward", grads=[None if g is None else g.detach() for g in got])
        except BaseException as exc:  # noqa: BLE001
            self.send(kind="backward", error={"message": f"{type(exc).__name__}: {exc}"[:500]})

    # ---- requests to the grader ----
    def _ask(self, **message):
        self.send(**message)
        _, ok, value = self.serve_until("result")
        if ok:
            return value
        raise RuntimeError(f"{value[0]}: {value[1]}")

    def callback(self, ident: int, args: tuple, kwargs: dict):
        import torch

        leaves = [t for t in _flat_tensors((args, kwargs)) if t.requires_grad] \
            if torch.is_grad_enabled() else []
        if not leaves:
            return self._ask(kind="callback", ident=ident, args=tuple(args),
                             kwargs=dict(kwargs), grad=False)
        value, gid, flags = self._ask(kind="callback", ident=ident, args=tuple(args),
                                      kwargs=dict(kwargs), grad=True)
        if gid is None:
            return value
        return _attach_autograd(value, flags, leaves, lambda grads: self._ask(
            kind="cbackward", graph=gid, grads=[None if g is None else g.detach()
                                                for g in grads]))

    def grader_getattr(self, ident: int, name: str):
        return self._ask(kind="gattr", ident=ident, name=name)


class _Exercise:
    """Enough of a Check for the engine's forbidden-call guard."""

    def __init__(self, name: str):
        self.exercise = name


def worker_main(read_fd: int, write_fd: int) -> None:
    # Everything the learner's code might use is imported before it runs.
    import torch  # noqa: F401

    import checks  # noqa: F401
    import checks.engine  # noqa: F401

    if os.environ.get(AUDIT_ENV):
        _install_audit_hook(tuple(filter(None, os.environ.get(PROTECT_ENV, "").split(
            os.pathsep))))
    side = _WorkerSide(read_fd, write_fd)
    _worker_state["side"] = side
    side.send(kind="ready")
    side.serve_until(None)


# Without walls (no root): audit events refused in the worker, a speed bump only.
_REFUSED = frozenset({
    "os.kill", "os.killpg", "signal.pthread_kill", "os.system", "os.exec", "os.posix_spawn",
    "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "subprocess.Popen", "sys.addaudithook",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "os.chdir", "os.symlink",
    "os.link"})
_PATH_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.truncate", "os.chmod",
                          "os.chown", "os.utime", "shutil.rmtree", "os.mkdir"})


def _install_audit_hook(protected: tuple[str, ...]) -> None:
    def hook(event, args, _refused=_REFUSED, _paths=_PATH_EVENTS, _protected=protected,
             _str=str, _fspath=os.fspath, _abspath=os.path.abspath, _isinstance=isinstance,
             _int=int, _err=PermissionError):
        if event in _refused:
            raise _err(f"not allowed while grading: {event}")
        if event == "open" or event in _paths:
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None, None))[:3]
                writing = (_isinstance(mode, _str) and any(c in mode for c in "wax+")) or (
                    _isinstance(flags, _int) and flags & 0o3 != 0)
                if not writing:
                    return
            else:
                path = args[0] if args else None
            if _isinstance(path, _int) or path is None:
                return
            try:
                full = _abspath(_fspath(path))
            except Exception:  # noqa: BLE001
                raise _err("not allowed while grading: an unusual path") from None
            for folder in _protected:
                if full == folder or full.startswith(folder + "/"):
                    raise _err(f"not allowed while grading: writing to {full}")

    sys.addaudithook(hook)
