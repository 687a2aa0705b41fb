"""Feedback for students: `DIR/<student>/<chapter>.html`, each exercise's points and the
grader's diagnosis (a diagnosed mistake's registry message as its headline, `headlines.headline`,
over what the checks said to this student, the error's name and message), the notebook's own
problems (a cell skipped because it hung or crashed), and lateness (times in the grading
machine's zone, named). `DIR/index.html` maps each student to their pages. Nothing of the hidden
tests: the diagnoses are the grader's one-line messages, never a cell's source or a traceback.
Every piece of text is escaped: student names, messages and file names are the students' to
choose. The page is in the submission's language (the record's `lang`; LLAMA_COURSE_LANG, when
set, decides), like the diagnoses the grader wrote into the record.

A student's folder is named readably for any name (`folder_names`): the name in Unicode's NFC
form with its letters, digits, marks and `._-` kept and any other run of characters made one
`_` (`chloé.dubois`, `alice_uni.edu` for `alice@uni.edu`); a short hash of the name is added
only where two students' names would give one folder (compared case-blind, as macOS and Windows
do), where a name is longer than `LONGEST`, or where it would be the index page's name."""

from __future__ import annotations

import hashlib
import html
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from ...i18n import _, language, using
from ..report import replay_text, status_word
from .gradebook import score, student_label
from .headlines import headline
from .late import late_text, local_time, penalty_text
from .store import atomic_write

_DIGEST = 12
LONGEST = 100  # characters of a folder's readable name
INDEX = "index.html"
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


def readable_name(text: str) -> str:
    """`text` as one plain path component: NFC, letters, digits, marks and `._-` kept, any other
    run of characters one `_`, no leading or trailing dot or `_` ("unnamed" when nothing is
    left)."""
    kept, last = [], ""
    for ch in unicodedata.normalize("NFC", text):
        safe = ch in "._-" or ch.isalnum() or unicodedata.category(ch).startswith("M")
        if safe and ch.isprintable():
            kept.append(ch)
        elif last != "_":
            kept.append("_")
        last = kept[-1] if kept else ""
    return "".join(kept).strip("._") or "unnamed"


def _hashed(text: str, name: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return f"{name[:LONGEST]}-{digest}"


def folder_names(names: Iterable[str]) -> dict[str, str]:
    """{student: their folder's name} for every student of `names`, one folder each: the
    readable name, with a hash of the student's own name only where it is needed (see the
    module's docstring). A name that is already its readable form keeps it when it is the only
    one of its group that does."""
    groups: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        groups.setdefault(readable_name(name).casefold(), []).append(name)
    folders: dict[str, str] = {}
    for key, group in groups.items():
        plain = [n for n in group if readable_name(n) == unicodedata.normalize("NFC", n)]
        for name in group:
            readable = readable_name(name)
            alone = len(group) == 1 or (len(plain) == 1 and name == plain[0])
            if alone and len(readable) <= LONGEST and key != INDEX:
                folders[name] = readable
            else:
                folders[name] = _hashed(name, readable)
    # A name shaped like another's hashed folder ("x...x-0123456789ab"): hashed in its turn
    seen: dict[str, int] = {}
    for folder in folders.values():
        seen[folder.casefold()] = seen.get(folder.casefold(), 0) + 1
    for name, folder in folders.items():
        if seen[folder.casefold()] > 1 and folder == readable_name(name):
            folders[name] = _hashed(name, folder)
    return folders


def safe_name(text: str) -> str:
    """The folder of a student whose name is the only one known (`folder_names`)."""
    return folder_names([text])[text]


def feedback_path(folder: Path, record: dict, folders: dict[str, str] | None = None) -> Path:
    """Where a record's page goes: a folder per student, named by `folders` (`folder_names`;
    None: as the only student known)."""
    student = student_label(record)
    name = (folders or {}).get(student) or safe_name(student)
    return Path(folder) / name / f"{readable_name(record['chapter'])}.html"


def write_feedback(folder: Path, record: dict, folders: dict[str, str] | None = None) -> Path:
    target = feedback_path(folder, record, folders)
    atomic_write(target, feedback_html(record))
    return target


def write_index(folder: Path, records: list[dict], folders: dict[str, str],
                roster: dict | None = None) -> Path:
    """`DIR/index.html`: each student (the roster's name beside the folder's) and a link to
    each of their pages with its points, in the instructor's language of the moment."""
    e = html.escape
    by_student: dict[str, list[dict]] = {}
    for record in records:
        by_student.setdefault(student_label(record), []).append(record)
    title = _("Feedback pages: {count} students").format(count=len(by_student))
    parts = ["<!DOCTYPE html>", f'<html lang="{language()}"><head><meta charset="utf-8">',
             f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{e(title)}</h1>", "<table><thead><tr>"
             + "".join(f"<th>{e(h)}</th>" for h in (_("student"), _("folder"), _("pages")))
             + "</tr></thead><tbody>"]
    for student in sorted(by_student, key=str.casefold):
        name = ((roster or {}).get(student) or {}).get("name") or student
        links = []
        for record in sorted(by_student[student], key=lambda r: r["chapter"]):
            page = feedback_path(folder, record, folders)
            href = "/".join(page.relative_to(folder).parts)
            shown = f"{record['chapter']} ({_pts(score(record))} / {_pts(record['max_points'])})"
            links.append(f'<a href="{e(_url(href))}">{e(shown)}</a>')
        folder_name = feedback_path(folder, by_student[student][0], folders).parent.name
        parts.append(f"<tr><td>{e(name)}</td><td><code>{e(folder_name)}</code></td>"
                     f"<td>{'<br>'.join(links)}</td></tr>")
    parts.append("</tbody></table></body></html>")
    target = Path(folder) / INDEX
    atomic_write(target, "\n".join(parts) + "\n")
    return target


def _url(path: str) -> str:
    """A relative link to `path` (a folder name may hold any letter, `#` or `%` never)."""
    from urllib.parse import quote

    return quote(path, safe="/")


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
            when = _("Submitted {when} (due {due})").format(
                when=local_time(record["submitted_at"]), due=local_time(record["due"]))
        else:
            when = _("Submitted {when}").format(when=local_time(record["submitted_at"]))
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
