"""Counts of client events, bumped by sessions and connections and read by the statistics
(server/stats.py)."""

from __future__ import annotations

__all__ = ["Counters"]


class Counters:
    """Counts bumped by sessions and connections."""

    __slots__ = ("connections_total", "disconnects", "refused")

    def __init__(self) -> None:
        self.connections_total = 0
        self.refused = 0  # commands refused with a failure ack
        self.disconnects: dict[str, int] = {}  # reason -> connections closed

    def disconnected(self, reason: str) -> None:
        self.disconnects[reason] = self.disconnects.get(reason, 0) + 1
