"""Checks across a replication set (`config.replication_set`) and `--verify-config` with several
files; the example sets in config/examples/ are loaded and cross-verified here."""

from pathlib import Path

import pytest

import config
from config import load_config, load_config_text
from config.replication_set import check_set, describe_links
from protocol.security.passwords import ScryptParams, set_password
from server.cli import main

EXAMPLES = Path(config.__file__).parent / "examples"


def instance(
    name: str,
    repl_port: int,
    dests: str = "",
    group: str | None = None,
    extra: str = "",
    repl_extra: str = "",
    client: bool = True,
):
    client_transport = (
        f"<Transport><Name>c</Name><InetAddr>127.0.0.1:{repl_port + 1}</InetAddr></Transport>"
        if client
        else ""
    )
    text = f"""<TickertapeConfig><Name>{name}</Name>{f"<Group>{group}</Group>" if group else ""}
<Transports>{client_transport}
  <Transport><Name>r</Name><Type>replication</Type><InetAddr>127.0.0.1:{repl_port}</InetAddr>{repl_extra}</Transport>
</Transports>
<TransactionLog><JournalDirectory>j</JournalDirectory><Topic><Name>.*</Name></Topic></TransactionLog>
{extra}
<Replication>{dests}</Replication></TickertapeConfig>"""
    return load_config_text(text, f"{name}.xml", env={})


def dest(name, port, sync="sync", topics=(".*",), group=None, inner=""):
    t = "".join(f"<Topic><Name>{p}</Name></Topic>" for p in topics)
    g = f"<Group>{group}</Group>" if group else ""
    return (
        f"<Destination><Name>{name}</Name>{g}<SyncType>{sync}</SyncType>"
        f"<Transport><InetAddr>127.0.0.1:{port}</InetAddr></Transport>{t}{inner}</Destination>"
    )


def levels(findings):
    return [(f.level, f.instance) for f in findings]


def pair(a_dest=None, b_dest=None, **kw):
    a = instance("a", 9010, a_dest if a_dest is not None else dest("b", 9020))
    b = instance("b", 9020, b_dest if b_dest is not None else dest("a", 9010), **kw)
    return [a, b]


def test_a_sync_pair_has_no_finding():
    configs = pair()
    assert check_set(configs) == []
    assert describe_links(configs) == ["  a -> b: sync, topics .*", "  b -> a: sync, topics .*"]


def test_names_must_be_unique():
    a = instance("a", 9010, dest("b", 9020))
    b = instance("b", 9020, dest("a", 9010))
    again = instance("a", 9030)
    found = check_set([a, b, again])
    assert levels(found)[0] == ("error", "a")
    assert "a.xml and a.xml both have <Name>a</Name>" in found[0].message


def test_a_destination_outside_the_set():
    [f] = [f for f in check_set(pair(a_dest=dest("c", 9020))) if f.level == "error"]
    assert f.instance == "a"
    assert "destination c is not an instance of the set (a, b); give its file too" in f.message


def test_the_address_must_be_the_replication_transport():
    found = check_set(pair(a_dest=dest("b", 9021)))
    assert [f.level for f in found if f.instance == "a"] == ["error", "warning"]
    assert "none of its addresses is b's replication transport; give 127.0.0.1:9020" in (
        found[0].message
    )
    assert "127.0.0.1:9021 is b's client transport c" in found[1].message


def test_a_failover_address_that_is_wrong_is_a_warning():
    two = dest("b", 9020).replace(
        "</Transport>", "</Transport><Transport><InetAddr>127.0.0.1:9999</InetAddr></Transport>", 1
    )
    [f] = check_set(pair(a_dest=two))
    assert (f.level, f.instance) == ("warning", "a")
    assert "127.0.0.1:9999 is not b's replication transport (127.0.0.1:9020)" in f.message


def test_groups_must_agree():
    found = check_set(pair(a_dest=dest("b", 9020, group="ny")))
    assert levels(found) == [("error", "a")]
    assert "<Group>ny</Group>, but b's group is b (its <Name>, having no <Group>)" in (
        found[0].message
    )


def test_topics_one_way_only_is_a_warning():
    found = check_set(
        pair(
            a_dest=dest("b", 9020, topics=("orders", "md\\..*")),
            b_dest=dest("a", 9010, topics=("orders",)),
        )
    )
    assert levels(found) == [("warning", "a")]
    assert "topics md\\..* are sent to b and not sent back" in found[0].message
    assert "add them to b's destination a" in found[0].message


def test_no_sync_destination_is_a_warning_saying_what_is_at_risk():
    found = check_set(pair(a_dest=dest("b", 9020, sync="async")))
    assert levels(found) == [("warning", "a")]
    assert "accepts publishes and has no sync destination" in found[0].message
    assert "lost with the machine" in found[0].message


def test_one_way_replication_warns_that_messages_never_reach():
    a = instance("a", 9010, dest("b", 9020))
    b = instance("b", 9020)
    found = check_set([a, b])
    assert levels(found) == [("warning", "b"), ("warning", "a")]
    assert "accepts publishes and has no sync destination" in found[0].message
    assert "messages published on b never reach a" in found[1].message


def test_a_receive_only_instance_is_not_warned_about_sync():
    a = instance("a", 9010, dest("b", 9020))
    b = instance("b", 9020, client=False)
    assert check_set([a, b]) == []


def test_no_replication_transport():
    a = instance("a", 9010, dest("b", 9020))
    b = load_config_text(
        "<TickertapeConfig><Name>b</Name><Replication>" + dest("a", 9010) + "</Replication>"
        "<TransactionLog><JournalDirectory>j</JournalDirectory><Topic><Name>.*</Name></Topic>"
        "</TransactionLog></TickertapeConfig>",
        env={},
    )
    found = check_set([a, b])
    assert found[0].level == "error" and "b has no replication transport" in found[0].message


def test_tls_must_agree(tmp_path):
    from tests.security.certs import make_pki

    pki = make_pki(tmp_path)
    served = (
        f"<Certificate>{pki.server_cert}</Certificate><PrivateKey>{pki.server_key}</PrivateKey>"
    )
    found = check_set(pair(repl_extra=served))
    assert levels(found) == [("error", "a")]
    assert "b's replication transport r serves TLS; add <TLS>true</TLS>" in found[0].message
    tls = dest("b", 9020).replace("</InetAddr>", "</InetAddr><TLS>true</TLS>")
    found = check_set(pair(a_dest=tls))
    assert levels(found) == [("error", "a")]
    assert "but b's replication transport r has no <Certificate>" in found[0].message


def test_authentication_on_the_destination(tmp_path):
    users = tmp_path / "users.db"
    set_password(users, "root", "pw", ScryptParams(n=1 << 10))
    secret = tmp_path / "pw"
    secret.write_text("pw\n")
    auth = f"<Authentication><PasswordFile>{users}</PasswordFile></Authentication>"
    found = check_set(pair(extra=auth))
    assert levels(found) == [("error", "a")]
    assert "b has <Authentication>, and the link gives no credentials" in found[0].message
    creds = f"<User>repl</User><PasswordFile>{secret}</PasswordFile>"
    found = check_set(pair(a_dest=dest("b", 9020, inner=creds), extra=auth))
    assert "user repl is not in the destination's password file" in found[0].message
    set_password(users, "repl", "pw", ScryptParams(n=1 << 10))
    assert check_set(pair(a_dest=dest("b", 9020, inner=creds), extra=auth)) == []
    roles = "<Entitlement><Role><Name>ops</Name><Users>root</Users><Admin>true</Admin></Role></Entitlement>"
    found = check_set(pair(a_dest=dest("b", 9020, inner=creds), extra=auth + roles))
    assert "user repl has no role with <Admin>true</Admin> on b" in found[0].message
    roles = roles.replace("root", "root,repl")
    assert check_set(pair(a_dest=dest("b", 9020, inner=creds), extra=auth + roles)) == []


def test_pass_through_paths_are_noted():
    # c's messages reach b directly and through a: b gets two copies
    a = instance("a", 9010, dest("b", 9020, inner="<PassThrough>c</PassThrough>") + dest("c", 9030))
    b = instance("b", 9020, dest("a", 9010) + dest("c", 9030))
    c = instance("c", 9030, dest("a", 9010) + dest("b", 9020))
    found = check_set([a, b, c])
    assert levels(found) == [("note", "b")]
    assert "receives messages published on c from c and a (pass-through)" in found[0].message


def test_the_example_sets_cross_verify():
    pair_ = [load_config(p, env={}) for p in sorted((EXAMPLES / "replication-pair").glob("*.xml"))]
    assert [c.name for c in pair_] == ["tt-1", "tt-2"]
    assert check_set(pair_) == []
    trio = [load_config(p, env={}) for p in sorted((EXAMPLES / "replication-trio").glob("*.xml"))]
    assert [c.name for c in trio] == ["ldn-1", "ny-1", "ny-2"]
    found = check_set(trio)
    # the remote instance's async-only replication is the one risk, and it is stated
    assert levels(found) == [("warning", "ldn-1")]
    assert "has no sync destination" in found[0].message
    assert {c.name: c.group for c in trio} == {"ldn-1": "ldn", "ny-1": "ny", "ny-2": "ny"}


def test_cli_with_several_files(capsys, tmp_path):
    paths = [str(p) for p in sorted((EXAMPLES / "replication-trio").glob("*.xml"))]
    assert main(["serve", "--verify-config", *paths]) == 0
    out = capsys.readouterr().out
    assert "set of 3 instances (ldn-1, ny-1, ny-2): 1 warning(s)" in out
    assert "  ny-1 -> ldn-1: async, topics .*, pass-through ny" in out
    assert "warning: ldn-1: accepts publishes and has no sync destination" in out
    a, b = (tmp_path / "a.xml", tmp_path / "b.xml")
    pair_dir = EXAMPLES / "replication-pair"
    a.write_text((pair_dir / "tt-1.xml").read_text())
    b.write_text(
        (pair_dir / "tt-2.xml").read_text().replace("<Group>tt-1</Group>", "<Group>x</Group>")
    )
    assert main(["serve", "--verify-config", str(a), str(b)]) == 2
    captured = capsys.readouterr()
    assert "set of 2 instances (tt-1, tt-2): 1 error(s)" in captured.out
    assert "error: tt-2: destination tt-1: <Group>x</Group>, but tt-1's group is tt-1" in (
        captured.err
    )


def test_cli_checks_the_set_only_when_every_file_is_valid(capsys, tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<TickertapeConfig/>")
    good = EXAMPLES / "replication-pair" / "tt-1.xml"
    assert main(["serve", "--verify-config", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "missing <Name>" in err
    assert "the set of 2 files is not checked until every file is valid" in err


@pytest.mark.parametrize("name", ["minimal.xml"])
def test_cli_with_one_file_is_unchanged(capsys, name):
    assert main(["serve", "--verify-config", str(EXAMPLES / name)]) == 0
    out = capsys.readouterr().out
    assert "configuration is valid" in out and "set of" not in out
