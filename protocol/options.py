"""The ``o`` (``opts``) header: option strings, and their typed values per command.

This module owns the option string format of docs/protocol.md §6 (and the heartbeat form of §3).

Syntax, applied by :func:`parse_options`::

    options := item ("," item)*
    item    := "" | key | key "=" value | "start" "," interval      (heartbeat, see below)
    key     := [A-Za-z_][A-Za-z0-9_]*                  (folded to lower case)
    value   := text without a top-level ","  |  "[" text "]"       (brackets hold commas)

- Whitespace around items, keys and values is ignored; empty items are skipped, so the
  trailing comma that option builders like to leave (``"replace,timestamp,"``) is harmless.
- A bracketed value is returned without its outer brackets: ``conflation_key=[/a,/b]`` gives
  ``{"conflation_key": "/a,/b"}``. Brackets nest (``[/arr[0],/b]``); an unbalanced ``[`` or ``]``
  fails. After the closing ``]`` only the next ``,`` or the end may follow.
- ``start,<s>``: a bare ``start`` followed by an item that begins with a digit or ``.`` takes that
  item as its value, so ``o=start,5`` gives ``{"start": "5"}`` (same as ``start=5``).
- A key given twice fails (``live,live``): a client that contradicts itself is told so.
- A bare key maps to ``None``; ``key=`` maps to ``""`` (the typed layer rejects both where a value
  is needed).
- Text longer than :data:`MAX_OPTIONS_TEXT` or with more than :data:`MAX_OPTIONS_ITEMS` items fails.

Typed layer, one function per command, each returning a frozen msgspec Struct:

=====================  =========================================================================
function               options (anything else fails)
=====================  =========================================================================
subscribe_options      live, fully_durable, pause, resume, replace, timestamp (flags);
                       rate=<rate>, rate_max_gap=<interval>, conflation=<interval>,
                       conflation_key=<path> | [<path>,...], bookmark_not_found=now|epoch|fail,
                       max_backlog=<n >= 1>; for a SOW topic (§10) oof, no_sowkey, no_empties,
                       send_keys (flags); with ``command="sow_and_subscribe"`` (and the delta
                       forms) also skip_n=<n >= 0>, top_n=<n >= 0>
sow_options            a ``sow`` query: skip_n=<n >= 0>, top_n=<n >= 0>; timestamp,
                       no_sowkey, send_keys (flags)
sow_delete_options     cancel, expire (flags); lease_extend=<interval> (reserved: parsed and
                       checked so clients get a stable answer; the server decides whether it
                       supports it)
logon_options          ack_conflation=<interval >= 0>
heartbeat_options      start,<interval > 0> | start=<interval> | beat
=====================  =========================================================================

Rates (:func:`parse_rate`): ``1000`` or ``1000/s`` messages per second (decimals allowed),
``500KB`` or ``500KB/s`` bytes per second (any size of :mod:`protocol.units`), ``2X``, ``.5X``,
``1.5x`` multiples of the original publish pace. Every rate must be > 0.

Combinations that are refused (docs/protocol.md §6 and the AMPS rules it follows): ``live`` with
``rate``, ``pause``, ``resume`` or ``fully_durable``; ``pause`` with ``resume``; ``rate_max_gap``
without ``rate``; ``conflation_key`` without ``conflation``; more than one of ``cancel``,
``expire``, ``lease_extend``; heartbeat with both or neither of ``start`` and ``beat``.
Which options need a bookmark (``rate``, ``live``, ...) is not known here: the server checks that
with :meth:`SubscribeOptions.bookmark_only`.

Every failure raises :class:`InvalidOptions` (``reason = "invalid options"``, the stable failure
reason of docs/protocol.md §3), naming the option and what is accepted. Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import math
import re
from typing import Literal

import msgspec

from .units import INTERVAL_FORMS, UnitError, parse_interval, parse_size

__all__ = [
    "MAX_OPTIONS_ITEMS",
    "MAX_OPTIONS_TEXT",
    "HeartbeatOptions",
    "InvalidOptions",
    "LogonOptions",
    "Rate",
    "SowDeleteOptions",
    "SowOptions",
    "SubscribeOptions",
    "heartbeat_options",
    "logon_options",
    "parse_options",
    "parse_rate",
    "sow_delete_options",
    "sow_options",
    "subscribe_options",
]

MAX_OPTIONS_TEXT = 64 * 1024
"""Longest ``o`` header accepted, in characters."""
MAX_OPTIONS_ITEMS = 256
"""Most comma-separated items accepted in one ``o`` header."""

_KEY_RE = re.compile(r"[a-z_][a-z0-9_]*")
_NUMBER_RE = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_MAX_BACKLOG_LIMIT = 2**31 - 1

RATE_FORMS = "messages/s as a number (1000), bytes/s as a size (500KB), or a multiple (2X, .5X)"


class InvalidOptions(ValueError):
    """An ``o`` header that does not parse or does not fit the command.

    ``reason`` is the stable client-facing failure reason; ``option`` names the offending option
    when there is one (``None`` for syntax errors that are not about one option).
    """

    reason = "invalid options"

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


# --------------------------------------------------------------------------------------------
# syntax


def _split_items(text: str) -> list[str]:
    """Split at commas outside square brackets; strip items; drop empty ones."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidOptions(
                    f"unbalanced ']' at position {i} of options {_quote(text)}; "
                    "a value with commas is written key=[a,b]"
                )
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise InvalidOptions(
            f"unclosed '[' in options {_quote(text)}; a value with commas is written key=[a,b]"
        )
    items.append(text[start:])
    out = [item.strip() for item in items if item.strip()]
    if len(out) > MAX_OPTIONS_ITEMS:
        raise InvalidOptions(f"{len(out)} options given; at most {MAX_OPTIONS_ITEMS} are accepted")
    return out


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_options(text: str | None) -> dict[str, str | None]:
    """Parse an ``o`` header into ``{key: value or None}`` (syntax only; see module docstring).

    ``None`` or blank text gives ``{}``. Raises :class:`InvalidOptions`.
    """
    if text is None:
        return {}
    if not isinstance(text, str):
        raise InvalidOptions(f"options must be a string, got {type(text).__name__}")
    if len(text) > MAX_OPTIONS_TEXT:
        raise InvalidOptions(
            f"options of {len(text)} characters are too long (at most {MAX_OPTIONS_TEXT})"
        )
    items = _split_items(text)
    result: dict[str, str | None] = {}
    i = 0
    n = len(items)
    while i < n:
        item = items[i]
        i += 1
        key, sep, raw = item.partition("=")
        key = key.strip().lower()
        if not _KEY_RE.fullmatch(key):
            raise InvalidOptions(
                f"{_quote(item)} is not an option: expected name or name=value "
                "(names are letters, digits and _)",
                option=key or None,
            )
        value: str | None
        if sep:
            value = raw.strip()
            if value.startswith("["):
                if not value.endswith("]"):
                    raise InvalidOptions(
                        f"option {key!r}: text after the closing ']' in {_quote(value)}; "
                        "write key=[a,b] followed by ',' or the end",
                        option=key,
                    )
                value = value[1:-1].strip()
        else:
            value = None
            # Heartbeat's "start,<seconds>": the seconds arrive as the next item.
            if key == "start" and i < n and items[i][0] in "0123456789.":
                value = items[i]
                i += 1
        if key in result:
            raise InvalidOptions(f"option {key!r} is given more than once", option=key)
        result[key] = value
    return result


# --------------------------------------------------------------------------------------------
# typed values


class Rate(msgspec.Struct, frozen=True):
    """A replay rate cap: ``value`` messages/s, bytes/s, or times the original publish pace."""

    kind: Literal["msgs", "bytes", "multiple"]
    value: float


class SubscribeOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Options of a ``subscribe`` command; ``SubscribeOptions()`` is "no options".

    Intervals (``rate_max_gap``, ``conflation``) are seconds.
    """

    live: bool = False
    fully_durable: bool = False
    pause: bool = False
    resume: bool = False
    replace: bool = False
    rate: Rate | None = None
    rate_max_gap: float | None = None
    timestamp: bool = False
    conflation: float | None = None
    conflation_key: tuple[str, ...] | None = None
    bookmark_not_found: Literal["now", "epoch", "fail"] | None = None
    max_backlog: int | None = None
    # State of the World (docs/protocol.md §10)
    oof: bool = False
    no_sowkey: bool = False
    no_empties: bool = False
    send_keys: bool = False
    skip_n: int | None = None
    top_n: int | None = None

    def bookmark_only(self) -> tuple[str, ...]:
        """Names of the options set here that docs/protocol.md §6 allows only on a bookmark subscribe."""
        names = ("live", "fully_durable", "pause", "resume", "rate", "bookmark_not_found")
        return tuple(name for name in names if getattr(self, name))


class SowOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Options of a ``sow`` query; ``SowOptions()`` is "no options"."""

    skip_n: int | None = None
    top_n: int | None = None
    timestamp: bool = False
    no_sowkey: bool = False
    send_keys: bool = False


class SowDeleteOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Options of a ``sow_delete`` on a queue; ``lease_extend`` (seconds) is reserved."""

    cancel: bool = False
    expire: bool = False
    lease_extend: float | None = None


class LogonOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Options of a ``logon``: ``ack_conflation`` seconds (``None`` = ack at once)."""

    ack_conflation: float | None = None


class HeartbeatOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Options of a ``heartbeat``: exactly one of ``start`` (seconds) or ``beat``."""

    start: float | None = None
    beat: bool = False


# each command's options, named in its Struct's order (the order an unknown option's refusal lists)
_SOW_SUBSCRIBE_KNOWN = SubscribeOptions.__struct_fields__
_SUBSCRIBE_KNOWN = tuple(k for k in _SOW_SUBSCRIBE_KNOWN if k not in ("skip_n", "top_n"))
_SOW_DELETE_KNOWN = SowDeleteOptions.__struct_fields__


def _check_known(opts: dict[str, str | None], known: tuple[str, ...], command: str) -> None:
    for key in opts:
        if key not in known:
            raise InvalidOptions(
                f"unknown option {key!r} for {command}; accepted: {', '.join(known)}",
                option=key,
            )


def _flag(opts: dict[str, str | None], name: str) -> bool:
    if name not in opts:
        return False
    if opts[name] is not None:
        raise InvalidOptions(f"option {name!r} takes no value (write just {name})", option=name)
    return True


def _value(opts: dict[str, str | None], name: str, forms: str) -> str | None:
    if name not in opts:
        return None
    value = opts[name]
    if not value:
        raise InvalidOptions(f"option {name!r} needs a value: {name}=<{forms}>", option=name)
    return value


def _interval(
    opts: dict[str, str | None], name: str, *, positive: bool, forms: str | None = None
) -> float | None:
    text = _value(opts, name, "interval")
    if text is None:
        return None
    try:
        seconds = parse_interval(text)
    except UnitError as exc:
        raise InvalidOptions(f"option {name!r}: {exc}", option=name) from None
    if positive and seconds <= 0:
        raise InvalidOptions(
            f"option {name!r} must be greater than zero, got {text!r}; "
            f"expected {forms or INTERVAL_FORMS}",
            option=name,
        )
    return seconds


def _number(text: str) -> float | None:
    return float(text) if _NUMBER_RE.fullmatch(text) else None


def parse_rate(text: str) -> Rate:
    """Parse a ``rate`` value (see module docstring). Raises :class:`InvalidOptions`."""
    s = text.strip()
    body = s[:-2].rstrip() if s[-2:].lower() == "/s" else s
    if not body:
        raise InvalidOptions(f"rate {text!r} is empty; expected {RATE_FORMS}", option="rate")
    rate: Rate
    if body[-1] in "xX":
        if body is not s:
            raise InvalidOptions(
                f"rate {text!r}: a multiple of the publish pace has no '/s'; expected {RATE_FORMS}",
                option="rate",
            )
        factor = _number(body[:-1].rstrip())
        if factor is None:
            raise InvalidOptions(
                f"rate {text!r} is not a number followed by X; expected {RATE_FORMS}", option="rate"
            )
        rate = Rate("multiple", factor)
    elif (count := _number(body)) is not None:
        rate = Rate("msgs", count)
    else:
        try:
            rate = Rate("bytes", float(parse_size(body)))
        except UnitError:
            raise InvalidOptions(
                f"rate {text!r} is not a rate; expected {RATE_FORMS}", option="rate"
            ) from None
    if not (rate.value > 0 and math.isfinite(rate.value)):
        raise InvalidOptions(
            f"rate {text!r} must be greater than zero; expected {RATE_FORMS}", option="rate"
        )
    return rate


def _conflict(opts: dict[str, str | None], a: str, b: str, why: str = "") -> None:
    if a in opts and b in opts:
        raise InvalidOptions(f"options {a!r} and {b!r} cannot be combined{why}", option=b)


def _count(opts: dict[str, str | None], name: str, least: int = 0) -> int | None:
    text = _value(opts, name, "n")
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or not (
        least <= int(text) <= _MAX_BACKLOG_LIMIT
    ):
        raise InvalidOptions(
            f"option {name!r} is {text!r}; expected a whole number from {least} to "
            f"{_MAX_BACKLOG_LIMIT}",
            option=name,
        )
    return int(text)


def sow_options(text: str | None) -> SowOptions:
    """Parse and check the ``o`` header of a ``sow`` query. Raises :class:`InvalidOptions`."""
    opts = parse_options(text)
    if not opts:
        return _NO_SOW_OPTIONS
    _check_known(opts, SowOptions.__struct_fields__, "sow")
    return SowOptions(
        skip_n=_count(opts, "skip_n"),
        top_n=_count(opts, "top_n"),
        timestamp=_flag(opts, "timestamp"),
        no_sowkey=_flag(opts, "no_sowkey"),
        send_keys=_flag(opts, "send_keys"),
    )


_NO_SOW_OPTIONS = SowOptions()


def subscribe_options(text: str | None, command: str = "subscribe") -> SubscribeOptions:
    """Parse and check the ``o`` header of a ``subscribe`` (or, with ``command``, of a
    ``sow_and_subscribe``, ``delta_subscribe`` or ``sow_and_delta_subscribe``, which also take
    ``skip_n`` and ``top_n``). Raises :class:`InvalidOptions`."""
    opts = parse_options(text)
    if not opts:
        return SubscribeOptions()
    known = _SOW_SUBSCRIBE_KNOWN if command.startswith("sow_and_") else _SUBSCRIBE_KNOWN
    _check_known(opts, known, command)
    live_why = " (live delivers before durability; rate, pause and resume need the replay pacer)"
    for other in ("rate", "pause", "resume", "fully_durable"):
        _conflict(opts, "live", other, live_why)
    _conflict(opts, "pause", "resume")
    if "rate_max_gap" in opts and "rate" not in opts:
        raise InvalidOptions(
            "option 'rate_max_gap' needs 'rate' (e.g. rate=5X,rate_max_gap=10s)",
            option="rate_max_gap",
        )
    if "conflation_key" in opts and "conflation" not in opts:
        raise InvalidOptions(
            "option 'conflation_key' needs 'conflation=<interval>' (e.g. conflation=1s)",
            option="conflation_key",
        )

    rate_text = _value(opts, "rate", RATE_FORMS)
    rate = parse_rate(rate_text) if rate_text is not None else None

    keys: tuple[str, ...] | None = None
    keys_text = _value(opts, "conflation_key", "/field or [/field,...]")
    if keys_text is not None:
        keys = tuple(k.strip() for k in keys_text.split(","))
        for k in keys:
            if not k.startswith("/") or len(k) < 2:
                raise InvalidOptions(
                    f"option 'conflation_key': {k!r} is not a field path; "
                    "expected /field or [/field,/other/field]",
                    option="conflation_key",
                )

    not_found = _value(opts, "bookmark_not_found", "now|epoch|fail")
    if not_found is not None:
        not_found = not_found.lower()
        if not_found not in ("now", "epoch", "fail"):
            raise InvalidOptions(
                f"option 'bookmark_not_found' is {opts['bookmark_not_found']!r}; "
                "accepted: now, epoch, fail",
                option="bookmark_not_found",
            )

    backlog = _count(opts, "max_backlog", least=1)  # checked here: before the flags, as ever
    return SubscribeOptions(
        live=_flag(opts, "live"),
        fully_durable=_flag(opts, "fully_durable"),
        pause=_flag(opts, "pause"),
        resume=_flag(opts, "resume"),
        replace=_flag(opts, "replace"),
        rate=rate,
        rate_max_gap=_interval(opts, "rate_max_gap", positive=True),
        timestamp=_flag(opts, "timestamp"),
        conflation=_interval(opts, "conflation", positive=True),
        conflation_key=keys,
        bookmark_not_found=not_found,  # type: ignore[arg-type]
        max_backlog=backlog,
        oof=_flag(opts, "oof"),
        no_sowkey=_flag(opts, "no_sowkey"),
        no_empties=_flag(opts, "no_empties"),
        send_keys=_flag(opts, "send_keys"),
        skip_n=_count(opts, "skip_n"),
        top_n=_count(opts, "top_n"),
    )


def sow_delete_options(text: str | None) -> SowDeleteOptions:
    """Parse and check the ``o`` header of a ``sow_delete``. Raises :class:`InvalidOptions`."""
    if not text:
        return _NO_SOW_DELETE_OPTIONS  # the common ack: one per read of a queue consumer
    opts = parse_options(text)
    if not opts:
        return SowDeleteOptions()
    _check_known(opts, _SOW_DELETE_KNOWN, "sow_delete")
    given = [k for k in _SOW_DELETE_KNOWN if k in opts]
    if len(given) > 1:
        raise InvalidOptions(
            f"options {' and '.join(repr(k) for k in given)} cannot be combined; "
            "give one of cancel, expire, lease_extend=<interval>",
            option=given[1],
        )
    return SowDeleteOptions(
        cancel=_flag(opts, "cancel"),
        expire=_flag(opts, "expire"),
        lease_extend=_interval(opts, "lease_extend", positive=True),
    )


_NO_SOW_DELETE_OPTIONS = SowDeleteOptions()


def logon_options(text: str | None) -> LogonOptions:
    """Parse and check the ``o`` header of a ``logon``. Raises :class:`InvalidOptions`."""
    opts = parse_options(text)
    if not opts:
        return LogonOptions()
    _check_known(opts, LogonOptions.__struct_fields__, "logon")
    return LogonOptions(ack_conflation=_interval(opts, "ack_conflation", positive=False))


def heartbeat_options(text: str | None) -> HeartbeatOptions:
    """Parse and check the ``o`` header of a ``heartbeat``. Raises :class:`InvalidOptions`."""
    opts = parse_options(text)
    _check_known(opts, HeartbeatOptions.__struct_fields__, "heartbeat")
    if len(opts) != 1:
        raise InvalidOptions(
            "heartbeat needs exactly one of start,<seconds> or beat",
            option="start" if opts else None,
        )
    if "start" in opts and not opts["start"]:
        raise InvalidOptions(
            "option 'start' needs an interval: start,<seconds> (e.g. start,5)", option="start"
        )
    return HeartbeatOptions(
        start=_interval(opts, "start", positive=True),
        beat=_flag(opts, "beat"),
    )
