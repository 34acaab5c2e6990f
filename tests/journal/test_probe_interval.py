"""TICKERTAPE_JOURNAL_PROBE_INTERVAL: how often an unavailable journal is probed (journal/writer.py)."""

import math

import pytest

from journal.errors import ProbeIntervalError
from journal.writer import PROBE_INTERVAL_ENV, probe_interval


def test_unset_or_empty_is_the_second_of_the_contract():
    assert probe_interval({}) == 1.0
    assert probe_interval({PROBE_INTERVAL_ENV: " "}) == 1.0


@pytest.mark.parametrize("raw, seconds", [("0.05", 0.05), ("2", 2.0), (" 60 ", 60.0)])
def test_a_number_of_seconds_is_taken(raw, seconds):
    assert math.isclose(probe_interval({PROBE_INTERVAL_ENV: raw}), seconds)


@pytest.mark.parametrize("raw", ["0", "-1", "61", "nan", "inf", "1s", "fast"])
def test_anything_else_is_refused_saying_what_to_give(raw):
    with pytest.raises(ProbeIntervalError, match=r"TICKERTAPE_JOURNAL_PROBE_INTERVAL=.*unset it"):
        probe_interval({PROBE_INTERVAL_ENV: raw})


def test_a_journal_opened_with_a_bad_value_refuses_saying_why(tmp_path, monkeypatch):
    """The value is read when the writer opens: the server's start reports the JournalError."""
    from journal.errors import JournalError
    from journal.journal import Journal

    monkeypatch.setenv(PROBE_INTERVAL_ENV, "fast")
    with pytest.raises(JournalError, match="PROBE_INTERVAL='fast'"):
        Journal(str(tmp_path / "j"))
