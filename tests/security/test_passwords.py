"""The password file through its API: write, reload, verify, across the file on disk."""

import os
import stat
import time

import pytest

from protocol.security import passwords
from protocol.security.passwords import (
    PasswordFileError,
    ScryptParams,
    delete_user,
    load_password_file,
    set_password,
    set_token,
)

FAST = ScryptParams(n=1 << 10, r=8, p=1)  # the format and checks, without the real cost


def test_add_verify_change_delete(tmp_path):
    path = tmp_path / "users.db"
    assert set_password(path, "alice", "s3cret", FAST) is True
    assert set_password(path, "bob", "hunter2", FAST) is True
    users = load_password_file(path)
    assert len(users) == 2 and "alice" in users
    assert users.verify_password("alice", "s3cret")
    assert not users.verify_password("alice", "S3cret")
    assert not users.verify_password("alice", "")
    assert not users.verify_password("carol", "s3cret")
    assert set_password(path, "alice", "new one", FAST) is False  # changed, not added
    users = load_password_file(path)
    assert users.verify_password("alice", "new one") and not users.verify_password(
        "alice", "s3cret"
    )
    assert delete_user(path, "bob") is True
    assert delete_user(path, "bob") is False
    assert list(load_password_file(path).users) == ["alice"]


def test_file_holds_hashes_only_with_mode_0600(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "alice", "correct horse", FAST)
    text = path.read_text()
    assert "correct horse" not in text
    [line] = [x for x in text.splitlines() if not x.startswith("#")]
    user, hashed = line.split(":")
    assert user == "alice" and hashed.startswith("scrypt$1024$8$1$")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["users.db"]  # no temporary left behind


def test_a_write_syncs_the_file_then_renames_it_then_syncs_the_directory(tmp_path, monkeypatch):
    path = tmp_path / "users.db"
    steps = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(fd):
        steps.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def record_replace(src, dst):
        steps.append(("replace", os.fspath(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    set_password(path, "alice", "s3cret", FAST)
    assert steps[1:] == [("replace", str(path)), ("fsync", str(tmp_path))]
    assert steps[0][0] == "fsync" and os.path.dirname(steps[0][1]) == str(tmp_path)


def test_each_hash_has_its_own_salt(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "a", "same", FAST)
    set_password(path, "b", "same", FAST)
    users = load_password_file(path).users
    assert users["a"].password != users["b"].password


def test_a_rewrite_keeps_0600_even_if_the_file_was_loosened(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "a", "x", FAST)
    os.chmod(path, 0o644)
    set_password(path, "b", "y", FAST)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_default_cost_is_memory_hard_and_takes_tens_of_milliseconds(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "alice", "pw")
    users = load_password_file(path)
    assert users.users["alice"].password.startswith("scrypt$32768$8$1$")
    assert passwords.DEFAULT_PARAMS.memory == 32 << 20
    start = time.perf_counter()
    assert users.verify_password("alice", "pw")
    took = time.perf_counter() - start
    assert 0.005 < took < 2.0
    start = time.perf_counter()
    assert not users.verify_password("nobody", "pw")  # an unknown user costs a check too
    assert time.perf_counter() - start > 0.005


def test_tokens(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "root", "pw", FAST)
    token = set_token(path, "root")
    assert token.startswith("tt1.")
    users = load_password_file(path)
    assert users.verify_token(token) == "root"
    assert users.verify_password("root", "pw")  # the password is kept
    assert users.verify_token(token[:-2] + "xx") is None
    assert users.verify_token("tt1.bm9ib2R5.abc") is None  # user "nobody"
    assert users.verify_token("garbage") is None
    again = set_token(path, "root")
    users = load_password_file(path)
    assert users.verify_token(again) == "root" and users.verify_token(token) is None
    assert token not in path.read_text() and token.split(".")[2] not in path.read_text()


def test_token_only_user_cannot_log_on_with_a_password(tmp_path):
    path = tmp_path / "users.db"
    token = set_token(path, "monitor")
    users = load_password_file(path)
    assert users.users["monitor"].password is None
    assert ":!:token=" in path.read_text()
    assert not users.verify_password("monitor", "")
    assert not users.verify_password("monitor", "!")
    assert users.verify_token(token) == "monitor"


@pytest.mark.parametrize(
    "name",
    ["", "a:b", "with space", "tab\there", "#hash", "anonymous", "x" * 1025, "bell\x07"],
)
def test_bad_user_names(tmp_path, name):
    with pytest.raises(ValueError):
        set_password(tmp_path / "users.db", name, "pw", FAST)


def test_bad_passwords(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        set_password(tmp_path / "u", "a", "", FAST)
    with pytest.raises(ValueError, match="longer than 4096"):
        set_password(tmp_path / "u", "a", "x" * 4097, FAST)


def test_a_longer_attempt_never_matches_a_password_of_the_longest_length(tmp_path):
    path = tmp_path / "users.db"
    longest = "p" * 4096
    set_password(path, "a", longest, FAST)
    users = load_password_file(path)
    assert users.verify_password("a", longest)
    assert not users.verify_password("a", longest + "extra")


def test_unicode_user_and_password(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "zoë", "pässwörd ✓", FAST)
    assert load_password_file(path).verify_password("zoë", "pässwörd ✓")


GOOD = "alice:" + passwords.hash_secret("pw", FAST)


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        (f"# header\n{GOOD}\nbob\n", 3, "expected USER:HASH"),
        ("bob:md5$abc\n", 1, "scrypt$N$r$p$SALT$DIGEST"),
        ("bob:scrypt$1000$8$1$AAAAAAAAAAA$AAAA\n", 1, "not a power of two"),
        ("bob:scrypt$1048576$64$16$AAAAAAAAAAA$AAAA\n", 1, "MiB"),
        ("bob:scrypt$1024$8$1$!!!$AAAA\n", 1, "base64"),
        ("bob:scrypt$1024$8$1$AAAAAAAAAAAA$AAAA\n", 1, "32-byte digest"),
        (f"{GOOD}\n\n{GOOD}\n", 3, "given twice"),
        (f"{GOOD}:colour=blue\n", 1, "unknown field"),
        ("anonymous:!\n", 1, "anonymous"),
        (b"alice:\xff\n", 1, "not UTF-8"),
    ],
)
def test_corrupt_lines_name_the_file_and_line(tmp_path, content, line, fragment):
    path = tmp_path / "users.db"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(PasswordFileError) as info:
        load_password_file(path)
    assert info.value.line == line and info.value.path == str(path)
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"password file {path}:{line}: ")


def test_missing_file(tmp_path):
    with pytest.raises(PasswordFileError, match="not found; create it with `tickertape passwd"):
        load_password_file(tmp_path / "nope")
    with pytest.raises(PasswordFileError, match="not found"):
        delete_user(tmp_path / "nope", "a")
    assert not (tmp_path / "nope").exists()


def test_a_corrupt_file_is_not_rewritten(tmp_path):
    path = tmp_path / "users.db"
    path.write_text("broken line\n")
    with pytest.raises(PasswordFileError):
        set_password(path, "a", "pw", FAST)
    assert path.read_text() == "broken line\n"


def test_comments_blank_lines_and_crlf_are_accepted(tmp_path):
    path = tmp_path / "users.db"
    path.write_text(f"# a comment\r\n\r\n{GOOD}\r\n")
    assert load_password_file(path).verify_password("alice", "pw")


def test_empty_file_has_no_users(tmp_path):
    path = tmp_path / "users.db"
    path.write_text("")
    assert len(load_password_file(path)) == 0
