"""The worker's side of grading: its main loop (`worker_main`, started by
`python -I -c "...; from checks.grader.worker_side import worker_main; ..."` or, walled in, by
`jail.py`), which runs the notebook's cells in one namespace and the learner's functions when the
grader asks, sending back what they return through `wire`; stand-ins for the objects the grader
kept (their calls go back to the grader); and `echo_check`, what the graded chapter's `check_*`
functions are in the worker's library: they echo the outcome of the grader's own run of the test
(passed, or its error), never more of it.

Blocks of hidden tests are served by a throwaway fork of this process (`do_fork`): the child
answers every request of the block and exits at the grader's `join`, taking along whatever the
learner's code kept of the block's arguments; this process waits, then says how the child ended.

This module runs in the untrusted worker and is in its library (`library.WORKER_GRADER_MODULES`):
it and everything it imports must hold nothing the worker may not have."""

from __future__ import annotations

import builtins
import contextlib
import gc
import io
import os
import pickle
import sys
import traceback
import types
from typing import Any

import torch

from ..environment import AUDIT_ENV, PROTECT_ENV
from ..engine import CheckFailure, _Forbid, changed_inputs, snapshot_inputs
from . import wire
from .audit import forking, install_audit_hook
from .channel import receive_frame, send_frame
from .tensors import attach_autograd, flat_tensors, generator_states


_worker_state: dict[str, Any] = {}
_ECHOED: dict[str, type] = {}  # the exception classes echoed errors are raised as, by name


def echo_check(name: str):
    """In the worker: the graded chapter's `check_*`, which echoes the outcome of the grader's
    run of the test cell being run (the grader has already run the real check): None when it
    passed, else an error of the same name and text."""
    def check(*args, **kwargs):
        echo = _worker_state.get("echo")
        if echo is None:
            raise RuntimeError(f"{name} runs only in the test cells while this chapter is graded")
        if echo == "passed":
            return None
        ename, evalue = echo
        cls = _ECHOED.setdefault(str(ename), type(str(ename), (AssertionError,), {}))
        raise cls(evalue)

    check.__name__ = check.__qualname__ = name
    return check


verdict_check = echo_check  # the name the worker's library imports it by (library.py)


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
    last = None
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith("<cell"):
            last = frame
    return f"line {last.lineno}: {(last.line or '').strip()}" if last else ""


def _error_dict(exc: BaseException) -> dict:
    args = [a if type(a) in (str, int, float, bool) or a is None else repr(a)[:500]
            for a in exc.args[:4]]
    args = [a[:2000] if isinstance(a, str) else a for a in args]
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a learner's __str__ that fails
        text = "?"
    return {"type": type(exc).__name__, "args": tuple(args),
            "text": text[:2000] if isinstance(text, str) else "?",
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
            data = wire.encode(message, self.register)
        except Exception as exc:  # noqa: BLE001 - a value the encoder cannot write
            data = wire.encode({"kind": message["kind"], "error": {
                "type": "TypeError", "args": (f"returned a value the grader cannot receive "
                                              f"({type(exc).__name__})",)}})
        send_frame(self.write_fd, data)

    def receive(self):
        frame = receive_frame(self.read_fd, None, limit=1 << 40)
        return _ArgUnpickler(io.BytesIO(frame), self).load()

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
    def do_cell(self, index: int, source: str, echo) -> None:
        self.clear()
        _worker_state["echo"] = echo
        result: dict[str, Any] = {"kind": "cell", "ok": True}
        with self.captured() as err:
            try:
                exec(compile(source, f"<cell {index}>", "exec"), self.namespace)
            except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
                result.update(ok=False, ename=type(exc).__name__, evalue=str(exc)[:4000])
        _worker_state["echo"] = None
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
        args, kwargs = arguments
        result: dict[str, Any] = {"kind": "call"}
        leaves = [t for t in flat_tensors((args, kwargs)) if t.requires_grad] if grad else []
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
                    outs = flat_tensors(value)
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
        if result["changed"]:  # the grader writes them back where a check allows it (tensors.py)
            result["inputs"] = (args, kwargs)
        result["stderr"] = err.getvalue()
        with contextlib.suppress(Exception):
            result["rng"] = torch.get_rng_state()
            result["generators"] = generator_states((args, kwargs))
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

    def do_fork(self) -> None:
        """Serve a block of hidden tests from a throwaway copy of this process: the child
        answers every request until the grader's `join`, then exits, and with it whatever the
        learner's code kept of the hidden tests' arguments (in memory: files it writes and
        memory shared before the fork are another matter, docs/instructor/trust.md). This
        process waits for it meanwhile, then says how it ended ("joined": exit status); a
        "joined" that comes before the grader's `join` tells it the child died in mid-block.
        A fork that fails is said so ("fork", ok False): the grader then refuses to run the
        block, never runs it here."""
        gc.freeze()  # the child's collections leave the parent's objects (and pages) alone
        try:
            with forking():  # let through by the audit hook of a worker without walls
                child = os.fork()
        except OSError as exc:
            gc.unfreeze()
            self.send(kind="fork", ok=False, why=f"{type(exc).__name__}: {exc}"[:300])
            return
        if child == 0:
            self._serve_hidden_block()
        gc.unfreeze()
        try:
            _pid, status = os.waitpid(child, 0)
        except ChildProcessError:  # reaped already (the learner's code ignores SIGCHLD)
            status = None
        self.send(kind="joined", status=status)

    def _serve_hidden_block(self) -> None:
        """The forked child's whole life: serve until `join` (or `quit`), then end at once."""
        try:
            # Only this thread came through the fork. The worker runs torch with
            # `limits.threads` threads (the grader's cores / --jobs: torch.get_num_threads() is 2
            # in a worker of a one-job run on 2 cores), and OpenMP's pool, once used, stayed in
            # the parent: the child's first parallel region would wait for it for ever (tried:
            # it does). With one thread torch never enters one, as in PyTorch's DataLoader
            # workers; the parent keeps its threads.
            torch.set_num_threads(1)
            self.send(kind="fork", ok=True)
            self.serve_until("join")
        finally:
            os._exit(0)

    def do_backward(self, gid: int, grads: list) -> None:
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
        leaves = [t for t in flat_tensors((args, kwargs)) if t.requires_grad] \
            if torch.is_grad_enabled() else []
        if not leaves:
            return self._ask(kind="callback", ident=ident, args=tuple(args),
                             kwargs=dict(kwargs), grad=False)
        value, gid, flags = self._ask(kind="callback", ident=ident, args=tuple(args),
                                      kwargs=dict(kwargs), grad=True)
        if gid is None:
            return value
        return attach_autograd(value, flags, leaves, lambda grads: self._ask(
            kind="cbackward", graph=gid, grads=[None if g is None else g.detach()
                                                for g in grads]))

    def grader_getattr(self, ident: int, name: str):
        return self._ask(kind="gattr", ident=ident, name=name)


class _Exercise:
    """Enough of a Check for the engine's forbidden-call guard."""

    def __init__(self, name: str):
        self.exercise = name


def worker_main(read_fd: int, write_fd: int) -> None:
    """Serve the grader on the two pipe ends until it says quit (the module's imports have
    already imported everything the learner's code might use)."""
    if os.environ.get(AUDIT_ENV):
        install_audit_hook(tuple(filter(None, os.environ.get(PROTECT_ENV, "").split(
            os.pathsep))))
    side = _WorkerSide(read_fd, write_fd)
    _worker_state["side"] = side
    side.send(kind="ready")
    side.serve_until(None)
