"""Replication links with TLS and authentication, between two real server processes (docs:
the "Replication" sections of docs/configuration.md and docs/replication.md). tt-b's
replication transport serves TLS with a certificate made by `openssl` (tests/security/certs.py)
and tt-b has <Authentication>: tt-a's destination connects with TLS, verifies tt-b against the
test CA, and logs on as a user with admin rights. A wrong password, or a user without admin
rights, is refused with an ERROR log on both ends, and nothing is replicated."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.security.certs import make_pki
from tests.security.servers import users_file
from tests.support.cluster import free_port, wait_until
from tests.support.proc import ServerProcess
from tests.support.raw import publish_many

LOG = "<Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target></Logging>"
TOPICS = "<Topic><Name>orders.*</Name><MessageType>json</MessageType></Topic>"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _b_config(d, pki, repl_port: int, tls: bool) -> str:
    tls_xml = (
        f"<Certificate>{pki.server_cert}</Certificate><PrivateKey>{pki.server_key}</PrivateKey>"
        if tls
        else ""
    )
    return f"""<TickertapeConfig>
  <Name>tt-b</Name>
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>
    <Transport><Name>repl-in</Name><Type>replication</Type>
      <InetAddr>127.0.0.1:{repl_port}</InetAddr>{tls_xml}</Transport>
  </Transports>
  {LOG}
  <TransactionLog><JournalDirectory>{d}/journal</JournalDirectory>{TOPICS}</TransactionLog>
  <Authentication><PasswordFile>{d}/users.db</PasswordFile></Authentication>
  <Entitlement>
    <Role><Name>ops</Name><Users>repl</Users><Admin>true</Admin></Role>
    <Role><Name>desk</Name><Users>pleb</Users><Publish>.*</Publish></Role>
  </Entitlement>
</TickertapeConfig>
"""


def _a_config(d, pki, repl_port: int, user: str, password: str, tls: bool) -> str:
    (d / "link.pw").write_text(password + "\n")
    (d / "link.pw").chmod(0o600)
    tls_xml = f"<TLS>true</TLS><CAFile>{pki.ca}</CAFile>" if tls else ""
    return f"""<TickertapeConfig>
  <Name>tt-a</Name>
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>
  </Transports>
  <Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
  {LOG}
  <TransactionLog><JournalDirectory>{d}/journal</JournalDirectory>{TOPICS}</TransactionLog>
  <Replication><Destination>
    <Name>tt-b</Name><SyncType>async</SyncType>
    <Transport><InetAddr>127.0.0.1:{repl_port}</InetAddr><Type>replication</Type>{tls_xml}</Transport>
    {TOPICS}
    <User>{user}</User><PasswordFile>{d}/link.pw</PasswordFile>
  </Destination></Replication>
</TickertapeConfig>
"""


def pair(tmp_path, pki, user: str, password: str, tls: bool = True):
    da, db = tmp_path / "a", tmp_path / "b"
    da.mkdir()
    db.mkdir()
    users_file(db / "users.db", {"repl": "s3cret", "pleb": "pleb-pw"})
    port = free_port()
    b = ServerProcess(db, config_xml=_b_config(db, pki, port, tls)).start()
    a = ServerProcess(da, config_xml=_a_config(da, pki, port, user, password, tls))
    return a.start(), b


def dest(a: ServerProcess) -> dict:
    url = f"http://127.0.0.1:{a.admin_port}/stats"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["replication"]["destinations"].get("tt-b", {})


def test_tls_link_with_an_admin_user_replicates(tmp_path, pki):
    a, b = pair(tmp_path, pki, "repl", "s3cret")
    try:
        wait_until(lambda: dest(a).get("connected"), 20, "TLS link up")
        b.wait_for_log(r"replication link from tt-a .*resuming at 0")
        publish_many(a.port, "orders", [json.dumps({"i": i}) for i in range(20)]).close()
        end = wait_until(lambda: dest(a).get("lag_bytes") == 0 and dest(a)["acked_position"], 20)
        assert end > 0
    finally:
        a.kill()
        b.kill()


@pytest.mark.parametrize(
    ("user", "password", "reason"),
    [("repl", "wrong", "auth failure"), ("pleb", "pleb-pw", "may not replicate")],
)
def test_refused_logon_is_logged_on_both_ends(tmp_path, pki, user, password, reason):
    a, b = pair(tmp_path, pki, user, password)
    try:
        b.wait_for_log(rf"ERROR .*replication link from tt-a .*refused: .*{reason}", 20)
        a.wait_for_log(rf"ERROR .*replication to tt-b refused: .*{reason}", 20)
        assert not dest(a).get("connected")
        assert "resuming at" not in b.output()
    finally:
        a.kill()
        b.kill()


def test_tls_link_to_a_certificate_the_source_does_not_trust_never_comes_up(tmp_path, pki):
    other = make_pki(tmp_path / "other")  # the same names, another CA: tt-a trusts pki.ca only
    da, db = tmp_path / "a", tmp_path / "b"
    da.mkdir()
    db.mkdir()
    users_file(db / "users.db", {"repl": "s3cret"})
    port = free_port()
    b = ServerProcess(db, config_xml=_b_config(db, other, port, True)).start()
    a = ServerProcess(da, config_xml=_a_config(da, pki, port, "repl", "s3cret", True)).start()
    try:
        publish_many(a.port, "orders", [b"{}"]).close()
        a.wait_for_log(r"ERROR .*replication to tt-b: TLS with .*certificate verify failed", 20)
        assert not dest(a).get("connected") and "resuming at" not in b.output()
    finally:
        a.kill()
        b.kill()
