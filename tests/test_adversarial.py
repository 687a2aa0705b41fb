"""The catalogue of broken and adversarial submissions (tests/adversarial.py), graded in one run
of `python -m checks grade` over a class folder: every case gets exactly its points, the folder
is graded past every failure, and no protected file changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import adversarial

TIMEOUT = 10  # seconds per cell: the infinite loop costs this much


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adversarial")
    source = tmp / "solutions"
    for chapter in ("01_notation", "04_self_attention"):
        shutil.copytree(adversarial.REPO / "solutions" / chapter, source / chapter)
    folder = tmp / "class"
    cases = adversarial.write_catalogue(folder, source)
    before = adversarial.protected_bytes(source, folder)
    report = tmp / "grades.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(folder), "--source", str(source),
         "--timeout", str(TIMEOUT), "--json", str(report)],
        capture_output=True, text=True, timeout=1800, cwd=tmp,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    elapsed = time.monotonic() - started
    after = adversarial.protected_bytes(source, folder)
    data = json.loads(report.read_text()) if report.is_file() else None
    return cases, done, data, before, after, elapsed, folder


def case_of(path: str, folder: Path) -> str:
    return Path(path).relative_to(folder).parts[0]


def test_the_grader_survives_and_reports_every_notebook(graded):
    cases, done, data, before, after, elapsed, folder = graded
    assert data is not None, done.stderr
    assert done.returncode == 2  # two files cannot be graded
    problems = {case_of(e["path"], folder): e["error"] for e in data["errors"]}
    assert set(problems) == {name for name, c in cases.items() if c.points is None}
    for name, message in problems.items():
        assert cases[name].error in message and "\n" not in message
    assert len(done.stderr.strip().splitlines()) == len(problems), done.stderr
    graded_cases = {case_of(nb["path"], folder) for nb in data["notebooks"]}
    assert graded_cases == {n for n, c in cases.items() if c.points is not None}
    print(f"\n{len(data['notebooks'])} notebooks in {elapsed:.0f} s")


def test_protected_files_are_unchanged(graded):
    _, _, _, before, after, _, _ = graded
    assert after == before


def test_every_case_gets_its_points(graded):
    cases, done, data, *_, folder = graded
    results = {case_of(nb["path"], folder): nb for nb in data["notebooks"]}
    wrong = []
    for name, case in cases.items():
        if case.points is None:
            continue
        nb = results[name]
        statuses = {e["name"]: e["status"] for e in nb["exercises"]}
        ok = (nb["points"] == case.points and nb["chapter"] == case.chapter
              and case.error in (nb["error"] or "")
              and all(statuses.get(k) == v for k, v in case.statuses.items()))
        if not ok:
            wrong.append(f"{name}: expected {case.points} ({case.why}), got {nb['points']} "
                         f"{statuses} error={nb['error']!r} "
                         f"{[e['message'][:100] for e in nb['exercises']]}")
    assert not wrong, "\n".join(wrong)
