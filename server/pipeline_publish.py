"""What every intake of the pipeline shares, and the publish path's batched intake.

`Sequences` is the per-publisher state every intake checks and moves (the highest sequence
accepted, the gaps left by a failed commit, the receive clock, the counters); `TopicCache` what
the pipeline knows of a topic (its bytes, its JSON member, recorded, plain) and how it builds a
`Message` for the fan-out; `OpenBatch` the door to the batch being filled (the pipeline).

`RunIntake.publish_run` and `publish_raw` take a run of plain publishes from one
client-sequenced publisher and do what `Pipeline.publish` does per message (dedup, receive
time, record, batch rows) with the bookkeeping (time, highest sequence, acks, schedule) done
once per run. `publish_raw` takes the frames' bytes straight to journal records in one pass
(server/publish_scan.py, C when built), the publishes to a SOW topic keyed there too
(`TopicCache.key_spec`, from server/sow/); `publish_run` takes already decoded (seq, topic, body)
items. Whatever either does not take (a duplicate, a publisher past a gap, a topic that is not
recorded or is mapped, a field a record cannot hold) is left for `Pipeline.publish` to answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from journal.record import KIND_MESSAGE, RecordFieldError, encode_record

from . import frames
from .fanout import Fanout, Message
from .publish_scan import publish_records
from .topics import never

TOPIC_CACHE_LIMIT = 50_000  # the pipeline's topic caches are cleared past this many entries

__all__ = ["TOPIC_CACHE_LIMIT", "OpenBatch", "Publisher", "RunIntake", "Sequences", "TopicCache"]


class Publisher(Protocol):
    """A publishing client, as the pipeline acknowledges it."""

    wants_persisted: bool

    def persisted(self, seq: int) -> None: ...
    def persist_failed(self, reason: str, detail: str) -> None: ...
    def flush_done(self, cid: Any, acks: list[str]) -> None: ...
    def flush_failed(self, cid: Any, acks: list[str], reason: str) -> None: ...


class OpenBatch(Protocol):
    """The pipeline as an intake sees it: the batch being filled (a new one after each flush)
    and the commit it schedules."""

    batch: Any  # Batch (server/pipeline_batch.py, which names this module's Publisher)
    scheduled: bool

    def schedule(self) -> None: ...


@dataclass(slots=True, eq=False)
class Sequences:
    """Per publisher: the highest sequence accepted (stored or in flight) and, after a failed
    commit, the sequence it must send next (the gap rule, Pipeline._failed); the receive clock
    (never goes back in journal order); what was stored and dropped as duplicates."""

    highest: dict[int, int] = field(default_factory=dict)
    gaps: dict[int, int] = field(default_factory=dict)
    last_ts: int = 0
    published: int = 0
    duplicates: int = 0

    def now(self) -> int:
        """A receive time for the next records: microseconds, not before the last one."""
        return max(self.last_ts, int(time.time() * 1_000_000))


class TopicCache:
    """topic -> (topic bytes, topic member, recorded, plain), bounded; plain = recorded and not
    keyed: what the run paths may store as it comes."""

    def __init__(self, recorded: Callable[[str], bool]) -> None:
        self.recorded = recorded  # is the topic in the transaction log
        # topics whose publishes need the ordinary path (SOW topics: their key is computed
        # there, server/sow/): the run paths (publish_run, publish_raw) leave them to publish()
        self.keyed: Callable[[str], bool] = never
        # a keyed topic's key spec for publish_raw (server/sow/ key_spec), None: not there
        self.key_spec: Callable[[str], tuple[str, tuple[tuple[bytes, ...], ...], Any] | None] = (
            lambda topic: None
        )
        self.cache: dict[str, tuple[bytes, bytes, bool, bool]] = {}

    def info(self, topic: str) -> tuple[bytes, bytes, bool, bool]:
        info = self.cache.get(topic)
        if info is None:
            if len(self.cache) >= TOPIC_CACHE_LIMIT:
                self.cache.clear()
            recorded = self.recorded(topic)
            plain = recorded and not self.keyed(topic)
            info = (topic.encode(), frames.topic_member_text(topic), recorded, plain)
            self.cache[topic] = info
        return info

    def message(
        self,
        topic: str,
        pub: int,
        seq: int,
        ts: int,
        body: bytes,
        off: int,
        hdr: bytes,
        exp: Any,
        base: int,
    ) -> Message:
        """The fan-out's Message of a batch row (`Batch.msgs`) whose batch starts at `base`."""
        tj = self.info(topic)[1]
        if off >= 0:
            position = base + off
            suffix = frames.LIVE_SUFFIX % (tj, pub, seq, hdr)
        else:
            position = -1
            suffix = tj + hdr
        return Message(topic, pub, seq, ts, body, suffix, position, exp, hdr)


@dataclass(eq=False, repr=False)
class RunIntake:
    """Runs of plain publishes into the open batch, past the per-message path."""

    open: OpenBatch
    seqs: Sequences
    topics: TopicCache
    fanout: Fanout
    journaled: bool  # there is a journal: without, nothing is a run

    def __post_init__(self) -> None:
        # publish_raw: topic bytes -> topic, or a keyed topic's key spec
        self.plain_topics: dict[bytes, Any] = {}

    def publish_run(self, client: Publisher, pub: int, items: list[tuple[int, str, bytes]]) -> int:
        """Accept the leading publishes of `items` ((seq, topic, body) from one client-sequenced
        publisher, no header fragment, no expiration) that publish() would store; returns how
        many were taken. Each taken one ends as after publish() (STORED); the bookkeeping that
        publish() does per message (time, highest sequence, acks, schedule) is done once. The
        first one not taken (a duplicate, a publisher past a gap, a topic that is not recorded,
        a field the record cannot hold) is for publish() to answer."""
        seqs = self.seqs
        if not self.journaled or self.fanout.early or (seqs.gaps and pub in seqs.gaps):
            return 0
        highest = seqs.highest.get(pub, 0)
        ts = seqs.now()
        batch = self.open.batch
        data, entries, msgs = batch.data, batch.entries, batch.msgs
        cached = self.topics.cache.get
        took = 0
        off = -1
        for seq, topic, body in items:
            if seq <= highest:
                break
            info = cached(topic) or self.topics.info(topic)
            if not info[3]:  # not recorded, or keyed (a SOW topic)
                break
            try:
                rec = encode_record(KIND_MESSAGE, pub, seq, ts, info[0], body)
            except RecordFieldError:
                break
            off = len(data)
            entries.append((pub, seq, ts, off))
            data += rec
            msgs.append((topic, pub, seq, ts, body, off, b"", None))
            highest = seq
            took += 1
        if not took:
            return 0
        seqs.last_ts = ts
        seqs.highest[pub] = highest
        if pub not in batch.first_seq:
            batch.first_seq[pub] = items[0][0]
        batch.last[pub] = (highest, off)
        if client.wants_persisted:
            batch.acks[client] = highest
        seqs.published += took
        if not self.open.scheduled:
            self.open.schedule()
        return took

    def publish_raw(
        self,
        client: Publisher,
        pub: int,
        raw: bytes,
        pos: int,
        literal: Callable[[str], str | None],
    ) -> tuple[int, int]:
        """Store the leading plain publishes of the whole frames raw[pos:] (client-sequenced
        by `pub`; server/publish_scan.py says which frames are plain) as publish() would, with
        its bookkeeping (time, highest sequence, acks, schedule) done once. literal: the topic a
        publish to a topic is stored under (None: refused), as the session maps it. Returns
        (stop, taken): the frame at `stop` (if any) was not taken and is for the ordinary path.
        """
        seqs = self.seqs
        if not self.journaled or self.fanout.early or (seqs.gaps and pub in seqs.gaps):
            return pos, 0
        known = self.plain_topics
        taken = 0
        while True:
            batch = self.open.batch
            # Sequences.now(), inline: this runs once a read of a publisher
            ts = max(seqs.last_ts, int(time.time() * 1_000_000))
            records, entries, msgs, stop, highest, asked, unknown = publish_records(
                raw, pos, pub, ts, seqs.highest.get(pub, 0), known, len(batch.data)
            )
            if entries:
                batch.data += records
                batch.entries += entries
                batch.msgs += msgs
                seqs.last_ts = ts
                seqs.highest[pub] = highest
                if pub not in batch.first_seq:
                    batch.first_seq[pub] = entries[0][1]
                batch.last[pub] = (highest, entries[-1][3])
                if asked:
                    client.wants_persisted = True
                if client.wants_persisted:
                    batch.acks[client] = highest
                seqs.published += len(entries)
                taken += len(entries)
                if not self.open.scheduled:
                    self.open.schedule()
            if unknown is None:
                return stop, taken
            topic = unknown.decode("ascii")  # plain publishes have ASCII topics
            if literal(topic) != topic:
                return stop, taken  # mapped, a pattern: the ordinary path
            _tb, _tj, recorded, plain = self.topics.info(topic)
            # a SOW topic whose <Key> the scanner reads: its frames keyed there
            spec = self.topics.key_spec(topic) if recorded and not plain else None
            if not plain and spec is None:
                return stop, taken  # not recorded, keyed by the publisher: the ordinary path
            if len(known) >= TOPIC_CACHE_LIMIT:
                known.clear()
            known[unknown] = topic if plain else spec
            pos = stop
