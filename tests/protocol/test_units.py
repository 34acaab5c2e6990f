"""protocol.units: intervals and sizes (golden inputs, malformed inputs with their messages)."""

import math

import pytest

from protocol.units import MAX_UNIT_TEXT, UnitError, parse_interval, parse_size

INTERVALS = [
    ("500ms", 0.5),
    ("1ms", 0.001),
    ("10s", 10.0),
    ("2.5s", 2.5),
    (".5s", 0.5),
    ("3.s", 3.0),
    ("5m", 300.0),
    ("1h", 3600.0),
    ("1.5h", 5400.0),
    ("1d", 86400.0),
    ("30", 30.0),
    ("0.25", 0.25),
    ("0", 0.0),
    ("0s", 0.0),
    ("500MS", 0.5),
    ("10S", 10.0),
    ("5M", 300.0),
    ("1H", 3600.0),
    ("2D", 172800.0),
    ("36500d", 36500 * 86400.0),
    ("  10s  ", 10.0),
    ("10 s", 10.0),
    (7, 7.0),
    (0.5, 0.5),
]


@pytest.mark.parametrize(("text", "seconds"), INTERVALS)
def test_interval_golden(text, seconds):
    result = parse_interval(text)
    assert isinstance(result, float)
    assert math.isclose(result, seconds, rel_tol=0, abs_tol=1e-12)


BAD_INTERVALS = [
    ("", "empty"),
    ("   ", "empty"),
    ("s", "not a number"),
    ("ms", "not a number"),
    ("-5s", "sign"),
    ("+5s", "sign"),
    ("10x", "unknown unit 'x'"),
    ("10sec", "unknown unit 'sec'"),
    ("5us", "unknown unit 'us'"),
    ("1e3", "not a number with an optional unit"),
    ("1.2.3s", "not a number"),
    ("nan", "not a number"),
    ("inf", "not a number"),
    ("5 m s", "not a number"),
    ("１０s", "not a number"),  # fullwidth digits are not ASCII decimal
    ("36501d", "too large (at most 100 years"),
    ("9" * 60 + "d", "too large"),
    ("1" * (MAX_UNIT_TEXT + 1), "too long"),
    (None, "must be text"),
    (True, "must be text"),
    (-1, "from 0 to"),
    (float("inf"), "finite"),
    (float("nan"), "finite"),
    (4e9, "finite number from 0 to 3153600000"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_INTERVALS)
def test_interval_malformed(text, fragment):
    with pytest.raises(UnitError) as info:
        parse_interval(text)
    message = str(info.value)
    assert fragment in message
    assert "500ms" in message  # every message lists the accepted forms
    assert isinstance(info.value, ValueError)


SIZES = [
    ("512B", 512),
    ("512b", 512),
    ("0", 0),
    ("4096", 4096),
    ("1KB", 1024),
    ("500KB", 500 * 1024),
    ("500kb", 500 * 1024),
    ("10MB", 10 * 1024**2),
    ("10Mb", 10 * 1024**2),
    ("1GB", 1024**3),
    ("2TB", 2 * 1024**4),
    (" 16 MB ", 16 * 1024**2),
    (123, 123),
]


@pytest.mark.parametrize(("text", "size"), SIZES)
def test_size_golden(text, size):
    result = parse_size(text)
    assert type(result) is int
    assert result == size


BAD_SIZES = [
    ("", "empty"),
    ("KB", "not a whole number"),
    ("1.5GB", "not a whole number; use a smaller unit"),
    ("-1", "sign"),
    ("+1KB", "sign"),
    ("10MiB", "unknown unit 'MiB'"),
    ("10K", "unknown unit 'K'"),
    ("10 bytes", "unknown unit 'bytes'"),
    ("1e6", "not a whole number with an optional unit"),
    ("10 M B", "not a whole number"),
    ("9999999999TB", "too large"),
    ("1" * (MAX_UNIT_TEXT + 1), "too long"),
    (1.5, "must be text"),
    (-1, "between 0 and"),
    (False, "must be text"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_SIZES)
def test_size_malformed(text, fragment):
    with pytest.raises(UnitError) as info:
        parse_size(text)
    message = str(info.value)
    assert fragment in message
    assert "500KB" in message
