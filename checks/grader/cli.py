"""Command line: `python -m checks status [DIR]` and `python -m checks grade PATH...`.

Both run every notebook the way the grader does (`checks.grader.grading.grade_notebook`): its own
walled-in worker process with resource limits, each test decided in the grading process on the
worker's functions, test cells restored from the chapter's source notebook. `--jobs N` grades N
notebooks at once (default: one per core), each in its own grading process and worker, with the
cores divided among them; results are the same as one at a time, shown in the order given, with
a progress line on stderr as each notebook finishes.

Bad input gets one line on stderr and exit status 2; a folder keeps being graded past a
notebook that cannot be read, and the exit status is 2 at the end. If a file that no notebook may
change changes while grading (the course's code, the sources, any submission), grading stops
with an incident report and exit status 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from . import grading
from ..context import GRADING_ENV, THREADS_ENV
from .grading import GradingError, GradingIncident, NotebookResult, peak_memory_mib
from .sandbox import Limits, cores

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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
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
                        help="memory a notebook's worker may use (resident, not address space "
                             "reserved), e.g. 3G or 1500M; 0 for no limit (default: "
                             "%(default)s bytes)")
    common.add_argument("--memory-by", choices=("auto", "cgroup", "rss"),
                        default=defaults.memory_by,
                        help="how memory is limited: a cgroup (the kernel counts and kills; "
                             "needs root), or by watching resident memory; auto picks a cgroup "
                             "where it can (default: %(default)s)")
    common.add_argument("--jobs", type=_positive_int, default=cores(), metavar="N",
                        help="notebooks graded at once, each with its share of the cores "
                             "(default: %(default)s, the cores here)")
    common.add_argument("--hide", type=Path, action="append", default=[], metavar="DIR",
                        help="another folder the workers must not see (the course, the sources, "
                             "the notebooks graded and temporary folders always are); "
                             "repeatable")
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
    os.environ[GRADING_ENV] = "1"  # checks behave as under a grader, here and in the workers
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


def grade_each(paths: list[Path], args, show: Callable[[NotebookResult], None], *,
               progress: bool = True
               ) -> tuple[list[NotebookResult], list[GradingError], GradingIncident | None]:
    """Grade notebooks, `args.jobs` at a time, showing each result in the order of `paths` as
    soon as it and those before it are done, and a progress line on stderr as each finishes.
    One that cannot be graded is reported in one line and skipped. A notebook that hangs,
    crashes or misbehaves scores zero where it must and never stops the others.

    The course's code, the sources and every notebook in `paths` are hashed first and compared
    after each notebook: a change stops grading (no notebook starts after it) and is returned
    as the incident, naming the notebooks that were being graded."""
    tripwire = grading.Tripwire([*grading.course_files(args.source), *paths])
    jobs = max(1, min(args.jobs, len(paths)))
    options = _options(args, paths, threads=max(1, cores() // jobs))
    outcomes: dict[int, tuple] = {}
    results: list[NotebookResult] = []
    problems: list[GradingError] = []
    shown = 0

    def finished(index: int, outcome: tuple, running: list[Path]) -> GradingIncident | None:
        nonlocal shown
        outcomes[index] = outcome
        changed = tripwire.changed()
        if outcome[0] == "incident":
            return GradingIncident([*outcome[1], *map(str, running)], outcome[2], outcome[3])
        if changed:
            return GradingIncident([str(paths[index]), *map(str, running)],
                                   [grading._short_path(p) for p in changed])
        if progress:
            _progress(len(outcomes), len(paths), paths[index], outcome)
        while shown in outcomes:
            kind, *rest = outcomes[shown]
            if kind == "result":
                results.append(rest[0])
                show(rest[0])
            else:
                problem = GradingError(paths[shown], rest[0])
                print(f"{PROG}: {problem}", file=sys.stderr, flush=True)
                problems.append(problem)
            shown += 1
        return None

    if jobs == 1:
        for index, path in enumerate(paths):
            incident = finished(index, _grade_one(path, options), [])
            if incident:
                return results, problems, incident
        return results, problems, None
    return _grade_in_parallel(paths, options, jobs, finished, results, problems)


def _grade_in_parallel(paths, options, jobs, finished, results, problems):
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_child_setup, initargs=(options["threads"],))
    incident = None
    try:
        futures = {pool.submit(_grade_one, path, options): i for i, path in enumerate(paths)}
        pending = set(futures)
        while pending and incident is None:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.get):
                index = futures[future]
                try:
                    outcome = future.result()
                except Exception as exc:  # noqa: BLE001 - a grading process that died
                    outcome = ("problem", f"could not be graded ({type(exc).__name__}: {exc})")
                running = [paths[futures[f]] for f in pending if f.running()]
                incident = incident or finished(index, outcome, running)
    finally:
        if incident is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=True, cancel_futures=True)
    return results, problems, incident


def _child_setup(threads: int) -> None:
    """A grading process of `--jobs`: the grading flag and its share of the cores."""
    os.environ[GRADING_ENV] = "1"
    os.environ[THREADS_ENV] = str(threads)
    import torch

    torch.set_num_threads(threads)


def _options(args, paths: list[Path], threads: int) -> dict:
    roots = list(getattr(args, "paths", None) or [getattr(args, "dir", Path("."))])
    hide = [p if p.is_dir() else p.parent for p in roots] + list(args.hide)
    return {"source": args.source, "threads": threads, "hide": [p.resolve() for p in hide],
            "limits": Limits(cell_timeout=args.timeout, memory=args.memory, cpu=args.cpu_time,
                             output=args.max_output, threads=threads,
                             memory_by=args.memory_by)}


def _grade_one(path: Path, options: dict) -> tuple:
    """("result", NotebookResult) | ("problem", text) | ("incident", notebooks, files, what)."""
    try:
        return ("result", grading.grade_notebook(
            path, source_dir=options["source"], limits=options["limits"], hide=options["hide"],
            tripwire=grading.Tripwire([*grading.course_files(options["source"]), path])))
    except GradingError as problem:
        return ("problem", problem.problem)
    except GradingIncident as incident:
        return ("incident", incident.notebooks, incident.changed, incident.what)
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not stop a class's grading
        return ("problem", f"could not be graded ({type(exc).__name__}: {exc})")


def _progress(done: int, total: int, path: Path, outcome: tuple) -> None:
    """One line on stderr per graded notebook (one that cannot be graded gets its error line)."""
    if outcome[0] == "result":
        r = outcome[1]
        print(f"[{done}/{total}] {path}: {_pts(r.points)}/{_pts(r.max_points)} points "
              f"({r.seconds:.1f} s)", file=sys.stderr, flush=True)


def _report_incident(incident: GradingIncident, graded: int, total: int) -> None:
    print(f"{PROG}: INCIDENT: {incident}", file=sys.stderr)
    print(f"{PROG}: grading stopped after {graded} of {total} notebooks; the notebooks named "
          "above were being graded when it was found. Check them and the files before grading "
          "again.", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# status


def _status(args) -> int:
    paths = chapter_notebooks(args.dir)
    width = max(len(_status_label(p)) for p in paths) + 2
    print(f"{'chapter':<{width}}{'passed':>8}   not passing yet", flush=True)
    results, problems, incident = grade_each(  # each row is printed as soon as it is known
        paths, args, lambda r: print(_status_row(r, width), flush=True), progress=False)
    if incident is not None:
        _report_incident(incident, len(results) + len(problems), len(paths))
        return 3
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
    if args.json is not None and args.json.resolve() in {p.resolve() for p in paths}:
        raise GradingError(args.json, "the JSON output would overwrite a notebook being graded")
    to_stdout = args.json == Path("-")
    results, problems, incident = grade_each(paths, args, lambda r: None if to_stdout else
                                             print(_grade_table(r), flush=True))
    if len(results) > 1 and not to_stdout and incident is None:
        print(f"total: {_pts(sum(r.points for r in results))}/"
              f"{_pts(sum(r.max_points for r in results))} points in {len(results)} notebooks")
    if args.json is not None:
        _write_json(args.json, results, problems, incident)
    if incident is not None:
        _report_incident(incident, len(results) + len(problems), len(paths))
        return 3
    return 2 if problems else 0


def _grade_table(result: NotebookResult) -> str:
    """One notebook: a header line, one line per exercise, the notebook's error if any."""
    width = shutil.get_terminal_size((100, 24)).columns
    name_width = max([len(e.name) for e in result.exercises] + [8]) + 2
    student = f"  [student {result.student}]" if result.student else ""
    lines = [f"{result.chapter}  {result.path}  {_pts(result.points)}/{_pts(result.max_points)}"
             f" points  ({result.seconds:.1f} s){student}"]
    for e in result.exercises:
        row = f"  {e.name:<{name_width}}{_pts(e.points):>5}/{_pts(e.max_points):<4} " \
              f"{e.status:<12}{e.message}"
        lines.append(_clip(row.rstrip(), width))
    for warning in result.warnings:
        lines.append(_clip(f"  ! warning: {warning}", width))
    if result.error:
        lines.append(_clip(f"  ! {result.error}", width))
    if result.isolation == "none":
        lines.append(_clip("  ! the worker ran without walls (not root, or no namespaces): its "
                           "code could read the course's files", width))
    return "\n".join(lines) + "\n"


def _write_json(target: Path, results: list[NotebookResult], problems: list[GradingError],
                incident: GradingIncident | None = None):
    data = {
        "points": sum(r.points for r in results),
        "max_points": sum(r.max_points for r in results),
        "notebooks": [r.to_dict() for r in results],
        "errors": [{"path": p.path, "error": p.problem} for p in problems],
        "grader_memory_mib": round(max([peak_memory_mib()]
                                        + [r.grader_memory_mib for r in results]), 1),
    }
    if incident is not None:
        data["incident"] = {"what": incident.what, "files": incident.changed,
                            "notebooks": incident.notebooks}
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if target == Path("-"):
        sys.stdout.write(text)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _pts(value: float) -> str:
    return f"{value:g}"


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[:max(width - 1, 20)] + "…"
