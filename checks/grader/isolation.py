"""The walls around a worker: whether they can be built here (`isolation_mode`: "namespaces"
needs Linux, root and the kernel's namespaces; else "none"), the worker's own unprivileged user id,
the worker's whole environment, and the configuration `jail.py` builds the walled-in worker from:
its view of the file system is an allow-list (`worker_view`: the Python installation, the system's
libraries, a few files of /etc, /sys; read-only), so the course, the sources, the submissions and
any other copy of them anywhere on the disk are simply not in it.

Without walls the worker runs as the same user with resource limits, its own session, a private
folder, a minimal environment, the audit hook (`audit.py`) and its memory watched; the files of the
course stay readable to it, which the report says. The grading processes make themselves
non-dumpable (`make_undumpable`), so such a worker cannot read their environment or memory."""

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

from ..context import grading_environment

from ..environment import AUDIT_ENV, THREADS_ENV
from .library import PACKAGE
from .limits import Limits

WORKER_UID_BASE = 61000  # unprivileged user ids for workers (root only); none may exist
LIB_TARGET = "/tmp/.checks-lib"  # where the worker sees its copy of `checks` (namespaces)
SCRATCH = "/tmp/work"  # the worker's home, working and temporary folder (namespaces)
JAIL = PACKAGE / "grader" / "jail.py"
PR_SET_DUMPABLE = 4


def isolation_mode(requested: str = "auto") -> str:
    """"namespaces" when workers can be walled in (Linux, root, the kernel allows it); else
    "user" where the grader is root but may not make namespaces (a container without
    CAP_SYS_ADMIN, Docker's default, as Gradescope's): the worker runs as a user id of its own,
    its private folders checked unreadable to it, every process of that user killed after each
    notebook; else "none". Asking for a mode that is impossible here is an error."""
    if requested == "none":
        return "none"
    works = _namespaces_work()
    if requested == "namespaces" and not works:
        raise RuntimeError("workers cannot be walled in here (needs Linux, root and namespaces)")
    if works and requested != "user":
        return "namespaces"
    if _own_user_works():
        return "user"
    if requested == "user":
        raise RuntimeError("workers cannot run as a user of their own here (needs Linux and "
                           "root)")
    return "none"


@functools.lru_cache(maxsize=1)
def _own_user_works() -> bool:
    """Root on Linux that may change a child's user id (CAP_SETUID, CAP_SETGID: Docker keeps
    them by default)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return False
    true = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
    try:
        done = subprocess.run([true], user=65534, group=65534, extra_groups=[], timeout=30,
                              env={}, capture_output=True)
    except (OSError, subprocess.SubprocessError, ValueError):
        return False
    return done.returncode == 0


PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36


def become_worker_user(uid: int) -> None:  # preexec_fn of a worker in "user" mode (root)
    """Drop to the worker's own user id and group, no other group, and no way back: no
    new privileges (a set-user-id program such as su or sudo runs without them)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def become_subreaper() -> None:
    """Make this process the one that inherits its descendants' orphans (Linux): a process a
    worker started in a new session (double fork) stays below the grader, where it is found and
    killed after the notebook, instead of escaping to init."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def readable_by_others(path: str | os.PathLike) -> bool:
    """Whether a user of no group of the owner's could open `path` (or files under it by
    name): every folder on the way, itself included, lets "others" through (o+x). Access
    control lists are not read: the worker user is in no group, so only "others" matter."""
    import stat as st

    current = Path(os.path.realpath(path))
    for folder in [current, *current.parents]:
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            return False
        if st.S_ISDIR(mode) and not mode & st.S_IXOTH:
            return False
    return True


def private_folders(hide) -> list[str]:
    """What a worker without namespaces must not be able to read ("user" mode): the folders
    `hide` names (the sources, the submissions, --hide), the course's package (its reference
    functions) and any installed copy of it. The rest of a clone (its docs, a virtual
    environment inside it that the worker's Python needs) may stay open."""
    found = {os.path.realpath(p) for p in hide if Path(p).exists()} | {
        os.path.realpath(PACKAGE)}
    for folder in installed_course():  # a package folder, or the clone an editable one is in
        inside = [os.path.join(folder, name) for name in ("checks", "solutions")
                  if os.path.isdir(os.path.join(folder, name))]
        found |= {os.path.realpath(p) for p in inside} if inside else {folder}
    return sorted(found)


@functools.lru_cache(maxsize=1)
def _namespaces_work() -> bool:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory(prefix="checks-probe-") as tmp:
        allow, links, tmp_links = worker_view()
        config = {"grader": os.getpid(), "probe": True, "allow": allow, "links": links,
                  "tmp_links": tmp_links, "hide": [], "lib": tmp, "lib_target": LIB_TARGET,
                  "scratch": SCRATCH, "uid": 65534, "gid": 65534, "tmp_size": 2**20,
                  "cgroup_procs": None}
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


def course_folder() -> list[str]:
    """The folder above the course's package when it is the course's own (a clone, a Gradescope
    zip's course/: the sources and their hidden tests live there), never when it is the
    Python's site-packages (a wheel's install): hiding that would hide torch from the worker.
    Only the course's own package is hidden then."""
    parent = PACKAGE.parent
    sites = {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if parent.name in ("site-packages", "dist-packages") or os.path.realpath(parent) in sites:
        return []
    return [str(parent)]


def worker_environment(threads: int, lib: str, scratch: str, audit: bool = False
                       ) -> dict[str, str]:
    """The worker's whole environment: nothing of the grader's (no secret an instructor set),
    the grading flag, its thread share, and its copy of `checks`."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
           "USER": "grader", "LOGNAME": "grader", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONPATH": lib,
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": os.path.join(scratch, ".matplotlib"),
           # Every per-user setting a library reads lives in the throwaway scratch folder, never
           # in the grading user's home (a matplotlibrc or an IPython start-up file written there
           # would run or break later programs of the instructor's).
           "IPYTHONDIR": os.path.join(scratch, ".ipython"),
           "XDG_CONFIG_HOME": os.path.join(scratch, ".config"),
           "XDG_CACHE_HOME": os.path.join(scratch, ".cache"),
           "XDG_DATA_HOME": os.path.join(scratch, ".local", "share"),
           "JUPYTER_CONFIG_DIR": os.path.join(scratch, ".jupyter"),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           THREADS_ENV: str(threads)}
    if audit:
        env[AUDIT_ENV] = "1"
    return grading_environment(env)


# What of the machine a walled-in worker sees besides the Python installation, read-only: the
# system's libraries and programs, what the dynamic loader, fonts and time zones read, /sys (torch
# reads the CPUs there). Everything else is absent from its view (an allow-list, not hidden
# folders), so a course folder or a classmate's notebook elsewhere on the disk is out of reach.
SYSTEM_PATHS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libexec", "/usr/bin", "/usr/sbin",
                "/usr/share/fonts", "/usr/share/zoneinfo", "/lib", "/lib64", "/lib32", "/bin",
                "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
                "/etc/localtime", "/etc/fonts", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
                "/sys")


def python_installation() -> list[str]:
    """The folders of the Python that runs the grader (and so the worker): the virtual
    environment, its base installation, the executable's folder; as they are named and as
    they resolve."""
    named = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))),
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    return sorted(named)


def worker_view() -> tuple[list[str], list[list[str]], list[list[str]]]:
    """The walled-in worker's file system, for `jail.py`: (allow: real paths bound read-only,
    links: [path, target] made in the empty root, tmp_links: the same under /tmp, made after
    /tmp's own tmpfs)."""
    allow, links, tmp_links = set(), [], []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            links.append([path, os.readlink(path)])
        elif os.path.exists(path):
            allow.add(path)
    for path in python_installation():
        real = os.path.realpath(path)
        allow.add(real)
        if real != path:  # a named path through a link: the same link in the view
            parent = os.path.dirname(path)
            if os.path.realpath(parent) != parent:
                continue  # a link further up: the executable's own links lead to `real`
            entry = [path, real]
            (tmp_links if path == "/tmp" or path.startswith("/tmp/") else links).append(entry)
    allow = {p for p in allow if not any(p != q and p.startswith(q.rstrip("/") + "/")
                                         for q in allow)}  # inside another: bound with it
    return sorted(allow), links, tmp_links


def jail_config(limits: Limits, argv: list[str], threads: int, lib: Path, fds: tuple[int, int],
                hide, uid: int, cgroup_procs: str | None) -> dict:
    """What `jail.py` needs to start one walled-in worker (see its docstring for the keys).
    `hide`: folders the worker must not see; with the allow-list view only those inside the
    Python installation need a wall of their own (an installed copy of the course always)."""
    allow, links, tmp_links = worker_view()
    inside = {os.path.realpath(p) for p in hide if Path(p).exists()} | installed_course() | {
        str(PACKAGE), *course_folder()}
    inner = sorted(p for p in inside if any(p.startswith(a.rstrip("/") + "/") for a in allow))
    rlimits = {"RLIMIT_CORE": 0, "RLIMIT_NPROC": 1024}
    if limits.cpu:
        rlimits["RLIMIT_CPU"] = int(limits.cpu)
    if limits.output:
        rlimits["RLIMIT_FSIZE"] = int(limits.output)
    return {"grader": os.getpid(), "python": sys.executable, "argv": argv,
            "env": worker_environment(threads, LIB_TARGET, SCRATCH), "uid": uid,
            "gid": uid, "cgroup_procs": cgroup_procs, "allow": allow, "links": links,
            "tmp_links": tmp_links, "hide": inner, "lib": str(lib), "lib_target": LIB_TARGET,
            "scratch": SCRATCH, "tmp_size": max(limits.output or 0, 64 * 2**20),
            "rlimits": rlimits, "keep_fds": list(fds)}


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


def python_startup_files() -> list[Path]:
    """What every Python of this installation runs when it starts: its site-packages folders
    (a new .pth file changes their listing), their .pth files and the modules those import
    (editable installs' finders), and sitecustomize / usercustomize. A worker that added or
    changed one would run code in every later worker; the tripwire compares them after each
    notebook."""
    import importlib.util

    folders = [Path(p) for p in {*site.getsitepackages(), site.getusersitepackages()}
               if os.path.isdir(p)]
    found: set[Path] = set(folders)
    modules = {"sitecustomize", "usercustomize"}
    for folder in folders:
        for pth in folder.glob("*.pth"):
            found.add(pth)
            with contextlib.suppress(OSError, UnicodeDecodeError):
                for line in pth.read_text(encoding="utf-8").splitlines():
                    if line.startswith(("import ", "import\t")):
                        modules |= set(re.findall(r"\bimport\s+([A-Za-z_]\w*)", line))
                        modules |= set(re.findall(r"__import__\(['\"]([A-Za-z_]\w*)", line))
    for name in modules:
        with contextlib.suppress(ImportError, ValueError, AttributeError):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin and os.path.isfile(spec.origin):
                found.add(Path(spec.origin))
    return sorted(found | set(user_start_up_files()))


# What the grading user's own programs read at start in their home: matplotlib's and IPython's
# and Jupyter's settings and start-up files, Python's user site (usercustomize). A worker that
# runs as this user (no namespaces) must not write them: the audit hook refuses writes there,
# and the tripwire compares them (an absent one that appears is a change) after each notebook.
USER_START_UP = (".config/matplotlib/matplotlibrc", ".matplotlib/matplotlibrc",
                 ".ipython/profile_default/startup", ".ipython/profile_default/ipython_config.py",
                 ".ipython/profile_default/ipython_kernel_config.py",
                 ".jupyter/jupyter_notebook_config.py", ".jupyter/jupyter_server_config.py")
USER_SETTINGS = (".config/matplotlib", ".matplotlib", ".ipython", ".jupyter")  # hook: no writes


def user_start_up_files() -> list[Path]:
    """The grading user's start-up files and folders (USER_START_UP), present or not."""
    import pwd

    try:
        home = Path(pwd.getpwuid(os.geteuid()).pw_dir)
    except (KeyError, ImportError):
        return []
    found = [home / name for name in USER_START_UP]  # present or not (one that appears counts)
    startup = home / ".ipython" / "profile_default" / "startup"
    with contextlib.suppress(OSError):
        found += sorted(startup.iterdir())
    return found


def user_settings_folders() -> list[str]:
    """The folders of the grading user's settings (USER_SETTINGS), for the audit hook."""
    import pwd

    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except (KeyError, ImportError):
        return []
    return [os.path.join(home, name) for name in USER_SETTINGS]
