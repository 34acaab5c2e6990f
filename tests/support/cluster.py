"""A replication set of real servers on loopback, and a TCP proxy that cuts links between them.

`Cluster(tmp_path, ["tt-a", "tt-b"])` writes one config per instance (docs: the "Replication"
section of the configuration contract): a client transport and a `replication` transport on
fixed free loopback ports (fixed so that a restarted instance comes back where the clients and
the other instances look for it), and one `<Destination>` for every other instance. Each
directed link source -> destination goes through a `LinkProxy` owned by the test process, so a
test cuts A -> B with `cluster.link("tt-a", "tt-b").drop()` (connections closed, new ones
refused until `pass_()`) or `.stall()` (bytes held: the link looks alive and says nothing).
`.delay(0.05)` holds every read for that long before passing it on (a slow link), and
`cluster.cut("tt-a", "tt-b")` does both directions.

Instances are `ServerProcess`es: `cluster["tt-a"].kill()` is kill -9, `.start()` brings it back
on the same ports and data directory. Everything is bounded: every wait has a timeout, the proxy
holds at most `LinkProxy.MAX_BUFFER` bytes per direction, and `close()` stops every process and
proxy thread this cluster started (tests call it from a fixture's teardown).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable

from .proc import ServerProcess
from .raw import Raw

__all__ = ["Cluster", "LinkProxy", "free_port", "wait_until"]

_POLL = 0.01


# Ports handed out for a server to bind later come from below the kernel's ephemeral range
# (32768-60999 by default), so no outgoing connection can take one meanwhile, and from a slice
# of their own per pytest-xdist worker, so two workers never hand out the same one.
# TT_PORT_SLOT (default 0, up to 11) moves a whole run to other slices, so two checkouts testing on one
# machine at once do not race for the same ports.
_PORT_LOW, _PORT_HIGH = 20_000, 32_000
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
_checkout = os.environ.get("TT_PORT_SLOT", "0")
_SLICE = 500
_slot = (int(_worker) if _worker.isdigit() else 0) + 2 * (
    int(_checkout) if _checkout.isdigit() else 0
)
_slice_start = _PORT_LOW + _slot * _SLICE % (_PORT_HIGH - _PORT_LOW)
_next_port = itertools.count()


def free_port() -> int:
    """A loopback port free right now, for a server started afterwards (see above)."""
    for _ in range(_SLICE):
        port = _slice_start + next(_next_port) % _SLICE
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {_slice_start}..{_slice_start + _SLICE - 1}")


def wait_until(pred: Callable[[], object], timeout: float = 30.0, what: str = "condition"):
    """Poll `pred` until it returns a true value (returned); AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not true within {timeout}s (last: {last!r})")


class LinkProxy:
    """A threaded TCP proxy from a listening loopback port to `target`, with three modes.

    States (`mode`):

    ```
    pass   bytes flow both ways; new connections are forwarded
    delay  as pass, but every read waits `delay_s` before it is passed on (a slow, far link)
    stall  connections stay open but no byte moves (the peers' TCP windows fill up)
    drop   every current connection is closed; new ones are accepted and closed at once
    ```

    Any mode can move to any other. Per connection, two pump threads move at most 64 KiB per
    read; nothing is buffered in the proxy beyond one read per direction.
    """

    MAX_BUFFER = 65536

    def __init__(self, target: tuple[str, int], name: str = "link"):
        self.target = target
        self.name = name
        self.mode = "pass"
        self.delay_s = 0.0
        self.connections = 0  # accepted and forwarded, over the proxy's life
        self.bytes = 0  # moved in both directions
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name=f"proxy-{name}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<LinkProxy {self.name} :{self.port} -> {self.target[1]} {self.mode}>"

    def pass_(self) -> None:
        self.mode = "pass"

    def stall(self) -> None:
        self.mode = "stall"

    def delay(self, seconds: float) -> None:
        """Pass bytes on, each read `seconds` late (at most 5 s: a delay, not a stall)."""
        self.delay_s = min(max(seconds, 0.0), 5.0)
        self.mode = "delay"

    def drop(self) -> None:
        """Close every connection now and refuse (accept and close) new ones."""
        self.mode = "drop"
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, set()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self.mode = "drop"
        self._close_all()
        self._thread.join(2)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.mode == "drop" or self._closed:
                conn.close()
                continue
            try:
                up = socket.create_connection(self.target, timeout=2)
            except OSError:
                conn.close()  # the target is down: the source sees a refused link
                continue
            self.connections += 1
            with self._lock:
                self._socks.update((conn, up))
            for a, b in ((conn, up), (up, conn)):
                a.settimeout(0.1)
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed:
                mode = self.mode
                if mode == "drop":
                    break
                if mode == "stall":
                    time.sleep(_POLL)
                    continue
                try:
                    data = src.recv(self.MAX_BUFFER)
                except TimeoutError:
                    continue
                if not data:
                    break
                if self.mode == "delay":
                    time.sleep(self.delay_s)
                while self.mode == "stall" and not self._closed:
                    time.sleep(_POLL)  # a read in hand waits too: nothing moves while stalled
                if self.mode == "drop" or self._closed:
                    break
                dst.sendall(data)
                self.bytes += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._socks.discard(src)
                self._socks.discard(dst)
            src.close()


def _topics_xml(topics: Iterable[str]) -> str:
    return "".join(
        f"<Topic><Name>{t}</Name><MessageType>json</MessageType></Topic>" for t in topics
    )


class Instance(ServerProcess):
    """One member of a Cluster: a ServerProcess with fixed ports and a name."""

    def __init__(self, cluster: Cluster, name: str, directory, config_xml: str, args=()):
        super().__init__(directory, config_xml=config_xml, args=args)
        self.name = name
        self.cluster = cluster

    def start(self, timeout: float = 30.0) -> Instance:
        super().start(timeout)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def admin_get(self, path: str, timeout: float = 5.0):
        """GET an admin endpoint; JSON decoded when the answer is JSON, else the text."""
        url = f"http://127.0.0.1:{self.admin_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as r:
            data = r.read()
        try:
            return json.loads(data)
        except ValueError:
            return data.decode()

    def admin_post(self, path: str, timeout: float = 5.0):
        """POST an admin action (with the header the admin endpoint asks of actions)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}",
            data=b"",
            method="POST",
            headers={"X-Requested-By": "tickertape-console"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
        try:
            return json.loads(data)
        except ValueError:
            return data.decode()

    def replay(
        self, topic: str = ".*", since: str = "0", timeout: float = 60.0
    ) -> list[tuple[str, bytes]]:
        """Every recorded message of `topic` (a regex) after `since` (a bookmark; EPOCH by
        default) in this instance's journal order, as (bookmark, body) pairs: a bookmark replay
        that stops at `completed`."""
        c = Raw(self.port, timeout=timeout)
        try:
            c.logon(f"replayer-{time.monotonic_ns()}")
            c.send({"c": "subscribe", "t": topic, "bm": since, "cid": "r",
                    "a": "processed,completed", "o": "bookmark_not_found=epoch"})  # fmt: skip
            frames = c.recv_until(lambda h, b: h.get("a") == "completed", timeout=timeout)
        finally:
            c.close()
        return [(h["bm"], b) for h, b in frames if h.get("c") == "p"]

    def per_publisher(self, topic: str = ".*") -> dict[str, list[int]]:
        """Sequences per publisher id in journal order: `{publisher: [seq, ...]}`."""
        out: dict[str, list[int]] = {}
        for bm, _ in self.replay(topic):
            pub, seq = bm.split("|")[:2]
            out.setdefault(pub, []).append(int(seq))
        return out

    def replication_stats(self) -> dict:
        """The `replication` part of /stats (empty when the server has none)."""
        return self.admin_get("/stats").get("replication") or {}


class Cluster:
    """2-3 instances that replicate to each other through LinkProxies (module docstring).

    `sync`: every destination's `<SyncType>` (True: sync), or a dict {(source, dest): bool} for
    single links (missing pairs are async). `topics`: the recorded and replicated topic
    regexes. `downgrade_after`: `<DowngradeAfter>` text for every sync destination (None: never).
    `extra`: XML added to every config (queues, say); `journal_extra`: XML added inside every
    `<TransactionLog>` (`<JournalSize>`, `<JournalArchiveDirectory>`: `{dir}` in it is the
    instance's directory). `link_user`: (user, password file) every destination logs on with
    (for instances with `<Authentication>`). `links`: the directed pairs that get a
    destination (default every ordered pair). `proxy=False`: destinations point straight at
    the other instance's replication port (benchmarks: no proxy thread in the path, no cuts).
    """

    def __init__(
        self,
        directory,
        names: Iterable[str] = ("tt-a", "tt-b"),
        *,
        sync: bool | dict[tuple[str, str], bool] = True,
        topics: Iterable[str] = (".*",),
        downgrade_after: str | None = None,
        pass_through: str | None = None,
        queue_owner_failover: str | None = None,
        extra: str = "",
        journal_extra: str = "",
        link_user: tuple[str, str] | None = None,
        links: Iterable[tuple[str, str]] | None = None,
        groups: dict[str, str] | None = None,
        proxy: bool = True,
        args=(),
    ):
        self.directory = str(directory)
        self.names = list(names)
        self.topics = list(topics)
        self.ports = {n: free_port() for n in self.names}
        self.repl_ports = {n: free_port() for n in self.names}
        pairs = list(links) if links is not None else [
            (a, b) for a in self.names for b in self.names if a != b
        ]  # fmt: skip
        self.proxies: dict[tuple[str, str], LinkProxy] = {}
        self.pairs = pairs
        if proxy:
            for a, b in pairs:
                self.proxies[(a, b)] = LinkProxy(("127.0.0.1", self.repl_ports[b]), f"{a}->{b}")
        self.groups = groups or {}
        self.journal_extra = journal_extra
        self.link_user = link_user
        self.instances: dict[str, Instance] = {}
        for n in self.names:
            dests = []
            for a, b in pairs:
                if a != n:
                    continue
                is_sync = sync.get((a, b), False) if isinstance(sync, dict) else sync
                p = self.proxies.get((a, b))
                port = p.port if p is not None else self.repl_ports[b]
                dests.append(self._destination(b, port, is_sync, downgrade_after, pass_through))
            xml = self._config(n, dests, queue_owner_failover, extra)
            self.instances[n] = Instance(self, n, f"{self.directory}/{n}", xml, args)

    def _destination(self, dest, port, is_sync, downgrade_after, pass_through) -> str:
        parts = [
            f"<Name>{dest}</Name>",
            f"<Group>{self.groups.get(dest, dest)}</Group>",
            f"<SyncType>{'sync' if is_sync else 'async'}</SyncType>",
            f"<Transport><InetAddr>127.0.0.1:{port}</InetAddr><Type>replication</Type></Transport>",
            _topics_xml(self.topics),
        ]
        if pass_through:
            parts.append(f"<PassThrough>{pass_through}</PassThrough>")
        if downgrade_after and is_sync:
            parts.append(f"<DowngradeAfter>{downgrade_after}</DowngradeAfter>")
        if self.link_user:
            user, password_file = self.link_user
            parts.append(f"<User>{user}</User><PasswordFile>{password_file}</PasswordFile>")
        return "<Destination>" + "".join(parts) + "</Destination>"

    def _config(self, name, dests, queue_owner_failover, extra) -> str:
        d = f"{self.directory}/{name}"
        group = f"<Group>{self.groups[name]}</Group>" if name in self.groups else ""
        owner = (
            f"<QueueOwnerFailover>{queue_owner_failover}</QueueOwnerFailover>"
            if queue_owner_failover
            else ""
        )
        replication = f"<Replication>{''.join(dests)}{owner}</Replication>" if dests else ""
        return f"""<TickertapeConfig>
  <Name>{name}</Name>{group}
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:{self.ports[name]}</InetAddr>
      <MessageType>json</MessageType><Protocol>amps</Protocol></Transport>
    <Transport><Name>repl-in</Name><Type>replication</Type><InetAddr>127.0.0.1:{self.repl_ports[name]}</InetAddr></Transport>
  </Transports>
  <Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
  <Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target></Logging>
  <TransactionLog><JournalDirectory>{d}/journal</JournalDirectory>{self.journal_extra.replace("{dir}", d)}{_topics_xml(self.topics)}</TransactionLog>
  {replication}
  {extra}
</TickertapeConfig>
"""

    # ------------------------------------------------------------------ access

    def __getitem__(self, name: str) -> Instance:
        return self.instances[name]

    def __iter__(self):
        return iter(self.instances.values())

    def addresses(self, names: Iterable[str] | None = None) -> list[str]:
        """`host:port` of each instance's client transport (the HA client's server list)."""
        return [f"127.0.0.1:{self.ports[n]}" for n in (names or self.names)]

    def link(self, source: str, dest: str) -> LinkProxy:
        return self.proxies[(source, dest)]

    # ------------------------------------------------------------------ faults

    def cut(self, a: str, b: str, how: str = "drop") -> None:
        """Cut both directions between `a` and `b` (`drop` or `stall`)."""
        for pair in ((a, b), (b, a)):
            p = self.proxies.get(pair)
            if p is not None:
                p.drop() if how == "drop" else p.stall()

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Let bytes flow again between `a` and `b` (every link when no names are given)."""
        for (s, d), p in self.proxies.items():
            if a is None or {s, d} == {a, b}:
                p.pass_()

    # ------------------------------------------------------------------ life

    def start(self, names: Iterable[str] | None = None) -> Cluster:
        """Start the named instances (all by default) in order."""
        for n in names or self.names:
            self.instances[n].start()
        return self

    def close(self) -> None:
        """Kill every instance still running and stop every proxy (idempotent)."""
        for inst in self.instances.values():
            inst.kill()
        for p in self.proxies.values():
            p.close()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
