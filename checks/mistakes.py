"""Mistakes as data: each diagnosis a checker can give is declared once, with a stable id.

A chapter module declares the mistakes its checks can name:

    NO_SCALE = Mistake("missing_scale", N_("forgot the scale: divide the scores by sqrt(D) ..."))

A `Mistake` is the English message itself (a `str`: the catalogue's msgid, translated when it is
shown, so `_(NO_SCALE)` and `failure.hint == NO_SCALE` work as for any message) that also knows
its `key`. The failure that names it turns the key into the mistake's id,
"<chapter>.<exercise>.<key>" ("04.attention_scores.missing_scale"): the same for every student who
made that mistake, whatever the random inputs or the language they read it in. The grader records
the id, the class summary and the class report count students per id; tests assert ids, never
wording.

What detects a mistake is declared with it, and the engine (checks.engine.Check) does the
detecting:
- a wrong variant: the mistake is a key of `expect_tensor(..., wrong={MISTAKE: variant})`;
- an exception of the learner's code: `Mistake(..., raises=[("RuntimeError", r"pattern")])`,
  listed in `Check(..., errors=[...])`;
- an input changed in place: `Check(..., in_place=MISTAKE)` replaces the engine's generic one.

Keys are snake_case words that say what was done (`missing_scale`, `softmax_over_queries`), never
a position in a list; once released, a key does not change (a class's records keep it).

Which exercises can name a mistake is declared too: each chapter's package ends with `MISTAKES`,
{exercise: the mistakes its check can name}, and `checks.registry` maps every full id to exactly
one `Mistake` from those tables (the class report, the summary, feedback and Gradescope take the
message from there, never from one student's text). Two mistakes are the same mistake when they
have the same key and the same message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .i18n import N_, _

# The id of a mistake: chapter number, exercise, key.
ID_PATTERN = re.compile(r"^\d\d\.[A-Za-z_][A-Za-z0-9_]*\.[a-z0-9_]+$")
_KEY_PATTERN = re.compile(r"^[a-z0-9_]+$")


class Mistake(str):
    """A known mistake: the English message (the str itself) and its stable `key`.

    `raises`: (exception class name, regular expression on the exception's text) pairs that
    recognise this mistake from an exception the learner's code raised; the name "*" matches any
    class, a pattern of None any text.
    """

    key: str
    raises: tuple[tuple[str, str | None], ...]
    values: dict[str, str]

    def __new__(cls, key: str, message: str, *,
                raises: Iterable[tuple[str, str | None]] = (),
                values: dict[str, str] | None = None) -> "Mistake":
        """`values`: what the message's {placeholders} stand for where they are fixed when the
        mistake is declared (the helper of a knock-on failure); `shown()` fills them in."""
        if not _KEY_PATTERN.match(key):
            raise ValueError(f"a mistake's key is snake_case: {key!r}")
        self = super().__new__(cls, message)
        self.key = key
        self.raises = tuple((name, pattern) for name, pattern in raises)
        self.values = dict(values or {})
        return self

    def __eq__(self, other: object) -> bool:
        # The same mistake: the same key told with the same message (a str compares as text).
        if isinstance(other, Mistake):
            return self.key == other.key and str.__eq__(self, other)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__  # equal mistakes are equal texts, so their hashes agree

    def __reduce__(self):  # a str subclass with its own __new__ arguments
        return (_rebuild, (self.key, str(self), self.raises, self.values))

    def __repr__(self) -> str:
        return f"Mistake({self.key!r})"

    def shown(self) -> str:
        """The message in the reader's language, as a class report shows it: placeholders
        filled from `values`, and those only a failure knows (its numbers) shown as "…"."""
        return filled(_(self), self.values)

    def with_text(self, text: str) -> "Mistake":
        """The same mistake (same key) told with another text: one built from parts, already in
        the reader's language (`_(STEP).format(mistake=_(NO_SCALE))`)."""
        return Mistake(self.key, text, raises=self.raises)

    def recognises(self, error: str, text: str) -> bool:
        """Whether an exception (class name, text) of the learner's code is this mistake."""
        return any((name in ("*", error)) and (pattern is None or re.search(pattern, text))
                   for name, pattern in self.raises)


def _rebuild(key: str, message: str, raises, values=None) -> Mistake:
    return Mistake(key, message, raises=raises, values=values)


class _Unknown(dict):
    def __missing__(self, key: str) -> str:
        return "…"


def filled(text: str, values: dict[str, str]) -> str:
    """`text` with its {placeholders} filled from `values`, and "…" for those it lacks (what
    only a failure knows: its numbers)."""
    import string

    try:
        return string.Formatter().vformat(text, (), _Unknown(values))
    except (ValueError, IndexError, AttributeError, KeyError):  # not a template after all
        return text


def key_of(hint: object) -> str | None:
    """The key of a hint when it is a declared mistake, else None (a free text names nothing)."""
    return hint.key if isinstance(hint, Mistake) else None


def mistake_id(exercise: str, hint: object) -> str | None:
    """"04.attention_scores.missing_scale" for a declared mistake named by a check of
    `exercise`; None when the hint is no declared mistake or the exercise belongs to no chapter."""
    key = key_of(hint)
    if key is None:
        return None
    from .exercises import chapter_of

    chapter = chapter_of(exercise)
    return None if chapter is None else f"{chapter}.{exercise}.{key}"


# Mistakes the engine itself names, for every exercise.
CHANGED_INPUT = "changed_input_in_place"
FORBIDDEN_CALL = "calls_forbidden_function"
CALLS_REFERENCE = "calls_course_reference"


def fix_first_key(helper: str) -> str:
    """The key of a knock-on failure: the exercise fails because the learner's `helper` (an
    earlier exercise it calls) does not pass its own check."""
    return f"fix_{helper.lower()}_first"


# The engine's own mistakes, as the registry tells them (a failure tells them with its details).
INPUT_CHANGED_IN_PLACE = Mistake(CHANGED_INPUT, N_(
    "the check computes what it expects from the inputs as they were: build new tensors (or "
    "lists) instead of writing into the caller's (`x -= ...`, `x.mul_(...)`, `masked_fill_`, "
    "`append`)"))
FORBIDDEN = Mistake(FORBIDDEN_CALL, N_(
    "calls a library function that this exercise asks you to write yourself"))
CALLS_COURSE_REFERENCE = Mistake(CALLS_REFERENCE, N_(
    "calls the course's own answer (checks.reference) instead of computing it"))
_FIX_FIRST = N_("{helper} does not pass its own check and this exercise is built on it: fix "
                "{helper} first")


def fix_first(helper: str) -> Mistake:
    """The knock-on mistake "fix <helper> first", as the registry tells it."""
    return Mistake(fix_first_key(helper), _FIX_FIRST, values={"helper": helper})
