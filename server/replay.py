"""Bookmark replay (docs/protocol.md §5, §6): the pass over the journal that feeds bookmark
subscriptions, with ranges, rate, pause/resume, conflation, and a seamless join to the live
stream. Where a replay starts and ends is planned in server/replay_plan.py.

A `Replay` is one pass over the journal that feeds one or more subscriptions of one connection
(several when they were resumed together, so they stay in step). Each subscription has a
`Cursor` (server/replay_cursor.py): where it starts (records before are skipped), where it ends (ranges), and its
conflation state. `ReplayEngine` (server/replay_engine.py) starts, pauses and resumes them and
knows the ones running.

States of a Replay:

    waiting (future begin time) -> replaying <-> paused
    replaying -> tailing   (caught up, but a cursor cannot go live: a range end, conflation)
    replaying -> done      (every cursor went live or reached its end)

Memory and pacing: a replay holds one read block (READ_BLOCK) of the journal at a time, reads it
off the event loop, and waits whenever the subscriber's transport is above its high-water mark
(`Outbox.writable`), so a slow replayer slows only itself.

The join: `feed.delivered_end` (the pipeline's) is the journal position up to which the loop has
done live delivery. A replay reads only below it; when it reaches it, it hands the subscription
to live delivery (`owner.went_live`) with no `await` between the check and the switch. Live
delivery runs on the loop too, in commit order, so it takes over at exactly that position: no
gap, no duplicate. A range that reaches its end is reported with `owner.range_done`.

`fully_durable` (with sync replication destinations: the engine's `durable_end`): the pass reads
only below the durable end (everything below is acked by every active sync destination,
server/replication/sync.py), and such a cursor never joins the live stream, which delivers at
local durability: it keeps tailing the journal. Other cursors of that pass join the live
stream only when the pass stands at the live end itself.

Lagging connections (`ReplayEngine.fall_back`): a live subscription whose connection's output
passed <ClientOfflineThreshold> gets a replay too, from the live end (after the last message it
was sent), without `completed`; one pass per connection, joined by any of its subscriptions
that lag later. It rejoins the live stream exactly as a bookmark replay does.

Rates: `N` msgs/s and `NKB` bytes/s are token budgets; `kX` replays at k times the original pace
(the gaps between records' receive times, divided by k), never waiting longer than
`rate_max_gap` for one record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any, Protocol

from journal.journal import Journal
from journal.record import KIND_MESSAGE
from protocol.filters import CompiledFilter, compiled
from protocol.options import Rate

from .filter_scan import filter_frames
from .frames import STORED, pack_len, timestamp_part, topic_member
from .matching import Body, TopicFilter, body_matches
from .outbox import Outbox
from .reasons import Disconnect
from .replay_cursor import Cursor
from .replay_plan import Pacer, now_us
from .splice import ACCELERATED as SPLICE_ACCELERATED
from .splice import splice_frames
from .subscriptions import Subscription

__all__ = ["Cursor", "Feed", "Replay", "ReplayHost"]

log = logging.getLogger("tickertape.replay")
READ_BLOCK = 256 * 1024
FIRST_BLOCK = 16 * 1024  # the first read is small, so the first message goes out at once


class Feed(Protocol):
    """What a replay needs of the live stream (the pipeline)."""

    delivered_end: int  # journal position up to which live delivery is done
    waiters: list[asyncio.Future[None]]  # resolved at every commit


class ReplayHost(Protocol):
    """What a Replay uses of the engine that runs it (server/replay_engine.py)."""

    journal: Journal | None
    readers: Executor
    feed: Feed
    replays: set[Replay]
    rejoins: int
    durable_end: Callable[[], int] | None  # with sync destinations: fully_durable reads below


def _read_spliced(
    journal: Journal,
    position: int,
    size: int,
    start: int,
    end: int,
    topic: bytes,
    head: bytes,
    flt: CompiledFilter | None,
) -> tuple[int, tuple[Any, ...]] | None:
    """In a reader thread: (position, splice_frames result) of the next block, only the
    messages `flt` matches when there is one (filter_frames); None in a compacted segment
    (whose records are read as tuples instead)."""
    blk = journal.read_block(position, size)
    if blk is None:
        return None
    buf, pos = blk
    if flt is not None:
        return pos, filter_frames(buf, pos, start, end, topic, head, flt)
    return pos, splice_frames(buf, pos, start, end, topic, head)


@dataclass(eq=False, repr=False)
class Replay:
    engine: ReplayHost
    cursors: list[Cursor]
    position: int
    _: KW_ONLY
    paused: bool = False
    wait_until: int | None = None  # micros: begin time in the future
    rate: Rate | None = None
    rate_max_gap: InitVar[float | None] = None
    lagging: bool = False  # the pass of a lagging connection (ReplayEngine.fall_back)

    def __post_init__(self, rate_max_gap: float | None) -> None:
        rate = self.rate
        self.pacer = Pacer(rate, rate_max_gap) if rate is not None else None
        self.task: asyncio.Task | None = None
        self.wake = asyncio.Event()
        self.sent = 0
        self.reads = 0  # journal blocks read: a filter that matches nothing still reads big ones
        for c in self.cursors:
            self._mark_durable(c)

    def _mark_durable(self, c: Cursor) -> None:
        c.durable_only = self.engine.durable_end is not None and c.sub.opts.fully_durable

    # -- control ----------------------------------------------------------------------------

    @property
    def out(self) -> Outbox:
        return self.cursors[0].sub.out

    def subs(self) -> list[Subscription]:
        return [c.sub for c in self.cursors]

    def last_bm_of(self, sub: Subscription) -> tuple[int, int] | None:
        """The bookmark of the last record the pass went through for `sub`."""
        return next((c.last_bm for c in self.cursors if c.sub is sub), None)

    def durable_bm_of(
        self, sub: Subscription, end: int, bm: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """The newest bookmark `sub` passed below durable end `end`, whose newest message
        overall is `bm`: its last one while the pass is below `end`, else `bm` when the
        pass started below `end` (so passed it); None when it is not known."""
        c = next((c for c in self.cursors if c.sub is sub), None)
        if c is None:
            return None
        if self.position <= end:
            return c.last_bm
        return bm if c.start <= end else None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())
        self.engine.replays.add(self)
        self.task.add_done_callback(self._done)
        for c in self.cursors:
            c.sub.replay = self

    def _done(self, task: asyncio.Task[None]) -> None:
        self.engine.replays.discard(self)
        if (
            not task.cancelled() and task.exception() is not None
        ):  # pragma: no cover - logged in run
            log.error("replay ended with %r", task.exception())

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def add(self, cursor: Cursor) -> None:
        """One more subscription joins this pass (its cursor starts at or after `position`)."""
        self._mark_durable(cursor)
        self.cursors.append(cursor)
        cursor.sub.replay = self
        self.wake.set()

    def detach(self, sub: Subscription) -> None:
        """Remove one subscription (unsubscribe); the pass goes on for the others."""
        self.cursors = [c for c in self.cursors if c.sub is not sub]
        if not self.cursors:
            self.cancel()
        self.wake.set()

    def replace(self, old: Subscription, new: Subscription) -> None:
        for c in self.cursors:
            if c.sub is old:
                c.sub = new
        if new.opts.rate is not None:
            self.rate = new.opts.rate
            self.pacer = Pacer(new.opts.rate, new.opts.rate_max_gap)
        self.wake.set()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self.pacer is not None:
            self.pacer.restart()
        self.wake.set()

    # -- the pass ---------------------------------------------------------------------------

    async def run(self) -> None:
        engine = self.engine
        journal = engine.journal  # None: only a paused NOW, which is at the live end already
        feed = engine.feed
        loop = asyncio.get_running_loop()
        try:
            if self.wait_until is not None:
                assert journal is not None  # a begin time is planned only with a journal
                await self._wait_begin_time(journal)
            while self.cursors:
                out = self.out
                if out.closing:
                    return
                if self.paused:
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                if not out.writable.is_set():
                    await out.writable.wait()
                    continue
                end = live_end = feed.delivered_end
                durable_end = engine.durable_end
                if durable_end is not None and any(c.durable_only for c in self.cursors):
                    end = min(end, durable_end())
                if self.position >= end:
                    if self._caught_up(end, end >= live_end):
                        return
                    await self._tail(feed)
                    continue
                assert journal is not None  # below the live end there is a journal to read
                size = READ_BLOCK if self.sent or self.reads else FIRST_BLOCK
                self.reads += 1
                plain = self._plain_cursor()
                if plain is not None:
                    c, head, flt = plain
                    got = await loop.run_in_executor(
                        engine.readers,
                        _read_spliced,
                        journal,
                        self.position,
                        size,
                        c.start,
                        end,
                        c.sub.topic_b,
                        head,
                        flt,
                    )
                    if got is not None:
                        if self._deliver_spliced(c, got, journal):
                            continue
                        return
                recs, nxt = await loop.run_in_executor(
                    engine.readers, journal.read_raw, self.position, size
                )
                if not recs:
                    nxt2 = journal.next_position(nxt)
                    if nxt2 == self.position:
                        log.error("replay stuck at position %d", self.position)
                        return
                    self.position = nxt2
                    continue
                if (
                    self.rate is None
                    and len(self.cursors) == 1
                    and not self.cursors[0].tail_only
                    and not self.paused
                ):
                    self.position = journal.next_position(
                        self._send_fast(self.cursors[0], recs, end, nxt)
                    )
                else:
                    self.position = journal.next_position(await self._send(recs, end, nxt))
        except Exception:  # not CancelledError (a BaseException): a cancel ends it quietly
            log.exception("replay failed at position %d", self.position)
            if self.cursors:
                self.out.close(Disconnect.BAD_FRAME)

    async def _wait_begin_time(self, journal: Journal) -> None:
        assert self.wait_until is not None
        while True:
            delay = (self.wait_until - now_us()) / 1e6
            if delay <= 0:
                break
            await asyncio.sleep(min(delay, 1.0))
            if self.out.closing:
                return
        pos = journal.locate_time(self.wait_until - 1)
        for c in self.cursors:
            c.start = pos
        self.position = pos
        self.wait_until = None

    def _caught_up(self, end: int, live: bool = True) -> bool:
        """At the end the pass may read to (`live`: the live end): hand plain cursors to live
        delivery; True when nothing is left."""
        now = now_us()
        for c in list(self.cursors):
            sub = c.sub
            if c.conflater is not None:
                self._emit_conflated(c, c.conflater.due(now))
            if c.end is not None and (c.end.expired(now) or c.end.reached(self.position)):
                if c.conflater is not None:
                    self._emit_conflated(c, c.conflater.drain())
                self._finish(c)
                continue
            if not c.completed_sent and c.end is None:
                c.completed_sent = True
                if "completed" in sub.acks and not sub.out.closing:
                    sub.out.send_ack("completed", sub.cid, sub_id=sub.sub_id)
            if live and not c.tail_only and not c.durable_only:
                self.cursors.remove(c)
                if c.lagging:
                    self.engine.rejoins += 1
                sub.owner.went_live(sub)
            sub.out.flush()
        return not self.cursors

    async def _tail(self, feed: Feed) -> None:
        """Wait for the next commit, a conflation window or a range end time."""
        timeout = 1.0
        now = now_us()
        for c in self.cursors:
            if c.conflater is not None and c.conflater.held:
                first = next(iter(c.conflater.held.values()))[0]
                timeout = min(timeout, max(0.001, (first + c.conflater.interval - now) / 1e6))
            if c.end is not None and c.end.ts is not None:
                timeout = min(timeout, max(0.001, (c.end.ts - now) / 1e6 + 0.001))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        feed.waiters.append(fut)
        self.wake.clear()
        wake = asyncio.ensure_future(self.wake.wait())
        either: list[asyncio.Future[Any]] = [fut, wake]
        try:
            await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            if not fut.done():
                fut.cancel()

    def _plain_cursor(self) -> tuple[Cursor, bytes, CompiledFilter | None] | None:
        """(cursor, frame head, its filter) when the one cursor is plain: a literal topic, no
        filter or a compiled one (protocol/filters), no timestamp, no rate, no range or
        conflation (the frames can be spliced from the journal's bytes); else None."""
        if self.rate is not None or len(self.cursors) != 1:
            return None
        c = self.cursors[0]
        sub = c.sub
        if c.skip is not None:
            if self.position < c.skip_until:
                return None  # the tuple paths leave out what the list says the subscriber has
            c.skip = None
        if c.tail_only or sub.timestamp or sub.regex is not None:
            return None
        flt = None
        if sub.filter is not None:
            flt = compiled(sub.filter)
            # combined with content entitlements, or no C splice_at (whose Python reference
            # slices each record again): the tuple path
            if flt is None or not SPLICE_ACCELERATED:
                return None
        return c, sub.prefix + topic_member(sub.topic_b), flt

    def _deliver_spliced(
        self, c: Cursor, got: tuple[int, tuple[Any, ...]], journal: Journal
    ) -> bool:
        """Queue one block of spliced frames; False when the replay cannot go on."""
        pos, (spliced, sent, stop, last_pub, last_seq, _at_end) = got
        out = c.sub.out
        if out.closing or self.paused or not self.cursors or self.cursors[0] is not c:
            return True  # the loop looks again; the block is read again if still wanted
        if sent:
            out.buf.append(spliced)
            self.sent += sent
            out.sent += sent
            out.flush()
        if last_pub is not None:
            c.last_bm = (last_pub, last_seq)
        nxt = journal.next_position(pos + stop)
        if nxt == self.position:
            log.error("replay stuck at position %d", self.position)
            return False
        self.position = nxt
        return True

    def _send_fast(self, cursor: Cursor, recs: list[Any], end: int, nxt: int) -> int:
        """One cursor, no rate, records as tuples: content filters, regex topics, timestamps, and
        compacted segments (a plain subscription on stored bytes goes through splice_frames)."""
        sub = cursor.sub
        outbox = sub.out
        out = outbox.buf
        matches = sub.matches_topic_bytes
        f = sub.filter
        start = cursor.start
        skip, skip_until = cursor.skip, cursor.skip_until
        prefix = sub.prefix
        ts_part = sub.timestamp
        sent = 0
        last = None
        for rec in recs:
            pos, kind, pub, seq, ts, tb, body, extra = rec
            if pos >= end:
                nxt = pos
                break
            last = rec
            if pos < start or kind != KIND_MESSAGE or not matches(tb):
                continue
            if skip is not None and pos < skip_until and seq <= skip.get(pub, 0):
                continue
            if f is not None:
                g = f.at(tb) if f.__class__ is TopicFilter else f  # content entitlements by topic
                if g is not None and not body_matches(g, body):
                    continue
            hdr = STORED % (
                prefix,
                topic_member(tb),
                b"" if extra is None else extra[1],
                pub,
                seq,
                timestamp_part(ts) if ts_part else b"",
            )
            out += (pack_len(len(hdr) + len(body)), hdr, body)
            sent += 1
        if last is not None:
            cursor.last_bm = (last[2], last[3])
        self.sent += sent
        outbox.sent += sent
        outbox.flush()
        return nxt

    async def _send(self, recs: list[Any], end: int, nxt: int) -> int:
        """The general loop: several cursors, rates, ranges, conflation."""
        for rec in recs:
            pos, kind, pub, seq, ts, tb, body, extra = rec
            if pos >= end:
                return pos
            if self.paused or not self.cursors or self.out.closing:
                return pos
            if kind != KIND_MESSAGE:
                continue
            if self.rate is not None:
                wanted = [
                    c for c in self.cursors if pos >= c.start and c.sub.matches_topic_bytes(tb)
                ]
                if wanted:
                    await self._pace(ts, len(body))
                    if self.paused or not self.cursors:
                        return pos
                    if not self.out.writable.is_set():
                        self.out.flush()
                        await self.out.writable.wait()
            doc = None
            for c in list(self.cursors):
                if pos < c.start:
                    continue
                c.last_bm = (pub, seq)
                if c.skip is not None and pos < c.skip_until and seq <= c.skip.get(pub, 0):
                    continue
                deliver = True
                stop = False
                if c.end is not None:
                    deliver, stop = c.end.check(pos, pub, seq, ts)
                sub = c.sub
                if deliver and sub.matches_topic_bytes(tb):
                    f = sub.filter
                    if f.__class__ is TopicFilter:  # content entitlements by topic
                        f = f.at(tb)
                    if f is not None:
                        if doc is None:
                            doc = Body(body)
                        deliver = doc.matches(f)
                    if deliver:
                        if c.conflater is not None:
                            self._emit_conflated(c, c.conflater.due(ts))
                            c.conflater.add(rec)
                        else:
                            self._emit(sub, pub, seq, ts, tb, extra, body)
                elif c.conflater is not None:
                    self._emit_conflated(c, c.conflater.due(ts))
                if stop:
                    if c.conflater is not None:
                        self._emit_conflated(c, c.conflater.drain())
                    self._finish(c)
            if self.rate is not None:
                self.out.flush()
        if self.cursors:
            self.out.flush()
        return nxt

    def _emit(
        self,
        sub: Subscription,
        pub: int,
        seq: int,
        ts: int,
        tb: bytes,
        extra: tuple[Any, bytes] | None,
        body: bytes,
    ) -> None:
        hdr = STORED % (
            sub.prefix,
            topic_member(tb),
            extra[1] if extra else b"",
            pub,
            seq,
            timestamp_part(ts) if sub.timestamp else b"",
        )
        out = sub.out
        out.buf += (pack_len(len(hdr) + len(body)), hdr, body)
        out.sent += 1
        self.sent += 1

    def _emit_conflated(self, c: Cursor, entries: list[list[Any]]) -> None:
        for _first_ts, first_pub, first_seq, rec in entries:
            self._emit(c.sub, first_pub, first_seq, rec[4], rec[5], rec[7], rec[6])
        if entries:
            c.sub.out.flush()

    def _finish(self, c: Cursor) -> None:
        """A range reached its end: completed ack, then the subscription is removed."""
        sub = c.sub
        self.cursors.remove(c)
        out = sub.out
        if not out.closing:
            if "completed" in sub.acks:
                out.send_ack("completed", sub.cid, sub_id=sub.sub_id)
            out.flush()
        sub.owner.range_done(sub)

    async def _pace(self, ts: int, size: int) -> None:
        assert self.pacer is not None
        delay = self.pacer.delay(ts, size)
        if delay > 0:
            await self._sleep(delay)

    async def _sleep(self, seconds: float) -> None:
        self.out.flush()
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), seconds)
