"""The audit hook of a worker that runs without walls (no root): audit events it refuses
(signals, new processes, ctypes, changing folder, links) and writes it refuses under the protected
folders. Inside the worker's own process, so a speed bump only: the walls, where they can be
built, are what holds.

This module runs in the worker and is in its library (`library.WORKER_GRADER_MODULES`)."""

from __future__ import annotations

import os
import sys

_REFUSED = frozenset({
    "os.kill", "os.killpg", "signal.pthread_kill", "os.system", "os.exec", "os.posix_spawn",
    "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "subprocess.Popen", "sys.addaudithook",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "os.chdir", "os.symlink",
    "os.link"})
_PATH_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.truncate", "os.chmod",
                          "os.chown", "os.utime", "shutil.rmtree", "os.mkdir"})


_FORKING = [False]  # True while the worker's own loop forks (`forking`); not a wall either


class forking:
    """While the worker's loop forks the copy of itself that serves a block of hidden tests
    (worker_side._WorkerSide.do_fork): "os.fork" is let through. The learner's code could use it
    too: like the rest of this hook, a speed bump."""

    def __enter__(self):
        _FORKING[0] = True

    def __exit__(self, *exc):  # runs in the parent and in the child
        _FORKING[0] = False


_PROC_LINKS = frozenset({"root", "cwd", "fd", "fdinfo", "map_files", "mem", "environ", "exe"})


def _proc_problem(path: str, own: str) -> str | None:
    """Why a path under /proc is refused: another process's files (the grader's environment and
    memory, when it runs as the same user), or a process's links that lead out of the audit's
    reach (/proc/self/root/... is the whole file system again, unresolved)."""
    parts = path.split("/")  # "", "proc", who, ...
    if len(parts) < 4 or parts[1] != "proc":
        return None
    who, rest = parts[2], parts[3:]
    if who.isdigit() and who != own:
        return f"another process's files ({path})"
    if who in ("self", own) and rest[0] == "task":
        rest = rest[2:]  # /proc/self/task/<thread>/...
    if who in ("self", "thread-self", own) and rest and rest[0] in _PROC_LINKS:
        return f"a process's link or memory in /proc ({path})"
    return None


def install_audit_hook(protected: tuple[str, ...]) -> None:
    """Refuse the events in `_REFUSED`, any opening of /proc paths that lead to other processes
    or around the hook, and writes under `protected` (paths compared resolved: a symbolic link
    or /proc/self/root/... is followed first)."""
    own = str(os.getpid())

    def hook(event, args, _refused=_REFUSED, _paths=_PATH_EVENTS, _protected=protected,
             _str=str, _fspath=os.fspath, _abspath=os.path.abspath,
             _realpath=os.path.realpath, _proc=_proc_problem, _isinstance=isinstance,
             _int=int, _err=PermissionError, _isdir=os.path.isdir, _forking=_FORKING):
        if event in _refused and not (event == "os.fork" and _forking[0]):
            raise _err(f"not allowed while grading: {event}")
        if event != "open" and event not in _paths:
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (_isinstance(mode, _str) and any(c in mode for c in "wax+")) or (
                _isinstance(flags, _int) and flags & 0o3 != 0)
        else:
            path, writing = (args[0] if args else None), True
        if _isinstance(path, _int) or path is None:
            return
        try:
            given = _abspath(_fspath(path))
            given = given if _isinstance(given, _str) else given.decode("utf-8", "replace")
            full = _realpath(given)
        except Exception:  # noqa: BLE001
            raise _err("not allowed while grading: an unusual path") from None
        for candidate in (given, full):
            problem = _proc(candidate, own)
            if problem:
                raise _err(f"not allowed while grading: {problem}")
        # A folder opened under a protected one is refused too: its descriptor is what
        # os.open(name, dir_fd=...) writes through, and that event names only the bare name.
        if not writing and not _isdir(full):
            return
        for folder in _protected:
            for candidate in (given, full):
                if candidate == folder or candidate.startswith(folder + "/"):
                    raise _err(f"not allowed while grading: writing to {candidate}"
                               if writing else
                               f"not allowed while grading: opening the folder {candidate}")

    sys.addaudithook(hook)
