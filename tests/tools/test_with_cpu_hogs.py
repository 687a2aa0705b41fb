"""scripts/with_cpu_hogs.py: the hogs run for the command's whole duration and are always stopped;
the command's exit status comes through; a time limit and Ctrl-C stop the command."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "with_cpu_hogs.py"
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")


def hogs(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie has stopped running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def hog_cpu_seconds(stderr: str) -> float:
    return float(re.search(r"hog\(s\) used (\d+) CPU s", stderr).group(1))


# The command reports the hogs' process ids and whether each is running while it runs.
REPORT_HOGS = """
import os, sys, time
pids = [int(p) for p in os.environ["CPU_HOGS_PIDS"].split(",")]
running = []
for pid in pids:
    try:
        os.kill(pid, 0)
        running.append(pid)
    except ProcessLookupError:
        pass
print(",".join(map(str, pids)), ",".join(map(str, running)))
time.sleep(1.5)
sys.exit(3)
"""


def test_the_hogs_run_alongside_and_the_exit_status_comes_through():
    done = hogs("-n", "2", "--", *python(REPORT_HOGS))
    assert done.returncode == 3, done.stderr
    listed, running = (part.split(",") for part in done.stdout.split())
    assert len(listed) == 2 and running == listed
    assert not any(alive(int(pid)) for pid in listed), "the hogs outlived the command"
    assert hog_cpu_seconds(done.stderr) >= 0 and "exited with status 3" in done.stderr


def test_a_command_past_its_time_limit_is_stopped_with_status_124():
    started = time.monotonic()
    done = hogs("-n", "1", "--timeout", "1", "--", *python(
        "import os, time; print(os.environ['CPU_HOGS_PIDS'], flush=True); time.sleep(60)"))
    assert done.returncode == 124, done.stderr
    assert "longer than 1 s" in done.stderr
    assert time.monotonic() - started < 50                 # not the command's 60 s
    assert not alive(int(done.stdout.strip()))


def test_ctrl_c_stops_the_command_and_the_hogs():
    command = python("import os, time; print(os.environ['CPU_HOGS_PIDS'], os.getpid(), "
                     "flush=True); time.sleep(60)")
    # Ctrl-C's default action even when this suite runs in the background (where a shell
    # starts every process with SIGINT ignored, and the command would inherit that).
    process = subprocess.Popen([sys.executable, str(SCRIPT), "-n", "2", "--", *command],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = process.stdout.readline().split()      # the command is running
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    hog_pids, command_pid = first[0].split(","), int(first[1])
    assert not alive(command_pid)
    assert not any(alive(int(pid)) for pid in hog_pids)


@pytest.mark.parametrize("args, message", [
    ([], "no command given"),
    (["-n", "-1", "--", "true"], "-n must be 0 or more"),
    (["--timeout", "0", "--", "true"], "--timeout must be a positive"),
])
def test_bad_arguments_are_one_line_and_status_2(args, message):
    done = hogs(*args)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_command_is_status_127():
    done = hogs("-n", "1", "--", "no-such-command-anywhere")
    assert done.returncode == 127 and "cannot run 'no-such-command-anywhere'" in done.stderr
