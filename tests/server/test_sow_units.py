"""The SOW parts that are pure or own a format (server/sow/): keys (golden), the delete record
body (golden), order_by parsing, and the LMDB store through its API across a reopen."""

import os

import pytest

from server.sow import BadOrderBy, BadSowKey, KeyMaker, parse_order_by
from server.sow.keys import check_key, k_fragment, key_from_fragment
from server.sow.records import BY_FILTER, BY_KEYS, decode_delete, encode_delete
from server.sow.store import SowStore, decode_value, encode_value


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
