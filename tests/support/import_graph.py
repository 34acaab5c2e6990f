"""The import graph of the project's packages, read from the source with `ast`.

Every import counts: at the top, inside functions, and under `if TYPE_CHECKING:` (a circle that
only the type checker follows is still a circle a reader has to untangle). The layer test
(tests/test_layers.py) and the server's room test (tests/server/test_import_graph.py) share it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "journal", "config", "server", "client")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name."""
    found: dict[str, Path] = {}
    for pkg in packages:
        for p in (root / pkg).rglob("*.py"):
            found[module_name(p, root)] = p
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules `name` imports (`from . import x` counts as the package's x)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    st = path.stat()
    for level, module, names in _import_statements(str(path), st.st_mtime_ns, st.st_size):
        targets: list[str] = []
        if level is None:
            targets = list(names)
        else:
            if level:
                base = package.split(".")
                base = base[: len(base) - (level - 1)]
                mod = ".".join(base + ([module] if module else []))
            else:
                mod = module or ""
            targets = [mod] + [f"{mod}.{a}" for a in names]
        for t in targets:
            # the longest known module named by the import (a name inside it maps to it)
            while t and t not in known:
                t = t.rpartition(".")[0]
            # a package's own __init__ is not a dependency of its modules (`from . import x`)
            if t and t != name and not name.startswith(t + "."):
                found.add(t)
    return found


@functools.lru_cache(maxsize=4096)
def _import_statements(
    path: str, mtime_ns: int, size: int
) -> tuple[tuple[int | None, str | None, tuple[str, ...]], ...]:
    """The import statements of one file as (level, module, names); level None for `import x`.
    Kept per file version (path, mtime, size): the layer and room tests ask for the graph a dozen
    times in one process, and parsing every module each time was most of their seconds."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out: list[tuple[int | None, str | None, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.append((None, None, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module, tuple(a.name for a in node.names)))
    return tuple(out)


def graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    mods = modules(root, packages)
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def fold(g: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph with every module folded into its first `depth` name parts (server.filters.x
    into server.filters at 2, into server at 1); a node's imports of itself dropped."""
    out: dict[str, set[str]] = {}
    for m, deps in g.items():
        key = ".".join(m.split(".")[:depth])
        out.setdefault(key, set()).update(".".join(d.split(".")[:depth]) for d in deps)
    for key, deps in out.items():
        deps.discard(key)
    return out


def find_circle(g: dict[str, set[str]]) -> list[str] | None:
    """One circle of `g` (its nodes, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for dep in sorted(g.get(m, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None
