"""Our prose is our own (checks.tools.reuse): no run of 20 or more characters of the article's
prose in any notebook, translation, message or README, in either language; the detector itself
finds a planted sentence across a line break and leaves formulas and section titles aside."""

from __future__ import annotations

import pytest

from checks.tools import reuse

ARTICLE = """1. 先统一符号

学习 Transformer 时，我最开始能记住 Attention 的公式，却说不清公式里的每个张量究竟来自哪里。
$Z = QK^T / \\sqrt{D_h}$，形状 [B, N_h, S, S]，其中 B 是 batch size，S 是 sequence length
"""


def test_a_copied_sentence_is_found_even_across_a_line_break():
    ours = ("我们的话。学习 Transformer 时，我最开始能记住\n"
            "Attention 的公式，却说不清公式里的每个张量")
    found = reuse.reuses([("ours", ours)], ARTICLE)
    assert [where for where, _run in found] == ["ours"]
    assert found[0][1].startswith("学习Transformer时")


def test_formulas_shapes_and_section_titles_are_not_prose():
    ours = "1. 先统一符号\n$Z = QK^T / \\sqrt{D_h}$，形状 [B, N_h, S, S]，其中 B 是 batch size"
    assert reuse.reuses([("ours", ours)], ARTICLE) == []


@pytest.mark.skipif(not reuse.ARTICLE.is_file(), reason="the article is in ../shared/source")
def test_the_course_copies_no_run_of_the_article():
    found = reuse.reuses(reuse.course_texts(), reuse.ARTICLE.read_text(encoding="utf-8"))
    assert found == [], "\n".join(f"{where}: {run}" for where, run in found)
