"""checks.borrow.own_or_reference on small synthetic notebooks: use the learner's function when
it passes, the reference otherwise, and never raise on the learner's side."""

import json

import pytest
import torch

from checks import reference as ref
from checks.borrow import own_or_reference
from checks.engine import Check

CHAPTER = "04_fake_chapter"


def check_twice(f, *, seed=None, thorough=False):
    with Check("twice", f, seed=seed) as c:
        x = c.randn(c.randint(2, 6))
        c.expect_tensor(c.call(x), 2 * x, what="twice(x)")


def reference_twice(x):
    return x + x


def _cell(source, grade_id=None, solution=False, grade=False):
    meta = {}
    if grade_id:
        meta = {"nbgrader": {"schema_version": 3, "task": False, "grade_id": grade_id,
                             "solution": solution, "grade": grade, "locked": not solution}}
    return {"cell_type": "code", "execution_count": None, "metadata": meta, "outputs": [],
            "source": source.splitlines(keepends=True)}


def _markdown(text):
    return {"cell_type": "markdown", "metadata": {}, "source": [text]}


def _answer(body):
    return _cell(body, grade_id="twice", solution=True)


GOOD = "def twice(x):\n    \"\"\"2 x.\"\"\"\n    return 2 * x\n"


def _write(root, cells, chapter=CHAPTER):
    folder = root / chapter
    folder.mkdir(parents=True, exist_ok=True)
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / f"{chapter}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    return folder / f"{chapter}.ipynb"


def _borrow(root, capsys, **kwargs):
    kwargs.setdefault("checker", check_twice)
    kwargs.setdefault("fallback", reference_twice)
    fn = own_or_reference(kwargs.pop("chapter", CHAPTER), kwargs.pop("name", "twice"),
                          root=root, **kwargs)
    out, err = capsys.readouterr()
    assert err == ""
    assert len(out.splitlines()) == 1, out  # exactly one line says which one is used
    return fn, out


def test_passing_function_is_used(tmp_path, capsys):
    _write(tmp_path, [_markdown("# 04"), _cell("import torch"), _answer(GOOD),
                      _cell("check_twice(twice)", grade_id="check_twice", grade=True)])
    fn, out = _borrow(tmp_path, capsys)
    assert fn is not reference_twice
    assert torch.equal(fn(torch.ones(2)), torch.full((2,), 2.0))
    assert "your own `twice`" in out


def test_default_root_is_next_to_the_working_directory(tmp_path, capsys, monkeypatch):
    _write(tmp_path, [_answer(GOOD)])
    here = tmp_path / "07_position_information"
    here.mkdir()
    monkeypatch.chdir(here)
    fn = own_or_reference(CHAPTER, "twice", checker=check_twice, fallback=reference_twice)
    assert fn is not reference_twice
    assert "your own" in capsys.readouterr().out


def test_chapter_number_alone_finds_the_folder(tmp_path, capsys):
    _write(tmp_path, [_answer(GOOD)])
    fn, out = _borrow(tmp_path, capsys, chapter="04")
    assert fn is not reference_twice


def test_imports_and_earlier_answers_are_available(tmp_path, capsys):
    _write(tmp_path, [
        _cell("import math\nfrom torch import mul as multiply"),
        _answer_named("scale", "def scale(x, k):\n    return multiply(x, k)\n"),
        _answer("def twice(x):\n    return scale(x, math.sqrt(4.0))\n"),
    ])
    fn, out = _borrow(tmp_path, capsys)
    assert fn is not reference_twice, out


def _answer_named(grade_id, body):
    return _cell(body, grade_id=grade_id, solution=True)


def test_other_cells_do_not_run(tmp_path, capsys):
    marker = tmp_path / "ran.txt"
    _write(tmp_path, [
        _cell(f"open({str(marker)!r}, 'w').write('plain cell ran')"),          # not an import
        _cell(f"import os\nopen({str(marker)!r}, 'w').write('mixed cell ran')"),
        _answer(GOOD),
        _cell(f"open({str(marker)!r}, 'w').write('later cell ran')"),
        _cell(f"open({str(marker)!r}, 'w').write('test ran')", grade_id="check_twice",
              grade=True),
    ])
    fn, _ = _borrow(tmp_path, capsys)
    assert fn is not reference_twice
    assert not marker.exists()


def test_prints_of_the_learner_stay_hidden(tmp_path, capsys):
    _write(tmp_path, [_answer("import sys\nprint('hello at definition')\n"
                              "print('to stderr', file=sys.stderr)\n"
                              "def twice(x):\n    print('debug', x)\n    return 2 * x\n")])
    fn, out = _borrow(tmp_path, capsys)
    assert fn is not reference_twice
    assert "debug" not in out and "hello" not in out


@pytest.mark.parametrize("body,reason", [
    ("def twice(x):\n    \"\"\"2 x.\"\"\"\n    raise NotImplementedError()\n", "does not pass"),
    ("def twice(x):\n    return 3 * x\n", "does not pass"),
    ("def twice(x):\n    return undefined_helper(x)\n", "does not pass"),
    ("def twice(x)\n    return 2 * x\n", "syntax error on line 1"),
    ("1 / 0\ndef twice(x):\n    return 2 * x\n", "ZeroDivisionError"),
    ("import sys\nsys.exit(1)\n", "SystemExit"),
    ("def other(x):\n    return 2 * x\n", "does not define `twice`"),
    ("twice = 2\n", "does not define `twice`"),
    ("%time x = 1\n", "syntax error"),
])
def test_broken_answers_fall_back(tmp_path, capsys, body, reason):
    _write(tmp_path, [_cell("import torch"), _answer(body)])
    fn, out = _borrow(tmp_path, capsys)
    assert fn is reference_twice
    assert "reference `twice`" in out and reason in out, out


def test_missing_notebook_falls_back(tmp_path, capsys):
    fn, out = _borrow(tmp_path, capsys)
    assert fn is reference_twice
    assert "no notebook at" in out and f"{CHAPTER}.ipynb" in out


def test_missing_cell_falls_back(tmp_path, capsys):
    _write(tmp_path, [_cell("import torch"), _answer_named("something_else", GOOD)])
    fn, out = _borrow(tmp_path, capsys)
    assert fn is reference_twice
    assert "no answer cell `twice`" in out


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"cells": 3}'])
def test_unreadable_notebook_falls_back(tmp_path, capsys, content):
    folder = tmp_path / CHAPTER
    folder.mkdir()
    (folder / f"{CHAPTER}.ipynb").write_text(content, encoding="utf-8")
    fn, out = _borrow(tmp_path, capsys)
    assert fn is reference_twice
    assert "could not read" in out


def test_missing_checker_module_falls_back(tmp_path, capsys):
    _write(tmp_path, [_answer(GOOD)], chapter="99_not_a_chapter")
    fn, out = _borrow(tmp_path, capsys, chapter="99_not_a_chapter", checker=None)
    assert fn is reference_twice
    assert "checks of chapter 99 are not available" in out


def test_checker_that_crashes_falls_back(tmp_path, capsys):
    def broken_checker(f, **kwargs):
        raise RuntimeError("bug in the checker")

    _write(tmp_path, [_answer(GOOD)])
    fn, out = _borrow(tmp_path, capsys, checker=broken_checker)
    assert fn is reference_twice
    assert "RuntimeError" in out


def test_real_chapter_checker_and_reference(tmp_path, capsys):
    """Defaults: checks.nb01.check_head_dim and checks.reference.head_dim."""
    answer = _cell("def head_dim(cfg):\n    return int(cfg.head_dim)\n", grade_id="head_dim",
                   solution=True)
    _write(tmp_path, [_cell("from checks import ModelConfig"), answer], chapter="01_notation")
    fn = own_or_reference("01_notation", "head_dim", root=tmp_path)
    assert fn is not ref.head_dim
    assert capsys.readouterr().out.strip() == "Using your own `head_dim`."

    wrong = _cell("def head_dim(cfg):\n    return cfg.hidden_size\n", grade_id="head_dim",
                  solution=True)
    _write(tmp_path, [wrong], chapter="01_notation")
    assert own_or_reference("01_notation", "head_dim", root=tmp_path) is ref.head_dim
    assert "reference `head_dim`" in capsys.readouterr().out


def test_unknown_reference_is_a_course_bug(tmp_path):
    with pytest.raises(LookupError):
        own_or_reference(CHAPTER, "no_such_function", root=tmp_path, checker=check_twice)


def test_with_chapter_04s_own_checker(tmp_path, capsys):
    """If chapter 04's checks exist: a learner-style attention built from earlier answers is used,
    an unfinished one is not."""
    nb04 = pytest.importorskip("checks.nb04")
    if not hasattr(nb04, "check_attention"):
        pytest.skip("chapter 04 has no check_attention yet")
    imports = _cell("import math\n\nimport torch\n")
    scores = _answer_named("attention_scores", "def attention_scores(q, k):\n"
                           "    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n")
    softmax = _answer_named("masked_softmax", (
        "def masked_softmax(scores, mask=None):\n"
        "    if mask is not None:\n"
        "        scores = scores.masked_fill(~mask.bool(), float('-inf'))\n"
        "    top = scores.amax(-1, keepdim=True)\n"
        "    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))\n"
        "    e = torch.exp(scores - top)\n"
        "    total = e.sum(-1, keepdim=True)\n"
        "    return torch.where(total > 0, e / total.clamp_min(1e-300), torch.zeros_like(e))\n"))
    attention = _answer_named("attention", "def attention(q, k, v, mask=None):\n"
                              "    w = masked_softmax(attention_scores(q, k), mask)\n"
                              "    return w @ v, w\n")
    _write(tmp_path, [imports, scores, softmax, attention], chapter="04_self_attention")
    fn = own_or_reference("04_self_attention", "attention", root=tmp_path)
    assert fn is not ref.attention
    assert capsys.readouterr().out.strip() == "Using your own `attention`."

    stub = _answer_named("attention", "def attention(q, k, v, mask=None):\n"
                         "    raise NotImplementedError()\n")
    _write(tmp_path, [imports, scores, softmax, stub], chapter="04_self_attention")
    assert own_or_reference("04_self_attention", "attention", root=tmp_path) is ref.attention
    assert "does not pass" in capsys.readouterr().out
