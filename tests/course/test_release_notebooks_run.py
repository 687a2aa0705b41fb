"""Run All on every learner notebook goes to the end; a grader still scores unstarted work zero.

A learner opens a fresh release notebook and chooses "Run All Cells" before writing anything.
Each unstarted exercise's self-check must show its yellow "not started" line and let the run go
on (later cells fall back to the course's reference), so that every explanation, figure and demo
below it still runs. Under a grader (`LLAMA_COURSE_GRADING=1`, or nbgrader's `NBGRADER_EXECUTION`
during autograde and validate) the same self-check raises `NotStarted`, so the exercise scores 0.

The notebooks run as JupyterLab runs them: a real kernel (through `jupyter nbconvert --execute`),
the learner's settings (no grading flag: full demonstration sizes, 2 s timing budgets), several
notebooks at a time. `LLAMA_COURSE_RELEASE=/some/folder` runs another release than notebooks/
(for example one just generated with `checks.tools.release.generate_release`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from checks import context, display, engine
from checks.borrow import use_if_passing
from checks.engine import Check, NotStarted
from checks.exercises import SYLLABUS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RELEASE = Path(os.environ.get("LLAMA_COURSE_RELEASE", ROOT / "notebooks"))
CHAPTERS = sorted(p.name for p in RELEASE.iterdir() if (p / f"{p.name}.ipynb").is_file())
GRADER_FLAGS = {context.GRADING_ENV: "1", "NBGRADER_EXECUTION": "autograde"}
NOT_STARTED = "not started yet"
# Seconds. Most learner-mode cells take a few; chapter 14's training and three-seed ablations take
# minutes on the one thread a kernel gets here, more while other tests share the cores.
CELL_TIMEOUT = 600
NOTEBOOK_TIMEOUT = 1500


def kernel_env(**flags: str) -> dict[str, str]:
    """This process's environment without any grading flag, plus `flags`."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*GRADER_FLAGS, "NBGRADER_VALIDATING", context.QUICK_DEMOS_ENV)}
    env["OMP_NUM_THREADS"] = "1"  # kernels run side by side, one core each
    env["JUPYTER_PREFER_ENV_PATH"] = "1"  # the kernel of this environment, which imports checks
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # no debugger warning on stderr
    return {**env, **flags}


@dataclass
class Run:
    returncode: int
    log: str  # nbconvert's output: the failing cell and its error when there is one
    notebook: Path  # the executed notebook (written only when the run completed)
    seconds: float

    def cells(self) -> list[dict]:
        return json.loads(self.notebook.read_text(encoding="utf-8"))["cells"]


def run_all(chapter: str, workdir: Path, env: dict[str, str]) -> Run:
    """Execute a copy of the chapter's release notebook top to bottom in a fresh kernel."""
    folder = workdir / chapter
    shutil.copytree(RELEASE / chapter, folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    out = workdir / "executed"
    start = time.monotonic()
    cmd = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
           f"--ExecutePreprocessor.timeout={CELL_TIMEOUT}", "--output-dir", str(out),
           str(folder / f"{chapter}.ipynb")]
    try:
        proc = subprocess.run(cmd, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT)
        code, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:  # the kernel is nbconvert's child: it ends with it
        code, log = -1, f"took longer than {NOTEBOOK_TIMEOUT} s\n{exc.stderr or ''}"
    return Run(code, log, out / f"{chapter}.ipynb", time.monotonic() - start)


def _outputs_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for value in out.get("data", {}).values():
            parts.append("".join(value) if isinstance(value, list) else str(value))
        parts.extend(out.get("traceback", []))
    return "\n".join(parts)


def _is_test_cell(cell: dict) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade"))


# --------------------------------------------------------------------------------------------
# Every release notebook, as a learner runs it


# Chapters 14-16 run at the grader's demonstration sizes (still a learner's run: unstarted
# exercises show their line and Run All goes on). Chapter 14's full size is minutes of training
# and 21 ablation runs on the one thread a kernel gets here, most of this file's time; its full
# default run is tests/course/test_training_run.py's, held to the loss the chapter states.
# Chapters 15 and 16 run at full size in tests/course/test_browser.py (Run All in JupyterLab).
QUICK = {chapter: {context.QUICK_DEMOS_ENV: "1"}
         for chapter in ("14_training", "15_serving", "16_speculative")}

# The grader's runs use the chapter whose first exercise comes early (they stop there).
GRADER_CHAPTER = "04_self_attention" if "04_self_attention" in CHAPTERS else CHAPTERS[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    """Run All on every chapter as a learner, and on one chapter under each grader flag, a few
    at a time (each kernel uses one thread). Keys: the chapter, or the flag's name."""
    workdir = tmp_path_factory.mktemp("run-all")
    jobs = {chapter: (chapter, kernel_env(**QUICK.get(chapter, {}))) for chapter in CHAPTERS}
    jobs |= {flag: (GRADER_CHAPTER, kernel_env(**{flag: value}))
             for flag, value in GRADER_FLAGS.items()}
    workers = max(2, min(4, os.cpu_count() or 2))
    with ThreadPoolExecutor(workers) as pool:
        done = pool.map(lambda key: run_all(jobs[key][0], workdir / key, jobs[key][1]), jobs)
        return dict(zip(jobs, done))


def test_the_release_has_all_chapters():
    assert CHAPTERS == [chapter.folder for chapter in SYLLABUS], f"{RELEASE} holds {CHAPTERS}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_run_all_reaches_the_last_cell(runs, chapter):
    run = runs[chapter]
    assert run.returncode == 0, f"Run All stopped after {run.seconds:.0f} s:\n{run.log[-3000:]}"
    code = [c for c in run.cells() if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), "some code cells did not run"
    errors = [c["id"] for c in code if any(o["output_type"] == "error" for o in c["outputs"])]
    assert errors == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_unstarted_exercise_shows_the_not_started_line(runs, chapter):
    run = runs[chapter]
    assert run.returncode == 0, f"Run All stopped:\n{run.log[-3000:]}"
    tests = [c for c in run.cells() if _is_test_cell(c)]
    assert tests, "a chapter without graded exercises"
    silent = [c["id"] for c in tests if NOT_STARTED not in _outputs_text(c)]
    assert silent == [], "test cells without the 'not started' line"


# --------------------------------------------------------------------------------------------
# The grader's side: the same fresh notebook stops at the first self-check


@pytest.mark.parametrize("flag", sorted(GRADER_FLAGS))
def test_a_grader_still_fails_the_unstarted_exercise(runs, flag):
    run = runs[flag]
    assert run.returncode != 0, "a grader's run went past an unstarted exercise"
    # nbconvert names the cell that stopped the run and shows its error: the yellow line
    assert NOT_STARTED in run.log.split("CellExecutionError")[-1]


# --------------------------------------------------------------------------------------------
# The rule itself, without a kernel


def _unstarted(*args):
    raise NotImplementedError()


def _check(fn):
    with Check("demo", fn) as c:
        c.call(1)


@pytest.fixture
def shown(monkeypatch) -> list[str]:
    """Pretend to be a learner's Jupyter kernel; collect what the not-started display shows."""
    for name in (*GRADER_FLAGS, "NBGRADER_VALIDATING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(display, "in_notebook", lambda: True)
    lines: list[str] = []
    monkeypatch.setattr(display, "show_not_started", lines.append)
    return lines


def test_in_jupyterlab_an_unstarted_check_shows_a_line_and_returns(shown):
    _check(_unstarted)
    assert len(shown) == 1 and shown[0].startswith(f"demo: {NOT_STARTED}")


@pytest.mark.parametrize("flag", sorted(GRADER_FLAGS))
def test_under_a_grader_it_raises(shown, monkeypatch, flag):
    monkeypatch.setenv(flag, GRADER_FLAGS[flag])
    with pytest.raises(NotStarted):
        _check(_unstarted)
    assert shown == []


def test_outside_a_notebook_it_raises(shown, monkeypatch):
    # The grader's worker and `python -m checks` run checks without a Jupyter kernel.
    monkeypatch.setattr(display, "in_notebook", lambda: False)
    with pytest.raises(NotStarted):
        _check(_unstarted)


def test_use_if_passing_still_picks_the_reference(shown, capsys):
    def reference(x):
        return x

    assert use_if_passing(_unstarted, _check, reference, name="demo") is reference
    assert shown == [] and "reference" in capsys.readouterr().out


def test_a_check_inside_a_check_is_shown_once_by_the_outer_one(shown):
    def outer(fn):
        with Check("outer", fn):
            _check(fn)
            raise AssertionError("the inner check returned; it should have raised")

    outer(_unstarted)  # returns: the outer Check shows the line
    assert len(shown) == 1 and engine._open_checks.get() == 0


def test_a_stub_reached_outside_call_is_not_started_too(shown, monkeypatch):
    def checker(fn):
        with Check("demo", fn):
            fn(1)  # a checker that calls the learner's function directly

    checker(_unstarted)
    assert len(shown) == 1
    monkeypatch.setenv(context.GRADING_ENV, "1")
    with pytest.raises(NotStarted):
        checker(_unstarted)
