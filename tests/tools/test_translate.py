"""The translator's tools (checks/tools/translate.py) and the table of languages (checks/i18n.py):
a chapter's translation file is written and refreshed with the hashes of the English cells,
nothing translated is lost, `make messages` keeps the catalogue's layout, and a third language is
a row of the table (a release is built for a made-up one)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from checks import i18n
from checks.tools import release, translate

CHAPTER = "03_architectures"  # a short chapter


def _notebook(folder: Path) -> dict:
    return json.loads((folder / f"{folder.name}.ipynb").read_text(encoding="utf-8"))


def _save(folder: Path, nb: dict) -> None:
    (folder / f"{folder.name}.ipynb").write_text(json.dumps(nb, ensure_ascii=False, indent=1)
                                                 + "\n", encoding="utf-8")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.fixture
def chapter(tmp_path) -> Path:
    """A copy of one chapter with its translation, committed in a git repository of its own."""
    solutions = tmp_path / "solutions"
    shutil.copytree(release.SOLUTIONS / CHAPTER, solutions / CHAPTER,
                    ignore=shutil.ignore_patterns(*release.JUNK))
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "start")
    return solutions / CHAPTER


def test_the_committed_translations_are_up_to_date():
    """Refreshing every chapter's file changes nothing: the files are what the tool writes."""
    for name in release.chapters():
        folder = release.SOLUTIONS / name
        path = release.translation_path(folder)
        if not path.is_file():
            continue
        data, _report = translate.refresh(folder)
        assert translate.dumps(data) == path.read_text(encoding="utf-8"), name


def test_new_stale_removed_and_accepted_cells(chapter, capsys):
    nb = _notebook(chapter)
    path = release.translation_path(chapter)
    before = json.loads(path.read_text(encoding="utf-8"))["cells"]
    markdown = [c for c in nb["cells"] if c["cell_type"] == "markdown" and c["id"] in before]
    edited, gone = markdown[0], markdown[1]
    old_english = release.cell_source(edited)
    edited["source"] = "Edited after translation.\n\n" + old_english
    nb["cells"].remove(gone)
    nb["cells"].append({"cell_type": "markdown", "id": "new-cell", "metadata": {},
                        "source": "A new paragraph."})
    _save(chapter, nb)

    assert translate.main([CHAPTER[:2], "--solutions", str(chapter.parent), "--check"]) == 1
    assert translate.main([CHAPTER[:2], "--solutions", str(chapter.parent)]) == 0
    out = capsys.readouterr().out
    after = json.loads(path.read_text(encoding="utf-8"))
    # New: the hash of its English and an empty text, which is never shipped.
    assert after["cells"]["new-cell"] == {
        "sha256": release.source_hash(nb["cells"][-1]), "text": ""}
    assert "new-cell: new" in out
    shipped, problems = release.translate_notebook(nb, after["cells"], CHAPTER)
    assert release.cell_source(shipped["cells"][-1]) == "A new paragraph."
    assert ("new-cell", "missing") in {(p.cell, p.kind) for p in problems}
    # Stale: text and old hash kept; listed with the English it translated and the English now.
    assert after["cells"][edited["id"]] == before[edited["id"]]
    assert f"{edited['id']}: stale" in out
    assert old_english.splitlines()[0] in out and "Edited after translation." in out
    # Removed: kept aside, never lost.
    assert after["removed"][gone["id"]] == before[gone["id"]]
    # Every other entry as it was.
    for cell_id, entry in before.items():
        if cell_id not in (edited["id"], gone["id"]):
            assert after["cells"][cell_id] == entry
    # The translator updates the text, then accepts the cell: fresh again.
    after["cells"][edited["id"]]["text"] = "已在翻译后修改。"
    path.write_text(translate.dumps(after), encoding="utf-8")
    assert translate.main([CHAPTER, "--solutions", str(chapter.parent),
                           "--accept", edited["id"]]) == 0
    accepted = json.loads(path.read_text(encoding="utf-8"))["cells"][edited["id"]]
    assert accepted == {"sha256": release.source_hash(edited), "text": "已在翻译后修改。"}
    kinds = {(p.cell, p.kind) for p in release.translation_status(chapter.parent).errors}
    assert kinds == {("new-cell", "missing")}  # only the empty one is left


def test_a_chapter_without_a_file_gets_one(chapter):
    release.translation_path(chapter).unlink()
    data, report = translate.refresh(chapter)
    markdown = [c for c in _notebook(chapter)["cells"]
                if c["cell_type"] == "markdown" and release.cell_source(c).strip()]
    assert data["language"] == "zh" and data["source"] == f"{CHAPTER}.ipynb"
    assert list(data["cells"]) == [c["id"] for c in markdown]
    assert all(e["text"] == "" for e in data["cells"].values())
    assert {r["kind"] for r in report} == {"new"}


def test_unknown_chapter_is_one_line(capsys):
    assert translate.main(["99"]) == 2
    assert "no chapter '99'" in capsys.readouterr().err


def test_a_catalogue_update_keeps_translations_and_layout(tmp_path):
    """The update step of `make messages`: translated messages stay, new ones come empty, the
    obsolete go, sorted, lines at most 100 wide."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po

    pot, po = tmp_path / "checks.pot", tmp_path / "zh" / "checks.po"
    template = Catalog()
    for msgid in ("b message {x}", "a message", "c " + "long " * 30):
        template.add(msgid)
    translate.write_po(template, pot)
    po.parent.mkdir()
    catalog = Catalog(locale="zh")
    catalog.add("a message", "一条消息")
    catalog.add("gone", "已删除")
    translate.write_po(catalog, po)
    missing = translate.update_catalogue(pot, po, "zh")
    assert sorted(missing) == sorted(["b message {x}", "c " + "long " * 30])
    text = po.read_text(encoding="utf-8")
    assert max(len(line) for line in text.splitlines()) <= translate.WIDTH
    with open(po, "rb") as fh:
        updated = read_po(fh, locale="zh")
    assert updated["a message"].string == "一条消息" and "gone" not in updated
    assert [m.id for m in updated if m.id] == sorted(m.id for m in updated if m.id)
    before = po.read_bytes()
    translate.update_catalogue(pot, po, "zh")
    assert po.read_bytes() == before, "a second update changed the file"


@pytest.mark.slow  # nbgrader builds a release: about half a minute
def test_a_third_language_is_a_row_of_the_table(chapter, tmp_path, monkeypatch):
    """A made-up language, "xx", added as one row of checks/i18n.py's table: the translator's tool
    writes its file, and the release builds it with its text, its notebook lines and its
    language in the metadata; its translation file never reaches a release."""
    row = i18n.Language("xx", "Xish", "notebooks-xx", translation_suffix=".xx.json",
                        notebook_lines=i18n.notebook_lines("xx", "Xish edition."))
    monkeypatch.setitem(i18n.LANGUAGES, "xx", row)
    assert i18n.normalise("XX_YY") == "xx"

    assert translate.main([CHAPTER, "--lang", "xx", "--solutions", str(chapter.parent)]) == 0
    path = chapter / f"{CHAPTER}.xx.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["language"] == "xx"
    first = next(iter(data["cells"]))
    data["cells"][first]["text"] = "# Xish title"
    path.write_text(translate.dumps(data), encoding="utf-8")

    built = tmp_path / "release-xx"
    assert release.generate_release(built, chapter.parent, lang="xx") == [CHAPTER]
    nb = _notebook(built / CHAPTER)
    assert nb["metadata"]["course"]["lang"] == "xx"
    by_id = {c["id"]: release.cell_source(c) for c in nb["cells"]}
    assert by_id[first] == "# Xish title"
    assert any(src.endswith('os.environ.setdefault("LLAMA_COURSE_LANG", "xx")')
               and "# Xish edition." in src for src in by_id.values())
    assert not list(built.rglob("*.json")), "a translation file reached the release"
    assert not any("bound afresh" in src for src in by_id.values())
