"""The channel between the grader and a worker: frames of an 8-byte big-endian length and a
payload (the payload is `wire`'s encoding from the worker, a pickle from the grader), read with a
deadline and a size cap; and `WorkerGone`, how the grader's side learns the worker is no use.

Both sides import this module (it is in the worker's library)."""

from __future__ import annotations

import os
import select
import struct
import time

MAX_MESSAGE = 64 * 2**20  # bytes in one message from the worker; more ends the worker


def send_frame(fd: int, payload: bytes) -> None:
    """Write one frame, all of it."""
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


def receive_frame(fd: int, deadline: float | None = None, limit: int = MAX_MESSAGE) -> bytes:
    """One frame's payload. TimeoutError past `deadline`, EOFError when the other side closed,
    OverflowError(size) when it announces more than `limit` bytes."""
    (size,) = struct.unpack(">Q", _read_exact(fd, 8, deadline))
    if size > limit:
        raise OverflowError(size)
    return _read_exact(fd, size, deadline)


class WorkerGone(BaseException):
    """The worker died, ran past a limit or broke the protocol. A BaseException, so that no
    checker's `except Exception` turns it into an ordinary failure."""

