"""The filter index (server/filter_index.py): which equalities it reads out of filter text, that
its candidates always hold every subscription whose filter is TRUE (random filters and bodies),
and that live fan-out through it delivers exactly what trying every filter delivers."""

from __future__ import annotations

import json
import random

import pytest

from protocol.filters import compile_filter
from server.filter_index import INDEX_MIN, TopicIndex, equality_of, value_keys


@pytest.mark.parametrize(
    ("text", "path", "consts"),
    [
        ("/id = 42", ("id",), [42]),
        ("42 = /id", ("id",), [42]),
        ("/id == -3", ("id",), [-3]),
        ("/sym = 'IBM'", ("sym",), ["IBM"]),
        ("/a/b = TRUE", ("a", "b"), [True]),
        ("/sym IN ('IBM', 'MSFT')", ("sym",), ["IBM", "MSFT"]),
        ("/sym IN ('IBM', NULL)", ("sym",), ["IBM"]),
        ("/qty > 5 AND /sym = 'X'", ("sym",), ["X"]),
        ("(/a IN (1, 2, 3) AND /qty > 5) AND /b = 'x'", ("b",), ["x"]),
        ("/n = '12'", ("n",), ["12"]),
    ],
)
def test_equalities_it_indexes(text, path, consts):
    keys = []
    for c in consts:
        keys.extend(k for k in value_keys(c) if k not in keys)
    assert equality_of(text) == (path, tuple(keys))


@pytest.mark.parametrize(
    "text",
    [
        "/qty > 5",
        "/a = 1 OR /b = 2",
        "NOT /a = 1",
        "/a != 1",
        "/a NOT IN (1, 2)",
        "/a[0] = 1",
        "/a = /b",
        "/a IN (1, /b)",
        "/a = NULL",
        "/a + 1 = 2",
        "/a LIKE '^x'",
        "1 = 1",
        "this is not a filter",
    ],
)
def test_filters_it_leaves_to_every_message(text):
    assert equality_of(text) is None


def test_keys_follow_the_equality_rules():
    assert value_keys(True) == [("b", True)]
    assert value_keys(1) == [("n", 1)]
    assert set(value_keys("12")) == {("s", "12"), ("n", 12)}
    assert value_keys("abc") == [("s", "abc")]
    assert set(value_keys([1, "x", {"a": 1}, [2], None])) == {("n", 1), ("s", "x")}
    assert value_keys(None) == value_keys({"a": 1}) == value_keys([]) == []
    # 1 = 1.0 and TRUE != 1: the keys hash accordingly
    assert ("n", 1.0) in set(value_keys(1)) and ("n", 1) not in set(value_keys(True))


class _Sub:
    def __init__(self, i: int, text: str | None, out: object) -> None:
        self.sub_id = f"s{i}"
        self.filter_text = text
        self.filter = compile_filter(text) if text else None
        self.out = out


_VALUES = [0, 1, 2, 1.0, 2.5, -1, "1", "2", "1.0", "a", "b", "", "IBM", True, False, None]


def _value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.1 and depth < 2:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    if r < 0.15 and depth < 2:
        return {"x": _value(rng, depth + 1)}
    return rng.choice(_VALUES)


def _const(v) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    return repr(v)


def _filter(rng: random.Random) -> str | None:
    field = rng.choice(["/a", "/b", "/c/x"])
    shape = rng.randrange(7)
    v = rng.choice(_VALUES)
    if shape == 0:
        return None
    if shape == 1:
        return f"{field} = {_const(v)}"
    if shape == 2:
        return f"{_const(v)} = {field}"
    if shape == 3:
        items = ", ".join(_const(rng.choice(_VALUES)) for _ in range(rng.randrange(1, 4)))
        return f"{field} IN ({items})"
    if shape == 4:
        return f"{field} = {_const(v)} AND /b > 0"
    if shape == 5:
        return f"/b > 0 OR {field} = {_const(v)}"
    return f"{field} != {_const(v)}"


def test_candidates_hold_every_match_on_random_filters_and_bodies():
    rng = random.Random(15)
    outs = [object() for _ in range(4)]
    for _round in range(30):
        subs = [_Sub(i, _filter(rng), rng.choice(outs)) for i in range(60)]
        index = TopicIndex.build(subs)
        assert index is not None
        for _ in range(40):
            doc = {k: _value(rng) for k in ("a", "b", "c") if rng.random() < 0.8}
            body = json.dumps(doc).encode()
            got = {s for _out, group in index.select(body) for s in group}
            want = {s for s in subs if s.filter is not None and s.filter(doc)}
            want |= {s for s in subs if s.filter is None}
            assert want <= got, (doc, sorted(s.filter_text for s in want - got))


def test_groups_keep_the_router_order_and_a_body_that_is_not_json_reaches_the_unfiltered():
    a, b = object(), object()
    subs = [_Sub(i, f"/id = {i % 20}", a if i % 2 else b) for i in range(40)]
    subs.append(_Sub(40, None, a))
    index = TopicIndex.build(subs)
    assert index is not None
    got = index.select(b'{"id": 3}')
    assert [(out, [s.sub_id for s in g]) for out, g in got] == [(a, ["s3", "s23", "s40"])]
    assert [[s.sub_id for s in g] for _out, g in index.select(b"not json")] == [["s40"]]


def test_few_indexable_filters_get_no_index():
    subs = [_Sub(i, f"/id = {i}", None) for i in range(INDEX_MIN - 1)]
    subs += [_Sub(100 + i, "/qty > 5", None) for i in range(50)]
    assert TopicIndex.build(subs) is None


async def test_live_fanout_through_the_index_delivers_what_every_filter_would(core):
    """Two connections, 60 subscriptions on one topic (equalities, IN lists, a range filter, no
    filter); every delivery names exactly the subscriptions whose filter holds."""
    texts: list[str | None] = []
    for i in range(50):
        texts.append(f"/id = {i % 25}" if i % 5 else f"/id IN ({i % 25}, '7') AND /qty > 1")
    texts += ["/qty > 5"] * 5 + [None] * 5
    clients = [core.client("c0"), core.client("c1")]
    for i, text in enumerate(texts):
        fields = {"f": text} if text else {}
        clients[i % 2].send("subscribe", t="orders", sub_id=f"s{i}", **fields)
    for c in clients:
        assert all(f["status"] == "success" for f in c.take() if f["c"] == "ack")
    assert core.fanout.router.route("orders")[1] is not None
    pub = core.client("pub")
    docs = [{"id": i % 30, "qty": i % 9} for i in range(60)] + [{"id": "7", "qty": 3}]
    for n, doc in enumerate(docs, 1):
        pub.send("publish", json.dumps(doc), t="orders", s=n)
    await core.settle()
    for ci, c in enumerate(clients):
        got = [(json.loads(f.body), f["sids"].split(",")) for f in c.take() if f["c"] == "p"]
        want = []
        for doc in docs:
            sids = [
                f"s{i}"
                for i, text in enumerate(texts)
                if i % 2 == ci and (text is None or compile_filter(text)(doc))
            ]
            if sids:
                want.append((doc, sids))
        assert got == want
