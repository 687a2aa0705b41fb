"""The registry of mistakes: every mistake id ("04.attention_scores.missing_scale") mapped to
exactly one declared `Mistake`, built from the chapters' `MISTAKES` tables.

A chapter's package ends with `MISTAKES = {exercise: (the mistakes its check can name), ...}`;
the id of each is "<chapter>.<exercise>.<key>". Two declarations that would give one id two
messages stop the registry from being built (`ConflictingMistakes`), and tests hold every id to a
catalogued wrong implementation that names it (tests/checkers/test_registry.py). Everything that
tells a mistake by its id — the class report, the class summary, feedback pages, Gradescope's
results — takes its message from here (`message(id)`), in the reader's language.

This module imports every chapter (explicitly, below), so nothing the chapters import may import
it: only the grader's outputs and the tests do.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from . import (nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb08, nb09, nb10, nb11, nb12, nb13, nb14,
               nb15, nb16)
from .exercises import SYLLABUS
from .mistakes import ID_PATTERN, Mistake

_CHAPTERS = {"01": nb01, "02": nb02, "03": nb03, "04": nb04, "05": nb05, "06": nb06,
             "07": nb07, "08": nb08, "09": nb09, "10": nb10, "11": nb11, "12": nb12,
             "13": nb13, "14": nb14, "15": nb15, "16": nb16}


class ConflictingMistakes(ValueError):
    """Two declarations would give one mistake id two different messages."""


def build(tables: Mapping[str, Mapping[str, Iterable[Mistake]]]) -> dict[str, Mistake]:
    """{id: Mistake} from {chapter: {exercise: mistakes}}; ConflictingMistakes when one id
    would name two different messages."""
    found: dict[str, Mistake] = {}
    for chapter, table in tables.items():
        for exercise, mistakes in table.items():
            for mistake in mistakes:
                if not isinstance(mistake, Mistake):
                    raise TypeError(f"{chapter}.{exercise}: {mistake!r} is no declared Mistake")
                mistake_id = f"{chapter}.{exercise}.{mistake.key}"
                known = found.setdefault(mistake_id, mistake)
                if known != mistake:
                    raise ConflictingMistakes(
                        f"{mistake_id} is declared with two messages: {str(known)[:60]!r} and "
                        f"{str(mistake)[:60]!r}")
    return found


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, Mistake]:
    """Every mistake id of the course and its one `Mistake`."""
    return build({chapter.number: _CHAPTERS[chapter.number].MISTAKES for chapter in SYLLABUS})


def declared(mistake_id: str | None) -> Mistake | None:
    """The `Mistake` of an id; None for no id or one the course does not declare."""
    if not mistake_id or not ID_PATTERN.match(mistake_id):
        return None
    return registry().get(mistake_id)


def message(mistake_id: str | None) -> str | None:
    """The registry's message of an id in the reader's language (placeholders that only a
    failure can fill shown as "…"); None for an id the course does not declare."""
    known = declared(mistake_id)
    return None if known is None else known.shown()
