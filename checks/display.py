"""How check results look: a compact HTML block in Jupyter, plain text in a terminal."""

from __future__ import annotations

import html

from .i18n import _, ngettext

_GREEN, _RED, _YELLOW, _RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where rich HTML output is shown)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class _PassBlock:
    """Rendered as HTML by Jupyter and as plain text everywhere else."""

    def __init__(self, exercise: str, calls: int, properties: list[str]):
        self.exercise = exercise
        self.calls = calls
        self.properties = properties

    def _summary(self) -> str:
        shown = self.properties[:3]
        more = len(self.properties) - len(shown)
        checked = _("; ").join(shown) if shown else _("output")  # Chinese: a full-width "；"
        if more:
            checked += _("; and {count} more").format(count=more)
        calls = ngettext("{count} call", "{count} calls", self.calls).format(count=self.calls)
        return _("{calls}; checked {checked}").format(calls=calls, checked=checked)

    def __repr__(self) -> str:
        return _("✓ {exercise} passed ({summary})").format(exercise=self.exercise,
                                                         summary=self._summary())

    def _repr_html_(self) -> str:
        passed = html.escape(_("passed"))
        return ('<div style="border-left:4px solid #2e7d32;background:#e8f5e9;color:#1b5e20;'
                'padding:4px 10px;font-family:sans-serif">'
                f'<b>✓ {html.escape(self.exercise)}</b> {passed} '
                f'<span style="color:#555">({html.escape(self._summary())})</span></div>')


def show_pass(exercise: str, calls: int, properties: list[str]) -> None:
    block = _PassBlock(exercise, calls, properties)
    if in_notebook():
        from IPython.display import display

        display(block)
    else:
        print(repr(block))


def failure_lines(status: str, text: str) -> list[str]:
    """The lines IPython shows for a failed check (ANSI colours render in Jupyter too)."""
    colour = _YELLOW if status == "not started" else _RED
    mark = "…" if status == "not started" else "✗"
    first, *rest = text.splitlines()
    return [f"{colour}{mark} {first}{_RESET}", *(f"  {line}" for line in rest)]


class _NotStartedBlock:
    """The yellow line an unstarted exercise's self-check shows in JupyterLab."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return "\n".join(failure_lines("not started", self.text))

    def _repr_html_(self) -> str:
        first, *rest = self.text.splitlines()
        more = "".join(f"<br>{html.escape(line)}" for line in rest)
        return ('<div class="llama-course-not-started" style="border-left:4px solid #f9a825;'
                'background:#fff8e1;color:#6d4c00;padding:4px 10px;font-family:sans-serif">'
                f'<b>… {html.escape(first)}</b>{more}</div>')


def show_not_started(text: str) -> None:
    """Show an unstarted exercise's check result without stopping the notebook."""
    block = _NotStartedBlock(text)
    if in_notebook():
        from IPython.display import display

        display(block)
    else:
        print(repr(block))
