"""Journal identity: which journal a replication position belongs to (docs/replication.md
"Resynchronisation").

Positions on a link are the source's journal positions, and a destination keeps the one it
resumes from. A journal that is replaced (an instance whose data directory was lost and that
starts empty) reuses the positions of the one it replaces: without an identity, a peer would
resume the new journal at the old one's position and never receive what the new one holds
below it. So each journal has an identity, made when the journal is made, and the link carries
it both ways (protocol/replication.py `jid`).

The file `<JournalDirectory>/REPLICATION-ID` holds it: 32 lowercase hex digits (128 random
bits) and a newline, written once (a temporary file, fsync, rename, fsync of the directory).
The journal ignores the file.

Metadata this module names (the journal index's `batch.meta`):

- `repl-jid:<source>` on a destination: the identity of the source journal its resume point
  (`repl-from:<source>`) belongs to. A logon with another identity resets the resume point to
  0 (the duplicate check drops what the destination already has).
- `repl-peer:<destination>` on a source: the identity of the destination's journal as last seen
  (32 bytes), then u64 LE `own_below`: below that position of this journal, the records that
  came *from* that destination are sent back to it (it lost them with its journal). A
  destination seen with a new identity (or for the first time) gets `own_below` = this
  journal's end at that moment.
"""

from __future__ import annotations

import os
import secrets
import struct

from journal.manifest import write_atomic

__all__ = [
    "IDENTITY_FILE",
    "REPL_JID",
    "REPL_PEER",
    "journal_identity",
    "pack_peer",
    "unpack_peer",
]

IDENTITY_FILE = "REPLICATION-ID"
REPL_JID = b"repl-jid:"
REPL_PEER = b"repl-peer:"
_U64 = struct.Struct("<Q")


class BadIdentityFile(ValueError):
    """REPLICATION-ID holds something else than an identity: say so instead of replacing it
    (a new identity makes every peer resend its whole journal)."""

    def __init__(self, path: str, got: bytes):
        super().__init__(
            f"{path} holds {got[:40]!r}, not a journal identity (32 hex digits); restore it, or "
            "remove it to give this journal a new identity (every peer then resends its journal)"
        )


def journal_identity(directory: str) -> tuple[str, bool]:
    """(the identity of the journal in `directory`, True when it was made now)."""
    path = os.path.join(directory, IDENTITY_FILE)
    try:
        with open(path, "rb") as f:
            got = f.read(64)
    except FileNotFoundError:
        pass
    else:
        jid = got.strip().decode("ascii", "replace")
        if len(jid) != 32 or any(c not in "0123456789abcdef" for c in jid):
            raise BadIdentityFile(path, got)
        return jid, False
    jid = secrets.token_hex(16)
    write_atomic(path, jid.encode() + b"\n")
    return jid, True


def pack_peer(jid: str, own_below: int) -> bytes:
    return jid.encode() + _U64.pack(own_below)


def unpack_peer(raw: bytes | None) -> tuple[str | None, int]:
    """(identity, own_below) of a stored `repl-peer:` value; (None, 0) when none or unreadable."""
    if raw is None or len(raw) != 40:
        return None, 0
    return raw[:32].decode("ascii", "replace"), _U64.unpack(raw[32:])[0]
