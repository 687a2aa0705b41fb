"""Section `timing`: chapter 13's prefill/decode measurements (`checks.timing.run`, its CPU plan),
and its own table (`checks.timing.format_table`)."""

from __future__ import annotations

from ... import timing
from .common import Plan


def run_timing(plan: Plan, say) -> dict:
    say(f"chapter 13 timing ({plan.timing_size} plan)")
    return timing.run("cpu", plan.timing_size, repeats=plan.timing_repeats)


def format_timing(result: dict) -> list[str]:
    """Table (d)."""
    t = result.get("timing")
    if not t:
        return []
    return ["", "(d) chapter 13's prefill/decode measurements (python -m checks.timing "
                f"--size {t['size']})", timing.format_table(t)]
