"""Checks across the configurations of a replication set (`tickertape serve --verify-config
a.xml b.xml ...`): each file has been loaded alone first (`config.loader`); this module looks
at them together. Pure: configurations in, findings out; nothing is read but the destination
instances' password files (to see that a link's user is listed there).

    check_set(configs) -> list[Finding]     errors first, then warnings, then notes
    describe_links(configs) -> list[str]    one line per link, for the report

Levels (docs/configuration.md, "Checking a set of files"):
- "error": the set cannot work as written (a link that cannot log on, an address that is not
  the destination's replication transport, two instances with one name...);
- "warning": it works, with a risk the message names (topics replicated one way only, an
  instance that accepts publishes with no sync destination, messages that never reach an
  instance);
- "note": worth knowing, costs no message (a message reaching an instance along more than one
  pass-through path: the extra copies are dropped as duplicates).

Topic patterns are compared as written: a pattern is "carried back" when the other direction
has the same pattern, or `.*`, or (for a literal topic name) a pattern that matches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from protocol.patterns import compile_pattern

from .model import Config, ReplicationDestination, Transport
from .replication import same_host

__all__ = ["Finding", "check_set", "describe_links"]

Level = Literal["error", "warning", "note"]
_ORDER = {"error": 0, "warning": 1, "note": 2}
_REGEX_CHARS = frozenset("*+?[](){}|^$\\.")


class Finding(msgspec.Struct, frozen=True):
    """One thing found about the set: its level, the instance it is about, and the message."""

    level: Level
    instance: str
    message: str

    def format(self) -> str:
        return f"{self.level}: {self.instance}: {self.message}"


def _group(cfg: Config) -> str:
    return cfg.group or cfg.name


def _fullmatch(pattern: str, text: str) -> bool:
    return compile_pattern(pattern).fullmatch(text) is not None


def check_set(configs: Sequence[Config]) -> list[Finding]:
    """Every finding about the set `configs` (each loaded without problems), errors first."""
    found: list[Finding] = []
    by_name: dict[str, Config] = {}
    for cfg in configs:
        if cfg.name in by_name:
            found.append(
                Finding(
                    "error",
                    cfg.name,
                    f"{cfg.source} and {by_name[cfg.name].source} both have <Name>{cfg.name}"
                    "</Name>; every instance in a set has its own name",
                )
            )
            continue
        by_name[cfg.name] = cfg
    for cfg in by_name.values():
        for dest in cfg.replication.destinations:
            other = by_name.get(dest.name)
            if other is None:
                names = ", ".join(sorted(by_name))
                found.append(
                    Finding(
                        "error",
                        cfg.name,
                        f"destination {dest.name} is not an instance of the set ({names}); "
                        "give its file too, or correct the destination's <Name>",
                    )
                )
                continue
            found += _link(cfg, dest, other)
    found += _both_ways(by_name)
    found += _sync_and_reach(by_name)
    found += _paths(by_name)
    return sorted(found, key=lambda f: _ORDER[f.level])


def describe_links(configs: Sequence[Config]) -> list[str]:
    """`  tt-1 -> tt-2: sync, topics .*` for every destination, in file order."""
    lines = []
    for cfg in configs:
        for d in cfg.replication.destinations:
            kind = "sync" if d.sync else "async"
            if d.sync and d.downgrade_after is not None:
                kind += f", downgraded after {d.downgrade_after:g}s down"
            extra = f", pass-through {d.pass_through}" if d.pass_through else ""
            topics = " ".join(t.name for t in d.topics)
            lines.append(f"  {cfg.name} -> {d.name}: {kind}, topics {topics}{extra}")
    return lines


def _link(src: Config, dest: ReplicationDestination, dst: Config) -> list[Finding]:
    """What is wrong with the link src -> dst as src's destination `dest` describes it."""
    found: list[Finding] = []

    def error(message: str) -> None:
        found.append(Finding("error", src.name, f"destination {dest.name}: {message}"))

    if dest.group != _group(dst):
        error(
            f"<Group>{dest.group}</Group>, but {dst.name}'s group is {_group(dst)} "
            f"({'its <Group>' if dst.group else 'its <Name>, having no <Group>'}); make them "
            "the same (pass-through and loop prevention go by group)"
        )
    listeners = [t for t in dst.transports if t.type == "replication"]
    if not listeners:
        error(
            f"{dst.name} has no replication transport to receive the link; add "
            "<Transport><Type>replication</Type>...</Transport> to its <Transports>"
        )
        return found
    matched = 0
    for address in dest.addresses:
        where = f"{address.host}:{address.port}"
        listener = _listener(listeners, address.host, address.port)
        if listener is None:
            client = _listener(
                [t for t in dst.transports if t.type != "replication"], address.host, address.port
            )
            what = f"is {dst.name}'s client transport {client.name}" if client else "is not"
            ports = ", ".join(f"{t.host}:{t.port}" for t in listeners)
            found.append(
                Finding(
                    "warning",
                    src.name,
                    f"destination {dest.name}: {where} {what} {dst.name}'s replication "
                    f"transport ({ports}); a link there fails",
                )
            )
            continue
        matched += 1
        served = listener.certificate is not None and listener.private_key is not None
        if address.tls and not served:
            error(
                f"{where} is connected with <TLS>true</TLS>, but {dst.name}'s replication "
                f"transport {listener.name} has no <Certificate>; give it one, or remove <TLS>"
            )
        elif served and not address.tls:
            error(
                f"{dst.name}'s replication transport {listener.name} serves TLS; add "
                f"<TLS>true</TLS> to the <Transport> for {where}"
            )
    if not matched:
        error(
            f"none of its addresses is {dst.name}'s replication transport; give "
            + " or ".join(f"{t.host}:{t.port}" for t in listeners)
        )
    auth = dst.authentication
    if auth is not None and dest.user is None:
        error(
            f"{dst.name} has <Authentication>, and the link gives no credentials; add <User> and "
            "<PasswordFile> to this destination"
        )
    elif auth is not None and dest.user is not None and auth.password_file is not None:
        why = _unknown_user(auth.password_file, dest.user)
        if why:
            error(why)
    if dst.entitlement is not None and dest.user is not None:
        admins = [
            r for r in dst.entitlement.roles if r.allow.admin and ({dest.user, "*"} & set(r.users))
        ]
        if not admins:
            error(
                f"user {dest.user} has no role with <Admin>true</Admin> on {dst.name}, and a "
                "replication logon needs admin rights; add the user to such a role"
            )
    return found


def _listener(transports: list[Transport], host: str, port: int) -> Transport | None:
    return next((t for t in transports if t.port == port and same_host(t.host, host)), None)


def _unknown_user(path: str, user: str) -> str | None:
    from protocol.security.passwords import PasswordFileError, load_password_file

    try:
        users = load_password_file(path)
    except (PasswordFileError, OSError):
        return None  # the destination's own file check reports it
    if user not in users:
        return (
            f"user {user} is not in the destination's password file {path}; add it there "
            f"(tickertape passwd {path} {user}) with the password of this <PasswordFile>"
        )
    return None


def _covered(pattern: str, others: Sequence[str]) -> bool:
    if pattern in others or ".*" in others:
        return True
    if _REGEX_CHARS.isdisjoint(pattern):
        return any(_fullmatch(o, pattern) for o in others)
    return False


def _both_ways(by_name: dict[str, Config]) -> list[Finding]:
    found = []
    for cfg in by_name.values():
        for dest in cfg.replication.destinations:
            other = by_name.get(dest.name)
            if other is None:
                continue
            back = next((d for d in other.replication.destinations if d.name == cfg.name), None)
            if back is None:
                continue  # reach (below) says whether anything comes back at all
            theirs = [t.name for t in back.topics]
            one_way = [t.name for t in dest.topics if not _covered(t.name, theirs)]
            if one_way:
                found.append(
                    Finding(
                        "warning",
                        cfg.name,
                        f"topics {', '.join(one_way)} are sent to {other.name} and not sent "
                        f"back: what is published to them on {other.name} never reaches "
                        f"{cfg.name}, so a client failing over from {other.name} to {cfg.name} "
                        f"does not find it; add them to {other.name}'s destination {cfg.name}",
                    )
                )
    return found


def _publishes(cfg: Config) -> bool:
    return cfg.transaction_log is not None and any(t.type != "replication" for t in cfg.transports)


def _sync_and_reach(by_name: dict[str, Config]) -> list[Finding]:
    found = []
    for cfg in by_name.values():
        if _publishes(cfg) and not any(d.sync for d in cfg.replication.destinations):
            found.append(
                Finding(
                    "warning",
                    cfg.name,
                    "accepts publishes and has no sync destination: a message acknowledged "
                    f"`persisted` on {cfg.name} is on its disk only until it has been "
                    "replicated, and is lost with the machine before that; make a "
                    "destination sync to protect it",
                )
            )
    for origin in by_name.values():
        if not _publishes(origin):
            continue
        reached = {name for name, _ in _carriers(origin, by_name)}
        for cfg in by_name.values():
            if cfg.name != origin.name and cfg.name not in reached:
                found.append(
                    Finding(
                        "warning",
                        cfg.name,
                        f"messages published on {origin.name} never reach {cfg.name}: no "
                        f"destination {cfg.name} on {origin.name}, and no <PassThrough> on the "
                        f"way matches group {_group(origin)}",
                    )
                )
    return found


def _carriers(origin: Config, by_name: dict[str, Config]) -> list[tuple[str, str]]:
    """The links (to, from) that carry messages published on `origin`, topics aside: its own
    destinations, then every destination of an instance that has them whose `<PassThrough>`
    matches the origin's group (never back to the origin: loop prevention)."""
    group = _group(origin)
    links: list[tuple[str, str]] = []
    have = {origin.name}
    todo = [origin.name]
    while todo:
        name = todo.pop(0)
        cfg = by_name.get(name)
        if cfg is None:
            continue
        for d in cfg.replication.destinations:
            if d.name == origin.name or d.name not in by_name:
                continue
            if name != origin.name and not (d.pass_through and _fullmatch(d.pass_through, group)):
                continue
            links.append((d.name, name))
            if d.name not in have:
                have.add(d.name)
                todo.append(d.name)
    return links


def _paths(by_name: dict[str, Config]) -> list[Finding]:
    found = []
    for origin in by_name.values():
        arrivals: dict[str, list[str]] = {}
        for to, frm in _carriers(origin, by_name):
            arrivals.setdefault(to, []).append(frm)
        for name, froms in arrivals.items():
            if len(froms) > 1:
                found.append(
                    Finding(
                        "note",
                        name,
                        f"receives messages published on {origin.name} from "
                        f"{' and '.join(froms)} (pass-through); the later copy of each is "
                        "dropped as a duplicate, at the cost of sending it",
                    )
                )
    return found
