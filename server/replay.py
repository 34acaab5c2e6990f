"""Bookmark replay (PROTOCOL.md §5, §6): start points, ranges, rate, pause/resume, conflation,
and a seamless join to the live stream.

A `Replay` is one pass over the journal that feeds one or more subscriptions of one connection
(several when they were resumed together, so they stay in step). Each subscription has a
`Cursor`: where it starts (records before are skipped), where it ends (ranges), and its
conflation state.

States of a Replay:

    waiting (future begin time) -> replaying <-> paused
    replaying -> tailing   (caught up, but a cursor cannot go live: a range end, conflation)
    replaying -> done      (every cursor went live or reached its end)

Memory and pacing: a replay holds one read block (READ_BLOCK) of the journal at a time, reads it
off the event loop, and waits whenever the subscriber's transport is above its high-water mark
(`Outbox.writable`), so a slow replayer slows only itself.

The join: `pipeline.delivered_end` is the journal position up to which the loop has done live
delivery. A replay reads only below it; when it reaches it, it sets `sub.live = True` with no
`await` between the check and the switch. Live delivery runs on the loop too, in commit order,
so it takes over at exactly that position: no gap, no duplicate.

Rates: `N` msgs/s and `NKB` bytes/s are token budgets; `kX` replays at k times the original pace
(the gaps between records' receive times, divided by k), never waiting longer than
`rate_max_gap` for one record.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from journal.record import KIND_MESSAGE
from protocol.bookmarks import Bookmark, BookmarkList, Epoch, InvalidBookmark, Now, Range, Timestamp

from . import frames
from .matching import Body, body_matches
from .reasons import Disconnect
from .splice import splice_frames

log = logging.getLogger("tickertape.replay")
_decode = msgspec.json.Decoder().decode
READ_BLOCK = 256 * 1024
FIRST_BLOCK = 16 * 1024  # the first read is small, so the first message goes out at once


class UnknownBookmark(InvalidBookmark):
    pass


# -- start and end points -----------------------------------------------------------------------


def _now_us() -> int:
    return int(time.time() * 1_000_000)


def _point_position(journal, point, inclusive: bool, not_found: str | None):
    """Position where a replay beginning at `point` starts, or None for NOW.

    Returns ("at", position) or ("wait", micros) for a begin time in the future.
    """
    if isinstance(point, Now):
        return None
    if isinstance(point, Epoch):
        return ("at", journal.start_position)
    if isinstance(point, Timestamp):
        if point.micros > _now_us():
            return ("wait", point.micros if inclusive else point.micros + 1)
        return ("at", journal.locate_time(point.micros - 1 if inclusive else point.micros))
    if isinstance(point, Bookmark):
        pos = journal.locate(point.publisher_id, point.seq)
        if pos is not None:
            return ("at", pos if inclusive else journal.after(pos))
        return _not_found(journal, point, not_found)
    if isinstance(point, BookmarkList):
        found = []
        waits = []
        for item in point.items:
            if isinstance(item, Bookmark):
                pos = journal.locate(item.publisher_id, item.seq)
                if pos is not None:
                    found.append(pos if inclusive else journal.after(pos))
                continue
            r = _point_position(journal, item, inclusive, "now")
            if r is None:
                found.append(journal.end_position)
            elif r[0] == "at":
                found.append(r[1])
            else:
                waits.append(r[1])
        if found:
            return ("at", min(found))
        if waits:
            return ("wait", min(waits))
        return _not_found(journal, point, not_found)
    raise InvalidBookmark(f"{type(point).__name__} cannot be a start point")


def _not_found(journal, spec, not_found):
    mode = not_found or "now"
    log.info("bookmark %s is not in the transaction log; starting at %s", spec, mode.upper())
    if mode == "epoch":
        return ("at", journal.start_position)
    if mode == "fail":
        raise UnknownBookmark(
            f"bookmark {spec} is not in the transaction log (bookmark_not_found=fail); "
            "subscribe from a stored bookmark, a time, or 0 (EPOCH)"
        )
    return None


class End:
    """Where a range stops. check(position, pub, seq, ts) -> (deliver_this, stop_after)."""

    __slots__ = ("inclusive", "position", "pub", "seq", "ts")

    def __init__(self, position=None, pub=None, seq=None, ts=None, inclusive=True):
        self.position = position
        self.pub = pub
        self.seq = seq
        self.ts = ts
        self.inclusive = inclusive

    def check(self, position: int, pub: int, seq: int, ts: int) -> tuple[bool, bool]:
        if self.position is not None:
            if position < self.position:
                return True, False
            if position == self.position:
                return self.inclusive, True
            return False, True
        if self.ts is not None:
            if ts < self.ts or (ts == self.ts and self.inclusive):
                return True, False
            return False, True
        if pub == self.pub and seq == self.seq:
            return self.inclusive, True
        return True, False

    def expired(self, now_us: int) -> bool:
        """A time end that has passed: nothing later can still belong to the range."""
        return self.ts is not None and now_us > self.ts


def resolve_end(journal, point, inclusive: bool, end_now: int) -> End:
    if isinstance(point, Now):
        return End(position=end_now, inclusive=False)
    if isinstance(point, Epoch):
        return End(position=journal.start_position, inclusive=False)
    if isinstance(point, Timestamp):
        return End(ts=point.micros, inclusive=inclusive)
    if isinstance(point, Bookmark):
        pos = journal.locate(point.publisher_id, point.seq)
        if pos is not None:
            return End(position=pos, inclusive=inclusive)
        return End(pub=point.publisher_id, seq=point.seq, inclusive=inclusive)
    if isinstance(point, BookmarkList):
        # a list ends at its newest member: a range never stops before a point it names
        ends = [resolve_end(journal, item, inclusive, end_now) for item in point.items]
        known = [e for e in ends if e.position is not None]
        if len(known) == len(ends):
            return max(known, key=lambda e: e.position)
        pending = [e for e in ends if e.position is None]
        return pending[0]
    raise InvalidBookmark(f"{type(point).__name__} cannot be an end point")


class Plan:
    """Resolved bookmark: start ("at", pos) / ("wait", micros) / None (NOW), and an optional End."""

    __slots__ = ("end", "start")

    def __init__(self, start, end=None):
        self.start = start
        self.end = end


def plan_replay(journal, spec, not_found: str | None, end_now: int) -> Plan:
    if isinstance(spec, Range):
        start = _point_position(journal, spec.begin, spec.begin_inclusive, not_found)
        if start is None:
            start = ("at", end_now)
        return Plan(start, resolve_end(journal, spec.end, spec.end_inclusive, end_now))
    return Plan(_point_position(journal, spec, False, not_found))


# -- conflation -----------------------------------------------------------------------------------


class Conflater:
    """Latest message per key per interval, on the records' own timeline.

    A key's window opens at its first message; the delivery at the window's end carries the
    latest body and the *first* message's bookmark (as AMPS does).
    """

    __slots__ = ("held", "interval", "paths")

    def __init__(self, interval_s: float, keys):
        self.interval = int(interval_s * 1_000_000)
        self.paths = tuple(
            tuple(int(p) if p.isdigit() else p for p in k.strip("/").split("/")) for k in keys or ()
        )
        self.held: dict = {}  # key -> [first_ts, first_pub, first_seq, latest record]

    def key(self, topic: bytes, body: bytes):
        if not self.paths:
            return topic
        try:
            doc = _decode(body)
        except msgspec.DecodeError:
            return (topic, None)
        out = [topic]
        for path in self.paths:
            v = doc
            for step in path:
                try:
                    v = v[step]
                except (KeyError, IndexError, TypeError):
                    v = None
                    break
            out.append(v if isinstance(v, (str, int, float, bool)) or v is None else repr(v))
        return tuple(out)

    def due(self, now_ts: int) -> list:
        """Pop every held message whose window ended at or before now_ts, oldest first."""
        out = []
        held = self.held
        for key in list(held):
            entry = held[key]
            if entry[0] + self.interval > now_ts:
                break
            del held[key]
            out.append(entry)
        return out

    def add(self, rec) -> None:
        k = self.key(rec[5], rec[6])
        entry = self.held.get(k)
        if entry is None:
            self.held[k] = [rec[4], rec[2], rec[3], rec]
        else:
            entry[3] = rec

    def drain(self) -> list:
        out = list(self.held.values())
        self.held.clear()
        return out


# -- cursors and the replay pass --------------------------------------------------------------------


def _read_spliced(
    journal, position: int, size: int, start: int, end: int, topic: bytes, head: bytes
):
    """In a reader thread: (position, splice_frames result) of the next block, None in a
    compacted segment (whose records are read as tuples instead)."""
    blk = journal.read_block(position, size)
    if blk is None:
        return None
    buf, pos = blk
    return pos, splice_frames(buf, pos, start, end, topic, head)


class Cursor:
    __slots__ = ("completed_sent", "conflater", "end", "last_bm", "start", "sub", "tail_only")

    def __init__(self, sub, start: int, end: End | None):
        self.sub = sub
        self.start = start
        self.end = end
        o = sub.opts
        self.conflater = Conflater(o.conflation, o.conflation_key) if o.conflation else None
        self.completed_sent = False
        self.last_bm = None
        # ranges and conflation never hand over to the live path: they keep reading the journal
        self.tail_only = end is not None or self.conflater is not None


class Replay:
    def __init__(
        self,
        server,
        cursors: list[Cursor],
        position: int,
        *,
        paused=False,
        wait_until=None,
        rate=None,
        rate_max_gap=None,
    ):
        self.server = server
        self.cursors = cursors
        self.position = position
        self.paused = paused
        self.wait_until = wait_until  # micros: begin time in the future
        self.rate = rate
        self.rate_max_gap = rate_max_gap
        self.task: asyncio.Task | None = None
        self.wake = asyncio.Event()
        self.sent = 0
        self._pace_wall = None  # rate state
        self._pace_ts = None
        self._tokens = 0.0
        self._last_refill = 0.0

    # -- control ----------------------------------------------------------------------------

    @property
    def out(self):
        return self.cursors[0].sub.out

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())
        self.server.replays.add(self)
        self.task.add_done_callback(self._done)
        for c in self.cursors:
            c.sub.replay = self

    def _done(self, task) -> None:
        self.server.replays.discard(self)
        if (
            not task.cancelled() and task.exception() is not None
        ):  # pragma: no cover - logged in run
            log.error("replay ended with %r", task.exception())

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def detach(self, sub) -> None:
        """Remove one subscription (unsubscribe); the pass goes on for the others."""
        self.cursors = [c for c in self.cursors if c.sub is not sub]
        if not self.cursors:
            self.cancel()
        self.wake.set()

    def replace(self, old, new) -> None:
        for c in self.cursors:
            if c.sub is old:
                c.sub = new
        if new.opts.rate is not None:
            self.rate = new.opts.rate
            self.rate_max_gap = new.opts.rate_max_gap
            self._pace_wall = None
        self.wake.set()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._pace_wall = None
        self.wake.set()

    # -- the pass ---------------------------------------------------------------------------

    async def run(self) -> None:
        server = self.server
        journal = server.journal
        pipeline = server.pipeline
        loop = asyncio.get_running_loop()
        try:
            if self.wait_until is not None:
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
                end = pipeline.delivered_end
                if self.position >= end:
                    if self._caught_up(end):
                        return
                    await self._tail(pipeline)
                    continue
                size = READ_BLOCK if self.sent else FIRST_BLOCK
                plain = self._plain_cursor()
                if plain is not None:
                    c, head = plain
                    got = await loop.run_in_executor(
                        server.readers,
                        _read_spliced,
                        journal,
                        self.position,
                        size,
                        c.start,
                        end,
                        c.sub.topic_b,
                        head,
                    )
                    if got is not None:
                        if self._deliver_spliced(c, got, journal):
                            continue
                        return
                recs, nxt = await loop.run_in_executor(
                    server.readers, journal.read_raw, self.position, size
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
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("replay failed at position %d", self.position)
            if self.cursors:
                self.out.close(Disconnect.BAD_FRAME)

    async def _wait_begin_time(self, journal) -> None:
        while True:
            delay = (self.wait_until - _now_us()) / 1e6
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

    def _caught_up(self, end: int) -> bool:
        """At the live end: hand plain cursors to live delivery; True when nothing is left."""
        now = _now_us()
        for c in list(self.cursors):
            sub = c.sub
            if c.conflater is not None:
                self._emit_conflated(c, c.conflater.due(now))
            if c.end is not None and c.end.expired(now):
                if c.conflater is not None:
                    self._emit_conflated(c, c.conflater.drain())
                self._finish(c)
                continue
            if not c.completed_sent and c.end is None:
                c.completed_sent = True
                if "completed" in sub.acks and not sub.out.closing:
                    sub.out.send_ack("completed", sub.cid, sub_id=sub.sub_id)
            if not c.tail_only:
                if sub.opts.live:
                    sub.early = True
                    self.server.pipeline.join_early(sub)
                sub.live = True
                sub.replay = None
                self.cursors.remove(c)
            sub.out.flush()
        return not self.cursors

    async def _tail(self, pipeline) -> None:
        """Wait for the next commit, a conflation window or a range end time."""
        timeout = 1.0
        now = _now_us()
        for c in self.cursors:
            if c.conflater is not None and c.conflater.held:
                first = next(iter(c.conflater.held.values()))[0]
                timeout = min(timeout, max(0.001, (first + c.conflater.interval - now) / 1e6))
            if c.end is not None and c.end.ts is not None:
                timeout = min(timeout, max(0.001, (c.end.ts - now) / 1e6 + 0.001))
        fut = asyncio.get_running_loop().create_future()
        pipeline.waiters.append(fut)
        self.wake.clear()
        wake = asyncio.ensure_future(self.wake.wait())
        try:
            await asyncio.wait([fut, wake], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            if not fut.done():
                fut.cancel()

    def _plain_cursor(self):
        """(cursor, frame head) when the one cursor is plain: a literal topic, no filter, no
        timestamp, no rate, no range or conflation (the frames can be spliced from the journal's
        bytes); else None."""
        if self.rate is not None or len(self.cursors) != 1:
            return None
        c = self.cursors[0]
        sub = c.sub
        if c.tail_only or sub.filter is not None or sub.timestamp or sub.regex is not None:
            return None
        return c, sub.prefix + frames.topic_member(sub.topic_b)

    def _deliver_spliced(self, c: Cursor, got, journal) -> bool:
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

    def _send_fast(self, cursor: Cursor, recs, end: int, nxt: int) -> int:
        """One cursor, no rate, records as tuples: content filters, regex topics, timestamps, and
        compacted segments (a plain subscription on stored bytes goes through splice_frames)."""
        sub = cursor.sub
        outbox = sub.out
        out = outbox.buf
        topic_member = frames.topic_member
        header = frames.STORED
        pack_len = frames.pack_len
        timestamp_part = frames.timestamp_part
        matches = sub.matches_topic_bytes
        f = sub.filter
        start = cursor.start
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
            if f is not None and not body_matches(f, body):
                continue
            hdr = header % (
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

    async def _send(self, recs, end: int, nxt: int) -> int:
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
                deliver = True
                stop = False
                if c.end is not None:
                    deliver, stop = c.end.check(pos, pub, seq, ts)
                sub = c.sub
                if deliver and sub.matches_topic_bytes(tb):
                    if sub.filter is not None:
                        if doc is None:
                            doc = Body(body)
                        deliver = doc.matches(sub.filter)
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

    def _emit(self, sub, pub, seq, ts, tb, extra, body) -> None:
        hdr = frames.STORED % (
            sub.prefix,
            frames.topic_member(tb),
            extra[1] if extra else b"",
            pub,
            seq,
            frames.timestamp_part(ts) if sub.timestamp else b"",
        )
        out = sub.out
        out.buf += (frames.pack_len(len(hdr) + len(body)), hdr, body)
        out.sent += 1
        self.sent += 1

    def _emit_conflated(self, c: Cursor, entries) -> None:
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
        sub.replay = None
        conn = sub.conn
        if conn.subs.get(sub.sub_id) is sub:
            del conn.subs[sub.sub_id]
            self.server.remove_subscription(sub)

    async def _pace(self, ts: int, size: int) -> None:
        rate = self.rate
        now = time.monotonic()
        if rate.kind == "multiple":
            if self._pace_wall is None:
                self._pace_wall, self._pace_ts = now, ts
                return
            due = self._pace_wall + (ts - self._pace_ts) / 1e6 / rate.value
            gap = self.rate_max_gap
            if gap is not None and due - now > gap:
                # skip ahead over a long idle stretch of the original stream
                self._pace_wall, self._pace_ts = now + gap, ts
                due = now + gap
            if due > now:
                await self._sleep(due - now)
            return
        cost = 1.0 if rate.kind == "msgs" else float(size)
        if self._pace_wall is None:
            self._pace_wall = now
            self._tokens = min(rate.value, max(cost, rate.value / 100))
            self._last_refill = now
        self._tokens = min(rate.value, self._tokens + (now - self._last_refill) * rate.value)
        self._last_refill = now
        self._tokens -= cost
        if self._tokens < 0:
            await self._sleep(-self._tokens / rate.value)

    async def _sleep(self, seconds: float) -> None:
        self.out.flush()
        self.wake.clear()
        try:
            await asyncio.wait_for(self.wake.wait(), seconds)
        except TimeoutError:
            pass
