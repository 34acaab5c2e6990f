"""Live delivery: messages to every subscription on the live stream that wants them.

The pipeline (server/pipeline.py) hands over each committed batch (`deliver`), and, while a
subscription with the `live` option is joined, each message as it is published
(`deliver(..., early=True)`). A message matching several subscriptions of one connection goes
out once, with `sids` naming them (the router groups by connection's Outbox). Subscriptions
take part by state (server/subscriptions.py): LIVE gets committed messages, LIVE_EARLY gets
them at publish time. A bookmark subscription over a pattern gets only recorded topics
(`recorded_only`), and a conflated one hands its messages to its `LiveConflation`
(server/conflation.py) instead of getting a frame each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import frames
from .frames import timestamp_part
from .matching import Body, TopicFilter, body_matches
from .outbox import Outbox
from .router import Router
from .subscriptions import Subscription, SubState

__all__ = ["Fanout", "Message"]


@dataclass(slots=True, eq=False)  # eq=False: compared and hashed by identity, as before
class Message:
    """A message ready for live delivery. `position` is -1 on a topic that is not recorded."""

    topic: str
    pub: int
    seq: int
    ts: int
    body: bytes
    suffix: bytes  # frames.LIVE_SUFFIX: topic, bookmark, header fragment
    position: int
    exp: Any  # the publish's expiration (`e`, seconds) or None
    hdr: bytes = b""  # the record's header fragment
    # a replicated message's origin block (time µs, instance, group: journal/record.py);
    # None for one published here (the queues' ownership reads it: server/queue_repl.py)
    origin: Any = None


class Fanout:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.early = 0  # subscriptions in state LIVE_EARLY
        self.delivered = 0  # deliveries since start (stats)

    @property
    def active(self) -> bool:
        """Whether any subscription is on the live stream (messages are built only then)."""
        return self.router.count > 0

    def deliver(self, msgs: list[Message], early: bool = False) -> None:
        """Live fan-out to every matching subscription: of committed messages, or (early=True)
        of just-published ones to subscriptions with the `live` option.

        Consecutive messages on one topic (a run) share their route; a connection whose
        subscriptions there take every message alike (no filter, no conflation, no
        recorded-only choice) gets the whole run as one buffer (`_write_run`), the rest a frame
        per message (`_each`). Each connection's frames keep the messages' order either way."""
        route = self.router.route
        want = SubState.LIVE_EARLY if early else SubState.LIVE
        touched: set[Outbox] = set()
        delivered = 0
        n = len(msgs)
        done = 0  # msgs[:done] are delivered
        i = 0
        while i < n:
            topic = msgs[i].topic
            j = i + 1
            while j < n and msgs[j].topic == topic:
                j += 1
            if j - i > 1:
                groups, index = route(topic)
                if groups and index is None:
                    if done < i:  # what came before: a frame each, routed one by one
                        delivered += self._each(msgs[done:i], want, touched)
                    run = msgs if j - i == n else msgs[i:j]
                    delivered += self._write_run(run, topic, groups, want, touched, j == n)
                    done = j
            i = j
        if done < n:
            delivered += self._each(msgs[done:] if done else msgs, want, touched)
        self.delivered += delivered
        for out in touched:
            out.flush()

    def _write_run(
        self,
        run: list[Message],
        topic: str,
        groups: tuple,
        want: SubState,
        touched: set[Outbox],
        last: bool,
    ) -> int:
        """Deliver `run` (messages on `topic`) to `groups`: one buffer per connection whose
        subscriptions take them all alike, `_each` for the others. Returns the deliveries.

        last: the batch ends with this run, so each such buffer is written at once. One large
        buffer alive at a time, not one per connection: freed together, a batch's buffers
        (megabytes) made the allocator hand the memory back to the system and fault it in
        again on the next batch, which cost more than building them."""
        delivered = 0
        bodies: dict[bool, list[bytes]] = {}  # timestamp -> each message's frame after the prefix
        pieces: dict[tuple[int, bool], list[bytes]] = {}  # (prefix length, timestamp) -> pieces
        unrecorded: set[bool] | None = None  # {m.position < 0 for m in run}, when needed
        for out, subs in groups:
            chosen: list[Subscription] = []
            uniform = True
            for sub in subs:
                if sub.state is not want:
                    continue
                f = sub.filter
                if f is not None and f.__class__ is TopicFilter:
                    f = f.at(topic)
                if f is not None or sub.conflation is not None:
                    uniform = False
                    break
                if sub.recorded_only:
                    if unrecorded is None:
                        unrecorded = {m.position < 0 for m in run}
                    if len(unrecorded) > 1:  # some recorded, some not: decided per message
                        uniform = False
                        break
                    if True in unrecorded:
                        continue
                chosen.append(sub)
            if not uniform:
                delivered += self._each(run, want, touched, ((out, subs),))
                continue
            if not chosen:
                continue
            if len(chosen) == 1:
                prefix = chosen[0].prefix
                ts = chosen[0].timestamp
            else:
                prefix = frames.group_prefix([s.sub_id for s in chosen])
                ts = any(s.timestamp for s in chosen)
            key = (len(prefix), ts)
            seps = pieces.get(key)
            if seps is None:
                rests = bodies.get(ts)
                if rests is None:
                    if ts:
                        rests = [m.suffix + timestamp_part(m.ts) + b"}" + m.body for m in run]
                    else:
                        rests = [m.suffix + b"}" + m.body for m in run]
                    bodies[ts] = rests
                seps = pieces[key] = frames.live_separators(key[0], rests)
            out.buf.append(prefix.join(seps))
            out.sent += len(run)
            delivered += len(run)
            if last:
                out.flush()
            else:
                touched.add(out)
        return delivered

    def _each(
        self, msgs: list[Message], want: SubState, touched: set[Outbox], fixed: Any = None
    ) -> int:
        """Deliver `msgs` a frame per message and connection, each routed by its topic, or
        all to the groups `fixed` (one topic's, with no filter index). Returns the deliveries."""
        route = self.router.route
        write = frames.write_live
        delivered = 0
        groups: Any = fixed
        for m in msgs:
            if fixed is None:
                groups, index = route(m.topic)
                if not groups:
                    continue
                if index is not None:  # many filtered subscriptions: only those that can match
                    groups = index.select(m.body)
            body = None
            unrecorded = m.position < 0
            for out, subs in groups:
                chosen: Any = None
                for sub in subs:
                    if sub.state is not want or (unrecorded and sub.recorded_only):
                        continue
                    f = sub.filter
                    if f is not None:
                        if f.__class__ is TopicFilter:  # content entitlements by topic
                            f = f.at(m.topic)
                        if f is not None:
                            if body is None:
                                body = Body(m.body)
                            if not body.matches(f):
                                continue
                    if sub.conflation is not None:
                        sub.conflation.add(m)  # held; it sends at the window's end
                        continue
                    if chosen is None:
                        chosen = sub
                    elif type(chosen) is list:
                        chosen.append(sub)
                    else:
                        chosen = [chosen, sub]
                if chosen is None:
                    continue
                if type(chosen) is list:
                    prefix = frames.group_prefix([s.sub_id for s in chosen])
                    ts = any(s.timestamp for s in chosen)
                else:
                    prefix = chosen.prefix
                    ts = chosen.timestamp
                write(out.buf, prefix, m.suffix, timestamp_part(m.ts) if ts else b"", m.body)
                out.sent += 1
                touched.add(out)
                delivered += 1
        return delivered

    def join_early(self, sub: Subscription, pending: list[Message]) -> None:
        """`sub` (now LIVE_EARLY) gets messages at publish time from now on; `pending` are the
        ones published but not yet durable, queued for it now, in order."""
        self.early += 1
        f = sub.filter
        out = sub.out
        for m in pending:
            g = f.at(m.topic) if f.__class__ is TopicFilter else f  # type: ignore[union-attr]
            if not sub.matches_topic(m.topic) or (g is not None and not body_matches(g, m.body)):
                continue
            if m.position < 0 and sub.recorded_only:
                continue
            tail = timestamp_part(m.ts) if sub.timestamp else b""
            frames.write_live(out.buf, sub.prefix, m.suffix, tail, m.body)
            out.sent += 1

    def leave_early(self) -> None:
        """A subscription left LIVE_EARLY (paused, replaced away, removed)."""
        self.early -= 1
