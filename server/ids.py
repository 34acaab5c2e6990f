"""Publisher identities: the `publisher_id` half of a bookmark (docs/protocol.md §5).

A publisher id is a 64-bit hash of the publisher's identity: its client name for publishes that
carry their own sequence numbers, and client name plus instance name for publishes the server
numbers itself (so server-assigned sequences never collide with the client's own). The hash is
stable across restarts and instances (blake2b, not Python's salted hash), so a bookmark means the
same message on every instance that stored it. 0 is reserved (EPOCH / NOW).
"""

from __future__ import annotations

import hashlib


def publisher_id(name: str) -> int:
    v = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
    return v or 1


def server_publisher_id(client_name: str, instance_name: str) -> int:
    return publisher_id(f"{client_name}\x00{instance_name}\x00server-assigned")
