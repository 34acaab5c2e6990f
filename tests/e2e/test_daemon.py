"""`tickertape serve --daemon --pid-file`: detaching, refusing a second start, SIGHUP, SIGTERM."""

import os
import signal
import subprocess
import time

from tests.support.proc import TICKERTAPE, make_config
from tests.support.raw import Raw


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_daemon_lifecycle(tmp_path):
    log_file = tmp_path / "logs" / "tt.log"
    cfg = tmp_path / "tt.xml"
    cfg.write_text(
        make_config(
            str(tmp_path),
            logging_xml=(
                "<Logging><Target><Protocol>file</Protocol>"
                f"<FileName>{log_file}</FileName><Level>info</Level></Target></Logging>"
            ),
        )
    )
    pid_file = tmp_path / "tt.pid"
    r = subprocess.run(
        [TICKERTAPE, "serve", "--config", str(cfg), "--daemon", "--pid-file", str(pid_file)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "listening on 127.0.0.1:" in r.stdout
    port = int(r.stdout.split("listening on 127.0.0.1:")[1].split(";")[0].split()[0])
    pid = int(pid_file.read_text())
    try:
        assert _alive(pid)
        c = Raw(port)
        assert c.logon("daemon-client")["status"] == "success"
        c.close()
        # a second daemon on the same pid file refuses to start and names the holder
        r2 = subprocess.run(
            [TICKERTAPE, "serve", "--config", str(cfg), "--daemon", "--pid-file", str(pid_file)],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
        )
        assert r2.returncode == 1 and f"pid {pid}" in r2.stderr
        # logs go to the configured file; SIGHUP reopens it after rotation
        deadline = time.monotonic() + 5
        while "daemon-client" not in log_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "logon: connection" in log_file.read_text()
        os.rename(log_file, str(log_file) + ".1")
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 5
        while not log_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "log files reopened" in log_file.read_text()
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert not pid_file.exists()
    assert "stopped in" in log_file.read_text()


def test_daemon_reports_startup_failure(tmp_path):
    cfg = tmp_path / "tt.xml"
    cfg.write_text(make_config(str(tmp_path)))
    # a damaged journal segment: the daemon cannot start, and the starting shell is told why
    os.makedirs(tmp_path / "journal")
    (tmp_path / "journal" / "00000000000000000000.seg").write_bytes(b"JUNK" * 20)
    r = subprocess.run(
        [
            TICKERTAPE,
            "serve",
            "--config",
            str(cfg),
            "--daemon",
            "--pid-file",
            str(tmp_path / "p.pid"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert r.returncode == 1
    assert "not a journal segment" in r.stderr


def test_embedded_default_starts_with_no_config(tmp_path):
    """`tickertape serve` with no file: the embedded default, journal under ./tickertape-data."""
    import socket

    probe = socket.socket()
    if probe.connect_ex(("127.0.0.1", 9007)) == 0:
        probe.close()
        import pytest

        pytest.skip("port 9007 is taken on this machine")
    probe.close()
    proc = subprocess.Popen(
        [TICKERTAPE, "serve"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in proc.stdout:
            if line.startswith("tickertape ") and "listening on" in line:
                break
        assert "127.0.0.1:9007" in line
        c = Raw(9007)
        assert c.logon("default-user")["status"] == "success"
        c.close()
        assert (tmp_path / "tickertape-data" / "journal").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
