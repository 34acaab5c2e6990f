"""docs/architecture.md names what is in the code: every file it links or names exists, every
class and method it names in backticks is defined, and its table of packages is the layers
tests/test_layers.py holds, with each package's imports as the code has them."""

from __future__ import annotations

import re

from tests.support.import_graph import ROOT, fold, graph
from tests.test_layers import LAYERS

DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text()
SOURCES = ("server", "journal", "client", "config", "protocol")
STDLIB = {"Protocol", "NamedTuple", "StrEnum"}


def _code() -> str:
    return "\n".join(
        p.read_text()
        for pkg in SOURCES
        for pattern in ("*.py", "*.c", "*.h")
        for p in (ROOT / pkg).rglob(pattern)
    )


def test_every_file_the_page_names_exists():
    linked = {(DOC.parent / t).resolve() for t in re.findall(r"\]\((\.\./[^)#]+)", TEXT)}
    named = {
        ROOT / p
        for p in re.findall(r"\b((?:%s|tests)/[\w/]+\.(?:py|c|h))" % "|".join(SOURCES), TEXT)
    }
    missing = sorted(str(p.relative_to(ROOT)) for p in linked | named if not p.exists())
    assert missing == []


def test_every_class_and_method_the_page_names_is_defined():
    code = _code()
    missing = []
    for name in sorted(set(re.findall(r"`([A-Za-z_]\w*(?:\.\w+)*)(?:\(\))?`", TEXT))):
        head, *rest = name.split(".")
        if head[0].isupper() and not head.isupper() and head not in STDLIB:
            if not re.search(rf"^\s*(class {head}\b|{head} = |{head}: )", code, re.M):
                missing.append(name)
            missing += [
                name for r in rest if not re.search(rf"def {r}\b|\.{r}\b|^\s+{r}\b", code, re.M)
            ]
        elif head.startswith("_") and not rest:  # a step (`_advance_end`) or a table (`_ROUTES`)
            if not re.search(rf"\b(def|static \w+\*?) {head}\b|^{head}\b[^=]*=", code, re.M):
                missing.append(name)
    assert missing == []


def test_the_package_table_is_the_layers_the_code_keeps():
    rows = re.findall(r"^\| (\d) \| `(\w+)` \| [^|]+ \| ([^|]+) \|$", TEXT, re.M)
    assert {pkg: int(layer) for layer, pkg, _ in rows} == LAYERS
    imported = {m: deps for m, deps in fold(graph(), 1).items() if m in LAYERS}
    for _, pkg, cell in rows:
        drawn = set() if cell.strip() == "—" else {p.strip() for p in cell.split(",")}
        assert drawn == imported[pkg] - {pkg}, pkg
