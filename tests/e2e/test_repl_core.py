"""Replication between real server processes (server/replication/): a message published on one
instance reaches the others with the same bookmark, a restarted destination converges with no
gap and no duplicate, pass-through forwards across three instances, and a full mesh does not echo.
"""

import json
import socket
import time

from tests.support.proc import ServerProcess
from tests.support.raw import Raw


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def config(d, name, repl_port, dests, group=None, pass_through=None):
    """dests: [(name, repl port)]; group defaults to the instance name."""
    dx = "".join(
        f"""<Destination><Name>{n}</Name><Group>{n}</Group><SyncType>async</SyncType>
        <Transport><InetAddr>127.0.0.1:{p}</InetAddr><Type>replication</Type></Transport>
        <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
        {f"<PassThrough>{pass_through}</PassThrough>" if pass_through else ""}</Destination>"""
        for n, p in dests
    )
    return f"""<TickertapeConfig>
  <Name>{name}</Name>
  {f"<Group>{group}</Group>" if group else ""}
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
      <MessageType>json</MessageType><Protocol>amps</Protocol></Transport>
    <Transport><Name>repl-in</Name><Type>replication</Type><InetAddr>127.0.0.1:{repl_port}</InetAddr></Transport>
  </Transports>
  <Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target></Logging>
  <TransactionLog><JournalDirectory>{d}/journal</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  {f"<Replication>{dx}</Replication>" if dests else ""}
</TickertapeConfig>
"""


def instance(tmp_path, name, port, dests, **kw):
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return ServerProcess(d, config_xml=config(d, name, port, dests, **kw))


def publish(port, client, first, last, topic="orders"):
    p = Raw(port)
    p.logon(client)
    for i in range(first, last + 1):
        p.send({"c": "publish", "t": topic, "s": i, "a": "persisted"}, json.dumps({"i": i}))
    while p.ack("persisted")["s"] < last:
        pass
    p.close()


def replay(port, topic="orders", bm="0"):
    c = Raw(port)
    c.logon("replayer")
    c.send({"c": "subscribe", "t": topic, "bm": bm, "cid": "r", "a": "processed,completed"})
    frames = c.recv_until(lambda h, b: h.get("a") == "completed", timeout=30)
    c.close()
    return [(h["bm"], json.loads(b)["i"]) for h, b in frames if h["c"] == "p"]


def converge(port, want, topic="orders", timeout=30.0):
    """The replay at `port` once it holds `want` messages (or what it holds at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        got = replay(port, topic)
        if len(got) >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_two_instances_same_bookmarks_and_resync_after_kill(tmp_path):
    pa, pb = free_ports(2)
    a = instance(tmp_path, "tt-a", pa, [("tt-b", pb)]).start()
    b = instance(tmp_path, "tt-b", pb, [("tt-a", pa)]).start()
    try:
        assert a.wait_for_log("replication: instance tt-a .* sends to tt-b")
        publish(a.port, "pub-a", 1, 200)
        at_a = replay(a.port)
        at_b = converge(b.port, 200)
        assert at_b == at_a  # same bookmarks, same order (one publisher)
        # a bookmark taken at A resumes at B
        bm100 = at_a[99][0]
        assert [i for _, i in replay(b.port, bm=bm100)] == list(range(101, 201))
        # kill -9 B, publish more at A, restart B: B converges, no duplicate, in order
        b.kill()
        publish(a.port, "pub-a", 201, 2000)
        b.start()
        at_b = converge(b.port, 2000)
        assert [i for _, i in at_b] == list(range(1, 2001))
        assert at_b == replay(a.port)
        # publishing at B comes back to A, and nothing echoes
        publish(b.port, "pub-b", 1, 50, topic="other")
        assert len(converge(a.port, 50, topic="other")) == 50
        time.sleep(1.0)
        assert len(replay(a.port)) == 2000 and len(replay(b.port, "other")) == 50
    finally:
        a.stop()
        b.stop()


def test_pass_through_and_a_full_mesh_do_not_echo(tmp_path):
    pa, pb, pc = free_ports(3)
    # chain: A -> B -> C; B forwards what came from A's group
    a = instance(tmp_path, "tt-a", pa, [("tt-b", pb)]).start()
    b = instance(tmp_path, "tt-b", pb, [("tt-c", pc)], pass_through="tt-a").start()
    c = instance(tmp_path, "tt-c", pc, []).start()
    try:
        publish(a.port, "pub-a", 1, 100)
        assert converge(c.port, 100) == replay(a.port)
    finally:
        for s in (a, b, c):
            s.stop()
    # full mesh, every instance forwards everything: each message is stored once everywhere
    mesh = {"tt-a": pa, "tt-b": pb, "tt-c": pc}
    procs = {}
    for n, p in mesh.items():
        peers = [(m, q) for m, q in mesh.items() if m != n]
        d = tmp_path / ("mesh-" + n)
        d.mkdir()
        procs[n] = ServerProcess(d, config_xml=config(d, n, p, peers, pass_through=".*")).start()
    try:
        for k, n in enumerate(procs):
            publish(procs[n].port, f"pub-{n}", 1, 100, topic=f"t{k}")
        for n in procs:
            for k in range(3):
                got = converge(procs[n].port, 100, topic=f"t{k}")
                assert [i for _, i in got] == list(range(1, 101)), (n, k)
        time.sleep(1.5)  # an echo would show up by now
        for n in procs:
            for k in range(3):
                assert len(replay(procs[n].port, f"t{k}")) == 100
    finally:
        for s in procs.values():
            s.stop()
