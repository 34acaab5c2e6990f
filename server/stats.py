"""Server statistics, as served by the admin endpoint in JSON and Prometheus text format.

Counters are plain integers bumped on the hot path (server/counters.py, or read from the
pipeline and journal); rates are computed once a second by the server's ticker from counter deltas, so
reading the stats costs nothing per message. `Stats` reads each part it reports through the
part itself, handed over by the server when it starts (no back-pointer to the server).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Any

import msgspec

from journal.errors import JournalError
from journal.journal import Journal
from journal.record import KIND_MESSAGE

from .counters import Counters
from .fanout import Fanout
from .history import History
from .intake import Intake
from .pipeline import Pipeline
from .queues import QueueManager
from .replay_engine import ReplayEngine
from .sow.query_console import SowConsole
from .stats_replication import metric, queue_replication_metrics, replication_metrics


@dataclass(eq=False)
class Stats:
    instance: str
    started_at: float
    counters: Counters
    intake: Intake
    connections: Sized
    pipeline: Pipeline
    fanout: Fanout
    journal: Journal | None
    queues: QueueManager
    replays: ReplayEngine
    poll_rounds: Callable[[], int]
    # the journal's scheduled actions (Maintenance.status), set once maintenance has started
    actions: Callable[[], list[dict[str, Any]]] | None = None
    # replication destinations (SyncGate.snapshot), set when <Replication> has destinations
    replication: Callable[[], dict[str, dict[str, Any]]] | None = None
    # sources whose links this instance receives (Receiver.snapshot), set with a listener
    replication_sources: Callable[[], dict[str, dict[str, Any]]] | None = None
    held_batches: Callable[[], int] = lambda: 0
    sow: SowConsole | None = None  # the SOW topics (server/sow/query_console.py)
    # segment path -> Stats._first_time
    _first_times: dict[str, int | None] = field(default_factory=dict, init=False)
    publish_rate: float = field(default=0.0, init=False)
    delivery_rate: float = field(default=0.0, init=False)
    _last: tuple[int, int] = field(default=(0, 0), init=False)
    history: History = field(default_factory=History, init=False)
    _cpu: float = field(default_factory=lambda: _cpu_seconds(), init=False)
    # id(Replay) -> messages sent at the last sample
    _replay_sent: dict[int, int] = field(default_factory=dict, init=False)
    # name -> (acked, delivered)
    _queue_counts: dict[str, tuple[int, int]] = field(default_factory=dict, init=False)
    queue_ack_rates: dict[str, float] = field(default_factory=dict, init=False)

    def sample(self, elapsed: float) -> None:
        """Once a second (the server's ticker): the rates, and one sample into `history`."""
        if elapsed <= 0:
            return
        pub, dlv = self.pipeline.published, self.fanout.delivered
        self.publish_rate = (pub - self._last[0]) / elapsed
        self.delivery_rate = (dlv - self._last[1]) / elapsed
        self._last = (pub, dlv)
        if self.sow is not None:
            self.sow.sample(elapsed)
        self.history.record(self._row(elapsed))

    def _row(self, elapsed: float) -> dict[str, Any]:
        """The console's sample: a few numbers, each named with its unit."""
        cpu = _cpu_seconds()
        cpu_share, self._cpu = (cpu - self._cpu) / elapsed, cpu
        # a replay that ended within the second takes its last messages with it: a small undercount
        sent = {id(r): r.sent for r in self.replays.replays}
        replayed = sum(n - self._replay_sent.get(k, 0) for k, n in sent.items())
        self._replay_sent = sent
        acked = delivered = 0
        counts: dict[str, tuple[int, int]] = {}
        rates: dict[str, float] = {}
        for name, q in self.queues.queues.items():
            a, d = q.state.stats["acked"], q.state.stats["delivered"]
            pa, pd = self._queue_counts.get(name, (a, d))
            acked += a - pa
            delivered += d - pd
            counts[name] = (a, d)
            rates[name] = round((a - pa) / elapsed, 1)
        self._queue_counts, self.queue_ack_rates = counts, rates
        j = self.journal
        return {
            "t": round(time.time(), 3),
            "publish_per_s": round(self.publish_rate, 1),
            "delivery_per_s": round(self.delivery_rate, 1),
            "replay_per_s": round(replayed / elapsed, 1),
            "queue_ack_per_s": round(acked / elapsed, 1),
            "queue_delivery_per_s": round(delivered / elapsed, 1),
            "commit_latency_s": j.stats.last_latency_s if j is not None else None,
            "connections": len(self.connections),
            "subscriptions": self.fanout.router.count,
            "journal_bytes": j.disk_bytes() if j is not None else None,
            "disk_free_bytes": _free_bytes(j.directory) if j is not None else None,
            "cpu_percent": round(100 * cpu_share, 1),
            "rss_bytes": _rss(),
        }

    def _first_time(self, j: Journal, seg: Any, active: bool) -> int | None:
        """`_first_time_us` of a segment, read once: kept for good once found or once the
        segment is sealed (its first record never changes), so a page costs one small read per
        segment."""
        path = seg.path
        if path in self._first_times:
            return self._first_times[path]
        try:
            got = _first_time_us(j, seg)
        except (OSError, ValueError, JournalError):
            # removed meanwhile, not readable yet, a damaged compacted block, or the journal
            # closing: tried again next time, and never the end of a page's event stream
            return None
        if got is not None or not active:
            self._first_times[path] = got
        return got

    def details(self) -> dict[str, Any]:
        """What the console's Clients, Queues and Journal views show (built only for open pages).

        At most `MAX_CLIENTS` clients (those with the most output waiting first),
        `MAX_SUBSCRIPTIONS` subscriptions (furthest behind first) and `MAX_SEGMENTS` segments
        (the newest): what one page is sent each second stays bounded."""
        clients = []
        subs: list[dict[str, Any]] = []
        end = self.pipeline.delivered_end
        for conn in self.connections:  # type: ignore[attr-defined]  # Connections iterates
            s, out = conn.session, conn.out
            states = [sub.state.value for sub in s.table.subs.values()]
            for sub in s.table.subs.values():
                subs.append(_subscription(s.client_name, sub, end))
            queued = out.queued()
            clients.append(
                {
                    "id": conn.id,
                    "name": s.client_name,
                    "user": s.user_id,
                    "peer": s.peer,
                    "transport": conn.transport_name,
                    "connected_s": round(time.monotonic() - conn.connected_at, 1),
                    "logon_time": conn.logon_at,
                    "subscriptions": len(states),
                    "messages_in": s.received,
                    "messages_out": out.sent,
                    "bytes_in": conn.bytes_in,
                    "bytes_out": out.bytes_written,
                    "output_buffer_bytes": queued,
                    # past <ClientOfflineThreshold> (its live subscriptions read the journal
                    # instead), or the transport asked to stop writing: the peer reads slower
                    # than the server sends
                    "behind": bool(out.offline_at and queued > out.offline_at)
                    or not out.writable.is_set(),
                    "replaying": states.count("replaying"),
                }
            )
        clients.sort(key=lambda c: -c["output_buffer_bytes"])
        queues = {}
        now_us = time.time() * 1e6
        for name, q in self.queues.queues.items():
            oldest = q.state.oldest_waiting_us()
            queues[name] = {
                **q.snapshot(),
                "acked_per_s": self.queue_ack_rates.get(name, 0.0),
                "oldest_age_s": round(max(0.0, now_us - oldest) / 1e6, 1) if oldest else None,
                "consumers": q.state.consumers(),
            }
        j = self.journal
        segments = []
        if j is not None:
            last = len(j.segments) - 1
            first = max(0, len(j.segments) - MAX_SEGMENTS)
            shown = j.segments[first:]
            firsts = [self._first_time(j, seg, i == last) for i, seg in enumerate(shown, first)]
            paths = {seg.path for seg in shown}
            self._first_times = {p: t for p, t in self._first_times.items() if p in paths}
            segments = [
                {
                    "name": os.path.basename(seg.path),
                    "kind": "active"
                    if i == last
                    else ("compacted" if seg.kind == "compacted" else "sealed"),
                    "start_position": seg.base,
                    "end_position": seg.end,
                    "file_bytes": seg.file_bytes,
                    # receive times (µs since the epoch): its first message, and the next
                    # segment's first (times never decrease along the journal; None for the
                    # active segment, which ends now)
                    "first_time_us": firsts[k],
                    "until_time_us": firsts[k + 1] if k + 1 < len(firsts) else None,
                }
                for k, (i, seg) in enumerate(enumerate(shown, first))
            ]
        subs.sort(key=lambda d: -(d["lag_bytes"] or 0))
        return {
            "clients_total": len(clients),
            "clients": clients[:MAX_CLIENTS],
            "subscriptions_total": len(subs),
            "subscriptions": subs[:MAX_SUBSCRIPTIONS],
            "queues": queues,
            "segments_total": len(j.segments) if j is not None else 0,
            "segments": segments,
            "actions": self.actions() if self.actions is not None else [],
            "sow": self.sow.topics() if self.sow is not None else None,
        }

    def snapshot(self) -> dict[str, Any]:
        p = self.pipeline
        j = self.journal
        c = self.counters
        out: dict[str, Any] = {
            "instance": self.instance,
            "uptime_s": round(time.time() - self.started_at, 3),
            "pid": os.getpid(),
            "rss_bytes": _rss(),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "connections": len(self.connections),
            "connections_total": c.connections_total,
            "subscriptions": self.fanout.router.count,
            "replays": len(self.replays.replays),
            "lagging": {"fallbacks": self.replays.fallbacks, "rejoins": self.replays.rejoins},
            "topics": p.topics_seen,
            "published": p.published,
            "delivered": self.fanout.delivered,
            "duplicates": p.duplicates,
            "publish_rate": round(self.publish_rate, 1),
            "delivery_rate": round(self.delivery_rate, 1),
            "refused_commands": c.refused,
            "security": {
                "tls_handshakes_refused": c.tls_refused,
                "auth_failures": c.auth_failures,
                "not_entitled": c.not_entitled,
            },
            "idle_poll_rounds": self.poll_rounds(),
            "disconnects": dict(c.disconnects),
            "journal": None,
            "queues": self.queues.snapshot(),
            "queue_recovery_s": round(self.queues.recovery_seconds, 3),
            "sow": self.sow.topics() if self.sow is not None else None,
            "maintenance": self._maintenance(),
            "limits": {"input_buffered_bytes": self.intake.buffered, **self.intake.counts},
            "refused_above_gap": p.refused_above_gap,
            "replication": {
                "held_batches": self.held_batches(),
                "destinations": self.replication() if self.replication is not None else {},
                "sources": (
                    self.replication_sources() if self.replication_sources is not None else {}
                ),
                "replicated": p.replicated,
                "replicated_duplicates": p.replicated_duplicates,
                "queues": dict(self.queues.repl_stats),
            },
        }
        if j is not None:
            st = j.stats
            out["journal"] = {
                "directory": j.directory,
                "bytes": j.disk_bytes(),
                "segments": len(j.segments),
                "start_position": j.start_position,
                "end_position": j.end_position,
                "commits": st.commits,
                "records": st.records,
                "write_failures": st.failures,
                "available": j.available,
                "unavailable_since": st.unavailable_since or None,
                "recoveries": st.recoveries,
                "last_commit_latency_s": st.last_latency_s,
                "inflight_bytes": p.inflight_bytes,
                "recovery": j.recovery,
                "integrity": j.integrity.snapshot(),
            }
        return out

    def _maintenance(self) -> dict[str, Any]:
        """The scheduled actions (Maintenance.status) and, over their last runs, every step that
        could not do all it should and why ("held": "<action>: <step>: <why>")."""
        actions = self.actions() if self.actions is not None else []
        held = [
            f"{a['name']}: {h}" for a in actions if a.get("last") for h in a["last"].get("held", ())
        ]
        return {"actions": actions, "held": held}

    def prometheus(self) -> str:
        snap = self.snapshot()
        lines: list[str] = []
        _metrics(lines, snap, CONNECTION_METRICS)
        lim = snap["limits"]
        for key, what in LIMIT_METRICS:
            metric(lines, f"limit_{key}_total", what, lim.get(key, 0))
        _metrics(lines, snap, INSTANCE_METRICS)
        lines.append("# HELP tickertape_disconnects_total Connections closed, by reason.")
        lines.append("# TYPE tickertape_disconnects_total counter")
        for reason, n in sorted(snap["disconnects"].items()):
            lines.append(f'tickertape_disconnects_total{{reason="{reason}"}} {n}')
        if snap["queues"]:
            for key, help_ in QUEUE_METRICS:
                name = f"queue_{key}" + ("" if key in ("depth", "leased") else "_total")
                for i, (qname, q) in enumerate(sorted(snap["queues"].items())):
                    metric(lines, name, help_, q[key], f'{{queue="{qname}"}}', head=i == 0)
            queue_replication_metrics(lines, snap["queues"])
        replication_metrics(lines, snap["replication"])
        if snap["journal"]:
            _metrics(lines, snap["journal"], JOURNAL_METRICS)
        return "\n".join(lines) + "\n"


# /metrics of the instance: (metric name, help, where in /stats); a name that ends in _total is
# a counter, any other a gauge. The limits' counters (LIMIT_METRICS) go between the two tables.
CONNECTION_METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("connections", "Open client connections.", ("connections",)),
    ("connections_total", "Connections accepted since start.", ("connections_total",)),
    ("subscriptions", "Active subscriptions.", ("subscriptions",)),
    ("replays", "Bookmark replays in progress.", ("replays",)),
    ("subscriber_fallbacks_total", "Live subscriptions that lagged past ClientOfflineThreshold "
     "and read the journal.", ("lagging", "fallbacks")),
    ("subscriber_rejoins_total", "Lagging subscriptions that caught up and rejoined the live "
     "stream.", ("lagging", "rejoins")),
    ("input_buffered_bytes", "Partial input frames buffered over all connections.",
     ("limits", "input_buffered_bytes")),
)  # fmt: skip
INSTANCE_METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("publishes_refused_above_gap_total", "Publishes refused past a sequence that failed to "
     "commit (the gap rule).", ("refused_above_gap",)),
    ("topics", "Distinct topics seen.", ("topics",)),
    ("published_total", "Messages accepted for publish.", ("published",)),
    ("delivered_total", "Live deliveries to subscriptions.", ("delivered",)),
    ("duplicates_total", "Duplicate publishes dropped.", ("duplicates",)),
    ("publish_rate", "Messages published per second (last second).", ("publish_rate",)),
    ("delivery_rate", "Deliveries per second (last second).", ("delivery_rate",)),
    ("refused_commands_total", "Commands refused with a failure ack.", ("refused_commands",)),
    ("tls_handshakes_refused_total", "TLS handshakes that failed (plaintext client, untrusted "
     "or expired certificate...).", ("security", "tls_handshakes_refused")),
    ("auth_failures_total", "Logons refused with auth failure.", ("security", "auth_failures")),
    ("not_entitled_total", "Commands refused not entitled by the user's roles (and "
     "subscriptions ended so).", ("security", "not_entitled")),
    ("idle_poll_rounds_total", "Event-loop rounds spent polling after input instead of "
     "sleeping (<IdlePoll>).", ("idle_poll_rounds",)),
    ("rss_bytes", "Resident memory of the server process.", ("rss_bytes",)),
)  # fmt: skip
LIMIT_METRICS = (
    ("logon_timeout", "Connections closed for no logon within LogonTimeout."),
    ("logon_frame_too_large", "Connections closed for a frame over MaxLogonMessageSize before "
     "logon."),
    ("input_memory_limit", "Connections closed at InputMemoryLimit."),
    ("partial_message_timeout", "Connections closed for a frame not whole within "
     "PartialMessageTimeout."),
    ("idle", "Connections closed after IdleTimeout without input."),
    ("slow_client_age", "Connections closed for output not draining within "
     "ClientMessageAgeLimit."),
    ("subscriptions_refused", "Subscriptions refused at ClientMaxSubscriptions."),
    ("connections_refused", "Connections refused at MaxConnections."),
    ("address_connections_refused", "Connections refused at MaxConnectionsPerAddress."),
    ("unauthenticated_refused", "Connections refused at MaxUnauthenticatedConnections."),
)  # fmt: skip
QUEUE_METRICS = (
    ("depth", "Messages waiting in the queue."),
    ("leased", "Messages leased to consumers."),
    ("acked", "Messages acknowledged since start."),
    ("expired", "Messages expired since start."),
    ("redelivered", "Redeliveries since start."),
    ("delivered", "Deliveries since start."),
    ("dead_lettered", "Messages sent to the dead-letter topic since start."),
)
JOURNAL_METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("journal_bytes", "Bytes of journal segments on disk.", ("bytes",)),
    ("journal_segments", "Journal segment files.", ("segments",)),
    ("journal_commits_total", "Group commits.", ("commits",)),
    ("journal_records_total", "Records committed since start.", ("records",)),
    ("journal_write_failures_total", "Failed journal writes.", ("write_failures",)),
    ("journal_damaged_regions_total", "Damaged regions of the journal found at rest and "
     "skipped (never served).", ("integrity", "damaged_regions")),
    ("journal_damaged_bytes_total", "Bytes of the journal skipped as damaged.",
     ("integrity", "damaged_bytes")),
    ("journal_truncated_bytes_total", "Bytes of a torn tail truncated at open.",
     ("integrity", "truncated_bytes")),
    ("journal_index_rebuilds_total", "Times the derived index was found unreadable or "
     "inconsistent and rebuilt.", ("integrity", "index_rebuilds")),
    ("journal_available", "1 while the journal takes writes, 0 from a failed write until a "
     "probe succeeds.", ("available",)),
    ("journal_recoveries_total", "Times the journal became available again by itself.",
     ("recoveries",)),
    ("journal_last_commit_latency_seconds", "Duration of the last group commit.",
     ("last_commit_latency_s",)),
)  # fmt: skip


def _metrics(lines: list[str], snap: dict[str, Any], table: tuple) -> None:
    for name, help_, path in table:
        value: Any = snap
        for key in path:
            value = value[key]
        metric(lines, name, help_, value)


MAX_CLIENTS = 500
MAX_SUBSCRIPTIONS = 1000
MAX_SEGMENTS = 1000  # the newest
FIRST_TIME_SPAN = 64 * 1024  # a segment's first message is looked for this far, no further


def _first_time_us(j: Journal, seg: Any) -> int | None:
    """The receive time of the first message in `seg` (within its first FIRST_TIME_SPAN
    bytes), or None."""
    for r in j.records(seg.base, seg.end, max_bytes=4096):
        if r.kind == KIND_MESSAGE:
            return int(r.timestamp_us)
        if r.position - seg.base >= FIRST_TIME_SPAN:
            break
    return None


def _subscription(client: str | None, sub: Any, end: int) -> dict[str, Any]:
    """One row of the console's Subscriptions view: where it reads, and how far behind the
    journal end it is (bytes; None for a queue subscription, whose queue says)."""
    replay = sub.replay
    if sub.queue is not None:
        position = lag = None
    elif replay is not None:
        position = replay.position
        lag = max(0, end - position)
    else:
        position, lag = end, 0
    opts = {k: v for k, v in msgspec.structs.asdict(sub.opts).items() if v}
    return {
        "client": client,
        "sub_id": sub.sub_id,
        "topic": sub.topic,
        "regex": sub.regex is not None,
        "filter": sub.filter_text,
        "options": ",".join(k if v is True else f"{k}={v}" for k, v in opts.items()),
        "bookmark": sub.bookmark if isinstance(sub.bookmark, str) else None,
        "state": sub.state.value,
        "position": position,
        "lag_bytes": lag,
    }


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _free_bytes(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
