"""The HTTP admin endpoint (`<Admin><InetAddr>`): server statistics as JSON and Prometheus text.

    GET /            a short index
    GET /stats       JSON (Stats.snapshot)
    GET /metrics     Prometheus text exposition format 0.0.4

A deliberately small HTTP/1.0 responder on asyncio (one request per connection, request head
bounded to 8 KiB, 5 s to send it): the endpoint serves monitoring, not traffic.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from .stats import Stats

log = logging.getLogger("tickertape.admin")
MAX_HEAD = 8192


class AdminEndpoint:
    def __init__(self, stats: Stats, instance: str, host: str, port: int) -> None:
        self.stats = stats
        self.instance = instance
        self.host = host
        self.port = port
        self._srv: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._srv = await asyncio.start_server(
            self._handle, self.host, self.port, reuse_address=True
        )
        self.host, self.port = self._srv.sockets[0].getsockname()[:2]
        log.info("admin endpoint on http://%s:%d/stats and /metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._srv is not None:
            self._srv.close()

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
        line = head[:MAX_HEAD].split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
        if len(parts) < 2 or parts[0] != "GET":
            status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET is served\n"
        elif path == "/stats":
            status, ctype = "200 OK", "application/json"
            body = msgspec.json.format(msgspec.json.encode(self.stats.snapshot()), indent=2) + b"\n"
        elif path == "/metrics":
            status, ctype = "200 OK", "text/plain; version=0.0.4"
            body = self.stats.prometheus().encode()
        elif path == "/":
            status, ctype = "200 OK", "text/plain"
            body = (
                f"tickertape {self.instance}: GET /stats (JSON) or /metrics (Prometheus)\n".encode()
            )
        else:
            status, ctype, body = (
                "404 Not Found",
                "text/plain",
                b"not found: try /stats or /metrics\n",
            )
        writer.write(
            f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        try:
            await writer.drain()
        except ConnectionError:
            pass
        writer.close()
