"""The check messages' catalogue (checks/locale/zh/LC_MESSAGES/checks.po and .mo) is complete and
consistent, and the language switch works: Chinese with LLAMA_COURSE_LANG=zh, English (byte for
byte what it was before the catalogue existed) otherwise.

The msgids are extracted from the code with Babel exactly as a maintainer does (babel.cfg); a
message without Chinese, a placeholder that differs, or a .mo compiled from an older .po fails.
"""

from __future__ import annotations

import ast
import contextlib
import gettext
import io
import math
import string
from pathlib import Path

import pytest

from checks import i18n, nb01, nb04
from checks.environment import LANG_ENV
from checks.engine import CheckFailure, LearnerError

babel_extract = pytest.importorskip("babel.messages.extract")
from babel.messages.frontend import parse_mapping_cfg  # noqa: E402
from babel.messages.pofile import read_po  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PO = i18n.LOCALE_DIR / "zh" / "LC_MESSAGES" / "checks.po"
MO = PO.with_suffix(".mo")


def _extracted() -> dict[str | tuple, list[str]]:
    """{msgid: [file, ...]} from the code, as `pybabel extract -F babel.cfg` finds them."""
    with open(ROOT / "babel.cfg", encoding="utf-8") as f:
        method_map, options_map = parse_mapping_cfg(f)
    found: dict = {}
    for filename, _lineno, message, _comments, _context in babel_extract.extract_from_dir(
            str(ROOT), method_map, options_map):
        if message:
            found.setdefault(message, []).append(filename)
    return found


def _catalogue():
    with open(PO, "rb") as f:
        return read_po(f, locale="zh")


def _fields(text: str) -> set[str]:
    return {name for _lit, name, _spec, _conv in string.Formatter().parse(text) if name is not None}


# --------------------------------------------------------------------------------------------
# the catalogue


def test_every_message_in_the_code_has_its_chinese():
    catalogue = _catalogue()
    extracted = _extracted()
    assert len(extracted) > 100, "extraction found too few messages: is babel.cfg right?"
    lacking = []
    for msgid, files in extracted.items():
        key = msgid[0] if isinstance(msgid, tuple) else msgid
        entry = catalogue.get(key)
        strings = entry.string if entry is not None else None
        if isinstance(strings, tuple):
            strings = strings[0] if all(strings) else ""
        if not strings or (entry is not None and entry.fuzzy):
            lacking.append(f"{files[0]}: {key!r}")
    assert not lacking, (f"{len(lacking)} messages without Chinese in {PO.name} (run the commands "
                         "in checks/i18n.py's docstring):\n" + "\n".join(lacking))


def test_catalogue_holds_no_message_the_code_no_longer_has():
    extracted = {m[0] if isinstance(m, tuple) else m for m in _extracted()}
    obsolete = [m.id for m in _catalogue() if m.id and
                (m.id[0] if isinstance(m.id, tuple) else m.id) not in extracted]
    assert not obsolete, "msgids in checks.po that no code uses:\n" + "\n".join(map(repr, obsolete))


def test_placeholders_are_the_same_in_msgid_and_msgstr():
    wrong = []
    for message in _catalogue():
        if not message.id:
            continue
        ids = message.id if isinstance(message.id, tuple) else (message.id,)
        strs = message.string if isinstance(message.string, tuple) else (message.string,)
        want = set().union(*map(_fields, ids))
        for text in strs:
            if text and _fields(text) != want:
                wrong.append(f"{ids[0]!r}: {sorted(_fields(text))} != {sorted(want)}")
    assert not wrong, "placeholders differ:\n" + "\n".join(wrong)


def test_compiled_catalogue_is_up_to_date_with_the_source():
    """checks.mo holds exactly the .po's translations (pybabel compile was run after the last
    edit); the package reads the .mo, never the .po."""
    with open(MO, "rb") as f:
        compiled = gettext.GNUTranslations(f)._catalog  # what gettext will answer
    source = {}
    for message in _catalogue():
        if not message.id or not message.string:
            continue
        if isinstance(message.id, tuple):
            for i, text in enumerate(message.string):
                source[(message.id[0], i)] = text
        else:
            source[message.id] = message.string
    compiled = {k: v for k, v in compiled.items() if k != ""}  # the header
    assert compiled == source, (
        "checks.mo is out of date: run `.venv/bin/pybabel compile -d checks/locale -D checks "
        "-l zh`")


def test_no_message_is_an_f_string():
    """`_(f"...")` would put the values into the msgid, which then never matches the catalogue:
    values go in with .format() after _()."""
    bad = []
    for path in sorted((ROOT / "checks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("_", "N_") \
                    and node.args and isinstance(node.args[0], ast.JoinedStr):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "f-strings as messages: " + ", ".join(bad)


# --------------------------------------------------------------------------------------------
# the language switch


def _wrong_scores(q, k):
    return q @ k.transpose(-2, -1)  # forgot the scale


def _right_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _swapped(x, wq, wk, wv):
    return x @ wq, x @ wv, x @ wk


def _float_head(cfg):
    return cfg.hidden_size / cfg.n_heads


def _accept_all(cfg):
    return None


CASES = {"scores_no_scale": (nb04.check_attention_scores, _wrong_scores),
         "qkv_swapped": (nb04.check_project_qkv, _swapped),
         "head_dim_float": (nb01.check_head_dim, _float_head),
         "validate_accepts_all": (nb01.check_validate_config, _accept_all),
         "scores_pass": (nb04.check_attention_scores, _right_scores)}

# What these checks printed before the catalogue existed (commit 40884b3), seed 0; the fourth
# round changed two, not in wording: chapter 04's first case is a fixed one where every scale
# mistake differs (other sizes), and a config that breaks a rule names that rule's mistake.
ENGLISH = {
    'scores_no_scale': 'attention_scores: scores for q [3, 2, 5], k [3, 7, 5] has the right shape but wrong values; 42 of 42 entries differ; first at [B=0, S_q=0, S_k=0]: got -0.0831088, expected -0.0371674.\nlikely mistake: forgot the scale: divide the scores by sqrt(D), D = q.shape[-1] (the head dimension)\n(random inputs from seed 0; pass seed=0 to the check to see the same inputs again)',  # noqa: E501
    'qkv_swapped': 'project_qkv: k for x [6, 2, 9], w_q [9, 9], w_k [9, 9], w_v [9, 9] has the right shape but wrong values; 108 of 108 entries differ; first at [L0=0, S=0, out=0]: got -2.48048, expected 2.2639.\nlikely mistake: k computed with w_v: q = x @ w_q, k = x @ w_k, v = x @ w_v, returned in the order (q, k, v)\n(random inputs from seed 0; pass seed=0 to the check to see the same inputs again)',  # noqa: E501
    'head_dim_float': 'head_dim: head_dim(LLAMA2_7B) is 128.0, expected 128.\nlikely mistake: returned a float: use integer division `//`\n(random inputs from seed 0; pass seed=0 to the check to see the same inputs again)',  # noqa: E501
    'validate_accepts_all': 'validate_config: accepted a broken config (hidden_size=25, head_dim=6); it should raise ValueError (hidden_size divisible by n_heads).\nlikely mistake: hidden_size must be divisible by n_heads: raise ValueError when hidden_size % n_heads != 0\n(random inputs from seed 0; pass seed=0 to the check to see the same inputs again)',  # noqa: E501
    'scores_pass': '✓ attention_scores passed (4 calls; checked Q K^T / sqrt(D); S_q != S_k; [S, D], [B, S, D] and [B, N, S, D] inputs)\n',  # noqa: E501
}


def _run(name: str) -> str:
    checker, fn = CASES[name]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            checker(fn, seed=0)
    except CheckFailure as failure:
        return str(failure)
    return out.getvalue()


@pytest.mark.parametrize("setting", [None, "en", "EN_us"])
@pytest.mark.parametrize("name", ENGLISH)
def test_english_is_byte_identical_to_before(name, setting, monkeypatch):
    if setting is None:
        monkeypatch.delenv(LANG_ENV, raising=False)
    else:
        monkeypatch.setenv(LANG_ENV, setting)
    assert _run(name) == ENGLISH[name]


def test_chapter_04_forgotten_scale_reads_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    text = _run("scores_no_scale")
    assert text.startswith(
        "attention_scores: q [3, 2, 5]、k [3, 7, 5] 的分数 的形状正确但数值不对；")
    assert "可能的错误：忘了缩放：分数要除以 sqrt(D)，D = q.shape[-1]（每个 head 的维度）" in text
    assert "（随机输入来自种子 0；给检查传入 seed=0 即可再次看到同样的输入）" in text
    assert "likely mistake" not in text and "forgot" not in text


@pytest.mark.parametrize("name", ENGLISH)
def test_every_case_has_no_english_sentence_left_in_chinese(name, monkeypatch):
    """Under zh the words of the English sentences are gone (symbols and values stay)."""
    monkeypatch.setenv(LANG_ENV, "zh")
    text = _run(name)
    for word in ("likely mistake", "random inputs", "has the right shape", "expected",
                 "passed", "calls;", "accepted a broken", "returned a float", "computed with"):
        assert word not in text, f"{name}: {word!r} left in {text!r}"


def test_pass_and_not_started_lines_in_chinese(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    assert _run("scores_pass").startswith("✓ attention_scores 通过（调用 4 次；检查了 ")

    def not_started(q, k):
        raise NotImplementedError()
    with pytest.raises(CheckFailure) as info:
        nb04.check_attention_scores(not_started, seed=0)
    assert "尚未开始：把 `raise NotImplementedError()` 换成你的实现" in str(info.value)


def test_learner_errors_keep_english_for_checkers_and_show_chinese(monkeypatch):
    """A learner's exception: `message` stays the engine's English (checkers read it), what the
    learner reads is Chinese; chapter 01 still recognises the ValueError it asks for."""
    monkeypatch.setenv(LANG_ENV, "zh")

    def crash(q, k):
        return q @ k
    with pytest.raises(LearnerError) as info:
        nb04.check_attention_scores(crash, seed=0)
    err = info.value
    assert err.message.startswith("raised RuntimeError: ") and err.error == "RuntimeError"
    assert str(err).startswith("attention_scores: 引发了 RuntimeError: ")
    assert "调用参数为 (float32[3, 2, 5], float32[3, 7, 5])" in str(err)
    assert "位于第" in str(err) and "return q @ k" in str(err)
    assert "可能的错误：检查形状" in str(err)

    def validate_ok(cfg):  # the reference's rules, raised in English by the learner
        from checks import reference
        return reference.validate_config(cfg)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        nb01.check_validate_config(validate_ok, seed=0)
    assert out.getvalue().startswith("✓ validate_config 通过")


def test_environment_overrides_using_and_unknown_values_fall_back(monkeypatch):
    monkeypatch.delenv(LANG_ENV, raising=False)
    assert i18n.language() == "en"
    with i18n.using("zh"):
        assert i18n.language() == "zh" and i18n._("output") == "输出"
        with i18n.using(None):
            assert i18n.language() == "zh"
        monkeypatch.setenv(LANG_ENV, "en")
        assert i18n.language() == "en" and i18n._("output") == "output"
    monkeypatch.setenv(LANG_ENV, "fr")
    assert i18n.language() == "en"
    monkeypatch.setenv(LANG_ENV, "zh_CN.UTF-8")
    assert i18n.language() == "zh"


def test_notebook_language_comes_from_its_metadata():
    import nbformat

    zh = nbformat.read(ROOT / "notebooks-zh" / "04_self_attention" / "04_self_attention.ipynb",
                       as_version=4)
    en = nbformat.read(ROOT / "notebooks" / "04_self_attention" / "04_self_attention.ipynb",
                       as_version=4)
    assert i18n.notebook_language(zh) == "zh"
    assert i18n.notebook_language(en) == "en"
    assert i18n.notebook_language({"metadata": {"course": "odd"}}) == "en"
