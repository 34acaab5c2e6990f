"""A bookmark store that logs every received and discarded bookmark to a file.

Same behaviour as MemoryBookmarkStore (client/bookmarks.py), and it survives the process: on
open the log is replayed, and the undiscarded messages of each subscription are delivered once
more. `prune()` rewrites the log as a snapshot of the current state (recovery stays exact:
same resume point, same duplicate filter, same window); it runs by itself once the file passes
`auto_prune_bytes` and four times its last snapshot, and at close() when `prune_on_close`.

Writes: a received bookmark is buffered (a bounded buffer, at most 64 KiB) and written with the
next discard, mark or start, in one `write` (so the file is always a prefix of what happened:
a discard is never on disk without the receipts before it). Everything written survives
`kill -9`; `sync()` / `close()` fsync for power loss. A message received but not yet written
when the process dies was not discarded, so it is simply delivered again.

File format (this module owns it; integers little-endian)::

    header, 16 bytes: magic b"TTBMLOG\\0" | version u16 (1) | zero u16 | crc32 u32 of bytes 0..12
    records:          length u32 (bytes after the crc) | crc32 u32 of them | kind u8 | fields
      1 SUB      sid u32 | sub_id UTF-8          gives a subscription id a small number
      2 BASE     sid u32 | bookmark text         (re)starts the subscription from this point
      3 RECV     sid u32 | publisher u64 | seq u64
      4 DISCARD  sid u32 | publisher u64 | seq u64
      5 MARK     sid u32 | publisher u64 | seq u64   a periodic persisted ack
      6 PURGE    sid u32
      7 STATE    sid u32 | recovery length u16 | recovery text | count u32 | (publisher u64,
                 seq u64) * count | [count u32 | (publisher u64, seq u64) * count]
                                                 the snapshot of a subscription, from prune():
                 `highest`, then `passed` (absent in files written before it existed; a
                 reader that predates it ignores it); RECV / DISCARD / MARK records after it
                 rebuild its window

Recovery: records are read in order; the first one that is cut short or fails its checksum
ends the log. The file is truncated there (the damage never outlives an open) and
`recovery` (a RecoveryReport) says how many bytes were dropped; a damaged file logs a warning.
An unreadable header raises CorruptStore.
"""

from __future__ import annotations

import os
import struct
import zlib

from .bookmarks import BookmarkStore, Subscriptions, tracked
from .errors import CorruptStore
from .message import Message
from .storefile import RecoveryReport, open_locked, recovered

__all__ = ["LoggedBookmarkStore"]

MAGIC = b"TTBMLOG\x00"
VERSION = 1
SUB, BASE, RECV, DISCARD, MARK, PURGE, STATE = range(1, 8)
_HEAD = struct.Struct("<8sHH")
_REC = struct.Struct("<II")  # length, crc
_KEYED = struct.Struct("<BIQQ")  # kind, sid, publisher, seq
_SID = struct.Struct("<BI")
_PAIR = struct.Struct("<QQ")
_crc = zlib.crc32
_BUFFER = 64 * 1024


def _record(payload: bytes) -> bytes:
    return _REC.pack(len(payload), _crc(payload)) + payload


class LoggedBookmarkStore(BookmarkStore):
    """A file-backed bookmark store with exact out-of-order recovery (module docstring): the
    memory store's `Subscriptions`, each change to them written to the log."""

    path: str  # a file store always has one

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        auto_prune_bytes: int = 64 * 1024 * 1024,
        prune_on_close: bool = True,
        max_publishers: int = 100_000,
    ):
        self.subs = Subscriptions(max_publishers)
        self.path = os.fspath(path)
        self.auto_prune_bytes = auto_prune_bytes
        self.prune_on_close = prune_on_close
        self._sids: dict[str, int] = {}
        self._buf = bytearray()
        self._size = 0
        self._snapshot_size = 0
        self._fd = open_locked(self.path)
        self.recovery = recovered(self._fd, self._load)

    def __repr__(self) -> str:
        return f"<LoggedBookmarkStore {len(self.subs.states)} subscription(s)>"

    # ------------------------------------------------------------------ load

    def _load(self) -> RecoveryReport:
        report = RecoveryReport(self.path)
        with open(self._fd, "rb", closefd=False) as f:
            data = f.read()
        if len(data) < _HEAD.size + 4:
            if any(data):
                raise CorruptStore(self.path, 0, f"{len(data)} bytes: shorter than the header")
            os.ftruncate(self._fd, 0)
            self._write_now(self._header())
            self._snapshot_size = self._size
            return report
        magic, version, _ = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise CorruptStore(self.path, 0, f"magic {magic!r} is not {MAGIC!r}")
        (crc,) = struct.unpack_from("<I", data, 12)
        if crc != _crc(data[:12]) or version != VERSION:
            raise CorruptStore(self.path, 8, f"bad header (version {version}, checksum)")
        names: dict[int, str] = {}
        off = 16
        end = len(data)
        while off < end:
            if off + 8 > end:
                report.damage(off, "record length cut off by the end of the file", end - off, 1)
                break
            length, crc = _REC.unpack_from(data, off)
            body = data[off + 8 : off + 8 + length]
            if len(body) < length:
                report.damage(off, f"record of {length} bytes cut off by the end of the file",
                              end - off, 1)  # fmt: skip
                break
            if _crc(body) != crc or not body:
                report.damage(off, "record checksum mismatch: the rest of the log is dropped",
                              end - off, 1)  # fmt: skip
                break
            try:
                self._apply(body, names)
            except (struct.error, UnicodeDecodeError, KeyError, ValueError) as exc:
                report.damage(off, f"unreadable record ({exc}): the rest is dropped",
                              end - off, 1)  # fmt: skip
                break
            report.records += 1
            off += 8 + length
        if off < end:
            os.ftruncate(self._fd, off)
        os.lseek(self._fd, off, os.SEEK_SET)
        self._size = self._snapshot_size = off
        self._sids = {name: sid for sid, name in names.items()}
        for state in self.subs.states.values():
            state.start_redelivery()
        return report

    def _apply(self, body: bytes, names: dict[int, str]) -> None:
        kind = body[0]
        if kind in (RECV, DISCARD, MARK):
            _, sid, pub, seq = _KEYED.unpack(body)
            state = self.subs.states.get(names[sid])
            if state is None:
                return
            if kind == RECV:
                state.append(pub, seq, f"{pub}|{seq}|")
            elif kind == DISCARD:
                state.discard(f"{pub}|{seq}|")
            else:
                state.mark(pub, seq)
            return
        _, sid = _SID.unpack_from(body)
        rest = body[5:]
        if kind == SUB:
            names[sid] = rest.decode()
        elif kind == BASE:
            self.subs.new(names[sid], rest.decode())
        elif kind == PURGE:
            self.subs.states.pop(names[sid], None)
        elif kind == STATE:
            state = self.subs.states[names[sid]]
            (n,) = struct.unpack_from("<H", rest, 0)
            state.recovery = rest[2 : 2 + n].decode() or None
            (count,) = struct.unpack_from("<I", rest, 2 + n)
            pos = 6 + n + 16 * count
            state.highest.update(_PAIR.unpack_from(rest, p) for p in range(6 + n, pos, 16))
            if pos < len(rest):  # `passed` (absent in files written before it existed)
                (count,) = struct.unpack_from("<I", rest, pos)
                end = pos + 4 + 16 * count
                state.passed.update(_PAIR.unpack_from(rest, p) for p in range(pos + 4, end, 16))
        else:
            raise ValueError(f"unknown record kind {kind}")

    # ------------------------------------------------------------------ writing

    def _header(self) -> bytes:
        head = _HEAD.pack(MAGIC, VERSION, 0)
        return head + struct.pack("<I", _crc(head))

    def _write_now(self, data: bytes | bytearray = b"") -> None:
        """Write the buffered receipts and `data` in one call."""
        if self._buf:
            self._buf += data
            data = bytes(self._buf)
            self._buf.clear()
        if data:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            self._size += len(data)

    def _sid(self, sub_id: str) -> int:
        sid = self._sids.get(sub_id)
        if sid is None:
            sid = self._sids[sub_id] = len(self._sids) + 1
            self._buf += _record(_SID.pack(SUB, sid) + sub_id.encode())
        return sid

    # ------------------------------------------------------------------ BookmarkStore

    def start(self, sub_id: str, bookmark: str) -> str:
        self._check()
        send, afresh = self.subs.start(sub_id, bookmark)
        if afresh:
            self._write_now(_record(_SID.pack(BASE, self._sid(sub_id)) + send.encode()))
        return send

    def log(self, message: Message) -> bool:
        got = tracked(message)
        state = None if got is None else self.subs.states.get(got[0])
        if got is None or state is None:
            return True
        sub_id, pub, seq, bm = got
        redelivered = state.redeliver and bm in state.redeliver
        if not state.log(pub, seq, bm):
            return False
        if not redelivered:  # a redelivered message is in the log already
            self._check()
            buf = self._buf
            buf += _record(_KEYED.pack(RECV, self._sid(sub_id), pub, seq))
            if len(buf) >= _BUFFER:
                self._write_now()
        return True

    def discard_bookmark(self, sub_id: str, bookmark: str) -> bool:
        self._check()
        e = self.subs.discard(sub_id, bookmark)
        if e is None:
            return False
        self._write_now(_record(_KEYED.pack(DISCARD, self._sid(sub_id), e.pub, e.seq)))
        self._maybe_prune()
        return True

    def persisted(self, sub_id: str, bookmark: str) -> None:
        self._check()
        point = self.subs.mark(sub_id, bookmark)
        if point is not None:
            self._write_now(_record(_KEYED.pack(MARK, self._sid(sub_id), *point)))

    def most_recent(self, sub_id: str, elsewhere: bool = False) -> str:
        self._check()
        return self.subs.most_recent(sub_id, elsewhere)

    def window_size(self, sub_id: str) -> int:
        return self.subs.window_size(sub_id)

    def purge(self, sub_id: str | None = None) -> None:
        self._check()
        for sid in self.subs.purge(sub_id):
            if sid in self._sids:
                self._write_now(_record(_SID.pack(PURGE, self._sids[sid])))

    @property
    def file_bytes(self) -> int:
        return self._size + len(self._buf)

    def _maybe_prune(self) -> None:
        if self._size > self.auto_prune_bytes and self._size > 4 * self._snapshot_size:
            self.prune()

    def prune(self) -> None:
        """Rewrite the log as a snapshot of the current state (atomic: temp file + rename)."""
        self._check()
        out = bytearray(self._header())
        sids: dict[str, int] = {}
        for n, (sub_id, state) in enumerate(self.subs.states.items(), 1):
            sids[sub_id] = n
            out += _record(_SID.pack(SUB, n) + sub_id.encode())
            out += _record(_SID.pack(BASE, n) + state.base.encode())
            rec = (state.recovery or "").encode()
            pairs = b"".join(_PAIR.pack(p, s) for p, s in state.highest.items())
            passed = b"".join(_PAIR.pack(p, s) for p, s in state.passed.items())
            out += _record(_SID.pack(STATE, n) + struct.pack("<H", len(rec)) + rec +
                           struct.pack("<I", len(state.highest)) + pairs +
                           struct.pack("<I", len(state.passed)) + passed)  # fmt: skip
            for e in state.window:
                if e.mark:
                    out += _record(_KEYED.pack(MARK, n, e.pub, e.seq))
                    continue
                out += _record(_KEYED.pack(RECV, n, e.pub, e.seq))
                if e.done:
                    out += _record(_KEYED.pack(DISCARD, n, e.pub, e.seq))
        tmp = self.path + ".tmp"
        fd = open_locked(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            view = memoryview(out)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd = fd
        self._buf.clear()
        self._sids = sids
        self._size = self._snapshot_size = len(out)

    def sync(self) -> None:
        self._check()
        self._write_now()
        os.fsync(self._fd)

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.prune_on_close:
                self.prune()
            else:
                self._write_now()
            os.fsync(self._fd)
        finally:
            self._closed = True
            os.close(self._fd)
