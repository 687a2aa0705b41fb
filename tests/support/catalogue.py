"""Shared machinery for testing checkers against correct and known-wrong implementations."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Callable

import pytest

from checks.engine import CheckFailure, NotStarted

SEEDS = (0, 1, 2, 3, 12345)


@dataclass
class Wrong:
    """A plausible wrong implementation and the words its diagnosis must contain."""

    name: str
    fn: Callable
    diagnosis: str  # substring expected in the failure message or hint (case-insensitive)

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
    text = str(failure).lower()
    assert wrong.diagnosis.lower() in text, (
        f"{wrong.name}: expected the diagnosis to mention {wrong.diagnosis!r}, got:\n{failure}")
    return failure


def not_started(*args, **kwargs):
    raise NotImplementedError()
