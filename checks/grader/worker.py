"""One submission's worker, seen from the grader: the process that runs the learner's code,
which the grader starts, walls in, talks to, and never trusts.

Two processes: the grader (trusted: the source notebooks, the course's checkers and reference)
and a worker per submission (untrusted: it runs the submission's code cells, and the learner's
functions when the grader asks). What decides a grade happens in the grader. A test cell's
exercise names are `remote.RemoteFunction`s: calling one sends the arguments here, to `Worker.call`,
which pickles them to the worker (the worker trusts the grader), and the reply comes back as data
that `wire` decodes without running any of the worker's code (plain types, capped sizes, no
expanded tensors, bounded decoding time); objects that are not plain data come back as
`RemoteObject` handles. Tensors that track gradients cross too: the grader's autograd calls the
worker for the backward pass, and the worker calls the grader back for callables the grader handed
it. What must stay in the grader (the checkers' callables and objects, bound methods, closures,
whatever the worker's library lacks) is lent: the worker gets stubs whose calls come back here.

`Worker(...)` starts one in named steps (choose the isolation, build the library, open the pipes,
make the memory cgroup, start the process, start the memory watch, wait for it to be ready); each
wall is in its own module: `library` (the worker's copy of `checks`, answers withheld), `isolation`
(namespaces, the worker's user, environment and view of the file system), `memory` (cgroup or
watch), `zygote` (fast walled-in starts), `limits` (time, CPU, output)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Literal

import torch

from .. import engine
from ..environment import PROTECT_ENV
from ..i18n import _
from . import tensors, wire
from .channel import MAX_MESSAGE, WorkerGone, receive_frame, send_frame
from .isolation import (JAIL, LIB_TARGET, become_subreaper, become_worker_user, isolation_mode,
                        jail_config, private_folders, python_installation, readable_by_others,
                        user_settings_folders, worker_environment, worker_uid)
from .library import PACKAGE, WorkerLibrary
from .limits import Limits, apply_rlimits, cores, no_core_dumps
from .memory import (MemoryCgroup, MemoryWatch, descendants, process_tree, remove_owned,
                     remove_shared_memory, shared_memory_files)
from .remote import (MAX_TEXT, RemoteFunction, RemoteObject, capped_text, grader_value,
                     rebuild_exception)
from .tensors import as_is, attach_autograd, flat_tensors, grad_leaf, replace_tensors
from .wire import ProtocolError
from .zygote import zygote_spawn

# What the grader's run of a test cell gave, which the graded chapter's check stubs in the worker
# echo when the notebook's own copy of the cell runs (`worker_side.echo_check`): "passed", or the
# error's (name, text). Not the grader's verdict (`results.Verdict`): only pass or fail.
Echo = Literal["passed"] | tuple[str, str]


class HiddenTestsRefused(Exception):
    """A block of hidden tests was not run: the worker could not fork a copy of itself to run it
    in. An ordinary exception: the test fails, saying so in one line."""


def _exit_code(status) -> int | None:
    """A wait status (as os.waitpid gives it) as a return code; None if it is not one."""
    try:
        return os.waitstatus_to_exitcode(status) if type(status) is int else None
    except ValueError:
        return None


class _Session:
    """What one test shares with the worker: storages received, grader objects lent, graphs."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.storages = wire.Storages()
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
            self.worker.check_scope(obj._scope)
            return ("worker", obj._handle)
        if isinstance(obj, RemoteFunction):
            return ("name", obj._name)
        if self.worker._stays_here(obj):
            return ("grader", self.worker.session.lend(obj),
                    str(getattr(obj, "__name__", type(obj).__name__)))
        return None

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter) \
                and obj.requires_grad and (not self.keep_grad or obj.grad_fn is not None
                                           or type(obj) is not torch.Tensor):
            return (grad_leaf, (obj.detach(),)) if self.keep_grad else \
                (as_is, (obj.detach(),))
        return NotImplemented


def _as_worker_user(limits: Limits, uid: int, cgroup_procs: str | None) -> None:
    """preexec_fn of a "user" mode worker (root without namespaces): its resource limits (and
    no more processes than a walled-in worker), its memory cgroup when one was made, then its
    own user id for good."""
    import resource

    apply_rlimits(limits)
    resource.setrlimit(resource.RLIMIT_NPROC, (1024, 1024))
    if cgroup_procs:
        with open(cgroup_procs, "w") as procs:
            procs.write(str(os.getpid()))
    become_worker_user(uid)


class Worker:
    """One submission's worker process, seen from the grader."""

    def __init__(self, workdir: str | os.PathLike, limits: Limits, library: WorkerLibrary, *,
                 hide: list | tuple = (), budget: float | None = None):
        """Start a worker for one submission (`hide`: folders it must not see, besides the
        course's own; `budget`: the monotonic time the whole notebook must end by) and wait
        until it is ready; WorkerGone if it does not start."""
        self.limits = limits
        self.library = library
        self.budget = budget
        self.stderr_text = ""  # stderr the learner's code wrote during the current test's calls
        self.dead: str | None = None
        self.timed_out = False  # the worker was ended because a reply did not come in time
        self.cgroup: MemoryCgroup | None = None
        self.watch: MemoryWatch | None = None
        self.process = None
        self.session = _Session(time.monotonic() + limits.cell_timeout)
        self._forks: list[int] = []  # the blocks of hidden tests open now (`fork`, `join`)
        self._fork_count = 0
        self._fork_storages: list[tuple[_Session, set[int]]] = []
        self.mode, self.uid = self._choose_isolation()
        # Without namespaces, what the worker may leave behind is found by difference: the
        # processes below this one (it inherits orphans: `become_subreaper`) and the files in
        # /dev/shm that were not there before.
        become_subreaper()
        self._children_before = set(descendants(os.getpid()))
        self._shm_before = shared_memory_files()
        workdir = Path(workdir)
        self.log = workdir / "worker.log"
        lib = library.build(workdir / "lib")
        fds = self._open_pipes()
        try:
            self._make_cgroup()
            self._start_process(workdir, lib, fds, hide)
        except BaseException:
            self.close()  # the cgroup made for it goes too
            raise
        finally:
            for fd in fds:  # the worker's ends: only the worker holds them now
                os.close(fd)
        self._start_watch()
        self._handshake()

    # ---- starting ----
    def _choose_isolation(self) -> tuple[str, int | None]:
        """The isolation mode, and the worker's own user id when it is walled in."""
        mode = isolation_mode(self.limits.isolation)
        return mode, worker_uid() if mode in ("namespaces", "user") else None

    def _open_pipes(self) -> tuple[int, int]:
        """Two pipes; this side keeps one end of each, the worker's ends are returned."""
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        return to_worker_r, from_worker_w

    def _make_cgroup(self) -> None:
        limits = self.limits
        if limits.memory and limits.memory_by in ("auto", "cgroup"):
            self.cgroup = MemoryCgroup.create(limits.memory)
            if self.cgroup is None and limits.memory_by == "cgroup":
                raise RuntimeError("no memory cgroup can be made here (--memory-by cgroup)")

    def _worker_argv(self, lib: Path, fds: tuple[int, int]) -> list[str]:
        """The worker's command line: a Python that imports `checks` from its library only."""
        seen_lib = LIB_TARGET if self.mode == "namespaces" else str(lib)
        return [sys.executable, "-I", "-c",
                f"import sys; sys.path.insert(0, {seen_lib!r}); from checks.grader.worker_side "
                f"import worker_main; worker_main({fds[0]}, {fds[1]})"]

    def _start_process(self, workdir: Path, lib: Path, fds: tuple[int, int], hide) -> None:
        """Walled in: forked by the zygote, else a fresh Python through `jail.py`. Without
        walls: a fresh Python with resource limits, the audit hook and a private folder."""
        threads = max(1, self.limits.threads or cores())
        argv = self._worker_argv(lib, fds)
        with open(self.log, "wb") as log, open(os.devnull, "rb") as null:
            os.chmod(self.log, 0o600)  # the learner's output: not for another worker's user
            if self.mode == "namespaces":
                config = jail_config(self.limits, argv, threads, lib, fds, hide, self.uid,
                                     str(self.cgroup.procs) if self.cgroup else None)
                self.process = zygote_spawn(config, [*fds, log.fileno()])
                if self.process is None:  # no zygote: a fresh Python behind the walls
                    self.process = subprocess.Popen(
                        [sys.executable, "-I", "-S", str(JAIL), json.dumps(config)],
                        stdin=null, stdout=log, stderr=log, pass_fds=fds, env={},
                        start_new_session=True, preexec_fn=no_core_dumps)
                return
            scratch = workdir / "cwd"
            scratch.mkdir(exist_ok=True)
            prepare = functools.partial(apply_rlimits, self.limits)
            if self.mode == "user":
                self._check_private(hide)
                os.chmod(workdir, 0o711)  # its library readable, the rest of the folder not
                os.chown(scratch, self.uid, self.uid)
                os.chmod(scratch, 0o700)
                prepare = functools.partial(_as_worker_user, self.limits, self.uid,
                                            str(self.cgroup.procs) if self.cgroup else None)
            env = worker_environment(threads, str(lib), str(scratch), audit=True)
            env[PROTECT_ENV] = os.pathsep.join(  # the Python installation too: a .pth file
                str(Path(p).resolve()) for p in [*hide, PACKAGE.parent, *python_installation(),
                                                 *user_settings_folders()])
            self.process = subprocess.Popen(
                argv, stdin=null, stdout=log, stderr=log, cwd=scratch, env=env,
                pass_fds=fds, preexec_fn=prepare, start_new_session=True)

    def _check_private(self, hide) -> None:
        """"user" mode: the worker runs as a user of its own but sees the whole disk, so what it
        must not read has to be closed to other users; a folder that is not stops grading with
        one line (before any of the submission's code runs)."""
        for folder in private_folders(hide):
            if readable_by_others(folder):
                raise WorkerGone(_(
                    "without namespaces (a container without CAP_SYS_ADMIN) the worker runs as a "
                    "user of its own, and {folder} is readable by other users: make it private "
                    "(chmod o-rwx; Gradescope's run_autograder does) or grade where namespaces "
                    "work").format(folder=folder))
        python = os.path.realpath(sys.executable)
        if not readable_by_others(python):
            raise WorkerGone(_(
                "without namespaces (a container without CAP_SYS_ADMIN) the worker runs as a "
                "user of its own, which cannot run {python}: a folder on its way is closed to "
                "other users (a Python installed under /root); install Python where every user "
                "may run it").format(python=python))

    def _start_watch(self) -> None:
        """Where the kernel does not count the worker's memory, watch it."""
        if self.limits.memory and self.cgroup is None:
            self.watch = MemoryWatch(self.process.pid, self.uid, self.limits.memory,
                                     shm_before=None if self.mode == "namespaces"
                                     else self._shm_before)
            self.watch.start()

    def _handshake(self) -> None:
        try:
            self._serve("ready", self.deadline(max(60.0, self.limits.cell_timeout)))
        except WorkerGone as gone:
            raise WorkerGone(_("the worker did not start: {why}{log}").format(
                why=gone, log=self._log_tail())) from None

    # ---- plumbing ----
    def deadline(self, seconds: float | None = None) -> float:
        """When something started now must end: `seconds` (default: the cell time limit) from
        now, or the notebook's budget if that comes first."""
        end = time.monotonic() + (self.limits.cell_timeout if seconds is None else seconds)
        return end if self.budget is None else min(end, self.budget)

    def _timeout_text(self) -> str:
        if self.budget is not None and time.monotonic() >= self.budget:
            return _("ran past the notebook's {seconds} s budget (--notebook-timeout)").format(
                seconds=f"{self.limits.notebook_time:g}")
        return _("ran longer than the {seconds} s limit").format(
            seconds=f"{self.limits.cell_timeout:g}")

    def _post(self, message: tuple) -> None:
        if self.dead:
            raise WorkerGone(self.dead)
        buffer = io.BytesIO()
        _ArgPickler(buffer, self, keep_grad=message[0] == "call").dump(message)
        try:
            send_frame(self._to_worker, buffer.getvalue())
        except OSError:
            self._gone(_("the worker stopped reading{exit}").format(exit=self._exit_text()))

    def _receive_reply(self, deadline: float) -> dict:
        try:
            data = receive_frame(self._from_worker, deadline)
        except TimeoutError:
            self.timed_out = True
            self._gone(self._timeout_text())
        except EOFError:
            self._gone(_("the worker process died{exit}").format(exit=self._exit_text()))
        except OverflowError as size:
            self._gone(_("sent back {size} MiB in one answer (limit {limit} MiB)").format(
                size=f"{int(str(size)) / 2**20:.0f}", limit=f"{MAX_MESSAGE / 2**20:.0f}"))
        try:
            reply = wire.decode(data, self.session.storages)
        except ProtocolError as exc:
            self._gone(_("broke the grading protocol: {why}").format(why=exc))
        except Exception as exc:  # noqa: BLE001 - any decoding surprise ends the worker
            self._gone(_("broke the grading protocol ({why})").format(why=type(exc).__name__))
        finally:
            del data
        if not isinstance(reply, dict) or not isinstance(reply.get("kind"), str):
            self._gone(_("broke the grading protocol ({why})").format(why=_("not a reply")))
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
            elif kind == "joined":  # the fork serving a block of hidden tests ended early
                self._gone(_("the worker process died{exit}").format(
                    exit=self._status_text(_exit_code(reply.get("status")))))
            else:
                self._gone(_("broke the grading protocol ({why})").format(
                    why=_("a {kind} reply").format(kind=repr(kind[:40]))))

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
        target = self._lent(reply)
        args, kwargs = grader_value(reply.get("args"), self), grader_value(
            reply.get("kwargs"), self)
        if not isinstance(args, tuple) or not isinstance(kwargs, dict) or \
                not all(type(k) is str for k in kwargs):
            raise TypeError("bad callback arguments")
        if reply.get("grad") is not True:
            return target(*args, **kwargs)
        leaves = [t for t in flat_tensors((args, kwargs)) if t.requires_grad]
        with torch.enable_grad():
            value = target(*args, **kwargs)
        outs = flat_tensors(value)
        flags = [bool(o.requires_grad) for o in outs]
        gid = None
        if leaves and any(flags):
            gid = len(self.session.graphs) + 1
            self.session.graphs[gid] = ([o for o, f in zip(outs, flags) if f], leaves)
        return (replace_tensors(value, [o.detach() for o in outs]), gid, flags)

    def _callback_backward(self, reply: dict):
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
        got = torch.autograd.grad([o for o, _g in pairs], leaves, [g.to(o.dtype) for o, g in pairs],
                                  retain_graph=True, allow_unused=True)
        return [None if g is None else g.detach() for g in got]

    def _stays_here(self, obj) -> bool:
        """Objects the learner's function receives that must stay in the grader: bound
        methods, closures and lambdas, the checkers' callables and objects, and anything the
        worker's copy of `checks` does not have (the withheld reference functions)."""
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
            why = _("used {used} MiB, over the {limit} MiB memory limit").format(
                used=f"{self.watch.exceeded / 2**20:.0f}",
                limit=f"{self.limits.memory / 2**20:.0f}")
        self.dead = why
        raise WorkerGone(why)

    def _exit_text(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        return self._status_text(code)

    def _status_text(self, code: int | None) -> str:
        """How a worker's process ended, from its return code (negative: the signal)."""
        if code is None:
            return ""
        memory = (self.cgroup is not None and self.cgroup.oom_killed()) or (
            self.watch is not None and self.watch.exceeded)
        if memory:
            return _(" (over the {limit} MiB memory limit)").format(
                limit=f"{self.limits.memory / 2**20:.0f}")
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = _("signal {number}").format(number=-code)
            extra = {"SIGKILL": _(", killed"),
                     "SIGXCPU": _(", over the CPU time limit")}.get(name, "")
            return _(" (killed by {signal}{extra})").format(signal=name, extra=extra)
        if code == 97:
            return _(" (it could not be started{log})").format(log=self._log_tail())
        return _(" (exit status {code})").format(code=code)

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
                send_frame(self._to_worker, pickle.dumps(("quit",)))
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
        deadline = time.monotonic() + 10
        while (mine := self._strays()) and time.monotonic() < deadline:
            for pid in mine:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
            self._reap(mine)
        left += mine
        if self.mode != "namespaces":  # a namespaced worker's /dev/shm was its own
            remove_shared_memory(self._shm_before, self.uid)
        if self.mode == "user":  # what its own user left in the shared temporary folders
            remove_owned(("/tmp", "/var/tmp"), self.uid)
        self.left_behind = sorted(set(left))

    def _strays(self) -> list[int]:
        """The worker's processes still alive: every process of its own user id, and the
        processes below this one that were not there before it (orphans come here)."""
        mine = {p for p, _t in process_tree(0, self.uid)} if self.uid is not None else set()
        if self.mode != "namespaces":
            mine |= set(descendants(os.getpid())) - self._children_before
        return sorted(mine)

    @staticmethod
    def _reap(killed: list[int]) -> None:
        """Collect those of the killed processes that are this process's children (orphans it
        inherited), so that they do not stay as zombies; never another child's status."""
        for pid in killed:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    # ---- requests ----
    def begin_test(self, deadline: float) -> None:
        """A fresh session: the storages, lent objects and graphs of the previous test go."""
        self.session = _Session(deadline)
        self.stderr_text = ""

    @property
    def scope(self) -> tuple[int, ...]:
        """The forks open now, outermost first: what the worker sends back is valid while the
        forks open when it was sent still are (`check_scope`)."""
        return tuple(self._forks)

    def check_scope(self, scope: tuple[int, ...]) -> None:
        """An object of the worker, or a gradient graph, from a fork that has ended is gone
        with it (its handle may name another object in the worker now): refused."""
        if tuple(self._forks[:len(scope)]) != scope:
            raise LookupError(_("an object that a block of hidden tests made in the worker is "
                                "gone after the block"))

    def fork(self) -> None:
        """Go into a block of hidden tests: from now until `join`, a throwaway copy of the
        worker serves every request (`worker_side._WorkerSide.do_fork`), so that what the
        learner's code keeps of the block's arguments dies with it. HiddenTestsRefused when
        the worker could not fork: the block is not run (never in the shared worker)."""
        self._post(("fork",))
        reply = self._serve("fork", self.session.deadline)
        if reply.get("ok") is not True:
            raise HiddenTestsRefused(_(
                "the hidden tests were not run: the worker could not start a copy of itself to "
                "run them in ({why})").format(why=capped_text(reply.get("why"), 200) or "?"))
        self._fork_count += 1
        self._forks.append(self._fork_count)
        self._fork_storages.append((self.session, set(self.session.storages.live)))

    def join(self) -> None:
        """End the innermost block of hidden tests: its copy of the worker exits, the worker
        goes on serving. The storages first received from the copy are forgotten (their ids
        are memory that the worker may reuse for something else), as are its objects and
        graphs (`check_scope`)."""
        self._forks.pop()
        session, before = self._fork_storages.pop()
        for sid in set(session.storages.live) - before:
            del session.storages.live[sid]
        self._post(("join",))
        self._serve("joined", self.session.deadline)

    def run_cell(self, index: int, source: str, echo: Echo | None = None) -> dict:
        """Execute one cell in the notebook's namespace: {"ok", "ename", "evalue", "stderr"}.
        `echo` (for a test cell: "passed" or (ename, evalue)) is what the graded chapter's
        check stubs echo."""
        self._post(("cell", index, source, echo))
        reply = self._serve("cell", self.deadline())
        return {"ok": reply.get("ok") is True,
                "ename": capped_text(reply.get("ename"), 200) or "Error",
                "evalue": capped_text(reply.get("evalue"), self.limits.stderr_kept),
                "stderr": capped_text(reply.get("stderr"), self.limits.stderr_kept)}

    def lookup(self, name: str) -> dict:
        """{"found": "missing" | "class" | "function" | "callable" | "value", "value": ...}."""
        self._post(("lookup", name))
        reply = self._serve("lookup", self.session.deadline)
        return {"found": capped_text(reply.get("found"), 20),
                "value": grader_value(reply.get("value"), self)}

    def call(self, target: tuple, args: tuple, kwargs: dict, deadline: float):
        exercise, forbid = engine.calling.get() or (None, None)
        grad = torch.is_grad_enabled()
        leaves = [t for t in flat_tensors((args, kwargs)) if t.requires_grad] if grad else []
        self._post(("call", target, (args, kwargs), dict(forbid or {}), torch.get_rng_state(),
                    grad))
        reply = self._serve("call", deadline)
        rng = reply.get("rng")
        if type(rng) is torch.Tensor and rng.dtype == torch.uint8 and \
                rng.shape == torch.get_rng_state().shape:
            torch.set_rng_state(rng.clone())
        tensors.set_generator_states((args, kwargs), grader_value(reply.get("generators"), self))
        stderr = self.stderr_text + capped_text(reply.get("stderr"), MAX_TEXT)
        self.stderr_text = stderr[-MAX_TEXT:]
        name = target[1] if target[0] == "name" else _("your function")
        if isinstance(reply.get("forbidden"), str):
            fname = capped_text(reply["forbidden"], 100)
            raise engine.ForbiddenCall(exercise or name, _(
                "calls `{name}`, which this exercise asks you to write yourself (seen inside the "
                "worker).").format(name=fname),
                                hint=(forbid or {}).get(fname))
        if "error" in reply:
            raise rebuild_exception(reply["error"])
        changed = reply.get("changed")
        if isinstance(changed, list) and changed:
            if not (engine.writes_back.get() and tensors.write_back(
                    (args, kwargs), grader_value(reply.get("inputs"), self))):
                raise engine.in_place_failure(exercise or name,
                                              [capped_text(c, 100) for c in changed[:8]])
        value = grader_value(reply.get("value"), self)
        flags = reply.get("flags")
        if leaves and isinstance(flags, list) and type(reply.get("graph")) is int:
            if reply.get("leaves") != len(leaves) or \
                    len(flags) != len(flat_tensors(value)) or \
                    not all(type(f) is bool for f in flags):
                self._gone(_("broke the grading protocol ({why})").format(
                    why=_("gradients that do not match")))
            gid, scope = reply["graph"], self.scope
            return attach_autograd(value, flags, leaves,
                                    lambda grads: self._backward(gid, grads, deadline, scope))
        return value

    def _backward(self, gid: int, grads: list, deadline: float,
                  scope: tuple[int, ...] = ()) -> list:
        self.check_scope(scope)
        self._post(("backward", gid, [None if g is None else g.detach() for g in grads]))
        reply = self._serve("backward", deadline)
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            raise RuntimeError(capped_text(error.get("message"), 500) or
                               "the backward pass failed in the worker")
        got = reply.get("grads")
        if not isinstance(got, list):
            self._gone(_("broke the grading protocol ({why})").format(why=_("no gradients")))
        return got

    def getattr(self, handle: int, name: str, deadline: float):
        self._post(("getattr", handle, name))
        reply = self._serve("getattr", deadline)
        if "error" in reply:
            raise rebuild_exception(reply["error"])
        return grader_value(reply.get("value"), self)

    def vars(self, handle: int, deadline: float) -> dict:
        self._post(("vars", handle))
        reply = self._serve("vars", deadline)
        value = grader_value(reply.get("value"), self)
        if not isinstance(value, dict):
            raise TypeError("vars() argument must have __dict__ attribute")
        return value
