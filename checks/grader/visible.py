"""`python -m checks status` where the course has no source notebooks: the course installed from
a wheel (Colab, a Docker image, any `pip install`) holds the package alone, and a learner has
never heard of `solutions/`. Their own notebooks then stand for the sources: each chapter's test
cells are the visible checks the learner sees (the hidden tests are the instructor's and are not
there), run in the same walled-in worker; one line says so."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from ..i18n import N_, _
from .options import GradeOptions
from .read import chapter_notebooks

T = TypeVar("T")

NOTE = N_("the course is installed without its source notebooks (solutions/): the visible checks "
           "of your own notebooks are run (the hidden tests are the instructor's)")


@contextlib.contextmanager
def visible_sources(folder: Path) -> Iterator[Path]:
    """A temporary source folder made of the learner's own notebooks under `folder`
    (`NN_slug/*.ipynb`; the one named after its chapter first, else the first by name)."""
    with tempfile.TemporaryDirectory(prefix="checks-visible-") as tmp:
        for path in sorted(chapter_notebooks(folder),
                           key=lambda p: (p.stem != p.parent.name, p.name)):
            chapter = path.parent.name
            target = Path(tmp) / chapter / f"{chapter}.ipynb"
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        yield Path(tmp)


def status_without_sources(folder: Path, options: GradeOptions,
                           status: Callable[[Path, GradeOptions], T]) -> T:
    """`status(folder, options)` with the learner's notebooks under `folder` as the sources,
    saying so in one line."""
    print(_(NOTE), file=sys.stderr, flush=True)
    with visible_sources(folder) as sources:
        return status(folder, replace(options, source=sources))
