"""The shipped systemd unit: the lines the server's behaviour depends on."""

import configparser
from pathlib import Path

import config

UNIT = Path(config.__file__).parent / "tickertape.service"


def read_unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_sections():
    assert read_unit().sections() == ["Unit", "Service", "Install"]


def test_service_lines():
    service = read_unit()["Service"]
    assert service["Type"] == "simple"
    assert service["ExecStart"] == (
        "/usr/local/bin/tickertape serve --config /etc/tickertape/tickertape.xml"
    )
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # SIGHUP reopens log files
    assert service["KillSignal"] == "SIGTERM"  # drain and exit cleanly
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # invalid configuration: do not loop
    assert int(service["LimitNOFILE"]) >= 65536
    assert service["User"] == "tickertape"
    assert service["User"] != "root"


def test_install_target():
    assert read_unit()["Install"]["WantedBy"] == "multi-user.target"
