"""What no notebook may change: the course's code (the `checks` package the grader runs) and the
chapters' source notebooks, plus the submissions being graded, hashed before grading and compared
after each notebook. A change is a `GradingIncident` that stops the run."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from .identify import REPO, SOURCE_DIR


def course_files(source_dir: str | os.PathLike = SOURCE_DIR) -> list[Path]:
    """The course's code (the `checks` package the grader runs) and the chapters' source
    notebooks: no submission may change them."""
    package = Path(__file__).resolve().parents[1]  # checks/, not only checks/grader/
    return sorted([*package.rglob("*.py"), *Path(source_dir).glob("[0-9][0-9]_*/*.ipynb")])


class Tripwire:
    """Files hashed once; `changed()` lists those whose contents changed (or that vanished).

    A file whose size, times and inode are unchanged is not read again (any write changes its
    modification or status-change time); one whose status changed is hashed again."""

    def __init__(self, paths):
        self.files: dict[Path, tuple[tuple, str]] = {}
        for path in dict.fromkeys(Path(p).resolve() for p in paths):
            with contextlib.suppress(OSError):
                self.files[path] = (self._stat(path), self._hash(path))

    @staticmethod
    def _stat(path: Path) -> tuple:
        st = path.stat()
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev

    @staticmethod
    def _hash(path: Path) -> str:
        return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()

    def changed(self) -> list[Path]:
        found = []
        for path, (stat, digest) in self.files.items():
            try:
                now = self._stat(path)
                if now == stat:
                    continue
                if path.is_file() and self._hash(path) == digest:
                    self.files[path] = (now, digest)
                    continue
            except OSError:
                pass
            found.append(path)
        return found


def short_path(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)
