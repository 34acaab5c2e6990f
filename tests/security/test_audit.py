"""Audit lines: their format, their escaping, and a log target that keeps them apart."""

from __future__ import annotations

import logging

import pytest

from config import LogTarget, load_config_text
from server import logsetup
from server.security import audit


def test_format_event():
    line = audit.format_event("refused", {"peer": "10.0.0.1:5", "user": "alice",
                                          "right": "subscribe", "topic": r"orders\..*",
                                          "command": None})  # fmt: skip
    assert line == r"refused peer=10.0.0.1:5 user=alice right=subscribe topic=orders\..*"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("two words", '"two words"'),
        ("evil\nlogon peer=x user=root", '"evil\\nlogon peer=x user=root"'),
        ('quo"te', '"quo\\"te"'),
        ("k=v", '"k=v"'),
        ("", '""'),
        ("zoë", '"zo\\u00eb"'),
    ],
)
def test_values_cannot_forge_lines_or_fields(value, written):
    assert audit.format_event("logon", {"user": value}) == f"logon user={written}"


def test_long_values_are_cut():
    assert audit.format_event("logon", {"user": "x" * 1000}) == "logon user=" + "x" * 256 + "..."


def test_events_levels_and_structured_fields(caplog):
    caplog.set_level(logging.INFO, logger=audit.LOGGER)
    audit.logon("p:1", "alice", "password", "tls")
    audit.logon_failure("p:1", None, "no user_id")
    audit.refused("p:1", "alice", "publish", "orders.x", "publish")
    audit.admin_request("p:2", "root", "GET", "/stats", 200)
    got = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert got == [
        ("INFO", "logon peer=p:1 user=alice method=password transport=tls"),
        ("WARNING", 'logon_failure peer=p:1 detail="no user_id"'),
        ("WARNING", "refused peer=p:1 user=alice right=publish topic=orders.x command=publish"),
        ("INFO", "admin_request peer=p:2 user=root method=GET path=/stats status=200"),
    ]
    assert caplog.records[3].audit == {
        "event": "admin_request",
        "peer": "p:2",
        "user": "root",
        "method": "GET",
        "path": "/stats",
        "status": 200,
    }


@pytest.fixture
def restore_logging():
    root = logging.getLogger("tickertape")
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    logsetup.setup_logging([])
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    root.propagate = saved[2]


def test_a_logger_target_gets_the_audit_trail_alone(tmp_path, restore_logging):
    cfg = load_config_text(
        f"""<TickertapeConfig><Name>x</Name><Logging>
        <Target><Protocol>file</Protocol><FileName>{tmp_path}/all.log</FileName></Target>
        <Target><Protocol>file</Protocol><FileName>{tmp_path}/audit.log</FileName>
          <Logger>tickertape.audit</Logger></Target>
        </Logging></TickertapeConfig>""",
        env={},
    )
    assert cfg.logging[1] == LogTarget(
        protocol="file", file_name=f"{tmp_path}/audit.log", logger="tickertape.audit"
    )
    logsetup.setup_logging(cfg.logging)
    logging.getLogger("tickertape.server").info("server line")
    audit.logon("p:1", "alice", "password")
    for h in logging.getLogger("tickertape").handlers:
        h.flush()
    everything = (tmp_path / "all.log").read_text()
    trail = (tmp_path / "audit.log").read_text()
    assert "server line" in everything and "logon peer=p:1" in everything
    assert "server line" not in trail
    assert trail.rstrip().endswith(
        "INFO tickertape.audit: logon peer=p:1 user=alice method=password"
    )


def test_logger_must_be_the_servers():
    from config import ConfigError

    with pytest.raises(ConfigError, match="is not one of the server's"):
        load_config_text(
            "<TickertapeConfig><Name>x</Name><Logging><Target><Protocol>stdout</Protocol>"
            "<Logger>root</Logger></Target></Logging></TickertapeConfig>",
            env={},
        )
