"""Command line: `python -m checks status [DIR]` and `python -m checks grade PATH...`.

Both run every notebook the way the grader does (`checks.grader.grading.grade_notebook`): its own
walled-in worker process with resource limits, each test decided in the grading process on the
worker's functions, test cells restored from the chapter's source notebook. `--jobs N` grades N
notebooks at once (default: one per core), each in its own grading process and worker, with the
cores divided among them; results are the same as one at a time, shown in the order given, with
a progress line on stderr as each notebook finishes.

Here: the arguments, mapped onto the library's options (`options.GradeOptions`,
`options.OutputOptions`; a flag is the field of its name), the call to the library
(`api.status`, `api.grade_folder`: what is graded, written and printed), and its exit status.

Bad input gets one line on stderr and exit status 2; a folder keeps being graded past a
notebook that cannot be read, and the exit status is 2 at the end. If a file that no notebook may
change changes while grading (the course's code, the sources, any submission), grading stops
with an incident report and exit status 3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..i18n import LANGUAGES, _
from . import api
from .batch import Terminated
from .grading import DEFAULT_CELL_TIMEOUT
from .identify import SOURCE_DIR
from .limits import Limits, cores
from .options import GradeOptions, OutputOptions, from_namespace
from .outputs.late import assignments_argument, due_argument, extensions_argument
from .outputs.roster import roster_argument
from .read import CEILING_BYTES, CEILING_CELLS, Caps
from .report import PROG
from .results import GradingError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + error
        self.exit(2, f"{PROG}: {message} (see {PROG} --help)\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(
            _("not a positive number of seconds: {text}").format(text=repr(text)))
    return value


def _seconds_or_none(text: str) -> float:
    """A positive number of seconds, or 0 for no limit."""
    return 0.0 if text.strip() in ("0", "0.0") else _seconds(text)


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
        raise argparse.ArgumentTypeError(
            _("not a size: {text} (examples: 3G, 1500M, 0)").format(text=repr(text)))
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            _("not a positive whole number: {text}").format(text=repr(text)))
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            _("not a whole number of seconds: {text}").format(text=repr(text)))
    return value


def _capped(kind, ceiling: int):
    """An argument type: `kind`, at most `ceiling` (the grader's memory stays bounded below it)."""
    def parse(text: str) -> int:
        value = kind(text)
        if value > ceiling or value < 1:
            raise argparse.ArgumentTypeError(_("{text}: from 1 to {ceiling}").format(
                text=repr(text), ceiling=ceiling))
        return value
    return parse


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Progress and grading for the course's notebooks.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = _Parser(add_help=False)
    common.add_argument("--timeout", type=_seconds, default=DEFAULT_CELL_TIMEOUT,
                        metavar="SECONDS", help="time limit per cell (default: %(default)g)")
    defaults = Limits()
    common.add_argument("--notebook-timeout", type=_seconds_or_none, metavar="SECONDS",
                        default=defaults.notebook_time,
                        help="time limit for a whole notebook, cells that hang or crash and the "
                             "restarts after them included; 0 for none (default: %(default)g)")
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
    common.add_argument("--source", type=Path, default=SOURCE_DIR, metavar="DIR",
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
                       help="also write the results as JSON ('-' for stdout, no table); "
                            "rewritten as each notebook finishes, and merged with the file's "
                            "earlier results: a submission unchanged since is not graded again")
    grade.add_argument("--regrade", action="store_true",
                       help="grade every submission again, changed or not")
    grade.add_argument("--csv", type=Path, metavar="FILE",
                       help="also write a gradebook: one row per student, a column of points "
                            "per chapter (Canvas's gradebook import)")
    grade.add_argument("--csv-exercises", type=Path, metavar="FILE",
                       help="also write one row per student, a column per exercise, with each "
                            "chapter's total, submission time and lateness")
    grade.add_argument("--feedback", type=Path, metavar="DIR",
                       help="also write feedback for students: DIR/<student>/<chapter>.html, "
                            "and DIR/index.html naming each student's pages")
    grade.add_argument("--report", type=Path, metavar="FILE",
                       help="also write the class report: one HTML page with each exercise's "
                            "pass rate, the mistakes most students made (and who), the score "
                            "distribution and lateness, with charts, and a table of every "
                            "student (every --roster student too) in a needs-help order")
    grade.add_argument("--due", type=due_argument, metavar="TIME",
                       help="deadline (ISO 8601; no zone: UTC): submissions whose nbgrader "
                            "timestamp.txt is later are marked late in every output (for the "
                            "assignments that --assignments does not list)")
    grade.add_argument("--assignments", type=assignments_argument, metavar="FILE",
                       help="a CSV with a header and the columns assignment (a chapter's "
                            "folder name), due, and optionally penalty_per_day and max_penalty "
                            "(fractions of its points) and lms_id: each assignment's own "
                            "deadline and late penalty")
    grade.add_argument("--extensions", type=extensions_argument, metavar="FILE",
                       help="a CSV of student,due rows (every assignment) or "
                            "student,assignment,due rows: those students' own deadlines")
    grade.add_argument("--roster", type=roster_argument, metavar="FILE",
                       help="a CSV naming the students (columns folder, id, name, login, "
                            "section): the gradebook gets their LMS ids and a row each")
    grade.add_argument("--use-copies", action="store_true",
                       help="where a student's notebook at its place (<chapter>.ipynb) is the "
                            "untouched release and exactly one other notebook of that chapter "
                            "(a '-Copy1.ipynb') holds work, grade that one instead (without "
                            "this flag the copy is refused and flagged in every output)")
    grade.add_argument("--use-copy", type=Path, action="append", default=[], metavar="PATH",
                       help="the notebook that counts for its student's chapter (relative to "
                            "the submissions folder, or absolute): graded instead of the one at "
                            "its place, the others refused; repeatable, one per student and "
                            "chapter")
    grade.add_argument("--lang", choices=tuple(LANGUAGES), default=None,
                       help="your language: the lines printed, the class summary and the "
                            "class report, with the mistakes' messages in them (default: "
                            "LLAMA_COURSE_LANG, else English); each student's diagnoses and "
                            "feedback stay in the submission's language")
    grade.add_argument("--max-size", type=_capped(_size, CEILING_BYTES), default=Caps.max_bytes,
                       metavar="SIZE", help="largest notebook file graded, checked before it is "
                       "read (default: %(default)s bytes; at most 64M)")
    grade.add_argument("--max-cells", type=_capped(_positive_int, CEILING_CELLS),
                       default=Caps.max_cells, metavar="N",
                       help="most cells a notebook may have (default: %(default)s)")
    grade.add_argument("--max-notebooks", type=_positive_int, default=Caps.max_notebooks,
                       metavar="N", help="most notebooks graded for one student, those named "
                       "after a chapter first (default: %(default)s)")
    grade.set_defaults(run=_grade)
    # Listed for --help; `python -m checks` (and main) hand them over before parsing.
    commands.add_parser("gradescope", add_help=False,
                        help="build a Gradescope autograder (a zip) for chapters "
                             f"({PROG} gradescope --help)")
    commands.add_parser("doctor", add_help=False,
                        help="what this machine has for the course, for a bug report")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["gradescope"], ["doctor"]):
        return _hand_over(argv[0], argv[1:])
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except GradingError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"{PROG}: " + _("terminated (SIGTERM)"), file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"{PROG}: " + _("interrupted"), file=sys.stderr)
        return 130


def _hand_over(command: str, argv: list[str]) -> int:
    if command == "gradescope":
        from .gradescope.build import main as gradescope

        return gradescope(argv)
    from ..doctor import main as doctor

    return doctor(argv)


# --------------------------------------------------------------------------------------------
# the commands: the flags onto the options, the library's run (checks.grader.api), its exit status


def _status(args) -> int:
    return api.status(args.dir, from_namespace(GradeOptions, args)).exit_status


def _grade(args) -> int:
    return api.grade_folder(args.paths, from_namespace(GradeOptions, args),
                            from_namespace(OutputOptions, args)).exit_status
