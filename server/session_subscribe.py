"""The `subscribe` command of a session (docs/protocol.md §3, §5, §6, §8): plain, bookmark and queue
subscriptions, `replace`, and `pause` / `resume`.

Each form is checked completely (options, topic pattern, filter, bookmark, recorded topic,
replay plan) before anything changes, so a refused subscribe leaves no trace; then the
session's `SubscriptionTable` makes the change (server/subscription_table.py has the states).
`SubscribeCommands` is the object a session builds at logon (server/session_caller.py says what
it is handed); it also takes a queue's acknowledgements (`queue_ack`: `sow_delete` on a queue,
by bookmarks or a filter, answered once the acknowledgement is durable).
"""

from __future__ import annotations

import logging

from protocol.bookmarks import BookmarkSpec, InvalidBookmark, Now, parse_bookmark
from protocol.headers import MAX_SUB_ID_BYTES, Header
from protocol.options import (
    InvalidOptions,
    SubscribeOptions,
    sow_delete_options,
    subscribe_options,
)
from protocol.patterns import PatternError, compile_pattern, is_pattern

from .conflation import LiveConflation
from .matching import Predicate
from .queue import Queue
from .reasons import Failure
from .replay_plan import Plan
from .services import SessionServices
from .session_caller import Caller
from .subscriptions import Subscription, ack_types

__all__ = ["SubscribeCommands"]

log = logging.getLogger("tickertape.connection")


class SubscribeCommands:
    """One logged-on session's `subscribe` in all its forms, and its queue acknowledgements
    (`sow_delete` on a queue)."""

    __slots__ = ("caller", "fail", "out", "svc", "table")

    def __init__(self, caller: Caller, svc: SessionServices) -> None:
        self.caller = caller
        self.svc = svc
        self.out, self.fail, self.table = caller.out, caller.fail, caller.table

    def cmd_subscribe(self, h: Header, body: bytes) -> None:
        if h.f and not self.caller.filter_ready(h, body):
            return
        svc = self.svc
        table = self.table
        acks = ack_types(h.a)
        try:
            opts = subscribe_options(h.o)
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            return
        if opts.resume or (
            opts.pause and h.sub_id and all(i.strip() in table for i in h.sub_id.split(","))
        ):
            self._pause_or_resume(h, opts, acks)
            return
        topic = h.t
        if not topic:
            self.fail(h, Failure.INVALID_TOPIC, "subscribe needs a topic (t)")
            return
        sub_id = h.sub_id
        if sub_id is None:
            sub_id = self.caller.new_sub_id()
        existing = table.get(sub_id)
        if existing is None and not self._room_for_subscription(h, sub_id):
            return
        if existing is not None and not opts.replace:
            self.fail(
                h,
                Failure.SUBSCRIPTION_EXISTS,
                f"sub_id {sub_id!r} is in use; unsubscribe first or add the replace option",
            )
            return
        queue = svc.queues.get(topic) if not h.bm else None
        if queue is not None:
            self._subscribe_queue(h, queue, sub_id, opts, acks, existing)
            return
        if opts.max_backlog is not None:
            if svc.queues.get(topic) is None:  # a queue-only option on a name that is not one
                self.fail(
                    h,
                    Failure.NOT_A_QUEUE,
                    f"topic {topic!r} is not a queue; max_backlog applies to queue subscriptions",
                )
            else:
                self.fail(
                    h,
                    Failure.INVALID_OPTIONS,
                    f"max_backlog applies to queue subscriptions, which take no bookmark; "
                    f"{topic!r} with bm is a replay of its topic",
                )
            return
        match_topic = svc.topics.replay_topic(topic) if h.bm else topic
        regex = None
        if is_pattern(match_topic):
            try:
                regex = compile_pattern(match_topic)
            except PatternError as exc:
                self.fail(h, Failure.BAD_REGEX_TOPIC, str(exc))
                return
        ok, filt = self._filter(h)
        if not ok:
            return
        spec: BookmarkSpec | None = None
        if h.bm:
            try:
                spec = parse_bookmark(h.bm)
            except InvalidBookmark as exc:
                self.fail(h, Failure.INVALID_BOOKMARK, str(exc))
                return
        elif opts.bookmark_only():
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                f"options {', '.join(opts.bookmark_only())} need a bookmark subscription (bm)",
            )
            return
        # Only a replay reads the journal. Conflation without one runs on the live stream, any
        # topic; NOW with `pause` is a paused replay from the live end (it keeps its place).
        needs_journal = spec is not None and not isinstance(spec, Now)
        if needs_journal and not svc.topics.replayable(match_topic, regex):
            self.fail(
                h,
                Failure.INVALID_TOPIC,
                f"topic {topic!r} is not recorded in the transaction log, so it cannot be replayed",
            )
            return
        right = "replay" if h.bm else "subscribe"
        grant = self.caller.grant(h, right, match_topic, regex is not None, filt, "subscribe")
        if grant is None:
            return
        plan: Plan | None = None
        if (needs_journal or (spec is not None and opts.pause)) and existing is None:
            try:
                plan = svc.replays.plan(spec, opts)
            except InvalidBookmark as exc:
                self.fail(h, Failure.INVALID_BOOKMARK, str(exc))
                return
        sub = Subscription(
            table, self.out, sub_id, match_topic, regex, filt, h.f, opts, acks, h.cid, h.bm
        )
        if opts.conflation is not None and not needs_journal:
            sub.conflation = LiveConflation(
                sub, opts.conflation, opts.conflation_key, svc.call_later
            )
        sub.journal_fed = svc.topics.journal_fed(match_topic, regex, spec is not None)
        grant.apply(sub)
        if existing is not None:  # replace: same place in the stream, new filter / options
            table.replace(existing, sub)
        elif plan is not None:
            table.add_replay(sub)
        else:
            table.add_live(sub)
        if "processed" in acks:
            self.out.send_ack("processed", h.cid, sub_id=sub_id)
        if plan is not None:
            table.start_replay(sub, plan)
        elif existing is None and spec is not None and "completed" in acks:
            self.out.send_ack("completed", h.cid, sub_id=sub_id)  # NOW: nothing to replay

    def _filter(self, h: Header) -> tuple[bool, Predicate | None]:
        """(True, the compiled `f` or None without one), or (False, None) when it does not
        compile (refused)."""
        if not h.f:
            return True, None
        filt = self.caller.compiled_filter(h)
        return filt is not None, filt

    def _room_for_subscription(self, h: Header, sub_id: str) -> bool:
        """A new subscription fits the connection's bounds: <ClientMaxSubscriptions>, and a
        sub_id short enough that a delivery's `sids` (every matching sub_id) stays small."""
        if len(sub_id.encode()) > MAX_SUB_ID_BYTES or "," in sub_id:
            self.fail(
                h,
                Failure.BAD_FRAME,
                f"sub_id is at most {MAX_SUB_ID_BYTES} bytes and has no comma",
            )
            return False
        limit = self.svc.max_subscriptions
        if len(self.table) >= limit:
            self.svc.limit_counts["subscriptions_refused"] += 1
            self.fail(
                h,
                Failure.NOT_ENTITLED,
                f"this connection has {len(self.table)} subscriptions, the most "
                f"<ClientMaxSubscriptions> allows; unsubscribe some or open another connection",
            )
            return False
        return True

    def _subscribe_queue(
        self,
        h: Header,
        queue: Queue,
        sub_id: str,
        opts: SubscribeOptions,
        acks: frozenset[str],
        existing: Subscription | None,
    ) -> None:
        ok, filt = self._filter(h)
        if not ok:
            return
        if opts.bookmark_only() or opts.conflation is not None:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                "a queue subscription takes max_backlog (and timestamp); replay options need a bookmark",
            )
            return
        assert h.t is not None
        grant = self.caller.grant(
            h, "consume", h.t, False, filt, "subscribe", (queue.spec.underlying_topic,)
        )
        if grant is None:
            return
        table = self.table
        if existing is not None:
            table.remove(existing)
        sub = Subscription(table, self.out, sub_id, h.t, None, filt, h.f, opts, acks, h.cid)
        grant.apply(sub)
        if "processed" in acks:
            self.out.send_ack("processed", h.cid, sub_id=sub_id)
        table.add_queued(sub, queue, opts.max_backlog)

    def _pause_or_resume(self, h: Header, opts: SubscribeOptions, acks: frozenset[str]) -> None:
        table = self.table
        ids = [i.strip() for i in (h.sub_id or "").split(",") if i.strip()]
        subs = [s for s in (table.get(i) for i in ids) if s is not None]
        missing = [i for i in ids if i not in table]
        if missing or not subs:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                f"{'resume' if opts.resume else 'pause'} names unknown sub_id(s) {', '.join(missing) or '(none)'}",
            )
            return
        plain = [s.sub_id for s in subs if s.bookmark is None]
        if plain:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                f"pause and resume apply to bookmark subscriptions; {', '.join(plain)} has no bookmark",
            )
            return
        if opts.resume:
            table.resume(subs)
        else:
            table.pause(subs)
        if "processed" in acks:
            self.out.send_ack("processed", h.cid, sub_id=h.sub_id)

    # -- queue acknowledgements ---------------------------------------------------------------------

    def queue_ack(self, h: Header, q: Queue) -> None:
        """`sow_delete` on a queue: acknowledge (or cancel, expire, extend) leased messages by
        bookmarks (the normal, batched case) or a filter; the reply waits until the
        acknowledgement is durable."""
        if not self.caller.may(h, "consume", q.name, "sow_delete"):
            return
        try:
            opts = sow_delete_options(h.o)
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            return
        if h.bm:
            try:
                bms = q.normalize_bookmarks(h.bm.split(","))
            except ValueError as exc:
                self.fail(
                    h,
                    Failure.INVALID_BOOKMARK,
                    f"{exc.args[0]!r} is not a bookmark (publisher|seq|)",
                )
                return
            n, refused = q.ack(
                self.table,
                bms,
                cancel=opts.cancel,
                expire=opts.expire,
                extend=opts.lease_extend,
                visible=self._queue_view(q, None),
            )
        elif h.f:
            f = self.caller.compiled_filter(h)
            if f is None:
                return
            n, refused = q.ack_filter(
                self.table,
                self._queue_view(q, f) or f,
                cancel=opts.cancel,
                expire=opts.expire,
                extend=opts.lease_extend,
            )
        else:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                "sow_delete on a queue needs bm (bookmarks) or f (a filter)",
            )
            return
        acks = [a.strip() for a in (h.a or "").split(",") if a.strip()]
        if not acks:
            return
        if refused:
            log.warning(
                "%s: sow_delete on %s refused for %d: %s",
                self.caller.describe(),
                q.name,
                len(refused),
                refused[0],
            )
        out = self.out

        def reply(err: BaseException | None) -> None:
            if out.closing:
                return
            for kind in acks:
                if err is not None:
                    out.send_ack(
                        kind,
                        h.cid,
                        "failure",
                        getattr(err, "reason", Failure.JOURNAL_UNAVAILABLE),
                        detail=str(err),
                    )
                elif refused:
                    out.send_ack(
                        kind,
                        h.cid,
                        "failure",
                        Failure.NOT_ENTITLED,
                        detail="; ".join(refused[:5]),
                        records_deleted=n,
                    )
                else:
                    out.send_ack(kind, h.cid, records_deleted=n)
            out.flush()

        self.svc.pipeline.after_commit(reply)  # acked only once the acknowledgement is durable

    def _queue_view(self, q: Queue, own: Predicate | None) -> Predicate | None:
        """What a sow_delete of this user may act on in `q`: `own` (a filter, None: anything)
        AND the user's content entitlement on the queue and its topic, the filter a queue
        subscription of this user reads through. A user acks, cancels or expires only what it
        could be delivered."""
        c = self.caller
        if c.ent is None:
            return own
        also = (q.spec.underlying_topic,)
        grant = c.guard.grant(c.peer, c.user_id, "consume", q.name, False, own, "sow_delete", also)
        return own if grant is None else grant.filter
