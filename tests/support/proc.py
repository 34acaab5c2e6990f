"""A real Tickertape server in a child process, for end-to-end tests.

`ServerProcess` writes a config (transport and admin on port 0), starts `tickertape serve`,
waits for its `listening on` line, and parses the ports. Output is collected by a thread so a test
can assert on log lines. stop() sends SIGTERM and waits; kill() is `kill -9`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

# the console script, not `python -m`: -m puts the working directory (which holds a data
# folder named journal/) first on sys.path
TICKERTAPE = os.path.join(os.path.dirname(sys.executable), "tickertape")
READY = re.compile(
    r"^tickertape \S+: listening on ([\d.]+):(\d+)(?:, [\d.:]+)*(?:; admin https?://([\d.]+):(\d+))?"
)


def make_config(
    data_dir: str,
    name: str = "tt-test",
    extra: str = "",
    topics=(".*",),
    admin=True,
    journal_size: str | None = None,
    logging_xml: str = "",
    transport_extra: str = "",
) -> str:
    topic_xml = "".join(
        f"<Topic><Name>{t}</Name><MessageType>json</MessageType></Topic>" for t in topics
    )
    size = f"<JournalSize>{journal_size}</JournalSize>" if journal_size else ""
    admin_xml = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>" if admin else ""
    log_xml = (
        logging_xml
        or "<Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target></Logging>"
    )
    return f"""<TickertapeConfig>
  <Name>{name}</Name>
  <Transports><Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
    <MessageType>json</MessageType><Protocol>amps</Protocol>{transport_extra}</Transport></Transports>
  {admin_xml}
  {log_xml}
  <TransactionLog><JournalDirectory>{data_dir}/journal</JournalDirectory>{size}{topic_xml}</TransactionLog>
  {extra}
</TickertapeConfig>
"""


# for servers whose journal a test makes fail on purpose: an unavailable journal is probed every
# 50 ms instead of every second (journal/writer.py), so the test does not wait out the probe
FAST_PROBE = {"TICKERTAPE_JOURNAL_PROBE_INTERVAL": "0.05"}


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a server started by a test or a bench: this one, unbuffered, plus
    `extra`. Where PYTHONDONTWRITEBYTECODE is set (it is on the shared test machines) and no
    PYTHONPYCACHEPREFIX is, the server writes and reads its bytecode under a cache directory of
    the temp dir instead: otherwise every start compiles the ~230 modules of a server from
    source, measured at 0.75 s of CPU of a start that takes 0.43 s with the cache. The checkout
    itself stays free of __pycache__ either way."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra or {}))
    if env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX"):
        del env["PYTHONDONTWRITEBYTECODE"]
        env["PYTHONPYCACHEPREFIX"] = os.path.join(
            tempfile.gettempdir(), f"tickertape-pycache-{os.getuid()}"
        )
    return env


_LIVE: set = set()


def kill_leftovers() -> None:
    """Kill every server a test started and did not stop (a failed assertion skips its stop)."""
    for sp in list(_LIVE):
        sp.kill()


class ServerProcess:
    def __init__(
        self, directory, config_xml: str | None = None, args=(), env=None, preexec_fn=None, **cfg
    ):
        self.directory = str(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.config_path = os.path.join(self.directory, "tickertape.xml")
        with open(self.config_path, "w") as f:
            f.write(config_xml or make_config(self.directory, **cfg))
        self.args = list(args)
        self.env = env
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.port = self.admin_port = None

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.lines = []
        env = server_env(self.env)
        self.proc = subprocess.Popen(
            [TICKERTAPE, "serve", "--config", self.config_path, *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.directory,
            env=env,
            preexec_fn=self.preexec_fn,
        )
        _LIVE.add(self)
        ready = threading.Event()

        def pump(proc=self.proc, lines=self.lines):
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                m = READY.search(line)
                if m:
                    self.port = int(m.group(2))
                    self.admin_port = int(m.group(4)) if m.group(4) else None
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or self.port is None:
            self.kill()
            raise RuntimeError("server did not start:\n" + self.output())
        return self

    def output(self) -> str:
        return "\n".join(self.lines)

    def log_mark(self) -> int:
        """Where the log of this run stands: pass it to wait_for_log(since=) so a test on a
        server shared by a module sees only the lines that came after it began."""
        return len(self.lines)

    def wait_for_log(self, pattern: str, timeout: float = 10.0, since: int = 0) -> str:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            for line in self.lines[since:]:
                if rx.search(line):
                    return line
            time.sleep(0.02)
        raise AssertionError(f"no log line matching {pattern!r}:\n{self.output()}")

    def stop(self, timeout: float = 20.0) -> int:
        _LIVE.discard(self)
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        _LIVE.discard(self)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> ServerProcess:
        self.stop()
        return self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill() if exc[0] else self.stop()
