"""The zygote: a process that has imported torch (and nothing of the course) and forks
walled-in workers on request through `jail.py --zygote`, so that a worker starts in a fraction of a
second instead of importing torch again. One per grading process, started when its first walled-in
worker is; `zygote_spawn` returns a handle with the part of `subprocess.Popen` a `Worker` uses, or
None when there is no zygote to ask (the worker is then started as a fresh Python)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time

from .isolation import JAIL
from .limits import no_core_dumps


class _Zygote:
    """A process that has imported torch and forks walled-in workers on request (see
    `checks/grader/jail.py`): a worker starts in a fraction of a second instead of importing torch
    again. One per grading process, started when the first worker is."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.channel = ours
        self.exited: dict[int, int] = {}
        self.buffer = b""
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(JAIL), "--zygote", str(theirs.fileno()), str(os.getpid())],
            pass_fds=(theirs.fileno(),), env={}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=no_core_dumps)
        theirs.close()

    def alive(self) -> bool:
        return self.process.poll() is None

    def spawn(self, config: dict, fds: list[int]) -> int:
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


def zygote_spawn(config: dict, fds: list[int]) -> "_ZygoteChild | None":
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
