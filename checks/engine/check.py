"""The check itself: `Check` opens one run of one exercise's check, feeds the learner's function
inputs through `Check.call` (forbidden calls blocked, inputs guarded against in-place changes,
exceptions turned into readable failures, calls of earlier exercises recorded) and compares what
comes back with `expect_tensor` / `expect_equal`, naming the likely mistake from known-wrong
variants."""

from __future__ import annotations

import contextlib
import numbers
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .. import display
from ..i18n import _
from ..mistakes import CALLS_REFERENCE, Mistake
from .calls import _chain, _recording
from .compare import _shape_text, describe, matches, mismatch_text, tolerance, values_close
from .failures import CheckFailure, ForbiddenCall, LearnerError, NotStarted
from .forbid import _Forbid
from .in_place import IN_PLACE, changed_inputs, in_place_failure, snapshot_inputs
from .state import _open_checks, _quiet, calling, fresh_seed

def _goes_on_after(exc: NotStarted) -> bool:
    """Whether an unstarted exercise's self-check shows a line instead of raising.

    Only in a learner's Jupyter kernel, for the outermost check the learner ran themselves: a
    grader (`context.grading()`: nbgrader, `python -m checks status|grade`) needs the exception
    to score the exercise zero, and `use_if_passing` (quiet) needs it to pick the reference.
    """
    from .. import context

    return (_open_checks.get() == 0 and not _quiet.get() and display.in_notebook()
            and not context.grading())


# --------------------------------------------------------------------------------------------
# The check itself


class Check:
    """One run of one exercise's check: inputs, calls, comparisons and the final report.

    Use as a context manager; leaving it without an exception reports a pass.
    """

    def __init__(self, exercise: str, fn: Callable, *, seed: int | None = None,
                 forbid: Mapping[str, str] | None = None, errors: Iterable[Mistake] = (),
                 in_place: Mistake | None = None):
        """`forbid`: torch function names the learner may not call, each with its hint.
        `errors`: mistakes recognised from an exception the learner's function raises (each
        declares what it `raises`), tried in order. `in_place`: the mistake a function that
        changes its inputs is told (default: the engine's generic one)."""
        if not callable(fn):
            raise CheckFailure(exercise, _("expected a function, got {value}.").format(
                value=describe(fn)))
        self.exercise = exercise
        self.fn = fn
        self.seed = fresh_seed() if seed is None else seed
        self.gen = torch.Generator().manual_seed(self.seed)
        self.forbid = dict(forbid or {})
        self.errors = tuple(errors)
        self.in_place = in_place or IN_PLACE
        self.calls = 0
        self.properties: list[str] = []  # every comparison's label, in order
        self.headlines: list[str] = []  # what the pass line shows, when a check names them

    # ---- context manager ----
    def __enter__(self) -> "Check":
        self._depth_token = _open_checks.set(_open_checks.get() + 1)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        _open_checks.reset(self._depth_token)
        if exc_type is None and not _quiet.get():
            display.show_pass(self.exercise, self.calls, self.headlines or self.properties)
        if exc_type is not None and issubclass(exc_type, NotImplementedError):
            exc = NotStarted(self.exercise)  # the learner's stub, reached outside `call`
            if not _goes_on_after(exc):
                raise exc from None
        if isinstance(exc, NotStarted) and _goes_on_after(exc):
            display.show_not_started(exc._text())
            return True  # the learner's "Run All" goes on to the next cell
        return False

    # ---- random inputs ----
    def randn(self, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0):
        return (torch.randn(*shape, generator=self.gen, dtype=torch.float64) * scale).to(dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...] = ()) -> torch.Tensor | int:
        """Uniform integers in [low, high); a Python int when `shape` is empty."""
        t = torch.randint(low, high, shape or (1,), generator=self.gen)
        return t if shape else int(t.item())

    def sizes(self, count: int, low: int = 2, high: int = 9) -> list[int]:
        """`count` distinct sizes in [low, high), so that swapped dimensions show up as errors."""
        if high - low < count:
            raise ValueError("size range too small for distinct sizes")
        perm = torch.randperm(high - low, generator=self.gen)[:count] + low
        return [int(v) for v in perm]

    def choice(self, options: list) -> Any:
        return options[self.randint(0, len(options))]

    # ---- calling the learner ----
    def call(self, *args, **kwargs) -> Any:
        """Call the learner's function; turn its exceptions into readable failures."""
        self.calls += 1
        guard = _Forbid(self, self.forbid) if self.forbid else contextlib.nullcontext()
        # When grading, `fn` may run in a worker process: the worker applies the same guard.
        token = calling.set((self.exercise, self.forbid))
        # Copies taken before the call: what the check expects is computed from the inputs as
        # they were, and a function that writes into them fails (unless the check allows it).
        before = snapshot_inputs(args, kwargs, self.fn)
        record = _recording.get()
        watch = record.watching() if record is not None else contextlib.nullcontext()
        try:
            with guard, watch:
                result = self.fn(*args, **kwargs)
        except CheckFailure:
            raise
        except NotImplementedError as exc:
            raise NotStarted(self.exercise, record and record.stub_message(
                self.exercise, exc.__traceback__)) from None
        except Exception as exc:  # noqa: BLE001 - the learner's bug, reported without a traceback wall
            shown = ", ".join([describe(a) for a in args] +
                              [f"{k}={describe(v)}" for k, v in kwargs.items()])
            error = LearnerError.from_exception(self.exercise, exc, shown, seed=self.seed)
            raise error.with_hint(self.recognise(error)) from None
        finally:
            calling.reset(token)
        changed = changed_inputs(before)
        if changed:
            raise in_place_failure(self.exercise, changed, seed=self.seed, hint=self.in_place)
        return result

    def recognise(self, error: "LearnerError") -> Mistake | None:
        """The first of the check's `errors` that recognises the learner's exception."""
        return next((m for m in self.errors if m.recognises(error.error or "", error.error_text)),
                    None)

    def forbid_functions(self, functions: Iterable[Callable], hint: str) -> None:
        """Make `call` fail when the learner's function runs any of `functions` (the course's
        own answers in checks.reference), however they were imported or renamed: they are
        recognised by their code objects while the learner's function runs. `hint` may use
        `{name}`."""
        codes = {id(fn.__code__): fn.__name__ for fn in functions}
        inner = self.fn

        def profile(frame, event, arg):
            if event == "call" and id(frame.f_code) in codes:
                name = codes[id(frame.f_code)]
                raise ForbiddenCall(self.exercise, _("calls checks.reference.{name}, the "
                                    "course's own answer.").format(name=name),
                                    hint=Mistake(CALLS_REFERENCE, _(hint).format(name=name)))

        def guarded(*args, **kwargs):
            previous = sys.getprofile()  # a `builds_on` record's, which must go on seeing calls
            sys.setprofile(profile if previous is None else _chain(profile, previous))
            try:
                return inner(*args, **kwargs)
            finally:
                sys.setprofile(previous)

        guarded.__name__ = getattr(inner, "__name__", self.exercise)
        self.fn = guarded

    # ---- failing ----
    def fail(self, message: str, hint: str | None = None, *, show_seed: bool = True):
        raise CheckFailure(self.exercise, message, hint=hint,
                           seed=self.seed if show_seed else None)

    def note(self, prop: str) -> None:
        """Record a property that was verified, for the pass summary."""
        if prop not in self.properties:
            self.properties.append(prop)

    def headline(self, prop: str) -> None:
        """Name a verified property for the pass line. Once a check names any, the pass line
        shows only these instead of every comparison's (often long, per-case) label."""
        if prop not in self.headlines:
            self.headlines.append(prop)

    # ---- comparisons ----
    def expect_tensor(self, got: Any, want: torch.Tensor, *, what: str | None = None,
                      dims: Iterable[str] | None = None,
                      wrong: Mapping[str, Callable[[], Any] | Any] | None = None,
                      atol: float | None = None, rtol: float | None = None,
                      check_dtype: bool = True) -> None:
        """Compare a tensor with the expected one: type, shape, dtype, then values."""
        what = _("output") if what is None else what
        dims = list(dims) if dims is not None else None
        if not isinstance(got, torch.Tensor) or type(got) not in (torch.Tensor,
                                                                    torch.nn.Parameter):
            self.fail(_("{what} should be a torch.Tensor, got {kind}.").format(
                what=what, kind=type(got).__name__))
        if got.shape != want.shape:
            hint = self.diagnose(got, wrong, atol, rtol)
            self.fail(_("{what} has shape {got}, expected {want}.").format(
                what=what, got=_shape_text(got.shape, None), want=_shape_text(want.shape, dims)),
                hint)
        if check_dtype and got.dtype != want.dtype:
            self.fail(_("{what} has dtype {got}, expected {want}.").format(
                what=what, got=got.dtype, want=want.dtype))
        default_atol, default_rtol = tolerance(want.dtype)
        atol = default_atol if atol is None else atol
        rtol = default_rtol if rtol is None else rtol
        if not values_close(got, want, atol, rtol):
            hint = self.diagnose(got, wrong, atol, rtol)
            self.fail(_("{what} has the right shape but wrong values; {mismatch}").format(
                what=what, mismatch=mismatch_text(got, want, atol, rtol, dims)), hint)
        self.note(what)

    def expect_equal(self, got: Any, want: Any, *, what: str | None = None,
                     wrong: Mapping[str, Callable[[], Any] | Any] | None = None) -> None:
        """Exact equality for ints, strings, lists, tuples, dicts (no tensors)."""
        what = _("output") if what is None else what
        if isinstance(want, int) and not isinstance(want, bool):
            # NumPy integers are fine; floats and bools are not (128.0 is not a size).
            same = (isinstance(got, numbers.Integral) and not isinstance(got, bool)
                    and got == want)
        else:
            same = type(got) is type(want) and got == want
        if not same:
            hint = self.diagnose(got, wrong, 0.0, 0.0)
            self.fail(_("{what} is {got}, expected {want}.").format(
                what=what, got=describe(got), want=describe(want)), hint)
        self.note(what)

    def diagnose(self, got: Any, wrong, atol, rtol) -> str | None:
        """Name the first known-wrong variant that reproduces the learner's output."""
        for mistake, variant in (wrong or {}).items():
            try:
                value = variant() if callable(variant) else variant
            except Exception:  # noqa: BLE001 - a variant that cannot be formed for these inputs says nothing
                continue
            if matches(got, value, atol or 0.0, rtol or 0.0):
                return mistake
        return None

