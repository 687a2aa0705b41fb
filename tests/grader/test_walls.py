"""What a worker can see and share (issue 18, items 4, 5 and 7): each wall tested from inside a
real worker, and the catalogue's way: an attack graded first, its victim after, the victim keeping
its exact score.

- kernel state: a worker's system-call filter refuses the per-user keyring (add_key, keyctl,
  request_key) and new namespaces (unshare, setns, clone with CLONE_NEW*); threads, fork and
  torch still work (walled-in workers: root only);
- the audit hook of a worker without walls compares resolved paths and refuses /proc links
  (/proc/self/root/..., fd, cwd, environ) and other processes' /proc files;
- the grading process is not dumpable (its /proc files need CAP_SYS_PTRACE).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from checks.grader import identify
from checks.grader.isolation import isolation_mode
from checks.grader.library import WorkerLibrary
from checks.grader.limits import Limits
from checks.grader.worker import Worker

from ..support import submissions as sub

pytestmark = pytest.mark.grader_workers

walled = pytest.mark.skipif(isolation_mode() != "namespaces",
                            reason="walled-in workers need root and Linux namespaces")

SYSCALL = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "NR = {'x86_64': {'add_key': 248, 'keyctl': 250, 'request_key': 249, 'unshare': 272,"
           " 'setns': 308}, 'aarch64': {'add_key': 217, 'keyctl': 219, 'request_key': 218,"
           " 'unshare': 97, 'setns': 268}}[__import__('os').uname().machine]\n")
USER_KEYRING = -4  # KEY_SPEC_USER_KEYRING: the keyring every process of a user id shares


def run_cells(cells: list[str], **limits) -> list[dict]:
    """Each cell's result in one fresh worker for chapter 01."""
    library = WorkerLibrary("01_notation", identify.SOURCE_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker(tmp, Limits(cell_timeout=60, **limits), library)
        try:
            return [worker.run_cell(i, cell) for i, cell in enumerate(cells)]
        finally:
            worker.close()
            assert worker.left_behind == []


@walled
@pytest.mark.parametrize("call, args", [
    ("add_key", 'b"user", b"checks-test", b"secret", 6, ctypes.c_int(-4)'),
    ("keyctl", "0, ctypes.c_int(-4), 0"),  # KEYCTL_GET_KEYRING_ID of the user keyring
    ("request_key", 'b"user", b"checks-test", None, 0'),
    ("unshare", "0x10000000"),  # CLONE_NEWUSER: a user namespace of its own
    ("setns", "0, 0"),
])
def test_the_worker_cannot_reach_kernel_state_or_make_namespaces(call, args):
    cell = SYSCALL + (f"r = libc.syscall(NR[{call!r}], {args})\n"
                      "assert (r, ctypes.get_errno()) == (-1, 1), (r, ctypes.get_errno())")
    result, = run_cells([cell])
    assert result["ok"], result


@walled
def test_threads_fork_and_torch_still_work_under_the_filter():
    result, = run_cells(["import os, threading, torch\n"
                         "t = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
                         "torch.set_num_threads(2)\n"
                         "assert (torch.ones(300, 300) @ torch.ones(300, 300)).sum() == 300**3\n"
                         "pid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
                         "assert os.waitpid(pid, 0)[1] >> 8 == 7"])
    assert result["ok"], result


def keyring_attack(answer: str) -> str:
    """Code that stores `answer` (a cell's source) in the user keyring."""
    return SYSCALL + (f"code = {answer.encode()!r}\n"
                      f"libc.syscall(NR['add_key'], b'user', b'checks-answer', code, len(code), "
                      f"{USER_KEYRING})")


KEYRING_VICTIM = SYSCALL + (
    f"key = libc.syscall(NR['keyctl'], 10, {USER_KEYRING}, b'user', b'checks-answer', 0)\n"
    "buffer = ctypes.create_string_buffer(4096)\n"  # 10: KEYCTL_SEARCH, 11: KEYCTL_READ
    "n = libc.syscall(NR['keyctl'], 11, key, buffer, 4096) if key > 0 else -1\n"
    "if n > 0:\n    exec(buffer.raw[:n].decode())")


@walled
def test_a_key_left_by_one_notebook_never_reaches_a_later_one(tmp_path):
    """The attack of issue 18, item 5: a notebook stores its function in the user keyring, a
    notebook graded after it (same grading process: same worker user id) reads it back and runs
    it (without the filter it gets head_dim's point). The attacker keeps its own marks; the
    victim, which has no code for head_dim, gets none."""
    class_dir = tmp_path / "class"
    attacker = sub.solution()
    answer = sub.cell(attacker, "head_dim").source
    sub.cell(attacker, "head_dim").source += "\n" + keyring_attack(answer)
    sub.write(attacker, class_dir / "a_attacker" / "01_notation.ipynb")
    victim = sub.release()
    sub.cell(victim, "head_dim").source = KEYRING_VICTIM
    sub.write(victim, class_dir / "b_victim" / "01_notation.ipynb")
    report = tmp_path / "grades.json"
    done = subprocess.run([sys.executable, "-m", "checks", "grade", str(class_dir), "--jobs", "1",
                           "--json", str(report)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    attacked, victim_result = json.loads(report.read_text())["notebooks"]
    assert attacked["points"] == attacked["max_points"] == 6
    assert victim_result["points"] == 0
    assert {e["name"]: e["status"] for e in victim_result["exercises"]}["head_dim"] == "error"


def _site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


@pytest.mark.parametrize("path", [
    "/proc/self/root{site}/checks-audit-test.pth",   # through the link: unresolved elsewhere
    "{site}/checks-audit-test.pth",
    "/proc/self/cwd/../../../../../../..{site}/checks-audit-test.pth",
])
def test_without_walls_the_python_installation_cannot_be_written(path):
    """The .pth attack of issue 18, item 7: a file every later Python runs at start."""
    target = path.format(site=_site_packages())
    result, = run_cells([f"open({target!r}, 'w').write('import sys')\n"], isolation="none")
    assert not result["ok"] and result["ename"] == "PermissionError", result
    assert not os.path.exists(os.path.join(_site_packages(), "checks-audit-test.pth"))


def test_without_walls_no_write_through_a_folder_descriptor():
    """A write by bare name relative to a protected folder's descriptor (os.open(name,
    dir_fd=...)): the open event names only the bare name, so the folder itself may not be
    opened (helper U's attack on the course's own files as a normal user)."""
    site = _site_packages()
    cell = ("import os\n"
            f"d = os.open({site!r}, os.O_RDONLY)\n"
            "os.close(os.open('checks-audit-test.pth', os.O_WRONLY | os.O_CREAT, 0o644, "
            "dir_fd=d))\n")
    result, = run_cells([cell], isolation="none")
    assert not result["ok"] and result["ename"] == "PermissionError", result
    assert "opening the folder" in result["evalue"], result
    assert not os.path.exists(os.path.join(site, "checks-audit-test.pth"))


@pytest.mark.parametrize("path, words", [
    ("/proc/{grader}/environ", "another process"),
    ("/proc/{grader}/cmdline", "another process"),
    ("/proc/self/environ", "/proc"),
    ("/proc/self/fd/0", "/proc"),
    ("/proc/self/root/etc/hostname", "/proc"),
    ("/proc/thread-self/root/etc/hostname", "/proc"),
])
def test_without_walls_proc_leads_nowhere(path, words):
    """The grader's environment (same user without walls) and the links around the hook."""
    target = path.format(grader=os.getpid())
    result, = run_cells([f"open({target!r}, 'rb').read(10)\n"], isolation="none")
    assert not result["ok"] and result["ename"] == "PermissionError", result
    assert words in result["evalue"], result


def test_ordinary_reads_still_work_without_walls():
    result, = run_cells(["open('/proc/self/status').read()\nopen('/proc/cpuinfo').read()\n"
                         "import torch\nassert torch.ones(2).sum() == 2"], isolation="none")
    assert result["ok"], result


def test_the_grading_process_is_not_dumpable(tmp_path):
    """`python -m checks` makes itself non-dumpable at once: its /proc files (environ, mem)
    then need CAP_SYS_PTRACE, which a worker of the same user does not have."""
    code = ("import ctypes, sys\nfrom checks.grader.cli import main\n"
            f"main(['grade', {str(tmp_path / 'missing.ipynb')!r}])\n"
            "print('dumpable', ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")  # PR_GET_DUMPABLE
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "dumpable 0", done.stdout + done.stderr


STEAL = ("import json, os\n"
         "for path in {paths!r}:\n"
         "    if os.path.exists(path):\n"
         "        for cell in json.load(open(path))['cells']:\n"
         "            if 'def head_dim' in ''.join(cell['source']):\n"
         "                exec(''.join(cell['source']))\n")


@walled
def test_the_worker_sees_no_classmate_and_no_other_copy_of_the_course(tmp_path):
    """Issue 18, item 4: graded alone, a student's worker looks for a classmate's notebook in a
    sibling folder and for another copy of the course on the disk (outside every folder the
    grader knows to hide) and runs their head_dim. Neither is in its view: no point for it."""
    import shutil
    import uuid

    elsewhere = Path("/") / f".checks-walls-test-{uuid.uuid4().hex[:8]}"
    try:
        classmate = sub.write(sub.solution(), elsewhere / "class" / "alice" / "01_notation.ipynb")
        clone = elsewhere / "course-copy" / "solutions" / "01_notation" / "01_notation.ipynb"
        clone.parent.mkdir(parents=True)
        shutil.copy(sub.SOLUTION_01, clone)
        mallory = sub.release()
        sub.cell(mallory, "head_dim").source = STEAL.format(paths=[str(classmate), str(clone)])
        path = sub.write(mallory, elsewhere / "class" / "mallory" / "01_notation.ipynb")
        os.chmod(elsewhere, 0o755)
        report = tmp_path / "grades.json"
        done = subprocess.run([sys.executable, "-m", "checks", "grade", str(path.parent),
                               "--json", str(report)], capture_output=True, text=True,
                              timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert done.returncode == 0, done.stderr[-2000:]
        result, = json.loads(report.read_text())["notebooks"]
        assert result["points"] == 0, result["exercises"]
        assert {e["name"]: e["status"] for e in result["exercises"]}["head_dim"] == "error"
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@walled
def test_an_allowed_folder_under_tmp_is_in_the_view(tmp_path):
    """A Python installation under /tmp (a virtual environment in a clone under /tmp, as CI's may
    be) is in the worker's view: the worker's own /tmp is mounted first and the allowed folders
    are bound inside it, not covered by it (that once hid the whole environment: every
    exercise after the first import failed, 46/116 for the solutions)."""
    from checks.grader.isolation import JAIL, jail_config

    installation = tmp_path / "clone" / ".venv"
    installation.mkdir(parents=True)
    (installation / "marker.txt").write_text("visible\n")
    os.chmod(installation, 0o755)
    os.chmod(installation / "marker.txt", 0o644)
    lib = tmp_path / "lib"
    lib.mkdir()
    os.chmod(lib, 0o755)
    cat = "/bin/cat" if os.path.exists("/bin/cat") else "/usr/bin/cat"
    config = jail_config(Limits(), ["cat", str(installation / "marker.txt")], 1, lib, (), [],
                         65534, None)
    config["allow"] = [*config["allow"], str(installation)]
    config["python"] = cat
    done = subprocess.run([sys.executable, "-I", "-S", str(JAIL), json.dumps(config)],
                          capture_output=True, text=True, env={}, timeout=60)
    assert done.returncode == 0 and done.stdout == "visible\n", done.stderr[-2000:]
