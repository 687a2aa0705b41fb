"""Stage 2 of grading: which chapter a notebook is (`identify_chapter`: its metadata, its answer
cells, its file or folder name), where that chapter's source notebook is (`source_notebook_path`),
which student it belongs to (`student_of`), and warnings about names that say another chapter.

Before a class is graded, `find_submissions` decides what is graded and whose it is:

- The student is the first folder level under the root given: `ROOT/<student>/...`. nbgrader's
  layout is one case of it: a root named `submitted`, or one holding a `submitted/` folder (a
  course folder: only its `submitted/` is searched), has its students one level under
  `submitted/`; so is a folder inside that layout (one student's, `submitted/alice/`: the root
  is the `submitted/` above it). A notebook directly in the root, one in a first-level folder
  named like a chapter (the layout of notebooks/: `ROOT/01_notation/01_notation.ipynb`), or a
  file named on the command line outside nbgrader's layout, belongs to no student named.
- A notebook nested below its assignment folder (`ROOT/<student>/<assignment>/more/x.ipynb`) is
  the student's, with a warning.
- A second notebook for one (student, chapter) is not a second record: the one at the standard
  place (its file named after the chapter, not nested) is graded and each other one refused in one
  line; when there is no single such notebook, none of them is graded (each refused, saying why).
  The one graded names the others (`Submission.copies`; the record's `copies`, each with whether
  it holds work, checks.grader.copies), so that work in `<chapter>-Copy1.ipynb` beside an
  untouched stub is flagged; with `use_copies` (`--use-copies`, the instructor's word) the one
  notebook of the group with work is graded when the one at the standard place has none. With
  `use_copy` (`--use-copy PATH`, repeatable: the instructor's word for one file) the notebook
  named is graded for its student's chapter, the others refused; a path that is not a student's
  submitted notebook, or two for one student's chapter, is bad input (GradingError, before
  anything runs).
- Caps: more than `Caps.max_notebooks` notebooks for one student are cut to that many (those
  named after a chapter first), larger files and notebooks with more cells are refused.
- A notebook graded as another chapter than its file or folder name says is graded and shown,
  not counted in the totals (`NotebookResult.not_counted`), and the command's exit status is 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..i18n import _
from .copies import has_work
from .read import Caps, grade_id, notebooks_in, read_notebook, too_big
from .results import CHAPTER_NAME, GradingError, NotebookResult, Refused, printable

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIR = REPO / "solutions"


def identify_chapter(nb, path: str | os.PathLike, source_dir: str | os.PathLike = SOURCE_DIR
                     ) -> str:
    """The chapter a notebook belongs to: metadata `course.chapter`, else the chapter whose
    answer cells (grade_ids) it has, else its file or folder name.

    The first of these that names a chapter present in `source_dir` wins, so a renamed notebook
    is recognised by its metadata or content, and a chapter 01 notebook saved under chapter 04's
    name is graded as chapter 01 (the report shows the chapter).
    """
    path = Path(path)
    course = nb.metadata.get("course")
    named = course.get("chapter") if isinstance(course, dict) else None
    candidates = [c for c in (named, _chapter_by_content(nb, source_dir), path.stem,
                              path.parent.name)
                  if isinstance(c, str) and CHAPTER_NAME.fullmatch(c)]
    for chapter in candidates:
        if source_notebook_path(chapter, source_dir).is_file():
            return chapter
    if candidates:
        raise GradingError(path, _("unknown chapter {chapter} (no {source})").format(
            chapter=repr(candidates[0]), source=source_notebook_path(candidates[0], source_dir)))
    raise GradingError(path, _("cannot tell which chapter this is (no course.chapter metadata, "
                               "and neither the file nor its folder is named like 01_notation)"))


def _answer_ids(nb) -> set[str]:
    return {gid for c in nb.cells if (gid := grade_id(c)) is not None
            and isinstance(c.metadata.get("nbgrader"), dict)
            and c.metadata["nbgrader"].get("solution")}


def _chapter_by_content(nb, source_dir) -> str | None:
    """The one chapter whose answer cells (by grade_id) the notebook shares most, if any."""
    mine = _answer_ids(nb)
    if not mine:
        return None
    overlap = {chapter: len(mine & ids) for chapter, ids in _source_answer_ids(
        os.path.abspath(source_dir), _fingerprint(source_dir))}
    best = max(overlap.values(), default=0)
    winners = [chapter for chapter, n in overlap.items() if n == best]
    return winners[0] if best and len(winners) == 1 else None


def _fingerprint(source_dir) -> tuple:
    """Changes when a source notebook does (the cache below is read again)."""
    found = []
    for source in sorted(Path(source_dir).glob("*/*.ipynb")):
        try:
            st = source.stat()
        except OSError:
            continue
        found.append((source.name, st.st_mtime_ns, st.st_size))
    return tuple(found)


@lru_cache(maxsize=8)
def _source_answer_ids(source_dir: str, fingerprint: tuple) -> tuple[tuple[str, frozenset], ...]:
    """(chapter, its answer cells' grade_ids) for each source notebook, read once per run."""
    found = []
    for source in sorted(Path(source_dir).glob("*/*.ipynb")):
        if source.stem != source.parent.name:
            continue
        try:
            found.append((source.stem, frozenset(_answer_ids(read_notebook(source)))))
        except GradingError:
            continue
    return tuple(found)


def source_notebook_path(chapter: str, source_dir: str | os.PathLike = SOURCE_DIR) -> Path:
    return Path(source_dir) / chapter / f"{chapter}.ipynb"


def students_root(folder: Path) -> Path:
    """Where the students' folders are, for a folder given: itself; its `submitted/` when it is
    an nbgrader course folder (it holds one); or, for a folder inside nbgrader's layout (one
    student's, `.../submitted/alice/`), the first `submitted/` above it."""
    inner = folder / "submitted"
    if folder.name != "submitted" and inner.is_dir() and not inner.is_symlink():
        return inner
    parts = Path(os.path.abspath(folder)).parts
    if folder.name != "submitted" and "submitted" in parts[:-1]:
        return Path(*parts[:parts.index("submitted") + 1])
    return folder


def student_of(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str | None:
    """The student a notebook belongs to: the first folder under `root` (see the module's
    docstring); without a root, the folder after the first `submitted` in the path (nbgrader's
    `submitted/<student>/...`; a `submitted/` nested further down changes nothing)."""
    parts = _below(path, root)
    if parts is None or len(parts) < 2 or CHAPTER_NAME.fullmatch(parts[0]):
        return None  # loose in the root, or a chapter's folder (the layout of notebooks/)
    return printable(parts[0])


def layout_warnings(path: str | os.PathLike, root: str | os.PathLike | None = None) -> list[str]:
    """A warning for a notebook nested below its assignment folder (`<student>/<assignment>/`)."""
    parts = _below(path, root)
    if parts is None or len(parts) <= 3:
        return []
    return [printable(_("nested below its assignment folder ({path}): graded as {student}'s")
                      .format(path="/".join(parts), student=parts[0]))]


def _below(path, root) -> tuple[str, ...] | None:
    """The parts of `path` below the students' root, or None outside any."""
    path = Path(path)
    if root is not None:
        try:
            return Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).parts
        except ValueError:
            return None
    parts = path.parts
    if "submitted" not in parts:
        return None
    return parts[parts.index("submitted") + 1:]


def name_warnings(path: str | os.PathLike, chapter: str,
                  source_dir: str | os.PathLike = SOURCE_DIR) -> list[str]:
    """A warning for each name (file or folder) that names a different chapter."""
    path = Path(path)
    found = []
    says = (_("its file name says {name}, but the notebook is chapter {chapter} (graded as "
              "{chapter}, not counted in the totals)"),
            _("its folder name says {name}, but the notebook is chapter {chapter} (graded as "
              "{chapter}, not counted in the totals)"))
    for text, name in zip(says, (path.stem, path.parent.name)):
        if CHAPTER_NAME.fullmatch(name) and name != chapter and \
                source_notebook_path(name, source_dir).is_file():
            found.append(text.format(name=name, chapter=chapter))
    return found


# --------------------------------------------------------------------------------------------
# A class: what is graded, and whose it is


@dataclass
class Submission:
    path: Path
    student: str | None  # printable (see results.printable)
    chapter: str | None  # None: it could not be read or identified (grading will say why)
    warnings: list[str] = field(default_factory=list)
    # the other notebooks of this student's chapter (refused): {"path", "has_work"}
    copies: list[dict] = field(default_factory=list)
    # the instructor's word that chose it over the notebook at the standard place:
    # "--use-copy" or "--use-copies"; None when it is the standard one
    chosen: str | None = None


@dataclass
class Found:
    """The notebooks to grade, in order, and the files refused (one line each)."""

    submissions: list[Submission]
    refused: list[GradingError]
    source_dir: Path = SOURCE_DIR

    @property
    def paths(self) -> list[Path]:
        return [s.path for s in self.submissions]

    def adopt(self, result: NotebookResult) -> NotebookResult:
        """Give a graded notebook's result its student, the layout's warnings, and, when it was
        graded as another chapter than its name says, the reason it is not counted."""
        submission = self._by_path().get(result.path)
        if submission is None:
            return result
        result.student = submission.student
        result.warnings += [w for w in submission.warnings if w not in result.warnings]
        result.copies = [dict(c) for c in submission.copies]
        result.chosen = submission.chosen
        if name_warnings(submission.path, result.chapter, self.source_dir):
            result.not_counted = _("graded as {chapter}, but its name says another chapter: not "
                                   "counted in the totals").format(chapter=result.chapter)
        return result

    def _by_path(self) -> dict[str, Submission]:
        return {printable(os.fsdecode(s.path)): s for s in self.submissions}


def find_submissions(paths, caps: Caps = Caps(), source_dir: str | os.PathLike = SOURCE_DIR,
                     use_copies: bool = False, use_copy=()) -> Found:
    """The notebooks under `paths` (files named, or folders searched) that are graded, each with
    its student, and those refused (each with its student where known): links and special
    files, past the caps, second notebooks of one student's chapter (`use_copies`, `use_copy`:
    see the module's docstring). Bad input (a missing path, a folder with no notebooks, a
    `use_copy` path that is not a student's submitted notebook or a second one for one
    student's chapter) raises GradingError before anything runs."""
    submissions: list[Submission] = []
    refused: list[GradingError] = []
    for given in paths:
        given = Path(given)
        root = students_root(given) if given.is_dir() else None
        search = root if root == given / "submitted" else given  # a course folder: submitted/
        found, skipped = notebooks_in([search], caps.max_depth)
        found, over = _within_student_cap(found, root, caps.max_notebooks)
        refused += _owned([*skipped, *over], root)
        for path in found:
            problem, chapter = _examine(path, caps, source_dir)
            if problem is not None:
                refused += _owned([problem], root)
                continue
            submissions.append(Submission(path, student_of(path, root), chapter,
                                          layout_warnings(path, root)))
    unique = {}
    for s in submissions:
        unique.setdefault(s.path, s)
    choices = _instructor_choices(use_copy, paths, list(unique.values()), refused)
    kept, doubles = _one_per_student_chapter(list(unique.values()), caps, use_copies, choices)
    return Found(kept, refused + doubles, Path(source_dir))


def _instructor_choices(use_copy, paths, submissions: list[Submission],
                        refused: list[GradingError]) -> dict[tuple[str, str], Submission]:
    """--use-copy: the notebook named for each (student, chapter), found among the submissions
    by a path relative to a folder given (or to its students' root: `submitted/`), to the
    working folder, or absolute. A path that is none of them, or a second choice for one
    student's chapter, is bad input: one line, before anything is graded."""
    by_file = {os.path.realpath(s.path): s for s in submissions}
    refusals = {os.path.realpath(r.path): r for r in refused}
    chosen: dict[tuple[str, str], Submission] = {}
    for choice in use_copy:
        places = [os.path.realpath(p) for p in _places(Path(choice), paths)]
        submission = next((by_file[p] for p in places if p in by_file), None)
        if submission is None:
            refusal = next((refusals[p] for p in places if p in refusals), None)
            raise GradingError(choice, _(
                "--use-copy: not a notebook submitted in {folders}{why} (a path relative to the "
                "submissions folder, or absolute)").format(
                    folders=", ".join(printable(os.fsdecode(p)) for p in paths),
                    why="" if refusal is None else _(" (refused: {why})").format(
                        why=refusal.problem)))
        if submission.student is None or submission.chapter is None:
            raise GradingError(choice, _(
                "--use-copy: this notebook belongs to no student's chapter (it is not in a "
                "student's folder, or its chapter cannot be told): nothing to choose it for"))
        key = (submission.student, submission.chapter)
        first = chosen.setdefault(key, submission)
        if first is not submission:
            raise GradingError(choice, _(
                "--use-copy: a second choice for {student}'s {chapter} (the first: {first}): "
                "name one notebook per student and chapter").format(
                    student=key[0], chapter=key[1], first=printable(os.fsdecode(first.path))))
    return chosen


def _places(choice: Path, paths) -> list[Path]:
    """Where a --use-copy path may point: itself when absolute; else below each folder given or
    its students' root, then below the working folder."""
    if choice.is_absolute():
        return [choice]
    folders = [Path(p) for p in paths if Path(p).is_dir()]
    return [*(f / choice for f in folders), *(students_root(f) / choice for f in folders),
            choice]


def _owned(refusals: list[GradingError], root: Path | None) -> list[GradingError]:
    """The refusals, each with the student whose file it is (where the layout says one)."""
    for refusal in refusals:
        if refusal.student is None:
            student = student_of(refusal.path, root)
            refusal.student = None if student is None else printable(student)
    return refusals


def _examine(path: Path, caps: Caps, source_dir) -> tuple[Refused | None, str | None]:
    """A cap the file breaks before it is parsed (its size) or while it is (its cells); else its
    chapter, or None when it cannot be read or identified (grading reports that, in its place
    among the others)."""
    try:
        big = too_big(os.lstat(path), caps.max_bytes)
        if big:
            return Refused(path, big), None
        nb = read_notebook(path, max_bytes=caps.max_bytes, max_cells=caps.max_cells)
        return None, identify_chapter(nb, path, source_dir)
    except Refused as refusal:
        return refusal, None
    except (GradingError, OSError):
        return None, None


def _within_student_cap(found: list[Path], root: Path | None, cap: int
                        ) -> tuple[list[Path], list[GradingError]]:
    """At most `cap` notebooks per student (those named after a chapter, shallowest, first);
    one line per student past it."""
    by_student: dict[str | None, list[Path]] = {}
    for path in found:
        by_student.setdefault(student_of(path, root), []).append(path)
    dropped: set[Path] = set()
    refused: list[GradingError] = []
    for student, theirs in by_student.items():
        if student is None or len(theirs) <= cap:
            continue
        ranked = sorted(theirs, key=lambda p: (not CHAPTER_NAME.fullmatch(p.stem),
                                               len(p.parts), p))
        dropped |= set(ranked[cap:])
        folder = theirs[0].parent if root is None else \
            Path(os.path.abspath(root)) / _below(theirs[0], root)[0]
        refused.append(Refused(folder, _(
            "{count} notebooks for student {student}, more than the {cap} one student may have "
            "(--max-notebooks): {dropped} not graded (those named after a chapter first)").format(
                count=len(theirs), student=student, cap=cap, dropped=len(theirs) - cap)))
    return [p for p in found if p not in dropped], refused


def _one_per_student_chapter(submissions: list[Submission], caps: Caps = Caps(),
                             use_copies: bool = False,
                             choices: dict[tuple[str, str], Submission] | None = None
                             ) -> tuple[list[Submission], list[GradingError]]:
    """One record per (student, chapter): the notebook at the standard place (named after the
    chapter, not nested) is graded, the others refused; with no single such notebook, none.
    The instructor's choice for the group (`choices`, --use-copy) is graded instead; else with
    `use_copies`, when the standard one holds no work and exactly one other does, that one.
    The one graded names the others (`copies`)."""
    choices = choices or {}
    groups: dict[tuple[str, str], list[Submission]] = {}
    for s in submissions:
        if s.student is not None and s.chapter is not None:
            groups.setdefault((s.student, s.chapter), []).append(s)
    refused: dict[Path, GradingError] = {}
    for (student, chapter), group in groups.items():
        if len(group) < 2:
            continue
        work = {s.path: has_work(s.path, caps) for s in group}
        standard = [s for s in group if s.path.stem == chapter and not s.warnings]
        by_word = choices.get((student, chapter))
        chosen = by_word or (_chosen_copy(group, standard, work) if use_copies else None)
        if chosen is not None:
            standard = [chosen]
            chosen.chosen = "--use-copy" if by_word is not None else "--use-copies"
        for s in group:
            if len(standard) == 1 and s is standard[0]:
                s.copies = [{"path": printable(os.fsdecode(o.path)), "has_work": work[o.path]}
                            for o in group if o is not s]
                continue
            why = _why_not_graded(student, chapter, group, standard, by_word is not None)
            if work[s.path] and by_word is None and len(standard) == 1 and \
                    not work[standard[0].path]:
                why += _("; it has work and the one graded has none: --use-copies grades it")
            refused[s.path] = Refused(s.path, why, student)
    return [s for s in submissions if s.path not in refused], list(refused.values())


def _why_not_graded(student: str, chapter: str, group: list[Submission],
                    graded: list[Submission], by_word: bool) -> str:
    """The refusal of a notebook of a (student, chapter) group that is not the one graded."""
    if len(graded) != 1:
        return _("one of {count} notebooks for {student}'s {chapter} ({names}), none of them "
                 "{chapter}.ipynb at its place: none graded (leave one)").format(
                   count=len(group), student=student, chapter=chapter,
                   names=", ".join(printable(os.fsdecode(s.path.name)) for s in group))
    path = printable(os.fsdecode(graded[0].path))
    if by_word:
        return _("a second notebook for {student}'s {chapter} (graded on your word, "
                 "--use-copy: {graded}): not graded").format(
                   student=student, chapter=chapter, graded=path)
    return _("a second notebook for {student}'s {chapter} (graded: {graded}): not "
             "graded").format(student=student, chapter=chapter, graded=path)


def _chosen_copy(group: list[Submission], standard: list[Submission],
                 work: dict[Path, bool]) -> Submission | None:
    """With --use-copies: the one notebook of the group with work, when the one at the standard
    place (if any) has none."""
    if len(standard) == 1 and work[standard[0].path]:
        return None
    with_work = [s for s in group if work[s.path]]
    return with_work[0] if len(with_work) == 1 else None
