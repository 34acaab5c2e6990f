"""The packages stand in layers (docs/architecture.md draws them) and nothing imports in a circle.

    layer 3  server                         (its entry point also runs the client's CLI)
    layer 2  config
    layer 1  journal    client
    layer 0  protocol   (the wire format and the pure building blocks: filters, security)

A package imports only itself and packages of a lower layer, so the client sees only the
protocol, and the journal and the client never see each other. Imports inside functions and
under TYPE_CHECKING count. No circle between modules, nor between (sub)packages folded whole.
bench/ and tests/ stand above everything and are free.
"""

import re
from pathlib import Path

import pytest

from tests.support.import_graph import ROOT, find_circle, fold, graph

LAYERS = {"protocol": 0, "journal": 1, "client": 1, "config": 2, "server": 3}
# subpackages that stand above the rest of their package: the Spark job uses the storage
# engine's format readers, the storage engine never imports the job
ABOVE_ITS_PACKAGE = ("journal.spark",)


def layer_breaches(g: dict[str, set[str]]) -> list[str]:
    out = []
    for m, deps in sorted(g.items()):
        mine = m.split(".")[0]
        for d in sorted(deps):
            theirs = d.split(".")[0]
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                out.append(f"{m} (layer {LAYERS[mine]}) imports {d} (layer {LAYERS[theirs]})")
    return out


def test_the_storage_engine_does_not_import_the_spark_job():
    g = graph()
    for top in ABOVE_ITS_PACKAGE:
        pkg = top.split(".")[0]
        inside = [m for m in g if m == top or m.startswith(top + ".")]
        users = sorted(
            f"{m} imports {d}"
            for m, deps in g.items()
            if m.split(".")[0] == pkg and m not in inside
            for d in deps
            if d in inside
        )
        assert inside and users == []


def test_every_package_has_a_layer():
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert on_disk == set(LAYERS), on_disk ^ set(LAYERS)


def test_each_package_imports_only_the_layers_below():
    assert layer_breaches(graph()) == []


@pytest.mark.parametrize("depth", [None, 3, 2, 1])
def test_no_import_circle(depth):
    """Between modules, and between subpackages / packages seen as one piece each."""
    g = graph()
    circle = find_circle(g if depth is None else fold(g, depth))
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return graph(tmp_path, ("protocol", "journal", "client", "server"))


def test_the_checks_see_what_they_must(tmp_path):
    """The test of the test: a client importing the journal (in a function), a protocol module
    importing the server (under TYPE_CHECKING) and a circle between two subpackages are found."""
    g = _tree(
        tmp_path,
        {
            "protocol/__init__.py": "",
            "protocol/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from server.x import X\n",
            "journal/__init__.py": "",
            "client/__init__.py": "",
            "client/c.py": "def f():\n    from journal import y\n",
            "journal/y.py": "",
            "server/__init__.py": "",
            "server/x.py": "",
            "server/p/__init__.py": "",
            "server/p/one.py": "from server.q import two\n",
            "server/q/__init__.py": "",
            "server/q/two.py": "from ..p import three\n",
            "server/p/three.py": "",
        },
    )
    assert layer_breaches(g) == [
        "client.c (layer 1) imports journal (layer 1)",
        "client.c (layer 1) imports journal.y (layer 1)",
        "protocol.a (layer 0) imports server.x (layer 3)",
    ]
    assert find_circle(g) is None  # module by module there is none
    assert find_circle(fold(g, 2)) == ["server.p", "server.q", "server.p"]


def test_the_architecture_page_draws_these_layers():
    """docs/architecture.md's table of packages: each package in its layer, and the packages
    each imports are the ones the code imports."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d) \| `(\w+)` \|[^|]*\| ([^|]*) \|$", text, re.M)
    assert {pkg: int(layer) for layer, pkg, _ in rows} == LAYERS
    uses = {pkg: {d.strip() for d in deps.split(",")} - {"—"} for _, pkg, deps in rows}
    actual = fold(graph(), 1)
    assert uses == {pkg: actual[pkg] for pkg in LAYERS}


MAX_MODULE_LINES = 600


def test_no_module_of_the_product_is_over_600_lines():
    """Small modules with names that explain themselves: a module past this is split by its
    objects (a collaborator with a narrow door), not cut in two files of one object."""
    big = {
        str(p.relative_to(ROOT)): n
        for pkg in ("protocol", "journal", "config", "server", "client")
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}, f"modules over {MAX_MODULE_LINES} lines: {big}"
