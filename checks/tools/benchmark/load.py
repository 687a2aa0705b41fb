"""Section `load`: the notebooks' and one submission's grading, quiet and with CPU hogs alongside
(busy processes, `scripts/with_cpu_hogs.py`, running only during the loaded run), each
notebook's pair back to back so that both see the same machine; their ratio is the figure that
matters (two hogs on two cores leave a third of the CPU to the work). When this section runs, its
quiet runs are the numbers of `notebooks` and `grading` (measured once).
"""

from __future__ import annotations

from pathlib import Path

from .common import LOADED_LIMIT, REPO, cpu_hogs, solution_notebooks
from .grading import points, run_grading
from .notebooks import time_notebook


def run_under_load(chapters, say, hogs: int) -> dict:
    """Each notebook quiet and with `hogs` CPU hogs alongside, back to back (the order swapped
    from one notebook to the next, so that a drift of the machine's load favours neither), then
    one complete submission's grading both ways."""
    rows = []
    for i, path in enumerate(solution_notebooks(chapters)):
        say(f"notebook {path.parent.name}, quiet and with {hogs} CPU hogs")
        row: dict = {"notebook": str(path.relative_to(REPO))}
        for loaded in ((False, True) if i % 2 == 0 else (True, False)):
            with cpu_hogs(hogs if loaded else 0, LOADED_LIMIT) as load:
                row["loaded" if loaded else "quiet"] = time_notebook(path)
            if loaded:
                row["hog_cpu_seconds"] = load["cpu_seconds"]
        row["ratio"] = row["loaded"]["total_seconds"] / row["quiet"]["total_seconds"]
        rows.append(row)
    quiet = run_grading(chapters, say)
    loaded = run_grading(chapters, say, hogs=hogs)
    return {"hogs": hogs, "notebooks": rows,
            "grading": {"quiet": quiet, "loaded": loaded,
                        "ratio": loaded["seconds"] / quiet["seconds"]}}


def format_load(result: dict) -> list[str]:
    """Table (e) under load: quiet against loaded, per notebook and for one submission's
    grading."""
    load = result.get("load")
    if not load:
        return []
    n = load["hogs"]
    lines = ["", f"(e) under load: each solution notebook (fresh kernel, start-up included) and "
                 f"one submission's grading, quiet and with {n} CPU hog{'s' * (n != 1)} "
                 "alongside (seconds; back to back)",
             f"{'notebook':<28}{'quiet':>8}{'loaded':>8}{'ratio':>7}{'hogs CPU s':>12}  status"]
    for r in load["notebooks"]:
        errors = [r[k]["error"] for k in ("quiet", "loaded") if r[k]["error"]]
        stderr = sum(r[k]["stderr_outputs"] for k in ("quiet", "loaded"))
        status = "ok" if not errors else f"ERROR {errors[0]}"
        if stderr:
            status += f", {stderr} stderr outputs"
        lines.append(f"{Path(r['notebook']).parent.name:<28}{r['quiet']['total_seconds']:>8.1f}"
                     f"{r['loaded']['total_seconds']:>8.1f}{r['ratio']:>6.2f}x"
                     f"{r['hog_cpu_seconds']:>12.0f}  {status}")
    slowest = max(load["notebooks"], key=lambda r: r["loaded"]["total_seconds"])
    lines.append(f"{'slowest loaded':<28}{'':>8}{slowest['loaded']['total_seconds']:>8.1f}"
                 f"  ({Path(slowest['notebook']).parent.name}; target: under 30 s)")
    g = load["grading"]
    lines += [f"    python -m checks grade, one complete submission: quiet "
              f"{g['quiet']['seconds']:.1f} s ({points(g['quiet'])}), loaded "
              f"{g['loaded']['seconds']:.1f} s ({points(g['loaded'])}; the hogs used "
              f"{g['loaded']['hog_cpu_seconds']:.0f} CPU s)",
              f"    loaded/quiet: {g['ratio']:.2f}x (target: at most 2.5)"
              + ("" if g["quiet"]["graded"] == g["loaded"]["graded"] == g["quiet"]["notebooks"]
                 else "; not comparable: a run stopped early")]
    return lines
