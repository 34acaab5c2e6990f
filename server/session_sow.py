"""The State of the World commands of a session (docs/protocol.md §14; docs/sow.md): `sow`,
`sow_and_subscribe`, and `sow_delete` on a SOW topic.

Each command is checked completely (topic, options, filter, order_by, sow_keys, rights) before
anything starts, so a refused one leaves no trace. A query's answer is a `SowQuery`
(server/sow/query.py) streaming from one snapshot of the store; the session keeps its running
queries by `query_id` (or `sub_id`, or `cid`) so `unsubscribe` and a disconnect stop them.

`sow_and_subscribe` is atomic with live delivery: in one loop step it takes the snapshot, whose
point is the pipeline's `delivered_end` P, and registers the subscription in the replaying
state, which the live fan-out passes by. When the answer has gone out, the subscription replays
the journal from P and joins the live stream as any bookmark subscription does
(server/replay.py): the first message after the answer is the first one after P, none missing,
none twice, however fast publishers run meanwhile (the journal is the buffer, not memory).
With `bm`, the answer is the historical state at that point (`SowManager.historical`, read off
the loop) and the replay starts from that point; the subscription waits in the replaying state
from the command on.

`SowCommands` is the object a session builds at logon (server/session_caller.py says what it is
handed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from protocol.bookmarks import InvalidBookmark, Now, parse_bookmark
from protocol.filters import FilterError, compile_filter
from protocol.headers import MAX_SUB_ID_BYTES, Header
from protocol.options import InvalidOptions, SubscribeOptions, sow_options, subscribe_options
from protocol.patterns import PatternError, compile_pattern, is_pattern

from .matching import Predicate
from .reasons import Failure
from .replay_plan import Plan
from .services import SessionServices
from .session_caller import Caller
from .sow import BadOrderBy, BadSowKey, SowManager, SowQuery, parse_order_by
from .sow.keys import check_key
from .sow.query import QueryPlan
from .sow.query_queue import WaitingReader
from .sow.records import BY_FILTER, BY_KEYS
from .subscriptions import Subscription, SubState, ack_types

__all__ = ["SowCommands"]

log = logging.getLogger("tickertape.connection")


class SowCommands:
    """One logged-on session's SOW commands and its running queries. `cmd_subscribe` and
    `cmd_publish`: the session's (a delta subscribe and a delta publish end as those)."""

    __slots__ = ("_queries", "caller", "cmd_publish", "cmd_subscribe", "fail", "out", "svc")

    def __init__(
        self,
        caller: Caller,
        svc: SessionServices,
        cmd_subscribe: Callable[[Header, bytes], None],
        cmd_publish: Callable[[Header, bytes], None],
    ) -> None:
        self.caller = caller
        self.svc = svc
        self.out, self.fail = caller.out, caller.fail
        self.cmd_subscribe = cmd_subscribe
        self.cmd_publish = cmd_publish
        self._queries: dict[str, SowQuery] = {}  # answers still sending, by name

    # -- checks shared by the query commands -----------------------------------------------------

    def sow_manager(self, h: Header) -> SowManager | None:
        sow = self.svc.sow
        if sow is None or not h.t:
            self.fail(
                h,
                Failure.INVALID_TOPIC,
                f"{h.c} needs a SOW topic (t); {h.t!r} is not one (<SOW><Topic>)",
            )
            return None
        return None if self.store_failed(h, sow) else sow

    def store_failed(self, h: Header, sow: SowManager) -> bool:
        """True (and `h` refused) when the store lacks updates it failed to write: an answer or
        a delta merge from it would be wrong."""
        failed = sow.store.failed if sow.store is not None else None
        if failed is not None:
            self.fail(
                h,
                Failure.CATCHING_UP,
                f"the SOW store lacks updates it failed to write ({failed}); restart the server: "
                "it folds the journal into the store again from before them",
            )
        return failed is not None

    def _query_plan(
        self, h: Header, sow: SowManager, top_n: int | None, skip_n: int | None, **kw: Any
    ) -> tuple[QueryPlan, Any, Predicate | None] | None:
        """The checked plan of a query on `h.t`, with the topic pattern and the user's own
        filter; None when refused (the failure ack is sent)."""
        topic = h.t or ""
        regex = None
        if is_pattern(topic):
            try:
                regex = compile_pattern(topic)
            except PatternError as exc:
                self.fail(h, Failure.BAD_REGEX_TOPIC, str(exc))
                return None
            topics = sorted(t for t in sow.topics() if regex.fullmatch(t) and sow.is_sow(t))
        elif not sow.is_sow(topic):
            self.fail(
                h,
                Failure.INVALID_TOPIC,
                f"topic {topic!r} is not a SOW topic (<SOW><Topic>, recorded in the "
                "transaction log)",
            )
            return None
        else:
            topics = [topic]
        parts = self._query_parts(h)
        if parts is None:
            return None
        filt, order, keys = parts
        grant = self.caller.grant(h, "subscribe", topic, regex is not None, filt, h.c or "sow")
        if grant is None:
            return None
        if grant.topics is not None:
            topics = [t for t in topics if grant.topics(t)]
        plan = QueryPlan(
            topics=topics,
            filters=dict.fromkeys(topics, grant.filter),
            keys=keys,
            order=order,
            top_n=h.top_n if h.top_n is not None else top_n,
            skip_n=skip_n or 0,
            query_id=h.query_id,
            cid=h.cid,
            **kw,
        )
        return plan, regex, filt

    def _query_parts(
        self, h: Header
    ) -> tuple[Predicate | None, list[Any] | None, list[str] | None] | None:
        """The query's own filter, order_by and sow_keys, checked; None when refused (the
        failure ack is sent)."""
        try:
            filt = compile_filter(h.f) if h.f else None
            order = parse_order_by(h.order_by) if h.order_by else None
            keys = None
            if h.sow_keys is not None:
                keys = [check_key(k.strip()) for k in h.sow_keys.split(",") if k.strip()]
        except FilterError as exc:
            self.fail(h, Failure.BAD_FILTER, str(exc))
            return None
        except BadOrderBy as exc:
            self.fail(h, Failure.BAD_ORDER_BY, str(exc))
            return None
        except BadSowKey as exc:
            self.fail(h, Failure.BAD_SOW_KEY, str(exc))
            return None
        return filt, order, keys

    def _read_history(
        self,
        h: Header,
        sow: SowManager,
        point: Any,
        start: Callable[[Any, Any], object],
        gone: Callable[[], bool] = lambda: False,
        failed: Callable[[], None] = lambda: None,
    ) -> None:
        """Read the state at `point` off the event loop (`SowManager.historical`), then on the
        loop: `start(reader, bm)`; or, for a point the journal cannot answer, `failed()` and
        the refusal; or nothing (the reader closed) once the client or `gone()` is gone."""
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.svc.replays.readers, sow.historical, point)

        def answer(f: asyncio.Future[Any]) -> None:
            exc = f.exception()
            if self.out.closing or gone():
                if exc is None:
                    f.result()[0].close()
                return
            if exc is not None:
                failed()
                if isinstance(exc, InvalidBookmark):
                    self.fail(h, Failure.INVALID_BOOKMARK, str(exc))
                else:
                    log.error("historical SOW query failed: %r", exc)
                    self.fail(h, Failure.BAD_FRAME, "internal error reading the history")
                self.out.flush()
                return
            start(*f.result())

        fut.add_done_callback(answer)

    def _run_query(self, plan: QueryPlan, name: str, then: Any = None) -> SowQuery:
        """Start the answer from a snapshot taken now; `then(point)` once it is all sent."""
        sow = self.svc.sow
        assert sow is not None
        reader, point, last_bm = sow.snapshot()
        return self._start(
            plan, name, reader, last_bm, None if then is None else partial(then, point)
        )

    def _start(
        self,
        plan: QueryPlan,
        name: str,
        reader: Any,
        point_bm: tuple[int, int] | None,
        then: Callable[[], None] | None = None,
    ) -> SowQuery:
        """Start the answer from `reader`; `then()` once it is all sent."""
        queries = self._queries

        def done(q: SowQuery, finished: bool) -> None:
            if queries.get(name) is q:
                del queries[name]
            if finished and then is not None:
                then()

        old = queries.pop(name, None)
        if old is not None:
            old.cancel()
        q = SowQuery(self.out, reader, point_bm, plan, done)
        queries[name] = q
        q.start()
        self.out.flush()
        return q

    def stop_queries(self, names: list[str] | None = None) -> int:
        """Stop the named running queries (all with None); how many were stopped."""
        queries = self._queries
        targets = list(queries) if names is None else [n for n in names if n in queries]
        for n in targets:
            queries.pop(n).cancel()
        return len(targets)

    # -- sow ------------------------------------------------------------------------------------------

    def _query_point(self, h: Header) -> tuple[bool, Any]:
        """(False, None) after refusing a bad `bm`; else (True, the point of the journal the
        answer is taken at: None for the current state, without `bm` or with NOW)."""
        if not h.bm:
            return True, None
        try:
            point = parse_bookmark(h.bm)
        except InvalidBookmark as exc:
            self.fail(h, Failure.INVALID_BOOKMARK, str(exc))
            return False, None
        return True, None if isinstance(point, Now) else point

    def cmd_sow(self, h: Header, body: bytes) -> None:
        try:
            opts = sow_options(h.o)
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            return
        queue = self.svc.queues.get(h.t) if h.t else None
        if queue is not None:
            self._sow_queue(h, queue, opts)
            return
        sow = self.sow_manager(h)
        if sow is None:
            return
        ok, point = self._query_point(h)
        if not ok:
            return
        got = self._query_plan(
            h,
            sow,
            opts.top_n,
            opts.skip_n,
            acks=ack_types(h.a),
            no_sowkey=opts.no_sowkey,
            timestamp=opts.timestamp,
        )
        if got is None:
            return
        plan = got[0]
        if "processed" in plan.acks:
            self.out.send_ack("processed", h.cid, query_id=h.query_id)
        name = h.query_id or h.cid or f"q{id(plan)}"
        if point is None:
            self._run_query(plan, name)
            return
        # historical: the checkpoint and the journal after it are read off the event loop
        self._read_history(h, sow, point, lambda reader, bm: self._start(plan, name, reader, bm))

    def _sow_queue(self, h: Header, queue: Any, opts: Any) -> None:
        """`sow` on a queue: the messages it holds available now (server/sow/query_queue.py),
        with the filter, sow_keys, order and paging of any query, and the content entitlement
        of a consumer of the queue (the right to consume it, the filters on it and on its
        underlying topic)."""
        if h.bm:
            self.fail(
                h,
                Failure.INVALID_BOOKMARK,
                f"a queue has no history to query: give no bm with sow on {queue.name!r}",
            )
            return
        parts = self._query_parts(h)
        if parts is None:
            return
        filt, order, keys = parts
        grant = self.caller.grant(
            h, "consume", queue.name, False, filt, "sow", (queue.spec.underlying_topic,)
        )
        if grant is None:
            return
        plan = QueryPlan(
            topics=[queue.name],
            filters={queue.name: grant.filter},
            keys=keys,
            order=order,
            top_n=h.top_n if h.top_n is not None else opts.top_n,
            skip_n=opts.skip_n or 0,
            query_id=h.query_id,
            cid=h.cid,
            acks=ack_types(h.a),
            no_sowkey=opts.no_sowkey,
            timestamp=opts.timestamp,
        )
        if "processed" in plan.acks:
            self.out.send_ack("processed", h.cid, query_id=h.query_id)
        reader = WaitingReader(queue.waiting(), self.svc.queues.read)
        name = h.query_id or h.cid or f"q{id(plan)}"
        self._start(plan, name, reader, self.svc.pipeline.last_bm)

    # -- sow_and_subscribe --------------------------------------------------------------------------

    def cmd_sow_and_subscribe(self, h: Header, body: bytes) -> None:
        svc = self.svc
        table = self.caller.table
        sow = self.sow_manager(h)
        if sow is None:
            return
        try:
            opts = subscribe_options(h.o, h.c or "sow_and_subscribe")
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            return
        refused = [n for n in ("live", "pause", "resume", "rate", "conflation") if getattr(opts, n)]
        if opts.max_backlog is not None:
            refused.append("max_backlog")
        if refused:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                f"options {', '.join(refused)} are not served on sow_and_subscribe",
            )
            return
        ok, point = self._query_point(h)
        if not ok:
            return
        sub_id = h.sub_id
        if sub_id is None:
            sub_id = self.caller.new_sub_id()
        elif len(sub_id.encode()) > MAX_SUB_ID_BYTES or "," in sub_id:
            self.fail(
                h, Failure.BAD_FRAME, f"sub_id is over {MAX_SUB_ID_BYTES} bytes or has a comma"
            )
            return
        existing = table.get(sub_id)
        if existing is not None and not opts.replace:
            self.fail(
                h,
                Failure.SUBSCRIPTION_EXISTS,
                f"sub_id {sub_id!r} is in use; unsubscribe first or add the replace option",
            )
            return
        if existing is not None and point is not None:
            self.fail(
                h,
                Failure.INVALID_BOOKMARK,
                "replace re-runs the query on the current state: give no bm with replace",
            )
            return
        acks = ack_types(h.a)
        got = self._query_plan(
            h,
            sow,
            opts.top_n,
            opts.skip_n,
            acks=acks,
            sub_id=sub_id,
            no_sowkey=opts.no_sowkey,
            timestamp=opts.timestamp,
        )
        if got is None:
            return
        plan, regex, filt = got
        topic = h.t or ""
        grant = self.caller.grant(h, "subscribe", topic, regex is not None, filt, "subscribe")
        if grant is None:  # pragma: no cover - the query's grant was the same check
            return
        # the replay after the answer must not send a second `completed`: the answer's is the one
        sub_acks = acks - {"completed"}
        live_opts = SubscribeOptions(
            timestamp=opts.timestamp,
            oof=opts.oof,
            no_sowkey=opts.no_sowkey,
            no_empties=opts.no_empties,  # for sow_and_delta_subscribe (server/sow/delta.py)
            send_keys=opts.send_keys,
        )
        sub = Subscription(
            table, self.out, sub_id, topic, regex, filt, h.f, live_opts, sub_acks, h.cid, None
        )
        sub.journal_fed = svc.topics.journal_fed(topic, regex, True)
        grant.apply(sub)

        def go_live(point: int) -> None:
            if sub.state is not SubState.REMOVED:
                table.start_replay(sub, Plan(("at", point)))

        if existing is not None:
            # replace: the live part takes the new filter at once; the query sends only the
            # records that came into scope (they match the new filter, not the old one)
            old = existing.filter
            answering = existing.state is SubState.REPLAYING and existing.replay is None
            table.replace(existing, sub)
            if old is not None:
                new = plan.filters
                plan.filters = {t: _came_into_scope(f, old) for t, f in new.items()}
            if "processed" in acks:
                self.out.send_ack("processed", h.cid, sub_id=sub_id)
            # a subscription still in its first answer goes live after this one
            self._run_query(plan, sub_id, go_live if answering else None)
            return
        table.add_replay(sub)
        if point is None:
            if "processed" in acks:
                self.out.send_ack("processed", h.cid, sub_id=sub_id)
            self._run_query(plan, sub_id, go_live)
            return

        # from a point of the journal: the state there (read off the loop, as `sow` with bm),
        # then the journal replayed from that point, then live; the subscription waits in the
        # replaying state meanwhile, so nothing published in between is missed; `processed`
        # comes once the point is read (a point the journal cannot answer is refused instead)
        def answer(reader: Any, bm: Any) -> None:
            if "processed" in acks:  # the point is known good: a refusal comes instead
                self.out.send_ack("processed", h.cid, sub_id=sub_id)
            self._start(plan, sub_id, reader, bm, partial(go_live, reader.position))

        self._read_history(
            h,
            sow,
            point,
            answer,
            gone=lambda: sub.state is SubState.REMOVED,
            failed=lambda: table.remove(sub),
        )

    # -- sow_delete on a SOW topic ------------------------------------------------------------------

    def sow_delete_records(self, h: Header, body: bytes, sow: SowManager) -> None:
        topic = h.t or ""
        if not self.caller.may(h, "publish", topic, "sow_delete"):
            return
        if h.sow_keys is not None:
            try:
                keys = [check_key(k.strip()) for k in h.sow_keys.split(",") if k.strip()]
            except BadSowKey as exc:
                self.fail(h, Failure.BAD_SOW_KEY, str(exc))
                return
            form, payload = BY_KEYS, ",".join(keys)
        elif h.f:
            try:
                compile_filter(h.f)
            except FilterError as exc:
                self.fail(h, Failure.BAD_FILTER, str(exc))
                return
            form, payload = BY_FILTER, h.f
        elif body:
            spec = sow.spec(topic)
            assert spec is not None
            try:
                k = sow.maker(spec).key(body, h.k)
            except BadSowKey as exc:
                self.fail(h, Failure.BAD_SOW_KEY, str(exc))
                return
            form, payload = BY_KEYS, k
        else:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                "sow_delete on a SOW topic needs sow_keys, f (a filter) or a body (the record's "
                "message)",
            )
            return
        acks = sorted(ack_types(h.a))
        out = self.out

        def reply(n: int, err: BaseException | None) -> None:
            if out.closing or not acks:
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
                else:
                    out.send_ack(kind, h.cid, records_deleted=n)
            out.flush()

        sow.delete(topic, form, payload, reply)


def _came_into_scope(new: Predicate | None, old: Predicate) -> Predicate | None:
    from .matching import TopicFilter

    if new is None or isinstance(new, TopicFilter) or isinstance(old, TopicFilter):
        return new

    def into_scope(doc: Any) -> bool:
        return bool(new(doc)) and not old(doc)

    return into_scope
