"""The schema of the configuration file: which children each section allows.

One `Spec` per section element, in document order. The loader checks every section against its
Spec (`config.rules.Section`), so an element not listed here is a problem, never ignored; the
tests check that docs/configuration.md describes every name listed here.

Each Spec names, for its section:
- `children`: the elements it allows, each with whether it may repeat;
- `synonyms`: AMPS spellings accepted for one of our elements (`MinJournalSize` = `JournalSize`);
- `unsupported`: AMPS elements we refuse as "not supported", with why (rather than "unknown");
- `misnamed`: names people are known to get wrong, with the right one (too far apart for difflib).

Action modules are tables too: `TRIGGERS` (`<On>`) and `STEPS` (`<Do>`), each module's short
name -> (options allowed, options required), with one `<Options>` Spec per module.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from .limits import LIMIT_ELEMENTS

__all__ = [
    "ACTION",
    "ACTIONS",
    "ADMIN",
    "AUTHENTICATION",
    "DENY",
    "DESTINATION",
    "DESTINATION_TOPIC",
    "DESTINATION_TRANSPORT",
    "DO",
    "ENTITLEMENT",
    "FILTER",
    "LOGGING",
    "MODULE_PREFIXES",
    "ON",
    "OPTION_SPECS",
    "QUEUE",
    "REPLICATION",
    "RIGHT_ELEMENTS",
    "ROLE",
    "ROOT",
    "SECTIONS",
    "SOW",
    "SOW_HISTORY",
    "SOW_TOPIC",
    "STEPS",
    "TARGET",
    "TOPIC",
    "TRANSACTION_LOG",
    "TRANSPORT",
    "TRANSPORTS",
    "TRIGGERS",
    "Spec",
    "unknown_element",
]


class Spec:
    """The children section `tag` allows: `one` at most once, `many` any number of times.
    Creating a Spec records where each name belongs, for the "it goes in <...>" hint.

    `within` names the parent when `tag` is also a section elsewhere with other children (the
    `<Transport>` of a replication `<Destination>` is not the one of `<Transports>`): hints then
    say "<Destination>", and docs/configuration.md describes it under a heading naming both."""

    def __init__(
        self,
        tag: str,
        one: tuple[str, ...] = (),
        many: tuple[str, ...] = (),
        synonyms: Mapping[str, str] | None = None,
        unsupported: Mapping[str, str] | None = None,
        misnamed: Mapping[str, str] | None = None,
        within: str | None = None,
    ) -> None:
        self.tag = tag
        self.within = within
        self.children = {name: False for name in one} | {name: True for name in many}
        self.synonyms = dict(synonyms or {})
        self.unsupported = dict(unsupported or {})
        self.misnamed = dict(misnamed or {})
        _WHERE.setdefault(tag, [])
        for name in (*self.children, *self.synonyms):
            _WHERE.setdefault(name, []).append(f"{within}><{tag}" if within else tag)


_WHERE: dict[str, list[str]] = {}  # element name -> sections it may appear in (for hints)

_QUEUE_OWNER = (
    "a queue message is owned by the instance it was published on, and taken over after "
    "<QueueOwnerFailover> (docs/replication.md)"
)
_LOCAL_QUEUE = (
    "write <Queue>: a queue is replicated to the destinations whose <Topic> matches its name, "
    "so a queue no destination carries is local"
)
_VALIDATION = (
    "the checks across a set are made by `tickertape serve --verify-config` given every "
    "instance's file; they never stop a start, so there is nothing to exclude"
)
_SLOW_CLIENT = (
    "Tickertape bounds each connection at the root: past <ClientOfflineThreshold> its "
    "subscribers read from the journal, <ClientMaxBufferSize> and <ClientMessageAgeLimit> close it"
)

ROOT = Spec(
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
        "Entitlement",
        "Group",
        "Replication",
    ),
    unsupported={
        "Include": "the configuration is one file",
        "MessageTypes": "json is built in and the only message type",
        "Modules": "plug-in modules are not supported",
        "MessageMemoryLimit": _SLOW_CLIENT,
        "MessageDiskLimit": _SLOW_CLIENT,
        "MessageDiskPath": _SLOW_CLIENT,
        "ClientMaxCapacity": _SLOW_CLIENT,
        "ProcessorAffinity": "not applicable to a Python server",
    },
    misnamed={
        "ClientBufferThreshold": "ClientMaxBufferSize",
        "SlowClientDisconnect": "ClientMaxBufferSize",
        "SlowClientTimeout": "ClientMessageAgeLimit",
        "Queues": "SOW",
    },
)
TRANSPORTS = Spec("Transports", many=("Transport",))
TRANSPORT = Spec(
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
        "CAFile",
        "VerifyClient",
        "MinimumVersion",
        "Ciphers",
    ),
    unsupported={
        "InitialState": "transports always start enabled",
        "Authentication": "per-transport authentication is not supported; use the root's",
        "Entitlement": "entitlements are given once, at the root",
        "MessageMemoryLimit": _SLOW_CLIENT,
        "MessageDiskLimit": _SLOW_CLIENT,
        "MessageDiskPath": _SLOW_CLIENT,
        "ClientMaxCapacity": _SLOW_CLIENT,
        "ClientMessageAgeLimit": _SLOW_CLIENT,
        "TransportFilter": "transport filters are not supported",
        "SecureSocketProtocols": "write the lowest version allowed in <MinimumVersion>",
        "CAPath": "put the CA certificates in one PEM file and name it in <CAFile>",
    },
)
ADMIN = Spec(
    "Admin",
    one=("InetAddr", "Interval", "Certificate", "PrivateKey", "AllowedHosts"),
    unsupported={
        "FileName": "statistics are kept in memory only",
        "SQLTransport": "statistics are served as JSON and Prometheus text",
    },
)
LOGGING = Spec("Logging", many=("Target",))
TARGET = Spec(
    "Target",
    one=("Protocol", "Level", "FileName", "Logger"),
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
TRANSACTION_LOG = Spec(
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
TOPIC = Spec("Topic", one=("Name", "MessageType"), unsupported={"ExcludeValidation": _VALIDATION})
SOW = Spec(
    "SOW",
    one=("MaxCheckpointSize",),
    many=("Topic", "Queue"),
    synonyms={"QueueDefinition": "Queue", "TopicDefinition": "Topic"},
    unsupported={
        "View": "views are not supported",
        "ConflatedTopic": "conflated topics are not supported; use the conflation option",
        "LocalQueue": _LOCAL_QUEUE,
        "GroupLocalQueue": _LOCAL_QUEUE,
    },
)
SOW_TOPIC = Spec(
    "Topic",
    one=("Name", "MessageType", "Expiration", "History"),
    many=("Key",),
    within="SOW",
    unsupported={
        "FileName": "the SOW store lives beside the journal, under <JournalDirectory>",
        "Durability": "a SOW topic is kept from the journal, so it is as durable as the journal",
        "RecordSize": "records are stored whole, whatever their size",
        "KeyDomain": "a record's key is its <Key> values themselves",
    },
)
SOW_HISTORY = Spec(
    "History",
    one=("Window",),
    unsupported={"Granularity": "every message is a point of history; no granularity to set"},
)
QUEUE = Spec(
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
        "DefaultPublishTarget",
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
        "ExpirationModel": "a message's own expiration (e) applies, else the queue's <Expiration> "
        "(AMPS's default model)",
        "RecoveryPoint": "queue state is always rebuilt from the whole journal",
        "Priority": "priority queues are not supported",
        "FileBackedMetadata": "queue metadata is an in-memory index over the journal",
        "TargetQueueDepth": "not applicable",
        "DeferredAckExpiration": "not applicable",
        "InitialOwner": _QUEUE_OWNER,
        "GroupLocalQueueDomain": _QUEUE_OWNER,
    },
)
ACTIONS = Spec("Actions", many=("Action",))
ACTION = Spec(
    "Action", one=("On",), many=("Do",), unsupported={"If": "conditions are not supported"}
)
ON = Spec("On", one=("Module", "Options"))
DO = Spec("Do", one=("Module", "Options"))

# Action modules: short name -> (options allowed, options required)
TRIGGERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "schedule": (("Every", "Name"), ("Every",)),
    "startup": ((), ()),
}
STEPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "archive-journal": (("Age",), ("Age",)),
    "compress-journal": (("Age",), ("Age",)),
    "remove-journal": (("Age",), ("Age",)),
    "compact-journal": (("Retention",), ("Retention",)),
}
OPTION_SPECS: dict[tuple[str, str], Spec] = {
    (kind, module): Spec("Options", one=allowed)
    for kind, table in (("on", TRIGGERS), ("do", STEPS))
    for module, (allowed, _required) in table.items()
}
MODULE_PREFIXES = ("amps-action-", "tickertape-action-")

_BUILT_IN = "authentication and entitlements are built in (docs/security.md)"
AUTHENTICATION = Spec(
    "Authentication",
    one=("PasswordFile", "LogonTimeout", "AllowAnonymous"),
    unsupported={"Module": _BUILT_IN, "Options": _BUILT_IN},
)
ENTITLEMENT = Spec(
    "Entitlement", many=("Role",), unsupported={"Module": _BUILT_IN, "Options": _BUILT_IN}
)
RIGHT_ELEMENTS = ("Publish", "Subscribe", "Replay", "Consume")
ROLE = Spec(
    "Role",
    one=("Name", "Users", "Admin", "Deny"),
    many=(*RIGHT_ELEMENTS, "Filter"),
    misnamed={"User": "Users", "Read": "Subscribe", "Write": "Publish"},
)
DENY = Spec("Deny", one=("Admin",), many=RIGHT_ELEMENTS)
FILTER = Spec("Filter", one=("Topic", "Expression"))

REPLICATION = Spec(
    "Replication",
    one=("QueueOwnerFailover",),
    many=("Destination",),
    misnamed={"Destinations": "Destination"},
)
DESTINATION = Spec(
    "Destination",
    one=("Name", "Group", "SyncType", "PassThrough", "DowngradeAfter", "User", "PasswordFile"),
    many=("Transport", "Topic"),
    misnamed={"Sync": "SyncType", "Mode": "SyncType"},
)
DESTINATION_TRANSPORT = Spec(
    "Transport",
    one=("InetAddr", "Type", "TLS", "CAFile", "Certificate", "PrivateKey"),
    within="Destination",
    unsupported={"Name": "a destination's transports are tried in order; they have no name"},
)
DESTINATION_TOPIC = Spec(
    "Topic",
    one=("Name", "MessageType"),
    within="Destination",
    unsupported={"ExcludeValidation": _VALIDATION},
)

# Every section Spec but the per-module <Options> (OPTION_SPECS), in document order.
SECTIONS: tuple[Spec, ...] = (
    ROOT,
    TRANSPORTS,
    TRANSPORT,
    ADMIN,
    LOGGING,
    TARGET,
    TRANSACTION_LOG,
    TOPIC,
    SOW,
    SOW_TOPIC,
    SOW_HISTORY,
    QUEUE,
    ACTIONS,
    ACTION,
    ON,
    DO,
    AUTHENTICATION,
    ENTITLEMENT,
    ROLE,
    DENY,
    FILTER,
    REPLICATION,
    DESTINATION,
    DESTINATION_TRANSPORT,
    DESTINATION_TOPIC,
)


def unknown_element(tag: str, parent: str, spec: Spec) -> str:
    """The problem message for child `tag` of `parent` that `spec` does not allow."""
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
