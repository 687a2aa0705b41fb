"""`--roster FILE`: who the students are, for the gradebook CSV to import into an LMS without
editing. The roster is a CSV with a header row naming its columns: `folder` (the student's folder
under the class root, as the grader names the student) and any of `id` (the LMS's student id:
Canvas's SIS User ID, Moodle's ID number), `name`, `login` and `section`. With it, the gradebook
has a row per roster student (those with no notebook too, their grades empty) with their id, name
and section, and the folders the roster does not name after them, so that nobody is lost."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from ...i18n import _

FIELDS = ("folder", "id", "name", "login", "section")


def read_roster(path: Path) -> dict[str, dict[str, str]]:
    """{folder: {"id", "name", "login", "section"}}; ValueError (one line) for a file that is
    not such a table."""
    rows = list(csv.reader(Path(path).read_text(encoding="utf-8-sig").splitlines()))
    if not rows:
        raise ValueError(_("empty: expected a header row with a folder column"))
    header = [cell.strip().lower() for cell in rows[0]]
    if "folder" not in header:
        raise ValueError(_("no folder column in its header row (columns: folder, id, name, "
                           "login, section)"))
    roster: dict[str, dict[str, str]] = {}
    for number, row in enumerate(rows[1:], 2):
        cells = dict(zip(header, (cell.strip() for cell in row)))
        folder = cells.get("folder", "")
        if not any(cells.values()):
            continue
        if not folder:
            raise ValueError(_("row {number}: no folder").format(number=number))
        if folder in roster:
            raise ValueError(_("row {number}: {folder} is named twice").format(
                number=number, folder=repr(folder[:60])))
        roster[folder] = {key: cells.get(key, "") for key in FIELDS[1:]}
    _refuse_shared_logins(roster)
    return roster


def _login(folder: str, entry: dict[str, str]) -> str:
    """The SIS Login ID a roster student's row carries (the folder, when the roster has none)."""
    return entry["login"] or folder


def _refuse_shared_logins(roster: dict[str, dict[str, str]]) -> None:
    """Two roster rows with one login or one id would be one student to the LMS: the later
    row's grade would replace the earlier's."""
    for key, read in (("login", _login), ("id", lambda folder, entry: entry["id"])):
        seen: dict[str, str] = {}
        for folder, entry in roster.items():
            value = read(folder, entry).casefold()
            if value and value in seen:
                raise ValueError(_("{first} and {second} have the same {key} {value}").format(
                    first=repr(seen[value][:60]), second=repr(folder[:60]), key=key,
                    value=repr(read(folder, entry)[:60])))
            seen.setdefault(value, folder)


def claims_a_classmate(student: str, roster: dict[str, dict[str, str]] | None) -> bool:
    """A folder the roster does not name whose name is a roster student's login or id: its
    row, with that login, would replace the real student's grade in the LMS."""
    if not roster or student in roster:
        return False
    name = student.casefold()
    return any(name in (_login(folder, entry).casefold(), entry["id"].casefold())
               for folder, entry in roster.items())


def roster_argument(text: str) -> dict[str, dict[str, str]]:
    """`--roster`'s type: the table, or one line saying what is wrong with the file."""
    try:
        return read_roster(Path(text))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or type(exc).__name__}") \
            from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None


def student_columns(student: str, roster: dict[str, dict[str, str]] | None) -> list[str]:
    """Canvas's Student, ID, SIS User ID, SIS Login ID, Section for one student's row: from the
    roster when it names the folder, else the folder as the login (Canvas fills the rest)."""
    known = (roster or {}).get(student)
    if claims_a_classmate(student, roster):  # no login: the LMS matches it to nobody
        return [_("{folder} (not on the roster, and named like a roster student's login or id: "
                  "given no login, so that it cannot replace their grade)").format(
                      folder=student), "", "", "", ""]
    if known is None:
        return [student, "", "", student, ""]
    return [known["name"] or student, "", known["id"], known["login"] or student,
            known["section"]]


def roster_students(students: list[str], roster: dict[str, dict[str, str]] | None
                    ) -> list[str]:
    """The gradebook's rows in order: the roster's students (graded or not), then the graded
    folders it does not name."""
    if not roster:
        return students
    return [*roster, *(s for s in students if s not in roster)]
