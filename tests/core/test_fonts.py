"""Chinese text in figures: the course's font is installed, registered, and has every glyph."""

import warnings

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib import font_manager  # noqa: E402

from checks import figures  # noqa: E402

SENTENCE = "我 喜欢 学习 AI"  # the article's example sentence, drawn in chapter 04's heatmap


@pytest.fixture
def fresh_font_search(monkeypatch):
    """Each test finds the font anew, and leaves matplotlib's settings as they were."""
    figures._find_cjk_family.cache_clear()
    monkeypatch.setitem(matplotlib.rcParams, "font.family", list(matplotlib.rcParams["font.family"]))
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
