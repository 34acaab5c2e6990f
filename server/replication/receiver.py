"""The receiving end of replication: the `replication` transport's listener (docs/replication.md).

Per link:

    logon check -> resume point sent -> batches <-> acks -> closed

The logon is refused (a failure repl_ack, then close) for a link version it does not speak, a
`dest` that is not this instance's name, a source with this instance's own name, and bad
credentials or a user without admin rights when <Authentication> is configured. The resume point
is the source position this instance durably holds everything below (`repl-from:<source>` in
the journal's metadata, committed with the records), for the source journal whose identity
goes with it (`repl-jid:<source>`, server/replication/identity.py): a source that logs on with
another journal identity (its journal was replaced) resumes from 0. The answer carries this
instance's own journal identity. Each batch starts where the last one ended, or before it (a
source that rewinds, finding the resume point past its journal's end: what it sends again is
dropped as duplicates); one that starts after it is a gap, and closes the link. Each batch must start where the last one
ended; every record in it is checked (length, flags, crc) and a damaged one closes the link
with an ERROR: the source re-sends from the durable point. The batch's body goes to
`Pipeline.replicate_block` (runs of records in C, server/replicate_scan.py); once they are
durable here the link gets one ack per group commit, sent from the commit's callback.
A commit failure closes the link. A second link from the same source replaces the first.
A source is *synced* for the queues once the link has handed the pipeline every batch below
the journal end it named on its logon (`end`; at once when the resume point is there already):
a source that publishes without pause never goes idle, yet has caught up. A heartbeat (a
second of silence) says so only for a source that names no end (an older version): a blocked
write is silence too. `catch_up`, which also hears which journal of this instance each source
last saw (a replaced journal catches up before serving clients), hears each heartbeat. While
a link's logon is checked (a password check can take seconds on a loaded machine), the queues
count its source as linking; a check that runs past `CHECK_QUIET` sends heartbeats, so that the
source, which gives a silent destination `DEAD_AFTER`, waits for the answer; the link's own
heartbeats start once the logon is answered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from journal.journal import Journal
from journal.queue_events import WireEventError
from journal.record import RawTuple, raw_origin, verified_prefix
from protocol.replication import (
    LINK_VERSION,
    ReplBatch,
    ReplLogon,
    ReplOwners,
    encode_ack,
    encode_failure,
)

from ..guard import Guard
from ..pipeline import Pipeline
from ..security.authenticator import Identity
from . import REPL_FROM, U64
from .identity import REPL_JID
from .link import DEAD_AFTER, HEARTBEAT_IDLE, Link, LinkClosed

CHECK_QUIET = 3.0  # seconds into a logon check before heartbeats tell the source it goes on

log = logging.getLogger("tickertape.replication")
_JID = re.compile(r"[0-9a-f]{32}")

__all__ = ["QueueDoor", "Receiver"]


class QueueDoor(Protocol):
    """What the receiver uses of the queues (server/queues.py QueueManager)."""

    def translate_in(self, queue: bytes, wire: bytes, origin: str, group: str) -> None: ...
    def source_up(self, name: str) -> None: ...
    def source_logon(self, name: str, checking: bool) -> None: ...
    def source_synced(self, name: str) -> None: ...
    def source_down(self, name: str) -> None: ...


class CatchUpDoor(Protocol):
    """What the receiver tells server/replication/catchup.py's CatchUp."""

    def source_knew(self, source: str, seen: str | None) -> None: ...
    def synced(self, source: str) -> None: ...


@dataclass(eq=False, repr=False)
class Receiver:
    name: str
    pipeline: Pipeline
    journal: Journal
    guard: Guard
    queues: QueueDoor | None = None
    jid: str | None = None  # this instance's journal identity, sent to every source
    catch_up: CatchUpDoor | None = None

    def __post_init__(self) -> None:
        # a source's link is up: it is back, and this instance's sender to it (if any) tries
        # again at once rather than at the end of its back-off (app.py wires the senders)
        self.source_back: Callable[[str], None] | None = None
        self.jids: dict[str, str] = {}  # source -> its journal identity (this run)
        self.links: dict[str, Link] = {}  # source name -> its current link
        self.durable_from: dict[str, int] = {}  # source -> position acked on this run
        self.received = 0
        self.stored = 0
        self.duplicates = 0
        self.damaged = 0
        # per source since start: [messages received, bytes received, duplicates dropped]
        self.per_source: dict[str, list[int]] = {}
        self._conns: set[Link] = set()
        self._conflicts: set[tuple[str, int]] = set()  # (source, publisher) bound differently

    def resume_point(self, source: str) -> int:
        pos = self.durable_from.get(source)
        if pos is not None:
            return pos
        raw = self.journal.index.get_meta(REPL_FROM + source.encode())
        return U64.unpack(raw)[0] if raw is not None else 0

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per source instance (stats): its link, the resume point, what it sent since start."""
        out: dict[str, dict[str, object]] = {}
        for source in sorted(set(self.per_source) | set(self.links)):
            n = self.per_source.get(source, (0, 0, 0))
            out[source] = {
                "connected": source in self.links,
                "resume_position": self.resume_point(source),
                "received_messages": n[0],
                "received_bytes": n[1],
                "duplicates": n[2],
            }
        return out

    async def stop(self) -> None:
        for link in list(self._conns):
            link.end("shutdown")
        for link in list(self._conns):
            await link.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """asyncio.start_server's callback: one link, to its end."""
        peer = writer.get_extra_info("peername")
        desc = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        link = Link(reader, writer, desc)
        self._conns.add(link)
        source = None
        try:
            frames = await asyncio.wait_for(link.read_frames(), DEAD_AFTER)
            h = frames[0][0]
            if not isinstance(h, ReplLogon):
                raise LinkClosed(f"expected repl_logon, got {type(h).__name__}")
            problem = await self._checked_logon(h, link)
            if problem is not None:
                log.error("replication link from %s (%s) refused: %s", h.name, desc, problem)
                link.send(encode_failure(problem))
                await link.drain()
                raise LinkClosed(f"refused: {problem}")
            source = h.name
            old = self.links.get(source)
            if old is not None:
                old.end("replaced by a new link from the same source")
            self.links[source] = link
            if self.queues is not None and old is None:
                self.queues.source_up(source)
            if self.source_back is not None:
                self.source_back(source)
            if self.catch_up is not None:
                self.catch_up.source_knew(source, h.seen)
            seen = self._known_jid(source)
            resume = self._resume_for(source, h.jid)
            link.send(encode_ack(resume, resume=True, jid=self.jid, seen=seen))
            # heartbeats only after the answer: one sent while the logon was being checked
            # would reach the source where it waits for the answer
            link.start_keepalive()
            log.info(
                "replication link from %s (group %s, %s): resuming at %d",
                source,
                h.group,
                desc,
                resume,
            )
            end = h.end
            if end is not None and resume >= end:
                end = None
                self._source_synced(source)
            await self._batches(link, source, h.group, resume, frames[1:], end)
        except LinkClosed as exc:
            if source is not None and exc.reason != "shutdown":
                log.warning("replication link from %s closed: %s", source, exc.reason)
        except TimeoutError:
            log.warning("replication link from %s: no logon within %.0fs", desc, DEAD_AFTER)
        finally:
            link.end("link ended")
            self._conns.discard(link)
            if source is not None and self.links.get(source) is link:
                del self.links[source]
                if self.queues is not None:
                    self.queues.source_down(source)

    def _known_jid(self, source: str) -> str | None:
        """The journal identity of `source` its resume point belongs to (None: not known)."""
        known = self.jids.get(source)
        if known is None:
            raw = self.journal.index.get_meta(REPL_JID + source.encode())
            known = raw.decode("ascii", "replace") if raw is not None else None
        return known if known is None or _JID.fullmatch(known) else None

    def _resume_for(self, source: str, jid: str | None) -> int:
        """The resume point of `source` for its journal `jid`: 0 when the point belongs to
        another journal of that name (the source's journal was replaced: its positions now
        name other records, and it must send everything; duplicates are dropped here)."""
        resume = self.resume_point(source)
        if jid is None:
            return resume  # a source that does not say (an older version): as before
        known = self._known_jid(source)
        if known is not None and known != jid and resume:
            log.warning(
                "replication link from %s: its journal was replaced (identity %s, the resume "
                "point %d belongs to journal %s): resuming from its start; what this instance "
                "already has is dropped as duplicates",
                source,
                jid,
                resume,
                known,
            )
            resume = 0
            self.durable_from[source] = 0
            self.pipeline.remember_meta(REPL_FROM + source.encode(), U64.pack(0))
        if known != jid:
            self.jids[source] = jid
            self.pipeline.remember_meta(REPL_JID + source.encode(), jid.encode())
        return resume

    async def _checked_logon(self, h: ReplLogon, link: Link) -> str | None:
        """`_check_logon`, during which the queues count the source as linking: its check can
        take longer than their wait for a source without a link (a loaded machine), and a
        catch-up of it that gave up then would deliver what it acknowledged."""
        if self.queues is not None:
            self.queues.source_logon(h.name, True)
        beats = asyncio.get_running_loop().create_task(self._beat_while_checking(link))
        try:
            return await self._check_logon(h, link)
        finally:
            beats.cancel()
            if self.queues is not None:
                self.queues.source_logon(h.name, False)

    @staticmethod
    async def _beat_while_checking(link: Link) -> None:
        """Heartbeats from `CHECK_QUIET` into a logon check on: the source waits for the answer
        and takes `DEAD_AFTER` of silence for a dead destination. A quick check sends none (a
        source older than these heartbeats would take one for the answer)."""
        await asyncio.sleep(CHECK_QUIET)
        while not link.closed:
            link.heartbeat()
            await asyncio.sleep(HEARTBEAT_IDLE)

    async def _check_logon(self, h: ReplLogon, link: Link) -> str | None:
        if h.v != LINK_VERSION:
            return f"link version {h.v} is not supported (this instance speaks {LINK_VERSION})"
        if h.dest != self.name:
            return (
                f"destination name mismatch: the source calls it {h.dest!r}, this is {self.name!r}"
            )
        if h.name == self.name:
            return f"the source has this instance's own name {self.name!r}"
        guard = self.guard
        if guard.checker is None:
            return None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        guard.logon(link.peer, h.user, h.pw, None, None, done.set_result)
        outcome = await done
        if not isinstance(outcome, Identity):
            return "auth failure"
        if not guard.may_admin(link.peer, outcome.user):
            return f"user {outcome.user!r} may not replicate (needs admin rights)"
        return None

    def _bind(self, source: str, owners: list[tuple[int, str]]) -> None:
        """Client-name bindings made on (or passed on by) `source`: bound here too, durably with
        the next commit, so another user's logon under the name is refused `name in use` here
        as well. A name bound here to another user keeps its binding (both were bound before
        either instance heard of the other's: a partition); said once per name and source."""
        pipeline = self.pipeline
        for pub, user in owners:
            if not pipeline.bind_owner(pub, user):
                key = (source, pub)
                if key not in self._conflicts and len(self._conflicts) < 10_000:
                    self._conflicts.add(key)
                    log.warning(
                        "replication link from %s: publisher id %d is bound to user %r there and "
                        "to %r here (each bound it before hearing of the other); this instance "
                        "keeps its own",
                        source,
                        pub,
                        user,
                        pipeline.owners.get(pub),
                    )

    def _queue_events(self, source: str, group: str, rec: RawTuple) -> None:
        """A queue-event record received (translate_in of Pipeline.replicate): to the queues,
        which apply it and journal it as their own record (nothing to add to the batch here).
        Its origin is where the events happened: the record's origin block, else the source."""
        assert self.queues is not None
        origin = raw_origin(rec[7])
        if origin is None:
            who, grp = source, group
        else:
            who, grp = origin[1].decode(errors="replace"), origin[2].decode(errors="replace")
        try:
            self.queues.translate_in(bytes(rec[5]), bytes(rec[6]), who, grp)
        except WireEventError as exc:
            log.error(
                "replication link from %s: queue events of %r at source position %d left out: %s",
                source,
                bytes(rec[5]).decode(errors="replace"),
                rec[0],
                exc,
            )

    def _source_synced(self, source: str) -> None:
        """`source` has sent this instance everything it held when its link logged on: its
        queue events are applied here (they are applied as each batch is handed over)."""
        if self.queues is not None:
            self.queues.source_synced(source)

    async def _batches(
        self,
        link: Link,
        source: str,
        group: str,
        expected: int,
        frames: list[Any],
        end: int | None = None,
    ) -> None:
        """The link's frames after the logon; `end`: the source's journal end at the logon,
        where it is synced (None: not said, or reached already)."""
        pipeline = self.pipeline
        name_b, group_b = source.encode(), group.encode()
        acked = [-1]
        named_end = end is not None
        translate = (
            functools.partial(self._queue_events, source, group)
            if self.queues is not None
            else None
        )

        def durable(end: int, err: BaseException | None, cell: list[int]) -> None:
            if err is not None:
                link.end(f"commit failed here: {err}")
                return
            to = cell[0]
            if to > self.durable_from.get(source, -1):
                self.durable_from[source] = to
            if to > acked[0]:
                acked[0] = to
                if not link.closed:
                    link.send(encode_ack(to))

        # one ack per group commit, not per batch, sent from the commit itself (no extra loop
        # iteration on the sync path): the first link batch that goes into a pipeline batch
        # registers the callback, later ones only move its end
        open_batch: list[Any] = [None, None]  # [pipeline batch, its callback's end cell]

        def on_durable(to: int) -> Callable[[int, BaseException | None], None]:
            if open_batch[0] is pipeline.batch:
                open_batch[1][0] = to
                return _ignore
            cell = [to]
            open_batch[0], open_batch[1] = pipeline.batch, cell
            return lambda end, err: durable(end, err, cell)

        while True:
            for h, body in frames:
                if link.closed:
                    # ended under us: a commit of this link failed (its `durable` ends it), or
                    # a newer link replaced it. A batch after a failed one must not be stored:
                    # its commit would carry the resume point past the records that failed, and
                    # no link would send them again (issue 23, seams round 79)
                    raise LinkClosed(link.reason or "link ended")
                if not isinstance(h, ReplBatch):
                    if isinstance(h, ReplOwners):
                        self._bind(source, h.owners)
                        continue
                    if type(h).__name__ == "Heartbeat":
                        # a source sends heartbeats when it has sent nothing for a while: that
                        # says it is synced only for a source that did not name its end (a
                        # blocked write or a slow answer to its logon is silence too)
                        if not named_end:
                            self._source_synced(source)
                        if self.catch_up is not None:
                            self.catch_up.synced(source)
                        continue
                    raise LinkClosed(f"unexpected {type(h).__name__} on a replication link")
                if h.from_ > expected:
                    raise LinkClosed(f"batch from {h.from_}, expected {expected}: a gap")
                received = stored = dups = 0
                if body:
                    stop, bad = verified_prefix(body)
                    if stop != len(body):
                        self.damaged += 1
                        log.error(
                            "replication link from %s: damaged record at byte %d of the batch "
                            "[%d, %d); closing the link (the source re-sends)",
                            source,
                            stop,
                            h.from_,
                            h.to,
                        )
                        raise LinkClosed("damaged record")
                    received, stored, dups = pipeline.replicate_block(
                        body, h.from_, name_b, group_b, h.to, on_durable(h.to), translate
                    )
                else:
                    pipeline.replicate([], name_b, group_b, h.to, on_durable(h.to), translate)
                self.received += received
                counts = self.per_source.setdefault(source, [0, 0, 0])
                self.stored += stored
                self.duplicates += dups
                counts[0] += received
                counts[1] += len(body)
                counts[2] += dups
                expected = h.to
                if end is not None and expected >= end:
                    end = None
                    self._source_synced(source)
            while pipeline.inflight_bytes > pipeline.max_inflight and not link.closed:
                await asyncio.sleep(0.002)  # the journal is behind: stop reading this link
            frames = await link.read_frames()


def _ignore(end: int, err: BaseException | None) -> None:
    """The durable callback of a link batch whose pipeline batch acks through an earlier one."""
