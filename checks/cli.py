"""Command line: `python -m checks status [DIR]` and `python -m checks grade PATH...`.

Both run every notebook the way the grader does (`checks.grading.grade_notebook`): its own
worker process with resource limits, each test run again in the grading process on the
worker's functions, test cells restored from the chapter's source notebook.
Bad input gets one line on stderr and exit status 2; a folder keeps being graded past a
notebook that cannot be read, and the exit status is 2 at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from . import grading
from .grading import GradingError, NotebookResult
from .sandbox import Limits

PROG = "python -m checks"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + error
        self.exit(2, f"{PROG}: {message} (see {PROG} --help)\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def _size(text: str) -> int:
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    number, unit = text.strip().upper().rstrip("IB").rstrip("B"), ""
    if number and number[-1] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = int(float(number) * units[unit])
    except (ValueError, KeyError):
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 3G, 1500M, 0)")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Progress and grading for the course's notebooks.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = _Parser(add_help=False)
    common.add_argument("--timeout", type=_seconds, default=grading.DEFAULT_CELL_TIMEOUT,
                        metavar="SECONDS", help="time limit per cell (default: %(default)g)")
    defaults = Limits()
    common.add_argument("--memory", type=_size, default=defaults.memory, metavar="SIZE",
                        help="address space per notebook's worker, e.g. 3G or 1500M; 0 for no "
                             "limit (default: %(default)s bytes)")
    common.add_argument("--cpu-time", type=_nonnegative_int, default=defaults.cpu,
                        metavar="SECONDS", help="CPU seconds per notebook; 0 for no limit "
                                                "(default: %(default)s)")
    common.add_argument("--max-output", type=_size, default=defaults.output, metavar="SIZE",
                        help="largest file a notebook may write (its output log included); "
                             "printed output is discarded either way (default: %(default)s "
                             "bytes)")
    common.add_argument("--source", type=Path, default=grading.SOURCE_DIR, metavar="DIR",
                        help="folder of the chapters' source notebooks, whose test cells are "
                             "used (default: the repository's solutions/)")

    status = commands.add_parser("status", parents=[common],
                                 help="your progress: exercises passed per chapter")
    status.add_argument("dir", nargs="?", default="notebooks", type=Path, metavar="DIR",
                        help="folder with NN_slug/*.ipynb (default: notebooks)")
    status.set_defaults(run=_status)

    grade = commands.add_parser("grade", parents=[common],
                                help="grade notebooks: points per chapter and exercise")
    grade.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                       help="notebooks, or folders searched for notebooks")
    grade.add_argument("--json", type=Path, metavar="FILE",
                       help="also write the results as JSON ('-' for stdout, no table)")
    grade.set_defaults(run=_grade)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if not args.source.is_dir():
            raise GradingError(args.source, "no such folder of source notebooks")
        return args.run(args)
    except GradingError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


# --------------------------------------------------------------------------------------------
# Finding notebooks


def chapter_notebooks(folder: Path) -> list[Path]:
    """`folder/NN_slug/*.ipynb`, the layout of notebooks/ and solutions/."""
    if not folder.is_dir():
        raise GradingError(folder, "no such folder")
    found = sorted(p for p in folder.glob("[0-9][0-9]_*/*.ipynb") if p.is_file())
    if not found:
        raise GradingError(folder, "no chapter notebooks (NN_slug/*.ipynb) in this folder")
    return found


def notebooks_in(paths: Iterable[Path]) -> list[Path]:
    """Notebook files named directly, and those anywhere under named folders (hidden folders
    such as .ipynb_checkpoints skipped). A missing path or a file that is not a notebook is bad
    input, found before anything runs."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*.ipynb") if p.is_file() and not any(
                part.startswith(".") for part in p.relative_to(path).parts))
            if not inside:
                raise GradingError(path, "no notebooks (.ipynb) in this folder")
            found += inside
        elif not path.exists():
            raise GradingError(path, "no such file or folder")
        elif path.suffix != ".ipynb":
            raise GradingError(path, "not a notebook (expected a .ipynb file)")
        else:
            found.append(path)
    return list(dict.fromkeys(found))


def grade_each(paths: list[Path], args, show: Callable[[NotebookResult], None]
               ) -> tuple[list[NotebookResult], list[GradingError]]:
    """Grade notebooks one by one, showing each result as it comes; one that cannot be graded
    is reported in one line and skipped. A notebook that hangs, crashes or misbehaves scores
    zero where it must and never stops the others."""
    results, problems = [], []
    for path in paths:
        try:
            result = _grade_one(path, args)
        except GradingError as problem:
            print(f"{PROG}: {problem}", file=sys.stderr, flush=True)
            problems.append(problem)
        else:
            results.append(result)
            show(result)
    return results, problems


def _grade_one(path: Path, args) -> NotebookResult:
    try:
        limits = Limits(cell_timeout=args.timeout, memory=args.memory, cpu=args.cpu_time,
                        output=args.max_output)
        return grading.grade_notebook(path, source_dir=args.source, limits=limits,
                                      protect=getattr(args, "all_paths", ()))
    except GradingError:
        raise
    except Exception as exc:  # a bug of ours must not stop a class's grading either
        raise GradingError(path, f"could not be graded ({type(exc).__name__}: {exc})") from exc


# --------------------------------------------------------------------------------------------
# status


def _status(args) -> int:
    paths = chapter_notebooks(args.dir)
    width = max(len(_status_label(p)) for p in paths) + 2
    print(f"{'chapter':<{width}}{'passed':>8}   not passing yet", flush=True)
    results, problems = grade_each(paths, args, lambda r: print(_status_row(r, width),
                                                                 flush=True))
    passed = sum(r.passed for r in results)
    total = sum(len(r.exercises) for r in results)
    print(f"{'total':<{width}}{f'{passed}/{total}':>8}")
    return 2 if problems else 0


def _status_label(path: Path) -> str:
    """The chapter folder, plus the file name when it is not the chapter's own notebook."""
    chapter = path.parent.name
    return chapter if path.stem == chapter else f"{chapter}/{path.name}"


def _status_row(result: NotebookResult, width: int) -> str:
    todo = ", ".join(e.name for e in result.exercises if e.status != grading.PASSED)
    if result.error:
        todo = f"{todo}  [{result.error}]" if todo else f"[{result.error}]"
    label = _status_label(Path(result.path))
    return f"{label:<{width}}{f'{result.passed}/{len(result.exercises)}':>8}   {todo}".rstrip()


# --------------------------------------------------------------------------------------------
# grade


def _grade(args) -> int:
    paths = notebooks_in(args.paths)
    args.all_paths = paths  # no submission may change another one
    if args.json is not None and args.json.resolve() in {p.resolve() for p in paths}:
        raise GradingError(args.json, "the JSON output would overwrite a notebook being graded")
    to_stdout = args.json == Path("-")
    results, problems = grade_each(paths, args, lambda r: None if to_stdout else
                                   print(_grade_table(r), flush=True))
    if len(results) > 1 and not to_stdout:
        print(f"total: {_pts(sum(r.points for r in results))}/"
              f"{_pts(sum(r.max_points for r in results))} points in {len(results)} notebooks")
    if args.json is not None:
        _write_json(args.json, results, problems)
    return 2 if problems else 0


def _grade_table(result: NotebookResult) -> str:
    """One notebook: a header line, one line per exercise, the notebook's error if any."""
    width = shutil.get_terminal_size((100, 24)).columns
    name_width = max([len(e.name) for e in result.exercises] + [8]) + 2
    lines = [f"{result.chapter}  {result.path}  {_pts(result.points)}/{_pts(result.max_points)}"
             f" points  ({result.seconds:.1f} s)"]
    for e in result.exercises:
        row = f"  {e.name:<{name_width}}{_pts(e.points):>5}/{_pts(e.max_points):<4} " \
              f"{e.status:<12}{e.message}"
        lines.append(_clip(row.rstrip(), width))
    if result.error:
        lines.append(_clip(f"  ! {result.error}", width))
    return "\n".join(lines) + "\n"


def _write_json(target: Path, results: list[NotebookResult], problems: list[GradingError]):
    data = {
        "points": sum(r.points for r in results),
        "max_points": sum(r.max_points for r in results),
        "notebooks": [r.to_dict() for r in results],
        "errors": [{"path": p.path, "error": p.problem} for p in problems],
    }
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if target == Path("-"):
        sys.stdout.write(text)
    else:
        target.write_text(text, encoding="utf-8")


def _pts(value: float) -> str:
    return f"{value:g}"


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[:max(width - 1, 20)] + "…"
