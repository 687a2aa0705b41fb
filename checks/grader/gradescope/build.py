"""`python -m checks gradescope CHAPTER -o autograder.zip`: a Gradescope autograder for one
chapter (04 or 04_self_attention), several (04,05), or the course (all). The zip holds setup.sh,
run_autograder, README.md (for the instructor), and course/: the course's package `checks`, its
pyproject.toml and constraints.txt (what setup.sh installs), the chosen chapters' source
notebooks (their hidden tests: the zip is the instructor's, never the students'), and
gradescope.json (the chapters and the grader's options)."""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from importlib import resources
from pathlib import Path

from ..identify import CHAPTER_NAME, REPO, SOURCE_DIR
from ..report import PROG

EXECUTABLE = 0o100755 << 16  # zip's external attributes: a regular file, rwxr-xr-x
READABLE = 0o100644 << 16
COURSE_FILES = ("pyproject.toml", "constraints.txt", "README.md")
VISIBILITY = ("visible", "after_due_date", "after_published", "hidden")  # Gradescope's words


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{PROG} gradescope: {message} (see {PROG} gradescope --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog=f"{PROG} gradescope",
                     description="Build a Gradescope autograder (a zip) for chapters.")
    parser.add_argument("chapter", metavar="CHAPTER",
                        help="04, 04_self_attention, several separated by commas, or all")
    parser.add_argument("-o", "--output", type=Path, default=Path("autograder.zip"),
                        metavar="ZIP", help="the zip to write (default: %(default)s)")
    parser.add_argument("--source", type=Path, default=SOURCE_DIR, metavar="DIR",
                        help="folder of the chapters' source notebooks (default: solutions/)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="the grader's time limit per cell inside Gradescope")
    parser.add_argument("--notebook-timeout", type=float, default=None, metavar="SECONDS",
                        help="the grader's time limit per notebook inside Gradescope (set "
                             "Gradescope's own timeout above it)")
    parser.add_argument("--visibility", choices=VISIBILITY, default="visible",
                        help="when students see their results on Gradescope: visible (at once), "
                             "after_due_date, after_published or hidden (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        chapters = chapters_named(args.chapter, args.source)
    except ValueError as exc:
        print(f"{PROG} gradescope: {exc}", file=sys.stderr)
        return 2
    options = ["--timeout", f"{args.timeout:g}"] if args.timeout else []
    if args.notebook_timeout:
        options += ["--notebook-timeout", f"{args.notebook_timeout:g}"]
    try:
        build_zip(args.output, chapters, args.source, options, args.visibility)
    except OSError as exc:
        print(f"{PROG} gradescope: {args.output}: cannot write the zip "
              f"({exc.strerror or type(exc).__name__})", file=sys.stderr)
        return 2
    print(f"{args.output}: Gradescope autograder for {', '.join(chapters)}")
    return 0


def chapters_named(text: str, source: Path) -> list[str]:
    """The source chapters `text` names (ValueError, one line, for a name that is none)."""
    known = sorted(p.name for p in Path(source).glob("*") if CHAPTER_NAME.fullmatch(p.name)
                   and (p / f"{p.name}.ipynb").is_file())
    if not known:
        raise ValueError(f"no chapters' source notebooks in {source}")
    if text.strip() == "all":
        return known
    chosen = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        matches = [c for c in known if c == name or c.split("_", 1)[0] == name]
        if len(matches) != 1:
            raise ValueError(f"unknown chapter {name!r} (known: 01..{known[-1][:2]}, a full "
                             f"name such as {known[0]}, or all)")
        chosen += [m for m in matches if m not in chosen]
    if not chosen:
        raise ValueError("no chapter named")
    return chosen


def build_zip(target: Path, chapters: list[str], source: Path, grade_options: list[str],
              visibility: str = "visible"):
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in ("setup.sh", "run_autograder"):
            _add(archive, name, _template(name), EXECUTABLE)
        _add(archive, "README.md", _template("README.md"), READABLE)
        for path in _package_files():
            _add(archive, f"course/{path.relative_to(REPO).as_posix()}", path.read_bytes())
        for name in COURSE_FILES:
            _add(archive, f"course/{name}", (REPO / name).read_bytes())
        for chapter in chapters:
            notebook = Path(source) / chapter / f"{chapter}.ipynb"
            _add(archive, f"course/solutions/{chapter}/{chapter}.ipynb", notebook.read_bytes())
        config = {"chapters": chapters, "grade_options": grade_options,
                  "visibility": visibility}
        _add(archive, "course/gradescope.json", json.dumps(config, indent=2) + "\n")
    partial.replace(target)


def _package_files() -> list[Path]:
    package = REPO / "checks"
    return sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".pyo"))


def _template(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")


def _add(archive: zipfile.ZipFile, name: str, data: str | bytes, mode: int = READABLE):
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # same input, same zip
    info.external_attr = mode
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)
