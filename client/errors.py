"""Errors raised by the client: one type per cause, each with its fields and a message that says
what to do.

```
ClientError                         base of everything below
├── ConnectFailed   (ConnectionError)  the TCP connection could not be opened
├── Disconnected    (ConnectionError)  an open connection ended; every waiter fails with it
├── CommandError                       the server refused a command (failure ack)
│   └── PublishFailed                  the server could not persist publishes
├── CommandTimeout  (TimeoutError)     no ack within the caller's timeout
├── NoServerAvailable                  HA: the server chooser offers no server (its `error()`)
├── ReconnectGaveUp                    HA: the delay strategy's give-up time has passed
└── StoreError                         publish / bookmark store files
    ├── StoreClosed                    the store was used after close()
    ├── StoreLocked                    another process (or store object) holds the file
    ├── StoreFull                      a record cannot fit (or no room came within a timeout)
    └── CorruptStore                   a file whose header is unreadable (damaged tails are
                                       cut off and reported, never raised: see RecoveryReport)
```

`CommandError.reason` is one of docs/protocol.md §3's stable failure reasons (`bad filter`,
`invalid bookmark`, `journal unavailable`, ...): compare against it, never against the message.
`Disconnected.reason` names why the connection ended (`closed by client`, `closed by server`,
`heartbeat`, `bad frame`, or an OS error text).
"""

from __future__ import annotations

import builtins

__all__ = [
    "ClientError",
    "CommandError",
    "CommandTimeout",
    "ConnectFailed",
    "CorruptStore",
    "Disconnected",
    "NoServerAvailable",
    "PublishFailed",
    "ReconnectGaveUp",
    "StoreClosed",
    "StoreError",
    "StoreFull",
    "StoreLocked",
]

_HINTS = {
    "auth failure": "check user_id and password",
    "name in use": "another connection with a different user_id holds this client name; "
    "choose another name",
    "bad filter": "fix the filter expression (docs/protocol.md §7)",
    "bad regex topic": "fix the topic regular expression (Python re syntax)",
    "invalid bookmark": "use 0, 0|1|, <publisher_id>|<seq>|, a timestamp, a list or a range "
    "(docs/protocol.md §5)",
    "invalid options": "remove or fix the option (docs/protocol.md §6)",
    "invalid topic": "bookmark subscriptions need a topic recorded in the transaction log; "
    "sow and the delta commands need a SOW topic (<SOW><Topic>)",
    "journal unavailable": "the server cannot write its journal (disk full or I/O error); "
    "republish once it recovers",
    "not entitled": "this user may not use that topic",
    "subscription already exists": "use another sub_id, or options='replace'",
    "not a queue": "sow_delete and max_backlog are for queues; use a queue's name",
    "logon required": "call logon() before any other command",
}


class ClientError(Exception):
    """Base of every error raised by the Tickertape client."""


class ConnectFailed(ClientError, builtins.ConnectionError):
    """The TCP connection to `address` could not be opened (`reason`: the OS error text)."""

    def __init__(self, address: str, reason: str):
        hint = ""
        if "refused" in reason.lower():
            hint = "; is the server running? Start one with `tickertape serve`"
        super().__init__(f"cannot connect to {address}: {reason}{hint}")
        self.address = address
        self.reason = reason


class Disconnected(ClientError, builtins.ConnectionError):
    """The connection ended. Pending commands fail with this; subscriptions end with it."""

    def __init__(self, reason: str, detail: str = ""):
        text = f"disconnected: {reason}"
        if detail:
            text += f" ({detail})"
        if reason == "closed by server":
            text += "; the server log names the reason; connect again when it is back"
        elif reason != "closed by client":
            text += "; connect again"
        super().__init__(text)
        self.reason = reason
        self.detail = detail


class CommandError(ClientError):
    """The server answered a command with a failure ack.

    `reason` is the stable reason string of docs/protocol.md §3; `message` adds context (the
    command, and what the server said beyond the reason, if anything).
    """

    def __init__(self, reason: str, message: str = ""):
        hint = _HINTS.get(reason)
        text = reason
        if message:
            text += f": {message}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)
        self.reason = reason
        self.message = message


class PublishFailed(CommandError):
    """Publishes up to sequence `seq` were refused as not persisted (`journal unavailable`).

    `count` is how many of this connection's in-flight publishes the failure settled.
    """

    def __init__(self, reason: str, seq: int | None, count: int):
        where = f"through seq {seq}" if seq is not None else "in flight"
        super().__init__(reason, f"{count} publish(es) {where} were not persisted")
        self.seq = seq
        self.count = count


class CommandTimeout(ClientError, builtins.TimeoutError):
    """No ack of the awaited type arrived for `command` within `timeout` seconds."""

    def __init__(self, command: str, timeout: float, what: str = "ack"):
        super().__init__(
            f"no {what} for {command} within {timeout:g}s; the server may be overloaded or "
            "unreachable: retry, or pass a larger timeout"
        )
        self.command = command
        self.timeout = timeout


class NoServerAvailable(ClientError):
    """The server chooser returned no URI; `detail` is what its `error()` said."""

    def __init__(self, detail: str):
        super().__init__(
            f"no server to connect to: {detail or 'the server chooser is empty'}; "
            "add servers to the chooser (tickertape --server HOST:PORT, repeatable)"
        )
        self.detail = detail


class ReconnectGaveUp(ClientError):
    """The reconnect delay strategy gave up after `elapsed` seconds without a connection.

    `last_error` is the last connection or logon failure (or None)."""

    def __init__(self, elapsed: float, limit: float, last_error: BaseException | None):
        text = f"gave up reconnecting after {elapsed:.1f}s (give-up time {limit:g}s)"
        if last_error is not None:
            text += f"; last error: {last_error}"
        super().__init__(text + "; check the servers, or raise the strategy's give_up_after")
        self.elapsed = elapsed
        self.limit = limit
        self.last_error = last_error


class StoreError(ClientError):
    """Base of the publish and bookmark store errors; `path` is the file (None in memory)."""

    def __init__(self, path: str | None, message: str):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class StoreClosed(StoreError):
    """The store was used after close()."""

    def __init__(self, path: str | None):
        super().__init__(path, "store is closed; open a new store object")


class StoreLocked(StoreError):
    """Another process (or another store object in this one) holds the store file."""

    def __init__(self, path: str):
        super().__init__(
            path,
            "store file is in use by another client (a store file serves one client at a "
            "time); stop the other one, or give this client its own file",
        )


class StoreFull(StoreError):
    """A record of `size` bytes does not fit in a store bounded to `limit` bytes / records."""

    def __init__(self, path: str | None, size: int, limit: str):
        super().__init__(
            path,
            f"a record of {size} bytes does not fit (limit {limit}); raise the store's "
            "max_bytes / max_messages, or wait for the server to persist what is stored",
        )
        self.size = size
        self.limit = limit


class CorruptStore(StoreError):
    """The file at `path` cannot be used at all (`offset`, `reason`): its header is damaged or
    it is not a store of this kind. Damage after the header is never raised: the valid records
    load and the loss is reported (see client/storefile.py `RecoveryReport`)."""

    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(
            path,
            f"not a usable store at offset {offset}: {reason}; move the file aside to start "
            "an empty store (its unpersisted messages / bookmarks are then lost)",
        )
        self.offset = offset
        self.reason = reason
