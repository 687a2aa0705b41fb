"""The walls around a worker: whether they can be built here (`isolation_mode`: "namespaces"
needs Linux, root and the kernel's namespaces; else "none"), the worker's own unprivileged user id,
the worker's whole environment, and the configuration `jail.py` builds the walled-in worker from
(what is hidden: the course, the sources, the submissions, home and temporary folders; what is
bound back read-only: the Python installation).

Without walls the worker runs as the same user with resource limits, its own session, a private
folder, a minimal environment, the audit hook (`audit.py`) and its memory watched; the files of the
course stay readable to it, which the report says."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import site
import subprocess
import sys
import tempfile
from pathlib import Path

from ..context import AUDIT_ENV, THREADS_ENV, grading_environment
from .library import PACKAGE
from .limits import Limits

WORKER_UID_BASE = 61000  # unprivileged user ids for workers (root only); none may exist
LIB_TARGET = "/tmp/.checks-lib"  # where the worker sees its copy of `checks` (namespaces)
SCRATCH = "/tmp/work"  # the worker's home, working and temporary folder (namespaces)
JAIL = PACKAGE / "grader" / "jail.py"
PR_SET_DUMPABLE = 4


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
            done = subprocess.run([sys.executable, "-I", "-S", str(JAIL),
                                   json.dumps(config)], capture_output=True, timeout=30, env={})
        except (OSError, subprocess.SubprocessError):
            return False
    return done.returncode == 0


_uid_lock = None


def worker_uid() -> int:
    """An unprivileged user id no account and no other grading process uses (held per
    process, so that parallel graders' workers never share one)."""
    import fcntl  # POSIX only (as `pwd`): the walls exist only there
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


def installed_course() -> set[str]:
    """Where an installed `checks` package lives: the folder an editable install points at
    (its finder in site-packages names it) and a regular install's package folder."""
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


def jail_config(limits: Limits, argv: list[str], threads: int, lib: Path, fds: tuple[int, int],
                hide, uid: int, cgroup_procs: str | None) -> dict:
    """What `jail.py` needs to start one walled-in worker (see its docstring for the keys)."""
    runtime = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                              sys.base_exec_prefix)}
    runtime |= {sys.prefix, os.path.dirname(os.path.dirname(os.path.realpath(
        sys.executable)))}
    hidden = {os.path.realpath(p) for p in hide if Path(p).exists()}
    hidden |= installed_course()
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
            "env": worker_environment(threads, LIB_TARGET, SCRATCH), "uid": uid,
            "gid": uid, "cgroup_procs": cgroup_procs,
            "hide": sorted(hidden), "reveal": reveal, "lib": str(lib),
            "lib_target": LIB_TARGET, "scratch": SCRATCH,
            "tmp_size": max(limits.output or 0, 64 * 2**20), "rlimits": rlimits,
            "keep_fds": list(fds)}


def make_undumpable() -> None:
    """Make this process non-dumpable (Linux): its /proc files (environ, mem, fds) are then
    readable only with CAP_SYS_PTRACE, so a worker running as the same user (no walls) cannot
    read the instructor's environment or the grader's memory. Reset by exec: each grading
    process calls it itself."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
