"""A server that stores nothing of what it is sent: a reference beside bench_publish's rows.

It speaks just enough of the protocol for bench/pubsend.c: it answers the logon, counts the
publish frames it reads and answers each read with one conflated `persisted` ack for
everything counted so far (the sender's sequences run 1..n in order). No journal, no fsync, no
dedup, no parsing past the frame lengths. Whatever rate the C sender reaches against it at one
frame per send(2) and at a window per send(2) is what this machine's loopback TCP and the
sender allow a single connection, with a receiver that costs next to nothing: the ratio of the
two is the most any server could show for "one frame per send ÷ a window per send" here.

    sink = NullSink.start()       # a child process on 127.0.0.1, sink.port
    ... pubsend.run("127.0.0.1", sink.port, ...) ...
    sink.stop()
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket

from loadgen import run_coro
from loadwire import tickertape_frame

LOGON_ACK = b'{"c":"ack","a":"processed","cid":"logon","status":"success","s":0}'


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.count = -1  # the logon frame is the first one
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, n, count = 0, len(buf), self.count
        while n - pos >= 4:
            end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
            if end > n:
                break
            pos = end
            count += 1
        self.buf = buf[pos:]
        if count == self.count or self.transport is None:
            return
        out = b""
        if self.count < 0:
            out = tickertape_frame(LOGON_ACK)
        self.count = count
        if count > 0:
            out += tickertape_frame(
                b'{"c":"ack","a":"persisted","status":"success","s":%d}' % count
            )
        self.transport.write(out)


def _serve(sock: socket.socket) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Protocol, sock=sock)
        async with server:
            await server.serve_forever()

    run_coro(main())  # on uvloop when installed, as the load generator


class NullSink:
    def __init__(self, proc: multiprocessing.process.BaseProcess, port: int) -> None:
        self.proc = proc
        self.port = port

    @classmethod
    def start(cls) -> NullSink:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        proc = multiprocessing.get_context("fork").Process(target=_serve, args=(sock,))
        proc.daemon = True
        proc.start()
        port = sock.getsockname()[1]
        sock.close()
        return cls(proc, port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.join(5)
