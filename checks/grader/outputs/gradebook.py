"""The CSVs: `gradebook_csv`, one row per student and a column per chapter (points), laid out as
Canvas's gradebook import reads it; `exercises_csv`, one row per student and a column per
exercise, with each chapter's submission time and lateness, for the instructor.

A record that does not count (`"counted": false`: a notebook graded as another chapter than its
name says) is left out of both. Where a student has two records of one chapter, the one with more
points is used (both are in the JSON)."""

from __future__ import annotations

import csv
import io

from .roster import roster_students, student_columns

# Canvas matches a row to a student by ID, SIS User ID or SIS Login ID; the student's folder name
# is written as the SIS Login ID, the others are left empty (Canvas fills what it knows).
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "    Points Possible"  # Canvas's own export has this row; its import reads it


def student_label(record: dict) -> str:
    """The student's name, or the notebook's path for a notebook no student is named for."""
    return record.get("student") or record["path"]


def flagged_copies(record: dict | None) -> list[str]:
    """The paths of the other notebooks of the record's chapter that hold work while the one
    graded holds none (every exercise not started): work in a copy the grader did not grade
    (`--use-copies` grades it)."""
    if not record or any(e["status"] != "not started" for e in record["exercises"]):
        return []
    return [c["path"] for c in record.get("copies") or [] if c.get("has_work")]


def counted(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("counted", True)]


def by_student(records: list[dict]) -> dict[str, dict[str, dict]]:
    """student -> chapter -> the record with the most points."""
    table: dict[str, dict[str, dict]] = {}
    for record in counted(records):
        chapters = table.setdefault(student_label(record), {})
        best = chapters.get(record["chapter"])
        if best is None or record["points"] > best["points"]:
            chapters[record["chapter"]] = record
    return dict(sorted(table.items()))


def chapters_of(records: list[dict]) -> list[str]:
    return sorted({r["chapter"] for r in counted(records)})


def gradebook_csv(records: list[dict], roster: dict | None = None) -> str:
    """Student, ID, SIS User ID, SIS Login ID, Section, then one column of points per chapter,
    the score after any late penalty (named `<chapter> (<lms_id>)` where --assignments gives the
    LMS's id), and for a chapter with a late penalty (--assignments' penalty_per_day) a column
    `<chapter> late penalty` of the points deducted; a chapter a student has no notebook for is
    empty (Canvas leaves such a grade alone). With a roster (outputs/roster.py): its students'
    ids, names and sections, each of them a row."""
    chapters = chapters_of(records)
    maxima = _max_points(records)
    penalised = _penalised(records)
    lms = _lms_ids(records)
    header, possible = list(CANVAS_COLUMNS), [POINTS_POSSIBLE, "", "", "", ""]
    for chapter in chapters:
        header.append(f"{chapter} ({lms[chapter]})" if lms.get(chapter) else chapter)
        possible.append(_number(maxima[chapter]))
        if chapter in penalised:
            header.append(f"{chapter} {PENALTY_COLUMN}")
            possible.append("")
    rows = [header, possible]
    table = by_student(records)
    for student in roster_students(list(table), roster):
        mine = table.get(student, {})
        row = student_columns(student, roster)
        for chapter in chapters:
            record = mine.get(chapter)
            row.append(_number(score(record)) if record else "")
            if chapter in penalised:
                row.append(_number(record.get("penalty") or 0) if record else "")
        rows.append(row)
    return _csv(rows)


PENALTY_COLUMN = "late penalty"
GRADED_FILE, COPY_WITH_WORK = "graded file", "copy with work"


def score(record: dict) -> float:
    """A record's points after its late penalty (the points earned, where there is none)."""
    return max(record["points"] - (record.get("penalty") or 0), 0)


def _penalised(records: list[dict]) -> set[str]:
    """The chapters with a late penalty rule (a record's penalty is a number, not None)."""
    return {r["chapter"] for r in counted(records) if r.get("penalty") is not None}


def _lms_ids(records: list[dict]) -> dict[str, str]:
    return {r["chapter"]: str(r["lms_id"]) for r in counted(records) if r.get("lms_id")}


def exercises_csv(records: list[dict]) -> str:
    """student, then per chapter: one column per exercise ('<chapter>/<exercise>'), its total,
    when it was submitted and whether that was late ('yes', 'no', or empty when unknown); for
    a chapter with a late penalty (--assignments), also its due time (the student's), the
    points deducted and the score after them; for a chapter where a student has another
    notebook with work beside an untouched one graded (`flagged_copies`), the file graded and
    that copy (`<chapter> graded file`, `<chapter> copy with work`)."""
    chapters = chapters_of(records)
    names = _exercise_names(records)
    penalised = _penalised(records)
    copied = {r["chapter"] for r in counted(records) if flagged_copies(r)}
    header = ["student"]
    for chapter in chapters:
        header += [f"{chapter}/{name}" for name in names[chapter]]
        header += [f"{chapter} total", f"{chapter} submitted", f"{chapter} late"]
        if chapter in penalised:
            header += [f"{chapter} due", f"{chapter} {PENALTY_COLUMN}", f"{chapter} score"]
        if chapter in copied:
            header += [f"{chapter} {GRADED_FILE}", f"{chapter} {COPY_WITH_WORK}"]
    rows = [header]
    for student, mine in by_student(records).items():
        row = [student]
        for chapter in chapters:
            record = mine.get(chapter)
            points = {e["name"]: e["points"] for e in record["exercises"]} if record else {}
            row += [_number(points[n]) if n in points else "" for n in names[chapter]]
            row += [_number(record["points"]), record.get("submitted_at") or "",
                    _yes_no(record.get("late"))] if record else ["", "", ""]
            if chapter in penalised:
                row += [record.get("due") or "", _number(record.get("penalty") or 0),
                        _number(score(record))] if record else ["", "", ""]
            if chapter in copied:
                flagged = flagged_copies(record)
                row += [record["path"], "; ".join(flagged)] if flagged else ["", ""]
        rows.append(row)
    return _csv(rows)


def _exercise_names(records: list[dict]) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for record in counted(records):
        known = names.setdefault(record["chapter"], [])
        known += [e["name"] for e in record["exercises"] if e["name"] not in known]
    return names


def _max_points(records: list[dict]) -> dict[str, float]:
    maxima: dict[str, float] = {}
    for record in counted(records):
        maxima[record["chapter"]] = max(maxima.get(record["chapter"], 0), record["max_points"])
    return maxima


def _yes_no(value) -> str:
    return "" if value is None else ("yes" if value else "no")


def _number(value: float) -> str:
    return f"{value:g}"


def _csv(rows: list[list[str]]) -> str:
    buffer = io.StringIO()
    # A spreadsheet runs a cell that starts with = + - @ as a formula: student names are
    # folder names anyone can choose, so such a cell gets a leading apostrophe.
    csv.writer(buffer, lineterminator="\n").writerows(
        [[_defused(cell) for cell in row] for row in rows])
    return buffer.getvalue()


def _defused(cell: str) -> str:
    return "'" + cell if cell[:1] in ("=", "+", "-", "@", "\t", "\r") else cell
