"""A catalogue of broken and adversarial submissions, each with the points it must get.

`CATALOGUE` is the table: one `Case` per row, with its name, the submission it builds (from
the paths in `Where`: the attacks aim at the marker, the sources and the other submissions) and
what grading it must give (points, statuses, the error's words, or `points=None`: a refusal).
`write_catalogue(folder, source_dir, marker)` writes one notebook per case under
`folder/<case>/` and returns {case: Case}; tests/grader/test_adversarial.py grades the folder
once and checks each case as a test of its own. Cases are named `cK_...` after the attack class they
belong to (issue 11's eight classes; `c0` are faults and references, `t` tampering made visible,
`a` what is not protected), and each class ends with a victim, an honest solution graded after
the attacks, which must keep its full marks. `points=None` means the file cannot be graded at
all: one line in the report's "errors", and the rest of the folder is still graded.

Notebooks are lean (imports, answers and tests only) so that the whole catalogue grades in about a
minute. Chapter 01: head_dim 1, kv_group_size 1, validate_config 2, tensor_shape 2 (6 points).
Chapter 04: project_qkv 1, attention_scores 1, masked_softmax 2, attention 2 (6 points).
Chapter 10: layer_norm 2, rms_norm 2, pre_norm_residual 1, post_norm_residual 1 (6 points).
Chapter 13: KVCache 2, forward_with_cache 3, generate 3 (8 points).

`PROTECTED` and `NOT_PROTECTED` are docs/instructor/trust.md's two lists, word for word ("What is
guaranteed", "What is not guaranteed"); every case names the claim it tests, and
`tests/grader/test_adversarial.py` checks that the lists and the catalogue match.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import nbformat

from . import submissions as sub

REPO = sub.REPO
SOLUTIONS = REPO / "solutions"
CHAPTER_01 = ("head_dim", "kv_group_size", "validate_config", "tensor_shape")  # its exercises
SECRET = "LLAMA_COURSE_SECRET_TOKEN"  # set in the grader's environment by the test

PROTECTED = {
    "tests-from-source": "Test cells come from the source notebooks: edited, deleted or added "
                         "test cells, points in a submission's metadata and cells a submission "
                         "marks as tests change nothing, and never run in the grader.",
    "kinds-from-source": "Whether an exercise is a function or a class comes from the source: a "
                         "function exercise that arrives as a class fails.",
    "checkers-in-grader": "Redefining or patching a checker, `torch.allclose`, "
                          "`AssertionError` or anything else in the notebook changes only the "
                          "worker; the grader's own run decides, and a notebook whose own run "
                          "passes where the grader's fails is reported as tampering suspected.",
    "answers-unreachable": "The course's answers are out of the worker's reach: the graded "
                           "chapter's checkers and reference functions are not in its copy of "
                           "`checks`, and its view of the disk is an allow-list (as root: an empty"
                           " root holding only the Python installation with the model's converted "
                           "weights, system libraries, a few files of /etc and /sys, all "
                           "read-only, and its own scratch), so the repository, the sources, other"
                           " submissions, a second clone of the course and the grader's home are "
                           "not there (switching off a profiler, threads, cloned code objects, "
                           "reading files or walking the garbage collector find nothing).",
    "hostile-data": "Everything the worker sends is data decoded without running its code: "
                    "objects that lie about equality, tensor subclasses, oversized or forged "
                    "messages, colliding dict keys, deep nesting and expanded or out-of-bounds "
                    "tensors are refused or arrive as plain values, within bounded time and "
                    "memory.",
    "inputs-copied": "Expected values come from the inputs as they were before the call: a "
                     "function that changes its inputs in place fails, saying so.",
    "walls": "The worker runs as an unprivileged user in its own PID, mount, network and IPC "
             "namespaces and memory cgroup, with a system-call filter that refuses the kernel's "
             "keyrings and new namespaces (nothing a notebook leaves there reaches a later one): "
             "it cannot signal the grader or other processes, cannot write outside its scratch "
             "folder, and every process it starts is gone before the next notebook (checked); the "
             "grader's processes are not dumpable, and SIGINT or SIGTERM to the grader ends every "
             "process it started; the course, the sources, every submission and the Python "
             "installation's start-up files (.pth, sitecustomize) are hashed and compared after "
             "each notebook, and a change stops grading with an incident report.",
    "bounded-grader": "Output, messages, decoded data and the worker's memory, CPU time, file "
                      "sizes and wall time per notebook are capped: the grader stays under 1 GiB, "
                      "and a hang, crash, memory blow-up, `os._exit` or `sys.exit` costs only that"
                      " cell's exercise and those whose code calls it (the worker is restarted, "
                      "the cells before it replayed without it, and the report names the cell "
                      "skipped and why); a test cell that calls a function whose call already "
                      "ran out of time is skipped at once, saying so, instead of waiting for the "
                      "time limit again.",
    "minimal-environment": "The worker gets a minimal environment: nothing the instructor has "
                           "set (secrets included) reaches it.",
}

NOT_PROTECTED = {
    "advisory-guard": "Forbidden library functions (for example chapter 04's library softmax) "
                      "are caught by a guard inside the worker, which the notebook can switch "
                      "off: a detection fails the test, an evasion is not seen.",
    "copied-reference": "Copying the reference's code (it ships with the course) is not "
                        "detected.",
    "no-root": ("Without namespaces the walls are weaker; the section below says exactly "
              "what holds as root in a container without CAP_SYS_ADMIN and as a normal "
              "user. As a normal user the worker runs as your user: it can read every file "
              "you can (the course, the sources, classmates' notebooks), write to /tmp "
              "and, through a child process started around the audit hook, wherever you "
              "can (the tripwire then stops grading, after the fact), signal your other "
              "processes (a pidfd kill of a grading process: the notebooks it was grading "
              "are graded again alone, and one whose grading process is killed again is "
              "not graded), share your kernel keyring and reach the network. The report "
              "says so; grade as root for the walls."),
    "hidden-inputs": ("Hidden tests' inputs: the worker receives the arguments a hidden test "
                      "passes to the learner's functions (never the hidden tests' source). Each "
                      "block of hidden tests runs in a throwaway fork of the worker, so what the "
                      "learner's code keeps of them in its memory is gone after the block: a "
                      "later test cannot raise, print or return it. But the fork is made by the "
                      "worker's own loop, which the notebook can patch, like the guard above; and "
                      "a notebook that keeps the arguments outside its memory (a file in its "
                      "scratch folder, memory it shared before the fork, a process it started) "
                      "or fails the hidden test itself with them in its message still gets them "
                      "into the feedback."),
}


@dataclass
class Where:
    """Where a catalogue is written: the attacks aim at these paths."""

    folder: Path      # the class folder: one subfolder per case
    source_dir: Path  # the source notebooks the grader reads
    marker: Path      # a file that must never exist (attacks try to create it from the grader)

    @property
    def chapter_01(self) -> Path:
        return self.source_dir / "01_notation" / "01_notation.ipynb"

    @property
    def victim(self) -> Path:
        """The submission later attacks write to (c0_zz_victim)."""
        return self.folder / "c0_zz_victim" / "01_notation.ipynb"


@dataclass
class Case:
    """One row of the catalogue: a submission, and what grading it must give."""

    name: str  # its folder in the class; cK_... after the attack class it belongs to
    submission: Callable[[Where], object]  # the notebook, or a str: the file's raw text
    chapter: str | None  # the chapter the report must show
    points: float | None  # None: cannot be graded (one line in "errors")
    why: str
    claim: str = ""  # the PROTECTED or NOT_PROTECTED entry it tests
    error: str = ""  # words the notebook's error (or the grading error) must contain
    statuses: dict[str, str] = field(default_factory=dict)  # exercise: expected status
    tampering: set[str] = field(default_factory=set)  # exercises flagged "tampering suspected"
    warning: str = ""  # words a warning must contain
    absent: str = ""  # words that no text of the notebook's record may contain
    shown: str = ""  # words that an exercise's message must contain
    filename: str = ""  # the file's name, when it is not <chapter>.ipynb

    def write(self, where: Where) -> Path:
        path = where.folder / self.name / (self.filename or f"{self.chapter}.ipynb")
        submission = self.submission(where)
        if isinstance(submission, str):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(submission)
            return path
        return sub.write(submission, path)


def lean(path: Path):
    """A chapter's solution with only its import cells (whole: they also borrow earlier
    chapters' functions), answer cells and test cells."""
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            tree = ast.Module(body=[], type_ignores=[])
        if meta.get("solution") or meta.get("grade"):
            cells.append(cell)
        elif any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body):
            # Figures are not graded: leave out what only draws them (a second per notebook).
            tree.body = [n for n in tree.body if not _drawing(n)]
            cell.source = ast.unparse(tree)
            cell.outputs = []
            cells.append(cell)
    nb.cells = cells
    return nb


def _drawing(node: ast.stmt) -> bool:
    modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
        [a.name for a in node.names] if isinstance(node, ast.Import) else []
    return bool(modules) and all(m.split(".")[0] == "matplotlib" or m in (
        "checks.diagrams", "checks.figures") for m in modules)


@lru_cache(maxsize=None)
def _tests(chapter: str) -> tuple[tuple[str, float], ...]:
    """(exercise, points) of the chapter's test cells, in order (read once: the catalogue's
    points are computed when this module is imported)."""
    nb = nbformat.read(SOLUTIONS / chapter / f"{chapter}.ipynb", as_version=4)
    return tuple((c.metadata["nbgrader"]["grade_id"].removeprefix("check_"),
                  float(c.metadata["nbgrader"].get("points", 0))) for c in nb.cells
                 if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")
                 and not c.metadata["nbgrader"].get("solution"))


def full(chapter: str = "01_notation") -> float:
    return sum(p for _, p in _tests(chapter))


def without(*names: str, chapter: str = "01_notation") -> float:
    """Full marks less the named exercises."""
    return sum(p for n, p in _tests(chapter) if n not in names)


def before(name: str, chapter: str = "01_notation") -> float:
    """The points of the tests before exercise `name`'s (kept when the worker dies there)."""
    tests = _tests(chapter)
    return sum(p for _, p in tests[:[n for n, _ in tests].index(name)])


def sol(chapter: str = "01_notation"):
    return lean(SOLUTIONS / chapter / f"{chapter}.ipynb")


def answer(nb, grade_id: str, body: str):
    """Give answer cell `grade_id` a new source."""
    sub.cell(nb, grade_id).source = body
    return nb


def extra_cell(nb, after: str, source: str, metadata: dict):
    cell = nbformat.v4.new_code_cell(source, metadata={"nbgrader": metadata})
    nb.cells.insert(nb.cells.index(sub.cell(nb, after)) + 1, cell)
    return nb


# The worker's pipe to the grader (the one pipe it holds open for writing), and a message frame.
PIPE = """import os, fcntl, struct, json
_fd = next(int(fd) for fd in os.listdir('/proc/self/fd') if int(fd) > 2
           and os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:')
           and fcntl.fcntl(int(fd), fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY)
def _frame(header, blob=b''):
    payload = struct.pack('>I', len(header)) + header + blob
    return struct.pack('>Q', len(payload)) + payload
"""


def pipe_attack(payload: str) -> str:
    return PIPE + f"os.write(_fd, {payload})\n"


# ---- the submissions that take more than one expression -----------------------------------------

# Chapter 04's hidden test of project_qkv calls it with torch.arange(6.0).view(1, 2, 3), the only
# call of that shape; RECORDS_HIDDEN keeps what that call passes.
HIDDEN_X = "[[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]"
RECORDS_HIDDEN = ("_seen = []\n"
                  "def project_qkv(x, w_q, w_k, w_v):\n"
                  "    if tuple(x.shape) == (1, 2, 3):\n"
                  "        _seen.append(repr(x.tolist()))\n"
                  "    return x @ w_q, x @ w_k, x @ w_v")
MASKED_SOFTMAX = ("def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> "
                  "torch.Tensor:\n")


def _source_of(chapter: str, grade_id: str) -> str:
    """The solution's answer cell `grade_id` of `chapter`."""
    return sub.cell(sol(chapter), grade_id).source


def _victim(klass: str) -> Case:
    return Case(f"{klass}_zz_victim", lambda w: sol(), "01_notation", full(),
                "an honest solution graded after the attacks above keeps its marks", "walls")


def _answer_moved_below_its_test():
    moved = sol()
    moved.cells.append(moved.cells.pop(moved.cells.index(sub.cell(moved, "head_dim"))))
    return moved


def _grader_code(w: Where) -> str:
    """Code that, run in the grader, would leave the marker and make every check pass."""
    return (f"open({str(w.marker)!r}, 'w').write('ran in the grader')\n"
            "import torch, checks.nb01\n"
            "torch.equal = lambda *a, **k: False\n"
            "torch.allclose = lambda *a, **k: False\n"
            "checks.nb01.check_tensor_shape = lambda *a, **k: None\n")


def _duplicate_test_id():
    duplicated = answer(sol(), "head_dim", "def head_dim(cfg):\n    return 64")
    return extra_cell(duplicated, "head_dim", "pass  # my own test", {
        "grade": True, "grade_id": "check_head_dim", "locked": True, "points": 1,
        "schema_version": 3, "solution": False})


def _tests_edited_and_deleted():
    tampered = sol()
    sub.delete(tampered, "check_head_dim")
    answer(tampered, "kv_group_size", "def kv_group_size(cfg):\n    return cfg.n_heads")
    sub.cell(tampered, "check_kv_group_size").source = "pass  # nothing to see"
    sub.cell(tampered, "check_tensor_shape").metadata["nbgrader"]["points"] = 20
    return tampered


# What c4 writes to the grader's pipe ("MARKER": the marker's path), and the words of the error.
PIPES = {
    "huge_frame": ("struct.pack('>Q', 2**40)", "MiB in one answer"),
    "colliding_keys": ("_frame(json.dumps({'v': {'d': [[k * (2**61 - 1), 0] for k in "
                       "range(1, 30001)]}, 's': []}).encode())", "protocol"),
    "deep_nesting": ("_frame(b'{\"v\": ' + b'[' * 200000 + b']' * 200000 + b', \"s\": []}')",
                     "protocol"),
    "expanded_tensor": ("_frame(json.dumps({'v': {'d': [['kind', 'callback'], ['ident', 1],"
                        " ['args', {'t': [{'x': [1, 'float32', 0, [2**28], [0], False]}]}],"
                        " ['kwargs', {'d': []}]]}, 's': [[1, 4]]}).encode(), b'\\0' * 4)",
                        "expanded"),
    "pickle": ("(lambda p: struct.pack('>Q', len(p)) + p)(__import__('pickle').dumps("
               "type('X', (), {'__reduce__': lambda s: (open, (MARKER, 'w'))})()))",
               "protocol"),
    "forged_reply": ("_frame(json.dumps({'v': {'d': [['kind', 'cell'], ['ok', True]]}, "
                     "'s': []}).encode())", "protocol"),
}


def _pipe_case(name: str, payload: str, words: str) -> Case:
    def submission(w):
        attack = pipe_attack(payload.replace("MARKER", repr(str(w.marker))))
        return sub.prepend(sol(), "tensor_shape", attack)
    return Case(f"c4_pipe_{name}", submission, "01_notation", before("tensor_shape"),
                f"a {name.replace('_', ' ')} written to the grader's pipe ends "
                "the worker; earlier points kept", "hostile-data", error=words)


def _late_writes(w: Where) -> str:
    """What c6's escaped processes try 3 s later, when the worker is gone."""
    return (f"import time, os\ntime.sleep(3)\n"
            f"for target in [{str(w.victim)!r}, {str(w.chapter_01)!r}, "
            f"{str(REPO / 'checks' / 'nb01' / '__init__.py')!r}, {str(w.marker)!r}]:\n"
            "    try:\n        open(target, 'a').write('# tampered')\n"
            "    except OSError:\n        pass\n")


def _many_medium_answers():
    many = sol()
    sub.cell(many, "validate_config").source += (
        "\n_honest = validate_config\n"
        "def validate_config(cfg):\n    _honest(cfg)\n    return torch.zeros(12 * 2**20)")
    return many


def _fake_checks_module():
    fake = sol()
    fake.cells.insert(1, nbformat.v4.new_code_cell(
        "import sys, types\nfake = types.ModuleType('checks.nb01')\n"
        "for name in ('head_dim', 'kv_group_size', 'validate_config', 'tensor_shape'):\n"
        "    setattr(fake, 'check_' + name, lambda *a, **k: None)\n"
        "sys.modules['checks.nb01'] = fake\n"
        "import torch\ntorch.allclose = lambda *a, **k: True\n"
        "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})"))
    for name, value in (("head_dim", 128), ("kv_group_size", 4)):  # right for the examples only
        answer(fake, name, f"def {name}(cfg):\n    return {value}")
    return fake


# ---- the catalogue ------------------------------------------------------------------------------
# Graded in this order (the folder's), so each class's victim comes after its attacks.
CATALOGUE: list[Case] = [
    # ---- c0: references and faults --------------------------------------------------------------
    Case("c0_solution_04", lambda w: sol("04_self_attention"),
         "04_self_attention", full("04_self_attention"), "the instructor's solution",
         "tests-from-source"),
    Case("c0_release_04", lambda w: sub.release_like(sol("04_self_attention")),
         "04_self_attention", 0, "nothing done", "tests-from-source",
         statuses={"attention": "not started"}),
    Case("c0_infinite_loop", lambda w: sub.prepend(sol(), "tensor_shape", "while True:\n    pass"),
         "01_notation", before("tensor_shape"), "stopped at the time limit; earlier points kept",
         "bounded-grader", error="ran longer than the"),
    Case("c0_sys_exit", lambda w: sub.prepend(sol(), "validate_config", "import sys\nsys.exit()"),
         "01_notation", without("validate_config"), "SystemExit ends that cell only",
         "bounded-grader", statuses={"validate_config": "error", "tensor_shape": "passed"}),
    Case("c0_os_exit", lambda w: sub.prepend(sol(), "tensor_shape", "import os\nos._exit(1)"),
         "01_notation", before("tensor_shape"), "the worker dies; earlier points kept",
         "bounded-grader", error="exit status 1"),
    Case("c0_segfault",
         lambda w: sub.prepend(sol(), "tensor_shape", "import ctypes\nctypes.string_at(0)"),
         "01_notation", before("tensor_shape"), "a real crash of the worker; earlier points kept",
         "bounded-grader", error="killed by SIGSEGV"),
    Case("c0_memory_hog", lambda w: sub.prepend(sol(), "tensor_shape",
                                     "import torch\nhog = torch.ones(2**31, dtype=torch.uint8)"),
         "01_notation", before("tensor_shape"),
         "2 GiB touched: over the memory limit, the worker is killed", "bounded-grader",
         error="memory limit"),
    Case("c0_address_space_reserved", lambda w: sub.prepend(sol(), "head_dim", (
        "import mmap\n"
        "reserved = mmap.mmap(-1, 64 << 30, prot=mmap.PROT_READ,\n"
        "                     flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)")),
         "01_notation", full(),
         "64 GiB of address space reserved, never touched (as CUDA "
         "builds of torch do): the limit counts memory used, so nothing happens",
         "bounded-grader"),
    Case("c0_hung_function_not_called_again", lambda w: answer(
        sol("04_self_attention"), "attention_scores",
        "def attention_scores(q, k):\n    while True:\n        pass"),
         "04_self_attention",
         without("attention_scores", "attention", chapter="04_self_attention"),
         "attention_scores hangs: its test costs one time limit; attention's, which calls it, "
         "is skipped at once (round five: it waited for a second time limit)", "bounded-grader",
         error="not called again",
         statuses={"attention": "error", "masked_softmax": "passed"}),
    Case("c0_syntax_error", lambda w: sub.prepend(sol(), "head_dim", "def oops(:"),
         "01_notation", without("head_dim"), "the cell with the syntax error defines nothing",
         "tests-from-source", statuses={"head_dim": "error"}),
    Case("c0_invalid_json", lambda w: '{"cells": [',
         None, None, "one line in errors", "bounded-grader", error="not valid JSON",
         filename="01_notation.ipynb"),
    Case("c0_renamed", lambda w: sol(),
         "01_notation", full(), "recognised by its metadata", "tests-from-source",
         filename="my homework (final).ipynb"),
    Case("c0_wrong_chapter_name", lambda w: sol(),
         "01_notation", full(),
         "a chapter 01 notebook saved as chapter 04 is graded as chapter 01, "
         "with a warning", "tests-from-source", warning="says 04_self_attention",
         filename="04_self_attention.ipynb"),
    Case("c0_answer_below_its_test", lambda w: _answer_moved_below_its_test(),
         "01_notation", without("head_dim"),
         "run top to bottom, the test comes before the definition", "tests-from-source",
         statuses={"head_dim": "error"}),
    Case("c0_zz_victim", lambda w: sol(),
         "01_notation", full(), "the submission later attacks write to", "walls"),
    # ---- c1: extra test cells -------------------------------------------------------------------
    Case("c1_extra_test_cell", lambda w: extra_cell(sol(), "check_head_dim", _grader_code(w), {
        "grade": True, "grade_id": "check_bonus", "locked": True, "points": 50,
        "schema_version": 3, "solution": False}),
         "01_notation", full(),
         "a cell marked as a test with 50 points of its own runs in the "
         "worker as plain code and earns nothing", "tests-from-source"),
    Case("c1_extra_test_cell_as_answer", lambda w: extra_cell(sol(), "head_dim", _grader_code(w), {
        "grade": True, "grade_id": "tensor_shape_bonus", "locked": False, "points": 10,
        "schema_version": 3, "solution": True}),
         "01_notation", full(), "a graded answer cell of its own: plain code in the worker",
         "tests-from-source"),
    Case("c1_duplicate_test_id", lambda w: _duplicate_test_id(),
         "01_notation", without("head_dim"),
         "a cell claiming a real test's id is replaced by the source's", "tests-from-source",
         statuses={"head_dim": "failed"}),
    Case("c1_tests_edited_and_deleted", lambda w: _tests_edited_and_deleted(),
         "01_notation", without("kv_group_size"), "tests restored from the source (points too)",
         "tests-from-source", statuses={"head_dim": "passed", "kv_group_size": "failed"}),
    _victim("c1"),
    # ---- c2: function or class decided by the worker --------------------------------------------
    Case("c2_function_as_class", lambda w: answer(sol(), "head_dim", (
        "import sys\n"
        "class head_dim:\n    def __new__(cls, cfg):\n        return cfg.head_dim\n"
        "sys.modules['checks.nb01'].check_head_dim = lambda *a, **k: None")),
         "01_notation", without("head_dim"),
         "a function exercise defined as a class fails (its own patched "
         "run passes: tampering suspected)", "kinds-from-source", statuses={"head_dim": "failed"},
         tampering={"head_dim"}),
    Case("c2_function_as_metaclass", lambda w: answer(sol(), "kv_group_size", (
        "class _Meta(type):\n    def __call__(cls, cfg):\n"
        "        return cfg.n_heads // cfg.n_kv_heads\n"
        "class kv_group_size(metaclass=_Meta):\n    pass")),
         "01_notation", without("kv_group_size"),
         "a class whose metaclass computes the answer is still a class", "kinds-from-source",
         statuses={"kv_group_size": "failed"}),
    _victim("c2"),
    # ---- c3: guards in the worker; the answers out of reach -------------------------------------
    Case("c3_reference_tricks", lambda w: answer(answer(answer(answer(sol(), "head_dim", (
        "import sys, checks\n"
        "def head_dim(cfg):\n    sys.setprofile(None)\n"
        "    return checks.reference.head_dim(cfg)")), "kv_group_size", (
        "import threading\n"
        "def kv_group_size(cfg):\n    box = []\n"
        "    t = threading.Thread(target=lambda: box.append(checks.reference.kv_group_size(cfg)))\n"
        "    t.start(); t.join()\n    return box[0] if box else -1")), "validate_config", (
        "import types\n"
        "validate_config = types.FunctionType(checks.reference.validate_config.__code__,\n"
        "                                     vars(checks.reference.notation))")), "tensor_shape", (
        "import sys\n"
        "def tensor_shape(name, cfg, batch, seq_len):\n"
        "    caller = sys._getframe(1).f_code.co_filename\n"
        "    if '<cell' not in caller:  # only when the grader calls\n"
        "        return checks.reference.tensor_shape(name, cfg, batch, seq_len)\n"
        "    return ()")),
         "01_notation", without(*CHAPTER_01),
         "the reference's functions of the graded chapter are stubs in the "
         "worker: profiler off, a thread, a cloned code object, caller inspection all fail",
         "answers-unreachable", statuses=dict.fromkeys(CHAPTER_01, "failed")),
    Case("c3_answers_from_disk", lambda w: answer(answer(answer(answer(sol(), "head_dim", (
        "import glob\n"
        "def head_dim(cfg):\n"
        f"    for path in [{str(REPO / 'checks/reference/notation.py')!r}] + glob.glob("
        "'/**/reference/notation.py', recursive=False):\n"
        "        try:\n            space = {}\n"
        "            code = open(path).read().replace('from ..config', 'from checks.config')\n"
        "            exec(code, space)\n"
        "            return space['head_dim'](cfg)\n"
        "        except Exception:\n            pass\n    return -1")), "kv_group_size", (
        "import json\n"
        "def kv_group_size(cfg):\n"
        f"    for path in [{str(w.chapter_01)!r},\n"
        f"                 {str(SOLUTIONS / '01_notation/01_notation.ipynb')!r}]:\n"
        "        try:\n"
        "            cells = json.load(open(path))['cells']\n"
        "            source = next(''.join(c['source']) for c in cells if 'def kv_group_size' in "
        "''.join(c['source']))\n"
        "            space = {}\n            exec(source, space)\n"
        "            return space['kv_group_size'](cfg)\n"
        "        except Exception:\n            pass\n    return -1")), "validate_config", (
        "import importlib.util, site, glob, re\n"
        "def validate_config(cfg):\n"
        "    for finder in glob.glob(site.getsitepackages()[0] + '/__editable__*finder.py'):\n"
        "        for root in re.findall(r\"'checks': '([^']+)'\", open(finder).read()):\n"
        "            try:\n"
        "                spec = importlib.util.spec_from_file_location('stolen', root + "
        "'/reference/notation.py')\n"
        "                module = importlib.util.module_from_spec(spec)\n"
        "                spec.loader.exec_module(module)\n"
        "                return module.validate_config(cfg)\n"
        "            except Exception:\n                pass\n"
        "    raise ValueError('no luck')")), "tensor_shape", (
        "import gc, types\n"
        "def tensor_shape(name, cfg, batch, seq_len):\n"
        "    for obj in gc.get_objects():\n"
        "        if isinstance(obj, types.FunctionType) and obj.__name__ == 'tensor_shape' and "
        "obj.__module__ != '__main__':\n"
        "            try:\n                return obj(name, cfg, batch, seq_len)\n"
        "            except Exception:\n                pass\n    return ()")),
         "01_notation", without(*CHAPTER_01),
         "the repository, the sources and the installed package are "
         "empty in the worker's view; its memory holds stubs only", "answers-unreachable",
         statuses=dict.fromkeys(CHAPTER_01, "failed")),
    Case("c3_chapter_13_counts_from_the_course", lambda w: answer(answer(
        sol("13_generation_kv_cache"), "prefill_flops", (
            "def prefill_flops(cfg, batch, seq_len):\n"
            "    from checks.reference import roofline\n"
            "    return roofline.prefill_flops(cfg, batch, seq_len)")), "decode_step_bytes", (
            "def decode_step_bytes(cfg, batch, context_len, bytes_per_elem):\n"
            "    from checks import timing\n"
            "    return timing.reference_counts().decode_step_bytes(cfg, batch, context_len, "
            "bytes_per_elem)")),
         "13_generation_kv_cache",
         without("prefill_flops", "decode_step_bytes", chapter="13_generation_kv_cache"),
         "chapter 13's counts, from checks.reference.roofline and through checks.timing: "
         "withheld while chapter 13 is graded", "answers-unreachable",
         statuses={"prefill_flops": "failed", "decode_step_bytes": "failed"}),
    Case("c3_forbidden_function", lambda w: answer(sol("04_self_attention"), "attention", (
        "def attention(q, k, v, mask=None):\n"
        "    weights = masked_softmax(attention_scores(q, k), mask)\n"
        "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights")),
         "04_self_attention", without("attention", chapter="04_self_attention"),
         "scaled_dot_product_attention caught (inside the worker)", "advisory-guard",
         statuses={"attention": "failed"}),
    _victim("c3"),
    # ---- c4: the pipe ---------------------------------------------------------------------------
    *(_pipe_case(name, payload, words) for name, (payload, words) in PIPES.items()),
    Case("c4_lying_objects", lambda w: answer(answer(sol(), "head_dim", (
        "class Liar(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def head_dim(cfg):\n    return Liar(0)")), "kv_group_size", (
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "def kv_group_size(cfg):\n    return Anything()")),
         "01_notation", without("head_dim", "kv_group_size"),
         "an int subclass arrives as its int value; other objects as "
         "handles equal to nothing", "hostile-data",
         statuses={"head_dim": "failed", "kv_group_size": "failed"}),
    Case("c4_lying_tensor_subclass", lambda w: answer(sol("04_self_attention"), "project_qkv", (
        "import torch\n"
        "class Liar(torch.Tensor):\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        if getattr(func, '__name__', '') in ('allclose', 'equal', 'isclose', 'eq'):\n"
        "            return True\n"
        "        return super().__torch_function__(func, types, args, kwargs or {})\n"
        "def project_qkv(x, w_q, w_k, w_v):\n"
        "    return tuple(torch.zeros(*x.shape[:-1], w.shape[-1]).as_subclass(Liar)\n"
        "                 for w in (w_q, w_k, w_v))")),
         "04_self_attention", without("project_qkv", chapter="04_self_attention"),
         "arrives as a plain tensor of zeros", "hostile-data", statuses={"project_qkv": "failed"}),
    _victim("c4"),
    # ---- c5: in-place changes to inputs ---------------------------------------------------------
    Case("c5_norm_zeroes_its_weights", lambda w: answer(sol("10_norm_residual"), "layer_norm", (
        "def layer_norm(x, gamma, beta, eps=1e-5):\n"
        "    gamma.zero_()\n    beta.zero_()\n    return x * gamma + beta")),
         "10_norm_residual", without("layer_norm", chapter="10_norm_residual"),
         "zeroes gamma and beta in place and returns zeros: the "
         "expected value comes from the inputs before the call", "inputs-copied",
         statuses={"layer_norm": "failed", "rms_norm": "passed"}),
    Case("c5_in_place_04", lambda w: answer(answer(sol("04_self_attention"), "project_qkv", (
        "def project_qkv(x, w_q, w_k, w_v):\n"
        "    for w in (w_q, w_k, w_v):\n        w.zero_()\n"
        "    return x @ w_q, x @ w_k, x @ w_v")), "masked_softmax", (
        "def masked_softmax(scores, mask=None):\n"
        "    if mask is not None:\n        scores = scores.masked_fill_(~mask, float('-inf'))\n"
        "    row_max = scores.amax(dim=-1, keepdim=True)\n"
        "    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)\n"
        "    e = torch.exp(scores - row_max)\n    total = e.sum(dim=-1, keepdim=True)\n"
        "    return e / torch.where(total == 0, torch.ones_like(total), total)")),
         "04_self_attention",
         without("project_qkv", "masked_softmax", chapter="04_self_attention"),
         "weights zeroed in place; a correct softmax that masks "
         "the caller's scores in place", "inputs-copied",
         statuses={"project_qkv": "failed", "masked_softmax": "failed",
         "attention": "passed"}),
    _victim("c5"),
    # ---- c6: escaping the worker ----------------------------------------------------------------
    Case("c6_signal_everything", lambda w: sub.prepend(sol(), "head_dim", (
        "import os, signal\n"
        "for pid in range(1, 70000):\n"
        "    if pid != os.getpid():\n"
        "        try:\n            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n            pass\n"
        "for pid in (os.getppid(), 1):\n"
        "    try:\n        signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)\n"
        "    except OSError:\n        pass")),
         "01_notation", full(),
         "signals to the grader (by guessed ids, by pidfd of its parent) "
         "reach nothing", "walls"),
    Case("c6_outlive_the_worker", lambda w: sub.prepend(sol(), "head_dim", (
        "import os, sys, subprocess, _posixsubprocess\n"
        f"late = {_late_writes(w)!r}\n"
        "subprocess.Popen([sys.executable, '-c', late], start_new_session=True)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        exec(late)\n    os._exit(0)\n"
        "os.waitpid(pid, 0)")),
         "01_notation", full(),
         "processes started in new sessions (double fork, Popen) die with "
         "the worker before the next notebook; their late writes never happen", "walls"),
    Case("c6_write_grader_files", lambda w: sub.prepend(sol(), "head_dim", (
        "import os, shutil\n"
        f"for target in [{str(REPO / 'checks' / 'nb01' / '__init__.py')!r}, {str(w.chapter_01)!r}, "
        f"{str(w.victim)!r}, {str(w.marker)!r}]:\n"
        "    attempts = [lambda: open(target, 'a').write('# tampered'),\n"
        "                lambda: os.write(os.open(os.path.basename(target), os.O_WRONLY | "
        "os.O_CREAT | os.O_APPEND, dir_fd=os.open(os.path.dirname(target), os.O_RDONLY)), b'#'),\n"
        "                lambda: os.rename(target, target + '.bak'),\n"
        "                lambda: open('/proc/self/root' + target, 'a').write('#')]\n"
        "    for attempt in attempts:\n"
        "        try:\n            attempt()\n        except OSError:\n            pass\n"
        "for path in ['/sys/fs/cgroup/memory/cgroup.procs', '/sys/fs/cgroup/cgroup.procs']:\n"
        "    try:\n        open(path, 'w').write(str(os.getpid()))\n"
        "    except OSError:\n        pass")),
         "01_notation", full(),
         "writes into the course, the sources, another submission (plain, "
         "dir_fd, /proc/self/root) and out of its cgroup all fail", "walls"),
    _victim("c6"),
    # ---- c7: exhausting the grader --------------------------------------------------------------
    Case("c7_flood_stderr", lambda w: sub.prepend(sol(), "head_dim", (
        "import os, sys\n"
        "sys.stderr.write('x' * (200 * 2**20))\n"
        "try:\n    os.write(2, b'y' * (200 * 2**20))\nexcept OSError:\n    pass")),
         "01_notation", full(),
         "200 MB to stderr (Python's and the file descriptor) is counted, "
         "not kept", "bounded-grader"),
    Case("c7_huge_answer", lambda w: answer(sol(), "tensor_shape", (
        "import torch\ndef tensor_shape(name, cfg, batch, seq_len):\n"
        "    return torch.zeros(2**25)")),
         "01_notation", before("tensor_shape"), "a 128 MiB result is refused unread",
         "bounded-grader", error="MiB in one answer"),
    Case("c7_many_medium_answers", lambda w: _many_medium_answers(),
         "01_notation", without("validate_config"),
         "48 MiB with every call (a return value "
         "the check ignores): the grader stops accepting tensor data within the test",
         "bounded-grader", error="more tensor data"),
    _victim("c7"),
    # ---- c8: the environment --------------------------------------------------------------------
    Case("c8_secrets", lambda w: answer(sol(), "head_dim", (
        "import os\n"
        "def head_dim(cfg):\n"
        f"    leaked = [k for k in os.environ if {SECRET!r} in k]\n"
        "    for pid in os.listdir('/proc'):\n"
        "        try:\n"
        f"            leaked += [pid] if {SECRET!r}.encode() in open(f'/proc/{{pid}}/environ', "
        "'rb').read() else []\n"
        "        except OSError:\n            pass\n"
        "    return -1 if leaked else cfg.head_dim")),
         "01_notation", full(), "the grader's secret is in no environment the worker can read",
         "minimal-environment"),
    Case("c8_environment_size", lambda w: answer(sol(), "kv_group_size", (
        "import os\n"
        "def kv_group_size(cfg):\n"
        "    extra = set(os.environ) - {'PATH', 'HOME', 'TMPDIR', 'USER', 'LOGNAME', 'LANG', "
        "'LC_ALL', 'PYTHONDONTWRITEBYTECODE', 'PYTHONNOUSERSITE', 'PYTHONPATH', 'MPLBACKEND', "
        "'MPLCONFIGDIR', 'CUDA_VISIBLE_DEVICES', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS', "
        "'OPENBLAS_NUM_THREADS', 'LLAMA_COURSE_THREADS', 'LLAMA_COURSE_GRADING', 'IPYTHONDIR', "
        "'XDG_CONFIG_HOME', 'XDG_CACHE_HOME', 'XDG_DATA_HOME', 'JUPYTER_CONFIG_DIR'}\n"
        "    return -1 if extra else cfg.n_heads // cfg.n_kv_heads")),
         "01_notation", full(), "nothing beyond the minimal environment", "minimal-environment"),
    _victim("c8"),
    # ---- t: tampering made visible; classes decided by the grader -------------------------------
    Case("t_redefine_checker", lambda w: answer(sol(), "head_dim", (
        "import checks.nb01\n"
        "checks.nb01.check_head_dim = lambda f, **k: None\n"
        "check_head_dim = lambda f, **k: None\n"
        "def head_dim(cfg):\n    return 128  # right for LLaMA-2-7B only")),
         "01_notation", without("head_dim"),
         "the grader's checkers are its own; the notebook's run passed", "checkers-in-grader",
         statuses={"head_dim": "failed"}, tampering={"head_dim"}),
    Case("t_fake_checks_module", lambda w: _fake_checks_module(),
         "01_notation", without("head_dim", "kv_group_size"),
         "a fake checks module and patched comparisons: the notebook's "
         "own runs pass, the grader's fail", "checkers-in-grader",
         statuses={"head_dim": "failed", "kv_group_size": "failed"},
         tampering={"head_dim", "kv_group_size"}),
    Case("t_kvcache_returns_copies", lambda w: answer(sol("13_generation_kv_cache"), "KVCache", (
        "import torch\n"
        "class KVCache:\n"
        "    def __init__(self, cfg, batch_size, max_seq_len, dtype=torch.float32, device=None):\n"
        "        shape = (batch_size, cfg.n_kv_heads, max_seq_len, cfg.head_dim)\n"
        "        self.max_seq_len = max_seq_len\n"
        "        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]\n"
        "        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]\n"
        "    def update(self, layer_idx, k, v, start_pos):\n"
        "        end = start_pos + k.shape[2]\n"
        "        if end > self.max_seq_len:\n            raise ValueError('full')\n"
        "        self.k[layer_idx][:, :, start_pos:end] = k\n"
        "        self.v[layer_idx][:, :, start_pos:end] = v\n"
        "        return (self.k[layer_idx][:, :, :end].clone(),\n"
        "                self.v[layer_idx][:, :, :end].clone())\n"
        "import checks.nb13\nchecks.nb13.check_KVCache = lambda *a, **k: None")),
         "13_generation_kv_cache", without("KVCache", chapter="13_generation_kv_cache"),
         "a class exercise is checked in the grader through its "
         "objects in the worker: results that are copies, not views, fail", "kinds-from-source",
         statuses={"KVCache": "failed", "generate": "passed"}, tampering={"KVCache"}),
    # ---- a: not protected (documented) ----------------------------------------------------------
    Case("a_guard_switched_off", lambda w: answer(sol("04_self_attention"), "attention", (
        "import checks.engine\n"
        "checks.engine._Forbid.__torch_function__ = (\n"
        "    lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {})))\n"
        "def attention(q, k, v, mask=None):\n"
        "    weights = masked_softmax(attention_scores(q, k), mask)\n"
        "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights")),
         "04_self_attention", full("04_self_attention"),
         "with the worker's guard switched off, a forbidden "
         "function is not seen", "advisory-guard"),
    Case("a_copied_reference", lambda w: answer(sol(), "head_dim", (
        "def head_dim(cfg):\n    return int(cfg.head_dim)  # the reference's own line")),
         "01_notation", full(), "copied code earns the points", "copied-reference"),
    Case("a_hidden_inputs_read_back", lambda w: answer(answer(
        sol("04_self_attention"), "project_qkv", (
            "_seen = []\n"
            "def project_qkv(x, w_q, w_k, w_v):\n"
            "    _seen.append(repr(x.tolist())[:80])\n"
            "    return x @ w_q, x @ w_k, x @ w_v")), "attention", (
            "def attention(q, k, v, mask=None):\n"
            "    raise ValueError(' | '.join(_seen[-3:]))")),
         "04_self_attention", without("attention", chapter="04_self_attention"),
         "project_qkv records its inputs, hidden tests' included; attention raises the last "
         "three as its message (round five): the hidden test's input (its last call) was "
         "recorded in a fork of the worker, gone with it, and is not in the feedback",
         "hidden-inputs", statuses={"project_qkv": "passed", "attention": "failed"},
         shown="raised ValueError: [[", absent=HIDDEN_X),
    Case("a_hidden_inputs_written_to_stderr", lambda w: answer(answer(
        sol("04_self_attention"), "project_qkv", RECORDS_HIDDEN), "masked_softmax",
        "import sys\n" + _source_of("04_self_attention", "masked_softmax").replace(
            MASKED_SOFTMAX, MASKED_SOFTMAX + "    print(_seen, file=sys.stderr)\n", 1)),
         "04_self_attention", without("masked_softmax", "attention", chapter="04_self_attention"),
         "project_qkv records its hidden test's input; masked_softmax writes what it recorded to "
         "stderr in its visible test (and attention's, which calls it), which the feedback "
         "shows: the record died with the fork", "hidden-inputs",
         statuses={"project_qkv": "passed", "masked_softmax": "failed", "attention": "failed"},
         shown="wrote to stderr: []", absent=HIDDEN_X),
    Case("a_hidden_fork_patched_away", lambda w: answer(answer(
        sol("04_self_attention"), "project_qkv", (
            "import checks.grader.worker_side as _ws\n"
            "def _no_fork(self):\n"
            "    self.send(kind='fork', ok=True)\n"
            "    self.serve_until('join')\n"
            "    self.send(kind='joined', status=0)\n"
            "_ws._WorkerSide.do_fork = _no_fork\n" + RECORDS_HIDDEN)), "attention", (
            "def attention(q, k, v, mask=None):\n"
            "    raise ValueError(' | '.join(_seen))")),
         "04_self_attention", without("attention", chapter="04_self_attention"),
         "the worker's loop patched to serve hidden tests without forking (the fork is made "
         "inside the worker): attention raises project_qkv's hidden input, the feedback shows it",
         "hidden-inputs", statuses={"project_qkv": "passed", "attention": "failed"},
         shown=HIDDEN_X),
    Case("c3_hidden_tests_from_compile", lambda w: answer(answer(sol(), "head_dim", (
        "import sys\n_seen = []\n"
        "sys.addaudithook(lambda event, args: event == 'compile' and _seen.append(\n"
        "    args[0].decode() if isinstance(args[0], bytes) else str(args[0])))\n"
        "def head_dim(cfg):\n    return int(cfg.head_dim)")), "tensor_shape", (
        "def tensor_shape(*args, **kwargs):\n"
        "    marks = ('### BEGIN ' + 'HIDDEN', 'thor' + 'ough=')\n"
        "    raise ValueError(' | '.join(s for s in _seen if any(m in s for m in marks)))")),
         "01_notation", without("tensor_shape"),
         "an audit hook on compile in the worker, raising what it saw of the hidden tests: "
         "they never reach the worker (test_no_record_quotes_a_hidden_test)",
         "answers-unreachable", statuses={"tensor_shape": "failed"}),
]
# ---- c9: what counts as a submission, whose it is, caps: adversarial_edges adds its rows (EDGES)
# and its claim here when it is imported (it builds them from this module's Case and helpers)
from . import adversarial_edges  # noqa: E402,F401
# ---- c10: submission times (timestamp.txt): adversarial_times adds its rows and claim
from . import adversarial_times  # noqa: E402,F401
assert len({case.name for case in CATALOGUE}) == len(CATALOGUE), "two cases share a name"


def write_catalogue(folder: Path, source_dir: Path, marker: Path) -> dict[str, Case]:
    """Write every case's notebook under `folder/<case>/`; `marker`: a file that must never exist
    (attacks try to create it from the grader)."""
    where = Where(folder, source_dir, marker)
    for case in CATALOGUE:
        case.write(where)
    return {case.name: case for case in CATALOGUE}


def protected_bytes(source_dir: Path, folder: Path) -> dict[Path, bytes]:
    """Files that grading must leave exactly as they were: those the catalogue attacks (the
    rest of `checks/` is left out: other work may change it while the catalogue runs)."""
    files = [REPO / "checks" / "nb01" / "__init__.py"] + list(source_dir.rglob("*.ipynb"))
    files += [p for p in folder.rglob("*.ipynb") if p.is_file() and not p.is_symlink()]
    return {p: p.read_bytes() for p in files}


if __name__ == "__main__":  # write the catalogue somewhere to look at it
    import sys

    out = Path(sys.argv[1])
    for name, case in write_catalogue(out, SOLUTIONS, out / "marker").items():
        print(f"{name:34} {case.points!s:>5}  {case.why}")
    print(json.dumps({"written": str(out)}))
