"""Typed values the client hands to applications: delivered messages and the logon result."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from protocol.headers import Header

__all__ = ["LogonResult", "Message", "PersistedBookmark"]


# gc=False: a Message only holds strings, bytes and a Header (no cycles), and skipping GC
# tracking makes the per-delivery allocation cheaper.
class Message(msgspec.Struct, frozen=True, gc=False):
    """One delivered message (`{"c":"p",...}` + body, docs/protocol.md §4).

    `body` is the raw body bytes (decode it yourself: `msgspec.json.decode(m.body)`).
    `bookmark` is `<publisher_id>|<seq>|` on topics recorded in the transaction log, else None.
    `sub_id` is the subscription this message was handed to; `sids` the server's full list of
    this connection's matching subscriptions. `timestamp` (`ts`) only with the `timestamp`
    option; `lease_period` (`lp`) only on at-least-once queue deliveries. `header` is the whole
    decoded header, for fields not lifted out here.
    """

    topic: str | None
    body: bytes
    bookmark: str | None
    sub_id: str | None
    sids: str | None
    timestamp: str | None
    correlation_id: str | None
    lease_period: str | None
    header: Header

    def json(self) -> Any:
        """The body decoded as JSON (raises msgspec.DecodeError if it is not JSON)."""
        return msgspec.json.decode(self.body)


class LogonResult(msgspec.Struct, frozen=True):
    """The logon's processed ack: `seq` is the highest sequence the server has stored for this
    client name (0 if none) and `bookmark` that message's bookmark. A publisher resumes by
    re-sending everything after `seq`; `Client.publish` numbers new messages from `seq + 1`."""

    seq: int
    bookmark: str | None


class PersistedBookmark(msgspec.Struct, frozen=True, gc=False):
    """A bookmark subscription's periodic `persisted` ack, in stream order with its messages
    (only from subscriptions placed with `marks=True`): the server has passed the durable
    message `bookmark` for subscription `sub_id`. Bookmark stores use it as a resume point."""

    sub_id: str | None
    bookmark: str
    body: ClassVar[bytes] = b""  # counted like an empty message in a subscription's buffer
