"""The stable reasons the server gives: why it closed a connection, why it refused a command.

Both are part of the protocol (docs/protocol.md §3 Acks, §9): clients and operators match on the
text, so a reason is never reworded. They are `StrEnum`s: each member *is* its text, so it
goes into logs, JSON acks and the `/stats` disconnect counts unchanged.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Disconnect", "Failure"]


class Disconnect(StrEnum):
    """Why a connection ended (the `disconnect: ... reason=` log line, `/stats` disconnects)."""

    CONNECTION_CLOSED = "connection closed"  # the client went away
    NAME_IN_USE = "name in use"  # a newer logon with the same client name and user id
    HEARTBEAT = "heartbeat"  # silent for two heartbeat intervals
    SLOW_CLIENT = "slow client"  # output past <ClientMaxBufferSize> or not draining (intake)
    BAD_FRAME = "bad frame"
    UNKNOWN_COMMAND = "unknown command"
    LOGON_REQUIRED = "logon required"
    AUTH_FAILURE = "auth failure"
    SHUTDOWN = "shutdown"
    ADMIN = "admin"  # a user with admin disconnected it (the web console's action)
    CATCHING_UP = "catching up"  # a logon refused while a new journal catches up (replication)
    # the root limits of server/intake.py
    LOGON_TIMEOUT = "logon timeout"
    INPUT_MEMORY_LIMIT = "input memory limit"
    PARTIAL_MESSAGE_TIMEOUT = "partial message timeout"
    IDLE = "idle"


class Failure(StrEnum):
    """The `reason` of a failure ack."""

    LOGON_REQUIRED = "logon required"
    AUTH_FAILURE = "auth failure"
    NOT_ENTITLED = "not entitled"
    NAME_IN_USE = "name in use"
    BAD_FRAME = "bad frame"
    UNKNOWN_COMMAND = "unknown command"
    INVALID_TOPIC = "invalid topic"
    BAD_FILTER = "bad filter"
    BAD_REGEX_TOPIC = "bad regex topic"
    INVALID_BOOKMARK = "invalid bookmark"
    INVALID_OPTIONS = "invalid options"
    SUBSCRIPTION_EXISTS = "subscription already exists"
    NOT_A_QUEUE = "not a queue"
    JOURNAL_UNAVAILABLE = "journal unavailable"  # nothing is acked as persisted
    BAD_SOW_KEY = "bad sow key"  # a SOW publish without its key, or an unusable k / sow_keys
    BAD_ORDER_BY = "bad order by"  # an order_by that does not parse
    # a new journal in a replicated set, before its peers sent it what they hold
    CATCHING_UP = "catching up"
