"""`tickertape pub` / `sub` as subprocesses (`python -m client.cli`) against the scripted server:
output format, exit statuses, one-line errors, Ctrl-C."""

import argparse
import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import msgspec
import pytest

from client.cli import add_client_commands, run_pub, run_sub

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cli_process  # the commands run in processes of their own


async def run_cli(*args, stdin: bytes = b"", timeout: float = 20.0):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    return proc.returncode, out, err.decode()


def auto_publisher(conn, header, body):
    """Answer logons (s=0) and acknowledge every publish as persisted."""
    if header.c == "logon":
        conn.ack("processed", cid=header.cid, s=0)
        return True
    if header.c == "publish":
        conn.published = [*getattr(conn, "published", []), (header.t, header.s, body)]
        conn.ack("persisted", s=header.s)
        return True
    return False


def auto_subscriber(bodies, *, fail=None):
    def handler(conn, header, body):
        if header.c == "logon":
            conn.ack("processed", cid=header.cid, s=0)
            return True
        if header.c == "subscribe":
            conn.subscribe_header = header
            if fail:
                conn.ack("processed", cid=header.cid, status="failure", reason=fail)
                return True
            conn.ack("processed", cid=header.cid, sub_id=header.sub_id)
            for i, b in enumerate(bodies, 1):
                conn.deliver(header.t, b, header.sub_id, bm=f"77|{i}|")
            return True
        return False

    return handler


async def test_pub_publishes_lines_and_waits_for_persisted(server):
    server.auto = auto_publisher
    lines = b'{"a":1}\n\n  {"a":2}  \n{"a":3}'  # blank line skipped, no final newline
    status, _, err = await run_cli("pub", "orders", "--server", server.address, stdin=lines)
    assert status == 0, err
    assert "published 3 message(s) to orders, persisted through seq 3" in err
    conn = server.conns[0]
    assert conn.published == [
        ("orders", 1, b'{"a":1}'), ("orders", 2, b'{"a":2}'), ("orders", 3, b'{"a":3}'),
    ]  # fmt: skip


async def test_pub_rejects_invalid_json_lines_and_exits_nonzero(server):
    server.auto = auto_publisher
    lines = b'{"a":1}\nnot json\n{"a":2}\n{"a":\n'
    status, _, err = await run_cli("pub", "t", "--server", server.address, stdin=lines)
    assert status == 1
    assert "line 2: not JSON" in err and "line 4: not JSON" in err
    assert "published 2 message(s) to t, persisted through seq 2" in err
    assert "2 line(s) rejected" in err
    assert "Traceback" not in err


async def test_pub_reports_journal_unavailable(server):
    def failing(conn, header, body):
        if header.c == "publish":
            conn.ack("persisted", s=header.s, status="failure", reason="journal unavailable")
            return True
        return auto_publisher(conn, header, body)

    server.auto = failing
    status, _, err = await run_cli("pub", "t", "--server", server.address, stdin=b"{}\n")
    assert status == 1
    assert "journal unavailable" in err and "Traceback" not in err


async def test_sub_prints_bodies_and_stops_at_count(server):
    server.auto = auto_subscriber([b'{"a":1}', b'{"a":2}', b'{"a":3}'])
    status, out, err = await run_cli(
        "sub", "orders", "--server", server.address, "--count", "2", "--filter", "/a > 0",
        "--bookmark", "0",
    )  # fmt: skip
    assert status == 0, err
    assert out == b'{"a":1}\n{"a":2}\n'
    header = server.conns[0].subscribe_header
    assert (header.f, header.bm) == ("/a > 0", "0")


async def test_sub_headers_wraps_body(server):
    server.auto = auto_subscriber([b'{"a":1}', b"plain text"])
    status, out, err = await run_cli(
        "sub", "orders", "--server", server.address, "--count", "2", "--headers"
    )
    assert status == 0, err
    lines = [msgspec.json.decode(line) for line in out.splitlines()]
    assert lines == [
        {"bm": "77|1|", "t": "orders", "body": {"a": 1}},
        {"bm": "77|2|", "t": "orders", "body": "plain text"},
    ]


async def test_sub_idle_timeout(server):
    server.auto = auto_subscriber([b"{}"])
    status, out, err = await run_cli(
        "sub", "orders", "--server", server.address, "--count", "3", "--timeout", "0.3"
    )
    assert status == 1 and out == b"{}\n"
    assert "received 1 of 3" in err
    server.auto = auto_subscriber([b"{}"])
    status, out, _ = await run_cli("sub", "orders", "--server", server.address, "--timeout", "0.3")
    assert status == 0 and out == b"{}\n"


async def test_sub_refused_is_one_line(server):
    server.auto = auto_subscriber([], fail="bad filter")
    status, _, err = await run_cli("sub", "t", "--server", server.address, "--filter", "/a =")
    assert status == 1
    assert err.count("\n") == 1 and "bad filter" in err and "Traceback" not in err


async def test_connection_refused_is_one_line_exit_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for command in (["pub", "t"], ["sub", "t"]):
        status, _, err = await run_cli(*command, "--server", f"127.0.0.1:{port}")
        assert status == 2
        assert err.count("\n") == 1, err
        assert f"127.0.0.1:{port}" in err and "tickertape serve" in err


async def test_bad_bookmark_and_server_are_usage_errors():
    status, _, err = await run_cli("sub", "t", "--bookmark", "12|x|")
    assert status == 2 and "--bookmark" in err and "Traceback" not in err
    status, _, err = await run_cli("sub", "t", "--server", "http://x:1")
    assert status == 2 and "--server" in err


async def test_sub_ctrl_c_exits_130(server):
    server.auto = auto_subscriber([b"{}"])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", "sub", "orders", "--server", server.address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    assert line == b"{}\n"  # subscribed and printing, flushed per line
    os.kill(proc.pid, signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 130
    assert "Traceback" not in err.decode()


def test_commands_register_on_a_parent_parser():
    parser = argparse.ArgumentParser(prog="tickertape")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pub", "orders", "--client-name", "p1"])
    assert args.func is run_pub and args.server is None and args.client_name == "p1"
    args = parser.parse_args(["sub", "orders", "--count", "3", "--headers", "--bookmark", "0"])
    assert args.func is run_sub and (args.count, args.headers, args.bookmark) == (3, True, "0")
