"""The journal index keeps the client name bindings (journal/index.py, `owners`): written with a
commit's metadata, read back after a reopen, and kept when the index is reset to be rebuilt
from the segments (the segments cannot give them back)."""

from __future__ import annotations

import struct

from journal.index import OWNER_KEY, JournalIndex


def test_owners_are_stored_with_a_commit_and_survive_reopen_and_reset(tmp_path):
    path = str(tmp_path / "index")
    idx = JournalIndex(path, map_size=1 << 24)
    pub = 0xFEEDFACE12345678
    idx.add([(pub, 1, 1_000_000, 0)], 100, {OWNER_KEY + struct.pack(">Q", pub): b"carol"})
    idx.add([(7, 1, 1_000_001, 100)], 200, {b"other": b"x"})  # not an owner
    assert idx.owners() == {pub: "carol"}
    idx.close()
    idx = JournalIndex(path, map_size=1 << 24)
    assert idx.owners() == {pub: "carol"}
    idx.reset()
    assert idx.publishers() == {}  # everything derivable is gone, to be rebuilt
    assert idx.get_meta(b"other") is None
    assert idx.owners() == {pub: "carol"}
    idx.close()
