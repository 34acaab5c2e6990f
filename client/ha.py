"""HAClient: a Client that reconnects, fails over, republishes and resubscribes by itself.

```python
store = FilePublishStore("pub.store")
async with HAClient("pub-1", servers=["primary:9007", "secondary:9007"],
                    publish_store=store) as c:                 # connect_and_logon()
    await c.publish("orders", {"id": 1})                       # numbered by the store
    await c.publish_flush(timeout=10)                          # persisted on the server
    async for msg in await c.subscribe("orders", bookmark=MOST_RECENT, sub_id="orders-1"):
        ...
        c.discard(msg)                                         # processed
```

States:

```
new --connect_and_logon()--> connecting --> connected <--> reconnecting
connected / reconnecting --close()--> closed
reconnecting --NoServerAvailable / ReconnectGaveUp--> failed
```

The connect sequence (`connect_and_logon()`, and again after every lost connection):

1. Ask the ServerChooser for `current_uri()` and `current_authenticator()`; no URI: raise
   NoServerAvailable with the chooser's `error()` (a reconnect then moves to `failed`).
2. Ask the delay strategy how long to wait, and wait (it raises ReconnectGaveUp past its
   give-up time; the first attempt to a URI after a success is immediate).
3. Connect. On failure: `report_failure` to the chooser, back to 1.
4. Log on (the authenticator gives the password). On failure: `report_failure`, back to 1.
5. `report_success`; reset the delay strategy; start heartbeats if configured.
6. The logon ack's `s` is the highest sequence the server stored for this client name: the
   publish store discards everything through it.
7. Republish everything the store still holds, in sequence order. Publishes the application
   makes meanwhile are stored and sent by the same loop, after them (sequence order on the
   wire is what keeps the server's duplicate detection exact).
8. Re-enter every subscription of the subscription manager that the application still
   consumes: bookmark subscriptions at MOST_RECENT from the bookmark store (with
   `bookmark_not_found=epoch`, so a server that does not know the bookmark replays all it has
   and the store drops what was seen), a `sow_and_subscribe` whose answer is in likewise
   from its point, the others as first placed. A refused one fails its HASubscription; the
   others continue (client/haplace.py's `Placer`).
9. `connected`: waiting calls proceed. A connection lost during 6-8 restarts at 1.

Publishing: `publish()` stores the message (waiting for room while the store is full), then
sends it at once when connected and nothing is queued before it; otherwise the store keeps it
and step 7 or the send loop sends it. A publish made while disconnected returns once stored.
Persisted acks discard from the store. `publish_flush()` waits until everything stored when it
was called is persisted, across reconnects; it raises PublishFailed if the server refused
publishes (they stay in the store and are sent again after the next logon).

Heartbeats: `heartbeat=i` asks the server for a heartbeat every `i` seconds; a connection
silent for `heartbeat_timeout` (default 2 * i) is closed as dead and the sequence above runs.

Ownership: stores and the subscription manager passed in belong to the caller (close them
after the client); the HAClient creates memory ones when none are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self, TypeVar

import msgspec

from .bookmarks import MOST_RECENT, BookmarkStore, MemoryBookmarkStore
from .chooser import DefaultServerChooser, ServerChooser
from .client import DEFAULT_TIMEOUT, Client
from .client_commands import _opts_text
from .client_publish import BodyLike, _body_bytes
from .delay import ExponentialDelayStrategy, ReconnectDelayStrategy
from .errors import (
    ClientError,
    CommandError,
    CommandTimeout,
    ConnectFailed,
    Disconnected,
    NoServerAvailable,
    PublishFailed,
    ReconnectGaveUp,
)
from .halife import Lifecycle
from .haplace import Placer
from .hapublisher import Publisher
from .hasub import HASubscription
from .message import LogonResult, Message
from .pubstore import MemoryPublishStore, PublishStore
from .submanager import MemorySubscriptionManager, SubscriptionManager, SubscriptionSpec
from .subscription import _STOP

__all__ = ["HAClient"]

log = logging.getLogger("tickertape.client.ha")
_T = TypeVar("_T")


class HAClient:
    """See the module docstring. Keyword options:

    - `servers` (a list of addresses, in failover order) or `chooser` (a ServerChooser).
    - `publish_store` (default MemoryPublishStore()), `bookmark_store` (default
      MemoryBookmarkStore()), `subscription_manager` (default MemorySubscriptionManager()).
    - `delay_strategy` (default ExponentialDelayStrategy(): 50 ms doubling to 250 ms).
    - `heartbeat` / `heartbeat_timeout` seconds; `connect_timeout`, `logon_timeout`.
    - `bookmark_not_found` added to MOST_RECENT placements ("epoch"; None to leave it out).
    - `max_window`: most bookmark-store entries per subscription before next() waits.
    - `on_error(exc)`: failures no call waits for (publish refusals, a failed resubscribe);
      `on_state(state)`: each state change.
    - `client_options`: passed to every Client (max_inflight, max_buffered_messages, ...,
      `tls`: the ssl.SSLContext for `tcps://` servers, client/tls.py).
    """

    def __init__(
        self,
        name: str,
        *,
        servers: Iterable[str] | None = None,
        chooser: ServerChooser | None = None,
        user_id: str | None = None,
        password: str | None = None,
        publish_store: PublishStore | None = None,
        bookmark_store: BookmarkStore | None = None,
        subscription_manager: SubscriptionManager | None = None,
        delay_strategy: ReconnectDelayStrategy | None = None,
        heartbeat: float | None = None,
        heartbeat_timeout: float | None = None,
        connect_timeout: float = 5.0,
        logon_timeout: float = 10.0,
        bookmark_not_found: str | None = "epoch",
        max_window: int = 100_000,
        on_error: Callable[[ClientError], None] | None = None,
        on_state: Callable[[str], None] | None = None,
        **client_options: Any,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError("client name must be a non-empty string (it identifies the publisher)")
        if chooser is not None and servers is not None:
            raise ValueError("pass servers or chooser, not both")
        self.name = name
        self.chooser = chooser or DefaultServerChooser(servers or ())
        self.user_id = user_id
        self.password = password
        self.publish_store = publish_store if publish_store is not None else MemoryPublishStore()
        self.bookmark_store = (
            bookmark_store if bookmark_store is not None else MemoryBookmarkStore()
        )
        self.subscription_manager = subscription_manager or MemorySubscriptionManager()
        self.delay_strategy = delay_strategy or ExponentialDelayStrategy()
        self.heartbeat = heartbeat
        self.heartbeat_timeout = heartbeat_timeout
        self.connect_timeout = connect_timeout
        self.logon_timeout = logon_timeout
        self.bookmark_not_found = bookmark_not_found
        self.max_window = max_window
        self.on_error = on_error
        self.client_options = client_options
        self.reconnects = 0  # connections established after the first
        self.republished = 0  # messages sent again by the connect sequence (step 7)
        self.logon_result: LogonResult | None = None
        self.current_uri: str | None = None
        self.last_error: BaseException | None = None
        self._life = Lifecycle(on_state)  # the state, and the waits for a connection
        self.wait_connected = self._life.wait_connected
        self._client: Client | None = None
        self._publisher = Publisher(self.publish_store, self._check_publish)
        self.publish_flush = self._publisher.flush
        self._placer = Placer(self, self._report)  # the subscriptions, across connections
        self._logged_on_once = False

    def __repr__(self) -> str:
        return f"<HAClient {self.name!r} {self._life.state} {self.current_uri}>"

    # ================================================================ state

    @property
    def state(self) -> str:
        return self._life.state

    @property
    def connected(self) -> bool:
        return self._life.state == "connected"

    @property
    def client(self) -> Client | None:
        """The Client of the current connection (None between connections)."""
        return self._client

    def _report(self, exc: ClientError) -> None:
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:
                log.exception("on_error callback failed")

    # ================================================================ connecting

    async def connect_and_logon(self, timeout: float | None = None) -> LogonResult:
        """Run the connect sequence (module docstring) until connected; then keep the client
        connected in the background. With `timeout`, give up after that many seconds (every
        server is tried at least once) and raise the last ConnectFailed / CommandError.
        Raises NoServerAvailable / ReconnectGaveUp as the chooser / strategy decide."""
        if self._life.state != "new":
            raise ClientError(f"connect_and_logon() on a {self._life.state} HAClient")
        loop = asyncio.get_running_loop()
        self._life.start()
        try:
            logon = await self._establish(None if timeout is None else loop.time() + timeout)
        except BaseException:
            self._life.set("new")
            raise
        self._life.supervisor = loop.create_task(self._supervise(), name=f"ha-{self.name}")
        return logon

    def _new_client(self, password: str | None) -> Client:
        return Client(
            self.name,
            user_id=self.user_id,
            password=password,
            on_error=self._on_client_error,
            on_persisted=self._publisher.on_persisted,
            **self.client_options,
        )

    def _min_attempts(self) -> int:
        uris = getattr(self.chooser, "uris", None)
        return max(1, len(uris)) if isinstance(uris, list) else 1

    async def _establish(self, deadline: float | None) -> LogonResult:
        """Steps 1-9 of the connect sequence, until one connection gets through them; returns
        its logon result."""
        loop = asyncio.get_running_loop()
        last: BaseException | None = None
        attempts = 0
        while True:
            if self._life.state == "closed":
                raise Disconnected("closed by client")
            uri = self.chooser.current_uri()
            if not uri:
                raise NoServerAvailable(self.chooser.error())
            authenticator = self.chooser.current_authenticator()
            try:
                delay = self.delay_strategy.next_delay(uri)
            except ReconnectGaveUp as exc:
                raise ReconnectGaveUp(exc.elapsed, exc.limit, last) from last
            past = deadline is not None and loop.time() + delay > deadline
            if past and attempts >= self._min_attempts():
                assert last is not None, "every attempt that did not return set it"
                raise last
            if delay > 0:
                await asyncio.sleep(delay)
            attempts += 1
            password = authenticator.authenticate(self.user_id, self.password)
            client = self._new_client(password)
            try:
                await client.connect(uri, timeout=self.connect_timeout)
                logon = await client.logon(timeout=self.logon_timeout)
            except (ConnectFailed, CommandError, CommandTimeout, Disconnected) as exc:
                await client.close()
                last = self.last_error = exc
                self.chooser.report_failure(exc, uri)
                log.info("connect to %s failed: %s", uri, exc)
                continue
            self.chooser.report_success(uri)
            self.delay_strategy.reset()
            try:
                await self._resync(client, uri, logon)
            except Disconnected as exc:
                last = self.last_error = exc
                self.chooser.report_failure(exc, uri)
                log.info("connection to %s lost while resynchronizing: %s", uri, exc)
                self._client = None
                self._publisher.offline()
                continue
            return logon

    async def _resync(self, client: Client, uri: str, logon: LogonResult) -> None:
        """Steps 5-9 on a logged-on connection."""
        if self.heartbeat:
            client.start_heartbeat(self.heartbeat, self.heartbeat_timeout)
        if self._logged_on_once:
            self.reconnects += 1
        self._logged_on_once = True
        self._client = client
        self.current_uri = uri
        self.logon_result = logon
        again = await self._publisher.resync(client, logon.seq)  # steps 6-7
        if again:
            log.info("republished %d message(s) to %s after seq %d", again, uri, logon.seq)
        self.republished += again
        await self._placer.reenter(client)  # step 8
        if self._client is not client or not client.connected:
            raise client.closed_reason or Disconnected("connection lost")
        self._life.set("connected")

    async def _supervise(self) -> None:
        """Wait for the connection to end; run the connect sequence again (module docstring)."""
        while True:
            client = self._client
            if client is None:
                return
            reason = await client.wait_closed()
            if self._life.state == "closed":
                return
            self._publisher.offline()
            self._client = None
            self._life.set("reconnecting")
            log.warning("connection to %s lost (%s); reconnecting", self.current_uri, reason)
            try:
                await self._establish(None)
            except (NoServerAvailable, ReconnectGaveUp) as exc:
                self._fail(exc)
                return
            except Disconnected:
                return  # closed by the application meanwhile

    def _fail(self, exc: ClientError) -> None:
        log.error("HAClient %s stops: %s", self.name, exc)
        self._life.fail(exc)
        for hs in self._placer.subs.values():
            hs._finish(exc)
        self._publisher.fail(exc)
        self._report(exc)

    async def close(self) -> None:
        """Stop reconnecting, end every subscription, close the connection. Stores and the
        subscription manager stay open (they belong to the caller)."""
        if self._life.state == "closed":
            return
        self._life.set("closed")
        for hs in self._placer.subs.values():
            hs._finish(_STOP)
        self._publisher.fail(Disconnected("closed by client"))
        sup, self._life.supervisor = self._life.supervisor, None
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        if sup is not None and sup is not asyncio.current_task():
            sup.cancel()
            with contextlib.suppress(asyncio.CancelledError, ClientError):
                await sup

    async def __aenter__(self) -> Self:
        if self._life.state == "new":
            await self.connect_and_logon()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ================================================================ publishing

    @property
    def persisted_seq(self) -> int:
        return self.publish_store.acked_seq

    @property
    def last_seq(self) -> int:
        return self.publish_store.last_seq

    def unpersisted_count(self) -> int:
        """Messages stored and not yet acknowledged as persisted (in any connection)."""
        return self.publish_store.unpersisted_count()

    def _on_client_error(self, exc: ClientError) -> None:
        if isinstance(exc, PublishFailed):
            self._publisher.on_failure(exc)
        self._report(exc)

    def _check_publish(self) -> None:
        self._life.raise_if_done()
        if not self._logged_on_once:
            raise ClientError("publish before connect_and_logon(): the store's numbering "
                              "starts from the server's logon ack")  # fmt: skip

    async def publish(
        self,
        topic: str,
        body: BodyLike,
        *,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> int:
        """Store and send one message; returns its sequence number (module docstring and
        client/hapublisher.py).

        `body`: bytes as-is, str as UTF-8, dict/list as JSON. Waits for room while the store
        is full and for the socket while connected; returns once stored while disconnected.
        Raises StoreFull for a message larger than the store, ClientError before the first
        connect_and_logon(), the failure once the client failed, Disconnected once closed.
        """
        if type(body) is not bytes:
            body = _body_bytes(body)
        return await self._publisher.publish(topic, body, expiration, correlation_id)

    # ================================================================ subscribing

    async def subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        bookmark: str | None = None,
        options: str | Iterable[str] | None = None,
        sub_id: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> HASubscription:
        """Place a subscription that is re-entered after every reconnect; returns its
        HASubscription once the server accepted it.

        `bookmark`: None for a live subscription; EPOCH, NOW, a bookmark, a list, a
        timestamp, or MOST_RECENT (resume `sub_id` from the bookmark store; EPOCH when the
        store does not know it). A bookmark other than MOST_RECENT starts `sub_id` afresh in
        the store. Give a stable `sub_id` to resume across process restarts. Ranges are
        re-entered as placed. Raises CommandError with the server's reason.
        """
        return await self._place_new(SubscriptionSpec(
            sub_id or f"ha-{os.urandom(6).hex()}", topic, filter, _opts_text(options),
            None if bookmark is None else str(bookmark)), timeout)  # fmt: skip

    async def sow_and_subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        options: str | Iterable[str] | None = None,
        sub_id: str | None = None,
        bookmark: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> HASubscription:
        """Client.sow_and_subscribe, kept across reconnects and failover: the answer's records
        (`header.c == "sow"`), then every change after the answer's point once, on whichever
        server, none lost (client/haplace.py; docs/client.md). Discard each change
        (`discard(msg)`) as for a bookmark subscription; its state is the bookmark store's."""
        return await self._place_new(SubscriptionSpec(
            sub_id or f"ha-{os.urandom(6).hex()}", topic, filter, _opts_text(options),
            bookmark, sow=True), timeout)  # fmt: skip

    async def _place_new(self, spec: SubscriptionSpec, timeout: float | None) -> HASubscription:
        sub_id = spec.sub_id
        existing = self._placer.subs.get(sub_id)
        if existing is not None and existing.active:
            raise CommandError("subscription already exists",
                               f"sub_id {sub_id!r} is active on this client")  # fmt: skip
        hs = HASubscription(self, spec, self._placer.tracking_store(spec), self.max_window)
        self._placer.subs[sub_id] = hs
        try:  # placed again on the next connection if this one is lost
            await self._on_connection(
                lambda c, t: self._placer.place(hs, c, first=True, timeout=t), timeout
            )
        except BaseException:
            if self._placer.subs.get(sub_id) is hs:
                del self._placer.subs[sub_id]
            hs._finish(_STOP)
            raise
        self.subscription_manager.add(spec)
        return hs

    async def restore_subscriptions(self, timeout: float | None = DEFAULT_TIMEOUT
                                    ) -> list[HASubscription]:  # fmt: skip
        """Place every spec of the subscription manager that has no HASubscription in this
        process (after a restart, with a persistent manager); bookmark ones at MOST_RECENT."""
        out = []
        for spec in self.subscription_manager.specs():
            if spec.sub_id not in self._placer.subs:  # a sow_and_subscribe queries again
                if spec.bookmark is not None and not spec.sow:
                    spec = msgspec.structs.replace(spec, bookmark=MOST_RECENT)
                out.append(await self._place_new(spec, timeout))
        return out

    def subscriptions(self) -> list[HASubscription]:
        return list(self._placer.subs.values())

    async def unsubscribe(self, sub_id: str, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        """Stop `sub_id` for good (also after reconnects); its iterator ends at once."""
        hs = self._placer.subs.pop(sub_id, None)
        self.subscription_manager.remove(sub_id)
        if hs is not None:
            hs._finish(_STOP)
        client = self._client
        if client is not None and client.connected:
            # Disconnected: the server drops subscriptions with the connection
            with contextlib.suppress(Disconnected):
                await client.unsubscribe(sub_id, timeout=timeout)

    def discard(self, message: Message) -> bool:
        """Mark a bookmark subscription's message processed (any order)."""
        return self.bookmark_store.discard(message)

    # ================================================================ other commands

    async def _on_connection(
        self, what: Callable[[Client, float | None], Awaitable[_T]], timeout: float | None
    ) -> _T:
        """Run `what(client, seconds left)` on a connection, retrying on the next one if it is
        lost."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            await self.wait_connected(left)
            client = self._client
            assert client is not None, "the connected state always has a client"
            try:
                return await what(client, left)
            except Disconnected:
                await self._after_loss(client)

    async def _after_loss(self, client: Client) -> None:
        """A command on `client` raised Disconnected: wait until the supervisor has let that
        connection go. Until its next turn the state is still connected and the loop above
        takes the same dead Client, whose commands fail without awaiting anything, so a retry
        at once would spin and starve the loop (the supervisor included)."""
        while self._client is client and not client.connected and self._life.state == "connected":
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)

    async def sow_delete(self, topic: str, bookmarks: str | Iterable[object] | None = None, *,
                         filter: str | None = None, options: str | Iterable[str] | None = None,
                         timeout: float | None = DEFAULT_TIMEOUT) -> int:  # fmt: skip
        """Client.sow_delete (acknowledge queue messages) on the current connection, sent
        again on the next one if the connection is lost before the ack."""
        return await self._on_connection(
            lambda c, t: c.sow_delete(topic, bookmarks, filter=filter, options=options, timeout=t),
            timeout,
        )

    async def flush(self, timeout: float | None = None) -> None:
        """Client.flush on the current connection (again on the next if it is lost)."""
        await self._on_connection(lambda c, t: c.flush(timeout=t), timeout)
