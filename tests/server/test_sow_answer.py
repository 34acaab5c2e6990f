"""A SOW answer's frames made from store values in bulk (server/sow/answer.py): golden frames, the
C version byte-equal to the Python reference, the chunked store read, and the filter over values
in C giving the Python evaluator's answers."""

import random

import pytest

from protocol.filters import compile_filter
from protocol.framing import FrameDecoder
from server import frames
from server.matching import body_matches
from server.sow import answer
from server.sow.answer import matching, sow_frames_py, value_body
from server.sow.keys import k_fragment
from server.sow.store import SowStore, encode_value, record_key

IMPLS = [pytest.param(sow_frames_py, id="python")]
if answer.ACCELERATED:
    IMPLS.append(pytest.param(answer.sow_frames, id="c"))

HEAD = b'{"c":"sow","t":"px"'


def items(*rows):
    return [(record_key(t, k), encode_value(*v)) for t, k, v in rows]


@pytest.mark.parametrize("impl", IMPLS)
def test_sow_frames_golden(impl):
    """One frame per record, as frames.sow_record makes it; stops at the next topic."""
    got = items(
        ("px", "a", (5, 7, 1, 1000, k_fragment("a"), b'{"a":1}')),
        ("px", "b", (6, 2**64 - 1, 10**15, 1001, b',"x":"c"' + k_fragment("b"), b"")),
        ("py", "a", (7, 7, 3, 1002, k_fragment("a"), b'{"n":1}')),
    )
    data, taken = impl(got, b"px\x00", HEAD, b',"query_id":"q1"', False)
    assert taken == 2
    assert data == (
        b'\x00\x00\x00\x3f{"c":"sow","t":"px","bm":"7|1|","k":"a","query_id":"q1"}{"a":1}'
        + frames.sow_record(
            b',"t":"px"',
            2**64 - 1,
            10**15,
            b',"x":"c","k":"b"',
            b',"query_id":"q1"',
            b"",
        )
    )
    decoded = FrameDecoder().feed(data)
    assert [(h.c, h.t, h.bm, h.k, h.query_id, b) for h, b in decoded] == [
        ("sow", "px", "7|1|", "a", "q1", b'{"a":1}'),
        ("sow", "px", f"{2**64 - 1}|{10**15}|", "b", "q1", b""),
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_sow_frames_no_sowkey_cuts_the_key_member(impl):
    got = items(("px", "a", (5, 7, 1, 1000, b',"x":"c"' + k_fragment("a"), b"{}")))
    data, taken = impl(got, b"px\x00", HEAD, b"", True)
    assert taken == 1
    assert data == frames.sow_record(b',"t":"px"', 7, 1, b',"x":"c"', b"", b"{}")


@pytest.mark.parametrize("impl", IMPLS)
def test_sow_frames_refuses_a_value_too_short_for_its_fields(impl):
    good = encode_value(5, 7, 1, 1000, k_fragment("a"), b"{}")
    for bad in (good[:20], good[:33], good[:36]):
        with pytest.raises(ValueError, match="too short"):
            impl([(b"px\x00a", good), (b"px\x00b", bad)], b"px\x00", HEAD, b"", False)


def test_sow_frames_c_equals_python_on_random_records():
    if not answer.ACCELERATED:
        pytest.skip("the C accelerator is not built here")
    rnd = random.Random(25)
    for _ in range(200):
        rows = []
        for i in range(rnd.randrange(0, 40)):
            topic = rnd.choice(["px", "px", "px", "pz"])
            k = f"k{i:03d}"
            frag = rnd.choice([b"", b',"x":"c-1"', b',"e":5']) + k_fragment(k)
            body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 60)))
            v = (rnd.randrange(2**64), rnd.randrange(2**64), rnd.randrange(2**64), 1, frag, body)
            rows.append((topic, k, v))
        rows.sort(key=lambda r: (r[0], r[1]))
        got = items(*rows)
        extra = rnd.choice([b"", b',"sub_id":"s"'])
        no_key = rnd.random() < 0.3
        assert answer.sow_frames(got, b"px\x00", HEAD, extra, no_key) == sow_frames_py(
            got, b"px\x00", HEAD, extra, no_key
        )


def test_reader_chunks_read_one_topic_in_key_order(tmp_path):
    store = SowStore(str(tmp_path / "sow"))
    try:
        with store.write() as txn:
            for t in ("pa", "px", "py"):
                for i in range(10):
                    store.put(txn, t, f"{i:02d}", encode_value(i, 1, i, 0, k_fragment("x"), b"{}"))
        reader = store.reader(0)
        try:
            for size in (1, 3, 10, 11, 100):
                chunks = list(reader.chunks("px", size))
                assert all(0 < len(c) <= size for c in chunks)
                assert [k for c in chunks for k, _v in c] == [
                    record_key("px", f"{i:02d}") for i in range(10)
                ]
            assert list(reader.chunks("pq", 4)) == []
            assert list(reader.chunks("pz", 4)) == []
        finally:
            reader.close()
    finally:
        store.close()


@pytest.mark.parametrize(
    "text",
    [
        "/n > 3",
        "/n = 2 OR /s = 'b'",
        "/s LIKE 'a' AND /n <= 7",
        "/m IS NULL",
        "/s IN ('a', 'c')",
        "NOT (/n > 3)",
    ],
)
def test_matching_gives_the_evaluators_answers(text):
    """The filter over a chunk of values (C, bodies it cannot decide by the Python evaluator)
    keeps exactly the items body_matches keeps, in order."""
    rnd = random.Random(text)
    bodies = [
        b'{"n":%d,"s":"%s"}' % (rnd.randrange(10), rnd.choice([b"a", b"b", b"ca"]))
        for _ in range(150)
    ]
    bodies += [b'{"n":"5","s":"\\u0061"}', b"not json", b'{"n":[4]}', b'{"m":null}', b"{}"]
    rnd.shuffle(bodies)
    got = [(b"px\x00%03d" % i, encode_value(i, 1, i, 0, k_fragment("x"), b)) for i, b in
           enumerate(bodies)]  # fmt: skip
    f = compile_filter(text)
    want = [it for it in got if body_matches(f, value_body(it[1]))]
    assert matching(got, f) == want
    assert matching(got, lambda doc: isinstance(doc, dict) and doc.get("n") == 3) == [
        it for it in got if b'"n":3,' in it[1]
    ]


def test_historical_fold_in_c_equals_the_tuple_fold(tmp_path):
    """A historical query's fold over stored journal bytes (FoldTable in server/_sowfold.c,
    the records it cannot take folded one by one) leaves the overlay the tuple fold (the
    reference) leaves, at every end point: other topics and kinds passed, keys made from the
    body where a record has none, own expirations, replicated records, deletes by keys and by
    filter, several blocks."""
    from journal.journal import Journal
    from journal.record import KIND_QUEUE_EVENT
    from server.sow import history
    from server.sow.keys import KeyMaker
    from server.sow.records import BY_FILTER, BY_KEYS, encode_delete
    from tests.support.journal_data import submit

    if history.FoldTable is None:
        pytest.skip("the C accelerator is not built here")
    makers = {"px": KeyMaker(("/id",)), "py": KeyMaker(("/id",))}
    rnd = random.Random(7)
    j = Journal(str(tmp_path / "journal"), durability="write")
    try:
        seq = 0
        for _batch in range(30):
            recs = []
            for _ in range(40):
                seq += 1
                topic = rnd.choice(["px", "px", "py", "plain"])
                i = rnd.randrange(25)
                body = b'{"id":%d,"v":%d}' % (i, seq)
                kind = rnd.random()
                if kind < 0.05:
                    form = rnd.choice([BY_KEYS, BY_FILTER])
                    payload = (
                        makers["px"].key(b'{"id":%d}' % i, None) if form == BY_KEYS else "/v > 500"
                    )
                    recs.append(dict(kind=3, pub=0, seq=0, ts=seq, topic="px",
                                     body=encode_delete(form, payload)))  # fmt: skip
                    continue
                if kind < 0.08:
                    recs.append(dict(kind=KIND_QUEUE_EVENT, pub=0, seq=0, ts=seq, topic="px",
                                     body=b"\x00" * 9))  # fmt: skip
                    continue
                hdr = b""
                if topic != "plain" and kind > 0.15:  # the rest: recorded without a k
                    hdr = k_fragment(makers[topic].key(body, None))
                    if kind > 0.9:
                        hdr = b',"x":"c1"' + hdr  # a fragment other than the plain k
                exp = 30 if rnd.random() < 0.1 else None
                recs.append(dict(pub=5, seq=seq, ts=seq, topic=topic, body=body, hdr=hdr, exp=exp))
            submit(j, recs)
        starts = [r[0] for recs in j.raw_batches() for r in recs]  # record boundaries
        for stop in sorted({starts[0], j.end_position, *rnd.sample(starts, 8)}):
            got = []
            for run in ("run", "run_py", "compacted"):
                overlay: dict = {}
                fold = history._Fold(overlay, lambda t: t in makers, makers.get)
                fold.base = None
                if run == "run_py":
                    fold.run_py(j, j.start_position, stop)
                else:
                    history.FOLD_BLOCK = 777  # several blocks, records cut at their ends
                    if run == "compacted":  # no stored bytes (a compacted segment's reads)
                        read_block, j.read_block = j.read_block, lambda *a: None
                    try:
                        table = fold.run(j, j.start_position, stop, None)
                    finally:
                        if run == "compacted":
                            j.read_block = read_block
                    if table is not None:  # the whole fold went through the table
                        assert not overlay
                        table.seek(b"px\x00")
                        overlay = dict(table.rest(10**6))
                        table.seek(b"py\x00")
                        overlay.update(table.rest(10**6))
                got.append(overlay)
            assert got[0] == got[1] == got[2], stop
            assert stop <= j.start_position or got[0]
    finally:
        history.FOLD_BLOCK = 1 << 20
        j.close()


def test_historical_chunks_merge_the_checkpoint_with_the_overlay(tmp_path):
    """HistoricalReader.chunks: the checkpoint's records with the overlay's puts and deletes,
    in key order, one topic, for overlays that touch none, some or all of a chunk's keys."""
    from server.sow.history import HistoricalReader

    rnd = random.Random(3)
    store = SowStore(str(tmp_path / "sow"))
    try:
        base = {}
        with store.write() as txn:
            for t in ("pa", "px", "pz"):
                for i in range(0, 120, 2):
                    v = encode_value(i, 1, i, 0, k_fragment(f"{i:03d}"), b'{"b":%d}' % i)
                    store.put(txn, t, f"{i:03d}", v)
                    base[record_key(t, f"{i:03d}")] = v
        for trial in range(30):
            overlay = {}
            for _ in range(rnd.choice([0, 5, 60, 200])):
                t, i = rnd.choice(["pa", "px", "pz"]), rnd.randrange(130)
                rk = record_key(t, f"{i:03d}")
                overlay[rk] = None if rnd.random() < 0.2 else encode_value(
                    1000 + i, 2, i, 0, k_fragment(f"{i:03d}"), b'{"o":%d}' % trial
                )  # fmt: skip
            want = dict(base)
            want.update(overlay)
            prefix = record_key("px", "")
            want_px = sorted(kv for kv in want.items() if kv[0].startswith(prefix) and kv[1])
            for with_base in (True, False):
                reader = HistoricalReader(
                    store.reader(0) if with_base else None, overlay, 0, lambda: None
                )
                try:
                    size = rnd.choice([1, 7, 32, 500])
                    got = [kv for c in reader.chunks("px", size) for kv in c]
                    if with_base:
                        assert got == want_px
                    else:
                        assert got == sorted(
                            kv for kv in overlay.items() if kv[0].startswith(prefix) and kv[1]
                        )
                    keys = [(k, rec[0]) for k, rec in reader.keys("px")]
                    assert [record_key("px", k) for k, _ in keys] == [kv[0] for kv in got]
                finally:
                    reader.close()
    finally:
        store.close()


class _Wire:
    """A transport that keeps what is written (the Outbox's side of a socket)."""

    def __init__(self):
        self.data = bytearray()

    def write(self, data):
        self.data += data

    def is_closing(self):
        return False

    def get_write_buffer_size(self):
        return 0

    def close(self):
        pass

    def abort(self):
        pass


@pytest.mark.parametrize(
    ("skip", "top", "text"),
    [(0, None, None), (300, None, None), (250, 20, None), (0, 256, None), (5, 0, None),
     (10, 40, "/n < 300"), (0, None, "/n >= 690")],
)  # fmt: skip
def test_chunked_answer_pages_across_chunks_as_the_record_path_did(tmp_path, skip, top, text):
    """skip_n, top_n and a filter over several chunks (CHUNK records each): the records past
    `skip` matches, at most `top`, in key order, and the stats counts of the record path."""
    import asyncio

    from server.outbox import Outbox
    from server.sow.query import CHUNK, QueryPlan, SowQuery

    store = SowStore(str(tmp_path / "sow"))
    try:
        n = 2 * CHUNK + 188
        with store.write() as txn:
            for i in range(n):
                body = b'{"n":%d}' % i
                store.put(
                    txn,
                    "px",
                    f"{i:04d}",
                    encode_value(i, 1, i + 1, 0, k_fragment(f"{i:04d}"), body),
                )
        f = compile_filter(text) if text else None
        plan = QueryPlan(
            topics=["px"], filters={"px": f}, top_n=top, skip_n=skip, acks=frozenset({"stats"})
        )
        wire = _Wire()
        out = Outbox(1 << 30, lambda reason: None)
        out.attach(wire)
        finished = []

        async def run():
            q = SowQuery(out, store.reader(0), (1, n), plan, lambda q, done: finished.append(q))
            q.start()
            await q.task

        asyncio.run(run())
        (q,) = finished
        frames = FrameDecoder().feed(bytes(wire.data))
        got = [int(h.bm.split("|")[1]) - 1 for h, _b in frames if h.c == "sow"]
        matching = [i for i in range(n) if text is None or body_matches(f, b'{"n":%d}' % i)]
        want = matching[skip:] if top is None else matching[skip : skip + top]
        assert got == want
        assert (q.matches, q.returned) == (len(matching), len(want))
        stats = [h for h, _b in frames if h.c == "ack" and h.a == "stats"]
        assert stats and stats[0].records_returned == len(want)
    finally:
        store.close()
