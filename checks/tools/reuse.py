"""Our prose is our own: no run of 20 or more characters of the article's prose may appear in a
notebook, a translation file, a message of the catalogue or a README, in either language.

The article (`../shared/source/transformer-quickstart.zh.txt` beside the repository) gives facts,
formulas and its section titles; its sentences are not ours to copy. A run is compared with the
whitespace taken out (a line break does not hide a copied sentence); a run of the article counts
as prose when most of it is CJK text, so formulas, shapes, tables of symbols and code (which the
course shares with the article by design) are left aside, and so are its numbered section titles
(each notebook's title quotes its section's heading).

    python -m checks.tools.reuse            every copied run, with where it is; exit 1 if any
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTICLE = ROOT.parent / "shared" / "source" / "transformer-quickstart.zh.txt"
RUN = 20  # characters
_CJK = re.compile(r"[\u3400-\u9fff]")
_SPACE = re.compile(r"\s+")
_SECTION_TITLE = re.compile(r"^\s*\d+(\.\d+)*\.?\s+\S{1,30}\s*$")


def _prose_runs(article: str) -> set[str]:
    """Every RUN-character run of the article's prose (whitespace removed), paragraph by
    paragraph; runs mostly of CJK characters only."""
    runs = set()
    for paragraph in article.splitlines():
        if _SECTION_TITLE.match(paragraph):
            continue
        text = _SPACE.sub("", paragraph)
        for start in range(len(text) - RUN + 1):
            run = text[start:start + RUN]
            if len(_CJK.findall(run)) >= RUN * 2 // 5:
                runs.add(run)
    return runs


def copied(text: str, runs: set[str]) -> list[str]:
    """The article's runs found in `text`, overlapping ones merged into the longest stretches."""
    flat = _SPACE.sub("", text)
    stretches: list[list[int]] = []  # [start, end) of each stretch found
    for start in range(len(flat) - RUN + 1):
        if flat[start:start + RUN] in runs:
            if stretches and start <= stretches[-1][1]:
                stretches[-1][1] = start + RUN
            else:
                stretches.append([start, start + RUN])
    return [flat[start:end] for start, end in stretches]


def course_texts(root: Path = ROOT) -> Iterator[tuple[str, str]]:
    """(where, text) for every piece of the course a reader reads."""
    for pattern in ("solutions/*/*.ipynb", "notebooks/*/*.ipynb", "notebooks-zh/*/*.ipynb"):
        for path in sorted(root.glob(pattern)):
            for number, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
                yield f"{path.relative_to(root)} cell {number}", "".join(cell.get("source", ""))
    for path in sorted(root.glob("solutions/*/*.zh.json")):
        yield str(path.relative_to(root)), path.read_text(encoding="utf-8")
    for path in [*sorted(root.glob("*.md")), *sorted(root.glob("docs/**/*.md")),
                 *sorted(root.glob("checks/locale/*/LC_MESSAGES/*.po"))]:
        yield str(path.relative_to(root)), path.read_text(encoding="utf-8")


def reuses(texts: Iterable[tuple[str, str]], article: str) -> list[tuple[str, str]]:
    """(where, copied run) for every run of the article's prose found in `texts`."""
    runs = _prose_runs(article)
    return [(where, run) for where, text in texts for run in copied(text, runs)]


def main() -> int:
    if not ARTICLE.is_file():
        print(f"the article is not at {ARTICLE}: nothing to compare with", file=sys.stderr)
        return 2
    found = reuses(course_texts(), ARTICLE.read_text(encoding="utf-8"))
    for where, run in found:
        print(f"{where}: {run}")
    print(f"{len(found)} runs of the article's prose in the course" if found
          else "no run of the article's prose in the course")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
