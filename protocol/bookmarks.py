"""Bookmarks: the ``bm`` header of docs/protocol.md §5, as typed values.

This module owns the bookmark text forms and the timestamp text form.

Text forms accepted by :func:`parse_bookmark` (whitespace around the whole text, around list
items, around ``:`` and inside range brackets is ignored; nowhere else)::

    point     := epoch | now | bookmark | timestamp
    epoch     := "0"                                       -> EPOCH   (replay everything)
    now       := "0|1|"                                    -> NOW     (no replay)
    bookmark  := publisher_id "|" seq "|"                  -> Bookmark(publisher_id, seq)
    timestamp := YYYYmmdd "T" HHMMSS ["." f{1,6}] ["Z"]    -> Timestamp(micros)   (always UTC)
    list      := point ("," point)+                        -> BookmarkList(items)
    side      := point | list
    range     := ("[" | "(") side ":" side ("]" | ")")     -> Range(begin, begin_inclusive,
                                                                     end, end_inclusive)

- ``publisher_id`` and ``seq`` are ASCII decimal, unsigned 64-bit, without sign or leading zeros,
  so each number has one spelling. ``str()`` of every value is canonical text and
  ``parse_bookmark(str(x)) == x``. ``publisher_id`` 0 is reserved: ``0|1|`` is NOW, any other
  ``0|n|`` fails.
- Decision: the trailing ``|`` is optional on input (``123|45`` = ``123|45|``, ``0|1`` = NOW);
  output always has it, as AMPS does.
- Timestamps: uppercase ``T`` and ``Z`` only (AMPS accepts only a literal ``Z``); 1 to 6 fraction
  digits (``.5`` = 500000 us); dates are checked (no Feb 30, no second 60). ``micros`` is
  microseconds since 1970-01-01T00:00:00Z.
- ``[`` / ``]`` include the begin / end message, ``(`` / ``)`` exclude it. Begin and end may each be
  a point or a list; the end may be in the future. A range whose begin and end are both timestamps
  must not begin after it ends. Ranges do not nest and are not list items.
- Bounds: text over :data:`MAX_BOOKMARK_TEXT` characters, or a list over :data:`MAX_LIST_ITEMS`
  items, fails before it is split.

Timestamps written by the server (``ts``, ``lp`` headers): :func:`format_timestamp` gives
``YYYYmmddTHHMMSS.ffffffZ``, always six fraction digits, e.g. ``20261121T204005.123456Z``.

Every failure raises :class:`InvalidBookmark` (``reason = "invalid bookmark"``, the stable failure
reason of docs/protocol.md §3) whose message says which part was wrong. Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import msgspec

__all__ = [
    "BOOKMARK_FORMAT",
    "EPOCH",
    "MAX_BOOKMARK_TEXT",
    "MAX_LIST_ITEMS",
    "MAX_U64",
    "NOW",
    "Bookmark",
    "BookmarkList",
    "BookmarkSpec",
    "Epoch",
    "InvalidBookmark",
    "Now",
    "Point",
    "Range",
    "Timestamp",
    "format_bookmark",
    "format_timestamp",
    "parse_bookmark",
    "parse_timestamp",
    "publisher_bookmark",
]

MAX_U64 = 2**64 - 1
MAX_BOOKMARK_TEXT = 1024 * 1024
"""Longest ``bm`` text accepted, in characters (1 MiB)."""
MAX_LIST_ITEMS = 10_000
"""Most items in one bookmark list (or one side of a range)."""

_FORMS = (
    "expected 0 (EPOCH), 0|1| (NOW), <publisher_id>|<seq>|, YYYYmmddTHHMMSS[.ffffff][Z], "
    "a comma list of those, or a range [begin:end] with ( ) for exclusive ends"
)


class InvalidBookmark(ValueError):
    """A ``bm`` value that does not parse; the message names the part that is wrong."""

    reason = "invalid bookmark"


# --------------------------------------------------------------------------------------------
# typed values


class Epoch(msgspec.Struct, frozen=True):
    """``0``: replay the whole transaction log, then live."""

    def __str__(self) -> str:
        return "0"


class Now(msgspec.Struct, frozen=True):
    """``0|1|``: no replay, live only."""

    def __str__(self) -> str:
        return "0|1|"


EPOCH = Epoch()
NOW = Now()


class Bookmark(msgspec.Struct, frozen=True):
    """One stored message: ``<publisher_id>|<seq>|``. Publisher 0 is reserved (EPOCH / NOW)."""

    publisher_id: int
    seq: int

    def __post_init__(self) -> None:
        if not 0 < self.publisher_id <= MAX_U64:
            raise InvalidBookmark(
                f"publisher id {self.publisher_id} is out of range 1..{MAX_U64} "
                "(0 is reserved: 0 is EPOCH, 0|1| is NOW)"
            )
        if not 0 <= self.seq <= MAX_U64:
            raise InvalidBookmark(f"sequence {self.seq} is out of range 0..{MAX_U64}")

    def __str__(self) -> str:
        return f"{self.publisher_id}|{self.seq}|"


class Timestamp(msgspec.Struct, frozen=True, order=True):
    """A UTC time, in microseconds since the Unix epoch."""

    micros: int

    def __str__(self) -> str:
        return format_timestamp(self.micros)


Point = Epoch | Now | Bookmark | Timestamp


class BookmarkList(msgspec.Struct, frozen=True):
    """A comma list of points (two or more when parsed); replay starts after the oldest."""

    items: tuple[Point, ...]

    def __str__(self) -> str:
        return ",".join(str(item) for item in self.items)


class Range(msgspec.Struct, frozen=True):
    """``[``/``(`` begin ``:`` end ``]``/``)``: replay from begin to end, then complete."""

    begin: Point | BookmarkList
    begin_inclusive: bool
    end: Point | BookmarkList
    end_inclusive: bool

    def __str__(self) -> str:
        return (
            f"{'[' if self.begin_inclusive else '('}{self.begin}:"
            f"{self.end}{']' if self.end_inclusive else ')'}"
        )


BookmarkSpec = Epoch | Now | Bookmark | Timestamp | BookmarkList | Range


# --------------------------------------------------------------------------------------------
# formatting


def format_bookmark(publisher_id: int, seq: int) -> str:
    """``"<publisher_id>|<seq>|"``. Hot path: no range checks (the journal's ids are valid)."""
    return f"{publisher_id}|{seq}|"


BOOKMARK_FORMAT = b"%d|%d|"
""":func:`format_bookmark` as a bytes ``%`` template of (publisher_id, seq), for byte formats
that are assembled once at import and filled per message (server/frames.py)."""


# One-entry cache of the "YYYYmmddTHHMMSS" prefix: the server stamps many messages per second.
# A single tuple is read and replaced whole, so concurrent threads never see a torn pair.
_ts_cache: tuple[int, str] = (0, "19700101T000000")


def _format_seconds(sec: int) -> str:
    t = time.gmtime(sec)
    if not 1 <= t.tm_year <= 9999:
        raise ValueError(f"timestamp second {sec} is outside years 0001..9999")
    return (
        f"{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}T{t.tm_hour:02d}{t.tm_min:02d}{t.tm_sec:02d}"
    )


def format_timestamp(micros: int) -> str:
    """``YYYYmmddTHHMMSS.ffffffZ`` (UTC) for ``micros`` since the Unix epoch."""
    global _ts_cache
    sec, frac = divmod(micros, 1_000_000)
    cached = _ts_cache
    if cached[0] == sec:
        prefix = cached[1]
    else:
        prefix = _format_seconds(sec)
        _ts_cache = (sec, prefix)
    return f"{prefix}.{frac:06d}Z"


# --------------------------------------------------------------------------------------------
# parsing

_TS_RE = re.compile(
    r"([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})(?:\.([0-9]{1,6}))?Z?"
)
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DECIMAL_RE = re.compile(r"0|[1-9][0-9]*")
_TS_FORM = "YYYYmmddTHHMMSS[.ffffff][Z], e.g. 20261121T204005.123456Z"


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_timestamp(text: str) -> Timestamp:
    """Parse ``YYYYmmddTHHMMSS[.ffffff][Z]`` (UTC). Raises :class:`InvalidBookmark`."""
    m = _TS_RE.fullmatch(text)
    if m is None:
        raise InvalidBookmark(f"timestamp {_short(text)} is malformed; expected {_TS_FORM}")
    *fields, frac = m.groups()
    year, month, day, hour, minute, second = map(int, fields)
    try:
        dt = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError as exc:
        raise InvalidBookmark(f"timestamp {_short(text)} is not a valid UTC time: {exc}") from None
    delta = dt - _UTC_EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000
    if frac:
        micros += int(frac.ljust(6, "0"))
    return Timestamp(micros)


def _decimal(text: str, what: str, whole: str) -> int:
    if not text:
        raise InvalidBookmark(f"bookmark {_short(whole)}: {what} is empty; expected {_FORMS}")
    if text[0] in "+-":
        sign = "negative" if text[0] == "-" else "signed"
        raise InvalidBookmark(
            f"bookmark {_short(whole)}: {what} {_short(text)} is {sign}; "
            "ids and sequences are unsigned decimal"
        )
    if not _DECIMAL_RE.fullmatch(text):
        raise InvalidBookmark(
            f"bookmark {_short(whole)}: {what} {_short(text)} is not a decimal number "
            "(digits 0-9, no leading zeros)"
        )
    # Length first: never convert a huge digit string.
    if len(text) > 20 or int(text) > MAX_U64:
        raise InvalidBookmark(
            f"bookmark {_short(whole)}: {what} {_short(text)} exceeds 2**64-1 ({MAX_U64})"
        )
    return int(text)


def _point(text: str) -> Point:
    if text == "0":
        return EPOCH
    if "|" in text:
        parts = text.split("|")
        # "id|seq|" -> [id, seq, ""]; the trailing "|" is optional: "id|seq" -> [id, seq].
        if len(parts) == 3 and parts[2] == "":
            parts.pop()
        if len(parts) != 2:
            raise InvalidBookmark(
                f"bookmark {_short(text)} has {text.count('|')} '|'; expected <publisher_id>|<seq>|"
            )
        publisher_id = _decimal(parts[0], "publisher id", text)
        seq = _decimal(parts[1], "sequence", text)
        if publisher_id == 0:
            if seq == 1:
                return NOW
            raise InvalidBookmark(
                f"bookmark {_short(text)}: publisher id 0 is reserved "
                "(0 is EPOCH, 0|1| is NOW); a stored bookmark has a non-zero publisher id"
            )
        return Bookmark(publisher_id, seq)
    if len(text) >= 9 and text[8] == "T" and text[:8].isdigit():
        return parse_timestamp(text)
    raise InvalidBookmark(f"{_short(text)} is not a bookmark; {_FORMS}")


def publisher_bookmark(text: str) -> tuple[int, int] | None:
    """``(publisher_id, seq)`` when ``text`` is the bookmark of one message
    (``<publisher_id>|<seq>|``: what :func:`parse_bookmark` reads as a :class:`Bookmark`); None
    for any other text (epoch, now, a timestamp, a list, a range, not a bookmark). For the paths
    that see one per message: the common text raises and catches nothing."""
    parts = text.strip().split("|")
    if len(parts) == 3 and not parts[2]:
        parts.pop()
    if len(parts) != 2:
        return None
    p, s = parts
    if len(p) > 20 or len(s) > 20 or not (_DECIMAL_RE.fullmatch(p) and _DECIMAL_RE.fullmatch(s)):
        return None
    publisher_id, seq = int(p), int(s)
    if publisher_id == 0 or publisher_id > MAX_U64 or seq > MAX_U64:
        return None
    return publisher_id, seq


def _side(text: str, where: str) -> Point | BookmarkList:
    """A point or a comma list; ``where`` (e.g. ``"range begin"``) prefixes error messages."""
    stripped = text.strip()
    if not stripped:
        raise InvalidBookmark(f"{where or 'bookmark'} is empty; {_FORMS}")
    try:
        if "," not in stripped:
            return _point(stripped)
        count = stripped.count(",") + 1
        if count > MAX_LIST_ITEMS:
            raise InvalidBookmark(
                f"bookmark list has {count} items; at most {MAX_LIST_ITEMS} are accepted"
            )
        items = []
        for n, item in enumerate(stripped.split(","), 1):
            item = item.strip()
            if not item:
                raise InvalidBookmark(f"bookmark list item {n} is empty (stray ','); {_FORMS}")
            try:
                items.append(_point(item))
            except InvalidBookmark as exc:
                raise InvalidBookmark(f"bookmark list item {n}: {exc}") from None
        return BookmarkList(tuple(items))
    except InvalidBookmark as exc:
        if where:
            raise InvalidBookmark(f"{where}: {exc}") from None
        raise


def parse_bookmark(text: str) -> BookmarkSpec:
    """Parse a ``bm`` header (see module docstring). Raises :class:`InvalidBookmark`."""
    if not isinstance(text, str):
        raise InvalidBookmark(f"bookmark must be a string, got {type(text).__name__}; {_FORMS}")
    if len(text) > MAX_BOOKMARK_TEXT:
        raise InvalidBookmark(
            f"bookmark of {len(text)} characters is too long (at most {MAX_BOOKMARK_TEXT})"
        )
    s = text.strip()
    if not s:
        raise InvalidBookmark(f"bookmark is empty; {_FORMS}")
    first, last = s[0], s[-1]
    if first in "[(":
        if last not in "])":
            raise InvalidBookmark(
                f"unbalanced range brackets: range opens with {first!r} but does not end "
                "with ']' or ')'"
            )
        inner = s[1:-1]
        if any(ch in inner for ch in "[]()"):
            raise InvalidBookmark(
                "nested ranges or stray brackets inside a range; begin and end are bookmarks, "
                "lists or timestamps"
            )
        colons = inner.count(":")
        if colons != 1:
            raise InvalidBookmark(
                f"range needs exactly one ':' between begin and end, found {colons}"
            )
        begin_text, end_text = inner.split(":")
        begin = _side(begin_text, "range begin")
        end = _side(end_text, "range end")
        if isinstance(begin, Timestamp) and isinstance(end, Timestamp) and begin > end:
            raise InvalidBookmark(
                f"range begins at {begin} after it ends at {end}; swap begin and end"
            )
        return Range(begin, first == "[", end, last == "]")
    if "[" in s or "(" in s:
        raise InvalidBookmark(
            "range brackets inside a bookmark or list; a range encloses the whole text"
        )
    if last in "])":
        raise InvalidBookmark(
            f"unbalanced range brackets: text ends with {last!r} but does not start with '[' or '('"
        )
    if ":" in s:
        raise InvalidBookmark(
            "':' outside a range; a range is written [begin:end], (begin:end), [begin:end) "
            "or (begin:end]"
        )
    if any(ch in s for ch in "[]()"):
        raise InvalidBookmark(
            "range brackets inside a bookmark or list; a range encloses the whole text"
        )
    return _side(s, "")
