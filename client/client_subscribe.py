"""The subscriptions of one connection, a collaborator of `Client`: subscribe, unsubscribe,
delivery and flow control.

`ClientSubscriptions` is handed the connection (client_conn.py) and the commands
(client_commands.py), and owns the subscriptions, by `sub_id` (`by_id`) and by the `cid` of
the subscribe command (`by_cid`; a `completed` ack may name either). Each `Subscription` sees
it as its owner (the `Unsubscriber` of client/subscription.py). A subscription is registered before its subscribe is sent, so deliveries that
race the ack are routed; a delivery whose `sids` lists several subscriptions is handed to each
one; a delivery for no known subscription counts in `stray_messages`.

Flow control: while any subscription's buffer is full, reading from the socket is paused
(`sub_full` / `sub_drained`, called by the `Subscription`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import msgspec

from protocol.headers import Header

from .client_commands import DEFAULT_TIMEOUT, ClientCommands, _opts_text
from .client_conn import ClientConnection
from .errors import CommandError, CommandTimeout, Disconnected
from .message import Message
from .subscription import _STOP, Subscription

__all__ = ["ClientSubscriptions"]

log = logging.getLogger("tickertape.client")

_replace = msgspec.structs.replace


class ClientSubscriptions:
    """Subscriptions of one connection (see the module docstring)."""

    def __init__(
        self,
        conn: ClientConnection,
        commands: ClientCommands,
        max_buffered_messages: int,
        max_buffered_bytes: int,
    ) -> None:
        self._conn = conn
        self._commands = commands
        self.max_buffered_messages = max_buffered_messages
        self.max_buffered_bytes = max_buffered_bytes
        self.stray_messages = 0  # deliveries for no known subscription (e.g. after unsubscribe)
        self.by_id: dict[str, Subscription] = {}
        self.by_cid: dict[str, Subscription] = {}
        self._full_subs: set[Subscription] = set()

    # ================================================================ subscribing

    async def subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        bookmark: object | None = None,
        options: str | Iterable[str] | None = None,
        sub_id: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        marks: bool = False,
    ) -> Subscription:
        """Subscribe and wait for the processed ack; returns the Subscription to iterate.

        `marks=True` also asks for `persisted` acks and hands the periodic ones out of the
        iterator as PersistedBookmark items (see the module docstring).

        `bookmark` (a str, or a protocol.bookmarks value) makes it a bookmark subscription;
        `options` is the `o` text or a list of options. With `replace` in the options and an
        existing `sub_id`, the existing Subscription is updated and returned. Raises
        CommandError with the server's reason (`bad filter`, `invalid bookmark`, ...).
        """
        if self._conn.state != "logged_on":
            raise self._conn.not_ready("subscribe")
        opts = _opts_text(options)
        bm = None if bookmark is None else str(bookmark)
        sub, existing = self.open_sub(sub_id, topic, bm, opts, marks)
        cid = self._commands.new_id()
        self.by_cid[cid] = sub
        header = Header(
            c="subscribe", cid=cid, t=topic, sub_id=sub.sub_id, f=filter, bm=bm, o=opts,
            a="processed,completed,persisted" if marks else "processed,completed",
        )  # fmt: skip
        await self.subscribe_request(header, sub, existing, timeout)
        return sub

    def open_sub(
        self, sub_id: str | None, topic: str, bm: str | None, opts: str | None, marks: bool = False
    ) -> tuple[Subscription, Subscription | None]:
        """The Subscription a subscribe command is about to make (registered now: a replay or
        an answer may deliver before the ack arrives), or the one `replace` updates; and that
        existing one, or None. Raises CommandError for a `sub_id` in use without `replace`."""
        replace = opts is not None and "replace" in (o.strip() for o in opts.split(","))
        existing = self.by_id.get(sub_id) if sub_id is not None else None
        if existing is not None and not replace:
            raise CommandError(
                "subscription already exists",
                f"sub_id {sub_id!r} is active on this client; unsubscribe it or pass "
                "options='replace'",
            )
        if sub_id is None:
            sub_id = self.new_sub_id()
        sub = existing or Subscription(
            self,
            sub_id,
            topic,
            bm,
            max_messages=self.max_buffered_messages,
            max_bytes=self.max_buffered_bytes,
            on_full=self.sub_full,
            on_drained=self.sub_drained,
            marks=marks,
        )
        self.by_id[sub_id] = sub
        return sub, existing

    async def subscribe_request(
        self,
        header: Header,
        sub: Subscription,
        existing: Subscription | None,
        timeout: float | None,
    ) -> None:
        """Send a subscribe-like command and wait for `processed`; on a refusal, a timeout or
        a cancel, a new subscription is dropped again (and unsubscribed on the server when its
        answer may still come)."""
        try:
            await self._commands.request(header, "processed", timeout)
        except BaseException as exc:
            if header.cid is not None:
                self.by_cid.pop(header.cid, None)
            if existing is None:
                self.drop(sub)
                sub._finish(_STOP, drop=True)
                if isinstance(exc, (CommandTimeout, asyncio.CancelledError)):
                    self._commands.send_quietly(Header(c="unsubscribe", sub_id=sub.sub_id))
            raise

    async def unsubscribe(self, sub_id: str, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        """Unsubscribe `sub_id` (or `all`). Its iterator stops at once (buffer dropped).

        On a closed connection this only ends the subscription(s) locally.
        """
        ids = list(self.by_id) if sub_id == "all" else [sub_id]
        for sid in ids:
            sub = self.by_id.get(sid)
            if sub is not None:
                self.drop(sub)
                sub._finish(_STOP, drop=True)
        if self._conn.transport is None or self._conn.state != "logged_on":
            return
        await self._commands.request(Header(c="unsubscribe", sub_id=sub_id), "processed", timeout)

    def subscriptions(self) -> list[Subscription]:
        return list(self.by_id.values())

    def drop(self, sub: Subscription) -> None:
        if self.by_id.get(sub.sub_id) is sub:
            del self.by_id[sub.sub_id]
        for cid in [c for c, s in self.by_cid.items() if s is sub]:
            del self.by_cid[cid]

    def sub_full(self, sub: Subscription) -> None:
        self._full_subs.add(sub)
        if self._conn.pause_reading():
            log.debug("paused reading: subscription %s buffer is full", sub.sub_id)

    def sub_drained(self, sub: Subscription) -> None:
        self._full_subs.discard(sub)
        if not self._full_subs:
            self._conn.resume_reading()

    # ================================================================ internals

    def new_sub_id(self) -> str:
        while True:
            sid = f"s{self._commands.new_id()}"
            if sid not in self.by_id:
                return sid

    def deliver_many(self, header: Header, body: bytes, sids: str) -> None:
        msg = Message(header.t, body, header.bm, header.sub_id, sids, header.ts, header.x,
                      header.lp, header)  # fmt: skip
        seen = False
        for sid in sids.split(","):
            sub = self.by_id.get(sid)
            if sub is not None:
                sub._push(msg if sid == msg.sub_id else _replace(msg, sub_id=sid))
                seen = True
        if not seen:
            self.stray_messages += 1

    def end_all(self, err: Disconnected) -> None:
        end = _STOP if self._conn.user_closed else err  # a clean stop when the application closed
        for sub in list(self.by_id.values()):
            sub._finish(end, drop=False)
        self.by_id.clear()
        self.by_cid.clear()
        self._full_subs.clear()
