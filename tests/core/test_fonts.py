"""Chinese text in figures: the course's font is installed, registered, and has every glyph;
on a fresh machine (an empty matplotlib cache) chapter 01's first figure writes nothing to
stderr."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib import font_manager

from checks import figures

SENTENCE = "我 喜欢 学习 AI"  # the article's example sentence, drawn in chapter 04's heatmap


@pytest.fixture
def fresh_font_search(monkeypatch):
    """Each test finds the font anew, and leaves matplotlib's settings as they were."""
    figures._find_cjk_family.cache_clear()
    monkeypatch.setitem(matplotlib.rcParams, "font.family",
                        list(matplotlib.rcParams["font.family"]))
    yield
    figures._find_cjk_family.cache_clear()
    plt.close("all")


def _missing_glyph_warnings(draw) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draw()
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


def test_course_setup_installs_a_cjk_font_package():
    path = figures.packaged_font_path()
    assert path is not None, "noto-cjk-sans-otc is not installed: run `make setup`"
    assert figures.covers(path, SENTENCE)


def test_use_cjk_font_registers_the_packaged_font(fresh_font_search):
    family = figures.use_cjk_font()
    assert family == "Noto Sans CJK SC"
    registered = {entry.fname for entry in font_manager.fontManager.ttflist if entry.name == family}
    assert str(figures.packaged_font_path()) in registered


def test_labels_in_the_cjk_family_have_every_glyph(fresh_font_search):
    family = figures.use_cjk_font()
    font_path = font_manager.findfont(font_manager.FontProperties(family=family),
                                      fallback_to_default=False)
    charmap = matplotlib.ft2font.FT2Font(font_path).get_charmap()
    missing = [ch for ch in SENTENCE if not ch.isspace() and ord(ch) not in charmap]
    assert missing == [], f"{font_path} lacks {missing}"

    def draw():
        fig, ax = plt.subplots()
        ax.set_xticks(range(4), SENTENCE.split(), fontfamily=family)
        fig.canvas.draw()

    assert _missing_glyph_warnings(draw) == []


def test_plain_text_falls_back_to_the_cjk_font(fresh_font_search):
    # A title that names no font: DejaVu Sans draws the Latin, the CJK font the Chinese.
    figures.use_cjk_font()

    def draw():
        fig, ax = plt.subplots()
        ax.set_title(SENTENCE)
        ax.plot([-1, 1])  # a minus sign on the tick labels, from the default font
        fig.canvas.draw()

    assert _missing_glyph_warnings(draw) == []


def test_without_the_fallback_the_figure_would_miss_glyphs(fresh_font_search):
    # The check above can fail: DejaVu Sans alone has none of the Chinese glyphs.
    def draw():
        fig, ax = plt.subplots()
        ax.set_title(SENTENCE, fontfamily="DejaVu Sans")
        fig.canvas.draw()

    assert len(_missing_glyph_warnings(draw)) == len(SENTENCE.replace(" ", "")) - 2


def test_falls_back_to_a_system_font_without_the_package(fresh_font_search, monkeypatch):
    monkeypatch.setattr(figures, "packaged_font_path", lambda: None)
    system_family = figures._system_cjk_family()
    if system_family is None:
        pytest.skip("no system CJK font on this machine")
    assert figures.use_cjk_font() == system_family
    assert system_family in matplotlib.rcParams["font.family"]


def test_no_font_at_all_says_so_in_one_line(fresh_font_search, monkeypatch, capsys):
    monkeypatch.setattr(figures, "packaged_font_path", lambda: None)
    monkeypatch.setattr(figures, "SYSTEM_CJK_FAMILIES", ())
    assert figures.use_cjk_font() is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "No Chinese font found" in out


# --------------------------------------------------------------------------------------------
# A fresh machine: chapter 01's first figure with an empty matplotlib cache, in its own process.

REPO = Path(__file__).resolve().parents[2]
CHAPTER_01 = REPO / "solutions" / "01_notation" / "01_notation.ipynb"

FIGURE_SCRIPT = """
import json, sys
import matplotlib.pyplot as plt
from checks import figures
if sys.argv[2] == "without-stand-in":
    figures._stand_in_for_bold = lambda path: None
cells = ["".join(c["source"]) for c in json.load(open(sys.argv[1], encoding="utf-8"))["cells"]
         if c["cell_type"] == "code"]
imports = next(c for c in cells if "from checks.figures import use_cjk_font" in c)
figure = next(c for c in cells if "use_cjk_font()" in c)
plt.show = lambda *args, **kwargs: [plt.figure(n).canvas.draw() for n in plt.get_fignums()]
namespace = {}
exec(imports, namespace)
exec(figure, namespace)
print(len(plt.get_fignums()), "figure drawn")
"""


def _chapter_01_figure(tmp_path, mode: str) -> subprocess.CompletedProcess:
    """Chapter 01's import cell and first figure, run as a new learner's machine would: an
    empty matplotlib cache and config folder (matplotlib rebuilds its font list)."""
    mpl = tmp_path / f"mpl-{mode}"
    mpl.mkdir()
    env = {**os.environ, "MPLCONFIGDIR": str(mpl), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", FIGURE_SCRIPT, str(CHAPTER_01), mode],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


@pytest.mark.slow
def test_chapter_01s_first_figure_is_silent_with_an_empty_matplotlib_cache(tmp_path):
    done = _chapter_01_figure(tmp_path, "as-shipped")
    assert done.returncode == 0, done.stderr
    assert "1 figure drawn" in done.stdout
    assert done.stderr == ""


@pytest.mark.slow
def test_without_the_bold_stand_in_the_fresh_machine_warns(tmp_path):
    # The test above can fail: the packaged font has no bold face, and chapter 01 asks for one.
    done = _chapter_01_figure(tmp_path, "without-stand-in")
    assert done.returncode == 0, done.stderr
    assert "Failed to find font weight bold for Noto Sans CJK SC" in done.stderr


def test_bold_chinese_has_every_glyph(fresh_font_search):
    family = figures.use_cjk_font()
    path = font_manager.findfont(font_manager.FontProperties(family=family, weight="bold"),
                                 fallback_to_default=False)
    assert Path(path) == figures.packaged_font_path()

    def draw():
        fig, ax = plt.subplots()
        ax.set_title(SENTENCE, fontweight="bold")
        fig.canvas.draw()

    assert _missing_glyph_warnings(draw) == []
