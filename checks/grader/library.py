"""The worker's copy of `checks`, built per graded chapter from the package's layout: the core and
the chapters, never grader/ (but for the worker's own side), tools/ or the registry of mistakes.

In the copy, the graded chapter's checkers are stubs that repeat the grader's verdict
(`checks.grader.worker_side.verdict_check`), later chapters' checkers are absent, and every
`checks.reference` function or class of the graded chapter and of the later ones is withheld (a
stub that raises): neither the checkers nor the answers are in the worker's memory. Modules that
hold answers must therefore live in `checks/reference/`. `WorkerLibrary.has` tells the grader
which of its objects the worker could import (what it cannot stays in the grader when handed to
the learner's code)."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # checks/
COURSE_SOURCE = PACKAGE.parent / "solutions"  # a clone's; absent from a wheel


# What the worker may import follows from the layout: every module of the package outside
# grader/ and tools/ (the learner-facing core, the engine, the chapters' checkers, the reference
# with the graded chapter's answers withheld, the model loader), less GRADER_ONLY; of grader/, its
# worker's side only: its main loop and what that imports (the channel, the wire encoding, tensors
# across the channel, the audit hook; tests/grader/test_grading.py holds to it).
WORKER_GRADER_MODULES = ("grader/__init__.py", "grader/worker_side.py", "grader/channel.py",
                         "grader/wire.py", "grader/tensors.py", "grader/audit.py")
MAINTAINERS_AND_GRADER = ("grader", "tools")
GRADER_ONLY = ("registry.py",)  # imports every chapter's checks: the grader's own knowledge
WORKER_DATA = ("locale/*/LC_MESSAGES/*.mo",)  # copied as they are: the messages' translations
_library_plans: dict[tuple, tuple[dict[str, bytes], dict[str, set[str] | None]]] = {}


def _chapter_number(chapter: str) -> int:
    return int(chapter[:2])


def _answer_names(source_dir: Path) -> dict[str, int]:
    """Every exercise name (answer cells' grade_ids and the functions and classes they
    define) with the chapter that asks for it."""
    names: dict[str, int] = {}
    for path in sorted(Path(source_dir).glob("[0-9][0-9]_*/*.ipynb")):
        if path.stem != path.parent.name:
            continue
        number = _chapter_number(path.stem)
        for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
            meta = cell.get("metadata", {}).get("nbgrader") or {}
            if cell.get("cell_type") != "code" or not meta.get("solution"):
                continue
            found = {meta.get("grade_id")} | set(defined_names("".join(cell.get("source", ""))))
            for name in filter(None, found):
                names[name] = min(number, names.get(name, number))
    return names


def course_answers(source_dir: Path | None = None) -> dict[str, int]:
    """Which chapter asks for which function: the course's own list of exercises
    (`checks.exercises`, read from every chapter's checker module, so it is whole however few
    source notebooks a folder holds: a Gradescope zip for one chapter, a wheel with none), with
    the further names the source notebooks' answer cells define (helpers, classes) added where
    the list does not already say. An exercise's chapter is the list's, never a folder's."""
    from ..exercises import chapters

    answers = {name: int(number) for number, names in chapters().items() for name in names}
    exercises = set(answers)
    for folder in filter(None, [COURSE_SOURCE, source_dir]):
        if Path(folder).is_dir():
            for name, number in _answer_names(Path(folder)).items():
                if name not in exercises:
                    answers[name] = min(number, answers.get(name, number))
    return answers


def defined_names(source: str) -> dict[str, str]:
    """Top-level functions and classes a cell defines: {name: "function" | "class"}."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {node.name: "class" if isinstance(node, ast.ClassDef) else "function"
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _imported_from(source_dir: Path, chapter: str, module: str) -> set[str]:
    """Names the chapter's source notebook imports from `module` outside its test cells."""
    path = Path(source_dir) / chapter / f"{chapter}.ipynb"
    names: set[str] = set()
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if cell.get("cell_type") != "code" or meta.get("grade"):
            continue
        try:
            tree = ast.parse("".join(cell.get("source", "")))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                names |= {alias.name for alias in node.names}
    return names


def _top_defs(tree: ast.Module) -> dict[str, ast.stmt]:
    defs: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defs[name.id] = node
    return defs


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _withheld_reference(answers: dict[str, int], graded: int
                        ) -> tuple[dict[str, bytes], dict[str, set[str]]]:
    """checks/reference/*.py for a worker grading chapter `graded`: every function or class of
    that chapter and of the later ones replaced by a stub that raises.

    A definition's chapter: an exercise's own; a helper's, the earliest chapter whose exercise
    uses it (directly or through other helpers); a helper no exercise uses, the latest chapter
    its module serves (a module serving none counts as beyond every chapter)."""
    folder = PACKAGE / "reference"
    trees = {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py"))
             if p.stem != "__init__"}
    defs = {(m, n): node for m, tree in trees.items() for n, node in _top_defs(tree).items()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    aliases: dict[tuple[str, str], tuple[str, str]] = {}
    for m, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in trees:
                for alias in node.names:
                    aliases[(m, alias.asname or alias.name)] = (node.module, alias.name)
    uses = {}
    for (m, n), node in defs.items():
        found = set()
        for name in _names_used(node):
            target = (m, name) if (m, name) in defs else aliases.get((m, name))
            if target in defs and target != (m, n):
                found.add(target)
        uses[(m, n)] = found
    chapter: dict[tuple[str, str], int] = {key: answers[key[1]] for key in defs
                                           if key[1] in answers}
    module_last = {m: max([c for (mm, _), c in chapter.items() if mm == m], default=99)
                   for m in trees}
    for key in defs:
        if key in chapter:
            continue
        reached = [c for start, c in chapter.items() if key in _closure(start, uses)]
        chapter[key] = min(reached) if reached else module_last[key[0]]
    files: dict[str, bytes] = {}
    withheld: dict[str, set[str]] = {}
    for m, tree in trees.items():
        names = {n for (mm, n), c in chapter.items() if mm == m and c >= graded}
        withheld[f"checks.reference.{m}"] = names
        if names:
            body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) and \
                isinstance(tree.body[0].value, ast.Constant) else tree.body  # no docstring
            tree.body = [_stub(node, graded) if getattr(node, "name", None) in names else node
                         for node in body]
            files[f"reference/{m}.py"] = (ast.unparse(tree) + "\n").encode()
    return files, withheld


def _closure(start, uses) -> set:
    seen, todo = set(), [start]
    while todo:
        for nxt in uses.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _stub(node: ast.stmt, graded: int) -> ast.stmt:
    message = (f"checks.reference.{node.name} is withheld while chapter {graded:02d} is graded: "
               "the grader keeps the course's answers to itself")
    raise_ = ast.Raise(exc=ast.Call(func=ast.Name("RuntimeError", ast.Load()),
                                    args=[ast.Constant(message)], keywords=[]), cause=None)
    args = ast.arguments(posonlyargs=[], args=[], vararg=ast.arg("args"), kwonlyargs=[],
                         kw_defaults=[], kwarg=ast.arg("kwargs"), defaults=[])
    if isinstance(node, ast.ClassDef):
        init = ast.FunctionDef(name="__init__", args=ast.arguments(
            posonlyargs=[], args=[ast.arg("self")], vararg=ast.arg("args"), kwonlyargs=[],
            kw_defaults=[], kwarg=ast.arg("kwargs"), defaults=[]), body=[raise_],
            decorator_list=[], returns=None, type_comment=None)
        return ast.fix_missing_locations(ast.ClassDef(
            name=node.name, bases=[], keywords=[], body=[init], decorator_list=[]))
    return ast.fix_missing_locations(ast.FunctionDef(
        name=node.name, args=args, body=[raise_], decorator_list=[], returns=None,
        type_comment=None))


def _checker_stub(module: str, graded_chapter: str, source_dir: Path) -> tuple[bytes, set[str]]:
    """checks/nbNN/__init__.py for the worker grading chapter NN: each `check_*` repeats the
    grader's verdict (`verdict_check`); the helpers the notebook imports from the module, and
    tensor subclasses the checkers hand to the learner's functions, are copied with what they
    use."""
    tree = ast.parse((PACKAGE / module / "__init__.py").read_text(encoding="utf-8"))
    defs = _top_defs(tree)
    checks = [n for n, node in defs.items() if n.startswith("check_")
              and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    wanted = {n for n in _imported_from(source_dir, graded_chapter, f"checks.{module}")
              if n in defs and not n.startswith("check_")}
    wanted |= {n for n, node in defs.items() if isinstance(node, ast.ClassDef) and any(
        ast.unparse(b).endswith("Tensor") for b in node.bases)}
    keep = set(wanted)
    todo = list(wanted)
    while todo:
        for name in _names_used(defs[todo.pop()]):
            if name in defs and name not in keep and not name.startswith("check_"):
                keep.add(name)
                todo.append(name)
    # Its top-level imports, but not of the chapter's own internals (checks/nbNN/*.py), which
    # stay with the grader: nothing the stub keeps uses them.
    body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            and not _imports_internals(node, module)]
    seen: set[int] = set()
    for node in tree.body:
        names = [n for n, d in defs.items() if d is node]
        if any(n in keep for n in names) and id(node) not in seen:
            seen.add(id(node))
            body.append(node)
    lines = [f'"""Chapter {graded_chapter[:2]}\'s checks, withheld from the worker that runs a '
             f'chapter {graded_chapter[:2]} notebook for the grader: each check repeats the '
             'grader\'s verdict."""', "from __future__ import annotations",
             ast.unparse(ast.Module(body=body, type_ignores=[])),
             "from checks.grader.worker_side import verdict_check as _verdict_check"]
    lines += [f"{name} = _verdict_check({name!r})" for name in checks]
    return ("\n".join(lines) + "\n").encode(), keep | set(checks)


def _imports_internals(node: ast.stmt, chapter: str) -> bool:
    """Whether an import statement of a chapter's face (checks/nbNN/__init__.py) names one of
    the chapter's internal modules: `from .cache import x`, `from . import init`,
    `import checks.nb11.init`."""
    if isinstance(node, ast.ImportFrom):
        return node.level == 1 or (node.module or "").startswith(f"checks.{chapter}")
    return any(a.name.startswith(f"checks.{chapter}.") for a in node.names)


def worker_module_paths() -> list[Path]:
    """The modules of `checks` that the worker's copy is built from (see WORKER_GRADER_MODULES
    above: the layout decides, no module is listed by hand)."""
    found = {PACKAGE / rel for rel in WORKER_GRADER_MODULES}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if "__pycache__" in rel.parts or rel.parts[0] in MAINTAINERS_AND_GRADER or \
                rel.as_posix() in GRADER_ONLY:
            continue
        found.add(path)
    return sorted(found)


def worker_data_paths() -> list[Path]:
    """The data files of `checks` the worker's copy holds unchanged (WORKER_DATA)."""
    return sorted({path for pattern in WORKER_DATA for path in PACKAGE.glob(pattern)})


class WorkerLibrary:
    """The worker's copy of `checks` for one chapter (see the module docstring).

    `build(folder)` writes it to `folder/checks`; `has(module, name)` says whether the worker can
    import `module.name` (what cannot stays in the grader when it is handed to the learner)."""

    def __init__(self, chapter: str, source_dir: str | os.PathLike):
        self.chapter = chapter
        self.source_dir = Path(source_dir)
        stamp = tuple(sorted((str(p), p.stat().st_mtime_ns) for p in [
            *PACKAGE.rglob("*.py"), *worker_data_paths(), *self.source_dir.glob("*/*.ipynb")]))
        key = (chapter, str(self.source_dir), stamp)
        if key not in _library_plans:
            _library_plans.clear()
            _library_plans[key] = self._plan()
        self.files, self.available = _library_plans[key]

    def _plan(self) -> tuple[dict[str, bytes], dict[str, set[str] | None]]:
        graded = _chapter_number(self.chapter)
        answers = course_answers(self.source_dir)
        files: dict[str, bytes] = {}
        available: dict[str, set[str] | None] = {}
        reference, withheld = _withheld_reference(answers, graded)
        for path in worker_module_paths():
            rel = path.relative_to(PACKAGE).as_posix()
            module = "checks." + rel.removesuffix(".py").replace("/", ".").removesuffix(
                ".__init__")
            chapter = rel.split("/")[0]
            if re.fullmatch(r"nb\d\d", chapter):
                number = int(chapter[2:])
                face = rel == f"{chapter}/__init__.py"
                if number > graded or (number == graded and not face):
                    continue  # later chapters' checkers, the graded one's internals
                if number == graded:
                    files[rel], names = _checker_stub(chapter, self.chapter, self.source_dir)
                    available[module] = names
                    continue
            files[rel] = reference.get(rel, path.read_bytes())
            available[module] = None
            if module in withheld:
                available[module] = {n for n in _top_defs(ast.parse(path.read_bytes()))
                                     if n not in withheld[module]}
        for path in worker_data_paths():
            files[path.relative_to(PACKAGE).as_posix()] = path.read_bytes()
        return files, available

    def has(self, module: str, name: str) -> bool:
        if module not in self.available:
            return not module.startswith("checks.") and module != "checks"
        names = self.available[module]
        return names is None or name.split(".")[0] in names

    def build(self, folder: Path) -> Path:
        for rel, data in self.files.items():
            target = folder / "checks" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(target.parent, 0o755)
            target.write_bytes(data)
            os.chmod(target, 0o644)
        os.chmod(folder, 0o755)
        return folder

