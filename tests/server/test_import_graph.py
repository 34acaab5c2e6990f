"""The server's modules import each other without a circle, and only the entry points import
the Server (docs/architecture.md draws this graph).

Every import counts: at the top, inside functions, and under `if TYPE_CHECKING:` (a circle
that only the type checker follows is still a circle a reader has to untangle).
"""

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "server"
ENTRY_POINTS = {"server.cli", "server.daemon"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SERVER.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _server_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SERVER.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The server modules `name` imports (`from . import x` counts as server.x)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            # the longest known module named by the import (a name inside it maps to it)
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t != "server":
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _server_modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def test_only_the_entry_points_import_the_server():
    graph = _graph()
    importers = sorted(m for m, deps in graph.items() if "server.app" in deps)
    assert set(importers) <= ENTRY_POINTS, importers


def test_the_import_graph_has_no_circle():
    graph = _graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for dep in sorted(graph.get(m, ())):
            if state.get(dep) == 1:
                circle = path[path.index(dep) :] + [dep]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_graph_sees_relative_and_type_checking_imports(tmp_path):
    """The parser itself: relative imports resolve, TYPE_CHECKING imports count."""
    pkg = tmp_path / "server"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (pkg / "b.py").write_text("from . import a\nimport server.c\n")
    (pkg / "c.py").write_text("def f():\n    from server.a import x\n")
    known = {"server.a", "server.b", "server.c"}
    assert _imports("server.a", pkg / "a.py", known) == {"server.b"}
    assert _imports("server.b", pkg / "b.py", known) == {"server.a", "server.c"}
    assert _imports("server.c", pkg / "c.py", known) == {"server.a"}


DOC = SERVER.parent / "docs" / "architecture.md"


def _doc_rooms() -> tuple[dict[str, tuple[int, str]], set[tuple[str, str]]]:
    """The layer table (module -> (layer, room)) and the room graph drawn in the doc."""
    text = DOC.read_text()
    table = text.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    rooms: dict[str, tuple[int, str]] = {}
    for line in table[1:]:
        layer, room, *modules = line.split()
        for m in modules:
            assert m not in rooms, f"{m} is listed twice in docs/architecture.md"
            rooms["server." + m] = (int(layer), room)
    drawing = text.split("```mermaid\n", 1)[1].split("```", 1)[0]
    edges = {
        tuple(part.strip() for part in line.split("-->"))
        for line in drawing.splitlines()
        if "-->" in line
    }
    return rooms, edges  # type: ignore[return-value]


def _top_level(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with a subpackage (server/filters/...) folded into its top-level name."""
    top: dict[str, set[str]] = {}
    for m, deps in graph.items():
        key = ".".join(m.split(".")[:2])
        top.setdefault(key, set()).update(".".join(d.split(".")[:2]) for d in deps)
    for key, deps in top.items():
        deps.discard(key)
    return top


def test_the_architecture_page_matches_the_imports():
    """Every server module is in one room of docs/architecture.md; it imports only its own room
    or rooms below; and the drawing has exactly the arrows between rooms the code has."""
    graph = _top_level(_graph())
    graph.pop("server", None)
    rooms, drawn = _doc_rooms()
    assert set(rooms) == set(graph), set(rooms) ^ set(graph)
    actual = set()
    for m, deps in graph.items():
        for d in deps:
            assert rooms[d][0] <= rooms[m][0], f"{m} (layer {rooms[m][0]}) imports {d} above it"
            if rooms[d][1] != rooms[m][1]:
                actual.add((rooms[m][1], rooms[d][1]))
    assert drawn == actual, (sorted(drawn - actual), sorted(actual - drawn))
