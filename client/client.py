"""The asyncio client: one `Client` is one TCP connection to a Tickertape server.

```python
async with Client("pub-1", server="127.0.0.1:9007") as c:      # connect + logon
    await c.publish("orders", {"id": 1})                        # returns the sequence number
    await c.publish_flush()                                     # everything persisted
    async with await c.subscribe("orders", bookmark="0") as sub:
        async for msg in sub:
            ...
```

States of a Client (a Client is single-use: after it closes, make a new one):

```
new --connect()--> connected --logon()--> logged on --close() / server closes / error--> closed
```

Only `logon` may be sent before logon (PROTOCOL.md §3). On close every pending command fails
with `Disconnected`, every subscription ends (`Disconnected` after its buffered messages, or a
clean stop when the application closed the client), and later calls raise `Disconnected`.

Wire decisions taken here (PROTOCOL.md leaves them to the client):

- Every command that waits for an ack carries a `cid` (a decimal counter); acks are matched
  by `cid` and by the awaited type. A failure ack of any type for that `cid` fails the command.
- Publishes carry `s` (numbered from the logon's `s` + 1 unless given) and `a: "persisted"`
  (plus `processed` with `track_duplicates=True`); they carry no `cid`. The conflated persisted
  acks are applied by `PublishTracker` (client/publish.py).
- Subscriptions always send a `sub_id` (generated here when not given) so deliveries that race
  the subscribe ack are routed, and always ask for `processed,completed`.
- A delivery whose `sids` lists several of this client's subscriptions is handed to each one.
- Writes are coalesced: every frame written during one event-loop iteration goes out in one
  `transport.write` (at once past 256 KiB), so a burst of publishes is one syscall, not one
  each. Order across commands is kept (a flush after publishes is sent after them).
- Client-side heartbeats: after `start_heartbeat(i)` a `beat` is sent every `i` seconds and in
  answer to each server heartbeat; no bytes from the server for `2 * i` (or the `timeout`
  given) closes the connection with reason `heartbeat` (not counted while reading is paused
  for a full subscription).
- A subscription placed with `marks=True` also asks for `persisted` acks; the server's periodic
  ones (`{"a":"persisted","sub_id":..,"bm":..}`) are queued in order with its messages as
  `PersistedBookmark` items (what bookmark stores need). Without it they are ignored.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable, Iterable
from typing import Self

import msgspec

from protocol.framing import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode_frame, frame_bytes
from protocol.headers import Header, encode_header

from .address import parse_address
from .errors import (
    ClientError,
    CommandError,
    CommandTimeout,
    ConnectFailed,
    Disconnected,
    PublishFailed,
)
from .message import LogonResult, Message, PersistedBookmark
from .publish import PublishTracker
from .subscription import Subscription

__all__ = ["DEFAULT_TIMEOUT", "VERSION", "Client"]

log = logging.getLogger("tickertape.client")

VERSION = "tickertape-py/0.1.0"
DEFAULT_TIMEOUT = 30.0
"""Seconds a command waits for its ack unless told otherwise (flushes wait forever by default)."""

_OUT_LIMIT = 256 * 1024  # coalesced bytes written at once instead of at the end of the iteration
_WRITE_HIGH = 4 * 1024 * 1024  # transport buffer high-water mark: above it publish() waits
# failure reasons after which the server closes the connection (PROTOCOL.md §9)
_DISCONNECT_REASONS = frozenset(
    {"bad frame", "unknown command", "logon required", "auth failure", "name in use"}
)
_BEAT = encode_frame(Header(c="heartbeat", o="beat"))
_json_encode = msgspec.json.Encoder().encode
_replace = msgspec.structs.replace

BodyLike = bytes | bytearray | memoryview | str | dict | list


def _body_bytes(body: object) -> bytes:
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, (dict, list)):
        return _json_encode(body)
    raise TypeError(f"body must be bytes, str or a JSON dict/list, not {type(body).__name__}")


def _opts_text(options: str | Iterable[str] | None) -> str | None:
    if options is None or isinstance(options, str):
        return options or None
    return ",".join(options) or None


class _Waiter:
    __slots__ = ("ack", "command", "fut")

    def __init__(self, fut: asyncio.Future, ack: str, command: str):
        self.fut = fut
        self.ack = ack
        self.command = command


class _ClientProtocol(asyncio.Protocol):
    """Forwards transport events to its Client; holds no state of its own."""

    __slots__ = ("_client",)

    def __init__(self, client: Client):
        self._client = client

    def connection_made(self, transport):
        self._client._connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._client._data_received(data)

    def eof_received(self):
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc):
        self._client._connection_lost(exc)

    def pause_writing(self):
        self._client._write_paused = True

    def resume_writing(self):
        self._client._resume_writing()


class Client:
    """An asyncio client for one connection. See the module docstring for states and decisions.

    Bounds: `max_inflight` unacknowledged publishes (publish() waits when reached), a
    transport write buffer of 4 MiB (publish() waits above it), and per subscription
    `max_buffered_messages` / `max_buffered_bytes` (reading pauses while one is full).

    Callbacks (called on the event loop; an exception in one is logged, not raised):
    `on_error(exc)` for failures that belong to no awaiting call (publish failures,
    failure acks without a `cid`); `on_duplicate(seq)` for each publish acknowledged with
    `reason: duplicate` (only with `track_duplicates=True`, which asks for processed acks);
    `on_persisted(seq)` for each successful conflated persisted ack of publishes (everything
    through `seq` is durable: what a publish store needs).
    """

    def __init__(
        self,
        name: str,
        *,
        user_id: str | None = None,
        password: str | None = None,
        server: str | None = None,
        max_inflight: int = 10_000,
        max_buffered_messages: int = 10_000,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        max_message_size: int = DEFAULT_MAX_FRAME,
        track_duplicates: bool = False,
        on_error: Callable[[ClientError], None] | None = None,
        on_duplicate: Callable[[int | None], None] | None = None,
        on_persisted: Callable[[int], None] | None = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError("client name must be a non-empty string (it identifies the publisher)")
        self.name = name
        self.user_id = user_id
        self.password = password
        self.server = server
        self.max_buffered_messages = max_buffered_messages
        self.max_buffered_bytes = max_buffered_bytes
        self.on_error = on_error
        self.on_duplicate = on_duplicate
        self.on_persisted = on_persisted
        self.duplicate_count = 0
        self.stray_messages = 0  # deliveries for no known subscription (e.g. after unsubscribe)
        self.logon_result: LogonResult | None = None

        self._publish_acks = "processed,persisted" if track_duplicates else "persisted"
        self._tracker = PublishTracker(max_inflight)
        self._decoder = FrameDecoder(max_message_size)
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = "new"  # new | connected | logged_on | closed
        self._closed_exc: Disconnected | None = None
        self._closing_reason: tuple[str, str] | None = None  # set when we close or abort
        self._server_failure: tuple[str, str] | None = None  # a failure the server closes after
        self._user_closed = False
        self._lost: asyncio.Future | None = None
        self._waiters: dict[str, _Waiter] = {}
        self._next_id = 0
        self._subs: dict[str, Subscription] = {}
        self._subs_by_cid: dict[str, Subscription] = {}
        self._full_subs: set[Subscription] = set()
        self._reading_paused = False
        self._write_paused = False
        self._drain_fut: asyncio.Future | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._prefixes: dict[str, bytes] = {}
        self._hb_task: asyncio.Task | None = None
        self._last_rx = 0.0

    def __repr__(self) -> str:
        return f"<Client {self.name!r} {self._state}>"

    # ================================================================ connection

    async def connect(self, address: str | None = None, *, timeout: float = 10.0) -> Client:
        """Open the TCP connection (`host:port` or `tcp://host:port/`; default the `server`
        given to the constructor). Raises `ConnectFailed`. Returns self."""
        if self._state != "new":
            raise ClientError(f"connect() on a {self._state} client; a Client is one connection")
        address = address or self.server
        if not address:
            raise ValueError("no server address: pass connect('host:port') or Client(server=...)")
        host, port = parse_address(address)
        self.server = address
        loop = self._loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: _ClientProtocol(self), host, port)
        except TimeoutError:
            raise ConnectFailed(address, f"no answer within {timeout:g}s") from None
        except OSError as exc:
            # several addresses (localhost: ::1 and 127.0.0.1) fail as one plain OSError
            refused = isinstance(exc, ConnectionRefusedError)
            refused = refused or f"[Errno {errno.ECONNREFUSED}]" in str(exc)
            reason = "connection refused" if refused else (exc.strerror or str(exc))
            raise ConnectFailed(address, reason) from None
        return self

    async def logon(
        self, timeout: float | None = 10.0, *, ack_conflation: str | None = None
    ) -> LogonResult:
        """Log on as `name`. Returns the server's highest stored sequence for this name (and
        its bookmark); publish() numbers from there. Raises CommandError (`auth failure`,
        `name in use`), CommandTimeout, Disconnected."""
        if self._state != "connected":
            raise ClientError(f"logon() on a {self._state} client; connect() first, logon once")
        header = Header(
            c="logon",
            client_name=self.name,
            user_id=self.user_id,
            pw=self.password,
            v=VERSION,
            o=f"ack_conflation={ack_conflation}" if ack_conflation else None,
        )
        ack = await self._request(header, "processed", timeout)
        seq = ack.s or 0
        self._tracker.reset(seq)
        self._state = "logged_on"
        self.logon_result = LogonResult(seq, ack.bm)
        return self.logon_result

    async def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered, close the connection and wait until it is closed.

        Does not wait for persisted acks: call publish_flush() first for that. Subscriptions
        stop cleanly after their buffered messages; pending commands fail with Disconnected.
        """
        transport = self._transport
        if transport is None:
            if self._state != "closed":
                self._mark_closed(Disconnected("closed by client"))
            return
        self._user_closed = True
        if self._closing_reason is None:
            self._closing_reason = ("closed by client", "")
        self._flush_out()
        transport.close()
        lost = self._lost
        try:
            await asyncio.wait_for(asyncio.shield(lost), timeout)
        except TimeoutError:
            # the peer does not read what is buffered: drop it instead of waiting forever
            transport.abort()
            await lost

    def abort(self, reason: str, detail: str = "") -> None:
        """Drop the connection at once (nothing buffered is sent): pending commands and
        subscriptions fail with Disconnected(`reason`), as when the connection is lost."""
        self._abort(reason, detail)

    async def wait_closed(self) -> Disconnected | None:
        """Wait until the connection ends; returns why (None if it never opened)."""
        if self._lost is not None:
            await asyncio.shield(self._lost)
        return self._closed_exc

    @property
    def connected(self) -> bool:
        return self._transport is not None

    @property
    def closed_reason(self) -> Disconnected | None:
        return self._closed_exc

    async def __aenter__(self) -> Self:
        if self._state == "new" and self.server:
            await self.connect()
            try:
                await self.logon()
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    # ================================================================ publishing

    @property
    def persisted_seq(self) -> int:
        """Highest sequence the server acknowledged as persisted (covers every lower one)."""
        return self._tracker.persisted_seq

    @property
    def last_seq(self) -> int:
        """Highest sequence published (or known stored at logon)."""
        return self._tracker.last_seq

    @property
    def failed_count(self) -> int:
        """Publishes settled as not persisted (failure acks)."""
        return self._tracker.failed_count

    def unpersisted_count(self) -> int:
        """Publishes sent and not yet acknowledged as persisted (or failed)."""
        return len(self._tracker._inflight)

    async def publish(
        self,
        topic: str,
        body: BodyLike,
        *,
        seq: int | None = None,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> int:
        """Send one publish and return its sequence number; does not wait for the ack.

        Waits only when `max_inflight` publishes are unacknowledged or the socket's write
        buffer is full. `body`: bytes as-is, str as UTF-8, dict/list encoded as JSON.
        Raises Disconnected if the connection is gone, ClientError before logon.
        """
        tracker = self._tracker
        # hot path: read the tracker's deque directly instead of through a method call
        if len(tracker._inflight) >= tracker.max_inflight:
            await tracker.wait_window()
        if self._write_paused:
            await self._wait_writable()
        if self._state != "logged_on":
            raise self._not_ready("publish")
        if type(body) is not bytes:
            body = _body_bytes(body)
        if seq is None:
            seq = tracker.last_seq + 1
        if expiration is None and correlation_id is None:
            prefix = self._prefixes.get(topic)
            if prefix is None:
                prefix = self._publish_prefix(topic)
            header = prefix + b"%d}" % seq
        else:
            header = encode_header(
                Header(
                    c="publish",
                    t=topic,
                    a=self._publish_acks,
                    s=seq,
                    x=correlation_id,
                    e=expiration,
                )
            )
        self._write(frame_bytes(header, body))
        tracker.sent(seq)
        return seq

    def can_publish(self) -> bool:
        """True when publish_nowait() may be called: logged on, the in-flight window has room
        and the socket's write buffer is below its high-water mark."""
        return (
            self._state == "logged_on"
            and not self._write_paused
            and len(self._tracker._inflight) < self._tracker.max_inflight
        )

    async def wait_publishable(self) -> None:
        """Wait until can_publish() (raises Disconnected if the connection ends first)."""
        while True:
            if self._state != "logged_on":
                raise self._not_ready("publish")
            if len(self._tracker._inflight) >= self._tracker.max_inflight:
                await self._tracker.wait_window()
            elif self._write_paused:
                await self._wait_writable()
            else:
                return

    def try_publish(
        self,
        topic: str,
        body: bytes,
        seq: int,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> bool:
        """Send one publish with sequence `seq` if that needs no waiting (logged on, room in
        the window and the write buffer); returns False, sending nothing, otherwise."""
        tracker = self._tracker
        if (
            self._state != "logged_on"
            or self._write_paused
            or len(tracker._inflight) >= tracker.max_inflight
        ):
            return False
        if expiration is None and correlation_id is None:
            prefix = self._prefixes.get(topic)
            if prefix is None:
                prefix = self._publish_prefix(topic)
            self._write(frame_bytes(prefix + b"%d}" % seq, body))
        else:
            self.publish_nowait(topic, body, seq, expiration, correlation_id)
            return True
        tracker.sent(seq)
        return True

    def publish_nowait(
        self,
        topic: str,
        body: bytes,
        seq: int,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Send one publish with sequence `seq` now, without waiting (check can_publish()
        first: this ignores the window). For callers that number publishes themselves, such
        as the HAClient's publish store. Raises Disconnected / ClientError when not logged on.
        """
        if self._state != "logged_on":
            raise self._not_ready("publish")
        if expiration is None and correlation_id is None:
            prefix = self._prefixes.get(topic)
            if prefix is None:
                prefix = self._publish_prefix(topic)
            header = prefix + b"%d}" % seq
        else:
            h = Header(c="publish", t=topic, a=self._publish_acks, s=seq, x=correlation_id,
                       e=expiration)  # fmt: skip
            header = encode_header(h)
        self._write(frame_bytes(header, body))
        self._tracker.sent(seq)

    def _publish_prefix(self, topic: str) -> bytes:
        # The common publish header differs only in `s`: encode the rest once per topic and
        # append the number (halves the per-publish cost against a Header encode).
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty string, got {topic!r}")
        if len(self._prefixes) >= 1024:
            self._prefixes.clear()  # bounded: a publisher to many topics re-encodes now and then
        full = encode_header(Header(c="publish", t=topic, a=self._publish_acks))
        prefix = self._prefixes[topic] = full[:-1] + b',"s":'
        return prefix

    async def publish_flush(self, timeout: float | None = None) -> None:
        """Wait until everything published so far is acknowledged as persisted.

        Raises PublishFailed if any of it was refused (`journal unavailable`) — or if a refusal
        arrived since the last flush and nobody was told yet — CommandTimeout after `timeout`,
        Disconnected if the connection ends first.
        """
        await self._tracker.flush(timeout)

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
        cid = self._new_id()
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
        # registered before sending: a replay may deliver before the ack arrives
        self._subs[sub_id] = sub
        self._subs_by_cid[cid] = sub
        header = Header(
            c="subscribe", cid=cid, t=topic, sub_id=sub_id, f=filter, bm=bm, o=opts,
            a="processed,completed,persisted" if marks else "processed,completed",
        )  # fmt: skip
        try:
            await self._request(header, "processed", timeout)
        except BaseException as exc:
            self._subs_by_cid.pop(cid, None)
            if existing is None:
                self._drop_sub(sub)
                sub._end_stop(drop=True)
                if isinstance(exc, (CommandTimeout, asyncio.CancelledError)):
                    self._send_quietly(Header(c="unsubscribe", sub_id=sub_id))
            raise
        return sub

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

    # ================================================================ other commands

    async def execute(
        self,
        header: Header,
        body: bytes = b"",
        *,
        ack: str = "processed",
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> Header:
        """Send any command and return its `ack`-type ack header.

        A `cid` is assigned if the header has none, and `ack` is added to its `a`. Raises
        CommandError on a failure ack, CommandTimeout, Disconnected.
        """
        if self._state == "connected" and header.c != "logon":
            raise self._not_ready(header.c or "execute")
        return await self._request(header, ack, timeout, body)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until the server has processed every earlier command of this connection."""
        await self.execute(Header(c="flush"), ack="completed", timeout=timeout)

    async def sow_delete(
        self,
        topic: str,
        bookmarks: str | Iterable[object] | None = None,
        *,
        filter: str | None = None,
        options: str | Iterable[str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> int:
        """Acknowledge (delete) queue messages by bookmarks or by filter; returns the stats
        ack's `records_deleted`. `options`: `cancel` or `expire` (PROTOCOL.md §8)."""
        if (bookmarks is None) == (filter is None):
            raise ValueError("sow_delete needs exactly one of bookmarks or filter")
        bm = None
        if bookmarks is not None:
            bm = bookmarks if isinstance(bookmarks, str) else ",".join(map(str, bookmarks))
        header = Header(c="sow_delete", t=topic, bm=bm, f=filter, o=_opts_text(options),
                        a="processed,stats")  # fmt: skip
        ack = await self.execute(header, ack="stats", timeout=timeout)
        return ack.records_deleted or 0

    # ================================================================ heartbeats

    async def send_heartbeat(self) -> None:
        """Send one `beat` now."""
        if self._state != "logged_on":
            raise self._not_ready("heartbeat")
        self._write(_BEAT)
        if self._write_paused:
            await self._wait_writable()

    def start_heartbeat(self, interval: float, timeout: float | None = None) -> None:
        """Ask the server for heartbeats every `interval` seconds, beat at that pace, and close
        with reason `heartbeat` when the server is silent for `timeout` seconds (default two
        intervals; the server closes a client silent for two intervals whatever this is)."""
        if self._state != "logged_on":
            raise self._not_ready("heartbeat")
        if not interval >= 0.01:
            raise ValueError(f"heartbeat interval must be >= 0.01 seconds, got {interval!r}")
        if timeout is None:
            timeout = 2 * interval
        elif not timeout > 0:
            raise ValueError(f"heartbeat timeout must be > 0 seconds, got {timeout!r}")
        text = f"{interval:.3f}".rstrip("0").rstrip(".")
        self._write(encode_frame(Header(c="heartbeat", o=f"start,{text}")))
        self._last_rx = self._loop.time()
        if self._hb_task is not None:
            self._hb_task.cancel()
        self._hb_task = self._loop.create_task(self._heartbeat_loop(interval, timeout))

    async def _heartbeat_loop(self, interval: float, timeout: float) -> None:
        loop = self._loop
        next_beat = loop.time() + interval
        tick = min(interval, timeout) / 2
        while self._transport is not None:
            await asyncio.sleep(tick)
            now = loop.time()
            if self._reading_paused:
                self._last_rx = now  # we stopped reading; the server is not the silent one
            elif now - self._last_rx > timeout:
                self._abort(
                    "heartbeat",
                    f"no bytes from the server for {now - self._last_rx:.1f}s "
                    f"(heartbeat interval {interval:g}s, timeout {timeout:g}s); check the "
                    "server and the network",
                )
                return
            if now >= next_beat and self._transport is not None:
                self._write(_BEAT)
                next_beat = now + interval

    # ================================================================ internals: requests

    def _new_id(self) -> str:
        self._next_id += 1
        return str(self._next_id)

    def _new_sub_id(self) -> str:
        while True:
            sid = f"s{self._new_id()}"
            if sid not in self._subs:
                return sid

    def _not_ready(self, what: str) -> ClientError:
        if self._state == "closed":
            return self._closed_exc or Disconnected("closed by client")
        if self._state == "new":
            return ClientError(f"{what}: not connected; call await client.connect(address) first")
        return ClientError(f"{what}: not logged on; call await client.logon() first")

    async def _request(
        self, header: Header, ack: str, timeout: float | None, body: bytes = b""
    ) -> Header:
        """Send `header` and wait for its `ack`-type ack (a cid is assigned if it has none,
        and `ack` is added to its `a`)."""
        if self._transport is None:
            raise self._not_ready(header.c or "command")
        changes: dict[str, str] = {}
        if header.cid is None:
            changes["cid"] = self._new_id()
        acks = header.a.split(",") if header.a else []
        if ack not in acks:
            changes["a"] = ",".join([*acks, ack])
        if changes:
            header = _replace(header, **changes)
        cid = header.cid
        fut = self._loop.create_future()
        waiter = self._waiters[cid] = _Waiter(fut, ack, header.c or "command")
        self._write(encode_frame(header, body))
        try:
            if timeout is None:
                return await fut
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise CommandTimeout(f"{header.c} (cid {cid})", timeout, f"{ack} ack") from None
        finally:
            if self._waiters.get(cid) is waiter:
                del self._waiters[cid]

    # ================================================================ internals: writing

    def _write(self, data: bytes) -> None:
        if self._transport is None:
            raise self._not_ready("write")
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _OUT_LIMIT:
            self._flush_out()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_out)

    def _flush_out(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_bytes = 0
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def _send_quietly(self, header: Header) -> None:
        """Fire-and-forget (cleanup after a cancelled or timed-out command)."""
        if self._transport is not None:
            self._write(encode_frame(header))

    async def _wait_writable(self) -> None:
        while self._write_paused:
            if self._transport is None:
                raise self._not_ready("write")
            fut = self._drain_fut
            if fut is None or fut.done():
                fut = self._drain_fut = self._loop.create_future()
            await asyncio.shield(fut)

    def _resume_writing(self) -> None:
        self._write_paused = False
        fut, self._drain_fut = self._drain_fut, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ================================================================ internals: transport events

    def _connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._state = "connected"
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        self._last_rx = self._loop.time()

    def _data_received(self, data: bytes) -> None:
        self._last_rx = self._loop.time()
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            self._dispatch(exc.frames)
            self._abort("bad frame", f"from the server: {exc}")
            return
        self._dispatch(frames)

    def _dispatch(self, frames: list[tuple[Header, bytes]]) -> None:
        subs = self._subs
        for header, body in frames:
            c = header.c
            if c == "p":
                sids = header.sids
                if sids is None or "," not in sids:
                    sub = subs.get(header.sub_id or sids)
                    if sub is not None:
                        msg = Message(header.t, body, header.bm, header.sub_id, sids, header.ts,
                                      header.x, header.lp, header)  # fmt: skip
                        sub._push(msg)
                    else:
                        self.stray_messages += 1
                else:
                    self._deliver_many(header, body, sids)
            elif c == "ack":
                self._on_ack(header)
            elif c == "heartbeat":
                if self._transport is not None:
                    self._write(_BEAT)
            else:
                log.debug("ignoring %r frame from the server", c)

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

    def _on_ack(self, h: Header) -> None:
        a = h.a
        cid = h.cid
        if cid is not None:
            w = self._waiters.get(cid)
            if w is not None:
                if h.status == "failure":
                    del self._waiters[cid]
                    if h.reason in _DISCONNECT_REASONS:
                        # e.g. a refused logon: the server closes next, and this is why
                        self._server_failure = (h.reason, f"{w.command} refused")
                    if not w.fut.done():
                        w.fut.set_exception(
                            CommandError(h.reason or "unknown", f"{w.command} refused (cid {cid})")
                        )
                    return
                if a == w.ack:
                    del self._waiters[cid]
                    if not w.fut.done():
                        w.fut.set_result(h)
                    return
        if a == "persisted" and cid is None:
            if h.sub_id is not None and h.bm is not None:
                sub = self._subs.get(h.sub_id)
                if sub is not None:
                    sub._push_mark(PersistedBookmark(h.sub_id, h.bm))
                return
            if h.status == "failure":
                self._report(self._tracker.failed(h.reason or "unknown", h.s))
            elif h.s is not None:
                self._tracker.persisted(h.s)
                if self.on_persisted is not None:
                    try:
                        self.on_persisted(h.s)
                    except Exception:
                        log.exception("on_persisted callback failed")
            return
        if a == "completed":
            sub = self._subs.get(h.sub_id) if h.sub_id else None
            if sub is None and cid is not None:
                sub = self._subs_by_cid.get(cid)
            if sub is not None and sub._complete():
                self._drop_sub(sub)  # a range ended: the server removed the subscription
            return
        if cid is None and a == "processed" and h.status != "failure":
            if h.reason == "duplicate":
                self.duplicate_count += 1
                if self.on_duplicate is not None:
                    try:
                        self.on_duplicate(h.s)
                    except Exception:
                        log.exception("on_duplicate callback failed")
            return
        if h.status == "failure":
            # nobody waits for it: a publish refused on its processed ack, or a command the
            # server could not attribute (`bad frame`, `logon required`); the connection
            # usually closes next, and the reason goes into the Disconnected detail
            what = f"{h.c} ack for cid {cid}" if cid else "a command without cid"
            exc = CommandError(h.reason or "unknown", f"server refused {what} ({a or 'no type'})")
            if h.reason in _DISCONNECT_REASONS:
                self._server_failure = (h.reason, str(exc))
            self._report(exc)

    def _report(self, exc: ClientError) -> None:
        if isinstance(exc, PublishFailed):
            log.warning("%s", exc)
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:
                log.exception("on_error callback failed")

    def _abort(self, reason: str, detail: str) -> None:
        """Close at once with `reason` (bad frame from the server, silent server)."""
        if self._closing_reason is None:
            self._closing_reason = (reason, detail)
        log.warning("closing connection to %s: %s (%s)", self.server, reason, detail)
        if self._transport is not None:
            self._transport.abort()

    def _connection_lost(self, exc: BaseException | None) -> None:
        if self._closing_reason is not None:
            reason, detail = self._closing_reason
        elif self._server_failure is not None:
            # the server closes after a failure it could not attribute (`bad frame`,
            # `logon required`): that reason is the disconnect reason (PROTOCOL.md §9)
            reason, detail = self._server_failure
        elif exc is None:
            reason, detail = "closed by server", ""
        else:
            reason, detail = "connection lost", str(exc) or type(exc).__name__
        self._mark_closed(Disconnected(reason, detail))

    def _mark_closed(self, err: Disconnected) -> None:
        self._transport = None
        self._state = "closed"
        self._closed_exc = err
        self._out.clear()
        self._out_bytes = 0
        waiters, self._waiters = self._waiters, {}
        for w in waiters.values():
            if not w.fut.done():
                w.fut.set_exception(err)
        self._tracker.close(err)
        for sub in list(self._subs.values()):
            if self._user_closed:
                sub._end_stop(drop=False)
            else:
                sub._end_failed(err)
        self._subs.clear()
        self._subs_by_cid.clear()
        self._full_subs.clear()
        self._resume_writing()  # blocked publishers wake up and see the closed state
        if self._hb_task is not None:
            self._hb_task.cancel()
            self._hb_task = None
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
