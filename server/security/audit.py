"""The audit trail: one structured line per security event, on the logger `tickertape.audit`.

    logon           INFO     a logon accepted: peer, user, method (password, certificate, ...)
    logon_failure   WARNING  a logon refused: peer, the user it claimed, why (never the password)
    refused         WARNING  a command refused `not entitled`: peer, user, right, topic
    admin_request   INFO     an admin endpoint request: peer, user, method, path, status

Each line is the event name followed by `key=value` pairs (logfmt), for example::

    logon_failure peer=10.0.0.7:51234 user=alice transport=tls detail="wrong password"

A value is written bare when it is made of safe characters, otherwise as a JSON string, so a
user name sent by a client can never start a new line or forge a field; values are cut at 256
characters. The fields also ride on the record as `record.audit` (a dict) for a structured
formatter.

The lines go wherever `tickertape` logs go. To keep them in a file of their own, give a log
target `<Logger>tickertape.audit</Logger>` (server/logsetup.py filters by logger name).
"""

from __future__ import annotations

import json
import logging
import re

__all__ = ["LOGGER", "admin_request", "format_event", "logon", "logon_failure", "refused"]

LOGGER = "tickertape.audit"
log = logging.getLogger(LOGGER)

_SAFE = re.compile(r"[A-Za-z0-9_.:/@+*\-\[\]|\\^$?(){}]+")
_MAX_VALUE = 256


def _value(value: object) -> str:
    text = str(value)
    if len(text) > _MAX_VALUE:
        text = text[:_MAX_VALUE] + "..."
    if _SAFE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=True)


def format_event(event: str, fields: dict[str, object]) -> str:
    """`event key=value ...`, leaving out fields that are None."""
    parts = [event]
    parts += [f"{key}={_value(value)}" for key, value in fields.items() if value is not None]
    return " ".join(parts)


def _emit(level: int, event: str, fields: dict[str, object]) -> None:
    if log.isEnabledFor(level):
        log.log(level, format_event(event, fields), extra={"audit": {"event": event, **fields}})


def logon(peer: str, user: str, method: str, transport: str | None = None) -> None:
    """A logon was accepted."""
    _emit(logging.INFO, "logon", {"peer": peer, "user": user, "method": method,
                                  "transport": transport})  # fmt: skip


def logon_failure(peer: str, user: str | None, detail: str, transport: str | None = None) -> None:
    """A logon was refused (`auth failure`). `user` is what the client claimed."""
    _emit(logging.WARNING, "logon_failure", {"peer": peer, "user": user,
                                             "transport": transport, "detail": detail})  # fmt: skip


def refused(peer: str, user: str, right: str, topic: str, command: str | None = None) -> None:
    """A command was refused `not entitled`."""
    _emit(logging.WARNING, "refused", {"peer": peer, "user": user, "right": right,
                                       "topic": topic, "command": command})  # fmt: skip


def admin_request(peer: str, user: str | None, method: str, path: str, status: int) -> None:
    """A request to the admin endpoint, with the status it was answered with."""
    _emit(logging.INFO, "admin_request", {"peer": peer, "user": user, "method": method,
                                          "path": path, "status": status})  # fmt: skip
