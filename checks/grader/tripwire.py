"""What no notebook may change: the course's code (the `checks` package the grader runs) and the
chapters' source notebooks, plus the submissions being graded, hashed before grading and compared
after each notebook. A change is a `GradingIncident` that stops the run. Paths are never
followed and only regular files are read (bounded): see `Tripwire`."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from .identify import REPO, SOURCE_DIR


def course_files(source_dir: str | os.PathLike = SOURCE_DIR) -> list[Path]:
    """The course's code (the `checks` package the grader runs) and the chapters' source
    notebooks: no submission may change them."""
    package = Path(__file__).resolve().parents[1]  # checks/, not only checks/grader/
    return sorted([*package.rglob("*.py"), *Path(source_dir).glob("[0-9][0-9]_*/*.ipynb")])


MAX_HASHED = 256 * 2**20  # a file larger than this is compared by its status alone


class Tripwire:
    """Files hashed once; `changed()` lists those whose contents changed (or that vanished).

    Each path is looked at with `lstat` and never followed: only a regular file is opened (without
    following a link, without blocking) and hashed, reading at most `MAX_HASHED` bytes; anything
    else (a link, a FIFO, a device such as /proc/kmsg behind a link) is compared by its status
    alone, so no file can make the tripwire block or read without end. A file whose size, times
    and inode are unchanged is not read again (any write changes its modification or
    status-change time); one whose status changed is hashed again."""

    def __init__(self, paths):
        self.files: dict[Path, tuple[tuple, str | None]] = {}
        self.saved: dict[Path, bytes | set[str] | None] = {}  # what `restore` puts back
        for path in dict.fromkeys(Path(os.path.abspath(p)) for p in paths):
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # watched too: one that appears is a change
                self.files[path] = ((), None)
                continue
            except OSError:
                continue
            with contextlib.suppress(OSError):
                self.files[path] = (self._status(st), self._hash(path, st))
        from .isolation import user_start_up_files

        self.keep(p for p in map(Path, map(os.path.abspath, user_start_up_files()))
                  if p in self.files)

    def keep(self, paths) -> None:
        """Remember `paths` (small files, folders' listings, or their absence) so that
        `restore` can put them back: the grading user's start-up files, which a worker without
        namespaces could write through a process of its own."""
        for path in map(Path, paths):
            try:
                if path.is_symlink() or not path.exists():
                    self.saved[path] = None
                elif path.is_dir():
                    self.saved[path] = {entry.name for entry in os.scandir(path)}
                elif path.stat().st_size <= 2**20:
                    self.saved[path] = path.read_bytes()
            except OSError:
                continue

    def restore(self, changed) -> list[Path]:
        """Put back those of the `changed` paths that `keep` remembered: a file's bytes, a
        folder's entries (new ones removed), an absent path removed again. The paths restored."""
        import shutil

        done = []
        for path in changed:
            if path not in self.saved:
                continue
            before = self.saved[path]
            with contextlib.suppress(OSError):
                if isinstance(before, set):
                    for entry in os.scandir(path):
                        if entry.name not in before:
                            _remove(Path(entry.path), shutil)
                elif before is None:
                    _remove(path, shutil)
                else:
                    _remove(path, shutil)
                    path.write_bytes(before)
                done.append(path)
        return done

    def rewatch(self, roots) -> None:
        """Watch `roots` (files, and folders with everything under them) as they are now: the
        grader's own outputs, after it wrote them, so that a later change by anyone else
        (a worker's process overwriting a classmate's feedback page) is seen."""
        for root in roots:
            root = Path(os.path.abspath(root))
            found = [root]
            if root.is_dir() and not root.is_symlink():
                found += list(root.rglob("*"))  # rglob does not follow links to folders
            for path in found:
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    self.files[path] = (self._status(st), self._hash(path, st))

    @staticmethod
    def _status(st: os.stat_result) -> tuple:
        return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                st.st_nlink)

    @staticmethod
    def _hash(path: Path, st: os.stat_result) -> str | None:
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HASHED:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the lstat
                return None
            digest = hashlib.blake2b(digest_size=16)
            left = MAX_HASHED
            while left > 0 and (chunk := stream.read(min(left, 2**20))):
                digest.update(chunk)
                left -= len(chunk)
        return digest.hexdigest()

    def changed(self) -> list[Path]:
        found = []
        for path, (status, digest) in self.files.items():
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                if status == ():
                    continue  # still absent
                found.append(path)
                continue
            except OSError:
                found.append(path)
                continue
            try:
                now = self._status(st)
                if now == status:
                    continue
                if digest is not None and now[0] == status[0] and \
                        self._hash(path, st) == digest:
                    self.files[path] = (now, digest)
                    continue
            except OSError:
                pass
            found.append(path)
        # The grading user's start-up files are put back at once (they would run, or break,
        # the instructor's next programs); the change is still reported.
        for path in self.restore(found):
            if path.exists():
                self.rewatch([path])
            else:
                self.files[path] = ((), None)
        return found


def _remove(path: Path, shutil) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def short_path(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def submission_times(paths) -> list[Path]:
    """Each submission's timestamp.txt (nbgrader's, in its assignment folder; present or not):
    watched like the notebooks, so that a process a notebook started cannot make late work on
    time (or a classmate's late) while the run goes on."""
    from .identify import student_of
    from .outputs.late import TIMESTAMP_FILE, assignment_folder

    found = []
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            found.append(assignment_folder(Path(path), student_of(path)) / TIMESTAMP_FILE)
    return found
