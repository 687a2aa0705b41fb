"""Earlier exercises that a check's function builds on: which of them the learner's function really
called (`CallRecord`), and the knock-on rule (`builds_on`): when the check fails and an earlier
exercise the function called fails its own check, the failure says "fix that one first"."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..i18n import _
from ..mistakes import Mistake, fix_first_key
from .failures import PACKAGE_DIR, CheckFailure, ForbiddenCall, NotStarted
from .state import quiet

_recording: contextvars.ContextVar = contextvars.ContextVar("checks_recording", default=None)
# Library code (torch, the standard library, installed packages) is never the learner's either:
# `F.silu` is a Python function named like chapter 09's exercise, and must not count as a call of
# the learner's own `silu`.
_LIBRARY_DIRS = tuple(dict.fromkeys(
    [os.path.dirname(torch.__file__), os.path.dirname(os.__file__),
     *(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))]))


def _chain(first: Callable, then: Callable) -> Callable:
    """One profile function that runs two (sys.setprofile holds only one)."""
    def profile(frame, event, arg):
        first(frame, event, arg)
        then(frame, event, arg)
    return profile


def _qualified_name(frame) -> str:
    code = frame.f_code
    qualname = getattr(code, "co_qualname", None)  # Python 3.11+
    if qualname is None:  # Python 3.10: a method is known by its `self`
        owner = frame.f_locals.get("self") if code.co_varnames[:1] == ("self",) else None
        qualname = code.co_name if owner is None else f"{type(owner).__name__}.{code.co_name}"
    return qualname


class CallRecord:
    """Which earlier exercises of a chapter the learner's function really called while a Check
    called it: the learner's own function (or class, through its methods) of each name, or an
    object the checker was given for that name (chapter 04's helpers), matched by its code.

    Code of this package is never the learner's. A function that runs elsewhere (the grader's
    worker) shows no calls here, so nothing is blamed for it."""

    def __init__(self, names: Iterable[str], given: Mapping[str, Any]):
        self.names = set(names)
        self.given = {name: obj for name, obj in given.items() if obj is not None}
        self._given_codes = {code: name for name, obj in self.given.items()
                             for code in _codes_of(obj)}
        self._looked_at: set = set()
        self.seen: dict[str, Any] = {}  # name: the function or class that ran

    def called(self, name: str) -> Any | None:
        return self.seen.get(name)

    @contextlib.contextmanager
    def watching(self):
        previous = sys.getprofile()
        sys.setprofile(self._profile if previous is None else _chain(self._profile, previous))
        try:
            yield
        finally:
            sys.setprofile(previous)

    def _profile(self, frame, event, arg) -> None:
        if event != "call" or frame.f_code in self._looked_at:
            return
        code = frame.f_code
        self._looked_at.add(code)
        name = self._given_codes.get(code)
        if name is not None:
            self.seen.setdefault(name, self.given[name])
            return
        head = _qualified_name(frame).partition(".")[0]
        if head in self.names and head not in self.given and \
                not code.co_filename.startswith((PACKAGE_DIR, *_LIBRARY_DIRS)):
            obj = frame.f_globals.get(head)
            if obj is not None:
                self.seen.setdefault(head, obj)

    def stub_message(self, exercise: str, tb) -> str | None:
        """For a NotImplementedError raised inside an earlier exercise's stub: which one."""
        last = None
        for frame, _line in traceback.walk_tb(tb):
            if not frame.f_code.co_filename.startswith(PACKAGE_DIR):
                last = frame
        if last is None:
            return None
        head = _qualified_name(last).partition(".")[0]
        named = self._given_codes.get(last.f_code, head)
        if named == exercise or named not in self.names:
            return None
        return _("calls {name}, which is not started yet: write {name} first (its exercise "
                 "comes before this one), then run this check again.").format(name=named)


def _codes_of(obj) -> list:
    """The code objects that run when `obj` (a function, or a class's methods) is called."""
    if isinstance(obj, type):
        return [f.__code__ for f in vars(obj).values() if hasattr(f, "__code__")]
    code = getattr(obj, "__code__", None)
    return [code] if code is not None else []


def earlier_failures(helpers: Mapping[str, Any], earlier: Mapping[str, Callable],
                     seed: int | None) -> tuple[list[str], tuple[str, CheckFailure] | None]:
    """Run the checks of earlier exercises on the learner's `helpers` (name: function or class;
    for blame, only those the function really called: `record.seen`), in the chapter's order,
    quietly and with the failed check's seed: (the names that passed, (name, failure) of the
    first that fails or None). One not started, or a check that cannot run, names nothing."""
    passed = []
    for name, checker in earlier.items():
        helper = helpers.get(name)
        if helper is None:
            continue
        try:
            with quiet():
                checker(helper, seed=seed)
        except NotStarted:
            continue
        except CheckFailure as broken:
            return passed, (name, broken)
        except Exception:  # noqa: BLE001 - a check that went wrong says nothing about the helper
            continue
        passed.append(name)
    return passed, None


def fix_first_text(exercise: str, name: str, broken: CheckFailure) -> Mistake:
    """The hint that sends the learner to the earlier exercise their function is built on: the
    mistake "fix <name> first" (a knock-on failure), told with the helper's own problem."""
    problem = _(broken.hint) if broken.hint else broken.shown_message.splitlines()[0]
    return Mistake(fix_first_key(name), _(
        "your {name} does not pass its own check ({problem}); {exercise} is built on it, so fix "
        "{name} first, then run this check again").format(
            name=name, problem=problem, exercise=exercise))


@contextlib.contextmanager
def builds_on(exercise: str, earlier: Mapping[str, Callable], *,
              given: Mapping[str, Any] | None = None,
              hint: Callable[[CheckFailure, CallRecord], str | None] | None = None):
    """A check of `exercise`, whose function may call earlier exercises of the same chapter:
    `earlier` maps their names to their checkers, in the chapter's order.

    Inside the block, `Check.call` records which of them the learner's function really calls.
    When the check fails, the first one called that fails its own check is named instead ("fix X
    first"): the later exercise cannot pass before it, and what went wrong there may not look
    like any mistake of the later one. A helper the function did not call is never blamed.
    `hint(failure, record)` may choose the hint itself (None: the failure's own)."""
    record = CallRecord(earlier, given or {})
    token = _recording.set(record)
    try:
        yield record
    except (NotStarted, ForbiddenCall):
        raise
    except CheckFailure as failure:
        _recording.reset(token)
        token = None
        if hint is not None:
            better = hint(failure, record)
        else:
            _passed, broken = earlier_failures(record.seen, earlier, failure.seed)
            better = None if broken is None else fix_first_text(exercise, *broken)
        if better is None:
            raise
        raise failure.with_hint(better) from None
    finally:
        if token is not None:
            _recording.reset(token)
