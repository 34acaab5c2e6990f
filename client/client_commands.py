"""Commands that wait for an ack, matched by `cid`: a collaborator of `Client`.

`ClientCommands` is handed the connection (client_conn.py) and owns the waiting commands: every
command sent with `request` carries a `cid` (a decimal counter, also the source of generated
`sub_id`s and `query_id`s) and waits for the ack of the awaited type; `settle` (called by
`Client._on_ack`) settles the waiter, a failure ack of any type for that `cid` fails it, and a
closing connection fails every waiter with `Disconnected` (`fail_all`). Also here: `execute`,
`flush` and `sow_delete`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec

from protocol.framing import encode_frame
from protocol.headers import Header

from .client_conn import ClientConnection
from .errors import CommandError, CommandTimeout, Disconnected

__all__ = ["DEFAULT_TIMEOUT", "ClientCommands"]

DEFAULT_TIMEOUT = 30.0
"""Seconds a command waits for its ack unless told otherwise (flushes wait forever by default)."""

_replace = msgspec.structs.replace
# failure reasons after which the server closes the connection (docs/protocol.md §9)
DISCONNECT_REASONS = frozenset(
    {"bad frame", "unknown command", "logon required", "auth failure", "name in use"}
)


def _opts_text(options: str | Iterable[str] | None) -> str | None:
    if options is None or isinstance(options, str):
        return options or None
    return ",".join(options) or None


def _joined(items: str | Iterable[object] | None) -> str | None:
    """A comma list given as its text or as its items (None: not given)."""
    return items if items is None or isinstance(items, str) else ",".join(map(str, items))


class _Waiter(msgspec.Struct, eq=False):
    fut: asyncio.Future
    ack: str
    command: str


class ClientCommands:
    """Commands that wait for their ack on one connection (see the module docstring)."""

    def __init__(self, conn: ClientConnection) -> None:
        self._conn = conn
        self._waiters: dict[str, _Waiter] = {}
        self._next_id = 0

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
        if self._conn.state == "connected" and header.c != "logon":
            raise self._conn.not_ready(header.c or "execute")
        return await self.request(header, ack, timeout, body)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until the server has processed every earlier command of this connection."""
        await self.execute(Header(c="flush"), ack="completed", timeout=timeout)

    async def sow_delete(
        self,
        topic: str,
        bookmarks: str | Iterable[object] | None = None,
        *,
        filter: str | None = None,
        keys: str | Iterable[str] | None = None,
        data: bytes | str | None = None,
        options: str | Iterable[str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> int:
        """Acknowledge (delete) queue messages by bookmarks or by filter, or delete records of
        a SOW topic by `keys` (their `k`), by `filter` (`1=1`: all) or by `data` (the record
        with that message's key); returns the stats ack's `records_deleted`. `options`:
        `cancel` or `expire` on a queue (docs/protocol.md §8, §14)."""
        given = [x for x in (bookmarks, filter, keys, data) if x is not None]
        if len(given) != 1:
            raise ValueError("sow_delete needs exactly one of bookmarks, filter, keys or data")
        body = data.encode() if isinstance(data, str) else (data or b"")
        header = Header(c="sow_delete", t=topic, bm=_joined(bookmarks), f=filter,
                        sow_keys=_joined(keys), o=_opts_text(options),
                        a="processed,stats")  # fmt: skip
        ack = await self.execute(header, body, ack="stats", timeout=timeout)
        return ack.records_deleted or 0

    # ================================================================ internals: requests

    def new_id(self) -> str:
        self._next_id += 1
        return str(self._next_id)

    async def request(
        self, header: Header, ack: str, timeout: float | None, body: bytes = b""
    ) -> Header:
        """Send `header` and wait for its `ack`-type ack (a cid is assigned if it has none,
        and `ack` is added to its `a`)."""
        conn = self._conn
        if conn.transport is None:
            raise conn.not_ready(header.c or "command")
        changes: dict[str, str] = {}
        cid = header.cid
        if cid is None:
            cid = changes["cid"] = self.new_id()
        acks = header.a.split(",") if header.a else []
        if ack not in acks:
            changes["a"] = ",".join([*acks, ack])
        if changes:
            header = _replace(header, **changes)
        fut = conn.loop.create_future()
        waiter = self._waiters[cid] = _Waiter(fut, ack, header.c or "command")
        conn.write(encode_frame(header, body))
        try:
            if timeout is None:
                return await fut
            try:
                async with asyncio.timeout(timeout):
                    return await fut
            except TimeoutError:
                raise CommandTimeout(f"{header.c} (cid {cid})", timeout, f"{ack} ack") from None
        finally:
            if self._waiters.get(cid) is waiter:
                del self._waiters[cid]

    def send_quietly(self, header: Header) -> None:
        """Fire-and-forget (cleanup after a cancelled or timed-out command)."""
        if self._conn.transport is not None:
            self._conn.write(encode_frame(header))

    def settle(self, h: Header, cid: str) -> bool:
        """Settle the command waiting on ack `h` for `cid`: True if one did (its result, or
        CommandError on a failure ack of any type), False if the ack is for nobody here."""
        w = self._waiters.get(cid)
        if w is None:
            return False
        if h.status == "failure":
            del self._waiters[cid]
            if h.reason in DISCONNECT_REASONS:
                # e.g. a refused logon: the server closes next, and this is why
                self._conn.server_failure = (h.reason, f"{w.command} refused")
            if not w.fut.done():
                w.fut.set_exception(
                    CommandError(h.reason or "unknown", f"{w.command} refused (cid {cid})")
                )
            return True
        if h.a == w.ack:
            del self._waiters[cid]
            if not w.fut.done():
                w.fut.set_result(h)
            return True
        return False

    def fail_all(self, err: Disconnected) -> None:
        waiters, self._waiters = self._waiters, {}
        for w in waiters.values():
            if not w.fut.done():
                w.fut.set_exception(err)
