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
    "queue_replication_metrics",
    "replication_metrics",
]

# per destination: (key in /stats, metric name, type, help); docs/replication.md
REPLICATION_METRICS = (
    ("connected", "replication_connected", "gauge", "1 while the link to the destination is up."),
    (
        "acked_position",
        "replication_acked_position",
        "gauge",
        "Journal position up to which the destination holds everything.",
    ),
    ("lag_bytes", "replication_lag_bytes", "gauge", "Journal bytes the destination lacks."),
    (
        "lag_messages",
        "replication_lag_messages",
        "gauge",
        "Messages committed since start that the destination lacks.",
    ),
    (
        "lag_seconds",
        "replication_lag_seconds",
        "gauge",
        "Age of the oldest committed batch the destination lacks.",
    ),
    (
        "last_ack_time",
        "replication_last_ack_time_seconds",
        "gauge",
        "Unix time of the destination's last ack (0: none since start).",
    ),
    (
        "catching_up",
        "replication_catching_up",
        "gauge",
        "1 while connected but more than one batch behind (resynchronising).",
    ),
    ("sent_bytes", "replication_sent_bytes_total", "counter", "Bytes sent to the destination."),
    (
        "sent_messages",
        "replication_sent_messages_total",
        "counter",
        "Records sent to the destination.",
    ),
    ("downgrades", "replication_downgrades_total", "counter", "Downgrades to async."),
    ("upgrades", "replication_upgrades_total", "counter", "Upgrades back to sync."),
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

# per source instance (label source): (key in /stats "replication" "sources", name, type, help)
SOURCE_METRICS = (
    (
        "connected",
        "replication_source_connected",
        "gauge",
        "1 while the link from the source is up.",
    ),
    (
        "resume_position",
        "replication_source_resume_position",
        "gauge",
        "Source journal position up to which this instance holds everything it sent.",
    ),
    (
        "received_messages",
        "replication_source_received_messages_total",
        "counter",
        "Records received from the source.",
    ),
    (
        "received_bytes",
        "replication_source_received_bytes_total",
        "counter",
        "Record bytes received from the source.",
    ),
    (
        "duplicates",
        "replication_source_duplicates_total",
        "counter",
        "Messages from the source dropped as duplicates.",
    ),
)


def replication_metrics(lines: list[str], repl: dict[str, Any]) -> None:
    sources = repl["sources"]
    if sources or repl["destinations"]:
        for key, metric, help_ in REPLICATION_TOTALS:
            lines.append(f"# HELP tickertape_{metric} {help_}")
            lines.append(f"# TYPE tickertape_{metric} counter")
            lines.append(f"tickertape_{metric} {repl[key]}")
        for key, metric, help_ in QUEUE_EVENT_METRICS:
            lines.append(f"# HELP tickertape_{metric} {help_}")
            lines.append(f"# TYPE tickertape_{metric} counter")
            lines.append(f"tickertape_{metric} {repl['queues'].get(key, 0)}")
    if sources:
        for key, metric, kind, help_ in SOURCE_METRICS:
            lines.append(f"# HELP tickertape_{metric} {help_}")
            lines.append(f"# TYPE tickertape_{metric} {kind}")
            for name, d in sorted(sources.items()):
                lines.append(f'tickertape_{metric}{{source="{name}"}} {int(d[key])}')
    dests = repl["destinations"]
    if not dests:
        return
    lines.append(
        "# HELP tickertape_replication_held_batches Committed batches whose acks wait for a "
        "sync destination."
    )
    lines.append("# TYPE tickertape_replication_held_batches gauge")
    lines.append(f"tickertape_replication_held_batches {repl['held_batches']}")
    lines.append(
        "# HELP tickertape_replication_mode The destination's mode (sync, async, downgraded): 1."
    )
    lines.append("# TYPE tickertape_replication_mode gauge")
    for name, d in sorted(dests.items()):
        lines.append(f'tickertape_replication_mode{{destination="{name}",mode="{d["mode"]}"}} 1')
    for key, metric, kind, help_ in REPLICATION_METRICS:
        lines.append(f"# HELP tickertape_{metric} {help_}")
        lines.append(f"# TYPE tickertape_{metric} {kind}")
        for name, d in sorted(dests.items()):
            value = d[key]
            if value is None:
                value = 0
            elif isinstance(value, bool):
                value = int(value)
            lines.append(f'tickertape_{metric}{{destination="{name}"}} {value}')


def queue_replication_metrics(lines: list[str], queues: dict[str, dict[str, Any]]) -> None:
    """Per replicated queue (its /stats entry has the replication keys)."""
    replicated = {n: q for n, q in queues.items() if "held_for_others" in q}
    if not replicated:
        return
    for key, kind, help_ in QUEUE_REPLICATION_METRICS:
        name = f"queue_{key}" + ("" if kind == "gauge" else "_total")
        lines.append(f"# HELP tickertape_{name} {help_}")
        lines.append(f"# TYPE tickertape_{name} {kind}")
        for qname, q in sorted(replicated.items()):
            lines.append(f'tickertape_{name}{{queue="{qname}"}} {q[key]}')
