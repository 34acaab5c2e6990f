"""Replication's part of /metrics (docs/replication.md "Statistics"): per destination, per
source, the instance's totals, and the replicated queues' counters. Each table names the key in
/stats it comes from; a test holds the docs to these names."""

from __future__ import annotations

from typing import Any

__all__ = [
    "QUEUE_EVENT_METRICS",
    "QUEUE_REPLICATION_METRICS",
    "REPLICATION_METRICS",
    "REPLICATION_TOTALS",
    "SOURCE_METRICS",
    "metric",
    "queue_replication_metrics",
    "replication_metrics",
]

# per destination: (key in /stats, metric name, help); docs/replication.md
REPLICATION_METRICS = (
    ("connected", "replication_connected", "1 while the link to the destination is up."),
    (
        "acked_position",
        "replication_acked_position",
        "Journal position up to which the destination holds everything.",
    ),
    ("lag_bytes", "replication_lag_bytes", "Journal bytes the destination lacks."),
    (
        "lag_messages",
        "replication_lag_messages",
        "Messages committed since start that the destination lacks.",
    ),
    (
        "lag_seconds",
        "replication_lag_seconds",
        "Age of the oldest committed batch the destination lacks.",
    ),
    (
        "last_ack_time",
        "replication_last_ack_time_seconds",
        "Unix time of the destination's last ack (0: none since start).",
    ),
    (
        "catching_up",
        "replication_catching_up",
        "1 while connected but more than one batch behind (resynchronising).",
    ),
    ("sent_bytes", "replication_sent_bytes_total", "Bytes sent to the destination."),
    (
        "sent_messages",
        "replication_sent_messages_total",
        "Records sent to the destination.",
    ),
    ("downgrades", "replication_downgrades_total", "Downgrades to async."),
    ("upgrades", "replication_upgrades_total", "Upgrades back to sync."),
)


# replicated queues, per queue: (key in the queue's /stats, type, help); docs/replication.md
QUEUE_REPLICATION_METRICS = (
    ("held_for_others", "gauge", "Messages held here for the instance that owns them."),
    ("taken_over", "counter", "Takeovers of a lost owner's messages journaled here."),
    ("done_elsewhere", "counter", "Messages made done by an event from another instance."),
    ("released", "counter", "Messages given up here after another instance took them over."),
)

# the instance's replication totals: (key in /stats "replication", metric name, help)
REPLICATION_TOTALS = (
    (
        "replicated",
        "replication_received_messages_stored_total",
        "Messages stored from replication links.",
    ),
    (
        "replicated_duplicates",
        "replication_received_duplicates_total",
        "Messages from replication links dropped as duplicates.",
    ),
)

# replicated queue events ("queues" in /stats "replication"): (key, metric name, help)
QUEUE_EVENT_METRICS = (
    ("events_in", "replication_queue_events_in_total", "Queue-event records received."),
    (
        "unresolved_dropped",
        "replication_queue_events_unresolved_dropped_total",
        "Received queue events about messages not here, dropped.",
    ),
    (
        "unnamed_dropped",
        "replication_queue_events_unnamed_dropped_total",
        "Queue events not sent: their message was no longer in the journal.",
    ),
)

# per source instance (label source): (key in /stats "replication" "sources", name, help)
SOURCE_METRICS = (
    (
        "connected",
        "replication_source_connected",
        "1 while the link from the source is up.",
    ),
    (
        "resume_position",
        "replication_source_resume_position",
        "Source journal position up to which this instance holds everything it sent.",
    ),
    (
        "received_messages",
        "replication_source_received_messages_total",
        "Records received from the source.",
    ),
    (
        "received_bytes",
        "replication_source_received_bytes_total",
        "Record bytes received from the source.",
    ),
    (
        "duplicates",
        "replication_source_duplicates_total",
        "Messages from the source dropped as duplicates.",
    ),
)


def metric(
    lines: list[str], name: str, help_: str, value: Any, labels: str = "", head: bool = True
) -> None:
    """One sample of metric `tickertape_<name>`, after its HELP and TYPE lines when `head` (a
    name that ends in _total is a counter, any other a gauge)."""
    if head:
        lines.append(f"# HELP tickertape_{name} {help_}")
        lines.append(
            f"# TYPE tickertape_{name} {'counter' if name.endswith('_total') else 'gauge'}"
        )
    lines.append(f"tickertape_{name}{labels} {int(value) if type(value) is bool else value}")


def replication_metrics(lines: list[str], repl: dict[str, Any]) -> None:
    sources, dests = repl["sources"], repl["destinations"]
    if sources or dests:
        for key, name, help_ in REPLICATION_TOTALS:
            metric(lines, name, help_, repl[key])
        for key, name, help_ in QUEUE_EVENT_METRICS:
            metric(lines, name, help_, repl["queues"].get(key, 0))
    for key, name, help_ in SOURCE_METRICS:
        for i, (src, d) in enumerate(sorted(sources.items())):
            metric(lines, name, help_, int(d[key]), f'{{source="{src}"}}', head=i == 0)
    if not dests:
        return
    metric(
        lines,
        "replication_held_batches",
        "Committed batches whose acks wait for a sync destination.",
        repl["held_batches"],
    )
    for i, (dest, d) in enumerate(sorted(dests.items())):
        labels = f'{{destination="{dest}",mode="{d["mode"]}"}}'
        help_ = "The destination's mode (sync, async, downgraded): 1."
        metric(lines, "replication_mode", help_, 1, labels, head=i == 0)
    for key, name, help_ in REPLICATION_METRICS:
        for i, (dest, d) in enumerate(sorted(dests.items())):
            value = 0 if d[key] is None else d[key]
            metric(lines, name, help_, value, f'{{destination="{dest}"}}', head=i == 0)


def queue_replication_metrics(lines: list[str], queues: dict[str, dict[str, Any]]) -> None:
    """Per replicated queue (its /stats entry has the replication keys)."""
    replicated = {n: q for n, q in queues.items() if "held_for_others" in q}
    for key, kind, help_ in QUEUE_REPLICATION_METRICS:
        name = f"queue_{key}" + ("" if kind == "gauge" else "_total")
        for i, (qname, q) in enumerate(sorted(replicated.items())):
            metric(lines, name, help_, q[key], f'{{queue="{qname}"}}', head=i == 0)
