"""Shared machinery for testing checkers against correct and known-wrong implementations."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Callable

import pytest

from checks.engine import CheckFailure, NotStarted
from checks.mistakes import ID_PATTERN

SEEDS = (0, 1, 2, 3, 12345)


@dataclass
class Wrong:
    """A plausible wrong implementation and the mistake its diagnosis must name.

    `diagnosis` is the id of the declared mistake ("04.attention_scores.missing_scale",
    checks.mistakes), which the failure must carry exactly. Words are refused when the case is
    built: a catalogue asserts ids, never wording, so rewording or translating a message breaks
    no test."""

    name: str
    fn: Callable
    diagnosis: str

    def __post_init__(self) -> None:
        if not (isinstance(self.diagnosis, str) and ID_PATTERN.match(self.diagnosis)):
            raise ValueError(f"{self.name}: give the id of the declared mistake (NN.exercise.key,"
                             f" checks.mistakes), not {self.diagnosis!r}")

    @property
    def mistake(self) -> str:
        """The mistake id this case asserts."""
        return self.diagnosis

    def __repr__(self) -> str:  # shown as the pytest id
        return self.name


def assert_passes(checker: Callable, fn: Callable, seed: int) -> None:
    """A correct implementation passes, silently on stderr, and shows a pass line on stdout."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        checker(fn, seed=seed)
    assert err.getvalue() == "", f"stderr not silent: {err.getvalue()!r}"
    assert "passed" in out.getvalue()


def assert_rejects(checker: Callable, wrong: Wrong, seed: int) -> CheckFailure:
    """A wrong implementation fails (not as 'not started') and the diagnosis names the mistake."""
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(CheckFailure) as info:
        checker(wrong.fn, seed=seed)
    failure = info.value
    assert not isinstance(failure, NotStarted)
    assert failure.mistake == wrong.mistake, (
        f"{wrong.name} at seed {seed}: expected the mistake {wrong.mistake!r}, got "
        f"{failure.mistake!r}:\n{failure}")
    return failure


def failure_text(checker: Callable, fn: Callable, seed: int = 0) -> str:
    """The failure a checker reports for `fn` (it must fail), as the learner reads it."""
    with pytest.raises(CheckFailure) as info:
        checker(fn, seed=seed)
    return str(info.value)


def not_started(*args, **kwargs):
    raise NotImplementedError()


def assert_passes_thorough(checker: Callable, fn: Callable, seed: int = 7) -> None:
    """As `assert_passes`, with the checker's thorough mode (more and larger cases)."""
    assert_passes(lambda f, seed: checker(f, seed=seed, thorough=True), fn, seed)


def assert_not_started(checker: Callable) -> None:
    """The stub a released notebook starts with reads as not started, not as a mistake."""
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(NotStarted):
        checker(not_started, seed=0)


@dataclass
class Exercise:
    """One exercise of a chapter, as tests/checkers/test_contract.py holds its checker to the
    contract: every correct implementation passes (plain at every seed, and thorough) with a
    silent stderr; every wrong one is rejected with its diagnosis; the stub reads as not
    started. Each chapter's test file lists its exercises in `EXERCISES`."""

    checker: Callable
    correct: dict[str, Callable]  # label: an implementation that must pass
    wrong: list[Wrong]

    @property
    def name(self) -> str:
        return self.checker.__name__.removeprefix("check_")


def implementations(*fns: Callable, **labelled: Callable) -> dict[str, Callable]:
    """Labelled correct implementations, for `Exercise.correct`: a function of
    `checks.reference` is "reference", any other its own name; a lambda needs a keyword label."""
    def label(fn):
        assert fn.__name__ != "<lambda>", "give a lambda a label: implementations(label=...)"
        return "reference" if fn.__module__.startswith("checks.reference") else fn.__name__
    out = {label(fn): fn for fn in fns}
    assert len(out) == len(fns) and not set(out) & set(labelled), [label(f) for f in fns]
    return {**out, **labelled}


def exercises(correct: dict[Callable, dict[str, Callable]],
              wrong: dict[Callable, list[Wrong]]) -> list[Exercise]:
    """A chapter's `EXERCISES` from its correct and wrong implementations, keyed by checker."""
    assert set(correct) == set(wrong), "one catalogue of each kind for every checker"
    return [Exercise(checker, correct[checker], wrong[checker]) for checker in correct]
