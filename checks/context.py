"""Where the notebooks run: a learner's JupyterLab, or a grader (and how much time to spend).

One environment variable, `LLAMA_COURSE_GRADING`, tells the notebooks that a machine is running
them rather than a person: `python -m checks status|grade` and the test suite set it, and
nbgrader's own `NBGRADER_EXECUTION` (which `autograde` and `validate` set around execution, and
the kernel inherits) counts too. In that context:

- an unstarted exercise fails its self-check (it scores zero), where in JupyterLab the learner
  sees the yellow "not started" line and Run All goes on;
- timing and demonstration cells do the smallest run that still exercises their code
  (`demo_size`), so that no graded result depends on how busy the machine is.

`time_budget` is how every timing cell measures: for a budget of seconds, not a fixed amount of
work (`checks.timing` measures; this module picks the budget, a learner's or a grader's).
Torch's threads are set here too: `configure_threads` for the process, `one_thread` for a check.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from . import timing
from .environment import _NBGRADER_ENV, GRADING_ENV, QUICK_DEMOS_ENV, THREADS_ENV
from .timing import Timing

T = TypeVar("T")


def grading() -> bool:
    """True when a grader, a status run, the test suite or nbgrader runs this notebook."""
    return _flag(GRADING_ENV) or bool(os.environ.get(_NBGRADER_ENV))


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def quick_demos_asked() -> bool:
    """Whether `LLAMA_COURSE_QUICK_DEMOS` asks for a learner's run with the grader's
    demonstration sizes (a quick look through a release: chapter 14's training takes seconds
    instead of minutes)."""
    return _flag(QUICK_DEMOS_ENV)


def quick_demos() -> bool:
    """True under a grader, and where `LLAMA_COURSE_QUICK_DEMOS` asks for quick demonstrations."""
    return grading() or quick_demos_asked()


def demo_size(full: T, quick: T) -> T:
    """`full` for a learner in JupyterLab, `quick` (the smallest run that still exercises the
    code) under a grader or with `LLAMA_COURSE_QUICK_DEMOS`."""
    return quick if quick_demos() else full


def demo_file(name: str) -> Path | io.BytesIO:
    """Where a demonstration cell writes a file: an empty in-memory file under a grader; for a
    learner, `name` in a new folder of the system's temporary directory, so that running a
    notebook never leaves a file in the course's folders (nbgrader would copy it into the
    release, and git would list it)."""
    if grading():
        return io.BytesIO()
    return Path(tempfile.mkdtemp(prefix="llama-course-")) / name


def grading_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default: this process's environment) with the grading flag set, for
    the processes a grader starts."""
    env = dict(os.environ if base is None else base)
    env[GRADING_ENV] = "1"
    return env


def time_budget(fn: Callable[[], Any], *, budget: float | None = None, warmup: int = 1,
                min_repeats: int = 3, max_repeats: int = 10_000,
                sync: Callable[[], None] | None = None) -> Timing:
    """Time `fn()` for about `budget` seconds: `warmup` untimed calls, then timed calls until
    the budget is spent (at least `min_repeats`, at most `max_repeats`); the median counts.

    The default budget is 2 s for a learner and 0.05 s under a grader, where the point is only
    that the code runs. `sync` (for example `torch.cuda.synchronize`) runs after every call so
    that asynchronous devices are timed to completion. (The measuring is
    `checks.timing.time_budget`; this picks the budget.)"""
    return timing.time_budget(fn, budget=demo_size(2.0, 0.05) if budget is None else budget,
                              warmup=warmup, min_repeats=min_repeats, max_repeats=max_repeats,
                              sync=sync)


def configure_threads() -> None:
    """Set torch's threads for this process: `LLAMA_COURSE_THREADS` when a grader (or the
    learner) gave a number; otherwise one thread inside a notebook kernel unless
    `OMP_NUM_THREADS` says otherwise; anything else keeps torch's default.

    Why one thread in a kernel: the course's tensors (the real SmolLM2 included) are small, so
    a second thread saves little on a quiet machine (chapter 12: 15.8 s with two threads, 15.9 s
    with one, on 2 cores), while on a busy one every parallel region waits for a thread the
    system has descheduled (chapter 12 with two CPU hogs alongside: 94 s with two threads, 16 s
    with one)."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value.isdigit() and int(value) > 0:
        wanted = int(value)
    elif "ipykernel" in sys.modules and not os.environ.get("OMP_NUM_THREADS"):
        wanted = 1
    else:
        return
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


def one_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` run on one CPU thread, the caller's setting back after (chapters 13 and 14 decorate
    their checks with it). Their models are tiny, so their time goes into the fixed cost of each
    operation, which more threads do not shorten; on a busy machine the threads of each small
    operation also wait for one another (measured beside two busy processes on 2 cores:
    check_generate took 0.8 s on one thread, 28 s on two)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        saved = torch.get_num_threads()
        if saved == 1:
            return fn(*args, **kwargs)
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(saved)
    return run
