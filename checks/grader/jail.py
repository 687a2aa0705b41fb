"""Start a grading worker behind operating-system walls (Linux, run as root).

`checks.grader.worker` runs this file as `python -I -S jail.py CONFIG_JSON` (standard library only: it
must not import the course's `checks`, which holds the answers). It

1. joins the worker's memory cgroup (so everything below is counted and limited),
2. enters new mount, PID, network and IPC namespaces and forks: the child is process 1 of the
   new PID namespace, and when it ends the kernel kills every process left in that namespace,
   however it was started (a new session, a double fork);
3. in the new mount namespace: a fresh /proc that shows only the namespace's processes; an empty
   read-only tmpfs over every hidden folder (the course repository, the source notebooks, the
   submissions, the grader's home) with the Python installation bound back read-only; a private
   tmpfs /tmp (also /var/tmp, /dev/shm, /run/lock) of limited size holding the worker's scratch
   folder and, read-only, the worker's copy of `checks` (without the graded chapter's answers);
4. forks the worker: resource limits, no supplementary groups, an unprivileged user id of its
   own, no_new_privs (setuid programs cannot raise it), only the two pipe ends open, and a
   minimal environment; then executes Python.

Process 1 waits for the worker and exits with its status; this process relays it (a worker killed
by a signal makes this process die of the same signal). If the grader dies, this process dies
(PR_SET_PDEATHSIG), and with it process 1 and the whole namespace.

`CONFIG_JSON` keys: python, argv, env, uid, gid, cgroup_procs (or null), hide, reveal, lib,
lib_target, scratch, tmp_size, rlimits ({name: value}), keep_fds, probe (only check that it all
works, then exit 0).

`python -I jail.py --zygote FD GRADER_PID` is the same, started once per grading process: it
imports torch (about two CPU seconds, the bulk of a worker's start) and then, for each request on
the Unix socket FD (a config and the worker's three file descriptors: its two pipe ends and its
log), forks the steps above; the worker then imports its copy of `checks` and serves the grader
without executing a new Python. The zygote holds nothing of the course: torch and this file. It
reports `{"spawned": pid}` and, when that process ends, `{"exited": pid, "code": code}`.
"""

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
CLONE_NEWNET, CLONE_NEWIPC = 0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
O_PATH = 0o10000000

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), "prctl")


def _die_with_parent(parent: int) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _mkdirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


def _bind(fd: int, target: str) -> None:
    """Bind the folder opened as `fd` at `target`, read-only."""
    _mkdirs(target)
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _hide(folder: str) -> None:
    _mount("none", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")


def build_view(cfg: dict) -> None:
    """Steps 3: the worker's view of the file system (runs as process 1, still root)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    reveal = [p for p in cfg["reveal"] if os.path.isdir(p)]
    opened = {p: os.open(p, O_PATH | os.O_DIRECTORY) for p in reveal}
    lib = os.open(cfg["lib"], O_PATH | os.O_DIRECTORY)
    private = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock"]
    hide = [p for p in cfg["hide"] if os.path.isdir(p) and p not in private]
    # Folders to hide that lie inside a folder bound back are hidden after the binding.
    outer = [p for p in hide if not any(_under(p, r) for r in reveal)]
    inner = [p for p in hide if p not in outer]
    for folder in sorted(outer, key=len):
        if not any(_under(folder, o) and folder != o for o in outer):
            _hide(folder)
    for folder in private:
        if os.path.isdir(folder):
            _mount("none", folder, "tmpfs", MS_NOSUID | MS_NODEV,
                   f"mode=1777,size={int(cfg['tmp_size'])}")
    for path in sorted(reveal, key=len):
        _bind(opened[path], path)
    for folder in inner:
        _mount("none", folder, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0755,size=4k")
    _bind(lib, cfg["lib_target"])
    scratch = cfg["scratch"]
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    os.chown(scratch, cfg["uid"], cfg["gid"])
    for fd in [*opened.values(), lib]:
        os.close(fd)


def become_worker(cfg: dict) -> None:
    """Step 4, in the worker's process: limits, an unprivileged identity, then Python."""
    import resource

    for name, value in cfg["rlimits"].items():
        kind = getattr(resource, name)
        resource.setrlimit(kind, (value, value))
    os.setgroups([])
    os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.chdir(cfg["scratch"])
    os.umask(0o077)
    keep = {0, 1, 2, *cfg["keep_fds"]}
    for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd in cfg["keep_fds"]:
        os.set_inheritable(fd, True)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the size limit fails instead
    if cfg.get("in_process"):  # forked from the zygote: torch is already imported
        os.environ.clear()
        os.environ.update(cfg["env"])
        sys.argv = ["-c"]
        sys.path.insert(0, cfg["lib_target"])
        from checks.grader.worker_side import worker_main

        worker_main(*cfg["keep_fds"])
        os._exit(0)
    os.execve(cfg["python"], cfg["argv"], cfg["env"])


def process_one(cfg: dict, alive: int) -> None:
    """Process 1 of the new PID namespace: build the view, start the worker, reap, exit.
    `alive`: a pipe whose other end the parent holds (its pid is not visible from here)."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.set_blocking(alive, False)
        try:
            if os.read(alive, 1) == b"":  # the parent died before the line above
                os._exit(1)
        except BlockingIOError:
            pass
        os.close(alive)
        build_view(cfg)
    except OSError as exc:
        print(f"checks.grader.jail: {exc}", file=sys.stderr, flush=True)
        os._exit(97)
    if cfg.get("probe"):
        os._exit(0)
    worker = os.fork()
    if worker == 0:
        try:
            become_worker(cfg)
        except BaseException as exc:  # noqa: BLE001 - nothing must escape into process 1's code
            print(f"checks.grader.jail: could not start the worker: {exc}", file=sys.stderr,
                  flush=True)
        os._exit(97)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(97)
        if pid == worker:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status))


def main() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sys.argv[1] == "--zygote":
        zygote(int(sys.argv[2]), int(sys.argv[3]))
        return
    cfg = json.loads(sys.argv[1])
    _die_with_parent(int(cfg["grader"]))
    jail(cfg)


def zygote(fd: int, grader: int) -> None:
    import select
    import socket

    import torch  # noqa: F401 - imported once here, inherited by every worker forked below

    _die_with_parent(grader)
    channel = socket.socket(fileno=fd)

    def report(**message) -> None:
        channel.sendall(json.dumps(message).encode() + b"\n")

    while True:
        ready, _, _ = select.select([channel], [], [], 0.05)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            report(exited=pid, code=os.waitstatus_to_exitcode(status))
        if not ready:
            continue
        data, fds, _, _ = socket.recv_fds(channel, 1 << 20, 3)
        if not data:
            os._exit(0)  # the grader is gone
        cfg = json.loads(data)
        pid = os.fork()
        if pid == 0:
            try:
                channel.close()
                to_worker, from_worker, log = fds
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                for extra in (null, log):
                    os.close(extra)
                os.setsid()
                _die_with_parent(os.getppid())
                cfg.update(in_process=True, keep_fds=[to_worker, from_worker])
                jail(cfg)
            finally:
                os._exit(97)
        for extra in fds:
            os.close(extra)
        report(spawned=pid)


def jail(cfg: dict) -> None:
    """Steps 1 and 2, then wait for process 1 and end as it ended."""
    if cfg.get("cgroup_procs"):
        with open(cfg["cgroup_procs"], "w") as f:
            f.write("0")
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
    try:
        _check(_libc.unshare(flags), "unshare")
    except OSError as exc:
        print(f"checks.grader.jail: {exc}", file=sys.stderr, flush=True)
        sys.exit(97)
    alive, holder = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(holder)
        process_one(cfg, alive)
    os.close(alive)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        sig = code - 128
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code)


if __name__ == "__main__":
    main()
