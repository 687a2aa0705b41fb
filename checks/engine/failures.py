"""Failures: what a check raises when the learner's function does not pass. `CheckFailure` (an
`AssertionError`) carries the exercise, the message, the likely mistake (a declared `Mistake`, whose
id it gives) and the seed; it renders as one short block in Jupyter instead of a traceback."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable

import torch

from .. import display
from ..i18n import N_, _
from ..mistakes import mistake_id

# The package's own code (checks/, chapters included) is never the learner's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

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

    `message` stays in English ("raised ValueError: ...\n  called with (...)"): it is the
    failure's record, never parsed; a check recognises an exception from `error` (the exception's
    class name) and `error_text` (its text) through the mistakes it declares (`Mistake(...,
    raises=...)`, `Check(errors=...)`). What the learner reads, `shown_message`, is built from
    the parts in the current language.
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


def _learner_frame(tb) -> tuple[int, str, str] | None:
    """(line number, code, function name) of the last traceback line that sits in the learner's
    own code (a notebook cell or file)."""
    skip = (PACKAGE_DIR, os.path.dirname(torch.__file__),
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

