"""The class summary: per chapter and exercise, how many of the notebooks graded passed it, and
the mistakes most often made by those that did not, counted once per student.

A diagnosis with a mistake id (checks.mistakes) is grouped by that id, whatever its random values
or the language the student read it in, and told by the registry's message for the id in the
instructor's language (`headlines.headline`), never by one student's words; one without (an
error, a failure no declared mistake explains) is grouped by its status and message."""

from __future__ import annotations

from ...i18n import _
from ..report import status_word
from .gradebook import counted
from .headlines import headline

COMMON = 3  # diagnoses shown per exercise in the terminal


def class_summary(records: list[dict], lang: str | None = None) -> list[dict]:
    """[{chapter, exercise, passed, graded, diagnoses: [{mistake, status, message, count,
    students}]}] in chapter order, then the order of the exercises in the notebook; each
    exercise's diagnoses most common first (`count`: how many students). A mistake's `message`
    is the registry's, in `lang` (None: the language of the moment; "" when the registry has no
    message for the id)."""
    rows: dict[tuple[str, str], dict] = {}
    groups: dict[tuple[str, str], dict[tuple, dict]] = {}
    for record in sorted(counted(records), key=lambda r: r["chapter"]):
        student = record.get("student") or record.get("path") or "?"
        for exercise in record["exercises"]:
            key = (record["chapter"], exercise["name"])
            row = rows.setdefault(key, {"chapter": key[0], "exercise": key[1], "passed": 0,
                                        "graded": 0})
            row["graded"] += 1
            if exercise["status"] == "passed":
                row["passed"] += 1
                continue
            mistake = exercise.get("mistake")
            message = exercise["message"] or exercise["status"]
            group_key = ("mistake", mistake) if mistake else ("text", exercise["status"], message)
            group = groups.setdefault(key, {}).setdefault(group_key, {
                "mistake": mistake, "status": exercise["status"],
                "message": _described(mistake, message, lang), "students": []})
            if student not in group["students"]:
                group["students"].append(student)
    for key, row in rows.items():
        found = sorted(groups.get(key, {}).values(), key=lambda g: -len(g["students"]))
        row["diagnoses"] = [{**g, "count": len(g["students"]),
                             "students": sorted(g["students"])} for g in found]
    return list(rows.values())


def _described(mistake: str | None, message: str, lang: str | None) -> str:
    """A mistake told by the registry's message for its id (in the instructor's language), and
    by nothing else: never the first student's words ("" when the registry has none). A
    diagnosis without an id by its text, the same for every student of its group."""
    if not mistake:
        return message
    return headline(mistake, lang) or ""


def summary_text(summary: list[dict], records: list[dict]) -> str:
    """The summary as the table after the grades: one line per exercise, its most common
    mistakes below (how many students, the mistake's id)."""
    if not summary:
        return ""
    late = sum(bool(r.get("late")) for r in counted(records))
    lines = [_("class summary: {count} notebooks").format(count=len(counted(records)))
             + (_(", {late} submitted late").format(late=late) if late else "")]
    width = max(len(f"{r['chapter']}/{r['exercise']}") for r in summary) + 2
    for row in summary:
        name = f"{row['chapter']}/{row['exercise']}"
        lines.append(f"  {name:<{width}}{row['passed']:>4}/{row['graded']:<4} " + _("passed"))
        for d in row["diagnoses"][:COMMON]:
            told = " ".join(filter(None, [f"[{d['mistake']}]" if d["mistake"] else "",
                                          d["message"]]))
            lines.append(f"      {d['count']:>3} × {status_word(d['status'])}: {told}")
    return "\n".join(lines) + "\n"
