"""The SOW delete record: how a `sow_delete` on a SOW topic is kept in the journal.

A delete is one journal record (journal/record.py) of kind 3 (`SOW_DELETE`), publisher 0,
sequence 0, the receive time of the batch, topic = the SOW topic, whose body is:

```
offset size  field
0      1     u8  form: b"K" = by keys, b"F" = by filter
1      ...   K: the keys, UTF-8, comma-separated (keys never hold a comma: server/sow/keys.py)
             F: the filter text, UTF-8 (docs/protocol.md §7)
```

A delete by filter is evaluated when the record is applied, on the records as they are at that
point of the journal: so it removes the same records in the live store, after a restart, and
in a fold of the journal. Subscribers never see these records (replay and splice deliver only
kind 1).
"""

from __future__ import annotations

__all__ = ["BY_FILTER", "BY_KEYS", "decode_delete", "encode_delete"]

BY_KEYS = b"K"
BY_FILTER = b"F"


def encode_delete(form: bytes, payload: str) -> bytes:
    return form + payload.encode("utf-8")


def decode_delete(body: bytes) -> tuple[bytes, str] | None:
    """(form, payload) of a delete record's body, or None for a body this version cannot read."""
    if not body or body[:1] not in (BY_KEYS, BY_FILTER):
        return None
    return body[:1], body[1:].decode("utf-8", "replace")
