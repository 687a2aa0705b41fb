"""Settings for the whole test suite: each test process's share of the cores, and one line at the
end that says under what load the run happened (timings and time limits read differently on a
busy machine)."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

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

# Markers (registered in pyproject.toml, with --strict-markers), so that `make test-fast`
# (-m "not slow and not grader_workers") can leave these tests out. A test file may mark its own
# (`pytestmark`, `@pytest.mark.slow`); these tables mark the rest, by path under tests/ (None: the
# whole module; else the tests of that name: a name that is gone is a warning).
SLOW = {
    "course/test_browser.py": None,                 # JupyterLab and Chromium
    "course/test_nbgrader_roundtrip.py": None,      # nbgrader's command line, for real
    "course/test_release_notebooks_run.py": None,   # every learner notebook executed
    "tools/test_release.py": None,                  # nbgrader regenerates the release
    "smollm/test_oracle_smollm.py": None,           # the real model, twice (ours and HF's)
    "core/test_threads.py": None,                   # notebook kernels and fresh interpreters
    "core/test_fonts.py": {                         # a fresh machine's empty matplotlib cache
        "test_chapter_01s_first_figure_is_silent_with_an_empty_matplotlib_cache",
        "test_without_the_bold_stand_in_the_fresh_machine_warns"},
    "core/test_timing.py": {                        # the command line, tiny and on the real model
        "test_headless_command_runs_tiny", "test_headless_command_runs_the_real_model",
        "test_command_refuses_cuda_without_a_gpu"},
    "tools/test_benchmark.py": {"test_quick_benchmark_runs_every_section"},
}
# The tests that start the grader's workers, or look at every worker process on the machine.
GRADER_WORKERS = {
    "grader/test_grading.py": {
        "test_solution_gets_full_marks_and_stays_untouched",
        "test_fresh_release_scores_zero_not_started",
        "test_tampered_tests_are_restored_and_sys_exit_costs_only_its_exercise",
        "test_a_cell_that_kills_the_worker_costs_only_its_exercise",
        "test_the_notebook_budget_ends_a_notebook_of_slow_cells",
        "test_memory_limit_counts_memory_used_not_address_space",
        "test_a_fault_costs_only_its_exercise_and_those_that_call_it",
        "test_a_fault_in_a_chinese_submission_costs_the_same_and_reads_in_chinese"},
    "grader/test_cli.py": {
        "test_grade_a_class_folder_past_a_hanging_and_a_broken_submission",
        "test_a_changed_file_stops_grading_with_an_incident_report",
        "test_a_killed_grading_process_costs_nothing"},
    "tools/test_benchmark.py": {"test_quick_benchmark_runs_every_section"},
}
TESTS = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(config, items):
    for marker, table in (("slow", SLOW), ("grader_workers", GRADER_WORKERS)):
        modules = {}
        for item in items:
            where = Path(str(item.path)).relative_to(TESTS).as_posix() \
                if Path(str(item.path)).is_relative_to(TESTS) else None
            if where in table:
                modules[where] = item.module
                names = table[where]
                if names is None or getattr(item, "originalname", item.name) in names:
                    item.add_marker(marker)
        for where, module in modules.items():
            gone = sorted(name for name in table[where] or () if not hasattr(module, name))
            if gone:   # said, not fatal: the file's owner may be renaming it right now
                warnings.warn(pytest.PytestConfigWarning(
                    f"tests/conftest.py marks {where}::{gone[0]} {marker}: there is no such "
                    "test (rename it there, or mark the test in its own file)"))


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
