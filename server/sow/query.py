"""A SOW query (docs/protocol.md §14 `sow`): its plan, and its answer streamed to one client.

The answer is `group_begin`, one `sow` frame per record, `group_end`, then the acks asked for:
`completed` with `bm` = the bookmark of the newest message of the journal the answer reflects,
and `stats` with `records_returned` and `topic_matches`. Every record comes from one read
snapshot of the store (server/sow/store.py), taken at one journal position: the answer is
exactly the journal up to that point.

Order and limits: without `order_by` records go out in key order as they are read, so the
answer never sits in memory; `skip_n` and `top_n` count matching records. With `order_by`
the sort values and keys of the matching records are held (not their bodies), sorted, and the
bodies read back from the snapshot as they are sent. NULL (a missing field) sorts after every
value ascending, before them descending; numbers sort before strings.

Pacing: frames are written in chunks of `CHUNK`; between chunks the query yields to the loop
and, when the client's transport is above its high-water mark, waits for it to drain (as a
replay does), so a query of a million records costs other clients nothing and the server no
memory beyond a chunk. `cancel` (unsubscribe by `query_id`, a disconnect) stops it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec

from protocol.filters import FilterError, compile_path

from .. import frames
from ..matching import Predicate, body_matches, filter_at
from ..outbox import Outbox
from ..reasons import Failure
from .answer import matching, sow_frames
from .history import HistoricalReader
from .query_queue import WaitingReader
from .store import Reader, Stored

__all__ = ["CHUNK", "BadOrderBy", "QueryPlan", "SowQuery", "parse_order_by"]

log = logging.getLogger("tickertape.sow")

CHUNK = 256
_json = msgspec.json.encode
_decode = msgspec.json.Decoder().decode

OrderItem = tuple[str, Callable[[Any], Any], bool]
"""(path, getter, descending)"""


class BadOrderBy(ValueError):
    reason = "bad order by"


def parse_order_by(text: str) -> list[OrderItem]:
    """`/field [ASC|DESC], /other ...` (raises BadOrderBy naming the item)."""
    items: list[OrderItem] = []
    for raw in text.split(","):
        words = raw.split()
        if not words or len(words) > 2:
            raise BadOrderBy(
                f"order_by item {raw.strip()!r} is not '/field' or '/field ASC|DESC'; "
                "write for example /price DESC, /sym"
            )
        desc = False
        if len(words) == 2:
            d = words[1].upper()
            if d not in ("ASC", "DESC"):
                raise BadOrderBy(f"order_by direction {words[1]!r} is not ASC or DESC")
            desc = d == "DESC"
        try:
            get = compile_path(words[0])
        except FilterError as exc:
            raise BadOrderBy(f"order_by field {words[0]!r}: {exc}") from None
        items.append((words[0], get, desc))
    return items


def _rank_at(j: int, row: tuple[Any, ...]) -> tuple[int, Any]:
    return _rank(row[0][j])


def _rank(v: Any) -> tuple[int, Any]:
    if v is None or isinstance(v, (dict, list)):
        return (2, 0)
    if isinstance(v, (int, float)):  # bool is an int: false < true
        return (0, v)
    return (1, str(v))


@dataclass
class QueryPlan:
    """What a query reads and how it answers (built and checked by the session)."""

    topics: list[str]
    filters: dict[str, Predicate | None]  # per topic: the user's filter AND entitlements
    keys: list[str] | None = None  # sow_keys
    order: list[OrderItem] | None = None
    top_n: int | None = None
    skip_n: int = 0
    query_id: str | None = None
    sub_id: str | None = None
    cid: Any = None
    acks: frozenset[str] = field(default_factory=frozenset)
    no_sowkey: bool = False
    timestamp: bool = False
    send_keys: Callable[[str, Any], dict[str, Any] | None] | None = None


@dataclass(eq=False, repr=False)
class SowQuery:
    """One query's answer on its way to one client (states: running -> done | cancelled)."""

    out: Outbox
    reader: Reader | HistoricalReader | WaitingReader
    point: tuple[int, int] | None
    plan: QueryPlan
    on_done: Callable[[SowQuery, bool], None]
    returned: int = field(init=False, default=0)
    matches: int = field(init=False, default=0)
    task: asyncio.Task[None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        plan = self.plan
        self._extra = b""
        if plan.query_id is not None:
            self._extra += b',"query_id":' + _json(plan.query_id)
        if plan.sub_id is not None:
            self._extra += b',"sub_id":' + _json(plan.sub_id)
        self._group_id = plan.query_id if plan.query_id is not None else plan.cid

    def start(self) -> None:
        """Send `group_begin` now (so it precedes anything later on this connection) and
        stream the rest from a task."""
        self.out.buf.append(frames.sow_group("group_begin", self._group_id))
        self.task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def _run(self) -> None:
        done = False
        try:
            if self.plan.order is None:
                await self._stream()
            else:
                await self._sorted()
            done = not self.out.closing
            if done:
                self._finish()
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug costs this query, never the server
            log.exception("SOW query on %s failed", self.plan.topics)
            if not self.out.closing:  # the client is not left waiting
                for kind in sorted(self.plan.acks & {"completed", "stats"}) or ["processed"]:
                    self.out.send_ack(
                        kind,
                        self.plan.cid,
                        "failure",
                        Failure.BAD_FRAME,
                        detail="internal error while answering the query",
                        query_id=self.plan.query_id,
                    )
                self.out.flush()
        finally:
            self.reader.close()
            self.on_done(self, done)

    def _finish(self) -> None:
        out, plan = self.out, self.plan
        out.buf.append(frames.sow_group("group_end", self._group_id))
        if "completed" in plan.acks:
            bm = "%d|%d|" % self.point if self.point is not None else None
            out.send_ack("completed", plan.cid, bm=bm, query_id=plan.query_id, sub_id=plan.sub_id)
        if "stats" in plan.acks:
            out.send_ack(
                "stats",
                plan.cid,
                records_returned=self.returned,
                topic_matches=self.matches,
                query_id=plan.query_id,
            )
        out.flush()

    def _matching(self) -> Any:
        """(topic, key, record) of every matching record, in topic then key order."""
        plan, reader = self.plan, self.reader
        for topic in plan.topics:
            f = filter_at(plan.filters.get(topic), topic)
            if plan.keys is not None:
                source: Any = (
                    (k, rec) for k in plan.keys if (rec := reader.get(topic, k)) is not None
                )
            else:
                source = reader.keys(topic)
            for k, rec in source:
                if f is None or body_matches(f, rec[5]):
                    yield topic, k, rec

    async def _stream(self) -> None:
        plan = self.plan
        if (
            plan.keys is None
            and not plan.timestamp
            and plan.send_keys is None
            and isinstance(self.reader, (Reader, HistoricalReader))
        ):
            await self._stream_chunks()
            return
        top = plan.top_n
        skip = plan.skip_n
        n = 0
        for topic, k, rec in self._matching():
            self.matches += 1
            if self.matches <= skip or (top is not None and self.returned >= top):
                continue
            self._emit(topic, k, rec)
            n += 1
            if n % CHUNK == 0 and not await self._pace():
                return

    async def _stream_chunks(self) -> None:
        """`_stream` for the store's records (current or historical) with no per-record extra (no `sow_keys`, no
        timestamp, no send_keys): CHUNK records read at once, filtered, and made into frames
        in one call (server/sow/answer.py)."""
        plan, out = self.plan, self.out
        top, skip = plan.top_n, plan.skip_n
        reader = self.reader
        assert isinstance(reader, (Reader, HistoricalReader))
        for topic in plan.topics:
            f = filter_at(plan.filters.get(topic), topic)
            prefix = topic.encode("utf-8") + b"\x00"
            head = b'{"c":"sow"' + frames.topic_member_text(topic)
            for items in reader.chunks(topic, CHUNK):
                if f is not None:
                    items = matching(items, f)
                before = self.matches
                self.matches += len(items)
                # the records past `skip_n` matches, up to `top_n` returned
                lo = max(0, skip - before)
                hi = len(items)
                if top is not None:
                    hi = min(hi, lo + max(0, top - self.returned))
                if lo < hi:
                    if lo or hi < len(items):
                        items = items[lo:hi]
                    data, n = sow_frames(items, prefix, head, self._extra, plan.no_sowkey)
                    out.buf.append(data)
                    self.returned += n
                if not await self._pace():
                    return

    async def _sorted(self) -> None:
        plan = self.plan
        order = plan.order
        assert order is not None
        rows: list[tuple[list[Any], str, str]] = []
        for i, (topic, k, rec) in enumerate(self._matching()):
            try:
                doc = _decode(rec[5])
            except (ValueError, RecursionError):
                doc = None
            rows.append(([get(doc) for _p, get, _d in order], topic, k))
            if i % (CHUNK * 16) == CHUNK * 16 - 1:
                await asyncio.sleep(0)  # a long scan lets other clients in
        self.matches = len(rows)
        for j in range(len(order) - 1, -1, -1):
            desc = order[j][2]
            rows.sort(key=partial(_rank_at, j), reverse=desc)
        end = len(rows) if plan.top_n is None else plan.skip_n + plan.top_n
        n = 0
        for _vals, topic, k in rows[plan.skip_n : end]:
            rec = self.reader.get(topic, k)
            if rec is None:  # pragma: no cover - one snapshot: it cannot go
                continue
            self._emit(topic, k, rec)
            n += 1
            if n % CHUNK == 0 and not await self._pace():
                return

    def _emit(self, topic: str, k: str, rec: Stored) -> None:
        plan = self.plan
        _pos, pub, seq, ts, hdr, body = rec
        if plan.no_sowkey:
            i = hdr.rfind(b',"k":')
            if i >= 0:
                hdr = hdr[:i]
        extra = self._extra
        if plan.timestamp:
            extra += frames.timestamp_part(ts)
        if plan.send_keys is not None:
            body = _with_keys(body, plan.send_keys(topic, body))
        self.out.buf.append(
            frames.sow_record(frames.topic_member_text(topic), pub, seq, hdr, extra, body)
        )
        self.returned += 1

    async def _pace(self) -> bool:
        """Between chunks: write, yield, and wait while the client does not read."""
        out = self.out
        out.flush()
        if out.closing:
            return False
        if not out.writable.is_set():
            await out.writable.wait()
        else:
            await asyncio.sleep(0)
        return not out.closing


def _with_keys(body: bytes, fields: dict[str, Any] | None) -> bytes:
    if not fields:
        return body
    try:
        doc = _decode(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(doc, dict):
        return body
    return _json(_merge(doc, fields))


def _merge(doc: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    for key, v in fields.items():
        if isinstance(v, dict) and isinstance(doc.get(key), dict):
            _merge(doc[key], v)
        else:
            doc.setdefault(key, v)
    return doc
