"""Journal identities on replication links (server/replication/identity.py): the file, the
link fields, a destination's resume point reset for a replaced source journal, a source's
records sent back to a replaced destination, and the catch-up of a replaced journal
(server/replication/catchup.py)."""

from __future__ import annotations

import pytest

from journal.record import KIND_MESSAGE, encode_record, scan_records
from protocol.framing import frame_bytes
from protocol.replication import (
    BadLinkFrame,
    LinkDecoder,
    ReplAck,
    ReplLogon,
    encode_ack,
    encode_logon,
)
from server.guard import Guard
from server.pipeline import REPL_FROM
from server.replication import U64
from server.replication.catchup import LINK_WAIT, CatchUp
from server.replication.identity import (
    IDENTITY_FILE,
    REPL_JID,
    BadIdentityFile,
    journal_identity,
    pack_peer,
    unpack_peer,
)
from server.replication.receiver import Receiver
from server.replication.sender import Filter, select
from tests.server.test_pipeline_engine import make_pipeline
from tests.server.test_replication_core import dest

J1, J2 = "1" * 32, "2" * 32


def test_the_identity_file_is_made_once_and_kept(tmp_path):
    jid, made = journal_identity(str(tmp_path))
    assert made and len(jid) == 32 and int(jid, 16) >= 0
    # the file is the identity and a newline, and nothing else is left in the directory
    assert [f.name for f in tmp_path.iterdir()] == [IDENTITY_FILE]
    assert (tmp_path / IDENTITY_FILE).read_bytes() == jid.encode() + b"\n"
    assert journal_identity(str(tmp_path)) == (jid, False)
    (tmp_path / IDENTITY_FILE).write_text("not an identity\n")
    with pytest.raises(BadIdentityFile, match="restore it, or remove it"):
        journal_identity(str(tmp_path))
    assert unpack_peer(pack_peer(J1, 1234)) == (J1, 1234)
    assert unpack_peer(None) == (None, 0) and unpack_peer(b"short") == (None, 0)


def test_link_frames_carry_identities_and_refuse_bad_ones():
    ((h, _),) = LinkDecoder().feed(encode_logon("tt-a", "ny", "tt-b", jid=J1, seen=J2))
    assert isinstance(h, ReplLogon) and (h.jid, h.seen) == (J1, J2)
    ((h, _),) = LinkDecoder().feed(encode_ack(77, resume=True, jid=J2, seen=J1))
    assert isinstance(h, ReplAck) and (h.pos, h.status, h.jid, h.seen) == (77, "success", J2, J1)
    # without identities: the bytes of before (an older peer reads them)
    assert encode_ack(77, resume=True) == encode_ack(77, resume=True, jid=None)
    with pytest.raises(BadLinkFrame, match="not 32 lowercase hex digits"):
        encode_logon("tt-a", "ny", "tt-b", jid="ABC")
    with pytest.raises(BadLinkFrame, match="journal identity"):
        LinkDecoder().feed(frame_bytes(b'{"c":"repl_ack","status":"success","pos":1,"jid":"x"}'))


async def test_a_replaced_source_journal_resumes_from_its_start(journal):
    p = make_pipeline(journal)
    r = Receiver("tt-b", p, journal, Guard(), jid=J2)
    assert r._resume_for("tt-a", J1) == 0  # new: nothing yet
    assert p.replication.pending[REPL_JID + b"tt-a"] == J1.encode()
    r.durable_from["tt-a"] = 500
    assert r._resume_for("tt-a", J1) == 500  # the same journal: where it was
    assert r._resume_for("tt-a", None) == 500  # a source that does not say: as before
    assert r._known_jid("tt-a") == J1
    assert r._resume_for("tt-a", J2) == 0  # another journal under that name: from its start
    assert r.durable_from["tt-a"] == 0
    assert p.replication.pending[REPL_FROM + b"tt-a"] == U64.pack(0)
    assert p.replication.pending[REPL_JID + b"tt-a"] == J2.encode()


def test_records_from_the_destination_go_back_to_it_below_own_below():
    mine = encode_record(KIND_MESSAGE, 1, 1, 10, b"orders", b"here")
    back = encode_record(KIND_MESSAGE, 2, 1, 11, b"orders", b"from b", origin=(5, b"tt-b", b"ny"))
    buf = mine + back + mine
    flt = Filter(dest())
    body, _, count = select(buf, 1000, flt, "tt-b")
    assert body == mine + mine and count == 2  # loop prevention
    flt.own_below = 1000 + len(mine) + 1  # tt-b lost its journal: its records go back to it
    body, _, count = select(buf, 1000, flt, "tt-b")
    assert body == buf and count == 3
    assert [r[2] for r in scan_records(body, 0)[0]] == [1, 2, 1]
    flt.own_below = 1000 + len(mine)  # only below the point
    assert select(buf, 1000, flt, "tt-b")[0] == mine + mine


class Later:
    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, delay, fn):
        self.calls.append((delay, fn))


async def test_catch_up_waits_for_the_peers_that_knew_another_journal():
    began = []
    later = Later()
    c = CatchUp(J2, ["tt-a", "tt-c"], lambda: began.append(1), later)
    assert "asks its replication peers (tt-a, tt-c)" in (c.reason() or "")
    c.answered("tt-c", None)  # could not reach it
    c.answered("tt-a", J2)  # knew this journal: nothing to catch up from it
    await c.first_answers(0.1)
    assert c.reason() is None and not began
    c.source_knew("tt-c", J1)  # tt-c knew another journal of this instance
    assert "lost its journal and is catching up from tt-c" in (c.reason() or "")
    assert began == [1] and later.calls[0][0] == LINK_WAIT
    c.answered("tt-c", J1)  # said again: nothing more
    assert began == [1]
    c.synced("tt-a")
    assert c.reason() is not None
    c.synced("tt-c")
    assert c.reason() is None
    # a peer that knew another journal but never links to this instance is waited for LINK_WAIT
    c.answered("tt-d", J1)
    assert c.reason() is not None
    later.calls[-1][1]()
    assert c.reason() is None


async def test_first_answers_waits_at_most_its_time():
    c = CatchUp(J2, ["tt-a"])
    await c.first_answers(0.05)
    assert c.reason() is None
