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

# Markers (registered in pyproject.toml, with --strict-markers) live in the test files themselves
# (`pytestmark = pytest.mark.slow`, `@pytest.mark.grader_workers`), so that a renamed test keeps
# its marker; `make test-fast` (-m "not slow and not grader_workers") leaves both out.


# pytest-xdist (`make test` runs `-n 2 --dist loadfile`: each test module runs whole in one
# process, so its module-scoped fixtures, such as a graded class or an nbgrader course, are built
# once). The tests marked grader_workers take turns: some of them look at every worker process on
# the machine (none left over; one running now) and would see another test's. The lock is taken
# before the test's fixtures are set up (a module-scoped fixture that grades is set up by the first
# test that needs it) and released after its teardown; the worker-free tests of the same modules
# run meanwhile. (xdist's own `loadgroup` cannot group them: it renames test ids, which pytest 9
# no longer allows.)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("grader_workers") is None or \
            not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl

    # The run's temporary folder, shared by its xdist workers (each has a subfolder of it).
    lock = item.config._tmp_path_factory.getbasetemp().parent / "grader-workers.lock"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# Reports: a test module may define `terminal_summary()`, returning lines about what its tests
# saw (the oracles' largest differences). The lines are printed once at the end of the run, after
# every test (under xdist, from each worker's modules).
_SUMMARIES: list[str] = []


def _module_summaries() -> list[str]:
    lines = []
    for name, module in sorted(sys.modules.items()):
        summary = getattr(module, "terminal_summary", None) if name.startswith("tests.") else None
        if callable(summary):
            lines += summary()
    return lines


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):          # an xdist worker: send them home
        session.config.workeroutput["terminal_summaries"] = _module_summaries()


@pytest.hookimpl(optionalhook=True)                     # xdist's hook, in the controller
def pytest_testnodedown(node, error):
    _SUMMARIES.extend(getattr(node, "workeroutput", {}).get("terminal_summaries", []))


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):   # an xdist worker
        return
    for line in _SUMMARIES or _module_summaries():
        terminalreporter.write_line(line)
    if _LOAD_AT_START is None:
        return
    terminalreporter.write_line(
        f"machine: {os.cpu_count()} cores, load average {_LOAD_AT_START:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end; {_test_processes(config)} test process(es), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
