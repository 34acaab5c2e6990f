"""The `subscribe` command of a session (docs/protocol.md §3, §5, §6, §8): plain, bookmark and queue
subscriptions, `replace`, and `pause` / `resume`.

Each form is checked completely (options, topic pattern, filter, bookmark, recorded topic,
replay plan) before anything changes, so a refused subscribe leaves no trace; then the
session's `SubscriptionTable` makes the change (server/subscription_table.py has the states).
`SubscribeCommands` is mixed into `Session` (server/session.py), which provides the attributes
declared here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from protocol.bookmarks import BookmarkSpec, InvalidBookmark, Now, parse_bookmark
from protocol.filters import FilterError, cached_filter, compile_filter
from protocol.headers import MAX_SUB_ID_BYTES, Header
from protocol.options import InvalidOptions, SubscribeOptions, subscribe_options
from protocol.patterns import PatternError, compile_pattern

from .conflation import LiveConflation
from .matching import Predicate
from .outbox import Outbox
from .queue import Queue
from .reasons import Failure
from .replay_plan import Plan
from .router import is_pattern
from .services import SessionServices
from .subscription_table import SubscriptionTable
from .subscriptions import Subscription, ack_types

__all__ = ["SubscribeCommands"]


class SubscribeCommands:
    # provided by Session
    id: int
    out: Outbox
    svc: SessionServices
    table: SubscriptionTable
    peer: str
    user_id: str | None
    _sub_counter: int
    _held: list[tuple[Header, Any]] | None
    hold: Callable[[bool], None]
    _compiled: tuple[str, Predicate | FilterError] | None

    def fail(self, header: Header, reason: str, detail: str) -> None:
        raise NotImplementedError

    def receive(self, frames_in: list[tuple[Header, Any]]) -> None:
        raise NotImplementedError

    def filter_ready(self, h: Header, body: Any) -> bool:
        """Whether the command's filter `h.f` can be had now (cached, short, or compiled off
        the loop for this very command). If not, its compile starts on the server's filter
        thread, the connection stops reading and its frames wait (as behind a logon), and the
        command is handled again when the compile is done: a large filter never stalls the
        event loop, and one connection has at most one compile under way."""
        done = self._compiled
        if done is not None and done[0] == h.f:
            return True
        try:
            if cached_filter(h.f or "") is not None:
                return True
        except FilterError:
            return True  # refused by the command, at once
        self._held = []
        self.hold(True)
        self.svc.compile_later(h.f or "", partial(self._filter_compiled, h, body))
        return False

    def _filter_compiled(self, h: Header, body: Any, result: Predicate | FilterError) -> None:
        held, self._held = self._held, None
        if self.out.closing:
            return
        self._compiled = (h.f or "", result)
        self.hold(False)
        self.receive([(h, body), *(held or ())])
        self.out.flush()

    def compiled_filter(self, h: Header) -> Predicate | None:
        """The command's filter `h.f` compiled (from filter_ready's compile, if it made one);
        refused with `bad filter` (and None) when it does not compile."""
        done, self._compiled = self._compiled, None
        try:
            if done is not None and done[0] == h.f:
                if isinstance(done[1], FilterError):
                    raise done[1]
                return done[1]
            return compile_filter(h.f or "")
        except FilterError as exc:
            self.fail(h, Failure.BAD_FILTER, str(exc))
            return None

    def not_entitled(self, h: Header, right: str, topic: str) -> None:
        raise NotImplementedError

    def cmd_subscribe(self, h: Header, body: bytes) -> None:
        if h.f and not self.filter_ready(h, body):
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
            self._sub_counter += 1
            sub_id = f"{self.id}.{self._sub_counter}"
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
        grant = svc.guard.grant(
            self.peer, self.user_id, right, match_topic, regex is not None, filt, "subscribe"
        )
        if grant is None:
            self.not_entitled(h, right, match_topic)
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
        filt = self.compiled_filter(h)
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
        grant = self.svc.guard.grant(
            self.peer,
            self.user_id,
            "consume",
            h.t,
            False,
            filt,
            "subscribe",
            also=(queue.spec.underlying_topic,),
        )
        if grant is None:
            self.not_entitled(h, "consume", h.t)
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
