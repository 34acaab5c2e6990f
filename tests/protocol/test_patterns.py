"""Which topics are patterns (protocol/patterns.py `is_pattern`): one rule for subscriptions,
queues, SOW topics and the journal's maintenance."""

import pytest

from config.model import is_topic_pattern
from protocol.patterns import is_pattern


@pytest.mark.parametrize(
    "topic,pattern",
    [
        ("orders", False),
        ("md.eq", False),  # a lone `.` is literal: dotted names mean themselves
        ("queue.work.v2", False),
        ("md.*", True),
        ("orders|trades", True),
        ("^orders$", True),
        ("a+", True),
        ("a?", True),
        ("[ab]", True),
        ("(a)", True),
        ("a{2}", True),
        ("a\\b", True),
    ],
)
def test_a_topic_is_a_pattern_when_it_holds_a_metacharacter_other_than_a_dot(topic, pattern):
    assert is_pattern(topic) is pattern
    assert is_topic_pattern(topic) is pattern  # the configuration's name for the same rule
