"""A replay's conflation key never raises on a body that is not JSON."""

from server.replay_plan import Conflater


def test_conflation_key_of_unreadable_bodies_is_the_topic_alone():
    c = Conflater(1.0, ["/sym"])
    assert c.key(b"t", b'{"sym":"IBM"}') == (b"t", "IBM")
    assert c.key(b"t", b'{"sym":"\xff"}') == (b"t", None)  # invalid UTF-8
    assert c.key(b"t", b"[" * 100_000) == (b"t", None)  # deeper than the decoder goes
    assert c.key(b"t", b"not json") == (b"t", None)
