"""The loader, through its public functions: the shipped files, each section, and problems.

Problems are checked by (line, path) and a fragment of the message; every message must also say
what to do, which the fragments check where it matters.
"""

import pickle
import shutil
import textwrap
from pathlib import Path

import msgspec
import pytest

import config
from config import (
    ActionStep,
    ActionTrigger,
    Config,
    ConfigError,
    LogTarget,
    Problem,
    QueueSpec,
    TopicSpec,
    TransactionLog,
    Transport,
    default_config,
    load_config,
    load_config_text,
    security,
    verify_config,
)
from protocol.security.passwords import ScryptParams, set_password
from tests.security.certs import make_pki

CONFIG_DIR = Path(config.__file__).parent
EXAMPLES = sorted((CONFIG_DIR / "examples").glob("*.xml"))
MB = 1 << 20


def load(body: str, env: dict[str, str] | None = None, root: str = "TickertapeConfig") -> Config:
    """Load `body` (the inside of the root element, dedented) with a hermetic environment."""
    text = f"<{root}>\n{textwrap.dedent(body).strip()}\n</{root}>\n"
    return load_config_text(text, "t.xml", env=env or {})


def problems(body: str, env: dict[str, str] | None = None) -> list[tuple[int, str, str]]:
    with pytest.raises(ConfigError) as info:
        load(body, env)
    return [(p.line, p.path, p.message) for p in info.value.problems]


def one_problem(body: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    found = problems(body, env)
    assert len(found) == 1, found
    return found[0]


def served_all(monkeypatch) -> None:
    """Load as a build that serves every security feature would: the file's own problems only
    (config.security.unsupported is the one place that refuses what is not served yet)."""
    monkeypatch.setattr(security, "unsupported", lambda cfg: [])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def install_example(path: Path, directory: Path, pki) -> Path:
    """A copy of the example `path` in `directory`, beside the files examples name relative to
    themselves: tls/server.pem, tls/server.key, tls/ca.pem, users.db, tt-2.password."""
    (directory / "tls").mkdir(exist_ok=True)
    shutil.copy(pki.server_cert, directory / "tls" / "server.pem")
    shutil.copy(pki.server_key, directory / "tls" / "server.key")
    shutil.copy(pki.ca, directory / "tls" / "ca.pem")
    set_password(directory / "users.db", "alice", "pw", ScryptParams(n=1 << 10))
    (directory / "tt-2.password").write_text("secret\n")
    copy = directory / path.name
    shutil.copy(path, copy)
    return copy


# Lines in `load` bodies: line 1 is the root, so the body's first line is line 2.
TXLOG = """
<TransactionLog>
  <JournalDirectory>j</JournalDirectory>
  <Topic><Name>orders</Name></Topic>
</TransactionLog>
"""


# ---------------------------------------------------------------------------------------------
# Shipped files


def test_default_config():
    c = default_config()
    assert c.source == "<embedded default>"
    assert c.name == "tickertape"
    [t] = c.transports
    assert (t.host, t.port, t.type, t.message_type, t.protocol) == (
        "127.0.0.1",
        9007,
        "tcp",
        "json",
        "amps",
    )
    assert t.max_message_size == 16 * MB
    assert (c.admin.host, c.admin.port) == ("127.0.0.1", 8085)
    assert c.logging == (LogTarget(protocol="stdout", level="info"),)
    tlog = c.transaction_log
    assert tlog.journal_directory == "./tickertape-data/journal"
    assert tlog.durability == "fsync"
    assert all(c.records_topic(t) for t in ("work", "orders", "md.AAPL", "a/b c"))
    [q] = c.queues
    assert (q.name, q.underlying_topic, q.semantics) == ("queue.work", "work", "at-least-once")
    assert c.queue("queue.work") is q
    [sow] = c.sow_topics
    assert (sow.name, sow.keys) == ("prices", ("/sym",))  # the README's SOW example
    assert c.limits.client_max_buffer_size == 64 * MB


def test_default_config_does_not_read_the_environment(monkeypatch):
    monkeypatch.setenv("TT_DATA", "/elsewhere")
    assert default_config() == default_config()


def test_there_are_examples():
    names = {p.name for p in EXAMPLES}
    assert {"minimal.xml", "full.xml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_loads(path, tmp_path, pki, monkeypatch):
    """Each example is valid; the only problems are the features this build refuses as not
    served yet (config.security.unsupported), one each."""
    copy = install_example(path, tmp_path, pki)
    with monkeypatch.context() as m:
        served_all(m)
        c = load_config(copy, env={})
    assert c.source == str(copy)
    assert c.name
    unserved = security.unsupported(c)
    found = verify_config(copy, env={})
    assert len(found) == len(unserved)
    assert all("is not served by this build yet" in p.message for p in found)


def test_minimal_example_defaults():
    c = load_config(CONFIG_DIR / "examples" / "minimal.xml", env={})
    assert c.transports == (Transport(name="json-tcp", host="127.0.0.1", port=9007),)
    assert c.admin is None
    assert c.transaction_log is None
    assert c.queues == () and c.actions == ()
    assert c.logging == (LogTarget(),)


def test_full_example_uses_every_element():
    """Every element the loader knows appears in full.xml, so it documents the whole format."""
    from config import schema

    text = (CONFIG_DIR / "examples" / "full.xml").read_text()
    specs = [*schema.SECTIONS, *schema.OPTION_SPECS.values()]
    missing = {name for spec in specs for name in spec.children if f"<{name}>" not in text} | {
        f"module {m}" for m in [*schema.TRIGGERS, *schema.STEPS] if f"-{m}<" not in text
    }
    assert not missing


def test_full_example_values(tmp_path, pki, monkeypatch):
    served_all(monkeypatch)
    path = install_example(CONFIG_DIR / "examples" / "full.xml", tmp_path, pki)
    c = load_config(path, env={"TT_DATA": "/srv/tt"})
    assert c.transaction_log.journal_directory == "/srv/tt/journal"
    tls = c.transports[1]
    assert tls.type == "tcps"
    assert tls.certificate == str(tmp_path / "tls" / "server.pem")
    assert (tls.ca_file, tls.verify_client, tls.minimum_version) == (
        str(tmp_path / "tls" / "ca.pem"),
        False,
        "TLSv1.2",
    )
    assert c.authentication.password_file == str(tmp_path / "users.db")
    assert [r.name for r in c.entitlement.roles] == ["desk-a", "ops"]
    q = c.queue("orders-work")
    assert q.filter == "/status = 'new' AND /qty > 0"
    assert q.max_backlog == 10_000
    assert c.queue("work-fanout").fairness_model == "round-robin"


# ---------------------------------------------------------------------------------------------
# Roots, names, files


def test_both_roots_mean_the_same():
    body = "<Name>tt</Name>" + TXLOG + "<SOW><Queue><Name>orders</Name></Queue></SOW>"
    assert load(body) == load(body, root="AMPSConfig")


def test_wrong_root():
    with pytest.raises(ConfigError) as info:
        load_config_text("<Config><Name>x</Name></Config>", "t.xml")
    assert str(info.value) == (
        "t.xml:1: /Config: the root element is <Config>; a configuration starts with "
        "<TickertapeConfig> (or <AMPSConfig>)"
    )


def test_root_names_are_case_sensitive():
    with pytest.raises(ConfigError, match="root element is <tickertapeconfig>"):
        load_config_text("<tickertapeconfig><Name>x</Name></tickertapeconfig>")


def test_missing_name():
    assert one_problem("<Admin/>") == (
        1,
        "/TickertapeConfig",
        "missing <Name> in <TickertapeConfig>; add <Name>...</Name> (the instance name)",
    )


@pytest.mark.parametrize("name", ["tt 1", "a/b", "a\\b", "$tt", "~tt"])
def test_bad_instance_name(name):
    line, path, message = one_problem(f"<Name>{name}</Name>")
    assert (line, path) == (2, "/TickertapeConfig/Name")
    assert "invalid instance name" in message


def test_missing_file(tmp_path):
    path = tmp_path / "nope.xml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [problem] = info.value.problems
    assert problem == Problem("", 0, problem.message)
    assert "configuration file not found" in problem.message
    assert str(info.value).startswith(f"{path}: configuration file not found (looked in ")
    assert verify_config(path) == info.value.problems


def test_directory_instead_of_file(tmp_path):
    assert "is a directory" in verify_config(tmp_path)[0].message


def test_unreadable_file(tmp_path, monkeypatch):
    from config import loader

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    path = tmp_path / "secret.xml"
    path.write_text("<TickertapeConfig><Name>x</Name></TickertapeConfig>")
    monkeypatch.setattr(loader, "open", denied, raising=False)  # works as root too
    assert "permission denied" in verify_config(path)[0].message


def test_load_config_accepts_str_and_path(tmp_path):
    path = tmp_path / "tt.xml"
    path.write_text("<TickertapeConfig><Name>x</Name></TickertapeConfig>")
    assert load_config(str(path)).source == str(path)
    assert load_config(path).name == "x"


# ---------------------------------------------------------------------------------------------
# Environment substitution


def test_env_substitution_in_values():
    c = load(
        """
        <Name>${NAME}</Name>
        <Transports><Transport>
          <Name>t</Name><InetAddr>${HOST:-127.0.0.1}:${PORT}</InetAddr>
          <MaxMessageSize>${MAX:-1MB}</MaxMessageSize>
        </Transport></Transports>
        """,
        env={"NAME": "tt-7", "PORT": "9100"},
    )
    assert c.name == "tt-7"
    assert (c.transports[0].host, c.transports[0].port) == ("127.0.0.1", 9100)
    assert c.transports[0].max_message_size == MB


def test_env_value_is_parsed_after_substitution():
    line, path, message = one_problem(
        "<Name>tt</Name><Admin><InetAddr>${PORT}</InetAddr></Admin>", env={"PORT": "http"}
    )
    assert (line, path) == (2, "/TickertapeConfig/Admin/InetAddr")
    assert "invalid port 'http'" in message


def test_env_cannot_inject_xml():
    """Substitution happens value by value after parsing: markup in a variable is just text."""
    c = load("<Name>x</Name>" + TXLOG.replace("orders", "${T}"), env={"T": "</Topic><Topic>x"})
    assert [t.name for t in c.transaction_log.topics] == ["</Topic><Topic>x"]


def test_unset_variables_are_problems_with_their_names():
    found = problems(
        """
        <Name>${INSTANCE}</Name>
        <TransactionLog>
          <JournalDirectory>${DATA}/journal</JournalDirectory>
        </TransactionLog>
        """
    )
    assert [(line, path) for line, path, _ in found] == [
        (2, "/TickertapeConfig/Name"),
        (4, "/TickertapeConfig/TransactionLog/JournalDirectory"),
    ]
    assert "environment variable INSTANCE is not set" in found[0][2]
    assert "environment variable DATA is not set" in found[1][2]
    assert "${DATA:-default}" in found[1][2]


def test_variable_that_comes_out_empty():
    assert "is empty" in one_problem("<Name>${N:-}</Name>")[2]


def test_config_directory_variables(tmp_path):
    path = tmp_path / "etc" / "tt.xml"
    path.parent.mkdir()
    path.write_text(
        "<TickertapeConfig><Name>x</Name>"
        "<TransactionLog><JournalDirectory>${TICKERTAPE_CONFIG_DIRECTORY}/j</JournalDirectory>"
        "<JournalArchiveDirectory>${AMPS_CONFIG_DIRECTORY}/a</JournalArchiveDirectory>"
        "</TransactionLog><Logging><Target><Protocol>file</Protocol>"
        "<FileName>${TICKERTAPE_CONFIG_PATH}.log</FileName></Target></Logging>"
        "</TickertapeConfig>"
    )
    c = load_config(path, env={})
    assert c.transaction_log.journal_directory == f"{path.parent}/j"
    assert c.transaction_log.archive_directory == f"{path.parent}/a"
    assert c.logging[0].file_name == f"{path}.log"


def test_environment_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("TT_TEST_NAME", "from-env")
    assert load_config_text("<TickertapeConfig><Name>${TT_TEST_NAME}</Name></TickertapeConfig>")


# ---------------------------------------------------------------------------------------------
# A file with many problems: all of them, in line order, with paths and lines

BAD = """\
<?xml version="1.0"?>
<TickertapeConfig>
  <Transports>
    <Transport>
      <Name>json-tcp</Name>
      <InetAddr>9007</InetAddr>
      <MaxMesageSize>1MB</MaxMesageSize>
    </Transport>
    <Transport>
      <Name>json-tcp</Name>
      <InetAddr>0.0.0.0:9007</InetAddr>
      <Type>udp</Type>
    </Transport>
  </Transports>
  <Admin><InetAddr>8085</InetAddr><Interval>often</Interval></Admin>
  <TransactionLog>
    <JournalDirectory>data</JournalDirectory>
    <JournalSize>1000</JournalSize>
    <Topic><Name>orders(</Name></Topic>
    <Topic><Name>work</Name></Topic>
  </TransactionLog>
  <SOW>
    <Queue>
      <Name>q</Name>
      <UnderlyingTopic>work</UnderlyingTopic>
      <LeaseDuration>30s</LeaseDuration>
    </Queue>
    <Queue>
      <Name>q</Name>
      <UnderlyingTopic>orders</UnderlyingTopic>
      <LeasePeriod>soon</LeasePeriod>
    </Queue>
  </SOW>
</TickertapeConfig>
"""


def test_bad_file_reports_every_problem(tmp_path):
    path = tmp_path / "bad.xml"
    path.write_text(BAD)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    got = [(p.line, p.path, p.message) for p in info.value.problems]
    expected = [
        (2, "/TickertapeConfig", "missing <Name> in <TickertapeConfig>"),
        (
            7,
            "/TickertapeConfig/Transports/Transport[1]/MaxMesageSize",
            "unknown element <MaxMesageSize> in <Transport>; did you mean <MaxMessageSize>?",
        ),
        (
            9,
            "/TickertapeConfig/Transports/Transport[2]",
            "transport name 'json-tcp' is already used at line 4; give each transport its own "
            "<Name>",
        ),
        (
            11,
            "/TickertapeConfig/Transports/Transport[2]/InetAddr",
            "port 9007 is already used by the transport at line 6",
        ),
        (
            11,
            "/TickertapeConfig/Transports/Transport[2]/InetAddr",
            "this transport listens on 0.0.0.0:9007, which is not loopback, and there is no "
            "<Authentication>",
        ),
        (
            12,
            "/TickertapeConfig/Transports/Transport[2]/Type",
            "invalid value 'udp'; use one of: tcp, tcps",
        ),
        (15, "/TickertapeConfig/Admin/Interval", "invalid interval 'often'"),
        (
            18,
            "/TickertapeConfig/TransactionLog/JournalSize",
            "JournalSize '1000' is below the minimum 64KB (a plain number is bytes",
        ),
        (
            19,
            "/TickertapeConfig/TransactionLog/Topic[1]/Name",
            "invalid regular expression 'orders(': missing ): orders(",
        ),
        (
            26,
            "/TickertapeConfig/SOW/Queue[1]/LeaseDuration",
            "unknown element <LeaseDuration> in <Queue>; did you mean <LeasePeriod>?",
        ),
        (
            28,
            "/TickertapeConfig/SOW/Queue[2]",
            "queue name 'q' is already used at line 23; give each queue its own <Name>",
        ),
        (
            30,
            "/TickertapeConfig/SOW/Queue[2]/UnderlyingTopic",
            (
                "the underlying topic 'orders' of queue 'q' is not recorded in the transaction "
                "log (line 16); add <Topic><Name>orders</Name></Topic> to <TransactionLog>"
            ),
        ),
        (31, "/TickertapeConfig/SOW/Queue[2]/LeasePeriod", "invalid interval 'soon'"),
    ]
    assert [(line, p) for line, p, _ in got] == [(line, p) for line, p, _ in expected]
    for (_, _, message), (_, _, fragment) in zip(got, expected, strict=True):
        assert fragment in message
    lines = str(info.value).splitlines()
    assert len(lines) == len(expected)
    assert lines[0] == (
        f"{path}:2: /TickertapeConfig: missing <Name> in <TickertapeConfig>; "
        "add <Name>...</Name> (the instance name)"
    )
    assert lines[-1].startswith(f"{path}:31: /TickertapeConfig/SOW/Queue[2]/LeasePeriod: ")
    assert verify_config(path, env={}) == info.value.problems


def test_config_error_pickles():
    e = ConfigError("f.xml", [Problem("/R", 3, "bad")])
    again = pickle.loads(pickle.dumps(e))
    assert (again.source, again.problems, str(again)) == ("f.xml", e.problems, "f.xml:3: /R: bad")


# ---------------------------------------------------------------------------------------------
# Element rules


@pytest.mark.parametrize(
    ("body", "line", "path", "fragment"),
    [
        (
            "<Name>x</Name><transports/>",
            2,
            "/TickertapeConfig/transports",
            "element names are case-sensitive: write <Transports>",
        ),
        (
            "<Name>x</Name><Queue><Name>q</Name></Queue>",
            2,
            "/TickertapeConfig/Queue",
            "<Queue> does not belong in <TickertapeConfig>; it goes in <SOW>",
        ),
        (
            "<Name>x</Name><Include>y.xml</Include>",
            2,
            "/TickertapeConfig/Include",
            "<Include> is not supported by Tickertape (the configuration is one file); remove it",
        ),
        (
            "<Name>x</Name><Frobnicate/>",
            2,
            "/TickertapeConfig/Frobnicate",
            "unknown element <Frobnicate> in <TickertapeConfig>; allowed here: <Name>,",
        ),
        (
            "<Name>x</Name>\n<Name>y</Name>",
            3,
            "/TickertapeConfig/Name[2]",
            "<Name> is given more than once in <TickertapeConfig>, first at line 2; keep one",
        ),
        (
            '<Name lang="en">x</Name>',
            2,
            "/TickertapeConfig/Name",
            "attributes are not used in this format (lang)",
        ),
        (
            "<Name>x</Name><Admin>8085</Admin>",
            2,
            "/TickertapeConfig/Admin",
            "text '8085' is not allowed in <Admin>, which holds elements only",
        ),
        (
            "<Name><First>x</First></Name>",
            2,
            "/TickertapeConfig/Name",
            "<Name> takes a value, not elements (found <First>)",
        ),
        ("<Name>  </Name>", 2, "/TickertapeConfig/Name", "<Name> is empty; give a value"),
        (
            "<Name>x</Name><ClientMaxCapacity>1m</ClientMaxCapacity>",
            2,
            "/TickertapeConfig/ClientMaxCapacity",
            "past <ClientOfflineThreshold> its subscribers read from the journal",
        ),
        (
            "<Name>x</Name><LogonTimeout>0s</LogonTimeout>",
            2,
            "/TickertapeConfig/LogonTimeout",
            "LogonTimeout '0s' must be a positive interval",
        ),
        (
            "<Name>x</Name><InputMemoryLimit>10KB</InputMemoryLimit>",
            2,
            "/TickertapeConfig/InputMemoryLimit",
            "is below the minimum",
        ),
        (
            "<Name>x</Name><ClientMaxSubscriptions>0</ClientMaxSubscriptions>",
            2,
            "/TickertapeConfig/ClientMaxSubscriptions",
            "must be at least 1",
        ),
    ],
)
def test_element_rules(body, line, path, fragment):
    got_line, got_path, message = one_problem(body)
    assert (got_line, got_path) == (line, path)
    assert fragment in message


# ---------------------------------------------------------------------------------------------
# Transports and Admin


def test_transports_absent_means_the_default_transport():
    assert load("<Name>x</Name>").transports == (Transport(name="json-tcp", port=9007),)


def test_empty_transports_is_a_problem():
    assert "has no <Transport>" in one_problem("<Name>x</Name><Transports/>")[2]


def test_transport_fields(pki, monkeypatch):
    served_all(monkeypatch)
    c = load(
        """
        <Name>x</Name>
        <Transports>
          <Transport><Name>a</Name><InetAddr>0</InetAddr><Protocol>JSON</Protocol></Transport>
          <Transport><Name>b</Name><InetAddr>0</InetAddr><MaxMessageSize>1KB</MaxMessageSize>
          </Transport>
          <Transport><Name>c</Name><InetAddr>[::1]:9443</InetAddr><Type>tcps</Type>
            <Certificate>${D}/server.pem</Certificate><PrivateKey>${D}/server.key</PrivateKey>
          </Transport>
        </Transports>
        """,
        env={"D": str(pki.dir)},
    )
    a, b, c_ = c.transports
    assert (a.port, a.protocol) == (0, "amps")  # port 0 may repeat: each gets its own
    assert b.max_message_size == 1024
    assert (c_.host, c_.port, c_.type, c_.certificate, c_.private_key) == (
        "::1",
        9443,
        "tcps",
        str(pki.server_cert),
        str(pki.server_key),
    )


def test_transport_problems():
    found = problems(
        """
        <Name>x</Name>
        <Transports>
          <Transport><Name>a</Name><InetAddr>1</InetAddr><Type>tcps</Type></Transport>
          <Transport><InetAddr>2</InetAddr><Certificate>c.pem</Certificate></Transport>
          <Transport><Name>c</Name><MaxMessageSize>512</MaxMessageSize></Transport>
          <Transport><Name>d</Name><InetAddr>4</InetAddr><Protocol>websocket</Protocol>
            <MessageType>fix</MessageType><MaxMessageSize>8GB</MaxMessageSize></Transport>
        </Transports>
        """
    )
    messages = [m for _, _, m in found]
    assert [line for line, _, _ in found] == [4, 4, 5, 5, 6, 6, 7, 8, 8]
    assert "missing <Certificate>" in messages[0]
    assert "missing <PrivateKey>" in messages[1]
    assert "missing <Name>" in messages[2]
    assert "<Certificate> is only used by tcps transports" in messages[3]
    assert "missing <InetAddr>" in messages[4]
    assert "MaxMessageSize '512' is below the minimum 1KB" in messages[5]
    assert "invalid value 'websocket'; use one of: amps" in messages[6]
    assert "invalid value 'fix'; use one of: json" in messages[7]
    assert "the largest frame a 4-byte length can describe" in messages[8]
    assert len(found) == 9  # the refused 8GB does not also trip the ClientMaxBufferSize check


def test_admin():
    c = load(
        "<Name>x</Name><Admin><InetAddr>0.0.0.0:8086</InetAddr><Interval>1s</Interval></Admin>"
        "<Authentication><AllowAnonymous>true</AllowAnonymous></Authentication>"
    )
    assert (c.admin.host, c.admin.port, c.admin.interval) == ("0.0.0.0", 8086, 1.0)
    assert load("<Name>x</Name><Admin/>").admin == config.Admin()
    assert load("<Name>x</Name>").admin is None


def test_admin_port_clashes_with_a_transport():
    line, path, message = one_problem(
        "<Name>x</Name><Transports><Transport><Name>t</Name><InetAddr>8085</InetAddr>"
        "</Transport></Transports>\n<Admin><InetAddr>8085</InetAddr></Admin>"
    )
    assert (line, path) == (3, "/TickertapeConfig/Admin/InetAddr")
    assert "admin port 8085 is already used by the transport at line 2" in message


# ---------------------------------------------------------------------------------------------
# Logging


def test_logging_absent_means_stdout_info_and_empty_means_nothing():
    assert load("<Name>x</Name>").logging == (LogTarget(protocol="stdout", level="info"),)
    assert load("<Name>x</Name><Logging/>").logging == ()


@pytest.mark.parametrize(
    ("written", "level"),
    [
        ("debug", "debug"),
        ("info", "info"),
        ("warning", "warning"),
        ("error", "error"),
        ("WARNING", "warning"),
        ("developer", "debug"),
        ("trace", "debug"),
        ("stats", "debug"),
        ("critical", "error"),
        ("emergency", "error"),
    ],
)
def test_log_levels(written, level):
    c = load(
        f"<Name>x</Name><Logging><Target><Protocol>stderr</Protocol><Level>{written}</Level>"
        "</Target></Logging>"
    )
    assert c.logging == (LogTarget(protocol="stderr", level=level),)


def test_log_file_target():
    c = load(
        "<Name>x</Name><Logging><Target><Protocol>file</Protocol><FileName>l/tt.log</FileName>"
        "</Target></Logging>"
    )
    assert c.logging == (LogTarget(protocol="file", level="info", file_name="l/tt.log"),)


def test_logging_problems():
    found = problems(
        """
        <Name>x</Name>
        <Logging>
          <Target><Protocol>file</Protocol></Target>
          <Target><Protocol>stdout</Protocol><FileName>x.log</FileName></Target>
          <Target><Protocol>syslog</Protocol><Level>none</Level></Target>
          <Target><Level>loud</Level></Target>
        </Logging>
        """
    )
    messages = [(line, m) for line, _, m in found]
    assert [line for line, _ in messages] == [4, 5, 6, 6, 7, 7]
    assert "missing <FileName>" in messages[0][1]
    assert "<FileName> is only used with <Protocol>file</Protocol>" in messages[1][1]
    assert "use one of: stdout, stderr, file" in messages[2][1]
    assert "remove the <Target> to log nothing" in messages[3][1]
    assert "missing <Protocol>" in messages[4][1]
    assert "invalid level 'loud'" in messages[5][1]


# ---------------------------------------------------------------------------------------------
# TransactionLog


def test_transaction_log_fields():
    c = load(
        """
        <Name>x</Name>
        <TransactionLog>
          <JournalDirectory>/data/j</JournalDirectory>
          <JournalArchiveDirectory>/data/a</JournalArchiveDirectory>
          <MinJournalSize>64KB</MinJournalSize>
          <Durability>write</Durability>
          <Topic><Name>orders</Name><MessageType>json</MessageType></Topic>
          <Topic><Name>md\\..*</Name></Topic>
        </TransactionLog>
        """
    )
    assert c.transaction_log == TransactionLog(
        journal_directory="/data/j",
        archive_directory="/data/a",
        journal_size=64 * 1024,
        durability="write",
        topics=(TopicSpec(name="orders"), TopicSpec(name=r"md\..*")),
    )


def test_transaction_log_defaults():
    tlog = load(
        "<Name>x</Name><TransactionLog><JournalDirectory>j</JournalDirectory></TransactionLog>"
    ).transaction_log
    assert (tlog.journal_size, tlog.durability, tlog.archive_directory, tlog.topics) == (
        256 * MB,
        "fsync",
        None,
        (),
    )
    assert not tlog.records_topic("anything")


def test_records_topic_is_a_full_match():
    tlog = TransactionLog(
        journal_directory="j",
        topics=(TopicSpec(name="orders"), TopicSpec(name=r"md\..*"), TopicSpec(name="a|b")),
    )
    assert tlog.records_topic("orders")
    assert not tlog.records_topic("orders2")
    assert not tlog.records_topic("my-orders")
    assert tlog.records_topic("md.AAPL")
    assert not tlog.records_topic("mdXAAPL")
    assert tlog.records_topic("a") and tlog.records_topic("b") and not tlog.records_topic("ab")
    assert tlog.records_topic("orders")  # cached answer


def test_config_records_topic_without_a_transaction_log():
    assert not load("<Name>x</Name>").records_topic("orders")


def test_journal_directory_is_required():
    line, path, message = one_problem("<Name>x</Name>\n<TransactionLog/>")
    assert (line, path) == (3, "/TickertapeConfig/TransactionLog")
    assert "missing <JournalDirectory>" in message


def test_journal_size_and_synonym_clash():
    found = problems(
        "<Name>x</Name><TransactionLog><JournalDirectory>j</JournalDirectory>"
        "<JournalSize>1GB</JournalSize><MinJournalSize>2GB</MinJournalSize></TransactionLog>"
    )
    [(_, path, message)] = found
    assert path == "/TickertapeConfig/TransactionLog/MinJournalSize"
    assert "<JournalSize> is given more than once in <TransactionLog> (also written " in message


def test_invalid_topic_regexes_are_all_reported():
    found = problems(
        """
        <Name>x</Name>
        <TransactionLog>
          <JournalDirectory>j</JournalDirectory>
          <Topic><Name>*orders</Name></Topic>
          <Topic><Name>ok</Name></Topic>
          <Topic><Name>[a-</Name></Topic>
          <Topic><MessageType>json</MessageType></Topic>
        </TransactionLog>
        """
    )
    assert [(line, path) for line, path, _ in found] == [
        (5, "/TickertapeConfig/TransactionLog/Topic[1]/Name"),
        (7, "/TickertapeConfig/TransactionLog/Topic[3]/Name"),
        (8, "/TickertapeConfig/TransactionLog/Topic[4]"),
    ]
    assert "no argument for repetition operator: *" in found[0][2]
    assert "missing <Name>" in found[2][2]


# ---------------------------------------------------------------------------------------------
# Queues


def test_queue_over_a_pattern_of_topics():
    c = load(
        "<Name>x</Name>" + TXLOG + "<SOW><Queue><Name>q</Name><UnderlyingTopic>ord.*"
        "</UnderlyingTopic><DefaultPublishTarget>orders</DefaultPublishTarget></Queue></SOW>"
    )
    assert (c.queues[0].underlying_topic, c.queues[0].default_publish_target) == (
        "ord.*",
        "orders",
    )
    found = problems(
        "<Name>x</Name>" + TXLOG + "<SOW><Queue><Name>q</Name><UnderlyingTopic>ord.*"
        "</UnderlyingTopic><DefaultPublishTarget>other</DefaultPublishTarget></Queue></SOW>"
    )
    assert any("'other' is not one of the underlying topics" in m for _, _, m in found)
    _, path, message = one_problem(
        "<Name>x</Name>" + TXLOG + "<SOW><Queue><Name>q</Name><UnderlyingTopic>(a)\\1"
        "</UnderlyingTopic></Queue></SOW>"
    )
    assert path.endswith("/UnderlyingTopic") and "not supported" in message
    _, path, message = one_problem(
        "<Name>x</Name>" + TXLOG + "<SOW><Queue><Name>q</Name><UnderlyingTopic>ord.*"
        "</UnderlyingTopic><DeadLetterTopic>ord.dead</DeadLetterTopic></Queue></SOW>"
    )
    assert path.endswith("/DeadLetterTopic") and "come straight back" in message


def test_queue_defaults():
    c = load("<Name>x</Name>" + TXLOG + "<SOW><Queue><Name>orders</Name></Queue></SOW>")
    assert c.queues == (QueueSpec(name="orders", underlying_topic="orders"),)
    q = c.queues[0]
    assert (q.semantics, q.lease_period, q.max_per_subscription_backlog, q.max_backlog) == (
        "at-least-once",
        30.0,
        1,
        None,
    )
    assert (q.fairness_model, q.max_deliveries, q.max_cancels, q.expiration, q.leasing) == (
        "proportional",
        0,
        0,
        None,
        "sublet",
    )


def test_queue_amps_synonyms():
    c = load(
        "<Name>x</Name>" + TXLOG + "<SOW><QueueDefinition><Topic>q</Topic>"
        "<UnderlyingTopic>orders</UnderlyingTopic></QueueDefinition></SOW>"
    )
    assert c.queue("q").underlying_topic == "orders"


def test_at_most_once_queue():
    c = load(
        "<Name>x</Name>" + TXLOG + "<SOW><Queue><Name>orders</Name>"
        "<Semantics>At-Most-Once</Semantics></Queue></SOW>"
    )
    assert (c.queues[0].semantics, c.queues[0].fairness_model) == ("at-most-once", "round-robin")


def test_at_most_once_queue_refuses_what_it_cannot_do():
    found = problems(
        f"""
        <Name>x</Name>{TXLOG}
        <SOW><Queue>
          <Name>orders</Name><Semantics>at-most-once</Semantics>
          <FairnessModel>proportional</FairnessModel>
          <LeasePeriod>30s</LeasePeriod><MaxDeliveries>3</MaxDeliveries>
          <MaxCancels>3</MaxCancels><Leasing>strict</Leasing>
        </Queue></SOW>
        """
    )
    assert [path.rsplit("/", 1)[1] for _, path, _ in found] == [
        "FairnessModel",
        "LeasePeriod",
        "MaxDeliveries",
        "MaxCancels",
        "Leasing",
    ]
    assert "at-most-once queues only allow round-robin fairness" in found[0][2]
    assert "has no effect on an at-most-once queue" in found[1][2]


def test_queue_needs_a_transaction_log():
    _, path, message = one_problem("<Name>x</Name><SOW><Queue><Name>work</Name></Queue></SOW>")
    assert path == "/TickertapeConfig/SOW/Queue/Name"
    assert "queue 'work' needs its underlying topic 'work' recorded in a transaction log" in message


def test_queue_problems():
    found = problems(
        f"""
        <Name>x</Name>{TXLOG}
        <SOW>
          <Queue><UnderlyingTopic>orders</UnderlyingTopic></Queue>
          <Queue><Name>orders.*</Name></Queue>
          <Queue><Name>a</Name><UnderlyingTopic>orders</UnderlyingTopic>
            <MaxPerSubscriptionBacklog>0</MaxPerSubscriptionBacklog>
            <MaxBacklog>many</MaxBacklog><Expiration>0s</Expiration>
            <DeadLetterTopic>orders</DeadLetterTopic><Leasing>loose</Leasing></Queue>
          <Queue><Name>b</Name><Name>c</Name><UnderlyingTopic>/AMPS/x</UnderlyingTopic></Queue>
        </SOW>
        """
    )
    messages = [m for _, _, m in found]
    assert "missing <Name> in <Queue>" in messages[0]
    assert "'orders.*' is not a literal topic name" in messages[1]
    assert "'0' is below the minimum of 1; write 1 or more" in messages[2]
    assert "invalid count 'many'" in messages[3]
    assert "interval '0s' must be greater than zero" in messages[4]
    assert "invalid value 'loose'; use one of: strict, sublet" in messages[5]
    assert "dead-letter topic 'orders' is this queue's own topic" in messages[6]
    assert "<Name> is given more than once in <Queue>" in messages[7]
    assert "topic names starting with /AMPS are reserved" in messages[8]
    assert len(found) == 9


def test_admin_port_may_not_be_the_default_transports():
    _, path, message = one_problem("<Name>x</Name><Admin><InetAddr>9007</InetAddr></Admin>")
    assert path == "/TickertapeConfig/Admin/InetAddr"
    assert "admin port 9007 is the default transport's" in message


def test_queue_filters_that_do_not_parse_are_problems():
    # they used to pass the loader and end `serve` with a FilterError traceback
    found = problems(
        f"""
        <Name>x</Name>{TXLOG}
        <SOW><Queue><Name>q</Name><UnderlyingTopic>orders</UnderlyingTopic>
          <Filter>/a = = 1</Filter><BarrierExpression>/b LIKE '('</BarrierExpression>
        </Queue></SOW>
        """
    )
    assert [p for _, p, _ in found] == [
        "/TickertapeConfig/SOW/Queue/Filter",
        "/TickertapeConfig/SOW/Queue/BarrierExpression",
    ]
    assert "bad filter at position 5" in found[0][2]
    assert "bad regular expression in LIKE" in found[1][2]
    good = load(
        f"<Name>x</Name>{TXLOG}<SOW><Queue><Name>q</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "<Filter>/qty &gt; 10</Filter></Queue></SOW>"
    )
    assert good.queues[0].filter == "/qty > 10"


def test_queue_over_a_regex_recorded_topic():
    c = load(
        "<Name>x</Name><TransactionLog><JournalDirectory>j</JournalDirectory>"
        "<Topic><Name>jobs\\..*</Name></Topic></TransactionLog>"
        "<SOW><Queue><Name>q</Name><UnderlyingTopic>jobs.eu</UnderlyingTopic></Queue></SOW>"
    )
    assert c.queue("q").underlying_topic == "jobs.eu"


# ---------------------------------------------------------------------------------------------
# Actions

JOURNAL = (
    "<Name>x</Name><TransactionLog><JournalDirectory>j</JournalDirectory>"
    "<JournalArchiveDirectory>a</JournalArchiveDirectory></TransactionLog>"
)


def action(on: str, *steps: str) -> str:
    do = "".join(f"<Do>{s}</Do>" for s in steps)
    return f"{JOURNAL}<Actions><Action><On>{on}</On>{do}</Action></Actions>"


SCHEDULE = "<Module>amps-action-on-schedule</Module><Options><Every>{}</Every></Options>"
ARCHIVE = "<Module>amps-action-do-archive-journal</Module><Options><Age>7d</Age></Options>"


@pytest.mark.parametrize(
    ("every", "trigger"),
    [
        ("1h", ActionTrigger(kind="schedule", every=3600.0)),
        ("100ms", ActionTrigger(kind="schedule", every=0.1)),
        ("17:45", ActionTrigger(kind="schedule", at=(17, 45))),
        ("07:05Z", ActionTrigger(kind="schedule", at=(7, 5), utc=True)),
        ("Saturday at 00:30", ActionTrigger(kind="schedule", at=(0, 30), weekday=5)),
        ("mon at 9:00z", ActionTrigger(kind="schedule", at=(9, 0), weekday=0, utc=True)),
    ],
)
def test_schedule_forms(every, trigger):
    [a] = load(action(SCHEDULE.format(every), ARCHIVE)).actions
    assert a.on == trigger
    assert a.do == (ActionStep(name="archive-journal", options=(("Age", "7d"),), age=604800.0),)


@pytest.mark.parametrize(
    ("every", "fragment"),
    [
        ("sometimes", "invalid schedule 'sometimes'"),
        ("0s", "invalid schedule '0s'"),
        ("24:00", "use 00:00 to 23:59"),
        ("Caturday at 10:00", "unknown weekday 'Caturday'"),
    ],
)
def test_bad_schedules(every, fragment):
    assert fragment in one_problem(action(SCHEDULE.format(every), ARCHIVE))[2]


def test_startup_and_several_steps_in_order():
    [a] = load(
        action(
            "<Module>amps-action-on-startup</Module>",
            "<Module>amps-action-do-compress-journal</Module><Options><Age>1d</Age></Options>",
            "<Module>tickertape-action-do-compact-journal</Module>"
            "<Options><Retention>7d</Retention></Options>",
            "<Module>tickertape-action-do-remove-journal</Module><Options><Age>0</Age></Options>",
        )
    ).actions
    assert a.on == ActionTrigger(kind="startup")
    assert [(s.name, s.age, s.retention) for s in a.do] == [
        ("compress-journal", 86400.0, None),
        ("compact-journal", None, 604800.0),
        ("remove-journal", 0.0, None),
    ]
    assert a.do[1].options == (("Retention", "7d"),)


def test_action_problems():
    every_hour = SCHEDULE.format("1h")
    found = problems(
        f"""
        {JOURNAL}
        <Actions>
          <Action><Do>{ARCHIVE}</Do></Action>
          <Action><On><Module>amps-action-on-signal</Module></On></Action>
          <Action><On>{every_hour}</On>
            <Do><Module>amps-action-do-archive-journal</Module></Do>
            <Do><Module>amps-action-do-remove-journal</Module><Options><Age>old</Age>
              <Pattern>*.gz</Pattern></Options></Do>
          </Action>
        </Actions>
        """
    )
    messages = [(line, m) for line, _, m in found]
    assert [line for line, _ in messages] == [4, 5, 5, 7, 8, 9]
    assert "missing <On> in <Action>" in messages[0][1]
    assert "missing <Do> in <Action>" in messages[1][1]
    assert "unsupported <On> module 'amps-action-on-signal'; supported: " in messages[2][1]
    assert "archive-journal needs <Options><Age>...</Age></Options>" in messages[3][1]
    assert "invalid interval 'old'" in messages[4][1]
    assert "unknown element <Pattern> in <Options>; allowed here: <Age>" in messages[5][1]


def test_journal_actions_need_a_journal_and_an_archive_directory():
    no_archive = (
        "<Name>x</Name><TransactionLog><JournalDirectory>j</JournalDirectory></TransactionLog>"
        f"<Actions><Action><On>{SCHEDULE.format('1h')}</On><Do>{ARCHIVE}</Do></Action></Actions>"
    )
    assert "needs <JournalArchiveDirectory>" in one_problem(no_archive)[2]
    no_journal = (
        "<Name>x</Name>"
        f"<Actions><Action><On>{SCHEDULE.format('1h')}</On><Do>{ARCHIVE}</Do></Action></Actions>"
    )
    assert "archive-journal needs a <TransactionLog>" in one_problem(no_journal)[2]


# ---------------------------------------------------------------------------------------------
# Limits and Authentication


def test_client_max_buffer_size():
    c = load("<Name>x</Name><ClientMaxBufferSize>128MB</ClientMaxBufferSize>")
    assert c.limits.client_max_buffer_size == 128 * MB


def test_client_offline_threshold():
    assert load("<Name>x</Name>").limits.offline_threshold == 4 * MB
    small = load("<Name>x</Name><ClientMaxBufferSize>16MB</ClientMaxBufferSize>")
    assert small.limits.client_offline_threshold is None
    assert small.limits.offline_threshold == 4 * MB
    tiny = load(
        "<Name>x</Name><ClientMaxBufferSize>2MB</ClientMaxBufferSize><Transports><Transport>"
        "<Name>t</Name><InetAddr>0</InetAddr><MaxMessageSize>1MB</MaxMessageSize></Transport>"
        "</Transports>"
    )
    assert tiny.limits.offline_threshold == 1 * MB  # half the buffer bound
    c = load("<Name>x</Name><ClientOfflineThreshold>1MB</ClientOfflineThreshold>")
    assert c.limits.offline_threshold == 1 * MB
    off = load("<Name>x</Name><ClientOfflineThreshold>0</ClientOfflineThreshold>")
    assert off.limits.offline_threshold == 0
    _, path, message = one_problem(
        "<Name>x</Name><ClientOfflineThreshold>64MB</ClientOfflineThreshold>"
    )
    assert path == "/TickertapeConfig/ClientOfflineThreshold"
    assert "is not below ClientMaxBufferSize 64MB" in message and "0 to turn" in message
    _, path, message = one_problem(
        "<Name>x</Name><ClientOfflineThreshold>1KB</ClientOfflineThreshold>"
    )
    assert "must be 0 (off) or at least 65536 bytes" in message
    _, path, message = one_problem("<Name>x</Name><SlowClientTimeout>5s</SlowClientTimeout>")
    assert "<ClientMessageAgeLimit>" in message


def test_idle_poll():
    assert load("<Name>x</Name>").limits.idle_poll == pytest.approx(100e-6)
    assert load("<Name>x</Name><IdlePoll>0</IdlePoll>").limits.idle_poll == 0
    assert load("<Name>x</Name><IdlePoll>2ms</IdlePoll>").limits.idle_poll == pytest.approx(0.002)
    _, path, message = one_problem("<Name>x</Name><IdlePoll>1s</IdlePoll>")
    assert path == "/TickertapeConfig/IdlePoll"
    assert "out of range; give 0 (off) up to 10ms" in message
    _, path, message = one_problem("<Name>x</Name><IdlePoll>soon</IdlePoll>")
    assert path == "/TickertapeConfig/IdlePoll" and "invalid interval 'soon'" in message


def test_client_buffer_must_hold_the_largest_message():
    _, path, message = one_problem("<Name>x</Name><ClientMaxBufferSize>1MB</ClientMaxBufferSize>")
    assert path == "/TickertapeConfig/ClientMaxBufferSize"
    assert "smaller than the largest MaxMessageSize (16MB)" in message
    _, path, message = one_problem(
        "<Name>x</Name><Transports><Transport><Name>t</Name><InetAddr>0</InetAddr>"
        "<MaxMessageSize>100MB</MaxMessageSize></Transport></Transports>"
    )
    assert path == "/TickertapeConfig"
    assert "add a larger <ClientMaxBufferSize>" in message


def test_authentication_anonymous_only_is_served():
    c = load(
        "<Name>x</Name><Authentication><AllowAnonymous>${ANON:-true}</AllowAnonymous>"
        "<LogonTimeout>3s</LogonTimeout></Authentication>"
    )
    assert c.authentication == config.Authentication(allow_anonymous=True, logon_timeout=3.0)
    assert c.limits.logon_timeout == 3.0  # one setting, whichever element gives it


def test_authentication_unset_variable_is_a_problem():
    body = (
        "<Name>x</Name><Authentication><AllowAnonymous>true</AllowAnonymous>"
        "<PasswordFile>${PASSWORD_FILE}</PasswordFile></Authentication>"
    )
    assert "PASSWORD_FILE is not set" in one_problem(body)[2]


# ---------------------------------------------------------------------------------------------
# The model


def test_model_is_frozen():
    c = default_config()
    with pytest.raises(AttributeError):
        c.name = "other"
    with pytest.raises(AttributeError):
        c.transports[0].port = 1


def test_model_round_trips_through_json(tmp_path, pki, monkeypatch):
    served_all(monkeypatch)
    c = load_config(install_example(CONFIG_DIR / "examples" / "full.xml", tmp_path, pki), env={})
    again = msgspec.json.decode(msgspec.json.encode(c), type=Config)
    assert again == c
    assert again.records_topic("md.X") and again.queue("orders-work") == c.queue("orders-work")


def test_model_built_in_code_has_the_format_defaults():
    c = Config(name="t", transports=(Transport(name="t", port=0),))
    assert c.logging == (LogTarget(protocol="stdout", level="info"),)
    assert c.limits.client_max_buffer_size == 64 * MB
    assert c.transaction_log is None and c.queue("x") is None
    assert c.transports[0].max_message_size == 16 * MB
