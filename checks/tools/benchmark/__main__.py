"""`python -m checks.tools.benchmark`: the command line (see the package's docstring)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import torch

from .common import FULL, QUICK, SECTIONS
from .suite import format_table, run


def _lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"not a list of positive lengths: {text!r}")
    return values


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {', '.join(unknown)}; the sections "
                                         f"are {', '.join(SECTIONS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.tools.benchmark",
        description="Benchmark the reference model against Hugging Face, the KV cache against "
                    "no cache, and the course's notebooks and grading; print ratios measured in "
                    "this process.")
    parser.add_argument("--json", metavar="FILE", help="write every number to FILE")
    parser.add_argument("--quick", action="store_true",
                        help="everything at a tiny size, in seconds (proves it works)")
    parser.add_argument("--lengths", type=_lengths, metavar="N,N,...",
                        help="new tokens per generation (default 128,512,1024)")
    parser.add_argument("--repeats", type=int, help="timed runs per implementation and length")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's default)")
    parser.add_argument("--skip", type=_sections, default=(), metavar="SECTIONS",
                        help=f"comma-separated sections to leave out: {', '.join(SECTIONS)}")
    parser.add_argument("--notebooks", type=lambda s: tuple(x.strip() for x in s.split(",")),
                        metavar="NN,NN", help="chapters for the notebook and grading sections "
                                              "(default: all thirteen)")
    parser.add_argument("--students", type=int, metavar="N",
                        help="complete submissions in the class of section `class` (default 20)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.lengths:
        plan = replace(plan, lengths=args.lengths,
                       cfg=replace(plan.cfg, max_seq_len=max(plan.cfg.max_seq_len,
                                                             plan.prompt_len + max(args.lengths))))
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        plan = replace(plan, repeats=args.repeats)
    if args.notebooks is not None:
        plan = replace(plan, notebooks=args.notebooks)
    if args.students is not None:
        if args.students < 1:
            parser.error("--students must be at least 1")
        plan = replace(plan, class_size=args.students)
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    result = run(plan, skip=args.skip,
                 progress=lambda text: print(f"... {text}", file=sys.stderr, flush=True))
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, default=str)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
