"""The catalogue's cases at the grader's edges (issue 18: what counts as a submission, names, who a
record belongs to, budgets), as rows of the same `Case` table as tests/support/adversarial.py.

Each case is a student's folder `folder/<case>/` holding what a download from a learning platform
or a clone can hold: links (to the instructor's source notebook by a relative path, to a
classmate's file, to /proc/kmsg), a FIFO, a hard link, folders nested 1,100 deep, file names that
are not UTF-8 or hold ESC and CR, nbgrader's layout nested inside a student's folder, a 24 MiB
notebook of empty lists, 10,000 cells (`DEEP_1100` apart). `EDGES` join the catalogue
(`adversarial.CATALOGUE`, and the claim `PROTECTED` its `PROTECTED`);
`MULTI` are the cases whose folder gets more than one outcome (a duplicate pair, 500 notebooks
for one student, a classmate's record forged from a nested folder), graded by
tests/grader/test_submissions.py on their own.

`regular_notebooks(folder)` lists the class's notebook files as the grader would find them
(regular files only, no link followed, no recursion): what a test may read back byte for byte.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import adversarial, submissions as sub
from .adversarial import Case, Where, answer, full, sol, without

CLAIM = "submissions-checked"
PROTECTED = {
    CLAIM: "Only regular files with one name, found inside the folder given, are submissions: a "
           "symbolic link (to a source notebook or a classmate's file), a hard link, a FIFO or a "
           "device is refused in one line and the rest of the class is graded; folders are "
           "searched to a bounded depth; names and messages are shown escaped; the student is "
           "the first folder under the root given, one notebook counts per student and chapter, "
           "and file size, cells and notebooks per student are capped before anything is "
           "parsed.",
}

FORGED_LINE = "\x1b[2K\r  head_dim     1/1   passed"  # what an ESC/CR message tries to draw
FORGED_NAME = "\x1b[2K\r  head_dim  passed, 6 of 6 points"  # a file name holds no "/"


@dataclass
class EdgeCase(Case):
    """A case whose submission is files on disk: `submission(where, folder)` makes them under
    the case's folder (`folder/<case>/`)."""

    student: str | None = None  # the student its record must name (graded cases)

    def write(self, where: Where) -> Path:
        folder = where.folder / self.name
        folder.mkdir(parents=True, exist_ok=True)
        self.submission(where, folder)
        return folder


def _notebook(nb, path: Path) -> None:
    sub.write(nb, path)


def _link(target: Callable[[Where], Path | str], relative: bool = False):
    def make(where: Where, folder: Path) -> None:
        aim = target(where)
        link = folder / "01_notation" / "01_notation.ipynb"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(aim, link.parent) if relative else aim)
    return make


def _fifo(where: Where, folder: Path) -> None:
    os.mkfifo(folder / "01_notation.ipynb")


def _hard_link(where: Where, folder: Path) -> None:
    """A hard link to a notebook outside the class (a classmate's file in another section's
    folder): one file, two names."""
    elsewhere = where.folder.parent / "other_section" / "alice" / "01_notation.ipynb"
    _notebook(sol(), elsewhere)
    os.link(elsewhere, folder / "01_notation.ipynb")


def _device(where: Where, folder: Path) -> None:
    """/dev/zero's device under a notebook's name (a tar archive can hold one; made as root)."""
    os.mknod(folder / "01_notation.ipynb", 0o644 | stat.S_IFCHR, os.makedev(1, 5))


def _deep(levels: int):
    def make(where: Where, folder: Path) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:  # by descriptor: the path would be longer than the system allows
            for _ in range(levels):
                os.mkdir("d", dir_fd=fd)
                inner = os.open("d", os.O_RDONLY, dir_fd=fd)
                os.close(fd)
                fd = inner
            made = os.open("01_notation.ipynb", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
            with os.fdopen(made, "w") as stream:
                stream.write(_text_of(sol()))
        finally:
            os.close(fd)
    return make


def _text_of(nb) -> str:
    import nbformat

    return nbformat.writes(nb)


def _named(name: bytes, nb_of: Callable[[], object] = sol):
    """A notebook under a file name given as bytes (not UTF-8, or holding ESC and CR)."""
    def make(where: Where, folder: Path) -> None:
        path = os.path.join(os.fsencode(folder), name)
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(_text_of(nb_of()))
    return make


def _nested_forgery(where: Where, folder: Path) -> None:
    """mallory's folder holds nbgrader's layout again, naming bob: the record is mallory's."""
    _notebook(sol(), folder / "01_notation" / "submitted" / "bob" / "01_notation" /
              "01_notation.ipynb")


def _huge_metadata(lists: int = 8_500_000):
    """About 24 MiB: the notebook's metadata holds millions of empty lists."""
    def make(where: Where, folder: Path) -> None:
        nb = json.loads(_text_of(sol()))
        nb["metadata"]["junk"] = [[] for _ in range(lists)]
        (folder / "01_notation.ipynb").write_text(json.dumps(nb, separators=(",", ":")))
    return make


def _many_cells(cells: int = 10_000):
    def make(where: Where, folder: Path) -> None:
        nb = sol()
        import nbformat

        nb.cells += [nbformat.v4.new_code_cell("pass") for _ in range(cells - len(nb.cells))]
        _notebook(nb, folder / "01_notation.ipynb")
    return make


def _exception_message_with_escapes():
    return answer(sol(), "head_dim", (
        "def head_dim(cfg):\n"
        f"    raise ValueError({FORGED_LINE!r} + ' \\x1b]0;title\\x07')"))


def _whole(where: Where, folder: Path) -> None:
    _notebook(sol(), folder / "01_notation" / "01_notation.ipynb")


def _exception_case(where: Where, folder: Path) -> None:
    _notebook(_exception_message_with_escapes(), folder / "01_notation" / "01_notation.ipynb")


EDGES: list[Case] = [
    EdgeCase("c9_link_to_source", _link(lambda w: w.chapter_01, relative=True),
             None, None, "a relative link to the instructor's source notebook", CLAIM,
             error="a symbolic link"),
    EdgeCase("c9_link_to_classmate", _link(lambda w: w.victim),
             None, None, "a link to a classmate's file", CLAIM, error="a symbolic link"),
    EdgeCase("c9_link_to_kmsg", _link(lambda w: "/proc/kmsg"),
             None, None, "a link to /proc/kmsg (reading it blocks)", CLAIM,
             error="a symbolic link"),
    EdgeCase("c9_fifo", _fifo, None, None, "a FIFO under a notebook's name", CLAIM,
             error="a FIFO"),
    EdgeCase("c9_device", _device, None, None, "a device under a notebook's name", CLAIM,
             error="a device"),
    EdgeCase("c9_hard_link", _hard_link, None, None, "a hard link to another's notebook", CLAIM,
             error="a hard link"),
    EdgeCase("c9_nested_too_deep", _deep(40), None, None,
             "folders nested past the search's depth", CLAIM, error="nested more than"),
    EdgeCase("c9_huge_metadata", _huge_metadata(), None, None,
             "24 MiB of empty lists in the metadata: refused before it is parsed", CLAIM,
             error="larger than"),
    EdgeCase("c9_ten_thousand_cells", _many_cells(), None, None, "10,000 cells", CLAIM,
             error="more than the 1000"),
    EdgeCase("c9_name_not_utf8", _named(b"\xff\xfe homework.ipynb"),
             "01_notation", full(), "a file name that is not UTF-8: graded, the JSON written",
             CLAIM, student="c9_name_not_utf8"),
    EdgeCase("c9_name_with_escapes", _named(os.fsencode(f"hw{FORGED_NAME}.ipynb")),
             "01_notation", full(), "ESC and CR in a file name: shown escaped", CLAIM,
             student="c9_name_with_escapes"),
    EdgeCase("c9_message_with_escapes", _exception_case,
             "01_notation", without("head_dim"),
             "ESC and CR in an exception message: shown escaped", CLAIM,
             statuses={"head_dim": "failed"}, student="c9_message_with_escapes"),
    EdgeCase("c9_nested_submitted", _nested_forgery,
             "01_notation", full(), "submitted/bob/ nested in mallory's folder: her record, "
             "with a warning", CLAIM, warning="nested below its assignment folder",
             student="c9_nested_submitted"),
    EdgeCase("c9_zz_victim", _whole, "01_notation", full(),
             "an honest solution graded after the attacks", "walls", student="c9_zz_victim"),
]


# The catalogue's rows and claims (whichever of the two modules is imported first).
if not any(case.name == EDGES[0].name for case in adversarial.CATALOGUE):
    adversarial.CATALOGUE += EDGES
    adversarial.PROTECTED.update(PROTECTED)
assert len({case.name for case in adversarial.CATALOGUE}) == len(adversarial.CATALOGUE)

# Past Python's recursion limit (rglob raised RecursionError; so does shutil.rmtree, hence not in
# the catalogue, whose folder pytest removes: tests/grader/test_submissions.py flattens it first).
DEEP_1100 = EdgeCase("c9_nested_1100_deep", _deep(1100), None, None,
                     "folders nested 1,100 deep (rglob raised RecursionError)", CLAIM,
                     error="nested more than")


# --------------------------------------------------------------------------------------------
# Cases with more than one outcome in a folder (tests/grader/test_submissions.py)


@dataclass
class Multi:
    name: str  # the student's folder
    make: Callable[[Path], None]
    graded: dict[str, float]  # file (relative to the student's folder): points
    refused: dict[str, str]  # file or folder (relative): words of its one line
    why: str
    warning: str = ""


def _pair_with_standard(folder: Path) -> None:
    _notebook(sol(), folder / "01_notation" / "01_notation.ipynb")
    _notebook(answer(sol(), "head_dim", "def head_dim(cfg):\n    return 0"),
              folder / "01_notation" / "01_notation-Copy1.ipynb")


def _pair_without_standard(folder: Path) -> None:
    _notebook(sol(), folder / "01_notation" / "mine.ipynb")
    _notebook(sol(), folder / "01_notation" / "also_mine.ipynb")


def _forged_beside_own(folder: Path) -> None:
    _notebook(answer(sol(), "head_dim", "def head_dim(cfg):\n    return 0"),
              folder / "01_notation" / "01_notation.ipynb")
    _notebook(sol(), folder / "01_notation" / "submitted" / "bob" / "01_notation" /
              "01_notation.ipynb")


def _five_hundred(folder: Path) -> None:
    _notebook(sol(), folder / "01_notation" / "01_notation.ipynb")
    text = (folder / "01_notation" / "01_notation.ipynb").read_text()
    junk = folder / "junk"
    junk.mkdir()
    for i in range(499):
        (junk / f"scratch_{i:03d}.ipynb").write_text(text)


MULTI: list[Multi] = [
    Multi("dup_standard", _pair_with_standard, {"01_notation/01_notation.ipynb": full()},
          {"01_notation/01_notation-Copy1.ipynb": "a second notebook for dup_standard's"},
          "two notebooks for one chapter: the one named after it is graded"),
    Multi("dup_neither", _pair_without_standard, {},
          {"01_notation/mine.ipynb": "none graded", "01_notation/also_mine.ipynb": "none graded"},
          "two notebooks for one chapter, neither at its place: neither graded"),
    Multi("mallory", _forged_beside_own,
          {"01_notation/01_notation.ipynb": without("head_dim")},
          {"01_notation/submitted/bob/01_notation/01_notation.ipynb":
           "a second notebook for mallory's"},
          "a nested submitted/bob/ beside her own notebook: no record for bob, hers graded"),
    Multi("hoarder", _five_hundred, {"01_notation/01_notation.ipynb": full()},
          {"": "500 notebooks for student hoarder"},
          "500 notebooks: the cap grades those named after a chapter first (--max-notebooks 1)"),
]


def regular_notebooks(folder: Path) -> list[Path]:
    """The `.ipynb` regular files under `folder`: no link followed, no recursion (a class may be
    nested deeper than Python's recursion limit), FIFOs and devices never opened."""
    found, stack = [], [str(folder)]
    while stack:
        here = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:  # deeper than the system's path length
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.name.endswith(".ipynb") and entry.is_file(follow_symlinks=False):
                found.append(Path(entry.path))
    return sorted(found)


def flatten_deep(folder: Path) -> None:
    """Remove a folder nested deeper than `shutil.rmtree` can recurse (its levels moved up one
    at a time), so that the test's temporary folder can be cleaned up."""
    top, n = folder / "d", 0
    while top.is_dir() and not top.is_symlink():
        inner = top / "d"
        if inner.is_dir():
            inner.rename(folder / f"level{n}")
        for leftover in top.iterdir():
            leftover.unlink()
        top.rmdir()
        if inner.exists() or not (folder / f"level{n}").exists():
            break
        (folder / f"level{n}").rename(top)
        n += 1
