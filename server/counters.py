"""Counts of client events, bumped by sessions and connections and read by the statistics
(server/stats.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Counters"]


@dataclass(slots=True, eq=False)
class Counters:
    """Counts bumped by sessions and connections."""

    connections_total: int = 0
    refused: int = 0  # commands refused with a failure ack
    auth_failures: int = 0  # logons refused `auth failure` by the authenticator
    not_entitled: int = 0  # commands refused `not entitled` by the user's roles
    tls_refused: int = 0  # TLS handshakes that failed (server/tls_accept.py)
    disconnects: Counter[str] = field(default_factory=Counter)  # reason -> connections closed
