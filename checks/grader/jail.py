"""Start a grading worker behind operating-system walls (Linux, run as root).

`checks.grader.worker` runs this file as `python -I -S jail.py CONFIG_JSON` (standard library
only: it must not import the course's `checks`, which holds the answers). It

1. joins the worker's memory cgroup (so everything below is counted and limited),
2. enters new mount, PID, network and IPC namespaces and forks: the child is process 1 of the
   new PID namespace, and when it ends the kernel kills every process left in that namespace,
   however it was started (a new session, a double fork);
3. in the new mount namespace, a view of the file system built from an allow-list: an empty root
   holding only the Python installation (the model inside it), the system's libraries and a few
   files of /etc and /sys, all read-only; a few devices; a fresh /proc that shows only the
   namespace's processes; and a private tmpfs /tmp (and /dev/shm) of limited size holding the
   worker's scratch folder and, read-only, the worker's copy of `checks` (without the graded
   chapter's answers). The course, the sources, the submissions, homes, any other copy of the
   course anywhere on the disk: not there;
4. forks the worker: resource limits, no supplementary groups, an unprivileged user id of its
   own, no_new_privs (setuid programs cannot raise it), a system-call filter (no keyring, no new
   namespaces: nothing it leaves in kernel state reaches a later worker), only the two pipe ends
   open, and a minimal environment; then executes Python.

Process 1 waits for the worker and exits with its status; this process relays it (a worker killed
by a signal makes this process die of the same signal). If the grader dies, this process dies
(PR_SET_PDEATHSIG), and with it process 1 and the whole namespace.

`CONFIG_JSON` keys: python, argv, env, uid, gid, cgroup_procs (or null), allow (paths bound
read-only), links ([path, target] symbolic links), tmp_links (the same, under /tmp), hide (folders
inside allowed ones shown empty), lib, lib_target, scratch, tmp_size, rlimits ({name: value}),
keep_fds, probe (only check that it all works, then exit 0).

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
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 38, 22
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


# The worker's system-call filter (seccomp): what a worker may leave in kernel state for a later
# worker of the same user id to find (the per-user keyring: add_key, request_key, keyctl), and the
# calls that make new namespaces (unshare, setns, clone with CLONE_NEW* flags; clone3, whose flags
# a filter cannot read, answers ENOSYS so that the C library falls back to clone).
SYSCALLS = {  # machine: (audit arch, {name: number})
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
                            "setns": 308, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97,
                             "setns": 268, "clone": 220, "clone3": 435}),
}
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000 | 0x00000080  # NS, CGROUP, UTS, IPC, USER, PID, NET, TIME
DENIED = ("add_key", "request_key", "keyctl", "unshare", "setns")


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The filter as classic BPF (code, jt, jf, k), or None for a machine not in SYSCALLS."""
    if machine not in SYSCALLS:
        return None
    arch, nr = SYSCALLS[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000
    body = [("op", ld, 4), ("jne", jeq, arch, "kill"), ("op", ld, 0),
            ("jmp", jge, 0x40000000, "eperm")]  # x32 system calls: none
    body += [("jmp", jeq, nr[name], "eperm") for name in DENIED]
    body += [("jmp", jeq, nr["clone3"], "enosys"), ("jne", jeq, nr["clone"], "allow"),
             ("op", ld, 16), ("jmp", jset, CLONE_NEW_ANY, "eperm"), ("op", ret, allow)]
    labels = {"allow": len(body) - 1, "eperm": len(body), "enosys": len(body) + 1,
              "kill": len(body) + 2}
    program = []
    for at, (kind, code, k, *target) in enumerate(body):
        skip = labels[target[0]] - at - 1 if target else 0
        program.append((code, skip, 0, k) if kind == "jmp" else
                       (code, 0, skip, k) if kind == "jne" else (code, 0, 0, k))
    return program + [(ret, 0, 0, eperm), (ret, 0, 0, enosys), (ret, 0, 0, kill)]


def _install_seccomp() -> None:
    """Load the filter into this process (no_new_privs is set); kept across exec and fork."""
    program = seccomp_program(os.uname().machine)
    if program is None:
        raise OSError(0, f"no system-call filter for {os.uname().machine}")

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*[Filter(*op) for op in program])
    fprog = Program(len(program), filters)
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(2), ctypes.byref(fprog), 0, 0),
           "seccomp")


def _die_with_parent(parent: int) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _mkdirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
MNT_DETACH = 2


def _bind_at(fd: int, target: str, folder: bool, *, writable: bool = False,
             devices: bool = False) -> None:
    """Bind what `fd` (O_PATH) opened at `target` in the new root, read-only unless asked."""
    if folder:
        _mkdirs(target)
    else:
        _mkdirs(os.path.dirname(target))
        with open(target, "a"):
            pass
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | (0 if devices else MS_NODEV)
           | (0 if writable else MS_RDONLY))


def _link(root: str, path: str, target: str) -> None:
    if not os.path.lexists(root + path):
        _mkdirs(os.path.dirname(root + path))
        os.symlink(target, root + path)


def build_view(cfg: dict) -> None:
    """Step 3: the worker's view of the file system, an allow-list (runs as process 1, still
    root). An empty root that holds only: the paths of cfg["allow"], read-only (the Python
    installation, the model inside it, the system's libraries and a few files of /etc, /sys);
    the symbolic links of cfg["links"]; a few devices; a fresh /proc of the new PID namespace;
    and a private /tmp of limited size with the worker's copy of `checks` (read-only) and its
    scratch folder. cfg["hide"]: folders inside allowed ones that must look empty (an installed
    copy of the course). Nothing else of the machine is there: not the course, not the sources,
    not the submissions, not another copy of any of them anywhere on the disk."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # for /proc/self/fd
    opened = {p: (os.open(p, O_PATH), os.path.isdir(p)) for p in cfg["allow"]
              if os.path.exists(p)}
    devices = {d: os.open(d, O_PATH) for d in DEVICES if os.path.exists(d)}
    lib = os.open(cfg["lib"], O_PATH | os.O_DIRECTORY)
    size = int(cfg["tmp_size"])
    _mount("none", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=1m")  # holds the root
    root = "/tmp/.root"
    _mkdirs(root)
    _mount("none", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    # The worker's own /tmp and /dev/shm first, so that an allowed path under /tmp (a virtual
    # environment in a clone under /tmp, as CI's may be) is bound inside them, not covered.
    for folder in ("/dev/shm", "/tmp"):
        _mkdirs(root + folder)
        _mount("none", root + folder, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size}")
    for path in sorted(opened, key=len):
        _bind_at(opened[path][0], root + path, opened[path][1])
    for path, target in cfg["links"]:
        _link(root, path, target)
    for path, fd in devices.items():
        _bind_at(fd, root + path, False, writable=True, devices=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        _link(root, f"/dev/{name}", target)
    _bind_at(lib, root + cfg["lib_target"], True)
    for path, target in cfg.get("tmp_links", []):  # the Python installation named under /tmp
        _link(root, path, target)
    for folder in cfg["hide"]:
        if os.path.isdir(root + folder):
            _mount("none", root + folder, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY,
                   "mode=0755,size=4k")
    _mkdirs(root + "/proc")
    for fd in [*(fd for fd, _ in opened.values()), *devices.values(), lib]:
        os.close(fd)
    _switch_root(root)
    scratch = cfg["scratch"]
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    os.chown(scratch, cfg["uid"], cfg["gid"])


def _switch_root(root: str) -> None:
    """Make `root` this mount namespace's "/" (pivot_root, the old root detached), with a fresh
    /proc; then "/" itself read-only."""
    old = root + "/.old"
    _mkdirs(old)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: unknown for {os.uname().machine}")
    _check(_libc.syscall(number, root.encode(), old.encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount the old root")
    os.rmdir("/.old")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


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
    _install_seccomp()
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
