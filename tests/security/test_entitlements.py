"""The entitlement matrix: every right for entitled and non-entitled users, deny over allow,
`*`, regex subscriptions, content filters, caching, and the diff a reload returns."""

from __future__ import annotations

import logging

import msgspec
import pytest

from config import ContentFilter, Entitlement, Rights, Role, load_config_text
from server.security.entitlements import Access, Entitlements, ReadFilter

DESK_A = Role(
    name="desk-a",
    users=("alice", "bob"),
    allow=Rights(
        publish=(r"orders\..*",),
        subscribe=(r"orders\..*", r"md\..*"),
        replay=(r"orders\..*",),
        consume=(r"queue\.fills",),
    ),
    deny=Rights(subscribe=(r"orders\.secret",)),
    filters=(ContentFilter(topic=r"orders\..*", expression="/desk = 'A'"),),
)
EVERYONE = Role(name="md", users=("*",), allow=Rights(subscribe=(r"md\..*",)))
OPS = Role(name="ops", users=("root",), allow=Rights(admin=True, subscribe=(".*",)))
RISK = Role(
    name="risk",
    users=("carol",),
    allow=Rights(subscribe=(r"orders\..*",)),
    filters=(ContentFilter(topic=r"orders\.eu.*", expression="/region = 'EU'"),),
)
RULES = Entitlement(roles=(DESK_A, EVERYONE, OPS, RISK))


@pytest.fixture
def e() -> Entitlements:
    return Entitlements(RULES)


@pytest.mark.parametrize(
    ("user", "right", "topic", "allowed"),
    [
        # entitled and not, for each right
        ("alice", "publish", "orders.new", True),
        ("alice", "publish", "md.AAPL", False),
        ("carol", "publish", "orders.new", False),
        ("alice", "subscribe", "orders.new", True),
        ("alice", "subscribe", "fills", False),
        ("alice", "replay", "orders.new", True),
        ("alice", "replay", "md.AAPL", False),  # subscribe is not replay
        ("carol", "replay", "orders.new", False),
        ("bob", "consume", "queue.fills", True),
        ("bob", "consume", "queue.other", False),
        ("carol", "consume", "queue.fills", False),
        # regexes match the whole topic name
        ("alice", "publish", "orders", False),
        ("alice", "publish", "xorders.new", False),
        # deny wins over allow, even over another role's allow
        ("alice", "subscribe", "orders.secret", False),
        ("alice", "subscribe", "orders.secrets", True),
        # * is every authenticated user
        ("carol", "subscribe", "md.AAPL", True),
        ("zed", "subscribe", "md.AAPL", True),
        ("zed", "subscribe", "orders.new", False),
        # ... but not anonymous
        ("anonymous", "subscribe", "md.AAPL", False),
        ("root", "subscribe", "anything.at.all", True),
    ],
)
def test_matrix(e, user, right, topic, allowed):
    assert e.allows(user, right, topic) is allowed


def test_admin(e):
    assert e.allows_admin("root")
    assert not e.allows_admin("alice") and not e.allows_admin("anonymous")
    denied = Entitlements(
        Entitlement(roles=(OPS, Role(name="no", users=("root",), deny=Rights(admin=True))))
    )
    assert not denied.allows_admin("root")


def test_without_entitlement_everything_but_admin():
    e = Entitlements(None)
    for right in ("publish", "subscribe", "replay", "consume"):
        assert e.allows("anyone", right, "any.topic")
        assert e.subscription("anyone", right, "any\\..*", pattern=True) is Access.ALLOW
    assert not e.allows_admin("root")
    assert e.read_filter("anyone", "orders.x") is None


def test_anonymous_named_explicitly():
    e = Entitlements(Entitlement(roles=(
        Role(name="guests", users=("anonymous",), allow=Rights(subscribe=("public",))),)))  # fmt: skip
    assert e.allows("anonymous", "subscribe", "public")
    assert not e.allows("alice", "subscribe", "public")


def test_unknown_right(e):
    with pytest.raises(ValueError, match="unknown right"):
        e.allows("alice", "delete", "x")


@pytest.mark.parametrize(
    ("user", "pattern", "access"),
    [
        ("alice", r"orders\..*", Access.PER_TOPIC),  # the allow regex itself, but a deny exists
        ("alice", r"md\..*", Access.PER_TOPIC),
        ("carol", r"orders\..*", Access.ALLOW),  # exactly her allow regex, no deny
        ("carol", r"orders\.(eu|us)", Access.PER_TOPIC),  # narrower: decided per topic
        ("carol", r"orders..*", Access.PER_TOPIC),  # text matches the allow regex: not trusted
        ("root", r"whatever.*", Access.ALLOW),  # .* allows every topic
        ("alice", r"orders\.secret", Access.DENY),  # exactly a deny regex
        ("zed", r"orders\..*", Access.PER_TOPIC),  # zed has md only: per topic, sees nothing
        ("anonymous", r"md\..*", Access.DENY),  # no allow regex at all
    ],
)
def test_regex_subscriptions(e, user, pattern, access):
    assert e.subscription(user, "subscribe", pattern, pattern=True) is access


def test_per_topic_delivery_leaves_out_what_the_user_may_not_see(e):
    assert e.subscription("alice", "subscribe", r"orders\..*", True) is Access.PER_TOPIC
    published = ["orders.new", "orders.secret", "orders.fill"]
    assert [t for t in published if e.allows("alice", "subscribe", t)] == [
        "orders.new",
        "orders.fill",
    ]


def test_regex_crossing_an_entitlement_boundary(e):
    # carol may read orders.* (risk) and md.* (everyone), not fx.*: a regex over all three is
    # accepted and filtered per topic
    assert e.subscription("carol", "subscribe", r"(orders|fx|md)\..*", True) is Access.PER_TOPIC
    seen = [t for t in ("orders.a", "fx.b", "md.c") if e.allows("carol", "subscribe", t)]
    assert seen == ["orders.a", "md.c"]


def test_content_filters(e):
    f = e.read_filter("alice", "orders.new")
    assert f == ReadFilter("/desk = 'A'")
    assert f.match(b'{"desk": "A", "qty": 1}') and not f.match(b'{"desk": "B"}')
    assert f.match_value({"desk": "A"}) and not f.match_value({})
    assert f.and_with("/qty > 5") == "(/desk = 'A') AND (/qty > 5)"
    assert f.and_with(None) == "/desk = 'A'"
    assert e.read_filter("alice", "md.AAPL") is None
    assert e.read_filter("root", "orders.new") is None


def test_filters_of_several_roles_are_anded():
    e = Entitlements(Entitlement(roles=(DESK_A, Role(name="risk-a", users=("alice",),
        filters=(ContentFilter(topic=r"orders\.eu.*", expression="/region = 'EU'"),)))))  # fmt: skip
    f = e.read_filter("alice", "orders.eu.new")
    assert f.text == "(/desk = 'A') AND (/region = 'EU')"
    assert f.match(b'{"desk":"A","region":"EU"}')
    assert not f.match(b'{"desk":"A","region":"US"}')
    assert e.read_filter("alice", "orders.us").text == "/desk = 'A'"


def test_queue_reads_get_the_filters_of_the_queue_and_its_topic(e):
    assert e.read_filter("bob", "queue.fills") is None
    assert e.read_filter("bob", "queue.fills", "orders.fills").text == "/desk = 'A'"


def test_decisions_are_cached_and_bounded():
    e = Entitlements(RULES, cache_size=8)
    assert e.allows("alice", "publish", "orders.x")
    rules = e._rules["alice"]
    assert e.allows("alice", "publish", "orders.x")
    assert e._rules["alice"] is rules  # the user's roles are folded once
    for i in range(100):
        e.allows("alice", "publish", f"orders.{i}")
        e.read_filter("alice", f"orders.{i}")
    assert len(e._decisions) <= 8 and len(e._filters) <= 8


def test_refusals_are_audited(e, caplog):
    caplog.set_level(logging.INFO, logger="tickertape.audit")
    assert e.check("10.0.0.1:5", "alice", "publish", "orders.x", "publish")
    assert not e.check("10.0.0.1:5", "alice", "publish", "md.x", "publish")
    assert not e.check("10.0.0.1:5", "alice", "admin", "/stats", "GET")
    assert [r.getMessage() for r in caplog.records] == [
        "refused peer=10.0.0.1:5 user=alice right=publish topic=md.x command=publish",
        "refused peer=10.0.0.1:5 user=alice right=admin topic=/stats command=GET",
    ]


def test_reload_reports_what_changed(e):
    e.allows("alice", "subscribe", "orders.new")
    e.allows("alice", "subscribe", "md.AAPL")
    e.subscription("carol", "subscribe", r"orders\..*", True)
    e.read_filter("alice", "orders.new")
    e.allows_admin("root")
    revoked_desk = msgspec.structs.replace(
        DESK_A,
        allow=msgspec.structs.replace(DESK_A.allow, subscribe=(r"md\..*",)),
        filters=(ContentFilter(topic=r"orders\..*", expression="/desk = 'A2'"),),
    )
    carol_narrowed = msgspec.structs.replace(RISK, deny=Rights(subscribe=(r"orders\.x",)))
    live = [("bob", "subscribe", "orders.old", False)]  # in use, but not in the cache
    result = e.reload(Entitlement(roles=(revoked_desk, EVERYONE, OPS, carol_narrowed)), live)
    changes = {(c.user, c.topic): (c.before, c.after) for c in result.changed}
    assert changes == {
        ("alice", "orders.new"): (Access.ALLOW, Access.DENY),
        ("carol", r"orders\..*"): (Access.ALLOW, Access.PER_TOPIC),
        ("bob", "orders.old"): (Access.ALLOW, Access.DENY),
    }
    assert {(c.user, c.topic) for c in result.revoked} == set(changes)
    assert result.filters_changed == (("alice", "orders.new"),)
    assert e.read_filter("alice", "orders.new").text == "/desk = 'A2'"
    assert not e.allows("alice", "subscribe", "orders.new")


def test_reload_to_no_entitlement_and_back(e):
    e.allows_admin("root")
    e.allows("carol", "publish", "x")
    result = e.reload(None)
    assert {(c.user, c.right, c.after) for c in result.changed} == {
        ("root", "admin", Access.DENY),
        ("carol", "publish", Access.ALLOW),
    }
    assert [c.user for c in result.revoked] == ["root"]


def test_from_a_configuration_file(tmp_path, monkeypatch):
    from config import security

    monkeypatch.setattr(security, "unsupported", lambda cfg: [])  # as a build that serves it
    users = tmp_path / "u.db"
    users.write_text("")
    cfg = load_config_text(
        f"""<TickertapeConfig><Name>x</Name>
        <Authentication><PasswordFile>{users}</PasswordFile></Authentication>
        <Entitlement>
          <Role><Name>a</Name><Users>alice</Users><Publish>orders\\..*</Publish>
            <Deny><Publish>orders\\.x</Publish></Deny></Role>
        </Entitlement></TickertapeConfig>""",
        env={},
    )
    e = Entitlements(cfg.entitlement)
    assert e.allows("alice", "publish", "orders.y")
    assert not e.allows("alice", "publish", "orders.x")
