"""Two nbgrader preprocessors the course's nbgrader_config.py puts in nbgrader's pipelines.

- `HideTestCode` (generate_feedback): a test cell that raises an ordinary exception (the
  timeout's KeyboardInterrupt, a NameError from a renamed function, a hidden `assert`) gets
  IPython's traceback, and that prints the lines around the failing one: the instructor's cell,
  `### BEGIN HIDDEN TESTS` and the hidden assertions included, and frames of `checks/nbNN/`.
  nbgrader's ClearHiddenTests clears the cell's source, not its outputs. This keeps, of each
  traceback in a test cell, the exception's type and message and the frames in the learner's own
  cells (where the loop spun or the error was raised), and drops every other frame. Elsewhere only
  frames inside the course's package are dropped. The autograded notebook, the instructor's copy,
  keeps the whole traceback.
  Every output of every cell (the learner's too) also loses each line that quotes a hidden
  test's line, as it is or inside a string's repr: a learner's cell that prints IPython's input
  history (`In`, `_ih`, `Out`, `%history`) after the tests ran showed them (round five). A copy
  the learner's code encodes first (reversed, base64) is not recognised.
- `RestoreMissingCells` (autograde): nbgrader 0.9.6's OverwriteCells, with the course's
  `add_missing_cells = True`, stops autograding a submission (the export then shows 0.0) when
  - a cell's grade id is not in the gradebook (an answer cell renamed): it removes the id but
    keeps the cell's other nbgrader metadata, and `add_missing_grade_cells` raises
    `KeyError: 'grade_id'` reading it (CheckCellMetadata would reject the cell next);
  - a test cell is missing and so is the source cell before it (an answer cell deleted with its
    test cell): `add_missing_grade_cells` raises `KeyError: '<answer id>'`.
  This subclass grades a cell the gradebook does not know as an ordinary cell (its code runs, it
  scores nothing) and puts each missing test cell back after the nearest earlier source cell the
  submission still has (at the top when there is none).
"""

from __future__ import annotations

import os
import re

from nbconvert.preprocessors import Preprocessor
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.api import MissingEntry
from nbgrader.preprocessors import OverwriteCells
from traitlets import Bool, Unicode

#: What a traceback shows where it dropped frames (one line per run of dropped frames).
HIDDEN_NOTE = "(the test's code is not shown)"
#: What an output shows in place of a line that quotes a hidden test (IPython's input history
#: printed by a learner's cell); hidden lines shorter than MIN_HIDDEN are not looked for.
HISTORY_NOTE = "(a line that quotes a hidden test is not shown)"
MIN_HIDDEN = 8

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# IPython's frame headers: "Cell In[7], line 3" (IPython 8.4+), "Input In [7], in <cell line: 3>()"
# (8.0-8.3), "File /path/x.py:12, in f(...)" (8.x), "/path/x.py in f(...)" (7.x).
_CELL_FRAME = re.compile(r"^\s*(?:Cell In\s*\[(\d+)\]|Input In\s*\[(\d+)\])")
_FILE_FRAME = re.compile(r"^\s*(?:File\s+\S.*?(?::\d+)?, in |\S+\.py in )")
_FILE_PATH = re.compile(r"^\s*(?:File\s+)?(\S.*?\.py)")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE_FILE = re.compile(r"(^|[/\\])checks[/\\]")


def _plain(text: str) -> str:
    return _ANSI.sub("", text)


def _is_test_cell(cell: NotebookNode) -> bool:
    return bool(utils.is_grade(cell)) and not utils.is_solution(cell)


def _in_course_package(frame: str) -> bool:
    found = _FILE_PATH.match(frame)
    if not found:
        return False
    path = found.group(1)
    return (os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep)
            or bool(_PACKAGE_FILE.search(path)))


class HideTestCode(Preprocessor):
    """Strip code context from tracebacks in feedback: see the module's docstring.

    Put it before nbgrader's ClearHiddenTests: it reads a test cell's hidden lines from the
    source to drop them from the cell's streams too (a warning prints the line that raised it).
    """

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off by default
    begin_hidden = Unicode("BEGIN HIDDEN TESTS").tag(config=True)
    end_hidden = Unicode("END HIDDEN TESTS").tag(config=True)

    def preprocess(self, nb, resources):
        # "Cell In[7]" is the cell that ran seventh: the learner's own, or a test cell.
        self._test_counts = {cell.get("execution_count") for cell in nb.cells
                             if cell.cell_type == "code" and _is_test_cell(cell)}
        # Every hidden line of the notebook, and how it looks inside a string's repr: a learner's
        # cell that prints IPython's input history (In, _ih, Out, %history) after the tests ran
        # prints them, one by one or inside a list's repr.
        lines = {line for cell in nb.cells if cell.cell_type == "code" and _is_test_cell(cell)
                 for line in self._hidden_lines(cell.source)}
        self._hidden_anywhere = {form for line in lines if len(line) >= MIN_HIDDEN
                                 for form in (line, repr(line)[1:-1],
                                              line.encode("unicode_escape").decode("ascii"))}
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        test = _is_test_cell(cell)
        hidden = self._hidden_lines(cell.source) if test else set()
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = self._visible_traceback(output.get("traceback", []), test)
            elif output.get("output_type") == "stream" and hidden:
                lines = output.get("text", "").splitlines(keepends=True)
                output["text"] = "".join(line for line in lines
                                         if _plain(line).strip() not in hidden)
            self._scrub(output)
        return cell, resources

    def _scrub(self, output) -> None:
        """Replace each line of an output (stream, result, display, error) that quotes a hidden
        test's line with HISTORY_NOTE."""
        if output.get("output_type") == "stream":
            output["text"] = self._scrubbed(output.get("text", ""))
        elif output.get("output_type") == "error":
            output["evalue"] = self._scrubbed(output.get("evalue", ""))
            output["traceback"] = [self._scrubbed(entry) for entry in output.get("traceback", [])]
        for mime, value in (output.get("data") or {}).items():
            if mime.startswith("text/") or mime in ("application/json", "image/svg+xml"):
                text = "".join(value) if isinstance(value, list) else value
                if isinstance(text, str):
                    output["data"][mime] = self._scrubbed(text)

    def _scrubbed(self, text: str) -> str:
        if not self._hidden_anywhere or not text:
            return text
        lines = text.splitlines(keepends=True)
        return "".join(
            HISTORY_NOTE + ("\n" if line.endswith("\n") else "")
            if any(hidden in _plain(line) for hidden in self._hidden_anywhere) else line
            for line in lines)

    def _hidden_lines(self, source: str) -> set[str]:
        """The non-blank lines of the cell's hidden-test regions, markers included."""
        found, inside = set(), False
        for line in source.splitlines():
            if self.begin_hidden in line:
                inside = True
            if inside and line.strip():
                found.add(line.strip())
            if self.end_hidden in line:
                inside = False
        return found

    def _visible_traceback(self, traceback: list[str], test: bool) -> list[str]:
        """The traceback without the frames a learner must not see, each run of them replaced by
        one note. A checker's own diagnosis (`_render_traceback_`) has no frames: kept as it is."""
        kept: list[str] = []
        for entry in traceback:
            if self._shown(_plain(entry), test):
                kept.append(entry)
            elif not kept or kept[-1] != HIDDEN_NOTE:
                kept.append(HIDDEN_NOTE)
        return kept

    def _shown(self, entry: str, test: bool) -> bool:
        cell = _CELL_FRAME.match(entry)
        if cell:
            count = int(cell.group(1) or cell.group(2))
            return count not in self._test_counts
        if _FILE_FRAME.match(entry):
            # In a test cell every file frame is the checker's or a library's, called by it.
            return not test and not _in_course_package(entry)
        return True  # the header, the exception's line, "During handling of the above ..."


class RestoreMissingCells(OverwriteCells):
    """OverwriteCells whose `add_missing_cells` survives renamed and deleted cells (see the
    module's docstring). Configured in place of OverwriteCells in Autograde's sanitize step; the
    `OverwriteCells.*` settings apply to it."""

    def preprocess_cell(self, cell, resources, index):
        meta = cell.metadata.get("nbgrader")
        if meta is not None and not self._in_gradebook(meta.get("grade_id")):
            self.log.warning("Cell %r is not in the gradebook: graded as an ordinary cell",
                             meta.get("grade_id"))
            del cell.metadata["nbgrader"]
            return cell, resources
        return super().preprocess_cell(cell, resources, index)

    def _in_gradebook(self, grade_id) -> bool:
        if not grade_id:
            return False
        try:
            self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
        except MissingEntry:
            return False
        return True

    def add_missing_grade_cells(self, nb, resources):
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        source_ids = [cell.name for cell in source_nb.source_cells]
        source_by_id = {cell.name: cell for cell in source_nb.source_cells}
        solution_ids = {cell.name for cell in source_nb.solution_cells}
        for grade_cell in source_nb.grade_cells:
            present = self._positions(nb)
            if grade_cell.name in present:
                continue
            self.log.warning("Missing grade cell %s encountered, adding to notebook",
                             grade_cell.name)
            cell = self.missing_cell_transform(source_by_id[grade_cell.name],
                                               grade_cell.max_score,
                                               is_solution=grade_cell.name in solution_ids)
            nb.cells.insert(self._insert_at(grade_cell.name, source_ids, present), cell)
        return nb, resources

    @staticmethod
    def _positions(nb) -> dict[str, int]:
        """grade id -> index, for every cell of the submission that (still) has one."""
        return {cell.metadata["nbgrader"]["grade_id"]: index
                for index, cell in enumerate(nb.cells)
                if cell.metadata.get("nbgrader", {}).get("grade_id")}

    @staticmethod
    def _insert_at(grade_id: str, source_ids: list[str], present: dict[str, int]) -> int:
        """Right after the nearest source cell before `grade_id` that the submission has."""
        for earlier in reversed(source_ids[:source_ids.index(grade_id)]):
            if earlier in present:
                return present[earlier] + 1
        return 0
