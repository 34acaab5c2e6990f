"""Counts of client events, bumped by sessions and connections and read by the statistics
(server/stats.py)."""

from __future__ import annotations

__all__ = ["Counters"]


class Counters:
    """Counts bumped by sessions and connections."""

    __slots__ = (
        "auth_failures",
        "connections_total",
        "disconnects",
        "not_entitled",
        "refused",
        "tls_refused",
    )

    def __init__(self) -> None:
        self.connections_total = 0
        self.refused = 0  # commands refused with a failure ack
        self.auth_failures = 0  # logons refused `auth failure` by the authenticator
        self.not_entitled = 0  # commands refused `not entitled` by the user's roles
        self.tls_refused = 0  # TLS handshakes that failed (server/tls_accept.py)
        self.disconnects: dict[str, int] = {}  # reason -> connections closed

    def disconnected(self, reason: str) -> None:
        self.disconnects[reason] = self.disconnects.get(reason, 0) + 1
