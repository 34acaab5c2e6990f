"""A model of what a power cut leaves of a directory, fed by the system calls the journal makes.

`PowerLoss(directory, owns)` stands in for the `os` module of journal/fileio.py (install it
with `monkeypatch.setattr(journal.fileio, "os", model)`): every call goes to the real `os`, and
the model keeps, for the files `owns(name)` accepts, the state a power cut would leave:

- a file's content is what its last `fsync` / `fdatasync` found, with every later write made
  with RWF_DSYNC / RWF_SYNC (or on a descriptor opened O_DSYNC / O_SYNC) laid over it. A plain
  `write` or `pwrite` changes nothing durable: the zeros of a runway synced before stay the
  durable content of the bytes a commit wrote over them without a sync;
- a directory's entries are what its last fsync found: a file created or renamed since is,
  after the cut, missing or under its old name.

The model watches the real system calls, not FileIO's methods, so dropping a sync flag from a
FileIO method is seen. Content is kept per inode (a rename keeps it). `crash()` rewrites the
directory to what a power cut leaves: the caller stops every writer first.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Callable

_SYNC_FLAGS = os.RWF_DSYNC | os.RWF_SYNC
_SYNC_OPEN = os.O_DSYNC | os.O_SYNC


class PowerLoss:
    def __init__(self, directory: str, owns: Callable[[str], bool]) -> None:
        self.directory = os.path.realpath(directory)
        self.owns = owns
        self._lock = threading.Lock()
        self.content: dict[int, bytearray] = {}  # inode -> durable bytes
        self.entries: dict[str, int] = {}  # durable directory entries: name -> inode
        self.unsynced_writes = 0  # writes that made nothing durable (for the tests' messages)
        # what is there when the model starts is taken as durable (the caller synced it)
        self._sync_dir()
        for ino in set(self.entries.values()):
            self.content[ino] = bytearray(self._read_all_ino(ino))

    # -- the os module, as journal/fileio.py uses it ------------------------------------------

    def __getattr__(self, name: str):
        return getattr(os, name)

    def open(self, path, flags, mode=0o777, *, dir_fd=None):
        existed = os.path.exists(path)
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
        if not existed:
            with self._lock:  # a new file: nothing of it is durable (an inode may be reused)
                self.content.pop(os.fstat(fd).st_ino, None)
        return fd

    def write(self, fd, data):
        n = os.write(fd, data)
        if self._opened_sync(fd):
            offset = os.lseek(fd, 0, os.SEEK_CUR) - n
            self._lay(fd, bytes(memoryview(data)[:n]), offset)
        else:
            self._unsynced(fd)
        return n

    def pwrite(self, fd, data, offset):
        n = os.pwrite(fd, data, offset)
        if self._opened_sync(fd):
            self._lay(fd, bytes(memoryview(data)[:n]), offset)
        else:
            self._unsynced(fd)
        return n

    def pwritev(self, fd, buffers, offset, flags=0):
        n = os.pwritev(fd, buffers, offset, flags)
        if flags & _SYNC_FLAGS or self._opened_sync(fd):
            self._lay(fd, b"".join(bytes(b) for b in buffers)[:n], offset)
        else:
            self._unsynced(fd)
        return n

    def fsync(self, fd):
        os.fsync(fd)
        self._synced(fd)

    def fdatasync(self, fd):
        os.fdatasync(fd)
        self._synced(fd)

    # -- the model ----------------------------------------------------------------------------

    def _opened_sync(self, fd: int) -> bool:
        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & _SYNC_OPEN)

    def _mine(self, fd: int) -> os.stat_result | None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.dirname(path) != self.directory or not self.owns(os.path.basename(path)):
            return None
        return st

    def _unsynced(self, fd: int) -> None:
        if self._mine(fd) is not None:
            with self._lock:
                self.unsynced_writes += 1

    def _lay(self, fd: int, data: bytes, offset: int) -> None:
        st = self._mine(fd)
        if st is None:
            return
        with self._lock:
            durable = self.content.setdefault(st.st_ino, bytearray())
            if len(durable) < offset:
                durable.extend(bytes(offset - len(durable)))
            durable[offset : offset + len(data)] = data

    def _synced(self, fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            if os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")) == self.directory:
                self._sync_dir()
            return
        if self._mine(fd) is None:
            return
        # the writer's descriptors are write-only: read the file through a descriptor of its own
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            data = f.read()
        with self._lock:
            self.content[st.st_ino] = bytearray(data)

    def _sync_dir(self) -> None:
        entries = {}
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if self.owns(name) and os.path.isfile(path):
                entries[name] = os.stat(path).st_ino
        with self._lock:
            self.entries = entries

    def _read_all_ino(self, ino: int) -> bytes:
        for name, i in self.entries.items():
            if i == ino:
                with open(os.path.join(self.directory, name), "rb") as f:
                    return f.read()
        return b""

    # -- what the tests ask -------------------------------------------------------------------

    def durable(self, path: str) -> bytes:
        """What a power cut now leaves of the file at `path` (by inode, whatever its name)."""
        with self._lock:
            return bytes(self.content.get(os.stat(path).st_ino, b""))

    def crash(self) -> None:
        """Rewrite the directory to what a power cut leaves: the durable entries, each with its
        durable content; every other file the model owns is gone."""
        with self._lock:
            left = {name: bytes(self.content.get(ino, b"")) for name, ino in self.entries.items()}
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if self.owns(name) and os.path.isfile(path):
                os.unlink(path)
        for name, data in left.items():
            with open(os.path.join(self.directory, name), "wb") as f:
                f.write(data)
