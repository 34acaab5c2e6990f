"""An HAClient's state and the waits on it (client/ha.py has the state diagram).

`Lifecycle` holds the state, tells the application of each change (`on_state`), records the
failure that ended the client, and lets calls wait until the client is connected: they wake on
the connection coming back, or on the supervisor ending (failed, closed), whichever first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .errors import ClientError, CommandTimeout, Disconnected

__all__ = ["Lifecycle"]

log = logging.getLogger("tickertape.client.ha")


class Lifecycle:
    """new, connecting, connected, reconnecting, closed, failed; and the supervisor task that
    keeps the client connected (its end wakes the waiters)."""

    def __init__(self, on_state: Callable[[str], None] | None) -> None:
        self.state = "new"
        self.on_state = on_state
        self.failure: ClientError | None = None  # what moved the client to `failed`
        self.supervisor: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None  # set while connected

    def start(self) -> None:
        """connect_and_logon(): connecting, with an event for the waits."""
        self._ready = asyncio.Event()
        self.set("connecting")

    def set(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        if self._ready is not None:
            if state == "connected":
                self._ready.set()
            else:
                self._ready.clear()
        if self.on_state is not None:
            try:
                self.on_state(state)
            except Exception:
                log.exception("on_state callback failed")

    def fail(self, exc: ClientError) -> None:
        self.failure = exc
        self.set("failed")

    def raise_if_done(self) -> None:
        """Raise what ended the client: Disconnected once closed, its failure once failed."""
        if self.state == "closed":
            raise Disconnected("closed by client")
        if self.state == "failed":
            assert self.failure is not None, "fail() records it before the failed state"
            raise self.failure

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until connected (raises the failure, Disconnected once closed, or
        CommandTimeout)."""
        while self.state != "connected":
            self.raise_if_done()
            if self.state == "new":
                raise ClientError("not connected; call await client.connect_and_logon() first")
            if timeout is None:
                await self._wait_ready_or_done()
                continue
            try:
                async with asyncio.timeout(timeout):
                    await self._wait_ready_or_done()
            except TimeoutError:
                raise CommandTimeout("waiting for a connection", timeout, "connection") from None

    async def _wait_ready_or_done(self) -> None:
        event = self._ready
        assert event is not None, "start() made it: the state is not new"
        ready = asyncio.ensure_future(event.wait())
        done = self.supervisor
        try:
            await asyncio.wait([ready, done] if done is not None else [ready],
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            ready.cancel()
