"""How many threads torch gets once `checks` is imported: one in a notebook kernel (the course's
tensors are small, and threads waiting for descheduled threads made a loaded chapter six times
slower), what a grader or the learner asks for with LLAMA_COURSE_THREADS, and torch's own default
everywhere else (the benchmark and plain scripts); and `one_thread`, the decorator of chapters 13
and 14's checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# What the kernel's import cell does, with ipykernel imported first as in a Jupyter kernel.
PROBE = """
import sys, torch
if sys.argv[1] == "kernel":
    import ipykernel  # noqa: F401 - a notebook kernel has it loaded before the first cell
default = torch.get_num_threads()
import checks  # noqa: F401
print(default, torch.get_num_threads())
"""


def threads(where: str, **env: str) -> tuple[int, int]:
    """(torch's default, torch's threads after `import checks`) in a fresh process."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_NUM_THREADS", "LLAMA_COURSE_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE, where], env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    default, after = map(int, out.split())
    return default, after


@pytest.mark.slow
def test_a_notebook_kernel_runs_on_one_thread():
    assert threads("kernel")[1] == 1


@pytest.mark.slow
def test_the_learner_or_a_grader_can_ask_for_more():
    assert threads("kernel", LLAMA_COURSE_THREADS="3")[1] == 3
    assert threads("script", LLAMA_COURSE_THREADS="2")[1] == 2


@pytest.mark.slow
def test_omp_num_threads_is_respected_in_a_kernel():
    assert threads("kernel", OMP_NUM_THREADS="2")[1] == 2


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: torch's default is one thread")
def test_outside_a_kernel_torch_keeps_its_default():
    default, after = threads("script")
    assert default > 1 and after == default


def test_one_thread_runs_a_check_on_one_thread_and_gives_the_setting_back():
    import torch

    from checks import nb13, nb14
    from checks.context import one_thread

    def boom():
        raise ValueError("a failing check")

    assert nb13._one_thread is nb14._one_thread is one_thread    # one definition, both chapters
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert one_thread(torch.get_num_threads)() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError):
            one_thread(boom)()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(saved)
