"""The subscriptions part of `Client`: subscribe, unsubscribe, delivery and flow control.

`ClientSubscriptions` (a base of `Client`, built on `ClientCommands`) owns the subscriptions of
one connection, by `sub_id` and by the `cid` of the subscribe command (a `completed` ack may
name either). A subscription is registered before its subscribe is sent, so deliveries that
race the ack are routed; a delivery whose `sids` lists several subscriptions is handed to each
one; a delivery for no known subscription counts in `stray_messages`.

Flow control: while any subscription's buffer is full, reading from the socket is paused
(`_sub_full` / `_sub_drained`, called by the `Subscription`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import msgspec

from protocol.headers import Header

from .client_commands import DEFAULT_TIMEOUT, ClientCommands, _opts_text
from .errors import CommandError, CommandTimeout, Disconnected
from .message import Message
from .subscription import Subscription

__all__ = ["ClientSubscriptions"]

log = logging.getLogger("tickertape.client")

_replace = msgspec.structs.replace


class ClientSubscriptions(ClientCommands):
    """Subscriptions of one connection (see the module docstring). Part of `Client`."""

    def _init_subscriptions(self, max_buffered_messages: int, max_buffered_bytes: int) -> None:
        self.max_buffered_messages = max_buffered_messages
        self.max_buffered_bytes = max_buffered_bytes
        self.stray_messages = 0  # deliveries for no known subscription (e.g. after unsubscribe)
        self._subs: dict[str, Subscription] = {}
        self._subs_by_cid: dict[str, Subscription] = {}
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
        if self._state != "logged_on":
            raise self._not_ready("subscribe")
        opts = _opts_text(options)
        bm = None if bookmark is None else str(bookmark)
        sub, existing = self._open_sub(sub_id, topic, bm, opts, marks)
        cid = self._new_id()
        self._subs_by_cid[cid] = sub
        header = Header(
            c="subscribe", cid=cid, t=topic, sub_id=sub.sub_id, f=filter, bm=bm, o=opts,
            a="processed,completed,persisted" if marks else "processed,completed",
        )  # fmt: skip
        await self._subscribe_request(header, sub, existing, timeout)
        return sub

    def _open_sub(
        self, sub_id: str | None, topic: str, bm: str | None, opts: str | None, marks: bool = False
    ) -> tuple[Subscription, Subscription | None]:
        """The Subscription a subscribe command is about to make (registered now: a replay or
        an answer may deliver before the ack arrives), or the one `replace` updates; and that
        existing one, or None. Raises CommandError for a `sub_id` in use without `replace`."""
        replace = opts is not None and "replace" in (o.strip() for o in opts.split(","))
        existing = self._subs.get(sub_id) if sub_id is not None else None
        if existing is not None and not replace:
            raise CommandError(
                "subscription already exists",
                f"sub_id {sub_id!r} is active on this client; unsubscribe it or pass "
                "options='replace'",
            )
        if sub_id is None:
            sub_id = self._new_sub_id()
        sub = existing or Subscription(
            self,
            sub_id,
            topic,
            bm,
            max_messages=self.max_buffered_messages,
            max_bytes=self.max_buffered_bytes,
            on_full=self._sub_full,
            on_drained=self._sub_drained,
            marks=marks,
        )
        self._subs[sub_id] = sub
        return sub, existing

    async def _subscribe_request(
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
            await self._request(header, "processed", timeout)
        except BaseException as exc:
            if header.cid is not None:
                self._subs_by_cid.pop(header.cid, None)
            if existing is None:
                self._drop_sub(sub)
                sub._end_stop(drop=True)
                if isinstance(exc, (CommandTimeout, asyncio.CancelledError)):
                    self._send_quietly(Header(c="unsubscribe", sub_id=sub.sub_id))
            raise

    async def unsubscribe(self, sub_id: str, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        """Unsubscribe `sub_id` (or `all`). Its iterator stops at once (buffer dropped).

        On a closed connection this only ends the subscription(s) locally.
        """
        ids = list(self._subs) if sub_id == "all" else [sub_id]
        for sid in ids:
            sub = self._subs.get(sid)
            if sub is not None:
                self._drop_sub(sub)
                sub._end_stop(drop=True)
        if self._transport is None or self._state != "logged_on":
            return
        await self._request(Header(c="unsubscribe", sub_id=sub_id), "processed", timeout)

    def subscriptions(self) -> list[Subscription]:
        return list(self._subs.values())

    def _drop_sub(self, sub: Subscription) -> None:
        if self._subs.get(sub.sub_id) is sub:
            del self._subs[sub.sub_id]
        for cid in [c for c, s in self._subs_by_cid.items() if s is sub]:
            del self._subs_by_cid[cid]

    def _sub_full(self, sub: Subscription) -> None:
        self._full_subs.add(sub)
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()
            log.debug("paused reading: subscription %s buffer is full", sub.sub_id)

    def _sub_drained(self, sub: Subscription) -> None:
        self._full_subs.discard(sub)
        if not self._full_subs and self._reading_paused:
            self._reading_paused = False
            if self._transport is not None:
                self._transport.resume_reading()
                self._last_rx = self._loop.time()  # silence while paused was ours

    # ================================================================ internals

    def _new_sub_id(self) -> str:
        while True:
            sid = f"s{self._new_id()}"
            if sid not in self._subs:
                return sid

    def _deliver_many(self, header: Header, body: bytes, sids: str) -> None:
        msg = Message(header.t, body, header.bm, header.sub_id, sids, header.ts, header.x,
                      header.lp, header)  # fmt: skip
        seen = False
        for sid in sids.split(","):
            sub = self._subs.get(sid)
            if sub is not None:
                sub._push(msg if sid == msg.sub_id else _replace(msg, sub_id=sid))
                seen = True
        if not seen:
            self.stray_messages += 1

    def _end_subscriptions(self, err: Disconnected) -> None:
        for sub in list(self._subs.values()):
            if self._user_closed:
                sub._end_stop(drop=False)
            else:
                sub._end_failed(err)
        self._subs.clear()
        self._subs_by_cid.clear()
        self._full_subs.clear()
