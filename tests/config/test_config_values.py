"""Golden tests for single values: sizes, intervals, counts, InetAddr, ${VAR} substitution."""

import pytest

from config.values import (
    parse_count,
    parse_inet_addr,
    parse_interval,
    parse_size,
    substitute_env,
)

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1024", 1024),
        ("100B", 100),
        ("500KB", 500 * KB),
        ("500kb", 500 * KB),
        ("500K", 500 * KB),
        ("500KiB", 500 * KB),
        ("64MB", 64 * MB),
        ("64 MB", 64 * MB),
        ("  64MB\n", 64 * MB),
        ("16M", 16 * MB),
        ("1GB", GB),
        ("1G", GB),
        ("2TB", 2 << 40),
        ("1.5KB", 1536),
        ("0.5GB", 512 * MB),
    ],
)
def test_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "MB", "-1MB", "64 megabytes", "1e3", "0.3KB", "1.5B", "64MB x", "0x10"]
)
def test_bad_size(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_bad_size_message_says_what_to_write():
    with pytest.raises(ValueError, match=r"invalid size 'lots'.*500KB, 64MB or 1GB"):
        parse_size("lots")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30", 30.0),
        ("0.25", 0.25),
        ("100ms", 0.1),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("7d", 7 * 86400.0),
        ("2w", 14 * 86400.0),
        ("1.5s", 1.5),
        ("500us", 0.0005),
        ("10ns", 1e-8),
        ("30S", 30.0),
        ("1 h", 3600.0),
    ],
)
def test_interval(text, expected):
    assert parse_interval(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "s", "-1s", "soon", "1y", "1h30m", "1,5s"])
def test_bad_interval(text):
    with pytest.raises(ValueError, match="100ms, 30s, 5m, 1h or 7d"):
        parse_interval(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("0", 0), ("5", 5), ("10k", 10_000), ("10K", 10_000), ("2M", 2_000_000)]
)
def test_count(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "1.5", "five", "10m", "3kb"])
def test_bad_count(text):
    with pytest.raises(ValueError):
        parse_count(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9007", ("127.0.0.1", 9007)),
        ("0", ("127.0.0.1", 0)),
        ("127.0.0.1:9007", ("127.0.0.1", 9007)),
        ("0.0.0.0:9007", ("0.0.0.0", 9007)),
        ("localhost:8085", ("localhost", 8085)),
        ("md-feed.example.com:443", ("md-feed.example.com", 443)),
        ("[::1]:9007", ("::1", 9007)),
        ("[::]:9007", ("::", 9007)),
        (" 9007 ", ("127.0.0.1", 9007)),
        ("65535", ("127.0.0.1", 65535)),
    ],
)
def test_inet_addr(text, expected):
    assert parse_inet_addr(text) == expected


def test_inet_addr_default_host():
    assert parse_inet_addr("9007", default_host="0.0.0.0") == ("0.0.0.0", 9007)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty InetAddr"),
        ("65536", "out of range"),
        ("host:", "invalid port"),
        ("host:http", "invalid port"),
        (":9007", "invalid host"),
        ("::1:9007", r"brackets: \[::1\]:9007"),
        ("[::1]9007", r"as \[addr\]:port"),
        ("[nope]:9007", "invalid IPv6 address"),
        ("bad host:9007", "invalid host"),
        ("-9007", "invalid port"),
    ],
)
def test_bad_inet_addr(text, message):
    with pytest.raises(ValueError, match=message):
        parse_inet_addr(text)


ENV = {"DATA": "/srv/tt", "PORT": "9100", "EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no variables", "no variables"),
        ("${DATA}/journal", "/srv/tt/journal"),
        ("127.0.0.1:${PORT}", "127.0.0.1:9100"),
        ("${DATA}${PORT}", "/srv/tt9100"),
        ("${UNSET:-./data}/journal", "./data/journal"),
        ("${PORT:-9007}", "9100"),
        ("${EMPTY:-fallback}", "fallback"),
        ("${EMPTY}", ""),
        ("${UNSET:-}", ""),
        ("orders.*$", "orders.*$"),
        ("cost $5", "cost $5"),
        ("$${DATA}", "${DATA}"),
        ("${UNSET:-a:-b}", "a:-b"),
    ],
)
def test_substitute_env(text, expected):
    assert substitute_env(text, ENV) == (expected, [])


def test_unset_variable_is_named():
    _, errors = substitute_env("${DATA}/${NOPE}/${ALSO_NOPE}", ENV)
    assert len(errors) == 2
    assert "NOPE is not set" in errors[0] and "${NOPE:-default}" in errors[0]
    assert "ALSO_NOPE is not set" in errors[1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("${DATA", "not closed"),
        ("${A:-${B}}", "not closed"),
        ("${}", "invalid variable name"),
        ("${1ABC}", "invalid variable name"),
        ("${A B}", "invalid variable name"),
    ],
)
def test_bad_substitution(text, message):
    _, errors = substitute_env(text, ENV)
    assert len(errors) == 1 and message in errors[0]
