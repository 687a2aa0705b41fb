"""Section `speculative`: chapter 16's measurement with the course's functions
(`checks.speculation.run_smollm`): SmolLM2-135M-Instruct (fp32, batch 1) on quote and edit a
passage (where prompt lookup pays) and open chat (where it does not), prompt lookup at several k
and the first 8 blocks as an early-exit draft; acceptance rate, new tokens per forward pass, the
speed-up over `generate`, and whether the tokens are identical. Skipped with a note when the
model is not installed. On a GPU, `python -m checks.gpu_check` prints the same table.

    python -m checks.tools.benchmark.speculative [--quick] [--device cpu|cuda]
"""

from __future__ import annotations

import torch

from ... import speculation
from .common import Plan


def run_speculative(plan: Plan, say, device: str = "cpu") -> dict:
    return speculation.run_smollm(quick=plan.cfg.hidden_size <= 64, device=device, say=say)


def format_speculative(result: dict) -> list[str]:
    """Table (g), chapter 16."""
    section = result.get("speculative")
    if not section:
        return []
    return ["", "(g) chapter 16: speculative decoding on SmolLM2-135M-Instruct, batch 1, "
            "against generate (greedy)"] + speculation.format_section(section)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m checks.tools.benchmark.speculative",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 new tokens, k = 2 only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    section = speculation.run_smollm(quick=args.quick, device=args.device,
                                     say=lambda text: print(text, flush=True))
    print("\n".join(format_speculative({"speculative": section})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
