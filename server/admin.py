"""The HTTP admin endpoint (`<Admin><InetAddr>`): server statistics as JSON and Prometheus text.

    GET /            the web console (server/console/: index.html, console.js, console.css)
    GET /events      Server-Sent Events for the console: `history` (the ring of the last hour
                     of samples) at once, then `sample` (a sample and Stats.details) each second
    GET /stats       JSON (Stats.snapshot)
    GET /metrics     Prometheus text exposition format 0.0.4
    GET /sow         JSON: the SOW topics (records, key paths, updates per second) and the
                     store's size (server/sow/query_console.py)
    GET /sow/<topic>?filter=<f>&order_by=<o>&top_n=<n>   JSON: a query's records (at most
                     1,000), read off the event loop; the user also needs the Subscribe right
                     on the topic (403), and its content entitlement is ANDed to the filter
    POST /clients/<id>/disconnect   the console's action: close that client's connection
                     (disconnect reason `admin`); only with `X-Requested-By: tickertape-console`,
                     a header a page of another origin cannot send without the browser asking
                     first (which this endpoint never grants), so no other site can make a
                     logged-on admin's browser do it
    POST /actions/<name>/run   the console's action: run that scheduled journal action
                     (`<Actions>`) now; the same header guard; 409 when it is running already
    POST /replication/<name>/downgrade   sync destination <name> acts as async from now on:
                     publishers' acks no longer wait for it (docs/replication.md); the same
                     header guard (`tickertape replication downgrade NAME` sends it); 409 when
                     it is not a sync destination acting as sync
    POST /replication/<name>/upgrade     a downgraded destination is sync again; 409 when it
                     is not downgraded

A deliberately small HTTP/1.0 responder on asyncio (one request per connection, request head
bounded to 8 KiB, 5 s to send it): the endpoint serves monitoring, not traffic.

Security (docs/security.md): first, every request must name in `Host` an IP address, `localhost`,
the configured listen host or a name of `<AllowedHosts>` (else 421): a page of another site whose
name was made to resolve to this address (DNS rebinding) names its own host, and is refused even
where no credentials are asked. The POST actions and `/events` also refuse an `Origin` that is not
the request's own (`<scheme>://<Host>`) or an allowed host's (403), and so do the SOW queries. Then, with `<Authentication>`, every request needs the credentials of a
user with `admin` (`<Admin>true</Admin>` in a role): HTTP Basic, or `Authorization: Bearer
<token>` from `tickertape passwd --token`. No or wrong credentials get 401 (with a
`WWW-Authenticate` challenge), a user without `admin` 403; wrong credentials back off per peer
address like logons. With `<Certificate>` and `<PrivateKey>` in `<Admin>` it serves HTTPS
(a failed handshake is dropped: monitoring clients report their own TLS errors). Each request
is an audit line (`admin_request`).

An event stream is the one request that stays open. It costs the server nothing while no page is
open; with pages open, the details are built once per sample for all of them. A page whose
output stays over `MAX_STREAM_BUFFER` bytes (it reads slower than a sample a second) is closed,
and a comment line every `KEEPALIVE` seconds without a sample finds a page that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec

from protocol.filters import FilterError, compile_filter

from .guard import Guard
from .security import audit
from .security.authenticator import AuthFailure
from .sow import BadOrderBy, parse_order_by
from .sow.query_console import MAX_ROWS, SowConsole
from .stats import Stats

log = logging.getLogger("tickertape.admin")
MAX_HEAD = 8192
HANDSHAKE_TIMEOUT = 5.0
MAX_STREAM_BUFFER = 1 << 20
KEEPALIVE = 15.0
CONSOLE = Path(__file__).with_name("console")
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
}

ACTION_HEADER = "tickertape-console"


@dataclass(eq=False, repr=False)
class AdminEndpoint:
    """`disconnect(id)` closes that client's connection and returns what it was (None: no such
    client); without it the disconnect action answers 404. `run_action(name)` starts that
    journal action now: "started", "running" (already), or None (no such action).
    `replication(name, "downgrade" | "upgrade", who)` changes a destination's mode: True, False
    (it was not in the mode to leave), None (no such destination). `allowed_hosts`: the host
    names (lowercase) requests may name besides IP addresses and `localhost`. `sow`: the SOW
    topics' view and queries (None: no SOW topics, 404)."""

    stats: Stats
    instance: str
    host: str
    port: int
    guard: Guard = field(default_factory=Guard)
    disconnect: Callable[[int], str | None] | None = None
    run_action: Callable[[str], str | None] | None = None
    replication: Callable[[str, str, str], bool | None] | None = None
    allowed_hosts: Collection[str] = ()
    sow: SowConsole | None = None

    def __post_init__(self) -> None:
        self.named_hosts = frozenset(self.allowed_hosts)
        self.allowed_hosts = self.named_hosts | {"localhost", self.host.lower()}
        self.scheme = "https" if self.guard.admin_tls is not None else "http"
        self._srv: asyncio.base_events.Server | None = None
        self._streams: set[asyncio.Task[None]] = set()
        self._details: tuple[int, bytes] = (0, b"")  # (sample n, the `sample` event's bytes)

    async def start(self) -> None:
        tls = self.guard.admin_tls
        self._srv = await asyncio.start_server(
            self._handle,
            self.host,
            self.port,
            reuse_address=True,
            ssl=tls,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls is not None else None,
        )
        self.host, self.port = self._srv.sockets[0].getsockname()[:2]
        log.info(
            "admin endpoint on %s://%s:%d/stats and /metrics%s",
            self.scheme,
            self.host,
            self.port,
            " (authenticated: users with admin)" if self.guard.checker is not None else "",
        )

    async def stop(self) -> None:
        if self._srv is not None:
            self._srv.close()
        for task in list(self._streams):
            task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ):
            writer.close()
            return
        lines = head[:MAX_HEAD].split(b"\r\n")
        parts = lines[0].decode("latin-1").split()
        method = parts[0] if parts else ""
        path, _, query = parts[1].partition("?") if len(parts) >= 2 else ("", "", "")
        peer = writer.get_extra_info("peername")
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        misdirected = self._check_host(method, path, lines)
        if misdirected is not None:
            user, denied = None, None
        else:
            user, denied = await self._authorize(peer_text, _header(lines, b"authorization"))
        extra = ""
        if misdirected is not None:
            code, body = misdirected
            ctype = "text/plain"
            log.warning("admin: refused %s %s from %s: %s", method, path, peer_text, body.decode())
        elif denied is not None:
            code = denied
            ctype = "text/plain"
            if code == 401:
                extra = 'WWW-Authenticate: Basic realm="tickertape", charset="UTF-8"\r\n'
                body = b"credentials of a user with admin are required (Basic or Bearer)\n"
            else:
                body = b"this user has no admin right\n"
        elif method == "GET" and path.startswith("/sow/"):
            code, ctype, body = await self._sow_query(path, query, peer_text, user)
        else:
            code, ctype, body = self._answer(method, path, lines, user)
        if self.guard.checker is not None:
            audit.admin_request(peer_text, user, method, path, code)
        if code == 200 and path == "/events":
            await self._stream(writer)
            return
        writer.write(
            f"HTTP/1.0 {code} {HTTPStatus(code).phrase}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    def _check_host(self, method: str, path: str, lines: list[bytes]) -> tuple[int, bytes] | None:
        """None when the request's Host (and, for what changes state or streams, its Origin)
        names this endpoint; else (421 or 403, why). A request without Host (HTTP/1.0 tools)
        is not a browser's and passes."""
        host = _header(lines, b"host")
        if host is not None:
            name = _authority(host, self.scheme)[0]
            if name is None or not self._allowed(name):
                return 421, (
                    f"this endpoint does not answer to Host {host!r}: use an IP address or "
                    "localhost, or list the name in <Admin><AllowedHosts>\n"
                ).encode()
        origin = _header(lines, b"origin")
        if origin is None or not (
            method == "POST" or path == "/events" or path.startswith("/sow/")
        ):
            return None
        parts = urlsplit(origin) if origin != "null" else None
        name = _authority(parts.netloc, self.scheme)[0] if parts is not None else None
        same = (
            parts is not None
            and host is not None
            and parts.scheme == self.scheme
            and _authority(parts.netloc, self.scheme) == _authority(host, self.scheme)
        )
        if not same and name not in self.named_hosts:
            return 403, (
                f"requests from origin {origin!r} are refused: use the console served by this "
                "endpoint, or a tool that sends no Origin\n"
            ).encode()
        return None

    def _allowed(self, name: str) -> bool:
        if name in self.allowed_hosts:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True  # an address is no name a rebinding page can be served under

    async def _authorize(
        self, peer: str, authorization: str | None
    ) -> tuple[str | None, int | None]:
        """(user, None) when the request may be served, else (user, 401 or 403)."""
        guard = self.guard
        checker = guard.checker
        if checker is None:
            return None, None  # no <Authentication>: the loader keeps the endpoint on loopback
        outcome = await checker.check_http(peer, authorization)
        if outcome is None:
            return None, 401
        if isinstance(outcome, AuthFailure):
            return outcome.user, 401
        if not guard.may_admin(peer, outcome.user):
            return outcome.user, 403
        return outcome.user, None

    def _answer(
        self, method: str, path: str, lines: list[bytes], user: str | None
    ) -> tuple[int, str, bytes]:
        action = None
        if method == "POST" and path.startswith("/clients/") and path.endswith("/disconnect"):
            action = self._disconnect
        elif method == "POST" and path.startswith("/actions/") and path.endswith("/run"):
            action = self._run_action
        elif method == "POST" and path.startswith("/replication/"):
            action = self._replication
        if action is not None:
            if _header(lines, b"x-requested-by") != ACTION_HEADER:
                return _text(403, f"actions need X-Requested-By: {ACTION_HEADER}\n")
            return action(path, user)
        if method != "GET":
            return _text(405, "only GET is served (and the console's POST actions)\n")
        if path == "/stats":
            body = msgspec.json.format(msgspec.json.encode(self.stats.snapshot()), indent=2)
            return 200, "application/json", body + b"\n"
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.stats.prometheus().encode()
        if path == "/events":
            return 200, "text/event-stream", b""
        if path == "/sow":
            if self.sow is None:
                return _text(404, "this instance has no SOW topics\n")
            return _json(self.sow.topics())
        if path in STATIC:
            name, ctype = STATIC[path]
            return 200, ctype, (CONSOLE / name).read_bytes()
        return _text(404, "not found: try /, /stats or /metrics\n")

    def _disconnect(self, path: str, user: str | None) -> tuple[int, str, bytes]:
        ident = path.split("/")[2]
        what = (
            self.disconnect(int(ident)) if ident.isdigit() and self.disconnect is not None else None
        )
        if what is None:
            return _text(404, "no such client (gone already?)\n")
        log.warning("admin: disconnected %s at the request of %s", what, user or "the console")
        return _json({"disconnected": what})

    def _run_action(self, path: str, user: str | None) -> tuple[int, str, bytes]:
        name = unquote(path[len("/actions/") : -len("/run")])
        what = self.run_action(name) if self.run_action is not None and name else None
        if what is None:
            return _text(404, "no such journal action\n")
        if what == "running":
            return _text(409, "that action is running already\n")
        log.warning("admin: ran action %s at the request of %s", name, user or "the console")
        return _json({"started": name})

    def _replication(self, path: str, user: str | None) -> tuple[int, str, bytes]:
        name, _, command = path[len("/replication/") :].rpartition("/")
        name = unquote(name)
        if command not in ("downgrade", "upgrade") or not name:
            return _text(404, "try POST /replication/<name>/downgrade or /upgrade\n")
        who = f"the admin ({user})" if user else "the admin"
        changed = self.replication(name, command, who) if self.replication is not None else None
        if changed is None:
            return _text(404, f"no replication destination named {name}\n")
        if not changed:
            now = (
                "not a sync destination acting as sync"
                if command == "downgrade"
                else "not downgraded"
            )
            return _text(409, f"destination {name} is {now}: nothing changed\n")
        return _json(
            {"destination": name, "mode": "downgraded" if command == "downgrade" else "sync"}
        )

    async def _sow_query(
        self, path: str, query: str, peer: str, user: str | None
    ) -> tuple[int, str, bytes]:
        """`GET /sow/<topic>?filter=&order_by=&top_n=`: the records the user may read."""
        sow = self.sow
        topic = unquote(path[len("/sow/") :])
        if sow is None or not sow.sow.is_sow(topic):
            return _text(404, f"{topic!r} is not a SOW topic of this instance\n")
        args = {k: v[-1] for k, v in parse_qs(query, max_num_fields=8).items()}
        try:
            own = compile_filter(args["filter"]) if args.get("filter") else None
            order = parse_order_by(args["order_by"]) if args.get("order_by") else None
            top_n = int(args.get("top_n") or 100)
        except (FilterError, BadOrderBy) as exc:
            return _text(400, f"{exc}\n")
        except ValueError:
            return _text(400, f"top_n is a number of records (at most {MAX_ROWS})\n")
        grant = self.guard.grant(peer, user, "subscribe", topic, False, own, "admin sow")
        if grant is None:
            return _text(403, f"user {user!r} may not read {topic!r}\n")
        try:
            answer = await sow.query(topic, grant.filter, order, top_n)
        except Exception as exc:  # the store closing under it (shutdown), or a bug: not the loop
            log.exception("admin: SOW query on %s failed", topic)
            return _text(500, f"the query failed: {exc!r}\n")
        return _json(answer)

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        """Serve /events until the page goes, its output backs up, or the endpoint stops."""
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        history = self.stats.history
        try:
            writer.write(
                b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Cache-Control: no-store\r\nConnection: close\r\n\r\n"
                b"retry: 2000\n\n" + _event(b"history", msgspec.json.encode(list(history.samples)))
            )
            if history.last() is not None:
                writer.write(self._sample_event())
            while not writer.is_closing():
                await writer.drain()
                try:
                    await asyncio.wait_for(history.next(), KEEPALIVE)
                except TimeoutError:
                    writer.write(b": keepalive\n\n")
                    continue
                if writer.transport.get_write_buffer_size() > MAX_STREAM_BUFFER:
                    log.warning("admin: closing an event stream that does not keep up")
                    break
                writer.write(self._sample_event())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._streams.discard(task)
            writer.close()

    def _sample_event(self) -> bytes:
        """The `sample` event for the latest sample, built once for every open page."""
        last = self.stats.history.last()
        assert last is not None
        if self._details[0] != last["n"]:
            body = msgspec.json.encode(
                {"instance": self.instance, "sample": last, **self.stats.details()}
            )
            self._details = (last["n"], _event(b"sample", body))
        return self._details[1]


def _text(code: int, msg: str) -> tuple[int, str, bytes]:
    return code, "text/plain", msg.encode()


def _json(obj: object) -> tuple[int, str, bytes]:
    return 200, "application/json", msgspec.json.encode(obj) + b"\n"


def _event(name: bytes, data: bytes) -> bytes:
    """One Server-Sent Event (`data` is JSON: one line, no newline in it)."""
    return b"event: " + name + b"\ndata: " + data + b"\n\n"


def _authority(authority: str, scheme: str) -> tuple[str | None, int | None]:
    """(host, port) of a `host[:port]`, the scheme's default port filled in; the host is
    lowercase (an IPv6 address without its brackets). (None, None) when it is not one."""
    try:
        parts = urlsplit("//" + authority.strip())
        port = parts.port
    except ValueError:
        return None, None
    return parts.hostname, port if port is not None else (443 if scheme == "https" else 80)


def _header(lines: list[bytes], name: bytes) -> str | None:
    """The value of header `name` (lowercase) in a request head's lines, or None."""
    for line in lines[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None
