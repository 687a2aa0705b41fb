"""The class report (`checks grade ... --report FILE.html`): one static page for the instructor.

First the student view (outputs/students.py): every roster student, those who submitted nothing
too, with their points per assignment, lateness, exercises not started, crashed or timed-out
cells, refused files and copies beside the notebook graded, in a "needs help" order and others.
Then per chapter: the distribution of scores, how many were late, and per exercise the pass rate
and the real misconceptions made most often, each counted once per student, with its id, its
short title, its message and which students made it (the registry's message for the id,
`headlines.headline`, never a student's words); knock-on failures of other exercises beneath
their root mistake, and "not started" listed apart, after them. The charts are SVG drawn with
matplotlib and put inline, the student view's orderings are CSS (`:target`): the page needs no
JavaScript and no other file, so it can be mailed or archived as it is. Every piece of text
from a submission (student names, messages) is escaped. The page is in the instructor's
language (`checks grade --lang`, else LLAMA_COURSE_LANG), like the terminal's summary."""

from __future__ import annotations

import html
import io
from collections import defaultdict

from ...i18n import _, language, using
from ..report import status_word
from .gradebook import counted, score, student_label
from .late import late_text, local_time
from .students import STYLE as STUDENTS_STYLE, students_html
from .summary import class_summary

SHOWN_STUDENTS = 12  # names listed under one mistake before "and N more"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 64rem; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.25rem; margin-top: 2.5rem; }
h3 { font-size: 1.05rem; margin: 1.2rem 0 .3rem; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #ddd;
         vertical-align: top; }
td.num { white-space: nowrap; font-variant-numeric: tabular-nums; text-align: right; }
code { font-size: .85em; color: #444; } .note { color: #555; } .ok { color: #176117; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; } .charts figure { margin: 0; }
figcaption { color: #555; font-size: .9rem; }
tr.knock-on td { color: #555; font-size: .9em; } .title { color: #444; }
caption { text-align: left; }
""" + STUDENTS_STYLE


def class_report_html(records: list[dict], lang: str | None = None, *,
                      roster: dict | None = None, problems: list = ()) -> str:
    """The page for these records (the JSON report's), with every student of `roster` (--roster)
    and the files refused (`problems`: the JSON report's errors, {path, error, student}), in
    `lang` (None: the language of the moment; LLAMA_COURSE_LANG, when set, still decides the
    page's own words, and `lang` the mistakes' messages)."""
    with using(lang):
        return _page(records, lang, roster, list(problems))


def _page(records: list[dict], lang: str | None, roster: dict | None = None,
          problems: list[dict] = ()) -> str:
    graded = counted(records)
    summary = class_summary(records, lang)
    title = _("Class report: {count} notebooks, {students} students").format(
        count=len(graded), students=len({student_label(r) for r in graded}))
    parts = ["<!DOCTYPE html>", f'<html lang="{language()}"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    parts += students_html(records, roster, problems)
    by_chapter: dict[str, list[dict]] = defaultdict(list)
    for row in summary:
        by_chapter[row["chapter"]].append(row)
    for chapter, rows in by_chapter.items():
        parts += _chapter_section(chapter, rows, [r for r in graded if r["chapter"] == chapter])
    if not by_chapter:
        parts.append(f'<p class="note">{html.escape(_("No notebook was graded."))}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _chapter_section(chapter: str, rows: list[dict], records: list[dict]) -> list[str]:
    e = html.escape
    late = sum(bool(r.get("late")) for r in records)
    points = [r["points"] for r in records]
    most = max((r["max_points"] for r in records), default=0)
    mean = sum(points) / len(points) if points else 0.0
    line = _("{count} notebooks; mean {mean:.1f} of {max_points} points; {late} late").format(
        count=len(records), mean=mean, max_points=f"{most:g}", late=late)
    parts = [f'<h2 id="{e(chapter)}">{e(chapter)}</h2>', f'<p class="note">{e(line)}</p>']
    parts += _lateness_block(records)
    parts += ['<div class="charts">',
              _figure(_pass_rate_svg(rows), _("Pass rate per exercise")),
              _figure(_scores_svg(points, most), _("Scores (notebooks per number of points)")),
              "</div>"]
    for row in rows:
        parts += _exercise_block(row)
    return parts


def _lateness_block(records: list[dict]) -> list[str]:
    """The chapter's due time(s), and a table of its late notebooks: who, by how much, when it
    was due for them (an extension shows), the points deducted and the score after them."""
    e = html.escape
    dues = sorted({r["due"] for r in records if r.get("due")})
    parts = []
    if dues:
        shown = ", ".join(local_time(d) for d in dues)
        parts.append(f'<p class="note">{e(_("due: {times}").format(times=shown))}</p>')
    late = sorted((r for r in records if r.get("late")), key=student_label)
    if not late:
        return parts
    deducted = sum(r.get("penalty") or 0 for r in late)
    if any(r.get("penalty") is not None for r in late):
        said = _("late penalties: {points} points deducted").format(points=f"{deducted:g}")
        parts.append(f'<p class="note">{e(said)}</p>')
    headings = (_("late"), _("student"), _("due"), _("penalty"), _("score"))
    parts.append('<table class="late-work"><thead><tr>'
                 + "".join(f"<th>{e(h)}</th>" for h in headings) + "</tr></thead><tbody>")
    for r in late:
        parts.append(f"<tr><td>{e(late_text(r))}</td><td>{e(student_label(r))}</td>"
                     f"<td>{e(local_time(r.get('due')))}</td>"
                     f'<td class="num">{e(_pts(r.get("penalty")))}</td>'
                     f'<td class="num">{score(r):g} / {r["max_points"]:g}</td></tr>')
    parts.append("</tbody></table>")
    return parts


def _pts(value) -> str:
    return "" if value is None else f"-{value:g}" if value else "0"


def _exercise_block(row: dict) -> list[str]:
    """The exercise's pass rate; its real misconceptions ranked, each with its knock-on failures
    of other exercises beneath it; its own failures counted under another exercise's mistake;
    then who has not started it."""
    e = html.escape
    rate = row["passed"] / row["graded"] if row["graded"] else 0.0
    head = _("{exercise}: {passed} of {graded} passed ({rate:.0%})").format(
        exercise=row["exercise"], passed=row["passed"], graded=row["graded"], rate=rate)
    parts = [f"<h3>{e(head)}</h3>"]
    ranked = [d for d in row["diagnoses"] if d["status"] != "not started"]
    apart = [d for d in row["diagnoses"] if d["status"] == "not started"]
    if not row["diagnoses"] and not row.get("knock_on"):
        return parts + [f'<p class="ok">{e(_("Every student passed."))}</p>']
    if ranked:
        headings = (_("students"), _("mistake"), _("what the checks said"), _("who"))
        parts.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in headings)
                     + "</tr></thead><tbody>")
        for d in ranked:
            parts.append(f'<tr><td class="num">{d["count"]}</td><td>{_named(d)}</td>'
                         f"<td>{e(d['message'])}</td><td>{e(_names(d['students']))}</td></tr>")
            for k in d.get("knock_on", []):
                told = _("↳ also fails {exercise} (counted here)").format(exercise=k["exercise"])
                mistake = "".join(f" <code>{e(m)}</code>" for m in k["mistakes"])
                parts.append(f'<tr class="knock-on"><td class="num">{k["count"]}</td>'
                             f'<td colspan="2">{e(told)}{mistake}</td>'
                             f"<td>{e(_names(k['students']))}</td></tr>")
        parts.append("</tbody></table>")
    for k in row.get("knock_on", []):
        told = _("{count} failed because {root} fails: counted under {root}'s mistake "
                 "({names})").format(count=k["count"], root=k["root"],
                                     names=_names(k["students"]))
        parts.append(f'<p class="note knock-on">{e(told)}</p>')
    for d in apart:
        told = _("Not started by {count}: {names}").format(count=d["count"],
                                                           names=_names(d["students"]))
        parts.append(f'<p class="note not-started">{e(told)}</p>')
    return parts


def _named(diagnosis: dict) -> str:
    """A mistake's id and short title, or the status of a diagnosis with no id."""
    e = html.escape
    if not diagnosis["mistake"]:
        return e(status_word(diagnosis["status"]))
    title = diagnosis.get("title")
    shown = title and title != diagnosis.get("message")  # a short message is its own title
    return f"<code>{e(diagnosis['mistake'])}</code>" + (
        f'<br><span class="title">{e(title)}</span>' if shown else "")


def _names(students: list[str]) -> str:
    who = students[:SHOWN_STUDENTS]
    more = len(students) - len(who)
    return ", ".join(who) + (_(" and {count} more").format(count=more) if more else "")


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


# --------------------------------------------------------------------------------------------
# Charts: matplotlib's object API (no pyplot, so no global state and no display is touched),
# saved as SVG text. Labels are exercise names and numbers: no font question in any language.


def _svg(fig) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight")
    text = out.getvalue()
    return text[text.index("<svg"):]  # the XML prolog and doctype do not belong inside HTML


def _pass_rate_svg(rows: list[dict]) -> str:
    from matplotlib.figure import Figure

    names = [r["exercise"] for r in rows]
    rates = [100 * r["passed"] / r["graded"] if r["graded"] else 0 for r in rows]
    fig = Figure(figsize=(5.2, 0.35 * len(rows) + 0.9))
    ax = fig.add_subplot()
    bars = ax.barh(range(len(rows)), rates, color="#3b7dd8")
    ax.bar_label(bars, labels=[f"{r:.0f}%" for r in rates], padding=3, fontsize=8)
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 112)
    ax.set_xlabel("%")
    ax.spines[["top", "right"]].set_visible(False)
    return _svg(fig)


def _scores_svg(points: list[float], most: float) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2, 2.6))
    ax = fig.add_subplot()
    edges = [x - 0.5 for x in range(int(most) + 2)] if most else [-0.5, 0.5]
    ax.hist(points, bins=edges, color="#6a9f58", edgecolor="white")
    ax.set_xlabel("points")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.spines[["top", "right"]].set_visible(False)
    return _svg(fig)
