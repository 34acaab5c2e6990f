"""The fault campaign at the seams (issue 23): a replicated set under every fault at once.

    ./run bench fault_campaign --seams --rounds 50 --seed 1 [--faults drop,stall,...] [--json F]

The runner is bench/campaign_runner.py's (rounds, seeds, totals, --keep, --time-limit, replay
with `--first-round R --rounds 1`). A round:

1. A pair or a trio (tests/support/cluster.py's `Cluster`, each replication link through a
   `LinkProxy`), each link sync or async at random (sync ones downgrade after 1 s), each
   instance on a 32 MB tmpfs of its own. Authentication and entitlements: publishers, queue
   consumers, an HA subscriber, and two desk users whose roles carry a content filter
   (alice: /desk = 'A', bob: /desk = 'B'); the links log on as an admin user. Two queues over
   the topic, one at-least-once and one at-most-once, with `<QueueOwnerFailover>` 1 s.
2. Load: one pipelining publisher per instance (moving to the next instance when its
   connection is lost, resending from what the instance it reaches says it stored); on every
   instance an acknowledging consumer of the at-least-once queue and a consumer of the
   at-most-once queue (as a random one of cons, alice, bob); alice and bob replaying the topic
   from the start, moving on when cut; an HAClient bookmark subscriber over every instance.
3. Faults, one or two of the enabled classes, at once, each on a random target:
   `drop` / `stall` / `delay` one or both directions of a link for 0.5-2 s, then heal;
   `kill` -9 an instance, restart it 0.2-1.5 s later; `disk-full` fill an instance's disk for
   0.3-1.5 s. Add-ons, not drawn: `maint` (about one round in eight, or every round when it
   is the only class) runs on one random instance the `<Actions>` archive -> compact -> remove
   every 4 s (journal segments of 64 KB, ages of 1 s), and the round lasts until a run that
   archived ended or MAINT_WAIT_S passed; in half of them the faults wait for the instance's
   first journal job, to land while it runs. Each job is a local Spark JVM: bench/seams_spark.py
   starts it for less (the same job; a class-data archive dumped once per campaign, C1, one
   task), about 13 s a job instead of 30 s, hence still only a share of the rounds);
   `filter-delete` (every round while enabled): alice
   acknowledges desk B's at-least-once messages by filter, which her content filter must make
   a no-op.
4. Everything healed and restarted, publishers finish, the set converges (bounded waits), all
   stop cleanly and the oracle (bench/seams_oracle.py) reads every journal and archive.

Each round runs in a child process (`play`), its servers in the child's process group, under
ROUND_LIMIT_S: a round that hangs is killed whole and reported with its last phase
(`phases.txt` in the round's directory; on stderr too with TT_SEAMS_TRACE=1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import multiprocessing
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

from campaign_runner import Mode, SetupError, mount_tmpfs
from fault_campaign import Publisher, Violation, fill
from seams_clients import (
    ALO_QUEUE,
    AMO_QUEUE,
    TOPIC,
    USERS,
    DeskSubscriber,
    FilterDeleter,
    HASubscriber,
    Ledger,
    QueueConsumer,
    body,
    login,
    msg_id,
    stored_ids,
)
from seams_oracle import (
    archive_ids,
    check_desks,
    check_ha,
    check_queues,
    check_stored,
    journal_ids,
    queue_journal,
    queue_left,
    skipped_ids,
)
from seams_spark import prepare as prepare_spark

from server.ids import publisher_id
from tests.support.cluster import Cluster

FAULTS = ("drop", "stall", "delay", "kill", "disk-full", "maint", "filter-delete")
ADDONS = ("maint", "filter-delete")  # not drawn as a round's fault: joined to rounds (pick)
MAINT_SHARE = 0.125
DISK = "32m"
PUBLISH_WAIT_S = 60.0
CONVERGE_WAIT_S = 10.0
# how long a maint round waits for a run that archived; TT_SEAMS_MAINT_WAIT on a slow machine
MAINT_WAIT_S = float(os.environ.get("TT_SEAMS_MAINT_WAIT", "90"))
ROUND_LIMIT_S = 150.0  # start, load, PUBLISH_WAIT_S, convergence, stop: a round past it hung
TRACE = bool(os.environ.get("TT_SEAMS_TRACE"))  # phase times and fault windows on stderr


# the HA client's reconnect warnings are expected here (the oracle judges the outcome)
logging.getLogger("tickertape.client").setLevel(logging.ERROR)


_phases: str | None = None  # the round's phases.txt, in the round's process


def trace(t0: float, what: str) -> None:
    line = f"    +{time.monotonic() - t0:6.2f}s {what}"
    if TRACE:
        print(line, file=sys.stderr, flush=True)
    if _phases:
        with open(_phases, "a") as f:
            f.write(line + "\n")


QUEUES = f"""<SOW>
  <Queue><Name>{ALO_QUEUE}</Name><UnderlyingTopic>{TOPIC}</UnderlyingTopic><LeasePeriod>5s</LeasePeriod>
    <MaxPerSubscriptionBacklog>20</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>{AMO_QUEUE}</Name><UnderlyingTopic>{TOPIC}</UnderlyingTopic><Semantics>at-most-once</Semantics>
    <MaxPerSubscriptionBacklog>20</MaxPerSubscriptionBacklog></Queue>
</SOW>"""

ROLES = f"""<Entitlement>
  <Role><Name>links</Name><Users>repl</Users><Admin>true</Admin></Role>
  <Role><Name>publishers</Name><Users>pub</Users><Publish>{TOPIC}</Publish>
    <Subscribe>{TOPIC}</Subscribe><Replay>{TOPIC}</Replay></Role>
  <Role><Name>workers</Name><Users>cons</Users><Consume>{ALO_QUEUE}|{AMO_QUEUE}</Consume></Role>
  <Role><Name>watch</Name><Users>hasub</Users><Subscribe>{TOPIC}</Subscribe><Replay>{TOPIC}</Replay></Role>
  <Role><Name>desk-a</Name><Users>alice</Users><Subscribe>{TOPIC}</Subscribe><Replay>{TOPIC}</Replay>
    <Consume>{ALO_QUEUE}|{AMO_QUEUE}</Consume><Filter><Topic>{TOPIC}</Topic><Expression>/desk = 'A'</Expression></Filter></Role>
  <Role><Name>desk-b</Name><Users>bob</Users><Subscribe>{TOPIC}</Subscribe><Replay>{TOPIC}</Replay>
    <Consume>{ALO_QUEUE}|{AMO_QUEUE}</Consume><Filter><Topic>{TOPIC}</Topic><Expression>/desk = 'B'</Expression></Filter></Role>
</Entitlement>"""

STEPS = [("amps-action-do-archive-journal", "<Age>1s</Age>"),
         ("tickertape-action-do-compact-journal", "<Retention>1s</Retention>"),
         ("amps-action-do-remove-journal", "<Age>1s</Age>")]  # fmt: skip
ACTIONS = (
    "<Actions><Action><On><Module>amps-action-on-schedule</Module><Options><Every>4s</Every>"
    "<Name>seams-maintenance</Name></Options></On>"
    + "".join(f"<Do><Module>{m}</Module><Options>{o}</Options></Do>" for m, o in STEPS)
    + "</Action></Actions>"
)
MAINT_JOURNAL = "<JournalSize>64KB</JournalSize><JournalArchiveDirectory>{dir}/archive</JournalArchiveDirectory>"


def pick(rng: random.Random, faults: list[str]) -> str:
    main = [f for f in faults if f not in ADDONS]
    n = rng.choice((1, 1, 2))
    chosen = sorted({rng.choice(main) for _ in range(n)} if main else set(), key=FAULTS.index)
    if "maint" in faults and (not main or rng.random() < MAINT_SHARE):
        chosen.append("maint")
    if "filter-delete" in faults:  # every round: the check is cheap
        chosen.append("filter-delete")
    return "+".join(chosen)


def make_cluster(data: str, rng: random.Random, maint: bool) -> tuple[Cluster, str | None]:
    """The round's set, and the instance that runs the maintenance schedule (None: none)."""
    from tests.security.servers import users_file

    names = ["tt-a", "tt-b", "tt-c"][: rng.choice((2, 2, 3))]
    for n in names:
        mount_tmpfs(os.path.join(data, n), DISK)
    users_file(os.path.join(data, "users.db"), USERS)  # type: ignore[arg-type]
    pw = os.path.join(data, "repl.pw")
    with open(os.open(pw, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(USERS["repl"] + "\n")
    pairs = [(a, b) for a in names for b in names if a != b]
    auth = f"<Authentication><PasswordFile>{data}/users.db</PasswordFile></Authentication>"
    cl = Cluster(
        data, names, sync={p: rng.random() < 0.5 for p in pairs}, topics=(TOPIC, ALO_QUEUE, AMO_QUEUE),
        downgrade_after="1s", queue_owner_failover="1s", link_user=("repl", pw),
        extra=QUEUES + auth + ROLES, journal_extra=MAINT_JOURNAL if maint else "",
    )  # fmt: skip
    where = None
    if maint:  # one instance runs the schedule: one Spark job at a time on a small machine
        where = rng.choice(names)
        cfg = Path(cl[where].config_path)
        xml = cfg.read_text()
        cfg.write_text(xml.replace("</TickertapeConfig>", ACTIONS + "</TickertapeConfig>"))
    return cl, where


class Faults:
    """Injects one fault and records its window {kind, start, end, target | link}."""

    def __init__(self, cl: Cluster, rng: random.Random):
        self.cl, self.rng = cl, rng
        self.windows: list[dict] = []

    async def inject(self, kind: str) -> None:
        cl, rng = self.cl, self.rng
        w: dict = {"kind": kind, "start": time.monotonic()}
        if kind in ("drop", "stall", "delay"):
            a, b = rng.choice(cl.pairs)
            both = rng.random() < 0.5
            links = [cl.link(a, b)] + ([cl.link(b, a)] if both else [])
            w["link"] = f"{a}{'<' if both else ''}->{b}"
            delay = rng.uniform(0.02, 0.2)
            for p in links:
                p.drop() if kind == "drop" else p.stall() if kind == "stall" else p.delay(delay)
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            for p in links:
                p.pass_()
        elif kind == "kill":
            w["target"] = t = rng.choice(cl.names)
            cl[t].kill()
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            await asyncio.to_thread(cl[t].start)
        elif kind == "disk-full":
            w["target"] = t = rng.choice(cl.names)
            filler = os.path.join(cl[t].directory, "filler")
            await asyncio.to_thread(fill, filler)
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            os.unlink(filler)
        w["end"] = time.monotonic()
        self.windows.append(w)


def start_all(cl: Cluster) -> None:
    """Start every instance at once (each start waits for its listening line)."""
    with concurrent.futures.ThreadPoolExecutor(len(cl.names)) as ex:
        for f in [ex.submit(i.start) for i in cl]:
            f.result()


def stop_all(cl: Cluster) -> list[str]:
    """SIGTERM every instance at once; an instance that does not stop is a problem."""

    def stop(i) -> str:
        try:
            i.stop()
            return ""
        except Exception:
            i.kill()
            return f"{i.name}: SIGTERM did not stop it within 20 s"

    with concurrent.futures.ThreadPoolExecutor(len(cl.names)) as ex:
        return [p for p in ex.map(stop, cl) if p]


def _archived(i) -> bool:
    cat = os.path.join(i.directory, "archive", "_catalog")
    return os.path.isdir(cat) and bool(os.listdir(cat))


def maintenance_runs(cl: Cluster) -> int:
    """Runs of the maintenance action that ended (done, or a step failed) on any instance."""
    return sum(1 for i in cl for line in list(i.lines)
               if "action seams-maintenance: done" in line or "later steps skipped" in line)  # fmt: skip


def maintenance_done(cl: Cluster) -> dict[str, int]:
    """What the maint instance's steps changed: archive and compaction results applied (its
    `_maint/applied/` answers, which outlive a restart) and segments removed (the log of its
    last start: a removal before a kill is not counted)."""
    out = {"archives_applied": 0, "compactions_applied": 0, "segments_removed": 0}
    for i in cl:
        adir = os.path.join(i.directory, "journal", "_maint", "applied")
        for name in os.listdir(adir) if os.path.isdir(adir) else ():
            try:
                with open(os.path.join(adir, name)) as f:
                    applied = json.load(f).get("status") == "applied"
            except (OSError, ValueError):
                continue
            kind = "archives_applied" if name.startswith("archive") else "compactions_applied"
            out[kind] += applied
        for line in list(i.lines):
            m = re.search(r"remove-journal: removed (\d+) segments", line)
            out["segments_removed"] += int(m.group(1)) if m else 0
    return out


async def wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await pred():
            return True
        await asyncio.sleep(0.2)
    return False


def job_started(i) -> bool:
    """Whether the instance has asked for an archive or a compaction (its journal job starts)."""
    rdir = os.path.join(i.directory, "journal", "_maint", "requests")
    return os.path.isdir(rdir) and bool(os.listdir(rdir))


async def round_async(cl: Cluster, rng: random.Random, label: str, maint: str | None) -> dict:
    kinds = label.split("+")
    names = cl.names
    ports = [cl[n].port for n in names]
    ledger = Ledger()
    stop = asyncio.Event()
    pubs, tasks = [], []
    for k, n in enumerate(names):
        p = Publisher(f"fc-seam-{n}", random.Random(rng.random()), TOPIC, body, login("pub"))
        p.window = rng.choice((5, 50))  # not 1: a sync round trip per message makes long rounds
        tries = iter(range(k, 1 << 30))  # home first; after a lost connection, the next one
        pubs.append(p)
        tasks.append(asyncio.create_task(p.run(lambda t=tries: ports[next(t) % len(ports)],
                                               stop, rng.randrange(100, 400))))  # fmt: skip
    consumers, desk_consumers = [], []
    for n in names:
        consumers.append(QueueConsumer(n, cl[n].port, ALO_QUEUE, ledger))
        user = rng.choice(("cons", "alice", "bob"))
        amo = QueueConsumer(n, cl[n].port, AMO_QUEUE, ledger, user)
        consumers.append(amo)
        if user != "cons":
            desk_consumers.append((amo, "A" if user == "alice" else "B"))
    pairs = list(zip(names, ports, strict=True))
    desks = [DeskSubscriber("alice", "A", pairs, rng.randrange(len(names))),
             DeskSubscriber("bob", "B", pairs, rng.randrange(len(names)))]  # fmt: skip
    k = rng.randrange(len(names))
    deleter = FilterDeleter("alice", "B", names[k], ports[k])
    order = cl.addresses(rng.sample(names, len(names)))
    ha = HASubscriber(order, lambda what: trace(ledger.t0, what))
    tasks += [asyncio.create_task(c.run(stop)) for c in (*consumers, *desks, ha)]
    if "filter-delete" in kinds:
        tasks.append(asyncio.create_task(deleter.run(stop)))
    await asyncio.sleep(rng.uniform(0.2, 0.8))
    if maint is not None and rng.random() < 0.5:  # the faults land on a journal job under way
        started = await wait_for(lambda: _true(job_started(cl[maint])), MAINT_WAIT_S / 2)
        trace(ledger.t0, f"{maint}'s journal job started: {started}")
    faults = Faults(cl, rng)
    trace(ledger.t0, f"faults {kinds}")
    await asyncio.gather(*(faults.inject(k) for k in kinds if k not in ADDONS))
    for w in faults.windows:
        trace(ledger.t0, f"window {w['kind']} {w.get('target') or w.get('link')} "
                         f"+{w['start'] - ledger.t0:.2f}..+{w['end'] - ledger.t0:.2f}s")  # fmt: skip
    problems: list[str] = []
    t_end = time.monotonic() + PUBLISH_WAIT_S
    while any(p.acked < p.target for p in pubs):
        if time.monotonic() > t_end:
            problems.append(f"publishers stalled: {[(p.acked, p.target) for p in pubs]}")
            break
        await asyncio.sleep(0.1)
    trace(ledger.t0, f"published {[(p.name, p.acked) for p in pubs]}")
    acked = {publisher_id(p.name): p.acked for p in pubs}
    want = {(pid, s) for pid, top in acked.items() for s in range(1, top + 1)}
    if "maint" in kinds:  # the oracle holds at any time; a run that archived is worth more
        before: list[int] = []

        async def archived_run() -> bool:
            if not before and any(_archived(i) for i in cl):
                before.append(maintenance_runs(cl))  # the run that archived ends after this
            return bool(before) and maintenance_runs(cl) > before[0]

        await wait_for(archived_run, MAINT_WAIT_S)
        trace(ledger.t0, f"maintenance runs ended: {maintenance_runs(cl)}, archived: {before}")

    async def converged() -> bool:
        for i in cl:
            try:
                have = await stored_ids(i.port)
            except (OSError, ConnectionError, TimeoutError, EOFError, Violation):
                return False
            if not want <= have | archive_ids(os.path.join(i.directory, "archive")):
                return False
        return True

    await wait_for(converged, CONVERGE_WAIT_S)  # the oracle says what is missing where
    trace(ledger.t0, "converged (or gave up)")
    await wait_for(lambda: _true(want <= set(map(msg_id, ha.seen))), CONVERGE_WAIT_S / 2)
    trace(ledger.t0, "HA subscriber done (or gave up)")
    await asyncio.sleep(0.5)  # queue consumers take what is left
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"acked": acked, "skipped": {publisher_id(p.name): p.skipped for p in pubs}, "ledger": ledger, "windows": faults.windows, "ha": ha,
            "desks": desks, "desk_consumers": desk_consumers, "deleter": deleter if "filter-delete" in kinds else None, "problems": problems,
            "maint_runs": maintenance_runs(cl)}  # fmt: skip


async def _true(v: bool) -> bool:
    return v


def check(cl: Cluster, out: dict) -> tuple[dict, list[str]]:
    acked = out["acked"]
    stored = {}
    for i in cl:
        jids, bad = journal_ids(os.path.join(i.directory, "journal"))
        stored[i.name] = (jids, archive_ids(os.path.join(i.directory, "archive")), bad)
    queues = {q: {i.name: queue_journal(os.path.join(i.directory, "journal"), q) for i in cl}
              for q in (ALO_QUEUE, AMO_QUEUE)}  # fmt: skip
    stats = {"acked": sum(acked.values())}
    violations = list(out["problems"])
    skipped = skipped_ids(out["skipped"])
    held = {k for k in skipped if any(k in j or k in a for j, a, _ in stored.values())}
    for part in (check_stored(acked, stored, skipped), check_queues(out["ledger"], out["windows"], queues),
                 check_ha(out["ha"].seen, out["ha"].errors, acked, held),
                 check_desks(out["desks"], out["desk_consumers"], out["deleter"])):  # fmt: skip
        stats.update(part[0])
        violations += part[1]
    # not a promise (a queue may keep messages when its consumers are cut from their owner),
    # but a healed set should have acknowledged nearly all: shown, not judged. Left: still to
    # deliver on some instance, by its journal; unconfirmed: done everywhere, but the consumer
    # never saw its ack's answer (the instance was killed before it went out)
    want = {(pid, s) for pid, top in acked.items() for s in range(1, top + 1)}
    left = want & set().union(*(queue_left(os.path.join(i.directory, "journal"), ALO_QUEUE)
                                for i in cl))  # fmt: skip
    confirmed = {msg_id(bm) for _, _, q, bm in out["ledger"].acked if q == ALO_QUEUE}
    stats["queue_left"] = len(left)
    stats["queue_unconfirmed"] = len(want - confirmed - left)
    stats["failovers"] = out["ha"].failovers
    stats["maint_runs"] = out["maint_runs"]
    stats.update(maintenance_done(cl))
    return stats, violations


def _play(rng: random.Random, label: str, data: str) -> tuple[dict, list[str]]:
    cl, maint = make_cluster(data, rng, "maint" in label)
    try:
        t0 = time.monotonic()
        start_all(cl)
        trace(t0, "cluster started")
        out = asyncio.run(round_async(cl, rng, label, maint))
        t0 = time.monotonic()
        out["problems"] += stop_all(cl)
        trace(t0, "stopped")
        for i in cl:  # for --keep: what each instance said since its last start
            Path(i.directory, "server.log").write_text(i.output() + "\n")
        result = check(cl, out)
        trace(t0, "checked")
        return result
    except Violation as exc:
        return {}, [str(exc)]
    except Exception as exc:  # a round that could not run is a failure, with its reason
        return {}, [f"round failed: {type(exc).__name__}: {exc}"]
    finally:
        cl.close()


_maint_env: dict[str, str] | None = None  # seams_spark.prepare's, once per campaign


def _child(rng: random.Random, label: str, data: str, conn) -> None:
    global _phases
    if "maint" in label and _maint_env:
        os.environ.update(_maint_env)  # this round's servers and their Spark children
    os.setpgrp()  # the round's servers join this group: a hung round is killed whole
    _phases = os.path.join(data, "phases.txt")
    try:
        conn.send(_play(rng, label, data))
    except SetupError as exc:
        conn.send(("setup", str(exc)))


def play(r: int, rng: random.Random, label: str, data: str) -> tuple[dict, list[str]]:
    """One round in a child process with a deadline: a client that hangs (or spins) is a
    finding, not the end of the campaign."""
    global _maint_env
    if "maint" in label and _maint_env is None:  # the campaign's root: kept to its end
        _maint_env = prepare_spark(os.path.dirname(data))
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(rng, label, data, send))
    child.start()
    send.close()
    limit = ROUND_LIMIT_S + (MAINT_WAIT_S if "maint" in label else 0)
    res = None
    try:
        res = recv.recv() if recv.poll(limit) else None
        child.join(30 if res is not None else 0)
    finally:  # hung, or the campaign itself was stopped: the round's process group goes
        if child.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.join(10)
    if res is None:
        try:
            last = [x.strip() for x in Path(data, "phases.txt").read_text().splitlines()[-3:]]
        except OSError:
            last = []
        return {}, [f"round hung: no result within {limit:.0f} s (last phases: {last or 'none'})"]
    if res[0] == "setup":
        raise SetupError(res[1])
    return res


SEAMS = Mode(
    name="seams",
    faults=FAULTS,
    stat_keys=(
        "acked",
        "lost",
        "lost_async",
        "duplicated",
        "archived",
        "archive_only",
        "queue_delivered",
        "queue_acked",
        "queue_again",
        "queue_excused",
        "queue_excused_journal",
        "queue_left",
        "queue_unconfirmed",
        "ha_delivered",
        "ha_twice",
        "ha_missed",
        "ha_missed_async",
        "desk_delivered",
        "entitlement_breaches",
        "failovers",
        "maint_runs",
        "archives_applied",
        "compactions_applied",
        "segments_removed",
    ),
    pick=pick,
    play=play,
    replay_flags="--seams",
)
