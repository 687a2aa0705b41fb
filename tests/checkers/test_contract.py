"""The contract every checker keeps, over every chapter's exercises: each correct implementation
passes, plain at every seed and thorough, with nothing on stderr; each wrong implementation in the
chapter's catalogue is rejected (as a mistake, not as "not started") with its diagnosis; the stub
a released notebook starts with reads as not started.

The catalogues are data in the chapter files (`EXERCISES` in test_nbNN.py, one per chapter of the
syllabus, checks.exercises.SYLLABUS), which also hold the tests that are their chapter's alone.
Each case is a test of its own, named `nbNN-exercise-implementation` (and the seed):
`-k nb04-attention` runs one exercise.
"""

from __future__ import annotations

import importlib
import re

import pytest

from checks.exercises import SYLLABUS

from ..support.catalogue import (SEEDS, Exercise, assert_not_started, assert_passes,
                                 assert_passes_thorough, assert_rejects)

CHAPTERS = [f"nb{chapter.number}" for chapter in SYLLABUS]
EXERCISES: dict[str, list[Exercise]] = {
    chapter: importlib.import_module(f"{__package__}.test_{chapter}").EXERCISES
    for chapter in CHAPTERS}


_SYMBOLS = {"//": " floordiv ", "/": " div ", "%": " mod ", "+": " plus ", "*": " times ",
            "^": "", "=": " eq ", "<": " lt ", ">": " gt ", "²": "2"}


def _slug(label: str) -> str:
    """A label as a test id: words joined by "_", operators spelled out ("h % N_kv" is
    "h_mod_N_kv", not the same id as "h // N_kv")."""
    for symbol, word in _SYMBOLS.items():
        label = label.replace(symbol, word)
    return re.sub(r"[^A-Za-z0-9.]+", "_", label).strip("_")


def _cases(kind: str) -> list:
    """pytest.param(checker, implementation) for every correct or wrong implementation, each
    with its id; two implementations of one exercise may not share a label."""
    cases = []
    for chapter, exercises in EXERCISES.items():
        for exercise in exercises:
            items = exercise.correct.items() if kind == "correct" else \
                [(wrong.name, wrong) for wrong in exercise.wrong]
            ids = [f"{chapter}-{exercise.name}-{_slug(label)}" for label, _ in items]
            assert len(set(ids)) == len(ids), f"{chapter} {exercise.name}: labels collide"
            cases += [pytest.param(exercise.checker, fn, id=case_id)
                      for case_id, (_, fn) in zip(ids, items)]
    return cases


CORRECT = _cases("correct")
WRONG = _cases("wrong")
STUBS = [pytest.param(e.checker, id=f"{chapter}-{e.name}")
         for chapter, exercises in EXERCISES.items() for e in exercises]


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("checker,fn", CORRECT)
def test_correct_implementation_passes(checker, fn, seed):
    assert_passes(checker, fn, seed)


@pytest.mark.parametrize("checker,fn", CORRECT)
def test_correct_implementation_passes_thorough(checker, fn):
    assert_passes_thorough(checker, fn)


@pytest.mark.parametrize("seed", SEEDS[:3], ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("checker,wrong", WRONG)
def test_wrong_implementation_is_diagnosed(checker, wrong, seed):
    assert_rejects(checker, wrong, seed)


# A learner with a mistake must not pass on a lucky run: every catalogued mistake is named at
# every one of these seeds (the three above are the edit loop's; these 20 are make test's).
EVERY_SEED = range(100, 120)


@pytest.mark.slow
@pytest.mark.parametrize("checker,wrong", WRONG)
def test_wrong_implementation_is_diagnosed_at_every_seed(checker, wrong):
    for seed in EVERY_SEED:
        assert_rejects(checker, wrong, seed)


@pytest.mark.parametrize("checker", STUBS)
def test_stub_reads_as_not_started(checker):
    assert_not_started(checker)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_checker_has_its_exercise_and_a_catalogue_of_three(chapter):
    module = importlib.import_module(f"checks.{chapter}")
    checkers = {name for name, value in vars(module).items() if name.startswith("check_")
                and getattr(value, "__module__", None) == module.__name__}
    exercises = EXERCISES[chapter]
    assert sorted(f"check_{e.name}" for e in exercises) == sorted(checkers)
    assert all(e.correct and len(e.wrong) >= 3 for e in exercises), chapter
