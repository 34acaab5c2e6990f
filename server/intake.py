"""Bounds on what clients make the server hold: input memory and connection timeouts.

One `Intake` per server, from the root limits of the configuration (config/limits.py):

- before logon a connection's frames may be at most <MaxLogonMessageSize> (its decoder's limit;
  raised to the transport's <MaxMessageSize> at logon), and the logon must come within
  <LogonTimeout>;
- partial frames buffered over all connections stay under <InputMemoryLimit>: the connection
  whose input would pass it is closed (`input memory limit`);
- a frame must arrive whole within <PartialMessageTimeout> (`partial message timeout`);
- with <IdleTimeout>, a connection that sends nothing for that long is closed (`idle`);
- a connection whose queued output drains by not one byte for <ClientMessageAgeLimit> is
  closed (`slow client`), however little it holds. Draining counts the kernel's send queue too:
  a client that reads slowly empties it long before the kernel asks the server for more (it
  waits for a third of the socket buffer to be free), so the server's own buffer can sit still
  for seconds while the client makes progress.

Each close is logged at WARNING with what to change, and counted (`counts`, in /stats).

Once a connection is logged on, its decoder leaves runs of publish frames whole
(`FrameDecoder.group`, server/publish_scan.py): the session stores them straight from the bytes.
One client's work per event-loop turn is bounded already: the event loop reads at most
256 KiB from one socket per callback, and everything decoded from it is handled in that turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Protocol

from config.model import Limits
from protocol.framing import FrameDecoder

from .outbox import Outbox
from .publish_scan import publish_span
from .reasons import Disconnect

__all__ = ["Intake", "IntakeConn"]

log = logging.getLogger("tickertape.server")


class IntakeConn(Protocol):
    """What the intake reads and sets on a connection (server/connection.py)."""

    decoder: FrameDecoder
    buffered: int
    partial_since: float | None
    connected_at: float
    last_recv: float
    drained_mark: int
    drained_at: float
    unsent_mark: int
    out: Outbox

    @property
    def closing(self) -> bool: ...
    @property
    def logged_on(self) -> bool: ...
    def describe(self) -> str: ...
    def close(self, reason: str, abort: bool = False) -> None: ...
    def unsent(self) -> int | None:
        """Bytes in the kernel's send queue not yet taken by the peer; None if unknown."""


class Intake:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.buffered = 0  # bytes of partial frames over all connections
        self.counts = dict.fromkeys(
            "logon_timeout logon_frame_too_large input_memory_limit partial_message_timeout idle "
            "slow_client_age subscriptions_refused".split(),
            0,
        )

    def after_feed(self, conn: IntakeConn) -> bool:
        """Account for conn's partial frame after it was fed input; False if conn was closed."""
        decoder = conn.decoder
        if decoder.group is None and conn.logged_on:
            decoder.group = publish_span
        now_buffered = decoder.buffered
        self.buffered += now_buffered - conn.buffered
        conn.buffered = now_buffered
        if now_buffered == 0:
            conn.partial_since = None
            return True
        if conn.partial_since is None:
            conn.partial_since = time.monotonic()
        if self.buffered > self.limits.input_memory_limit:
            self.counts["input_memory_limit"] += 1
            log.warning(
                "%s: closed: partial input over all connections passed <InputMemoryLimit> %d bytes "
                "(this one holds %d); raise the limit if such frames are expected",
                conn.describe(),
                self.limits.input_memory_limit,
                now_buffered,
            )
            conn.close(Disconnect.INPUT_MEMORY_LIMIT, abort=True)
            return False
        return True

    def forget(self, conn: IntakeConn) -> None:
        self.buffered -= conn.buffered
        conn.buffered = 0

    def frame_too_large_before_logon(self, conn: IntakeConn) -> None:
        self.counts["logon_frame_too_large"] += 1

    def sweep(self, connections: Iterable[IntakeConn], now: float) -> None:
        """Close connections past a timeout (called about every heartbeat tick)."""
        lim = self.limits
        for conn in list(connections):
            if conn.closing:
                continue
            if not conn.logged_on and now - conn.connected_at > lim.logon_timeout:
                self._close(
                    conn,
                    "logon_timeout",
                    Disconnect.LOGON_TIMEOUT,
                    f"no logon within <LogonTimeout> {lim.logon_timeout:g}s",
                )
            elif (
                conn.partial_since is not None
                and now - conn.partial_since > lim.partial_message_timeout
            ):
                self._close(
                    conn,
                    "partial_message_timeout",
                    Disconnect.PARTIAL_MESSAGE_TIMEOUT,
                    f"a frame did not arrive whole within <PartialMessageTimeout> {lim.partial_message_timeout:g}s",
                )
            elif lim.idle_timeout and now - conn.last_recv > lim.idle_timeout:
                self._close(
                    conn,
                    "idle",
                    Disconnect.IDLE,
                    f"no input for <IdleTimeout> {lim.idle_timeout:g}s",
                )
            elif self._output_stuck(conn, now):
                self._close(
                    conn,
                    "slow_client_age",
                    Disconnect.SLOW_CLIENT,
                    f"its queued output did not drain for <ClientMessageAgeLimit> {lim.client_message_age_limit:g}s",
                )

    def _output_stuck(self, conn: IntakeConn, now: float) -> bool:
        if conn.out.closing:
            return False
        queued = conn.out.queued()
        drained = conn.out.bytes_written - queued  # grows whenever the client reads anything
        if queued == 0 or drained != conn.drained_mark:
            conn.drained_mark = drained
            conn.drained_at = now
            return False
        unsent = conn.unsent()  # the server's buffer sat still: did the client read anything?
        if unsent is not None and unsent != conn.unsent_mark:
            conn.unsent_mark = unsent
            conn.drained_at = now
            return False
        return now - conn.drained_at > self.limits.client_message_age_limit

    def _close(self, conn: IntakeConn, counter: str, reason: str, why: str) -> None:
        self.counts[counter] += 1
        log.warning("%s: closed (%s): %s", conn.describe(), reason, why)
        conn.close(reason, abort=True)
