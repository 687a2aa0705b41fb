"""The class summary: per chapter and exercise, how many of the notebooks graded passed it, and
the diagnoses most often given to those that did not (with how many got each)."""

from __future__ import annotations

from collections import Counter

from ...i18n import _
from ..report import status_word
from .gradebook import counted

COMMON = 3  # diagnoses shown per exercise


def class_summary(records: list[dict]) -> list[dict]:
    """[{chapter, exercise, passed, graded, late, diagnoses: [{message, status, count}]}] in
    chapter order, then the order of the exercises in the notebook."""
    rows: dict[tuple[str, str], dict] = {}
    diagnoses: dict[tuple[str, str], Counter] = {}
    for record in sorted(counted(records), key=lambda r: r["chapter"]):
        for exercise in record["exercises"]:
            key = (record["chapter"], exercise["name"])
            row = rows.setdefault(key, {"chapter": key[0], "exercise": key[1], "passed": 0,
                                        "graded": 0})
            row["graded"] += 1
            if exercise["status"] == "passed":
                row["passed"] += 1
            else:
                diagnoses.setdefault(key, Counter())[
                    (exercise["status"], exercise["message"] or exercise["status"])] += 1
    for key, row in rows.items():
        row["diagnoses"] = [{"status": status, "message": message, "count": count}
                            for (status, message), count in
                            diagnoses.get(key, Counter()).most_common(COMMON)]
    return list(rows.values())


def summary_text(summary: list[dict], records: list[dict]) -> str:
    """The summary as the table after the grades: one line per exercise, its diagnoses below."""
    if not summary:
        return ""
    late = sum(bool(r.get("late")) for r in counted(records))
    lines = [_("class summary: {count} notebooks").format(count=len(counted(records)))
             + (_(", {late} submitted late").format(late=late) if late else "")]
    width = max(len(f"{r['chapter']}/{r['exercise']}") for r in summary) + 2
    for row in summary:
        name = f"{row['chapter']}/{row['exercise']}"
        lines.append(f"  {name:<{width}}{row['passed']:>4}/{row['graded']:<4} " + _("passed"))
        for d in row["diagnoses"]:
            lines.append(f"      {d['count']:>3} × {status_word(d['status'])}: {d['message']}")
    return "\n".join(lines) + "\n"
