"""The shipped systemd unit: the lines the server's behaviour depends on."""

import configparser
import re
import shutil
import subprocess
import sys
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
        "/opt/tickertape/bin/tickertape serve --config /etc/tickertape/tickertape.xml"
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


def test_the_install_steps_name_a_config_that_verifies(tmp_path):
    """The unit's install comment copies an example to /etc/tickertape/tickertape.xml and the
    binary it runs is the one its `pip install` step makes: that example verifies as shipped
    (`tickertape serve --verify-config`, exit 0, no problem), with no other file beside it."""
    text = UNIT.read_text()
    m = re.search(r"install -D -m 0640 -g tickertape (\S+) /etc/tickertape/tickertape.xml", text)
    assert m, "the unit's install steps no longer copy a configuration"
    example = Path(config.__file__).parent.parent / m.group(1)
    copy = tmp_path / "tickertape.xml"
    shutil.copy(example, copy)  # alone in its directory, as in /etc/tickertape
    run = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--verify-config", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "problem" not in (run.stdout + run.stderr).lower(), run.stdout + run.stderr
    venv_bin = re.search(r"python3 -m venv (\S+) && \1/bin/pip install \.", text)
    assert venv_bin, "the unit's install steps no longer install the package"
    assert read_unit()["Service"]["ExecStart"].startswith(f"{venv_bin.group(1)}/bin/tickertape ")
