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

from .client_commands import DEFAULT_TIMEOUT, ClientCommands, _opts_text
from .client_conn import ClientConnection
from .client_subscribe import ClientSubscriptions
from .errors import CommandError, CommandTimeout
from .message import Message
from .subscription import Subscription

__all__ = ["ClientSow"]


def _keys_text(keys: str | Iterable[str] | None) -> str | None:
    if keys is None or isinstance(keys, str):
        return keys
    return ",".join(keys)


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
            sow_keys=_keys_text(sow_keys), o=",".join(opts) or None, query_id=query_id,
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
    ) -> Subscription:
        """Query `topic` and subscribe to what changes after the answer; returns the
        Subscription, whose iterator yields the answer's records and then live messages.
        With `bookmark`: the state at that point, then every change after it, then live."""
        if self._conn.state != "logged_on":
            raise self._conn.not_ready("sow_and_subscribe")
        opts = _opts_text(options)
        replace = opts is not None and "replace" in (o.strip() for o in opts.split(","))
        existing = self._subs.by_id.get(sub_id) if sub_id is not None else None
        if existing is not None and not replace:
            raise CommandError(
                "subscription already exists",
                f"sub_id {sub_id!r} is active on this client; unsubscribe it or pass "
                "options='replace'",
            )
        if sub_id is None:
            sub_id = self._subs.new_sub_id()
        cid = self._commands.new_id()
        sub = existing or Subscription(
            self._subs,
            sub_id,
            topic,
            None,
            max_messages=self._subs.max_buffered_messages,
            max_bytes=self._subs.max_buffered_bytes,
            on_full=self._subs.sub_full,
            on_drained=self._subs.sub_drained,
        )
        self._subs.by_id[sub_id] = sub  # registered before sending: the answer may come first
        header = Header(
            c="sow_and_subscribe", cid=cid, t=topic, sub_id=sub_id, f=filter, top_n=top_n,
            order_by=order_by, o=opts, bm=bookmark, a="processed",
        )  # fmt: skip
        try:
            await self._commands.request(header, "processed", timeout)
        except BaseException as exc:
            if existing is None:
                self._subs.drop(sub)
                sub._end_stop(drop=True)
                if isinstance(exc, (CommandTimeout, asyncio.CancelledError)):
                    self._commands.send_quietly(Header(c="unsubscribe", sub_id=sub_id))
            raise
        return sub

    def on_sow(self, header: Header, body: bytes) -> None:
        """One record of an answer: to its query's list, or its subscription's stream."""
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
