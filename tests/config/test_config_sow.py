"""`<SOW><Topic>`: State of the World topics in the configuration (config/sow.py)."""

import textwrap

import pytest

from config import ConfigError, SowTopicSpec, load_config_text


def load(body: str):
    text = f"<TickertapeConfig>\n<Name>tt</Name>\n{textwrap.dedent(body).strip()}\n</TickertapeConfig>\n"
    return load_config_text(text, "t.xml", env={})


def problems(body: str) -> list[tuple[int, str, str]]:
    with pytest.raises(ConfigError) as info:
        load(body)
    return [(p.line, p.path, p.message) for p in info.value.problems]


TXLOG = """
<TransactionLog>
  <JournalDirectory>j</JournalDirectory>
  <Topic><Name>prices</Name></Topic>
  <Topic><Name>md\\..*</Name></Topic>
</TransactionLog>
"""


def test_a_sow_topic_with_every_element():
    c = load(
        TXLOG
        + """
        <SOW>
          <Topic>
            <Name>prices</Name>
            <MessageType>json</MessageType>
            <Key>/sym</Key>
            <Key>/venue</Key>
            <Expiration>1h</Expiration>
            <History><Window>7d</Window></History>
          </Topic>
          <TopicDefinition><Name>md\\..*</Name></TopicDefinition>
        </SOW>
        """
    )
    assert c.sow_topics == (
        SowTopicSpec(
            name="prices",
            keys=("/sym", "/venue"),
            expiration=3600.0,
            history_window=7 * 86400.0,
        ),
        SowTopicSpec(name=r"md\..*"),
    )
    assert c.sow_topic("prices") is c.sow_topics[0]
    assert c.sow_topic("md.x") is c.sow_topics[1]
    assert c.sow_topic("mdx") is None and c.sow_topic("orders") is None


def test_max_checkpoint_size_bounds_the_checkpoints():
    sow = "<SOW>%s<Topic><Name>prices</Name></Topic></SOW>"
    assert load(TXLOG + sow % "").sow_max_checkpoint_size is None
    c = load(TXLOG + sow % "<MaxCheckpointSize>2GB</MaxCheckpointSize>")
    assert c.sow_max_checkpoint_size == 2 * 1024**3
    ((_, path, message),) = problems(TXLOG + sow % "<MaxCheckpointSize>lots</MaxCheckpointSize>")
    assert path == "/TickertapeConfig/SOW/MaxCheckpointSize"


def test_expiration_disabled_is_none():
    c = load(
        TXLOG + "<SOW><Topic><Name>prices</Name><Expiration>disabled</Expiration></Topic></SOW>"
    )
    assert c.sow_topics[0].expiration is None


def test_a_sow_topic_must_be_recorded():
    found = problems(TXLOG + "<SOW><Topic><Name>quotes</Name><Key>/sym</Key></Topic></SOW>")
    assert len(found) == 1
    line, path, message = found[0]
    assert (line, path) == (8, "/TickertapeConfig/SOW/Topic/Name")
    assert "'quotes' is not recorded in the transaction log (line 3)" in message
    assert "add <Topic><Name>quotes</Name></Topic> to <TransactionLog>" in message


def test_a_sow_topic_needs_a_transaction_log():
    ((line, path, message),) = problems("<SOW><Topic><Name>prices</Name></Topic></SOW>")
    assert path == "/TickertapeConfig/SOW/Topic/Name"
    assert "must be recorded in a transaction log" in message and "add <TransactionLog>" in message


def test_bad_keys_and_duplicates_are_reported_together():
    found = problems(
        TXLOG
        + """
        <SOW>
          <Topic><Name>prices</Name><Key>sym</Key><Key>/a</Key><Key>/a</Key></Topic>
          <Topic><Name>prices</Name></Topic>
        </SOW>
        """
    )
    messages = [m for _, _, m in found]
    assert len(found) == 3, found
    assert "a <Key> is one field path, such as /sym" in messages[0]
    assert "<Key> /a is given twice" in messages[1]
    assert "SOW topic 'prices' is already defined at line 10" in messages[2]


def test_a_sow_topic_may_not_be_a_queue():
    found = problems(
        TXLOG + "<SOW><Queue><Name>prices</Name></Queue><Topic><Name>prices</Name></Topic></SOW>"
    )
    assert any("is both a queue and a SOW topic" in m for _, _, m in found)


def test_refused_amps_elements_say_why():
    ((_, path, message),) = problems(
        TXLOG + "<SOW><Topic><Name>prices</Name><FileName>x.sow</FileName></Topic></SOW>"
    )
    assert path == "/TickertapeConfig/SOW/Topic/FileName"
    assert "not supported by Tickertape" in message and "beside the journal" in message
    ((_, _, message),) = problems(
        TXLOG + "<SOW><Topic><Name>prices</Name><History><Granularity>1s</Granularity>"
        "</History></Topic></SOW>"
    )
    assert "<Granularity> is not supported" in message


def test_a_key_element_in_the_transaction_log_points_at_sow():
    found = problems(
        "<TransactionLog><JournalDirectory>j</JournalDirectory>"
        "<Topic><Name>prices</Name><Key>/sym</Key></Topic></TransactionLog>"
    )
    assert any(
        "<Key> does not belong in <Topic>; it goes in <SOW><Topic>" in m for *_, m in found
    ), found
