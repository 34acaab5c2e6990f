"""docs/configuration.md keeps up with the loader: every element, synonym, refused element, action
module and option, limit and log level the loader knows is described there, in the right place.

The names come from the loader's own tables (`config.schema`, `config.limits`,
`config.transports.LOG_LEVELS`), so an element added to the code without documentation fails here.
"""

import re
from pathlib import Path

import pytest

import config
from config import schema
from config.limits import LIMIT_ELEMENTS
from config.transports import LOG_LEVELS

DOC = Path(config.__file__).parent.parent / "docs" / "configuration.md"
TEXT = DOC.read_text()


def section(tag: str, within: str | None = None) -> str:
    """The text under the first heading that names `<tag>` (and `<within>`, for a section
    whose name is used in two places), up to the next heading."""
    also = rf"[^\n]*`<{within}>`" if within else ""
    match = re.search(rf"^(#+) [^\n]*`<{tag}>`{also}[^\n]*\n", TEXT, re.MULTILINE)
    assert match, f"docs/configuration.md has no heading for <{tag}> {within or ''}"
    rest = TEXT[match.end() :]
    end = re.search(r"^#+ ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def part(title: str) -> str:
    """The text of the `## title` part, subsections included."""
    match = re.search(rf"^## {re.escape(title)}\n", TEXT, re.MULTILINE)
    assert match, f"docs/configuration.md has no part {title!r}"
    rest = TEXT[match.end() :]
    end = re.search(r"^## ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def has_heading(tag: str) -> bool:
    return re.search(rf"^#+ [^\n]*`<{tag}>`", TEXT, re.MULTILINE) is not None


@pytest.mark.parametrize("spec", schema.SECTIONS, ids=[s.tag for s in schema.SECTIONS])
def test_every_child_has_a_row_in_its_section(spec):
    """Each child is a table row (`| <Name> ...`) under its parent's heading, or a section
    with a heading of its own."""
    text = section(spec.tag, spec.within)
    rows = [line for line in text.splitlines() if line.startswith("| `<")]
    missing = [
        name
        for name in spec.children
        if not has_heading(name) and not any(r.startswith(f"| `<{name}>`") for r in rows)
    ]
    assert not missing, f"<{spec.tag}> in docs/configuration.md does not describe {missing}"


def test_every_action_module_and_option_is_described():
    text = section("Actions")
    modules = [f"amps-action-on-{m}" for m in schema.TRIGGERS]
    modules += [f"-action-do-{m}" for m in schema.STEPS]
    missing = [m for m in modules if m not in text]
    options = {o for spec in schema.OPTION_SPECS.values() for o in spec.children}
    missing += [o for o in sorted(options) if f"`<{o}>`" not in text]
    assert not missing


def test_every_synonym_is_listed():
    text = part("Coming from AMPS")
    rows = [line for line in text.splitlines() if line.startswith("|")]
    missing = [
        (spec.tag, name)
        for spec in schema.SECTIONS
        for name, ours in spec.synonyms.items()
        if not any(f"`<{name}>`" in r and f"`<{ours}>`" in r for r in rows)
    ]
    assert not missing


def test_every_refused_element_is_listed_with_its_section():
    text = part("Coming from AMPS")
    rows = [line for line in text.splitlines() if line.startswith("| `<")]
    missing = [
        (spec.tag, name)
        for spec in schema.SECTIONS
        for name in spec.unsupported
        if not any(r.startswith(f"| `<{spec.tag}>`") and f"| `<{name}>` |" in r for r in rows)
    ]
    assert not missing


def test_no_refused_element_is_listed_that_the_loader_accepts():
    text = part("Coming from AMPS")
    refused = re.findall(r"^\| `<(\w+)>`[^|]* \| `<(\w+)>` \|", text.split("### Refused")[1], re.M)
    known = {(s.tag, n) for s in schema.SECTIONS for n in s.unsupported}
    assert refused and set(refused) <= known


def test_every_limit_is_described():
    text = part("Limits")
    assert [e for e in LIMIT_ELEMENTS if f"`<{e}>`" not in text] == []


def test_every_log_level_is_described():
    text = section("Logging")
    assert [level for level in LOG_LEVELS if f"`{level}`" not in text] == []


def test_roots_and_builtin_variables_are_described():
    for name in ("`<TickertapeConfig>`", "`<AMPSConfig>`", "--verify-config"):
        assert name in TEXT
    for var in ("TICKERTAPE_CONFIG_PATH", "TICKERTAPE_CONFIG_DIRECTORY", "AMPS_CONFIG_PATH"):
        assert var in TEXT


def test_examples_it_points_at_exist():
    links = re.findall(r"\]\((\.\./[^)]+)\)", TEXT)
    assert links
    assert [link for link in links if not (DOC.parent / link).exists()] == []


def test_links_stay_inside_the_repository():
    root = DOC.parent.parent.resolve()
    targets = [t for t in re.findall(r"\]\(([^)#][^)]*)\)", TEXT) if not t.startswith("http")]
    assert targets
    outside = [t for t in targets if not (DOC.parent / t).resolve().is_relative_to(root)]
    assert outside == [] and not [t for t in targets if t.startswith("/")]


def test_links_within_the_page_resolve():
    def slug(heading: str) -> str:  # GitHub's anchors
        return re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")

    anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", TEXT, re.MULTILINE)}
    links = re.findall(r"\]\(#([^)]+)\)", TEXT)
    assert links
    assert [link for link in links if link not in anchors] == []
