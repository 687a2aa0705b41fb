"""Section `notebooks`: the execution time of each solution notebook (nbclient, a fresh kernel
each; kernel start-up reported apart from running the cells)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .common import REPO, solution_notebooks


def time_notebook(path: Path, *, timeout: float = 600) -> dict:
    """Execute one notebook in a fresh kernel (in its own folder, as nbval and nbconvert do):
    seconds to start the kernel (until it answers), to run the cells, to shut it down."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.reset_execution_trackers()
    error = None
    start = time.perf_counter()
    with client.setup_kernel(stderr=subprocess.DEVNULL):   # the kernel's own log lines
        started = time.perf_counter()
        try:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        except CellExecutionError as exc:
            error = str(exc).strip().splitlines()[-1][:200]
        ran = time.perf_counter()
    stopped = time.perf_counter()
    stderr = sum(1 for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.get("outputs", [])
                 if out.get("output_type") == "stream" and out.get("name") == "stderr")
    return {"notebook": str(path.relative_to(REPO)), "kernel_start_seconds": started - start,
            "cells_seconds": ran - started, "shutdown_seconds": stopped - ran,
            "total_seconds": stopped - start, "stderr_outputs": stderr, "error": error}


def run_notebooks(chapters, say) -> list[dict]:
    rows = []
    for path in solution_notebooks(chapters):
        say(f"notebook {path.parent.name}")
        rows.append(time_notebook(path))
    return rows


def format_notebooks(result: dict) -> list[str]:
    """Table (e), the notebooks."""
    nbs = result.get("notebooks")
    if not nbs:
        return []
    lines = ["", "(e) solution notebooks, each in a fresh kernel (seconds)",
             f"{'notebook':<28}{'kernel start':>13}{'cells':>8}{'total':>8}  status"]
    for r in nbs:
        status = "ok" if not r["error"] else f"ERROR {r['error']}"
        if r["stderr_outputs"]:
            status += f", {r['stderr_outputs']} stderr outputs"
        lines.append(f"{Path(r['notebook']).parent.name:<28}{r['kernel_start_seconds']:>13.1f}"
                     f"{r['cells_seconds']:>8.1f}{r['total_seconds']:>8.1f}  {status}")
    lines.append(f"{'slowest':<28}{'':>13}{max(r['cells_seconds'] for r in nbs):>8.1f}"
                 f"{max(r['total_seconds'] for r in nbs):>8.1f}")
    return lines
