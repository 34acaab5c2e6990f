"""The replication part of the configuration: the root's `<Group>` and `<Replication>`.

docs/configuration.md ("`<Replication>`") describes every element, docs/replication.md what
replication does. This module checks one file; `config.replication_set` checks several files
against each other (`tickertape serve --verify-config a.xml b.xml ...`).

    <Replication>
      <QueueOwnerFailover>30s</QueueOwnerFailover>
      <Destination>                       one per instance this one pushes its journal to
        <Name>tt-2</Name>                 R   the other instance's <Name>; not this one's
        <Group>ny</Group>                     its <Group>; default: its <Name>
        <SyncType>sync</SyncType>         R   sync | async
        <Transport>                       R+  tried in order
          <InetAddr>host:port</InetAddr>  R   its replication transport
          <Type>replication</Type>            or amps-replication (the only types)
          <TLS>true</TLS>                     connect with TLS; then, optional:
          <CAFile/> <Certificate/> <PrivateKey/>
        </Transport>
        <Topic><Name>regex</Name></Topic> R+  topics (and queue names) carried
        <PassThrough>regex</PassThrough>      forward what came here from these groups
        <DowngradeAfter>30s</DowngradeAfter>  sync only
        <User/> <PasswordFile/>               log on to the destination (both or neither)
      </Destination>
    </Replication>

Checks in one file: every value, destination names unique and not this instance's, no two
destinations on one address nor one on this instance's own replication transport, a journal to
replicate from and to, literal destination topics recorded by the journal.
"""

from __future__ import annotations

from typing import cast

from protocol.patterns import PatternError, compile_pattern

from .model import (
    MessageType,
    Replication,
    ReplicationAddress,
    ReplicationDestination,
    TopicSpec,
    TransactionLog,
    Transport,
)
from .rules import Checker, Section, boolean, enum, instance_name, message_type, positive_interval
from .schema import DESTINATION, DESTINATION_TOPIC, DESTINATION_TRANSPORT, REPLICATION
from .security import is_loopback
from .txlog import topic_pattern
from .values import parse_inet_addr
from .xmltree import Node

__all__ = ["DEFAULT_QUEUE_OWNER_FAILOVER", "group_pattern", "read_replication", "same_host"]

DEFAULT_QUEUE_OWNER_FAILOVER = 30.0
_REGEX_CHARS = frozenset("*+?[](){}|^$\\.")
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def group_pattern(text: str) -> str:
    """A `<PassThrough>`: a regular expression (RE2) over group names, matched whole."""
    try:
        compile_pattern(text)
    except PatternError as e:
        raise ValueError(
            f"invalid regular expression {text!r}: {e.why}; <PassThrough> is a regular "
            "expression over group names, matched whole (.* = every group)"
        ) from None
    return text


def _destination_addr(text: str) -> tuple[str, int]:
    host, port = parse_inet_addr(text)
    if port == 0:
        raise ValueError(
            f"port 0 in {text!r}: a destination's <InetAddr> is where its replication "
            "transport listens; give that port"
        )
    if host in _WILDCARD_HOSTS:
        raise ValueError(
            f"{host!r} in {text!r} means every interface when listening, and cannot be "
            "connected to; give the destination's host name or address"
        )
    return host, port


def _sync_type(text: str) -> bool:
    return enum("sync", "async")(text) == "sync"


def same_host(a: str, b: str) -> bool:
    """Whether two hosts of addresses name the same machine, as far as the text tells: equal,
    or both loopback (`localhost`, `127.0.0.1`, `::1`); a wildcard listener matches any host."""
    if a == b or a in _WILDCARD_HOSTS or b in _WILDCARD_HOSTS:
        return True
    return is_loopback(a) and is_loopback(b)


def read_replication(
    checker: Checker,
    node: Node | None,
    name: str,
    transports: list[Transport],
    tlog: TransactionLog | None,
    root: Node,
) -> Replication:
    """`<Replication>`: an empty `Replication` without one. `name` is this instance's
    `<Name>`, `transports` its transports (a destination must not be one of its own)."""
    repl_transports = [t for t in transports if t.type == "replication"]
    if repl_transports and tlog is None:
        checker.report(
            root,
            "a replication transport receives messages into the journal, and there is no "
            "<TransactionLog>; add one (with the topics replicated here) or remove the transport",
        )
    if node is None:
        return Replication()
    sec = Section(checker, node, REPLICATION)
    failover = sec.value("QueueOwnerFailover", positive_interval, DEFAULT_QUEUE_OWNER_FAILOVER)
    dnodes = sec.many("Destination")
    if dnodes and tlog is None:
        checker.report(
            node,
            "replication sends the journal's records, and there is no <TransactionLog>; add "
            "one that records the topics the destinations carry",
        )
    names: dict[str, Node] = {}
    addresses: dict[tuple[str, int], Node] = {}
    destinations = []
    for dnode in dnodes:
        dest_name, found, dest = _destination(checker, dnode, name, tlog)
        if dest_name is not None:
            if dest_name in names:
                checker.report(
                    dnode,
                    f"destination name {dest_name!r} is already used at line "
                    f"{names[dest_name].line}; one <Destination> per instance (give it several "
                    "<Transport>s for failover)",
                )
            names.setdefault(dest_name, dnode)
        for address, where in found:
            key = (address.host, address.port)
            if key in addresses:
                checker.report(
                    where,
                    f"{address.host}:{address.port} is already a destination's address at "
                    f"line {addresses[key].line}; each instance listens on its own address",
                )
            addresses.setdefault(key, where)
            for own in repl_transports:
                if own.port == address.port and same_host(own.host, address.host):
                    checker.report(
                        where,
                        f"{address.host}:{address.port} is this instance's own replication "
                        f"transport {own.name!r}; give the address of the destination's",
                    )
        if dest is not None:
            destinations.append(dest)
    return Replication(destinations=tuple(destinations), queue_owner_failover=failover)


def _destination(
    checker: Checker, node: Node, own_name: str, tlog: TransactionLog | None
) -> tuple[str | None, list[tuple[ReplicationAddress, Node]], ReplicationDestination | None]:
    """The destination's name and addresses (with their `<InetAddr>` nodes) as far as they
    could be read, and the destination itself when it has no problem."""
    d = Section(checker, node, DESTINATION)
    name = d.value(
        "Name", instance_name, None, required=True, hint=" (the other instance's <Name>)"
    )
    if name is not None and name == own_name:
        checker.report(
            d.at("Name"),
            f"destination {name!r} is this instance's own <Name>; a destination is another "
            "instance (each instance in a set has its own <Name>)",
        )
        name = None
    group = d.value("Group", instance_name, None)
    sync = d.value("SyncType", _sync_type, None, required=True, hint=" (sync or async)")
    downgrade = d.value("DowngradeAfter", positive_interval, None)
    if downgrade is not None and sync is False:
        checker.report(
            d.at("DowngradeAfter"),
            "<DowngradeAfter> applies to sync destinations only (an async one never holds "
            "acks); remove it, or write <SyncType>sync</SyncType>",
        )
        downgrade = None
    pass_through = d.value("PassThrough", group_pattern, None)
    found = [(_address(checker, n), n.child("InetAddr")) for n in d.many("Transport")]
    addresses = [(a, where) for a, where in found if a is not None]
    if not d.has("Transport"):
        d.missing(
            "Transport",
            " with the <InetAddr> of the destination's replication transport (several for "
            "failover, tried in order)",
        )
    topics = [t for t in (_topic(checker, n, tlog) for n in d.many("Topic")) if t]
    if not d.has("Topic"):
        d.missing(
            "Topic",
            " with a <Name> regex of the topics to replicate (.* = every recorded topic; "
            "queues are carried by their names)",
        )
    user = d.text("User")
    password_file = d.text("PasswordFile")
    if d.has("User") != d.has("PasswordFile"):
        given, other = ("User", "PasswordFile") if d.has("User") else ("PasswordFile", "User")
        d.missing(other, " (a logon to the destination needs both <User> and <PasswordFile>)")
    if password_file is not None:
        problem = _password_problem(password_file, user)
        if problem:
            checker.report(d.at("PasswordFile"), problem)
    if (
        name is None
        or sync is None
        or not addresses
        or len(addresses) != len(found)
        or not topics
        or len(topics) != len(d.many("Topic"))
    ):
        return name, addresses, None
    return (
        name,
        addresses,
        ReplicationDestination(
            name=name,
            group=group or name,
            sync=sync,
            addresses=tuple(a for a, _ in addresses),
            topics=tuple(topics),
            pass_through=pass_through,
            downgrade_after=downgrade,
            user=user,
            password_file=password_file,
        ),
    )


def _address(checker: Checker, node: Node) -> ReplicationAddress | None:
    t = Section(checker, node, DESTINATION_TRANSPORT)
    addr = t.value(
        "InetAddr",
        _destination_addr,
        None,
        required=True,
        hint=" (host:port of the destination's replication transport)",
    )
    kind = t.value("Type", _link_type, "replication")
    tls = t.value("TLS", boolean, False)
    ca_file = t.text("CAFile")
    certificate = t.text("Certificate")
    private_key = t.text("PrivateKey")
    if not tls:
        for element in ("CAFile", "Certificate", "PrivateKey"):
            if t.has(element):
                checker.report(
                    t.at(element),
                    f"<{element}> is only used over TLS; add <TLS>true</TLS> or remove it",
                )
        ca_file = certificate = private_key = None
    else:
        for element, other in (("Certificate", "PrivateKey"), ("PrivateKey", "Certificate")):
            if t.has(element) and not t.has(other):
                t.missing(other, " (a client certificate needs its key)")
        if ca_file is not None or (certificate is not None and private_key is not None):
            from protocol.security.tls import TlsError, client_context

            try:
                client_context(ca_file, certificate, private_key, check_hostname=False)
            except TlsError as e:
                message = f"{e.path}: {e.reason}" if e.path else e.reason
                checker.report(t.at(e.element), message)
    if addr is None or kind is None:
        return None
    return ReplicationAddress(
        host=addr[0],
        port=addr[1],
        tls=tls,
        ca_file=ca_file,
        certificate=certificate if private_key else None,
        private_key=private_key if certificate else None,
    )


def _link_type(text: str) -> str:
    if text.lower() in ("replication", "amps-replication"):
        return "replication"
    raise ValueError(
        f"a destination's <Transport> is a replication link, not {text!r}; write "
        "<Type>replication</Type> (amps-replication is the same), or leave <Type> out"
    )


def _topic(checker: Checker, node: Node, tlog: TransactionLog | None) -> TopicSpec | None:
    t = Section(checker, node, DESTINATION_TOPIC)
    pattern = t.value("Name", topic_pattern, None, required=True, hint=" (a topic regex)")
    mtype = t.value("MessageType", message_type, "json")
    if pattern is None:
        return None
    if tlog is not None and _REGEX_CHARS.isdisjoint(pattern) and not tlog.records_topic(pattern):
        checker.report(
            t.at("Name"),
            f"topic {pattern!r} is not recorded by the <TransactionLog>, and replication sends "
            f"recorded messages only; add <Topic><Name>{pattern}</Name></Topic> to "
            "<TransactionLog>",
        )
    return TopicSpec(name=pattern, message_type=cast(MessageType, mtype))


def _password_problem(path: str, user: str | None) -> str | None:
    """Why the destination's password file cannot be used, or None. The file holds the
    password in clear on its first line (the server's own password file holds hashes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except FileNotFoundError:
        return (
            f"{path}: not found; give a file whose first line is {user or 'the user'}'s "
            "password on the destination (mode 0600)"
        )
    except IsADirectoryError:
        return f"{path}: is a directory; give the file holding the password"
    except OSError as e:
        return f"{path}: cannot be read ({e.strerror or e}); make it readable by the server"
    first = head.split(b"\n", 1)[0].strip()
    if not first:
        return f"{path}: the first line is empty; write the password on it"
    if b":scrypt$" in head or head.startswith(b"# tickertape password file"):
        return (
            f"{path}: is a server password file (hashes, written by `tickertape passwd`); "
            "give a file whose first line is the password itself"
        )
    return None
