"""State of the World topics (issue 25): publish into a SOW topic, query it, restart with it.

    ./run bench bench_sow [--count 1000000] [--keys 100000] [--reps 3] [--parts 4]
                          [--big-keys 1000000] [--quick]
    ./run bench bench_sow --history 10000000 [--keys 100000] [--reps 3] [--parts 4]
                          [--max-checkpoints 2GB]

Per repetition, fresh servers, one after the other:

  plain publish   `--count` persisted publishes of 100 B bodies to a recorded topic (no SOW),
                  in `--parts` runs as the SOW publish (each run's ramp and drain weigh the
                  same on both: msgs/s is count over the sum of the runs' times)
  SOW publish     the same bodies to a SOW topic keyed on /key: `--keys` keys, each updated
                  count/keys times (the body carries `"key":N`, N = seq mod keys); published in
                  `--parts` runs, the time between two runs noted for the historical queries
  query all       `sow` of the whole topic (`--keys` records), from the command to `completed`:
                  records/s and server CPU µs per record; read raw (as the peers are), and
                  again with the client library (`Client.sow`: a Message per record)
  query filtered  `sow` with `/key < keys/10` (a tenth of the records): the same figures, and the
                  CPU ratio to the unfiltered query
  historical      `sow` with `bm` = each time between two runs (the state then: every key):
                  seconds, and the ratio to the current query (the cost should not grow with
                  how far back the point is)
  restart         a clean stop and start: seconds to `listening on`, and the store's catch-up
                  from the server log (`SOW store at journal position ...`)
  rebuild         the store directory removed, then a start: the store rebuilt from the whole
                  journal (`--count` records): seconds to `listening on`
  RSS             server VmRSS (and its anonymous part) after the SOW publish, after the
                  restart, and the plain server's
  JetStream KV    peer: a KV bucket holding the same latest records, every key's last value
                  delivered to a push consumer (deliver_policy last_per_subject)
  Redis           peer: the same records as hashes, HGETALL of each, pipelined 1,000 at a time
  big store       `--big-keys` keys each published once into a fresh SOW server: RSS against
                  the `--keys` server's, then a clean restart (seconds to `listening on`) and
                  a query of all of them

`--history N` measures only the historical queries, on a journal of N updates (one server): N
updates over `--keys` keys in `--parts` runs, then `--reps` rounds of a current query and a
historical one at each point between two runs (its own section, bench_sow_history), with the
worst point's median ratio, the worst single ratio, and the checkpoints' count and size on disk;
`--max-checkpoints` sets `<SOW><MaxCheckpointSize>`. The points fall wherever the runs end,
so more `--parts` sample more positions between two checkpoints (the worst one is just before
a checkpoint: a whole interval folded).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import sys
import time

import benchlib
import loadgen
import peers
from sow_peers import jetstream_kv, redis_hashes

from protocol.bookmarks import format_timestamp

SOW_TOPIC = "bench.sow"
PLAIN_TOPIC = "bench.plain"
SOW_XML = f"""  <SOW>
    <Topic><Name>{SOW_TOPIC}</Name><Key>/key</Key></Topic>
  </SOW>
"""
_CAUGHT_UP = re.compile(
    r"SOW store at journal position (\d+): (\d+) records read from \d+ in ([0-9.]+)s"
)


def keyed_frames(keys: int, start: int):
    """loadgen.build_publish_frames with a key in each body: {"seq":S,"key":S mod keys,...},
    S from start."""

    def build(proto: str, dest: str, n: int, size: int, inbox: str = ""):
        assert proto == "tickertape"
        t = dest.encode()
        parts = []
        for s in range(start, start + n):
            head = b'{"seq":%d,"key":%d,"pad":"' % (s, s % keys)  # strict JSON: no zero padding
            body = head + b"x" * max(0, size - len(head) - 2) + b'"}'
            h = b'{"c":"publish","t":"%s","s":%d,"a":"persisted"}' % (t, s - start + 1)
            parts.append(loadgen._U32.pack(len(h) + len(body)) + h + body)
        return loadgen.Frames(parts)

    return build


def publish(peer, topic: str, n: int, args, tag: str, start: int = 1) -> dict:
    """n keyed publishes (seq start..start+n-1 in the bodies): msgs/s and server CPU µs/msg."""
    loadgen.build_publish_frames = keyed_frames(args.keys, start)
    r, cpu = benchlib.timed_load(peer, args, n=n, pub_dest=topic, tag=tag)
    if r["timed_out"] or r["errors"] or r["acked"] < n:
        raise RuntimeError(f"publish: {r['acked']}/{n} acked, errors {r['errors']}")
    return {"rate": n / r["pub_seconds"], "cpu_us": cpu / n * 1e6}


def publish_parts(peer, topic: str, n: int, args, tag: str, marks: list | None = None) -> tuple:
    """n keyed publishes in `--parts` runs (module docstring): (msgs/s over the sum of the runs'
    times, server CPU µs/msg); with marks, (updates before, µs) of the time between two runs."""
    secs = cpu = 0.0
    for i in range(args.parts):
        lo, hi = n * i // args.parts, n * (i + 1) // args.parts
        if i and marks is not None:
            time.sleep(0.05)
            marks.append((lo, int(time.time() * 1e6)))
            time.sleep(0.05)
        got = publish(peer, topic, hi - lo, args, f"{tag}.{i}", start=lo + 1)
        secs += (hi - lo) / got["rate"]
        cpu += got["cpu_us"] * (hi - lo)
    return n / secs, cpu / n


def _frame(h: dict) -> bytes:
    b = json.dumps(h, separators=(",", ":")).encode()
    return len(b).to_bytes(4, "big") + b


def query(peer, timeout: float, **fields) -> dict:
    """One `sow` on a fresh connection: records, seconds from the command to `completed`,
    server CPU seconds over that time."""
    with socket.create_connection((peer.host, peer.port), timeout=timeout) as s:
        s.sendall(_frame({"c": "logon", "cid": "l", "client_name": f"q{time.monotonic_ns()}"}))
        cpu0 = peer.cpu_seconds()
        t0 = time.perf_counter()
        s.sendall(_frame({"c": "sow", "t": SOW_TOPIC, "cid": "q", "a": "completed", **fields}))
        buf = bytearray()
        records = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = s.recv(1 << 20)
            if not data:
                raise RuntimeError("server closed the query connection")
            buf += data
            pos = 0
            while len(buf) - pos >= 4:
                n = int.from_bytes(buf[pos : pos + 4], "big")
                if len(buf) - pos - 4 < n:
                    break
                start, pos = pos + 4, pos + 4 + n
                if buf[start : start + 10] == b'{"c":"sow"':
                    records += 1
                    continue
                h, _ = json.JSONDecoder().raw_decode(
                    bytes(buf[start:pos]).decode("utf-8", "replace")
                )
                if h.get("c") == "ack" and h.get("cid") == "q":
                    if h.get("status") == "failure":
                        raise RuntimeError(f"query refused: {h}")
                    secs = time.perf_counter() - t0
                    return {"records": records, "s": secs, "cpu": peer.cpu_seconds() - cpu0}
            del buf[:pos]
    raise RuntimeError(f"query did not complete in {timeout}s")


def query_client(peer, timeout: float) -> dict:
    """`Client.sow` of the whole topic (the client library, client/client_sow.py): records,
    seconds from the call to its return (every record a Message), server CPU seconds."""
    import asyncio

    import client

    async def go() -> dict:
        c = client.Client(f"bench-q{time.monotonic_ns()}", server=f"{peer.host}:{peer.port}")
        await c.connect()
        await c.logon()
        try:
            cpu0 = peer.cpu_seconds()
            t0 = time.perf_counter()
            records = await c.sow(SOW_TOPIC, timeout=timeout)
            secs = time.perf_counter() - t0
            return {"records": len(records), "s": secs, "cpu": peer.cpu_seconds() - cpu0}
        finally:
            await c.close()

    return asyncio.run(go())


def latest_bodies(n: int, keys: int, size: int) -> list[tuple[int, int, bytes]]:
    """(key, seq, body) of each key's latest message after publishes 1..n (keyed_frames)."""
    out = []
    for k in range(min(keys, n)):
        s = n - ((n - k) % keys)
        head = b'{"seq":%d,"key":%d,"pad":"' % (s, k)
        out.append((k, s, head + b"x" * max(0, size - len(head) - 2) + b'"}'))
    return out


def _timed_restart(peer, timeout: float) -> float:
    t0 = time.monotonic()
    peer.restart(timeout=timeout)
    return time.monotonic() - t0


def one_rep(args, r: int) -> dict:
    out: dict = {}
    n, keys = args.count, args.keys
    plain = peers.make_peer("tickertape")
    try:
        plain.start(timeout=args.timeout)
        out["plain_rate"], out["plain_cpu"] = publish_parts(
            plain, PLAIN_TOPIC, n, args, f"plain{r}"
        )
        out["plain_rss"] = plain.rss_bytes()
    finally:
        plain.cleanup()
    sow = peers.make_peer("tickertape")
    sow.extra["config_xml"] = SOW_XML
    try:
        sow.start(timeout=args.timeout)
        marks: list = []
        out["sow_rate"], out["sow_cpu"] = publish_parts(sow, SOW_TOPIC, n, args, f"sow{r}", marks)
        out["sow_rss"] = sow.rss_bytes()
        out["sow_anon"] = anon_bytes(sow)
        q = query(sow, args.timeout)
        if q["records"] != keys:
            raise RuntimeError(f"query all: {q['records']} records, expected {keys}")
        out["q_rate"], out["q_cpu_us"] = q["records"] / q["s"], q["cpu"] / q["records"] * 1e6
        out["q_s"] = q["s"]
        c = query_client(sow, args.timeout)
        if c["records"] != keys:
            raise RuntimeError(f"query all (client library): {c['records']} records")
        out["qc_s"] = c["s"]
        f = query(sow, args.timeout, f=f"/key < {keys // 10}")
        if f["records"] != keys // 10:
            raise RuntimeError(f"filtered: {f['records']} records, expected {keys // 10}")
        out["qf_s"], out["qf_cpu"] = f["s"], f["cpu"]
        out["qf_cpu_ratio"] = f["cpu"] / q["cpu"] if q["cpu"] else None
        for j, (done, mark) in enumerate(marks):
            h = query(sow, args.timeout, bm=format_timestamp(mark))
            if h["records"] != min(keys, done):
                raise RuntimeError(
                    f"historical: {h['records']} records, expected {min(keys, done)}"
                )
            out[f"hist{j}_s"] = h["s"]
            out[f"hist{j}_ratio"] = h["s"] / q["s"]
        out["hist_worst_ratio"] = max(out[f"hist{j}_ratio"] for j in range(len(marks)))
        out["restart_s"] = _timed_restart(sow, args.timeout)
        m = _CAUGHT_UP.findall(sow.log_text()[sow.extra.get("log_from", 0) :])
        out["restart_catchup_s"] = float(m[-1][2]) if m else None
        time.sleep(0.5)
        out["restart_rss"] = sow.rss_bytes()
        sow.stop()
        shutil.rmtree(os.path.join(sow.journal_dir(), "sow"))
        out["rebuild_s"] = _timed_restart(sow, args.timeout)
        m = _CAUGHT_UP.findall(sow.log_text()[sow.extra.get("log_from", 0) :])
        out["rebuild_fold_s"] = float(m[-1][2]) if m else None
        q2 = query(sow, args.timeout)
        if q2["records"] != keys:
            raise RuntimeError(f"after the rebuild: {q2['records']} records, expected {keys}")
    finally:
        sow.cleanup()
    bodies = latest_bodies(n, keys, args.size)
    if peers.available("jetstream")[0]:
        js = jetstream_kv(args, bodies)
        out["js_s"], out["js_cpu_us"] = js["s"], js["cpu"] / js["records"] * 1e6
        out["q_vs_js"] = js["s"] / out["q_s"]
        out["qc_vs_js"] = js["s"] / out["qc_s"]
    if peers.available("redis-everysec")[0]:
        rd = redis_hashes(args, bodies)
        out["redis_s"], out["redis_cpu_us"] = rd["s"], rd["cpu"] / rd["records"] * 1e6
        out["q_vs_redis"] = rd["s"] / out["q_s"]
    if args.big_keys:
        out.update(big_store(args, r))
        out["rss_big_ratio"] = out["big_rss"] / out["sow_rss"]
        out["anon_big_ratio"] = out["big_anon"] / out["sow_anon"]
    return out


def history_only(args) -> str:
    """`--history N`: the historical queries on an N-update journal (module docstring); the
    section's text."""
    n, keys, parts = args.history, args.keys, args.parts
    sow = peers.make_peer("tickertape")
    sow.extra["config_xml"] = (
        SOW_XML.replace(
            "<SOW>", f"<SOW><MaxCheckpointSize>{args.max_checkpoints}</MaxCheckpointSize>"
        )
        if args.max_checkpoints
        else SOW_XML
    )
    rounds: list[dict] = []
    try:
        sow.start(timeout=args.timeout)
        marks: list = []
        t0 = time.monotonic()
        publish_parts(sow, SOW_TOPIC, n, args, "hist", marks)
        published = time.monotonic() - t0
        time.sleep(2)  # the last checkpoint copy (a thread) finishes
        cdir = os.path.join(sow.journal_dir(), "sow-checkpoints")
        ckpt = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cdir) for f in fs)
        ckpts = len([c for c in os.listdir(cdir) if c.isdigit()])
        journal = sum(
            os.path.getsize(os.path.join(d, f))
            for d, _, fs in os.walk(sow.journal_dir())
            for f in fs
        )
        for r in range(args.reps):
            q = query(sow, args.timeout)
            if q["records"] != keys:
                raise RuntimeError(f"query all: {q['records']} records, expected {keys}")
            got = {"q_s": q["s"], "q_cpu": q["cpu"]}
            for j, (done, mark) in enumerate(marks):
                h = query(sow, args.timeout, bm=format_timestamp(mark))
                if h["records"] != min(keys, done):
                    raise RuntimeError(f"historical: {h['records']} records")
                got[f"h{j}_s"], got[f"h{j}_ratio"] = h["s"], h["s"] / q["s"]
                got[f"h{j}_cpu"] = h["cpu"]
            rounds.append(got)
            print(
                f"  round {r + 1}/{args.reps}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items())
            )
    finally:
        sow.cleanup()

    def cell(k: str) -> str:
        v = [g[k] for g in rounds]
        return f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"

    lines = [
        "| measure | figure |",
        "|---|---:|",
        f"| query all {keys:,} records, s | {cell('q_s')} |",
    ]
    lines.append(f"| query all, server CPU s | {cell('q_cpu')} |")
    for j, (done, _mark) in enumerate(marks):
        lines.append(
            f"| historical query at update {done:,} ({n - done:,} updates back), s | "
            f"{cell(f'h{j}_s')} |"
        )
        lines.append(f"| ÷ query all (current) | {cell(f'h{j}_ratio')} |")
    if marks:
        med = {j: statistics.median(g[f"h{j}_ratio"] for g in rounds) for j in range(len(marks))}
        worst = max(med, key=med.__getitem__)
        lines.append(
            f"| worst point (update {marks[worst][0]:,}): ÷ query all, median of its "
            f"repetitions | {med[worst]:.2f} |"
        )
        every = [g[f"h{j}_ratio"] for g in rounds for j in range(len(marks))]
        lines.append(f"| worst single repetition at any point, ÷ query all | {max(every):.2f} |")
        cpu = [g[f"h{j}_cpu"] for g in rounds for j in range(len(marks))]
        lines.append(
            f"| historical query, server CPU s, median (range) over every point | "
            f"{statistics.median(cpu):.2f} ({min(cpu):.2f}–{max(cpu):.2f}) |"
        )
        # by server CPU, which the machine's other jobs move less than the wall time
        q_cpu = statistics.median(g["q_cpu"] for g in rounds)
        by_cpu = {j: statistics.median(g[f"h{j}_cpu"] for g in rounds) for j in med}
        worst_cpu = max(by_cpu, key=by_cpu.__getitem__)
        lines.append(
            f"| costliest point by server CPU (update {marks[worst_cpu][0]:,}): its median "
            f"÷ the current query's | {by_cpu[worst_cpu] / q_cpu:.2f} |"
        )
    lines.append(
        f"| checkpoints kept after the publish: count, MiB | {ckpts}, {ckpt / 2**20:,.0f} |"
    )
    cap = f", <MaxCheckpointSize> {args.max_checkpoints}" if args.max_checkpoints else ""
    notes = [
        f"{n:,} persisted publishes of {args.size} B over {keys:,} keys in {parts} runs "
        f"({published:.0f} s; journal directory {journal / 2**30:.2f} GiB with the checkpoints),"
        f" one server{cap}; then "
        f"{len(rounds)} rounds of a current query and a historical one at each point between "
        "two runs; median (range in brackets)",
        "the machine is shared with other jobs: figures are indicative",
    ]
    text = benchlib.header_block(
        "bench_sow --history: historical queries on a long journal",
        ["bench_sow"] + sys.argv[1:],
        notes,
    )
    return text + "\n\n" + "\n".join(lines) + "\n"


def anon_bytes(peer) -> int:
    """The server's anonymous resident memory (its heap: VmRSS less the mapped files, of which
    the SOW store's LMDB map is one: page cache the kernel can take back)."""
    return peers.proc_status_kb(peer.pid, "RssAnon") * 1024


def big_store(args, r: int) -> dict:
    """A store of `--big-keys` records (each key published once): RSS after the publish and
    after a clean restart, and the seconds from the restart to `listening on`."""
    out = {}
    big = peers.make_peer("tickertape")
    big.extra["config_xml"] = SOW_XML
    try:
        big.start(timeout=args.timeout)
        keys, args.keys = args.keys, args.big_keys
        try:
            got = publish(big, SOW_TOPIC, args.big_keys, args, f"big{r}")
        finally:
            args.keys = keys
        out["big_rate"] = got["rate"]
        time.sleep(0.5)
        out["big_rss"] = big.rss_bytes()
        out["big_anon"] = anon_bytes(big)
        out["big_restart_s"] = _timed_restart(big, args.timeout)
        time.sleep(0.5)
        out["big_restart_rss"] = big.rss_bytes()
        q = query(big, args.timeout)
        if q["records"] != args.big_keys:
            raise RuntimeError(f"big store: {q['records']} records, expected {args.big_keys}")
        out["big_q_s"] = q["s"]
    finally:
        big.cleanup()
    return out


def shown(m: dict) -> str:
    return (
        f"publish plain {m['plain_rate']:,.0f}/s, SOW "
        f"{m['sow_rate']:,.0f}/s; query all {m['q_s']:.2f}s (JetStream KV "
        f"{m.get('js_s', 0):.2f}s, Redis {m.get('redis_s', 0):.2f}s); filtered "
        f"{m['qf_s']:.2f}s; historical worst {m['hist_worst_ratio']:.2f}x current; "
        f"restart {m['restart_s']:.2f}s; rebuild {m['rebuild_s']:.2f}s; big store "
        f"restart {m.get('big_restart_s', 0):.2f}s, RSS {m.get('big_rss', 0) / 2**20:.0f} MiB"
    )


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=1_000_000, help="publishes (updates)")
    p.add_argument("--keys", type=int, default=100_000, help="SOW keys (records)")
    p.add_argument("--parts", type=int, default=4, help="publish runs (historical points between)")
    p.add_argument(
        "--big-keys", type=int, default=1_000_000, help="records of the RSS/restart store (0: skip)"
    )
    p.add_argument("--window", type=int, default=1000, help="most unacked publishes")
    p.add_argument(
        "--history", type=int, default=0, help="only the historical queries, on N updates"
    )
    p.add_argument(
        "--max-checkpoints", default="", help="<SOW><MaxCheckpointSize> (--history; default none)"
    )
    benchlib.run_args(p, quick="50k updates over 5k keys, 1 repetition")
    p.set_defaults(timeout=600.0)  # the longest step: a 1M-record publish or rebuild
    args = p.parse_args()
    if args.quick:
        args.count, args.keys, args.reps = min(args.count, 50_000), min(args.keys, 5_000), 1
        args.big_keys = min(args.big_keys, 50_000)
    benchlib.tickertape_only()
    if args.history:
        benchlib.emit("bench_sow_history", history_only(args), args.no_results)
        return
    reps, problems = benchlib.repeat("", args.reps, lambda r: one_rep(args, r), show=shown)

    med = benchlib.medians(reps).get

    def cell(k, f, scale=1.0):
        v = [m[k] * scale for m in reps if m.get(k) is not None]
        if not v:
            return "—"
        s = f.format(statistics.median(v))
        return s + (f" ({f.format(min(v))}–{f.format(max(v))})" if len(v) > 1 else "")

    def ratio(a, b):
        x, y = med(a), med(b)
        return f"{x / y:.2f}" if x and y else "—"

    n, keys = args.count, args.keys
    mib = 1 / 2**20
    lines = [
        "| measure | figure |",
        "|---|---:|",
        f"| publish, plain recorded topic, msgs/s | {cell('plain_rate', '{:,.0f}')} |",
        f"| publish, SOW topic ({keys:,} keys), msgs/s | {cell('sow_rate', '{:,.0f}')} |",
        f"| ratio SOW ÷ plain (msgs/s) | {ratio('sow_rate', 'plain_rate')} |",
        f"| server CPU µs/msg, plain | {cell('plain_cpu', '{:.1f}')} |",
        f"| server CPU µs/msg, SOW | {cell('sow_cpu', '{:.1f}')} |",
        f"| query all {keys:,} records, s | {cell('q_s', '{:.2f}')} |",
        f"| query all, records/s | {cell('q_rate', '{:,.0f}')} |",
        f"| query all, server CPU µs/record | {cell('q_cpu_us', '{:.1f}')} |",
        f"| query all with the client library (`Client.sow`, a Message each), s | "
        f"{cell('qc_s', '{:.2f}')} |",
        f"| query `/key < {keys // 10}` ({keys // 10:,} records), s | {cell('qf_s', '{:.2f}')} |",
        f"| filtered ÷ unfiltered server CPU | {cell('qf_cpu_ratio', '{:.2f}')} |",
    ]
    for j in range(1, args.parts):
        at = n * j // args.parts
        lines.append(
            f"| historical query at update {at:,} ({min(keys, at):,} records, "
            f"{n - at:,} updates back), s | {cell(f'hist{j - 1}_s', '{:.2f}')} |"
        )
        lines.append(f"| ÷ query all (current) | {cell(f'hist{j - 1}_ratio', '{:.2f}')} |")
    lines += [
        f"| restart (clean stop, start), s to listening | {cell('restart_s', '{:.2f}')} |",
        f"| store rebuilt from {n:,} journal records, s to listening | {cell('rebuild_s', '{:.2f}')} |",
        f"| of which the fold (server log), s | {cell('rebuild_fold_s', '{:.2f}')} |",
        f"| RSS MiB, plain server after publish | {cell('plain_rss', '{:.1f}', mib)} |",
        f"| RSS MiB, SOW server after publish | {cell('sow_rss', '{:.1f}', mib)} |",
        f"| of which anonymous (heap; the rest is mapped files) | {cell('sow_anon', '{:.1f}', mib)} |",
        f"| RSS MiB, SOW server after restart | {cell('restart_rss', '{:.1f}', mib)} |",
        f"| JetStream KV: last value of {keys:,} keys (last_per_subject), s | "
        f"{cell('js_s', '{:.2f}')} |",
        f"| JetStream KV, server CPU µs/record | {cell('js_cpu_us', '{:.1f}')} |",
        f"| query all speed ÷ JetStream KV (time ratio) | {cell('q_vs_js', '{:.2f}')} |",
        f"| query all with the client library ÷ JetStream KV (time ratio) | "
        f"{cell('qc_vs_js', '{:.2f}')} |",
        f"| Redis: HGETALL of {keys:,} hashes, pipelined 1,000, s | {cell('redis_s', '{:.2f}')} |",
        f"| Redis, server CPU µs/record | {cell('redis_cpu_us', '{:.1f}')} |",
        f"| query all speed ÷ Redis (time ratio) | {cell('q_vs_redis', '{:.2f}')} |",
    ]
    if args.big_keys:
        b = args.big_keys
        lines += [
            f"| big store: {b:,} keys published once, msgs/s | {cell('big_rate', '{:,.0f}')} |",
            f"| RSS MiB, big store after publish | {cell('big_rss', '{:.1f}', mib)} |",
            f"| ÷ RSS of the {keys:,}-record server | {cell('rss_big_ratio', '{:.2f}')} |",
            f"| anonymous RSS MiB, big store | {cell('big_anon', '{:.1f}', mib)} |",
            f"| ÷ anonymous RSS of the {keys:,}-record server | "
            f"{cell('anon_big_ratio', '{:.2f}')} |",
            f"| big store restart (clean stop, start), s to listening | "
            f"{cell('big_restart_s', '{:.2f}')} |",
            f"| RSS MiB, big store after restart | {cell('big_restart_rss', '{:.1f}', mib)} |",
            f"| query all {b:,} records, s | {cell('big_q_s', '{:.2f}')} |",
        ]
    notes = [
        f"{n:,} persisted publishes of {args.size} B over {keys:,} keys, window {args.window}; "
        f"median of {len(reps)} repetitions (range in brackets); fresh servers per repetition",
        "peers read the same latest records: JetStream KV = a bucket (stream KV_bench, one "
        "message per subject) read by an ephemeral push consumer with deliver_policy "
        "last_per_subject, from its creation to the last value; Redis = hashes h:<key> "
        "(seq, key, pad), HGETALL pipelined 1,000 at a time; all three read by the same Python "
        "client process, one connection, each with a raw reader of its protocol (no nats-py or "
        "redis-py here, so none of the three goes through a client library); the query with "
        "Tickertape's client library (client/, `Client.sow`) is beside, for what a user gets",
        "time ratios > 1: Tickertape faster",
        "the machine is shared with other jobs: figures are indicative",
    ]
    if args.quick:
        notes.append("--quick: small counts, one repetition")
    title = "bench_sow: State of the World topics"
    benchlib.write_section("bench_sow", title, notes, "\n".join(lines), problems, args.no_results)


if __name__ == "__main__":
    main()
