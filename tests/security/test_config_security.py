"""The security elements of the configuration: parsing, a problem for each bad element (with its
path and line), the safe-defaults rule, and the refusal of what this build does not serve."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import config
from config import ConfigError, load_config, load_config_text, security
from config.security import is_loopback
from protocol.security.passwords import ScryptParams, set_password

EXAMPLES = Path(config.__file__).parent / "examples"
TICKERTAPE = os.path.join(os.path.dirname(sys.executable), "tickertape")
FAST = ScryptParams(n=1 << 10)


@pytest.fixture
def served(monkeypatch):
    """Check files as a build that serves everything would (only the file's own problems)."""
    monkeypatch.setattr(security, "unsupported", lambda cfg: [])


@pytest.fixture
def env(pki, tmp_path) -> dict[str, str]:
    users = tmp_path / "users.db"
    set_password(users, "alice", "pw", FAST)
    return {"D": str(pki.dir), "USERS": str(users), "TMP": str(tmp_path)}


def load(body: str, env: dict[str, str]):
    text = (
        f"<TickertapeConfig>\n<Name>x</Name>\n{textwrap.dedent(body).strip()}\n</TickertapeConfig>"
    )
    return load_config_text(text, "t.xml", env=env)


def problems(body: str, env: dict[str, str]) -> list[tuple[int, str, str]]:
    with pytest.raises(ConfigError) as info:
        load(body, env)
    return [(p.line, p.path, p.message) for p in info.value.problems]


TLS = """
<Transports><Transport><Name>t</Name><Type>tcps</Type><InetAddr>0</InetAddr>
<Certificate>${D}/server.pem</Certificate><PrivateKey>${D}/server.key</PrivateKey>
{extra}
</Transport></Transports>
"""
AUTH = "<Authentication><PasswordFile>${USERS}</PasswordFile></Authentication>"


def tls(extra: str = "") -> str:
    return TLS.replace("{extra}", extra)


# ---------------------------------------------------------------------------------------------
# TLS


def test_tcps_transport_fields(served, env):
    c = load(
        tls(
            "<CAFile>${D}/ca.pem</CAFile><VerifyClient>true</VerifyClient>"
            "<MinimumVersion>tlsv1.3</MinimumVersion><Ciphers>ECDHE+AESGCM</Ciphers>"
        ),
        env,
    )
    [t] = c.transports
    assert (t.type, t.ca_file, t.verify_client, t.minimum_version, t.ciphers) == (
        "tcps",
        f"{env['D']}/ca.pem",
        True,
        "TLSv1.3",
        "ECDHE+AESGCM",
    )
    [t] = load(tls(), env).transports
    assert (t.ca_file, t.verify_client, t.minimum_version, t.ciphers) == (
        None,
        False,
        "TLSv1.2",
        None,
    )


@pytest.mark.parametrize(
    ("version", "expect"),
    [("TLSv1.2", "TLSv1.2"), ("1.3", "TLSv1.3"), ("TLS1.3", "TLSv1.3"), ("tlsv1_2", "TLSv1.2")],
)
def test_minimum_version_spellings(served, env, version, expect):
    c = load(tls(f"<MinimumVersion>{version}</MinimumVersion>"), env)
    assert c.transports[0].minimum_version == expect


@pytest.mark.parametrize(
    ("version", "fragment"),
    [
        ("TLSv1.1", "TLS below 1.2 has known breaks"),
        ("TLSv1", "TLS below 1.2 has known breaks"),
        ("SSLv3", "TLS below 1.2 has known breaks"),
        ("TLSv2", "write TLSv1.2 or TLSv1.3"),
    ],
)
def test_minimum_version_below_1_2_is_refused(served, env, version, fragment):
    [(line, path, message)] = problems(tls(f"<MinimumVersion>{version}</MinimumVersion>"), env)
    assert path.endswith("/Transport/MinimumVersion") and fragment in message


def test_tls_elements_on_a_tcp_transport(served, env):
    found = problems(
        "<Transports><Transport><Name>t</Name><InetAddr>0</InetAddr>"
        "<CAFile>x</CAFile><VerifyClient>true</VerifyClient>"
        "<MinimumVersion>TLSv1.3</MinimumVersion><Ciphers>HIGH</Ciphers>"
        "</Transport></Transports>",
        env,
    )
    assert [p.rsplit("/", 1)[1] for _, p, _ in found] == [
        "CAFile",
        "VerifyClient",
        "MinimumVersion",
        "Ciphers",
    ]
    assert all("only used by tcps transports" in m for _, _, m in found)


def test_verify_client_needs_a_ca_file(served, env):
    [(_, path, message)] = problems(tls("<VerifyClient>true</VerifyClient>"), env)
    assert path == "/TickertapeConfig/Transports/Transport"
    assert "missing <CAFile>" in message


def test_tls_file_problems_name_the_element_and_the_file(served, env, pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("nothing\n")
    body = (
        "<Transports><Transport><Name>t</Name><Type>tcps</Type><InetAddr>0</InetAddr>"
        "<Certificate>${TMP}/nope.pem</Certificate><PrivateKey>${TMP}/nokey.pem</PrivateKey>"
        "<CAFile>${TMP}/garbage.pem</CAFile><Ciphers>NOTHING-AT-ALL</Ciphers>"
        "</Transport></Transports>"
    )
    found = problems(body, env)
    by_element = {path.rsplit("/", 1)[1]: message for _, path, message in found}
    assert set(by_element) == {"Certificate", "PrivateKey", "CAFile", "Ciphers"}
    assert by_element["Certificate"].startswith(f"{tmp_path}/nope.pem: not found")
    assert by_element["PrivateKey"].startswith(f"{tmp_path}/nokey.pem: not found")
    assert "holds no PEM certificate" in by_element["CAFile"]
    assert "selects no cipher" in by_element["Ciphers"]


def test_a_key_that_does_not_match(served, env, pki):
    body = tls("").replace("${D}/server.key", "${D}/ca.key")
    [(_, path, message)] = problems(body, env)
    assert path.endswith("/PrivateKey") and "does not belong to the certificate" in message


def test_admin_tls(served, env, pki):
    c = load(
        "<Admin><InetAddr>0</InetAddr><Certificate>${D}/server.pem</Certificate>"
        "<PrivateKey>${D}/server.key</PrivateKey></Admin>",
        env,
    )
    assert c.admin.certificate == str(pki.server_cert)
    [(_, path, message)] = problems(
        "<Admin><InetAddr>0</InetAddr><Certificate>${D}/server.pem</Certificate></Admin>", env
    )
    assert path == "/TickertapeConfig/Admin" and "missing <PrivateKey>" in message
    [(_, path, message)] = problems(
        "<Admin><InetAddr>0</InetAddr><Certificate>${D}/nope.pem</Certificate>"
        "<PrivateKey>${D}/server.key</PrivateKey></Admin>",
        env,
    )
    assert path == "/TickertapeConfig/Admin/Certificate" and "not found" in message


@pytest.mark.parametrize(
    ("element", "hint"),
    [("CAPath", "<CAFile>"), ("SecureSocketProtocols", "<MinimumVersion>")],
)
def test_amps_tls_elements_are_refused_with_our_element(served, env, element, hint):
    [(_, _, message)] = problems(tls(f"<{element}>x</{element}>"), env)
    assert "not supported by Tickertape" in message and hint in message


# ---------------------------------------------------------------------------------------------
# Authentication


def test_authentication_fields(served, env):
    c = load(
        "<Authentication><PasswordFile>${USERS}</PasswordFile><LogonTimeout>2s</LogonTimeout>"
        "<AllowAnonymous>TRUE</AllowAnonymous></Authentication>",
        env,
    )
    assert c.authentication == config.Authentication(
        password_file=env["USERS"], logon_timeout=2.0, allow_anonymous=True
    )
    assert c.limits.logon_timeout == 2.0


def test_password_file_problems(served, env, tmp_path):
    [(line, path, message)] = problems(
        "<Authentication>\n<PasswordFile>${TMP}/none.db</PasswordFile></Authentication>", env
    )
    assert (line, path) == (4, "/TickertapeConfig/Authentication/PasswordFile")
    assert "not found; create it with `tickertape passwd" in message
    (tmp_path / "bad.db").write_text("# users\nalice:scrypt$1$2$3\n")
    [(_, _, message)] = problems(
        "<Authentication><PasswordFile>${TMP}/bad.db</PasswordFile></Authentication>", env
    )
    assert f"password file {tmp_path}/bad.db:2: " in message


def test_authentication_value_problems(served, env):
    found = problems(
        "<Authentication><PasswordFile>${USERS}</PasswordFile><AllowAnonymous>yes"
        "</AllowAnonymous><LogonTimeout>0s</LogonTimeout><Module>x</Module></Authentication>",
        env,
    )
    messages = {path.rsplit("/", 1)[1]: m for _, path, m in found}
    assert "write true or false" in messages["AllowAnonymous"]
    assert "must be greater than zero" in messages["LogonTimeout"]
    assert "authentication and entitlements are built in" in messages["Module"]


def test_logon_timeout_is_one_setting(served, env):
    [(_, path, message)] = problems(
        "<LogonTimeout>3s</LogonTimeout><Authentication><PasswordFile>${USERS}</PasswordFile>"
        "<LogonTimeout>4s</LogonTimeout></Authentication>",
        env,
    )
    assert path == "/TickertapeConfig/Authentication/LogonTimeout"
    assert "given here and at the root (line 3)" in message


def test_authentication_that_accepts_nobody(served, env, pki):
    [(_, path, message)] = problems("<Authentication/>", env)
    assert path == "/TickertapeConfig/Authentication" and "accepts no logon" in message
    # client certificates are a way to log on
    load("<Authentication/>" + tls("<CAFile>${D}/ca.pem</CAFile>"), env)


# ---------------------------------------------------------------------------------------------
# Entitlement

ROLES = """
<Entitlement>
  <Role>
    <Name>desk-a</Name><Users>alice, bob</Users>
    <Publish>orders\\..*</Publish><Publish>fills</Publish>
    <Subscribe>orders\\..*</Subscribe><Replay>orders\\..*</Replay><Consume>queue\\..*</Consume>
    <Deny><Subscribe>orders\\.secret</Subscribe><Admin>true</Admin></Deny>
    <Filter><Topic>orders\\..*</Topic><Expression>/desk = 'A'</Expression></Filter>
  </Role>
  <Role><Name>ops</Name><Users>*</Users><Admin>true</Admin></Role>
</Entitlement>
"""


def test_entitlement_fields(served, env):
    c = load(AUTH + ROLES, env)
    desk, ops = c.entitlement.roles
    assert desk.name == "desk-a" and desk.users == ("alice", "bob")
    assert desk.allow == config.Rights(
        publish=(r"orders\..*", "fills"),
        subscribe=(r"orders\..*",),
        replay=(r"orders\..*",),
        consume=(r"queue\..*",),
    )
    assert desk.deny == config.Rights(subscribe=(r"orders\.secret",), admin=True)
    assert desk.filters == (config.ContentFilter(topic=r"orders\..*", expression="/desk = 'A'"),)
    assert (ops.users, ops.allow.admin, ops.deny) == (("*",), True, config.Rights())


def test_entitlement_problems(served, env):
    body = AUTH + textwrap.dedent(
        """
        <Entitlement>
          <Role><Name>a</Name><Users>x,,y</Users><Publish>bad(</Publish></Role>
          <Role><Name>a</Name><Users>z</Users><Deny><Replay>(?=x)</Replay></Deny></Role>
          <Role><Users>z</Users><User>q</User>
            <Filter><Topic>t</Topic><Expression>/a = = 1</Expression></Filter>
            <Filter><Expression>/a = 1</Expression></Filter>
          </Role>
          <Role><Name>b</Name></Role>
          <Module>m</Module>
        </Entitlement>
        """
    )
    found = problems(body, env)
    got = [(line, path.removeprefix("/TickertapeConfig/Entitlement/")) for line, path, _ in found]
    assert got == [
        (5, "Role[1]/Users"),
        (5, "Role[1]/Publish"),
        (6, "Role[2]"),
        (6, "Role[2]/Deny/Replay"),
        (7, "Role[3]/User"),
        (7, "Role[3]"),
        (8, "Role[3]/Filter[1]/Expression"),
        (9, "Role[3]/Filter[2]"),
        (11, "Role[4]"),
        (12, "Module"),
    ]
    messages = [m for _, _, m in found]
    assert "empty user name" in messages[0]
    assert "invalid regular expression 'bad('" in messages[1]
    assert messages[2] == "role name 'a' is already used at line 5; give each role its own <Name>"
    assert "lookaround" in messages[3] or "not supported" in messages[3]
    assert "did you mean <Users>?" in messages[4]
    assert "missing <Name>" in messages[5]
    assert "bad filter at position" in messages[6]
    assert "missing <Topic>" in messages[7]
    assert "missing <Users>" in messages[8]
    assert "built in" in messages[9]


def test_entitlement_needs_authentication(served, env):
    [(_, path, message)] = problems(ROLES, env)
    assert path == "/TickertapeConfig/Entitlement"
    assert "needs <Authentication>" in message


# ---------------------------------------------------------------------------------------------
# Safe defaults


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "[::1]", "localhost"])
def test_loopback_needs_no_authentication(env, host):
    load(f"<Transports><Transport><Name>t</Name><InetAddr>{host}:0</InetAddr></Transport>"
         f"</Transports><Admin><InetAddr>{host}:0</InetAddr></Admin>", env)  # fmt: skip


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "10.1.2.3", "example.com"])
def test_non_loopback_without_authentication_is_refused(env, host):
    found = problems(
        f"<Transports><Transport><Name>t</Name><InetAddr>{host}:9007</InetAddr></Transport>"
        f"</Transports><Admin><InetAddr>{host}:8085</InetAddr></Admin>",
        env,
    )
    assert [p for _, p, _ in found] == [
        "/TickertapeConfig/Transports/Transport/InetAddr",
        "/TickertapeConfig/Admin/InetAddr",
    ]
    assert "this transport listens on" in found[0][2] and "is not loopback" in found[0][2]
    assert "the admin endpoint listens on" in found[1][2]
    assert "<AllowAnonymous>true</AllowAnonymous>" in found[0][2]


def test_allow_anonymous_accepts_an_open_server(env):
    c = load(
        "<Transports><Transport><Name>t</Name><InetAddr>0.0.0.0:9007</InetAddr></Transport>"
        "</Transports><Authentication><AllowAnonymous>true</AllowAnonymous></Authentication>",
        env,
    )
    assert c.authentication.allow_anonymous and security.unsupported(c) == []


def test_the_embedded_default_is_loopback_and_needs_nothing():
    c = config.default_config()
    assert all(is_loopback(t.host) for t in c.transports) and is_loopback(c.admin.host)
    assert c.authentication is None and c.entitlement is None
    assert security.unsupported(c) == []


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("host")


# ---------------------------------------------------------------------------------------------
# Fail closed: what this build does not serve


def test_every_security_feature_is_served_now(env, pki):
    """Nothing security-related is refused as not served any more (TLS, authentication,
    entitlements are wired into the server); `unsupported` stays the one place to refuse a
    future feature until the server serves it."""
    body = (
        tls("")
        + "<Admin><InetAddr>0</InetAddr><Certificate>${D}/server.pem</Certificate>"
        + "<PrivateKey>${D}/server.key</PrivateKey></Admin>"
        + AUTH
        + ROLES
    )
    c = load(body, env)
    assert security.unsupported(c) == []
    assert c.transports[0].type == "tcps" and c.admin.certificate and c.entitlement


def test_anonymous_only_authentication_is_served(env):
    c = load("<Authentication><AllowAnonymous>true</AllowAnonymous></Authentication>", env)
    assert security.unsupported(c) == []


def secure_copy(tmp_path: Path, pki) -> Path:
    (tmp_path / "tls").mkdir()
    shutil.copy(pki.server_cert, tmp_path / "tls" / "server.pem")
    shutil.copy(pki.server_key, tmp_path / "tls" / "server.key")
    shutil.copy(pki.ca, tmp_path / "tls" / "ca.pem")
    for user in ("alice", "bob", "carol", "root"):
        set_password(tmp_path / "users.db", user, f"{user}-pw", FAST)
    shutil.copy(EXAMPLES / "secure.xml", tmp_path / "secure.xml")
    return tmp_path / "secure.xml"


def test_secure_example_is_valid_and_means_what_it_says(tmp_path, pki, monkeypatch):
    path = secure_copy(tmp_path, pki)
    with monkeypatch.context() as m:
        m.setattr(security, "unsupported", lambda cfg: [])
        c = load_config(path, env={})
    tls_t, local = c.transports
    assert (tls_t.type, tls_t.host, tls_t.ca_file) == ("tcps", "0.0.0.0", f"{tmp_path}/tls/ca.pem")
    assert local.type == "tcp" and c.admin.certificate == f"{tmp_path}/tls/server.pem"
    assert c.limits.logon_timeout == 5.0
    assert [r.name for r in c.entitlement.roles] == ["market-data", "desk-a", "risk", "ops"]
    assert config.verify_config(path, env={}) == []  # every part of it is served


def test_verify_config_accepts_the_secure_example(tmp_path, pki):
    path = secure_copy(tmp_path, pki)
    done = subprocess.run(
        [TICKERTAPE, "serve", "--verify-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done
    assert "configuration is valid" in done.stdout
