"""The TLS acceptor in-process (server/tls_accept.py), on asyncio and uvloop: a handshake whose
first bytes arrive before the upgrade task runs (uvloop reads a new connection whatever its
`connection_made` paused) still completes, with those bytes handed to the TLS protocol first."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest
import uvloop

from protocol.security.tls import ServerTls, client_context, server_context
from server.admission import Admission
from server.connection import ConnectionEnv, Connections
from server.intake import Intake
from server.tls_accept import TlsAcceptor, _Handshake
from tests.server.core_harness import Core


def frame(header: dict) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack(">I", len(h)) + h


async def scenario(tmp_path, pki, delay: float) -> tuple[dict, list[int]]:
    loop = asyncio.get_running_loop()
    core = Core(tmp_path, loop)
    env = ConnectionEnv(
        registry=Connections(),
        intake=Intake(core.config.limits),
        counters=core.counters,
        services=core.services,
        max_logon_message_size=65536,
        max_client_buffer=1 << 24,
        offline_threshold=1 << 22,
        input_seen=lambda now: None,
        admission=Admission(core.config.limits, {}),
    )
    ctx = server_context(ServerTls(str(pki.server_cert), str(pki.server_key)))
    acceptor = TlsAcceptor(env, "tls", 1 << 20, ctx, 5.0)
    early: list[int] = []
    original = TlsAcceptor.upgrade

    async def late_upgrade(self: TlsAcceptor, hs: _Handshake) -> None:
        await asyncio.sleep(delay)  # the client's ClientHello is on its way meanwhile
        early.append(sum(map(len, hs.early)))
        await original(self, hs)

    acceptor.upgrade = late_upgrade.__get__(acceptor)  # type: ignore[method-assign]
    srv = await loop.create_server(acceptor.protocol, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(ca_file=str(pki.ca)), server_hostname="localhost"
        )
        writer.write(frame({"c": "logon", "client_name": "early", "a": "processed", "cid": "1"}))
        (n,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))
        ack = json.loads(await reader.readexactly(n))
        writer.close()
        return ack, early
    finally:
        srv.close()
        await core.aclose()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_bytes_read_before_the_upgrade_go_to_the_handshake(tmp_path, pki, loop_kind):
    run = uvloop.run if loop_kind == "uvloop" else asyncio.run
    ack, early = run(scenario(tmp_path, pki, delay=0.2))
    assert ack["status"] == "success" and ack["client_name"] == "early"
    if loop_kind == "uvloop":
        assert early[0] > 0  # the ClientHello came before the task: the case under test
    else:
        assert early == [0]  # asyncio honours the pause in connection_made
