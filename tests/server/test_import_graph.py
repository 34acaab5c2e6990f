"""The server's modules import each other without a circle, and only the entry points import
the Server (docs/architecture.md draws this graph).

Every import counts: at the top, inside functions, and under `if TYPE_CHECKING:` (a circle
that only the type checker follows is still a circle a reader has to untangle).
"""

from pathlib import Path

import pytest

from tests.support.import_graph import find_circle, fold, graph, imports

SERVER = Path(__file__).resolve().parents[2] / "server"
ENTRY_POINTS = {"server.cli", "server.daemon"}


def _graph() -> dict[str, set[str]]:
    return graph(SERVER.parent, ("server",))


def test_only_the_entry_points_import_the_server():
    graph = _graph()
    importers = sorted(m for m, deps in graph.items() if "server.app" in deps)
    assert set(importers) <= ENTRY_POINTS, importers


def test_the_import_graph_has_no_circle():
    circle = find_circle(_graph())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


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
    assert imports("server.a", pkg / "a.py", known) == {"server.b"}
    assert imports("server.b", pkg / "b.py", known) == {"server.a", "server.c"}
    assert imports("server.c", pkg / "c.py", known) == {"server.a"}


DOC = SERVER.parent / "docs" / "architecture.md"


def _doc_rooms(text: str) -> tuple[dict[str, tuple[int, str]], set[tuple[str, str]]]:
    """The layer table (module -> (layer, room)) and the room graph drawn in the doc."""
    table = text.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    rooms: dict[str, tuple[int, str]] = {}
    for line in table[1:]:
        layer, room, *modules = line.split()
        for m in modules:
            name = "server." + m
            assert name not in rooms, f"{m} is listed twice in docs/architecture.md"
            rooms[name] = (int(layer), room)
    drawing = text.split("```mermaid\n", 1)[1].split("```", 1)[0]
    edges = {
        tuple(part.strip() for part in line.split("-->"))
        for line in drawing.splitlines()
        if "-->" in line
    }
    return rooms, edges  # type: ignore[return-value]


def test_the_architecture_page_matches_the_imports():
    """Every server module is in one room of docs/architecture.md; it imports only its own room
    or rooms below; and the drawing has exactly the arrows between rooms the code has."""
    top = fold(_graph(), 2)  # a subpackage (protocol/filters/...) is one name
    top.pop("server", None)
    rooms, drawn = _doc_rooms(DOC.read_text())
    assert set(rooms) == set(top), set(rooms) ^ set(top)
    actual = set()
    for m, deps in top.items():
        for d in deps:
            assert rooms[d][0] <= rooms[m][0], f"{m} (layer {rooms[m][0]}) imports {d} above it"
            if rooms[d][1] != rooms[m][1]:
                actual.add((rooms[m][1], rooms[d][1]))
    assert drawn == actual, (sorted(drawn - actual), sorted(actual - drawn))


def test_a_module_listed_twice_in_the_page_is_refused():
    """The test of the test: the page's table names each module once."""
    text = "```text\nlayer room modules\n2 b x y\n1 a y\n```\n```mermaid\nb --> a\n```\n"
    with pytest.raises(AssertionError, match="y is listed twice"):
        _doc_rooms(text)
    rooms, edges = _doc_rooms(text.replace("1 a y", "1 a z"))
    assert rooms == {"server.x": (2, "b"), "server.y": (2, "b"), "server.z": (1, "a")}
    assert edges == {("b", "a")}
