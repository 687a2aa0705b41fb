"""The oracles' table of largest differences, printed at the end of the run.

tests/reference/test_oracle_hf.py, test_oracle_hf_model.py and tests/smollm/test_oracle_smollm.py
each keep a dict {key: largest |ours - Hugging Face|} and show it from their `terminal_summary()`
(tests/conftest.py prints it); this is that table, written once.
"""

from __future__ import annotations


def largest_differences(title: str, largest: dict[tuple[str, ...], float],
                        widths: tuple[int, ...]) -> list[str]:
    """A blank line and `title`, then one line per key in sorted order: the key's parts
    left-aligned in columns of `widths`, then its difference; nothing when `largest` is empty
    (the comparisons did not run)."""
    if not largest:
        return []
    lines = [f"\n{title}"]
    for key, diff in sorted(largest.items()):
        columns = " ".join(f"{part:<{width}}" for part, width in zip(key, widths, strict=True))
        lines.append(f"  {columns} {diff:.2e}")
    return lines
