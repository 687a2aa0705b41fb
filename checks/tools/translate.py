"""The translator's tools: a chapter's translation file, and the message catalogues.

    python -m checks.tools.translate 04              write or refresh solutions/04_*/04_*.zh.json
    python -m checks.tools.translate 04 --lang xx    the same for another language of the table
    python -m checks.tools.translate 04 --accept ID  the stale cell ID is translated again: record
                                                     the hash of its current English
    python -m checks.tools.translate all --check     exit 1 if a file would change or a cell is
                                                     stale or untranslated (writes nothing)
    python -m checks.tools.translate --messages      the catalogues (`make messages`): extract
                                                     checks/locale/checks.pot, update and compile
                                                     every language's checks.po

## A chapter's translation file (the format is checks/tools/release.py's)

Refreshing `solutions/NN_slug/NN_slug<suffix>` against the English notebook beside it:

- every markdown cell with text gets an entry; a new one is `{"sha256": <hash of the English>,
  "text": ""}`: fill in "text" (an empty text is not shipped: the cell stays English);
- an entry whose sha256 is not the hash of its cell's English is *stale*: it keeps its text and
  its old hash (so the release keeps showing the English) and is listed with the English it
  translated (found in git's history of the notebook, by its hash) and the English now. Update
  the text, then `--accept ID` records the new hash;
- an entry for a cell that no longer exists moves to "removed" (kept, never shipped), so nothing
  translated is lost; an empty one is dropped;
- entries keep the file's order, new ones after them in the order of the notebook's cells; code
  cells keep their "strings" entries (written by hand: exact English substrings and their
  translation).

The hash is checks.tools.release.source_hash: the sha256 of the cell's source as one UTF-8 string.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

from checks import i18n
from checks.tools import release

ROOT = release.ROOT
POT = i18n.LOCALE_DIR / f"{i18n.DOMAIN}.pot"
#: The catalogues' layout: pybabel's extraction with these options, and the .po written by babel's
#: write_po with the same width and sorted (what `pybabel update` cannot sort).
WIDTH = 100
EXTRACT = ("-w", str(WIDTH), "--no-location", "--omit-header", "--sort-output")
SHOWN_MISSING = 20  # untranslated messages listed by `make messages`


class TranslateError(RuntimeError):
    """A chapter that does not exist, a file that cannot be read."""


def chapter_dir(chapter: str, solutions: Path = release.SOLUTIONS) -> Path:
    """The chapter folder for "04", "4" or "04_self_attention"."""
    names = release.chapters(solutions)
    key = chapter.strip()
    if key.isdigit():
        key = f"{int(key):02d}"
    found = [name for name in names if name == key or name.split("_")[0] == key]
    if len(found) != 1:
        raise TranslateError(f"no chapter {chapter!r} in {solutions} (one of "
                             f"{', '.join(n[:2] for n in names)})")
    return Path(solutions) / found[0]


def _notebook(folder: Path) -> dict:
    path = folder / f"{folder.name}.ipynb"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TranslateError(f"{path}: not a readable notebook ({exc})") from None


def old_english(folder: Path, cell_id: str, sha256: str, limit: int = 300) -> str | None:
    """The English source of `cell_id` whose hash is `sha256`, from git's history of the chapter's
    notebook (the newest `limit` commits), or None when git or the version is not there."""
    path = folder / f"{folder.name}.ipynb"
    try:
        commits = subprocess.run(
            ["git", "log", f"-{limit}", "--format=%H", "--", path.name], cwd=folder,
            capture_output=True, text=True, timeout=60, check=True).stdout.split()
        prefix = subprocess.run(["git", "rev-parse", "--show-prefix"], cwd=folder,
                                capture_output=True, text=True, timeout=60,
                                check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    for commit in commits:
        try:
            text = subprocess.run(["git", "show", f"{commit}:{prefix}{path.name}"], cwd=folder,
                                  capture_output=True, text=True, encoding="utf-8",
                                  timeout=60, check=True).stdout
            cells = json.loads(text).get("cells", [])
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        for cell in cells:
            if cell.get("id") == cell_id and release.source_hash(cell) == sha256:
                return release.cell_source(cell)
    return None


def refresh(folder: Path, lang: str = "zh", accept: tuple[str, ...] = ()
            ) -> tuple[dict, list[dict]]:
    """The chapter's translation file, refreshed (see the module's docstring), and the report:
    one dict per cell to look at ({"cell", "kind": new | stale | untranslated | removed,
    "english", "old_english"})."""
    folder = Path(folder)
    nb = _notebook(folder)
    path = release.translation_path(folder, lang)
    if path.is_file():
        release.read_translation(path, lang)  # the format, checked
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        data = {"language": lang, "source": f"{folder.name}.ipynb", "cells": {}}
    old: dict[str, dict] = data.get("cells", {})
    removed: dict[str, dict] = dict(data.get("removed", {}))
    cells: dict[str, dict] = {}
    report: list[dict] = []
    ids = set()
    for cell in nb.get("cells", []):
        cell_id, english = cell.get("id"), release.cell_source(cell)
        ids.add(cell_id)
        entry = old.get(cell_id)
        if entry is None and cell.get("cell_type") == "markdown" and english.strip():
            entry = {"sha256": release.source_hash(cell), "text": ""}
            report.append({"cell": cell_id, "kind": "new", "english": english})
        elif entry is None:
            continue
        else:
            entry = dict(entry)
            if cell_id in accept:
                entry["sha256"] = release.source_hash(cell)
            if entry["sha256"] != release.source_hash(cell):
                report.append({"cell": cell_id, "kind": "stale", "english": english,
                               "old_english": old_english(folder, cell_id, entry["sha256"])})
            elif "text" in entry and not entry["text"].strip():
                report.append({"cell": cell_id, "kind": "untranslated", "english": english})
        cells[cell_id] = entry
    for cell_id, entry in old.items():
        if cell_id not in ids and (entry.get("text", "").strip() or entry.get("strings")):
            removed[cell_id] = entry
            report.append({"cell": cell_id, "kind": "removed", "english": ""})
    unknown = [a for a in accept if a not in ids]
    if unknown:
        raise TranslateError(f"--accept: no cell {', '.join(unknown)} in {folder.name}")
    # The file's own order first (a refresh changes only what changed), new cells after it.
    ordered = {cell_id: cells[cell_id] for cell_id in old if cell_id in cells}
    ordered.update(cells)
    out = {"language": lang, "source": data.get("source", f"{folder.name}.ipynb"),
           "cells": ordered}
    if removed:
        out["removed"] = removed
    return out, report


def dumps(data: dict) -> str:
    """A translation file's text: the layout of the committed files (indent 1, UTF-8 as is)."""
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def _show(folder: Path, report: list[dict], out) -> None:
    for item in report:
        head = f"{folder.name} cell {item['cell']}: {item['kind']}"
        if item["kind"] == "stale":
            was = item.get("old_english")
            was = _indent(was) if was is not None else "    (not found in git's history)"
            print(f"{head}\n  English it translated:\n{was}\n  English now:\n"
                  f"{_indent(item['english'])}", file=out)
        elif item["kind"] in ("new", "untranslated"):
            print(f"{head}: {release._first_words(item['english'])}", file=out)
        else:
            print(f"{head}: moved to \"removed\"", file=out)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


# ------------------------------------------------------------------------------------------------
# the message catalogues


def write_po(catalog, path: Path) -> bytes:
    """The bytes of a .po in the committed layout (width 100, sorted), written to `path`."""
    from babel.messages.pofile import write_po as _write_po

    buffer = io.BytesIO()
    _write_po(buffer, catalog, width=WIDTH, sort_output=True)
    data = buffer.getvalue()
    Path(path).write_bytes(data)
    return data


def update_catalogue(pot: Path, po: Path, lang: str) -> list[str]:
    """Update `po` from the template `pot` (no fuzzy matching); return the message ids that have
    no translation yet."""
    from babel.messages.pofile import read_po

    with open(pot, "rb") as fh:
        template = read_po(fh)
    if po.is_file():
        with open(po, "rb") as fh:
            catalog = read_po(fh, locale=lang)
    else:
        from babel.messages.catalog import Catalog

        catalog = Catalog(locale=lang, domain=i18n.DOMAIN)
        po.parent.mkdir(parents=True, exist_ok=True)
    before = ({m.id for m in catalog if m.id}, catalog.creation_date)
    catalog.update(template, no_fuzzy_matching=True, update_header_comment=False)
    catalog.obsolete.clear()
    if {m.id for m in catalog if m.id} == before[0]:
        catalog.creation_date = before[1]  # the same messages: no new date in the header
    write_po(catalog, po)
    return [str(m.id) for m in catalog if m.id and not m.string]


def messages(root: Path = ROOT, pybabel: str | None = None) -> int:
    """Extract, update every language's catalogue, compile: what `make messages` runs in the
    repository `root`. 1 while a message has no translation (named), else 0."""
    pybabel = pybabel or str(Path(sys.executable).parent / "pybabel")
    root = Path(root)
    locale = root / i18n.LOCALE_DIR.relative_to(ROOT)
    pot = locale / POT.name
    subprocess.run([pybabel, "extract", "-F", "babel.cfg", "-o", str(pot), *EXTRACT, "."],
                   cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status = 0
    for lang in i18n.translated_languages():
        po = locale / lang.catalogue.relative_to(i18n.LOCALE_DIR)
        missing = update_catalogue(pot, po, lang.code)
        if missing:
            print(f"{po.relative_to(root)}: {len(missing)} message(s) without a translation; "
                  "write them, then run `make messages` again:")
            for msgid in missing[:SHOWN_MISSING]:
                print(f"  {msgid!r}")
            if len(missing) > SHOWN_MISSING:
                print(f"  ... and {len(missing) - SHOWN_MISSING} more")
            status = 1
        subprocess.run([pybabel, "compile", "-d", str(locale), "-D", i18n.DOMAIN,
                        "-l", lang.code, "--statistics"], cwd=root, check=True)
    return status


# ------------------------------------------------------------------------------------------------
# the command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.tools.translate",
        description="Write or refresh a chapter's translation file (the sha256 of each English "
                    "cell), or the message catalogues (--messages).")
    parser.add_argument("chapter", nargs="?",
                        help="a chapter: 04, 4 or 04_self_attention; `all` for every chapter")
    parser.add_argument("--lang", default="zh",
                        choices=[lang.code for lang in i18n.translated_languages()],
                        help="the language (default: zh)")
    parser.add_argument("--accept", action="append", default=[], metavar="CELL_ID",
                        help="record the current English hash of a stale cell whose text you "
                             "have updated (repeatable)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file would change, or a cell is stale "
                             "or untranslated")
    parser.add_argument("--messages", action="store_true",
                        help="extract, update and compile the message catalogues "
                             "(make messages)")
    parser.add_argument("--solutions", type=Path, default=release.SOLUTIONS, metavar="DIR",
                        help="source folder (default: the repository's solutions/)")
    args = parser.parse_args(argv)
    if args.messages:
        return messages()
    if not args.chapter:
        parser.error("name a chapter (or --messages)")
    try:
        folders = ([Path(args.solutions) / n for n in release.chapters(args.solutions)]
                   if args.chapter == "all" else [chapter_dir(args.chapter, args.solutions)])
        failed = False
        for folder in folders:
            data, report = refresh(folder, args.lang, tuple(args.accept))
            path = release.translation_path(folder, args.lang)
            text = dumps(data)
            changed = not path.is_file() or path.read_text(encoding="utf-8") != text
            _show(folder, report, sys.stdout)
            if args.check:
                failed |= changed or any(i["kind"] != "removed" for i in report)
                if changed:
                    print(f"{path.relative_to(args.solutions.parent)}: out of date")
            elif changed:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path}")
    except (TranslateError, release.ReleaseError) as exc:
        print(f"translate: {exc}", file=sys.stderr)
        return 2
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
