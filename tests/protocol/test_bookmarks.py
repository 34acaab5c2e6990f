"""protocol.bookmarks: every ``bm`` form, malformed inputs, round trips, the index key."""

import calendar
import random
from datetime import UTC, datetime, timedelta

import pytest

from protocol import bookmarks
from protocol.bookmarks import (
    EPOCH,
    MAX_BOOKMARK_TEXT,
    MAX_LIST_ITEMS,
    MAX_U64,
    NOW,
    Bookmark,
    BookmarkList,
    Epoch,
    InvalidBookmark,
    Now,
    Range,
    Timestamp,
    format_bookmark,
    format_timestamp,
    parse_bookmark,
    parse_timestamp,
    publisher_bookmark,
)


def ts(*parts: int, micros: int = 0) -> Timestamp:
    """Timestamp for a UTC (year, month, day, hour, minute, second), computed independently."""
    return Timestamp(calendar.timegm((*parts, 0, 0, 0)) * 1_000_000 + micros)


JUNE_4 = ts(2020, 6, 4, 0, 0, 0)
JUNE_5 = ts(2020, 6, 5, 0, 0, 0)
FUTURE = ts(2999, 12, 31, 23, 59, 59)
B1 = Bookmark(15965946592823539461, 1555437495000000004)
B2 = Bookmark(42, 7)
B3 = Bookmark(1, 0)

# --------------------------------------------------------------------------------------------
# golden inputs

POINTS = [
    ("0", EPOCH),
    ("0|1|", NOW),
    ("0|1", NOW),  # trailing '|' optional
    ("42|7|", B2),
    ("42|7", B2),
    ("1|0|", B3),
    ("15965946592823539461|1555437495000000004|", B1),
    (f"{MAX_U64}|{MAX_U64}|", Bookmark(MAX_U64, MAX_U64)),
    ("  42|7|  ", B2),
    # timestamps
    ("20150102T123500Z", ts(2015, 1, 2, 12, 35, 0)),
    ("20150102T123500", ts(2015, 1, 2, 12, 35, 0)),
    ("20150102T123500.000000Z", ts(2015, 1, 2, 12, 35, 0)),
    ("20261121T204005.123456Z", ts(2026, 11, 21, 20, 40, 5, micros=123456)),
    ("20261121T204005.123456", ts(2026, 11, 21, 20, 40, 5, micros=123456)),
    ("20261121T204005.5Z", ts(2026, 11, 21, 20, 40, 5, micros=500000)),
    ("20261121T204005.05", ts(2026, 11, 21, 20, 40, 5, micros=50000)),
    ("20261121T204005.000001Z", ts(2026, 11, 21, 20, 40, 5, micros=1)),
    ("19700101T000000Z", Timestamp(0)),
    ("19691231T235959.999999Z", Timestamp(-1)),
    ("20240229T120000Z", ts(2024, 2, 29, 12, 0, 0)),  # leap day
    ("29991231T235959Z", FUTURE),
    ("00010101T000000Z", Timestamp(-62135596800 * 1_000_000)),
    ("99991231T235959.999999Z", Timestamp(253402300799 * 1_000_000 + 999999)),
]


@pytest.mark.parametrize(("text", "expected"), POINTS)
def test_point_golden(text, expected):
    result = parse_bookmark(text)
    assert result == expected
    assert type(result) is type(expected)


def test_golden_timestamps_against_hardcoded_micros():
    # Independent of calendar.timegm: 2015-01-02T12:35:00Z is 1420202100 s after the epoch.
    assert parse_bookmark("20150102T123500Z") == Timestamp(1420202100_000000)
    assert parse_bookmark("20261121T204005.123456Z") == Timestamp(1795293605_123456)


LISTS = [
    ("42|7|,1|0|", BookmarkList((B2, B3))),
    ("42|7|, 1|0| ,0", BookmarkList((B2, B3, EPOCH))),
    ("0,0|1|", BookmarkList((EPOCH, NOW))),
    ("42|7,1|0", BookmarkList((B2, B3))),
    ("42|7|,20200604T000000Z", BookmarkList((B2, JUNE_4))),
    ("42|7|,42|7|", BookmarkList((B2, B2))),  # duplicates are harmless: oldest wins anyway
]


@pytest.mark.parametrize(("text", "expected"), LISTS)
def test_list_golden(text, expected):
    assert parse_bookmark(text) == expected


L12 = BookmarkList((B1, B2))
L23 = BookmarkList((B2, B3))

RANGES = [
    # all four bracket combinations
    ("[20200604T000000Z:20200605T000000Z]", Range(JUNE_4, True, JUNE_5, True)),
    ("[20200604T000000Z:20200605T000000Z)", Range(JUNE_4, True, JUNE_5, False)),
    ("(20200604T000000Z:20200605T000000Z]", Range(JUNE_4, False, JUNE_5, True)),
    ("(20200604T000000Z:20200605T000000Z)", Range(JUNE_4, False, JUNE_5, False)),
    ("[42|7|:1|0|]", Range(B2, True, B3, True)),
    ("(42|7|:1|0|)", Range(B2, False, B3, False)),
    # a timestamp on either side
    ("[42|7|:20200605T000000Z)", Range(B2, True, JUNE_5, False)),
    ("(20200604T000000Z:42|7|]", Range(JUNE_4, False, B2, True)),
    # lists on either side, and both
    (
        f"[{B1},{B2}:1|0|]",
        Range(L12, True, B3, True),
    ),
    (
        f"(1|0|:{B2},{B3})",
        Range(B3, False, L23, False),
    ),
    (
        f"[{B1},{B2}:{B2},{B3}]",
        Range(L12, True, L23, True),
    ),
    (
        "[42|7|,20200604T000000Z:20200605T000000Z]",
        Range(BookmarkList((B2, JUNE_4)), True, JUNE_5, True),
    ),
    # future end, EPOCH begin, NOW begin
    ("[20200604T000000Z:29991231T235959Z)", Range(JUNE_4, True, FUTURE, False)),
    ("[0:29991231T235959Z]", Range(EPOCH, True, FUTURE, True)),
    ("(0|1|:29991231T235959Z]", Range(NOW, False, FUTURE, True)),
    # whitespace around the parts, an empty timestamp interval, optional trailing '|'
    (" [ 42|7| : 1|0| ] ", Range(B2, True, B3, True)),
    ("[20200604T000000Z:20200604T000000Z)", Range(JUNE_4, True, JUNE_4, False)),
    ("[42|7:1|0]", Range(B2, True, B3, True)),
]


@pytest.mark.parametrize(("text", "expected"), RANGES)
def test_range_golden(text, expected):
    assert parse_bookmark(text) == expected


# --------------------------------------------------------------------------------------------
# malformed inputs

MALFORMED = [
    ("", "bookmark is empty"),
    ("   ", "bookmark is empty"),
    ("garbage", "'garbage' is not a bookmark; expected 0 (EPOCH)"),
    ("now", "is not a bookmark"),
    ("EPOCH", "is not a bookmark"),
    ("00", "is not a bookmark"),
    ("1", "is not a bookmark"),
    ("|", "publisher id is empty"),
    ("||", "publisher id is empty"),
    ("5||", "sequence is empty"),
    ("|5|", "publisher id is empty"),
    ("-1|2|", "publisher id '-1' is negative"),
    ("1|-2|", "sequence '-2' is negative"),
    ("+1|2|", "publisher id '+1' is signed"),
    ("0x1F|2|", "publisher id '0x1F' is not a decimal number"),
    ("1.5|2|", "not a decimal number"),
    ("1e3|2|", "not a decimal number"),
    ("01|2|", "no leading zeros"),
    ("1|02|", "no leading zeros"),
    ("1 |2|", "not a decimal number"),
    ("١|2|", "not a decimal number"),  # Arabic-Indic one
    ("1|2|3|", "has 3 '|'"),
    ("1|2||", "has 3 '|'"),
    ("1|2|x", "has 2 '|'"),
    (f"{MAX_U64 + 1}|1|", "publisher id '18446744073709551616' exceeds 2**64-1"),
    (f"1|{MAX_U64 + 1}|", "sequence '18446744073709551616' exceeds 2**64-1"),
    ("1|" + "9" * 5000 + "|", "exceeds 2**64-1"),
    ("0|0|", "publisher id 0 is reserved"),
    ("0|2|", "publisher id 0 is reserved"),
    # timestamps
    ("20200230T000000Z", "not a valid UTC time"),
    ("20201301T000000Z", "not a valid UTC time"),
    ("20200101T240000Z", "not a valid UTC time"),
    ("20200101T235960Z", "not a valid UTC time"),
    ("00000101T000000Z", "not a valid UTC time"),
    ("2020010T000000Z", "is not a bookmark"),
    ("20200101T00000Z", "timestamp '20200101T00000Z' is malformed; expected YYYYmmddTHHMMSS"),
    ("20200101T000000z", "malformed"),
    ("20200101t000000Z", "is not a bookmark"),
    ("20200101T000000+01", "malformed"),
    ("20200101T000000.Z", "malformed"),
    ("20200101T000000.1234567Z", "malformed"),
    ("20200101T000000ZZ", "malformed"),
    ("2020-01-01T00:00:00Z", "':' outside a range"),
    # lists
    ("1|2|,", "bookmark list item 2 is empty"),
    (",1|2|", "bookmark list item 1 is empty"),
    ("1|2|,,3|4|", "bookmark list item 2 is empty"),
    ("1|2|,x", "bookmark list item 2: 'x' is not a bookmark"),
    ("1|2|,0|5|", "bookmark list item 2: bookmark '0|5|': publisher id 0 is reserved"),
    ("1|2|,[3|4|:5|6|]", "range brackets inside a bookmark or list"),
    # ranges
    ("[1|2|:3|4|", "unbalanced range brackets: range opens with '['"),
    ("(1|2|:3|4|", "unbalanced range brackets"),
    ("1|2|:3|4|]", "unbalanced range brackets: text ends with ']'"),
    ("1|2|:3|4|)", "unbalanced range brackets"),
    ("1|2|:3|4|", "':' outside a range"),
    ("[1|2|]", "exactly one ':' between begin and end, found 0"),
    ("[]", "found 0"),
    ("[:]", "range begin is empty"),
    ("[1|2|:3|4|:5|6|]", "exactly one ':' between begin and end, found 2"),
    ("[[1|2|:3|4|]:5|6|]", "nested ranges"),
    ("[1|2|:[3|4|:5|6|]]", "nested ranges"),
    ("[1|2|:(3|4|)]", "nested ranges"),
    ("[:3|4|]", "range begin is empty"),
    ("[1|2|:]", "range end is empty"),
    ("[x:3|4|]", "range begin: 'x' is not a bookmark"),
    ("[1|2|:3|x|]", "range end: bookmark '3|x|': sequence 'x' is not a decimal number"),
    ("[1|2|,,3|4|:5|6|]", "range begin: bookmark list item 2 is empty"),
    ("[1|2|:3|4|,-5|6|]", "range end: bookmark list item 2: bookmark '-5|6|': publisher id"),
    (
        "[20200605T000000Z:20200604T000000Z]",
        "range begins at 20200605T000000.000000Z after it ends at 20200604T000000.000000Z",
    ),
    ("[20200230T000000Z:20200605T000000Z]", "range begin: timestamp '20200230T000000Z'"),
    # not text
    (None, "bookmark must be a string, got NoneType"),
    (0, "bookmark must be a string, got int"),
    (b"0", "bookmark must be a string, got bytes"),
]


@pytest.mark.parametrize(("text", "fragment"), MALFORMED)
def test_malformed(text, fragment):
    with pytest.raises(InvalidBookmark) as info:
        parse_bookmark(text)
    assert fragment in str(info.value)
    assert info.value.reason == "invalid bookmark"
    assert isinstance(info.value, ValueError)


def test_bounded_list_size():
    at_limit = ",".join(f"{i}|1|" for i in range(1, MAX_LIST_ITEMS + 1))
    result = parse_bookmark(at_limit)
    assert isinstance(result, BookmarkList)
    assert len(result.items) == MAX_LIST_ITEMS
    assert result.items[-1] == Bookmark(MAX_LIST_ITEMS, 1)

    with pytest.raises(InvalidBookmark, match="10001 items; at most 10000"):
        parse_bookmark(at_limit + ",1|2|")
    with pytest.raises(InvalidBookmark, match="range end: bookmark list has 10001 items"):
        parse_bookmark(f"[1|1|:{at_limit},1|2|]")


def test_bounded_text_size():
    padded = " " * (MAX_BOOKMARK_TEXT - 1) + "0"
    assert parse_bookmark(padded) == EPOCH
    with pytest.raises(
        InvalidBookmark, match=r"1048577 characters is too long \(at most 1048576\)"
    ):
        parse_bookmark(padded + " ")


# --------------------------------------------------------------------------------------------
# typed values, formatting, round trips


def test_sentinels():
    assert str(EPOCH) == "0"
    assert str(NOW) == "0|1|"
    assert EPOCH == Epoch() and NOW == Now()
    assert EPOCH != NOW
    assert parse_bookmark(str(EPOCH)) is EPOCH
    assert parse_bookmark(str(NOW)) is NOW


def test_bookmark_str_and_format():
    assert str(Bookmark(42, 7)) == "42|7|"
    assert format_bookmark(42, 7) == "42|7|"
    assert str(B1) == "15965946592823539461|1555437495000000004|"


@pytest.mark.parametrize(
    ("publisher_id", "seq", "fragment"),
    [
        (0, 1, "0 is reserved"),
        (-1, 1, "out of range"),
        (MAX_U64 + 1, 1, "out of range"),
        (1, -1, "sequence -1 is out of range"),
        (1, MAX_U64 + 1, "out of range"),
    ],
)
def test_bookmark_constructor_checks_range(publisher_id, seq, fragment):
    with pytest.raises(InvalidBookmark, match=fragment):
        Bookmark(publisher_id, seq)


def test_values_are_frozen_and_hashable():
    with pytest.raises(AttributeError):
        B2.seq = 8  # type: ignore[misc]
    values = {parse_bookmark(text) for text, _ in POINTS + LISTS + RANGES}
    assert EPOCH in values and NOW in values and B2 in values


def test_format_timestamp_golden():
    assert format_timestamp(1795293605_123456) == "20261121T204005.123456Z"
    assert format_timestamp(0) == "19700101T000000.000000Z"
    assert format_timestamp(1) == "19700101T000000.000001Z"
    assert format_timestamp(-1) == "19691231T235959.999999Z"
    assert format_timestamp(1420202100_000000) == "20150102T123500.000000Z"
    assert format_timestamp(253402300799_999999) == "99991231T235959.999999Z"
    assert format_timestamp(-62135596800_000000) == "00010101T000000.000000Z"
    assert str(Timestamp(1795293605_123456)) == "20261121T204005.123456Z"


def test_format_timestamp_cache_is_not_stale():
    # Same second twice (cache hit), then the next second, then back: each must be right.
    base = 1795293605_000000
    assert format_timestamp(base + 1) == "20261121T204005.000001Z"
    assert format_timestamp(base + 999_999) == "20261121T204005.999999Z"
    assert format_timestamp(base + 1_000_000) == "20261121T204006.000000Z"
    assert format_timestamp(base) == "20261121T204005.000000Z"
    assert format_timestamp(base - 1) == "20261121T204004.999999Z"


def test_format_timestamp_matches_datetime():
    rng = random.Random(20261121)
    origin = datetime(1970, 1, 1, tzinfo=UTC)
    for _ in range(2000):
        micros = rng.randrange(-62135596800_000000, 253402300800_000000)
        expected = (origin + timedelta(microseconds=micros)).strftime("%Y%m%dT%H%M%S.%fZ")
        # strftime's %Y does not pad years below 1000 on every platform; compare the tail only.
        assert format_timestamp(micros)[-19:] == expected[-19:]
        assert (
            format_timestamp(micros)[:4] == f"{(origin + timedelta(microseconds=micros)).year:04d}"
        )


def test_format_timestamp_out_of_range():
    with pytest.raises(ValueError, match="outside years 0001..9999"):
        format_timestamp(253402300800_000000)


def test_timestamp_round_trip_random():
    rng = random.Random(5)
    for _ in range(2000):
        micros = rng.randrange(-62135596800_000000, 253402300800_000000)
        text = format_timestamp(micros)
        assert parse_bookmark(text) == Timestamp(micros)
        assert parse_timestamp(text) == Timestamp(micros)
        assert parse_bookmark(text.removesuffix("Z")) == Timestamp(micros)


def test_bookmark_round_trip_random():
    rng = random.Random(7)
    for _ in range(2000):
        publisher_id = rng.choice([1, MAX_U64, rng.randrange(1, MAX_U64 + 1)])
        seq = rng.choice([0, 1, MAX_U64, rng.randrange(0, MAX_U64 + 1)])
        text = format_bookmark(publisher_id, seq)
        assert parse_bookmark(text) == Bookmark(publisher_id, seq)
        assert str(Bookmark(publisher_id, seq)) == text


@pytest.mark.parametrize(("text", "expected"), POINTS + LISTS + RANGES)
def test_round_trip_every_golden(text, expected):
    # format then parse gives the same value, and the formatted text is canonical (a fixed point).
    canonical = str(expected)
    assert parse_bookmark(canonical) == expected
    assert str(parse_bookmark(canonical)) == canonical


def test_range_str():
    assert (
        str(Range(JUNE_4, True, JUNE_5, False))
        == "[20200604T000000.000000Z:20200605T000000.000000Z)"
    )
    assert str(Range(L12, False, B3, True)) == f"({B1},{B2}:1|0|]"


# --------------------------------------------------------------------------------------------
# index key


def test_module_docstring_documents_the_format():
    doc = bookmarks.__doc__
    for fragment in ("0|1|", "YYYYmmdd", "trailing ``|`` is optional"):
        assert fragment in doc


# -- publisher_bookmark: the one reader of a message's bookmark on the per-message paths ----------


def _as_point(text: str):
    try:
        spec = parse_bookmark(text)
    except InvalidBookmark:
        return None
    return (spec.publisher_id, spec.seq) if isinstance(spec, Bookmark) else None


@pytest.mark.parametrize(
    "text",
    [
        "12|34|", "12|34", " 12|34| ", "1|0|", f"{MAX_U64}|{MAX_U64}|", f"1|{MAX_U64 + 1}|",
        "0|1|", "0|2|", "0", "", "|", "||", "1||", "|1|", "012|3|", "12|03|", "+1|2|", "-1|2|",
        "1 |2|", "1| 2|", "1|2|x", "1|2|3|", "1|2|,3|4|", "[1|2|:3|4|]", "20261121T204005Z",
        "1|2|\n", "a|b|", "١|٢|", "1_0|2|", "1|2| |",
    ],
)  # fmt: skip
def test_publisher_bookmark_reads_what_parse_bookmark_reads_as_one_bookmark(text):
    assert publisher_bookmark(text) == _as_point(text)


def test_publisher_bookmark_agrees_with_parse_bookmark_on_random_text():
    rng = random.Random(7)
    alphabet = "0123456789||| ,:[]()T.Z-+x"
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert publisher_bookmark(text) == _as_point(text), text
