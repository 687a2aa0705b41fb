"""The package's layout, as the README's maintainer guide states it: dependencies flow one way.

The learner-facing core (checks/*.py, reference/) imports neither the grader nor the tools; the
model loader (smollm/) imports only the core; the grader imports no tool; nothing imports in a
cycle. Every import counts, the ones inside functions too: a lazy import still makes a cycle a
reader has to untangle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "checks"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imports(path: Path) -> set[str]:
    """Every `checks` module that `path` imports, anywhere in the file."""
    me = _module_name(path)
    package = me if _is_package(path) else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "checks"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "checks":
                continue
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}   # `from . import engine`
    return found


def _graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {_module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # Importing checks.a.b runs checks/__init__ and checks/a/__init__ too, but those are the
        # packages' own business; an edge goes to the deepest module that exists.
        graph[name] = {t for t in _imports(path) if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _role(module: str) -> str:
    if module == "checks.__main__":
        return "entry"   # `python -m checks`: hands each command to its package
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("grader", "tools", "smollm"):
        return parts[1]
    return "core"


def test_the_layout_test_sees_the_packages():
    graph = _graph()
    roles = {_role(m) for m in graph}
    assert roles == {"core", "grader", "tools", "smollm", "entry"}, roles
    assert "checks.engine" in graph["checks.nb04"]


def test_no_import_cycle_inside_checks():
    graph = _graph()
    # Package __init__ files that re-export their own submodules point down into them; that is
    # not a cycle a reader untangles, so edges from a package to its own children do not count.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")
                       or not (PACKAGE.parent / (name.replace(".", "/") + "/__init__.py")).exists()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


ALLOWED = {  # what each role may import
    "core": {"core", "smollm"},   # chapter 12/13 and timing run the real model
    "smollm": {"core", "smollm"},
    "grader": {"core", "smollm", "grader"},
    "tools": {"core", "smollm", "grader", "tools"},
    "entry": {"core", "smollm", "grader", "tools"},
}


@pytest.mark.parametrize("role", sorted(ALLOWED))
def test_dependencies_flow_one_way(role):
    wrong = sorted(f"{m} imports {t}" for m, targets in _graph().items() if _role(m) == role
                   for t in targets if _role(t) not in ALLOWED[role])
    assert not wrong, wrong


@pytest.mark.parametrize("package", ["checks", "checks/reference", "checks/smollm",
                                     "checks/grader", "checks/tools"])
def test_each_package_says_what_it_is_for(package):
    init = PACKAGE.parent / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    assert doc and len(doc.split()) >= 12, \
        f"{init} needs a docstring: what it is for, what it imports"
