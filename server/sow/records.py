"""The SOW delete record: how a `sow_delete` on a SOW topic is kept in the journal.

A delete is one journal record (journal/record.py) of kind 3 (`SOW_DELETE`), publisher 0,
sequence 0, the receive time of the batch, topic = the SOW topic, whose body is:

```
offset size  field
0      1     u8  form: b"K" = by keys, b"F" = by filter, b"E" = expired, by keys
1      ...   K, E: the keys, UTF-8, comma-separated (keys never hold a comma: server/sow/keys.py)
             F: the filter text, UTF-8 (docs/protocol.md §7)
```

`E` is what the expiration tick journals: applied like `K`, but out-of-focus notices say
`expired`, and replication does not send it (each instance of a pair expires its own records
from its own receive times; sending both sides' expirations would let one side's late
expiration remove a record the other side has since received anew).

Replication sends `K` and `F` records (server/replication/sender.py) with an origin block; a
replica journals them as its own delete records, in their place among the replicated messages,
so both sides fold to the same state.

A delete by filter is evaluated when the record is applied, on the records as they are at that
point of the journal: so it removes the same records in the live store, after a restart, and
in a fold of the journal. Subscribers never see these records (replay and splice deliver only
kind 1).
"""

from __future__ import annotations

__all__ = ["BY_EXPIRY", "BY_FILTER", "BY_KEYS", "decode_delete", "encode_delete", "replicated"]

BY_KEYS = b"K"
BY_FILTER = b"F"
BY_EXPIRY = b"E"
_FORMS = (BY_KEYS, BY_FILTER, BY_EXPIRY)


def encode_delete(form: bytes, payload: str) -> bytes:
    return form + payload.encode("utf-8")


def decode_delete(body: bytes) -> tuple[bytes, str] | None:
    """(form, payload) of a delete record's body, or None for a body this version cannot read."""
    if not body or body[:1] not in _FORMS:
        return None
    return body[:1], body[1:].decode("utf-8", "replace")


def replicated(body: bytes) -> bool:
    """Whether replication sends a delete record with this body (not an expiration)."""
    return body[:1] in (BY_KEYS, BY_FILTER)
