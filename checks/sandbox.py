"""The learner's code in a worker process that the grading process controls but never trusts.

`python -m checks grade` runs each submission in one `Worker`: a fresh `python -m checks.sandbox`
process with resource limits (address space, CPU time, file size), its own empty working folder,
and its standard output and error sent to a capped log. The worker executes the notebook's code
cells on request, one at a time, and reports each cell's outcome as data. When the grader reaches
a test cell, it runs that cell *twice*:

1. inside the worker, in the notebook's namespace, as Jupyter would (this keeps everything a
   checker observes from inside the learner's call, such as forbidden library calls recorded by
   torch function modes), and
2. inside the grading process, with checkers and torch the learner never touched: each exercise
   name in the test cell is a `RemoteFunction` that sends its arguments to the worker, calls the
   learner's function there, and brings the result back as plain data.

A test earns its points only if both runs pass. The learner's code can tamper with run 1 as it
likes (redefine a checker, patch `torch.allclose`, print "passed"): run 2 decides, and it sees
nothing of the learner's code but the values its functions return, decoded with
`torch.load(weights_only=True)` into plain tensors, numbers, strings, lists, tuples and dicts.
Objects of other types (a lying `__eq__`, a tensor subclass that cannot be converted) arrive as
`Unsendable` and compare equal to nothing.

Wire format: 8-byte big-endian length + payload. Grader to worker: pickle (the worker trusts the
grader). Worker to grader: `torch.save` of plain data, loaded with `weights_only=True` (the
grader trusts nothing that comes back). Callables among the arguments (recorders, activations
that a checker hands to the learner's function) stay in the grader: the worker receives a stub,
and each call of the stub is a callback request answered by the grader.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_MESSAGE = 256 * 2**20  # bytes in one message from the worker; more ends the worker

# --------------------------------------------------------------------------------------------
# Limits


@dataclass(frozen=True)
class Limits:
    """Resource limits for one submission's worker. Defaults fit a 2-core, 8 GiB grading box."""

    cell_timeout: float = 120.0  # wall-clock seconds per cell (and per test cell's calls)
    memory: int = 3 * 2**30  # bytes of address space for the worker (RLIMIT_AS)
    cpu: int = 900  # CPU seconds for the whole worker (RLIMIT_CPU)
    output: int = 64 * 2**20  # bytes the worker may write to any file, its log included
    stderr_kept: int = 4000  # characters of a cell's stderr kept for the report


# --------------------------------------------------------------------------------------------
# Framing


def _send(fd: int, payload: bytes) -> None:
    data = struct.pack(">Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
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


# --------------------------------------------------------------------------------------------
# Plain data (worker side: best effort; grader side: the only types that can arrive)


class Unsendable:
    """Stands in for a returned object that is not plain data. Equal to nothing."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} object (not plain data)>"

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__


def _plain(value: Any, depth: int = 0) -> Any:
    """Value as exact built-in types and plain tensors (worker side)."""
    import numbers

    import torch

    if depth > 20:
        return {"__unsendable__": "deeply nested value"}
    if value is None or type(value) in (bool, int, float, str, bytes, complex):
        return value
    if isinstance(value, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            plain = torch.Tensor.as_subclass(value, torch.Tensor)
            return plain.detach().clone() if plain.requires_grad else plain
    if isinstance(value, torch.dtype) or isinstance(value, torch.Size):
        return value
    if isinstance(value, bool):
        return bool.__bool__(value) if type(value) is bool else bool(int.__int__(value))
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, numbers.Integral) and type(value).__module__ == "numpy":
        return int(value)
    if isinstance(value, numbers.Real) and type(value).__module__ == "numpy":
        return float(value)
    if isinstance(value, tuple):
        return tuple(_plain(v, depth + 1) for v in tuple.__iter__(value))
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, dict):
        return {_plain(k, depth + 1): _plain(v, depth + 1) for k, v in dict.items(value)}
    return {"__unsendable__": f"{type(value).__module__}.{type(value).__qualname__}"}


def _grader_value(value: Any) -> Any:
    """Rebuild what `weights_only` loading gave: exact types, Unsendable markers decoded."""
    import torch

    if isinstance(value, dict):
        if set(value) == {"__unsendable__"} and isinstance(value["__unsendable__"], str):
            return Unsendable(value["__unsendable__"])
        return {_grader_value(k): _grader_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_grader_value(v) for v in value]
    if type(value) is tuple:
        return tuple(_grader_value(v) for v in value)
    if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
        return Unsendable(type(value).__name__)
    return value


def _encode_plain(obj: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _decode_plain(data: bytes) -> Any:
    import torch

    with torch._C.DisableTorchFunction():
        return torch.load(io.BytesIO(data), weights_only=True)


# --------------------------------------------------------------------------------------------
# Grader side


class WorkerGone(BaseException):
    """The worker died, ran past a limit or broke the protocol. A BaseException, so that no
    checker's `except Exception` turns it into an ordinary failure."""


class InProcessOnly(BaseException):
    """The check hands the learner's function tensors that track gradients: autograd cannot
    cross processes, so this test is decided by its run inside the worker alone."""


class _CallbackStub:
    """What the worker gets in place of a grader-side callable argument."""

    def __init__(self, ident: int, name: str):
        self.ident = ident
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return _worker_state["callback"](self.ident, args, kwargs)

    def __repr__(self) -> str:
        return f"<{self.__name__}>"

    def __reduce__(self):  # only ever sent grader -> worker
        return (_CallbackStub, (self.ident, self.__name__))


class _ArgPickler(pickle.Pickler):
    """Pickles arguments for the worker; callables stay here and become callback stubs."""

    def __init__(self, file, callbacks: dict[int, Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.callbacks = callbacks

    def persistent_id(self, obj):
        if _stays_here(obj):
            ident = len(self.callbacks)
            self.callbacks[ident] = obj
            return ("callback", ident, getattr(obj, "__name__", type(obj).__name__))
        return None


def _stays_here(obj) -> bool:
    """Callables a checker hands to the learner's function that must run in the grader: its
    own objects (recorders) and functions that cannot be imported by name (closures, lambdas,
    bound methods). Importable functions, classes and torch built-ins travel by name."""
    import functools

    if isinstance(obj, (types.MethodType, functools.partial)):
        return True
    if isinstance(obj, types.FunctionType):
        module = sys.modules.get(obj.__module__ or "")
        return "<" in obj.__qualname__ or getattr(module, obj.__qualname__, None) is not obj
    return (callable(obj) and not isinstance(obj, type)
            and (type(obj).__module__ or "").split(".")[0] == "checks")


class _ArgUnpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        kind, ident, name = pid
        return _CallbackStub(ident, str(name))


# (exercise, forbidden names and hints) of the Check calling the learner now (checks.engine)
calling: contextvars.ContextVar = contextvars.ContextVar("checks_sandbox_calling", default=None)


def _flat_tensors(value: Any, out: list, depth: int = 0) -> list:
    import torch

    if depth > 6:
        return out
    if type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flat_tensors(v, out, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            _flat_tensors(v, out, depth + 1)
    return out


class Worker:
    """One submission's worker process, seen from the grader."""

    def __init__(self, workdir: Path, limits: Limits, env: dict[str, str]):
        self.limits = limits
        self.stderr_text = ""  # stderr the learner's code wrote during the current test's calls
        self.dead: str | None = None
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        cwd = workdir / "cwd"
        cwd.mkdir(exist_ok=True)
        self.log = workdir / "worker.log"
        with open(self.log, "wb") as log, open(os.devnull, "rb") as null:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "checks._worker", str(to_worker_r), str(from_worker_w)],
                stdin=null, stdout=log, stderr=log, cwd=cwd, env=env,
                pass_fds=(to_worker_r, from_worker_w), preexec_fn=self._limit,
                start_new_session=True)
        os.close(to_worker_r)
        os.close(from_worker_w)
        try:
            self._await("ready", time.monotonic() + max(60.0, limits.cell_timeout))
        except WorkerGone as gone:
            raise WorkerGone(f"the worker did not start: {gone}{self._log_tail()}") from None

    def _limit(self) -> None:  # runs in the child before exec
        limits = self.limits
        for kind, value in ((resource.RLIMIT_AS, limits.memory),
                            (resource.RLIMIT_CPU, limits.cpu),
                            (resource.RLIMIT_FSIZE, limits.output),
                            (resource.RLIMIT_CORE, 0)):
            if value:
                resource.setrlimit(kind, (value, value))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead

    # ---- plumbing ----
    def _post(self, message: tuple) -> None:
        if self.dead:
            raise WorkerGone(self.dead)
        try:
            _send(self._to_worker, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            self._gone("the worker stopped reading")

    def _await(self, expected: str, deadline: float) -> dict:
        try:
            data = _receive(self._from_worker, deadline)
        except TimeoutError:
            self._gone(f"ran longer than the {self.limits.cell_timeout:g} s limit", kill=True)
        except EOFError:
            self._gone(f"the worker process died{self._exit_text()}")
        except OverflowError as size:
            self._gone(f"sent back {int(str(size)) / 2**20:.0f} MiB in one answer (limit "
                       f"{MAX_MESSAGE / 2**20:.0f} MiB)", kill=True)
        try:
            reply = _decode_plain(data)
        except Exception as exc:
            self._gone(f"sent back something that is not plain data ({type(exc).__name__})",
                       kill=True)
        if not isinstance(reply, dict) or not isinstance(reply.get("kind"), str):
            self._gone("broke the grading protocol", kill=True)
        if reply["kind"] not in (expected, "callback"):
            self._gone(f"broke the grading protocol ({reply['kind']!r})", kill=True)
        return reply

    def _gone(self, why: str, kill: bool = False):
        self.close()
        self.dead = why
        raise WorkerGone(why)

    def _exit_text(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            extra = {"SIGKILL": ", probably over the memory limit or killed",
                     "SIGXCPU": ", over the CPU time limit"}.get(name, "")
            return f" (killed by {name}{extra})"
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
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for fd in (self._to_worker, self._from_worker):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._to_worker = self._from_worker = -1

    # ---- requests ----
    def run_cell(self, index: int, source: str) -> dict:
        """Execute one cell in the notebook's namespace: {"ok", "ename", "evalue", "stderr"}."""
        self._post(("cell", index, source))
        return self._serve("cell", time.monotonic() + self.limits.cell_timeout)

    def lookup(self, name: str) -> dict:
        self._post(("lookup", name))
        return self._serve("lookup", time.monotonic() + self.limits.cell_timeout)

    def call(self, name: str, args: tuple, kwargs: dict, deadline: float):
        exercise, forbid = calling.get() or (None, None)
        callbacks: dict[int, Any] = {}
        buffer = io.BytesIO()
        import torch

        if any(t.requires_grad for t in _flat_tensors((args, kwargs), [])):
            raise InProcessOnly(name)
        with torch._C.DisableTorchFunction():
            _ArgPickler(buffer, callbacks).dump((args, kwargs))
        # The global random state travels with the call, so that a function that draws from
        # torch's default generator behaves as if it ran here.
        self._post(("call", name, buffer.getvalue(), dict(forbid or {}), torch.get_rng_state()))
        reply = self._serve("call", deadline, callbacks)
        rng = reply.get("rng")
        if type(rng) is torch.Tensor and rng.dtype == torch.uint8 and \
                rng.shape == torch.get_rng_state().shape:
            with contextlib.suppress(Exception):
                torch.set_rng_state(rng)
        self.stderr_text += reply.get("stderr") or ""
        # In-place changes to the arguments happen here too, so that checks that the learner's
        # function leaves its inputs alone still see them.
        after = reply.get("args_after")
        if isinstance(after, list):
            with torch._C.DisableTorchFunction():
                for mine, theirs in zip(_flat_tensors((args, kwargs), []), after):
                    if (type(theirs) is torch.Tensor and theirs.shape == mine.shape and
                            theirs.dtype == mine.dtype and not torch.equal(theirs, mine)):
                        with torch.no_grad():
                            mine.copy_(theirs)
        if reply.get("forbidden"):
            from .engine import ForbiddenCall

            fname = str(reply["forbidden"])
            raise ForbiddenCall(exercise or name, f"calls `{fname}`, which this exercise asks "
                                f"you to write yourself.", hint=(forbid or {}).get(fname))
        if "error" in reply:
            raise _rebuild_exception(reply["error"])
        if reply.get("used_reference"):
            from .engine import CheckFailure

            raise CheckFailure(exercise or name, f"calls the course's reference "
                               f"`checks.reference.{name}` instead of your own implementation.")
        return _grader_value(reply.get("value"))

    def _serve(self, expected: str, deadline: float, callbacks: dict | None = None) -> dict:
        """Wait for the reply, answering the worker's callback requests meanwhile."""
        while True:
            reply = self._await(expected, deadline)
            if reply["kind"] != "callback":
                return reply
            if not callbacks or reply.get("ident") not in callbacks:
                self._gone("broke the grading protocol (unknown callback)", kill=True)
            try:
                args, kwargs = _grader_value(reply.get("args")), _grader_value(reply.get("kwargs"))
                if not isinstance(args, tuple) or not isinstance(kwargs, dict):
                    raise TypeError("bad callback arguments")
                answer = ("callback_result", True, callbacks[reply["ident"]](*args, **kwargs))
            except Exception as exc:
                answer = ("callback_result", False, (type(exc).__name__, str(exc)))
            try:
                self._post(answer)
            except pickle.PicklingError:
                self._post(("callback_result", False, ("TypeError", "unpicklable result")))


class RemoteFunction:
    """A learner's function living in the worker, callable from the grading process."""

    def __init__(self, worker: Worker, name: str, deadline: float):
        self._worker = worker
        self._name = name
        self.deadline = deadline
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self._worker.call(self._name, args, kwargs, self.deadline)

    def __repr__(self) -> str:
        return f"<your function {self._name}>"


_EXCEPTIONS: dict[str, type] = {}


def _rebuild_exception(error: Any) -> Exception:
    """An exception of the same built-in class (ValueError, KeyError, NotImplementedError ...),
    or of a new class with the learner's class name. Never a BaseException or a CheckFailure."""
    import builtins

    if not isinstance(error, dict):
        return RuntimeError("an error the grader could not read")
    name = error.get("type") if isinstance(error.get("type"), str) else "Exception"
    args = error.get("args") if isinstance(error.get("args"), tuple) else ()
    args = tuple(a if type(a) in (str, int, float, bool) or a is None else repr(a) for a in args)
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)) or name in (
            "StopIteration", "StopAsyncIteration"):
        key = name if name.isidentifier() else "LearnerException"
        cls = _EXCEPTIONS.setdefault(key, type(key, (Exception,), {"__module__": "learner"}))
    try:
        exc = cls(*args)
    except Exception:
        exc = cls(str(args))
    where = error.get("where")
    if isinstance(where, str) and where:
        exc.add_note(f"at {where}")
    return exc


# --------------------------------------------------------------------------------------------
# Worker side (python -m checks._worker READ_FD WRITE_FD)

_worker_state: dict[str, Any] = {}


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

    here = os.path.dirname(__file__)
    last = None
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith("<cell"):
            last = frame
        elif last is None and not frame.filename.startswith(here):
            pass
    if last is None:
        return ""
    return f"line {last.lineno}: {(last.line or '').strip()}"


def _error_dict(exc: BaseException) -> dict:
    args = []
    for a in exc.args[:4]:
        args.append(a if type(a) in (str, int, float, bool) or a is None else repr(a)[:500])
    return {"type": type(exc).__name__, "args": tuple(args),
            "where": _learner_where(exc.__traceback__)}


def _worker_main(read_fd: int, write_fd: int) -> None:
    # Everything the learner's code might use is imported before it runs.
    import builtins

    import torch

    import checks  # noqa: F401
    from checks.engine import CheckFailure, _Forbid

    from checks import reference

    limits = Limits()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    reference_code = {name: fn.__code__ for name, fn in vars(reference).items()
                      if isinstance(fn, types.FunctionType)}
    _install_audit_hook(tuple(filter(None, os.environ.get("CHECKS_PROTECT", "").split(
        os.pathsep))))
    real_stdout, real_stderr = sys.stdout, sys.stderr

    def reply(**message) -> None:
        _send(write_fd, _encode_plain(message))

    def receive():
        return pickle.loads(_receive(read_fd, None, limit=1 << 40))

    def callback(ident, args, kwargs):
        reply(kind="callback", ident=ident, args=_plain(tuple(args)), kwargs=_plain(dict(kwargs)))
        message = receive()
        if message[0] != "callback_result":
            raise RuntimeError("grading protocol out of step")
        _, ok, value = message
        if ok:
            return value
        raise RuntimeError(f"{value[0]}: {value[1]}")

    _worker_state["callback"] = callback

    @contextlib.contextmanager
    def captured():
        out, err = _CappedText(0), _CappedText(limits.stderr_kept)
        sys.stdout, sys.stderr = out, err
        try:
            yield err
        finally:
            sys.stdout, sys.stderr = real_stdout, real_stderr

    reply(kind="ready")
    while True:
        message = receive()
        if message[0] == "quit":
            return
        if message[0] == "cell":
            _, index, source = message
            result: dict[str, Any] = {"kind": "cell", "ok": True}
            with captured() as err:
                try:
                    exec(compile(source, f"<cell {index}>", "exec"), namespace)
                except BaseException as exc:  # SystemExit and KeyboardInterrupt included
                    result.update(ok=False, ename=type(exc).__name__,
                                  evalue=str(exc)[:limits.stderr_kept])
            result.update(stderr=err.getvalue(), stderr_total=err.total)
            reply(**result)
        elif message[0] == "lookup":
            name = message[1]
            value = namespace.get(name, _worker_state)
            if value is _worker_state:
                reply(kind="lookup", found="missing")
            elif isinstance(value, type):
                reply(kind="lookup", found="class")
            elif callable(value):
                reply(kind="lookup", found="callable")
            else:
                reply(kind="lookup", found="value", value=_plain(value))
        elif message[0] == "call":
            _, name, payload, forbid, rng = message
            args, kwargs = _ArgUnpickler(io.BytesIO(payload)).load()
            result = {"kind": "call"}
            torch.set_rng_state(rng)
            with captured() as err:
                try:
                    fn = namespace[name]
                    guard = (_Forbid(_Exercise(name), forbid) if forbid
                             else contextlib.nullcontext())
                    used = _ReferenceWatch(reference_code.get(name))
                    with guard, used:
                        value = fn(*args, **kwargs)
                    if used.seen:
                        result["used_reference"] = name
                    result["value"] = _plain(value)
                except CheckFailure as exc:
                    if type(exc).__name__ == "ForbiddenCall":
                        called = str(exc).split("`")
                        result["forbidden"] = called[1] if len(called) > 2 else "?"
                    else:
                        result["error"] = _error_dict(exc)
                except BaseException as exc:
                    result["error"] = _error_dict(exc)
            result["stderr"] = err.getvalue()
            try:
                result["rng"] = torch.get_rng_state()
            except Exception:
                pass
            result["args_after"] = [_plain(t) for t in _flat_tensors((args, kwargs), [])]
            try:
                reply(**result)
            except Exception as exc:  # e.g. a value torch.save cannot write
                reply(kind="call", error={"type": "TypeError", "args": (
                    f"returned a value the grader cannot receive ({type(exc).__name__})",)})
            del args, kwargs, result


class _ReferenceWatch:
    """Notices when the course's reference implementation of the exercise itself runs."""

    def __init__(self, code):
        self.code = code
        self.seen = False

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code is self.code:
            self.seen = True

    def __enter__(self):
        if self.code is not None:
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        if self.code is not None:
            sys.setprofile(None)
        return False


# Audit events refused in the worker once the learner's code may run: signals to other
# processes, new processes, raw memory access through ctypes, walking the garbage collector's
# object graph, more audit hooks, and writes into protected folders.
_REFUSED = frozenset({
    "os.kill", "os.killpg", "signal.pthread_kill", "os.system", "os.exec", "os.posix_spawn",
    "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "subprocess.Popen", "sys.addaudithook",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.addressof", "ctypes.cdata", "ctypes.cdata/buffer",
    "ctypes.create_string_buffer", "ctypes.create_unicode_buffer", "gc.get_referents",
    "gc.get_referrers", "gc.get_objects", "os.chdir", "os.symlink", "os.link"})
_PATH_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.truncate", "os.chmod",
                          "os.chown", "os.utime", "shutil.rmtree", "os.mkdir"})


def _install_audit_hook(protected: tuple[str, ...]) -> None:
    def hook(event, args, _refused=_REFUSED, _paths=_PATH_EVENTS, _protected=protected,
             _str=str, _fspath=os.fspath, _abspath=os.path.abspath, _isinstance=isinstance,
             _int=int, _err=PermissionError):
        if event in _refused:
            raise _err(f"not allowed while grading: {event}")
        if event == "object.__setattr__" and args and args[0] is hook:
            raise _err("not allowed while grading")
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
            except Exception:
                raise _err("not allowed while grading: an unusual path") from None
            for folder in _protected:
                if full == folder or full.startswith(folder + "/"):
                    raise _err(f"not allowed while grading: writing to {full}")

    sys.addaudithook(hook)


class _Exercise:
    """Enough of a Check for the engine's forbidden-call guard."""

    def __init__(self, name: str):
        self.exercise = name

