"""Every Header field has one place in the publish fast path's classification (protocol/headers.py)
and the fast path's three parts use it: the byte scanners (server/publish_scan.py, its C twin)
take only the "fast" members within the limits of check_fields, the session's run predicate
leaves a publish with a "slow" field to cmd_publish."""

import json
import struct

import pytest

from protocol.headers import (
    FAST_PUBLISH_ACK,
    FAST_PUBLISH_FIELDS,
    MAX_CID_BYTES,
    MAX_SEQ,
    MAX_TOPIC_BYTES,
    PUBLISH_FIELDS,
    SLOW_PUBLISH_FIELDS,
    Header,
)
from server import publish_scan

SCANNERS = [publish_scan.publish_records_py]
if publish_scan.ACCELERATED:
    SCANNERS.append(publish_scan.publish_records)


def test_every_header_field_is_classified_for_the_publish_fast_path():
    assert set(PUBLISH_FIELDS) == set(Header.__struct_fields__), (
        "classify the new Header field in protocol/headers.py PUBLISH_FIELDS",
        set(Header.__struct_fields__) ^ set(PUBLISH_FIELDS),
    )
    assert set(PUBLISH_FIELDS.values()) == {"fast", "slow", "unused"}
    assert FAST_PUBLISH_FIELDS == {"c", "cid", "t", "s", "a"}
    assert SLOW_PUBLISH_FIELDS == {"x", "e", "k"}


def _frame(header: dict, body: bytes = b"{}") -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack(">I", len(h) + len(body)) + h + body


def _taken(scan, header: dict) -> int:
    topic = header.get("t", "t1").encode()
    raw = _frame(header)
    entries = scan(raw, 0, 7, 1, 0, {topic: topic.decode()}, 0)[1]
    return len(entries)


@pytest.mark.parametrize("scan", SCANNERS)
def test_the_scanners_take_the_fast_members_only(scan):
    plain = {"c": "publish", "t": "t1", "s": 1}
    assert _taken(scan, plain) == 1
    assert _taken(scan, {**plain, "a": FAST_PUBLISH_ACK, "cid": "c1"}) == 1
    for name in sorted(set(PUBLISH_FIELDS) - FAST_PUBLISH_FIELDS):
        assert _taken(scan, {**plain, name: "1"}) == 0, name
    assert _taken(scan, {**plain, "a": "processed"}) == 0


@pytest.mark.parametrize("scan", SCANNERS)
def test_the_scanners_use_the_limits_of_check_fields(scan):
    plain = {"c": "publish", "t": "t1", "s": 1}
    assert _taken(scan, {**plain, "t": "t" * MAX_TOPIC_BYTES}) == 1
    assert _taken(scan, {**plain, "t": "t" * (MAX_TOPIC_BYTES + 1)}) == 0
    assert _taken(scan, {**plain, "cid": "c" * MAX_CID_BYTES}) == 1
    assert _taken(scan, {**plain, "cid": "c" * (MAX_CID_BYTES + 1)}) == 0
    assert _taken(scan, {**plain, "s": MAX_SEQ}) == 1
    assert _taken(scan, {**plain, "s": MAX_SEQ + 1}) == 0


def test_the_scanners_read_what_the_classification_names():
    """The members the scanners were taught are the fast ones (a field classified fast that
    they do not read would stop the import of server/publish_scan.py)."""
    assert publish_scan.MEMBERS == tuple(sorted(f.encode() for f in FAST_PUBLISH_FIELDS))
