"""The SOW parts that are pure or own a format (server/sow/): keys (golden), the delete record
body (golden), order_by parsing, and the LMDB store through its API across a reopen."""

import os
import sys

import pytest

from server.sow import BadOrderBy, BadSowKey, KeyMaker, parse_order_by
from server.sow.keys import check_key, k_fragment, key_from_fragment
from server.sow.records import BY_FILTER, BY_KEYS, decode_delete, encode_delete
from server.sow.store import SowStore, decode_value, encode_value, store_rows, store_rows_py


def test_keys_are_the_base64url_of_the_values_array():
    m = KeyMaker(("/sym", "/venue"))
    assert m.key(b'{"sym":"A","venue":"X","px":1}', None) == "WyJBIiwiWCJd"  # ["A","X"]
    assert m.key(b'{"venue":"X","px":2,"sym":"A"}', None) == "WyJBIiwiWCJd"
    assert m.key(b'{"sym":1,"venue":"X"}', None) != m.key(b'{"sym":"1","venue":"X"}', None)
    assert KeyMaker(("/a/b",)).key(b'{"a":{"b":7}}', None) == "Wzdd"  # [7]


@pytest.mark.parametrize(
    "body,words",
    [
        (b'{"venue":"X"}', "no value at /sym"),
        (b'{"sym":null,"venue":"X"}', "no value at /sym"),
        (b'{"sym":[1],"venue":"X"}', "object or an array"),
        (b"not json", "not JSON"),
    ],
)
def test_a_body_without_its_key_is_refused(body, words):
    with pytest.raises(BadSowKey) as info:
        KeyMaker(("/sym", "/venue")).key(body, None)
    assert words in str(info.value) and info.value.reason == "bad sow key"


def test_publisher_given_keys():
    m = KeyMaker(())
    assert m.key(b"anything", "key-1") == "key-1"
    for bad in (None, "", "a,b", "tab\there", "x" * 1025):
        with pytest.raises(BadSowKey):
            m.key(b"{}", bad)
    assert check_key("é" * 512) == "é" * 512  # 1,024 bytes


def test_the_key_member_of_a_header_fragment():
    hdr = b',"x":"a,\\"k\\":\\"no\\""' + k_fragment("WzFd")
    assert hdr.endswith(b',"k":"WzFd"')
    assert key_from_fragment(hdr) == "WzFd"
    assert key_from_fragment(b',"x":"c"') is None


def test_delete_record_bodies():
    assert encode_delete(BY_KEYS, "a,b") == b"Ka,b"
    assert encode_delete(BY_FILTER, "/x = 1") == b"F/x = 1"
    assert decode_delete(b"Ka,b") == (BY_KEYS, "a,b")
    assert decode_delete(b"") is None and decode_delete(b"Zjunk") is None


def test_order_by():
    items = parse_order_by("/px DESC, /sym,/a/b asc")
    assert [(p, d) for p, _get, d in items] == [("/px", True), ("/sym", False), ("/a/b", False)]
    for bad in ("px", "/px SIDEWAYS", "/px DESC extra", "", "/px,"):
        with pytest.raises(BadOrderBy):
            parse_order_by(bad)


def test_the_store_across_a_reopen(tmp_path):
    path = str(tmp_path / "sow")
    s = SowStore(path)
    assert s.rebuilt is None and s.position is None
    v = encode_value(100, 7, 3, 123456, b',"k":"a"', b'{"k":1}')
    assert decode_value(v) == (100, 7, 3, 123456, b',"k":"a"', b'{"k":1}')
    with s.write() as txn:
        assert s.put(txn, "t", "a", v) is False
        assert s.put(txn, "t", "a", v) is True  # replaced
        s.put(txn, "t", "b", v)
        s.put(txn, "t2", "a", v)
        s.set_position(txn, 200)
    r = s.reader(200)
    with s.write() as txn:
        assert s.delete(txn, "t", "b")
    assert [k for k, _ in r.keys("t")] == ["a", "b"]  # the snapshot does not move
    r.close()
    s.close()
    s = SowStore(path)
    assert s.position == 200 and s.topics() == {"t": 1, "t2": 1}
    r = s.reader(200)
    assert r.get("t", "a")[5] == b'{"k":1}' and r.get("t", "b") is None
    r.close()
    s.close()


def test_record_counts_are_kept_with_the_position(tmp_path):
    """A store written with counts opens without counting; one without them (an older
    version's) is counted by a scan; a cleared store counts nothing."""
    path = str(tmp_path / "sow")
    s = SowStore(path)
    v = encode_value(1, 1, 1, 1, b',"k":"a"', b"{}")
    with s.write() as txn:
        for k in "abc":
            s.put(txn, "t", k, v)
        s.put(txn, "u", "a", v)
        s.set_position(txn, 10)  # no counts: as an older version wrote
    s.close()
    s = SowStore(path)
    assert not s.counts_kept and s.topics() == {"t": 3, "u": 1}
    with s.write() as txn:
        s.set_position(txn, 20, {"t": 7, "u": 0})  # what the manager says, not a recount
    s.close()
    s = SowStore(path)
    assert s.counts_kept and s.topics() == {"t": 7}
    s.clear()
    assert s.counts_kept and s.topics() == {}
    s.close()


def test_an_unreadable_store_is_moved_aside(tmp_path):
    path = str(tmp_path / "sow")
    SowStore(path).close()
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.write(b"\xff" * 8192)
    s = SowStore(path)
    assert s.rebuilt is not None and "moved to" in s.rebuilt
    assert s.position is None
    s.close()


def test_the_expiration_member_of_a_stored_fragment():
    """`e` goes just before `k` (k stays last); golden bytes; a fragment without e has none."""
    from server.sow.keys import expiration_from_fragment, with_expiration

    hdr = b',"x":"c1"' + k_fragment("K1")
    got = with_expiration(hdr, 30)
    assert got == b',"x":"c1","e":30,"k":"K1"'
    assert key_from_fragment(got) == "K1" and expiration_from_fragment(got) == 30
    assert expiration_from_fragment(hdr) is None and expiration_from_fragment(b"") is None
    assert with_expiration(b"", 5) == b',"e":5' and expiration_from_fragment(b',"e":5') == 5
    # a value that only looks like the member is inside a string: quotes there are escaped
    assert expiration_from_fragment(b',"x":"a\\",\\"e\\":7"' + k_fragment("K")) is None


def test_the_store_notes_a_record_with_its_own_e(tmp_path):
    store = SowStore(str(tmp_path / "sow"))
    try:
        assert not store.expiring
        with store.write() as txn:
            store.note_expiring(txn)
        assert store.expiring
        store.clear()  # a rebuild: the catch-up notes it again if it meets one
        assert not store.expiring
    finally:
        store.close()


STORE_ROWS = [pytest.param(store_rows_py, id="python")]
if store_rows is not store_rows_py:
    STORE_ROWS.append(pytest.param(store_rows, id="c"))


@pytest.mark.parametrize("impl", STORE_ROWS)
def test_store_rows_golden(impl):
    """Committed batch rows to store rows (server/sow/store.py): the record key, the value
    (golden bytes), the latest of a key winning, other topics skipped."""
    k1, k2 = k_fragment("WzFd"), k_fragment("é")
    msgs = [
        ("px", 7, 1, 1000, b'{"a":1}', 0, k1, None),
        ("plain", 7, 2, 1000, b"x", 60, b"", None),
        ("px", 7, 3, 1001, b'{"a":2}', 100, k2, None),
        ("px", 8, 4, 1002, b'{"a":3}', 200, k1, None),
    ]
    targets = {"px": (b"px\x00", {})}
    assert impl(msgs, 5000, targets) == 3
    # a row with its own expiration stops the run (its record keeps e: the Python way)
    assert (
        impl([("px", 7, 5, 1003, b'{"a":4}', 300, k1, 12.5)], 5000, {"px": (b"px\x00", {})}) == -1
    )
    rows = targets["px"][1]
    assert list(rows) == [b"px\x00WzFd", "px\x00é".encode()]
    assert rows[b"px\x00WzFd"] == (
        (5200).to_bytes(8, "big")
        + (8).to_bytes(8, "big")
        + (4).to_bytes(8, "big")
        + (1002).to_bytes(8, "big")
        + len(k1).to_bytes(2, "big")
        + b',"k":"WzFd"{"a":3}'
    )
    assert rows[b"px\x00WzFd"] == encode_value(5200, 8, 4, 1002, k1, b'{"a":3}')
    assert decode_value(rows["px\x00é".encode()]) == (5100, 7, 3, 1001, k2, b'{"a":2}')


@pytest.mark.parametrize("impl", STORE_ROWS)
@pytest.mark.parametrize(
    "hdr", [b"", b',"x":1' + k_fragment("a"), k_fragment('q"'), k_fragment("b\\c"), b',"k":"']
)
def test_store_rows_stop_at_a_fragment_other_than_a_plain_key(impl, hdr):
    msgs = [
        ("px", 7, 1, 1000, b"{}", 0, k_fragment("a"), None),
        ("px", 7, 2, 1000, b"{}", 50, hdr, None),
    ]
    targets = {"px": (b"px\x00", {})}
    assert impl(msgs, 0, targets) == -1
    assert list(targets["px"][1]) == [b"px\x00a"]  # the rows before it are in


def test_put_many_counts_only_new_records(tmp_path):
    """A key written by two flushes is one record (putmulti's own count says 2): the record
    counts kept in meta, the console's and /stats' figures, do not grow with updates."""
    store = SowStore(str(tmp_path / "sow"))
    try:
        v = encode_value(1, 1, 1, 0, k_fragment("a"), b"{}")
        with store.write() as txn:
            assert store.put_many(txn, [(b"px\x00a", v), (b"px\x00b", v)]) == 2
        with store.write() as txn:
            assert store.put_many(txn, [(b"px\x00a", v), (b"px\x00c", v)]) == 1
            assert store.put_many(txn, [(b"py\x00a", v)]) == 1
    finally:
        store.close()


def _resident_kb(path: str) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    target = os.path.realpath(path)
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0] and len(line.split()) >= 5:
                inside = line.rstrip("\n").endswith(target)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="trim uses Linux's madvise")
def test_trim_drops_the_maps_resident_pages(tmp_path):
    """The pages a full read touched leave the resident set, and the data read after it is
    the same (the page cache keeps them): the RSS of a big store stays bounded."""
    store = SowStore(str(tmp_path / "sow"))
    try:
        with store.write() as txn:
            rows = [(b"px\x00%07d" % i, b"v" * 1000) for i in range(12_000)]
            store.put_many(txn, rows)
        reader = store.reader(0)
        try:
            assert sum(len(c) for c in reader.chunks("px", 1000)) == 12_000  # every page read
        finally:
            reader.close()
        data = str(tmp_path / "sow" / "data.mdb")
        before = _resident_kb(data)
        assert before > 8_000
        assert store.trim(force=True)
        assert _resident_kb(data) < before / 4
        reader = store.reader(0)
        try:
            assert [k for c in reader.chunks("px", 5000) for k, _v in c] == [k for k, _v in rows]
        finally:
            reader.close()
        assert not store.trim()  # not again within TRIM_SECONDS
    finally:
        store.close()
