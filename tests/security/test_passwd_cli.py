"""`tickertape passwd` as users run it: a subprocess, the password on stdin or at a terminal
prompt, never on the command line."""

from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import sys
import time
import warnings

from protocol.security.passwords import load_password_file

TICKERTAPE = os.path.join(os.path.dirname(sys.executable), "tickertape")


def passwd(*args: str, stdin: str | None = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TICKERTAPE, "passwd", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_add_change_delete_from_stdin(tmp_path):
    path = tmp_path / "users.db"
    done = passwd(str(path), "alice", stdin="first secret\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"added alice in {path}" and done.stdout == ""
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "first secret" not in path.read_text()
    assert load_password_file(path).verify_password("alice", "first secret")

    done = passwd(str(path), "alice", stdin="second\r\n")
    assert done.returncode == 0 and "changed the password of alice" in done.stderr
    users = load_password_file(path)
    assert users.verify_password("alice", "second")  # the line ending is not the password
    assert not users.verify_password("alice", "first secret")

    assert passwd(str(path), "bob", stdin="b").returncode == 0  # no newline at the end: fine
    done = passwd(str(path), "alice", "--delete", stdin=None)
    assert done.returncode == 0 and f"removed alice from {path}" in done.stderr
    assert list(load_password_file(path).users) == ["bob"]
    done = passwd(str(path), "alice", "--delete", stdin=None)
    assert done.returncode == 1 and "no user 'alice'" in done.stderr


def test_the_password_is_never_an_argument(tmp_path):
    done = passwd(str(tmp_path / "u.db"), "alice", "hunter2")
    assert done.returncode == 2 and "unrecognized arguments: hunter2" in done.stderr
    assert not (tmp_path / "u.db").exists()


def test_empty_input_and_bad_names_are_refused(tmp_path):
    path = tmp_path / "users.db"
    done = passwd(str(path), "alice", stdin="")
    assert done.returncode == 1 and "no password on standard input" in done.stderr
    done = passwd(str(path), "alice", stdin="\n")
    assert done.returncode == 1 and "the password is empty" in done.stderr
    done = passwd(str(path), "anonymous", stdin="x\n")
    assert done.returncode == 1 and "anonymous logons get" in done.stderr
    done = passwd(str(path), "a:b", stdin="x\n")
    assert done.returncode == 1 and "':'" in done.stderr
    assert not path.exists()


def test_a_corrupt_file_is_reported_with_its_line_and_left_alone(tmp_path):
    path = tmp_path / "users.db"
    passwd(str(path), "alice", stdin="pw\n")
    damaged = path.read_text() + "bob:not-a-hash\n"
    path.write_text(damaged)
    done = passwd(str(path), "carol", stdin="pw\n")
    assert done.returncode == 1
    assert done.stderr.startswith(f"tickertape passwd: password file {path}:3: ")
    assert "scrypt$N$r$p$SALT$DIGEST" in done.stderr
    assert path.read_text() == damaged


def test_token(tmp_path):
    path = tmp_path / "users.db"
    done = passwd(str(path), "monitor", "--token", stdin=None)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert token.startswith("tt1.") and "shown only this once" in done.stderr
    users = load_password_file(path)
    assert users.verify_token(token) == "monitor"
    assert token not in path.read_text()
    done = passwd(str(path), "monitor", "--token", "--delete")
    assert done.returncode == 2  # one or the other


def _read_until(fd: int, marker: bytes, timeout: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def _at_terminal(args: list[str], answers: list[bytes]) -> tuple[int, bytes]:
    with warnings.catch_warnings():  # 3.12+ warns about forking a threaded process; we exec
        warnings.simplefilter("ignore", DeprecationWarning)
        pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execv(TICKERTAPE, [TICKERTAPE, "passwd", *args])
    output = b""
    try:
        for prompt, answer in zip((b"New password for", b"Again: "), answers, strict=False):
            output += _read_until(fd, prompt)
            os.write(fd, answer)
        output += _read_until(fd, b"\x00", timeout=30.0)  # everything until it exits
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), output


def test_prompt_at_a_terminal(tmp_path):
    path = tmp_path / "users.db"
    code, output = _at_terminal([str(path), "alice"], [b"typed secret\n", b"typed secret\n"])
    assert code == 0, output
    assert b"typed secret" not in output  # not echoed
    assert load_password_file(path).verify_password("alice", "typed secret")
    code, output = _at_terminal([str(path), "alice"], [b"one\n", b"two\n"])
    assert code == 1 and b"the two passwords differ" in output
    assert load_password_file(path).verify_password("alice", "typed secret")
