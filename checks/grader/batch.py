"""Grading many notebooks: `grade_each` grades them `--jobs` at a time (each in its own grading
process with its share of the cores, and its own worker), shows each result in the order given
as soon as it and those before it are done, and stops at the first incident. One notebook that
cannot be graded is one line; one that hangs, crashes or misbehaves never stops the others."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from ..environment import GRADING_ENV, THREADS_ENV
from ..i18n import _
from .grading import grade_notebook
from .isolation import make_undumpable, python_startup_files
from .limits import Limits, cores
from .report import progress_line, report_problem
from .options import GradeOptions
from .results import (Graded, GradingError, GradingIncident, Incident, NotebookResult,
                      NotGraded, Outcome, printable)
from .tripwire import Tripwire, course_files, short_path, submission_times


def grade_each(paths: list[Path], options: GradeOptions, show: Callable[[NotebookResult], None],
               *, roots: list[Path] = (), progress: bool = True,
               on_result: Callable[[NotebookResult], object] | None = None,
               outputs: list[Path] | tuple = ()
               ) -> tuple[list[NotebookResult], list[GradingError], GradingIncident | None]:
    """Grade notebooks, `options.jobs` at a time (`roots`: the folders or files given, which
    the workers must not see), handing each result to `on_result` as soon as it is graded (in
    the order they finish: where results are saved, so that none waits to be lost), showing
    each in the order of `paths` as soon as it and those before it are done, and (`progress`)
    a progress line on stderr as each finishes. One that cannot be graded is reported in one
    line and skipped. A notebook that hangs, crashes or misbehaves scores zero where it must
    and never stops the others.

    The course's code, the sources and every notebook in `paths` are hashed first and compared
    after each notebook: a change stops grading (no notebook starts after it) and is returned
    as the incident, naming the notebooks that were being graded."""
    tripwire = Tripwire([*course_files(options.source), *python_startup_files(), *paths,
                         *submission_times(paths)])
    jobs = max(1, min(options.jobs, len(paths)))
    plan = grading_plan(options, list(roots) or paths, threads=max(1, cores() // jobs))
    outcomes: dict[int, Outcome] = {}
    results: list[NotebookResult] = []
    problems: list[GradingError] = []
    shown = 0

    def finished(index: int, outcome: Outcome, running: list[Path]) -> GradingIncident | None:
        nonlocal shown
        outcomes[index] = outcome
        changed = tripwire.changed()
        if isinstance(outcome, Incident):  # and what the run's own tripwire saw beside it
            incident = outcome.with_running(running)
            incident.changed += [c for c in (printable(short_path(p)) for p in changed)
                                 if c not in incident.changed]
            return incident
        if changed:
            return GradingIncident([str(paths[index]), *map(str, running)],
                                   [short_path(p) for p in changed])
        if on_result is not None and isinstance(outcome, Graded):
            on_result(outcome.result)
            tripwire.rewatch(outputs)  # as the grader wrote them: nobody else may change them
        if progress:
            progress_line(len(outcomes), len(paths), paths[index], outcome)
        while shown in outcomes:
            outcome = outcomes[shown]
            if isinstance(outcome, Graded):
                results.append(outcome.result)
                show(outcome.result)
            else:
                problem = GradingError(paths[shown], outcome.problem)
                report_problem(problem)
                problems.append(problem)
            shown += 1
        return None

    if jobs == 1:
        for index, path in enumerate(paths):
            incident = finished(index, _grade_one(path, plan), [])
            if incident:
                return results, problems, incident
        return results, problems, None
    return _grade_in_parallel(paths, plan, jobs, finished, results, problems)


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into the same clean ending as Ctrl-C: the `finally` blocks on the way
    out end every process the grader started (grading processes, zygotes, workers)."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside: SIGTERM raises `Terminated` (once; a second one during the clean-up is
    ignored, so that the clean-up finishes)."""
    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread (a test runner's): signals stay as they are
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _end_processes(processes, wait_s: float = 30.0) -> None:
    """SIGTERM each grading process (each closes its worker and exits), then SIGKILL whatever
    is still there after `wait_s` seconds."""
    for process in processes:
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5)


def _grade_in_parallel(paths, options, jobs, finished, results, problems, work=None):
    """`jobs` grading processes at a time, each grading one notebook with `work` (default
    `_grade_one`). A grading process that dies (killed from outside, by the OOM killer, or by a
    submission's worker where there are no walls) breaks the whole pool: the notebooks being
    graded then are graded again one at a time, each in a pool of its own, so that only one
    whose grading process dies again alone is given up; the rest go on in a fresh pool. When a
    grading process cannot even start, the grader's environment is at fault: every notebook
    left says so, and grading ends."""
    work = work or _grade_one
    incident, todo = None, list(range(len(paths)))
    while todo and incident is None:
        round_ = _pool_round(paths, todo, options, jobs, finished, work)
        incident, todo = round_.incident, round_.unsent
        if round_.in_flight and incident is None:
            report_problem(GradingError(", ".join(str(paths[i]) for i in round_.in_flight), _(
                "a grading process died (killed from outside, or by a submission): these "
                "notebooks are graded again, one at a time")))
        for number, index in enumerate(round_.in_flight):
            if incident is not None:
                break
            alone = _pool_round(paths, [index], options, 1, finished, work, probe=True)
            incident = alone.incident
            if alone.cannot_start:
                left = [*round_.in_flight[number:], *todo]
                return results, problems, _give_up(left, finished, _(
                    "could not be graded: the grader's grading processes do not start (its "
                    "environment is at fault, not the submissions)"))
            if (alone.in_flight or alone.unsent) and incident is None:
                incident = finished(index, NotGraded(_(
                    "could not be graded: its grading process was killed while it was graded "
                    "alone (a submission that signals the grader's processes? grade as root, "
                    "with walls)")), [])
    return results, problems, incident


def _give_up(indices: list[int], finished, why: str) -> GradingIncident | None:
    """Each of `indices` ends with the problem `why` (so that the table goes on in order)."""
    incident = None
    for index in indices:
        incident = incident or finished(index, NotGraded(why), [])
    return incident


@dataclass
class _Round:
    """How one pool's grading ended."""

    incident: GradingIncident | None = None
    in_flight: list[int] = field(default_factory=list)  # being graded when the pool broke
    unsent: list[int] = field(default_factory=list)  # not yet handed to the pool by then
    cannot_start: bool = False  # (a probed pool) its grading process never started


def _pool_round(paths, indices: list[int], options, jobs: int, finished, work, *,
                probe: bool = False) -> _Round:
    """Grade `indices` in one pool of `jobs` processes, every outcome to `finished`. At most
    `jobs` notebooks are handed to the pool at a time, so that each one handed over is being
    graded: when the pool breaks, those are the ones a dead process may have been grading.
    `probe`: first check that a grading process starts at all."""
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_child_setup, initargs=(options["threads"],))
    done_round, queue, futures = _Round(), list(indices), {}
    try:
        if probe and not _starts(pool):
            done_round.cannot_start, done_round.unsent = True, queue
            return done_round
        broken = not _hand_over(pool, queue, futures, jobs, work, paths, options)
        while futures and done_round.incident is None:
            done, _pending = wait(futures, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.get):
                index = futures.pop(future)
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    done_round.in_flight.append(index)
                    broken = True
                    continue
                except Exception as exc:  # noqa: BLE001 - a grading process that failed
                    outcome = NotGraded(_("could not be graded ({error}: {why})").format(
                        error=type(exc).__name__, why=exc))
                now = [paths[i] for i in futures.values()]
                done_round.incident = done_round.incident or finished(index, outcome, now)
            if not broken and done_round.incident is None:
                broken = not _hand_over(pool, queue, futures, jobs, work, paths, options)
        done_round.unsent = queue
    except BaseException:  # Ctrl-C, SIGTERM: no grading process may outlive this one
        _end_processes(list(getattr(pool, "_processes", {}).values()))
        raise
    finally:
        if done_round.incident is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=True, cancel_futures=True)
    return done_round


def _hand_over(pool, queue: list[int], futures: dict, jobs: int, work, paths, options) -> bool:
    """Submit the next notebooks of `queue` until `jobs` are being graded; False when the pool
    is broken (the notebook not handed over stays first in `queue`)."""
    while queue and len(futures) < jobs:
        try:
            futures[pool.submit(work, paths[queue[0]], options)] = queue[0]
        except BrokenProcessPool:
            return False
        queue.pop(0)
    return True


def _starts(pool) -> bool:
    """Whether a grading process of `pool` starts (runs its set-up and answers)."""
    try:
        return pool.submit(_alive).result()
    except BrokenProcessPool:
        return False


def _alive() -> bool:
    return True


def _child_setup(threads: int) -> None:
    """A grading process of `--jobs`: the grading flag and its share of the cores."""
    os.environ[GRADING_ENV] = "1"
    os.environ[THREADS_ENV] = str(threads)
    torch.set_num_threads(threads)
    make_undumpable()
    global _in_grading_process
    _in_grading_process = True
    signal.signal(signal.SIGTERM, _end_this_grading_process)


_in_grading_process = False  # this process is one of --jobs' grading processes


_grading_now = False  # this grading process is inside `_grade_one`


def _end_this_grading_process(signum, frame) -> None:
    """SIGTERM in a grading process of `--jobs`: stop the notebook (its worker is closed on the
    way out of `_grade_one`), then exit; an idle one (waiting for a notebook: a broken pool ends
    them all) exits at once, quietly."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not _grading_now:
        os._exit(143)
    raise Terminated()


def grading_plan(options: GradeOptions, roots: list[Path], threads: int) -> dict:
    """What each grading process needs (plain data: it crosses to --jobs' processes): the
    sources, its threads, the folders its workers must not see (those of `roots`, and
    `options.hide`), the limits."""
    hide = [p if p.is_dir() else p.parent for p in roots] + list(options.hide)
    return {"source": options.source, "threads": threads, "hide": [p.resolve() for p in hide],
            "limits": Limits(cell_timeout=options.timeout, memory=options.memory,
                             cpu=options.cpu_time, output=options.max_output, threads=threads,
                             memory_by=options.memory_by,
                             notebook_time=options.notebook_timeout)}


def _grade_one(path: Path, options: dict) -> Outcome:
    """Grade one notebook: its result, why it could not be graded, or an incident."""
    global _grading_now
    _grading_now = True
    try:
        return Graded(grade_notebook(
            path, source_dir=options["source"], limits=options["limits"], hide=options["hide"],
            tripwire=Tripwire([*course_files(options["source"]), *python_startup_files(),
                               path])))
    except Terminated:
        if _in_grading_process:  # of --jobs: its worker is closed by now
            os._exit(143)
        raise
    except GradingError as problem:
        return NotGraded(problem.problem)
    except GradingIncident as incident:
        return Incident(incident.notebooks, incident.changed, incident.what)
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not stop a class's grading
        return NotGraded(_("could not be graded ({error}: {why})").format(
            error=type(exc).__name__, why=exc))
    finally:
        _grading_now = False
