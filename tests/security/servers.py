"""Real server processes with security configured, and raw-protocol clients over TLS.

    secure_config(directory, pki, ...)  a configuration: a `tcps` transport first (its port is
                                        the one `ServerProcess.port` reads), a plain `tcp` one
                                        on loopback, an admin endpoint, a journal, a queue
    ports(server)                       {transport name: port} from the log
    TlsRaw(port, ctx)                   tests/support/raw.Raw over TLS
    admin_get(server, path, ...)        one admin endpoint request: (status, headers, body)

The server's certificate and key are copied into the server's directory, so a test can rotate
them there.
"""

from __future__ import annotations

import base64
import http.client
import re
import shutil
import socket
import ssl
import time
from pathlib import Path

from protocol.security.passwords import ScryptParams, set_password, set_token
from protocol.security.tls import client_context
from tests.support.proc import ServerProcess
from tests.support.raw import Raw

FAST = ScryptParams(n=1 << 10, r=8, p=1)  # cheap hashes: the tests check rules, not cost
LOG = "<Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target></Logging>"


def secure_config(
    directory: Path,
    pki,
    *,
    verify_client: bool = False,
    ca: bool = True,
    authentication: str = "",
    entitlement: str = "",
    extra: str = "",
    admin: str = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>",
) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(pki.server_cert, directory / "server.pem")
    shutil.copy(pki.server_key, directory / "server.key")
    ca_xml = f"<CAFile>{pki.ca}</CAFile>" if ca else ""
    verify = f"<VerifyClient>{'true' if verify_client else 'false'}</VerifyClient>" if ca else ""
    return f"""<TickertapeConfig>
  <Name>tt-sec</Name>
  <Transports>
    <Transport><Name>tls</Name><Type>tcps</Type><InetAddr>127.0.0.1:0</InetAddr>
      <Certificate>{directory}/server.pem</Certificate><PrivateKey>{directory}/server.key</PrivateKey>
      {ca_xml}{verify}</Transport>
    <Transport><Name>plain</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>
  </Transports>
  {admin}
  {LOG}
  <TransactionLog><JournalDirectory>{directory}/journal</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  <SOW><Queue><Name>queue.work</Name><UnderlyingTopic>work</UnderlyingTopic>
    <LeasePeriod>30s</LeasePeriod></Queue></SOW>
  {authentication}
  {entitlement}
  {extra}
</TickertapeConfig>
"""


def start(directory: Path, config_xml: str, loop: str = "uvloop") -> ServerProcess:
    return ServerProcess(directory, config_xml=config_xml, args=("--loop", loop)).start()


def ports(server: ServerProcess) -> dict[str, int]:
    """{transport name: port} from the `listening on HOST:PORT (transport NAME ...` lines."""
    found = {}
    for line in server.lines:
        m = re.search(r"listening on [\d.]+:(\d+) \(transport (\S+),", line)
        if m:
            found[m.group(2)] = int(m.group(1))
    return found


def trusting(pki, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A client context that trusts the test CA, with a client certificate if given."""
    if cert is None:
        return client_context(ca_file=str(pki.ca))
    return client_context(ca_file=str(pki.ca), certificate=str(cert[0]), private_key=str(cert[1]))


class TlsRaw(Raw):
    """Raw over TLS (the server's name is `localhost`)."""

    def __init__(self, port: int, ctx: ssl.SSLContext, timeout: float = 10.0):
        plain = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = ctx.wrap_socket(plain, server_hostname="localhost")
        self.sock.settimeout(timeout)
        self.buf = b""
        self.cid = 0
        self.pending = []

    def closed(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except TimeoutError:
            return False
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
            return True


def users_file(path: Path, users: dict[str, str], tokens: tuple[str, ...] = ()) -> dict[str, str]:
    """A password file with these users and passwords; returns {user: bearer token}."""
    for user, password in users.items():
        set_password(path, user, password, FAST)
    return {user: set_token(path, user) for user in tokens}


def admin_get(
    server: ServerProcess,
    path: str = "/stats",
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    ctx: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    headers = {}
    if user is not None:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    assert server.admin_port is not None
    if ctx is not None:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "localhost", server.admin_port, context=ctx, timeout=10
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", server.admin_port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)
