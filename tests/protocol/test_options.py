"""protocol.options: the ``o`` header (syntax golden inputs, typed options, malformed inputs)."""

import pytest

from protocol.options import (
    MAX_OPTIONS_ITEMS,
    MAX_OPTIONS_TEXT,
    HeartbeatOptions,
    InvalidOptions,
    LogonOptions,
    Rate,
    SowDeleteOptions,
    SubscribeOptions,
    heartbeat_options,
    logon_options,
    parse_options,
    parse_rate,
    sow_delete_options,
    sow_options,
    subscribe_options,
)

# --------------------------------------------------------------------------------------------
# syntax

SYNTAX = [
    (None, {}),
    ("", {}),
    ("   ", {}),
    (",", {}),
    ("live", {"live": None}),
    ("live,timestamp", {"live": None, "timestamp": None}),
    (" live ,  timestamp ", {"live": None, "timestamp": None}),
    ("replace,timestamp,", {"replace": None, "timestamp": None}),  # builder's trailing comma
    ("live,,timestamp", {"live": None, "timestamp": None}),
    ("rate=1000", {"rate": "1000"}),
    ("rate = 500KB", {"rate": "500KB"}),
    ("LIVE,Rate=2X", {"live": None, "rate": "2X"}),  # keys fold to lower case, values do not
    ("rate=", {"rate": ""}),
    ("f=a=b", {"f": "a=b"}),
    ("conflation_key=[/a,/b]", {"conflation_key": "/a,/b"}),
    ("conflation_key=[ /a , /b ]", {"conflation_key": "/a , /b"}),
    ("conflation_key=[/a]", {"conflation_key": "/a"}),
    ("conflation_key=[]", {"conflation_key": ""}),
    ("conflation_key=[/arr[0],/b],live", {"conflation_key": "/arr[0],/b", "live": None}),
    ("conflation_key=/arr[0]", {"conflation_key": "/arr[0]"}),
    (
        "conflation=1s,conflation_key=[/a,/b],timestamp",
        {"conflation": "1s", "conflation_key": "/a,/b", "timestamp": None},
    ),
    ("start,5", {"start": "5"}),
    ("start, 5", {"start": "5"}),
    ("start,.5", {"start": ".5"}),
    ("start,500ms", {"start": "500ms"}),
    ("start=5", {"start": "5"}),
    ("start", {"start": None}),
    ("start,beat", {"start": None, "beat": None}),
    ("beat", {"beat": None}),
]


@pytest.mark.parametrize(("text", "expected"), SYNTAX)
def test_parse_options_golden(text, expected):
    assert parse_options(text) == expected


BAD_SYNTAX = [
    ("5", "'5' is not an option"),
    ("live,5", "'5' is not an option"),
    ("a-b", "is not an option"),
    ("=5", "is not an option"),
    ("[a,b]", "is not an option"),
    ("x=[a", "unclosed '['"),
    ("x=[a,b", "unclosed '['"),
    ("x=a]", "unbalanced ']'"),
    ("x=[a]]", "unbalanced ']'"),
    ("x=[a]b", "text after the closing ']'"),
    ("live,live", "'live' is given more than once"),
    ("rate=1,RATE=2", "'rate' is given more than once"),
    ("a" * (MAX_OPTIONS_TEXT + 1), "too long"),
    (",".join(f"k{i}" for i in range(MAX_OPTIONS_ITEMS + 1)), "at most 256"),
    (5, "must be a string"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_SYNTAX)
def test_parse_options_malformed(text, fragment):
    with pytest.raises(InvalidOptions) as info:
        parse_options(text)
    assert fragment in str(info.value)
    assert info.value.reason == "invalid options"
    assert isinstance(info.value, ValueError)


def test_parse_options_at_the_item_limit():
    text = ",".join(f"k{i}" for i in range(MAX_OPTIONS_ITEMS))
    assert len(parse_options(text)) == MAX_OPTIONS_ITEMS


# --------------------------------------------------------------------------------------------
# rates

RATES = [
    ("1000", Rate("msgs", 1000.0)),
    ("1000/s", Rate("msgs", 1000.0)),
    ("1000/S", Rate("msgs", 1000.0)),
    ("0.5", Rate("msgs", 0.5)),
    ("500KB", Rate("bytes", 512000.0)),
    ("500kb/s", Rate("bytes", 512000.0)),
    ("10MB", Rate("bytes", 10485760.0)),
    ("512B", Rate("bytes", 512.0)),
    ("2X", Rate("multiple", 2.0)),
    (".5X", Rate("multiple", 0.5)),
    ("1.5x", Rate("multiple", 1.5)),
    ("5x", Rate("multiple", 5.0)),
]


@pytest.mark.parametrize(("text", "rate"), RATES)
def test_rate_golden(text, rate):
    assert parse_rate(text) == rate
    assert subscribe_options(f"rate={text}").rate == rate


BAD_RATES = [
    ("0", "greater than zero"),
    ("0X", "greater than zero"),
    ("0KB", "greater than zero"),
    ("-5", "not a rate"),
    ("X", "not a number followed by X"),
    ("2XX", "not a number followed by X"),
    ("2X/s", "has no '/s'"),
    ("/s", "empty"),
    ("fast", "not a rate"),
    ("1.5KB", "not a rate"),
    ("1e3", "not a rate"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_RATES)
def test_rate_malformed(text, fragment):
    with pytest.raises(InvalidOptions) as info:
        subscribe_options(f"rate={text}")
    message = str(info.value)
    assert fragment in message
    assert "500KB" in message and "2X" in message  # says what is accepted
    assert info.value.option == "rate"


# --------------------------------------------------------------------------------------------
# subscribe

SUBSCRIBE = [
    (None, SubscribeOptions()),
    ("", SubscribeOptions()),
    ("live", SubscribeOptions(live=True)),
    ("fully_durable", SubscribeOptions(fully_durable=True)),
    ("pause", SubscribeOptions(pause=True)),
    ("resume", SubscribeOptions(resume=True)),
    ("replace", SubscribeOptions(replace=True)),
    ("timestamp", SubscribeOptions(timestamp=True)),
    ("replace,timestamp,", SubscribeOptions(replace=True, timestamp=True)),
    ("live,timestamp", SubscribeOptions(live=True, timestamp=True)),
    ("rate=1000", SubscribeOptions(rate=Rate("msgs", 1000.0))),
    (
        "rate=5X,rate_max_gap=10s",
        SubscribeOptions(rate=Rate("multiple", 5.0), rate_max_gap=10.0),
    ),
    ("conflation=500ms", SubscribeOptions(conflation=0.5)),
    (
        "conflation=1s,conflation_key=[/a,/b/c]",
        SubscribeOptions(conflation=1.0, conflation_key=("/a", "/b/c")),
    ),
    (
        "conflation=1s,conflation_key=/a",
        SubscribeOptions(conflation=1.0, conflation_key=("/a",)),
    ),
    (
        "conflation=1m,conflation_key=[ /a , /arr[0] ]",
        SubscribeOptions(conflation=60.0, conflation_key=("/a", "/arr[0]")),
    ),
    ("bookmark_not_found=now", SubscribeOptions(bookmark_not_found="now")),
    ("bookmark_not_found=epoch", SubscribeOptions(bookmark_not_found="epoch")),
    ("bookmark_not_found=FAIL", SubscribeOptions(bookmark_not_found="fail")),
    ("max_backlog=1", SubscribeOptions(max_backlog=1)),
    ("max_backlog=250", SubscribeOptions(max_backlog=250)),
    (
        "pause,rate=500KB/s,timestamp,bookmark_not_found=fail,fully_durable",
        SubscribeOptions(
            pause=True,
            rate=Rate("bytes", 512000.0),
            timestamp=True,
            bookmark_not_found="fail",
            fully_durable=True,
        ),
    ),
]


@pytest.mark.parametrize(("text", "expected"), SUBSCRIBE)
def test_subscribe_golden(text, expected):
    assert subscribe_options(text) == expected


def test_subscribe_options_are_frozen():
    opts = subscribe_options("live")
    with pytest.raises(AttributeError):
        opts.live = False  # type: ignore[misc]


def test_bookmark_only_names():
    assert SubscribeOptions().bookmark_only() == ()
    assert subscribe_options("timestamp,replace,max_backlog=3").bookmark_only() == ()
    assert subscribe_options("pause,rate=2X,bookmark_not_found=fail").bookmark_only() == (
        "pause",
        "rate",
        "bookmark_not_found",
    )
    assert subscribe_options("live").bookmark_only() == ("live",)


BAD_SUBSCRIBE = [
    ("bogus", "bogus", "unknown option 'bogus' for subscribe; accepted: live"),
    ("skip_n=2", "skip_n", "unknown option 'skip_n' for subscribe"),
    ("cancel", "cancel", "unknown option 'cancel' for subscribe"),
    ("live=true", "live", "takes no value"),
    ("timestamp=", "timestamp", "takes no value"),
    ("rate", "rate", "needs a value: rate=<"),
    ("rate=", "rate", "needs a value"),
    ("conflation=1s,conflation_key=[]", "conflation_key", "needs a value"),
    ("conflation", "conflation", "needs a value"),
    ("conflation=0s", "conflation", "greater than zero"),
    ("conflation=fast", "conflation", "not a number with an optional unit"),
    ("conflation=5 parsecs", "conflation", "unknown unit 'parsecs'"),
    ("conflation=-1s", "conflation", "sign"),
    ("conflation_key=/a", "conflation_key", "needs 'conflation=<interval>'"),
    ("conflation=1s,conflation_key=a", "conflation_key", "'a' is not a field path"),
    ("conflation=1s,conflation_key=[/a,,/b]", "conflation_key", "'' is not a field path"),
    ("conflation=1s,conflation_key=/", "conflation_key", "not a field path"),
    ("rate_max_gap=10s", "rate_max_gap", "needs 'rate'"),
    ("rate=2X,rate_max_gap=0", "rate_max_gap", "greater than zero"),
    ("rate=2X,rate_max_gap=10y", "rate_max_gap", "unknown unit 'y'"),
    ("live,rate=2X", "rate", "'live' and 'rate' cannot be combined"),
    ("live,pause", "pause", "'live' and 'pause' cannot be combined"),
    ("resume,live", "resume", "'live' and 'resume' cannot be combined"),
    ("live,fully_durable", "fully_durable", "'live' and 'fully_durable' cannot be combined"),
    ("pause,resume", "resume", "'pause' and 'resume' cannot be combined"),
    ("bookmark_not_found=later", "bookmark_not_found", "accepted: now, epoch, fail"),
    ("bookmark_not_found", "bookmark_not_found", "needs a value"),
    ("max_backlog=0", "max_backlog", "from 1 to"),
    ("max_backlog=-1", "max_backlog", "from 1 to"),
    ("max_backlog=1.5", "max_backlog", "whole number"),
    ("max_backlog=ten", "max_backlog", "whole number"),
    ("max_backlog=99999999999", "max_backlog", "from 1 to"),
    ("max_backlog=٣", "max_backlog", "whole number"),  # Arabic-Indic three: not ASCII
    ("timestamp,timestamp", "timestamp", "more than once"),
]


@pytest.mark.parametrize(("text", "option", "fragment"), BAD_SUBSCRIBE)
def test_subscribe_malformed(text, option, fragment):
    with pytest.raises(InvalidOptions) as info:
        subscribe_options(text)
    assert fragment in str(info.value)
    assert option in str(info.value)  # the message names the option
    assert info.value.option == option
    assert info.value.reason == "invalid options"


# --------------------------------------------------------------------------------------------
# sow_delete, logon, heartbeat


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, SowDeleteOptions()),
        ("", SowDeleteOptions()),
        ("cancel", SowDeleteOptions(cancel=True)),
        ("expire", SowDeleteOptions(expire=True)),
        ("lease_extend=30s", SowDeleteOptions(lease_extend=30.0)),
        ("lease_extend=500ms", SowDeleteOptions(lease_extend=0.5)),
    ],
)
def test_sow_delete_golden(text, expected):
    assert sow_delete_options(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cancel,expire", "'cancel' and 'expire' cannot be combined"),
        ("cancel,lease_extend=5s", "'cancel' and 'lease_extend' cannot be combined"),
        ("lease_extend=0", "greater than zero"),
        ("lease_extend", "needs a value"),
        ("cancel=1", "takes no value"),
        ("live", "unknown option 'live' for sow_delete; accepted: cancel, expire, lease_extend"),
    ],
)
def test_sow_delete_malformed(text, fragment):
    with pytest.raises(InvalidOptions) as info:
        sow_delete_options(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, LogonOptions()),
        ("", LogonOptions()),
        ("ack_conflation=100ms", LogonOptions(ack_conflation=0.1)),
        ("ack_conflation=1s", LogonOptions(ack_conflation=1.0)),
        ("ack_conflation=0", LogonOptions(ack_conflation=0.0)),
    ],
)
def test_logon_golden(text, expected):
    assert logon_options(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ack_conflation", "needs a value"),
        ("ack_conflation=soon", "not a number"),
        ("pretty", "unknown option 'pretty' for logon; accepted: ack_conflation"),
    ],
)
def test_logon_malformed(text, fragment):
    with pytest.raises(InvalidOptions) as info:
        logon_options(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("start,5", HeartbeatOptions(start=5.0)),
        ("start,30", HeartbeatOptions(start=30.0)),
        ("start=5", HeartbeatOptions(start=5.0)),
        ("start,500ms", HeartbeatOptions(start=0.5)),
        (" start , 2.5 ", HeartbeatOptions(start=2.5)),
        ("beat", HeartbeatOptions(beat=True)),
    ],
)
def test_heartbeat_golden(text, expected):
    assert heartbeat_options(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (None, "exactly one of start,<seconds> or beat"),
        ("", "exactly one of"),
        ("start", "needs an interval: start,<seconds>"),
        ("start,0", "greater than zero"),
        ("start,5,beat", "exactly one of"),
        ("start,5s5", "not a number with an optional unit"),
        ("start,5y", "unknown unit 'y'"),
        ("beat=1", "takes no value"),
        ("stop", "unknown option 'stop' for heartbeat; accepted: start, beat"),
    ],
)
def test_heartbeat_malformed(text, fragment):
    with pytest.raises(InvalidOptions) as info:
        heartbeat_options(text)
    assert fragment in str(info.value)


SUBSCRIBE_ACCEPTED = (
    "live, fully_durable, pause, resume, replace, rate, rate_max_gap, timestamp, conflation, "
    "conflation_key, bookmark_not_found, max_backlog, oof, no_sowkey, no_empties, send_keys"
)


@pytest.mark.parametrize(
    "parse,command,accepted",
    [
        (subscribe_options, "subscribe", SUBSCRIBE_ACCEPTED),
        (lambda t: subscribe_options(t, "sow_and_subscribe"), "sow_and_subscribe",
         SUBSCRIBE_ACCEPTED + ", skip_n, top_n"),
        (sow_options, "sow", "skip_n, top_n, timestamp, no_sowkey, send_keys"),
        (sow_delete_options, "sow_delete", "cancel, expire, lease_extend"),
        (logon_options, "logon", "ack_conflation"),
        (heartbeat_options, "heartbeat", "start, beat"),
    ],
)  # fmt: skip
def test_an_unknown_option_is_told_every_option_of_its_command_in_order(parse, command, accepted):
    with pytest.raises(InvalidOptions) as info:
        parse("bogus")
    assert str(info.value) == f"unknown option 'bogus' for {command}; accepted: {accepted}"
