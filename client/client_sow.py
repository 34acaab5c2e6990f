"""State of the World queries on one connection, a collaborator of `Client` (docs/protocol.md
§14; docs/sow.md).

- `sow(topic, ...)`: a query; returns the records of the answer (`Message`s whose
  `header.c` is `"sow"` and `header.k` the record's key), once the `completed` ack arrived.
  Every query carries a `query_id` (generated here), which routes its `sow` frames.
- `sow_and_subscribe(topic, ...)`: a query and a subscription in one command; the returned
  `Subscription` yields the answer's records first (`header.c == "sow"`), then the live
  messages, with no gap and no duplicate between them (the server's guarantee).
- `sow_delete(topic, keys=... | filter=... | data=...)` (client/client_commands.py) deletes
  records of a SOW topic and returns how many.

`ClientSow` is handed the connection, the commands and the subscriptions (client_conn.py,
client_commands.py, client_subscribe.py); `Client` routes each `sow` frame to `on_sow`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from protocol.headers import Header

from .client_commands import DEFAULT_TIMEOUT, ClientCommands, _joined, _opts_text
from .client_conn import ClientConnection
from .client_subscribe import ClientSubscriptions
from .errors import CommandTimeout
from .message import Message
from .subscription import Subscription

__all__ = ["ClientSow"]


class ClientSow:
    """Queries of SOW topics (see the module docstring)."""

    def __init__(
        self, conn: ClientConnection, commands: ClientCommands, subs: ClientSubscriptions
    ) -> None:
        self._conn = conn
        self._commands = commands
        self._subs = subs
        self._answers: dict[str, list[Message]] = {}

    async def sow(
        self,
        topic: str,
        *,
        filter: str | None = None,
        top_n: int | None = None,
        order_by: str | None = None,
        skip_n: int | None = None,
        sow_keys: str | Iterable[str] | None = None,
        options: str | Iterable[str] | None = None,
        bookmark: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[Message]:
        """The records of SOW topic `topic` (a pattern: of every SOW topic it matches) that
        match `filter`, in `order_by` order (`/field [ASC|DESC], ...`), at most `top_n`
        after skipping `skip_n`; with `bookmark` (a bookmark, a timestamp or "0"), as they
        were at that point of the journal. Raises CommandError with the server's reason (`invalid
        topic`, `bad filter`, `bad order by`, ...)."""
        if self._conn.state != "logged_on":
            raise self._conn.not_ready("sow")
        opts = [o for o in (_opts_text(options) or "").split(",") if o]
        if skip_n is not None:
            opts.append(f"skip_n={skip_n}")
        query_id = f"q{self._commands.new_id()}"
        answer: list[Message] = []
        self._answers[query_id] = answer
        header = Header(
            c="sow", t=topic, f=filter, top_n=top_n, order_by=order_by,
            sow_keys=_joined(sow_keys), o=",".join(opts) or None, query_id=query_id,
            bm=bookmark, a="completed",
        )  # fmt: skip
        try:
            await self._commands.request(header, "completed", timeout)
        except (CommandTimeout, asyncio.CancelledError):
            self._commands.send_quietly(Header(c="unsubscribe", query_id=query_id))
            raise
        finally:
            self._answers.pop(query_id, None)
        return answer

    async def sow_and_subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        top_n: int | None = None,
        order_by: str | None = None,
        options: str | Iterable[str] | None = None,
        sub_id: str | None = None,
        bookmark: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        marks: bool = False,
    ) -> Subscription:
        """Query `topic` and subscribe to what changes after the answer; returns the
        Subscription, whose iterator yields the answer's records and then live messages;
        its `completed` is set when the answer is all in. With `bookmark`: the state at that
        point, then every change after it, then live. `marks=True` (the HAClient's) also hands
        out, in order, the answer's point (the `completed` ack's bookmark, right after the
        answer's records) and the periodic `persisted` acks, as PersistedBookmark items."""
        if self._conn.state != "logged_on":
            raise self._conn.not_ready("sow_and_subscribe")
        opts = _opts_text(options)
        sub, existing = self._subs.open_sub(sub_id, topic, None, opts, marks)
        header = Header(
            c="sow_and_subscribe", cid=self._commands.new_id(), t=topic, sub_id=sub.sub_id, f=filter,
            top_n=top_n, order_by=order_by, o=opts, bm=bookmark,
            a="processed,completed,persisted" if marks else "processed,completed",
        )  # fmt: skip
        await self._subs.subscribe_request(header, sub, existing, timeout)
        return sub

    def on_sow(self, header: Header, body: bytes) -> None:
        """One record of an answer: to its query's list, or its subscription's stream; an
        out-of-focus notice (`header.c == "oof"`, with `k` and `reason`) to its subscription's
        stream, in order with the messages."""
        msg = Message(header.t, body, header.bm, header.sub_id, header.sub_id, header.ts,
                      header.x, None, header)  # fmt: skip
        if header.sub_id is not None:
            sub = self._subs.by_id.get(header.sub_id)
            if sub is not None:
                sub._push(msg)
                return
        answer = self._answers.get(header.query_id or "")
        if answer is not None:
            answer.append(msg)
        else:
            self._subs.stray_messages += 1
