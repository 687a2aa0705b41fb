"""Small drawing helpers for the course's tensor diagrams (matplotlib only).

The notebooks draw their pictures of tensors with these: a canvas measured in inches, matrices
as grids of shaded cells with their name and shape, labelled boxes, and arrows. Each helper
returns the drawn thing's bounding box `(left, bottom, right, top)` so the next element can be
placed against it. Every picture stays in the notebook as code; this module only saves repeating
the geometry.

Used by chapters 01, 04 and 05 (helper H6, who owns this file) and 06 and 08 (helper H7, who may
add functions here; please keep the existing signatures).
"""

from __future__ import annotations

from collections.abc import Sequence

Box = tuple[float, float, float, float]  # left, bottom, right, top

# One colour per head (colour-blind-safe Okabe-Ito hues), reused by every chapter's pictures.
HEAD_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
               "#999999")
BLOCKED_COLOR = "#4d4d4d"  # a masked (-inf) score
TEXT_COLOR = "#222222"


def canvas(width: float, height: float):
    """A figure of `width` x `height` inches whose data coordinates are inches, origin bottom
    left, no axes drawn. Returns (fig, ax)."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def shade(color: str, amount: float) -> tuple[float, float, float]:
    """`color` mixed with white: amount 1 is the colour itself, 0 is white."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (1 - amount * (1 - r), 1 - amount * (1 - g), 1 - amount * (1 - b))


def matrix(ax, left: float, top: float, colors: Sequence[Sequence], *, cell: float = 0.25,
           label: str | None = None, shape: str | None = None, texts=None,
           fontsize: float = 9, text_size: float | None = None) -> Box:
    """A grid of cells whose top-left corner sits at (left, top): `colors[r][c]` is any
    matplotlib colour; `texts[r][c]` (optional) is written in the cell. `label` goes above the
    grid, `shape` (for example "[S, D_h]") below it."""
    from matplotlib.patches import Rectangle

    rows, cols = len(colors), len(colors[0])
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((left + c * cell, top - (r + 1) * cell), cell, cell,
                                   facecolor=colors[r][c], edgecolor="white", linewidth=0.8))
            if texts is not None and texts[r][c]:
                ax.text(left + (c + 0.5) * cell, top - (r + 0.5) * cell, texts[r][c],
                        ha="center", va="center", fontsize=text_size or fontsize * 0.75,
                        color=_ink_on(colors[r][c]))
    right, bottom = left + cols * cell, top - rows * cell
    middle = (left + right) / 2
    if label:
        ax.text(middle, top + 0.08, label, ha="center", va="bottom", fontsize=fontsize,
                color=TEXT_COLOR)
    if shape:
        ax.text(middle, bottom - 0.08, shape, ha="center", va="top", fontsize=fontsize * 0.9,
                color="#555555")
    return (left, bottom, right, top)


def values_to_colors(values, cmap: str = "RdBu_r", vmin: float | None = None,
                     vmax: float | None = None, blocked=None) -> list[list]:
    """Colours for a 2-D array of numbers (a tensor or nested lists) through `cmap`; entries
    where `blocked` is True get BLOCKED_COLOR. Symmetric limits by default, for signed data."""
    import matplotlib

    rows = [[float(v) for v in row] for row in values]
    finite = [v for row in rows for v in row if abs(v) != float("inf")]
    bound = max((abs(v) for v in finite), default=1.0) or 1.0
    lo = -bound if vmin is None else vmin
    hi = bound if vmax is None else vmax
    colormap = matplotlib.colormaps[cmap]
    out = []
    for r, row in enumerate(rows):
        out.append([BLOCKED_COLOR if blocked is not None and bool(blocked[r][c])
                    else colormap(0.15 + 0.7 * min(max((v - lo) / (hi - lo), 0.0), 1.0))
                    for c, v in enumerate(row)])
    return out


def box(ax, left: float, bottom: float, width: float, height: float, text: str, *,
        color: str = "#e8eef7", edge: str = "#4a6a9a", fontsize: float = 9,
        linestyle: str = "-", style: str = "round,pad=0.02,rounding_size=0.08",
        **text_kw) -> Box:
    """A rounded box with centred (multi-line) text; `text_kw` go to the text."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((left, bottom), width, height, boxstyle=style,
                                facecolor=color, edgecolor=edge, linewidth=1.0,
                                linestyle=linestyle))
    ax.text(left + width / 2, bottom + height / 2, text, ha="center", va="center",
            fontsize=fontsize, color=TEXT_COLOR, **text_kw)
    return (left, bottom, left + width, bottom + height)


def arrow(ax, start: tuple[float, float], end: tuple[float, float], text: str | None = None, *,
          side: str = "above", fontsize: float = 8, color: str = "#333333",
          style: str = "-|>", connection: str = "arc3", linestyle: str = "-") -> None:
    """An arrow from `start` to `end`, with `text` above, below, left or right of its middle."""
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=color,
                                 linewidth=1.0, shrinkA=0, shrinkB=0, linestyle=linestyle,
                                 connectionstyle=connection))
    if text:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        offset = {"above": (0, 0.07, "center", "bottom"), "below": (0, -0.07, "center", "top"),
                  "left": (-0.08, 0, "right", "center"),
                  "right": (0.08, 0, "left", "center")}[side]
        ax.text(mx + offset[0], my + offset[1], text, ha=offset[2], va=offset[3],
                fontsize=fontsize, color=color)


def _ink_on(color) -> str:
    """Black or white text, whichever reads better on `color`."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
