"""The catalogue of broken and adversarial submissions (tests/support/adversarial.py), graded in
one run of `python -m checks grade --jobs 2` over a class folder: every case (a test of its own,
named after its row) gets exactly its points, the victims graded after each class of attack keep
theirs, the folder is graded past every failure, no protected file changes, no worker process
survives, and the grader stays under 1 GiB.

The walls (namespaces, an unprivileged user, cgroups) need root, which CI has; elsewhere the
catalogue is skipped (the report marks such runs, and the README says what they do not protect).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checks.grader import isolation as sandbox  # isolation_mode

from ..support import adversarial


def graded_run(test):
    """Marks a test of the graded run: it starts the grader's workers (two at a time) and takes
    minutes. The README's lists and the catalogue's own shape are checked without it."""
    return pytest.mark.slow(pytest.mark.grader_workers(test))


# Seconds per cell: the infinite loop costs this much. Room for a loaded machine: `make test`
# grades this catalogue while another test process grades the fault matrix, and there the 2 GiB
# memory hog once took longer than 20 s to reach its limit and be killed.
TIMEOUT = 30
LIMIT = 90  # no notebook may take longer than TIMEOUT + this (start-up and load included)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if sandbox.isolation_mode() != "namespaces":
        pytest.skip("the catalogue's walls need root and Linux namespaces")
    tmp = tmp_path_factory.mktemp("adversarial")
    source = tmp / "solutions"
    for chapter in ("01_notation", "04_self_attention", "10_norm_residual",
                    "13_generation_kv_cache"):
        shutil.copytree(adversarial.SOLUTIONS / chapter, source / chapter)
    folder = tmp / "class"
    marker = tmp / "marker"
    cases = adversarial.write_catalogue(folder, source, marker)
    before = adversarial.protected_bytes(source, folder)
    report = tmp / "grades.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(folder), "--source", str(source),
         "--timeout", str(TIMEOUT), "--memory", "1500M", "--jobs", "2", "--json", str(report)],
        capture_output=True, text=True, timeout=1200, cwd=tmp,
        env=dict(os.environ, OMP_NUM_THREADS="1", **{adversarial.SECRET: "hunter2"}))
    elapsed = time.monotonic() - started
    after = adversarial.protected_bytes(source, folder)
    data = json.loads(report.read_text()) if report.is_file() else None
    return cases, done, data, before, after, elapsed, folder, marker


def case_of(path: str, folder: Path) -> str:
    return Path(path).relative_to(folder).parts[0]


@graded_run
def test_the_grader_survives_and_reports_every_notebook(graded):
    cases, done, data, *_, elapsed, folder, _ = graded
    assert data is not None, done.stderr[-3000:]
    assert done.returncode == 2, done.stderr[-3000:]  # one file cannot be graded
    problems = {case_of(e["path"], folder): e["error"] for e in data["errors"]}
    assert set(problems) == {name for name, c in cases.items() if c.points is None}
    for name, message in problems.items():
        assert cases[name].error in message and "\n" not in message
    errors = [line for line in done.stderr.splitlines() if line.startswith("python -m checks:")]
    assert len(errors) == len(problems), done.stderr[-3000:]
    progress = [line for line in done.stderr.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert len(progress) == len(data["notebooks"])  # one progress line per graded notebook
    graded_cases = {case_of(nb["path"], folder) for nb in data["notebooks"]}
    assert graded_cases == {n for n, c in cases.items() if c.points is not None}
    assert {nb["isolation"] for nb in data["notebooks"]} == {"namespaces"}
    print(f"\n{len(data['notebooks'])} notebooks in {elapsed:.0f} s")


@graded_run
def test_protected_files_are_unchanged_and_nothing_reached_the_grader(graded):
    *_, before, after, _, _, marker = graded
    assert after == before
    assert not marker.exists()


@graded_run
@pytest.mark.parametrize("case", adversarial.CATALOGUE, ids=lambda case: case.name)
def test_each_case_gets_what_its_row_says(graded, case):
    """One row of the catalogue: its points, chapter, statuses, error words, tampering flags and
    warning; or, for a file that cannot be graded, its one line in the report's errors."""
    _, done, data, *_, folder, _ = graded
    assert data is not None, done.stderr[-3000:]
    if case.points is None:
        errors = [e["error"] for e in data["errors"] if case_of(e["path"], folder) == case.name]
        assert len(errors) == 1 and case.error in errors[0] and "\n" not in errors[0], errors
        return
    results = [nb for nb in data["notebooks"] if case_of(nb["path"], folder) == case.name]
    assert len(results) == 1, f"graded {len(results)} times: {done.stderr[-2000:]}"
    nb = results[0]
    statuses = {e["name"]: e["status"] for e in nb["exercises"]}
    got = (nb["points"], nb["chapter"], {k: statuses.get(k) for k in case.statuses},
           set(nb["tampering_suspected"]))
    assert got == (case.points, case.chapter, case.statuses, case.tampering), (
        f"{case.why}: error={nb['error']!r} {[e['message'][:120] for e in nb['exercises']]}")
    assert case.error in (nb["error"] or ""), nb["error"]
    assert not case.warning or any(case.warning in w for w in nb["warnings"]), nb["warnings"]
    messages = [e["message"] or "" for e in nb["exercises"]]
    assert not case.shown or any(case.shown in m for m in messages), messages
    assert not case.absent or case.absent not in json.dumps(nb), case.why


@graded_run
def test_submission_times_are_nbgrader_s_own(graded):
    """The time a record shows is the assignment folder's timestamp.txt, or none at all."""
    from ..support.adversarial_times import TimeCase

    cases, _, data, *_, folder, _ = graded
    for name, case in cases.items():
        if not isinstance(case, TimeCase):
            continue
        (record,) = [nb for nb in data["notebooks"] if case_of(nb["path"], folder) == name]
        assert record["submitted_at"] == case.submitted_at, (name, record["submitted_at"])
        unknown = [w for w in record["warnings"] if "submission time unknown" in w]
        assert len(unknown) == (case.submitted_at is None and "victim" not in name), name
        assert all("\n" not in w and len(w) < 200 for w in unknown)


@graded_run
def test_no_record_quotes_a_hidden_test(graded):
    """Hidden tests run on the grader's side only: no message or error of any record, attack or
    not, holds a line of them (c3_hidden_tests_from_compile tries to read them in the worker)."""
    data = graded[2]
    hidden = set()
    for notebook in adversarial.SOLUTIONS.glob("*/*.ipynb"):
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell.get("source", ""))
            for block in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", source,
                                    re.DOTALL):
                hidden |= {line.strip() for line in block.splitlines() if len(line.strip()) > 12}
    assert hidden
    for record in data["notebooks"]:
        texts = [record["error"] or ""] + [e["message"] or "" for e in record["exercises"]]
        for text in texts:
            leaked = [line for line in hidden if line in text]
            assert not leaked, (record["path"], leaked[:3])


@graded_run
def test_victims_keep_their_marks(graded):
    cases, _, data, *_, folder, _ = graded
    victims = [nb for nb in data["notebooks"] if "victim" in case_of(nb["path"], folder)]
    assert len(victims) >= 8
    assert all(nb["points"] == nb["max_points"] == 6 and nb["error"] is None for nb in victims)


@graded_run
def test_grader_memory_and_time_stay_within_limits(graded):
    _, _, data, *_ = graded
    heaviest = sorted(data["notebooks"], key=lambda nb: -nb.get("grader_memory_mib", 0))[:3]
    assert data["grader_memory_mib"] < 1024, [(nb["path"], nb.get("grader_memory_mib"))
                                              for nb in heaviest]
    slow = {nb["path"]: nb["seconds"] for nb in data["notebooks"]
            if nb["seconds"] > TIMEOUT + LIMIT}
    assert not slow


@graded_run
def test_no_worker_process_survives(graded):
    """Every process of the users the catalogue's workers ran as is gone."""
    _, _, data, *_ = graded
    uids = {nb["worker_uid"] for nb in data["notebooks"]}
    assert uids and None not in uids
    left = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid in uids:
                    left.append(name)
            except OSError:
                continue
    assert not left


TRUST = adversarial.REPO / "docs" / "instructor" / "trust.md"  # the instructor's trust model


def _bullets(section: str) -> list[str]:
    """The trust model's first bullet list after the text `section` (continuation lines joined),
    up to the first blank line after it."""
    text = TRUST.read_text(encoding="utf-8")
    bullets: list[str] = []
    for line in text[text.index(section):].splitlines()[1:]:
        if line.startswith("- "):
            bullets.append(line[2:].strip())
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
        elif bullets:
            break
    return bullets


def test_the_trust_model_lists_match_the_catalogue():
    """docs/instructor/trust.md claims exactly what the catalogue's cases test."""
    assert _bullets("## What is guaranteed") == list(adversarial.PROTECTED.values())
    assert _bullets("## What is not guaranteed") == list(adversarial.NOT_PROTECTED.values())


def test_every_claim_has_cases_and_every_attack_class_several():
    cases = {case.name: case for case in adversarial.CATALOGUE}
    claims = {c.claim for c in cases.values()}
    assert claims == set(adversarial.PROTECTED) | (
        set(adversarial.NOT_PROTECTED) - {"no-root"})  # no-root: this module's skip condition
    for klass in [f"c{k}" for k in range(1, 9)]:
        attacks = [n for n in cases if n.startswith(klass + "_") and "victim" not in n]
        assert len(attacks) >= 2, klass
        assert f"{klass}_zz_victim" in cases
