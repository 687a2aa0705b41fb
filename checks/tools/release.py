"""Generate the learner releases from the instructor notebooks (`solutions/`): `notebooks/`
(English) and `notebooks-zh/` (Chinese).

    python -m checks.tools.release            regenerate both (what `make release` runs)
    python -m checks.tools.release --check    exit 1 if either is out of date or a translation is
                                              stale, naming the chapters and the cells
    python -m checks.tools.release --lang en  only the English release (or `--lang zh`)

Every chapter folder `solutions/NN_slug/` (holding `NN_slug.ipynb`) is one nbgrader assignment.
`nbgrader generate_assignment` runs in a temporary course directory (its own config, database
and release folder), because its `--force` deletes the folder it writes to. The generated
`NN_slug/` folders are then compared with, or copied into, the release folder; chapters that no
longer exist in `solutions/` are removed from it. Nothing else in the release folder is touched.

## The Chinese release: one source, a translation beside it

`solutions/NN_slug/NN_slug.zh.json` holds the Chinese of one chapter, keyed by cell id; each entry
carries the sha256 of the English cell source it translates:

    {"language": "zh", "source": "NN_slug.ipynb",
     "cells": {"<markdown cell id>": {"sha256": "...", "text": "<the whole cell in Chinese>"},
               "<code cell id>": {"sha256": "...", "strings": [["English", "中文"], ...]}}}

A markdown cell's "text" replaces it; a code cell that is neither an answer nor a test may carry
"strings": exact substrings (printed sentences, figure labels) replaced in its code, which is
otherwise byte-identical to the English. For the zh release each solution notebook is translated
in a temporary source folder, then generated through nbgrader exactly like the English one, so
answer cells, test cells, grade ids, points and checksums are the same in both releases. Two
things mark a Chinese notebook: `metadata.course.lang = "zh"` (the grader reads it to report in
the submission's language), and a few lines at the end of its first code cell (the imports, after
the install cell): `os.environ.setdefault("LLAMA_COURSE_LANG", "zh")`, which makes `checks` speak
Chinese in the learner's kernel unless they set the variable themselves (checks.i18n), and
`use_cjk_font()`, so that the Chinese figure labels render.

Drift: a translation whose sha256 is not the hash of the English cell's current source is
*stale*; it is never shipped (the cell stays English in notebooks-zh/) and `--check` fails naming
it (chapter, cell id, first English words), as does regeneration. So do entries for cells that
no longer exist, "strings" that no longer occur in their cell, and translations of graded cells.
A markdown cell without a translation is *missing*: an error once every chapter has its .zh.json,
a warning while some chapters have none yet (those chapters are released with English text).
The .zh.json files never reach a release folder (they are left out of the temporary course, and
nbgrader_config.py's CourseDirectory.ignore leaves them out of an instructor's own runs).

Other languages work the same way: each row of the table of languages (checks/i18n.py's
LANGUAGES) names its release folder, its translation files' suffix and the lines that end its
first code cell; `python -m checks.tools.translate NN --lang CODE` writes and refreshes a
chapter's file with the hashes.

Maintainer notes (MAINTAINER_NOTE: the test cells' "# bound afresh ..." comments) are dropped from
every release's code cells before nbgrader runs, so a learner never reads them and the locked
cells' checksums are those of the released text.

Tests use `generate_release(folder, lang=...)` to build a release somewhere else,
`out_of_date()` to compare two releases and `translation_status()` for the translations.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from checks import i18n

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
CONFIG = ROOT / "nbgrader_config.py"
#: The languages, their release folders and translation files: checks/i18n.py's LANGUAGES.
#: The names below are the English and Chinese rows, kept for callers and tests.
NOTEBOOKS = i18n.get_language("en").release_dir
NOTEBOOKS_ZH = i18n.get_language("zh").release_dir
RELEASES = {code: lang.release_dir for code, lang in i18n.LANGUAGES.items()}
#: A chapter's Chinese lies beside its notebook: solutions/NN_slug/NN_slug.zh.json.
TRANSLATION_SUFFIX = i18n.get_language("zh").translation_suffix
#: The install cell (first in every notebook): the language lines go into the code cell after it.
INSTALL_CELL = "install-course"
#: What ends a Chinese notebook's first code cell (see checks/i18n.py's LANGUAGES).
LANG_LINES = i18n.get_language("zh").notebook_lines
#: Maintainer notes in the source's code cells that a learner never reads: a comment from its
#: `#` to the end of the line (the test cells' "bound afresh" reminder that the check is imported
#: again so that a redefinition above does not count). The release drops them.
MAINTAINER_NOTE = re.compile(r"[ \t]*# bound afresh\b[^\n]*")
#: A chapter folder: two digits, an underscore, a lower-case slug (`01_notation`).
CHAPTER_RE = re.compile(r"^[0-9]{2}_[a-z0-9_]+$")
#: Editor and interpreter droppings that are never part of a chapter.
JUNK = (".ipynb_checkpoints", "__pycache__", "*.pyc", ".DS_Store")


def not_released() -> tuple[str, ...]:
    """What is never copied from a chapter folder into the temporary course: junk, and the
    translation file of every language."""
    return (*JUNK, *("*" + lang.translation_suffix for lang in i18n.translated_languages()))


#: The same, for the languages known at import (callers that want a constant).
NOT_RELEASED = not_released()


class ReleaseError(RuntimeError):
    """nbgrader failed, or the source tree is not a valid course."""


# ------------------------------------------------------------------------------------------------
# running nbgrader in a course directory of its own


def nbgrader_env(course_dir: Path) -> dict[str, str]:
    """Environment for an nbgrader subprocess that only sees `course_dir`'s config.

    nbgrader calls the `alembic` command for its database, so the interpreter's script folder goes
    first on PATH (a virtual environment that is not activated still works). The Jupyter config
    folder points into the course so that a personal ~/.jupyter/nbgrader_config.py cannot change
    the result.
    """
    env = dict(os.environ)
    scripts = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join([*dict.fromkeys(scripts), env.get("PATH", "")])
    env["JUPYTER_CONFIG_DIR"] = str(course_dir / ".jupyter")
    env.pop("JUPYTER_CONFIG_PATH", None)
    # Kernels from this environment first (autograde runs "python3", which must import checks).
    env.setdefault("JUPYTER_PREFER_ENV_PATH", "1")
    env.setdefault("PYTHONIOENCODING", "utf-8")
    env.setdefault("OMP_NUM_THREADS", "1")  # grading kernels: tiny tensors, no oversubscription
    return env


def write_course_config(course_dir: Path, *, db: bool = True) -> Path:
    """Write `course_dir/nbgrader_config.py`: the course's settings, rooted in `course_dir`.

    The repository's nbgrader_config.py is loaded first, so stubs, time limits and restore rules
    are the ones instructors get; then the paths are moved into `course_dir` (same layout:
    solutions/, notebooks/, grading/...) with a gradebook of its own.
    """
    course_dir = Path(course_dir).resolve()
    (course_dir / ".jupyter").mkdir(parents=True, exist_ok=True)
    db_file = course_dir / "grading" / "gradebook.db"
    db_file.parent.mkdir(parents=True, exist_ok=True)
    text = (
        "# Written by checks.tools.release: the course settings, in a temporary course directory.\n"
        "import os\n"
        "c = get_config()  # noqa: F821\n"
        f"if not os.path.isfile({str(CONFIG)!r}):\n"
        f"    raise FileNotFoundError({str(CONFIG)!r})\n"
        f"load_subconfig({str(CONFIG)!r})  # noqa: F821\n"
        f"c.CourseDirectory.root = {str(course_dir)!r}\n"
        f"c.CourseDirectory.db_url = {('sqlite:///' + str(db_file))!r}\n"
    )
    if not db:
        text += "c.GenerateAssignment.no_database = True\nc.SaveCells.enabled = False\n"
    path = course_dir / "nbgrader_config.py"
    path.write_text(text, encoding="utf-8")
    return path


def run_nbgrader(course_dir: Path, *args: str, timeout: float = 900) -> str:
    """Run `python -m nbgrader ARGS` in `course_dir`; return its output, raise ReleaseError."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    try:
        course_dir = Path(course_dir).resolve()
        proc = subprocess.run(cmd, cwd=course_dir, env=nbgrader_env(course_dir),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, encoding="utf-8",
                              errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ReleaseError(f"`nbgrader {' '.join(args)}` took longer than {timeout:.0f} s") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise ReleaseError(f"`nbgrader {' '.join(args)}` failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


# ------------------------------------------------------------------------------------------------
# the chapters


def chapters(solutions: Path = SOLUTIONS) -> list[str]:
    """The chapter folders of `solutions/`, in order.

    A chapter folder `NN_slug/` holds `NN_slug.ipynb`. A folder without any notebook yet (a chapter
    being written) is skipped; one whose notebooks are misnamed is an error.
    """
    solutions = Path(solutions)
    if not solutions.is_dir():
        raise ReleaseError(f"no source folder {solutions}")
    found, misnamed = [], []
    for folder in sorted(p for p in solutions.iterdir() if p.is_dir() and CHAPTER_RE.match(p.name)):
        if (folder / f"{folder.name}.ipynb").is_file():
            found.append(folder.name)
        elif any(folder.glob("*.ipynb")):
            misnamed.append(f"{solutions.name}/{folder.name}/{folder.name}.ipynb")
    if misnamed:
        raise ReleaseError("chapter folder without its notebook: " + ", ".join(misnamed))
    return found


# ------------------------------------------------------------------------------------------------
# translations


@dataclass(frozen=True)
class TranslationProblem:
    """One cell whose translation cannot ship. `kind`: stale, missing, unknown cell, graded cell,
    string not found, malformed."""

    chapter: str
    cell: str
    kind: str
    words: str = ""  # the English cell's first words (or what is wrong)

    def __str__(self) -> str:
        return f"{self.chapter} cell {self.cell}: {self.kind}" + (f" ({self.words})"
                                                                  if self.words else "")


@dataclass
class TranslationStatus:
    """What the translations of a source folder say: per chapter, whether a file exists, and every
    problem. `errors` fail the release; `warnings` (missing cells while some chapters have no
    file yet) do not."""

    untranslated: list[str] = field(default_factory=list)  # chapters without a .zh.json
    problems: list[TranslationProblem] = field(default_factory=list)

    @property
    def errors(self) -> list[TranslationProblem]:
        return [p for p in self.problems if p.kind != "missing" or not self.untranslated]

    @property
    def warnings(self) -> list[TranslationProblem]:
        return [p for p in self.problems if p not in self.errors]


def cell_source(cell) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def source_hash(cell) -> str:
    """The sha256 (hex) of a cell's source as one UTF-8 string: what a translation records."""
    return hashlib.sha256(cell_source(cell).encode("utf-8")).hexdigest()


def translation_path(chapter_dir: Path, lang: str = "zh") -> Path:
    """The translation file of a chapter into `lang`: solutions/NN_slug/NN_slug<suffix>."""
    chapter_dir = Path(chapter_dir)
    suffix = i18n.get_language(lang).translation_suffix
    if suffix is None:
        raise ReleaseError(f"{lang} is the source language: it has no translation files")
    return chapter_dir / f"{chapter_dir.name}{suffix}"


def strip_maintainer_notes(source: str) -> str:
    """`source` without the maintainer notes (MAINTAINER_NOTE) a learner never reads."""
    return MAINTAINER_NOTE.sub("", source)


def read_translation(path: Path, lang: str = "zh") -> dict[str, dict]:
    """The cells of a translation file ({cell id: entry}); ReleaseError, in one line, when the
    file is not in the fixed format."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReleaseError(f"{path}: not a readable JSON file ({exc})") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, dict) or data.get("language") != lang:
        raise ReleaseError(f'{path}: expected {{"language": "{lang}", "source": ..., '
                           '"cells": {...}}')
    for cell_id, entry in cells.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and (
            isinstance(entry.get("text"), str) or (
                isinstance(entry.get("strings"), list) and all(
                    isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str)
                                                                      for x in pair)
                    and pair[0] for pair in entry["strings"])))
        if not ok:
            raise ReleaseError(f'{path}: cell {cell_id}: expected {{"sha256": ..., "text": ...}} '
                               'or {"sha256": ..., "strings": [["English", "中文"], ...]}')
    return cells


def _first_words(text: str, count: int = 8) -> str:
    words = text.split()
    return " ".join(words[:count]) + (" ..." if len(words) > count else "")


def _graded(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade") or meta.get("locked"))


def translate_notebook(nb: dict, cells: dict[str, dict], chapter: str
                       ) -> tuple[dict, list[TranslationProblem]]:
    """The Chinese notebook made from English `nb` (nbformat JSON) and a translation's `cells`,
    and the problems found. A cell whose translation cannot ship stays English."""
    import copy

    nb = copy.deepcopy(nb)
    problems: list[TranslationProblem] = []
    ids = {cell.get("id") for cell in nb["cells"]}
    problems += [TranslationProblem(chapter, cell_id, "unknown cell",
                                    "no cell with this id in the English notebook")
                 for cell_id in cells if cell_id not in ids]
    for cell in nb["cells"]:
        english = cell_source(cell)
        entry = cells.get(cell.get("id"))

        def problem(kind: str, words: str = _first_words(english)) -> None:
            problems.append(TranslationProblem(chapter, cell.get("id"), kind, words))

        if entry is None:
            if cell["cell_type"] == "markdown" and english.strip():
                problem("missing")
            continue
        if entry["sha256"] != source_hash(cell):
            problem("stale")
        elif cell["cell_type"] == "markdown":
            if "text" in entry and not entry["text"].strip():
                problem("missing")  # written by checks.tools.translate, not yet filled in
            elif "text" in entry:
                cell["source"] = entry["text"]
            else:
                problem("malformed", 'a markdown cell needs "text"')
        elif cell["cell_type"] != "code" or _graded(cell) or "strings" not in entry:
            problem("graded cell" if _graded(cell) else "malformed",
                    "answer and test cells are never translated" if _graded(cell)
                    else 'a code cell takes "strings" only')
        else:
            lost = [en for en, _zh in entry["strings"] if en not in english]
            if lost:
                problem("string not found", repr(lost[0]))
                continue
            for en, zh in entry["strings"]:
                english = english.replace(en, zh)
            cell["source"] = english
    return nb, problems


def mark_language(nb: dict, lang: str) -> dict:
    """Set the notebook's language (metadata.course.lang) and end its first code cell after the
    install cell (its imports; neither an answer nor a test) with the language's lines
    (checks/i18n.py's LANGUAGES)."""
    nb["metadata"].setdefault("course", {})["lang"] = lang
    lines = i18n.get_language(lang).notebook_lines
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and cell.get("id") != INSTALL_CELL and not _graded(cell):
            cell["source"] = cell_source(cell).rstrip("\n") + lines
            break
    else:
        raise ReleaseError(f"{nb['metadata']['course'].get('chapter', 'a notebook')}: no code "
                           "cell for the language line")
    return nb


def _chapter_translation(chapter_dir: Path, lang: str = "zh"
                         ) -> tuple[dict, list[TranslationProblem]] | None:
    """(translated notebook, problems) of one chapter folder; None while it has no translation."""
    path = translation_path(chapter_dir, lang)
    if not path.is_file():
        return None
    notebook = chapter_dir / f"{chapter_dir.name}.ipynb"
    try:
        nb = json.loads(notebook.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReleaseError(f"{notebook}: not a readable notebook ({exc})") from None
    return translate_notebook(nb, read_translation(path, lang), chapter_dir.name)


def translation_status(solutions: Path = SOLUTIONS, lang: str = "zh") -> TranslationStatus:
    """Every chapter's translation into `lang`, checked against the English cells it
    translates."""
    status = TranslationStatus()
    for name in chapters(solutions):
        found = _chapter_translation(Path(solutions) / name, lang)
        if found is None:
            status.untranslated.append(name)
        else:
            status.problems += found[1]
    return status


def _write_translated_sources(course: Path, names: list[str], solutions: Path,
                              lang: str) -> None:
    """Replace each copied chapter notebook of the temporary course by its version in `lang`."""
    for name in names:
        found = _chapter_translation(Path(solutions) / name, lang)
        target = course / "solutions" / name / f"{name}.ipynb"
        nb = json.loads(target.read_text(encoding="utf-8")) if found is None else found[0]
        target.write_text(json.dumps(mark_language(nb, lang), ensure_ascii=False, indent=1)
                          + "\n", encoding="utf-8")


def _strip_notes(course: Path, names: list[str]) -> None:
    """Drop the maintainer notes from the code cells of the temporary course's notebooks (before
    nbgrader, so the checksums of locked cells are those of what the learner gets)."""
    for name in names:
        target = course / "solutions" / name / f"{name}.ipynb"
        text = target.read_text(encoding="utf-8")
        nb = json.loads(text)
        changed = False
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                source = cell_source(cell)
                stripped = strip_maintainer_notes(source)
                if stripped != source:
                    cell["source"], changed = stripped, True
        if changed:
            target.write_text(json.dumps(nb, ensure_ascii=False, indent=1) + "\n",
                              encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# the release


def generate_release(dest: Path, solutions: Path = SOLUTIONS, lang: str = "en") -> list[str]:
    """Generate the learner release of every chapter in `solutions` into `dest/NN_slug/`, in
    `lang` (a row of checks/i18n.py's LANGUAGES: "en", the source; "zh" or another: each
    notebook translated first, see the module's docstring). Maintainer notes are dropped
    (MAINTAINER_NOTE).

    `dest` is created if needed; chapter folders already in it are replaced, nothing else in it is
    touched. Returns the chapter names. nbgrader itself only ever writes inside a temporary course.
    """
    if lang not in i18n.LANGUAGES:
        raise ReleaseError(f"no release in language {lang!r} "
                           f"(one of {', '.join(i18n.LANGUAGES)})")
    dest = Path(dest)
    names = chapters(solutions)
    dest.mkdir(parents=True, exist_ok=True)
    if not names:
        return names
    with tempfile.TemporaryDirectory(prefix="course-release-") as tmp:
        course = Path(tmp)
        write_course_config(course, db=False)
        # The course layout (solutions/ -> notebooks/) comes from the repository's config.
        for name in names:
            shutil.copytree(Path(solutions) / name, course / "solutions" / name,
                            ignore=shutil.ignore_patterns(*not_released()))
        if not i18n.get_language(lang).is_source:
            _write_translated_sources(course, names, Path(solutions), lang)
        _strip_notes(course, names)
        # One call for all chapters: `*` is one assignment per chapter folder.
        run_nbgrader(course, "generate_assignment", "*", "--force")
        for name in names:
            built = course / "notebooks" / name
            if not (built / f"{name}.ipynb").is_file():
                raise ReleaseError(f"nbgrader did not write notebooks/{name}/{name}.ipynb")
            _replace_dir(built, dest / name)
    return names


def _replace_dir(src: Path, dst: Path) -> None:
    """Make `dst` a copy of `src` (file contents only; no metadata, so output is reproducible)."""
    staging = dst.parent / f".{dst.name}.release-tmp"
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(src, staging, copy_function=shutil.copyfile,
                    ignore=shutil.ignore_patterns(*JUNK))
    if dst.exists():
        shutil.rmtree(dst)
    staging.rename(dst)


def _files(folder: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not any(part in (".ipynb_checkpoints", "__pycache__", ".DS_Store")
                                      or part.endswith(".pyc") for part in rel.parts):
            out[rel.as_posix()] = path.read_bytes()
    return out


def _chapter_dirs(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and CHAPTER_RE.match(p.name))


def out_of_date(fresh: Path, committed: Path) -> dict[str, str]:
    """Chapters where `committed` differs from the `fresh` release: {chapter: why}."""
    fresh, committed = Path(fresh), Path(committed)
    new, old = _chapter_dirs(fresh), _chapter_dirs(committed)
    problems = {}
    for name in sorted(set(new) | set(old)):
        if name not in old:
            problems[name] = "missing"
        elif name not in new:
            problems[name] = "no longer in solutions/"
        else:
            a, b = _files(fresh / name), _files(committed / name)
            if a.keys() != b.keys():
                problems[name] = "files differ"
            elif a != b:
                changed = sorted(k for k in a if a[k] != b[k])
                problems[name] = "changed: " + ", ".join(changed)
    return problems


def update(notebooks: Path = NOTEBOOKS, solutions: Path = SOLUTIONS,
           lang: str = "en") -> dict[str, str]:
    """Regenerate the `lang` release folder from `solutions/`; return what changed
    ({chapter: why})."""
    notebooks = Path(notebooks)
    with tempfile.TemporaryDirectory(prefix="course-release-out-") as tmp:
        fresh = Path(tmp)
        names = generate_release(fresh, solutions, lang=lang)
        changes = out_of_date(fresh, notebooks)
        notebooks.mkdir(parents=True, exist_ok=True)
        for name, why in changes.items():
            if name in names:
                _replace_dir(fresh / name, notebooks / name)
            else:  # a chapter folder whose source is gone
                shutil.rmtree(notebooks / name)
    return changes


def _report_translations(status: TranslationStatus) -> None:
    """Warnings on stderr: chapters not yet translated, cells not yet translated."""
    if status.untranslated:
        print("warning: not yet translated (released with English text): "
              + ", ".join(status.untranslated), file=sys.stderr)
    if status.warnings:
        print(f"warning: {len(status.warnings)} markdown cells not yet translated, the first: "
              f"{status.warnings[0]}", file=sys.stderr)


def _check(folders: dict[str, Path], solutions: Path) -> int:
    """`--check`: one line per release folder, one per translation error; 1 if anything is off."""
    failed = False
    for lang, folder in folders.items():
        rel = os.path.relpath(folder)
        with tempfile.TemporaryDirectory(prefix="course-release-out-") as tmp:
            names = generate_release(Path(tmp), solutions, lang=lang)
            problems = out_of_date(Path(tmp), folder)
        if problems:
            listed = "; ".join(f"{name} ({why})" for name, why in problems.items())
            print(f"{rel}/ is out of date: {listed}. Run `make release`.")
            failed = True
        else:
            print(f"{rel}/ is up to date ({len(names)} chapters).")
    return 1 if failed else 0


def _translation_errors(status: TranslationStatus, lang: str = "zh") -> int:
    """Print each translation that cannot ship (one line each); 1 if there is any."""
    for problem in status.errors:
        print(f"translation {problem}")
    if status.errors:
        suffix = i18n.get_language(lang).translation_suffix
        print(f"{len(status.errors)} translation(s) cannot ship: update the {suffix} files "
              "(`python -m checks.tools.translate NN` lists the stale cells and writes the "
              "hashes; see checks/tools/release.py).")
    return 1 if status.errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.tools.release",
        description="Generate the learner notebooks (notebooks/, notebooks-zh/) from solutions/ "
                    "with nbgrader.")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a release is out of date or a translation "
                             "is stale")
    parser.add_argument("--lang", choices=[*i18n.LANGUAGES, "all"], default="all",
                        help="which release (default: all)")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, metavar="DIR",
                        help="source folder (default: the repository's solutions/)")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, metavar="DIR",
                        help="English release folder (default: the repository's notebooks/)")
    parser.add_argument("--notebooks-zh", type=Path, default=NOTEBOOKS_ZH, metavar="DIR",
                        help="Chinese release folder (default: the repository's notebooks-zh/)")
    args = parser.parse_args(argv)
    folders = {code: lang.release_dir for code, lang in i18n.LANGUAGES.items()}
    folders.update({"en": args.notebooks, "zh": args.notebooks_zh})
    if args.lang != "all":
        folders = {args.lang: folders[args.lang]}
    try:
        statuses = {code: translation_status(args.solutions, code) for code in folders
                    if not i18n.get_language(code).is_source}
        for status in statuses.values():
            _report_translations(status)
        if args.check:
            return max(_check(folders, args.solutions), _all_errors(statuses))
        for lang, folder in folders.items():
            _print_changes(os.path.relpath(folder), update(folder, args.solutions, lang=lang))
    except ReleaseError as exc:
        print(f"release failed: {exc}", file=sys.stderr)
        return 2
    return _all_errors(statuses)


def _all_errors(statuses: dict[str, TranslationStatus]) -> int:
    return max([0, *(_translation_errors(status, code) for code, status in statuses.items())])


def _print_changes(rel: str, changes: dict[str, str]) -> None:
    if not changes:
        print(f"{rel}/ was already up to date.")
    for name, why in changes.items():
        verb = {"missing": "added"}.get(why, "removed" if why.startswith("no longer")
                                        else "updated")
        print(f"{rel}/{name}: {verb} ({why})")


if __name__ == "__main__":
    sys.exit(main())
