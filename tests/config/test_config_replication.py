"""The loader's replication part: `<Group>`, `<Replication>`, the replication transport type.

Problems are checked by (line, path) and a fragment of the message that says what to do.
"""

import textwrap

import pytest

from config import ConfigError, load_config_text
from config.model import ReplicationAddress, ReplicationDestination, TopicSpec
from tests.security.certs import make_pki

HEAD = """\
<Transports>
  <Transport><Name>c</Name><InetAddr>127.0.0.1:9007</InetAddr></Transport>
  <Transport><Name>r</Name><Type>replication</Type><InetAddr>127.0.0.1:9010</InetAddr></Transport>
</Transports>
<TransactionLog><JournalDirectory>j</JournalDirectory><Topic><Name>.*</Name></Topic></TransactionLog>
"""  # lines 3..7 of the document; the body starts at line 8


def load(body: str, head: str = HEAD):
    text = f"<TickertapeConfig>\n<Name>tt-1</Name>\n{head}{textwrap.dedent(body).strip()}\n"
    return load_config_text(text + "</TickertapeConfig>\n", "t.xml", env={})


def problems(body: str, head: str = HEAD) -> list[tuple[int, str, str]]:
    with pytest.raises(ConfigError) as info:
        load(body, head)
    return [(p.line, p.path, p.message) for p in info.value.problems]


def one_problem(body: str, head: str = HEAD) -> tuple[int, str, str]:
    found = problems(body, head)
    assert len(found) == 1, found
    return found[0]


def dest(inner: str = "", name: str = "tt-2", sync: str = "sync", port: int = 9020) -> str:
    return (
        f"<Destination><Name>{name}</Name><SyncType>{sync}</SyncType>"
        f"<Transport><InetAddr>127.0.0.1:{port}</InetAddr></Transport>"
        f"<Topic><Name>.*</Name></Topic>{inner}</Destination>"
    )


def test_the_contract_example_loads():
    c = load(
        """
        <Group>ny</Group>
        <Replication>
          <Destination>
            <Name>tt-2</Name>
            <Group>ny</Group>
            <SyncType>sync</SyncType>
            <Transport><InetAddr>127.0.0.1:9020</InetAddr><Type>replication</Type></Transport>
            <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
            <PassThrough>.*</PassThrough>
            <DowngradeAfter>30s</DowngradeAfter>
          </Destination>
        </Replication>
        """
    )
    assert c.group == "ny"
    assert [t.type for t in c.transports] == ["tcp", "replication"]
    assert c.replication.queue_owner_failover == 30.0
    assert c.replication.destinations == (
        ReplicationDestination(
            name="tt-2",
            group="ny",
            sync=True,
            addresses=(ReplicationAddress(host="127.0.0.1", port=9020),),
            topics=(TopicSpec(name=".*"),),
            pass_through=".*",
            downgrade_after=30.0,
        ),
    )


def test_defaults_and_synonyms():
    c = load(
        """
        <Replication>
          <QueueOwnerFailover>5s</QueueOwnerFailover>
          <Destination><Name>tt-2</Name><SyncType>ASYNC</SyncType>
            <Transport><InetAddr>9020</InetAddr><Type>amps-replication</Type></Transport>
            <Transport><InetAddr>host-b:9020</InetAddr></Transport>
            <Topic><Name>orders</Name></Topic><Topic><Name>md\\..*</Name></Topic>
          </Destination>
        </Replication>
        """,
        HEAD.replace("<Type>replication</Type>", "<Type>amps-replication</Type>"),
    )
    assert c.group is None
    assert c.transports[1].type == "replication"
    [d] = c.replication.destinations
    assert (d.group, d.sync, d.pass_through, d.downgrade_after, d.user) == (
        "tt-2",
        False,
        None,
        None,
        None,
    )
    assert [(a.host, a.port) for a in d.addresses] == [("127.0.0.1", 9020), ("host-b", 9020)]
    assert [t.name for t in d.topics] == ["orders", "md\\..*"]
    assert c.replication.queue_owner_failover == 5.0


def test_no_replication():
    c = load("")
    assert c.replication.destinations == () and c.group is None


@pytest.mark.parametrize(
    ("body", "line", "path", "fragment"),
    [
        (
            dest(sync="semi"),
            8,
            "/TickertapeConfig/Replication/Destination/SyncType",
            "invalid value 'semi'; use one of: sync, async",
        ),
        (
            "<Destination><Name>tt-2</Name><SyncType>sync</SyncType>"
            "<Topic><Name>.*</Name></Topic></Destination>",
            8,
            "/TickertapeConfig/Replication/Destination",
            "missing <Transport> in <Destination>; add <Transport>...</Transport> with the "
            "<InetAddr> of the destination's replication transport",
        ),
        (
            "<Destination><Name>tt-2</Name><SyncType>sync</SyncType>"
            "<Transport><InetAddr>9020</InetAddr></Transport></Destination>",
            8,
            "/TickertapeConfig/Replication/Destination",
            "missing <Topic> in <Destination>; add <Topic>...</Topic> with a <Name> regex",
        ),
        (
            "<Destination><SyncType>sync</SyncType><Transport><InetAddr>9020</InetAddr>"
            "</Transport><Topic><Name>.*</Name></Topic></Destination>",
            8,
            "/TickertapeConfig/Replication/Destination",
            "missing <Name> in <Destination>",
        ),
        (
            "<Destination><Name>tt-2</Name><Transport><InetAddr>9020</InetAddr>"
            "</Transport><Topic><Name>.*</Name></Topic></Destination>",
            8,
            "/TickertapeConfig/Replication/Destination",
            "missing <SyncType> in <Destination>; add <SyncType>...</SyncType> (sync or async)",
        ),
        (
            dest("<Topic><Name>(a</Name></Topic>"),
            8,
            "/TickertapeConfig/Replication/Destination/Topic[2]/Name",
            "invalid regular expression '(a'",
        ),
        (
            dest("<PassThrough>[</PassThrough>"),
            8,
            "/TickertapeConfig/Replication/Destination/PassThrough",
            "<PassThrough> is a regular expression over group names",
        ),
        (
            dest(name="tt-1"),
            8,
            "/TickertapeConfig/Replication/Destination/Name",
            "destination 'tt-1' is this instance's own <Name>",
        ),
        (
            dest() + "\n" + dest(port=9030),
            9,
            "/TickertapeConfig/Replication/Destination[2]",
            "destination name 'tt-2' is already used at line 8; one <Destination> per instance",
        ),
        (
            dest() + "\n" + dest(name="tt-3"),
            9,
            "/TickertapeConfig/Replication/Destination[2]/Transport/InetAddr",
            "127.0.0.1:9020 is already a destination's address at line 8",
        ),
        (
            dest(port=9010),
            8,
            "/TickertapeConfig/Replication/Destination/Transport/InetAddr",
            "127.0.0.1:9010 is this instance's own replication transport 'r'",
        ),
        (
            dest("<DowngradeAfter>10s</DowngradeAfter>", sync="async"),
            8,
            "/TickertapeConfig/Replication/Destination/DowngradeAfter",
            "<DowngradeAfter> applies to sync destinations only",
        ),
        (
            dest("<DowngradeAfter>0s</DowngradeAfter>"),
            8,
            "/TickertapeConfig/Replication/Destination/DowngradeAfter",
            "must be greater than zero",
        ),
        (
            dest("<User>tt-1</User>"),
            8,
            "/TickertapeConfig/Replication/Destination",
            "missing <PasswordFile> in <Destination>",
        ),
        (
            dest().replace("127.0.0.1:9020", "0.0.0.0:9020"),
            8,
            "/TickertapeConfig/Replication/Destination/Transport/InetAddr",
            "cannot be connected to; give the destination's host name or address",
        ),
        (
            dest().replace("127.0.0.1:9020", "127.0.0.1:0"),
            8,
            "/TickertapeConfig/Replication/Destination/Transport/InetAddr",
            "port 0",
        ),
        (
            dest().replace("</InetAddr>", "</InetAddr><Type>tcp</Type>"),
            8,
            "/TickertapeConfig/Replication/Destination/Transport/Type",
            "a destination's <Transport> is a replication link, not 'tcp'; write "
            "<Type>replication</Type>",
        ),
        (
            dest().replace("</InetAddr>", "</InetAddr><CAFile>ca.pem</CAFile>"),
            8,
            "/TickertapeConfig/Replication/Destination/Transport/CAFile",
            "<CAFile> is only used over TLS; add <TLS>true</TLS> or remove it",
        ),
        (
            dest().replace("</InetAddr>", "</InetAddr><Name>x</Name>"),
            8,
            "/TickertapeConfig/Replication/Destination/Transport/Name",
            "<Name> is not supported by Tickertape (a destination's transports are tried in "
            "order; they have no name)",
        ),
        (
            dest("<Frob/>"),
            8,
            "/TickertapeConfig/Replication/Destination/Frob",
            "unknown element <Frob> in <Destination>; allowed here: <Name>",
        ),
        (
            dest("<Sync>sync</Sync>"),
            8,
            "/TickertapeConfig/Replication/Destination/Sync",
            "did you mean <SyncType>?",
        ),
        (
            "<QueueOwnerFailover>soon</QueueOwnerFailover>",
            8,
            "/TickertapeConfig/Replication/QueueOwnerFailover",
            "invalid interval 'soon'",
        ),
    ],
)
def test_destination_problems(body, line, path, fragment):
    got_line, got_path, message = one_problem(f"<Replication>{body}\n</Replication>")
    assert (got_line, got_path) == (line, path)
    assert fragment in message


def test_a_literal_topic_must_be_recorded():
    head = HEAD.replace("<Name>.*</Name>", "<Name>orders</Name>")
    body = dest().replace("<Name>.*</Name>", "<Name>trades</Name>")
    line, path, message = one_problem(f"<Replication>\n{body}\n</Replication>", head)
    assert path == "/TickertapeConfig/Replication/Destination/Topic/Name"
    assert "add <Topic><Name>trades</Name></Topic> to <TransactionLog>" in message


def test_replication_needs_a_journal():
    head = HEAD.split("<TransactionLog>")[0]
    found = problems(f"<Replication>\n{dest()}\n</Replication>", head)
    assert [p for _, p, _ in found] == ["/TickertapeConfig", "/TickertapeConfig/Replication"]
    assert "a replication transport receives messages into the journal" in found[0][2]
    assert "there is no <TransactionLog>; add one" in found[1][2]


def test_group_name_is_checked():
    assert "invalid instance name" in one_problem("<Group>n y</Group>")[2]


def test_the_password_file(tmp_path):
    pw = tmp_path / "pw"
    body = dest(f"<User>tt-1</User><PasswordFile>{pw}</PasswordFile>")
    wrapped = f"<Replication>\n{body}\n</Replication>"
    assert "not found; give a file whose first line is tt-1's password" in one_problem(wrapped)[2]
    pw.write_text("\n")
    assert "the first line is empty" in one_problem(wrapped)[2]
    pw.write_text("# tickertape password file\ntt-1:scrypt$1$2$3$x$y\n")
    assert "is a server password file" in one_problem(wrapped)[2]
    pw.write_text("s3cret\n")
    [d] = load(wrapped).replication.destinations
    assert (d.user, d.password_file) == ("tt-1", str(pw))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_tls_on_both_sides(pki):
    head = HEAD.replace(
        "<InetAddr>127.0.0.1:9010</InetAddr>",
        f"<InetAddr>127.0.0.1:9010</InetAddr><Certificate>{pki.server_cert}</Certificate>"
        f"<PrivateKey>{pki.server_key}</PrivateKey>",
    )
    body = dest().replace(
        "</InetAddr>",
        f"</InetAddr><TLS>true</TLS><CAFile>{pki.ca}</CAFile>"
        f"<Certificate>{pki.server_cert}</Certificate><PrivateKey>{pki.server_key}</PrivateKey>",
    )
    c = load(f"<Replication>\n{body}\n</Replication>", head)
    assert c.transports[1].certificate == str(pki.server_cert)
    [a] = c.replication.destinations[0].addresses
    assert (a.tls, a.ca_file, a.certificate, a.private_key) == (
        True,
        str(pki.ca),
        str(pki.server_cert),
        str(pki.server_key),
    )


def test_tls_problems(pki, tmp_path):
    head = HEAD.replace(
        "<InetAddr>127.0.0.1:9010</InetAddr>",
        f"<InetAddr>127.0.0.1:9010</InetAddr><Certificate>{pki.server_cert}</Certificate>",
    )
    line, path, message = one_problem("", head)
    assert path == "/TickertapeConfig/Transports/Transport[2]"
    assert "missing <PrivateKey>" in message and "replication transport with TLS" in message
    head = HEAD.replace(
        "</InetAddr></Transport>\n</T", "</InetAddr><CAFile>x</CAFile></Transport>\n</T"
    )
    assert (
        "<CAFile> needs TLS: a replication transport serves TLS when it has"
        in (one_problem("", head)[2])
    )
    missing = tmp_path / "nope.pem"
    body = dest().replace("</InetAddr>", f"</InetAddr><TLS>true</TLS><CAFile>{missing}</CAFile>")
    line, path, message = one_problem(f"<Replication>\n{body}\n</Replication>")
    assert path == "/TickertapeConfig/Replication/Destination/Transport/CAFile"
    assert "not found" in message
    body = dest().replace(
        "</InetAddr>", f"</InetAddr><TLS>true</TLS><Certificate>{pki.server_cert}</Certificate>"
    )
    assert "missing <PrivateKey>" in one_problem(f"<Replication>\n{body}\n</Replication>")[2]


@pytest.mark.parametrize(
    ("section", "element", "fragment"),
    [
        ("SOW", "LocalQueue", "a queue no destination carries is local"),
        ("SOW", "GroupLocalQueue", "a queue no destination carries is local"),
    ],
)
def test_local_queues_say_what_to_write(section, element, fragment):
    _, path, message = one_problem(f"<{section}><{element}/></{section}>")
    assert path == f"/TickertapeConfig/{section}/{element}"
    assert "write <Queue>" in message and fragment in message
