"""The worker's budgets: `Limits` (per cell, per worker: time, memory, CPU, output, threads), the
cores this process may use, and the resource limits set in a worker's process before it runs
Python (the walled-in path sets them in `jail.py` instead)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Resource limits for one submission's worker. Defaults fit a 2-core, 8 GiB grading box."""

    cell_timeout: float = 120.0  # wall-clock seconds per cell (and per test cell's calls)
    notebook_time: float = 1200.0  # wall-clock seconds for a whole notebook, restarts included
    memory: int = 3 * 2**30  # bytes of memory the worker and its processes may use; 0: none
    cpu: int = 900  # CPU seconds for the whole worker (RLIMIT_CPU)
    output: int = 64 * 2**20  # bytes the worker may write to any file, its log included
    stderr_kept: int = 4000  # characters of a cell's stderr kept for the report
    threads: int = 0  # torch / OpenMP threads in the worker; 0: every core this process has
    memory_by: str = "auto"  # "cgroup" (the kernel counts and limits), "rss" (watched), "auto"
    # "namespaces" (root: walls, own user), "user" (root without namespaces: own user only),
    # "none", "auto" (the strongest this machine allows)
    isolation: str = "auto"


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def no_core_dumps() -> None:  # preexec_fn of the zygote and the jail
    import resource  # POSIX only: `python -m checks status` also runs where it is missing

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def apply_rlimits(limits: Limits) -> None:  # runs in the worker's process before exec (no walls)
    import resource  # POSIX only (see above)

    for kind, value in ((resource.RLIMIT_CPU, limits.cpu),
                        (resource.RLIMIT_FSIZE, limits.output), (resource.RLIMIT_CORE, 0)):
        if value or kind == resource.RLIMIT_CORE:
            resource.setrlimit(kind, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead

