"""Late work: when a submission was handed in (nbgrader's `timestamp.txt`, in the submission's
assignment folder `submitted/<student>/<chapter>/`, read as untrusted data: a regular file with
one name, a few bytes), and whether that is after `--due` or the student's own due time
(`--extensions FILE`). Computed again on every run, kept records included. Only marked: the
penalty stays the instructor's call. A time without a zone is UTC (nbgrader writes UTC)."""

from __future__ import annotations

import argparse
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from ...i18n import N_, _

TIMESTAMP_FILE = "timestamp.txt"


def parse_time(text: str) -> datetime:
    """An ISO 8601 time ('2026-03-01T23:59', '2026-03-01 23:59:00+01:00'), or nbgrader's
    '2026-03-01 23:59:00.123456 UTC'; without a zone, UTC."""
    cleaned = text.strip()
    for suffix in (" UTC", " GMT", "Z"):
        if cleaned.endswith(suffix):
            cleaned = cleaned[: -len(suffix)].strip() + "+00:00"
            break
    moment = datetime.fromisoformat(cleaned)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def due_argument(text: str) -> datetime:
    """`--due`'s type: one line for a time that is not one (or one past what UTC can hold)."""
    try:
        moment = parse_time(text)
        moment.astimezone(timezone.utc)
        return moment
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(_("not an ISO time: {text} (example: "
                                           "2026-03-01T23:59+01:00; without a zone, UTC)").format(
            text=repr(text))) from None


STAMP_BYTES = 64  # nbgrader writes "2026-03-01 23:59:00.123456 UTC": 30 bytes
UNKNOWN = N_("submission time unknown: {file} {why}")
_WHY = {"link": N_("is a link, not nbgrader's own file"),
        "linked": N_("has more than one name (a hard link)"),
        "special": N_("is not a regular file"),
        "big": N_("is larger than a time"),
        "unreadable": N_("cannot be read"),
        "garbage": N_("does not hold a time")}


def assignment_folder(notebook: Path, student: str | None) -> Path:
    """Where nbgrader put the submission's timestamp.txt: its assignment folder,
    `submitted/<student>/<assignment>/`, however deep below it the notebook lies (a folder the
    student made, with a timestamp.txt of their own, is never it). The student's folder is the
    one after `submitted/`, else the outermost folder of the student's name (a folder inside a
    submission cannot be above it). A notebook of no student: its own folder."""
    parts = Path(os.path.abspath(notebook)).parent.parts
    if student:
        starts = [i for i, part in enumerate(parts[:-1]) if part == student]
        after = [i for i in starts if i > 0 and parts[i - 1] == "submitted"]
        for i in after[:1] or starts[:1]:
            return Path(*parts[:i + 2])
    return Path(*parts)


def read_submission_time(stamp: Path) -> tuple[datetime | None, str | None]:
    """(when, None) from a timestamp.txt read as untrusted data: a regular file with one name
    (no symbolic link, no hard link, no device or pipe), at most STAMP_BYTES bytes, a time that
    converts to UTC; (None, None) without one; (None, one line) for any other problem. Never
    raises, never blocks, never reads more than STAMP_BYTES + 1 bytes."""
    try:
        info = os.lstat(stamp)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError):
        return None, _unknown("unreadable")
    if stat.S_ISLNK(info.st_mode):
        return None, _unknown("link")
    if not stat.S_ISREG(info.st_mode):
        return None, _unknown("special")
    if info.st_nlink != 1:
        return None, _unknown("linked")
    if info.st_size > STAMP_BYTES:
        return None, _unknown("big")
    try:
        fd = os.open(stamp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None, _unknown("unreadable")
    try:
        opened = os.fstat(fd)
        if (opened.st_ino, opened.st_dev) != (info.st_ino, info.st_dev) or \
                not stat.S_ISREG(opened.st_mode) or opened.st_nlink != 1:
            return None, _unknown("special")  # swapped between the look and the open
        data = os.read(fd, STAMP_BYTES + 1)
    except OSError:
        return None, _unknown("unreadable")
    finally:
        os.close(fd)
    if len(data) > STAMP_BYTES:
        return None, _unknown("big")
    try:
        return parse_time(data.decode("ascii")).astimezone(timezone.utc), None
    except (ValueError, OverflowError, UnicodeDecodeError, TypeError):
        return None, _unknown("garbage")


def _unknown(why: str) -> str:
    return _(UNKNOWN).format(file=TIMESTAMP_FILE, why=_(_WHY[why]))


def submitted_at(notebook: Path, student: str | None = None
                 ) -> tuple[datetime | None, str | None]:
    """(when, None) from nbgrader's timestamp.txt of the submission's assignment folder;
    (None, None) without one; (None, one line) when it cannot be believed."""
    return read_submission_time(assignment_folder(notebook, student) / TIMESTAMP_FILE)


def lateness(notebook: Path, due: datetime | None, student: str | None = None,
             extensions: dict[str, datetime] | None = None) -> dict:
    """The record's lateness fields: submitted_at (ISO, UTC), due (the student's extension, else
    `due`), late (True, False, or None when unknown or no due time), late_by_seconds, and a
    warning when timestamp.txt cannot be believed. Never raises: one submission's file cannot
    end the class's run."""
    if extensions and student in extensions:
        due = extensions[student]
    fields = {"submitted_at": None, "due": None, "late": None, "late_by_seconds": None}
    try:
        when, warning = submitted_at(notebook, student)
        fields["due"] = due.astimezone(timezone.utc).isoformat() if due else None
        fields["submitted_at"] = when.isoformat() if when else None
        if when is not None and due is not None:
            late_by = (when - due).total_seconds()
            fields.update(late=late_by > 0, late_by_seconds=round(late_by) if late_by > 0 else 0)
    except Exception:  # noqa: BLE001 - whatever the time, the run goes on
        fields.update(submitted_at=None, late=None, late_by_seconds=None)
        warning = _unknown("garbage")
    if warning:
        fields["late_warning"] = warning
    return fields


def refresh_lateness(record: dict, due: datetime | None,
                     extensions: dict[str, datetime] | None = None) -> dict:
    """A kept record (its notebook unchanged since an earlier run) with its lateness computed
    again for this run's --due and --extensions: a changed due time changes who is late. A run
    with neither keeps the record's lateness as it was."""
    if due is None and not extensions:
        return record
    fields = lateness(Path(record["path"]), due, record.get("student"), extensions)
    warning = fields.pop("late_warning", None)
    record.update(fields)
    old = [w for w in record.get("warnings", []) if not _is_time_warning(w)]
    record["warnings"] = old + ([warning] if warning else [])
    return record


def _is_time_warning(text: str) -> bool:
    head = _(UNKNOWN).split("{")[0]
    return isinstance(text, str) and (text.startswith(head) or text.startswith(
        UNKNOWN.split("{")[0]))


def read_extensions(path: Path) -> dict[str, datetime]:
    """--extensions FILE: a CSV of `student,due` rows (a header row `student,due` is allowed;
    the due time as --due takes it). ValueError, one line, naming the row, for a bad one."""
    import csv

    text = Path(path).read_text(encoding="utf-8-sig")
    found: dict[str, datetime] = {}
    for number, row in enumerate(csv.reader(text.splitlines()), 1):
        cells = [cell.strip() for cell in row]
        if not any(cells) or (number == 1 and [c.lower() for c in cells[:2]] == ["student",
                                                                               "due"]):
            continue
        if len(cells) < 2 or not cells[0]:
            raise ValueError(_("row {number}: expected student,due").format(number=number))
        try:
            found[cells[0]] = parse_time(cells[1])
            found[cells[0]].astimezone(timezone.utc)
        except (ValueError, OverflowError):
            raise ValueError(_("row {number}: not an ISO time: {text}").format(
                number=number, text=repr(cells[1][:40]))) from None
    return found


def extensions_argument(text: str) -> dict[str, datetime]:
    """`--extensions`' type: the file read, or one line saying what is wrong with it."""
    try:
        return read_extensions(Path(text))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or type(exc).__name__}") \
            from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None


def late_text(record: dict) -> str:
    """'late by 2 h 5 min' for a late record, '' otherwise; in the language of the moment (the
    terminal's for the grade table, the submission's for its feedback page)."""
    if not record.get("late"):
        return ""
    seconds = int(record.get("late_by_seconds") or 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [_("{n} d").format(n=days)] * bool(days) + [_("{n} h").format(n=hours)] * bool(hours)
    parts += [_("{n} min").format(n=minutes)] * bool(minutes or not parts)
    return _("late by {duration}").format(duration=" ".join(parts))
