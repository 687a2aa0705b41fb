"""`python -m checks status` and `python -m checks grade`: bad input, a class folder with a hanging
and a broken submission, progress of a fresh release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from nbformat.v4 import new_notebook

from checks.cli import main

from . import submissions as sub

TIMEOUT = 5  # seconds per cell for the hanging notebook; the imports cell needs about 2


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert "Traceback" not in text
    return lines[0]


def exit_code(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exc:  # argparse's usage errors
        return exc.code


def release_copy(path):
    return sub.write(sub.release(), path)


BAD_INPUT = {  # case: (arguments, with {d} for the test's folder; expected words)
    "missing file": ("grade {d}/missing.ipynb", "no such file"),
    "not a notebook": ("grade {d}/notes.txt", "not a notebook"),
    "broken JSON": ("grade {d}/broken.ipynb", "not valid JSON"),
    "empty file": ("grade {d}/empty.ipynb", "empty file"),
    "unknown chapter": ("grade {d}/99_unknown.ipynb", "unknown chapter '99_unknown'"),
    "zero timeout": ("grade {d}/01_notation.ipynb --timeout 0", "--timeout"),
    "json over input": ("grade {d}/01_notation.ipynb --json {d}/01_notation.ipynb",
                        "would overwrite"),
    "folder without notebooks": ("grade {d}/empty_folder", "no notebooks"),
    "status of a missing folder": ("status {d}/missing", "no such folder"),
    "status without chapters": ("status {d}/empty_folder", "no chapter notebooks"),
    "unknown command": ("frobnicate", "invalid choice"),
}


@pytest.mark.parametrize("args, problem", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_gets_one_line_and_status_2(tmp_path, capsys, args, problem):
    (tmp_path / "notes.txt").write_text("not a notebook")
    (tmp_path / "broken.ipynb").write_text('{"cells": [')
    (tmp_path / "empty.ipynb").write_text("")
    (tmp_path / "empty_folder").mkdir()
    # No answer cells either: a notebook with chapter 01's cells is graded as chapter 01.
    sub.write(new_notebook(metadata={"course": {"chapter": "99_unknown"}}),
              tmp_path / "99_unknown.ipynb")
    release_copy(tmp_path / "01_notation.ipynb")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}

    assert exit_code(args.format(d=tmp_path).split()) == 2
    captured = capsys.readouterr()
    assert problem in one_line(captured.err)
    assert captured.out == ""
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_grade_a_class_folder_past_a_hanging_and_a_broken_submission(tmp_path):
    """`python -m checks grade` as a process: the hanging notebook scores zero within its time
    limit, the broken one costs one line, the solution still gets full marks, inputs unchanged."""
    class_dir = tmp_path / "class"
    sub.write(sub.prepend(sub.release(), "head_dim", "while True: pass"),
              class_dir / "alice" / "01_notation.ipynb")
    (class_dir / "bob").mkdir()
    (class_dir / "bob" / "01_notation.ipynb").write_text('{"cells": [')
    (class_dir / "alice" / ".ipynb_checkpoints").mkdir()
    (class_dir / "alice" / ".ipynb_checkpoints" / "01_notation-checkpoint.ipynb").write_text("")
    sub.write(sub.solution(), class_dir / "carol" / "01_notation.ipynb")
    before = {p: p.read_bytes() for p in class_dir.rglob("*") if p.is_file()}
    report = tmp_path / "grades.json"

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(class_dir), "--timeout", str(TIMEOUT),
         "--json", str(report)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    elapsed = time.monotonic() - started

    assert done.returncode == 2, done.stderr
    assert "bob" in one_line(done.stderr) and "not valid JSON" in done.stderr
    assert elapsed < 120
    assert "0/6 points" in done.stdout and "6/6 points" in done.stdout
    assert f"longer than the {TIMEOUT} s limit" in done.stdout
    assert "total: 6/12 points in 2 notebooks" in done.stdout

    data = json.loads(report.read_text())
    alice, carol = data["notebooks"]
    assert alice["path"].endswith("alice/01_notation.ipynb") and alice["points"] == 0
    assert "limit" in alice["error"] and alice["seconds"] < TIMEOUT + 60
    assert {e["status"] for e in alice["exercises"]} == {"error"}
    assert carol["points"] == carol["max_points"] == 6 and carol["error"] is None
    assert [e["path"].endswith("bob/01_notation.ipynb") for e in data["errors"]] == [True]
    assert (data["points"], data["max_points"]) == (6, 12)
    assert {p: p.read_bytes() for p in class_dir.rglob("*") if p.is_file()} == before


def test_status_of_a_fresh_release_is_zero_with_every_exercise_listed(tmp_path, capsys):
    release_copy(tmp_path / "01_notation" / "01_notation.ipynb")
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("01_notation"))
    assert "0/4" in row
    assert all(name in row for name in sub.EXERCISES_01)
