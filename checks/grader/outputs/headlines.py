"""A mistake told by the registry (`checks.registry.declared`): the message the course declares
for a mistake's id, in the language asked for, the same for every student who made it: the
headline every output that names a mistake by id shows (the class summary in the terminal and
the JSON, the class report, the feedback pages, Gradescope's results), never one student's own
words. Each student's detailed message (their values, their seed) stays where it is shown per
student, under the headline.

A declared message may be a format template whose placeholders the checks fill when they fail
("permuted the batch axis (dim 0); {rule}"); a headline shows each placeholder as "…"
(`elided`)."""

from __future__ import annotations

from string import Formatter

from ...i18n import _, catalogue, normalise
from ...mistakes import filled
from ...registry import declared

PLACEHOLDER = "…"  # what a headline shows in place of a template's {placeholder}


def elided(template: str) -> str:
    """`template` with each `{placeholder}` (named, numbered or empty, with or without a format
    spec) shown as "…", and its doubled braces as single ones: "normalised over the {axis}" ->
    "normalised over the …". A text that is not a well-formed template is returned as it is."""
    try:
        parts = list(Formatter().parse(template))
    except ValueError:  # a lone brace: not a template
        return template
    return "".join(literal + (PLACEHOLDER if field is not None else "")
                   for literal, field, _spec, _conversion in parts)


def headline(mistake: str | None, lang: str | None = None) -> str | None:
    """The registry's message for the mistake id `mistake`, translated into `lang` (a code of
    `checks.i18n.LANGUAGES`; None: the language of the moment), placeholders elided. None when
    there is no id, or the registry declares no message for it. Placeholders the mistake's
    declaration fixes (the helper of `fix_<name>_first`) are filled in."""
    known = declared(mistake) if mistake else None
    if known is None:
        return None
    code = normalise(lang)
    text = catalogue(code).gettext(str(known)) if code else _(known)
    return filled(text, known.values)


TITLE_LENGTH = 70  # characters of a short title, at most


def short_title(mistake: str | None, lang: str | None = None) -> str | None:
    """The headline's first clause, the mistake's short title beside its id ("summed instead of
    averaged" for "summed instead of averaged: the loss is the MEAN ..."): the text before the
    first ':' or ';' outside brackets, cut at `TITLE_LENGTH` characters. None as `headline`."""
    told = headline(mistake, lang)
    if told is None:
        return None
    title = _first_clause(told).strip()
    return title if len(title) <= TITLE_LENGTH else title[:TITLE_LENGTH - 1].rstrip() + "…"


def _first_clause(text: str) -> str:
    depth = 0
    for index, ch in enumerate(text):
        if ch in "([{（【":
            depth += 1
        elif ch in ")]}）】":
            depth = max(depth - 1, 0)
        elif ch in ":;：；" and depth == 0:
            return text[:index]
    return text
