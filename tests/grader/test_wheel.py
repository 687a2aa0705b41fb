"""The course installed as a wheel (Colab, a Docker image, any `pip install`) and graded as root:
the package lives in site-packages, next to torch. The walls hide only the course's own package
(hiding the folder above it hid torch: every notebook scored 0 with "No module named
'torch.utils.serialization'"); a worker's self-test before grading turns an environment that
cannot grade into one line and a non-zero exit, with no score; and `checks status` works
without `solutions/`, on the visible checks of the learner's own notebooks.

Slow: the wheel is built from this clone and installed with torch into a fresh virtual
environment (packages from pip's configured index, as tests/course/test_install.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..support import submissions as sub

pytestmark = [pytest.mark.slow, pytest.mark.grader_workers]

REPO = sub.REPO
CH01, CH04 = "01_notation", "04_self_attention"


def _run(argv, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(map(str, argv)), capture_output=True, text=True,
                          env=dict(env, OMP_NUM_THREADS="1"), **kwargs)


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """The Python of a fresh environment with torch and the course's wheel (nothing of this
    clone on its path)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    for name in ("checks", "pyproject.toml", "README.md", "constraints.txt"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copyfile
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (REPO / name).is_dir() else {}))
    done = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-q", source, "-w", work / "dist"], timeout=600)
    assert done.returncode == 0, done.stderr
    (wheel,) = (work / "dist").glob("*.whl")
    base = getattr(sys, "_base_executable", sys.executable)
    done = _run([base, "-m", "venv", "--system-site-packages", work / "env"], timeout=300)
    assert done.returncode == 0, done.stderr
    python = work / "env" / "bin" / "python"
    version = torch.__version__.split("+")[0]
    done = _run([python, "-m", "pip", "install", "-q", f"torch=={version}", "-c",
                 REPO / "constraints.txt", wheel], timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    where = _run([python, "-c", "import checks; print(checks.__file__)"], cwd=work)
    assert "site-packages" in where.stdout and str(REPO) not in where.stdout
    return python


def test_a_wheel_install_grades_as_root_with_full_marks(python, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the walls are built by root only")
    notebook = sub.write(sub.solution(), tmp_path / "alice" / f"{CH01}.ipynb")
    report = tmp_path / "grades.json"
    done = _run([python, "-m", "checks", "grade", notebook, "--source", REPO / "solutions",
                 "--json", report], cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = json.loads(report.read_text())["notebooks"]
    assert record["points"] == 6 and record["isolation"] == "namespaces", record
    assert "worker process died" not in done.stdout + done.stderr


def test_an_environment_that_cannot_grade_is_one_line_and_no_score(python, tmp_path):
    """The worker's self-test fails (here: site-packages hidden from the worker by --hide): one
    line names the environment as the cause, no record, exit status 2."""
    if os.geteuid() != 0:
        pytest.skip("the walls are built by root only")
    site = _run([python, "-c", "import torch, os; print(os.path.dirname(os.path.dirname("
                 "torch.__file__)))"]).stdout.strip()
    notebook = sub.write(sub.solution(), tmp_path / "alice" / f"{CH01}.ipynb")
    report = tmp_path / "grades.json"
    done = _run([python, "-m", "checks", "grade", notebook, "--source", REPO / "solutions",
                 "--json", report, "--hide", site], cwd=tmp_path, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "not graded" in line]
    assert len(lines) == 1 and "self-test failed" in lines[0], done.stderr
    assert "environment is at fault" in lines[0]
    assert json.loads(report.read_text())["notebooks"] == []


def test_status_from_a_wheel_runs_the_visible_checks_without_solutions(python, tmp_path):
    folder = tmp_path / "my-notebooks"
    sub.write(sub.solution(), folder / CH01 / f"{CH01}.ipynb")
    (folder / CH04).mkdir()
    shutil.copyfile(REPO / "notebooks" / CH04 / f"{CH04}.ipynb", folder / CH04 / f"{CH04}.ipynb")
    done = _run([python, "-m", "checks", "status", folder], cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "without its source notebooks" in done.stderr
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()[1:]}
    assert rows[CH01] == "4/4" and rows[CH04] == "0/4" and rows["total"] == "4/8", done.stdout
