"""Late work: when a submission was handed in (nbgrader's `timestamp.txt`, in the submission's
folder `submitted/<student>/<chapter>/`), and whether that is after `--due`. Only marked: the
penalty stays the instructor's call. A time without a zone is UTC (nbgrader writes UTC)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

from ...i18n import _

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
    """`--due`'s type: one line for a time that is not one."""
    try:
        return parse_time(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("not an ISO time: {text} (example: "
                                           "2026-03-01T23:59+01:00; without a zone, UTC)").format(
            text=repr(text))) from None


def submitted_at(notebook: Path) -> tuple[datetime | None, str | None]:
    """(when, None) from the submission's timestamp.txt; (None, None) without one;
    (None, warning) when it cannot be read."""
    stamp = Path(notebook).parent / TIMESTAMP_FILE
    if not stamp.is_file():
        return None, None
    try:
        return parse_time(stamp.read_text(encoding="utf-8", errors="replace")), None
    except ValueError:
        return None, _("{file} does not hold a time; lateness unknown").format(file=TIMESTAMP_FILE)


def lateness(notebook: Path, due: datetime | None) -> dict:
    """The record's lateness fields: submitted_at (ISO, UTC), late (True, False, or None when
    unknown or no --due), late_by_seconds, and a warning when timestamp.txt is unreadable."""
    when, warning = submitted_at(notebook)
    fields = {"submitted_at": when.astimezone(timezone.utc).isoformat() if when else None,
              "due": due.astimezone(timezone.utc).isoformat() if due else None,
              "late": None, "late_by_seconds": None}
    if when is not None and due is not None:
        late_by = (when - due).total_seconds()
        fields.update(late=late_by > 0, late_by_seconds=round(late_by) if late_by > 0 else 0)
    if warning:
        fields["late_warning"] = warning
    return fields


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
