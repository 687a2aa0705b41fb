"""The registry of mistakes (checks.registry): every id names exactly one message, every
catalogued wrong implementation names an id the registry holds, and every id the registry holds
is named by a test (no dead diagnoses). The chapters' `MISTAKES` tables and the syllabus
(checks.exercises) agree with the chapters' checkers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from checks import exercises, registry
from checks.i18n import using
from checks.mistakes import ID_PATTERN, Mistake

from .test_contract import EXERCISES

TESTS = Path(__file__).resolve().parents[1]
REGISTRY = registry.registry()


def _catalogued() -> set[str]:
    return {wrong.mistake for cases in EXERCISES.values() for e in cases for wrong in e.wrong}


def _id_patterns_in_tests() -> list[re.Pattern]:
    """Every mistake id a test file spells out (the catalogues, and the tests of a chapter's own
    that assert an id outside the catalogue: forbidden calls, knock-on failures), as patterns:
    an f-string's replacement fields ("09.{exercise}.calls_library_activation") match any name."""
    patterns = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = re.escape(node.value)
            elif isinstance(node, ast.JoinedStr):
                text = "".join(re.escape(part.value) if isinstance(part, ast.Constant)
                               else r"[A-Za-z_]\w*" for part in node.values)
            else:
                continue
            key = text.rsplit(r"\.", 1)[-1]
            knock_on = key.startswith("fix_") and key.endswith("_first")  # fix_{helper}_first
            if re.match(r"\d\d\\\.", text) and (re.fullmatch(r"[a-z0-9_]+", key) or knock_on):
                patterns.append(re.compile(text + "$"))  # the key itself spelled out
    return patterns


def test_every_id_names_one_declared_mistake():
    assert len(REGISTRY) > 800
    for mistake_id, mistake in REGISTRY.items():
        assert isinstance(mistake, Mistake) and ID_PATTERN.match(mistake_id), mistake_id
        assert mistake_id.rsplit(".", 1)[1] == mistake.key


def test_two_messages_for_one_id_stop_the_registry():
    one = Mistake("missing_scale", "forgot the scale")
    other = Mistake("missing_scale", "forgot the scale: divide by sqrt(D)")
    assert registry.build({"04": {"attention_scores": [one, Mistake("missing_scale",
                                                                    "forgot the scale")]}})
    with pytest.raises(registry.ConflictingMistakes, match="04.attention_scores.missing_scale"):
        registry.build({"04": {"attention_scores": [one, other]}})
    # the same key in two exercises is two ids: no conflict
    assert len(registry.build({"04": {"attention": [one], "attention_scores": [other]}})) == 2


def test_every_catalogued_mistake_is_in_the_registry():
    missing = sorted(_catalogued() - set(REGISTRY))
    assert not missing, f"catalogued ids the registry lacks (add them to MISTAKES): {missing}"


def test_no_dead_diagnoses():
    """An id no test names is a diagnosis nobody has seen work: catalogue a wrong
    implementation that makes it, or take it out of the chapter's MISTAKES."""
    patterns = _id_patterns_in_tests()
    dead = sorted(i for i in REGISTRY if not any(p.match(i) for p in patterns))
    assert not dead, f"ids no test names: {dead}"


def test_the_tables_name_only_the_chapters_exercises():
    for chapter in exercises.SYLLABUS:
        table = registry._CHAPTERS[chapter.number].MISTAKES
        assert set(table) <= set(chapter.exercises), chapter.number


def test_the_syllabus_lists_every_checker_in_order():
    for chapter in exercises.SYLLABUS:
        module = exercises.checks_module(chapter.number)
        checkers = [name.removeprefix("check_") for name in vars(module)
                    if name.startswith("check_") and callable(getattr(module, name))
                    and getattr(module, name).__module__.startswith(chapter.module)]
        assert checkers == list(chapter.exercises), chapter.number


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_messages_come_in_the_readers_language(lang, monkeypatch):
    monkeypatch.delenv("LLAMA_COURSE_LANG", raising=False)
    mistake_id = "04.attention.fix_masked_softmax_first"
    with using(lang):
        shown = registry.message(mistake_id)
    assert "masked_softmax" in shown and "{" not in shown
    if lang == "zh":
        assert re.search(r"[\u4e00-\u9fff]", shown), shown
    templated = registry.message("10.rms_norm.mean_over_wrong_axis")
    assert "…" in templated and "{" not in templated
    assert registry.message("04.attention.no_such_key") is None
    assert registry.message(None) is None
