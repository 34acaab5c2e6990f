"""The configuration as the server sees it: a frozen tree of typed msgspec Structs.

This module owns the *typed* form of the configuration; `config.loader` owns the XML form and
builds this tree (docs/configuration.md describes every XML element). Everything in the tree
has been checked once, when it was loaded; nothing here re-checks, and nothing here parses.

Units are resolved: every size is an `int` number of bytes, every interval a `float` number of
seconds. `None` means "not set", with the meaning given on each field (for example no lease
expiry). Enumerated values are lowercase strings, typed as `Literal`s.

    Config
    ├── name: str                            instance name (part of server-assigned publisher ids)
    ├── transports: tuple[Transport, ...]    listening sockets, at least one
    ├── admin: Admin | None                  HTTP stats endpoint; None = no admin endpoint
    ├── logging: tuple[LogTarget, ...]       () = log nothing
    ├── transaction_log: TransactionLog | None   None = no journal (no bookmarks, no queues)
    │   └── topics: tuple[TopicSpec, ...]    which topics are recorded (regex, full match)
    ├── queues: tuple[QueueSpec, ...]        <SOW><Queue>
    ├── sow_topics: tuple[SowTopicSpec, ...] <SOW><Topic>: latest message per key
    ├── actions: tuple[Action, ...]          scheduled journal management
    │   ├── on: ActionTrigger
    │   └── do: tuple[ActionStep, ...]
    ├── limits: Limits                       per-connection bounds
    ├── authentication: Authentication | None   None = no authentication (loopback only)
    ├── entitlement: Entitlement | None      None = every logged-on user may do all but admin
    │   └── roles: tuple[Role, ...]
    │       ├── allow: Rights / deny: Rights  topic regexes per right, and admin
    │       └── filters: tuple[ContentFilter, ...]
    └── source: str                          the file it came from, or "<embedded default>"

Security (`config.security` reads and checks it; docs/security.md): what a build does not serve
yet is refused by `config.security.unsupported`, so a configuration that asks for TLS,
authentication or entitlements never starts a server that would ignore them.

Structs are frozen (hashable, comparable by value) and can be encoded as they are
(`msgspec.json.encode(config)`), for example to dump the effective configuration. Defaults in
the Structs are the defaults of the XML format, so that a Struct built in code (in tests) means
the same as an XML file that leaves those elements out.

Topic matching: `TransactionLog.records_topic(topic)` answers whether a topic is recorded, that
is whether any `<Topic><Name>` pattern matches the *whole* topic name (Python `re.fullmatch`).
Patterns are compiled once per TransactionLog, and answers are cached per topic name (bounded), so
the call is cheap enough for the publish path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from protocol.patterns import compile_pattern
from protocol.patterns import is_pattern as is_topic_pattern

__all__ = [
    "DEFAULT_ADMIN_PORT",
    "DEFAULT_CLIENT_MAX_BUFFER_SIZE",
    "DEFAULT_HOST",
    "DEFAULT_IDLE_POLL",
    "DEFAULT_JOURNAL_SIZE",
    "DEFAULT_LEASE_PERIOD",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_PORT",
    "MAX_IDLE_POLL",
    "Action",
    "ActionStep",
    "ActionTrigger",
    "Admin",
    "Authentication",
    "Config",
    "ContentFilter",
    "Durability",
    "Entitlement",
    "FairnessModel",
    "Leasing",
    "Limits",
    "LogLevel",
    "LogProtocol",
    "LogTarget",
    "QueueSpec",
    "Rights",
    "Role",
    "Semantics",
    "SowTopicSpec",
    "TopicSpec",
    "TransactionLog",
    "Transport",
]

KiB = 1 << 10
MiB = 1 << 20

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9007
DEFAULT_ADMIN_PORT = 8085
DEFAULT_MAX_MESSAGE_SIZE = 16 * MiB
DEFAULT_JOURNAL_SIZE = 256 * MiB
DEFAULT_CLIENT_MAX_BUFFER_SIZE = 64 * MiB
DEFAULT_LEASE_PERIOD = 30.0
DEFAULT_IDLE_POLL = 100e-6
MAX_IDLE_POLL = 0.01

TransportType = Literal["tcp", "tcps", "replication"]
TlsVersion = Literal["TLSv1.2", "TLSv1.3"]
MessageType = Literal["json"]
LogProtocol = Literal["stdout", "stderr", "file"]
LogLevel = Literal["debug", "info", "warning", "error"]
Durability = Literal["fsync", "write"]
Semantics = Literal["at-least-once", "at-most-once"]
FairnessModel = Literal["fast", "round-robin", "proportional"]
Leasing = Literal["strict", "sublet"]
TriggerKind = Literal["schedule", "startup"]
StepName = Literal["archive-journal", "compress-journal", "remove-journal", "compact-journal"]


class Transport(msgspec.Struct, frozen=True, kw_only=True):
    """A listening socket (`<Transports><Transport>`)."""

    name: str
    port: int
    """0 = an ephemeral port chosen by the OS (tests)."""
    host: str = DEFAULT_HOST
    """IPv6 addresses without brackets ("::1"); "0.0.0.0" / "::" = every interface."""
    type: TransportType = "tcp"
    message_type: MessageType = "json"
    protocol: Literal["amps"] = "amps"
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    """Largest frame (header + body) accepted, in bytes; larger: `bad frame` and disconnect."""
    certificate: str | None = None
    """tcps only: PEM certificate chain file."""
    private_key: str | None = None
    """tcps only: PEM private key file."""
    ca_file: str | None = None
    """tcps only: PEM CA certificates that sign client certificates; with it a client may
    present a certificate (and is identified by it), with `verify_client` it must."""
    verify_client: bool = False
    """tcps only: mutual TLS; a client without a certificate signed by `ca_file` is refused."""
    minimum_version: TlsVersion = "TLSv1.2"
    ciphers: str | None = None
    """tcps only: an OpenSSL cipher string for TLS 1.2; None = OpenSSL's defaults."""


class Admin(msgspec.Struct, frozen=True, kw_only=True):
    """The HTTP stats endpoint (`<Admin>`): JSON and Prometheus."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_ADMIN_PORT
    interval: float = 10.0
    """Meant as how often statistics are sampled, seconds; not used by the server yet (it computes
    rates every second)."""
    certificate: str | None = None
    """With `private_key`: serve HTTPS with this PEM certificate chain."""
    private_key: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    """Host names (lowercase) the endpoint answers to besides IP addresses and `localhost`
    (`<AllowedHosts>`): a request naming another Host is refused, against DNS rebinding."""


class LogTarget(msgspec.Struct, frozen=True, kw_only=True):
    """One log destination (`<Logging><Target>`): every record at `level` or above goes there."""

    protocol: LogProtocol = "stdout"
    level: LogLevel = "info"
    file_name: str | None = None
    """Path of the log file, for protocol "file" only. Reopened on SIGHUP (for logrotate)."""
    logger: str | None = None
    """Only records of this logger and the loggers below it (`tickertape.audit`); None = all."""


class TopicSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A `<TransactionLog><Topic>`: topics whose whole name matches `name` (a regex) are recorded."""

    name: str
    message_type: MessageType = "json"


class TransactionLog(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """The journal (`<TransactionLog>`). `dict=True` only to cache the compiled topic patterns."""

    journal_directory: str
    """Relative paths are relative to the server's working directory (as in AMPS)."""
    archive_directory: str | None = None
    """Where archived segments go (`archive-journal`); None = archiving not configured."""
    journal_size: int = DEFAULT_JOURNAL_SIZE
    """A segment is sealed and a new one started once it grows past this many bytes."""
    durability: Durability = "fsync"
    """"fsync": persisted means fdatasync done (survives power loss). "write": persisted means
    written to the OS (survives a process crash, NOT a power loss or kernel crash)."""
    topics: tuple[TopicSpec, ...] = ()
    """No topics = the journal exists but records nothing."""

    @functools.cached_property
    def _lookup(self) -> Callable[[str], TopicSpec | None]:
        # Any: protocol.patterns.Pattern is a runtime alias of RE2's class, not a type to mypy
        compiled: tuple[tuple[Any, TopicSpec], ...] = tuple(
            (compile_pattern(t.name), t) for t in self.topics
        )

        @functools.lru_cache(maxsize=4096)
        def lookup(topic: str) -> TopicSpec | None:
            return next((spec for pattern, spec in compiled if pattern.fullmatch(topic)), None)

        return lookup

    def records_topic(self, topic: str) -> bool:
        """Whether messages published to `topic` are recorded in the journal."""
        return self._lookup(topic) is not None


class QueueSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A queue (`<SOW><Queue>`): a view over topics recorded in the transaction log."""

    name: str
    """The topic consumers subscribe to (a literal name)."""
    underlying_topic: str
    """The topic publishers publish to (defaults to `name` in XML), or a pattern over topic
    names (RE2, whole name; is_topic_pattern): the recorded topics it matches."""
    message_type: MessageType = "json"
    semantics: Semantics = "at-least-once"
    lease_period: float = DEFAULT_LEASE_PERIOD
    """Seconds a delivered at-least-once message stays leased before it returns to the queue
    (`<LeasePeriod>`; unused on at-most-once queues). 30s when not given: seed 004 has every
    at-least-once message processed "within a specified timeout, or lease period", and the
    wire contract puts the lease's end (`lp`) on every at-least-once delivery, so a lease always
    ends. (AMPS documents an unset LeasePeriod as no expiry; docs/configuration.md says so.)"""
    max_per_subscription_backlog: int = 1
    """Most unacked messages one subscription holds: min(this, the subscriber's max_backlog)."""
    max_backlog: int | None = None
    """Most unacked messages for the whole queue; None = unlimited."""
    fairness_model: FairnessModel = "proportional"
    """The XML default is "proportional" for at-least-once and "round-robin" for at-most-once
    (the only model allowed there)."""
    max_deliveries: int = 0
    """Deliveries before the message expires; 0 = unlimited."""
    max_cancels: int = 0
    """Cancels (`sow_delete` with `cancel`) before the message expires; 0 = unlimited."""
    expiration: float | None = None
    """Seconds after its receipt a message expires; None = never. A message's own `e` replaces
    it (AMPS's default ExpirationModel); a leased message expires when its lease ends."""
    leasing: Leasing = "sublet"
    """"strict": only the lease holder may ack. "sublet": any subscriber may ack."""
    filter: str | None = None
    """Only underlying messages matching this filter join the queue (checked by the loader, compiled by the queue)."""
    barrier_expression: str | None = None
    """Filter marking barrier messages (unparsed here)."""
    dead_letter_topic: str | None = None
    """Where expired messages are published, with the expiry reason; None = dropped."""
    default_publish_target: str | None = None
    """A publish to the queue's name goes to this topic (one of the underlying ones); None = a
    publish to the name is a publish to that topic, as to any other."""


class SowTopicSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A State of the World topic (`<SOW><Topic>`): the latest message per key of topics
    recorded in the transaction log (docs/sow.md)."""

    name: str
    """A literal topic, or a pattern over topic names (RE2, whole name; every recorded topic it
    matches is a SOW topic of its own, with these settings)."""
    message_type: MessageType = "json"
    keys: tuple[str, ...] = ()
    """`<Key>` paths (`/sym`, `/a/b`, `/arr[0]`) whose values make a record's key; () = the
    publisher gives `k` on every publish."""
    expiration: float | None = None
    """Seconds after its last update a record leaves the topic; None = never."""
    history_window: float | None = None
    """`<History><Window>`: how far back historical queries may go, seconds; None = as far as
    the journal holds."""


class ActionTrigger(msgspec.Struct, frozen=True, kw_only=True):
    """When an action runs (`<On>`).

    kind "schedule" has exactly one form: `every` (a timer, seconds, first run one interval
    after start), or `at` alone (daily at that time), or `at` with `weekday` (weekly).
    kind "startup" runs once when the server has started and has no other field.
    """

    kind: TriggerKind
    every: float | None = None
    at: tuple[int, int] | None = None
    """(hour, minute), 24-hour clock."""
    weekday: int | None = None
    """0 = Monday .. 6 = Sunday."""
    utc: bool = False
    """`at` is in UTC (a `Z` suffix in XML); otherwise local time."""
    name: str | None = None


class ActionStep(msgspec.Struct, frozen=True, kw_only=True):
    """One thing an action does (`<Do>`), in order; if a step fails, later steps are skipped.

    `options` keeps every `<Options>` child as written (after `${VAR}` substitution), in file
    order; the options the step needs are also given typed: `age` for the journal steps (segments
    older than this), `retention` for `compact-journal` (replay window to keep).
    """

    name: StepName
    options: tuple[tuple[str, str], ...] = ()
    age: float | None = None
    retention: float | None = None


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """`<Actions><Action>`: one trigger, then its steps in order."""

    on: ActionTrigger
    do: tuple[ActionStep, ...]


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Per-connection bounds, from elements directly under the root."""

    client_max_buffer_size: int = DEFAULT_CLIENT_MAX_BUFFER_SIZE
    """Bytes queued for output to one connection (`<ClientMaxBufferSize>`) past which the server
    closes it with disconnect reason `slow client`. Never below any transport's max_message_size.
    Heartbeat intervals are not configured on the server: the client chooses them (PROTOCOL §3)."""
    idle_poll: float = DEFAULT_IDLE_POLL
    """Seconds the server keeps polling its sockets after network input before it sleeps
    (`<IdlePoll>`, 0 = off). A request that arrives meanwhile is read at once instead of after a
    wake-up of a sleeping CPU, which on virtual machines costs tens of microseconds per round
    trip; the price is at most this much CPU after each burst of input. Not while a journal
    commit is in flight (the writer thread then needs the GIL)."""
    # Input and connection bounds (config/limits.py; docs/configuration.md, "Limits")
    logon_timeout: float = 10.0
    max_logon_message_size: int = 64 * 1024
    input_memory_limit: int = 256 * 1024 * 1024
    publish_memory_limit: int = 64 * 1024 * 1024
    """Bytes of publishes handed to the journal and not yet durable, over all connections
    (`<PublishMemoryLimit>`): past it publishers stop reading until half of it is durable."""
    client_publish_memory_limit: int = 4 * 1024 * 1024
    """Bytes one publisher has sent that are not committed yet (`<ClientPublishMemoryLimit>`):
    past it that connection stops reading until half of them are committed."""
    partial_message_timeout: float = 60.0
    idle_timeout: float = 0.0
    client_message_age_limit: float = 60.0
    """Seconds a connection's queued output may go without draining a byte before it is closed
    (`slow client`): a subscriber that makes no progress, including one reading the journal."""
    client_max_subscriptions: int = 1000
    client_offline_threshold: int | None = None
    """Bytes queued for output to one connection (`<ClientOfflineThreshold>`) past which its live
    subscriptions that the journal can feed stop queueing in memory and read the journal from
    the last message they were sent, then rejoin the live stream (server/replay.py). 0 = never
    (they are closed at `client_max_buffer_size`); None = `offline_threshold`'s default."""

    @property
    def offline_threshold(self) -> int:
        """The threshold that applies: as configured, else min(4 MiB, half the buffer bound)."""
        if self.client_offline_threshold is not None:
            return self.client_offline_threshold
        return min(4 * MiB, self.client_max_buffer_size // 2)

    max_connections: int = 10_000
    max_connections_per_address: int = 1000
    max_unauthenticated_connections: int = 1000


class Authentication(msgspec.Struct, frozen=True, kw_only=True):
    """`<Authentication>`: how a logon proves who it is (docs/security.md)."""

    password_file: str | None = None
    """The file `tickertape passwd` writes (protocol/security/passwords.py); None = no passwords."""
    logon_timeout: float | None = None
    """As written here; the loader folds it into `Limits.logon_timeout`, which is what applies."""
    allow_anonymous: bool = False
    """A logon without `user_id` is accepted as user "anonymous"."""


class Rights(msgspec.Struct, frozen=True, kw_only=True):
    """Rights by topic regex (RE2, whole-name match), one tuple per right, and admin."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    replay: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    admin: bool = False

    def patterns(self, right: str) -> tuple[str, ...]:
        """The regexes of `right` ("publish", "subscribe", "replay" or "consume")."""
        return getattr(self, right)  # type: ignore[no-any-return]


class ContentFilter(msgspec.Struct, frozen=True, kw_only=True):
    """A role's `<Filter>`: on topics matching `topic`, a read sees only what `expression`
    (the filter language of docs/protocol.md §7) matches."""

    topic: str
    expression: str


class Role(msgspec.Struct, frozen=True, kw_only=True):
    """An `<Entitlement><Role>`: rights granted (`allow`) and refused (`deny`) to `users`."""

    name: str
    users: tuple[str, ...]
    """User names; "*" = every authenticated user (not "anonymous", which is named if meant)."""
    allow: Rights = Rights()
    deny: Rights = Rights()
    """Deny wins over allow, across all the user's roles."""
    filters: tuple[ContentFilter, ...] = ()


class Entitlement(msgspec.Struct, frozen=True, kw_only=True):
    """`<Entitlement>`: with it, a right no role grants is refused."""

    roles: tuple[Role, ...] = ()


class ReplicationAddress(msgspec.Struct, frozen=True, kw_only=True):
    """One `<Transport>` of a `<Destination>`: where the destination's replication transport
    listens. Several addresses are tried in order (failover)."""

    host: str
    port: int
    tls: bool = False
    """Connect with TLS (the destination's replication transport has a certificate)."""
    ca_file: str | None = None
    """Verify the destination's certificate against this CA bundle (system CAs otherwise)."""
    certificate: str | None = None
    """Client certificate presented to the destination (when it verifies clients)."""
    private_key: str | None = None


class ReplicationDestination(msgspec.Struct, frozen=True, kw_only=True):
    """`<Replication><Destination>`: another instance this one pushes its journal to."""

    name: str
    """The destination instance's `<Name>`."""
    group: str
    sync: bool
    """`<SyncType>sync`: publishers' `persisted` acks wait for this destination's ack."""
    addresses: tuple[ReplicationAddress, ...]
    topics: tuple[TopicSpec, ...]
    """Topic name regexes carried to this destination (queue events: by the queue's name)."""
    pass_through: str | None = None
    """Regex of group names: messages that came here from those groups are forwarded too."""
    downgrade_after: float | None = None
    """Seconds a sync destination may be down before it acts as async; None = never."""
    user: str | None = None
    """Log on to the destination as this user (its `<Authentication>`), password from
    `password_file`."""
    password_file: str | None = None


class Replication(msgspec.Struct, frozen=True, kw_only=True):
    """`<Replication>`: the destinations, and how replicated queues move ownership."""

    destinations: tuple[ReplicationDestination, ...] = ()
    queue_owner_failover: float = 30.0
    """`<QueueOwnerFailover>`: seconds after losing the owner of queue messages before a
    surviving instance takes them over (docs/replication.md)."""


class Config(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """The whole configuration. `dict=True` only to cache the queue index."""

    name: str
    transports: tuple[Transport, ...]
    admin: Admin | None = None
    logging: tuple[LogTarget, ...] = (LogTarget(),)
    transaction_log: TransactionLog | None = None
    queues: tuple[QueueSpec, ...] = ()
    sow_topics: tuple[SowTopicSpec, ...] = ()
    sow_max_checkpoint_size: int | None = None
    """`<SOW><MaxCheckpointSize>`: the most disk the SOW store's checkpoints take, bytes (None:
    no bound; server/sow/checkpoints.py says which go first)."""
    actions: tuple[Action, ...] = ()
    limits: Limits = msgspec.field(default_factory=Limits)
    authentication: Authentication | None = None
    entitlement: Entitlement | None = None
    group: str | None = None
    """`<Group>`: this instance's replication group (None = its own name)."""
    replication: Replication = msgspec.field(default_factory=Replication)
    source: str = "<constructed>"

    @functools.cached_property
    def _queues_by_name(self) -> dict[str, QueueSpec]:
        return {q.name: q for q in self.queues}

    def queue(self, name: str) -> QueueSpec | None:
        """The queue whose name is exactly `name`, or None."""
        return self._queues_by_name.get(name)

    @functools.cached_property
    def _sow_lookup(self) -> Callable[[str], SowTopicSpec | None]:
        literal = {t.name: t for t in self.sow_topics if not is_topic_pattern(t.name)}
        patterns = [
            (compile_pattern(t.name).fullmatch, t)
            for t in self.sow_topics
            if is_topic_pattern(t.name)
        ]

        @functools.lru_cache(maxsize=4096)
        def lookup(topic: str) -> SowTopicSpec | None:
            found = literal.get(topic)
            if found is not None:
                return found
            return next((spec for match, spec in patterns if match(topic)), None)

        return lookup

    def sow_topic(self, topic: str) -> SowTopicSpec | None:
        """The `<SOW><Topic>` that makes `topic` a SOW topic (a literal name first, then the
        first pattern that matches it whole), or None."""
        if not self.sow_topics:
            return None
        return self._sow_lookup(topic)

    def records_topic(self, topic: str) -> bool:
        """Whether `topic` is recorded in the transaction log (False without one)."""
        return self.transaction_log is not None and self.transaction_log.records_topic(topic)
