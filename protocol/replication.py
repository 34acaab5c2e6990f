"""Replication link frames (docs/replication.md). This module owns the link's commands.

A link carries frames in the client framing (protocol/framing.py: `u32 BE length | JSON header |
body`), from a *source* instance that sends its journal to a *destination* that records it:

```
source -> dest  {"c":"repl_logon","name":N,"group":G,"dest":D,"v":1[,"user":U,"pw":P]
                 [,"jid":J][,"seen":S][,"end":E]}
dest -> source  {"c":"repl_ack","status":"success","pos":P[,"jid":J][,"seen":S]}
                                                                  resume point: the source
                                                                  position the destination holds
                                                                  everything below (0: new source)
dest -> source  {"c":"repl_ack","status":"failure","reason":R}   then the destination closes
source -> dest  {"c":"repl_batch","from":P0,"to":P1}  body       raw journal records of the
                                                                  source positions [P0, P1) this
                                                                  destination carries, back to
                                                                  back, crc included (may be empty)
dest -> source  {"c":"repl_ack","pos":P1}                        durable on the destination
source -> dest  {"c":"repl_owners","owners":[[ID,U],...]}        client-name bindings: publisher
                                                                  id ID (u64) is bound to user U
                                                                  (docs/security.md)
either way      {"c":"heartbeat"}                                after 1 s idle, once the logon
                                                                  is answered
```

N and G are the source instance's name and group, D the destination's name as the source has it
configured (a mismatch is refused), U/P the link's credentials when the destination has
<Authentication>. J (optional) is the identity of the sender's journal on a logon, of the
destination's on the logon's answer: 32 hex digits, new with every new journal
(server/replication/identity.py), so a resume point is never applied to a journal it was not
taken from. S (optional) is the other end's journal identity as this end last saw it (on a
logon, the destination's as the source saw it; on its answer, the source's as the destination
saw it): an instance whose journal is not that one lost its journal (it was replaced). E
(optional) is the source journal's end when it logs on: once the destination has applied every
batch below E it holds what the source had then, its queue events included (the source is
*synced*; a source without E syncs only by going idle, a heartbeat from it).
Positions are u64 journal positions of the *source*. A batch's `from` is the
previous batch's `to` on the same link (or the resume point): the link is a gap-free walk of
the source journal; records filtered out by the source just leave nothing in the body. A
batch of an empty range (`from` = `to`) may carry records: a handoff of records from earlier in
the source journal (a publisher that moved to the source; server/replication/handoff.py).
`repl_owners` carries at most MAX_OWNERS entries, each user 1..MAX_USER bytes of UTF-8.

Everything here is pure: `LinkDecoder.feed(bytes) -> [LinkFrame]` and the `encode_*` functions.
Every field is checked when decoded; a bad frame raises LinkError (a subclass per cause), and
the caller closes the link.
"""

from __future__ import annotations

import re
import struct

import msgspec

from .framing import frame_bytes

__all__ = [
    "HEARTBEAT",
    "LINK_VERSION",
    "MAX_BATCH_BODY",
    "MAX_LINK_FRAME",
    "MAX_NAME",
    "RETRY_MAX",
    "BadLinkFrame",
    "Heartbeat",
    "LinkDecoder",
    "LinkError",
    "LinkFrame",
    "LinkFrameTooLarge",
    "ReplAck",
    "ReplBatch",
    "ReplLogon",
    "ReplOwners",
    "encode_ack",
    "encode_batch",
    "encode_failure",
    "encode_heartbeat",
    "encode_logon",
    "encode_owners",
]

LINK_VERSION = 1
# a source whose link is down tries its destination again within this many seconds (doubling
# from 0.1 s), and at once when a link from that destination comes up: a destination that waits
# this long past its own bound for a source without a link has given a live source its turn
RETRY_MAX = 2.0
MAX_BATCH_BODY = 1024 * 1024  # what a sender puts in one batch (one larger record goes alone)
# a batch holding one record of the largest size a transport accepts, plus its header
MAX_LINK_FRAME = 64 * 1024 * 1024
MAX_NAME = 255  # bytes of an instance or group name (the origin block's limit, record.py)
MAX_U64 = (1 << 64) - 1
MAX_OWNERS = 1000  # client-name bindings per repl_owners frame
MAX_USER = 1024  # bytes of a user name in a binding


class LinkError(ValueError):
    """The link's byte stream is not valid link frames; the caller closes the link.
    `frames` holds the good frames decoded from the same feed before the bad one."""

    def __init__(self, message: str, frames: list[LinkFrame] | None = None):
        super().__init__(message)
        self.frames = frames or []


class LinkFrameTooLarge(LinkError):
    def __init__(self, size: int, limit: int):
        super().__init__(
            f"replication frame of {size} bytes exceeds the link limit {limit}; "
            "the source sends batches of at most 1 MiB plus one record"
        )
        self.size = size
        self.limit = limit


class BadLinkFrame(LinkError):
    """A header that is not one of the link's commands, or a field out of its range."""


class ReplLogon(
    msgspec.Struct, tag_field="c", tag="repl_logon", forbid_unknown_fields=True, omit_defaults=True
):
    name: str
    group: str
    dest: str
    v: int
    user: str | None = None
    pw: str | None = None
    jid: str | None = None
    seen: str | None = None
    end: int | None = None  # the source journal's end position at the logon


class ReplAck(
    msgspec.Struct, tag_field="c", tag="repl_ack", forbid_unknown_fields=True, omit_defaults=True
):
    pos: int | None = None
    status: str | None = None  # "success" | "failure" on the logon's answer; absent on a batch's
    reason: str | None = None
    jid: str | None = None  # on the logon's answer: the destination's journal identity
    seen: str | None = None  # on the logon's answer: the source's, as the destination saw it


class ReplBatch(msgspec.Struct, tag_field="c", tag="repl_batch", forbid_unknown_fields=True):
    from_: int = msgspec.field(name="from")
    to: int


class ReplOwners(msgspec.Struct, tag_field="c", tag="repl_owners", forbid_unknown_fields=True):
    owners: list[tuple[int, str]]


class Heartbeat(msgspec.Struct, tag_field="c", tag="heartbeat", forbid_unknown_fields=True):
    pass


LinkHeader = ReplLogon | ReplAck | ReplBatch | ReplOwners | Heartbeat
LinkFrame = tuple[LinkHeader, bytes]
"""(header, body); the body is empty except for a repl_batch."""

HEARTBEAT = Heartbeat()
_DECODE = msgspec.json.Decoder(LinkHeader)
_ENCODE = msgspec.json.Encoder()
_LEN = struct.Struct(">I")
_unpack_len = _LEN.unpack_from
_HEADER_END = re.compile(rb'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}', re.DOTALL)


def _check_name(what: str, value: str, empty_ok: bool = False) -> None:
    n = len(value.encode())
    if (n == 0 and not empty_ok) or n > MAX_NAME:
        raise BadLinkFrame(f"repl_logon `{what}` must be 1..{MAX_NAME} bytes of UTF-8 (got {n})")


_JID = re.compile(r"[0-9a-f]{32}")


def _check_jid(jid: str | None) -> None:
    if jid is not None and not _JID.fullmatch(jid):
        raise BadLinkFrame(f"journal identity {jid[:40]!r} is not 32 lowercase hex digits")


def _check_pos(what: str, value: int | None) -> None:
    if value is not None and not 0 <= value <= MAX_U64:
        raise BadLinkFrame(f"`{what}` {value} is not a journal position (0..2^64-1)")


def check_header(h: LinkHeader, body: bytes) -> None:
    """BadLinkFrame for a field out of its range (the types are checked by the decoder)."""
    if isinstance(h, ReplBatch):
        _check_pos("from", h.from_)
        _check_pos("to", h.to)
        if h.to < h.from_:
            raise BadLinkFrame(f"repl_batch `to` {h.to} is before `from` {h.from_}")
        # a batch of an empty range may carry records: a handoff (records of a publisher that
        # moved to the sender, from earlier in its journal; docs/replication.md)
        return
    if body:
        raise BadLinkFrame(f"a {type(h).__name__} frame carries a body of {len(body)} bytes")
    if isinstance(h, ReplLogon):
        _check_name("name", h.name)
        _check_name("dest", h.dest)
        # the group defaults to the name in the sender; an empty one is still a stored value
        _check_name("group", h.group, empty_ok=True)
        if h.v < 1:
            raise BadLinkFrame(f"repl_logon version {h.v} is not a link version")
        _check_jid(h.jid)
        _check_jid(h.seen)
        _check_pos("end", h.end)
    elif isinstance(h, ReplOwners):
        if not 0 < len(h.owners) <= MAX_OWNERS:
            raise BadLinkFrame(f"repl_owners must carry 1..{MAX_OWNERS} bindings")
        for pub, user in h.owners:
            if not 0 <= pub <= MAX_U64:
                raise BadLinkFrame(f"repl_owners publisher id {pub} is not a u64")
            if not 0 < len(user.encode()) <= MAX_USER:
                raise BadLinkFrame(f"repl_owners user must be 1..{MAX_USER} bytes of UTF-8")
    elif isinstance(h, ReplAck):
        _check_pos("pos", h.pos)
        _check_jid(h.jid)
        _check_jid(h.seen)
        if h.status not in (None, "success", "failure"):
            raise BadLinkFrame(f"repl_ack status {h.status!r} is not success or failure")
        if h.status == "failure":
            if not h.reason:
                raise BadLinkFrame("a failed repl_ack has no `reason`")
        elif h.pos is None:
            raise BadLinkFrame("repl_ack has no `pos`")


def decode_link_header(raw: bytes | memoryview) -> LinkHeader:
    try:
        return _DECODE.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadLinkFrame(f"not a replication command: {exc}") from None
    except (msgspec.DecodeError, ValueError) as exc:
        raise BadLinkFrame(f"replication header is not JSON: {exc}") from None


class LinkDecoder:
    """Incremental, sans-IO. States: waiting for a prefix, waiting for the rest of a frame.
    Holds at most one partial frame; a length above `max_size` is refused from its prefix."""

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = MAX_LINK_FRAME):
        self._buf = bytearray()
        self.max_size = max_size

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[LinkFrame]:
        """Every complete frame so far; LinkError (after which the decoder is empty) for bytes
        that are not link frames."""
        buf = self._buf
        buf += data
        frames: list[LinkFrame] = []
        pos, n = 0, len(buf)
        try:
            while n - pos >= 4:
                (length,) = _unpack_len(buf, pos)
                if length > self.max_size:
                    raise LinkFrameTooLarge(length, self.max_size)
                end = pos + 4 + length
                if end > n:
                    break
                start, pos = pos + 4, end
                if length == 0:
                    continue
                if buf[start] != 0x7B:  # '{'
                    raise BadLinkFrame("frame does not start with a JSON object header")
                close = buf.find(b"}", start, end) + 1
                if close <= 0:
                    raise BadLinkFrame("frame header is not a JSON object")
                try:
                    header = decode_link_header(memoryview(buf)[start:close])
                except BadLinkFrame:
                    m = _HEADER_END.match(buf, start, end)  # a `}` inside a quoted value
                    if m is None or m.end() == close:
                        raise
                    close = m.end()
                    header = decode_link_header(memoryview(buf)[start:close])
                body = bytes(buf[close:end])
                check_header(header, body)
                frames.append((header, body))
        except LinkError as exc:
            self._buf = bytearray()
            exc.frames = frames
            raise
        del buf[:pos]
        return frames


def _frame(header: LinkHeader) -> bytes:
    check_header(header, b"")  # a frame we send holds to the ranges we require of a peer's
    return frame_bytes(_ENCODE.encode(header))


def encode_logon(
    name: str,
    group: str,
    dest: str,
    user: str | None = None,
    pw: str | None = None,
    jid: str | None = None,
    seen: str | None = None,
    end: int | None = None,
) -> bytes:
    return _frame(
        ReplLogon(
            name=name,
            group=group,
            dest=dest,
            v=LINK_VERSION,
            user=user,
            pw=pw,
            jid=jid,
            seen=seen,
            end=end,
        )
    )


def encode_ack(
    pos: int, resume: bool = False, jid: str | None = None, seen: str | None = None
) -> bytes:
    """A batch ack (`{"c":"repl_ack","pos":P}`), or with resume the logon's success answer
    (with the destination's journal identity `jid` and the source's as it saw it, `seen`, when
    given)."""
    _check_pos("pos", pos)
    if resume:
        if jid is not None or seen is not None:
            return _frame(ReplAck(pos=pos, status="success", jid=jid, seen=seen))
        return frame_bytes(b'{"c":"repl_ack","status":"success","pos":%d}' % pos)
    return frame_bytes(b'{"c":"repl_ack","pos":%d}' % pos)


def encode_owners(owners: list[tuple[int, str]]) -> bytes:
    """Client-name bindings (publisher id, user): at most MAX_OWNERS per frame."""
    return _frame(ReplOwners(owners=owners))


def encode_failure(reason: str) -> bytes:
    return _frame(ReplAck(status="failure", reason=reason or "refused"))


def encode_batch(from_: int, to: int, body: bytes = b"") -> bytes:
    h = ReplBatch(from_=from_, to=to)
    check_header(h, body)
    return frame_bytes(b'{"c":"repl_batch","from":%d,"to":%d}' % (from_, to), body)


def encode_heartbeat() -> bytes:
    return frame_bytes(b'{"c":"heartbeat"}')
