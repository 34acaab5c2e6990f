"""The XML configuration format, and the loader that turns it into a `config.model.Config`.

    load_config(path) -> Config              read, check and build; raises ConfigError
    load_config_text(text, source) -> Config the same from a string (tests, embedded files)
    default_config() -> Config               the embedded default (config/default.xml)
    verify_config(path) -> list[Problem]     every problem in the file; [] when it is usable

The format is shaped after AMPS's configuration, so an AMPS user recognizes every element
(config/examples/full.xml uses and explains every element; docs/configuration-limits.md the limits).

General rules
-------------
- The root is `<TickertapeConfig>`; `<AMPSConfig>` is the same thing. Only `<Name>` is required.
- Element names are case-sensitive. Enumerated values (`tcp`, `at-least-once`, `info`, ...) are
  not. Values are stripped of surrounding whitespace; an empty element is a problem.
- Unknown elements are problems (typos are caught, with a "did you mean" where one is close).
  Elements AMPS has and Tickertape does not are reported as "not supported", never ignored.
  Attributes are not used anywhere. A value element may not contain elements, and a section
  may not contain text.
- `${NAME}` / `${NAME:-default}` in any value is replaced from the environment after parsing,
  value by value (so a variable can never inject XML, and line numbers stay true); an unset
  variable without a default is a problem naming it. `$${` is a literal `${`. When loading a
  file, `TICKERTAPE_CONFIG_PATH` / `TICKERTAPE_CONFIG_DIRECTORY` (and the AMPS spellings
  `AMPS_CONFIG_PATH` / `AMPS_CONFIG_DIRECTORY`) name the file and its directory, so paths can be
  relative to the configuration: `${TICKERTAPE_CONFIG_DIRECTORY}/data`.
- Sizes: `500KB`, `64MB`, `1GB` (binary units), or plain bytes. Intervals: `100ms`, `30s`, `5m`,
  `1h`, `7d`, or plain seconds. InetAddr: `port` (binds 127.0.0.1, unlike AMPS), `host:port`,
  `[ipv6]:port`. Details in `config.values`.
- Relative paths (journal, archive, log files) are relative to the server's working directory.
- Safety: no DOCTYPE, DTD or entity declarations are accepted (see `config.xmltree`).

Elements (default in brackets; R = required when the parent is present)
-----------------------------------------------------------------------
    <TickertapeConfig>
      <Name> R                instance name: no whitespace and none of / \\ $ ~
      <ClientMaxBufferSize>   [64MB] output queued to one connection before it is closed as
                              `slow client`; at least every transport's MaxMessageSize
      <IdlePoll>              [100us] after network input, keep polling this long before
                              sleeping (0 = off, at most 10ms): lower round-trip latency for
                              at most this much CPU per burst of input
      <Transports>            [absent: one json-tcp transport on 127.0.0.1:9007]
        <Transport>           one or more
          <Name> R            unique
          <InetAddr> R        ports unique across transports and Admin (0 = ephemeral)
          <Type>              [tcp] | tcps (then <Certificate> and <PrivateKey> are required)
          <MessageType>       [json]
          <Protocol>          [amps] (`json` is AMPS's synonym)
          <MaxMessageSize>    [16MB] 1KB .. 4GB-1 (the frame length is a u32)
          <Certificate>, <PrivateKey>   PEM files, tcps only
      <Admin>                 [absent: no admin endpoint]
        <InetAddr>            [127.0.0.1:8085]
        <Interval>            [10s] statistics sampling interval
      <Logging>               [absent: stdout at info; present but empty: log nothing]
        <Target>
          <Protocol> R        stdout | stderr | file
          <Level>             [info] debug | info | warning | error; AMPS levels are mapped:
                              developer, trace, stats -> debug; critical, emergency -> error
                              (note: AMPS treats `debug` as info; here it is Python's DEBUG)
          <FileName>          required for file, refused otherwise; reopened on SIGHUP
      <TransactionLog>        [absent: no journal, so no bookmarks and no queues]
        <JournalDirectory> R
        <JournalArchiveDirectory>     where archive-journal puts archives
        <JournalSize>         [256MB] at least 64KB; `MinJournalSize` is AMPS's synonym
        <Durability>          [fsync] | write (persisted = written to the OS: survives a process
                              crash but not a power loss; never the default)
        <Topic>               zero or more; no Topic = record nothing
          <Name> R            a regular expression matched against the whole topic name
          <MessageType>       [json]
      <SOW>
        <Queue>               (`QueueDefinition` is AMPS's legacy synonym)
          <Name> R            literal topic name, unique (`Topic` is AMPS's synonym)
          <UnderlyingTopic>   [= Name] literal; must be recorded by the TransactionLog
          <MessageType>       [json]
          <Semantics>         [at-least-once] | at-most-once
          <LeasePeriod>       [none: leases never expire] interval > 0
          <MaxPerSubscriptionBacklog>  [1] >= 1
          <MaxBacklog>        [unlimited] >= 1
          <FairnessModel>     [proportional; round-robin for at-most-once, the only one allowed
                              there] fast | round-robin | proportional
          <MaxDeliveries>     [0 = unlimited]
          <MaxCancels>        [0 = unlimited]
          <Expiration>        [never] interval > 0
          <Leasing>           [sublet] | strict
          <Filter>            only matching messages join the queue
          <BarrierExpression> filter marking barrier messages
          <DeadLetterTopic>   literal topic that receives expired messages (Tickertape's own)
          LeasePeriod, MaxDeliveries, MaxCancels and Leasing are refused on at-most-once queues,
          where they would do nothing.
      <Actions>
        <Action>
          <On> R              exactly one
            <Module> R        amps-action-on-schedule | amps-action-on-startup
            <Options>         schedule: <Every> R (timer `1h`; daily `17:45`; weekly
                              `Saturday at 00:30`; `Z` suffix = UTC), <Name>
          <Do> R              one or more, run in order
            <Module> R        amps-action-do-archive-journal | -compress-journal |
                              -remove-journal (<Age> R) | tickertape-action-do-compact-journal
                              (<Retention> R). `amps-action-` and `tickertape-action-` prefixes
                              are interchangeable. Journal steps need a TransactionLog;
                              archive-journal needs a JournalArchiveDirectory.
            <Options>         as listed for the module
      <Authentication>        kept as written (RawElement) for a later issue
    </TickertapeConfig>

Problems
--------
Every problem in a file is collected, then one `ConfigError` is raised with all of them, sorted
by line: malformed XML (one problem: expat stops there), then element, value and cross-element
problems (duplicate names and ports, queue topics not recorded, ...). See `config.errors`.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections import ChainMap
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, TypeVar

from protocol.patterns import PatternError, compile_pattern

from .errors import ConfigError, Problem
from .limits import LIMIT_ELEMENTS
from .model import (
    DEFAULT_ADMIN_PORT,
    DEFAULT_CLIENT_MAX_BUFFER_SIZE,
    DEFAULT_HOST,
    DEFAULT_IDLE_POLL,
    DEFAULT_JOURNAL_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_PORT,
    MAX_IDLE_POLL,
    Action,
    ActionStep,
    ActionTrigger,
    Admin,
    Config,
    Limits,
    LogTarget,
    QueueSpec,
    RawElement,
    TopicSpec,
    TransactionLog,
    Transport,
)
from .values import parse_count, parse_inet_addr, parse_interval, parse_size, substitute_env
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
MIN_JOURNAL_SIZE = 64 << 10
MIN_MAX_MESSAGE_SIZE = 1 << 10
MAX_MAX_MESSAGE_SIZE = (1 << 32) - 1

T = TypeVar("T")


# ----------------------------------------------------------------------------------------------
# Public API


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Load and check a configuration file. Raises `ConfigError` listing every problem."""
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
    return _Loader(source, ChainMap(builtins, os.environ if env is None else env)).load(data)


def load_config_text(
    text: str | bytes, source: str = "<text>", *, env: Mapping[str, str] | None = None
) -> Config:
    """Load and check a configuration given as text. Raises `ConfigError`."""
    return _Loader(source, os.environ if env is None else env).load(text)


def default_config() -> Config:
    """The embedded default (config/default.xml): what the server runs with no --config."""
    data = resources.files(__package__).joinpath("default.xml").read_bytes()
    return _Loader(EMBEDDED_SOURCE, {}).load(data)


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
# The schema: which children each section allows


class _Spec:
    """The children a section allows. `many` ones may repeat; `synonyms` map AMPS spellings to
    ours; `unsupported` are AMPS elements we name as such rather than call unknown; `misnamed`
    are names people are known to get wrong, with the right one (too far apart for difflib)."""

    def __init__(
        self,
        tag: str,
        one: tuple[str, ...] = (),
        many: tuple[str, ...] = (),
        synonyms: Mapping[str, str] | None = None,
        unsupported: Mapping[str, str] | None = None,
        misnamed: Mapping[str, str] | None = None,
    ) -> None:
        self.tag = tag
        self.children = {name: False for name in one} | {name: True for name in many}
        self.synonyms = dict(synonyms or {})
        self.unsupported = dict(unsupported or {})
        self.misnamed = dict(misnamed or {})
        _WHERE.setdefault(tag, [])
        for name in (*self.children, *self.synonyms):
            _WHERE.setdefault(name, []).append(tag)


_WHERE: dict[str, list[str]] = {}  # element name -> sections it may appear in (for hints)

_NO_REPLICATION = "replication is not supported yet"
_SLOW_CLIENT = "Tickertape bounds each connection with <ClientMaxBufferSize> at the root"

ROOT = _Spec(
    "TickertapeConfig",
    one=(
        "Name",
        "ClientMaxBufferSize",
        "IdlePoll",
        *LIMIT_ELEMENTS,
        "Transports",
        "Admin",
        "Logging",
        "TransactionLog",
        "SOW",
        "Actions",
        "Authentication",
    ),
    unsupported={
        "Group": _NO_REPLICATION,
        "Replication": _NO_REPLICATION,
        "Include": "the configuration is one file",
        "MessageTypes": "json is built in and the only message type",
        "Modules": "plug-in modules are not supported",
        "Entitlement": "entitlements are not supported yet",
        "MessageMemoryLimit": _SLOW_CLIENT,
        "MessageDiskLimit": _SLOW_CLIENT,
        "MessageDiskPath": _SLOW_CLIENT,
        "ClientMaxCapacity": _SLOW_CLIENT,
        "ProcessorAffinity": "not applicable to a Python server",
    },
    misnamed={
        "ClientBufferThreshold": "ClientMaxBufferSize",
        "SlowClientDisconnect": "ClientMaxBufferSize",
        "Queues": "SOW",
    },
)
TRANSPORTS = _Spec("Transports", many=("Transport",))
TRANSPORT = _Spec(
    "Transport",
    one=(
        "Name",
        "Type",
        "InetAddr",
        "MessageType",
        "Protocol",
        "MaxMessageSize",
        "Certificate",
        "PrivateKey",
    ),
    unsupported={
        "InitialState": "transports always start enabled",
        "Authentication": "per-transport authentication is not supported; use the root's",
        "Entitlement": "entitlements are not supported yet",
        "MessageMemoryLimit": _SLOW_CLIENT,
        "MessageDiskLimit": _SLOW_CLIENT,
        "MessageDiskPath": _SLOW_CLIENT,
        "ClientMaxCapacity": _SLOW_CLIENT,
        "ClientMessageAgeLimit": _SLOW_CLIENT,
        "TransportFilter": "transport filters are not supported",
        "Ciphers": "TLS settings other than Certificate and PrivateKey are not supported yet",
        "SecureSocketProtocols": "TLS settings other than Certificate/PrivateKey are not supported",
        "VerifyClient": "client certificates are not supported yet",
        "CAFile": "client certificates are not supported yet",
        "CAPath": "client certificates are not supported yet",
    },
)
ADMIN = _Spec(
    "Admin",
    one=("InetAddr", "Interval"),
    unsupported={
        "FileName": "statistics are kept in memory only",
        "SQLTransport": "statistics are served as JSON and Prometheus text",
    },
)
LOGGING = _Spec("Logging", many=("Target",))
TARGET = _Spec(
    "Target",
    one=("Protocol", "Level", "FileName"),
    unsupported={
        "Levels": "give one lower bound in <Level>",
        "IncludeErrors": "log filtering by error id is not supported",
        "ExcludeErrors": "log filtering by error id is not supported",
        "RotationThreshold": "rotate with logrotate: SIGHUP reopens log files",
        "Ident": "syslog is not supported; log to stdout under systemd",
        "Options": "syslog is not supported; log to stdout under systemd",
        "Facility": "syslog is not supported; log to stdout under systemd",
    },
)
TRANSACTION_LOG = _Spec(
    "TransactionLog",
    one=("JournalDirectory", "JournalArchiveDirectory", "JournalSize", "Durability"),
    many=("Topic",),
    synonyms={"MinJournalSize": "JournalSize"},
    misnamed={"ArchiveDirectory": "JournalArchiveDirectory", "SyncMode": "Durability"},
    unsupported={
        "PreallocatedJournalFiles": "segments are created as needed",
        "FlushInterval": "the journal uses group commit; there is no flush interval to tune",
        "O_DIRECT": "the journal does not use O_DIRECT",
        "InactiveClientAckExpiration": "publisher sequence records are kept for good",
        "CompressedJournalCacheMemoryLimit": "not applicable",
    },
)
TOPIC = _Spec(
    "Topic", one=("Name", "MessageType"), unsupported={"ExcludeValidation": _NO_REPLICATION}
)
SOW = _Spec(
    "SOW",
    many=("Queue",),
    synonyms={"QueueDefinition": "Queue"},
    unsupported={
        "Topic": "SOW topics (last value per key) are not supported yet; only <Queue>",
        "View": "views are not supported",
        "ConflatedTopic": "conflated topics are not supported; use the conflation option",
        "LocalQueue": "write <Queue> (there is no replication, so every queue is local)",
        "GroupLocalQueue": "write <Queue> (there is no replication, so every queue is local)",
    },
)
QUEUE = _Spec(
    "Queue",
    one=(
        "Name",
        "UnderlyingTopic",
        "MessageType",
        "Semantics",
        "LeasePeriod",
        "MaxPerSubscriptionBacklog",
        "MaxBacklog",
        "FairnessModel",
        "MaxDeliveries",
        "MaxCancels",
        "Expiration",
        "Leasing",
        "Filter",
        "BarrierExpression",
        "DeadLetterTopic",
    ),
    synonyms={"Topic": "Name"},
    misnamed={
        "LeaseDuration": "LeasePeriod",
        "LeaseTime": "LeasePeriod",
        "DeliveryFairness": "FairnessModel",
        "Fairness": "FairnessModel",
        "DeadLetterQueue": "DeadLetterTopic",
        "MaxRedeliveries": "MaxDeliveries",
    },
    unsupported={
        "DefaultPublishTarget": "the underlying topic is a literal name; publish to it",
        "ExpirationModel": "a message's own expiration (e) and the queue's <Expiration> apply",
        "RecoveryPoint": "queue state is always rebuilt from the whole journal",
        "Priority": "priority queues are not supported",
        "FileBackedMetadata": "queue metadata is an in-memory index over the journal",
        "TargetQueueDepth": "not applicable",
        "DeferredAckExpiration": "not applicable",
        "InitialOwner": _NO_REPLICATION,
        "GroupLocalQueueDomain": _NO_REPLICATION,
    },
)
ACTIONS = _Spec("Actions", many=("Action",))
ACTION = _Spec(
    "Action", one=("On",), many=("Do",), unsupported={"If": "conditions are not supported"}
)
ON = _Spec("On", one=("Module", "Options"))
DO = _Spec("Do", one=("Module", "Options"))

# Action modules: short name -> (options allowed, options required)
_TRIGGERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "schedule": (("Every", "Name"), ("Every",)),
    "startup": ((), ()),
}
_STEPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "archive-journal": (("Age",), ("Age",)),
    "compress-journal": (("Age",), ("Age",)),
    "remove-journal": (("Age",), ("Age",)),
    "compact-journal": (("Retention",), ("Retention",)),
}
_OPTION_SPECS = {
    (kind, module): _Spec("Options", one=allowed)
    for kind, table in (("on", _TRIGGERS), ("do", _STEPS))
    for module, (allowed, _required) in table.items()
}
_MODULE_PREFIXES = ("amps-action-", "tickertape-action-")

_LOG_LEVELS = {
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "error": "error",
    "developer": "debug",
    "trace": "debug",
    "stats": "debug",
    "critical": "error",
    "emergency": "error",
}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAILY = re.compile(
    r"(?:(?P<day>[A-Za-z]+)\s+at\s+)?(?P<h>[0-9]{1,2}):(?P<m>[0-9]{2})(?P<z>[Zz])?", re.IGNORECASE
)
_NAME_FORBIDDEN = re.compile(r"[\s/\\$~]")
_TOPIC_FORBIDDEN = re.compile(r"[\s*+?\[\](){}|^$\\]")


# ----------------------------------------------------------------------------------------------
# Value parsers: text -> value, or ValueError with a message that says what to write


def _enum(*choices: str, aliases: Mapping[str, str] | None = None) -> Callable[[str], str]:
    table = {c: c for c in choices} | dict(aliases or {})

    def parse(text: str) -> str:
        value = table.get(text.lower())
        if value is None:
            raise ValueError(f"invalid value {text!r}; use one of: {', '.join(choices)}")
        return value

    return parse


def _at_least(parse: Callable[[str], T], low: Any, describe: str) -> Callable[[str], T]:
    def checked(text: str) -> T:
        value = parse(text)
        if value < low:  # type: ignore[operator]
            raise ValueError(f"{text!r} is below the minimum {describe}; write {low} or more")
        return value

    return checked


def _positive_interval(text: str) -> float:
    value = parse_interval(text)
    if value <= 0:
        raise ValueError(f"interval {text!r} must be greater than zero")
    return value


def _instance_name(text: str) -> str:
    if _NAME_FORBIDDEN.search(text):
        raise ValueError(
            f"invalid instance name {text!r}; use no whitespace and none of / \\ $ ~ "
            "(it is part of file names and publisher ids)"
        )
    return text


def _literal_topic(text: str) -> str:
    if _TOPIC_FORBIDDEN.search(text):
        raise ValueError(
            f"{text!r} is not a literal topic name; use no whitespace and none of "
            "* + ? [ ] ( ) { } | ^ $ \\ (regular expressions are not allowed here)"
        )
    if text.startswith("/AMPS"):
        raise ValueError(f"topic names starting with /AMPS are reserved: {text!r}")
    return text


def _message_type(text: str) -> str:
    return _enum("json")(text)


def _size_between(low: int, high: int | None, name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_size(text)
        if value < low:
            hint = " (a plain number is bytes: add a unit such as MB)" if text.isdigit() else ""
            raise ValueError(f"{name} {text!r} is below the minimum {_human(low)}{hint}")
        if high is not None and value > high:
            raise ValueError(f"{name} {text!r} is above the maximum {high} bytes{_why(name)}")
        return value

    return parse


def _why(name: str) -> str:
    if name == "MaxMessageSize":
        return ", the largest frame a 4-byte length can describe"
    return ""


def _human(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"


def _every(text: str) -> tuple[float | None, tuple[int, int] | None, int | None, bool]:
    """`<Every>`: (interval, at, weekday, utc). Timer, daily time or weekly time."""
    try:
        return _positive_interval(text), None, None, False
    except ValueError:
        pass
    m = _DAILY.fullmatch(text)
    if m:
        hour, minute = int(m.group("h")), int(m.group("m"))
        weekday = None
        if m.group("day"):
            day = m.group("day").lower()
            matches = [i for i, d in enumerate(_WEEKDAYS) if d == day or d[:3] == day]
            if not matches:
                raise ValueError(f"unknown weekday {m.group('day')!r} in {text!r}")
            weekday = matches[0]
        if hour > 23 or minute > 59:
            raise ValueError(f"invalid time of day in {text!r}; use 00:00 to 23:59")
        return None, (hour, minute), weekday, bool(m.group("z"))
    raise ValueError(
        f"invalid schedule {text!r}; write an interval (30m, 1h, 1d), a daily time (17:45, or "
        "17:45Z for UTC) or a weekly time (Saturday at 00:30)"
    )


# ----------------------------------------------------------------------------------------------
# The loader


class _Section:
    """A section element whose children have been checked against its `_Spec`."""

    def __init__(self, loader: _Loader, node: Node, spec: _Spec) -> None:
        self.loader = loader
        self.node = node
        self.found: dict[str, list[Node]] = {}
        loader.check_section(node)
        for child in node.children:
            name = spec.synonyms.get(child.tag, child.tag)
            if name not in spec.children:
                loader.report(child, _unknown(child.tag, node.tag, spec))
                continue
            seen = self.found.setdefault(name, [])
            if seen and not spec.children[name]:
                also = f" (also written <{seen[0].tag}>)" if seen[0].tag != child.tag else ""
                loader.report(
                    child,
                    f"<{name}> is given more than once in <{node.tag}>{also}, first at line "
                    f"{seen[0].line}; keep one",
                )
                continue
            seen.append(child)

    def has(self, name: str) -> bool:
        return name in self.found

    def one(self, name: str) -> Node | None:
        nodes = self.found.get(name)
        return nodes[0] if nodes else None

    def many(self, name: str) -> list[Node]:
        return self.found.get(name, [])

    def missing(self, name: str, hint: str = "") -> None:
        self.loader.report(
            self.node, f"missing <{name}> in <{self.node.tag}>; add <{name}>...</{name}>{hint}"
        )

    def value(
        self,
        name: str,
        parse: Callable[[str], T],
        default: T,
        *,
        required: bool = False,
        hint: str = "",
    ) -> T:
        """The parsed value of child `name`; `default` when it is absent or has a problem."""
        node = self.one(name)
        if node is None:
            if required:
                self.missing(name, hint)
            return default
        text = self.loader.leaf(node)
        if text is None:
            return default
        try:
            return parse(text)
        except ValueError as e:
            self.loader.report(node, str(e))
            return default

    def text(self, name: str, *, required: bool = False, hint: str = "") -> str | None:
        return self.value(name, str, None, required=required, hint=hint)


def _unknown(tag: str, parent: str, spec: _Spec) -> str:
    if tag in spec.unsupported:
        return f"<{tag}> is not supported by Tickertape ({spec.unsupported[tag]}); remove it"
    if tag in spec.misnamed:
        return f"unknown element <{tag}> in <{parent}>; did you mean <{spec.misnamed[tag]}>?"
    known = [*spec.children, *spec.synonyms]
    for name in known:
        if name.lower() == tag.lower():
            return f"unknown element <{tag}>; element names are case-sensitive: write <{name}>"
    close = difflib.get_close_matches(tag, known, n=1, cutoff=0.75)
    if close:
        return f"unknown element <{tag}> in <{parent}>; did you mean <{close[0]}>?"
    elsewhere = [p for p in _WHERE.get(tag, []) if p != parent]
    if elsewhere:
        return f"<{tag}> does not belong in <{parent}>; it goes in <{elsewhere[0]}>"
    allowed = ", ".join(f"<{n}>" for n in spec.children)
    return f"unknown element <{tag}> in <{parent}>; allowed here: {allowed or 'nothing'}"


class _Loader:
    def __init__(self, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.problems: list[Problem] = []

    # -- reporting and leaves

    def report(self, node: Node, message: str) -> None:
        self.problems.append(Problem(node.path, node.line, message))

    def check_section(self, node: Node) -> None:
        self._check_attrs(node)
        stray = node.text.strip()
        if stray:
            shown = stray if len(stray) <= 40 else stray[:37] + "..."
            self.report(
                node, f"text {shown!r} is not allowed in <{node.tag}>, which holds elements only"
            )

    def _check_attrs(self, node: Node) -> None:
        if node.attrs:
            names = ", ".join(sorted(node.attrs))
            self.report(
                node,
                f"attributes are not used in this format ({names}); write values as child elements",
            )

    def leaf(self, node: Node) -> str | None:
        """The value of a value element: stripped, ${VAR} substituted; None after a problem."""
        self._check_attrs(node)
        if node.children:
            self.report(
                node,
                f"<{node.tag}> takes a value, not elements (found <{node.children[0].tag}>)",
            )
            return None
        return self._substitute(node, node.text.strip())

    def _substitute(self, node: Node, text: str) -> str | None:
        value, errors = substitute_env(text, self.env)
        for error in errors:
            self.report(node, error)
        if errors:
            return None
        value = value.strip()
        if not value:
            self.report(node, f"<{node.tag}> is empty; give a value or remove the element")
            return None
        return value

    # -- the document

    def load(self, data: str | bytes) -> Config:
        try:
            root = parse_xml(data)
        except XmlError as e:
            message = f"{e.message} (column {e.column})"
            raise ConfigError(self.source, [Problem(e.path, e.line, message)]) from None
        config = self._root(root)
        if self.problems or config is None:
            self.problems.sort(key=lambda p: p.line)
            raise ConfigError(self.source, self.problems)
        return config

    def _root(self, root: Node) -> Config | None:
        if root.tag not in ROOT_TAGS:
            self.report(
                root,
                f"the root element is <{root.tag}>; a configuration starts with "
                "<TickertapeConfig> (or <AMPSConfig>)",
            )
            return None
        sec = _Section(self, root, ROOT)
        name = sec.value("Name", _instance_name, "", required=True, hint=" (the instance name)")
        transports, ports = self._transports(sec.one("Transports"))
        admin = self._admin(sec.one("Admin"), ports)
        logging = self._logging(sec.one("Logging"))
        tlog, tlog_node = self._transaction_log(sec.one("TransactionLog"))
        queues = self._sow(sec.one("SOW"), tlog, tlog_node)
        actions = self._actions(sec.one("Actions"), tlog)
        limits = self._limits(sec, transports)
        auth_node = sec.one("Authentication")
        authentication = self._raw(auth_node) if auth_node is not None else None
        return Config(
            name=name,
            transports=tuple(transports),
            admin=admin,
            logging=logging,
            transaction_log=tlog,
            queues=tuple(queues),
            actions=tuple(actions),
            limits=limits,
            authentication=authentication,
            source=self.source,
        )

    # -- sections

    def _transports(self, node: Node | None) -> tuple[list[Transport], dict[int, Node]]:
        """The transports, and the nodes that claimed each port (to check Admin against)."""
        if node is None:
            default = Transport(name="json-tcp", host=DEFAULT_HOST, port=DEFAULT_PORT)
            return [default], {}
        sec = _Section(self, node, TRANSPORTS)
        if not sec.many("Transport"):
            self.report(
                node,
                "<Transports> has no <Transport>; add one, or remove <Transports> to get the "
                f"default transport on {DEFAULT_HOST}:{DEFAULT_PORT}",
            )
        transports: list[Transport] = []
        names: dict[str, Node] = {}
        ports: dict[int, Node] = {}
        for tnode in sec.many("Transport"):
            t = _Section(self, tnode, TRANSPORT)
            name = t.text("Name", required=True, hint=" (for example json-tcp)")
            addr = t.value(
                "InetAddr", parse_inet_addr, None, required=True, hint=" (port or host:port)"
            )
            ttype = t.value("Type", _enum("tcp", "tcps"), "tcp")
            message_type = t.value("MessageType", _message_type, "json")
            protocol = t.value("Protocol", _enum("amps", aliases={"json": "amps"}), "amps")
            max_size = t.value(
                "MaxMessageSize",
                _size_between(MIN_MAX_MESSAGE_SIZE, MAX_MAX_MESSAGE_SIZE, "MaxMessageSize"),
                DEFAULT_MAX_MESSAGE_SIZE,
            )
            certificate = t.text("Certificate")
            private_key = t.text("PrivateKey")
            if ttype == "tcps":
                for element, value in (("Certificate", certificate), ("PrivateKey", private_key)):
                    if value is None and not t.has(element):
                        t.missing(element, " (a PEM file; tcps needs a certificate and key)")
            else:
                for element in ("Certificate", "PrivateKey"):
                    if t.has(element):
                        self.report(
                            t.one(element),  # type: ignore[arg-type]
                            f"<{element}> is only used by tcps transports; set <Type>tcps</Type> "
                            "or remove it",
                        )
            if name is not None:
                if name in names:
                    self.report(
                        tnode,
                        f"transport name {name!r} is already used at line {names[name].line}; "
                        "give each transport its own <Name>",
                    )
                names.setdefault(name, tnode)
            if addr is not None:
                host, port = addr
                addr_node = t.one("InetAddr")
                assert addr_node is not None
                if port != 0 and port in ports:
                    self.report(
                        addr_node,
                        f"port {port} is already used by the transport at line "
                        f"{ports[port].line}; give each transport its own port",
                    )
                ports.setdefault(port, addr_node)
            else:
                host, port = DEFAULT_HOST, DEFAULT_PORT
            transports.append(
                Transport(
                    name=name or "",
                    host=host,
                    port=port,
                    type=ttype,  # type: ignore[arg-type]
                    message_type=message_type,  # type: ignore[arg-type]
                    protocol=protocol,  # type: ignore[arg-type]
                    max_message_size=max_size,
                    certificate=certificate,
                    private_key=private_key,
                )
            )
        return transports, ports

    def _admin(self, node: Node | None, ports: dict[int, Node]) -> Admin | None:
        if node is None:
            return None
        sec = _Section(self, node, ADMIN)
        host, port = sec.value("InetAddr", parse_inet_addr, (DEFAULT_HOST, DEFAULT_ADMIN_PORT))
        addr_node = sec.one("InetAddr") or node
        if port != 0 and port in ports:
            self.report(
                addr_node,
                f"admin port {port} is already used by the transport at line "
                f"{ports[port].line}; give the admin endpoint its own port",
            )
        interval = sec.value("Interval", _positive_interval, 10.0)
        return Admin(host=host, port=port, interval=interval)

    def _logging(self, node: Node | None) -> tuple[LogTarget, ...]:
        if node is None:
            return (LogTarget(protocol="stdout", level="info"),)
        sec = _Section(self, node, LOGGING)
        targets = []
        for tnode in sec.many("Target"):
            t = _Section(self, tnode, TARGET)
            protocol = t.value(
                "Protocol",
                _enum("stdout", "stderr", "file"),
                "stdout",
                required=True,
                hint=" (stdout, stderr or file)",
            )
            level = t.value("Level", _log_level, "info")
            file_name = t.text("FileName")
            if protocol == "file" and file_name is None and not t.has("FileName"):
                t.missing("FileName", " (the log file's path)")
            elif protocol != "file" and t.has("FileName"):
                self.report(
                    t.one("FileName"),  # type: ignore[arg-type]
                    f"<FileName> is only used with <Protocol>file</Protocol>, not {protocol}; "
                    "remove it",
                )
                file_name = None
            targets.append(LogTarget(protocol=protocol, level=level, file_name=file_name))  # type: ignore[arg-type]
        return tuple(targets)

    def _transaction_log(self, node: Node | None) -> tuple[TransactionLog | None, Node | None]:
        if node is None:
            return None, None
        sec = _Section(self, node, TRANSACTION_LOG)
        directory = sec.text("JournalDirectory", required=True, hint=" (where segments live)")
        archive = sec.text("JournalArchiveDirectory")
        size = sec.value(
            "JournalSize",
            _size_between(MIN_JOURNAL_SIZE, None, "JournalSize"),
            DEFAULT_JOURNAL_SIZE,
        )
        durability = sec.value("Durability", _enum("fsync", "write"), "fsync")
        topics = []
        for tnode in sec.many("Topic"):
            t = _Section(self, tnode, TOPIC)
            pattern = t.value("Name", _topic_pattern, None, required=True, hint=" (a topic regex)")
            message_type = t.value("MessageType", _message_type, "json")
            if pattern is not None:
                topics.append(TopicSpec(name=pattern, message_type=message_type))  # type: ignore[arg-type]
        tlog = TransactionLog(
            journal_directory=directory or "",
            archive_directory=archive,
            journal_size=size,
            durability=durability,  # type: ignore[arg-type]
            topics=tuple(topics),
        )
        return tlog, node

    def _sow(
        self, node: Node | None, tlog: TransactionLog | None, tlog_node: Node | None
    ) -> list[QueueSpec]:
        if node is None:
            return []
        sec = _Section(self, node, SOW)
        queues = []
        names: dict[str, Node] = {}
        for qnode in sec.many("Queue"):
            queue = self._queue(qnode, tlog, tlog_node)
            if queue is None:
                continue
            if queue.name in names:
                self.report(
                    qnode,
                    f"queue name {queue.name!r} is already used at line "
                    f"{names[queue.name].line}; give each queue its own <Name>",
                )
            names.setdefault(queue.name, qnode)
            queues.append(queue)
        return queues

    def _queue(
        self, qnode: Node, tlog: TransactionLog | None, tlog_node: Node | None
    ) -> QueueSpec | None:
        q = _Section(self, qnode, QUEUE)
        name = q.value("Name", _literal_topic, None, required=True, hint=" (the queue's topic)")
        underlying = q.value("UnderlyingTopic", _literal_topic, None)
        if not q.has("UnderlyingTopic"):
            underlying = name  # the AMPS default; an invalid one stays None (reported)
        message_type = q.value("MessageType", _message_type, "json")
        semantics = q.value("Semantics", _enum("at-least-once", "at-most-once"), "at-least-once")
        at_most_once = semantics == "at-most-once"
        lease_period = q.value("LeasePeriod", _positive_interval, None)
        per_sub = q.value("MaxPerSubscriptionBacklog", _at_least(parse_count, 1, "of 1"), 1)
        max_backlog = q.value("MaxBacklog", _at_least(parse_count, 1, "of 1"), None)
        fairness = q.value(
            "FairnessModel",
            _enum("fast", "round-robin", "proportional"),
            "round-robin" if at_most_once else "proportional",
        )
        max_deliveries = q.value("MaxDeliveries", parse_count, 0)
        max_cancels = q.value("MaxCancels", parse_count, 0)
        expiration = q.value("Expiration", _positive_interval, None)
        leasing = q.value("Leasing", _enum("strict", "sublet"), "sublet")
        filter_ = q.text("Filter")
        barrier = q.text("BarrierExpression")
        dead_letter = q.value("DeadLetterTopic", _literal_topic, None)

        if at_most_once:
            if fairness != "round-robin":
                self.report(
                    q.one("FairnessModel"),  # type: ignore[arg-type]
                    f"at-most-once queues only allow round-robin fairness, not {fairness}; "
                    "remove <FairnessModel> or make the queue at-least-once",
                )
                fairness = "round-robin"
            for element in ("LeasePeriod", "MaxDeliveries", "MaxCancels", "Leasing"):
                if q.has(element):
                    self.report(
                        q.one(element),  # type: ignore[arg-type]
                        f"<{element}> has no effect on an at-most-once queue (a message leaves "
                        "the queue when it is delivered); remove it or use at-least-once",
                    )
        if dead_letter is not None and dead_letter in (name, underlying):
            self.report(
                q.one("DeadLetterTopic"),  # type: ignore[arg-type]
                f"the dead-letter topic {dead_letter!r} is this queue's own topic; expired "
                "messages would come straight back; choose another topic",
            )
        if underlying is not None:
            where = q.one("UnderlyingTopic") or q.one("Name") or qnode
            if tlog is None:
                self.report(
                    where,
                    f"queue {name!r} needs its underlying topic {underlying!r} recorded in a "
                    f"transaction log; add <TransactionLog> with <Topic><Name>{underlying}"
                    "</Name></Topic>",
                )
            elif not tlog.records_topic(underlying):
                assert tlog_node is not None
                self.report(
                    where,
                    f"the underlying topic {underlying!r} of queue {name!r} is not recorded in "
                    f"the transaction log (line {tlog_node.line}); add <Topic><Name>{underlying}"
                    "</Name></Topic> to <TransactionLog>",
                )
        if name is None or underlying is None:
            return None
        return QueueSpec(
            name=name,
            underlying_topic=underlying,
            message_type=message_type,  # type: ignore[arg-type]
            semantics=semantics,  # type: ignore[arg-type]
            lease_period=lease_period,
            max_per_subscription_backlog=per_sub,
            max_backlog=max_backlog,
            fairness_model=fairness,  # type: ignore[arg-type]
            max_deliveries=max_deliveries,
            max_cancels=max_cancels,
            expiration=expiration,
            leasing=leasing,  # type: ignore[arg-type]
            filter=filter_,
            barrier_expression=barrier,
            dead_letter_topic=dead_letter,
        )

    def _actions(self, node: Node | None, tlog: TransactionLog | None) -> list[Action]:
        if node is None:
            return []
        sec = _Section(self, node, ACTIONS)
        actions = []
        for anode in sec.many("Action"):
            a = _Section(self, anode, ACTION)
            on_node = a.one("On")
            if on_node is None:
                a.missing("On", " (when the action runs)")
            if not a.many("Do"):
                a.missing("Do", " (what the action does)")
            trigger = self._trigger(on_node) if on_node is not None else None
            steps = [self._step(d, tlog) for d in a.many("Do")]
            if trigger is not None and steps and all(s is not None for s in steps):
                actions.append(Action(on=trigger, do=tuple(steps)))  # type: ignore[arg-type]
        return actions

    def _module(
        self, node: Node, kind: str, table: Mapping[str, Any]
    ) -> tuple[str | None, dict[str, tuple[str, Node]]]:
        """The short module name of an <On>/<Do>, and its options {name: (text, node)}."""
        sec = _Section(self, node, ON if kind == "on" else DO)
        example = f" (for example amps-action-{kind}-{next(iter(table))})"
        module_text = sec.text("Module", required=True, hint=example)
        short = None
        if module_text is not None:
            for prefix in _MODULE_PREFIXES:
                if module_text.startswith(f"{prefix}{kind}-"):
                    short = module_text[len(prefix) + len(kind) + 1 :]
            if short not in table:
                supported = ", ".join(f"amps-action-{kind}-{m}" for m in table)
                self.report(
                    sec.one("Module"),  # type: ignore[arg-type]
                    f"unsupported <{node.tag}> module {module_text!r}; supported: {supported}",
                )
                short = None
        options: dict[str, tuple[str, Node]] = {}
        if short is None:
            return None, options
        allowed, required = table[short]
        opts_node = sec.one("Options")
        if opts_node is not None:
            opts = _Section(self, opts_node, _OPTION_SPECS[(kind, short)])
            for option in allowed:
                onode = opts.one(option)
                if onode is not None:
                    text = self.leaf(onode)
                    if text is not None:
                        options[option] = (text, onode)
        present = {c.tag for c in opts_node.children} if opts_node is not None else set()
        for option in required:
            if option not in present:  # present but invalid has been reported already
                self.report(
                    opts_node or node,
                    f"{module_text} needs <Options><{option}>...</{option}></Options>",
                )
        return short, options

    def _trigger(self, node: Node) -> ActionTrigger | None:
        short, options = self._module(node, "on", _TRIGGERS)
        if short is None:
            return None
        if short == "startup":
            return ActionTrigger(kind="startup")
        if "Every" not in options:
            return None
        text, every_node = options["Every"]
        try:
            every, at, weekday, utc = _every(text)
        except ValueError as e:
            self.report(every_node, str(e))
            return None
        name = options["Name"][0] if "Name" in options else None
        return ActionTrigger(
            kind="schedule", every=every, at=at, weekday=weekday, utc=utc, name=name
        )

    def _step(self, node: Node, tlog: TransactionLog | None) -> ActionStep | None:
        short, options = self._module(node, "do", _STEPS)
        if short is None:
            return None
        if tlog is None:
            self.report(node, f"{short} needs a <TransactionLog>; add one or remove this <Do>")
        elif short == "archive-journal" and tlog.archive_directory is None:
            self.report(
                node,
                "archive-journal needs <JournalArchiveDirectory> in <TransactionLog>; add it",
            )
        typed: dict[str, float] = {}
        ok = True
        for option in ("Age", "Retention"):
            if option in options:
                text, onode = options[option]
                try:
                    typed[option] = parse_interval(text)
                except ValueError as e:
                    self.report(onode, str(e))
                    ok = False
        if not ok or any(o not in options for o in _STEPS[short][1]):
            return None
        return ActionStep(
            name=short,  # type: ignore[arg-type]
            options=tuple((k, v[0]) for k, v in options.items()),
            age=typed.get("Age"),
            retention=typed.get("Retention"),
        )

    def _limits(self, sec: _Section, transports: list[Transport]) -> Limits:
        size = sec.value("ClientMaxBufferSize", parse_size, DEFAULT_CLIENT_MAX_BUFFER_SIZE)
        node = sec.one("ClientMaxBufferSize")
        largest = max((t.max_message_size for t in transports), default=0)
        if node is not None and size < largest:
            self.report(
                node,
                f"ClientMaxBufferSize {_human(size)} is smaller than the largest MaxMessageSize "
                f"({_human(largest)}): one large message would disconnect its subscriber; "
                "raise <ClientMaxBufferSize> or lower <MaxMessageSize>",
            )
        elif node is None and size < largest:
            self.report(
                sec.node,
                f"a transport allows messages of {_human(largest)}, more than the default "
                f"<ClientMaxBufferSize> {_human(size)}; add a larger <ClientMaxBufferSize>",
            )
        poll = sec.value("IdlePoll", parse_interval, DEFAULT_IDLE_POLL)
        if not 0 <= poll <= MAX_IDLE_POLL:
            self.report(
                sec.one("IdlePoll"),
                f"IdlePoll {poll * 1e6:g}us is out of range; give 0 (off) up to 10ms "
                "(longer only burns CPU: a sleeping server wakes within tens of microseconds)",
            )
            poll = DEFAULT_IDLE_POLL
        return Limits(
            client_max_buffer_size=size,
            idle_poll=poll,
            **{
                f: sec.value(tag, parse, default)
                for tag, (f, parse, default) in LIMIT_ELEMENTS.items()
            },
        )

    def _raw(self, node: Node) -> RawElement:
        self._check_attrs(node)
        text = node.text.strip()
        if text and not node.children:
            text = self._substitute(node, text) or ""
        return RawElement(
            tag=node.tag,
            text=text,
            children=tuple(self._raw(c) for c in node.children),
            line=node.line,
        )


def _log_level(text: str) -> str:
    level = _LOG_LEVELS.get(text.lower())
    if level is None:
        if text.lower() == "none":
            raise ValueError("level 'none' is not supported; remove the <Target> to log nothing")
        raise ValueError(
            f"invalid level {text!r}; use debug, info, warning or error (AMPS names developer, "
            "trace, stats, critical and emergency are accepted too)"
        )
    return level


def _topic_pattern(text: str) -> str:
    try:
        compile_pattern(text)
    except PatternError as e:
        raise ValueError(
            f"invalid regular expression {text!r}: {e.why}; topic names here are "
            r"regular expressions (escape a literal dot as \.; RE2 syntax: no backreferences "
            "or lookaround)"
        ) from None
    return text
