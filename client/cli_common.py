"""What `tickertape pub`, `sub` and `queue` share: the checked options, the HAClient and its
connection, and the run wrapper that turns every expected failure into one stderr line and an
exit status (the statuses are listed in client/cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import IO, Any

import msgspec

from .address import DEFAULT_ADDRESS, parse_server
from .errors import ClientError, ConnectFailed, StoreError
from .ha import HAClient
from .message import Message

__all__ = [
    "Printing",
    "Usage",
    "checked_servers",
    "connect",
    "credentials",
    "default_name",
    "ha_client",
    "render",
    "report_recovery",
    "run_command",
]


def render(msg: Message, headers: bool, key: bool = False) -> bytes:
    """One line of `sub`, `queue` or `sow`: the body, or with --headers a JSON object of the
    bookmark, topic and body (as JSON, or as a string if it is not JSON), with `key` the SOW
    record's key `k` first."""
    if not headers:
        return msg.body + b"\n"
    try:
        body = msgspec.json.decode(msg.body)
    except msgspec.DecodeError:
        body = msg.body.decode("utf-8", "replace")
    line: dict[str, Any] = {"k": msg.header.k} if key else {}
    line.update(bm=msg.bookmark, t=msg.topic, body=body)
    return msgspec.json.encode(line) + b"\n"


class Usage(Exception):
    """A problem with the command line; exit status 2."""


def default_name(command: str) -> str:
    # unique per process: two pubs sharing a name would take over each other's connection
    return f"tickertape-{command}-{socket.gethostname()}-{os.getpid()}"


def checked_servers(args: argparse.Namespace) -> list[str]:
    """The --server addresses (default 127.0.0.1:9007); Usage for one that does not parse."""
    servers = args.server or [DEFAULT_ADDRESS]
    for address in servers:
        try:
            parse_server(address)
        except ValueError as exc:
            raise Usage(f"--server: {exc}") from None
    return servers


def run_command(command: str, coro: Coroutine[Any, Any, int], stderr: IO[str]) -> int:
    """Run `coro` to its exit status; turn every expected failure into one stderr line."""
    # the commands print every client failure themselves: keep the library's warnings (which
    # would otherwise reach stderr through logging's last-resort handler) from repeating them
    logging.getLogger("tickertape.client").addHandler(logging.NullHandler())
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        print(f"tickertape {command}: interrupted", file=stderr)
        return 130
    except (ConnectFailed, Usage, StoreError) as exc:
        print(f"tickertape {command}: {exc}", file=stderr)
        return 2
    except ClientError as exc:
        print(f"tickertape {command}: {exc}", file=stderr)
        return 1


def ha_client(command: str, args: argparse.Namespace, stderr: IO[str], **kw: Any) -> HAClient:
    """The HAClient of a command: --server, --client-name, the credentials, and a one-line
    note on stderr for each lost and regained connection."""
    first = True

    def on_state(state: str) -> None:
        nonlocal first
        if state == "reconnecting":
            print(f"tickertape {command}: connection to {client.current_uri} lost; reconnecting",
                  file=stderr, flush=True)  # fmt: skip
        elif state == "connected":
            if not first:
                print(f"tickertape {command}: connected to {client.current_uri}", file=stderr,
                      flush=True)  # fmt: skip
            first = False

    client = HAClient(args.client_name or default_name(command), servers=checked_servers(args),
                      on_state=on_state, **credentials(args), **kw)  # fmt: skip
    return client


def credentials(args: argparse.Namespace) -> dict[str, Any]:
    """user_id, password and the TLS context for tcps:// servers, from the options."""
    found: dict[str, Any] = {}
    if args.user:
        found["user_id"] = args.user
        if args.password_file:
            try:
                with open(args.password_file, encoding="utf-8") as f:
                    found["password"] = f.readline().rstrip("\r\n")
            except OSError as exc:
                raise Usage(
                    f"--password-file: {exc.strerror or exc}: {args.password_file}"
                ) from None
        else:
            found["password"] = os.environ.get("TICKERTAPE_PASSWORD")
    elif args.password_file:
        raise Usage("--password-file needs --user")
    if args.ca_file or args.cert or args.key:
        from .tls import tls_context

        try:
            found["tls"] = tls_context(args.ca_file, args.cert, args.key)
        except (OSError, ValueError) as exc:
            raise Usage(f"TLS options: {exc}") from None
    return found


async def connect(client: HAClient, args: argparse.Namespace) -> None:
    """connect_and_logon() within --connect-timeout; a ConnectFailed names every server."""
    try:
        await client.connect_and_logon(timeout=max(0.0, args.connect_timeout))
    except ConnectFailed as exc:
        servers = client.chooser.uris if hasattr(client.chooser, "uris") else []
        if len(servers) > 1:
            raise ConnectFailed(", ".join(servers), exc.reason) from None
        raise


def report_recovery(command: str, store: object, stderr: IO[str]) -> None:
    """One stderr line if `store` is a file store whose opening dropped damaged records."""
    report = getattr(store, "recovery", None)
    if report is not None and not report.clean:
        print(f"tickertape {command}: store damaged, recovered what was valid: {report}",
              file=stderr)  # fmt: skip


class Printing:
    """A command that prints messages (`sub`, `queue`, `sow`): called with its parsed options
    (and the streams, for tests), it runs `fn` under run_command() and returns the exit status;
    a closed stdout (`| head`) is exit 0."""

    def __init__(
        self,
        command: str,
        fn: Callable[[argparse.Namespace, IO[bytes], IO[str]], Coroutine[Any, Any, int]],
    ) -> None:
        self.command = command
        self.fn = fn

    def __call__(
        self,
        args: argparse.Namespace,
        *,
        stdout: IO[bytes] | None = None,
        stderr: IO[str] | None = None,
    ) -> int:
        stderr = stderr or sys.stderr
        real_stdout = stdout is None
        stdout = stdout or sys.stdout.buffer
        status = run_command(self.command, self.fn(args, stdout, stderr), stderr)
        if status == -1:  # the reader went away (`| head`): that is a normal way to stop
            if real_stdout:
                # keep the interpreter's final flush of stdout from failing again at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        return status
