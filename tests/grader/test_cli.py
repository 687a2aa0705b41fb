"""`python -m checks status` and `python -m checks grade`: bad input, a class folder with a hanging
and a broken submission (the same results one at a time and two at a time), the incident stop,
progress of a fresh release."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from nbformat.v4 import new_notebook

from checks.environment import LANG_ENV
from checks.grader.cli import main

from ..support import submissions as sub

TIMEOUT = 20  # seconds per cell for the hanging notebook; the imports cell needs about 2 quiet,
# several times that on a loaded machine


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
    "zero jobs": ("grade {d}/01_notation.ipynb --jobs 0", "--jobs"),
    "json over input": ("grade {d}/01_notation.ipynb --json {d}/01_notation.ipynb",
                        "would overwrite"),
    "folder without notebooks": ("grade {d}/empty_folder", "no notebooks"),
    "status of a missing folder": ("status {d}/missing", "no such folder"),
    "status without chapters": ("status {d}/empty_folder", "no chapter notebooks"),
    "unknown command": ("frobnicate", "invalid choice"),
}


# The grader's own words in Chinese (LLAMA_COURSE_LANG=zh, as the Chinese release's learners have
# it); argparse's frame ("invalid choice") is argparse's and stays English.
BAD_INPUT_ZH = {
    "missing file": "没有这个文件", "not a notebook": "不是 notebook（需要 .ipynb 文件）",
    "broken JSON": "不是有效的 JSON（", "empty file": "空文件，不是 notebook",
    "unknown chapter": "未知章节 '99_unknown'（没有 ", "zero timeout": "不是正数秒数：'0'",
    "zero jobs": "不是正整数：'0'", "json over input": "JSON 输出会覆盖一个正在评分的 notebook",
    "folder without notebooks": "这个文件夹里没有 notebook（.ipynb）",
    "status of a missing folder": "没有这个文件夹",
    "status without chapters": "这个文件夹里没有章节 notebook（NN_slug/*.ipynb）",
}


@pytest.mark.parametrize("args, problem", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_gets_one_line_and_status_2(tmp_path, capsys, args, problem):
    assert_bad_input(tmp_path, capsys, args, problem)


@pytest.mark.parametrize("case", BAD_INPUT_ZH)
def test_bad_input_is_said_in_chinese_under_llama_course_lang_zh(tmp_path, capsys, monkeypatch,
                                                                 case):
    monkeypatch.setenv(LANG_ENV, "zh")
    assert_bad_input(tmp_path, capsys, BAD_INPUT[case][0], BAD_INPUT_ZH[case])


def assert_bad_input(tmp_path, capsys, args: str, problem: str) -> None:
    """`args` (with {d} for tmp_path) exits 2 with one line on stderr holding `problem`, and
    leaves every input file as it was."""
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


def grade_class(class_dir, report, *extra, env=None):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(class_dir), "--timeout", str(TIMEOUT),
         "--json", str(report), *extra],
        capture_output=True, text=True, timeout=300, cwd=class_dir.parent,
        env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    return done, time.monotonic() - started


def results_of(report) -> list:
    """The JSON's notebooks without the fields that vary from run to run."""
    notebooks = json.loads(report.read_text())["notebooks"]
    for nb in notebooks:
        del nb["seconds"], nb["grader_memory_mib"], nb["worker_uid"]
    return notebooks


@pytest.mark.grader_workers
def test_grade_a_class_folder_past_a_hanging_and_a_broken_submission(tmp_path):
    """`python -m checks grade` as a process: the hanging notebook scores zero within its time
    limit, the broken one costs one line, the solution still gets full marks, inputs unchanged;
    two at a time gives the same results as one at a time."""
    class_dir = tmp_path / "grading" / "submitted"
    sub.write(sub.prepend(sub.release(), "head_dim", "while True: pass"),
              class_dir / "alice" / "01_notation" / "01_notation.ipynb")
    (class_dir / "bob" / "01_notation").mkdir(parents=True)
    (class_dir / "bob" / "01_notation" / "01_notation.ipynb").write_text('{"cells": [')
    checkpoints = class_dir / "alice" / "01_notation" / ".ipynb_checkpoints"
    checkpoints.mkdir()
    (checkpoints / "01_notation-checkpoint.ipynb").write_text("")
    sub.write(sub.solution(), class_dir / "carol" / "01_notation" / "01_notation.ipynb")
    before = {p: p.read_bytes() for p in class_dir.rglob("*") if p.is_file()}
    report = tmp_path / "grades" / "grades.json"  # its folder is made

    done, elapsed = grade_class(class_dir, report, "--jobs", "2")

    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("python -m checks:")]
    assert len(errors) == 1 and "bob" in errors[0] and "not valid JSON" in errors[0]
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 2 and all("/3] " in line for line in progress)
    assert "0/6 points" in done.stdout and "6/6 points" in done.stdout
    assert done.stdout.index("alice") < done.stdout.index("carol")  # in the order given
    assert f"longer than the {TIMEOUT} s limit" in done.stdout
    assert "total: 6/12 points in 2 notebooks" in done.stdout

    data = json.loads(report.read_text())
    alice, carol = data["notebooks"]
    assert alice["student"] == "alice" and carol["student"] == "carol"
    assert alice["path"].endswith("alice/01_notation/01_notation.ipynb") and alice["points"] == 0
    assert "limit" in alice["error"] and alice["seconds"] < TIMEOUT + 60
    # the hanging answer cell was skipped and the worker restarted: the rest was graded
    assert {e["name"]: e["status"] for e in alice["exercises"]} == {
        "head_dim": "error", "kv_group_size": "not started", "validate_config": "not started",
        "tensor_shape": "not started"}
    assert alice["skipped"] == [{"cell": "answer cell head_dim",
                                 "why": f"ran longer than the {TIMEOUT} s limit"}]
    assert carol["points"] == carol["max_points"] == 6 and carol["error"] is None
    assert [e["path"].endswith("bob/01_notation/01_notation.ipynb") for e in data["errors"]] == \
        [True]
    assert (data["points"], data["max_points"]) == (6, 12)
    assert {p: p.read_bytes() for p in class_dir.rglob("*") if p.is_file()} == before

    one_at_a_time = tmp_path / "grades" / "one.json"
    done, _ = grade_class(class_dir, one_at_a_time, "--jobs", "1")
    assert done.returncode == 2
    assert results_of(one_at_a_time) == results_of(report)


@pytest.mark.grader_workers
def test_a_changed_file_stops_grading_with_an_incident_report(tmp_path):
    """The walls keep submissions from changing files; should anything change one anyway, the
    run stops after the notebook being graded, naming it (here the test itself changes a file
    while a slow notebook runs)."""
    class_dir = tmp_path / "class"
    slow = sub.write(sub.prepend(sub.solution(), "head_dim", "import time\ntime.sleep(8)"),
                     class_dir / "a_slow" / "01_notation.ipynb")
    other = sub.write(sub.solution(), class_dir / "b_other" / "01_notation.ipynb")
    report = tmp_path / "grades.json"
    process = _start_grading(tmp_path, class_dir, "--jobs", "1", "--json", report)
    try:
        _wait_for_a_worker(process)
        other.write_text(other.read_text() + " ")  # what an escaped worker would do
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 3, err
    assert "INCIDENT" in err and str(slow) in err and "b_other" in err
    data = json.loads(report.read_text())
    assert data["incident"]["notebooks"][0] == str(slow)
    assert data["notebooks"] == []  # nothing graded since the change is trusted


def _start_grading(cwd, *args) -> subprocess.Popen:
    """`python -m checks grade *args` in the background, its output captured."""
    return subprocess.Popen([sys.executable, "-m", "checks", "grade", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def _wait_for_a_worker(process: subprocess.Popen, timeout: float = 120) -> None:
    """Until the grader `process` runs a worker (at most `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while not _worker_running(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)


def _worker_running(grader: int) -> bool:
    """A worker of the grader process `grader` runs (a descendant running as a worker's user,
    or running `worker_main` when workers are not walled in)."""
    from checks.grader import isolation

    parent, workers = {}, []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    parent[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
                uid = os.stat(f"/proc/{name}").st_uid
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    command = f.read()
            except (OSError, IndexError, ValueError):
                continue
            if isolation.WORKER_UID_BASE <= uid < isolation.WORKER_UID_BASE + 4000 or \
                    b"worker_main" in command:
                workers.append(int(name))
    for pid in workers:
        for _ in range(8):
            pid = parent.get(pid, 0)
            if pid == grader:
                return True
    return False


def _processes() -> dict[int, tuple[int, bytes, bytes]]:
    """{pid: (parent, state, start time)} of every process."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            found[int(name)] = (int(fields[1]), fields[0], fields[19])
    return found


def _descendants(root: int) -> dict[int, bytes]:
    """{pid: start time} of the live processes descending from `root`."""
    procs = _processes()
    found = {}
    for pid, (_, state, start) in procs.items():
        q, steps = pid, 0
        while q not in (0, 1) and steps < 32 and state != b"Z":
            q, steps = procs.get(q, (0,))[0], steps + 1
            if q == root:
                found[pid] = start
                break
    return found


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigterm_ends_every_process_the_grader_started(tmp_path, jobs):
    """SIGTERM to the grader (a scheduler's stop, `kill`): it exits at once with status 143,
    and its grading processes, zygotes and workers are gone with it, as after Ctrl-C."""
    class_dir = tmp_path / "class"
    for student in ("a", "b"):
        sub.write(sub.prepend(sub.solution(), "head_dim", "while True: pass"),
                  class_dir / student / "01_notation.ipynb")
    process = _start_grading(tmp_path, class_dir, "--jobs", jobs, "--timeout", "600")
    try:
        _wait_for_a_worker(process)
        time.sleep(1)
        started = _descendants(process.pid)
        assert _worker_running(process.pid) and started
        process.terminate()
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        procs = _processes()
        left = [pid for pid, start in started.items()
                if pid in procs and procs[pid][2] == start and procs[pid][1] != b"Z"]
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"{len(left)} of {len(started)} processes outlived the grader"


@pytest.mark.grader_workers
def test_sigterm_keeps_every_output_of_the_notebooks_finished(tmp_path):
    """SIGTERM after one notebook finished, while another hangs: the JSON (marked incomplete),
    the gradebook and the class report all hold the finished one."""
    class_dir = tmp_path / "class"
    sub.write(sub.solution(), class_dir / "a" / "01_notation.ipynb")
    sub.write(sub.prepend(sub.solution(), "head_dim", "while True: pass"),
              class_dir / "b" / "01_notation.ipynb")
    out = tmp_path / "out"
    report, page, book = out / "grades.json", out / "class.html", out / "grades.csv"
    process = _start_grading(tmp_path, class_dir, "--jobs", "1", "--timeout", "600",
                             "--json", report, "--report", page, "--csv", book)
    try:
        deadline = time.monotonic() + 180
        while not (report.exists() and json.loads(report.read_text())["notebooks"]):
            assert time.monotonic() < deadline and process.poll() is None, "a was not graded"
            time.sleep(0.2)
        _wait_for_a_worker(process)  # b's
        process.terminate()
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, err
    assert "Traceback" not in err
    data = json.loads(report.read_text())
    assert data["complete"] is False and [r["student"] for r in data["notebooks"]] == ["a"]
    assert book.read_text().splitlines()[2].startswith("a,")
    html = page.read_text(encoding="utf-8")
    assert "Class report: 1 notebooks, 1 students" in html and "head_dim: 1 of 1 passed" in html


def _grading_processes(grader: int) -> list[int]:
    """The `--jobs` grading processes of the grader process `grader` (its spawned children)."""
    found = []
    for pid, (parent, state, _start) in _processes().items():
        if parent == grader and state != b"Z":
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"spawn_main" in f.read():
                        found.append(pid)
            except OSError:
                continue
    return found


@pytest.mark.grader_workers
def test_a_killed_grading_process_costs_nothing(tmp_path):
    """SIGKILL to one of --jobs' grading processes (the OOM killer, an operator, a submission's
    worker where there are no walls) breaks the pool: the notebooks it was grading are graded
    again one at a time, the rest in a fresh pool, and every notebook gets its own points."""
    class_dir = tmp_path / "class"
    slow = sub.prepend(sub.solution(), "head_dim", "import time\ntime.sleep(4)")
    for student, nb in (("a", slow), ("b", slow), ("c", sub.solution()), ("d", sub.solution())):
        sub.write(nb, class_dir / student / "01_notation.ipynb")
    report = tmp_path / "grades.json"
    process = _start_grading(tmp_path, class_dir, "--jobs", "2", "--json", report)
    try:
        _wait_for_a_worker(process)
        victims = _grading_processes(process.pid)
        assert victims, "no grading process found"
        os.kill(victims[0], signal.SIGKILL)
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "a grading process died" in err and "graded again, one at a time" in err
    assert "could not be graded" not in err and "Traceback" not in err
    data = json.loads(report.read_text())
    assert sorted((r["student"], r["points"]) for r in data["notebooks"]) == \
        [(s, 6.0) for s in "abcd"]
    assert data["errors"] == []
