"""Self-check of the load generator's Tickertape driver against a protocol stub.

    ./run bench selfcheck_tickertape

Not a benchmark and not the server: a few dozen lines that speak the parts of docs/protocol.md
the driver uses (length-prefixed frames, logon with a `processed` ack carrying `s`, publish with
conflated `persisted` acks covering every sequence <= s, subscribe with a `processed` ack, `p`
deliveries with `sub_id`/`sids`/`bm`), each chunk of publishes acked once, as a group commit would.
It checks that the driver frames, windows and counts right, so that a wrong figure against the
real server is the server's. Frames arriving split at odd boundaries are part of the check
(the stub writes its replies in small pieces).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import ClassVar

import loadgen
from loadgen import _U32 as U32
from loadgen import tickertape_frame as frame


class Stub(asyncio.Protocol):
    subs: ClassVar[dict] = {}  # topic -> list of (conn, sub_id), shared by the stub's conns

    def connection_made(self, t):
        self.t, self.buf, self.name, self.last = t, bytearray(), None, 0

    def connection_lost(self, exc):
        for lst in Stub.subs.values():
            lst[:] = [(c, s) for c, s in lst if c is not self]

    def write_split(self, data: bytes) -> None:
        for i in range(0, len(data), 7):  # odd-sized pieces: the driver must reassemble
            self.t.write(data[i : i + 7])

    def data_received(self, data):
        self.buf += data
        top, out, fan = 0, [], {}
        while len(self.buf) >= 4:
            n = U32.unpack_from(self.buf)[0]
            if len(self.buf) < 4 + n:
                break
            raw = bytes(self.buf[4 : 4 + n])
            del self.buf[: 4 + n]
            h, end = json.JSONDecoder().raw_decode(raw.decode())
            body = raw[end:]
            c = h["c"]
            ok = {"c": "ack", "a": "processed", "cid": h.get("cid"), "status": "success"}
            if c == "logon":
                self.name = h["client_name"]
                out.append(frame({**ok, "s": 0, "bm": "0"}))
            elif c == "subscribe":
                Stub.subs.setdefault(h["t"], []).append((self, h["sub_id"]))
                out.append(frame({**ok, "sub_id": h["sub_id"]}))
            elif c == "publish":
                assert self.name, "publish before logon"
                assert h["a"] == "persisted" and int(h["s"]) == self.last + 1, h
                self.last = top = int(h["s"])
                for conn, sid in Stub.subs.get(h["t"], []):
                    fan.setdefault(conn, []).append(
                        frame(
                            {"c": "p", "t": h["t"], "sub_id": sid, "sids": sid, "bm": f"77|{top}|"},
                            body,
                        )
                    )
        if top:  # one conflated persisted ack per chunk, then the deliveries (after "commit")
            out.append(frame({"c": "ack", "a": "persisted", "status": "success", "s": top}))
        if out:
            self.write_split(b"".join(out))
        for conn, frames in fan.items():
            conn.t.write(b"".join(frames))


async def main() -> int:
    srv = await asyncio.get_running_loop().create_server(Stub, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    ok = True
    try:
        r = await loadgen.run(
            "tickertape", "127.0.0.1", port, n=20000, pub_dest="t.pub", timeout=30, tag="a"
        )
        good = r["acked"] == 20000 and not r["errors"] and not r["timed_out"]
        print(
            ("ok  " if good else "BAD ") + f"publish: {r['acked']} acked in "
            f"{r['pub_seconds']:.2f}s {r['errors']}"
        )
        ok &= good
        r = await loadgen.run(
            "tickertape",
            "127.0.0.1",
            port,
            n=3000,
            pub_dest="t.fan",
            sub_dests=["t.fan"] * 3,
            timeout=30,
            tag="b",
        )
        good = r["received"] == 9000 and r["acked"] == 3000 and not r["errors"]
        print(("ok  " if good else "BAD ") + f"fan-out: {r['received']} delivered {r['errors']}")
        ok &= good
        r = await loadgen.run(
            "tickertape",
            "127.0.0.1",
            port,
            n=1000,
            pub_dest="t.lat",
            sub_dests=["t.lat"],
            rate=2000,
            warmup_msgs=100,
            timeout=30,
            tag="c",
        )
        lat = sorted(r["latency_ns"])
        good = len(lat) == 900 and lat[0] > 0 and r["received"] == 1000
        print(
            ("ok  " if good else "BAD ") + f"latency: {len(lat)} samples, p50 "
            f"{lat[len(lat) // 2] / 1e3:.0f} µs"
            if lat
            else "BAD latency: no samples"
        )
        ok &= good
    finally:
        srv.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(loadgen.run_coro(main()))
