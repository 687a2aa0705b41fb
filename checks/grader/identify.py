"""Stage 2 of grading: which chapter a notebook is (`identify_chapter`: its metadata, its answer
cells, its file or folder name), where that chapter's source notebook is (`source_notebook_path`),
which student it belongs to (`student_of`), and warnings about names that say another chapter."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .read import grade_id, read_notebook
from .results import GradingError

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIR = REPO / "solutions"

CHAPTER_NAME = re.compile(r"\d\d_[A-Za-z0-9_]+")


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
        raise GradingError(path, f"unknown chapter {candidates[0]!r} (no "
                                 f"{source_notebook_path(candidates[0], source_dir)})")
    raise GradingError(path, "cannot tell which chapter this is (no course.chapter metadata, "
                             "and neither the file nor its folder is named like 01_notation)")


def _answer_ids(nb) -> set[str]:
    return {gid for c in nb.cells if (gid := grade_id(c)) is not None
            and isinstance(c.metadata.get("nbgrader"), dict)
            and c.metadata["nbgrader"].get("solution")}


def _chapter_by_content(nb, source_dir) -> str | None:
    """The one chapter whose answer cells (by grade_id) the notebook shares most, if any."""
    mine = _answer_ids(nb)
    if not mine:
        return None
    overlap = {}
    for source in sorted(Path(source_dir).glob("*/*.ipynb")):
        if source.stem != source.parent.name:
            continue
        try:
            overlap[source.stem] = len(mine & _answer_ids(read_notebook(source)))
        except GradingError:
            continue
    best = max(overlap.values(), default=0)
    winners = [chapter for chapter, n in overlap.items() if n == best]
    return winners[0] if best and len(winners) == 1 else None


def source_notebook_path(chapter: str, source_dir: str | os.PathLike = SOURCE_DIR) -> Path:
    return Path(source_dir) / chapter / f"{chapter}.ipynb"


def student_of(path: str | os.PathLike) -> str | None:
    """The student in nbgrader's layout `.../submitted/<student>/<assignment>/<file>.ipynb`."""
    parts = Path(path).parts
    return parts[-3] if len(parts) >= 4 and parts[-4] == "submitted" else None


def name_warnings(path: str | os.PathLike, chapter: str,
                  source_dir: str | os.PathLike = SOURCE_DIR) -> list[str]:
    """A warning for each name (file or folder) that names a different chapter."""
    path = Path(path)
    found = []
    for what, name in (("file", path.stem), ("folder", path.parent.name)):
        if CHAPTER_NAME.fullmatch(name) and name != chapter and \
                source_notebook_path(name, source_dir).is_file():
            found.append(f"its {what} name says {name}, but the notebook is chapter {chapter} "
                         f"(graded as {chapter})")
    return found
