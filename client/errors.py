"""Errors raised by the client: one type per cause, each with its fields and a message that says
what to do.

```
ClientError                         base of everything below
├── ConnectFailed   (ConnectionError)  the TCP connection could not be opened
├── Disconnected    (ConnectionError)  an open connection ended; every waiter fails with it
├── CommandError                       the server refused a command (failure ack)
│   └── PublishFailed                  the server could not persist publishes
└── CommandTimeout  (TimeoutError)     no ack within the caller's timeout
```

`CommandError.reason` is one of PROTOCOL.md §3's stable failure reasons (`bad filter`,
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
    "Disconnected",
    "PublishFailed",
]

_HINTS = {
    "auth failure": "check user_id and password",
    "name in use": "another connection with a different user_id holds this client name; "
    "choose another name",
    "bad filter": "fix the filter expression (PROTOCOL.md §7)",
    "bad regex topic": "fix the topic regular expression (Python re syntax)",
    "invalid bookmark": "use 0, 0|1|, <publisher_id>|<seq>|, a timestamp, a list or a range "
    "(PROTOCOL.md §5)",
    "invalid options": "remove or fix the option (PROTOCOL.md §6)",
    "invalid topic": "bookmark subscriptions need a topic recorded in the transaction log",
    "journal unavailable": "the server cannot write its journal (disk full or I/O error); "
    "republish once it recovers",
    "not entitled": "this user may not use that topic",
    "subscription already exists": "use another sub_id, or options='replace'",
    "not a queue": "sow_delete acknowledges queue messages; use a queue topic",
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

    `reason` is the stable reason string of PROTOCOL.md §3; `message` adds context (the
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
