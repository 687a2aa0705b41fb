"""Generate the learner release (`notebooks/`) from the instructor notebooks (`solutions/`).

    python -m checks.tools.release            regenerate notebooks/ (what `make release` runs)
    python -m checks.tools.release --check    exit 1, naming the chapters, if notebooks/ is out of date

Every chapter folder `solutions/NN_slug/` (holding `NN_slug.ipynb`) is one nbgrader assignment.
`nbgrader generate_assignment` runs in a temporary course directory (its own config, database
and release folder), because its `--force` deletes the folder it writes to. The generated
`NN_slug/` folders are then compared with, or copied into, `notebooks/`; chapters that no longer
exist in `solutions/` are removed from `notebooks/`. Nothing else in `notebooks/` is touched.

Tests use `generate_release(folder)` to build the release somewhere else and `out_of_date()` to
compare two releases.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
NOTEBOOKS = ROOT / "notebooks"
CONFIG = ROOT / "nbgrader_config.py"

#: A chapter folder: two digits, an underscore, a lower-case slug (`01_notation`).
CHAPTER_RE = re.compile(r"^[0-9]{2}_[a-z0-9_]+$")
#: Editor and interpreter droppings that are never part of a chapter.
JUNK = (".ipynb_checkpoints", "__pycache__", "*.pyc", ".DS_Store")


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
# the release


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


def generate_release(dest: Path, solutions: Path = SOLUTIONS) -> list[str]:
    """Generate the learner release of every chapter in `solutions` into `dest/NN_slug/`.

    `dest` is created if needed; chapter folders already in it are replaced, nothing else in it is
    touched. Returns the chapter names. nbgrader itself only ever writes inside a temporary course.
    """
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
                            ignore=shutil.ignore_patterns(*JUNK))
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


def update(notebooks: Path = NOTEBOOKS, solutions: Path = SOLUTIONS) -> dict[str, str]:
    """Regenerate `notebooks/` from `solutions/`; return what changed ({chapter: why})."""
    notebooks = Path(notebooks)
    with tempfile.TemporaryDirectory(prefix="course-release-out-") as tmp:
        fresh = Path(tmp)
        names = generate_release(fresh, solutions)
        changes = out_of_date(fresh, notebooks)
        notebooks.mkdir(parents=True, exist_ok=True)
        for name, why in changes.items():
            if name in names:
                _replace_dir(fresh / name, notebooks / name)
            else:  # a chapter folder whose source is gone
                shutil.rmtree(notebooks / name)
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.tools.release",
        description="Generate the learner notebooks (notebooks/) from solutions/ with nbgrader.")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if notebooks/ is out of date")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, metavar="DIR",
                        help="source folder (default: the repository's solutions/)")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, metavar="DIR",
                        help="release folder (default: the repository's notebooks/)")
    args = parser.parse_args(argv)
    rel = os.path.relpath(args.notebooks)
    try:
        if args.check:
            with tempfile.TemporaryDirectory(prefix="course-release-out-") as tmp:
                names = generate_release(Path(tmp), args.solutions)
                problems = out_of_date(Path(tmp), args.notebooks)
            if problems:
                listed = "; ".join(f"{name} ({why})" for name, why in problems.items())
                print(f"{rel}/ is out of date: {listed}. Run `make release`.")
                return 1
            print(f"{rel}/ is up to date ({len(names)} chapters).")
            return 0
        changes = update(args.notebooks, args.solutions)
    except ReleaseError as exc:
        print(f"release failed: {exc}", file=sys.stderr)
        return 2
    if changes:
        for name, why in changes.items():
            verb = {"missing": "added"}.get(why, "removed" if why.startswith("no longer")
                                            else "updated")
            print(f"{rel}/{name}: {verb} ({why})")
    else:
        print(f"{rel}/ was already up to date.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
