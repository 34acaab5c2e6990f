"""`SowManager`: the SOW store kept from the journal (docs/sow.md "How the store is kept").

The journal is the one source of truth. The store (server/sow/store.py) is a fold of it: for
each SOW topic, key -> the latest message, with the journal position it reflects written in the
same LMDB transaction.

- **Publish**: the session asks `key` for the record's key (or a `BadSowKey`) and
  publishes with `,"k":...` in the header fragment; the message is acknowledged `persisted` by
  the journal's rule, as any other.
- **Commit**: `before_flush` (a pipeline hook, called with the batch about to be committed)
  notes the batch's SOW messages and deletes; when the batch is durable, `_committed` takes
  them. Plain puts (no delete in the batch, nobody watching the topic for out-of-focus
  notices or deltas, no `<Expiration>`) are *held* (`HeldWrites`, server/sow/held.py), and
  written by its writer thread. Anything else waits for it and writes what is held
  (`HeldWrites.sync`), then is applied in journal order in one write transaction that also
  writes the batch's end position. Every read of the store (a query's snapshot, the expiration
  tick, `topics`, close) syncs first; delta_publish's merge reads the held rows and those being
  written. A batch with no SOW work writes nothing, except the position at most once a second
  (so a restart reads little journal). Nothing here runs for an instance without SOW topics.
- **Delete**: `delete` appends a SOW delete record (server/sow/records.py) to the open batch at
  once, so it keeps its place among the publishes around it; it is applied at its commit, and
  its reply (with `records_deleted`) goes out then.
- **Start** (`recover`, off the loop, before connections): from the position the store
  reflects to the journal's end, the same fold (`HeldWrites.start`). A store missing,
  unreadable, ahead of the journal, or behind the journal's start is rebuilt from the
  journal's start, and the log says why; a catch-up that fails leaves the store failed.
- **Consistency point**: between two loop callbacks the store reflects exactly the journal up
  to `Pipeline.delivered_end` (the fold runs inside the commit's completion, before the
  pipeline moves `delivered_end`), so a query's snapshot and that position are one point.

Parts, made here and handed what they use: `HeldWrites` (once the store is open) and `Deltas`
(delta_publish's merge, delta subscriptions: server/sow/deltas.py). States of the store:
opening -> catching up (recover) -> live (attached to the pipeline).
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import time
from collections.abc import Callable
from functools import partial
from operator import itemgetter
from typing import Any, Protocol

from config.model import Config, SowTopicSpec
from journal.journal import Journal
from journal.record import KIND_SOW_DELETE, encode_record
from protocol.bookmarks import BookmarkSpec, InvalidBookmark
from protocol.filters import FilterError, compile_filter

from ..matching import body_matches
from ..router import Router
from .checkpoints import Checkpoints
from .delta import DeltaFeed
from .deltas import Deltas
from .held import HeldWrites
from .history import HistoricalReader, locate_point
from .keys import (
    BadSowKey,
    KeyMaker,
    expires_at,
    k_fragment,
    key_from_fragment,
    with_expiration,
)
from .oof import OofNotices, send_notices
from .records import BY_EXPIRY, BY_FILTER, decode_delete, encode_delete
from .store import Reader, SowStore, decode_value, encode_value

__all__ = ["Commits", "SowManager"]


log = logging.getLogger("tickertape.sow")

POSITION_EVERY = 1.0  # seconds: the position of batches without SOW work is written this often


class Commits(Protocol):
    """What the SOW manager uses of the pipeline."""

    delivered_end: int
    last_ts: int
    last_bm: tuple[int, int] | None
    before_flush: list[Callable[[Any], None]]
    batch: Any
    inflight: Any  # the batches submitted and not yet committed, in commit order
    replicated_delete: Callable[[str, bytes, int, tuple[int, bytes, bytes]], None] | None

    def schedule(self) -> None: ...


Reply = Callable[[int, BaseException | None], None]
"""f(records_deleted, err) once a delete is committed (err None) or failed."""


def _EXPIRED(n: int, err: BaseException | None) -> None:
    """The reply of the deletes `tick` journals for expired records (nobody to answer)."""


class SowManager:
    def __init__(self, config: Config, journal: Journal | None) -> None:
        self.config = config
        self.journal = journal
        self.store: SowStore | None = None
        self.commits: Commits | None = None
        self._makers: dict[str, KeyMaker] = {}
        self._specs: dict[str, SowTopicSpec | None] = {}
        self.counts: dict[str, int] = {}  # records per topic
        self.updates: dict[str, int] = {}  # puts applied per topic since start (the console)
        self._pending: list[tuple[int, str, bytes, str, Reply | None]] = []
        self._pending_batch: Any = None
        self._recount: set[str] = set()  # topics whose record count changed since the last write
        self.held: HeldWrites | None = None  # the store's held writes, once it is open (recover)
        self._last_position_write = 0.0
        self.checkpoints: Checkpoints | None = None
        self.oof: OofNotices | None = None  # out-of-focus notices (attach)
        # (expires at µs, topic, key, position) of records of topics with <Expiration>; an
        # entry whose record was updated since (another position) is stale and skipped
        self._expiry: list[tuple[int, str, str, int]] = []
        self._expiring = any(t.expiration for t in config.sow_topics)
        windows = [t.history_window for t in config.sow_topics]
        # checkpoints are kept for the longest window (None: as far as the journal holds)
        self.window = None if not windows or None in windows else max(windows)  # type: ignore[type-var]
        self.deltas = Deltas(self.spec, self.maker, self._committed_body)  # delta_publish, feeds
        self.caught_up = 0  # records read from the journal by the last recover
        self.rebuilt: str | None = None  # why the last start rebuilt the store, if it did

    # -- topics and keys -----------------------------------------------------------------------

    def spec(self, topic: str) -> SowTopicSpec | None:
        """The `<SOW><Topic>` of `topic` when it is a SOW topic (recorded in the journal)."""
        try:
            return self._specs[topic]
        except KeyError:
            pass
        spec = self.config.sow_topic(topic)
        if spec is not None and not self.config.records_topic(topic):
            spec = None
        if len(self._specs) > 65536:
            self._specs.clear()
        self._specs[topic] = spec
        return spec

    def is_sow(self, topic: str) -> bool:
        return self.spec(topic) is not None

    def maker(self, spec: SowTopicSpec) -> KeyMaker:
        m = self._makers.get(spec.name)
        if m is None:
            m = self._makers[spec.name] = KeyMaker(spec.keys)
        return m

    def key(self, topic: str, body: bytes, given: str | None) -> str:
        """The key of a publish to SOW topic `topic` (raises BadSowKey)."""
        spec = self.spec(topic)
        assert spec is not None
        return self.maker(spec).key(body, given)

    def key_spec(self, topic: str) -> tuple[str, tuple[tuple[bytes, ...], ...], KeyMaker] | None:
        """(topic, key paths as member names, KeyMaker) for the publish scanner
        (server/publish_scan.py) to key the publishes to SOW topic `topic` in the batch; None
        when its keys are the publisher's `k` or a path has an array index."""
        spec = self.spec(topic)
        if spec is None:
            return None
        maker = self.maker(spec)
        return None if maker.steps is None else (topic, maker.steps, maker)

    def topics(self) -> list[str]:
        """Topics that hold records now."""
        self.flush()
        return [t for t, n in self.counts.items() if n > 0]

    def flush(self) -> None:
        """Write the held puts and wait for the writer thread (before a read of the store)."""
        if self.held is not None:
            self.held.sync()

    def _holdable(self, topic: str) -> bool:
        """Puts to `topic` may be held: no <Expiration>, no out-of-focus notices watching."""
        spec = self.spec(topic)
        oof = self.oof
        return spec is not None and not spec.expiration and not (oof and oof.watching(topic))

    def _committed_body(self, topic: str, k: str) -> bytes | None:
        """The body committed for record `k` (`HeldWrites.body`); None before the store opens."""
        return self.held.body(topic, k) if self.held is not None else None

    def merge_delta(self, topic: str, delta: bytes, given: str | None) -> bytes:
        """The message a delta_publish stores (`Deltas.merge_delta`)."""
        return self.deltas.merge_delta(self.commits, topic, delta, given)

    def delta_feed(self, sub: Any) -> DeltaFeed:
        """The live fan-out hook that makes `sub` a delta subscription (`Deltas.delta_feed`)."""
        return self.deltas.delta_feed(sub)

    # -- start -----------------------------------------------------------------------------------

    def recover(self) -> None:
        """Open the store and fold the journal into it from the position it reflects (runs off
        the loop, before the server accepts connections)."""
        journal = self.journal
        assert journal is not None
        path = os.path.join(journal.directory, "sow")
        existed = os.path.exists(path)
        store = self.store = SowStore(path)
        start = journal.start_position
        end = journal.end_position
        position = store.position
        why = None
        if store.rebuilt is not None:
            why = f"the store was unreadable ({store.rebuilt})"
        elif position is None:
            why = "there was no store" if not existed else "the store had no position"
        elif position > end:
            why = f"the store reflects position {position}, past the journal's end {end}"
        elif position < start:
            why = f"the store reflects position {position}, before the journal's start {start}"
        if why is not None:
            position = start
            self.rebuilt = why
            log.warning("SOW store rebuilt from the journal's start (%d): %s", start, why)
        assert position is not None
        kept = store.counts_kept
        self.counts = {} if why is not None else store.topics()
        if not kept:
            self._recount = set(self.counts)  # counted by a scan: kept from the next write on
        self.checkpoints = Checkpoints(
            os.path.join(journal.directory, "sow-checkpoints"),
            lambda: self.store.env if self.store is not None else None,
            lambda: self.store.trim(force=True) if self.store is not None else None,
            lambda: self.store.tree_bytes() if self.store is not None else 0,
            lambda: journal.start_position,
            self.config.sow_max_checkpoint_size,
        )
        self.held = HeldWrites(
            store, self.counts, self._recount, self.is_sow, self._holdable, self._put,
            self._delete, self.checkpoints, self.window,
        )  # fmt: skip
        began = time.monotonic()
        self.caught_up = self.held.start(journal, position, end, rebuild=why is not None)
        store.trim(force=True)  # the check at open and the catch-up read every page
        # records published with their own `e` may be in any SOW topic: the store says which
        self._load_expiry()
        self._expiring = self._expiring or bool(self._expiry)
        log.info(
            "SOW store at journal position %d: %d records read from %d in %.2fs; %d records in "
            "%d topics",
            end,
            self.caught_up,
            position,
            time.monotonic() - began,
            sum(self.counts.values()),
            len(self.counts),
        )

    # -- expiration -----------------------------------------------------------------------------

    def _load_expiry(self) -> None:
        """The expiry heap from the store (at start): every record of a topic that expires,
        and every record published with its own `e` (its stored fragment says so; the records
        of other topics are read only once the store has held such a record)."""
        store = self.store
        assert store is not None
        heap = []
        any_topic = store.expiring
        with store.env.begin() as txn:
            for topic in list(self.counts):
                spec = self.spec(topic)
                if spec is None or not (spec.expiration or any_topic):
                    continue
                for k, rec in store.topic_records(txn, topic):
                    at = expires_at(spec.expiration, rec[3], rec[4])
                    if at is not None:
                        heap.append((at, topic, k, rec[0]))
        heapq.heapify(heap)
        self._expiry = heap

    def _note_expiry(self, topic: str, k: str, pos: int, ts: int, hdr: bytes) -> None:
        spec = self.spec(topic)
        at = expires_at(spec.expiration if spec is not None else None, ts, hdr)
        if at is not None:
            heap = self._expiry
            heapq.heappush(heap, (at, topic, k, pos))
            if len(heap) > 2 * max(1, sum(self.counts.values())) + 1024:
                self._load_expiry()  # drop the stale entries: a bound on the heap

    def tick(self) -> None:
        """Journal a delete of the records past their topic's <Expiration> (one delete record
        per topic and tick); applied at its commit like any delete."""
        if self.held is not None:
            self.held.tick()
        heap = self._expiry
        if not heap or self.commits is None:
            return
        now = int(time.time() * 1e6)
        if heap[0][0] > now:
            return
        due: dict[str, list[str]] = {}
        store = self.store
        assert store is not None
        self.flush()  # an update of a due record may be held: it is no longer due
        reader = store.reader(0)
        try:
            while heap and heap[0][0] <= now:
                _at, topic, k, pos = heapq.heappop(heap)
                rec = reader.get(topic, k)
                if rec is not None and rec[0] == pos:  # not updated since
                    due.setdefault(topic, []).append(k)
        finally:
            reader.close()
        for topic, keys in due.items():
            log.debug("SOW %s: %d records expired", topic, len(keys))
            self.delete(topic, BY_EXPIRY, ",".join(keys), _EXPIRED)

    # -- the fold ---------------------------------------------------------------------------------

    def _put(
        self,
        txn: Any,
        topic: str,
        pos: int,
        pub: int,
        seq: int,
        ts: int,
        hdr: bytes,
        body: bytes,
        exp: float | None = None,
    ) -> str | None:
        store = self.store
        assert store is not None
        k = key_from_fragment(hdr) if hdr else None
        if k is None:  # recorded before the topic was a SOW topic, or by another instance
            spec = self.spec(topic)
            assert spec is not None
            try:
                k = self.maker(spec).key(body, None)
            except BadSowKey:
                return None  # not a record of this SOW topic: it had no key
            hdr = hdr + k_fragment(k)
        if exp:  # the publish's own `e`, in whole seconds as the journal keeps it
            hdr = with_expiration(hdr, math.ceil(exp))
            self._expiring = True
            store.note_expiring(txn)
        value = encode_value(pos, pub, seq, ts, hdr, body)
        oof = self.oof
        subs = oof.watching(topic) if oof is not None else None
        deltas = self.deltas
        if subs or deltas.feeds:
            old = store.replace(txn, topic, k, value)
            replaced = old is not None
            if old is not None:
                old_body = decode_value(old)[5]
                if subs:
                    oof.changed(subs, topic, k, old_body, body)  # type: ignore[union-attr]
                if deltas.feeds:
                    deltas.note_replaced(pos, old_body)
        else:
            replaced = store.put(txn, topic, k, value)
        if not replaced:
            self.counts[topic] = self.counts.get(topic, 0) + 1
            self._recount.add(topic)
        self.updates[topic] = self.updates.get(topic, 0) + 1
        if self._expiring and self.commits is not None:
            self._note_expiry(topic, k, pos, ts, hdr)
        return k

    def _delete(self, txn: Any, topic: str, body: bytes) -> int:
        store = self.store
        assert store is not None
        got = decode_delete(body)
        if got is None:
            return 0
        form, payload = got
        reason = "expired" if form == BY_EXPIRY else "deleted"
        if form != BY_FILTER:
            keys = [k for k in payload.split(",") if k]
        else:
            try:
                f = compile_filter(payload)
            except FilterError:
                return 0
            keys = [k for k, rec in store.topic_records(txn, topic) if body_matches(f, rec[5])]
        n = 0
        oof = self.oof
        subs = oof.watching(topic) if oof is not None else None
        for k in keys:
            if subs:
                old = store.pop(txn, topic, k)
                if old is not None:
                    n += 1
                    oof.left(subs, topic, k, decode_value(old)[5], reason)  # type: ignore[union-attr]
            elif store.delete(txn, topic, k):
                n += 1
        if n:
            self.counts[topic] = self.counts.get(topic, 0) - n
            self._recount.add(topic)
        return n

    # -- live: the pipeline's commits ------------------------------------------------------------

    def attach(self, commits: Commits, router: Router | None = None) -> None:
        self.commits = commits
        if router is not None:
            self.oof = OofNotices(router)
        commits.before_flush.append(self.before_flush)
        commits.replicated_delete = self.replicated_delete

    def before_flush(self, batch: Any) -> None:
        """The batch is about to be committed: note its SOW messages and deletes."""
        msgs = batch.msgs
        # per topic, not per message (a batch is mostly a few topics' runs); the set made in C
        topics = set(map(itemgetter(0), msgs)) if msgs else set()
        sow = {t for t in topics if self.is_sow(t)}  # recorded: their messages have offsets
        puts = (msgs if sow == topics else [m for m in msgs if m[0] in sow]) if sow else []
        deletes: list[tuple[int, str, bytes, str, Reply | None]] = []
        if self._pending:
            deletes, self._pending = self._pending, []
            if self._pending_batch is not batch:  # the batch they were in failed unsent
                for *_, reply in deletes:
                    if reply is not None:
                        reply(0, RuntimeError("the commit holding this delete failed"))
                deletes = []
            self._pending_batch = None
        now = time.monotonic()
        if not puts and not deletes:
            if now - self._last_position_write < POSITION_EVERY or not batch.data:
                return
        self._last_position_write = now
        # the batch in a cell the call empties: holding the batch itself makes a cycle (batch ->
        # durable -> callback -> batch) only the collector frees; every batch outlived its commit
        batch.durable.append(partial(self._committed, [batch], puts, sow, deletes))

    def _committed(
        self,
        cell: list[Any],
        puts: list[Any],
        topics: set[str],
        deletes: list[Any],
        end: int,
        err: BaseException | None,
    ) -> None:
        """The batch (`cell`'s one item) is durable (err None) or failed: apply it. A failure
        marks the store failed (store.py) until a restart; it never reaches the pipeline."""
        batch = cell.pop()  # called once: the batch commits or fails
        try:
            self._apply(batch, puts, topics, deletes, end, err)
        except Exception as exc:
            if self.store is not None:
                self.store.failed = self.store.failed or f"applying a commit failed: {exc!r}"
            log.exception("SOW store: applying a commit failed; queries are refused until restart")
            for *_, reply in deletes:
                if reply is not None:
                    try:
                        reply(0, exc)
                    except Exception:
                        log.exception("SOW delete reply failed")

    def _apply(
        self,
        batch: Any,
        puts: list[Any],
        topics: set[str],
        deletes: list[Any],
        end: int,
        err: BaseException | None,
    ) -> None:
        if err is not None:
            for *_, reply in deletes:
                if reply is not None:
                    reply(0, err)
            return
        base = end - len(batch.data)
        held = self.held
        assert held is not None
        # the records a delta feed watches are applied at once: it needs the bodies they replace
        if not deletes and not self.deltas.feeds and held.defer(puts, topics, base, end):
            updates = self.updates  # held puts count as updates now (the console's rate)
            if len(topics) == 1:
                for t in topics:
                    updates[t] = updates.get(t, 0) + len(puts)
            else:
                for m in puts:
                    updates[m[0]] = updates.get(m[0], 0) + 1
            return
        held.sync()  # the writer's flushes first: the store is written in journal order
        store = self.store
        assert store is not None
        work: list[tuple[int, Any]] = [(m[5], m) for m in puts]
        work += [(d[0], d) for d in deletes]
        work.sort(key=lambda w: w[0])
        replies: list[tuple[Reply, int]] = []
        with store.write() as txn:
            for off, item in work:
                if len(item) == 8:  # a message (topic, pub, seq, ts, body, off, hdr, exp)
                    topic, pub, seq, ts, body, _off, hdr, exp = item
                    self._put(txn, topic, base + off, pub, seq, ts, hdr, body, exp)
                else:
                    _off, topic, form, payload, reply = item
                    n = self._delete(txn, topic, encode_delete(form, payload))
                    if reply is _EXPIRED:
                        continue
                    if reply is not None:
                        replies.append((reply, n))
            store.set_position(txn, end, held.changed_counts())
        self._recount.clear()
        for reply, n in replies:
            reply(n, None)
        if self.oof is not None and self.oof.pending:
            batch.after.append(partial(send_notices, self.oof.take()))
        self.deltas.after_commit(batch)
        if self.checkpoints is not None:
            self.checkpoints.maybe_make(end, self.window)

    def delete(
        self,
        topic: str,
        form: bytes,
        payload: str,
        reply: Reply | None,
        ts: int | None = None,
        origin: tuple[int, bytes, bytes] | None = None,
    ) -> None:
        """Journal a delete on SOW topic `topic` (form BY_KEYS, BY_FILTER or BY_EXPIRY) in the
        open batch; `reply(records_deleted, err)` at its commit. `ts` and `origin`: a delete
        received by replication (`replicated_delete`)."""
        commits = self.commits
        assert commits is not None
        batch = commits.batch
        off = len(batch.data)
        batch.data += encode_record(
            KIND_SOW_DELETE,
            0,
            0,
            commits.last_ts if ts is None else ts,
            topic.encode("utf-8"),
            encode_delete(form, payload),
            origin=origin,
        )
        self._pending.append((off, topic, form, payload, reply))
        self._pending_batch = batch
        commits.schedule()

    def replicated_delete(
        self, topic: str, body: bytes, ts: int, origin: tuple[int, bytes, bytes]
    ) -> None:
        """A delete record received by replication (server/pipeline_replicate.py): journaled
        here as this instance's own, with its origin, in its place among the replicated
        messages around it, and applied at its commit like any delete. A body this version
        cannot read, or a topic that is not a SOW topic here, is left out."""
        got = decode_delete(body)
        if got is None or not self.is_sow(topic):
            return
        self.delete(topic, got[0], got[1], None, ts, origin)

    # -- queries ----------------------------------------------------------------------------------

    def snapshot(self) -> tuple[Reader, int, tuple[int, int] | None]:
        """A read snapshot of the store, the journal position it reflects (every message
        before it, none after), and the (publisher, seq) of the newest message there."""
        commits = self.commits
        store = self.store
        assert commits is not None and store is not None
        self.flush()
        end = commits.delivered_end
        return store.reader(end), end, commits.last_bm

    def historical(self, point: BookmarkSpec) -> tuple[HistoricalReader, tuple[int, int] | None]:
        """The state as of `point` (a bookmark: that message included; a timestamp: every
        message recorded at or before it) and the point's bookmark when known; runs off the
        loop (it reads the journal). Raises InvalidBookmark for a point it cannot answer."""
        journal = self.journal
        assert journal is not None and self.checkpoints is not None
        end, ts, bm = locate_point(journal, point)
        if self.window is not None and ts is not None and time.time() - ts / 1e6 > self.window:
            raise InvalidBookmark(
                f"the point is older than <History><Window> ({self.window:g}s); query a later one"
            )
        end = min(end, self.commits.delivered_end if self.commits is not None else end)
        reader = self.checkpoints.reader(
            journal, end, self.is_sow, lambda t: self.maker(s) if (s := self.spec(t)) else None
        )
        return reader, bm

    def close(self) -> None:
        if self.store is not None:
            if self.held is not None:
                self.held.close()  # written: a restart then reads no journal for them
            self.store.close()
            self.store = None
            self.held = None
