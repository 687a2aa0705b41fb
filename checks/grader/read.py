"""Stage 1 of grading: what the submissions are and reading each.

Finding (`walk_notebooks`, `notebooks_in`, `chapter_notebooks`): only regular files count, each
checked with `lstat` and never followed: a symbolic link, a hard link (a file with two names, one
of them a classmate's), a FIFO or a device is refused with one line for that file, and the rest
of the class is graded. Folders are walked without following links and at most `MAX_DEPTH`
levels deep (a deeper folder is one refusal, never a `RecursionError`).

Reading (`read_notebook`): the file is opened without following links, checked again (regular,
at most `CEILING_BYTES`), decoded as UTF-8, and parsed for what grading needs only: each
cell's type, source, id and the `nbgrader` part of its metadata, and the notebook's `course`,
`kernelspec` and `language_info` metadata. Outputs, attachments and every other piece of metadata
are stepped over without building anything, so memory stays about the file's size whatever it
holds (a 24 MiB notebook of millions of empty lists in its metadata included). The result is a
tree of `Node`s, or `GradingError` with one readable line. `grade_id` and `is_test_cell` read a
cell's nbgrader metadata for every later stage.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..i18n import N_, _
from .results import GradingError, Refused

MAX_BYTES = 8 * 2**20  # the largest notebook file graded (`--max-size`)
MAX_CELLS = 1000  # the most cells in one notebook (`--max-cells`); the course's have 30 to 60
MAX_NOTEBOOKS = 40  # the most notebooks graded for one student (`--max-notebooks`)
MAX_DEPTH = 32  # folder levels searched below a folder given
# What `read_notebook` accepts at most, whatever the caps above are set to: the grader's memory
# stays bounded (about three times the file's size) within them.
CEILING_BYTES = 64 * 2**20
CEILING_CELLS = 5000

# Problems said in more than one place (marked for the catalogue, translated where raised)
NO_SUCH_FILE = N_("no such file")
A_FOLDER = N_("is a folder, not a notebook")
NOT_A_NOTEBOOK = N_("not a notebook (expected a .ipynb file)")
CANNOT_READ = N_("cannot be read ({why})")
MALFORMED = N_("malformed notebook ({why})")


@dataclass(frozen=True)
class Caps:
    """The instructor's caps on what one submission may be (flags `--max-size`, `--max-cells`,
    `--max-notebooks`); `read_notebook` never goes past the ceilings whatever they are."""

    max_bytes: int = MAX_BYTES
    max_cells: int = MAX_CELLS
    max_notebooks: int = MAX_NOTEBOOKS
    max_depth: int = MAX_DEPTH


class Node(dict):
    """A notebook, cell or metadata dict whose keys also read as attributes, like nbformat's
    NotebookNode (nbformat itself is not imported: it pulls in jsonschema, seconds per process)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value


def as_node(value: Any) -> Any:
    if isinstance(value, dict):
        return Node({k: as_node(v) for k, v in value.items()})
    if isinstance(value, list):
        return [as_node(v) for v in value]
    return value


def new_code_cell(source: str, metadata: dict | None = None) -> Node:
    return Node(cell_type="code", execution_count=None, metadata=as_node(metadata or {}),
                outputs=[], source=source)


# --------------------------------------------------------------------------------------------
# What counts as a submission: a regular file with one name, checked without following links


def refusal(path: Path, st: os.stat_result, *, one_name: bool = True) -> str | None:
    """Why a file (its `lstat`) is not a submission, or None for a regular file with one name
    (`one_name=False`: or more; names are counted when a class is searched, not when one file is
    read, so that a source notebook with two names is still read)."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return _("a symbolic link, not a file: not graded (submit the notebook itself)")
    if not stat.S_ISREG(mode):
        kind = (_("a FIFO") if stat.S_ISFIFO(mode) else _("a device") if stat.S_ISCHR(mode)
                or stat.S_ISBLK(mode) else _("a socket") if stat.S_ISSOCK(mode) else _("a folder")
                if stat.S_ISDIR(mode) else _("not a regular file"))
        return _("{kind}, not a notebook file: not graded").format(kind=kind)
    if one_name and st.st_nlink > 1:
        return _("a hard link (one file with {count} names, another student's perhaps): not "
                 "graded (submit a copy of its own)").format(count=st.st_nlink)
    return None


def too_big(st: os.stat_result, max_bytes: int) -> str | None:
    if st.st_size > max_bytes:
        return _("{size} MiB, larger than the {limit} MiB a notebook may be (--max-size): not "
                 "graded").format(size=f"{st.st_size / 2**20:.1f}", limit=f"{max_bytes / 2**20:g}")
    return None


def walk_notebooks(root: Path, max_depth: int = MAX_DEPTH
                   ) -> tuple[list[Path], list[GradingError]]:
    """The regular `.ipynb` files under `root` (hidden names such as .ipynb_checkpoints skipped),
    sorted, and one refusal per link, special file or too-deep folder met on the way. Nothing is
    followed: the walk stays inside `root`."""
    found: list[Path] = []
    refused: list[GradingError] = []
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:  # an explicit stack: no recursion, however deep the folders
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as entries:
                names = sorted(entry.name for entry in entries)
        except OSError as exc:
            refused.append(Refused(folder, _("cannot be read ({why}): not searched").format(
                why=exc.strerror)))
            continue
        subfolders = []
        for name in names:
            if name.startswith("."):
                continue
            path = folder / name
            try:
                st = os.lstat(path)
            except OSError as exc:
                refused.append(Refused(path, _(CANNOT_READ).format(why=exc.strerror)))
                continue
            if stat.S_ISDIR(st.st_mode):
                subfolders.append(path)
            elif name.endswith(".ipynb") or stat.S_ISLNK(st.st_mode) and _links_to_folder(path):
                problem = refusal(path, st)
                if problem is None:
                    found.append(path)
                else:
                    refused.append(Refused(path, problem))
        for sub in reversed(subfolders):
            if depth + 1 > max_depth:
                refused.append(Refused(sub, _("folders nested more than {depth} levels deep: "
                                              "not searched").format(depth=max_depth)))
            else:
                stack.append((sub, depth + 1))
    return sorted(found), refused


def _links_to_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)  # stat opens nothing: safe on any target
    except OSError:
        return False


def chapter_notebooks(folder: Path) -> list[Path]:
    """`folder/NN_slug/*.ipynb`, the layout of notebooks/ and solutions/ (regular files only)."""
    if not folder.is_dir():
        raise GradingError(folder, _("no such folder"))
    found = sorted(p for p in folder.glob("[0-9][0-9]_*/*.ipynb")
                   if not p.is_symlink() and p.is_file())
    if not found:
        raise GradingError(folder, _("no chapter notebooks (NN_slug/*.ipynb) in this folder"))
    return found


def notebooks_in(paths: Iterable[Path], max_depth: int = MAX_DEPTH
                 ) -> tuple[list[Path], list[GradingError]]:
    """Notebook files named directly, and those anywhere under named folders; and the files
    refused (links, special files, too deep). A missing path, a file that is not a notebook or a
    folder with nothing to grade is bad input, found before anything runs."""
    found: list[Path] = []
    refused: list[GradingError] = []
    for path in paths:
        if path.is_dir():
            inside, skipped = walk_notebooks(path, max_depth)
            if not inside and not skipped:
                raise GradingError(path, _("no notebooks (.ipynb) in this folder"))
            found += inside
            refused += skipped
        elif not os.path.lexists(path):
            raise GradingError(path, _("no such file or folder"))
        elif path.suffix != ".ipynb":
            raise GradingError(path, _(NOT_A_NOTEBOOK))
        else:  # named directly (perhaps by a shell glob over the students' folders): checked too
            problem = refusal(path, os.lstat(path))
            if problem is None:
                found.append(path)
            else:
                refused.append(Refused(path, problem))
    return list(dict.fromkeys(found)), refused


# --------------------------------------------------------------------------------------------
# Reading one notebook


def read_notebook(path: str | os.PathLike, *, max_bytes: int = CEILING_BYTES,
                  max_cells: int = CEILING_CELLS):
    """Read a notebook (any format-4 minor version) or raise GradingError saying what is wrong.
    Only what grading needs is kept (see the module's docstring)."""
    path = Path(path)
    data = _notebook_bytes(path, min(max_bytes, CEILING_BYTES))
    if not data.strip():
        raise GradingError(path, _("empty file, not a notebook"))
    try:
        raw = _Parser(data, min(max_cells, CEILING_CELLS)).notebook()
    except _TooManyCells as exc:
        raise Refused(path, _("{count} cells or more, more than the {limit} a notebook may have "
                              "(--max-cells): not graded").format(
            count=exc.args[0], limit=min(max_cells, CEILING_CELLS))) from None
    except _Malformed as exc:
        raise GradingError(path, _(MALFORMED).format(why=exc)) from None
    except (ValueError, IndexError, RecursionError) as exc:
        # The parser's own words (byte offsets) stay English, as json's would.
        raise GradingError(path, _("not valid JSON ({why})").format(why=exc)) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) \
            or raw.get("nbformat") != 4:
        raise GradingError(path, _("JSON, but not a Jupyter notebook in format 4"))
    try:
        return _as_notebook(raw)
    except Exception as exc:  # noqa: BLE001 - any malformed structure reads as one line, never a traceback
        raise GradingError(path, _(MALFORMED).format(why=exc)) from None


def _notebook_bytes(path: Path, max_bytes: int) -> bytes:
    """The file's bytes: opened without following a link and without blocking (a FIFO), checked to
    be a regular file of at most `max_bytes`, read no further than that."""
    if path.suffix != ".ipynb":
        if not os.path.lexists(path):
            raise GradingError(path, _(NO_SUCH_FILE))
        if path.is_dir():
            raise GradingError(path, _(A_FOLDER))
        raise GradingError(path, _(NOT_A_NOTEBOOK))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise GradingError(path, _(NO_SUCH_FILE)) from None
    except OSError as exc:
        if os.path.islink(path):
            raise Refused(path, refusal(path, os.lstat(path))) from None
        raise GradingError(path, _(CANNOT_READ).format(why=exc.strerror)) from None
    with os.fdopen(fd, "rb") as stream:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise GradingError(path, _(A_FOLDER))
        problem = refusal(path, st, one_name=False) or too_big(st, max_bytes)
        if problem:
            raise Refused(path, problem)
        data = stream.read(st.st_size + 1)
    if len(data) > max_bytes:  # it grew since fstat
        raise Refused(path, _("larger than the {limit} MiB a notebook may be (--max-size): not "
                              "graded").format(limit=f"{max_bytes / 2**20:g}"))
    return data


def _as_notebook(raw: dict) -> Node:
    nb = as_node(raw)
    if not isinstance(nb.setdefault("metadata", Node()), dict):
        raise ValueError("metadata that is not a mapping")
    for cell in nb.cells:
        if not isinstance(cell, dict):
            raise ValueError("a cell that is not a mapping")
        source = cell.get("source")
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            cell["source"] = "".join(source)
        if cell.get("cell_type") not in ("code", "markdown", "raw") or \
                not isinstance(cell.get("source"), str):
            raise ValueError("a cell without a type or source")
        if not isinstance(cell.setdefault("metadata", Node()), dict):
            raise ValueError("cell metadata that is not a mapping")
    return nb


class _TooManyCells(Exception):
    pass


class _Malformed(ValueError):
    """Valid JSON perhaps, but not what a notebook holds where it holds it."""


_WHITESPACE = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCALAR = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
# A string, or one bracket: what stepping over a value has to look at.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")
_NOTEBOOK_KEYS = {"cells", "metadata", "nbformat", "nbformat_minor"}
_NOTEBOOK_METADATA = {"course", "kernelspec", "language_info"}
_CELL_KEYS = {"cell_type", "source", "id", "metadata"}
_CELL_METADATA = {"nbgrader"}
_SMALL = 64 * 2**10  # bytes a kept piece of metadata may have
_SMALL_CONTAINERS = 256  # arrays and objects a kept piece of metadata may have


class _Parser:
    """Standard JSON, parsed from the file's bytes for the keys grading needs only. Kept values
    are decoded by the json module (strictly, UTF-8 included); the others are stepped over by
    their brackets and strings, building nothing and never decoded (they are not checked beyond
    their brackets matching). UTF-8 never puts a quote, backslash or bracket byte inside a
    character, so stepping over bytes is stepping over characters."""

    def __init__(self, data: bytes, max_cells: int):
        self.data = data
        self.max_cells = max_cells

    def notebook(self) -> Any:
        pos = self._ws(0)
        if self._at(pos) != b"{":
            value, end = self._kept(pos)  # not a notebook: the caller says so
        else:
            value, end = self._object(pos, self._notebook_member)
        if self._ws(end) != len(self.data):
            raise ValueError(f"extra data at byte {end}")
        return value

    def _notebook_member(self, key: str, pos: int) -> tuple[Any, int]:
        if key == "cells" and self._at(pos) == b"[":
            return self._array(pos, self._cell)
        if key == "metadata" and self._at(pos) == b"{":
            return self._object(pos, lambda k, p: self._kept(p) if k in _NOTEBOOK_METADATA
                                else self._skipped(p))
        if key in _NOTEBOOK_KEYS:
            return self._kept(pos)
        return self._skipped(pos)

    def _cell(self, index: int, pos: int) -> tuple[Any, int]:
        if index >= self.max_cells:
            raise _TooManyCells(index + 1)
        if self._at(pos) != b"{":
            return self._kept(pos)
        return self._object(pos, self._cell_member)

    def _cell_member(self, key: str, pos: int) -> tuple[Any, int]:
        if key == "metadata" and self._at(pos) == b"{":
            return self._object(pos, lambda k, p: self._kept(p) if k in _CELL_METADATA
                                else self._skipped(p))
        if key == "source":  # a string or a list of strings, as long as the file allows
            return self._kept(pos, len(self.data), 1)
        if key in _CELL_KEYS:
            return self._kept(pos)
        return self._skipped(pos)

    # -- the pieces -------------------------------------------------------------------------

    def _at(self, pos: int) -> bytes:
        return self.data[pos:pos + 1]

    def _ws(self, pos: int) -> int:
        return _WHITESPACE.match(self.data, pos).end()

    def _object(self, pos: int, member) -> tuple[dict, int]:
        """The object at `pos` (a "{"): member(key, value_pos) -> (value or _SKIPPED, end)."""
        result: dict = {}
        pos = self._ws(pos + 1)
        if self._at(pos) == b"}":
            return result, pos + 1
        while True:
            key = _STRING.match(self.data, pos)
            if key is None:
                raise ValueError(f"expected a key at byte {pos}")
            pos = self._ws(key.end())
            if self._at(pos) != b":":
                raise ValueError(f"expected ':' at byte {pos}")
            name = json.loads(key.group())
            value, pos = member(name, self._ws(pos + 1))
            if value is not _SKIPPED:
                result[name] = value
            pos = self._ws(pos)
            if self._at(pos) == b"}":
                return result, pos + 1
            if self._at(pos) != b",":
                raise ValueError(f"expected ',' or '}}' at byte {pos}")
            pos = self._ws(pos + 1)

    def _array(self, pos: int, item) -> tuple[list, int]:
        result: list = []
        pos = self._ws(pos + 1)
        if self._at(pos) == b"]":
            return result, pos + 1
        while True:
            value, pos = item(len(result), pos)
            result.append(value)
            pos = self._ws(pos)
            if self._at(pos) == b"]":
                return result, pos + 1
            if self._at(pos) != b",":
                raise ValueError(f"expected ',' or ']' at byte {pos}")
            pos = self._ws(pos + 1)

    def _kept(self, pos: int, max_bytes: int = _SMALL, max_containers: int = _SMALL_CONTAINERS
              ) -> tuple[Any, int]:
        """The value at `pos`, decoded, if it is small enough to build."""
        end, containers = self._extent(pos)
        if end - pos > max_bytes or containers > max_containers:
            raise _Malformed(f"a value too large or too deeply built at byte {pos}")
        return json.loads(self.data[pos:end]), end

    def _skipped(self, pos: int) -> tuple[Any, int]:
        return _SKIPPED, self._extent(pos)[0]

    def _extent(self, pos: int) -> tuple[int, int]:
        """Where the value at `pos` ends, and how many arrays and objects it holds."""
        first = self._at(pos)
        if first == b'"':
            string = _STRING.match(self.data, pos)
            if string is None:
                raise ValueError(f"unclosed string at byte {pos}")
            return string.end(), 0
        if first not in (b"[", b"{"):
            scalar = _SCALAR.match(self.data, pos)
            if scalar is None:
                raise ValueError(f"expected a value at byte {pos}")
            return scalar.end(), 0
        data, depth, containers = self.data, 0, 0
        for token in _TOKEN.finditer(data, pos):
            byte = data[token.start()]
            if byte in _OPEN:
                depth += 1
                containers += 1
            elif byte in _CLOSE:
                depth -= 1
                if depth == 0:
                    return token.end(), containers
        raise ValueError(f"unclosed {first.decode()!r} at byte {pos}")


_SKIPPED = object()


def grade_id(cell) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    gid = meta.get("grade_id") if isinstance(meta, dict) else None
    return gid if isinstance(gid, str) else None


def is_test_cell(cell) -> bool:
    """An autograded test cell: a code cell nbgrader grades that is not an answer cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return (cell.cell_type == "code" and isinstance(meta, dict) and bool(meta.get("grade"))
            and not meta.get("solution") and grade_id(cell) is not None)
