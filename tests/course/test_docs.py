"""Docs that cannot drift: README.md, README.zh.md, CONTRIBUTING.md and docs/**/*.md.

- Every relative link resolves: the file (or folder) exists and its #anchor is one GitHub makes
  for a heading of that file (or an explicit <a id>/<a name>).
- Every `--flag` a page uses with `python -m checks ...` exists in that command's real `--help`,
  and every `make TARGET` is a target of the Makefile.
- A size or a time is stated once: the quantities of docs/facts.md are stated nowhere else (pages
  link to it), a line that names one of its subjects quotes no number for it, and no other size or
  time appears on two pages. Dated benchmark results (docs/maintainer/benchmarks-YYYY-MM-DD.md)
  are records of a run, not statements, and are left out of this last check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "docs" / "facts.md"
RESULTS = re.compile(r"^benchmarks-\d{4}-\d{2}-\d{2}\.md$")


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "README.zh.md", ROOT / "CONTRIBUTING.md",
             *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if p.is_file()]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


PAGES = pages()
FENCE = re.compile(r"^(```|~~~)")


def _split_code(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, code-block lines), each as (line number, text)."""
    prose, code, inside = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        (code if inside else prose).append((number, line))
    return prose, code


# ------------------------------------------------------------------------------------------------
# links and anchors

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text, lower-cased, punctuation dropped
    (letters of every script, digits, `_`, `-` and spaces kept), spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                          # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)               # _emphasis_, not snake_case
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    text = path.read_text(encoding="utf-8")
    prose, _code = _split_code(text)
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for _number, line in prose:
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        found.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return frozenset(found)


def _strip_inline_code(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def links(path: Path) -> list[tuple[int, str]]:
    """The relative link targets of a page, outside code: (line number, target)."""
    prose, _code = _split_code(path.read_text(encoding="utf-8"))
    found = []
    for number, line in prose:
        line = _strip_inline_code(line)
        for pattern in (LINK, IMAGE):
            for target in pattern.findall(line):
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:
                    found.append((number, target))
    return found


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    broken = []
    for number, target in links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        where = f"{_rel(page)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading makes #{anchor} (there are: "
                          f"{', '.join(sorted(anchors(dest)))})")
        elif anchor and dest.suffix != ".md":
            broken.append(f"{where}: an anchor into a file that is not Markdown")
    assert not broken, "\n".join(broken)


FIRST_SCREEN = 40  # lines a browser shows before the reader scrolls


@pytest.mark.parametrize("name", ["README.md", "README.zh.md"])
def test_the_readme_is_short_and_starts_the_learner(name):
    """At most 150 lines, and chapter 01 on the first screen: its Colab link (README.md), or,
    where the Chinese README leads with the local install that works in mainland China, the
    notebook to open."""
    from checks import install

    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"{name}: {len(lines)} lines; move the detail into docs/"
    first = install.chapters(ROOT)[0]
    wanted = install.colab_url(first) if name == "README.md" else f"{first}/{first}.ipynb"
    assert any(wanted in line for line in lines[:FIRST_SCREEN]), \
        f"{name}: chapter 01 ({wanted}) is not on the first screen"


def test_the_chinese_readme_opens_the_chinese_release():
    """README.zh.md's Colab links open notebooks-zh/, one per chapter, at the address of
    checks/install.py's REPOSITORY (as README.md's, which `python -m checks.install --sync`
    writes), and its clone command names the same repository."""
    from checks import install

    text = (ROOT / "README.zh.md").read_text(encoding="utf-8")
    for chapter in install.chapters(ROOT):
        url = install.colab_url(chapter).replace("/notebooks/", "/notebooks-zh/")
        assert url in text, f"README.zh.md: no Colab link {url}"
    assert f"git clone {install.REPOSITORY}.git" in text


def test_the_slugs_are_githubs():
    assert github_slug("Open in Colab, Kaggle or any Jupyter") == \
        "open-in-colab-kaggle-or-any-jupyter"
    assert github_slug("Grading with `python -m checks grade`") == \
        "grading-with-python--m-checks-grade"
    assert github_slug("在 Colab、Kaggle 或任意 Jupyter 中打开") == \
        "在-colabkaggle-或任意-jupyter-中打开"
    assert github_slug("`--report FILE.html`: the class report") == \
        "--report-filehtml-the-class-report"
    assert github_slug("Add or update a translated cell") == "add-or-update-a-translated-cell"


# ------------------------------------------------------------------------------------------------
# commands and their flags

COMMAND = re.compile(r"(?:^|[\s`(!])(?:\S*/)?python3? -m (checks(?:\.[a-z_]+)*)((?:\s+[^\s`]+)*)")
MAKE = re.compile(r"(?:^|[\s`(])make((?:\s+[a-zA-Z][\w.-]*)+|(?:\s+-[-\w=]+)+)")
SUBCOMMANDS = {"checks": ("status", "grade", "gradescope", "doctor")}
FLAG = re.compile(r"(?<![\w-])(--[a-zA-Z][\w-]*)")
#: What ends a command on a line: a comment, a shell operator, a sentence going on in prose.
END = re.compile(r"\s(?:#|&&|\|\||\||;|>)\s|\s#|[`]|\)\s|\)$")


def _command_texts(page: Path) -> list[tuple[int, str]]:
    """Every piece of text that may hold a command: code-block lines (joined over trailing
    backslashes) and inline code spans."""
    prose, code = _split_code(page.read_text(encoding="utf-8"))
    texts, pending = [], None
    for number, line in code:
        if pending is not None:
            line = pending[1] + " " + line.strip()
            number = pending[0]
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        pending = None
        texts.append((number, line))
    for number, line in prose:
        texts += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
    return texts


def commands(page: Path) -> list[tuple[int, str, str | None, list[str]]]:
    """(line, module, subcommand, flags) for every `python -m checks...` command of a page."""
    found = []
    for number, text in _command_texts(page):
        for match in COMMAND.finditer(text):
            module, rest = match.group(1), match.group(2)
            cut = END.search(rest + " ")
            rest = rest[:cut.start()] if cut else rest
            words = rest.split()
            sub = words[0] if words and words[0] in SUBCOMMANDS.get(module, ()) else None
            flags = [f for f in FLAG.findall(rest) if f != "--help"]
            found.append((number, module, sub, flags))
    return found


def make_uses(page: Path) -> list[tuple[int, list[str]]]:
    """(line, words after `make`) for every make command of a page."""
    found = []
    for number, text in _command_texts(page):
        for match in MAKE.finditer(text):
            found.append((number, match.group(1).split()))
    return found


@lru_cache(maxsize=None)
def _help(command: tuple[str, ...]) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          cwd=ROOT).stdout


def _helps(keys: set[tuple[str, str | None]]) -> dict[tuple[str, str | None], str]:
    """Each command's --help, run in parallel (each starts its own Python)."""
    procs = {key: subprocess.Popen([sys.executable, "-m", key[0], *([key[1]] if key[1] else []),
                                    "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
             for key in sorted(keys, key=str)}
    return {key: proc.communicate(timeout=300)[0] for key, proc in procs.items()}


@pytest.mark.slow  # runs the real --help of about ten commands, each a Python that imports torch
def test_every_flag_a_page_uses_is_in_the_commands_help():
    uses = [(page, *use) for page in PAGES for use in commands(page)]
    assert uses, "no `python -m checks` command found: the pattern is broken"
    helps = _helps({(module, sub) for _p, _n, module, sub, _f in uses})
    missing = []
    for page, number, module, sub, flags in uses:
        text = helps[(module, sub)]
        name = " ".join(filter(None, ["python -m", module, sub]))
        assert "usage:" in text, f"{name} --help did not run:\n{text}"
        missing += [f"{_rel(page)}:{number}: {name} has no {flag}" for flag in flags
                    if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]
    assert not missing, "\n".join(missing)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-zA-Z][\w.-]*)\s*:(?!=)", text, re.MULTILINE))


def test_every_make_target_and_flag_a_page_uses_exists():
    targets = _make_targets()
    problems = []
    for page in PAGES:
        for number, words in make_uses(page):
            for word in words:
                if word.startswith("-"):
                    flag = word.split("=")[0]
                    if flag not in _help(("make", "--help")):
                        problems.append(f"{_rel(page)}:{number}: make has no {flag}")
                elif "=" not in word and word not in targets:
                    problems.append(f"{_rel(page)}:{number}: the Makefile has no target {word}")
    assert not problems, "\n".join(problems)


def test_the_command_patterns_find_what_they_should(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("Run `python -m checks grade a/ --json x.json` and\n\n```bash\n"
                    ".venv/bin/python -m checks.tools.release --check   # --not-a-flag\n"
                    "python -m checks grade x \\\n    --csv y.csv | tee --append z\n"
                    "make release\n```\n", encoding="utf-8")
    assert [(m, s, f) for _n, m, s, f in commands(page)] == [
        ("checks.tools.release", None, ["--check"]), ("checks", "grade", ["--csv"]),
        ("checks", "grade", ["--json"])]
    assert [w for _n, w in make_uses(page)] == [["release"]]


# ------------------------------------------------------------------------------------------------
# sizes and times, stated once

SIZE = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*)\s?(KB|kB|MB|GB|TB|KiB|MiB|GiB|TiB)\b")
WORD_NUMBER = r"(?:\d+(?:\.\d+)?|a|an|one|two|three|four|five|six|seven|eight|nine|ten|twenty)"
TIME = re.compile(rf"\b(?:about|under|over|in|takes?|within)\s+{WORD_NUMBER}\s+"
                  r"(minutes?|hours?|seconds?)\b|(?:约|大约|不到|不超过)\s?[\d一两二三四五六七八九十]+\s?"
                  r"(分钟|秒|小时)", re.IGNORECASE)


def quantities(line: str) -> list[str]:
    """The sizes and times a line states, normalised ("98 MB", "about two minutes")."""
    found = [f"{n.replace(',', '')} {unit}" for n, unit in SIZE.findall(line)]
    found += [re.sub(r"\s+", " ", m.group(0).lower()) for m in TIME.finditer(line)]
    return found


def facts() -> list[dict]:
    """The rows of docs/facts.md's tables: {"what", "value", "subjects"}. A row's subjects are the
    `code` names in its first column (what a page would mention near the number)."""
    rows = []
    for line in FACTS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not line.startswith("|") or set(cells[0]) <= {"-"} or \
                cells[0] == "what":
            continue
        rows.append({"what": cells[0], "value": cells[1],
                     "subjects": re.findall(r"`([^`]+)`", cells[0])})
    return rows


def _statement_pages() -> list[Path]:
    return [p for p in PAGES if p != FACTS and not RESULTS.match(p.name)]


def test_the_facts_table_states_each_quantity():
    rows = facts()
    assert len(rows) >= 8, "docs/facts.md: the tables were not found"
    for row in rows:
        assert quantities(row["value"]) or re.search(r"\d", row["value"]), row


def test_a_fact_is_stated_only_in_docs_facts():
    """A quantity of docs/facts.md appears on no other page, and no line of another page names a
    fact's subject together with a size or a time (it links to docs/facts.md instead)."""
    known = {q for row in facts() for q in quantities(row["value"])}
    subjects = {s for row in facts() for s in row["subjects"] if len(s) > 4}
    problems = []
    for page in _statement_pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            stated = quantities(line)
            where = f"{_rel(page)}:{number}"
            problems += [f"{where}: {q!r} is in docs/facts.md: link to it" for q in stated
                         if q in known]
            named = [s for s in subjects if s in line]
            if stated and named:
                problems.append(f"{where}: {named[0]} with {stated[0]!r}: state it in "
                                "docs/facts.md and link to it")
    assert not problems, "\n".join(problems)


def test_no_size_or_time_is_stated_twice():
    seen: dict[str, list[str]] = {}
    for page in _statement_pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for quantity in quantities(line):
                seen.setdefault(quantity, []).append(f"{_rel(page)}:{number}")
    twice = {q: where for q, where in seen.items() if len(where) > 1}
    assert not twice, "stated more than once (state it in docs/facts.md and link to it): " + \
        "; ".join(f"{q!r} at {', '.join(w)}" for q, w in twice.items())


def test_the_quantity_pattern_finds_sizes_and_times():
    assert quantities("a 98 MB wheel, 1.5 GB for .venv; about two minutes on 2 cores") == [
        "98 MB", "1.5 GB", "about two minutes"]
    assert quantities("模型 wheel 98 MB，转换约一分钟") == ["98 MB", "约一分钟"]
    assert quantities("(default 8M), --timeout 120, 2 cores") == []
