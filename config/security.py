"""The security part of the configuration: `<Authentication>`, `<Entitlement>`, the TLS files of
`tcps` transports and of `<Admin>`, the safe-defaults rule, and what this build cannot serve.

docs/configuration.md describes the elements and docs/security.md what they mean. Checks here:

- TLS: the certificate, key and CA files must exist and load together (a key that does not
  belong to its certificate, a PEM without a certificate, an encrypted key...), `<Ciphers>` must
  select a cipher, `<MinimumVersion>` is TLSv1.2 or TLSv1.3; the checks are those of
  `protocol.security.tls`, imported when a file has a TLS section, so a problem found here is the
  one the server would hit.
- `<PasswordFile>` must load (`protocol.security.passwords`: a damaged line is named by number);
  topic regexes must compile in RE2; `<Filter><Expression>`s must compile in the filter language
  (`protocol.filters`).
- Safe defaults: a transport or the admin endpoint on an address that is not loopback needs an
  `<Authentication>` section; `<Authentication><AllowAnonymous>true</AllowAnonymous>` is how a
  file says "open to the network" in so many words.
- Fail closed: `unsupported(cfg)` lists what `cfg` asks for that this build does not serve; the
  loader reports each as a problem, so such a file neither starts a server nor passes
  `--verify-config`. As the server learns each feature, its line in `unsupported` goes.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Literal, NamedTuple

from .model import Authentication, Config, ContentFilter, Entitlement, Rights, Role
from .rules import Checker, Section, boolean, positive_interval
from .schema import AUTHENTICATION, DENY, ENTITLEMENT, FILTER, RIGHT_ELEMENTS, ROLE
from .txlog import topic_pattern
from .xmltree import Node

if TYPE_CHECKING:
    from protocol.security.tls import ServerTls

__all__ = [
    "Unserved",
    "check_security",
    "check_tls",
    "is_loopback",
    "minimum_version",
    "read_authentication",
    "read_entitlement",
    "unsupported",
]

_SEE = "; see docs/security.md"


class Unserved(NamedTuple):
    """Something a configuration asks for that this build does not serve. `section` and
    `number` say where (the transport at that position; 0 for the other sections)."""

    section: Literal["transport", "admin", "authentication", "entitlement"]
    number: int
    reason: str


def unsupported(cfg: Config) -> list[Unserved]:
    """What `cfg` asks for that the server does not serve yet, each with why it is refused.

    Empty today: TLS, authentication and entitlements are all served (docs/security.md,
    "State today"). A security feature added to the configuration before the server serves it
    goes here (and in that table), so that it is refused rather than accepted and ignored.
    """
    del cfg
    return []


# ----------------------------------------------------------------------------------------------
# Value checks


def minimum_version(text: str) -> str:
    """`<MinimumVersion>`: TLSv1.2 or TLSv1.3 (also written 1.2, TLS1.2, tlsv1_2)."""
    key = text.lower().replace("_", ".").removeprefix("tlsv").removeprefix("tls").lstrip("v")
    if key in ("1.2", "1.3"):
        return f"TLSv{key}"
    if key in ("1", "1.0", "1.1") or text.lower().startswith("ssl"):
        raise ValueError(
            f"{text!r} is refused: TLS below 1.2 has known breaks; write TLSv1.2 or TLSv1.3"
        )
    raise ValueError(f"invalid value {text!r}; write TLSv1.2 or TLSv1.3")


def is_loopback(host: str) -> bool:
    """Whether `host` only reaches this machine. A host name other than localhost counts as
    not loopback: what it resolves to is not known here."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def user_list(text: str) -> tuple[str, ...]:
    """`<Users>`: a comma list of user names, or `*`."""
    names = tuple(n.strip() for n in text.split(","))
    for name in names:
        if not name:
            raise ValueError(f"empty user name in {text!r}; write a comma list: alice,bob")
        if any(c.isspace() or c == ":" for c in name):
            raise ValueError(f"user name {name!r} has whitespace or ':'")
    return names


def _expression(text: str) -> str:
    from protocol.filters import FilterError, compile_filter  # the server's own filter compiler

    try:
        compile_filter(text)
    except FilterError as e:
        raise ValueError(f"{e}; <Expression> is a filter as in a subscription") from None
    return text


# ----------------------------------------------------------------------------------------------
# Sections


def check_tls(checker: Checker, sec: Section, tls: ServerTls) -> None:
    """Report every problem of the TLS settings `tls` read from `sec`, at the element it
    comes from."""
    from protocol.security.tls import check

    for error in check(tls):
        message = f"{error.path}: {error.reason}" if error.path else error.reason
        checker.report(sec.at(error.element), message)


def read_authentication(checker: Checker, node: Node | None) -> Authentication | None:
    """`<Authentication>`, None without one. The password file must load."""
    if node is None:
        return None
    sec = Section(checker, node, AUTHENTICATION)
    password_file = sec.text("PasswordFile")
    if password_file is not None:
        from protocol.security.passwords import PasswordFileError, load_password_file

        try:
            load_password_file(password_file)
        except PasswordFileError as e:
            checker.report(sec.at("PasswordFile"), str(e))
    return Authentication(
        password_file=password_file,
        logon_timeout=sec.value("LogonTimeout", positive_interval, None),
        allow_anonymous=sec.value("AllowAnonymous", boolean, False),
    )


def read_entitlement(checker: Checker, node: Node | None) -> Entitlement | None:
    """`<Entitlement>` and its roles, None without one."""
    if node is None:
        return None
    sec = Section(checker, node, ENTITLEMENT)
    roles: list[Role] = []
    names: dict[str, Node] = {}
    for rnode in sec.many("Role"):
        r = Section(checker, rnode, ROLE)
        name = r.text("Name", required=True, hint=" (names the role in logs)")
        no_users: tuple[str, ...] = ()
        users = r.value("Users", user_list, no_users, required=True, hint=" (alice,bob or *)")
        if name is not None:
            checker.unique_name(names, "role", name, rnode)
        deny_node = r.one("Deny")
        deny = _rights(checker, Section(checker, deny_node, DENY)) if deny_node else Rights()
        filters = []
        for fnode in r.many("Filter"):
            f = Section(checker, fnode, FILTER)
            topic = f.value("Topic", topic_pattern, None, required=True, hint=" (a topic regex)")
            expression = f.value(
                "Expression", _expression, None, required=True, hint=" (/desk = 'A')"
            )
            if topic is not None and expression is not None:
                filters.append(ContentFilter(topic=topic, expression=expression))
        roles.append(
            Role(
                name=name or "",
                users=users,
                allow=_rights(checker, r),
                deny=deny,
                filters=tuple(filters),
            )
        )
    return Entitlement(roles=tuple(roles))


def _rights(checker: Checker, sec: Section) -> Rights:
    patterns: dict[str, tuple[str, ...]] = {}
    for element in RIGHT_ELEMENTS:  # each a Rights field, in lowercase
        found = []
        for node in sec.many(element):
            text = checker.leaf(node)
            if text is None:
                continue
            try:
                found.append(topic_pattern(text))
            except ValueError as e:
                checker.report(node, str(e))
        patterns[element.lower()] = tuple(found)
    return Rights(**patterns, admin=sec.value("Admin", boolean, False))


# ----------------------------------------------------------------------------------------------
# Checks across sections


def check_security(checker: Checker, root: Section, cfg: Config) -> None:
    """The checks that need the whole configuration: exposure without authentication, what
    authentication can accept, and what this build does not serve (`unsupported`)."""
    transports = root.one("Transports")
    tnodes = [c for c in transports.children if c.tag == "Transport"] if transports else []
    admin_node = root.one("Admin")
    sections = {
        "admin": admin_node,
        "authentication": root.one("Authentication"),
        "entitlement": root.one("Entitlement"),
    }

    def where(section: str, index: int) -> Node:
        if section == "transport":
            return tnodes[index] if index < len(tnodes) else root.node
        return sections.get(section) or root.node

    auth = cfg.authentication
    if auth is None:
        exposed = [(i, t.host, t.port) for i, t in enumerate(cfg.transports)]
        if cfg.admin is not None:
            exposed.append((-1, cfg.admin.host, cfg.admin.port))
        for index, host, port in exposed:
            if is_loopback(host):
                continue
            node = admin_node if index < 0 else where("transport", index)
            assert node is not None
            what = "the admin endpoint" if index < 0 else "this transport"
            checker.report(
                node.child("InetAddr"),
                f"{what} listens on {host}:{port}, which is not loopback, and there is no "
                "<Authentication>: whoever reaches it could do everything. Add "
                "<Authentication> with a <PasswordFile>, or accept an open server with "
                "<Authentication><AllowAnonymous>true</AllowAnonymous></Authentication>, or "
                "listen on 127.0.0.1" + _SEE,
            )
    else:
        certified = any(t.type == "tcps" and t.ca_file for t in cfg.transports)
        if auth.password_file is None and not auth.allow_anonymous and not certified:
            checker.report(
                where("authentication", 0),
                "<Authentication> accepts no logon: give a <PasswordFile>, "
                "<AllowAnonymous>true</AllowAnonymous>, or a tcps transport with <CAFile> "
                "(client certificates)" + _SEE,
            )
        if auth.logon_timeout is not None and root.has("LogonTimeout"):
            checker.report(
                where("authentication", 0).child("LogonTimeout"),
                f"<LogonTimeout> is given here and at the root (line "
                f"{root.at('LogonTimeout').line}); they are one setting: keep one",
            )
    if cfg.entitlement is not None and auth is None:
        checker.report(
            where("entitlement", 0),
            "<Entitlement> needs <Authentication>: without it a user name is whatever a "
            "client claims" + _SEE,
        )
    for unserved in unsupported(cfg):
        checker.report(
            where(unserved.section, unserved.number),
            f"{unserved.reason} is not served by this build yet; it is refused rather than "
            "ignored (remove the element to run without it)" + _SEE,
        )
