"""Objects on the message path keep the interpreter's fast attribute reads (issue 24).

CPython 3.11 specialises `obj.attr` into a direct read of the instance's inline values. Once an
object's `__dict__` has been read (functools.cached_property stores through it, and so do
`vars(obj)` and `obj.__dict__[...]`), its attributes live in a dictionary that the specialised
read cannot use, and every attribute read of that object takes the generic lookup. A session
whose command handlers were cached_property read some 15 of its attributes that way on each
queue acknowledgement (the interpreter's adaptive instructions, read back after a backlog-1
run: each still unspecialised, its counter backing off). So no module of the server, the
journal or the protocol reads an instance's `__dict__`: a handler built at first use is a plain
attribute (server/session.py `publisher`, `subscribing`).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PACKAGES = ("server", "journal", "protocol")


def _modules() -> list[pathlib.Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def dict_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each cached_property, `vars(...)` call and `.__dict__` in source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("__dict__", "cached_property"):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Name) and node.id == "cached_property":
            found.append((node.lineno, "cached_property"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "vars"
            and node.args
        ):
            found.append((node.lineno, "vars()"))
        elif isinstance(node, ast.ImportFrom) and any(
            a.name == "cached_property" for a in node.names
        ):
            found.append((node.lineno, "cached_property"))
    return found


def test_the_scan_finds_each_way_of_reading_a_dict():
    source = (
        "import functools\n"
        "from functools import cached_property\n"
        "class A:\n"
        "    @functools.cached_property\n"
        "    def x(self): return 1\n"
        "    def y(self): return vars(self), self.__dict__\n"
    )
    assert sorted(what for _, what in dict_reads(source)) == [
        "__dict__",
        "cached_property",
        "cached_property",
        "vars()",
    ]
    assert dict_reads("class B:\n    def y(self): return vars()\n") == []  # the caller's locals


def test_no_module_reads_an_instance_dict():
    found = {
        str(path.relative_to(ROOT)): where
        for path in _modules()
        if (where := dict_reads(path.read_text()))
    }
    assert not found, (
        f"{found}: reading an instance's __dict__ costs the object its specialised attribute "
        "reads; build a lazily made part into a plain attribute (server/session.py `publisher`)"
    )
