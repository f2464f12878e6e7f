"""The architecture of DESIGN.md: imports inside nkisim flow one way (faces -> core -> analysis),
with no import circle, counting imports inside functions too (a deferred import is still a
dependency), and the core imports no face."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import nkisim

ROOT = Path(nkisim.__file__).parent
FACES = ("nkisim.beta1", "nkisim.nki")
# the entry points above the faces: they choose a face for the user
ENTRY = {"nkisim.shim", "nkisim.cli", "nkisim.__main__", "nkisim"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, modules: set) -> set:
    """Every nkisim module ``path`` imports, at any depth of its code."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if _is_type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("nkisim"):
                continue
            for alias in node.names:           # `from . import ops` names a module
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("nkisim"))
        todo.extend(ast.iter_child_nodes(node))
    found.discard(name)
    return {m for m in found if m in modules}


# built once per module (0.7 s of CPU each): the four tests read it, none changes it
@functools.cache
def _graph() -> dict:
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(paths)
    return {m: _imports(p, modules) for m, p in paths.items()}


def _cycle(graph) -> list | None:
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_circle():
    graph = _graph()
    # a package's __init__ importing its own submodules is how packages expose them; the
    # submodules must not import their package back (checked as any other edge)
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_core_imports_no_face():
    graph = _graph()
    for m, deps in graph.items():
        if m in ENTRY or m.startswith(FACES):
            continue
        faces = sorted(d for d in deps if d.startswith(FACES))
        assert not faces, f"core module {m} imports face module(s) {faces}"


def test_faces_do_not_reach_into_each_other():
    graph = _graph()
    for m, deps in graph.items():
        for face in FACES:
            if m.startswith(face):
                other = [d for d in deps if d.startswith(FACES) and not d.startswith(face)]
                assert not other, f"{m} reaches into another face: {other}"


def test_the_graph_sees_deferred_imports():
    """The checker itself: an import inside a function counts (runtime defers its cost import)."""
    graph = _graph()
    assert "nkisim.cost" in graph["nkisim.runtime"]
    assert "nkisim.ops" in graph["nkisim.engines"]
