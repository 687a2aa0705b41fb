"""Late work: when a submission was handed in (nbgrader's `timestamp.txt`, in the submission's
assignment folder `submitted/<student>/<chapter>/`, read as untrusted data: a regular file with
one name, a few bytes), and whether that is after its due time: the student's extension for the
assignment (`--extensions FILE`, a row for that assignment, else one for every assignment), else
the assignment's own due time (`--assignments FILE`), else `--due`. An assignment of the file
with a `penalty_per_day` deducts that fraction of its points per day late (each day begun
counts), at most `max_penalty` of them, never more than the points earned. Computed again on
every run, for every record (kept ones and those of notebooks not given this time), from the
submission time the record holds: a changed file changes only what it changes. A time without a
zone is UTC (nbgrader writes UTC)."""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import stat
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Assignment:
    """One row of --assignments FILE: a chapter's due time and late penalty."""

    name: str  # the chapter's folder name, 04_self_attention
    due: datetime
    penalty_per_day: float = 0.0  # a fraction of the assignment's points, per day late
    max_penalty: float = 1.0  # a fraction of its points, at most
    lms_id: str = ""  # the LMS's id of the assignment (the gradebook's column says it)


@dataclass(frozen=True)
class Deadlines:
    """What decides lateness and penalties in one run: --due (the default due time),
    --extensions ({student: due} for every assignment, {(student, assignment): due} for one)
    and --assignments ({chapter: Assignment})."""

    due: datetime | None = None
    extensions: dict = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.due or self.extensions or self.assignments)

    def due_for(self, student: str | None, chapter: str | None) -> datetime | None:
        if student is not None:
            for key in ((student, chapter), student):
                if key in self.extensions:
                    return self.extensions[key]
        assignment = self.assignments.get(chapter)
        return assignment.due if assignment else self.due


def lateness(notebook: Path, due: datetime | None, student: str | None = None,
             extensions: dict | None = None, chapter: str | None = None,
             assignments: dict[str, Assignment] | None = None) -> dict:
    """The record's lateness fields: submitted_at (ISO, UTC), due (the student's extension for
    the assignment, else the assignment's due time, else `due`), late (True, False, or None when
    unknown or no due time), late_by_seconds, and a warning when timestamp.txt cannot be
    believed. Never raises: one submission's file cannot end the class's run. (The penalty needs
    the record's points: `apply_deadlines`.)"""
    deadlines = Deadlines(due, extensions or {}, assignments or {})
    fields = {"submitted_at": None, "due": None, "late": None, "late_by_seconds": None}
    try:
        when, warning = submitted_at(notebook, student)
        fields["submitted_at"] = when.isoformat() if when else None
    except Exception:  # noqa: BLE001 - whatever the time, the run goes on
        warning = _unknown("garbage")
    fields.update(_late_fields(fields["submitted_at"], deadlines.due_for(student, chapter)))
    if warning:
        fields["late_warning"] = warning
    return fields


def _late_fields(when_text: str | None, due: datetime | None) -> dict:
    fields = {"due": None, "late": None, "late_by_seconds": None}
    try:
        fields["due"] = due.astimezone(timezone.utc).isoformat() if due else None
        when = parse_time(when_text) if when_text else None
        if when is not None and due is not None:
            late_by = (when - due).total_seconds()
            fields.update(late=late_by > 0, late_by_seconds=round(late_by) if late_by > 0 else 0)
    except (ValueError, OverflowError, TypeError):
        fields.update(late=None, late_by_seconds=None)
    return fields


def penalty_points(record: dict, assignment: Assignment | None) -> float | None:
    """The points deducted from a record for lateness: None where its assignment has no
    penalty (no --assignments row, or no penalty_per_day); else a fraction of its maximum,
    `penalty_per_day` per day begun (at most `max_penalty`), never more than the points
    earned."""
    if assignment is None or not assignment.penalty_per_day:
        return None
    if not record.get("late"):
        return 0.0
    days = math.ceil(int(record.get("late_by_seconds") or 0) / 86400)
    fraction = min(days * assignment.penalty_per_day, assignment.max_penalty)
    deducted = round(fraction * float(record.get("max_points") or 0), 2)
    return float(min(deducted, max(float(record.get("points") or 0), 0.0)))


def apply_deadlines(record: dict, deadlines: Deadlines) -> dict:
    """A record's due, late, late_by_seconds and penalty (and, with an LMS id, lms_id) for
    this run's deadlines, from the submission time the record holds. A run without any
    deadline keeps the record's lateness as it was."""
    if not deadlines:
        record.setdefault("penalty", None)
        return record
    chapter = record.get("chapter")
    record.update(_late_fields(record.get("submitted_at"),
                               deadlines.due_for(record.get("student"), chapter)))
    assignment = deadlines.assignments.get(chapter)
    record["penalty"] = penalty_points(record, assignment)
    if assignment is not None and assignment.lms_id:
        record["lms_id"] = assignment.lms_id
    else:
        record.pop("lms_id", None)
    return record


def refresh_lateness(record: dict, due: datetime | None,
                     extensions: dict | None = None,
                     assignments: dict[str, Assignment] | None = None) -> dict:
    """A kept record (its notebook unchanged since an earlier run) with its submission time
    read again and its lateness computed again for this run's --due, --extensions and
    --assignments: a changed due time changes who is late. A run with none keeps the record's
    lateness as it was."""
    deadlines = Deadlines(due, extensions or {}, assignments or {})
    if not deadlines:
        return record
    fields = lateness(Path(record["path"]), due, record.get("student"), extensions,
                      record.get("chapter"), assignments)
    warning = fields.pop("late_warning", None)
    record.update(fields)
    old = [w for w in record.get("warnings", []) if not _is_time_warning(w)]
    record["warnings"] = old + ([warning] if warning else [])
    return apply_deadlines(record, deadlines)


def _is_time_warning(text: str) -> bool:
    head = _(UNKNOWN).split("{")[0]
    return isinstance(text, str) and (text.startswith(head) or text.startswith(
        UNKNOWN.split("{")[0]))


def _due_time(text: str, number: int) -> datetime:
    try:
        moment = parse_time(text)
        moment.astimezone(timezone.utc)
        return moment
    except (ValueError, OverflowError):
        raise ValueError(_("row {number}: not an ISO time: {text}").format(
            number=number, text=repr(text[:40]))) from None


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    """The CSV's rows with their numbers, cells stripped, empty rows left out. A quoted cell
    that spans several lines (CSV allows "a<newline>b") is refused, naming its row and column:
    no assignment, due time, penalty, lms_id or student holds a line break, and joining its
    lines would grade against a name or a time the file does not show on one line."""
    text = Path(path).read_text(encoding="utf-8-sig")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    for number, row in enumerate(rows, 1):
        for index, cell in enumerate(row):
            if "".join(cell.splitlines()) != cell:
                raise ValueError(_("row {number}, column {column}: a quoted cell spans several "
                                   "lines; every cell of this file is one line").format(
                                       number=number, column=_column_name(rows[0], index)))
    return [(number, [cell.strip() for cell in row]) for number, row in enumerate(rows, 1)
            if any(cell.strip() for cell in row)]


def _column_name(first_row: list[str], index: int) -> str:
    """A column as the header names it (`'due'`), else by its place (`2`)."""
    known = (*ASSIGNMENT_COLUMNS, "student")
    name = first_row[index].strip().lower() if index < len(first_row) else ""
    return repr(name) if name in known else str(index + 1)


def read_extensions(path: Path) -> dict:
    """--extensions FILE: a CSV of `student,due` rows (an extension for every assignment) or
    `student,assignment,due` rows (for that assignment: a chapter's folder name); a header row
    naming the columns (`student,due` or `student,assignment,due`) is allowed. The due time as
    --due takes it. {student: due, (student, assignment): due}. ValueError, one line, naming the
    row, for a bad one (a bad time, a student named twice for the same assignment)."""
    found: dict = {}
    rows = _rows(path)
    columns = None
    if rows and [c.lower() for c in rows[0][1]] in (["student", "due"],
                                                   ["student", "assignment", "due"]):
        columns = [c.lower() for c in rows[0][1]]
        rows = rows[1:]
    elif rows and rows[0][1] and rows[0][1][0].lower() == "student":
        unknown = [c for c in rows[0][1] if c.lower() not in ("student", "assignment", "due")]
        raise ValueError(_("row 1: unknown column {column} (the columns: student, assignment "
                           "(optional), due)").format(column=repr((unknown or ["?"])[0][:40])))
    for number, cells in rows:
        width = len(columns) if columns else len(cells)
        if len(cells) != width or width not in (2, 3) or not cells[0] or \
                (width == 3 and not cells[1]):
            raise ValueError(_("row {number}: expected student,due or student,assignment,due"
                               ).format(number=number))
        key = cells[0] if width == 2 else (cells[0], cells[1])
        if key in found:
            raise ValueError(_("row {number}: {key} has an extension already").format(
                number=number, key=" ".join(key) if isinstance(key, tuple) else repr(key)))
        found[key] = _due_time(cells[-1], number)
    return found


ASSIGNMENT_COLUMNS = ("assignment", "due", "penalty_per_day", "max_penalty", "lms_id")


def read_assignments(path: Path) -> dict[str, Assignment]:
    """--assignments FILE: a CSV with a header row, the columns `assignment` (a chapter's folder
    name) and `due` (as --due takes it), and optionally `penalty_per_day` and `max_penalty`
    (fractions of the assignment's points, from 0 to 1; max_penalty 1 when empty) and `lms_id`.
    ValueError, one line, naming the row, for a bad one. Whether each assignment is a chapter
    is checked against the sources: `check_chapters`."""
    rows = _rows(path)
    if not rows:
        raise ValueError(_("empty: expected a header row with the columns assignment and due"))
    header = [c.lower() for c in rows[0][1]]
    for column in header:
        if column not in ASSIGNMENT_COLUMNS:
            raise ValueError(_("row 1: unknown column {column} (the columns: {columns})").format(
                column=repr(column[:40]), columns=", ".join(ASSIGNMENT_COLUMNS)))
    if len(set(header)) != len(header):
        raise ValueError(_("row 1: a column is named twice"))
    if "assignment" not in header or "due" not in header:
        raise ValueError(_("row 1: the columns assignment and due are needed"))
    found: dict[str, Assignment] = {}
    for number, cells in rows[1:]:
        if len(cells) != len(header):
            raise ValueError(_("row {number}: expected {count} cells, as the header has").format(
                number=number, count=len(header)))
        row = dict(zip(header, cells))
        name = row["assignment"]
        if not name:
            raise ValueError(_("row {number}: no assignment").format(number=number))
        if name in found:
            raise ValueError(_("row {number}: {name} is named twice").format(
                number=number, name=repr(name[:40])))
        found[name] = Assignment(
            name, _due_time(row["due"], number),
            _fraction(row.get("penalty_per_day", ""), "penalty_per_day", number, 0.0),
            _fraction(row.get("max_penalty", ""), "max_penalty", number, 1.0),
            _lms_id(row.get("lms_id", ""), number))
    return found


def _lms_id(text: str, number: int) -> str:
    """An LMS's assignment id as the gradebook's column names it (`<chapter> (<id>)`, Canvas's
    form): printable, without parentheses or quotes, at most 64 characters; one line otherwise
    (a control character would reach the terminal, a parenthesis would make Canvas read another
    id)."""
    if len(text) > 64 or any(not c.isprintable() or c in "()\"'" for c in text):
        raise ValueError(_("row {number}: lms_id must be an LMS's assignment id (printable, "
                           "without parentheses or quotes, at most 64 characters), not "
                           "{text}").format(number=number, text=repr(text[:40])))
    return text


def _fraction(text: str, column: str, number: int, default: float) -> float:
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise ValueError(_("row {number}: {column} must be a fraction from 0 to 1 (0.1 is "
                           "10%), not {text}").format(number=number, column=column,
                                                      text=repr(text[:40])))
    return value


def not_a_chapter(names, source: Path) -> str | None:
    """The first of `names` that is no chapter of the sources (a one-line problem), or None."""
    from ..identify import source_notebook_path

    for name in names:
        if "/" in name or "\\" in name or name.startswith(".") or \
                not source_notebook_path(name, source).is_file():
            return _("{name} is no chapter (a chapter's folder name, such as "
                     "04_self_attention)").format(name=repr(name[:60]))
    return None


def assignments_argument(text: str) -> dict[str, Assignment]:
    """`--assignments`' type: the file read, or one line saying what is wrong with it."""
    try:
        return read_assignments(Path(text))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or type(exc).__name__}") \
            from None
    except (ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None


def extensions_argument(text: str) -> dict[str, datetime]:
    """`--extensions`' type: the file read, or one line saying what is wrong with it."""
    try:
        return read_extensions(Path(text))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or type(exc).__name__}") \
            from None
    except (ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None


def penalty_text(record: dict) -> str:
    """'late penalty: -1.2 points' for a record with points deducted, '' otherwise."""
    if not record.get("penalty"):
        return ""
    return _("late penalty: -{points} points").format(points=f"{record['penalty']:g}")


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


def local_time(text: str | None) -> str:
    """A stored time (ISO 8601, UTC) as a reader reads it: in the grading machine's local zone
    (TZ), to the minute, with the zone's name and offset: '2026-03-02 11:05 CET (UTC+01:00)'.
    '' for None; a text that is no time, as it is."""
    if not text:
        return ""
    try:
        moment = parse_time(str(text)).astimezone()
    except (ValueError, OverflowError):
        return str(text)
    offset = moment.strftime("%z")
    offset = f"UTC{offset[:3]}:{offset[3:]}" if offset else "UTC"
    name = moment.tzname() or ""
    shown = moment.strftime("%Y-%m-%d %H:%M")
    return f"{shown} {name} ({offset})" if name and name != offset else f"{shown} ({offset})"
