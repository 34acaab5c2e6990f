"""`tickertape pub`: publish stdin's JSON lines (options and exit statuses: client/cli.py).

One message per non-empty stdin line; the body is the line without surrounding whitespace,
and must be JSON (a rejected line is named by its number on stderr and skipped). With
`--publish-store FILE` every message is kept in FILE until the server persisted it, so a
server restart loses nothing and duplicates nothing, and a killed `pub` run again with the same
FILE and `--client-name` first republishes what the server had not persisted, then reads new
input. At end of input it waits (`--timeout`) for persisted acks, then prints `published N
message(s) to T, persisted through seq S` on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import sys
import threading
from typing import IO

import msgspec

from .cli_common import Usage, checked_servers, connect, ha_client, report_recovery, run_command
from .errors import ClientError, ConnectFailed
from .pubstore import MemoryPublishStore
from .pubstore_file import FilePublishStore

__all__ = ["run_pub"]

_READ_CHUNK = 64 * 1024
_json_decode = msgspec.json.decode


def run_pub(
    args: argparse.Namespace,
    *,
    stdin: IO[bytes] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """`tickertape pub`: returns the exit status (see the module docstring)."""
    stderr = stderr or sys.stderr
    stdin = stdin or sys.stdin.buffer
    return run_command("pub", _pub(args, stdin, stderr), stderr)


def _start_reader(stream: IO[bytes], loop: asyncio.AbstractEventLoop) -> asyncio.Queue[bytes]:
    """Read `stream` on a daemon thread into a bounded queue of chunks (b"" = end of input).

    A daemon thread, not the loop's executor: a read blocked on a terminal must not keep the
    process alive after Ctrl-C (asyncio.run waits for executor threads).
    """
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)
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
    servers = checked_servers(args)
    if args.publish_store and not args.client_name:
        raise Usage("--publish-store needs --client-name (the server numbers a publisher's "
                     "messages by its name)")  # fmt: skip
    store = FilePublishStore(args.publish_store) if args.publish_store else MemoryPublishStore()
    report_recovery("pub", store, stderr)
    topic = args.topic
    client = ha_client("pub", args, stderr, publish_store=store)
    published = rejected = lineno = 0
    try:
        await connect(client, args)
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
