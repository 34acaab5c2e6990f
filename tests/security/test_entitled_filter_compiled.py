"""An entitled subscriber's own filter and the role's are one compiled filter, so the
fields-only decode and the replay's block scanner serve entitled subscribers too."""

from protocol.filters import compile_filter, compiled
from server.guard import _and
from server.security.entitlements import ReadFilter


def test_own_filter_and_entitlement_compile_into_one_filter():
    f = _and(compile_filter("/qty > 50"), ReadFilter("/desk = 'fx'"))
    info = compiled(f)
    assert info is not None and info.fields == frozenset({"qty", "desk"})
    assert info.program is not None  # the block scanner takes it
    assert info.match_raw(b'{"qty":60,"desk":"fx"}')
    assert not info.match_raw(b'{"qty":60,"desk":"eq"}')
    assert not info.match_raw(b'{"qty":10,"desk":"fx"}')


def test_a_combination_past_the_length_limit_still_filters_by_both():
    own = compile_filter("/a = '" + "x" * 40000 + "'")
    f = _and(own, ReadFilter("/b = '" + "y" * 40000 + "'"))
    assert compiled(f) is None
    assert f({"a": "x" * 40000, "b": "y" * 40000})
    assert not f({"a": "x" * 40000, "b": "z"})
