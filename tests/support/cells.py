"""A learner's code as a notebook cell runs it, for the checkers' tests: `learner_cell`."""

from __future__ import annotations

import itertools
import linecache
import math
import textwrap

import torch
import torch.nn.functional as F

_CELLS = itertools.count(1)


def learner_cell(source: str, **names) -> dict:
    """Run `source` as a notebook cell would: its functions module-level in a fresh namespace of
    their own (holding torch, F, math and `names`), their code in no file of the package, its
    lines known to `linecache` as IPython makes a cell's (so a failure can quote them); return
    the namespace."""
    source = textwrap.dedent(source)
    filename = f"<learner cell {next(_CELLS)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__", "math": math, "torch": torch, "F": F, **names}
    exec(compile(source, filename, "exec"), namespace)
    return namespace
