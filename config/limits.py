"""Root elements that bound what one client can make the server hold or do (docs/configuration.md,
"Limits"). Each is optional; the defaults keep a single trusted client unhindered and a hostile
or broken one from taking the server's memory or event loop.

| element | default | bounds |
|---|---|---|
| `<LogonTimeout>` | 10s | time from connect to a successful logon (with or without authentication) |
| `<MaxLogonMessageSize>` | 64KB | the size of any frame before logon (a logon fits in a few hundred bytes) |
| `<InputMemoryLimit>` | 256MB | partial frames buffered across all connections; the connection that would pass it is closed |
| `<PublishMemoryLimit>` | 64MB | publish data handed to the journal and not yet durable, over all connections; past it every publisher stops reading until half of it is durable |
| `<ClientPublishMemoryLimit>` | 4MB | one publisher's input read and not yet committed; past it that connection stops reading until half of it is committed |
| `<PartialMessageTimeout>` | 60s | how long one frame may take to arrive whole (a byte a second would pin its buffer) |
| `<IdleTimeout>` | 0 (off) | time with no input at all from a connection (heartbeats count) |
| `<ClientMessageAgeLimit>` | 60s | time a connection's queued output may go without draining before it is closed |
| `<ClientMaxSubscriptions>` | 1000 | subscriptions on one connection (so the `sids` of a delivery stay bounded) |
| `<ClientOfflineThreshold>` | min(4MB, half of `<ClientMaxBufferSize>`) | output queued to one connection past which its live subscriptions to recorded topics read from the journal instead (0 = never); the loader checks it against `<ClientMaxBufferSize>` |
| `<MaxConnections>` | 10000 | open connections over all transports |
| `<MaxConnectionsPerAddress>` | 1000 | open connections from one peer address |
| `<MaxUnauthenticatedConnections>` | 1000 | connections not logged on yet, TLS handshakes included |
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec

from .model import Limits
from .values import parse_count, parse_interval, parse_size


def _interval(name: str, zero_ok: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = parse_interval(text)
        if value < 0 or (value == 0 and not zero_ok):
            raise ValueError(
                f"{name} {text!r} must be {'0 (off) or ' if zero_ok else ''}a positive interval such as 10s"
            )
        return value

    return parse


def _size(name: str, low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_size(text)
        if value < low:
            raise ValueError(f"{name} {text!r} is below the minimum {low} bytes")
        return value

    return parse


def _size_or_off(name: str, low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_size(text)
        if value != 0 and value < low:
            raise ValueError(f"{name} {text!r} must be 0 (off) or at least {low} bytes")
        return value

    return parse


def _count(name: str, low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_count(text)
        if value < low:
            raise ValueError(f"{name} {text!r} must be at least {low}")
        return value

    return parse


# element -> (its parser's kind, the bound that kind takes); in the order of the table above
_BOUNDS: dict[str, tuple[Callable[[str, Any], Callable[[str], float]], Any]] = {
    "LogonTimeout": (_interval, False),
    "MaxLogonMessageSize": (_size, 1024),
    "InputMemoryLimit": (_size, 1 << 20),
    "PublishMemoryLimit": (_size, 1 << 20),
    "ClientPublishMemoryLimit": (_size, 64 * 1024),
    "PartialMessageTimeout": (_interval, False),
    "IdleTimeout": (_interval, True),
    "ClientMessageAgeLimit": (_interval, False),
    "ClientMaxSubscriptions": (_count, 1),
    "ClientOfflineThreshold": (_size_or_off, 64 * 1024),
    "MaxConnections": (_count, 1),
    "MaxConnectionsPerAddress": (_count, 1),
    "MaxUnauthenticatedConnections": (_count, 1),
}
_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(Limits)}


def _field(element: str) -> str:
    """The Limits field of an element: its name in snake case (`LogonTimeout` -> logon_timeout)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", element).lower()


# element -> (Limits field, parser, default: the field's; None: its default rule, config/model.py)
LIMIT_ELEMENTS: dict[str, tuple[str, Callable[[str], float], float | None]] = {
    element: (_field(element), kind(element, bound), _DEFAULTS[_field(element)])
    for element, (kind, bound) in _BOUNDS.items()
}
