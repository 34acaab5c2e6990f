"""Bounds on connections (docs/configuration.md, "Limits"): how many in all, how many from one
peer address, how many not logged on yet.

    <MaxConnections>                  open connections over every transport
    <MaxConnectionsPerAddress>        open connections from one peer address
    <MaxUnauthenticatedConnections>   connections not logged on yet (TLS handshakes included)

A connection is admitted when it is accepted, before anything is read from it (before its TLS
handshake on a `tcps` transport), and released when it closes. One past a bound is closed at
once, with a log line naming the bound and a count in `/stats` ("limits") and `/metrics`.

States of one admitted connection: unauthenticated --logged_on--> logged on; either --release-->
gone.
"""

from __future__ import annotations

import logging

from config.model import Limits

__all__ = ["Admission"]

log = logging.getLogger("tickertape.server")


class Admission:
    def __init__(self, limits: Limits, counts: dict[str, int]) -> None:
        self.limits = limits
        self.counts = counts  # the intake's refusal counts (/stats "limits")
        for key in (
            "connections_refused",
            "address_connections_refused",
            "unauthenticated_refused",
        ):
            counts.setdefault(key, 0)
        self.open = 0
        self.unauthenticated = 0
        self.by_address: dict[str, int] = {}

    def admit(self, address: str, peer: str, transport: str) -> bool:
        """Take a new connection from `address` (`peer` = address:port, for the log line);
        False when a bound refuses it (logged and counted; the caller closes it)."""
        lim = self.limits
        refused = None
        if self.open >= lim.max_connections:
            refused = ("connections_refused", f"<MaxConnections> {lim.max_connections}")
        elif self.by_address.get(address, 0) >= lim.max_connections_per_address:
            refused = (
                "address_connections_refused",
                f"<MaxConnectionsPerAddress> {lim.max_connections_per_address} from {address}",
            )
        elif self.unauthenticated >= lim.max_unauthenticated_connections:
            refused = (
                "unauthenticated_refused",
                f"<MaxUnauthenticatedConnections> {lim.max_unauthenticated_connections} "
                "not logged on yet",
            )
        if refused is not None:
            counter, bound = refused
            self.counts[counter] += 1
            log.warning(
                "connection from %s on %s refused: %s reached; raise the limit if this load is "
                "expected",
                peer,
                transport,
                bound,
            )
            return False
        self.open += 1
        self.unauthenticated += 1
        self.by_address[address] = self.by_address.get(address, 0) + 1
        return True

    def logged_on(self) -> None:
        """An admitted connection logged on: it no longer counts as unauthenticated."""
        self.unauthenticated -= 1

    def release(self, address: str, logged_on: bool) -> None:
        """An admitted connection closed."""
        self.open -= 1
        if not logged_on:
            self.unauthenticated -= 1
        left = self.by_address.get(address, 0) - 1
        if left > 0:
            self.by_address[address] = left
        else:
            self.by_address.pop(address, None)
