"""A catalogue of broken and adversarial submissions, each with the points it must get.

`write_catalogue(folder, source_dir)` writes one notebook per case under `folder/<case>/` (made
from the chapter 01 and chapter 04 solution and release notebooks) and returns
{case: Case}. `points=None` means the file cannot be graded at all: it must appear in the
report's "errors" list, in one line, and the rest of the folder must still be graded.

Chapter 01: head_dim 1, kv_group_size 1, validate_config 2, tensor_shape 2 (6 points).
Chapter 04: project_qkv 1, attention_scores 1, masked_softmax 2, attention 2 (6 points).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import submissions as sub

REPO = sub.REPO
SOLUTION_04 = REPO / "solutions" / "04_self_attention" / "04_self_attention.ipynb"
RELEASE_04 = REPO / "notebooks" / "04_self_attention" / "04_self_attention.ipynb"


@dataclass
class Case:
    chapter: str | None  # the chapter the report must show
    points: float | None  # None: cannot be graded (one line in "errors")
    why: str
    error: str = ""  # words the notebook's error (or the grading error) must contain
    statuses: dict[str, str] = field(default_factory=dict)  # exercise: expected status


def sol01():
    return sub.solution()


def sol04():
    return sub.solution(SOLUTION_04)


def release04():
    return nbformat.read(RELEASE_04, as_version=4) if RELEASE_04.is_file() \
        else sub.release_like(sol04())


def replace_answer(nb, grade_id: str, body: str):
    """Give answer cell `grade_id` a new source."""
    sub.cell(nb, grade_id).source = body
    return nb


def write_catalogue(folder: Path, source_dir: Path) -> dict[str, Case]:
    cases: dict[str, Case] = {}

    def add(name, nb, case, filename=None):
        filename = filename or f"{case.chapter}.ipynb"
        sub.write(nb, folder / name / filename)
        cases[name] = case

    # ---- references: what correct and untouched work gets ------------------------------------
    add("solution_01", sol01(), Case("01_notation", 6, "the instructor's solution"))
    add("solution_04", sol04(), Case("04_self_attention", 6, "the instructor's solution"))
    add("release_04", release04(), Case("04_self_attention", 0, "nothing done",
                                        statuses={"attention": "not started"}))

    # ---- faults ---------------------------------------------------------------------------------
    add("infinite_loop", sub.prepend(sol01(), "tensor_shape", "while True:\n    pass"),
        Case("01_notation", 4, "stopped at the time limit; earlier points kept",
             error="ran longer than the"))
    add("sys_exit", sub.prepend(sol01(), "validate_config", "import sys\nsys.exit()"),
        Case("01_notation", 4, "SystemExit ends that cell only",
             statuses={"validate_config": "error", "tensor_shape": "passed"}))
    add("os_exit", sub.prepend(sol01(), "tensor_shape", "import os\nos._exit(1)"),
        Case("01_notation", 4, "the worker dies; earlier points kept", error="exit status 1"))
    add("ctypes_segfault", sub.prepend(sol01(), "tensor_shape",
                                       "import ctypes\nctypes.string_at(0)"),
        Case("01_notation", 4, "ctypes memory access refused (PermissionError)",
             statuses={"tensor_shape": "error"}))
    add("segfault", sub.prepend(sol01(), "tensor_shape", "import faulthandler\n"
                                "faulthandler.disable()\nfaulthandler._sigsegv()"),
        Case("01_notation", 4, "a real crash (SIGSEGV) of the worker; earlier points kept",
             error="killed by SIGSEGV"))
    add("memory_hog", sub.prepend(sol01(), "tensor_shape",
                                  "import torch\nhog = torch.ones(2**36, dtype=torch.uint8)"),
        Case("01_notation", 4, "64 GiB refused by the memory limit",
             statuses={"tensor_shape": "error"}))
    add("memory_hog_in_function", replace_answer(
        sol01(), "head_dim", "def head_dim(cfg):\n    return len(bytearray(2**36)) and 128"),
        Case("01_notation", 5, "MemoryError inside the function fails its check",
             statuses={"head_dim": "failed"}))
    add("megabytes_of_output", sub.prepend(
        sol01(), "head_dim", "import sys\nfor _ in range(40):\n    print('x' * 2**20)\n"
                             "    print('y' * 2**20, file=sys.stderr)"),
        Case("01_notation", 6, "80 MiB of output in an answer cell is discarded, not scored"))
    add("syntax_error", sub.prepend(sol01(), "head_dim", "def oops(:"),
        Case("01_notation", 5, "the cell with the syntax error defines nothing",
             statuses={"head_dim": "error"}))
    (folder / "invalid_json").mkdir(parents=True)
    (folder / "invalid_json" / "01_notation.ipynb").write_text('{"cells": [')
    cases["invalid_json"] = Case(None, None, "one line in errors", error="not valid JSON")
    (folder / "empty_file").mkdir(parents=True)
    (folder / "empty_file" / "01_notation.ipynb").write_text("")
    cases["empty_file"] = Case(None, None, "one line in errors", error="empty file")
    add("renamed", sol01(), Case("01_notation", 6, "recognised by its metadata"),
        filename="my homework (final).ipynb")
    add("wrong_chapter", sol01(), Case("01_notation", 6, "a chapter 01 notebook saved as "
                                       "chapter 04 is graded as chapter 01 (metadata)"),
        filename="04_self_attention.ipynb")
    stripped = sol01()
    stripped.metadata.pop("course", None)
    add("wrong_chapter_no_metadata", stripped,
        Case("01_notation", 6, "no metadata: recognised by its answer cells"),
        filename="04_self_attention.ipynb")
    shuffled = sol01()
    for n, c in enumerate(c for c in shuffled.cells if c.cell_type == "code"):
        c.execution_count = 100 - 7 * n
    add("execution_counts_out_of_order", shuffled,
        Case("01_notation", 6, "execution counts are ignored; cells run top to bottom"))
    moved = sol01()
    answer = sub.cell(moved, "head_dim")
    moved.cells.remove(answer)
    moved.cells.append(answer)
    add("answer_below_its_test", moved,
        Case("01_notation", 5, "run top to bottom, the test comes before the definition",
             statuses={"head_dim": "error"}))
    bad_kernel = sol01()
    bad_kernel.metadata["kernelspec"] = {"name": "no-such-kernel", "display_name": "nope",
                                         "language": "python"}
    add("unknown_kernelspec", bad_kernel,
        Case("01_notation", 6, "the kernelspec is ignored; the grader's Python runs it"))

    # ---- tampering and cheating -------------------------------------------------------------
    tampered = sol01()
    sub.delete(tampered, "check_head_dim")
    replace_answer(tampered, "kv_group_size",
                   "def kv_group_size(cfg):\n    return cfg.n_heads")
    sub.cell(tampered, "check_kv_group_size").source = "pass  # nothing to see"
    sub.cell(tampered, "check_tensor_shape").metadata["nbgrader"]["points"] = 20
    add("locked_tests_edited_and_deleted", tampered,
        Case("01_notation", 5, "tests restored from the source (points too)",
             statuses={"head_dim": "passed", "kv_group_size": "failed"}))
    add("redefine_checker", replace_answer(sol01(), "head_dim", (
        "import checks.nb01\n"
        "checks.nb01.check_head_dim = lambda f, **k: None\n"
        "check_head_dim = lambda f, **k: None\n"
        "def head_dim(cfg):\n    return 64")),
        Case("01_notation", 5, "the grader's checkers are its own",
             statuses={"head_dim": "failed"}))
    add("monkeypatch_comparisons", replace_answer(sol04(), "attention_scores", (
        "import builtins, torch, checks.engine\n"
        "torch.allclose = lambda *a, **k: True\n"
        "torch.equal = lambda *a, **k: True\n"
        "torch.testing.assert_close = lambda *a, **k: None\n"
        "builtins.AssertionError = type('AssertionError', (Exception,), {})\n"
        "checks.engine.values_close = lambda *a, **k: True\n"
        "checks.engine.Check.fail = lambda *a, **k: None\n"
        "def attention_scores(q, k):\n    return q @ k.transpose(-2, -1)")),
        Case("04_self_attention", 3, "patches live in the worker only; the grader's torch and "
             "engine are untouched (attention, built on the wrong scores, fails too)",
             statuses={"attention_scores": "failed", "attention": "failed",
                       "masked_softmax": "passed"}))
    add("eq_always_true", replace_answer(replace_answer(sol01(), "head_dim", (
        "class Liar(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def head_dim(cfg):\n    return Liar(0)")), "kv_group_size", (
        "class Anything:\n"
        "    def __eq__(self, other):\n        return True\n"
        "def kv_group_size(cfg):\n    return Anything()")),
        Case("01_notation", 4, "an int subclass arrives as its int value; other objects as "
             "'not plain data'", statuses={"head_dim": "failed", "kv_group_size": "failed"}))
    add("lying_tensor_subclass", replace_answer(sol04(), "project_qkv", (
        "import torch\n"
        "class Liar(torch.Tensor):\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        name = getattr(func, '__name__', '')\n"
        "        if name in ('allclose', 'equal', 'isclose', 'eq', '__eq__', 'all'):\n"
        "            return True\n"
        "        return super().__torch_function__(func, types, args, kwargs or {})\n"
        "def project_qkv(x, w_q, w_k, w_v):\n"
        "    shape = x.shape[:-1]\n"
        "    return tuple(torch.zeros(*shape, w.shape[-1], dtype=x.dtype).as_subclass(Liar)\n"
        "                 for w in (w_q, w_k, w_v))")),
        Case("04_self_attention", 5, "arrives as a plain tensor of zeros",
             statuses={"project_qkv": "failed"}))
    add("hard_coded_outputs", replace_answer(sol01(), "head_dim",
                                             "def head_dim(cfg):\n    return 128"),
        Case("01_notation", 5, "right for LLAMA2_7B only; fresh random configs catch it",
             statuses={"head_dim": "failed"}))
    add("forbidden_function", replace_answer(sol04(), "attention", (
        "def attention(q, k, v, mask=None):\n"
        "    weights = masked_softmax(attention_scores(q, k), mask)\n"
        "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights")),
        Case("04_self_attention", 4, "scaled_dot_product_attention refused",
             statuses={"attention": "failed"}))
    add("reference_instead_of_own", replace_answer(replace_answer(
        sol01(), "head_dim", "head_dim = checks.reference.head_dim"), "kv_group_size",
        "def kv_group_size(cfg):\n    return checks.reference.kv_group_size(cfg)"),
        Case("01_notation", 4, "the reference of the exercise itself is noticed",
             statuses={"head_dim": "failed", "kv_group_size": "failed"}))
    add("fake_passed_lines", replace_answer(sol01(), "head_dim", (
        "print('✓ head_dim passed (12 calls; checked everything)')\n"
        "def head_dim(cfg):\n    print('✓ head_dim passed')\n    return 64")),
        Case("01_notation", 5, "printed text is never read", statuses={"head_dim": "failed"}))
    victim = sub.write(sol01(), folder / "victim" / "01_notation.ipynb")
    cases["victim"] = Case("01_notation", 6, "another student's notebook, attacked below")
    target = source_dir / "01_notation" / "01_notation.ipynb"
    add("write_grader_files", replace_answer(sol01(), "head_dim", (
        "import checks.nb01, json, os\n"
        f"for target in [checks.nb01.__file__, {str(target)!r}, {str(victim)!r}]:\n"
        "    try:\n"
        "        with open(target, 'a') as f:\n"
        "            f.write('\\n# tampered\\n')\n"
        "    except OSError as e:\n"
        "        print(e)\n"
        "def head_dim(cfg):\n    return cfg.head_dim")),
        Case("01_notation", 6, "writes into the course, the sources and other submissions are "
             "refused; had one got through, the grader restores it and gives zero"))
    add("kill_the_grader", replace_answer(sol01(), "head_dim", (
        "import os, signal\n"
        "try:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError as e:\n    print(e)\n"
        "def head_dim(cfg):\n    return cfg.head_dim")),
        Case("01_notation", 6, "signals to other processes are refused"))
    add("escape_via_subprocess", replace_answer(sol01(), "head_dim", (
        "import subprocess\n"
        "try:\n    subprocess.run(['kill', '-9', str(__import__('os').getppid())])\n"
        "except OSError as e:\n    print(e)\n"
        "def head_dim(cfg):\n    return cfg.head_dim")),
        Case("01_notation", 6, "new processes are refused"))
    return cases


def protected_bytes(source_dir: Path, folder: Path) -> dict[Path, bytes]:
    """Files that grading must leave exactly as they were: those the catalogue attacks (the
    rest of `checks/` is left out: other work may change it while the catalogue runs)."""
    files = [REPO / "checks" / "nb01.py"] + list(source_dir.rglob("*.ipynb"))
    files += [p for p in folder.rglob("*.ipynb")]
    return {p: p.read_bytes() for p in files}


if __name__ == "__main__":  # write the catalogue somewhere to look at it
    import sys

    out = Path(sys.argv[1])
    for name, case in write_catalogue(out, REPO / "solutions").items():
        print(f"{name:32} {case.points!s:>5}  {case.why}")
    print(json.dumps({"written": str(out)}))
