"""What counts as a submission, whose it is, and the caps (issue 18, items 1, 2, 3 and 6's caps;
issue 19's student names and wrong-chapter notebooks), on real files on disk: the edge cases of
tests/support/adversarial_edges.py found by the Python API (no worker), and a class holding all
of them graded by `python -m checks grade` (a subprocess, workers started), where the victims
keep their exact scores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from checks.grader import identify, read, tripwire
from checks.grader.results import GradingError, NotebookResult, Refused, printable

from ..support import adversarial, adversarial_edges as edges
from ..support import submissions as sub

ROOT = os.geteuid() == 0  # a device node needs root to be made


def _edges(where: adversarial.Where) -> list[edges.EdgeCase]:
    cases = [c for c in [*edges.EDGES, edges.DEEP_1100] if ROOT or c.name != "c9_device"]
    for case in cases:
        case.write(where)
    return cases


def _multi(folder: Path) -> list[edges.Multi]:
    for case in edges.MULTI:
        (folder / case.name).mkdir(parents=True)
        case.make(folder / case.name)
    return edges.MULTI


def _victim(where: adversarial.Where) -> None:
    sub.write(adversarial.sol(), where.victim)


@pytest.fixture(scope="module")
def klass():
    """A class folder (the README's layout: grading/submitted/<student>/...) with every edge
    case and every multi-outcome case, the victim the links aim at, and a notebook saved under
    another chapter's name. Not under pytest's temporary folders: their clean-up recurses, and
    the folders nested 1,100 deep would crash it (this fixture flattens them first)."""
    tmp = Path(tempfile.mkdtemp(prefix="checks-edges-"))
    folder = tmp / "grading" / "submitted"
    where = adversarial.Where(folder, identify.SOURCE_DIR, tmp / "marker")
    _victim(where)
    cases = _edges(where)
    multi = _multi(folder)
    sub.write(adversarial.sol(), folder / "renamer" / "04_self_attention.ipynb")
    try:
        yield tmp, folder, cases, multi
    finally:
        edges.flatten_deep(folder / "c9_nested_1100_deep")
        shutil.rmtree(tmp, ignore_errors=True)


def _under(path: str, folder: Path) -> tuple[str, ...]:
    return Path(path).relative_to(folder).parts


# --------------------------------------------------------------------------------------------
# Finding (the Python API, no worker)


def test_each_edge_is_refused_in_one_line_or_found_with_its_student(klass):
    tmp, folder, cases, _ = klass
    found = identify.find_submissions([folder], read.Caps(max_notebooks=3))
    refused: dict[str, list[str]] = {}
    for problem in found.refused:
        refused.setdefault(_under(problem.path, folder)[0], []).append(problem.problem)
    students = {printable(os.fsdecode(s.path)): s.student for s in found.submissions}
    for case in cases:
        if case.points is None:
            assert len(refused.get(case.name, [])) == 1, (case.name, refused.get(case.name))
            line = refused[case.name][0]
            assert case.error in line and "\n" not in line and line.isprintable(), line
        else:
            assert case.name not in refused, refused[case.name]
            mine = [s for p, s in students.items() if _under(p, folder)[0] == case.name]
            assert mine == [case.student], (case.name, mine)
    assert "bob" not in students.values()  # submitted/bob/ nested in a folder names nobody
    assert all(s is not None and s.isprintable() for s in students.values())


def test_multi_outcome_folders(klass):
    """A duplicate (student, chapter) is one record; 500 notebooks are cut to the cap."""
    tmp, folder, _, multi = klass
    found = identify.find_submissions([folder], read.Caps(max_notebooks=3))
    graded = {Path(os.fsdecode(s.path)).relative_to(folder).as_posix() for s in found.submissions}
    lines = [(Path(p.path).relative_to(folder).as_posix(), p.problem) for p in found.refused]
    for case in multi:
        mine = {g.removeprefix(case.name + "/") for g in graded if g.startswith(case.name + "/")}
        assert mine == set(case.graded), (case.name, mine)
        for where, words in case.refused.items():
            target = f"{case.name}/{where}".rstrip("/")
            assert any(p == target and words in text for p, text in lines), (target, lines)


def test_finding_as_one_student_of_a_course_folder(klass):
    """The root may be the course folder (holding submitted/), submitted/ itself, a folder
    inside that layout (one student's, or their assignment's), or a file named directly
    (nbgrader's layout read from its path)."""
    tmp, folder, _, _ = klass
    course = folder.parent
    a = identify.find_submissions([course], read.Caps(max_notebooks=3))
    b = identify.find_submissions([folder], read.Caps(max_notebooks=3))
    assert [(s.path, s.student) for s in a.submissions] == [
        (s.path, s.student) for s in b.submissions]
    direct = folder / "c9_zz_victim" / "01_notation" / "01_notation.ipynb"
    for inside in (folder / "c9_zz_victim", folder / "c9_zz_victim" / "01_notation"):
        alone = identify.find_submissions([inside])
        assert [(s.path, s.student) for s in alone.submissions] == [(direct, "c9_zz_victim")]
    assert identify.student_of(direct) == "c9_zz_victim"
    nested = folder / "mallory" / "01_notation" / "submitted" / "bob" / "01_notation" / "x.ipynb"
    assert identify.student_of(nested) == "mallory"
    assert identify.student_of(nested, folder) == "mallory"
    assert identify.layout_warnings(nested, folder) and not identify.layout_warnings(direct)
    plain = tmp / "submissions" / "alice" / "01_notation.ipynb"
    assert identify.student_of(plain, tmp / "submissions") == "alice"
    assert identify.student_of(tmp / "submissions" / "loose.ipynb", tmp / "submissions") is None
    chapters = tmp / "notebooks"  # the learner's layout: chapters, not students
    assert identify.student_of(chapters / "01_notation" / "01_notation.ipynb", chapters) is None


def test_a_named_link_or_fifo_is_refused_and_nothing_blocks(klass):
    tmp, folder, _, _ = klass
    links = [folder / c / "01_notation" / "01_notation.ipynb"
             for c in ("c9_link_to_kmsg", "c9_link_to_source")] + [
        folder / "c9_fifo" / "01_notation.ipynb"]
    found, refused = read.notebooks_in(links)
    assert found == [] and len(refused) == 3
    for path in links:  # read directly (the API): refused, never opened through the link
        with pytest.raises(Refused):
            read.read_notebook(path)
    done = threading.Event()

    def hash_them():
        tripwire.Tripwire([*links, folder / "c9_zz_victim" / "01_notation" / "01_notation.ipynb"])
        done.set()

    threading.Thread(target=hash_them, daemon=True).start()
    assert done.wait(20), "the tripwire blocked on a link to /proc/kmsg or a FIFO"


def test_tripwire_still_sees_a_change(tmp_path):
    path = sub.write(adversarial.sol(), tmp_path / "01_notation.ipynb")
    wire = tripwire.Tripwire([path])
    assert wire.changed() == []
    path.write_text(path.read_text() + " ")
    assert wire.changed() == [path]


def test_only_what_grading_needs_is_kept(tmp_path):
    nb = json.loads(edges._text_of(adversarial.sol()))
    nb["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout",
                                  "text": ["x"] * 1000}]
    nb["cells"][0]["attachments"] = {"a.png": {"image/png": "AAAA" * 1000}}
    nb["cells"][0]["metadata"]["widgets"] = [[]] * 1000
    path = tmp_path / "01_notation.ipynb"
    path.write_text(json.dumps(nb))
    got = read.read_notebook(path)
    assert "outputs" not in got.cells[0] and "attachments" not in got.cells[0]
    assert set(got.cells[0].metadata) <= {"nbgrader"}
    assert [c.source for c in got.cells] == [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in nb["cells"]]
    assert identify.identify_chapter(got, path) == "01_notation"


def test_24_mib_of_empty_lists_stays_far_under_1_gib(tmp_path):
    """Read with the size cap raised above it (the Python API's ceiling): memory about the
    file's size, not the 1.4 GiB that building it took."""
    folder = tmp_path / "big"
    folder.mkdir()
    edges._huge_metadata()(None, folder)
    path = folder / "01_notation.ipynb"
    assert path.stat().st_size > 24 * 2**20
    code = ("import sys; from checks.grader import grading, read\n"
            "before = grading.peak_memory_mib()\n"
            "nb = read.read_notebook(sys.argv[1])\n"
            "print(len(nb.cells), before, grading.peak_memory_mib())\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=300)
    cells, before, after = done.stdout.split()
    print(f"\nreading 24 MiB of empty lists: peak {float(after):.0f} MiB "
          f"(imports {float(before):.0f} MiB)")
    assert int(cells) == len(adversarial.sol().cells)
    assert float(after) - float(before) < 100 and float(after) < 1024


def test_names_and_messages_are_printable_and_json_safe():
    name = os.fsdecode(b"/c/\xff\xfehw" + edges.FORGED_LINE.encode() + b".ipynb")
    result = NotebookResult(name, "01_notation", student=name, error="\x1b[2Kboom\r",
                            warnings=["\u202eevil"])
    text = json.dumps(result.to_dict(), ensure_ascii=False)
    text.encode("utf-8")  # never a UnicodeEncodeError
    assert "\x1b" not in text and "\r" not in text and "\\xff\\xfe" in result.path
    assert result.error == "\\x1b[2Kboom\\r" and result.warnings == ["\\u202eevil"]
    problem = GradingError(name, "bad \x1b")
    assert str(problem).isprintable()


def test_a_cap_above_the_ceiling_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "checks", "grade", str(tmp_path),
                           "--max-size", "1G"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--max-size" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------
# The class graded by `python -m checks grade` (workers)


@pytest.fixture(scope="module")
def graded(klass):
    tmp, folder, cases, multi = klass
    report = tmp / "grades.json"
    before = {p: p.read_bytes() for p in edges.regular_notebooks(folder)}
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(folder.parent), "--json", str(report),
         "--jobs", "2", "--timeout", "60", "--max-notebooks", "3"],
        capture_output=True, timeout=1500, cwd=tmp, env=dict(os.environ, OMP_NUM_THREADS="1"))
    after = {p: p.read_bytes() for p in edges.regular_notebooks(folder)}
    data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
    return folder, cases, multi, done, data, before == after


@pytest.mark.grader_workers
def test_the_class_is_graded_past_every_edge(graded):
    folder, cases, multi, done, data, unchanged = graded
    err = done.stderr.decode("utf-8", "replace")
    assert data is not None, err[-3000:]
    assert done.returncode == 2, err[-3000:]  # refusals and a notebook that does not count
    assert unchanged
    records = {_under(nb["path"], folder)[0]: nb for nb in data["notebooks"]}
    for case in cases:
        if case.points is None:
            continue
        nb = records[case.name]
        assert (nb["points"], nb["chapter"], nb["student"]) == (
            case.points, case.chapter, case.student), (case.name, nb)
        statuses = {e["name"]: e["status"] for e in nb["exercises"]}
        assert {k: statuses[k] for k in case.statuses} == case.statuses
        assert not case.warning or any(case.warning in w for w in nb["warnings"])
    assert records["c9_zz_victim"]["points"] == records["c9_zz_victim"]["max_points"] == 6
    assert all(nb["student"] != "bob" for nb in data["notebooks"])
    by_path = {Path(nb["path"]).relative_to(folder).as_posix(): nb for nb in data["notebooks"]}
    for case in multi:
        for where, points in case.graded.items():
            assert by_path[f"{case.name}/{where}"]["points"] == points
    errors = {Path(e["path"]).relative_to(folder).as_posix(): e["error"]
              for e in data["errors"]}
    for case in cases:
        if case.points is None:
            assert any(p.split("/")[0] == case.name and case.error in e
                       for p, e in errors.items()), case.name
    assert data["grader_memory_mib"] < 1024


@pytest.mark.grader_workers
def test_nothing_raw_reaches_stdout(graded):
    """No ESC, CR or byte that is not UTF-8 in the tables: the forged line is shown escaped,
    never drawn; the refusals' lines on stderr too."""
    _, _, _, done, data, _ = graded
    assert b"\x1b" not in done.stdout and b"\r" not in done.stdout
    done.stdout.decode("utf-8")  # strictly
    assert b"\\x1b[2K\\r  head_dim" in done.stdout
    assert b"\\xff\\xfe homework.ipynb" in done.stdout
    refusals = [line for line in done.stderr.splitlines() if line.startswith(b"python -m checks:")]
    assert refusals and all(b"\x1b" not in line and b"\r" not in line for line in refusals)


@pytest.mark.grader_workers
def test_nothing_raw_reaches_stderr(graded):
    _, _, _, done, data, _ = graded
    assert b"\x1b" not in done.stderr and b"\r" not in done.stderr
    done.stderr.decode("utf-8")


@pytest.mark.grader_workers
def test_a_notebook_named_as_another_chapter_is_shown_but_not_counted(graded):
    folder, _, _, done, data, _ = graded
    nb = next(nb for nb in data["notebooks"] if _under(nb["path"], folder)[0] == "renamer")
    assert nb["chapter"] == "01_notation" and nb["points"] == 6
    assert nb["counted"] is False and "not counted" in nb["not_counted"]
    counted = [r for r in data["notebooks"] if r["counted"]]
    assert data["points"] == sum(r["points"] for r in counted)


@pytest.mark.grader_workers
def test_the_python_api_on_the_same_files(klass):
    """grade_notebook on a name that is not UTF-8 (its result is JSON-safe) and on links
    (refused before anything runs)."""
    from checks.grader.grading import grade_notebook

    _, folder, _, _ = klass
    name = next(p for p in edges.regular_notebooks(folder / "c9_name_not_utf8"))
    result = grade_notebook(name)
    assert result.points == result.max_points == 6
    json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")
    for case in ("c9_link_to_source", "c9_link_to_classmate"):
        with pytest.raises(Refused, match="symbolic link"):
            grade_notebook(folder / case / "01_notation" / "01_notation.ipynb")
