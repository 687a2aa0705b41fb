"""The class report's student view: one row per student (every `--roster` student, those who
submitted nothing too, then the graded folders the roster does not name), with their points per
assignment after any late penalty, how late, the exercises not started (a chapter not submitted
counts all of its exercises), the cells that crashed or timed out, the files refused, and the
copies of a chapter's notebook beside the one graded.

`student_rows` computes the rows; `needs_help` is the order a teacher reads first (lowest share
of the points, then most unfinished, then most crashed cells); `students_html` draws the table
once per ordering, the "needs help" one shown, each other one shown when its link is followed (a
CSS `:target` rule): sortable with no JavaScript, so the page can still be mailed or archived."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ...i18n import _
from .gradebook import by_student, chapters_of, flagged_copies, score
from .late import late_text

STYLE = """
.orderings > section { display: none; }
.orderings > section:target, .orderings > section.default { display: block; }
.orderings > section:target ~ section.default { display: none; }
.sort a { margin-right: .8rem; } .flag { color: #a11; } .quiet { color: #888; }
tr.nothing td { color: #a11; }
"""


@dataclass
class ChapterCell:
    """One student's assignment: the record graded (None: no notebook)."""

    record: dict | None
    max_points: float
    exercises: int  # how many the chapter has (those of a missing notebook are unfinished)

    @property
    def points(self) -> float:
        return score(self.record) if self.record else 0.0

    @property
    def not_started(self) -> int:
        if self.record is None:
            return self.exercises
        return sum(e["status"] == "not started" for e in self.record["exercises"])

    @property
    def crashed(self) -> list[dict]:
        """The cells skipped because they hung or crashed the worker."""
        return list(self.record.get("skipped") or []) if self.record else []

    @property
    def copies(self) -> list[str]:
        """Other notebooks of this chapter with work, beside an untouched one graded."""
        return flagged_copies(self.record)


@dataclass
class StudentRow:
    student: str  # the folder name (the grader's name for the student)
    name: str  # the roster's name ("" when none)
    section: str
    chapters: dict[str, ChapterCell]
    refused: list[dict] = field(default_factory=list)  # the JSON report's errors of theirs

    @property
    def points(self) -> float:
        return sum(c.points for c in self.chapters.values())

    @property
    def max_points(self) -> float:
        return sum(c.max_points for c in self.chapters.values())

    @property
    def share(self) -> float:
        return self.points / self.max_points if self.max_points else 0.0

    @property
    def not_started(self) -> int:
        return sum(c.not_started for c in self.chapters.values())

    @property
    def crashed(self) -> int:
        return sum(len(c.crashed) for c in self.chapters.values())

    @property
    def late(self) -> int:
        return sum(bool(c.record and c.record.get("late")) for c in self.chapters.values())

    @property
    def submitted_nothing(self) -> bool:
        return all(c.record is None for c in self.chapters.values())


def student_rows(records: list[dict], roster: dict | None = None,
                 problems: list[dict] = ()) -> list[StudentRow]:
    """A row per roster student, then per graded student the roster does not name, by name."""
    chapters = chapters_of(records)
    table = by_student(records)
    maxima, counts = _chapter_sizes(records)
    names = [*(roster or {}), *(s for s in table if s not in (roster or {}))]
    rows = []
    for student in names:
        known = (roster or {}).get(student, {})
        mine = table.get(student, {})
        cells = {c: ChapterCell(mine.get(c), maxima[c], counts[c]) for c in chapters}
        refused = [p for p in problems if p.get("student") == student]
        rows.append(StudentRow(student, known.get("name", ""), known.get("section", ""), cells,
                               refused))
    return rows


def _chapter_sizes(records: list[dict]) -> tuple[dict[str, float], dict[str, int]]:
    """Each chapter's points and number of exercises (the most any record of it has)."""
    maxima: dict[str, float] = {}
    counts: dict[str, int] = {}
    for record in records:
        if record.get("counted", True):
            chapter = record["chapter"]
            maxima[chapter] = max(maxima.get(chapter, 0), record["max_points"])
            counts[chapter] = max(counts.get(chapter, 0), len(record["exercises"]))
    return maxima, counts


def needs_help(rows: list[StudentRow]) -> list[StudentRow]:
    """Lowest share of the points first, then most exercises unfinished, then most cells that
    crashed or timed out, then by name."""
    return sorted(rows, key=lambda r: (r.share, -r.not_started, -r.crashed, r.student))


# --------------------------------------------------------------------------------------------
# The table, drawn once per ordering


def orderings(rows: list[StudentRow], chapters: list[str]
              ) -> list[tuple[str, str, list[StudentRow]]]:
    """(anchor, label, rows) per ordering; the first, "needs help", is the one shown."""
    def by(key: Callable[[StudentRow], object]) -> list[StudentRow]:
        return sorted(rows, key=lambda r: (key(r), r.student))

    found = [("students-needs-help", _("needs help first"), needs_help(rows)),
             ("students-by-name", _("name"), by(lambda r: (r.name or r.student).casefold())),
             ("students-by-points", _("total points"), by(lambda r: -r.points)),
             ("students-by-not-started", _("not started"), by(lambda r: -r.not_started)),
             ("students-by-crashed", _("crashed or timed out"), by(lambda r: -r.crashed)),
             ("students-by-late", _("late"), by(lambda r: -r.late)),
             ("students-by-refused", _("refused files"), by(lambda r: -len(r.refused)))]
    found += [(f"students-by-{_anchor(c)}", c, by(lambda r, c=c: -r.chapters[c].points))
              for c in chapters]
    return found


def _anchor(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text)


def students_html(records: list[dict], roster: dict | None = None,
                  problems: list[dict] = ()) -> list[str]:
    """The student view's section (its heading, the ordering links, one table per ordering)."""
    e = html.escape
    rows = student_rows(records, roster, problems)
    if not rows:
        return []
    chapters = chapters_of(records)
    nothing = sum(r.submitted_nothing for r in rows)
    line = _("{count} students; {nothing} submitted nothing").format(count=len(rows),
                                                                     nothing=nothing)
    parts = [f'<h2 id="students">{e(_("Students"))}</h2>', f'<p class="note">{e(line)}</p>']
    found = orderings(rows, chapters)
    links = " ".join(f'<a href="#{anchor}">{e(label)}</a>' for anchor, label, _r in found)
    parts.append(f'<p class="sort">{e(_("Order by:"))} {links}</p>')
    parts.append('<div class="orderings">')
    # The default ordering last: a CSS sibling rule hides it while another one is targeted.
    for anchor, label, ordered in [*found[1:], found[0]]:
        css = ' class="default"' if anchor == found[0][0] else ""
        caption = _("ordered by: {order}").format(order=label)
        parts.append(f'<section id="{anchor}"{css}>')
        parts.append(_table(ordered, chapters, caption))
        parts.append("</section>")
    parts.append("</div>")
    return parts


def _table(rows: list[StudentRow], chapters: list[str], caption: str) -> str:
    e = html.escape
    headings = ["#", _("student"), *chapters, _("total"), _("not started"),
                _("crashed or timed out"), _("refused files")]
    out = [f'<table class="students"><caption class="note">{e(caption)}</caption><thead><tr>'
           + "".join(f"<th>{e(h)}</th>" for h in headings) + "</tr></thead><tbody>"]
    for rank, row in enumerate(rows, 1):
        css = ' class="nothing"' if row.submitted_nothing else ""
        cells = [f'<td class="num">{rank}</td>', f"<td>{_who(row)}</td>"]
        cells += [f"<td>{_chapter_cell(row.chapters[c])}</td>" for c in chapters]
        cells.append(f'<td class="num">{_pts(row.points)} / {_pts(row.max_points)}</td>')
        cells.append(f'<td class="num">{row.not_started or ""}</td>')
        crashed = "; ".join(f"{c.get('cell', '')}: {c.get('why', '')}"
                            for cell in row.chapters.values() for c in cell.crashed)
        cells.append(f'<td class="num" title="{e(crashed)}">{row.crashed or ""}</td>')
        refused = "<br>".join(f"{e(p['path'].rsplit('/', 1)[-1])}: {e(p['error'])}"
                              for p in row.refused)
        cells.append(f"<td>{refused}</td>")
        out.append(f"<tr{css}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _who(row: StudentRow) -> str:
    e = html.escape
    who = e(row.name) + f' <code>{e(row.student)}</code>' if row.name else \
        f"<code>{e(row.student)}</code>"
    if row.section:
        who += f' <span class="quiet">{e(row.section)}</span>'
    if row.submitted_nothing:
        who += f'<br><span class="flag">{e(_("submitted nothing"))}</span>'
    return who


def _chapter_cell(cell: ChapterCell) -> str:
    """Points after any penalty, then what else a teacher should know about the notebook."""
    e = html.escape
    if cell.record is None:
        return f'<span class="quiet">{e(_("no notebook"))}</span>'
    notes = []
    if cell.record.get("late"):
        notes.append(late_text(cell.record)
                     + (f" (-{_pts(cell.record['penalty'])})" if cell.record.get("penalty")
                        else ""))
    if cell.not_started:
        notes.append(_("{count} not started").format(count=cell.not_started))
    if cell.crashed:
        notes.append(_("{count} crashed or timed out").format(count=len(cell.crashed)))
    for copy in cell.copies:
        notes.append(_("graded {graded}; {copy} beside it has work").format(
            graded=cell.record["path"].rsplit("/", 1)[-1], copy=copy.rsplit("/", 1)[-1]))
    shown = f"{_pts(cell.points)} / {_pts(cell.max_points)}"
    return shown + "".join(f'<br><span class="flag">{e(n)}</span>' for n in notes)


def _pts(value: float) -> str:
    return f"{value:g}"
