"""The publish path's batched intake: `BatchedIntake.publish_run` and `publish_raw`, mixed into
`Pipeline` (server/pipeline.py), which provides the attributes declared here.

Both take a run of plain publishes from one client-sequenced publisher and do what
`Pipeline.publish` does per message (dedup, receive time, record, batch rows) with the
bookkeeping (time, highest sequence, acks, schedule) done once per run. `publish_raw` takes the
frames' bytes straight to journal records in one pass (server/publish_scan.py, C when built),
the publishes to a SOW topic keyed there too (`key_spec`, from server/sow/);
`publish_run` takes already decoded (seq, topic, body) items. Whatever either does not take
(a duplicate, a publisher past a gap, a topic that is not recorded or is mapped, a field a
record cannot hold) is left for `Pipeline.publish` to answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from journal.record import KIND_MESSAGE, RecordFieldError, encode_record

from .publish_scan import publish_records

TOPIC_CACHE_LIMIT = 50_000  # the pipeline's topic caches are cleared past this many entries

__all__ = ["TOPIC_CACHE_LIMIT", "BatchedIntake", "Publisher"]


class Publisher(Protocol):
    """A publishing client, as the pipeline acknowledges it."""

    wants_persisted: bool

    def persisted(self, seq: int) -> None: ...
    def persist_failed(self, reason: str, detail: str) -> None: ...
    def flush_done(self, cid: Any, acks: list[str]) -> None: ...
    def flush_failed(self, cid: Any, acks: list[str], reason: str) -> None: ...


class BatchedIntake:
    # provided by Pipeline
    batch: Any
    journal: Any
    fanout: Any
    gaps: dict[int, int]
    highest: dict[int, int]
    last_ts: int
    published: int
    scheduled: bool
    _topics: dict[str, tuple[bytes, bytes, bool, bool]]
    _plain_topics: dict[bytes, Any]
    key_spec: Callable[[str], tuple[str, tuple[tuple[bytes, ...], ...], Any] | None]

    def topic_info(self, topic: str) -> tuple[bytes, bytes, bool, bool]:
        raise NotImplementedError

    def _schedule(self) -> None:
        raise NotImplementedError

    def publish_run(self, client: Publisher, pub: int, items: list[tuple[int, str, bytes]]) -> int:
        """Accept the leading publishes of `items` ((seq, topic, body) from one client-sequenced
        publisher, no header fragment, no expiration) that publish() would store; returns how
        many were taken. Each taken one ends as after publish() (STORED); the bookkeeping that
        publish() does per message (time, highest sequence, acks, schedule) is done once. The
        first one not taken (a duplicate, a publisher past a gap, a topic that is not recorded,
        a field the record cannot hold) is for publish() to answer."""
        if self.journal is None or self.fanout.early or (self.gaps and pub in self.gaps):
            return 0
        highest = self.highest.get(pub, 0)
        ts = max(self.last_ts, int(time.time() * 1_000_000))
        batch = self.batch
        data, entries, msgs = batch.data, batch.entries, batch.msgs
        cached = self._topics.get
        took = 0
        off = -1
        for seq, topic, body in items:
            if seq <= highest:
                break
            info = cached(topic) or self.topic_info(topic)
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
        self.last_ts = ts
        self.highest[pub] = highest
        if pub not in batch.first_seq:
            batch.first_seq[pub] = items[0][0]
        batch.last[pub] = (highest, off)
        if client.wants_persisted:
            batch.acks[client] = highest
        self.published += took
        if not self.scheduled:
            self._schedule()
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
        if self.journal is None or self.fanout.early or (self.gaps and pub in self.gaps):
            return pos, 0
        known = self._plain_topics
        taken = 0
        while True:
            batch = self.batch
            ts = max(self.last_ts, int(time.time() * 1_000_000))
            records, entries, msgs, stop, highest, asked, unknown = publish_records(
                raw, pos, pub, ts, self.highest.get(pub, 0), known, len(batch.data)
            )
            if entries:
                batch.data += records
                batch.entries += entries
                batch.msgs += msgs
                self.last_ts = ts
                self.highest[pub] = highest
                if pub not in batch.first_seq:
                    batch.first_seq[pub] = entries[0][1]
                batch.last[pub] = (highest, entries[-1][3])
                if asked:
                    client.wants_persisted = True
                if client.wants_persisted:
                    batch.acks[client] = highest
                self.published += len(entries)
                taken += len(entries)
                if not self.scheduled:
                    self._schedule()
            if unknown is None:
                return stop, taken
            topic = unknown.decode("ascii")  # plain publishes have ASCII topics
            if literal(topic) != topic:
                return stop, taken  # mapped, a pattern: the ordinary path
            _tb, _tj, recorded, plain = self.topic_info(topic)
            # a SOW topic whose <Key> the scanner reads: its frames keyed there
            spec = self.key_spec(topic) if recorded and not plain else None
            if not plain and spec is None:
                return stop, taken  # not recorded, keyed by the publisher: the ordinary path
            if len(known) >= TOPIC_CACHE_LIMIT:
                known.clear()
            known[unknown] = topic if plain else spec
            pos = stop
