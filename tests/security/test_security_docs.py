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


def test_the_token_format_is_the_one_issued():
    """The token format the page spells out (three dot-separated parts, the user base64url
    without padding, 43 characters of secret) is what `tickertape passwd --token` issues, and
    the page's example user part is right."""
    import base64

    from protocol.security.passwords import issue_token, parse_token, verify_secret

    assert "`tt1.<user>.<secret>`" in TEXT
    example = re.search(r"`root` is `([A-Za-z0-9_-]+)`", TEXT)
    assert example and example.group(1) == base64.urlsafe_b64encode(b"root").decode().rstrip("=")
    for user in ("root", "désk-ops", "a"):
        token, stored = issue_token(user)
        prefix, name, secret = token.split(".")
        assert prefix == "tt1" and "=" not in name and "=" not in secret
        assert base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode() == user
        assert len(secret) == 43 and len(base64.urlsafe_b64decode(secret + "=")) == 32
        assert parse_token(token) == (user, secret)
        assert verify_secret(stored, secret)  # the secret text is what the hash covers
