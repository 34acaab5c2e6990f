"""server/guard.py and matching.TopicFilter in-process: the grant a subscription gets (its
filter ANDed with the content entitlements, the per-topic gate of a regex), and the fail-closed
behaviour of a topic-dependent filter."""

from __future__ import annotations

from config.model import ContentFilter, Entitlement, Rights, Role
from protocol.filters import compile_filter
from protocol.options import subscribe_options
from protocol.patterns import compile_pattern
from server.guard import Grant, Guard, TopicGate
from server.matching import TopicFilter
from server.outbox import Outbox
from server.security.entitlements import Entitlements
from server.subscriptions import Subscription

ROLES = Entitlement(
    roles=(
        Role(
            name="desk",
            users=("alice",),
            allow=Rights(subscribe=(r"orders\..*", r"md\..*"), consume=(r"queue\.a",)),
            deny=Rights(subscribe=(r"orders\.secret",)),
            filters=(
                ContentFilter(topic=r"orders\..*", expression="/desk = 'A'"),
                ContentFilter(topic="work", expression="/n > 1"),
            ),
        ),
        Role(name="md", users=("bob",), allow=Rights(subscribe=(r"md\..*",))),
    )
)


def guard() -> Guard:
    return Guard(entitlements=Entitlements(ROLES))


class _Owner:
    def describe(self) -> str:
        return "test"

    def went_live(self, sub) -> None: ...

    def range_done(self, sub) -> None: ...


def sub_for(topic: str, regex: bool) -> Subscription:
    pattern = compile_pattern(topic) if regex else None
    return Subscription(
        _Owner(), Outbox(1 << 20, lambda r: None), "s", topic, pattern, None, None,
        subscribe_options(None), frozenset(), None,
    )  # fmt: skip


def test_a_literal_topic_gets_its_content_filter_anded_to_its_own():
    g = guard().grant("p", "alice", "subscribe", "orders.a", False, compile_filter("/n > 1"), "s")
    assert g is not None and g.topics is None
    f = g.filter
    assert (
        f({"desk": "A", "n": 2}) and not f({"desk": "B", "n": 2}) and not f({"desk": "A", "n": 1})
    )


def test_refusals_and_no_entitlements():
    assert guard().grant("p", "bob", "subscribe", "orders.a", False, None, "s") is None
    assert guard().grant("p", "alice", "subscribe", "orders.secret", False, None, "s") is None
    open_grant = Guard().grant("p", "bob", "subscribe", "orders.a", False, None, "s")
    assert open_grant == Grant(None)


def test_a_queue_takes_the_filters_of_its_name_and_its_underlying_topic():
    g = guard().grant("p", "alice", "consume", "queue.a", False, None, "s", also=("work",))
    assert g is not None and g.filter({"n": 2}) and not g.filter({"n": 1})


def test_a_regex_allowed_topic_by_topic_is_gated_and_filtered_per_topic():
    g = guard().grant("p", "alice", "subscribe", ".*", True, None, "s")
    assert g is not None and g.topics is not None
    assert isinstance(g.filter, TopicFilter)
    assert g.filter.at("md.x") is None  # no content filter on md.*
    assert g.filter.at(b"orders.x")({"desk": "A"}) and not g.filter.at("orders.x")({"desk": "B"})
    sub = sub_for(".*", regex=True)
    g.apply(sub)
    assert isinstance(sub.regex, TopicGate) and isinstance(sub.regex_b, TopicGate)
    assert sub.matches_topic("orders.x") and sub.matches_topic_bytes(b"md.y")
    assert not sub.matches_topic("orders.secret") and not sub.matches_topic_bytes(b"other")
    # granted again as allowed everywhere: the gate comes off
    Grant(None).apply(sub)
    assert not isinstance(sub.regex, TopicGate) and sub.matches_topic("other")


def test_a_regex_equal_to_an_allow_regex_without_denies_is_not_gated():
    g = guard().grant("p", "bob", "subscribe", r"md\..*", True, None, "s")
    assert g == Grant(None)


def test_a_topic_filter_fails_closed_when_called_as_a_predicate():
    calls = []

    def resolve(topic: str):
        calls.append(topic)
        return None

    f = TopicFilter(resolve)
    assert f({"anything": 1}) is False
    assert f.at("t") is None and f.at("t") is None and calls == ["t"]  # resolved once
