"""Settings for the whole test suite: each test process's share of the cores, and one line at the
end that says under what load the run happened (timings and time limits read differently on a
busy machine)."""

from __future__ import annotations

import os
import sys

import pytest


def _test_processes(config) -> int:
    """How many processes run tests at once: pytest-xdist's workers (`-n N`), or this one."""
    workers = getattr(config.option, "numprocesses", None)  # an int once xdist has read `-n`
    return workers if isinstance(workers, int) and workers > 0 else 1


def pytest_configure(config):
    """Give torch (in every test process, and in every kernel, grader and worker a test starts)
    the cores divided by the test processes, unless OMP_NUM_THREADS says otherwise. PyTorch's
    thread pools spin while they wait for each other: more threads than free cores make a busy
    machine far slower (a chapter took 189 s instead of 31 s with one thread). xdist's workers
    start after this hook and inherit the variable; nothing has imported torch yet."""
    global _LOAD_AT_START
    _LOAD_AT_START = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // _test_processes(config))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:                  # too late for the variable: set it directly
            sys.modules["torch"].set_num_threads(threads)


_LOAD_AT_START: float | None = None

# pytest-xdist (`make test` runs `-n 2 --dist loadfile`: each test module runs whole in one
# process, so its module-scoped fixtures, such as a graded class or an nbgrader course, are built
# once). The modules that start the grader's workers take turns: some of their tests look at every
# worker process on the machine (none left over; one running now) and would see the other
# module's. (xdist's own `loadgroup` cannot group them: it renames test ids, which pytest 9 no
# longer allows.)
GRADER_WORKER_MODULES = {"test_adversarial", "test_benchmark", "test_cli", "test_grading"}


@pytest.fixture(scope="module", autouse=True)
def _one_grader_module_at_a_time(request, tmp_path_factory):
    module = request.module.__name__.rsplit(".", 1)[-1]
    if module not in GRADER_WORKER_MODULES or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl

    # The run's temporary folder, shared by its xdist workers (each has a subfolder of it).
    lock = tmp_path_factory.getbasetemp().parent / "grader-worker-modules.lock"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)          # released when the module's tests are done
        yield


def pytest_terminal_summary(terminalreporter, config):
    if _LOAD_AT_START is None or hasattr(config, "workerinput"):   # an xdist worker
        return
    terminalreporter.write_line(
        f"machine: {os.cpu_count()} cores, load average {_LOAD_AT_START:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end; {_test_processes(config)} test process(es), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
