"""`tickertape pub` and `tickertape sub`: the command-line client.

The project's entry point (server/cli.py) owns the `tickertape` parser; it calls
`add_client_commands(subparsers)` and then `args.run(args)`, which is `run_pub` or `run_sub`.
Both are plain synchronous functions that run their own event loop (`asyncio.run`, the
default loop: uvloop belongs to the server's entry point) and return the exit status:

```
0    done (pub: everything persisted; sub: --count reached, a range completed, or idle
     --timeout without --count)
1    the server refused something, the connection was lost, pub rejected input lines, or sub's
     --timeout passed before --count messages
2    usage: cannot connect (names the address, suggests `tickertape serve`), bad --server
     or --bookmark
130  interrupted (Ctrl-C)
```

Errors are one line on stderr, never a traceback. `python -m client.cli pub|sub ...` runs the
same commands without the rest of the `tickertape` parser.

pub: one message per non-empty stdin line; the body is the line without surrounding whitespace,
and must be JSON (a rejected line is named by its number on stderr and skipped). At end of input
it waits for persisted acks for everything, then prints `published N message(s) to T, persisted
through seq S` on stderr.

sub: one line per message on stdout, flushed per line: the body as-is, or with --headers
`{"bm": ..., "t": ..., "body": <body as JSON, or as a string if it is not JSON>}`.
--timeout is an idle limit: stop when no message arrived for that many seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import socket
import sys
import threading
from typing import IO

import msgspec

from .address import DEFAULT_ADDRESS, parse_address
from .client import Client
from .errors import ClientError, ConnectFailed

__all__ = ["add_client_commands", "main", "run_pub", "run_sub"]

_READ_CHUNK = 64 * 1024
_json_decode = msgspec.json.decode
_json_encode = msgspec.json.encode


class _Usage(Exception):
    """A problem with the command line; exit status 2."""


def add_client_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `pub` and `sub` on the `tickertape` parser's subparsers.

    Each sets `run` and `func` (both run_pub / run_sub; `run` is what server/cli.py dispatches
    on, `func` the argparse idiom): dispatch with `sys.exit(args.run(args))`.
    """
    pub = subparsers.add_parser(
        "pub",
        help="publish JSON lines from stdin to a topic",
        description="Publish one message per non-empty JSON line of stdin, then wait until "
        "the server has persisted all of them.",
    )
    pub.add_argument("topic", help="topic to publish to")
    _common(pub)
    pub.add_argument(
        "--client-name",
        help="publisher name (default: tickertape-pub-<host>-<pid>); reuse a name to continue "
        "its sequence numbers",
    )
    pub.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait for the persisted acks at the end (default 60)",
    )
    pub.set_defaults(func=run_pub, run=run_pub)

    sub = subparsers.add_parser(
        "sub",
        help="print a topic's messages as JSON lines",
        description="Subscribe to a topic (or a topic regex) and print one line per message.",
    )
    sub.add_argument("topic", help="topic name or regular expression")
    _common(sub)
    sub.add_argument("--client-name", help="default: tickertape-sub-<host>-<pid>")
    sub.add_argument("--filter", help="content filter, e.g. \"/qty > 10 AND /sym = 'X'\"")
    sub.add_argument(
        "--bookmark",
        help="replay from a bookmark: 0 (everything), 0|1| (now), <id>|<seq>|, a timestamp "
        "YYYYmmddTHHMMSS, a comma list, or a range [begin:end]",
    )
    sub.add_argument("--rate", help="replay rate limit: 1000 (msgs/s), 500KB (bytes/s), 2X")
    sub.add_argument("--options", help="raw subscribe options (the `o` header)")
    sub.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    sub.add_argument(
        "--headers",
        action="store_true",
        help='print {"bm": ..., "t": ..., "body": ...} instead of the bare body',
    )
    sub.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop when no message arrives for SECONDS (exit 1 if --count was not reached)",
    )
    sub.set_defaults(func=run_sub, run=run_sub)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        help=f"server address (default {DEFAULT_ADDRESS})",
    )


def _default_name(command: str) -> str:
    # unique per process: two pubs sharing a name would take over each other's connection
    return f"tickertape-{command}-{socket.gethostname()}-{os.getpid()}"


def _run(command: str, coro, stderr: IO[str]) -> int:
    """Run `coro` to its exit status; turn every expected failure into one stderr line."""
    # the commands print every client failure themselves: keep the library's warnings (which
    # would otherwise reach stderr through logging's last-resort handler) from repeating them
    logging.getLogger("tickertape.client").addHandler(logging.NullHandler())
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        print(f"tickertape {command}: interrupted", file=stderr)
        return 130
    except (ConnectFailed, _Usage) as exc:
        print(f"tickertape {command}: {exc}", file=stderr)
        return 2
    except ClientError as exc:
        print(f"tickertape {command}: {exc}", file=stderr)
        return 1


# ==================================================================================== pub


def run_pub(
    args: argparse.Namespace,
    *,
    stdin: IO[bytes] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """`tickertape pub`: returns the exit status (see the module docstring)."""
    stderr = stderr or sys.stderr
    stdin = stdin or sys.stdin.buffer
    return _run("pub", _pub(args, stdin, stderr), stderr)


def _start_reader(stream: IO[bytes], loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
    """Read `stream` on a daemon thread into a bounded queue of chunks (b"" = end of input).

    A daemon thread, not the loop's executor: a read blocked on a terminal must not keep the
    process alive after Ctrl-C (asyncio.run waits for executor threads).
    """
    queue: asyncio.Queue = asyncio.Queue(maxsize=16)
    read = getattr(stream, "read1", stream.read)

    def pump() -> None:
        while True:
            try:
                chunk = read(_READ_CHUNK)
            except (OSError, ValueError):
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is closed or shutting down: nobody wants the rest
            if not chunk:
                return

    threading.Thread(target=pump, name="tickertape-pub-stdin", daemon=True).start()
    return queue


async def _pub(args: argparse.Namespace, stdin: IO[bytes], stderr: IO[str]) -> int:
    _check_server(args.server)
    topic = args.topic
    client = Client(args.client_name or _default_name("pub"))
    await client.connect(args.server)
    published = rejected = lineno = 0
    try:
        await client.logon()
        queue = _start_reader(stdin, asyncio.get_running_loop())
        pending = b""
        while True:
            chunk = await queue.get()
            if chunk:
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
            else:
                lines, pending = ([pending] if pending else []), b""
            for line in lines:
                lineno += 1
                body = line.strip()
                if not body:
                    continue
                try:
                    _json_decode(body)
                except msgspec.DecodeError as exc:
                    rejected += 1
                    print(f"tickertape pub: line {lineno}: not JSON ({exc}); skipped", file=stderr)
                    continue
                await client.publish(topic, body)
                published += 1
            if not chunk:
                break
        await client.publish_flush(timeout=args.timeout)
    except ClientError as exc:
        print(
            f"tickertape pub: {exc}; {published} published, persisted through seq "
            f"{client.persisted_seq}",
            file=stderr,
        )
        return 1
    finally:
        await client.close()
    print(
        f"published {published} message(s) to {topic}, persisted through seq "
        f"{client.persisted_seq}",
        file=stderr,
    )
    if rejected:
        print(f"tickertape pub: {rejected} line(s) rejected as not JSON", file=stderr)
        return 1
    return 0


# ==================================================================================== sub


def run_sub(
    args: argparse.Namespace,
    *,
    stdout: IO[bytes] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """`tickertape sub`: returns the exit status (see the module docstring)."""
    stderr = stderr or sys.stderr
    real_stdout = stdout is None
    stdout = stdout or sys.stdout.buffer
    status = _run("sub", _sub(args, stdout, stderr), stderr)
    if status == -1:  # the reader went away (`| head`): that is a normal way to stop
        if real_stdout:
            # keep the interpreter's final flush of stdout from failing again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status


def _check_server(address: str) -> None:
    try:
        parse_address(address)
    except ValueError as exc:
        raise _Usage(f"--server: {exc}") from None


def _sub_options(args: argparse.Namespace) -> str | None:
    opts = [o for o in (args.options,) if o]
    if args.rate:
        opts.append(f"rate={args.rate}")
    return ",".join(opts) or None


def _check_bookmark(text: str | None) -> None:
    if text is None:
        return
    try:
        from protocol.bookmarks import InvalidBookmark, parse_bookmark
    except ImportError:  # pragma: no cover - the server checks it anyway
        return
    try:
        parse_bookmark(text)
    except InvalidBookmark as exc:
        raise _Usage(f"--bookmark: {exc}") from None


def _render(msg, headers: bool) -> bytes:
    if not headers:
        return msg.body + b"\n"
    try:
        body = _json_decode(msg.body)
    except msgspec.DecodeError:
        body = msg.body.decode("utf-8", "replace")
    return _json_encode({"bm": msg.bookmark, "t": msg.topic, "body": body}) + b"\n"


async def _sub(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    _check_server(args.server)
    _check_bookmark(args.bookmark)
    if args.count is not None and args.count < 1:
        raise _Usage("--count must be at least 1")
    client = Client(args.client_name or _default_name("sub"))
    await client.connect(args.server)
    received = 0
    try:
        await client.logon()
        sub = await client.subscribe(
            args.topic,
            filter=args.filter,
            bookmark=args.bookmark,
            options=_sub_options(args),
        )
        while args.count is None or received < args.count:
            try:
                msg = await sub.next(timeout=args.timeout)
            except TimeoutError:
                if args.count is not None:
                    print(
                        f"tickertape sub: received {received} of {args.count} message(s) "
                        f"before the --timeout of {args.timeout:g}s",
                        file=stderr,
                    )
                    return 1
                return 0
            if msg is None:  # a range completed
                return 0
            try:
                stdout.write(_render(msg, args.headers))
                stdout.flush()
            except BrokenPipeError:
                return -1
            received += 1
        return 0
    finally:
        await client.close()


# ==================================================================================== main


def main(argv: list[str] | None = None) -> int:
    """`python -m client.cli pub|sub ...` (the same commands as `tickertape pub|sub`)."""
    parser = argparse.ArgumentParser(prog="tickertape", description="Tickertape client")
    commands = parser.add_subparsers(dest="command", required=True)
    add_client_commands(commands)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
