"""The registry of mistakes (checks.registry): every id names exactly one message, every
catalogued wrong implementation names an id the registry holds, and every id the registry holds
is named by a test (no dead diagnoses). The chapters' `MISTAKES` tables and the syllabus
(checks.exercises) agree with the chapters' checkers."""

from __future__ import annotations

import ast
import importlib
import pkgutil
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


# Mistakes a chapter declares (NAME = Mistake(...) at module level) that no exercise of the
# chapter registers, on purpose; every other one is in the chapter's MISTAKES, so an id a check
# can name resolves in the class report. (chapter, module, name): why it is left out.
UNREGISTERED = {
    # The same id as a registered mistake, told in the words of another case: one id has one
    # message, the registered one, so these are the failure's wording only.
    ("07", "checks.nb07", "NO_ABS_REVERSED"):
        "07.equivariance_error.missing_abs (NO_ABS), for the difference taken the other way",
    ("09", "checks.nb09", "COUNT_W2_SQUARE"):
        "09.ffn_param_count.down_projection_counted_square (COUNT_DOWN_SQUARE), plain FFN's W2",
    ("09", "checks.nb09", "COUNT_BIASES_PLAIN"):
        "09.ffn_param_count.added_biases (COUNT_BIASES_GATED), for a plain FFN",
    ("10", "checks.nb10", "_LARGE_FLOAT16"):
        "10.rms_norm.half_precision_inside (_LOW_PRECISION), for float16 x ~ 1e4",
    ("11", "checks.nb11", "SCALE_BY_H"):
        "11.attention_sublayer/decoder_block.scaled_by_sqrt_h (SCALE_BY_H_HEADS), told for a "
        "config with D_h != H / N_h (test_learner_fixes holds its wording)",
    # Safety nets after the value comparisons: an implementation whose values pass every case
    # passes these too, so no catalogued (deterministic, plausible) mistake reaches them.
    ("08", "checks.nb08", "RELATIVE"):
        "q.k after RoPE from the already compared q' and k' (within the RoPE tolerance)",
    ("12", "checks.nb12.forward", "NOT_CAUSAL"):
        "the causality property on logits already compared with the reference",
    ("12", "checks.nb12.sampling", "EVERY_LOGIT_MASKED"):
        "an error at top_k=1 only; dropping scores <= kth is named top_k_minus_one at k >= 2 first",
}


def _declared_mistakes(package):
    """(module, name, Mistake) for every NAME = Mistake(...) at the top level of a chapter's
    package and of its modules."""
    modules = [package] + [importlib.import_module(f"{package.__name__}.{info.name}")
                           for info in pkgutil.iter_modules(package.__path__)]
    for module in modules:
        tree = ast.parse(Path(module.__file__).read_text("utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and \
                    isinstance(node.value, ast.Call) and \
                    getattr(node.value.func, "id", None) == "Mistake":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        yield module.__name__, target.id, getattr(module, target.id)


def test_every_declared_mistake_is_registered_by_its_chapter():
    """A mistake a chapter declares is in the MISTAKES of one of its exercises (else the id a
    check names does not resolve), or in UNREGISTERED with the reason."""
    unregistered, seen = [], set()
    for number, package in registry._CHAPTERS.items():
        registered = [m for mistakes in package.MISTAKES.values() for m in mistakes]
        for module, name, mistake in _declared_mistakes(package):
            assert isinstance(mistake, Mistake), (module, name)
            seen.add((number, module, name))
            if not any(mistake == known for known in registered) and \
                    (number, module, name) not in UNREGISTERED:
                unregistered.append(f"{module}.{name} ({mistake.key})")
    assert not unregistered, (
        "declared mistakes no exercise of their chapter registers (add them to MISTAKES, with a "
        f"catalogued wrong implementation, or remove them): {unregistered}")
    stale = sorted(set(UNREGISTERED) - seen)
    assert not stale, f"UNREGISTERED lists mistakes that are no longer declared: {stale}"
    for number, module, name in UNREGISTERED:
        package = registry._CHAPTERS[number]
        mistake = getattr(importlib.import_module(module), name)
        assert not any(mistake == m for ms in package.MISTAKES.values() for m in ms), (
            f"{module}.{name} is registered now: take it out of UNREGISTERED")


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
