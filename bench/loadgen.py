"""One lean load generator for every server under test, so the client is not what is measured.

Design (the same for Tickertape, NATS JetStream and Redis Streams):
  - raw protocol over asyncio.Protocol (uvloop when installed), one event loop, one process;
  - every publish frame / command is built before the clock starts, into ONE bytes buffer with
    an offsets array: sending frames [i, j) is one slice and one transport.write;
  - a bounded in-flight window (default 1000 unacked messages): the publisher sends whatever
    the window allows each time acks arrive, so writes are batched by the ack rhythm;
  - replies are parsed in data_received over one bytearray with bytes.find / struct.unpack_from;
    no per-message task, future, dict or object beyond what the wire format forces.

Bodies are JSON of exactly `size` bytes: {"seq":0000000042,"pad":"xxx..."}; the sequence sits at
body[7:17] so a latency subscriber reads it without decoding JSON.

The parts, one object each: loadwire.py (pre-built frames, the connection plumbing, the
publishing and subscribing halves), loadconns.py (one connection class per wire protocol),
this module (the runs); the names are re-exported here: benchmarks write loadgen.X.
"""

from __future__ import annotations

import asyncio
import time
from array import array

try:
    import uvloop  # the client loop; the same for every peer
except ImportError:  # pragma: no cover
    uvloop = None

from loadconns import NatsConn, RedisConn, TickertapeConn
from loadwire import (  # noqa: F401 (re-exported: the benchmarks use loadgen.X)
    _U32,
    Frames,
    ProtocolError,
    _Conn,
    _now_ns,
    build_publish_frames,
    resp_command,
    tickertape_frame,
)

# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def loop_name() -> str:
    return f"uvloop {uvloop.__version__}" if uvloop is not None else "asyncio"


async def _connect(factory, host: str, port: int, timeout: float, ssl=None):
    """ssl: an ssl.SSLContext for a TLS server (bench_security), None for plain TCP."""
    loop = asyncio.get_running_loop()
    conn = loop.create_connection(
        factory, host, port, ssl=ssl, server_hostname="localhost" if ssl else None
    )
    _t, proto = await asyncio.wait_for(conn, timeout)
    try:
        await asyncio.wait_for(asyncio.shield(proto.ready), timeout)
    except BaseException:
        proto.close()
        raise
    return proto


def _pub_factory(proto: str, dest: str, tag: str, body_size: int):
    if proto == "tickertape":
        return lambda: TickertapeConn(f"bench-pub-{tag}", body_size=body_size)
    if proto == "nats":
        return lambda: NatsConn(inbox=f"_INBOX.bench.{tag}")
    return lambda: RedisConn(dest)


def _sub_factory(proto: str, dest: str, i: int, tag: str, body_size: int, redis_count: int):
    def f():
        if proto == "tickertape":
            c = TickertapeConn(f"bench-sub-{tag}-{i}", dest, f"s{i}", body_size)
        else:
            c = NatsConn(subject=dest) if proto == "nats" else RedisConn(dest, count=redis_count)
        c.role = "sub"
        return c

    return f


async def run(
    proto: str,
    host: str,
    port: int,
    *,
    n: int,
    pub_dest: str,
    sub_dests: list[str] = (),
    body_size: int = 100,
    window: int = 1000,
    rate: float = 0.0,
    warmup_msgs: int = 0,
    timeout: float = 120.0,
    tag: str = "0",
    redis_count: int = 1000,
    on_start=None,
    ssl=None,
    per_send: int = 0,
    ack_latency: bool = False,
) -> dict:
    """One publisher of n messages and len(sub_dests) subscribers (each expects all n).
    `ssl`: connect over TLS with this context (Tickertape tcps transports).

    Returns counts, elapsed seconds (first send to last ack / last delivery), client CPU
    seconds, errors, and latencies (ns, array) when rate > 0 and there is a subscriber.
    A run that passes `timeout` stops and reports what it got, with timed_out=True.
    on_start() is called just before the first publish (the caller reads server CPU there).
    per_send: frames per write (0: the whole window's worth in one write). ack_latency: the
    publisher's send -> ack times (ns, array) in "ack_latency_ns".
    """
    frames = build_publish_frames(proto, pub_dest, n, body_size, inbox=f"_INBOX.bench.{tag}")
    subs = []
    conns = []
    try:
        for i, d in enumerate(sub_dests):
            s = await _connect(
                _sub_factory(proto, d, i, tag, body_size, redis_count), host, port, 30, ssl
            )
            conns.append(s)
            subs.append(s)
        pub = await _connect(_pub_factory(proto, pub_dest, tag, body_size), host, port, 30, ssl)
        conns.append(pub)
        if proto == "tickertape" and pub.logon_s:
            raise ProtocolError(f"publisher name already has sequence {pub.logon_s} stored")
        pub.setup_publisher(frames, window, rate, per_send, ack_latency)
        for s in subs:
            s.setup_subscriber(n, pub.send_ns if rate > 0 else None, warmup_msgs)
            if proto == "redis":
                s.start_reading()
            else:
                s.running = True
        if on_start is not None:
            on_start()
        cpu0 = time.process_time()  # this process: user + system, every thread
        pub.start_publishing()
        waits = [pub.done] + [s.done for s in subs]
        done, pending = await asyncio.wait(
            waits, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        failed = [f for f in done if f.exception() is not None]
        timed_out = bool(pending) and not failed
        t_end = _now_ns()
        errors = [c.error for c in conns if c.error]
        t_pub = (pub.t_end or t_end) - pub.t_start
        t_all = max([pub.t_end or t_end] + [s.t_last or t_end for s in subs]) - pub.t_start
        out = {
            "sent": pub.sent,
            "acked": pub.acked,
            "pub_errors": pub.errors,
            "received": sum(s.received for s in subs),
            "pub_seconds": t_pub / 1e9,
            "seconds": t_all / 1e9,
            "client_cpu": time.process_time() - cpu0,
            "timed_out": timed_out,
            "errors": errors,
        }
        if pub.ack_lat is not None:
            out["ack_latency_ns"] = pub.ack_lat
        if rate > 0 and subs:
            lat = array("q")
            for s in subs:
                lat.extend(s.lat)
            out["latency_ns"] = lat
        return out
    finally:
        for c in conns:
            c.close()
        await asyncio.sleep(0)


def run_coro(coro, uv: bool = True):
    """coro to completion on a fresh client loop (uvloop when installed, unless not uv), closed
    after."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop if uv and uvloop else None) as r:
        return r.run(coro)


def run_sync(*args, **kw) -> dict:
    return run_coro(run(*args, **kw))
