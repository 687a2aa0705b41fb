"""The class summary: per chapter and exercise, how many of the notebooks graded passed it, and
the mistakes most often made by those that did not, counted once per student.

A diagnosis with a mistake id (checks.mistakes) is grouped by that id, whatever its random values
or the language the student read it in, and told by the registry's message for the id in the
instructor's language (`headlines.headline`), never by one student's words; one without (an
error, a failure no declared mistake explains) is grouped by its status and message.

Real misconceptions are ranked first (most students first); "not started" comes after them,
whatever its count: an exercise nobody began says nothing about what the class misunderstands.

A knock-on failure is counted once, under its root (`knock_on`): a student whose exercise fails
because a helper it calls fails (the caller's mistake `<chapter>.<caller>.fix_<helper>_first`),
or whose caller repeats the helper's own mistake (the same mistake key, diagnosed earlier in the
same notebook under the helper), is counted under the helper's mistake, and the caller's
failure is listed beneath that mistake, not as a second misconception."""

from __future__ import annotations

import re

from ...i18n import _
from ..report import status_word
from .gradebook import counted, flagged_copies
from .headlines import headline, short_title

COMMON = 3  # diagnoses shown per exercise in the terminal
_FIX_FIRST = re.compile(r"fix_(\w+)_first")


def class_summary(records: list[dict], lang: str | None = None) -> list[dict]:
    """[{chapter, exercise, passed, graded, diagnoses, knock_on}] in chapter order, then the order
    of the exercises in the notebook.

    `diagnoses`: [{mistake, status, message, title, count, students, knock_on}], real
    misconceptions first (most students first), then "not started"; `count`: how many students.
    A mistake's `message` is the registry's, in `lang` (None: the language of the moment; ""
    when the registry has no message for the id), `title` its short form. A diagnosis's
    `knock_on`: [{exercise, mistakes, count, students}], the failures of other exercises that
    follow from it (counted here, not there; `mistakes`: the ids diagnosed there). A row's
    `knock_on`: [{root, root_mistake, mistakes, count, students}], its own failures counted
    under another exercise's (`root`) mistake."""
    rows: dict[tuple[str, str], dict] = {}
    groups: dict[tuple[str, str], dict[tuple, dict]] = {}
    for record in sorted(counted(records), key=lambda r: r["chapter"]):
        student = record.get("student") or record.get("path") or "?"
        roots = knock_on_roots(record["exercises"])
        for exercise in record["exercises"]:
            key = (record["chapter"], exercise["name"])
            row = rows.setdefault(key, {"chapter": key[0], "exercise": key[1], "passed": 0,
                                        "graded": 0})
            row["graded"] += 1
            if exercise["status"] == "passed":
                row["passed"] += 1
                continue
            if exercise["name"] in roots:
                continue  # counted under its root, below
            _join(groups.setdefault(key, {}), exercise, student, lang)
        for name, root in roots.items():
            caller = next(e for e in record["exercises"] if e["name"] == name)
            group = _join(groups.setdefault((record["chapter"], root["name"]), {}), root,
                          student, lang)
            _add_student(group["knock_on"], {"exercise": name}, caller.get("mistake"),
                         student)
            _add_student(rows[(record["chapter"], name)].setdefault("knock_on", []),
                         {"root": root["name"], "root_mistake": root.get("mistake")},
                         caller.get("mistake"), student)
    for key, row in rows.items():
        found = sorted(groups.get(key, {}).values(),
                       key=lambda g: (g["status"] == "not started", -len(g["students"])))
        row["diagnoses"] = [{**g, "count": len(g["students"]), "students": sorted(g["students"]),
                             "knock_on": _counted(g["knock_on"])} for g in found]
        row["knock_on"] = _counted(row.get("knock_on", []))
    return list(rows.values())


def knock_on_roots(exercises: list[dict]) -> dict[str, dict]:
    """{caller's name: the exercise (dict) it fails because of} in one notebook: a caller whose
    mistake is `fix_<helper>_first` with that helper failed, or whose mistake key is the same as
    an exercise before it that failed (the helper's mistake repeated under its caller)."""
    failed = [e for e in exercises if e["status"] not in ("passed", "not started")]
    by_name = {e["name"].lower(): e for e in failed}
    roots: dict[str, dict] = {}
    for index, exercise in enumerate(failed):
        key = _key(exercise.get("mistake"))
        if key is None:
            continue
        helper = _FIX_FIRST.fullmatch(key)
        if helper:
            root = by_name.get(helper.group(1))
        else:
            root = next((e for e in failed[:index] if _key(e.get("mistake")) == key), None)
        if root is not None and root is not exercise:
            roots[exercise["name"]] = roots.get(root["name"], root)  # a chain: its first root
    return roots


def _key(mistake: str | None) -> str | None:
    """The mistake's key, its id without chapter and exercise ("missing_scale")."""
    return mistake.rsplit(".", 1)[-1] if mistake and "." in mistake else None


def _join(groups: dict[tuple, dict], exercise: dict, student: str, lang: str | None) -> dict:
    """Count `student` under the exercise's diagnosis (its mistake id, else its text)."""
    mistake = exercise.get("mistake")
    message = exercise["message"] or exercise["status"]
    group_key = ("mistake", mistake) if mistake else ("text", exercise["status"], message)
    group = groups.setdefault(group_key, {
        "mistake": mistake, "status": exercise["status"],
        "message": _described(mistake, message, lang),
        "title": (short_title(mistake, lang) or "") if mistake else "",
        "students": [], "knock_on": []})
    if student not in group["students"]:
        group["students"].append(student)
    return group


def _add_student(entries: list[dict], what: dict, mistake: str | None, student: str) -> None:
    """`student` (and the caller's `mistake` id) into the entry of `entries` that is `what` (one
    made when there is none)."""
    entry = next((e for e in entries if all(e[k] == v for k, v in what.items())), None)
    if entry is None:
        entry = {**what, "mistakes": [], "students": []}
        entries.append(entry)
    if mistake and mistake not in entry["mistakes"]:
        entry["mistakes"].append(mistake)
    if student not in entry["students"]:
        entry["students"].append(student)


def _counted(entries: list[dict]) -> list[dict]:
    return [{**e, "count": len(e["students"]), "students": sorted(e["students"]),
             "mistakes": sorted(e["mistakes"])}
            for e in sorted(entries, key=lambda e: -len(e["students"]))]


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
            for k in d.get("knock_on", []):
                lines.append("            " + _knock_on_line(k["count"], k["exercise"],
                                                             k["mistakes"]))
        for k in row.get("knock_on", []):
            lines.append("      " + _("{count} × fails because {root} fails (counted under "
                                      "{root})").format(count=f"{k['count']:>3}",
                                                        root=k["root"]))
    lines += copies_lines(records)
    return "\n".join(lines) + "\n"


def copies_lines(records: list[dict]) -> list[str]:
    """One line per notebook graded untouched while a copy beside it holds work."""
    lines = []
    for record in counted(records):
        for copy in flagged_copies(record):
            if record.get("chosen") == "--use-copy":   # the instructor named the file graded
                text = _("{student}'s {chapter}: graded {graded} on your word (--use-copy), "
                         "which has no work; {copy} beside it has work")
            else:
                text = _("{student}'s {chapter}: graded {graded}, which has no work; {copy} "
                         "beside it has work (--use-copies grades it)")
            lines.append("  ! " + text.format(
                student=record.get("student") or "?", chapter=record["chapter"],
                graded=record["path"].rsplit("/", 1)[-1], copy=copy.rsplit("/", 1)[-1]))
    return lines


def _knock_on_line(count: int, exercise: str, mistakes: list[str]) -> str:
    """A knock-on failure under its root: "↳ 2 × also fails attention
    [04.attention.fix_masked_softmax_first]"."""
    told = _("↳ {count} × also fails {exercise}").format(count=count, exercise=exercise)
    return told + "".join(f" [{m}]" for m in mistakes)
