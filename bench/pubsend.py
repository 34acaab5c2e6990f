"""Drive bench/pubsend.c, a Tickertape publisher in C, for bench_publish.

A Python sender that makes one syscall per frame pays ~2–4 µs of its own CPU a frame (the
syscall, the server's wake-up, the interpreter) and caps one connection near 220k frames/s
whatever the server does; the C sender makes the same syscalls without the interpreter, so a
`1/send` row measures the server. Both of bench_publish's Tickertape rows (the whole window
per send and N frames per send) use it, so they differ only in how the writes are split.

The sender is compiled once per source version with the machine's C compiler (`cc`, or $CC)
into the temporary directory, as ./run compiles the server's extensions. `available()` says
whether it can be; without a compiler bench_publish falls back to the Python load generator.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import loadgen

SOURCE = Path(__file__).with_name("pubsend.c")


def _binary() -> Path:
    digest = hashlib.sha1(SOURCE.read_bytes()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"tickertape-bench-pubsend-{digest}"


def build() -> Path:
    """The compiled sender (built on first use); raises RuntimeError with the compiler's output."""
    exe = _binary()
    if exe.exists():
        return exe
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc) on PATH for bench/pubsend.c")
    tmp = exe.with_name(f"{exe.name}.{os.getpid()}")
    r = subprocess.run(
        [cc, "-O2", "-Wall", "-o", str(tmp), str(SOURCE)], capture_output=True, text=True
    )
    if r.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE.name} failed:\n{r.stderr}")
    os.replace(tmp, exe)
    return exe


def available() -> str | None:
    """None when the C sender can be used, else why not."""
    try:
        build()
    except (RuntimeError, OSError) as exc:
        return str(exc)
    return None


def run(
    host: str,
    port: int,
    *,
    n: int,
    pub_dest: str,
    body_size: int = 100,
    window: int = 1000,
    per_send: int = 0,
    timeout: float = 120.0,
    tag: str = "0",
    on_start=None,
) -> dict:
    """Publish n persisted messages to pub_dest through the C sender; the same keys as
    loadgen.run's publisher figures (sent, acked, pub_errors, pub_seconds, client_cpu,
    timed_out, errors) plus `sends`, the send(2) calls it made. on_start() is called after the
    logon, just before the first publish."""
    exe = build()
    frames = loadgen.build_publish_frames("tickertape", pub_dest, n, body_size)
    with tempfile.NamedTemporaryFile(prefix="pubsend-", suffix=".frames") as f:
        f.write(frames.buf)
        f.flush()
        args = [exe, host, str(port), f.name, str(per_send), str(window), f"bench-pub-{tag}"]
        proc = subprocess.Popen(
            [str(a) for a in (*args, timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                proc.kill()
                _, err = proc.communicate()
                raise loadgen.ProtocolError(f"pubsend did not start: {line.strip()} {err.strip()}")
            if on_start is not None:
                on_start()
            out, err = proc.communicate("go\n", timeout=timeout + 30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0 or not out.strip():
        raise loadgen.ProtocolError(f"pubsend failed ({proc.returncode}): {err.strip()}")
    r = json.loads(out.strip().splitlines()[-1])
    return {
        "sent": r["sent"],
        "acked": r["acked"],
        "pub_errors": r["errors"],
        "pub_seconds": r["seconds"],
        "client_cpu": r["cpu"],
        "timed_out": r["timed_out"],
        "errors": [r["error"]] if r["error"] else [],
        "sends": r["sends"],
    }
