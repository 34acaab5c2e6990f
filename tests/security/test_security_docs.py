"""docs/security.md stays true to the code: its links resolve, and what it says is refused today
is what config.security.unsupported refuses."""

import re
from pathlib import Path

import config
from config import security
from config.model import Admin, Authentication, Config, Entitlement, Transport

DOC = Path(config.__file__).parent.parent / "docs" / "security.md"
TEXT = DOC.read_text()


def test_links_resolve_inside_the_repository():
    root = DOC.parent.parent.resolve()
    targets = [t for t in re.findall(r"\]\(([^)#][^)]*)\)", TEXT) if not t.startswith("http")]
    assert targets
    for target in targets:
        path = (DOC.parent / target).resolve()
        assert path.exists() and path.is_relative_to(root), target


def test_anchors_resolve():
    def slug(heading: str) -> str:  # GitHub's anchors
        return re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")

    anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", TEXT, re.MULTILINE)}
    links = re.findall(r"\]\(#([^)]+)\)", TEXT)
    assert links and [link for link in links if link not in anchors] == []


def test_the_state_table_matches_what_is_refused():
    """A part marked **refused** in the table is exactly a part `unsupported` refuses."""
    everything = Config(
        name="x",
        transports=(Transport(name="t", port=0, type="tcps", certificate="c", private_key="k"),),
        admin=Admin(certificate="c", private_key="k"),
        authentication=Authentication(password_file="u"),
        entitlement=Entitlement(),
    )
    refused = {u.section for u in security.unsupported(everything)}
    table = TEXT.split("## State today")[1].split("\n## ")[0]
    rows = {
        "transport": "| TLS on a transport |",
        "admin": "| TLS on the admin endpoint |",
        "authentication": "| Authentication (a password file, client certificates) |",
        "entitlement": "| Entitlements and content filters |",
    }
    for section, row in rows.items():
        [line] = [x for x in table.splitlines() if x.startswith(row)]
        assert ("**refused**" in line) == (section in refused), line
