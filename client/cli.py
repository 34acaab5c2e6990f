"""`tickertape pub`, `tickertape sub` and `tickertape queue`: the command-line client.

The project's entry point (server/cli.py) owns the `tickertape` parser; it calls
`add_client_commands(subparsers)` and then `args.run(args)` (run_pub / run_sub / run_queue).
Each is a plain synchronous function that runs its own event loop (`asyncio.run`, the default
loop: uvloop belongs to the server's entry point) and returns the exit status:

```
0    done (pub: everything persisted; sub/queue: --count reached, a range completed, or idle
     --timeout without --count)
1    the server refused something, pub rejected input lines or timed out waiting for persisted
     acks, or sub/queue's --timeout passed before --count messages
2    usage: cannot connect at start (names the address, suggests `tickertape serve`), bad
     --server, --bookmark or store option, or a store file in use by another process
130  interrupted (Ctrl-C)
```

All three use the HAClient (client/ha.py): `--server` may be given several times (failover
order; default 127.0.0.1:9007); `tcps://host:port` is TLS, checked against `--ca-file` (the
system's trust store without it), with `--cert`/`--key` for a server that asks for a client
certificate. `--user` logs on as that user, with the password from the environment variable
TICKERTAPE_PASSWORD or the first line of `--password-file` (never from the command line,
which other users can read in the process list). At start every server is tried once (`--connect-timeout`
to keep trying longer); once connected, a lost connection is retried and failed over without
end, and a one-line note goes to stderr. Errors are one line on stderr, never a traceback.
`python -m client.cli pub|sub|queue ...` runs the same commands without the server package.

pub: one message per non-empty stdin line; the body is the line without surrounding whitespace,
and must be JSON (a rejected line is named by its number on stderr and skipped). With
`--publish-store FILE` every message is kept in FILE until the server persisted it, so a
server restart loses nothing and duplicates nothing, and a killed `pub` run again with the same
FILE and `--client-name` first republishes what the server had not persisted, then reads new
input. At end of input it waits (`--timeout`) for persisted acks, then prints `published N
message(s) to T, persisted through seq S` on stderr.

sub: one line per message on stdout, flushed per line: the body as-is, or with --headers
`{"bm": ..., "t": ..., "body": <body as JSON, or as a string if it is not JSON>}`. With
`--bookmark recent --bookmark-store FILE --sub-id ID` it resumes exactly where the previous
run with that FILE and ID stopped: each message is discarded in the store right after it is
printed (a kill between the two prints that one message again on the next run).
--timeout is an idle limit: stop when no message arrived for that many seconds.

queue: consume a queue (docs/protocol.md §8): one line per message (the body), each acknowledged
(`sow_delete`, in batches of up to half the backlog) after it is printed.
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
from .bookmarks import MOST_RECENT, MemoryBookmarkStore
from .bookmarks_logged import LoggedBookmarkStore
from .bookmarks_ring import RingBookmarkStore
from .errors import ClientError, ConnectFailed, StoreError
from .ha import HAClient
from .pubstore import MemoryPublishStore
from .pubstore_file import FilePublishStore

__all__ = ["add_client_commands", "main", "run_pub", "run_queue", "run_sub"]

_READ_CHUNK = 64 * 1024
_json_decode = msgspec.json.decode
_json_encode = msgspec.json.encode


class _Usage(Exception):
    """A problem with the command line; exit status 2."""


def add_client_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `pub`, `sub` and `queue` on the `tickertape` parser's subparsers.

    Each sets `run` and `func` (both run_pub / run_sub / run_queue; `run` is what server/cli.py
    dispatches on, `func` the argparse idiom): dispatch with `sys.exit(args.run(args))`.
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
        "its sequence numbers (always with --publish-store)",
    )
    pub.add_argument(
        "--publish-store",
        metavar="FILE",
        help="keep every message in FILE until persisted: survives server restarts and this "
        "command being killed (run it again with the same FILE and --client-name)",
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
        help="replay from a bookmark: recent (where --sub-id left off, with --bookmark-store), "
        "epoch or 0 (everything), now or 0|1| (no replay), <id>|<seq>|, a timestamp YYYYmmddTHHMMSS, a comma list, "
        "or a range [begin:end]",
    )
    sub.add_argument(
        "--bookmark-store",
        metavar="FILE",
        help="remember in FILE what was printed, per --sub-id, to resume where the last run "
        "stopped (--bookmark defaults to recent)",
    )
    sub.add_argument(
        "--bookmark-store-kind",
        choices=("logged", "ring"),
        default="logged",
        help="logged (default: exact even with out-of-order discards) or ring (smaller, faster)",
    )
    sub.add_argument("--sub-id", help="subscription id (needed to resume with a bookmark store)")
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

    queue = subparsers.add_parser(
        "queue",
        help="consume a queue, printing and acknowledging each message",
        description="Subscribe to a queue and print one JSON line per message (the body), "
        "acknowledging each after it is printed.",
    )
    queue.add_argument("name", help="queue name (its <SOW><Queue><Name>)")
    _common(queue)
    queue.add_argument("--client-name", help="default: tickertape-queue-<host>-<pid>")
    queue.add_argument(
        "--backlog",
        type=int,
        default=10,
        metavar="N",
        help="most unacknowledged messages leased to this consumer (max_backlog, default 10)",
    )
    queue.add_argument("--filter", help="content filter on the queue's messages")
    queue.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    queue.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop when no message arrives for SECONDS (exit 1 if --count was not reached)",
    )
    queue.set_defaults(func=run_queue, run=run_queue)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        action="append",
        metavar="HOST:PORT",
        help=f"server address (default {DEFAULT_ADDRESS}); give it several times for failover, "
        "in order",
    )
    p.add_argument("--user", metavar="USER", help="log on as USER (user_id)")
    p.add_argument(
        "--password-file",
        metavar="FILE",
        help="the password for --user: the first line of FILE (else $TICKERTAPE_PASSWORD)",
    )
    p.add_argument("--ca-file", metavar="FILE", help="CA certificates for tcps:// servers (PEM)")
    p.add_argument("--cert", metavar="FILE", help="client certificate for tcps:// (PEM)")
    p.add_argument("--key", metavar="FILE", help="private key of --cert (PEM)")
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep trying to connect at start for SECONDS (default: try each server once)",
    )


def _default_name(command: str) -> str:
    # unique per process: two pubs sharing a name would take over each other's connection
    return f"tickertape-{command}-{socket.gethostname()}-{os.getpid()}"


def _servers(args: argparse.Namespace) -> list[str]:
    servers = args.server or [DEFAULT_ADDRESS]
    for address in servers:
        try:
            parse_address(address)
        except ValueError as exc:
            raise _Usage(f"--server: {exc}") from None
    return servers


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
    except (ConnectFailed, _Usage, StoreError) as exc:
        print(f"tickertape {command}: {exc}", file=stderr)
        return 2
    except ClientError as exc:
        print(f"tickertape {command}: {exc}", file=stderr)
        return 1


def _ha_client(command: str, args: argparse.Namespace, stderr: IO[str], **kw) -> HAClient:
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

    client = HAClient(args.client_name or _default_name(command), servers=_servers(args),
                      on_state=on_state, **_credentials(args), **kw)  # fmt: skip
    return client


def _credentials(args: argparse.Namespace) -> dict:
    """user_id, password and the TLS context for tcps:// servers, from the options."""
    found: dict = {}
    if args.user:
        found["user_id"] = args.user
        if args.password_file:
            try:
                with open(args.password_file, encoding="utf-8") as f:
                    found["password"] = f.readline().rstrip("\r\n")
            except OSError as exc:
                raise _Usage(
                    f"--password-file: {exc.strerror or exc}: {args.password_file}"
                ) from None
        else:
            found["password"] = os.environ.get("TICKERTAPE_PASSWORD")
    elif args.password_file:
        raise _Usage("--password-file needs --user")
    if args.ca_file or args.cert or args.key:
        from .tls import tls_context

        try:
            found["tls"] = tls_context(args.ca_file, args.cert, args.key)
        except (OSError, ValueError) as exc:
            raise _Usage(f"TLS options: {exc}") from None
    return found


async def _connect(client: HAClient, args: argparse.Namespace) -> None:
    try:
        await client.connect_and_logon(timeout=max(0.0, args.connect_timeout))
    except ConnectFailed as exc:
        servers = client.chooser.uris if hasattr(client.chooser, "uris") else []
        if len(servers) > 1:
            raise ConnectFailed(", ".join(servers), exc.reason) from None
        raise


def _report_recovery(command: str, store, stderr: IO[str]) -> None:
    report = getattr(store, "recovery", None)
    if report is not None and not report.clean:
        print(f"tickertape {command}: store damaged, recovered what was valid: {report}",
              file=stderr)  # fmt: skip


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
    servers = _servers(args)
    if args.publish_store and not args.client_name:
        raise _Usage("--publish-store needs --client-name (the server numbers a publisher's "
                     "messages by its name)")  # fmt: skip
    store = FilePublishStore(args.publish_store) if args.publish_store else MemoryPublishStore()
    _report_recovery("pub", store, stderr)
    topic = args.topic
    client = _ha_client("pub", args, stderr, publish_store=store)
    published = rejected = lineno = 0
    try:
        await _connect(client, args)
        if client.republished:
            print(f"tickertape pub: republished {client.republished} message(s) from "
                  f"{args.publish_store} that {client.current_uri} had not persisted",
                  file=stderr, flush=True)  # fmt: skip
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
        if args.publish_store:
            print(f"tickertape pub: end of input: {published} message(s) stored in "
                  f"{args.publish_store}; waiting for persisted acks", file=stderr,
                  flush=True)  # fmt: skip
        await client.publish_flush(timeout=args.timeout)
    except ClientError as exc:
        if isinstance(exc, ConnectFailed) and servers and not client.logon_result:
            raise
        kept = store.unpersisted_count()
        where = f"; {kept} kept in {args.publish_store} for the next run" if (
            kept and args.publish_store) else ""  # fmt: skip
        print(
            f"tickertape pub: {exc}; {published} published, persisted through seq "
            f"{client.persisted_seq}{where}",
            file=stderr,
        )
        return 1
    finally:
        await client.close()
        store.close()
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
    return _run_printing("sub", _sub, args, stdout, stderr)


def _run_printing(command: str, fn, args, stdout, stderr) -> int:
    stderr = stderr or sys.stderr
    real_stdout = stdout is None
    stdout = stdout or sys.stdout.buffer
    status = _run(command, fn(args, stdout, stderr), stderr)
    if status == -1:  # the reader went away (`| head`): that is a normal way to stop
        if real_stdout:
            # keep the interpreter's final flush of stdout from failing again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status


def _sub_options(args: argparse.Namespace) -> str | None:
    opts = [o for o in (args.options,) if o]
    if args.rate:
        opts.append(f"rate={args.rate}")
    return ",".join(opts) or None


_BOOKMARK_WORDS = {"epoch": "0", "now": "0|1|"}


def _check_bookmark(text: str | None) -> None:
    if text is None or text == MOST_RECENT:
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


def _open_bookmark_store(args: argparse.Namespace):
    if not args.bookmark_store:
        return MemoryBookmarkStore()
    if not args.sub_id:
        raise _Usage("--bookmark-store needs --sub-id (the store keeps state per subscription)")
    if args.bookmark_store_kind == "ring":
        return RingBookmarkStore(args.bookmark_store)
    return LoggedBookmarkStore(args.bookmark_store)


async def _idle_next(sub, args, received: int, command: str, stderr: IO[str]):
    """The next message, or an exit status when the idle --timeout passed."""
    try:
        return await sub.next(timeout=args.timeout)
    except TimeoutError:
        if args.count is not None:
            print(
                f"tickertape {command}: received {received} of {args.count} message(s) "
                f"before the --timeout of {args.timeout:g}s",
                file=stderr,
            )
            return 1
        return 0


async def _sub(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    _servers(args)
    args.bookmark = _BOOKMARK_WORDS.get((args.bookmark or "").lower(), args.bookmark)
    _check_bookmark(args.bookmark)
    if args.count is not None and args.count < 1:
        raise _Usage("--count must be at least 1")
    store = _open_bookmark_store(args)
    _report_recovery("sub", store, stderr)
    bookmark = args.bookmark
    if bookmark is None and args.bookmark_store:
        bookmark = MOST_RECENT  # a store is there to resume from
    client = _ha_client("sub", args, stderr, bookmark_store=store)
    received = 0
    try:
        await _connect(client, args)
        sub = await client.subscribe(
            args.topic,
            filter=args.filter,
            bookmark=bookmark,
            options=_sub_options(args),
            sub_id=args.sub_id,
        )
        while args.count is None or received < args.count:
            msg = await _idle_next(sub, args, received, "sub", stderr)
            if isinstance(msg, int):
                return msg
            if msg is None:  # a range completed
                return 0
            try:
                stdout.write(_render(msg, args.headers))
                stdout.flush()
            except BrokenPipeError:
                return -1
            sub.discard(msg)
            received += 1
        return 0
    finally:
        await client.close()
        store.close()


# ==================================================================================== queue


def run_queue(
    args: argparse.Namespace,
    *,
    stdout: IO[bytes] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """`tickertape queue`: returns the exit status (see the module docstring)."""
    return _run_printing("queue", _queue, args, stdout, stderr)


async def _queue(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    _servers(args)
    if args.backlog < 1:
        raise _Usage("--backlog must be at least 1")
    if args.count is not None and args.count < 1:
        raise _Usage("--count must be at least 1")
    client = _ha_client("queue", args, stderr)
    received = 0
    unacked: list[str] = []
    batch = max(1, args.backlog // 2)

    async def ack() -> None:
        if unacked:
            bookmarks = ",".join(unacked)
            unacked.clear()
            await client.sow_delete(args.name, bookmarks)

    try:
        await _connect(client, args)
        sub = await client.subscribe(args.name, filter=args.filter,
                                     options=f"max_backlog={args.backlog}")  # fmt: skip
        while args.count is None or received < args.count:
            if unacked and (len(unacked) >= batch or sub.buffered == 0):
                await ack()  # before waiting: the server sends no more than the backlog
            msg = await _idle_next(sub, args, received, "queue", stderr)
            if isinstance(msg, int):
                return msg
            if msg is None:
                return 0
            try:
                stdout.write(msg.body + b"\n")
                stdout.flush()
            except BrokenPipeError:
                return -1
            if msg.bookmark:
                unacked.append(msg.bookmark)
            received += 1
        return 0
    finally:
        try:
            if client.connected:
                await ack()
        finally:
            await client.close()


# ==================================================================================== main


def main(argv: list[str] | None = None) -> int:
    """`python -m client.cli pub|sub|queue ...` (the same commands as `tickertape ...`)."""
    parser = argparse.ArgumentParser(prog="tickertape", description="Tickertape client")
    commands = parser.add_subparsers(dest="command", required=True)
    add_client_commands(commands)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
