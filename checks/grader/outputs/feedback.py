"""Feedback for students: `DIR/<student>/<chapter>.html`, each exercise's points and the
grader's diagnosis (a diagnosed mistake's registry message as its headline, `headlines.headline`,
over what the checks said to this student, the error's name and message), the notebook's own
problems (a cell skipped because it hung or crashed), and lateness. Nothing of the hidden tests:
the diagnoses are the grader's one-line messages, never a cell's source or a traceback. Every
piece of text is escaped: student names, messages and file names are the students' to choose.
The page is in the submission's language (the record's `lang`; LLAMA_COURSE_LANG, when set,
decides), like the diagnoses the grader wrote into the record."""

from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

from ...i18n import _, language, using
from ..report import replay_text, status_word
from .gradebook import score, student_label
from .headlines import headline
from .late import late_text, penalty_text
from .store import atomic_write

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DIGEST = 12
_HASHED = re.compile(rf"-[0-9a-f]{{{_DIGEST}}}$")  # what safe_name adds to a changed name
_STATUS_CLASS = {"passed": "ok", "failed": "no", "not started": "todo", "error": "no"}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; color: #222; }
h1 { font-size: 1.4rem; } .total { font-size: 1.1rem; margin: .5rem 0 1rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .4rem .6rem; border-bottom: 1px solid #ddd;
         vertical-align: top; }
td.points { white-space: nowrap; font-variant-numeric: tabular-nums; }
.ok { color: #176117; } .no { color: #a11; } .todo { color: #8a5a00; }
.late { color: #a11; font-weight: bold; } .note { color: #555; }
.message { overflow-wrap: anywhere; }
"""


def feedback_path(folder: Path, record: dict) -> Path:
    """Where a record's page goes: a folder per student (its name made safe as a file name)."""
    return Path(folder) / safe_name(student_label(record)) / f"{safe_name(record['chapter'])}.html"


def safe_name(text: str) -> str:
    """A name that is one plain path component (no separators, no leading dot, not empty), and
    one per text: a name that had to change (`alice@uni.edu`), or that could be mistaken for one
    that did, gets a short hash of the text itself (`alice_uni.edu-3f2a...`), so two students
    never share a page (`alice_uni.edu` keeps its name)."""
    name = _UNSAFE.sub("_", text).strip("._") or "unnamed"
    if name == text and len(name) <= 120 and not _HASHED.search(name):
        return name
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return f"{name[:100]}-{digest}"


def write_feedback(folder: Path, record: dict) -> Path:
    target = feedback_path(folder, record)
    atomic_write(target, feedback_html(record))
    return target


def feedback_html(record: dict) -> str:
    """The page of one record, in the record's language (English when it has none)."""
    with using(record.get("lang")):
        return _page(record)


def _page(record: dict) -> str:
    e = html.escape
    student = record.get("student") or "—"
    title = _("{chapter}: feedback for {student}").format(chapter=record["chapter"],
                                                          student=student)
    total = _("{points} / {max_points} points, {passed} of {count} exercises passed").format(
        points=_pts(record["points"]), max_points=_pts(record["max_points"]),
        passed=record.get("passed", 0), count=len(record["exercises"]))
    parts = ["<!DOCTYPE html>", f'<html lang="{language()}"><head><meta charset="utf-8">',
             f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{e(title)}</h1>", f'<p class="total">{e(total)}</p>']
    parts += _submission_lines(record)
    headings = "".join(f"<th>{e(h)}</th>" for h in (_("exercise"), _("points"), _("result"),
                                                     _("diagnosis")))
    parts.append(f"<table><thead><tr>{headings}</tr></thead><tbody>")
    for exercise in record["exercises"]:
        status = exercise["status"]
        css = _STATUS_CLASS.get(status, "no")
        word = status_word(status)
        parts.append(f"<tr><td>{e(exercise['name'])}</td><td class=\"points\">"
                     f"{_pts(exercise['points'])} / {_pts(exercise['max_points'])}</td>"
                     f'<td class="{css}">{e(word)}</td>'
                     f'<td class="message">{_headline(exercise)}'
                     f'{e(exercise.get("message") or "")}{_replay(exercise)}</td></tr>')
    parts.append("</tbody></table>")
    # The notebook's error names each skipped cell and why already: each said once.
    for skipped in [] if record.get("error") else record.get("skipped") or []:
        line = _("Skipped: {cell}: {why}").format(cell=str(skipped.get("cell", "")),
                                                  why=str(skipped.get("why", "")))
        parts.append(f'<p class="note">{e(line)}</p>')
    if record.get("error"):
        parts.append(f'<p class="note">{e(record["error"])}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _headline(exercise: dict) -> str:
    """The registry's message for the exercise's mistake, in the page's language, over the
    student's own diagnosis ("" when it passed or no declared mistake was diagnosed)."""
    told = headline(exercise.get("mistake")) if exercise.get("status") != "passed" else None
    return f'<strong class="headline">{html.escape(told)}</strong><br>' if told else ""


def _replay(exercise: dict) -> str:
    text = replay_text(exercise)
    return f'<br><span class="note">{html.escape(text)}</span>' if text else ""


def _submission_lines(record: dict) -> list[str]:
    lines = []
    if record.get("submitted_at"):
        if record.get("due"):
            when = _("Submitted {when} (due {due})").format(when=record["submitted_at"],
                                                           due=record["due"])
        else:
            when = _("Submitted {when}").format(when=record["submitted_at"])
        lines.append(f'<p class="note">{html.escape(when)}</p>')
    if record.get("late"):
        lines.append(f'<p class="late">{html.escape(late_text(record))}</p>')
    if record.get("penalty"):
        after = _("{penalty}: {points} / {max_points} points after it").format(
            penalty=penalty_text(record), points=_pts(score(record)),
            max_points=_pts(record["max_points"]))
        lines.append(f'<p class="late penalty">{html.escape(after)}</p>')
    return lines


def _pts(value: float) -> str:
    return f"{value:g}"
