"""Which chapter grades which exercise, read from the chapters' checker modules.

Every graded exercise `name` of chapter NN has its checker `check_<name>` in `checks/nbNN.py`
(docs/maintainer/recipes.md, "Add an exercise"), so the modules themselves are the list: they are
read as text, never imported (a worker's copy of the package may hold only some of them, and
importing every chapter would load the whole course to name one).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKER = re.compile(r"^def check_([A-Za-z_][A-Za-z0-9_]*)\(", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def chapters() -> dict[str, tuple[str, ...]]:
    """{"04": ("project_qkv", "attention_scores", ...), ...}: each chapter's exercises, in the
    order their checkers are defined."""
    found = {}
    for module in sorted(_PACKAGE.glob("nb[0-9][0-9].py")):
        found[module.stem[2:]] = tuple(_CHECKER.findall(module.read_text(encoding="utf-8")))
    return found


@functools.lru_cache(maxsize=None)
def chapter_of(exercise: str) -> str | None:
    """"04" for "attention_scores"; None for a name no chapter grades."""
    for number, names in chapters().items():
        if exercise in names:
            return number
    return None
