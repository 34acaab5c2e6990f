"""Frames on the wire (docs/protocol.md §1). This module owns the frame layout; nobody else slices it.

```
frame  := length:u32 big-endian | header | body
header := one flat JSON object (UTF-8), ending at the `}` that closes it
body   := the remaining (length - len(header)) bytes, opaque here
```

`length` counts header and body, not the four prefix bytes. `length == 0` is a no-op frame.

`FrameDecoder` is sans-IO: feed it whatever bytes arrived, get back every complete frame as
`(Header, body)`. It never holds more than one partial frame, and a length above the configured
maximum is refused as soon as the prefix arrives (the payload is never buffered).

Finding the end of the header: the fast path takes the first `}`; if that prefix does not decode
(a `}` inside a quoted value, or a nested value), a quote- and brace-aware scan finds the real
end. A header with a nested value is thus a well-formed frame: the header decoder refuses that one
command (`FieldError`), and the connection goes on.

Runs left whole: a decoder given a `group` function (`group(buf, pos, max_size) -> end`, the
server's publish fast path, server/publish_scan.py) asks it at every frame boundary whether the
whole frames from there to `end` are to be handed on undecoded; they come out as one
`(RAW_RUN, RawFrames)` item (its `data`), which the receiver decodes itself or with `expand()`. The
frames, taken in order with runs expanded, are the same however the input was split.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

from .headers import FieldError, Header, HeaderError, decode_header, encode_header

__all__ = [
    "DEFAULT_MAX_FRAME",
    "RAW_RUN",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "RawFrames",
    "encode_frame",
    "expand",
    "frame_bytes",
    "frame_end",
]

DEFAULT_MAX_FRAME = 16 * 1024 * 1024


class RawFrames:
    """Whole frames, back to back (`data`), left undecoded by a decoder's `group` function. A
    holder, not a bytes subclass: a read that is all one run is handed on without a copy."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


RAW_RUN = Header(c="raw frames")
"""The header of a RawFrames item (not a command: the frames in it are)."""

Frame = tuple[Header, bytes | FieldError | RawFrames]
"""(header, body); with refuse_fields, (header, the FieldError) for a header refused alone; with
a `group` function, (RAW_RUN, RawFrames) for a run of frames left whole."""
Group = Callable[[bytes | bytearray, int, int], int]

_LEN = struct.Struct(">I")
_unpack_len = _LEN.unpack_from
_pack_len = _LEN.pack
# What matters for finding where a JSON object ends: complete strings (their braces do not
# count) and braces.
_HEADER_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}]', re.DOTALL)


class FrameError(ValueError):
    """The byte stream cannot be read as frames. Protocol reason `bad frame`.

    `frames` holds the good frames decoded from the same feed before the bad one: the caller
    processes those, then closes the connection.
    """

    reason = "bad frame"

    def __init__(self, message: str, frames: list[Frame] | None = None):
        super().__init__(message)
        self.frames = frames or []


class FrameTooLarge(FrameError):
    def __init__(self, size: int, limit: int, frames: list[Frame] | None = None):
        super().__init__(
            f"frame of {size} bytes exceeds MaxMessageSize {limit}; raise <MaxMessageSize> "
            "on the transport or split the payload",
            frames,
        )
        self.size = size
        self.limit = limit


class FrameDecoder:
    """Incremental decoder. States: waiting for a prefix, waiting for the rest of a frame."""

    __slots__ = ("_buf", "group", "max_size", "refuse_fields")

    def __init__(
        self,
        max_size: int = DEFAULT_MAX_FRAME,
        refuse_fields: bool = False,
        group: Group | None = None,
    ):
        """refuse_fields: a header whose fields have the wrong type yields (header, FieldError)
        in place of (header, body), and decoding goes on (the server refuses that one command);
        otherwise it is a FrameError like any bad header. group: see the module's docstring
        (settable later: the server sets it once a connection is logged on)."""
        self._buf = bytearray()
        self.max_size = max_size
        self.refuse_fields = refuse_fields
        self.group = group

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Every complete frame in what has arrived so far (the rest is kept for the next
        feed). FrameError (its `frames`: the good ones before it) for bytes that are not frames;
        the decoder is then empty, and the caller closes the connection."""
        buf = self._buf
        view: bytes | bytearray
        if buf:
            buf += data
            view = buf
        else:
            view = data  # common case: no partial frame pending, parse the chunk in place
        frames: list[Frame] = []
        pos = 0
        n = len(view)
        max_size = self.max_size
        group = self.group
        try:
            while n - pos >= 4:
                if group is not None:
                    end = group(view, pos, max_size)
                    if end > pos:
                        # a whole bytes read is not copied (CPython returns it for [0:n])
                        frames.append((RAW_RUN, RawFrames(bytes(view[pos:end]))))
                        pos = end
                        continue
                (length,) = _unpack_len(view, pos)
                if length > max_size:
                    raise FrameTooLarge(length, max_size)
                end = pos + 4 + length
                if end > n:
                    break
                start = pos + 4
                pos = end
                if length == 0:
                    continue
                close = view.find(b"}", start, end)
                if close < 0 or view[start] != 0x7B:  # '{'
                    raise HeaderError("frame does not start with a JSON object header")
                close += 1
                try:
                    try:
                        header = decode_header(view[start:close])
                    except FieldError:
                        raise
                    except HeaderError:
                        real = _header_end(view, start, end)
                        if real < 0 or real == close:
                            raise
                        close = real
                        header = decode_header(view[start:close])
                except FieldError as exc:
                    if not self.refuse_fields or exc.header.c is None:
                        raise
                    frames.append((exc.header, exc))
                    continue
                if header.c is None:
                    raise HeaderError("header has no command field `c`")
                frames.append((header, bytes(view[close:end])))
        except FrameError as exc:
            self._buf = bytearray()
            exc.frames = frames
            raise
        except HeaderError as exc:
            self._buf = bytearray()
            raise FrameError(str(exc), frames) from None
        if pos:
            if buf:
                del buf[:pos]
            else:
                buf += view[pos:]
        elif not buf:
            buf += view
        return frames


def _header_end(view: bytes | bytearray, start: int, end: int) -> int:
    """Where the JSON object that opens at `start` ends (past its `}`), counting nested braces
    and skipping strings; -1 when it does not close before `end`."""
    depth = 0
    for m in _HEADER_TOKEN.finditer(view, start, end):
        token = m.group()
        if token == b"{":
            depth += 1
        elif token == b"}":
            depth -= 1
            if depth == 0:
                return m.end()
    return -1


def expand(raw: bytes, refuse_fields: bool = True) -> list[Frame]:
    """The frames of a RawFrames (whole frames): as FrameDecoder.feed would have decoded them,
    FrameError included."""
    return FrameDecoder(max(len(raw), 1), refuse_fields).feed(raw)


def frame_end(buf: bytes, pos: int) -> int:
    """Where the whole frame at `pos` of buf ends."""
    return pos + 4 + _unpack_len(buf, pos)[0]


def frame_bytes(header: bytes, body: bytes = b"") -> bytes:
    """Prefix an encoded header and body with the frame length."""
    return _pack_len(len(header) + len(body)) + header + body


def encode_frame(header: Header, body: bytes = b"") -> bytes:
    return frame_bytes(encode_header(header), body)
