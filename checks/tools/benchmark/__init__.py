"""Benchmarks: the course's reference model against Hugging Face, the KV cache against no cache,
and the course's own speed, measured side by side in one process on this machine.

    python -m checks.tools.benchmark [--json FILE] [--quick] [--lengths 128,512,1024] [--repeats N]
                               [--threads N] [--skip SECTIONS] [--notebooks 01,13] [--students N]

prints a table of ratios and (with --json) writes every number. `--quick` runs every section at a
tiny size in seconds (the test suite uses it to prove the command works; its numbers mean
nothing). A benchmark is not a test: nothing here asserts a speed.

One module per section (`--skip` takes their names, comma-separated), each with its measurement
and its table's formatter side by side; each module's docstring says what it measures:

    bandwidth.py    `bandwidth`: the machine's memory read bandwidth; table (b), decode's share
    generate.py     `generate`: the reference against Hugging Face's generate, table (a)
    no_cache.py     `no_cache`: the KV cache against recomputing everything, table (c)
    decode_path.py  `decode_path`: the decode path one change at a time, table (f)
    timing.py       `timing`: chapter 13's measurements (checks.timing), table (d)
    notebooks.py    `notebooks`: each solution notebook in a fresh kernel, table (e)
    grading.py      `grading`: python -m checks grade on one complete submission, table (e)
    load.py         `load`: notebooks and grading quiet and with CPU hogs alongside, table (e)
    classroom.py    `class`: a class graded with --jobs 1 and --jobs 2, table (e)
    smollm.py       `smollm`: `generate` on the real model, SmolLM2-135M-Instruct, table (g)
    serving.py      `serving`: chapter 15's server, eight chats alone and together, table (h)
    common.py       the plans (FULL, QUICK), random weights, timing a call, the CPU hogs
    suite.py        `run` (every section, in order) and `format_table` (every table, in order)
    __main__.py     the command line

Timing: warm-up first, then repeats; generation runs alternate between the two implementations
(and the order alternates between rounds) so that both see the same machine, and the fastest
repeat counts (on a shared machine the noise only ever adds time). Ratios are always of numbers
measured in this one process. torch's thread count is reported (`--threads` changes it).

A maintainers' tool: it may import anything in `checks` (the core, the reference, smollm; the
grader only through its command line, run as a subprocess); nothing imports it, and no worker's
copy of `checks` holds it.
"""

from __future__ import annotations

from .common import FULL, QUICK, SECTIONS, Plan, benchmark_params
from .decode_path import REFERENCE_STEP, VARIANTS, Variant

__all__ = ["FULL", "QUICK", "REFERENCE_STEP", "SECTIONS", "VARIANTS", "Plan", "Variant",
           "benchmark_params", "format_table", "main", "run"]


def __getattr__(name: str):
    """`main` (the command line, in __main__.py) and the suite (`run`, `format_table`, which
    import every section) are imported only when asked for: importing them here would make
    `python -m checks.tools.benchmark` or `python -m checks.tools.benchmark.training` find its
    module already loaded (runpy warns about that)."""
    if name == "main":
        from .__main__ import main
        return main
    if name in ("run", "format_table"):
        from . import suite
        return getattr(suite, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
