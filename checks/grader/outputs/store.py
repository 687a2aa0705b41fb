"""The JSON report as a store: written atomically (a temporary file beside it, then `os.replace`)
after every notebook, so that Ctrl-C, SIGTERM or a full disk never loses a finished result and a
reader never sees half a file; merged with what the file held before, so that re-grading one
student keeps the class; and consulted before grading, so that a re-run grades only submissions
whose file changed (by SHA-256) since it was graded, or whose grader did: each record keeps the
`grader` fingerprint of what decided it (the course's code and the chapter's source notebook), so
a fix to a checker or a test cell regrades the chapter without `--regrade`."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from ...i18n import _
from ..identify import source_notebook_path
from ..results import GradingError


def atomic_write(target: Path, text: str) -> None:
    """Replace `target` with `text` in one step: a reader sees the old file or the new one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_writable_file(target: Path, what: str) -> None:
    """Refuse (one line) an output file that cannot be written, before any grading starts."""
    if target.is_dir():
        raise GradingError(target, _("the {what} output is a folder, not a file").format(what=what))
    _check_writable_folder(target.parent, target, what)
    if target.exists() and not os.access(target, os.W_OK):
        raise GradingError(target, _("cannot write the {what} output here ({why})").format(
            what=what, why=_("permission denied")))


def check_writable_folder(folder: Path, what: str) -> None:
    if folder.exists() and not folder.is_dir():
        raise GradingError(folder, _("the {what} output is a file, not a folder").format(what=what))
    _check_writable_folder(folder, folder, what)


def _check_writable_folder(folder: Path, shown: Path, what: str) -> None:
    blocking = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise GradingError(shown, _("cannot write the {what} output here ({why})").format(
            what=what, why=_("{path} is a file, not a folder").format(path=blocking)))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".checks-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise GradingError(shown, _("cannot write the {what} output here ({why})").format(
            what=what, why=exc.strerror or type(exc).__name__)) from None


def file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


PACKAGE = Path(__file__).resolve().parents[2]  # checks/


@lru_cache(maxsize=1)
def _package_hash() -> str:
    """The course's code as the grader runs it: every module and message catalogue of checks/."""
    digest = hashlib.sha256()
    for path in sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.mo")]):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@lru_cache(maxsize=64)
def grader_fingerprint(source_dir: Path, chapter: str) -> str:
    """What decides a chapter's points besides the submission: the course's code and the
    chapter's source notebook (its test cells, hidden tests and points). Short: it is a label."""
    source = source_notebook_path(chapter, source_dir)
    notebook = source.read_bytes() if source.is_file() else b""
    return hashlib.sha256(_package_hash().encode() + notebook).hexdigest()[:16]


def record_key(path: str | os.PathLike) -> str:
    """Which submission a record is: its file's real path (so `a/../b.ipynb` is `b.ipynb`)."""
    return os.path.realpath(path)


def load_records(target: Path | None) -> dict[str, dict]:
    """The notebooks' records of an earlier report at `target`, by `record_key`; none when there
    is no report yet. A report that cannot be read is refused (one line), never overwritten."""
    if target is None or target == Path("-") or not target.exists():
        return {}
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
        records = data["notebooks"]
        return {record_key(r["path"]): r for r in records}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise GradingError(target, _("is not a report of `checks grade` (its results would be "
                                     "overwritten; move it away or name another --json file)")
                           ) from None


def unchanged(path: Path, previous: dict[str, dict], fingerprint: Callable[[str], str]
              ) -> tuple[dict | None, bool]:
    """(the earlier record of this submission when neither its file nor its grader has changed
    since, or None; whether the file is unchanged and only the grader is new). `fingerprint`:
    the grader's fingerprint of a chapter now."""
    record = previous.get(record_key(path))
    if record is None or record.get("sha256") != file_hash(path):
        return None, False
    if record.get("grader") != fingerprint(str(record.get("chapter"))):
        return None, True
    return record, False
