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

Only `logon` may be sent before logon (docs/protocol.md §3). On close every pending command fails
with `Disconnected`, every subscription ends (`Disconnected` after its buffered messages, or a
clean stop when the application closed the client), and later calls raise `Disconnected`.

Wire decisions taken here (docs/protocol.md leaves them to the client):

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

A Client is a façade over one object per responsibility, each in its own module and handed
the others it uses: `ClientConnection` (client_conn.py: transport, bytes in and out, heartbeats,
close), `ClientCommands` (client_commands.py: commands matched to acks by `cid`),
`ClientSubscriptions` (client_subscribe.py: subscriptions, delivery, flow control), `ClientSow`
(client_sow.py: SOW queries) and `ClientPublishing` (client_publish.py: publishes and the
in-flight window). Its public methods are those objects' own bound methods (no extra call on
the publish path). This module adds construction, logon and the routing of each frame from the
server to the object it concerns.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Self

from protocol.framing import DEFAULT_MAX_FRAME
from protocol.headers import Header

from .client_commands import DEFAULT_TIMEOUT, DISCONNECT_REASONS, ClientCommands
from .client_conn import BEAT, ClientConnection
from .client_publish import ClientPublishing
from .client_sow import ClientSow
from .client_subscribe import ClientSubscriptions
from .errors import ClientError, CommandError, Disconnected, PublishFailed
from .message import LogonResult, Message, PersistedBookmark

__all__ = ["DEFAULT_TIMEOUT", "VERSION", "Client"]

log = logging.getLogger("tickertape.client")

VERSION = "tickertape-py/0.1.0"


class Client:
    """An asyncio client for one connection. See the module docstring for states and decisions.

    Bounds: `max_inflight` unacknowledged publishes (publish() waits when reached), a
    transport write buffer of 4 MiB (publish() waits above it), and per subscription
    `max_buffered_messages` / `max_buffered_bytes` (reading pauses while one is full).

    TLS: a `tcps://host:port` server is reached over TLS with `tls` (an ssl.SSLContext,
    client/tls.py's `tls_context(ca_file=, certificate=, private_key=)`; without one, the
    system's trust store). `user_id` and `password` go in the logon (`auth failure` when the
    server refuses them). A subscription the server ends (`not entitled` after it reloaded its
    roles) raises CommandError from its next() once its buffer is read.

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
        tls: ssl.SSLContext | None = None,
        max_inflight: int = 10_000,
        max_buffered_messages: int = 10_000,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        max_message_size: int = DEFAULT_MAX_FRAME,
        track_duplicates: bool = False,
        on_error: Callable[[ClientError], None] | None = None,
        on_duplicate: Callable[[int | None], None] | None = None,
        on_persisted: Callable[[int], None] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("client name must be a non-empty string (it identifies the publisher)")
        self.name = name
        self.user_id = user_id
        self.password = password
        self.on_error = on_error
        self.on_duplicate = on_duplicate
        self.on_persisted = on_persisted
        self.logon_result: LogonResult | None = None
        self.duplicate_count = 0  # publishes acknowledged with `reason: duplicate`
        conn = self._conn = ClientConnection(
            server, max_message_size, tls, self._dispatch, self._fail_pending
        )
        cmds = self._commands = ClientCommands(conn)
        pub = self._pub = ClientPublishing(conn, max_inflight, track_duplicates)
        subs = self._subs = ClientSubscriptions(
            conn, cmds, max_buffered_messages, max_buffered_bytes
        )
        sow = self._sow = ClientSow(conn, cmds, subs)
        self._tracker = pub.tracker
        self.close = conn.close
        self.abort = conn.abort
        self.wait_closed = conn.wait_closed
        self.send_heartbeat = conn.send_heartbeat
        self.start_heartbeat = conn.start_heartbeat
        self.execute = cmds.execute
        self.flush = cmds.flush
        self.sow_delete = cmds.sow_delete
        self.publish = pub.publish
        self.can_publish = pub.can_publish
        self.wait_publishable = pub.wait_publishable
        self.try_publish = pub.try_publish
        self.publish_nowait = pub.publish_nowait
        self.publish_flush = pub.tracker.flush
        self.unpersisted_count = pub.unpersisted_count
        self.subscribe = subs.subscribe
        self.unsubscribe = subs.unsubscribe
        self.subscriptions = subs.subscriptions
        self.sow = sow.sow
        self.sow_and_subscribe = sow.sow_and_subscribe

    def __repr__(self) -> str:
        return f"<Client {self.name!r} {self._conn.state}>"

    async def connect(self, address: str | None = None, *, timeout: float = 10.0) -> Self:
        """Open the connection (`host:port`, `tcp://host:port/`, or `tcps://host:port/` for
        TLS with the client's `tls` context; default the `server` given to the constructor).
        Raises `ConnectFailed` (a refused TLS handshake too, with OpenSSL's reason). Returns
        self."""
        await self._conn.connect(address, timeout=timeout)
        return self

    @property
    def server(self) -> str | None:
        """The address given to the constructor, or the one connect() used."""
        return self._conn.server

    @property
    def tls(self) -> ssl.SSLContext | None:
        return self._conn.tls

    @property
    def connected(self) -> bool:
        return self._conn.transport is not None

    @property
    def closed_reason(self) -> Disconnected | None:
        return self._conn.closed_exc

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

    @property
    def stray_messages(self) -> int:
        """Deliveries for no known subscription (e.g. after unsubscribe)."""
        return self._subs.stray_messages

    @property
    def max_buffered_messages(self) -> int:
        return self._subs.max_buffered_messages

    @property
    def max_buffered_bytes(self) -> int:
        return self._subs.max_buffered_bytes

    async def logon(
        self, timeout: float | None = 10.0, *, ack_conflation: str | None = None
    ) -> LogonResult:
        """Log on as `name`. Returns the server's highest stored sequence for this name (and
        its bookmark); publish() numbers from there. Raises CommandError (`auth failure`,
        `name in use`), CommandTimeout, Disconnected."""
        conn = self._conn
        if conn.state != "connected":
            raise ClientError(f"logon() on a {conn.state} client; connect() first, logon once")
        header = Header(
            c="logon",
            client_name=self.name,
            user_id=self.user_id,
            pw=self.password,
            v=VERSION,
            o=f"ack_conflation={ack_conflation}" if ack_conflation else None,
        )
        try:
            ack = await self._commands.request(header, "processed", timeout)
        except CommandError as exc:
            if exc.reason == "auth failure" and self.user_id and self.password is None:
                raise CommandError(
                    "auth failure",
                    f"logon as {self.user_id!r} refused, and no password was given: pass "
                    "password= (tickertape pub/sub: --password-file FILE, or the "
                    "TICKERTAPE_PASSWORD environment variable)",
                ) from None
            raise
        seq = ack.s or 0
        self._tracker.reset(seq)
        conn.state = "logged_on"
        self.logon_result = LogonResult(seq, ack.bm)
        return self.logon_result

    async def __aenter__(self) -> Self:
        if self._conn.state == "new" and self._conn.server:
            await self.connect()
            try:
                await self.logon()
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ================================================================ routing what the server sends

    def _dispatch(self, frames: list[tuple[Header, bytes]]) -> None:
        subs = self._subs.by_id
        for header, body in frames:
            c = header.c
            if c == "p":
                sids = header.sids
                if sids is None or "," not in sids:
                    key = header.sub_id or sids
                    sub = subs.get(key) if key is not None else None
                    if sub is not None:
                        msg = Message(header.t, body, header.bm, header.sub_id, sids, header.ts,
                                      header.x, header.lp, header)  # fmt: skip
                        sub._push(msg)
                    else:
                        self._subs.stray_messages += 1
                else:
                    self._subs.deliver_many(header, body, sids)
            elif c == "ack":
                self._on_ack(header)
            elif c == "sow" or c == "oof":  # an answer's record, or an out-of-focus notice
                self._sow.on_sow(header, body)
            elif c == "heartbeat":
                if self._conn.transport is not None:
                    self._conn.write(BEAT)
            else:
                log.debug("ignoring %r frame from the server", c)

    def _on_ack(self, h: Header) -> None:
        a = h.a
        cid = h.cid
        if cid is not None and self._commands.settle(h, cid):
            return
        subs = self._subs
        if a == "persisted" and cid is None:
            if h.sub_id is not None and h.bm is not None:
                sub = subs.by_id.get(h.sub_id)
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
            sub = subs.by_id.get(h.sub_id) if h.sub_id else None
            if sub is None and cid is not None:
                sub = subs.by_cid.get(cid)
            if sub is not None and h.bm is not None:
                # a SOW answer's point (only its `completed` carries bm): in order, after the
                # answer's records and before the first change (client/hasub.py)
                sub._push_mark(PersistedBookmark(sub.sub_id, h.bm))
            if sub is not None and sub._complete():
                subs.drop(sub)  # a range ended: the server removed the subscription
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
        if h.status == "failure" and cid is None and h.sub_id is not None:
            sub = subs.by_id.get(h.sub_id)
            if sub is not None:  # the server ended it (`not entitled` after a reload of roles)
                exc = CommandError(
                    h.reason or "unknown", f"subscription {h.sub_id} ended by the server"
                )
                sub._finish(exc, drop=False)
                subs.drop(sub)
                self._report(exc)
                return
        if h.status == "failure":
            # nobody waits for it: a publish refused on its processed ack, or a command the
            # server could not attribute (`bad frame`, `logon required`); the connection
            # usually closes next, and the reason goes into the Disconnected detail
            what = f"{h.c} ack for cid {cid}" if cid else "a command without cid"
            exc = CommandError(h.reason or "unknown", f"server refused {what} ({a or 'no type'})")
            if h.reason in DISCONNECT_REASONS:
                self._conn.server_failure = (h.reason, str(exc))
            self._report(exc)

    def _report(self, exc: ClientError) -> None:
        if isinstance(exc, PublishFailed):
            log.warning("%s", exc)
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:
                log.exception("on_error callback failed")

    def _fail_pending(self, err: Disconnected) -> None:
        # commands first, then publishes, then subscriptions: the order callers are woken in
        self._commands.fail_all(err)
        self._tracker.close(err)
        self._subs.end_all(err)
