"""Running as a daemon: detach, hold a pid file, and report readiness to the starting shell.

`daemonize(pid_file)` returns in the daemon (grandchild) process; the original process waits
on a pipe until the daemon calls `ready()` (exit 0) or `failed(msg)` / dies (exit 1, with the
message on stderr). So `tickertape serve --daemon` returns only once the server listens, and its
exit status says whether it started.

The pid file is locked with flock for the daemon's whole life: a second daemon on the same pid
file finds it locked and refuses to start, naming the pid that holds it. A stale pid file (no
lock held) is simply taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys


class AlreadyRunning(RuntimeError):
    pass


class Daemon:
    def __init__(self, pid_file: str):
        self.pid_file = os.path.abspath(pid_file)
        self._fd = -1
        self._ready_w = -1

    def lock(self) -> None:
        os.makedirs(os.path.dirname(self.pid_file), exist_ok=True)
        fd = os.open(self.pid_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyRunning(
                f"another tickertape server holds pid file {self.pid_file} (pid {other}); "
                "stop it first (kill -TERM), or use another --pid-file"
            ) from None
        self._fd = fd

    def detach(self) -> None:
        """Fork twice; only the daemon returns. The first parent exits with the daemon's status."""
        r, w = os.pipe()
        if os.fork() > 0:
            os.close(w)
            with os.fdopen(r, "rb") as pipe:  # until the daemon closes its end (or dies)
                msg = pipe.read()
            if msg.startswith(b"ok"):
                print(msg[2:].decode().strip(), flush=True)
                os._exit(0)
            sys.stderr.write(
                (msg.decode(errors="replace").strip() or "the daemon exited before it was ready")
                + "\n"
            )
            os._exit(1)
        os.close(r)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        self._ready_w = w
        # the working directory is kept: relative paths in the config are relative to it
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        self.write_pid()

    def write_pid(self) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(self._fd)

    def ready(self, message: str) -> None:
        if self._ready_w >= 0:
            os.write(self._ready_w, b"ok" + message.encode())
            os.close(self._ready_w)
            self._ready_w = -1

    def failed(self, message: str) -> None:
        if self._ready_w >= 0:
            os.write(self._ready_w, message.encode())
            os.close(self._ready_w)
            self._ready_w = -1

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.pid_file)
            os.close(self._fd)
            self._fd = -1
