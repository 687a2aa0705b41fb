"""The language of every message a learner or a student reads from `checks`: English or Chinese.

One message catalogue in gettext's standard form, read with the standard library's `gettext`:

    checks/locale/zh/LC_MESSAGES/checks.po    the source translators edit (any .po editor works)
    checks/locale/zh/LC_MESSAGES/checks.mo    compiled from it, shipped with the package

The English text in the code is the message id; English needs no catalogue. The language is
`LLAMA_COURSE_LANG` (`en`, `zh` or another code of `LANGUAGES`; `checks.environment.ENVIRONMENT`)
when it is set, else the one a caller chose with `using(...)` (the grader: the submission's
`metadata.course.lang`), else English.
The Chinese release's notebooks set the variable in their first code cell
(`os.environ.setdefault(...)`, so a learner's own setting wins). The language is read at every
call, so a kernel that switches goes on in the new language at once.

## How a checker wraps its messages (the pattern of checks.nb01 and checks.nb04)

    from .i18n import _, N_

    c.fail(_("rejected a valid config ({config}): {why}").format(config=..., why=...))
    wrong={_("divided the wrong way round: G = N_h / N_kv"): ...}
    what=_("head_dim for {config}").format(config=_short(cfg))

- Every sentence a learner reads goes through `_()` where it is used (the language is the one of
  that moment). Placeholders are named (`{config}`, never `{}` or `%s`), and the values go in with
  `.format(...)` after `_()`: an f-string would put the values into the message id, which then
  never matches the catalogue. The placeholders of a msgid and its msgstr must be the same set
  (tests/course/test_i18n.py).
- A message kept in a module-level constant is marked with `N_("...")` (returns it unchanged, for
  extraction) and translated where it is shown: `_(ATTN_OUT_IS_H)`.
- Symbols, code and names (`head_dim`, `N_kv`, `torch.softmax`, `[B, S, H]`) stay as they are
  inside the Chinese; only the sentence around them is translated.
- Numbers, shapes and values stay outside the message (placeholders), so one msgid covers every
  case.
- A module that imports `_` never uses `_` as a throwaway name (`for _ in range(n)` would
  replace the function for the rest of the function body): write `for _n in range(n)`.
- `LearnerError.message` stays English (the failure's record; checks recognise an exception by
  `err.error` and `err.error_text`, never by parsing it); show `err.summary()` or
  `err.shown_message` to the learner, and
  add a hint with `raise err.with_hint(hint)`, never `LearnerError(err.exercise, err.message, ...)`
  (that loses the parts the Chinese is built from).
- A hint may be a constant's English (`hint=IN_PLACE`): CheckFailure translates message and hint
  when it renders, so comparisons such as `failure.hint == UNEXPLAINED` keep working; a hint
  built from parts is translated when built (`_(STEP).format(mistake=_(mistake))`).

## The languages: one table

`LANGUAGES` below lists each language once: its code (`LLAMA_COURSE_LANG`, a notebook's
`metadata.course.lang`), its release folder (`notebooks-zh/`), the suffix of its translation files
beside each chapter (`.zh.json`), its font for figures (checks/figures.py) and the lines that end
the first code cell of its release. Its catalogue is `checks/locale/<code>/LC_MESSAGES/checks.po`.
checks/figures.py, checks/tools/release.py and checks/tools/translate.py read the table, so a third
language is a row here, its catalogue and its translation files.

## After changing a message (Babel is installed in the course environment)

    make messages        # extract checks/locale/checks.pot, update every language's .po
    (write the new msgstr entries in checks/locale/<code>/LC_MESSAGES/checks.po)
    make messages        # again: compiles the .mo files

The languages and their catalogues are the table below; `make messages` runs
`python -m checks.tools.translate --messages` (docs/maintainer/recipes.md).

tests/course/test_i18n.py fails while any extracted message has no Chinese, while a placeholder
differs, or while the .mo is older than the .po.
"""

from __future__ import annotations

import contextlib
import contextvars
import gettext as _gettext
import os
from dataclasses import dataclass
from pathlib import Path

from .environment import LANG_ENV

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
LOCALE_DIR = PACKAGE / "locale"
#: The gettext domain of the messages of `checks`.
DOMAIN = "checks"


# ------------------------------------------------------------------------------------------------
# the table of languages

@dataclass(frozen=True)
class Font:
    """A font that draws a language's text in figures."""

    package: str                 # the importable name of the Python package that ships it
    file: str                    # the font file inside that package
    sample: str                  # characters the course draws; a font must cover them all
    system_families: tuple[str, ...] = ()  # installed fonts that would do, best first
    pip_name: str = ""           # what `pip install` takes (for messages)


@dataclass(frozen=True)
class Language:
    code: str                    # "zh": LLAMA_COURSE_LANG's value, metadata.course.lang
    name: str                    # its own name for itself ("中文")
    release: str                 # the release folder, relative to the repository
    translation_suffix: str | None = None  # ".zh.json"; None: the source language
    font: Font | None = None
    notebook_lines: str = ""     # appended to the release's first code cell after the install cell

    @property
    def catalogue(self) -> Path | None:
        """Its message catalogue (.po), or None for the source language."""
        if self.translation_suffix is None:
            return None
        return LOCALE_DIR / self.code / "LC_MESSAGES" / f"{DOMAIN}.po"

    @property
    def release_dir(self) -> Path:
        return ROOT / self.release

    @property
    def is_source(self) -> bool:
        return self.translation_suffix is None


def notebook_lines(code: str, comment: str = "") -> str:
    """The plain lines that make a release speak `code`: an optional comment (in the language),
    then LLAMA_COURSE_LANG set unless the learner set it. A language with a font adds its own
    lines after these (see ZH_LINES)."""
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return f'\n\n{head}import os\n\nos.environ.setdefault("LLAMA_COURSE_LANG", "{code}")'


CJK_FONT = Font(
    package="noto_cjk_sans_otc", file="NotoSansCJK-Regular.ttc", sample="我喜欢学习",
    pip_name="noto-cjk-sans-otc",
    system_families=(
        "Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN",
        "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "PingFang SC", "Heiti SC", "Hiragino Sans GB",
        "Microsoft YaHei", "SimHei", "Noto Sans CJK JP", "Noto Sans CJK TC", "Noto Serif CJK SC",
        "Arial Unicode MS"))

#: What ends a Chinese notebook's first code cell (its imports): checks.i18n reads the variable
#: whenever it shows a message; the course's CJK font labels the figures in Chinese.
ZH_LINES = ('\n\n# 中文版：检查结果用中文显示（想看英文，先把 LLAMA_COURSE_LANG 设为 "en"）。\n'
            '# 图中的中文用课程自带的字体；它排在字体列表首位，'
            '公式标签（$...$）里的中文也能显示。\n'
            'import os\n'
            '\n'
            'import matplotlib\n'
            'from checks.figures import use_cjk_font\n'
            '\n'
            'os.environ.setdefault("LLAMA_COURSE_LANG", "zh")\n'
            'cjk_font = use_cjk_font()\n'
            'if cjk_font:\n'
            '    matplotlib.rcParams["font.family"] = '
            '[cjk_font, *matplotlib.rcParams["font.family"]]')

#: Every language, the source first: the one place that lists them. A new language is one more
#: row (then its catalogue, `make messages`, and its translation files, `python -m
#: checks.tools.translate NN --lang CODE`; docs/maintainer/recipes.md, "Add a language").
LANGUAGES: dict[str, Language] = {
    "en": Language("en", "English", "notebooks"),
    "zh": Language("zh", "中文", "notebooks-zh", translation_suffix=".zh.json", font=CJK_FONT,
                   notebook_lines=ZH_LINES),
}

#: The language of the source (solutions/) and of every message's id.
SOURCE = "en"


def get_language(code: str) -> Language:
    """The row of `code`; KeyError naming the known ones otherwise."""
    try:
        return LANGUAGES[code]
    except KeyError:
        raise KeyError(f"no language {code!r} (one of {', '.join(LANGUAGES)})") from None


def translated_languages() -> list[Language]:
    """The languages other than the source."""
    return [lang for lang in LANGUAGES.values() if not lang.is_source]


DEFAULT = SOURCE

# ------------------------------------------------------------------------------------------------
# the language of the moment

_chosen: contextvars.ContextVar = contextvars.ContextVar("checks_language", default=None)
_catalogues: dict[str, _gettext.NullTranslations] = {}


def normalise(lang: object) -> str | None:
    """`zh`, `zh_CN`, `zh-Hans`, `ZH` -> "zh"; `en...` -> "en"; anything else -> None."""
    if not isinstance(lang, str):
        return None
    head = lang.strip().lower().replace("-", "_").split("_")[0].split(".")[0]
    return head if head in LANGUAGES else None


def language() -> str:
    """The language messages are in now: LLAMA_COURSE_LANG, else `using(...)`, else English."""
    return normalise(os.environ.get(LANG_ENV)) or _chosen.get() or DEFAULT


@contextlib.contextmanager
def using(lang: str | None):
    """Messages in `lang` inside the block, unless LLAMA_COURSE_LANG says otherwise (an unknown
    or empty `lang` changes nothing)."""
    token = _chosen.set(normalise(lang) or _chosen.get())
    try:
        yield
    finally:
        _chosen.reset(token)


@contextlib.contextmanager
def using_default():
    """Messages in LLAMA_COURSE_LANG's language, else English, inside the block, whatever a
    `using` around it chose: what the instructor reads while a submission's language is in
    force (the grader's own failure, not the submission's)."""
    token = _chosen.set(None)
    try:
        yield
    finally:
        _chosen.reset(token)


def notebook_language(nb) -> str:
    """The language a notebook is written in: its `metadata.course.lang` (the Chinese release
    sets "zh"), else English."""
    meta = nb.get("metadata", {}) if hasattr(nb, "get") else {}
    course = meta.get("course", {}) if hasattr(meta, "get") else {}
    lang = course.get("lang") if hasattr(course, "get") else None
    return normalise(lang) or DEFAULT


def catalogue(lang: str | None = None) -> _gettext.NullTranslations:
    """The compiled catalogue of `lang` (default: the current language); English, or a
    language without a compiled catalogue, gives the English text back."""
    lang = lang or language()
    if lang not in _catalogues:
        if lang == DEFAULT:
            _catalogues[lang] = _gettext.NullTranslations()
        else:
            _catalogues[lang] = _gettext.translation(DOMAIN, LOCALE_DIR, languages=[lang],
                                                     fallback=True)
    return _catalogues[lang]


def _(message: str) -> str:
    """`message` in the current language (the English itself when there is no translation)."""
    return catalogue().gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    """The singular or plural form for `n`, in the current language."""
    return catalogue().ngettext(singular, plural, n)


def N_(message: str) -> str:
    """Mark a message for the catalogue without translating it now (module constants); translate
    it with `_()` where it is shown."""
    return message
