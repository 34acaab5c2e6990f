"""Every frame the server sends: deliveries, acks, heartbeats. This module owns those bytes.

A frame (docs/protocol.md §1, protocol/framing.py) is `u32 BE length | JSON header | body`.

A delivery header (docs/protocol.md §4) is assembled from parts that are made once and reused, so
the hot paths only concatenate and `%`-format bytes:

```
part               bytes                                        made by
prefix             {"c":"p","sub_id":<id>,"sids":<ids>           sub_prefix / group_prefix
topic member       ,"t":<topic>                                 topic_member(_text)
fragment           the record's stored header members (`,"x":..`), or nothing
bookmark member    ,"bm":"<publisher_id>|<seq>|"                protocol.bookmarks.BOOKMARK_FORMAT
tail               ,"ts":"<time>" (timestamp option)            timestamp_part
                   ,"lp":"<lease end>" (at-least-once queues)   lease_part
                   }
```

Two orders exist, kept as they have always been on the wire:

- from stored bytes (replay, queues, the C splice of server/_splice.c and its reference
  server/splice.py): prefix, topic, fragment, bookmark, tail, `}` (`STORED`);
- live fan-out of a committed batch: prefix, then the message's `suffix` = topic, bookmark,
  fragment (`LIVE_SUFFIX`; topic and fragment only on a topic that is not recorded), then
  tail and `}` (`write_live`; a run of messages to one prefix as one buffer: `live_separators`).

The body follows the header as published. A dead letter (a queue message that expired or ran
out of deliveries) is published again with a stored fragment that says why
(`dead_letter_fragment`).

Acks are `{"c":"ack","a":<kind>[,"cid":..],"status":..[,"reason":..][,<fields>..]}` (`ack`),
with a preformatted form for the conflated `persisted` ack of publishers (`persisted_ack`).
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgspec

from protocol.bookmarks import BOOKMARK_FORMAT, format_timestamp
from protocol.framing import frame_bytes

__all__ = [
    "HEARTBEAT",
    "LIVE_SUFFIX",
    "STORED",
    "ack",
    "dead_letter_fragment",
    "group_prefix",
    "lease_part",
    "live_separators",
    "oof",
    "pack_len",
    "persisted_ack",
    "sow_group",
    "sow_record",
    "sub_prefix",
    "timestamp_part",
    "topic_member",
    "topic_member_text",
    "write_live",
]

pack_len = struct.Struct(">I").pack
_json = msgspec.json.encode
TOPIC_CACHE_LIMIT = 50_000

HEARTBEAT: Final = frame_bytes(b'{"c":"heartbeat"}')

STORED: Final = b'%s%s%s,"bm":"' + BOOKMARK_FORMAT + b'"%s}'
"""Header of a delivery from stored bytes: % (prefix, topic member, fragment, publisher id,
seq, tail). The C splice writes the same bytes (tests/server/test_splice.py holds them equal)."""

LIVE_SUFFIX: Final = b'%s,"bm":"' + BOOKMARK_FORMAT + b'"%s'
"""A committed message's part of a live delivery header: % (topic member, publisher id, seq,
fragment)."""

_PERSISTED: Final = b'{"c":"ack","a":"persisted","status":"success","s":%d}'
_DEAD_LETTER: Final = (
    b',"reason":%s,"deliveries":%d,"queue":%s,"source_bm":"' + BOOKMARK_FORMAT + b'"'
)


def sub_prefix(sub_id: str) -> bytes:
    """The header prefix of deliveries to one subscription."""
    sid = _json(sub_id)
    return b'{"c":"p","sub_id":' + sid + b',"sids":' + sid


def group_prefix(sub_ids: list[str]) -> bytes:
    """The prefix of one delivery to several subscriptions of a connection: `sub_id` is the
    first, `sids` lists them all."""
    return b'{"c":"p","sub_id":' + _json(sub_ids[0]) + b',"sids":' + _json(",".join(sub_ids))


_topic_members: dict[bytes, bytes] = {}


def topic_member(topic: bytes) -> bytes:
    """b',"t":"<topic>"' for a topic as stored in the journal (cached, bounded)."""
    tj = _topic_members.get(topic)
    if tj is None:
        if len(_topic_members) >= TOPIC_CACHE_LIMIT:
            _topic_members.clear()
        tj = _topic_members[topic] = b',"t":' + _json(topic.decode("utf-8", "replace"))
    return tj


def topic_member_text(topic: str) -> bytes:
    """b',"t":"<topic>"' for a topic as published (the caller caches it)."""
    return b',"t":' + _json(topic)


def timestamp_part(ts_us: int) -> bytes:
    """The `ts` member (timestamp option): the message's receive time."""
    return b',"ts":"' + format_timestamp(ts_us).encode() + b'"'


def lease_part(end_us: int) -> bytes:
    """The `lp` member of an at-least-once queue delivery: when its lease ends."""
    return b',"lp":"' + format_timestamp(end_us).encode() + b'"'


def dead_letter_fragment(
    reason: str, deliveries: int, queue: str, publisher_id: int, seq: int
) -> bytes:
    """The header fragment stored with a dead letter (delivered with it like `x`): why it left
    its queue, after how many deliveries, which queue, and the bookmark it had there."""
    return _DEAD_LETTER % (_json(reason), deliveries, _json(queue), publisher_id, seq)


def write_live(buf: list[bytes], prefix: bytes, suffix: bytes, tail: bytes, body: bytes) -> None:
    """Append one live delivery to an outbox's buffer (tail: b"" or timestamp_part)."""
    if tail:
        buf += (
            pack_len(len(prefix) + len(suffix) + len(tail) + 1 + len(body)),
            prefix,
            suffix,
            tail,
            b"}",
            body,
        )
    else:
        buf += (pack_len(len(prefix) + len(suffix) + 1 + len(body)), prefix, suffix, b"}", body)


def live_separators(prefix_len: int, rests: list[bytes]) -> list[bytes]:
    """Pieces that `prefix.join` turns into the live deliveries of several messages to one
    prefix, in one buffer: the same bytes as `write_live` of each in turn. rests: each message's
    `suffix + tail + b"}" + body`; prefix_len: len(prefix).

    The frames are `len(prefix + rest_i) | prefix | rest_i`: as
    `prefix.join([len_0, rest_0 + len_1, ..., rest_n])` the pieces depend only on the prefix's
    length, so every prefix of one length shares them and costs one join."""
    seps = [pack_len(prefix_len + len(rests[0]))]
    prev = rests[0]
    for rest in rests[1:]:
        seps.append(prev + pack_len(prefix_len + len(rest)))
        prev = rest
    seps.append(prev)
    return seps


def ack(
    kind: str, cid: Any, status: str = "success", reason: str | None = None, **fields: Any
) -> bytes:
    """One ack frame; fields that are None are left out."""
    h: dict[str, Any] = {"c": "ack", "a": kind}
    if cid is not None:
        h["cid"] = cid
    h["status"] = status
    if reason:
        h["reason"] = reason
    for k, v in fields.items():
        if v is not None:
            h[k] = v
    b = _json(h)
    return pack_len(len(b)) + b


_SOW_BM = b',"bm":"' + BOOKMARK_FORMAT + b'"'


def sow_record(
    topic_member: bytes, pub: int, seq: int, fragment: bytes, extra: bytes, body: bytes
) -> bytes:
    """One record of a SOW query's answer (docs/protocol.md §14):
    `{"c":"sow"<topic member>,"bm":"<pub>|<seq>|"<fragment: x, k><extra>}` + body; extra holds
    `query_id` / `sub_id` / `ts` members, or nothing."""
    head = b'{"c":"sow"' + topic_member + _SOW_BM % (pub, seq) + fragment + extra + b"}"
    return pack_len(len(head) + len(body)) + head + body


def oof(topic: str, k: str, sub_id: str, reason: str, body: bytes) -> bytes:
    """An out-of-focus notice (docs/protocol.md §14): a record left a subscription's scope."""
    head = _json({"c": "oof", "t": topic, "k": k, "sub_id": sub_id, "reason": reason})
    return pack_len(len(head) + len(body)) + head + body


def sow_group(kind: str, query_id: str | None) -> bytes:
    """`group_begin` or `group_end` of a query's answer, with its `query_id`."""
    h = b'{"c":"' + kind.encode() + b'"'
    if query_id is not None:
        h += b',"query_id":' + _json(query_id)
    h += b"}"
    return pack_len(len(h)) + h


def persisted_ack(seq: int) -> bytes:
    """The conflated `persisted` ack of a publisher: everything up to `seq` is durable."""
    h = _PERSISTED % seq
    return pack_len(len(h)) + h
