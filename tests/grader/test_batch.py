"""`checks.grader.batch`'s pool of grading processes when one of them dies: every notebook gets
exactly one outcome, only those being graded at the time are graded again alone, and one whose
grading process dies alone too is the one given up. The notebooks' grading is a stand-in here
(`stand_in`, run in the real spawned grading processes), so that a death can be staged exactly."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from checks.grader import batch
from checks.grader.results import GradingIncident, Incident, NotGraded

pytestmark = pytest.mark.slow  # each pool starts its processes afresh: about 10 s a test

KILLED_ALONE = "its grading process was killed while it was graded alone"


def stand_in(path: Path, options: dict):
    """A notebook's grading, by its name: `kill*` kills its grading process every time (`late*`
    after 2 s), `once*` the first time only (a marker beside it remembers), `incident*` reports an
    incident; any other takes a moment and is fine."""
    name = Path(path).name
    marker = Path(path).with_suffix(".seen")
    if name.startswith("late"):
        time.sleep(2)
    if name.startswith(("kill", "late")) or name.startswith("once") and not marker.exists():
        marker.write_text("seen")
        os.kill(os.getpid(), signal.SIGKILL)
    if name.startswith("incident"):
        return Incident([str(path)], ["checks/nb01.py"], "changed")
    time.sleep(0.3)
    return NotGraded(f"fine: {name}")


def grade(tmp_path, names: list[str], jobs: int = 2):
    """Run the pool on `names` with the stand-in: ({index: [outcome, ...]}, incident, stderr)."""
    paths = [tmp_path / name for name in names]
    outcomes: dict[int, list] = {}

    def finished(index, outcome, running):
        outcomes.setdefault(index, []).append(outcome)
        if isinstance(outcome, Incident):
            return outcome.with_running(running)
        return None

    _results, _problems, incident = batch._grade_in_parallel(
        paths, {"threads": 1}, jobs, finished, [], [], work=stand_in)
    return outcomes, incident


def graded_again(err: str) -> list[str]:
    """The notebooks named on the 'graded again, one at a time' lines."""
    lines = [line for line in err.splitlines() if "graded again, one at a time" in line]
    return [Path(p).name for line in lines
            for p in line.split(": ", 1)[1].rsplit(": a grading process died", 1)[0].split(", ")]


def test_a_notebook_that_kills_its_grading_process_is_the_only_one_given_up(tmp_path, capfd):
    names = ["a0", "a1", "kill2", "a3", "a4", "a5"]
    outcomes, incident = grade(tmp_path, names)
    assert incident is None
    assert sorted(outcomes) == list(range(len(names)))
    assert all(len(o) == 1 for o in outcomes.values()), outcomes  # one outcome each
    assert KILLED_ALONE in outcomes[2][0].problem
    assert [outcomes[i][0] for i in (0, 1, 3, 4, 5)] == \
        [NotGraded(f"fine: {names[i]}") for i in (0, 1, 3, 4, 5)]
    err = capfd.readouterr().err
    again = graded_again(err)
    # only what was being graded when it died (kill2 and one other, of two processes)
    assert "kill2" in again and len(again) <= 2, again


def test_an_idle_grading_process_of_a_broken_pool_ends_quietly(tmp_path, capfd):
    """a0 is done long before late1 kills its grading process: the other one is idle, waiting
    for a notebook, when the broken pool ends it (SIGTERM), and says nothing."""
    outcomes, _incident = grade(tmp_path, ["a0", "late1"])
    assert outcomes[0] == [NotGraded("fine: a0")] and KILLED_ALONE in outcomes[1][0].problem
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Terminated" not in err, err


def test_a_notebook_killed_once_is_graded_the_second_time(tmp_path, capfd):
    names = ["a0", "once1", "a2", "a3", "a4"]
    outcomes, incident = grade(tmp_path, names)
    assert incident is None and all(len(o) == 1 for o in outcomes.values())
    assert [outcomes[i][0] for i in range(5)] == [NotGraded(f"fine: {n}") for n in names]
    assert len(graded_again(capfd.readouterr().err)) <= 2


def test_an_incident_stops_the_pool_and_no_notebook_is_graded_twice(tmp_path):
    names = ["a0", "a1", "incident2", "a3", "a4", "a5", "a6"]
    outcomes, incident = grade(tmp_path, names)
    assert isinstance(incident, GradingIncident) and "incident2" in str(incident)
    assert all(len(o) == 1 for o in outcomes.values())
    assert 2 in outcomes and max(outcomes) <= 4  # nothing handed over after it but those running


def test_at_most_jobs_notebooks_are_handed_to_the_pool_at_a_time(tmp_path, capfd):
    """So that a break names only those being graded (a ProcessPoolExecutor queues jobs + 1
    more, which made up to 2 * jobs + 1 notebooks wait to be graded alone)."""
    jobs, names = 3, [f"a{i}" for i in range(8)]
    names[jobs] = "kill"
    outcomes, _incident = grade(tmp_path, names, jobs=jobs)
    assert all(len(o) == 1 for o in outcomes.values()) and len(outcomes) == 8
    assert len(graded_again(capfd.readouterr().err)) <= jobs
