"""checks.borrow on the course's real notebooks: the instructor solutions (every function is the
learner's own), the fresh learner release (every function falls back), and release notebooks that
a learner has partly filled in, partly broken. Chapters are copied into a temporary course folder
so each test can edit its copy."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from checks import borrow
from checks import reference as ref
from checks.borrow import own_functions, own_or_reference
from checks.environment import GRADING_ENV, NOTEBOOKS_ENV
from checks.gradients import TINY
from checks.install import CELL_ID

COURSE = Path(__file__).resolve().parents[2]
SOLUTIONS, RELEASE = COURSE / "solutions", COURSE / "notebooks"

# What chapters 11 and 12 take from earlier chapters (their import cells ask for the same).
FOR_CHAPTER_11 = {"rms_norm": "10_norm_residual", "split_qkv": "05_multi_head",
                  "apply_rope": "08_rope", "causal_mask": "03_architectures",
                  "grouped_query_attention": "06_gqa_mqa", "merge_heads": "05_multi_head",
                  "swiglu_ffn": "09_ffn_swiglu", "masked_softmax": "04_self_attention",
                  "silu": "09_ffn_swiglu"}
FOR_CHAPTER_12 = {"embed": "02_tokens_to_embeddings", "bpe_train": "02_tokens_to_embeddings",
                  "bpe_encode": "02_tokens_to_embeddings",
                  "bpe_decode": "02_tokens_to_embeddings", "rms_norm": "10_norm_residual",
                  "init_block_params": "11_decoder_block", "decoder_block": "11_decoder_block",
                  "block_param_count": "11_decoder_block"}
CH04 = {"project_qkv": "04", "attention_scores": "04", "masked_softmax": "04", "attention": "04"}


@pytest.fixture(autouse=True)
def learner(monkeypatch):
    """A learner's JupyterLab: not a grading run (the test suite itself may be one)."""
    monkeypatch.delenv(GRADING_ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv(NOTEBOOKS_ENV, raising=False)


def _chapters(source: Path, dest: Path, *numbers: str) -> Path:
    """Copy the chapters `numbers` ("04", ...) of `source` into the course folder `dest`."""
    for number in numbers:
        (folder,) = source.glob(f"{number}_*")
        shutil.copytree(folder, dest / folder.name, dirs_exist_ok=True)
    return dest


def _path(root: Path, number: str) -> Path:
    (path,) = root.glob(f"{number}_*/{number}_*.ipynb")
    return path


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _write(path: Path, nb: dict) -> None:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _cell(nb: dict, grade_id: str) -> dict:
    (cell,) = [c for c in nb["cells"]
               if (c.get("metadata", {}).get("nbgrader") or {}).get("grade_id") == grade_id]
    return cell


def _solution(number: str, grade_id: str) -> str:
    return "".join(_cell(_read(_path(SOLUTIONS, number)), grade_id)["source"])


def _answer(root: Path, number: str, grade_id: str, source: str) -> None:
    """The learner types `source` into the answer cell `grade_id` and saves."""
    path = _path(root, number)
    nb = _read(path)
    _cell(nb, grade_id)["source"] = source.splitlines(keepends=True)
    _write(path, nb)


def _insert(root: Path, number: str, index: int, source: str) -> None:
    """The learner adds a plain code cell at `index` and saves."""
    path = _path(root, number)
    nb = _read(path)
    nb["cells"].insert(index, {"cell_type": "code", "execution_count": None, "id": f"x-{index}",
                               "metadata": {}, "outputs": [],
                               "source": source.splitlines(keepends=True)})
    _write(path, nb)


def _one_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert err == ""
    assert len(out.splitlines()) == 1, out
    return out.strip()


def _yours(borrowed) -> list[str]:
    return [name for name, whose in borrowed.whose.items() if whose == "yours"]


# --------------------------------------------------------------------------------------------
# The instructor solutions: everything is the learner's own


def test_chapter_04_solution_attention_is_used(tmp_path, capsys):
    """The regression: chapter 04's import cell also holds `_ = torch.manual_seed(0)`, which
    once cost the whole cell, so `math` and `torch` were undefined and attention fell back."""
    root = _chapters(SOLUTIONS, tmp_path, "04")
    fn = own_or_reference("04_self_attention", "attention", root=root)
    assert fn is not ref.attention
    assert _one_line(capsys) == "Using your own `attention`."
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 7)
    torch.testing.assert_close(fn(q, k, v)[0], ref.attention(q, k, v)[0])


def test_every_solution_later_chapters_borrow_is_yours(tmp_path, capsys):
    root = _chapters(SOLUTIONS, tmp_path, *[f"{n:02d}" for n in range(2, 12)])
    borrowed = own_functions({**FOR_CHAPTER_11, **FOR_CHAPTER_12}, root=root)
    line = _one_line(capsys)
    assert set(_yours(borrowed)) == set(FOR_CHAPTER_11) | set(FOR_CHAPTER_12), line
    assert line.startswith("Yours: rms_norm (10), split_qkv (05), ") and "reference" not in line
    for name in borrowed.whose:
        assert borrowed[name] is not getattr(ref, name)


def test_borrowing_nests_and_follows_the_earlier_notebooks(tmp_path, capsys):
    """Chapter 11's decoder_block runs on whatever chapter 11's own import cell borrowed: the
    learner's rms_norm while it passes, the reference while it does not; saving chapter 10 is
    seen by the next call although chapter 11 did not change."""
    root = _chapters(SOLUTIONS, tmp_path, "03", "04", "05", "06", "08", "09", "10", "11")
    _chapters(RELEASE, tmp_path, "10")                      # chapter 10 back to unstarted

    def nested_rms_norm():
        block = own_functions({"decoder_block": "11"}, root=root).decoder_block
        assert _one_line(capsys) == "Yours: decoder_block (11)"
        return block.__globals__["attention_sublayer"].__globals__["rms_norm"]

    assert nested_rms_norm() is ref.rms_norm
    _answer(root, "10", "rms_norm", _solution("10", "rms_norm"))
    mine = nested_rms_norm()
    assert mine is not ref.rms_norm and mine.__code__.co_filename.startswith("<10_")


# --------------------------------------------------------------------------------------------
# The learner release: unstarted, partly done, broken


def test_fresh_release_uses_the_reference_everywhere(tmp_path, capsys):
    root = _chapters(RELEASE, tmp_path, *[f"{n:02d}" for n in range(2, 12)])
    borrowed = own_functions(FOR_CHAPTER_11, root=root)
    line = _one_line(capsys)
    assert _yours(borrowed) == []
    assert line.startswith("The course's reference: rms_norm (10: not started), "
                           "split_qkv (05: not started)"), line
    assert "Yours" not in line
    assert list(borrowed) == [getattr(ref, name) for name in FOR_CHAPTER_11]  # unpacking order


def test_some_answers_filled_some_wrong_some_unstarted(tmp_path, capsys):
    root = _chapters(RELEASE, tmp_path, "04")
    _answer(root, "04", "attention_scores", _solution("04", "attention_scores"))
    _answer(root, "04", "masked_softmax", (     # forgets the mask
        "def masked_softmax(scores, mask=None):\n"
        "    e = torch.exp(scores - scores.amax(-1, keepdim=True))\n"
        "    return e / e.sum(-1, keepdim=True)\n"))
    _answer(root, "04", "attention", _solution("04", "attention"))   # right, on the wrong softmax
    borrowed = own_functions(CH04, root=root)
    assert _one_line(capsys) == ("Yours: attention_scores (04) · the course's reference: "
                                 "project_qkv (04: not started), masked_softmax, attention "
                                 "(04: check failed)")
    assert borrowed.attention_scores is not ref.attention_scores
    assert borrowed.masked_softmax is ref.masked_softmax
    assert "does not pass its check" in borrowed.why["attention"]


def test_learner_helpers_in_their_own_cells_are_available(tmp_path, capsys):
    root = _chapters(RELEASE, tmp_path, "04")
    nb = _read(_path(root, "04"))
    at = nb["cells"].index(_cell(nb, "attention_scores"))
    _insert(root, "04", at, "import math as m\n\ndef inverse_sqrt(d):\n    return 1 / m.sqrt(d)\n")
    _answer(root, "04", "attention_scores", "def attention_scores(q, k):\n"
            "    return q @ k.transpose(-2, -1) * inverse_sqrt(q.shape[-1])\n")
    fn = own_or_reference("04", "attention_scores", root=root)
    assert fn is not ref.attention_scores, capsys.readouterr().out


@pytest.mark.parametrize("body,short", [
    ("def attention_scores(q, k)\n    return q\n", "syntax error"),
    ("1 / 0\ndef attention_scores(q, k):\n    return q\n", "cell raised ZeroDivisionError"),
    ("import sys\nsys.exit(1)\n", "cell raised SystemExit"),
    ("def scores(q, k):\n    return q @ k.transpose(-2, -1)\n", "not defined"),
    ("attention_scores = 2\n", "not defined"),
    ("def attention_scores(q, k):\n    return helper_never_written(q, k)\n", "check failed"),
    ("def attention_scores(q, k):\n    return q @ k.transpose(-2, -1)\n", "check failed"),
    ("%time x = 1\n", "syntax error"),
])
def test_broken_answers_fall_back_with_one_line(tmp_path, capsys, body, short):
    root = _chapters(RELEASE, tmp_path, "04")
    _answer(root, "04", "attention_scores", body)
    borrowed = own_functions({"attention_scores": "04_self_attention"}, root=root)
    assert borrowed.attention_scores is ref.attention_scores
    assert _one_line(capsys) == f"The course's reference: attention_scores (04: {short})"


def test_prints_of_the_learner_stay_hidden(tmp_path, capsys):
    root = _chapters(RELEASE, tmp_path, "04")
    _answer(root, "04", "attention_scores", (
        "import sys\nprint('hello at definition')\nprint('to stderr', file=sys.stderr)\n"
        + _solution("04", "attention_scores").replace(
            '"""\n', '"""\n    print("debug", q.shape, file=sys.stderr)\n', 1)))
    fn = own_or_reference("04", "attention_scores", root=root)
    assert fn is not ref.attention_scores
    assert _one_line(capsys) == "Using your own `attention_scores`."


def test_only_imports_definitions_and_answers_run(tmp_path, capsys):
    """Demonstrations, test cells and the rest of a mixed import cell never run; the imports of
    that cell still count, a magic line does not spoil them."""
    root = _chapters(SOLUTIONS, tmp_path, "04")
    marker = tmp_path / "ran.txt"
    write = f"open({str(marker)!r}, 'a').write"
    path = _path(root, "04")
    nb = _read(path)
    # The install cell stays as it is (its imports run, its body never does); the import cell
    # is the first code cell after it.
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and c.get("id") != CELL_ID]
    code[0]["source"] = ["%matplotlib inline\n", f"{write}('import cell ran')\n",
                         *code[0]["source"]]
    for cell in code[1:]:
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if not meta.get("solution"):           # demonstrations and test cells
            cell["source"] = [f"{write}('{cell.get('id')} ran')\n"]
    _write(path, nb)
    borrowed = own_functions(CH04, root=root)
    assert _yours(borrowed) == list(CH04), _one_line(capsys)
    assert not marker.exists()


def test_missing_cell_missing_notebook_unreadable_notebook(tmp_path, capsys):
    root = _chapters(RELEASE, tmp_path, "04", "05")
    path = _path(root, "04")
    nb = _read(path)
    nb["cells"].remove(_cell(nb, "attention"))
    _write(path, nb)
    _path(root, "05").write_text("{not json", encoding="utf-8")
    own_functions({"attention": "04", "split_qkv": "05", "apply_rope": "08"}, root=root)
    assert _one_line(capsys) == ("The course's reference: attention (04: no answer cell), "
                                 "split_qkv (05: unreadable notebook), apply_rope (08: no "
                                 "notebook)")


def test_a_check_that_only_shows_not_started_still_falls_back(tmp_path, capsys):
    """In JupyterLab a check may show "not started" without raising; borrowing must not take
    that for a pass."""
    root = _chapters(RELEASE, tmp_path, "04")

    def lenient_check(f, **kwargs):
        try:
            f(torch.randn(2, 3), torch.randn(3, 3), torch.randn(3, 3), torch.randn(3, 3))
        except NotImplementedError:
            return None

    fn = own_or_reference("04", "project_qkv", root=root, checker=lenient_check)
    assert fn is ref.project_qkv
    assert _one_line(capsys) == ("Using the course's reference `project_qkv` (yours is not "
                                 "started yet).")


def test_a_checker_that_crashes_falls_back(tmp_path, capsys):
    root = _chapters(SOLUTIONS, tmp_path, "04")

    def broken_checker(f, **kwargs):
        raise RuntimeError("bug in the checker")

    assert own_or_reference("04", "attention", root=root, checker=broken_checker) is ref.attention
    assert "checking yours raised RuntimeError: bug in the checker" in _one_line(capsys)


def test_chapter_without_checks_and_unknown_reference(tmp_path, capsys):
    root = _chapters(SOLUTIONS, tmp_path, "04")
    shutil.copytree(root / "04_self_attention", root / "99_extra")
    (root / "99_extra" / "04_self_attention.ipynb").rename(root / "99_extra" / "99_extra.ipynb")
    own_functions({"attention": "99_extra"}, root=root)
    assert _one_line(capsys) == "The course's reference: attention (99: no checks)"
    with pytest.raises(LookupError):
        own_functions({"no_such_function": "04"}, root=root)


def test_default_root_is_next_to_the_working_directory(tmp_path, capsys, monkeypatch):
    root = _chapters(SOLUTIONS, tmp_path, "04")
    here = root / "11_decoder_block"
    here.mkdir()
    monkeypatch.chdir(here)
    assert own_functions({"attention": "04"}).attention is not ref.attention
    assert _one_line(capsys) == "Yours: attention (04)"


def test_a_notebook_that_borrows_from_itself_does_not_loop(tmp_path, capsys):
    root = _chapters(SOLUTIONS, tmp_path, "04")
    path = _path(root, "04")
    nb = _read(path)
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    first["source"] += ["\nfrom checks.borrow import own_functions\n",
                        "(masked_softmax,) = own_functions({'masked_softmax': '04'})\n"]
    _write(path, nb)
    assert own_functions({"attention": "04"}, root=root).whose["attention"] == "yours"
    assert _one_line(capsys) == "Yours: attention (04)"


# --------------------------------------------------------------------------------------------
# Caching and grading


def test_notebooks_are_read_once_until_saved_again(tmp_path, capsys, monkeypatch):
    root = _chapters(SOLUTIONS, tmp_path, "04")
    runs = []
    execute = borrow._execute
    monkeypatch.setattr(borrow, "_execute", lambda path: runs.append(path.name) or execute(path))
    first = own_functions(CH04, root=root)
    again = own_functions(CH04, root=root)
    assert runs == ["04_self_attention.ipynb"]
    assert list(first) == list(again)
    _answer(root, "04", "attention", "def attention(q, k, v, mask=None):\n    raise "
                                     "NotImplementedError()\n")
    assert own_functions(CH04, root=root).attention is ref.attention
    assert len(runs) == 2
    capsys.readouterr()


@pytest.mark.parametrize("variable", [GRADING_ENV, "NBGRADER_EXECUTION"])
def test_a_graded_run_always_uses_the_reference(tmp_path, capsys, monkeypatch, variable):
    root = _chapters(SOLUTIONS, tmp_path, "04")
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(borrow, "_notebook", lambda path: pytest.fail("read a notebook"))
    borrowed = own_functions({"attention_scores": "04", "attention": "04_self_attention"},
                             root=root)
    assert list(borrowed) == [ref.attention_scores, ref.attention]
    assert _one_line(capsys) == ("Graded run: the course's reference for attention_scores (04), "
                                 "attention (04) (grading never depends on your other "
                                 "notebooks).")
    assert own_or_reference("04", "attention", root=root) is ref.attention
    assert "graded run" in _one_line(capsys)


def test_borrowed_namespace(tmp_path, capsys):
    borrowed = own_functions({"causal_mask": "03", "rms_norm": "10"}, root=tmp_path)
    causal, norm = borrowed
    assert (causal, norm) == (borrowed.causal_mask, borrowed["rms_norm"])
    assert len(borrowed) == 2 and repr(borrowed) == _one_line(capsys)
    with pytest.raises(AttributeError):
        borrowed.apply_rope


# --------------------------------------------------------------------------------------------
# A notebook alone in a folder (Colab, a download), and pointing it at the learner's own


ALONE = ("Your notebooks of chapters 10, 08 are not beside this one: the course's reference "
         "stands in for rms_norm, apply_rope. To use yours, point LLAMA_COURSE_NOTEBOOKS at the "
         "folder that holds them (in Colab, a Drive folder such as /content/drive/MyDrive/Colab "
         "Notebooks) or pass root=... to own_functions.")


def test_alone_in_a_folder_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    here = tmp_path / "content"          # Colab: the notebook alone in /content
    here.mkdir()
    _chapters(RELEASE, here, "12")       # a later chapter beside it is no earlier notebook
    monkeypatch.chdir(here)
    borrowed = own_functions({"rms_norm": "10_norm_residual", "apply_rope": "08"})
    assert _one_line(capsys) == ALONE
    assert borrowed.rms_norm is ref.rms_norm and borrowed.apply_rope is ref.apply_rope
    assert "LLAMA_COURSE_NOTEBOOKS can name the folder" in borrowed.why["rms_norm"]


def test_a_folder_named_by_the_variable_that_has_none_of_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(NOTEBOOKS_ENV, str(tmp_path / "drive"))
    own_functions({"rms_norm": "10"})
    assert _one_line(capsys).startswith(
        f"Your notebooks of chapter 10 are not in {tmp_path / 'drive'} (LLAMA_COURSE_NOTEBOOKS): "
        "the course's reference stands in for rms_norm.")


def test_the_variable_points_at_chapter_folders(tmp_path, capsys, monkeypatch):
    drive = _chapters(SOLUTIONS, tmp_path / "drive", "04")
    elsewhere = tmp_path / "content"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv(NOTEBOOKS_ENV, str(drive))
    assert own_functions({"attention": "04"}).attention is not ref.attention
    assert _one_line(capsys) == "Yours: attention (04)"


def test_notebooks_side_by_side_and_colab_copies(tmp_path, capsys, monkeypatch):
    """A Drive folder of notebooks saved from Colab: files side by side, named "Copy of ...";
    the newest copy counts, and borrowing nests through them (chapter 11's import cell borrows
    chapter 10's rms_norm from the same folder)."""
    drive = tmp_path / "Colab Notebooks"
    drive.mkdir()
    for number, name in [("03", "03_architectures.ipynb"),
                         ("04", "Copy of 04_self_attention.ipynb"), ("05", "05_multi_head.ipynb"),
                         ("06", "06_gqa_mqa.ipynb"),
                         ("08", "Copy of 08_rope.ipynb"), ("09", "09_ffn_swiglu.ipynb"),
                         ("10", "Copy of 10_norm_residual.ipynb"),
                         ("11", "11_decoder_block.ipynb")]:
        shutil.copy(_path(SOLUTIONS, number), drive / name)
    older = drive / "Copy of 10_norm_residual (old).ipynb"   # not a name borrowing takes
    shutil.copy(_path(RELEASE, "10"), older)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(NOTEBOOKS_ENV, str(drive))
    borrowed = own_functions({"rms_norm": "10_norm_residual", "decoder_block": "11"})
    assert _one_line(capsys) == "Yours: rms_norm (10), decoder_block (11)"
    nested = borrowed.decoder_block.__globals__["attention_sublayer"].__globals__["rms_norm"]
    assert nested is not ref.rms_norm


def test_the_newest_colab_copy_counts(tmp_path, capsys, monkeypatch):
    import os
    drive = tmp_path / "drive"
    drive.mkdir()
    solved = drive / "Copy of 04_self_attention.ipynb"
    unstarted = drive / "Copy 2 of 04_self_attention.ipynb"
    shutil.copy(_path(SOLUTIONS, "04"), solved)
    shutil.copy(_path(RELEASE, "04"), unstarted)
    os.utime(unstarted, (1, 1))                                     # older: the solved one counts
    monkeypatch.setenv(NOTEBOOKS_ENV, str(drive))
    assert own_or_reference("04_self_attention", "attention") is not ref.attention
    os.utime(solved, (0, 0))                                        # now the unstarted is newer
    assert own_or_reference("04", "attention") is ref.attention
    shutil.copy(_path(SOLUTIONS, "04"), drive / "04_self_attention.ipynb")
    os.utime(drive / "04_self_attention.ipynb", (0, 0))             # its own name beats copies
    assert own_or_reference("04", "attention") is not ref.attention


def test_the_variable_is_in_the_environment_table():
    from checks.environment import ENV
    assert "notebooks" in ENV[NOTEBOOKS_ENV].meaning


# Chapter 14 trains through what it borrows: gradients must flow through each function.
FOR_TRAINING = {"apply_rope": "08_rope", "rms_norm": "10_norm_residual",
                "model_forward": "12_lm_head_logits", "init_model_params": "12_lm_head_logits"}
UP_TO_12 = ("02", "03", "04", "05", "06", "08", "09", "10", "11", "12")


def _decorated(number: str, grade_id: str, decorator: str) -> str:
    source = _solution(number, grade_id)
    return source.replace(f"def {grade_id}(", f"{decorator}\ndef {grade_id}(", 1)


def _trains(model_forward, init_model_params) -> bool:
    params = ref.training.trainable(init_model_params(TINY, generator=torch.Generator()
                                                      .manual_seed(0)))
    ids = torch.randint(0, TINY.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    model_forward(ids, params, TINY).square().mean().backward()
    return all(t.grad is not None and bool(t.grad.abs().sum() > 0)
               for t in ref.training.param_list(params))


def test_a_forward_under_no_grad_is_not_borrowed_for_training(tmp_path, capsys):
    """The issue's case: chapter 12's model_forward under @torch.no_grad() stays the learner's
    nowhere; chapter 14 trains the reference, and one line says why, naming the chapter."""
    root = _chapters(SOLUTIONS, tmp_path, *UP_TO_12)
    _answer(root, "12", "model_forward", _decorated("12", "model_forward", "@torch.no_grad()"))
    borrowed = own_functions(FOR_TRAINING, root=root)
    out = capsys.readouterr().out
    assert borrowed.whose["model_forward"] == "reference"
    assert borrowed.whose["apply_rope"] == borrowed.whose["rms_norm"] == "yours"
    assert "model_forward (12: no gradients)" in out.splitlines()[0]
    assert "Not for training: `model_forward` (chapter 12) runs with gradient tracking off " \
        "(`torch.no_grad()`)" in out
    assert borrowed.mistakes["model_forward"] == "14.train_step.borrowed_without_gradients"
    assert _trains(borrowed.model_forward, borrowed.init_model_params)


@pytest.mark.parametrize("number,name,body,cause,mistake", [
    ("08", "apply_rope", "@torch.no_grad()", "runs with gradient tracking off (`torch.no_grad()`)",
     "14.train_step.borrowed_without_gradients"),
    ("08", "apply_rope", "@torch.inference_mode()", "runs with gradient tracking off",
     "14.train_step.borrowed_without_gradients"),
])
def test_a_piece_that_cuts_gradients_is_named_with_its_chapter(tmp_path, capsys, number, name,
                                                               body, cause, mistake):
    """A piece of chapter 08 under no_grad passes its own check; chapter 14 (and the chapters
    between, through nested borrowing) take the reference for it, and say which and why."""
    root = _chapters(SOLUTIONS, tmp_path, *UP_TO_12)
    _answer(root, number, name, _decorated(number, name, body))
    borrowed = own_functions(FOR_TRAINING, root=root)
    out = capsys.readouterr().out
    assert borrowed.whose[name] == "reference" and f"{name} ({number}: no gradients)" in out
    assert f"Not for training: `{name}` (chapter {number}) {cause}" in out
    assert borrowed.whose["model_forward"] == "yours"   # its block took the reference RoPE
    assert _trains(borrowed.model_forward, borrowed.init_model_params)
    assert borrowed.mistakes[name] == mistake and borrowed.mistakes["model_forward"] is None
