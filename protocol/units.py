"""Intervals and sizes as they are written in option strings and in the configuration.

This module owns two small text formats (docs/protocol.md §6 "Intervals ... sizes"):

Interval -> seconds (``float``)::

    interval := number [ws] [unit]          (whitespace around the whole text is ignored)
    number   := digits [ "." digits ] | "." digits
    unit     := "ms" | "s" | "m" | "h" | "d"  (case-insensitive; no unit = seconds)

    "500ms" -> 0.5   "10s" -> 10.0   "2.5s" -> 2.5   "5m" -> 300.0   "1h" -> 3600.0
    "1d" -> 86400.0  "30" -> 30.0    "0" -> 0.0

Size -> bytes (``int``)::

    size := digits [ws] [unit]
    unit := "b" | "kb" | "mb" | "gb" | "tb"   (case-insensitive; binary: KB = 1024; no unit = bytes)

    "512B" -> 512   "500KB" -> 512000   "10MB" -> 10485760   "1GB" -> 1073741824   "4096" -> 4096

Decisions:

- Negative values, signs, exponents (``1e3``), ``nan``/``inf`` and empty text are rejected.
- Sizes are whole numbers: ``1.5GB`` is rejected (write ``1536MB``), so a size never rounds.
- A JSON number (``int``/``float``, not ``bool``) is accepted where text is, and means seconds
  or bytes; numeric header values may arrive that way (docs/protocol.md §1).
- Input longer than 64 characters is rejected before any parsing (bounded input), and an
  interval over 100 years is rejected (event-loop timers overflow on absurd values).
- Zero is a valid value here; whether zero makes sense is the caller's decision.

Every failure raises :class:`UnitError` (a ``ValueError``) whose message quotes the input, says
what was wrong and lists the accepted forms. This module imports nothing else from the project.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "INTERVAL_FORMS",
    "MAX_INTERVAL",
    "MAX_UNIT_TEXT",
    "SIZE_FORMS",
    "UnitError",
    "parse_interval",
    "parse_size",
]

MAX_UNIT_TEXT = 64
"""Longest interval or size text accepted, in characters."""
MAX_INTERVAL = 100 * 365 * 86400.0
"""Longest interval accepted, in seconds (100 years): larger ones overflow event-loop timers."""

INTERVAL_FORMS = "a number of seconds, or a number with ms, s, m, h or d (e.g. 500ms, 2.5s, 5m, 1d)"
SIZE_FORMS = (
    "a whole number of bytes, or a whole number with B, KB, MB, GB or TB (e.g. 512B, 500KB, 10MB)"
)

_MAX_SIZE = 2**63 - 1

_INTERVAL_UNITS: dict[str, float] = {
    "": 1.0,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1024,
    "mb": 1024**2,
    "gb": 1024**3,
    "tb": 1024**4,
}

# ASCII digits only: str.isdigit() would accept "²" or Arabic-Indic digits.
_INTERVAL_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)")
_SIZE_RE = re.compile(r"([0-9]+)\s*([A-Za-z]*)")


class UnitError(ValueError):
    """An interval or size that does not parse; the message says what was wrong."""


def _text_of(value: object, what: str, forms: str) -> str:
    if isinstance(value, str):
        if len(value) > MAX_UNIT_TEXT:
            raise UnitError(
                f"{what} of {len(value)} characters is too long (at most {MAX_UNIT_TEXT}); "
                f"expected {forms}"
            )
        return value.strip()
    raise UnitError(f"{what} must be text, got {type(value).__name__}; expected {forms}")


def parse_interval(text: str | float) -> float:
    """Return the interval ``text`` in seconds (see the module docstring for the forms).

    Raises :class:`UnitError` for anything else, e.g. ``"10 parsecs"``, ``"-5s"``, ``""``.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not math.isfinite(text) or not 0 <= text <= MAX_INTERVAL:
            raise UnitError(
                f"interval {text!r} must be a finite number from 0 to {MAX_INTERVAL:.0f}; "
                f"expected {INTERVAL_FORMS}"
            )
        return float(text)
    s = _text_of(text, "interval", INTERVAL_FORMS)
    if not s:
        raise UnitError(f"interval is empty; expected {INTERVAL_FORMS}")
    m = _INTERVAL_RE.fullmatch(s)
    if m is None:
        if s[0] in "+-":
            raise UnitError(
                f"interval {s!r} has a sign; intervals are >= 0; expected {INTERVAL_FORMS}"
            )
        raise UnitError(
            f"interval {s!r} is not a number with an optional unit; expected {INTERVAL_FORMS}"
        )
    number, unit = m.groups()
    factor = _INTERVAL_UNITS.get(unit.lower())
    if factor is None:
        raise UnitError(
            f"interval {s!r} has unknown unit {unit!r} (use ms, s, m, h or d); expected {INTERVAL_FORMS}"
        )
    seconds = float(number) * factor
    if seconds > MAX_INTERVAL:
        raise UnitError(
            f"interval {s!r} is too large (at most 100 years = {MAX_INTERVAL:.0f}s); "
            f"expected {INTERVAL_FORMS}"
        )
    return seconds


def parse_size(text: str | int) -> int:
    """Return the size ``text`` in bytes (binary units: KB = 1024; see the module docstring).

    Raises :class:`UnitError` for anything else, e.g. ``"1.5GB"``, ``"10 MiB"``, ``"-1"``.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text <= _MAX_SIZE:
            raise UnitError(
                f"size {text!r} must be between 0 and {_MAX_SIZE}; expected {SIZE_FORMS}"
            )
        return text
    s = _text_of(text, "size", SIZE_FORMS)
    if not s:
        raise UnitError(f"size is empty; expected {SIZE_FORMS}")
    m = _SIZE_RE.fullmatch(s)
    if m is None:
        if s[0] in "+-":
            raise UnitError(f"size {s!r} has a sign; sizes are >= 0; expected {SIZE_FORMS}")
        if _INTERVAL_RE.fullmatch(s) is not None:
            raise UnitError(
                f"size {s!r} is not a whole number; use a smaller unit (e.g. 1536MB for 1.5GB); "
                f"expected {SIZE_FORMS}"
            )
        raise UnitError(
            f"size {s!r} is not a whole number with an optional unit; expected {SIZE_FORMS}"
        )
    number, unit = m.groups()
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise UnitError(
            f"size {s!r} has unknown unit {unit!r} (use B, KB, MB, GB or TB); expected {SIZE_FORMS}"
        )
    size = int(number) * factor
    if size > _MAX_SIZE:
        raise UnitError(
            f"size {s!r} is too large (at most {_MAX_SIZE} bytes); expected {SIZE_FORMS}"
        )
    return size
