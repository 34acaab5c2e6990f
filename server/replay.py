"""Bookmark replay: from a located journal position to the live end, then a seamless join.

A replay streams journal records to one subscription, filtered by topic and content exactly as
live delivery is. It never holds more than one read block of the journal (READ_BLOCK) and waits
whenever the subscriber's transport is above its high-water mark, so a slow replayer slows only
itself.

The join: the pipeline's `delivered_end` is the journal position up to which the loop has done
live delivery. The replay reads only below it; when it reaches it, it sets `sub.live = True` on the
loop with no `await` between the check and the switch, and live delivery (which also runs only on
the loop, in commit order) takes over from exactly that position: no gap, no duplicate.

Start points (PROTOCOL.md §5): `resolve_start` turns a parsed bookmark into a position, or None
for "start at the live end".
"""

from __future__ import annotations

import asyncio
import logging
import struct

from journal.record import KIND_MESSAGE
from protocol.bookmarks import Bookmark, BookmarkList, Epoch, InvalidBookmark, Now, Timestamp

from .pipeline import Message

log = logging.getLogger("tickertape.replay")
_pack_len = struct.Struct(">I").pack
READ_BLOCK = 256 * 1024


class UnknownBookmark(InvalidBookmark):
    pass


def resolve_start(journal, spec, not_found: str | None) -> int | None:
    """Journal position to start replay from, or None for NOW. Raises InvalidBookmark."""
    if isinstance(spec, Now):
        return None
    if isinstance(spec, Epoch):
        return journal.start_position
    if isinstance(spec, Timestamp):
        return journal.locate_time(spec.micros)
    if isinstance(spec, Bookmark):
        pos = journal.locate(spec.publisher_id, spec.seq)
        if pos is not None:
            return journal.after(pos)
        return _not_found(journal, spec, not_found)
    if isinstance(spec, BookmarkList):
        positions = []
        for item in spec.items:
            if isinstance(item, Bookmark):
                pos = journal.locate(item.publisher_id, item.seq)
                if pos is not None:
                    positions.append(journal.after(pos))
            else:
                p = resolve_start(journal, item, "now")
                positions.append(journal.end_position if p is None else p)
        if positions:
            return min(positions)
        return _not_found(journal, spec, not_found)
    raise InvalidBookmark(f"bookmark form {type(spec).__name__} is not supported here")


def _not_found(journal, spec, not_found):
    mode = not_found or "now"
    if mode == "epoch":
        return journal.start_position
    if mode == "fail":
        raise UnknownBookmark(f"bookmark {spec} is not in the transaction log (bookmark_not_found=fail)")
    return None


class Replay:
    def __init__(self, server, sub, start: int):
        self.server = server
        self.sub = sub
        self.position = start
        self.task: asyncio.Task | None = None
        self.sent = 0

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())
        self.server.replays.add(self)
        self.task.add_done_callback(lambda t: self.server.replays.discard(self))

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def run(self) -> None:
        server = self.server
        journal = server.journal
        pipeline = server.pipeline
        loop = asyncio.get_running_loop()
        try:
            while True:
                sub = self.sub
                conn = sub.conn
                if conn.closing:
                    return
                if not conn.writable.is_set():
                    await conn.writable.wait()
                    continue
                end = pipeline.delivered_end
                pos = self.position
                if pos >= end:
                    self._go_live(sub)
                    return
                recs, nxt = await loop.run_in_executor(server.readers, journal.read, pos, READ_BLOCK)
                sub = self.sub  # replace may have swapped it while we read
                if not recs:
                    nxt2 = journal.next_position(nxt)
                    if nxt2 == pos:
                        log.error("replay for %s stuck at position %d", sub.sub_id, pos)
                        return
                    self.position = nxt2
                    continue
                self.position = journal.next_position(self._send(sub, recs, end, nxt))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("replay for subscription %s failed", self.sub.sub_id)
            self.sub.conn.close("bad frame")

    def _send(self, sub, recs, end: int, nxt: int) -> int:
        conn = sub.conn
        matches = sub.matches_topic
        f = sub.filter
        decode = _decode
        sent = 0
        for r in recs:
            if r.position >= end:
                nxt = r.position
                break
            if r.kind != KIND_MESSAGE or not matches(r.topic):
                continue
            if f is not None:
                body = decode(r.body)
                if body is None or not f(body):
                    continue
            suffix = self.server.pipeline.topic_info(r.topic)[1] + b',"bm":"%d|%d|"' % (r.publisher_id, r.seq)
            conn.out_message(sub, Message(r.topic, r.publisher_id, r.seq, r.timestamp_us, r.body, suffix, r.position, None))
            sent += 1
        self.sent += sent
        conn.flush_out()
        return nxt

    def _go_live(self, sub) -> None:
        sub.live = True
        sub.replay = None
        if "completed" in sub.acks and not sub.conn.closing:
            sub.conn.send_ack("completed", sub.cid, sub_id=sub.sub_id)
            sub.conn.flush_out()


def _decode(body: bytes):
    import msgspec

    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
