"""Use the learner's own functions from earlier chapters, or the course's reference.

Later chapters build on earlier ones: chapter 11's block needs chapter 10's `rms_norm`, chapter
08's `apply_rope`, chapter 06's `grouped_query_attention` and more. This module takes each of those
from the learner's own notebook of that chapter when it passes that chapter's check, and from
`checks.reference` otherwise, so the later chapter always runs and is the learner's own wherever it
can be.

For a chapter's import cell: `own_functions`
--------------------------------------------

    from checks.borrow import own_functions

    (rms_norm, apply_rope, grouped_query_attention) = own_functions({
        "rms_norm": "10_norm_residual",
        "apply_rope": "08_rope",
        "grouped_query_attention": "06_gqa_mqa",
    })

It maps each function name to the chapter that teaches it (the chapter's folder name, or just its
number, "08") and returns a `Borrowed`: a namespace (`borrowed.apply_rope`) that also unpacks in
the order asked, as above. It prints exactly one line saying whose each function is, e.g.

    Yours: rms_norm (10), apply_rope (08) · the course's reference: swiglu_ffn (09: not started)

Reasons shown: "not started", "check failed", "no notebook", "unreadable notebook", "no answer
cell", "syntax error", "cell raised <Error>", "not defined" (the cell defines no such function),
"checking raised <Error>", "no checks" (no `checks.nbNN` for that chapter), "no gradients".
Names that share a chapter and a reason are listed together. `borrowed.whose[name]` is "yours"
or "reference" and `borrowed.why[name]` the longer reason, for tests and curious learners
(`borrowed.mistakes[name]`: the mistake's id where gradients do not flow through it, else None).

Chapter 14 trains through what the chapters borrow, so a function the course can probe
(`checks.gradients.PROBED`: `model_forward`, `decoder_block`, `rms_norm`, `apply_rope`, ...) is
yours only when gradients flow through it too: one forward and backward pass on tiny inputs, every
input and parameter with a finite, non-zero gradient, and no function of yours under it running
with gradients off or dropping them. When not, "no gradients", and one more line names the
function at fault, its chapter and the cause (`torch.no_grad()`, `.detach()`, `.data`,
`torch.tensor(...)`, a change in place): "Not for training: `apply_rope` (chapter 08) runs with
gradient tracking off (`torch.no_grad()`): ...". Its id is chapter 14's
(`14.train_step.borrowed_without_gradients`, ...: checks.gradients.BORROWED).

Under a grader (`checks.context.grading()`: `python -m checks status|grade`, nbgrader, the test
suite) every function is the reference and the line says so: grading one chapter never reads or
depends on the learner's other notebooks. `own_or_reference` follows the same rule.

For one function, with a custom check: `own_or_reference`
---------------------------------------------------------

    attention = own_or_reference("04_self_attention", "attention")

The same choice for one function, with an optional `checker` and `fallback`; it prints one line.

Where the notebooks are, and what runs
--------------------------------------

Jupyter runs a notebook in its own folder, so the earlier chapter's notebook is found next to the
current one: `../08_rope/08_rope.ipynb`. Elsewhere, `root=` or `$LLAMA_COURSE_NOTEBOOKS` names the
folder that holds them (in Colab, a Drive folder such as `/content/drive/MyDrive/Colab Notebooks`),
as chapter folders (`08_rope/08_rope.ipynb`) or as files side by side (`08_rope.ipynb`, or Colab's
`Copy of 08_rope.ipynb`; the newest such copy counts). A notebook opened by itself (Colab, a
download) finds none of them: the line then says so in one sentence, that the course's reference
stands in, and how to point it at yours. The notebook is read as last saved. Its code cells run
in a fresh namespace, in order, up to its last answer cell, with all output swallowed:

- answer cells (nbgrader `solution`) run whole; one that raises is skipped and reported if it is
  the one asked for (a later answer may not need it: the check decides);
- test cells (nbgrader `grade`) never run;
- every other cell contributes only its top-level imports, function definitions and borrowing
  statements (calls to `own_functions` / `own_or_reference`), each on its own, failures skipped;
  its demonstrations, figures and timings never run. (Import cells also hold statements such as
  `_ = torch.manual_seed(0)`; that must not cost the cell its imports.) IPython magics are
  ignored.

Borrowing nests: chapter 12 borrowing chapter 11's `decoder_block` runs chapter 11's import cell,
which borrows chapter 10's `rms_norm` and the others from the same folder, so the learner's
model is built from their own pieces all the way down.

Each function is then checked with `checks.nbNN.check_<name>` (quietly; an unfinished function,
one that raises `NotImplementedError`, never counts as passing). Notebooks and decisions are cached
per process, keyed by the notebook's path, size and modification time: asking again is free, and
saving the earlier notebook (or one it borrows from) makes the next call read it afresh.

Writing a chapter that borrows: list every earlier function the chapter's answers and
demonstrations use, each with the chapter that grades it (it needs a `check_<name>` there and a
`checks.reference.<name>`), unpack in the dict's order, and say in the markdown below the import
cell that the printed line tells whose each one is. Its self-checks must not depend on whose they
are (they compare with the reference block, model, ...), and the solutions must pass either way.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import contextvars
import functools
import io
import json
import linecache
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import reference
from .context import grading
from .environment import NOTEBOOKS_ENV
from .engine import CheckFailure, NotStarted, quiet
from .exercises import checks_module
from .i18n import N_, _

BORROWING_CALLS = frozenset({"own_functions", "own_or_reference"})

# While a notebook is being loaded: the folder that holds its chapter folders (where the borrowing
# statements inside it look), and the notebooks being loaded (to stop a circle of borrowing).
_current_root: contextvars.ContextVar[Path | None] = contextvars.ContextVar("borrow_root",
                                                                            default=None)
_loading: contextvars.ContextVar[tuple[tuple[str, set], ...]] = contextvars.ContextVar(
    "borrow_loading", default=())


class _Unavailable(Exception):
    """The learner's function cannot be used. `short` fits the one-line summary; the message
    says more. Both are message ids (English, with `{placeholders}` filled from `values`): the
    exception's own text and `short` stay English (they are recorded and compared), `shown()`
    and `shown_short()` are in the language of the moment (a cached verdict may be shown in
    another language later)."""

    def __init__(self, short: str, detail: str | None = None, **values):
        self._short, self._detail, self._values = short, detail or short, values
        self.short = short.format(**values)
        super().__init__(self._detail.format(**values))

    def shown_short(self) -> str:
        return _(self._short).format(**self._values)

    def shown(self) -> str:
        return _(self._detail).format(**self._values)


# --------------------------------------------------------------------------------------------
# The two entry points


class Borrowed:
    """The chosen functions, by name (`borrowed.rms_norm`, `borrowed["rms_norm"]`), unpacking in
    the order asked.

    `whose[name]` is "yours" or "reference"; `why[name]` says why the reference is used ("" for
    yours); `line` is the summary line that was printed."""

    def __init__(self, chosen: dict[str, Callable], whose: dict[str, str], why: dict[str, str],
                 line: str, mistakes: dict[str, str | None] | None = None):
        self.functions = chosen
        self.whose = whose
        self.why = why
        self.line = line
        # the mistake id where gradients do not flow ("14.train_step.borrowed_cuts_gradients")
        self.mistakes = mistakes or dict.fromkeys(chosen)

    def __getattr__(self, name: str) -> Callable:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"nothing borrowed under the name {name!r}")

    def __getitem__(self, name: str) -> Callable:
        return self.functions[name]

    def __iter__(self) -> Iterator[Callable]:
        return iter(self.functions.values())

    def __len__(self) -> int:
        return len(self.functions)

    def __repr__(self) -> str:
        return self.line


def own_functions(wanted: Mapping[str, str], *, root: str | os.PathLike | None = None) -> Borrowed:
    """For each `name: chapter` in `wanted`, the learner's `name` from that chapter's notebook
    if it passes `checks.nbNN.check_<name>`, else `checks.reference.<name>`; prints one line
    saying whose each one is. Under a grader: always the reference. Never raises on the
    learner's side; a name without a reference (a bug in the course) raises LookupError."""
    fallbacks = {name: _reference(name) for name in wanted}
    if grading():
        listed = ", ".join(f"{name} ({_chapter_number(ch)})" for name, ch in wanted.items())
        line = _("Graded run: the course's reference for {names} (grading never depends on "
                 "your other notebooks).").format(names=listed)
        print(line)
        return Borrowed(fallbacks, dict.fromkeys(wanted, "reference"),
                        dict.fromkeys(wanted, "graded run"), line)
    chosen, whose, why, shown, alone_ones, untrainable = {}, {}, {}, [], set(), []
    mistakes: dict[str, str | None] = dict.fromkeys(wanted)
    for name, chapter in wanted.items():
        try:
            chosen[name] = _own_if_passing(chapter, name, root, checker=None)
            whose[name], why[name], short = "yours", "", None
        except _Unavailable as exc:
            chosen[name] = fallbacks[name]
            whose[name], why[name], short = "reference", str(exc), exc.shown_short()
            if exc.short == "no notebook":
                alone_ones.add(name)
            if exc.short == _NO_GRADIENTS:
                untrainable.append(exc.shown())
                mistakes[name] = exc.mistake_id
        shown.append((name, _chapter_number(chapter), short))
    alone = len(alone_ones) == len(shown)
    line = _alone_line(shown, root) if alone else _summary_line(shown)
    print(line)
    for text in dict.fromkeys(untrainable):   # one line per cause, said once
        print(_("Not for training: {why}").format(why=text))
    return Borrowed(chosen, whose, why, line, mistakes)


def own_or_reference(chapter: str, name: str, *, root: str | os.PathLike | None = None,
                     checker: Callable | None = None,
                     fallback: Callable | None = None) -> Callable:
    """The learner's `name` from chapter `chapter` if it passes its check, else the reference.

    chapter:  the earlier chapter's folder, e.g. "04_self_attention" (or just "04").
    name:     the exercise: the answer cell's grade_id and the function it defines.
    root:     the folder holding the chapter folders (default: the parent of the working
              directory, which is the course folder when run from a notebook).
    checker:  the check to pass (default: `checks.nbNN.check_<name>`).
    fallback: what to use otherwise (default: `checks.reference.<name>`).

    Prints one line saying which implementation is used. Under a grader: always the fallback.
    Any failure on the learner's side (no notebook, no such cell, a syntax error, an exception,
    a failed check) falls back; only a missing reference (a bug in the course) raises.
    """
    if fallback is None:
        fallback = _reference(name)
    if grading():
        print(_("Using the course's reference `{name}` (graded run: grading never depends on "
                "your other notebooks).").format(name=name))
        return fallback
    try:
        fn = _own_if_passing(chapter, name, root, checker=checker)
    except _Unavailable as why:
        print(_("Using the course's reference `{name}` ({why}).").format(name=name,
                                                                         why=why.shown()))
        return fallback
    print(_("Using your own `{name}`.").format(name=name))
    return fn


# --------------------------------------------------------------------------------------------
# Choosing: load, then check (both cached)


def _reference(name: str) -> Callable:
    fn = getattr(reference, name, None)
    if fn is None:
        raise LookupError(f"checks.reference has no `{name}` to fall back on")
    return fn


def _own_if_passing(chapter: str, name: str, root, *, checker: Callable | None) -> Callable:
    """The learner's function if it passes; raises _Unavailable saying why not."""
    if checker is None:
        checker = _checker(chapter, name)
    notebook = _notebook(_notebook_path(chapter, root))
    key = (name, checker)
    if key not in notebook.verdicts:
        notebook.verdicts[key] = _verdict(notebook, name, checker)
    fn, problem = notebook.verdicts[key]
    if problem is not None:
        raise problem
    return fn


def _verdict(notebook: "_Notebook", name: str, checker: Callable):
    try:
        fn = notebook.function(name)
        try:
            _passes(fn, checker)
        except _Unavailable as failed:
            if failed.short == "check failed":
                _trains(fn, name)          # gradients that do not flow say more, and where
            raise
        _trains(fn, name)
    except _Unavailable as problem:
        return None, problem
    return fn, None


class _CutShown:
    """A `checks.gradients.Cut` as a message value: told in the language of the moment."""

    def __init__(self, cut):
        self.cut = cut

    def __format__(self, spec: str) -> str:
        return format(self.cut.detail(), spec)


def _trains(fn: Callable, name: str) -> None:
    """Raise _Unavailable when gradients do not flow through `fn` (chapter 14 trains through
    the functions the later chapters borrow: checks.gradients.PROBED), naming the function at
    fault, its chapter and the cause. A function that fails on the probe's own tiny inputs is
    left to its check, which it passed."""
    from . import gradients

    if name not in gradients.PROBED or isinstance(fn, type):
        return
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cut = gradients.probe(name, fn)
    except Exception:  # noqa: BLE001 - a learner's function may fail in any way
        return
    if cut is not None:
        mistake = gradients.borrowed_mistake(cut)
        problem = _Unavailable(_NO_GRADIENTS, mistake, cause=_CutShown(cut))
        problem.mistake_id = f"14.train_step.{mistake.key}"   # registered by chapter 14
        raise problem


_NO_GRADIENTS = N_("no gradients")


def _passes(fn: Callable, checker: Callable) -> None:
    """Raise _Unavailable unless `fn` passes `checker`. Whatever the check prints stays hidden;
    a function that raised NotImplementedError anywhere during the check is "not started", even
    if the check itself only showed that (as in JupyterLab, where it does not raise)."""
    seen = {"not_implemented": False}

    @functools.wraps(fn)
    def watched(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            seen["not_implemented"] = True
            raise

    candidate = fn if isinstance(fn, type) else watched  # a class is checked as it is
    try:
        with quiet(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            checker(candidate)
    except NotStarted:
        raise _Unavailable(_NOT_STARTED, _NOT_STARTED_YET) from None
    except CheckFailure as exc:
        if seen["not_implemented"]:
            raise _Unavailable(_NOT_STARTED, _NOT_STARTED_YET) from None
        raise _Unavailable(N_("check failed"), N_("yours does not pass its check yet: {why}"),
                           why=_short(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a bug in checking: still never stop the notebook
        raise _Unavailable(N_("checking raised {error}"),
                           N_("checking yours raised {error}: {why}"),
                           error=type(exc).__name__, why=_short(exc)) from None
    if seen["not_implemented"]:
        raise _Unavailable(_NOT_STARTED, _NOT_STARTED_YET)


_NOT_STARTED = N_("not started")
_NOT_STARTED_YET = N_("yours is not started yet")


def _checker(chapter: str, name: str) -> Callable:
    number = _chapter_number(chapter)
    if not number.isdigit():
        raise _Unavailable(N_("unknown chapter"),
                           N_("cannot tell the chapter number from {chapter}"),
                           chapter=repr(chapter))
    try:
        module = checks_module(number)
    except Exception:  # noqa: BLE001 - missing, or broken while being written
        raise _Unavailable(N_("no checks"), N_("the checks of chapter {number} are not "
                                               "available"), number=number) from None
    check = getattr(module, f"check_{name}", None)
    if check is None:
        raise _Unavailable(N_("no check"), N_("chapter {number} has no check for `{name}`"),
                           number=number, name=name)
    return check


def _alone_line(shown: list[tuple[str, str, str | None]], root) -> str:
    """None of the earlier notebooks is there: one sentence that says so, that the reference
    stands in, and how to point borrowing at the learner's own notebooks."""
    numbers = list(dict.fromkeys(number for _name, number, _short in shown))
    names = ", ".join(name for name, _number, _short in shown)
    text = (_("Your notebooks of chapters {numbers} are not {where}: the course's reference "
              "stands in for {names}. To use yours, point {variable} at the folder that holds "
              "them (in Colab, a Drive folder such as /content/drive/MyDrive/Colab Notebooks) "
              "or pass root=... to own_functions.") if len(numbers) > 1 else
            _("Your notebooks of chapter {numbers} are not {where}: the course's reference "
              "stands in for {names}. To use yours, point {variable} at the folder that holds "
              "them (in Colab, a Drive folder such as /content/drive/MyDrive/Colab Notebooks) "
              "or pass root=... to own_functions."))
    return text.format(numbers=", ".join(numbers), where=_where(root), names=names,
                       variable=NOTEBOOKS_ENV)


def _where(root) -> str:
    """Where borrowing looked, in words: 'beside this one', or 'in FOLDER (what chose it)'."""
    bases, how = _search_bases(root)
    return _("beside this one") if how == "default" else _("in {folder} ({how})").format(
        folder=bases[0], how=_(how))


def _summary_line(shown: list[tuple[str, str, str | None]]) -> str:
    """'Yours: a (10), b (08) · the course's reference: c, d (05: not started)'."""
    yours = [f"{name} ({number})" for name, number, short in shown if short is None]
    theirs: list[tuple[list[str], str]] = []  # consecutive names that share chapter and reason
    for name, number, short in shown:
        if short is None:
            continue
        reason = f"{number}: {short}"
        if theirs and theirs[-1][1] == reason:
            theirs[-1][0].append(name)
        else:
            theirs.append(([name], reason))
    parts = []
    if yours:
        parts.append(_("Yours: {names}").format(names=", ".join(yours)))
    if theirs:
        parts.append(_("the course's reference: {names}").format(names=", ".join(
            f"{', '.join(names)} ({reason})" for names, reason in theirs)))
    line = " · ".join(parts) or _("No functions borrowed.")
    return line[0].upper() + line[1:]


# --------------------------------------------------------------------------------------------
# Finding and reading a notebook


def _chapter_number(chapter: str) -> str:
    return str(chapter)[:2]


def _search_bases(root) -> tuple[list[Path], str]:
    """The folders that may hold the learner's notebooks, and what chose them: `root=`, the
    folder of the notebook being borrowed from (nested borrowing), $LLAMA_COURSE_NOTEBOOKS, else
    the parent of the working directory (Jupyter runs a notebook in its own chapter folder) and
    the working directory itself (notebooks side by side, as in Colab's /content)."""
    if root is not None:
        return [Path(root).expanduser()], "root="
    nested = _current_root.get()
    if nested is not None:
        return [nested], N_("the borrowing notebook's folder")
    configured = os.environ.get(NOTEBOOKS_ENV, "").strip()
    if configured:
        return [Path(configured).expanduser()], NOTEBOOKS_ENV
    return [Path.cwd().parent, Path.cwd()], "default"


def _notebook_path(chapter: str, root) -> Path:
    """The chapter's notebook in the search folder: its chapter folder (`08_rope/08_rope.ipynb`),
    else a file side by side (`08_rope.ipynb`, else the newest copy: Colab's
    `Copy of 08_rope.ipynb`).
    `chapter` is a folder name or just its number ("08")."""
    bases, _how = _search_bases(root)
    if "_" in chapter:
        named = re.compile(rf"(.*\s)?{re.escape(chapter)}")
    else:  # "04": the one chapter 04_* there
        named = re.compile(rf"(.*\s)?{re.escape(chapter)}_\w+")
    for base in bases:
        try:
            in_folders = sorted(p for p in base.glob(f"{chapter.split('_')[0]}_*/*.ipynb")
                                if p.stem == p.parent.name and named.fullmatch(p.stem))
            side_by_side = sorted((p for p in base.glob("*.ipynb") if named.fullmatch(p.stem)),
                                  key=lambda p: (named.fullmatch(p.stem).group(1) is not None,
                                                 -p.stat().st_mtime))   # its own name first
        except OSError:
            continue
        if in_folders or side_by_side:
            return (in_folders + side_by_side)[0]
    raise _Unavailable(N_("no notebook"), N_("no notebook of chapter {chapter} {where}; "
                                             "{variable} can name the folder of yours"),
                       chapter=chapter, where=_where(root), variable=NOTEBOOKS_ENV)


def _file_state(path: Path) -> tuple:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@dataclass
class _Notebook:
    """What a notebook's answer cells defined: each function as its own cell left it.

    `files` are the (path, size, mtime) of this notebook and of every notebook its borrowing
    statements read: when any of them changes, the notebook is run again. `verdicts` caches each
    function's check result."""

    name: str
    files: set[tuple] = field(default_factory=set)
    functions: dict[str, Callable] = field(default_factory=dict)
    problems: dict[str, _Unavailable] = field(default_factory=dict)
    verdicts: dict[tuple, tuple] = field(default_factory=dict)

    def up_to_date(self) -> bool:
        try:
            return all(_file_state(Path(path)) == (path, size, mtime)
                       for path, size, mtime in self.files)
        except OSError:
            return False

    def function(self, name: str) -> Callable:
        if name in self.problems:
            raise self.problems[name]
        if name not in self.functions:
            raise _Unavailable(N_("no answer cell"),
                               N_("{notebook} has no answer cell `{name}`"),
                               notebook=self.name, name=name)
        return self.functions[name]


_notebooks: dict[str, _Notebook] = {}  # by resolved path


def _notebook(path: Path) -> _Notebook:
    """The notebook's answers, run afresh if it or a notebook it borrows from has changed."""
    resolved = str(path.resolve())
    cached = _notebooks.get(resolved)
    if cached is None or not cached.up_to_date():
        if any(resolved == loading for loading, _ in _loading.get()):
            raise _Unavailable(N_("circular borrowing"),
                               N_("{notebook} borrows from itself through other chapters"),
                               notebook=path.name)
        files = {_file_state(path)}
        loading = _loading.set(_loading.get() + ((resolved, files),))
        here = _current_root.set(path.parent.parent if path.parent.name == path.stem
                                 else path.parent)
        try:
            cached = _execute(path)
        finally:
            _current_root.reset(here)
            _loading.reset(loading)
        cached.files = files
        _notebooks[resolved] = cached
    for _path, files in _loading.get():  # whoever is loading now depends on this notebook's files
        files.update(cached.files)
    return cached


def _execute(path: Path) -> _Notebook:
    """Run the notebook's cells as the module docstring says, up to its last answer cell."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = [(_source(cell), cell.get("metadata", {}).get("nbgrader") or {})
                for cell in cells if cell.get("cell_type") == "code"]
    except Exception as exc:  # noqa: BLE001 - a learner's notebook may fail in any way
        raise _Unavailable(N_("unreadable notebook"), N_("could not read {notebook}: {error}"),
                           notebook=path.name, error=type(exc).__name__) from None
    answers = [i for i, (_src, meta) in enumerate(code) if meta.get("solution")]
    result = _Notebook(path.name)
    namespace = {"__name__": f"_borrowed_{path.stem}", "__builtins__": builtins}
    for index, (source, meta) in enumerate(code[: answers[-1] + 1] if answers else []):
        if meta.get("solution"):
            _run_answer(source, meta.get("grade_id"), namespace, result, path.name)
        elif not meta.get("grade"):
            _run_definitions(source, namespace, f"{path.name}: cell {index + 1}")
    return result


def _run_answer(source: str, name: str | None, namespace: dict, result: _Notebook,
                notebook: str) -> None:
    try:
        _run(compile(source, _remembered(source, f"<{notebook}: cell {name}>"), "exec"),
             namespace)
    except SyntaxError as exc:
        result.problems[name] = _Unavailable(
            N_("syntax error"), N_("your cell `{name}` in {notebook} has a syntax error on line "
                                   "{line}"), name=name, notebook=notebook, line=exc.lineno)
        return
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a learner's notebook may fail in any way
        result.problems[name] = _Unavailable(
            N_("cell raised {error}"),
            N_("running your cell `{name}` in {notebook} raised {error}: {why}"),
            name=name, notebook=notebook, error=type(exc).__name__, why=_short(exc))
        return
    fn = namespace.get(name)
    if callable(fn):
        result.functions[name] = fn
    else:
        result.problems[name] = _Unavailable(
            N_("not defined"), N_("your cell `{name}` in {notebook} does not define `{name}`"),
            name=name, notebook=notebook)


def _run_definitions(source: str, namespace: dict, cell: str) -> None:
    """Run the cell's top-level imports, function definitions and borrowing statements, each on
    its own (one that fails is skipped); nothing else of the cell runs."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        try:
            body = ast.parse(_without_magics(source)).body
        except SyntaxError:
            return
    for node in body:
        if _is_definition(node):
            module = ast.Module(body=[node], type_ignores=[])
            with contextlib.suppress(Exception, SystemExit):
                _run(compile(module, _remembered(source, f"<{cell}>"), "exec"), namespace)


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.Expr)) and node.value is not None:
        return _borrows(node.value)
    return False


def _borrows(value: ast.expr) -> bool:
    """`own_functions(...)`, `borrow.own_or_reference(...)`, or one of those with an attribute or
    index taken (`own_functions({...}).rms_norm`)."""
    while isinstance(value, (ast.Attribute, ast.Subscript)):
        value = value.value
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return called in BORROWING_CALLS


_MAGIC = re.compile(r"^(\s*)[%!]")


def _without_magics(source: str) -> str:
    """IPython magics (`%matplotlib inline`, `!pip ...`) as `pass`, so the rest still parses."""
    return "\n".join(_MAGIC.sub(r"\1pass  # ", line) if _MAGIC.match(line) else line
                     for line in source.splitlines())


def _remembered(source: str, filename: str) -> str:
    """`filename`, with `source` kept in linecache under it: tracebacks show the learner's lines,
    and `inspect.getsource` finds a borrowed function's code (checks.gradients names the
    construct in it that stops gradients)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return filename


def _run(code, namespace: dict) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(code, namespace)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if len(text) <= 100 else text[:97] + "..."


def use_if_passing(fn: Callable, checker: Callable, fallback: Callable, *,
                   name: str | None = None) -> Callable:
    """Return `fn` if it passes `checker`, else `fallback`, saying which one is used.

    Later chapters build on earlier exercises; this lets a learner who is stuck on one exercise
    keep going with the course's reference implementation.
    """
    label = name or getattr(fn, "__name__", None) or _("your function")
    try:
        with quiet():
            checker(fn)
    except CheckFailure:
        print(_("Using the course's reference `{name}` (yours does not pass its check yet).")
              .format(name=label))
        return fallback
    except Exception as exc:  # noqa: BLE001 - never stop a notebook because checking went wrong
        print(_("Using the course's reference `{name}` (checking yours raised {error}: "
                "{text}).").format(name=label, error=type(exc).__name__, text=exc))
        return fallback
    print(_("Using your own `{name}`.").format(name=label))
    return fn

