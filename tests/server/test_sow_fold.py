"""The historical SOW fold in C (server/_sowfold.c, used by server/sow/history.py): the table
of pointers into the journal's blocks read as the answer is made, and the merge of a
checkpoint's chunks with the overlay, each held to its Python reference."""

from __future__ import annotations

import random

import pytest

from server.sow import history
from server.sow.keys import k_fragment
from server.sow.store import SowStore, encode_value

pytestmark = pytest.mark.skipif(
    history.FoldTable is None, reason="the C accelerator is not built here"
)

TOPICS = ("pa", "px", "pz")  # pa: only in the checkpoint; px, pz: folded too


def _key(i: int) -> str:
    """Keys past the 20 bytes the sort keeps inline, and short ones, mixed."""
    return ("L" * 21 if i % 3 == 0 else "") + f"{i:03d}"


def _journal(tmp_path, rnd: random.Random):
    """A journal of plain-k messages on px and pz (and others no SOW topic takes), in
    batches, several blocks long."""
    from journal.journal import Journal
    from journal.record import KIND_QUEUE_EVENT
    from tests.support.journal_data import submit

    j = Journal(str(tmp_path / "journal"), durability="write")
    seq = 0
    for _batch in range(25):
        recs = []
        for _ in range(40):
            seq += 1
            topic = rnd.choice(["px", "px", "pz", "plain"])
            if rnd.random() < 0.03:
                recs.append(dict(kind=KIND_QUEUE_EVENT, pub=0, seq=0, ts=seq, topic="px",
                                 body=b"\x00" * 9))  # fmt: skip
                continue
            k = _key(rnd.randrange(150))  # checkpoint keys are the even ones below 120
            body = b'{"k":"%s","v":%d}' % (k.encode(), seq)
            hdr = k_fragment(k) if topic != "plain" else b""
            recs.append(dict(pub=5, seq=seq, ts=seq, topic=topic, body=body, hdr=hdr))
        submit(j, recs)
    return j


def _checkpoint(tmp_path) -> SowStore:
    store = SowStore(str(tmp_path / "sow"))
    with store.write() as txn:
        for t in TOPICS:
            for i in range(0, 120, 2):
                k = _key(i)
                store.put(txn, t, k, encode_value(i, 1, i, 0, k_fragment(k), b'{"b":%d}' % i))
    return store


def _read(reader: history.HistoricalReader, rnd: random.Random) -> dict:
    size = rnd.choice([1, 7, 32, 500])
    out = {t: [kv for c in reader.chunks(t, size) for kv in c] for t in TOPICS}
    for t in TOPICS:
        for i in range(0, 160, 3):
            out[(t, i)] = reader.get(t, _key(i))
    return out


@pytest.mark.parametrize("dense", [history.DENSE, 0.0, 2.0])
@pytest.mark.parametrize("hold", [history.FOLD_HOLD, 2000])
def test_fold_table_reads_as_the_tuple_fold(tmp_path, hold, dense, monkeypatch):
    compactions = []
    if history.FoldTable is not None:
        real = history.FoldTable

        class Counting:  # the C table, its compactions counted
            def __init__(self, hint=0):
                self.t = real(hint=hint)

            def compact(self):
                compactions.append(1)
                return self.t.compact()

            def __getattr__(self, name):
                return getattr(self.t, name)

        monkeypatch.setattr(history, "FoldTable", Counting)
    """A fold through the FoldTable (puts only: it is kept and read as the answer is made) gives
    the chunks and records the tuple fold's dict gives, over a checkpoint, at many end
    points; with a small FOLD_HOLD the table compacts what it holds on the way (the bound on
    the journal bytes it keeps) and the answer is the same; the checkpoint's chunks read as
    keys only (DENSE 0: the values of the keys the fold left fetched) or always as pairs (2)
    give it too."""
    monkeypatch.setattr(history, "DENSE", dense)
    rnd = random.Random(11)
    monkeypatch.setattr(history, "FOLD_BLOCK", 777)  # several blocks, records cut at their ends
    monkeypatch.setattr(history, "FOLD_HOLD", hold)
    j = _journal(tmp_path, rnd)
    store = _checkpoint(tmp_path)
    try:
        starts = [r[0] for recs in j.raw_batches() for r in recs]
        for stop in sorted({j.end_position, *rnd.sample(starts, 10)}):
            got = []
            for run in ("run", "run_py"):
                overlay: dict = {}
                fold = history._Fold(overlay, lambda t: t in ("px", "pz"), lambda t: None)
                base = store.reader(0)
                if run == "run":
                    table = fold.run(j, j.start_position, stop, base)
                    assert table is not None and not overlay  # puts only: the table
                    # the blocks kept for the next fold: at most FOLD_HOLD bytes
                    assert 0 < sum(map(len, history._spent)) <= hold
                else:
                    fold.base = base
                    fold.run_py(j, j.start_position, stop)
                    table = None
                reader = history.HistoricalReader(base, overlay, stop, lambda: None, table)
                try:
                    got.append(_read(reader, random.Random(stop)))
                finally:
                    reader.close()
            assert got[0] == got[1], stop
            assert got[0]["px"] and got[0]["pa"]
        assert bool(compactions) == (hold == 2000)
    finally:
        store.close()
        j.close()


def test_merge_rows_in_c_equals_the_reference():
    """merge_rows (C) gives merge_rows_py's merged pairs and next index: rows before, inside,
    equal to and past a chunk's keys, deleted rows, empty chunks."""
    if history.merge_rows is history.merge_rows_py:
        pytest.skip("the C accelerator is not built here")
    rnd = random.Random(5)
    for _ in range(400):
        picked = sorted(rnd.sample(range(60), rnd.randrange(8)))
        chunk = [(b"t\x00%03d" % i, b"c%d" % i) for i in picked]
        rows = [
            (b"t\x00%03d" % i, None if rnd.random() < 0.3 else b"r%d" % i)
            for i in sorted(rnd.sample(range(70), rnd.randrange(20)))
        ]
        i = rnd.randrange(len(rows) + 1)
        assert history.merge_rows(chunk, rows, i) == history.merge_rows_py(chunk, rows, i)


def test_fold_table_orders_keys_of_every_length_as_bytes_do(tmp_path):
    """sort(): keys of 1 to 45 bytes sharing long prefixes (equal over the 8 bytes the radix
    sort reads and over the 20 kept beside it) and on several topics come out in record key
    order, the newest message of each."""
    from journal.journal import Journal
    from tests.support.journal_data import submit

    rnd = random.Random(9)
    j = Journal(str(tmp_path / "journal"), durability="write")
    try:
        newest: dict[bytes, int] = {}
        seq = 0
        for _batch in range(10):
            recs = []
            for _ in range(100):
                seq += 1
                topic = rnd.choice(["qa", "q", "qb"])
                k = "A" * rnd.choice([0, 3, 7, 8, 19, 20, 21, 40]) + str(rnd.randrange(30))
                recs.append(dict(pub=5, seq=seq, ts=seq, topic=topic,
                                 body=b'{"v":%d}' % seq, hdr=k_fragment(k)))  # fmt: skip
                newest[(topic + "\x00" + k).encode()] = seq
            submit(j, recs)
        fold = history._Fold({}, lambda t: True, lambda t: None)
        table = fold.run(j, j.start_position, j.end_position, None)
        assert table is not None
        got = []
        for topic in ("q", "qa", "qb"):
            table.seek(topic.encode() + b"\x00")
            got += table.rest(10**6)
        assert [k for k, _v in got] == sorted(newest)
        assert [int(v[16:24].hex(), 16) for _k, v in got] == [newest[k] for k in sorted(newest)]
    finally:
        j.close()


def test_fold_table_answers_the_same_whatever_its_first_size(tmp_path, monkeypatch):
    """A table sized far below the keys it meets (it grows, its entries hashed again from
    their keys) or far above (the hint is bounded) folds as the tuple fold does."""
    from journal.journal import Journal
    from tests.support.journal_data import submit

    j = Journal(str(tmp_path / "journal"), durability="write")
    real = history.FoldTable
    try:
        seq = 0
        for _batch in range(5):
            recs = []
            for _ in range(1000):
                seq += 1
                k = _key((seq * 7919) % 3000)
                recs.append(dict(pub=5, seq=seq, ts=seq, topic="px",
                                 body=b'{"v":%d}' % seq, hdr=k_fragment(k)))  # fmt: skip
            submit(j, recs)
        want = None
        for hint in (None, 1, 10**12):
            if hint is None:
                fold = history._Fold({}, lambda t: True, lambda t: None)
                fold.run_py(j, j.start_position, j.end_position)
                got = sorted(fold.overlay.items())
            else:
                monkeypatch.setattr(history, "FoldTable", lambda hint=0, h=hint: real(hint=h))
                table = history._Fold({}, lambda t: True, lambda t: None).run(
                    j, j.start_position, j.end_position, None
                )
                table.seek(b"px\x00")
                got = table.rest(10**6)
            assert len(got) == 3000  # past the 2,048 a table of the least size holds
            want = want or got
            assert got == want, hint
        with pytest.raises(ValueError):
            real(hint=-1).sort().merge_keys([b"px\x00a"], lambda keys: [])
    finally:
        j.close()


def test_merge_keys_refuses_a_fetch_that_does_not_answer_each_key(tmp_path):
    """merge_keys takes the values of the keys the fold left from fetch(keys): a fetch that
    returns another number of pairs, or another key, is refused (ValueError), never merged."""
    from journal.journal import Journal
    from tests.support.journal_data import submit

    j = Journal(str(tmp_path / "journal"), durability="write")
    try:
        recs = [dict(pub=5, seq=i + 1, ts=i + 1, topic="px", body=b"{}", hdr=k_fragment(k))
                for i, k in enumerate(["b", "d"])]  # fmt: skip
        submit(j, recs)

        def order():
            t = history._Fold({}, lambda t: True, lambda t: None).run(
                j, j.start_position, j.end_position, None
            )
            t.seek(b"px\x00")
            return t

        keys = [b"px\x00a", b"px\x00b", b"px\x00c"]
        out, taken = order().merge_keys(keys, lambda ks: [(k, b"v" + k) for k in ks])
        assert [k for k, _v in out] == keys and taken == 1  # b replaced; a, c fetched
        assert out[0][1] == b"vpx\x00a" and out[1][1] != b"vpx\x00b"
        for bad in (lambda ks: [], lambda ks: [(b"px\x00z", b"") for _k in ks], lambda ks: None):
            with pytest.raises(ValueError):
                order().merge_keys(keys, bad)
    finally:
        j.close()
