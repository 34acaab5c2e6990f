"""The configuration loader: an XML file in, a checked `config.model.Config` out.

    load_config(path) -> Config              read, check and build; raises ConfigError
    load_config_text(text, source) -> Config the same from a string (tests, embedded files)
    default_config() -> Config               the embedded default (config/default.xml)
    verify_config(path) -> list[Problem]     every problem in the file; [] when it is usable

docs/configuration.md is the reference of the format: the general rules, every element with its
default, the root limits, what is accepted from AMPS and what is refused.

The work is split by section: `config.schema` (which children each section allows),
`config.rules` (the rules every element follows, and shared value checks), `config.transports`
(`<Transports>`, `<Admin>`, `<Logging>`), `config.txlog` (`<TransactionLog>`), `config.queues`
(`<SOW>`), `config.sow` (`<SOW><Topic>`), `config.actions` (`<Actions>`), `config.limits` (the root limits), `config.security`
(`<Authentication>`, `<Entitlement>`, TLS files, safe defaults, and what this build refuses as
not served yet), `config.replication` (`<Group>`, `<Replication>`); this module reads the root and its own elements, and owns the public functions.

Problems
--------
Every problem in a file is collected, then one `ConfigError` is raised with all of them, sorted
by line: malformed XML (one problem: expat stops there), then element, value and cross-element
problems (duplicate names and ports, queue topics not recorded, ...). See `config.errors`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from importlib import resources
from typing import Any

import msgspec

from .actions import read_actions
from .errors import ConfigError, Problem
from .limits import LIMIT_ELEMENTS
from .model import DEFAULT_CLIENT_MAX_BUFFER_SIZE, DEFAULT_IDLE_POLL, MAX_IDLE_POLL, Config, Limits
from .replication import read_replication
from .rules import Checker, Section, human, instance_name
from .schema import ROOT
from .security import check_security, read_authentication, read_entitlement
from .sow import read_sow
from .transports import read_admin, read_logging, read_transports
from .txlog import read_transaction_log
from .values import parse_interval, parse_size
from .xmltree import Node, XmlError, parse_xml

__all__ = [
    "EMBEDDED_SOURCE",
    "ROOT_TAGS",
    "ConfigError",
    "Problem",
    "default_config",
    "load_config",
    "load_config_text",
    "verify_config",
]

EMBEDDED_SOURCE = "<embedded default>"
ROOT_TAGS = ("TickertapeConfig", "AMPSConfig")
MAX_FILE_SIZE = 16 << 20


# ----------------------------------------------------------------------------------------------
# Public API


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Load and check a configuration file. Raises `ConfigError` listing every problem.

    `env` (default `os.environ`) is where `${NAME}` is looked up; on top of it,
    `TICKERTAPE_CONFIG_PATH`/`_DIRECTORY` and `AMPS_CONFIG_PATH`/`_DIRECTORY` name this file.
    """
    source = os.fspath(path)
    data = _read_file(source)
    absolute = os.path.abspath(source)
    directory = os.path.dirname(absolute)
    builtins = {
        "TICKERTAPE_CONFIG_PATH": absolute,
        "TICKERTAPE_CONFIG_DIRECTORY": directory,
        "AMPS_CONFIG_PATH": absolute,
        "AMPS_CONFIG_DIRECTORY": directory,
    }
    layered = {**(os.environ if env is None else env), **builtins}
    return _load(source, layered, data)


def load_config_text(
    text: str | bytes, source: str = "<text>", *, env: Mapping[str, str] | None = None
) -> Config:
    """Load and check a configuration given as text. Raises `ConfigError`."""
    return _load(source, os.environ if env is None else env, text)


def default_config() -> Config:
    """The embedded default (config/default.xml): what the server runs with no --config."""
    data = resources.files(__package__).joinpath("default.xml").read_bytes()
    return _load(EMBEDDED_SOURCE, {}, data)


def verify_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> list[Problem]:
    """Every problem in a configuration file, in line order; [] when it can be used."""
    try:
        load_config(path, env=env)
    except ConfigError as e:
        return e.problems
    return []


def _read_file(source: str) -> bytes:
    def fail(message: str) -> ConfigError:
        return ConfigError(source, [Problem("", 0, message)])

    try:
        st = os.stat(source)
        if stat.S_ISDIR(st.st_mode):
            raise fail("is a directory; give the path of the XML configuration file")
        if st.st_size > MAX_FILE_SIZE:
            raise fail(
                f"is {st.st_size} bytes, larger than any configuration file "
                f"(limit {MAX_FILE_SIZE >> 20}MB); check the path"
            )
        with open(source, "rb") as f:
            return f.read(MAX_FILE_SIZE + 1)
    except FileNotFoundError:
        raise fail(
            f"configuration file not found (looked in {os.path.abspath(source)}); check the "
            "path, or run without --config to use the embedded default"
        ) from None
    except PermissionError:
        raise fail(
            "permission denied reading the configuration file; make it readable by the "
            "server's user"
        ) from None
    except OSError as e:
        raise fail(f"cannot read the configuration file: {e.strerror or e}") from None


# ----------------------------------------------------------------------------------------------
# The document


def _load(source: str, env: Mapping[str, str], data: str | bytes) -> Config:
    """Reads one document. Sections are read in a fixed order, whatever their order in the file,
    because later ones are checked against earlier ones (the admin port against the transports',
    queues and journal actions against the transaction log)."""
    try:
        root = parse_xml(data)
    except XmlError as e:
        message = f"{e.message} (column {e.column})"
        raise ConfigError(source, [Problem(e.path, e.line, message)]) from None
    checker = Checker(env)
    config = _root(checker, root, source)
    if checker.problems or config is None:
        checker.problems.sort(key=lambda p: p.line)
        raise ConfigError(source, checker.problems)
    return config


def _root(checker: Checker, root: Node, source: str) -> Config | None:
    if root.tag not in ROOT_TAGS:
        checker.report(
            root,
            f"the root element is <{root.tag}>; a configuration starts with "
            "<TickertapeConfig> (or <AMPSConfig>)",
        )
        return None
    sec = Section(checker, root, ROOT)
    name = sec.value("Name", instance_name, "", required=True, hint=" (the instance name)")
    transports_node = sec.one("Transports")
    transports, ports = read_transports(checker, transports_node)
    admin = read_admin(checker, sec.one("Admin"), ports, default_transport=transports_node is None)
    logging = read_logging(checker, sec.one("Logging"))
    tlog, tlog_node = read_transaction_log(checker, sec.one("TransactionLog"))
    queues, sow_topics, max_checkpoints = read_sow(checker, sec.one("SOW"), tlog, tlog_node)
    actions = read_actions(checker, sec.one("Actions"), tlog)
    limits = _limits(checker, sec, [t.max_message_size for t in transports])
    authentication = read_authentication(checker, sec.one("Authentication"))
    if authentication is not None and authentication.logon_timeout is not None:
        limits = msgspec.structs.replace(limits, logon_timeout=authentication.logon_timeout)
    entitlement = read_entitlement(checker, sec.one("Entitlement"))
    group = sec.value("Group", instance_name, None)
    replication = read_replication(checker, sec.one("Replication"), name, transports, tlog, root)
    config = Config(
        name=name,
        transports=tuple(transports),
        admin=admin,
        logging=logging,
        transaction_log=tlog,
        queues=tuple(queues),
        sow_topics=tuple(sow_topics),
        sow_max_checkpoint_size=max_checkpoints,
        actions=tuple(actions),
        limits=limits,
        authentication=authentication,
        entitlement=entitlement,
        group=group,
        replication=replication,
        source=source,
    )
    check_security(checker, sec, config)
    return config


def _limits(checker: Checker, sec: Section, message_sizes: list[int]) -> Limits:
    """The root's per-connection bounds; `message_sizes` are the transports' largest frames."""
    size = sec.value("ClientMaxBufferSize", parse_size, DEFAULT_CLIENT_MAX_BUFFER_SIZE)
    node = sec.one("ClientMaxBufferSize")
    largest = max(message_sizes, default=0)
    if node is not None and size < largest:
        checker.report(
            node,
            f"ClientMaxBufferSize {human(size)} is smaller than the largest MaxMessageSize "
            f"({human(largest)}): one large message would disconnect its subscriber; "
            "raise <ClientMaxBufferSize> or lower <MaxMessageSize>",
        )
    elif node is None and size < largest:
        checker.report(
            sec.node,
            f"a transport allows messages of {human(largest)}, more than the default "
            f"<ClientMaxBufferSize> {human(size)}; add a larger <ClientMaxBufferSize>",
        )
    poll = sec.value("IdlePoll", parse_interval, DEFAULT_IDLE_POLL)
    if not 0 <= poll <= MAX_IDLE_POLL:
        checker.report(
            sec.at("IdlePoll"),
            f"IdlePoll {poll * 1e6:g}us is out of range; give 0 (off) up to 10ms "
            "(longer only burns CPU: a sleeping server wakes within tens of microseconds)",
        )
        poll = DEFAULT_IDLE_POLL
    bounds: dict[str, Any] = {
        field: sec.value(tag, parse, default)
        for tag, (field, parse, default) in LIMIT_ELEMENTS.items()
    }
    offline = bounds["client_offline_threshold"]
    if offline and offline >= size:
        checker.report(
            sec.at("ClientOfflineThreshold"),
            f"ClientOfflineThreshold {human(offline)} is not below ClientMaxBufferSize "
            f"{human(size)}: a lagging subscriber would be disconnected before it falls back "
            "to the journal; lower it, or give 0 to turn the fallback off",
        )
    return Limits(client_max_buffer_size=size, idle_poll=poll, **bounds)
