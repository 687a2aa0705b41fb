"""The comparison engine behind every self-check.

A checker opens a `Check`, feeds the learner's function inputs through `Check.call`, and compares
what comes back with `expect_tensor` / `expect_equal`. Comparisons go shape and dtype first, then
values; when values disagree, the wrong output is compared with known-wrong variants so that the
failure can name the likely mistake. Failures are `CheckFailure` (an `AssertionError`) and render
as one short red block in Jupyter instead of a traceback.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import os
import secrets
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import display
from .environment import SEED_ENV
from .i18n import N_, _
from .mistakes import (CALLS_REFERENCE, CHANGED_INPUT, FORBIDDEN_CALL, Mistake, fix_first_key,
                       mistake_id)

# (exercise, forbidden names and hints) of the Check calling the learner now. The grader's side of
# a worker (checks.grader.worker) reads it to apply the same guards to a call it forwards.
calling: contextvars.ContextVar = contextvars.ContextVar("checks_engine_calling", default=None)

# Set (to True) by a check whose exercise changes its arguments in place by design (chapter 14's
# clip_grad_norm, adamw_step, train_step): a call the grader forwards to the worker then brings the
# arguments back as the learner's function left them, and the grader puts them into its own
# objects (checks.grader.tensors.write_back) instead of failing as "changed its input in place".
writes_back: contextvars.ContextVar = contextvars.ContextVar("checks_writes_back", default=False)


def is_remote(f) -> bool:
    """Whether `f` runs elsewhere (a learner's function in the grader's worker), not in this
    process: such proxies say so with a true `_checks_remote` attribute."""
    return bool(getattr(f, "_checks_remote", False))

# --------------------------------------------------------------------------------------------
# Failures

# The last line of a failure with random inputs (the grader's report leaves it out).
SEED_LINE = N_("(random inputs from seed {seed}; pass seed={seed} to the check to see the same "
               "inputs again)")


class CheckFailure(AssertionError):
    """A self-check failed. `hint` names the likely mistake when one is known: a declared
    `Mistake` (then `mistake` is its id, "04.attention_scores.missing_scale") or a free text."""

    status = "failed"

    def __init__(self, exercise: str, message: str, *, hint: str | None = None,
                 seed: int | None = None):
        self.exercise = exercise
        self.message = message
        self.hint = hint
        self.seed = seed
        super().__init__(self._text())

    @property
    def shown_message(self) -> str:
        """The message as the learner reads it (in the current language)."""
        return self.message

    @property
    def mistake(self) -> str | None:
        """The id of the diagnosed mistake, or None when no declared mistake was recognised."""
        return mistake_id(self.exercise, self.hint)

    def _text(self) -> str:
        # Messages and hints kept in constants (marked with N_) are translated here, when shown;
        # a text that is no message id (already translated, or built from values) stays as is.
        lines = [f"{self.exercise}: {_(self.shown_message)}"]
        if self.hint:
            lines.append(_("likely mistake: {hint}").format(hint=_(self.hint)))
        if self.seed is not None:
            lines.append(_(SEED_LINE).format(seed=self.seed))
        return "\n".join(lines)

    def report_lines(self) -> list[str]:
        """What a grade report says of this failure, in the current language: the message's
        lines and the likely mistake, without the exercise's name or the seed line (a report
        gives the seed as a field of its own)."""
        text = _(self.shown_message)
        if self.hint:
            text += "\n" + _("likely mistake: {hint}").format(hint=_(self.hint))
        return [line.strip() for line in text.splitlines() if line.strip()]

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing a traceback: learners see only the diagnosis.
        return display.failure_lines(self.status, self._text())

    def with_hint(self, hint: str | None) -> "CheckFailure":
        """The same failure (same class, message and seed) naming another likely mistake."""
        other = type(self).__new__(type(self))  # no __init__: each subclass has its own
        other.__dict__.update(vars(self))
        other.hint = hint
        other.args = (other._text(),)
        return other


class NotStarted(CheckFailure):
    """The exercise still raises NotImplementedError (or calls an earlier exercise of its chapter
    that does: `message` then says which one)."""

    status = "not started"

    def __init__(self, exercise: str, message: str | None = None):
        super().__init__(exercise, message or _(
            "not started yet: replace `raise NotImplementedError()` with your implementation, "
            "then run this cell again."))


class LearnerError(CheckFailure):
    """The learner's function raised an exception while being checked.

    `message` stays in English ("raised ValueError: ...\n  called with (...)"), because
    checkers read it to recognise an exception (`first.startswith("raised ValueError")`); what
    the learner reads, `shown_message`, is built from the parts in the current language.
    `error` is the exception's class name and `error_text` its text (when the engine made it).
    """

    def __init__(self, exercise: str, message: str, *, hint: str | None = None,
                 seed: int | None = None, error: str | None = None, error_text: str = "",
                 called_with: str | None = None, where: tuple[int, str, str] | None = None):
        self.error, self.error_text = error, error_text
        self.called_with, self.where = called_with, where
        super().__init__(exercise, message, hint=hint, seed=seed)

    @classmethod
    def from_exception(cls, exercise: str, exc: BaseException, called_with: str,
                       seed: int | None = None) -> "LearnerError":
        where = _learner_frame(exc.__traceback__)
        message = f"raised {type(exc).__name__}: {exc}\n  called with ({called_with})"
        if where:
            message += "\n  " + _where_text(*where, translate=str)
        return cls(exercise, message, seed=seed, error=type(exc).__name__, error_text=str(exc),
                   called_with=called_with, where=where)

    def with_hint(self, hint: str | None) -> "LearnerError":
        """The same failure naming a likely mistake (what a checker re-raises)."""
        return LearnerError(self.exercise, self.message, hint=hint, seed=self.seed,
                            error=self.error, error_text=self.error_text,
                            called_with=self.called_with, where=self.where)

    def summary(self) -> str:
        """The first line the learner reads: "raised ValueError: ..." in the current language."""
        return self.shown_message.splitlines()[0]

    @property
    def shown_message(self) -> str:
        if self.error is None:  # made by a checker from a message of its own
            return self.message
        lines = [_("raised {error}: {text}").format(error=self.error, text=self.error_text),
                 "  " + _("called with ({arguments})").format(arguments=self.called_with)]
        if self.where:
            lines.append("  " + _where_text(*self.where))
        return "\n".join(lines)


class ForbiddenCall(CheckFailure):
    """The learner's function called a library shortcut the chapter asks them to write."""


# --------------------------------------------------------------------------------------------
# Seeds and random inputs

_quiet = contextvars.ContextVar("checks_quiet", default=False)
_open_checks = contextvars.ContextVar("checks_open", default=0)  # how many Checks are running


def fresh_seed() -> int:
    """A new seed per check, unless CHECKS_SEED pins one (for reproducing a failure)."""
    pinned = os.environ.get(SEED_ENV)
    return int(pinned) if pinned else secrets.randbelow(2**31)


@contextlib.contextmanager
def quiet():
    """Suppress the pass display (used when a check only decides which implementation to use)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


# --------------------------------------------------------------------------------------------
# Describing inputs and outputs in messages


def describe(value: Any) -> str:
    """A short description of a value for messages: tensors by dtype and shape."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}[{', '.join(map(str, value.shape))}]"
    if isinstance(value, (list, tuple)):
        if len(value) > 6:
            inner = ", ".join(describe(v) for v in value[:3])
            return _("{kind} of {count} items [{first}, ...]").format(
                kind=type(value).__name__, count=len(value), first=inner)
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37] + "...")
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _shape_text(shape: Iterable[int], dims: Iterable[str] | None) -> str:
    shape = list(shape)
    if dims is None or len(list(dims)) != len(shape):
        return f"[{', '.join(map(str, shape))}]"
    return "[" + ", ".join(f"{d}={n}" for d, n in zip(dims, shape)) + "]"


def _learner_frame(tb) -> tuple[int, str, str] | None:
    """(line number, code, function name) of the last traceback line that sits in the learner's
    own code (a notebook cell or file)."""
    skip = (os.path.dirname(__file__), os.path.dirname(torch.__file__),
            os.path.dirname(os.__file__))
    last = None
    for frame in traceback.extract_tb(tb):
        if not frame.filename.startswith(skip):
            last = frame
    if last is None:
        return None
    return last.lineno, (last.line or "").strip(), last.name


_IN_FUNCTION = N_("in {function}, line {line}: {code}")
_IN_FUNCTION_NO_CODE = N_("in {function}, line {line}")
_AT_LINE = N_("at line {line}: {code}")
_AT_LINE_NO_CODE = N_("at line {line}")


def _where_text(line: int, code: str, function: str = "", translate: Callable = _) -> str:
    """"in split_heads, line 4: return ..." (a check calls one function, but the error may come
    from another one that it calls, so the function is named); "at line 4: ..." for code outside
    a named function (a cell's top level, a lambda). `translate=str` gives the English."""
    if function.isidentifier():
        text = translate(_IN_FUNCTION if code else _IN_FUNCTION_NO_CODE)
    else:
        text = translate(_AT_LINE if code else _AT_LINE_NO_CODE)
    return text.format(function=function, line=line, code=code)


# --------------------------------------------------------------------------------------------
# Forbidden shortcuts


def as_mistake(hint: str | None, key: str) -> Mistake | None:
    """A hint as a declared mistake: itself when it is one, else under the engine's `key`."""
    if hint is None or isinstance(hint, Mistake):
        return hint
    return Mistake(key, hint)


class _Forbid(TorchFunctionMode):
    """Raise ForbiddenCall when the learner's code reaches a forbidden torch function.

    `forbidden` maps function names (`__name__`, e.g. "softmax") to the hint shown.

    A torch-function mode sees every torch API call however it was imported (`F.softmax`,
    `torch.softmax`, `x.softmax`), so renaming the import does not get around it.
    """

    def __init__(self, check: "Check", forbidden: Mapping[str, str]):
        super().__init__()
        self.check = check
        self.forbidden = forbidden

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        # `torch.ops.aten` operators carry an overload suffix ("softmax.int"): match the base too.
        key = name if name in self.forbidden else name.split(".")[0]
        if key in self.forbidden:
            raise ForbiddenCall(self.check.exercise, _("calls `{name}`, which this exercise asks "
                                "you to write yourself.").format(name=name),
                                hint=as_mistake(self.forbidden[key], FORBIDDEN_CALL))
        return func(*args, **(kwargs or {}))


# --------------------------------------------------------------------------------------------
# Inputs changed in place


def snapshot_inputs(args: tuple, kwargs: dict, fn: Any = None) -> list[tuple[str, Any, Any]]:
    """(label, input, copy) for the tensors, lists and dicts among a call's arguments (nested
    ones too), labelled by parameter name where `fn`'s signature tells it."""
    import inspect

    names: list[str] = []
    with contextlib.suppress(Exception):
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    found: list[tuple[str, Any, Any]] = []

    def walk(label: str, value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if value.layout == torch.strided and value.device.type != "meta":
                with torch._C.DisableTorchFunctionSubclass():
                    found.append((label, value, value.detach().clone()))
        elif isinstance(value, (list, tuple, dict)) and depth < 4:
            if isinstance(value, list):
                found.append((label, value, list(value)))
            elif isinstance(value, dict):
                found.append((label, value, dict(value)))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in list(items)[:10_000]:
                walk(f"{label}[{key!r}]", item, depth + 1)

    for i, value in enumerate(args):
        walk(f"`{names[i]}`" if i < len(names) else f"argument {i + 1}", value, 0)
    for key, value in kwargs.items():
        walk(f"`{key}`", value, 0)
    return found


def changed_inputs(snapshot: list[tuple[str, Any, Any]], allowed: Iterable[str] = ()) -> list[str]:
    """Labels of the inputs in `snapshot` that are no longer what they were."""
    allowed = {a.strip("`") for a in allowed}
    changed = []
    for label, value, copy in snapshot:
        if label.strip("`").split("[")[0] in allowed:
            continue
        if isinstance(value, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():
                same = value.shape == copy.shape and value.dtype == copy.dtype and (
                    value.numel() == 0 or torch.equal(value.detach().reshape(-1).view(torch.uint8),
                                                      copy.reshape(-1).view(torch.uint8)))
        elif isinstance(value, list):
            same = len(value) == len(copy) and all(a is b for a, b in zip(value, copy))
        else:
            same = value.keys() == copy.keys() and all(value[k] is copy[k] for k in copy)
        if not same:
            changed.append(label)
    return changed


IN_PLACE = Mistake(CHANGED_INPUT, N_(
    "the check computes what it expects from the inputs as they were: build new tensors (or "
    "lists) instead of writing into the caller's (`x -= ...`, `x.mul_(...)`, `masked_fill_`, "
    "`append`)"))


def in_place_failure(exercise: str, changed: list[str], seed: int | None = None,
                     hint: Mistake = IN_PLACE) -> "CheckFailure":
    """The failure of a function that changed its inputs: `hint` is the chapter's own mistake
    for it (`Check(..., in_place=...)`) or the engine's generic one."""
    what = ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")
    return CheckFailure(exercise, _("changed its input {inputs} in place.").format(inputs=what),
                        hint=hint, seed=seed)


# --------------------------------------------------------------------------------------------
# Tolerances

_TOLERANCES = {  # dtype: (atol, rtol)
    torch.float64: (1e-9, 1e-7),
    torch.float32: (2e-5, 2e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _TOLERANCES.get(dtype, (0.0, 0.0))


def values_close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> bool:
    """Elementwise |got - want| <= atol + rtol * |want|, with inf/nan equal to themselves."""
    if got.shape != want.shape:
        return False
    if not want.is_floating_point():
        return bool((got == want).all())
    got64, want64 = got.detach().double(), want.detach().double()
    same_special = (got64 == want64) | (got64.isnan() & want64.isnan())
    diff = (got64 - want64).abs()
    # A finite value is never "close" to an infinite one (inf <= inf would say it is).
    ok = same_special | (want64.isfinite() & (diff <= atol + rtol * want64.abs()))
    return bool(ok.all())


def _goes_on_after(exc: NotStarted) -> bool:
    """Whether an unstarted exercise's self-check shows a line instead of raising.

    Only in a learner's Jupyter kernel, for the outermost check the learner ran themselves: a
    grader (`context.grading()`: nbgrader, `python -m checks status|grade`) needs the exception
    to score the exercise zero, and `use_if_passing` (quiet) needs it to pick the reference.
    """
    from . import context

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


def matches(got: Any, value: Any, atol: float, rtol: float) -> bool:
    if isinstance(value, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != value.shape:
            return False
        tol_a, tol_r = tolerance(value.dtype)
        return values_close(got.to(value.dtype), value, max(atol, tol_a), max(rtol, tol_r))
    try:
        return bool(got == value) and type(got) is type(value)
    except Exception:  # noqa: BLE001 - a value without a plain equality
        return False


def mismatch_text(got, want, atol, rtol, dims) -> str:
    got64, want64 = got.detach().double(), want.detach().double()
    bad = ~(want64.isfinite() & ((got64 - want64).abs() <= atol + rtol * want64.abs()))
    bad &= ~((got64 == want64) | (got64.isnan() & want64.isnan()))
    index = tuple(int(i) for i in bad.nonzero()[0])
    where = ", ".join(f"{d}={i}" for d, i in zip(dims, index)) if dims and \
        len(dims) == len(index) else ", ".join(map(str, index))
    count = int(bad.sum())
    return _("{count} of {total} entries differ; first at [{where}]: got {got}, expected "
             "{want}.").format(count=count, total=bad.numel(), where=where,
                               got=_num(got64[index]), want=_num(want64[index]))


def _num(t: torch.Tensor) -> str:
    v = float(t)
    return repr(v) if math.isnan(v) or math.isinf(v) else f"{v:.6g}"


# --------------------------------------------------------------------------------------------
# Earlier exercises that a check's function builds on

_recording: contextvars.ContextVar = contextvars.ContextVar("checks_recording", default=None)
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
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
                not code.co_filename.startswith((_PACKAGE_DIR, *_LIBRARY_DIRS)):
            obj = frame.f_globals.get(head)
            if obj is not None:
                self.seen.setdefault(head, obj)

    def stub_message(self, exercise: str, tb) -> str | None:
        """For a NotImplementedError raised inside an earlier exercise's stub: which one."""
        last = None
        for frame, _line in traceback.walk_tb(tb):
            if not frame.f_code.co_filename.startswith(_PACKAGE_DIR):
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


# --------------------------------------------------------------------------------------------
# Choosing between a learner's implementation and the reference


def use_if_passing(fn: Callable, checker: Callable, fallback: Callable, *,
                   name: str | None = None) -> Callable:
    """Return `fn` if it passes `checker`, else `fallback`, saying which one is used.

    Later chapters build on earlier exercises; this lets a learner who is stuck on one exercise
    keep going with the course's reference implementation.
    """
    label = name or getattr(fn, "__name__", None) or _("your function")
    try:
        with quiet():
            checker(fn)
    except CheckFailure:
        print(_("Using the course's reference `{name}` (yours does not pass its check yet).")
              .format(name=label))
        return fallback
    except Exception as exc:  # noqa: BLE001 - never stop a notebook because checking went wrong
        print(_("Using the course's reference `{name}` (checking yours raised {error}: "
                "{text}).").format(name=label, error=type(exc).__name__, text=exc))
        return fallback
    print(_("Using your own `{name}`.").format(name=label))
    return fn

