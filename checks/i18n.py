"""The language of every message a learner or a student reads from `checks`: English or Chinese.

One message catalogue in gettext's standard form, read with the standard library's `gettext`:

    checks/locale/zh/LC_MESSAGES/checks.po    the source translators edit (any .po editor works)
    checks/locale/zh/LC_MESSAGES/checks.mo    compiled from it, shipped with the package

The English text in the code is the message id; English needs no catalogue. The language is
`LLAMA_COURSE_LANG` (`en` or `zh`; `checks.environment.ENVIRONMENT`) when it is set, else the one a
caller chose with `using(...)` (the grader: the submission's `metadata.course.lang`), else English.
The Chinese release's notebooks set the variable in their first code cell
(`os.environ.setdefault(...)`, so a learner's own setting wins). The language is read at every
call, so a kernel that switches goes on in the new language at once.

## How a checker wraps its messages (the pattern of checks/nb01.py and checks/nb04.py)

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
- `LearnerError.message` stays English (checkers test it: `first.startswith("raised ValueError")`,
  `"KeyError" in err.message`); show `err.summary()` or `err.shown_message` to the learner, and
  add a hint with `raise err.with_hint(hint)`, never `LearnerError(err.exercise, err.message, ...)`
  (that loses the parts the Chinese is built from).
- A hint may be a constant's English (`hint=IN_PLACE`): CheckFailure translates message and hint
  when it renders, so comparisons such as `failure.hint == UNEXPLAINED` keep working; a hint
  built from parts is translated when built (`_(STEP).format(mistake=_(mistake))`).

## After changing a message (Babel is installed in the course environment)

    .venv/bin/pybabel extract -F babel.cfg -o checks/locale/checks.pot --no-location \\
        --omit-header --sort-output .
    .venv/bin/pybabel update -i checks/locale/checks.pot -d checks/locale -D checks -l zh \\
        --no-fuzzy-matching --omit-header
    (write the new msgstr entries in checks/locale/zh/LC_MESSAGES/checks.po)
    .venv/bin/pybabel compile -d checks/locale -D checks -l zh

tests/course/test_i18n.py fails while any extracted message has no Chinese, while a placeholder
differs, or while the .mo is older than the .po.
"""

from __future__ import annotations

import contextlib
import contextvars
import gettext as _gettext
import os
from pathlib import Path

from .environment import LANG_ENV

DOMAIN = "checks"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
LANGUAGES = ("en", "zh")
DEFAULT = "en"

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


gettext = _
