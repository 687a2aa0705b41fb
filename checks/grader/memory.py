"""How a worker's memory is limited: a memory cgroup where one can be made (the kernel counts
the memory the worker and its processes use, not address space reserved, and kills within the
group at the limit), else a watch that sums their resident memory several times a second and kills
them all above it. Also the process listing both the watch and the grader's clean-up use."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path


class MemoryCgroup:
    """A memory cgroup for one worker (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`):
    the kernel counts the memory the worker and its processes use (not address space reserved)
    and kills within the group at the limit."""

    _count = 0

    def __init__(self, path: Path, version: int):
        self.path = path
        self.version = version

    @classmethod
    def create(cls, limit: int) -> "MemoryCgroup | None":
        found = _own_memory_cgroup()
        if found is None:
            return None
        base, version = found
        cls._count += 1
        path = base / f"checks-worker-{os.getpid()}-{cls._count}"
        try:
            path.mkdir()
            if version == 2:
                (path / "memory.max").write_text(str(limit))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    with contextlib.suppress(OSError):
                        (path / name).write_text(value)
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path, version)

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in self.procs.read_text().split()]
        except OSError:
            return []

    def oom_killed(self) -> bool:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
            if self.version == 1:
                return int((self.path / "memory.failcnt").read_text()) > 0 and \
                    int((self.path / "memory.max_usage_in_bytes").read_text()) >= \
                    int((self.path / "memory.limit_in_bytes").read_text())
        except (OSError, ValueError):
            pass
        return False

    def kill_all(self, timeout: float = 10.0) -> bool:
        """SIGKILL every process in the group until none is left; remove the group. True when
        it is empty."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")
        while True:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        for _ in range(100):
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
        return True


def _own_memory_cgroup() -> tuple[Path, int] | None:
    """This process's memory cgroup folder, if a child can be made in it, and its version."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    where: dict[str, tuple[str, str]] = {}
    for line in mounts:
        fields = line.split()
        if " - " not in line:
            continue
        fstype, _, options = line.split(" - ", 1)[1].split(" ")[:3]
        if fstype == "cgroup2":
            where["v2"] = (fields[4], fields[3])
        elif fstype == "cgroup" and "memory" in options.split(","):
            where["v1"] = (fields[4], fields[3])
    for line in lines:
        ident, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if ident == "0" and "v2" in where:
            mount, root = where["v2"]
            base = Path(mount) / path.removeprefix(root).lstrip("/")
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "memory" in enabled and os.access(base, os.W_OK):
                return base, 2
    for line in lines:
        ident, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(",") and "v1" in where:
            mount, root = where["v1"]
            base = Path(mount) / path.removeprefix(root).lstrip("/")
            if (base / "memory.limit_in_bytes").exists() and os.access(base, os.W_OK):
                return base, 1
    return None


def _processes() -> list[tuple[int, int, int, int, int]]:
    """(pid, ppid, session, uid, resident bytes) of every process this one can see."""
    page = os.sysconf("SC_PAGE_SIZE")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            uid = os.stat(f"/proc/{name}").st_uid
            with open(f"/proc/{name}/statm", "rb") as f:
                resident = int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        found.append((int(name), int(stat[1]), int(stat[3]), uid, resident))
    return found


def process_tree(root: int, uid: int | None) -> list[tuple[int, int]]:
    """(pid, resident bytes) of `root`'s processes: those of user `uid` (a worker's own user
    id), else those in its session or descending from it."""
    procs = _processes()
    if uid is not None:
        return [(p, rss) for p, _, _, u, rss in procs if u == uid]
    parent = {p: pp for p, pp, _, _, _ in procs}
    mine = []
    for p, _, sid, _, rss in procs:
        q, steps = p, 0
        while q not in (0, 1, root) and steps < 64:
            q, steps = parent.get(q, 0), steps + 1
        if sid == root or q == root:
            mine.append((p, rss))
    return mine


def _proportional(pid: int, resident: int) -> int:
    """A process's share of the memory it uses (Pss: each page shared with others counted in
    part), where resident memory counts whole a page that a fork shares with its parent (the
    worker's blocks of hidden tests run in one); `resident` if it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return resident


def descendants(root: int) -> list[int]:
    """The processes below `root` (children, theirs, ...), zombies included."""
    children: dict[int, list[int]] = {}
    for p, pp, _, _, _ in _processes():
        children.setdefault(pp, []).append(p)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


SHARED_MEMORY = Path("/dev/shm")


def shared_memory_files() -> set[tuple[str, int]]:
    """(name, inode) of what /dev/shm holds now: memory that no process owns, which a worker
    without namespaces could fill and leave behind."""
    try:
        return {(entry.name, entry.inode()) for entry in os.scandir(SHARED_MEMORY)}
    except OSError:
        return set()


def _new_shared_memory(before: set[tuple[str, int]], uid: int | None):
    """The /dev/shm entries a worker made: those of its own user id ("user" mode), else the
    new ones of this process's user."""
    owner = os.geteuid() if uid is None else uid
    try:
        entries = list(os.scandir(SHARED_MEMORY))
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid == owner and (uid is not None or (entry.name, entry.inode()) not in before):
            found.append((entry, info))
    return found


def shared_memory_used(before: set[tuple[str, int]], uid: int | None) -> int:
    """Bytes of /dev/shm the worker's new files hold (counted against its memory limit)."""
    return sum(info.st_blocks * 512 for _, info in _new_shared_memory(before, uid))


def remove_shared_memory(before: set[tuple[str, int]], uid: int | None) -> None:
    """Remove what a worker left in /dev/shm (after its processes are gone)."""
    import shutil

    for entry, _info in _new_shared_memory(before, uid):
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)


def remove_owned(folders, uid: int) -> None:
    """Remove the entries of `folders` (top level) that belong to user `uid`: what a worker
    running as a user of its own left in the shared temporary folders."""
    import shutil

    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)


class MemoryWatch(threading.Thread):
    """Where no cgroup can be made: sums the resident memory of the worker's processes several
    times a second (and, without namespaces, the new files in /dev/shm: `shm_before` is what was
    there before) and kills them all above the limit."""

    def __init__(self, root: int, uid: int | None, limit: int,
                 shm_before: set[tuple[str, int]] | None = None):
        super().__init__(daemon=True)
        self.root, self.uid, self.limit = root, uid, limit
        self.shm_before = shm_before
        self.exceeded = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            tree = process_tree(self.root, self.uid)
            used = sum(rss for _, rss in tree)
            if used > self.limit and len(tree) > 1:  # a fork shares its parent's pages
                used = sum(_proportional(pid, rss) for pid, rss in tree)
            if self.shm_before is not None:
                used += shared_memory_used(self.shm_before, self.uid)
            if used > self.limit:
                self.exceeded = used
                for pid, _ in tree:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                return
