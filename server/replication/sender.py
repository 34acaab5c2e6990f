"""The sending end of replication: one asyncio task per `<Destination>`, pushing this instance's
journal to it in journal order (docs/replication.md).

    connecting -> logged on (resume point P) -> streaming <-> waiting for a commit
         ^                                          |
         +------ closed (back-off 0.1 s .. 2 s) <---+

Connecting tries the destination's addresses in turn (TLS per address). Streaming reads the
local journal from P (`read_block`; `read_raw` in compacted segments, whose records re-encode to
their original bytes), filters it (`Filter`), and sends `repl_batch` frames of at most 1 MiB of
records, every source position covered once, with at most MAX_UNACKED bytes of journal sent and
not yet acknowledged. At the durable end it waits for the pipeline's next commit: the commit
(or the link's end) resolves the future it awaits, so a committed batch goes out in the next
loop iteration, never on a timer.

The logon carries this journal's identity and the answer the destination's
(server/replication/identity.py): a destination seen with a new journal identity (it lost its
journal, or is seen for the first time) is sent back, below this journal's end at that moment,
the records that came from it, which loop prevention leaves out otherwise; the duplicate check
there drops those it still has. A resume point past this journal's end names no record here (a
peer that kept a replaced journal's position): the sender starts from the journal's start. Acks go to the AckSink at once (a sync gate releases the
publishers' acks in that call), and every second at most to the journal's metadata
(`repl-acked:<dest>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from config.model import ReplicationAddress, ReplicationDestination
from journal.journal import Journal
from journal.queue_events import WIRE_MAGIC
from journal.record import (
    KIND_MESSAGE,
    KIND_QUEUE_EVENT,
    KIND_SOW_DELETE,
    RawTuple,
    encode_record,
    raw_origin,
    record_length_at,
    scan_records,
)
from protocol.replication import (
    MAX_BATCH_BODY,
    MAX_OWNERS,
    MAX_USER,
    RETRY_MAX,
    Heartbeat,
    LinkFrame,
    ReplAck,
    encode_batch,
    encode_logon,
    encode_owners,
)

from ..pipeline import Pipeline
from ..replicate_scan import kept_span
from ..sow.records import replicated
from . import U64, AckSink, repl_acked_key
from .handoff import Handoffs, reencoded
from .identity import REPL_PEER, pack_peer, unpack_peer
from .link import DEAD_AFTER, Link, LinkClosed

# a logon's answer may take this long in all while the destination's heartbeats say it is
# checking it; a silent destination is given up after DEAD_AFTER, as on a running link
LOGON_ANSWER_MAX = 60.0

log = logging.getLogger("tickertape.replication")

MAX_UNACKED = 8 * 1024 * 1024  # journal bytes sent and not yet acknowledged, per destination
BACKOFF_MIN, BACKOFF_MAX = 0.1, RETRY_MAX
CONNECT_TIMEOUT = 5.0
ACKED_PERSIST_INTERVAL = 1.0
IDLE_RECHECK = 0.5  # a backstop only: commits and the link's end wake an idle streamer

__all__ = ["Filter", "Sender", "event_record", "select"]


def event_record(rec: RawTuple, translate: Callable[[bytes], bytes]) -> bytes | None:
    """The record a queue-event record is sent as: the same record with its body in the wire
    form (`translate`: the queues' `translate_out`, journal/queue_events.py `to_wire`; local
    positions mean nothing on the destination), its origin kept; None when no entry is left."""
    wire = translate(bytes(rec[6]))
    if len(wire) <= len(WIRE_MAGIC):
        return None
    return encode_record(rec[1], 0, 0, rec[4], rec[5], wire, origin=raw_origin(rec[7]))


class Filter:
    """Which records a destination carries (docs/replication.md §3), one decision per record:

    - a message's topic (a queue event's: the queue's name) full-matches one of its topic regexes;
    - a record whose origin instance is the destination is never sent (loop prevention), except
      below `own_below` (a destination that lost its journal gets its own records back);
    - a record from another origin is sent only if its origin group full-matches pass_through
      (absent: never);
    - a record published here (no origin) always, given its topic.
    """

    def __init__(self, dest: ReplicationDestination) -> None:
        self.dest = dest.name.encode()
        self.topics = [re.compile(t.name) for t in dest.topics]
        self.pass_through = re.compile(dest.pass_through) if dest.pass_through else None
        self.own_below = 0
        self._topic_ok: dict[bytes, bool] = {}
        self._group_ok: dict[bytes, bool] = {}

    def topic(self, tb: bytes) -> bool:
        ok = self._topic_ok.get(tb)
        if ok is None:
            if len(self._topic_ok) > 50_000:
                self._topic_ok.clear()
            t = tb.decode("utf-8", "replace")
            ok = self._topic_ok[tb] = any(p.fullmatch(t) for p in self.topics)
        return ok

    def origin(self, instance: bytes, group: bytes) -> bool:
        if instance == self.dest or self.pass_through is None:
            return False
        ok = self._group_ok.get(group)
        if ok is None:
            ok = self._group_ok[group] = (
                self.pass_through.fullmatch(group.decode("utf-8", "replace")) is not None
            )
        return ok

    def keeps(self, rec: RawTuple) -> bool:
        """For a message record, and a queue event (its topic is the queue's name)."""
        if not self.topic(rec[5]):
            return False
        origin = raw_origin(rec[7])
        if origin is None:
            return True
        if origin[1] == self.dest:
            return rec[0] < self.own_below
        return self.origin(origin[1], origin[2])


def select(
    buf: bytes,
    base: int,
    flt: Filter,
    dest: str,
    translate: Callable[[bytes], bytes] | None = None,
) -> tuple[bytes, int, int]:
    """(the bytes to send of the whole records at the start of buf, the offset after them,
    how many records they are). Messages and SOW deletes (not expirations) kept are sent as
    stored; a queue event kept as `event_record` makes it (left out without `translate`). Runs
    of messages published here on kept topics are walked by
    server/replicate_scan.py's `kept_span` (C when built); the others one at a time."""
    out: list[bytes] = []
    cache = flt._topic_ok
    end = len(buf)
    run_start = 0  # start offset of the current run of kept records
    pos = 0
    count = 0
    while True:
        stop, unknown, n = kept_span(buf, pos, cache)
        count += n
        if unknown is not None:
            flt.topic(unknown)  # now in the cache: the walk goes on from the same record
            pos = stop
            continue
        pos = stop
        if end - pos < 4:
            break
        nxt = pos + record_length_at(buf, pos)
        one = scan_records(buf[pos:nxt], base + pos)[0] if nxt <= end else []
        if not one:
            break  # a partial record: the next read starts there
        rec = one[0]
        if (rec[1] == KIND_MESSAGE or _sow_delete(rec)) and flt.keeps(rec):
            pos = nxt
            count += 1
            continue
        if pos > run_start:
            out.append(buf[run_start:pos])
        run_start = pos = nxt
        # queue events go in their wire form; expirations of SOW records are not sent
        if rec[1] == KIND_QUEUE_EVENT and translate is not None and flt.keeps(rec):
            wire = event_record(rec, translate)
            if wire is not None:
                out.append(wire)
                count += 1
    if run_start == 0:
        return buf[:pos], pos, count  # everything kept: the block as read
    if pos > run_start:
        out.append(buf[run_start:pos])
    return b"".join(out), pos, count


@dataclass(eq=False, repr=False)
class Sender:
    dest: ReplicationDestination
    name: str
    group: str
    journal: Journal
    pipeline: Pipeline
    sink: AckSink
    password: Callable[[], str | None] = lambda: None
    translate: Callable[[bytes], bytes] | None = None  # queue events' wire form (translate_out)
    jid: str | None = None  # this journal's identity (sent at logon)
    # each logon's outcome: the destination's `seen` (the identity it knew of this journal),
    # None when it could not be reached (server/replication/catchup.py)
    answered: Callable[[str, str | None], None] | None = None

    def __post_init__(self) -> None:
        dest, journal = self.dest, self.journal
        self.filter = Filter(dest)
        self.acked = 0  # source position the destination acknowledged (this link or before)
        self.link: Link | None = None
        self._acked_event = asyncio.Event()
        self._retry = asyncio.Event()  # ends a back-off wait (`retry_now`)
        self._idle: asyncio.Future[None] | None = None  # what an idle streamer awaits
        self._persisted_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._tls_errors: set[tuple[str, int, str]] = set()
        # records of a publisher that moved here (handoff.py): sent ahead of the journal
        self.handoffs = Handoffs(dest.name)
        self._owners_sent = 0  # client-name bindings sent on this link (pipeline.owners grows)
        stored = journal.index.get_meta(repl_acked_key(dest.name))
        if stored is not None:
            self.acked = U64.unpack(stored)[0]
        self.peer_jid, self.filter.own_below = unpack_peer(
            journal.index.get_meta(REPL_PEER + dest.name.encode())
        )

    def describe(self) -> str:
        addrs = ", ".join(
            f"{a.host}:{a.port}{' TLS' if a.tls else ''}" for a in self.dest.addresses
        )
        return f"{self.dest.name} ({'sync' if self.dest.sync else 'async'}, {addrs})"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    def retry_now(self) -> None:
        """A link from the destination came up: it is back, so a back-off under way ends now
        (a restarted destination waits for this link before its queues deliver)."""
        if self.link is None:
            self._retry.set()

    async def stop(self) -> None:
        self._stopping = True
        if self.link is not None:
            self.link.end("shutdown")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def run(self) -> None:
        backoff = BACKOFF_MIN
        while not self._stopping:
            self._retry.clear()  # a kick from here on ends the wait below
            for addr in self.dest.addresses:
                if self._stopping:
                    return
                link = await self._connect(addr)
                if link is None:
                    if self.answered is not None:
                        self.answered(self.dest.name, None)
                    continue
                try:
                    await self._session(link)
                except LinkClosed as exc:
                    if not self._stopping:
                        log.warning("replication to %s: link closed: %s", self.dest.name, exc)
                except (ConnectionError, OSError) as exc:
                    log.warning("replication to %s: link closed: %s", self.dest.name, exc)
                finally:
                    link.end("session ended")
                    self.link = None
                    if self.answered is not None:
                        self.answered(self.dest.name, None)  # (no answer, if none came)
                backoff = BACKOFF_MIN
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry.wait(), backoff)
            backoff = BACKOFF_MIN if self._retry.is_set() else min(BACKOFF_MAX, backoff * 2)

    async def _connect(self, addr: ReplicationAddress) -> Link | None:
        ctx = None
        if addr.tls:
            ctx = ssl.create_default_context(cafile=addr.ca_file)
            if addr.certificate:
                ctx.load_cert_chain(addr.certificate, addr.private_key)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    addr.host, addr.port, ssl=ctx, server_hostname=addr.host if ctx else None
                ),
                CONNECT_TIMEOUT,
            )
        except ssl.SSLError as exc:
            # a TLS problem (an untrusted or expired certificate, no common protocol) will not
            # go away by retrying: said once per address and reason, not at every retry
            said = (addr.host, addr.port, str(exc))
            if said not in self._tls_errors:
                self._tls_errors.add(said)
                log.error(
                    "replication to %s: TLS with %s:%d failed: %s",
                    self.dest.name,
                    addr.host,
                    addr.port,
                    exc,
                )
            return None
        except (OSError, TimeoutError) as exc:
            log.debug("replication to %s: %s:%d: %s", self.dest.name, addr.host, addr.port, exc)
            return None
        return Link(reader, writer, f"{addr.host}:{addr.port}")

    async def _session(self, link: Link) -> None:
        self.link = link
        user = self.dest.user
        link.send(
            encode_logon(
                self.name,
                self.group,
                self.dest.name,
                user,
                self.password(),
                self.jid,
                self.peer_jid,
                self.journal.end_position,  # the destination is synced once it has all below
            )
        )
        frames = await self._answer(link)
        h = frames[0][0]
        if not isinstance(h, ReplAck) or h.status is None:
            raise LinkClosed(f"expected the logon's repl_ack, got {type(h).__name__}")
        link.start_keepalive()  # not before: a heartbeat says "nothing more to send"
        if h.status == "failure":
            log.error("replication to %s refused: %s", self.dest.name, h.reason)
            if self.answered is not None:
                self.answered(self.dest.name, None)
            raise LinkClosed(f"refused: {h.reason}")
        resume = h.pos or 0
        if self.answered is not None:
            self.answered(self.dest.name, h.seen)
        log.info(
            "replication to %s: connected to %s, resuming at %d", self.dest.name, link.peer, resume
        )
        if h.jid is not None and h.jid != self.peer_jid:
            self._new_peer_journal(h.jid)
        self.acked = resume
        self.sink.link_up(self.dest.name)
        self.sink.acked(self.dest.name, resume)  # where it stands (a sync gate needs it)
        acks = asyncio.get_running_loop().create_task(self._read_acks(link, frames[1:]))
        try:
            await self._stream(link, resume)
        finally:
            acks.cancel()
            self.sink.link_down(self.dest.name)

    @staticmethod
    async def _answer(link: Link) -> list[LinkFrame]:
        """The frames from the logon's answer on. A destination whose logon check runs long (a
        loaded machine, its checks queued behind client logons, a back-off) sends heartbeats
        meanwhile; they are passed over, and the wait ends only after `DEAD_AFTER` of silence,
        as a link's does, or `LOGON_ANSWER_MAX` in all (TimeoutError)."""
        give_up = time.monotonic() + LOGON_ANSWER_MAX
        while True:
            left = min(DEAD_AFTER, give_up - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"no logon answer within {LOGON_ANSWER_MAX:.0f}s")
            got = await asyncio.wait_for(link.read_frames(), left)
            frames = [f for f in got if not isinstance(f[0], Heartbeat)]
            if frames:
                return frames

    def _new_peer_journal(self, jid: str) -> None:
        """The destination answers with a journal this sender has not seen: what came from it
        and is in this journal so far is sent back to it (it may have lost it)."""
        end = self.journal.end_position
        if self.peer_jid is not None:
            log.warning(
                "replication to %s: its journal is new (identity %s, was %s): the records that "
                "came from it, below position %d, are sent back to it",
                self.dest.name,
                jid,
                self.peer_jid,
                end,
            )
        self.peer_jid = jid
        self.filter.own_below = end
        batch = self.pipeline.batch
        if batch.meta is None:
            batch.meta = {}
        # with the next commit that has records; lost in a crash before it, the next logon
        # does this again (the duplicate check there drops what it has)
        batch.meta[REPL_PEER + self.dest.name.encode()] = pack_peer(jid, end)

    async def _read_acks(self, link: Link, first: list) -> None:
        frames = first
        try:
            while True:
                for h, _body in frames:
                    if isinstance(h, ReplAck) and h.pos is not None and h.status is None:
                        self._ack(h.pos)
                    elif not isinstance(h, ReplAck):
                        if type(h).__name__ != "Heartbeat":
                            link.end(f"unexpected {type(h).__name__} from a destination")
                frames = await link.read_frames()
        except LinkClosed:
            self._acked_event.set()  # wake the streamer, which sees the closed link
            if self._idle is not None and not self._idle.done():
                self._idle.set_result(None)

    def hand_off(self, records: list[RawTuple]) -> None:
        """A publisher moved here (handoff.py): its `records` from other instances go to this
        destination ahead of anything committed after this call, except those that came from
        the destination itself (it has them, loop prevention) or on topics it does not carry."""

        def keeps(r: RawTuple) -> bool:
            origin = raw_origin(r[7])
            return self.filter.topic(r[5]) and (origin is None or origin[1] != self.filter.dest)

        if self.handoffs.add(records, keeps) and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)  # an idle streamer sends them now

    def _send_owners(self, link: Link) -> None:
        """The client-name bindings made since the last call (all of them on a new link), ahead
        of the journal records read after them: a name's binding reaches the destination before
        its first message (docs/security.md). The destination binds each name it has not
        bound; bindings only grow, so the dict's order says which are new."""
        owners = self.pipeline.owners
        new = [
            (pub, user)
            for pub, user in itertools.islice(owners.items(), self._owners_sent, None)
            if 0 < len(user.encode()) <= MAX_USER
        ]
        self._owners_sent = len(owners)
        for i in range(0, len(new), MAX_OWNERS):
            link.send(encode_owners(new[i : i + MAX_OWNERS]))

    def _ack(self, pos: int) -> None:
        if self.handoffs.pending:
            self.handoffs.acked(pos)
        if pos > self.acked:
            self.acked = pos
            self.sink.acked(self.dest.name, pos)
            now = time.monotonic()
            if now - self._persisted_at >= ACKED_PERSIST_INTERVAL:
                # with the next commit that has records: conservative while this instance idles
                self._persisted_at = now
                batch = self.pipeline.batch
                if batch.meta is None:
                    batch.meta = {}
                batch.meta[repl_acked_key(self.dest.name)] = U64.pack(pos)
        self._acked_event.set()

    async def _stream(self, link: Link, pos: int) -> None:
        journal = self.journal
        name = self.dest.name
        start = journal.start_position
        if pos < start:
            log.warning(
                "replication to %s: it resumes at %d, below the journal's start %d: "
                "the records between were removed and are not sent",
                self.dest.name,
                pos,
                start,
            )
            pos = start
        elif pos > journal.end_position:
            log.error(
                "replication to %s: it resumes at %d, past this journal's end %d: that position "
                "is not this journal's (was it replaced?); sending from the journal's start",
                self.dest.name,
                pos,
                journal.end_position,
            )
            pos = start
            self.acked = pos
            self.sink.acked(name, pos)
        self.handoffs.new_link()  # what the last link may not have committed goes again
        self._owners_sent = 0  # and every client-name binding
        while True:
            if link.closed:
                raise LinkClosed(link.reason or "closed")
            if len(self.pipeline.owners) > self._owners_sent:
                self._send_owners(link)
            if self.handoffs.pending:
                for size in self.handoffs.send(link.send, pos):
                    self.sink.sent(name, pos, None, size)
            if pos >= journal.end_position:
                await self._next_commit()
                continue
            while pos - self.acked > MAX_UNACKED and not link.closed:
                self._acked_event.clear()
                await self._acked_event.wait()
            body, nxt, count = self._read(pos)
            if nxt <= pos:  # nothing readable here yet (a record still being made durable)
                await asyncio.sleep(0.001)
                continue
            link.send(encode_batch(pos, nxt, body))
            pos = nxt
            self.sink.sent(name, nxt, count, len(body))
            await link.drain()

    async def _next_commit(self) -> None:
        """Until the pipeline's next commit or the link's end (or IDLE_RECHECK as a backstop).

        The future is awaited directly: asyncio.wait_for would add a loop iteration between the
        commit and this task, on the path of every sync-held `persisted` ack."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._idle = fut
        self.pipeline.waiters.append(fut)
        timer = loop.call_later(IDLE_RECHECK, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._idle = None

    def _read(self, pos: int) -> tuple[bytes, int, int]:
        """(bytes to send, the position after the records read, how many records) from pos."""
        journal = self.journal
        blk = journal.read_block(pos, MAX_BATCH_BODY)
        if blk is None:  # a compacted segment: its records re-encode to their stored bytes
            recs, nxt = journal.read_raw(pos, MAX_BATCH_BODY)
            if not recs:
                return b"", journal.next_position(nxt), 0
            out = []
            for r in recs:
                if r[1] == KIND_MESSAGE or _sow_delete(r):
                    if self.filter.keeps(r):
                        out.append(reencoded(r))
                elif self.translate is not None and self.filter.keeps(r):
                    wire = event_record(r, self.translate)
                    if wire is not None:
                        out.append(wire)
            return b"".join(out), nxt, len(out)
        buf, p = blk
        if not buf:  # the end of a segment (or damage skipped to it)
            return b"", journal.next_position(p), 0
        body, stop, count = select(buf, p, self.filter, self.dest.name, self.translate)
        return body, p + stop, count


def _sow_delete(rec: RawTuple) -> bool:
    """A SOW delete record replication sends as stored (server/sow/records.py: not the
    expirations, which each instance journals for itself)."""
    return rec[1] == KIND_SOW_DELETE and replicated(bytes(rec[6]))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
