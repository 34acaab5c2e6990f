"""The `tickertape` command: the entry point for the server and the command-line client.

    tickertape serve [--config FILE] [--daemon --pid-file FILE]
    tickertape serve --verify-config FILE [FILE ...]   (several: a replication set, checked together)
    tickertape pub|sub ...            (client/cli.py)
    tickertape archive|compact ...    (maintenance_cli.py: the Spark journal job)
    tickertape passwd FILE USER [--delete | --token]   (security/passwd_cli.py)
    tickertape replication downgrade|upgrade NAME [--admin URL]   (replication_cli.py)

Exit status: 0 on a clean stop (SIGTERM / SIGINT drain first), 1 when the server cannot start
(address in use, damaged journal, already running, a certificate or password file that no
longer loads), 2 for a bad command line or configuration.

SIGHUP reopens the log files and, with `--config`, reads the file again and applies its
security part: the password file, the roles, the certificates (docs/security.md, "Rotation").
A file that no longer loads is reported and changes nothing.
This module may import both `server` and `client`: it is the entry point (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - imported where used, so the client CLI starts fast
    from config.model import Config

    from .app import Server
    from .daemon import Daemon

log = logging.getLogger("tickertape.server")


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the server (embedded default config without --config)")
    p.add_argument("--config", metavar="FILE", help="XML configuration file (see config/examples/)")
    p.add_argument(
        "--verify-config",
        metavar="FILE",
        nargs="+",
        help="check configuration files and exit; several files are checked as a replication set",
    )
    p.add_argument("--daemon", action="store_true", help="detach and run in the background")
    p.add_argument("--pid-file", metavar="FILE", help="pid file, locked while the server runs")
    p.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop", help=argparse.SUPPRESS
    )


def build_parser(serve_only: bool = False) -> argparse.ArgumentParser:
    """The whole command line; `serve_only`: just `serve` (the other commands' parsers import
    the client and the Spark job's options, a third of a server's start)."""
    parser = argparse.ArgumentParser(
        prog="tickertape", description="Tickertape message server and client"
    )
    parser.add_argument("--version", action="version", version=f"tickertape {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    if serve_only:
        return parser
    try:
        from client.cli import add_client_commands
    except ImportError:  # pragma: no cover - the client is part of the distribution
        pass
    else:
        add_client_commands(sub)
    from .maintenance_cli import (
        add_maintenance_commands,  # archive, compact (journal/spark/batch.py)
    )

    add_maintenance_commands(sub)
    from .security.passwd_cli import add_passwd_command

    add_passwd_command(sub)
    from .replication_cli import add_replication_command

    add_replication_command(sub)
    return parser


def version() -> str:
    """The installed package's version (pyproject.toml), or `unknown` when run from a tree
    that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("tickertape")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(serve_only=argv[:1] == ["serve"])
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    handler = getattr(args, "run", None)
    if handler is None:  # pragma: no cover
        parser.error(f"unknown command {args.command}")
    result = handler(args)
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    return int(result or 0)


def _load_config(path: str | None) -> Config:
    from config.loader import default_config, load_config

    return load_config(path) if path else default_config()


def _queue_lines(cfg: Config) -> list[str]:
    """What --verify-config says of each queue: the settings a reader might assume otherwise
    (a lease always ends; `e` replaces the queue's expiration), as they apply."""
    lines = []
    for q in cfg.queues:
        if q.semantics == "at-most-once":
            what = "at-most-once (no lease)"
        else:
            what = f"at-least-once, leases end after {q.lease_period:g}s"
        exp = (
            f"messages expire {q.expiration:g}s after receipt unless their own `e` says otherwise"
            if q.expiration
            else "messages expire only by their own `e`"
        )
        lines.append(f"  queue {q.name} over {q.underlying_topic}: {what}; {exp}")
    return lines


def verify(paths: list[str]) -> int:
    """`--verify-config`: each file alone, then (several files) the set. 0 = usable (warnings
    allowed), 2 = a problem in a file or an error across the set."""
    from config.errors import ConfigError
    from config.replication_set import check_set, describe_links

    loaded = []
    status = 0
    for path in paths:
        try:
            cfg = _load_config(path)
        except ConfigError as exc:
            print(str(exc), file=sys.stderr)
            status = 2
            continue
        loaded.append(cfg)
        print(
            f"{path}: configuration is valid (instance {cfg.name}, "
            f"{len(cfg.transports)} transport(s), {len(cfg.queues)} queue(s))"
        )
        for line in _queue_lines(cfg):
            print(line)
    if len(paths) < 2:
        return status
    if status:
        print(
            f"the set of {len(paths)} files is not checked until every file is valid",
            file=sys.stderr,
        )
        return status
    findings = check_set(loaded)
    names = ", ".join(c.name for c in loaded)
    counts = {
        level: sum(f.level == level for f in findings) for level in ("error", "warning", "note")
    }
    summary = ", ".join(f"{n} {level}(s)" for level, n in counts.items() if n) or "no problem"
    print(f"set of {len(loaded)} instances ({names}): {summary}")
    for line in describe_links(loaded):
        print(line)
    for f in findings:
        print(f.format(), file=sys.stderr if f.level == "error" else sys.stdout)
    return 2 if counts["error"] else 0


def serve(args: argparse.Namespace) -> int:
    from config.errors import ConfigError

    if args.verify_config:
        return verify(args.verify_config)
    try:
        cfg = _load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2

    from .daemon import AlreadyRunning, Daemon
    from .logsetup import setup_logging

    daemon = None
    if args.daemon or args.pid_file:
        daemon = Daemon(args.pid_file or "tickertape.pid")
        try:
            daemon.lock()
        except AlreadyRunning as exc:
            print(f"tickertape: {exc}", file=sys.stderr)
            return 1
        if args.daemon:
            daemon.detach()
        else:
            daemon.write_pid()
    setup_logging(cfg.logging, foreground=not args.daemon)
    # a file-size limit must surface as a write error (journal unavailable), not kill the server
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    runner: Callable[[Coroutine[Any, Any, int]], int]
    if args.loop == "uvloop":
        import uvloop

        runner = uvloop.run
    else:
        runner = asyncio.run
    try:
        return runner(_run(cfg, daemon, os.path.abspath(args.config) if args.config else None))
    finally:
        if daemon is not None:
            daemon.release()


def _on_signal(loop: asyncio.AbstractEventLoop, server: Server, name: str) -> None:
    loop.create_task(server.shutdown(name))


def _on_hangup(loop: asyncio.AbstractEventLoop, server: Server, path: str | None) -> None:
    from .logsetup import reopen

    reopen()
    if path is not None:
        task = loop.create_task(_reload(server, path))
        _reloads.add(task)
        task.add_done_callback(_reloads.discard)


_reloads: set[asyncio.Task[None]] = set()


async def _reload(server: Server, path: str) -> None:
    from config.errors import ConfigError
    from config.loader import load_config

    log.info("SIGHUP: reading %s again", path)
    try:
        cfg = await asyncio.get_running_loop().run_in_executor(None, load_config, path)
    except ConfigError as exc:
        log.error("reload: %s no longer loads; nothing changed:\n%s", path, exc)
        return
    server.reload(cfg)


async def _run(cfg: Config, daemon: Daemon | None, path: str | None = None) -> int:
    from journal.journal import JournalError
    from protocol.security.passwords import PasswordFileError
    from protocol.security.tls import TlsError

    from .app import Server

    server = Server(cfg)
    try:
        await server.start()
    except (OSError, JournalError, TlsError, PasswordFileError) as exc:
        msg = f"tickertape: cannot start: {exc}"
        if isinstance(exc, OSError) and exc.errno == 98:
            msg += " (another process listens on that address: stop it or change <InetAddr>)"
        log.error(msg)
        print(msg, file=sys.stderr)
        if daemon is not None:
            daemon.failed(msg)
        await server.shutdown("startup failed")
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, loop, server, signal.Signals(sig).name)
    loop.add_signal_handler(signal.SIGHUP, _on_hangup, loop, server, path)
    where = ", ".join(f"{h}:{p}" for _, h, p in server.addresses)
    line = f"tickertape {cfg.name}: listening on {where}"
    if server.admin is not None:
        line += f"; admin {server.admin.scheme}://{server.admin.host}:{server.admin.port}/stats"
    if daemon is not None and daemon._ready_w >= 0:
        daemon.ready(line)
    else:
        print(line, flush=True)
    await server.wait_stopped()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
