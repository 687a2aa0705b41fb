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


def install_audit_hook(protected: tuple[str, ...]) -> None:
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
