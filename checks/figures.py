"""Chinese text in the course's figures.

matplotlib's default font (DejaVu Sans) has no Chinese glyphs, so the article's sentence
"我 喜欢 学习 AI" would render as empty boxes. The course installs a CJK font from PyPI
(`noto-cjk-sans-otc`: Noto Sans CJK, SIL Open Font License) and `use_cjk_font()` registers it with
matplotlib; a machine without that package falls back to a Chinese font the system already has.

    from checks.figures import use_cjk_font
    cjk_font = use_cjk_font()   # "Noto Sans CJK SC", or None (one line on stdout says why)
    ax.set_xticks(range(4), ["我", "喜欢", "学习", "AI"], fontfamily=cjk_font)

After the call, plain text in any figure falls back to the CJK font for the glyphs DejaVu Sans
lacks, so titles and labels with Chinese work without naming the family.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import util as importlib_util
from pathlib import Path

from .i18n import get_language

# The font of the Chinese figures: the table of languages in checks/i18n.py (a language's `font`).
_FONT = get_language("zh").font

# The characters the course draws; a font counts as Chinese only if it has all of them.
SAMPLE_TEXT = _FONT.sample

# The Python package that ships the course's CJK font (see pyproject.toml).
FONT_PACKAGE = _FONT.package
FONT_FILE = _FONT.file

# System fonts that cover Simplified Chinese, best first (Linux, macOS, Windows).
SYSTEM_CJK_FAMILIES = _FONT.system_families

NO_FONT_MESSAGE = ("No Chinese font found: Chinese text in figures will show as empty boxes "
                   "(install one with `pip install noto-cjk-sans-otc`, part of `make setup`).")


def packaged_font_path() -> Path | None:
    """The font file of the course's font package, or None when it is not installed."""
    # find_spec, not import: the file is all we need, and the package has no code worth running.
    spec = importlib_util.find_spec(FONT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / FONT_FILE
    return path if path.is_file() else None


def covers(font_path: str | Path, text: str = SAMPLE_TEXT) -> bool:
    """True when the font file has a glyph for every non-space character of `text`."""
    from matplotlib import ft2font

    charmap = ft2font.FT2Font(str(font_path)).get_charmap()
    return all(ord(ch) in charmap for ch in text if not ch.isspace())


def _register_packaged_font() -> str | None:
    """Add the packaged font to matplotlib; return its Simplified Chinese family name."""
    from matplotlib import font_manager

    path = packaged_font_path()
    if path is None:
        return None
    manager = font_manager.fontManager
    manager.addfont(str(path))
    # matplotlib >= 3.10 registers every face of the collection (SC, TC, JP, KR, HK); older
    # versions only the first (JP), which still has every Chinese glyph the course draws.
    names = [entry.name for entry in manager.ttflist if Path(entry.fname) == path]
    _stand_in_for_bold(path)
    simplified = [name for name in names if name.endswith(" SC")]
    return (simplified or names or [None])[0]


def _stand_in_for_bold(path: Path) -> None:
    """Let the packaged Regular faces answer for bold too.

    The font package ships one weight, Regular. A bold label (chapter 01's figures have some)
    looks through every family of `font.family`, the CJK fallback included, and matplotlib,
    finding no bold face of it, logs "findfont: Failed to find font weight bold for Noto Sans
    CJK SC, now using 400" to stderr (a pink box in the notebook) before drawing with Regular
    anyway. Saying ahead of time that Regular is what bold gets draws the same figure without
    the warning: Latin text stays bold (DejaVu Sans Bold comes first), Chinese is Regular."""
    from matplotlib import font_manager

    manager = font_manager.fontManager
    bold = font_manager.weight_dict["bold"]

    def weight(entry) -> int:       # a number, or a name such as "bold"
        return entry.weight if isinstance(entry.weight, int) else \
            font_manager.weight_dict.get(entry.weight, 400)

    faces = [entry for entry in manager.ttflist if Path(entry.fname) == path]
    have_bold = {(entry.name, entry.style) for entry in faces if weight(entry) == bold}
    for entry in faces:
        if (entry.name, entry.style) not in have_bold:
            # Right after addfont, which emptied findfont's memo: no stale answer survives.
            manager.ttflist.append(dataclasses.replace(entry, weight=bold))
            have_bold.add((entry.name, entry.style))


def _system_cjk_family() -> str | None:
    """The best installed system font that covers SAMPLE_TEXT, or None."""
    from matplotlib import font_manager

    paths_by_name: dict[str, list[str]] = {}
    for entry in font_manager.fontManager.ttflist:
        paths_by_name.setdefault(entry.name, []).append(entry.fname)
    for name in SYSTEM_CJK_FAMILIES:
        if any(covers(path) for path in paths_by_name.get(name, ())):
            return name
    return None


def _add_as_fallback(family: str) -> None:
    """Keep the usual font first; let the CJK font supply the glyphs it lacks.

    matplotlib falls back glyph by glyph only along the `font.family` list (not along the fonts
    a generic name such as "sans-serif" stands for), so the CJK family goes at its end.
    """
    import matplotlib

    families = list(matplotlib.rcParams["font.family"])
    if family not in families:
        matplotlib.rcParams["font.family"] = [*families, family]


@functools.lru_cache(maxsize=None)
def _find_cjk_family() -> str | None:
    return _register_packaged_font() or _system_cjk_family()


def use_cjk_font() -> str | None:
    """Make Chinese text render in matplotlib figures; return the font family to use.

    Prefers the course's packaged Noto Sans CJK, then an installed system font; prints one line
    and returns None when there is none, so a figure can label its axes another way.
    """
    family = _find_cjk_family()
    if family is None:
        print(NO_FONT_MESSAGE)
        return None
    _add_as_fallback(family)
    return family
