"""The red team's fifth round (issue 34), the attacks on the grader's execution side: each one
replayed against a real worker, with the line the grader answers it with.

- a function whose call ran out of time is not called again: the test cells after it that call it
  are skipped at once, saying why (not another full time limit each);
- the grader's own "… still grading" line never lands in a test's captured stderr (any stderr
  fails a test, nbgrader's rule): an honest but slow first call keeps its point;
- a normal user's run: a /dev/shm hog past --memory (counted, removed), a process started around
  the audit hook that writes the grading user's matplotlibrc and IPython start-up file (put
  back), the student's timestamp.txt and a classmate's feedback page (grading stops, naming them);
  run as a user this test makes with useradd (root only; skipped, saying why, elsewhere or where
  that user could not run this Python, as one under /root);
- Gradescope's container without CAP_SYS_ADMIN (capsh --drop=cap_sys_admin): a released notebook
  that reads the zip's solutions and leaves a process to rewrite results.json scores 0;
- the roster: a folder named like a classmate's login cannot take their grade;
- the assignments file: what would mislead is refused in one line.

- hidden tests' inputs read back: a function that keeps what a hidden test passed it and a later
  test that raises it or writes it to stderr find nothing (the block ran in a throwaway fork of
  the worker); a hang or an os._exit in the fork is reported as before, nothing is left behind; a
  worker that cannot fork does not run the block; what a block made in the worker is gone after.

The catalogue (tests/support/adversarial.py) holds the namespaced forms: c0_hung_function_not_
called_again, a_hidden_inputs_read_back, a_hidden_inputs_written_to_stderr, and
a_hidden_fork_patched_away (the fork is made by the worker's own loop: not guaranteed, trust.md
says so).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from checks.grader import report
from checks.grader.grading import grade_notebook
from checks.grader.limits import Limits

from ..support import adversarial, other_users
from ..support import submissions as sub

pytestmark = pytest.mark.grader_workers

CHAPTER_04 = adversarial.SOLUTIONS / "04_self_attention" / "04_self_attention.ipynb"


def graded(nb, tmp_path, **limits):
    path = sub.write(nb, tmp_path / "student" / "submission.ipynb")
    return grade_notebook(path, limits=Limits(**{"cell_timeout": 60, **limits}))


def test_a_function_that_hung_is_not_called_again(tmp_path):
    """attention_scores loops forever: its own test costs one time limit; attention's test,
    which calls it (through attention, and as the helper handed to the check), is skipped at
    once with one line saying why; masked_softmax, which does not, keeps its points."""
    nb = adversarial.answer(adversarial.sol("04_self_attention"), "attention_scores",
                            "def attention_scores(q, k):\n    while True:\n        pass")
    started = time.monotonic()
    result = graded(nb, tmp_path, cell_timeout=8)
    elapsed = time.monotonic() - started
    by_name = {e.name: e for e in result.exercises}
    assert by_name["masked_softmax"].status == "passed"
    assert by_name["project_qkv"].status == "passed"
    assert by_name["attention_scores"].points == 0 and by_name["attention"].points == 0
    why = by_name["attention"].message
    assert "`attention_scores`, which ran past the time limit in test cell " \
           "check_attention_scores; not called again" in why, why
    assert "test cell check_attention was skipped: it calls `attention_scores`" in result.error
    assert "\n" not in result.error
    assert elapsed < 2 * 8 + 20, elapsed  # one time limit, not two


def test_the_still_grading_line_never_reaches_a_test_s_stderr(tmp_path, capsys):
    """The progress watch prints its line while a one-job run grades in this process, where a
    test cell's run captures sys.stderr: the line goes to the terminal, the slow but honest
    answer keeps its point."""
    nb = sub.solution()
    sub.cell(nb, "head_dim").source = (
        "import time\n_first = []\n"
        "def head_dim(cfg):\n"
        "    if not _first:\n        _first.append(1)\n        time.sleep(4)\n"
        "    return cfg.head_dim")
    progress = report.Progress([tmp_path / "x.ipynb"], jobs=1, heartbeat=0.3).start()
    try:
        result = graded(nb, tmp_path)
    finally:
        progress.stop()
    head_dim = next(e for e in result.exercises if e.name == "head_dim")
    assert (head_dim.status, head_dim.points) == ("passed", 1), head_dim.message
    assert "still grading" in capsys.readouterr().err


# ---- without root: a normal user grades, as the docs allow -------------------------------------

# Starts a process around the worker's audit hook (the hook refuses subprocess, fork, spawn):
# _posixsubprocess.fork_exec itself, whose arguments differ between Python versions.
AROUND_THE_HOOK = '''
import _posixsubprocess, os, sys
def _spawn(code):
    args = [sys.executable, '-c', code]
    r, w = os.pipe()
    base = [args, [os.fsencode(sys.executable)], True, (), None, None,
            -1, -1, -1, -1, -1, -1, r, w, False, True, -1]
    for tail in ([None, None, None, -1, None, False], [None, None, None, -1, None],
                 [None, None, None, None]):
        try:
            return _posixsubprocess.fork_exec(*base, *tail)
        except TypeError:
            continue
    raise RuntimeError('no fork_exec form fits this Python')
'''


def _escape_writes(timestamp: Path, feedback: Path) -> str:
    """What the escaped process writes at once: the grading user's matplotlibrc and an IPython
    start-up file, the student's own timestamp.txt (late made on time), and every feedback page
    already written (a classmate's)."""
    return (
        "import os, pwd, pathlib, time\n"
        "home = pathlib.Path(pwd.getpwuid(os.getuid()).pw_dir)\n"
        "rc = home / '.config' / 'matplotlib' / 'matplotlibrc'\n"
        "rc.parent.mkdir(parents=True, exist_ok=True)\n"
        "rc.write_text('text.usetex: True\\n')\n"
        "start = home / '.ipython' / 'profile_default' / 'startup' / '00-owned.py'\n"
        "start.parent.mkdir(parents=True, exist_ok=True)\n"
        "start.write_text('print(\"owned\")\\n')\n"
        f"pathlib.Path({str(timestamp)!r}).write_text('2026-01-01 00:00:00.000000 UTC\\n')\n"
        f"for page in pathlib.Path({str(feedback)!r}).rglob('*.html'):\n"
        "    page.write_text('<p>10/10, well done</p>')\n")


def _normal_user() -> str:
    """A normal user to grade as, made here when the tests run as root (CI); the test is skipped,
    saying why, where none can be made (not root, no useradd or runuser) or where that user could
    not read the course."""
    import os
    import pwd
    import shutil
    import subprocess

    from checks.grader.isolation import readable_by_others

    name = "checks-rt5"
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root with useradd and runuser (to grade as a normal user)")
    closed = [p for p in (sub.REPO / "checks", sub.REPO / "solutions")
              if not readable_by_others(p)]
    if closed:
        pytest.skip(f"a normal user could not read the course: {closed[0]} is in a folder "
                    "other users cannot enter")
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    return name


@contextlib.contextmanager
def _python_for_other_users():
    """A Python other users may run with the course's packages (this one, or one built in a
    temporary folder when this one is installed under /root: tests/support/other_users.py);
    the test is skipped, saying why, where there can be none."""
    try:
        with other_users.python_for_other_users() as python:
            yield python
    except other_users.NoPythonForOtherUsers as why:
        pytest.skip(f"the worker's user could not run a Python with the course's packages: {why}")


def test_without_root_a_notebook_leaves_nothing_that_lasts():
    """Round five's attacks on a normal user's run: 400 MiB left in /dev/shm (past --memory
    300M: counted, the worker stopped, the file removed); a process started around the audit
    hook writes the grading user's matplotlibrc and an IPython start-up file (put back at once),
    the student's own timestamp.txt and a classmate's feedback page written earlier in the run
    (grading stops with an incident naming them)."""
    user = _normal_user()
    with _python_for_other_users() as python:
        _grade_as_a_normal_user(user, python)


def _grade_as_a_normal_user(user: str, python: str) -> None:
    import json
    import os
    import pwd
    import shutil
    import subprocess
    import uuid

    home = Path(pwd.getpwnam(user).pw_dir)
    for leftover in (home / ".config", home / ".ipython"):
        shutil.rmtree(leftover, ignore_errors=True)
    work = home / f"rt5-{uuid.uuid4().hex[:8]}"
    hog = Path("/dev/shm") / f"checks-rt5-{uuid.uuid4().hex[:8]}"
    try:
        shm = sub.solution()
        sub.prepend(shm, "head_dim", (
            f"import time\nf = open({str(hog)!r}, 'wb')\n"
            "for _ in range(400):\n    f.write(bytes(2**20))\n    f.flush()\n"
            "time.sleep(10)"))
        sub.write(shm, work / "class" / "a_shm" / "01_notation.ipynb")
        sub.write(sub.solution(), work / "class" / "b_victim" / "01_notation.ipynb")
        attacker = sub.solution()
        timestamp = work / "class" / "c_attacker" / "timestamp.txt"
        sub.prepend(attacker, "head_dim", AROUND_THE_HOOK + "_spawn({!r})\nimport time\n"
                    "time.sleep(3)".format(_escape_writes(timestamp, work / "feedback")))
        sub.write(attacker, work / "class" / "c_attacker" / "01_notation.ipynb")
        timestamp.write_text("2026-12-24 00:00:00.000000 UTC\n")
        subprocess.run(["chown", "-R", f"{user}:{user}", str(work)], check=True)
        done = subprocess.run(
            ["runuser", "-u", user, "--", python, "-m", "checks", "grade",
             str(work / "class"), "--jobs", "1", "--memory", "300M", "--timeout", "60",
             "--feedback", str(work / "feedback"), "--json", str(work / "grades.json")],
            capture_output=True, text=True, timeout=600, cwd=work,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                 "PYTHONPATH": str(sub.REPO), "OMP_NUM_THREADS": "1"})
        err = done.stderr
        assert done.returncode == 3 and "INCIDENT" in err, err[-3000:]
        assert "timestamp.txt" in err and "b_victim" in err, err[-3000:]
        assert not (home / ".config" / "matplotlib" / "matplotlibrc").exists()
        assert not list((home / ".ipython").rglob("00-owned.py"))
        assert not hog.exists()
        shm_record = next(nb for nb in json.loads((work / "grades.json").read_text())["notebooks"]
                          if "a_shm" in nb["path"])
        assert "memory limit" in (shm_record["error"] or ""), shm_record["error"]
        assert shm_record["isolation"] == "none"
    finally:
        shutil.rmtree(work, ignore_errors=True)
        hog.unlink(missing_ok=True)


# ---- Gradescope's container: root without CAP_SYS_ADMIN (Docker's default) ---------------------

def _outlive(results: Path) -> str:
    """A process, started around the hook, that rewrites results.json once the grader is done."""
    later = ("import json, time\ntime.sleep(8)\n"
             f"open({str(results)!r}, 'w').write(json.dumps({{'score': 6.0, 'tests': []}}))\n")
    return AROUND_THE_HOOK + f"_spawn({later!r})\n"


def _steal(results: Path) -> str:
    """Run the answers of the zip's source notebook (read by its known name)."""
    source = results.parent.parent / "source" / "course" / "solutions" / "01_notation"
    return ("import json as _json\n"
            "try:\n"
            f"    _cells = _json.load(open({str(source / '01_notation.ipynb')!r}))['cells']\n"
            "except OSError as _e:\n"
            "    _why = f'steal failed: {_e}'\n"
            "    _cells = [{'metadata': {'nbgrader': {'solution': True}}, 'source': [\n"
            "        f'def {name}(*a):\\n    raise RuntimeError({_why!r})\\n'\n"
            f"        for name in {list(sub.EXERCISES_01)!r}]}}]\n"
            "for _cell in _cells:\n"
            "    if _cell.get('metadata', {}).get('nbgrader', {}).get('solution'):\n"
            "        exec(''.join(_cell['source']))\n")


def attack_notebook(results: Path):
    """A released notebook whose every answer cell ends by running the stolen answers, and whose
    first starts the process that outlives the grader."""
    nb = sub.release()
    for name in sub.EXERCISES_01:
        sub.cell(nb, name).source += "\n" + _steal(results)
    return sub.prepend(nb, "head_dim", _outlive(results))


@pytest.mark.slow
def test_gradescope_without_cap_sys_admin_keeps_its_walls():
    """Round five: in a container without CAP_SYS_ADMIN (no namespaces) a released notebook
    scored 6/6 by reading the zip's solutions and by a process that outlived the grader and
    rewrote results.json. Now the worker runs as a user of its own (isolation "user"), the
    zip's folder is closed to it, and every process below run_autograder is killed before
    results.json is written: the notebook scores 0, results.json stays the grader's."""
    import os
    import shutil
    import tempfile

    if os.geteuid() != 0 or not shutil.which("capsh"):
        pytest.skip("needs root and capsh (to drop CAP_SYS_ADMIN)")
    # As /autograder: a folder every user may enter (pytest's own is closed to other users);
    # the autograder itself closes what the worker must not read.
    folder = Path(tempfile.mkdtemp(prefix="checks-rt5-gradescope-", dir="/tmp"))
    os.chmod(folder, 0o755)
    try:
        with _python_for_other_users() as python:
            _grade_in_a_container_without_cap_sys_admin(folder, python)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _grade_in_a_container_without_cap_sys_admin(folder: Path, python: str) -> None:
    """Build chapter 01's autograder zip, unpack it as Gradescope does, and run its
    run_autograder under capsh --drop=cap_sys_admin with `python` (CHECKS_PYTHON) on the attack
    notebook."""
    import json
    import os
    import shutil
    import stat
    import subprocess
    import sys

    from checks.grader.isolation import private_folders

    zip_path = folder / "autograder.zip"
    made = subprocess.run([sys.executable, "-m", "checks", "gradescope", "01", "-o",
                           str(zip_path)], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    root = folder / "ag"
    shutil.unpack_archive(zip_path, root / "source")
    for script in ("run_autograder", "setup.sh"):
        os.chmod(root / "source" / script, 0o755)
    (root / "submission").mkdir()
    results = root / "results" / "results.json"
    sub.write(attack_notebook(results), root / "submission" / "01_notation.ipynb")
    opened = {p: stat.S_IMODE(os.stat(p).st_mode) for p in private_folders([])}
    try:
        done = subprocess.run(
            ["capsh", "--drop=cap_sys_admin", "--", "-c",
             f"exec {root / 'source' / 'run_autograder'}"], capture_output=True, text=True,
            timeout=600, env=dict(os.environ, AUTOGRADER_ROOT=str(root),
                                  CHECKS_PYTHON=python, OMP_NUM_THREADS="1"))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        time.sleep(10)  # past the escaped process's write
    finally:
        for path, mode in opened.items():
            os.chmod(path, mode)
    print(done.stdout[:3000])
    got = json.loads(results.read_text())
    assert got["tests"] and got["score"] == 0, (got["score"], done.stdout[-2000:])
    assert "steal failed: [Errno 13] Permission denied" in done.stdout  # closed to the worker
    assert "isolation" not in done.stdout or "user" in done.stdout
    assert "closed to other users for grading" in done.stdout, done.stdout[-2000:]
    assert str(root / "source") in done.stdout


# ---- the roster ---------------------------------------------------------------------------------

def test_a_folder_named_like_a_classmate_s_login_cannot_take_their_grade(tmp_path):
    """Round five: a submission folder named like a roster student's login gave a second row
    with their SIS Login ID (a Canvas import lets the later row replace the real grade). Now the
    impostor's row carries no login and says why; the real student's row is theirs alone. Two
    roster rows with one login or one id are refused in one line."""
    import argparse
    import csv
    import io

    from checks.grader.outputs import gradebook
    from checks.grader.outputs import roster as rosters

    table = tmp_path / "roster.csv"
    table.write_text("folder,id,name,login,section\nalice_f,1001,Alice F,alice,A\n"
                     "bob,1002,Bob,,A\n")
    roster = rosters.roster_argument(str(table))
    records = [{"student": s, "chapter": "01_notation", "points": p, "max_points": 6, "path": s,
                "exercises": []} for s, p in (("alice_f", 3), ("ALICE", 6), ("1002", 6))]
    rows = list(csv.reader(io.StringIO(gradebook.gradebook_csv(records, roster))))[2:]
    logins = [row[3] for row in rows if row[3]]
    assert len(logins) == len(set(logins)) and sorted(logins) == ["alice", "bob"], rows
    impostors = [row for row in rows if row[0].startswith(("ALICE", "1002"))]
    assert len(impostors) == 2 and all(row[2:4] == ["", ""] for row in impostors)
    assert all("named like a roster student's login or id" in row[0] for row in impostors)
    assert next(row for row in rows if row[3] == "alice")[-1] == "3"
    for text, words in [("folder,login\na,x\nb,X\n", "'a' and 'b' have the same login 'X'"),
                        ("folder,id\na,7\nb,7\n", "'a' and 'b' have the same id '7'"),
                        ("folder,login\na,b\nb,\n", "'a' and 'b' have the same login 'b'")]:
        table.write_text(text)
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            rosters.roster_argument(str(table))


# ---- the assignments file (attacked after it was built) ----------------------------------------

@pytest.mark.parametrize("rows, words", [
    ("04_self_attention,2026-03-01,nan,,", "penalty_per_day must be a fraction"),
    ("04_self_attention,2026-03-01,,inf,", "max_penalty must be a fraction"),
    ("04_self_attention,0001-01-01T00:00+01:00,,,", "not an ISO time"),
    ("04_self_attention,2026-03-01,,,\"12 (3\"", "lms_id must be an LMS's assignment id"),
    ("04_self_attention,2026-03-01,,,\"\x1b[2J\"", "lms_id must be an LMS's assignment id"),
    ("04_self_attention,2026-03-01,,,\"=HYPERLINK(\"\"x\"\")\"", "lms_id must be"),
    ("04_self_attention,2026-03-01,,," + "9" * 65, "at most 64 characters"),
    # a quoted cell over several lines was joined (a name or time the file shows on no line)
    ("\"04_self_\nattention\",2026-03-01,,,",
     "row 2, column 'assignment': a quoted cell spans several lines"),
    ("01_notation,2026-03-01,,,\n04_self_attention,\"2026-03-01\n23:59\",,,",
     "row 3, column 'due': a quoted cell spans several lines"),
    ("04_self_attention,2026-03-01,,,\"12\r\n34\"", "row 2, column 'lms_id': a quoted cell"),
    ("04_self_attention,2026-03-01,\"0.1\n\",,", "row 2, column 'penalty_per_day'"),
])
def test_an_assignments_file_that_would_mislead_is_refused_in_one_line(tmp_path, rows, words):
    import argparse

    from checks.grader.outputs import late

    table = tmp_path / "assignments.csv"
    table.write_text("assignment,due,penalty_per_day,max_penalty,lms_id\n" + rows + "\n")
    with pytest.raises(argparse.ArgumentTypeError, match=words) as refused:
        late.assignments_argument(str(table))
    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)


def test_an_assignment_that_is_no_chapter_is_refused(tmp_path):
    """A NUL, a path or a leading dot in an assignment's name: no chapter, one line."""
    from checks.grader.identify import SOURCE_DIR
    from checks.grader.outputs import late

    for name in ("04_self_attention\x00", "../04_self_attention", ".04_self_attention",
                 "04_self_attention/../01_notation"):
        assert "is no chapter" in late.not_a_chapter([name], SOURCE_DIR), name
    assert late.not_a_chapter(["04_self_attention"], SOURCE_DIR) is None


# ---- hidden tests run in a throwaway fork of the worker -----------------------------------------

# Chapter 04's hidden test of project_qkv calls it with torch.arange(6.0).view(1, 2, 3): the only
# call with that shape, and this is how it reads back.
HIDDEN_X = "[[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]"
RECORDS = ("_seen = []\n"
           "def project_qkv(x, w_q, w_k, w_v):\n"
           "    if tuple(x.shape) == (1, 2, 3):\n"
           "        _seen.append(repr(x.tolist()))\n"
           "    return x @ w_q, x @ w_k, x @ w_v")


def _everything_shown(result) -> str:
    """Every text of a graded notebook that reaches the student: messages, the error, and the
    feedback's outputs as the report holds them."""
    import dataclasses
    import json

    return json.dumps(dataclasses.asdict(result), default=str)


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_what_a_hidden_test_passed_is_not_read_back(tmp_path, isolation):
    """project_qkv keeps what its hidden test passes it; masked_softmax's visible test writes it
    to stderr, attention's raises it as its message (round five's attack, and its stderr twin).
    The hidden block ran in a fork of the worker, gone with what it kept: neither finds it,
    under every isolation (no process is left: grading would raise GradingIncident)."""
    if isolation != "none" and _isolation_unavailable(isolation):
        pytest.skip(f"{isolation} isolation needs root (and namespaces)")
    nb = adversarial.answer(adversarial.sol("04_self_attention"), "project_qkv", RECORDS)
    own = sub.cell(nb, "masked_softmax").source  # the reference's, writing what it finds
    head = "def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> " \
           "torch.Tensor:\n"
    assert head in own
    nb = adversarial.answer(nb, "masked_softmax", "import sys\n" + own.replace(
        head, head + "    print('seen: ' + ' | '.join(_seen), file=sys.stderr)\n", 1))
    nb = adversarial.answer(nb, "attention", (
        "def attention(q, k, v, mask=None):\n"
        "    raise ValueError('seen: ' + ' | '.join(_seen))"))
    result = graded(nb, tmp_path, isolation=isolation)
    by_name = {e.name: e for e in result.exercises}
    assert by_name["project_qkv"].status == "passed", by_name["project_qkv"].message
    assert "wrote to stderr: seen:" in by_name["masked_softmax"].message  # the attacks ran
    assert "raised ValueError: seen: " in by_name["attention"].message
    assert HIDDEN_X not in _everything_shown(result)
    assert result.error is None, result.error


def _isolation_unavailable(mode: str) -> bool:
    import os

    from checks.grader.isolation import isolation_mode

    return os.geteuid() != 0 or (mode == "namespaces" and isolation_mode() != "namespaces")


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_a_hidden_call_that_hangs_is_killed_with_its_fork(tmp_path, isolation):
    """project_qkv loops for ever on its hidden test's input only: the cell costs one time limit,
    reported as any hang; the fork and its parent are killed, nothing is left (GradingIncident
    otherwise), the worker restarts and the later tests keep their points."""
    if isolation != "none" and _isolation_unavailable(isolation):
        pytest.skip(f"{isolation} isolation needs root (and namespaces)")
    nb = adversarial.answer(adversarial.sol("04_self_attention"), "project_qkv", (
        "def project_qkv(x, w_q, w_k, w_v):\n"
        "    while tuple(x.shape) == (1, 2, 3):\n        pass\n"
        "    return x @ w_q, x @ w_k, x @ w_v"))
    result = graded(nb, tmp_path, cell_timeout=8, isolation=isolation)
    by_name = {e.name: e for e in result.exercises}
    assert by_name["project_qkv"].points == 0
    assert "test cell check_project_qkv" in result.error and "8 s limit" in result.error, \
        result.error
    assert all(by_name[n].status == "passed"
               for n in ("attention_scores", "masked_softmax", "attention")), result.error


def test_a_fork_that_dies_in_a_hidden_block_is_the_worker_dying(tmp_path):
    """os._exit in a hidden call ends the fork, not the worker: the grader hears it at once (not
    at the time limit) and reports it as the worker's death; the later tests keep their
    points."""
    nb = adversarial.answer(adversarial.sol("04_self_attention"), "project_qkv", (
        "import os\n"
        "def project_qkv(x, w_q, w_k, w_v):\n"
        "    if tuple(x.shape) == (1, 2, 3):\n        os._exit(3)\n"
        "    return x @ w_q, x @ w_k, x @ w_v"))
    started = time.monotonic()
    result = graded(nb, tmp_path, cell_timeout=30)
    assert time.monotonic() - started < 30
    by_name = {e.name: e for e in result.exercises}
    assert by_name["project_qkv"].points == 0
    assert "the worker process died (exit status 3)" in result.error, result.error
    assert by_name["attention"].status == "passed"


def test_a_worker_that_cannot_fork_does_not_run_hidden_tests(tmp_path):
    """A notebook that stops its own user from starting processes (RLIMIT_NPROC 0), so that the
    hidden tests would run in the shared worker: they are not run, each test fails in one line
    saying why (one torch thread: OpenMP could not start its threads either, and would end the
    worker)."""
    nb = adversarial.answer(adversarial.sol("04_self_attention"), "project_qkv",
                            "import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (0, 0))\n"
                            + RECORDS)
    result = graded(nb, tmp_path, threads=1)
    assert result.error is None, result.error
    for exercise in result.exercises:
        assert exercise.points == 0 and "HiddenTestsRefused: the hidden tests were not run: the " \
            "worker could not start a copy of itself to run them in (BlockingIOError" in \
            exercise.message and "\n" not in exercise.message, exercise.message


def test_hidden_blocks_are_found_at_any_depth():
    """The grader's copy of a test cell: each statement that starts in a hidden block, in a loop,
    a function or left open to the end, runs inside `with __hidden_tests__():`; the visible ones
    do not, and the line numbers are the cell's."""
    import ast

    import nbformat

    from checks.grader import run

    source = ("check(f)\n"
              "### BEGIN HIDDEN TESTS\ncheck(f, thorough=True)\nx = f(1)\n### END HIDDEN TESTS\n"
              "for i in range(2):\n    visible(i)\n"
              "    ### BEGIN HIDDEN TESTS\n    hidden(i)\n    ### END HIDDEN TESTS\n"
              "    after(i)\n"
              "def helper():\n    ### BEGIN HIDDEN TESTS\n    return secret()\n"
              "    ### END HIDDEN TESTS\n"
              "last(1)\n### BEGIN HIDDEN TESTS\nopen_block()\n")
    assert run.hidden_lines(source) == [(2, 5), (8, 10), (13, 15), (17, 18)]
    tree = run._HiddenBlocks(run.hidden_lines(source)).visit(ast.parse(source))
    inside = {node.func.id for w in ast.walk(tree) if isinstance(w, ast.With)
              for node in ast.walk(w) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Name)} - {run.HIDDEN_BLOCK}
    assert inside == {"check", "f", "hidden", "secret", "open_block"}
    calls = {node.func.id: node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert calls["open_block"] == 18 and calls["after"] == 11
    run.grader_code(nbformat.v4.new_code_cell(source))  # compiles


def test_what_a_hidden_block_made_in_the_worker_is_gone_after_it(tmp_path):
    """An object made in a fork (an instance of the learner's class) is refused after its block,
    saying so, even where its handle now names another object of the worker; one made after the
    block works; and the block left the worker's state as it was."""
    from checks.grader.library import WorkerLibrary
    from checks.grader.remote import RemoteFunction
    from checks.grader.worker import Worker

    worker = Worker(tmp_path, Limits(threads=1), WorkerLibrary("04_self_attention",
                                                              adversarial.SOLUTIONS))
    try:
        assert worker.run_cell(0, "class Box:\n    def __init__(self, n):\n        self.n = n\n"
                                  "kept = []\n"
                                  "def keep(x):\n    kept.append(x)\n    return len(kept)\n")["ok"]
        worker.begin_test(worker.deadline())
        box, keep = RemoteFunction(worker, "Box", worker.deadline()), \
            RemoteFunction(worker, "keep", worker.deadline())
        worker.fork()
        inside = box(1)
        assert inside.n == 1 and keep("hidden") == 1
        worker.join()
        outside = box(2)  # the same handle in the worker as `inside` had
        assert outside.n == 2 and keep("visible") == 1
        with pytest.raises(LookupError, match="made in the worker is gone after the block"):
            _ = inside.n
    finally:
        worker.close()
    assert worker.left_behind == []


def test_the_memory_watch_counts_a_fork_s_shared_pages_once():
    """Without a cgroup the watch sums resident memory, which counts a page that a fork shares
    with its parent twice (a worker of 1 GiB that forks for a hidden block would read as 2 GiB);
    above the limit it measures again by proportional share, which counts it once."""
    import os

    from checks.grader import memory

    ballast = bytearray(b"x" * (64 * 2**20))  # resident, then shared with the fork
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        time.sleep(0.2)
        tree = [(p, r) for p, r in memory.process_tree(os.getpid(), None)
                if p in (os.getpid(), child)]
        assert len(tree) == 2
        resident = sum(r for _p, r in tree)
        proportional = sum(memory._proportional(p, r) for p, r in tree)
        assert proportional < resident - 48 * 2**20, (proportional, resident)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
    del ballast


def test_without_walls_only_the_worker_s_own_loop_forks(tmp_path):
    """The audit hook of a worker without walls refuses os.fork to the notebook and lets the
    worker's own fork for a hidden block through; nothing is left behind."""
    from checks.grader.library import WorkerLibrary
    from checks.grader.worker import Worker

    worker = Worker(tmp_path, Limits(threads=1, isolation="none"),
                    WorkerLibrary("04_self_attention", adversarial.SOLUTIONS))
    try:
        done = worker.run_cell(0, "import os\nos.fork()\n")
        assert not done["ok"] and "not allowed while grading: os.fork" in done["evalue"], done
        worker.begin_test(worker.deadline())
        worker.fork()
        worker.join()
        assert worker.run_cell(1, "import os\nos.fork()\n")["ok"] is False
    finally:
        worker.close()
    assert worker.left_behind == []
