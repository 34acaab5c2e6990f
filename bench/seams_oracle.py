"""The one oracle of a seams round (bench/fault_seams.py), checked after every fault healed.

1. Stored: every acknowledged (publisher, sequence) is in the journal or the archive of every
   instance, and no journal holds one twice (read offline, after a clean stop: `journal_ids`,
   `archive_ids`).
2. Queues: no at-least-once message is delivered after its acknowledgement was confirmed, and
   no at-most-once message is delivered twice; but where docs/replication.md ("Semantics")
   allows it, which is counted as `queue_excused` (of which `queue_excused_journal` by the
   journals, the rest by the fault windows), not as a violation. On the same instance,
   never (an at-most-once delivery leaves only once its event is durable there, so a restart
   does not deliver it again). On another instance, Y after X, it is judged by what Y's
   journal held when Y delivered (`queue_journal`, `Judge`): Y journals the done events of
   other instances where they arrive (replicated records), and its own delivery either before
   it leaves (at most once: the DELIVERED event) or with the next commit after it (at least
   once: the lease). Allowed if X's done event (acknowledgement, delivery) and everything X
   journaled after it (replication keeps X's order) came after Y's own: a partition, a
   takeover within the replication lag, or a publisher that moved and sent the message again
   to Y before X's copy reached it (both own it). At most once, the same is asked of X about
   Y's delivery (the ledger's times are the consumers' reads, not the sends). A violation: Y's
   journal had a done event of the message from elsewhere, or X's later events, before its
   own; or, at most once, an instance that delivered it has no delivery event of its own (the
   delivery left before its event was durable). The limit of the rule at least once: a lease
   made in the commit that also journals X's acknowledgement (its own events come first) reads
   as made before it.
   Where a journal does not hold the message (maintenance removed it) or, at least once, the
   lease event (lost with a killed instance), the fault windows decide: while a link was
   dropped or stalled, or up to `GRACE` seconds after it healed (a partition: both sides own);
   after the instance of the acknowledgement (or first delivery) was killed within `GRACE`
   seconds after it (the event may not have replicated; a delivery read up to 0.5 s after the
   kill was on its way before it).
3. The HA subscriber got every acknowledged message, and none twice.
4. Entitlements: a desk user (alice, bob) was never handed a message of the other desk, live,
   replayed or from a queue, and alice's sow_delete by filter of desk B's queue messages
   deleted none; nobody was handed bytes that were not published.
"""

from __future__ import annotations

import bisect
import collections
import os
from dataclasses import dataclass, field

from seams_clients import ALO_QUEUE, AMO_QUEUE, TOPIC, Ledger, body_ok, msg_id

from journal.journal import Journal
from journal.manifest import read_json
from journal.queue_events import QueueOp, checkpoint_key, decode_checkpoint, iter_events

GRACE = 3.0  # seconds: QueueOwnerFailover (1 s) plus a replication round trip, with margin
DONE_OPS = (QueueOp.ACKED, QueueOp.ACKED_RUN, QueueOp.EXPIRED, QueueOp.DELIVERED_AT_MOST_ONCE)


def journal_ids(jdir: str) -> tuple[collections.Counter, list[str]]:
    """Message ids stored in a journal (with counts) and the records that are not well-formed
    published payloads."""
    ids: collections.Counter = collections.Counter()
    bad: list[str] = []
    if not os.path.isdir(jdir):
        return ids, bad
    j = Journal(jdir)
    try:
        for r in j.scan():
            if r.kind != 1:
                continue
            ids[(r.publisher_id, r.seq)] += 1
            if body_ok(r.body) is None:
                bad.append(f"journal record at {r.position} is not a published payload")
    finally:
        j.close()
    return ids, bad


def queue_left(jdir: str, queue: str) -> set[tuple[int, int]]:
    """The messages a journal's instance still has to deliver on `queue` (an at-least-once
    queue over TOPIC) after a clean stop: on the topic at or after the queue's checkpoint, and
    not made done by an event of that queue in this journal (acked, here or elsewhere)."""
    if not os.path.isdir(jdir):
        return set()
    j = Journal(jdir)
    try:
        start = decode_checkpoint(j.index.get_meta(checkpoint_key(queue)), 0)
        ids: dict[int, tuple[int, int]] = {}
        done: set[int] = set()
        for r in j.scan():
            if r.kind == 1 and r.topic == TOPIC and r.position >= start:
                ids[r.position] = (r.publisher_id, r.seq)
            elif r.kind == 2 and r.topic == queue:
                for op, _value, run, names in iter_events(r.body):
                    if names is None and op in DONE_OPS:
                        done.update(run)
    finally:
        j.close()
    return {k for pos, k in ids.items() if pos not in done}


@dataclass
class QueueJournal:
    """What one instance's journal says about one queue (`queue_journal`): the order in which
    it journaled its own events and the done events from elsewhere. Keys are message ids
    (publisher id, sequence); positions are this journal's."""

    at_most_once: bool
    held: set[tuple[int, int]] = field(default_factory=set)  # the messages on the topic
    own: dict[tuple[int, int], int] = field(default_factory=dict)  # first own done event
    leased: dict[tuple[int, int], int] = field(default_factory=dict)  # last own lease
    # first done event of the message that happened on another instance
    done_from: dict[tuple[int, int], int] = field(default_factory=dict)
    # this instance's own done entries in journal order: (position, op, message)
    own_done: list[tuple[int, int, tuple[int, int]]] = field(default_factory=list)
    # another instance's done entries, where they arrived: (origin, op, message) -> position
    arrived: dict[tuple[str, int, tuple[int, int]], int] = field(default_factory=dict)

    def delivered_at(self, k: tuple[int, int]) -> int | None:
        """Where this instance journaled its (last) delivery of `k`: at most once, its done
        event, journaled before the delivery leaves; at least once, its last lease, journaled
        with the next commit after the delivery left."""
        return self.own.get(k) if self.at_most_once else self.leased.get(k)


_LEASE_OPS = (QueueOp.LEASED, QueueOp.LEASED_RUN)


def _done_op(op: int) -> int:
    """Runs and single entries name the same event once translated (a run can be split)."""
    return QueueOp.ACKED if op == QueueOp.ACKED_RUN else op


def queue_journal(jdir: str, queue: str) -> QueueJournal | None:
    """The evidence of a journal about `queue` (None: no journal), read offline after a clean
    stop. Events name local positions, resolved to ids through the journal's messages."""
    if not os.path.isdir(jdir):
        return None
    out = QueueJournal(at_most_once=queue == AMO_QUEUE)
    ids: dict[int, tuple[int, int]] = {}
    j = Journal(jdir)
    try:
        for r in j.scan():
            if r.kind == 1 and r.topic == TOPIC:
                ids[r.position] = (r.publisher_id, r.seq)
                out.held.add((r.publisher_id, r.seq))
            elif r.kind == 2 and r.topic == queue:
                origin = r.origin.instance.decode(errors="replace") if r.origin else None
                for op, _value, run, names in iter_events(r.body):
                    lease = op in _LEASE_OPS
                    if names is not None or not (lease or op in DONE_OPS):
                        continue
                    for k in filter(None, map(ids.get, run)):
                        if lease:
                            if origin is None:
                                out.leased[k] = r.position
                        elif origin is not None:
                            out.done_from.setdefault(k, r.position)
                            out.arrived.setdefault((origin, _done_op(op), k), r.position)
                        else:
                            out.own_done.append((r.position, _done_op(op), k))
                            out.own.setdefault(k, r.position)
    finally:
        j.close()
    return out


class Judge:
    """The journal rule of a message delivered on one instance after another instance
    acknowledged it or delivered it at most once (module doc). `journals`: each instance's
    `queue_journal` of the queue. It counts on X's events reaching Y only over X's own link,
    in X's order: a seams set has no pass-through (which could bring them by another path)."""

    def __init__(self, journals: dict[str, QueueJournal | None], at_most_once: bool):
        self.journals = journals
        self.at_most_once = at_most_once
        self._reach: dict[tuple[str, str], tuple[list[int], list[int]]] = {}

    def reached(self, x: str, y: str, before: int) -> int:
        """The furthest position of `x`'s own done events that had arrived at `y` before `y`'s
        position `before` (-1: none)."""
        if (x, y) not in self._reach:
            jx, jy = self.journals[x], self.journals[y]
            assert jx is not None and jy is not None
            pairs = sorted((jy.arrived[(x, op, k)], px) for px, op, k in jx.own_done
                           if (x, op, k) in jy.arrived)  # fmt: skip
            at, furthest, top = [], [], -1
            for py, px in pairs:
                top = max(top, px)
                at.append(py)
                furthest.append(top)
            self._reach[(x, y)] = (at, furthest)
        at, furthest = self._reach[(x, y)]
        i = bisect.bisect_left(at, before)
        return furthest[i - 1] if i else -1

    def knew(self, y: str, x: str, k: tuple[int, int]) -> str | None:
        """Why `y`'s delivery of `k` broke the rule, given `x` made it done (None: it did not;
        "?" when the journals do not say)."""
        jy, jx = self.journals.get(y), self.journals.get(x)
        if jy is None or jx is None or k not in jy.held or k not in jx.held:
            return "?"
        py = jy.delivered_at(k)
        if py is None:  # at least once: a lease lost with a killed instance, or never written
            if not jy.at_most_once:
                return "?"
            return f"{y} delivered it, and its journal has no delivery event of its own for it"
        if jy.done_from.get(k, py) < py:
            return f"{y} delivered it after its journal had a done event of it from elsewhere"
        px = jx.own.get(k)
        if px is not None and self.reached(x, y, py) > px:
            return f"{y} delivered it after {x}'s later events (past {x}'s done event) reached it"
        return None

    def judge(self, first: str, again: str, k: tuple[int, int]) -> str | None:
        """None: excused (at most once: neither instance knew of the other's delivery; at
        least once: `again` did not know of `first`'s acknowledgement); "?": no evidence; else
        why it is a violation."""
        pairs = [(again, first), (first, again)] if self.at_most_once else [(again, first)]
        why = [w for w in (self.knew(y, x, k) for y, x in pairs) if w]
        real = [w for w in why if w != "?"]
        return real[0] if real else "?" if why else None


def archive_ids(adir: str) -> set[tuple[int, int]]:
    """Message ids in an archive directory: the Parquet files its catalogs list (a catalog is
    the archive's commit point: a file renamed into place by a run that never wrote its catalog
    is not archived, and compaction must not count on it)."""
    cdir = os.path.join(adir, "_catalog")
    if not os.path.isdir(cdir):
        return set()
    import pyarrow.dataset as ds

    files = sorted({os.path.join(adir, f["path"]) for name in os.listdir(cdir) if name.endswith(".json")
                    for f in read_json(os.path.join(cdir, name)).get("files", ())})  # fmt: skip
    files = [f for f in files if os.path.exists(f)]  # one a catalog lists and lacks: not held
    if not files:
        return set()
    t = ds.dataset(files, format="parquet").to_table(columns=["bookmark", "kind"])
    return {msg_id(bm) for bm, k in zip(t["bookmark"].to_pylist(), t["kind"].to_pylist(), strict=True)
            if k == 1}  # fmt: skip


def skipped_ids(skipped: dict[int, list[tuple[int, int]]]) -> set[tuple[int, int]]:
    """The messages a publisher went past on failover: acknowledged by one instance, and the
    instance it moved to said it had only up to an earlier sequence (Publisher.skipped)."""
    return {(p, s) for p, ranges in skipped.items() for lo, hi in ranges for s in range(lo + 1, hi + 1)}  # fmt: skip


def check_stored(
    acked: dict[int, int], stored: dict[str, tuple], skipped: set[tuple[int, int]] = frozenset()
) -> tuple[dict, list[str]]:
    """acked: {publisher id: highest acknowledged sequence}; stored: {instance: (journal ids
    Counter, archive ids, bad records)}; skipped: skipped_ids.

    A message missing on an instance is lost, except one the publisher went past on failover
    (`skipped`) that another instance holds: acknowledged by an instance whose link to the
    others was async (or downgraded) and had not sent it; the publisher moved on, and the
    instances that saw its later messages first drop it as a duplicate. That is the documented
    cost of async replication (docs/replication.md, "Duplicates"), counted as `lost_async`;
    one that no instance holds is lost all the same."""
    out: list[str] = []
    lost = dup = archived = archive_only = lost_async = 0
    held: set[tuple[int, int]] = set()
    for jids, aids, _bad in stored.values():
        held |= {k for k in skipped if k in jids or k in aids}
    for inst, (jids, aids, bad) in sorted(stored.items()):
        out += [f"{inst}: {b}" for b in bad[:5]]
        missing = [(p, s) for p, top in acked.items() for s in range(1, top + 1)
                   if (p, s) not in jids and (p, s) not in aids]  # fmt: skip
        excused = [k for k in missing if k in held]
        lost_async += len(excused)
        missing = [k for k in missing if k not in held]
        twice = [k for k, n in jids.items() if n > 1]
        archived += len(aids)
        # what compaction or removal took out of the journal after the archive took it
        archive_only += sum(1 for p, top in acked.items() for s in range(1, top + 1)
                            if (p, s) in aids and (p, s) not in jids)  # fmt: skip
        if missing:
            lost += len(missing)
            out.append(f"{inst}: {len(missing)} acknowledged message(s) in neither its journal "
                       f"nor its archive, e.g. {missing[:3]}")  # fmt: skip
        if twice:
            dup += len(twice)
            out.append(f"{inst}: {len(twice)} message(s) stored twice, e.g. {twice[:3]}")
    stats = {"lost": lost, "duplicated": dup, "archived": archived, "archive_only": archive_only,
             "lost_async": lost_async}  # fmt: skip
    return stats, out


def _excused(windows: list[dict], first: tuple[float, str], again: tuple[float, str]) -> str:
    """Why docs/replication.md allows `again` after `first` ("" if it does not)."""
    (t1, i1), (t2, i2) = first, again
    if i1 == i2:
        return ""
    for w in windows:
        cut = w["kind"] in ("drop", "stall") and w["start"] <= t2 and w["end"] + GRACE >= t1
        if cut:
            return "partition"
        # (a delivery read just after the kill was on its way before it)
        if w["kind"] == "kill" and w["target"] == i1 and t1 - 0.5 <= w["start"] <= t1 + GRACE:
            return "owner killed"
    return ""


def check_queues(
    ledger: Ledger,
    windows: list[dict],
    journals: dict[str, dict[str, QueueJournal | None]] | None = None,
) -> tuple[dict, list[str]]:
    """`journals`: {queue: {instance: its `queue_journal`}} for the journal rule of the module
    doc; without them, or where they do not say, the fault windows decide."""
    out = list(ledger.violations)
    judges = {q: Judge((journals or {}).get(q, {}), q == AMO_QUEUE) for q in (ALO_QUEUE, AMO_QUEUE)}
    acked: dict[tuple[str, str], tuple[float, str]] = {}
    for t, inst, q, bm in ledger.acked:
        acked.setdefault((q, bm), (t, inst))
    # at-most-once: the first delivery of each message on each instance, in time order
    firsts: dict[tuple[str, str], dict[str, float]] = {}
    excused = again = by_journal = 0
    for t, inst, q, bm in sorted(ledger.delivered):
        key = (q, bm)
        why = "?"  # no journal evidence: the fault windows decide
        if q == ALO_QUEUE:
            prior = acked.get(key)
            if prior is None or t <= prior[0]:
                continue
            what = "delivered again after its acknowledgement was confirmed"
            if prior[1] != inst:  # on the same instance, never excused
                why = judges[q].judge(prior[1], inst, msg_id(bm))
        elif q == AMO_QUEUE:
            seen = firsts.setdefault(key, {})
            if not seen:
                seen[inst] = t
                continue
            what = "an at-most-once message delivered twice"
            if inst in seen:  # the same instance again: never excused (_excused says so too)
                prior = (seen[inst], inst)
            else:  # excused only if neither knew of any other delivery (the module doc)
                verdicts = [judges[q].judge(i, inst, msg_id(bm)) for i in seen]
                prior = next(iter(seen.items()))[::-1]
                why = next(
                    (w for w in verdicts if w and w != "?"), "?" if "?" in verdicts else None
                )
                seen[inst] = t
        else:
            continue
        if why is None or (why == "?" and _excused(windows, prior, (t, inst))):
            excused += 1
            by_journal += why is None
            continue
        if why != "?":
            what += f" ({why})"
        again += 1
        if again <= 5:
            out.append(f"{q}: {bm} {what}: first on {prior[1]} at +{prior[0] - ledger.t0:.2f}s, "
                       f"again on {inst} at +{t - ledger.t0:.2f}s")  # fmt: skip
    if again > 5:
        out.append(f"queues: {again - 5} more message(s) delivered again")
    stats = {"queue_delivered": len(ledger.delivered), "queue_acked": len(acked),
             "queue_again": again, "queue_excused": excused,
             "queue_excused_journal": by_journal}  # fmt: skip
    return stats, out


def check_ha(
    seen: list[str],
    errors: list[str],
    acked: dict[int, int],
    excused: set[tuple[int, int]] = frozenset(),
) -> tuple[dict, list[str]]:
    """`excused`: messages check_stored counted as `lost_async` (held by one instance only, and
    the subscriber may be on another): missed, they are counted as `ha_missed_async`."""
    out = list(errors)
    ids = [msg_id(bm) for bm in seen]
    count = collections.Counter(ids)
    twice = [k for k, n in count.items() if n > 1]
    missing = [(p, s) for p, top in acked.items() for s in range(1, top + 1) if (p, s) not in count]
    missed_async = sum(1 for k in missing if k in excused)
    missing = [k for k in missing if k not in excused]
    if twice:
        out.append(f"HA subscriber: {len(twice)} message(s) delivered twice, e.g. {twice[:3]}")
    if missing:
        out.append(f"HA subscriber: {len(missing)} acknowledged message(s) never delivered, "
                   f"e.g. {missing[:3]}")  # fmt: skip
    return {"ha_delivered": len(ids), "ha_twice": len(twice), "ha_missed": len(missing),
            "ha_missed_async": missed_async}, out  # fmt: skip


def check_desks(desk_subs, desk_consumers, deleter=None) -> tuple[dict, list[str]]:
    out: list[str] = []
    wrong = 0
    if deleter is not None and deleter.deleted:
        wrong += deleter.deleted
        out.append(f"{deleter.user}@{deleter.instance}: sow_delete by filter /desk = "
                   f"'{deleter.other}' deleted {deleter.deleted} message(s) of a desk its "
                   "content filter hides")  # fmt: skip
    for d in desk_subs:
        wrong += len(d.wrong)
        out += d.wrong[:3] + d.foreign[:3]
    for qc, desk in desk_consumers:  # (consumer, its desk)
        other = qc.desks - {desk}
        if other:
            wrong += 1
            out.append(f"{qc.queue}@{qc.instance} ({qc.user}, desk {desk}) was handed desk "
                       f"{sorted(other)}")  # fmt: skip
    return {"desk_delivered": sum(d.got for d in desk_subs), "entitlement_breaches": wrong}, out
