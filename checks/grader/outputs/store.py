"""The JSON report as a store: written atomically (a temporary file beside it, then `os.replace`)
after every notebook, so that Ctrl-C, SIGTERM or a full disk never loses a finished result and a
reader never sees half a file; merged with what the file held before, so that re-grading one
student keeps the class; and consulted before grading, so that a re-run grades only submissions
whose file changed (by SHA-256) since it was graded, or whose grader did: each record keeps the
`grader` fingerprint of what decided it (the scoring code and the chapter's graded cells), so a
fix to a checker or a test cell regrades without `--regrade`."""

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
from ..read import read_notebook
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
# What never changes a score, left out of the grader's fingerprint (anything else counts, new
# modules included): the maintainers' tools, how results are shown and written, the other
# commands. The message catalogues are left out too: points never depend on the language.
NOT_SCORING = ("tools/**/*.py", "grader/outputs/*.py", "grader/gradescope/*.py",
               "grader/cli.py", "grader/api.py", "grader/batch.py", "grader/report.py",
               "grader/nbgrader_plugins.py", "doctor.py", "install.py", "__main__.py",
               "smollm/__main__.py")


@lru_cache(maxsize=1)
def _scoring_code_hash() -> str:
    """The modules of checks/ that decide a score (the checkers, the reference, the grader's
    pipeline and worker), by path inside the package and content."""
    skipped = {path for pattern in NOT_SCORING for path in PACKAGE.glob(pattern)}
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        inside = path.relative_to(PACKAGE)
        if path in skipped or any(part.startswith((".", "__pycache__")) for part in inside.parts):
            continue
        digest.update(inside.as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _graded_cells(source: Path) -> bytes:
    """A chapter's source notebook as grading uses it: its code cells (test cells, hidden tests,
    imports) with their nbgrader metadata (grade ids, points); prose and outputs left out."""
    if not source.is_file():
        return b""
    cells = [[cell.get("source", ""), cell.get("metadata", {}).get("nbgrader", {})]
             for cell in read_notebook(source).cells if cell.get("cell_type") == "code"]
    return json.dumps(cells, sort_keys=True).encode()


@lru_cache(maxsize=64)
def grader_fingerprint(source_dir: Path, chapter: str) -> str:
    """What decides a chapter's points besides the submission: the scoring code and the
    chapter's graded cells. The same for the same content wherever the course lies. Short: it
    is a label."""
    graded = _graded_cells(source_notebook_path(chapter, source_dir))
    return hashlib.sha256(_scoring_code_hash().encode() + graded).hexdigest()[:16]


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
