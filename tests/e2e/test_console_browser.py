"""The web console in a real browser: headless Chromium (Debian's `chromium`) driven by
Playwright, against a real server under load (docs/console.md).

Without chromium or Playwright the tests skip and say so, except under CI (`CI` set), where
`.ci/run` installs both and a missing browser is a failure. With TICKERTAPE_SCREENSHOTS=1 the
screenshots of every view are written to docs/console-*.png (the README shows them); otherwise
they go to the test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _missing() -> str | None:
    if shutil.which("chromium") is None:
        return "no chromium on PATH (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no Playwright (pip install playwright)"
    return None


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests need chromium and Playwright under CI: {missing}")
        pytest.skip(f"browser tests: {missing}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    pg.goto(f"http://127.0.0.1:{server.admin_port}/")
    pg.wait_for_selector("#status[data-state=live]", timeout=10_000)
    pg.wait_for_function(  # a first sample arrived (a new server's ring may be empty)
        "() => document.querySelector('.tile .value').textContent !== '–'", timeout=10_000
    )
    yield pg
    ctx.close()
    assert errors == [], f"errors in the page's console: {errors}"


class Load:
    """Publishes in a thread until stopped, so the page has something to show; with
    `subscriber`, a live subscriber reads it all in another thread."""

    def __init__(self, port: int, subscriber: bool = False) -> None:
        self.port = port
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.reader: threading.Thread | None = None
        if subscriber:
            self.sub = Raw(port)
            self.sub.logon("console-watcher")
            self.sub.subscribe("console.load")
            self.reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        self.sub.sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                self.sub.sock.recv(1 << 20)
            except TimeoutError:
                pass
        self.sub.close()

    def _run(self) -> None:
        c = Raw(self.port)
        c.logon("console-load")
        seq = 1
        while not self.stop.is_set():
            publish_many(self.port, "console.load", ["{}"] * 2000, start_seq=seq, conn=c)
            seq += 2000
            time.sleep(0.05)
        c.close()

    def __enter__(self) -> Load:
        self.thread.start()
        if self.reader is not None:
            self.reader.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.reader is not None:
            self.reader.join(30)


def _tile(page, label: str) -> str:
    return page.locator(".tile", has_text=label).locator(".value").first.inner_text()


def test_overview_moves_under_load(page, server, tmp_path):
    assert _tile(page, "Publish") == "0 msg/s"
    with Load(server.port):
        page.wait_for_function(
            "() => document.querySelector('.tile .value').textContent !== '0 msg/s'",
            timeout=10_000,
        )
        time.sleep(3)  # a few seconds of the chart under load
        for label, unit in (
            ("Publish", "msg/s"),
            ("Journal", "B"),
            ("Free disk", "B"),
            ("CPU", "%"),
            ("RSS", "B"),
            ("Connections", "clients"),
            ("Commit p99", "ms"),
        ):
            assert _tile(page, label).endswith(unit), (label, _tile(page, label))
        assert _tile(page, "Connections") != "0 clients"
        # the messages chart drew something: pixels that are not the background
        drawn = page.evaluate(
            """() => {
              const c = document.getElementById('chart-0');
              const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
              let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
              return n;
            }"""
        )
        assert drawn > 200
        page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)


QUEUE = (
    "<SOW><Queue><Name>jobs</Name><UnderlyingTopic>work</UnderlyingTopic>"
    "<MaxPerSubscriptionBacklog>50</MaxPerSubscriptionBacklog></Queue></SOW>"
)


def test_screenshots_of_every_view_under_load(browser, tmp_path):
    """docs/console-*.png with TICKERTAPE_SCREENSHOTS=1 (else into the test's directory)."""
    out = DOCS if os.environ.get("TICKERTAPE_SCREENSHOTS") else tmp_path
    with ServerProcess(tmp_path / "srv", extra=QUEUE) as srv:
        publish_many(srv.port, "work", ['{"job":1}'] * 300, name="job-feed").close()
        worker = Raw(srv.port)
        worker.logon("worker-1")
        worker.subscribe("jobs", o="max_backlog=50")
        worker.messages(50)
        replayer = Raw(srv.port)
        replayer.logon("audit-replay")
        replayer.subscribe("work", sub_id="audit", bm="0", o="pause", f="/job = 1")
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = ctx.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        with Load(srv.port, subscriber=True):
            pg.goto(f"http://127.0.0.1:{srv.admin_port}/")
            pg.wait_for_function(
                "() => document.querySelectorAll('.tile .value')[1].textContent !== '0 msg/s'"
                " && document.querySelectorAll('.tile .value')[1].textContent !== '–'",
                timeout=15_000,
            )
            # some history in the charts: the pictures in docs/ show 8 s; a run that keeps
            # them nowhere needs only a few updates of every chart (each second)
            time.sleep(8 if out is DOCS else 2)
            pg.screenshot(path=str(out / "console-overview.png"), full_page=True)
            for view in ("clients", "subscriptions", "queues", "journal"):
                pg.click(f"nav a[data-view={view}]")
                pg.wait_for_selector(f"#{view} table tr >> nth=1", timeout=5_000)
                pg.screenshot(path=str(out / f"console-{view}.png"), full_page=True)
            phone = browser.new_context(
                viewport={"width": 390, "height": 844}, color_scheme="dark", device_scale_factor=2
            )
            pp = phone.new_page()
            pp.goto(f"http://127.0.0.1:{srv.admin_port}/")
            pp.wait_for_selector("#status[data-state=live]", timeout=10_000)
            time.sleep(1.5)
            pp.screenshot(path=str(out / "console-phone-dark.png"))
            phone.close()
        ctx.close()
        worker.close()
        replayer.close()
    assert errors == []


def test_a_client_appears_then_leaves(page, server):
    page.click("nav a[data-view=clients]")
    c = Raw(server.port)
    c.logon("browser-visible")
    c.subscribe("console.none")
    row = page.locator("#clients-table tr", has_text="browser-visible")
    row.wait_for(timeout=10_000)
    assert "1 subs" in row.inner_text()
    page.fill("#client-filter", "no-such-client")
    row.wait_for(state="detached", timeout=5_000)
    page.fill("#client-filter", "browser")
    row.wait_for(timeout=5_000)
    page.click("nav a[data-view=subscriptions]")
    sub = page.locator("#subs-table tr", has_text="console.none")
    sub.wait_for(timeout=5_000)
    assert "live" in sub.inner_text() and "browser-visible" in sub.inner_text()
    page.click("nav a[data-view=clients]")
    c.close()
    row.wait_for(state="detached", timeout=10_000)


def test_disconnect_asks_then_disconnects(page, server):
    page.click("nav a[data-view=clients]")
    c = Raw(server.port)
    c.logon("browser-victim")
    row = page.locator("#clients-table tr", has_text="browser-victim")
    row.wait_for(timeout=10_000)
    asked: list[str] = []

    def answer(dialog, accept: bool) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda d: answer(d, False))
    row.locator("button", has_text="Disconnect").click()
    assert asked and "browser-victim" in asked[0]
    assert not c.closed(timeout=1.5)  # dismissed: nothing happens
    page.once("dialog", lambda d: answer(d, True))
    row.locator("button", has_text="Disconnect").click()
    assert c.closed()
    row.wait_for(state="detached", timeout=10_000)
    server.wait_for_log(r"disconnect: .*browser-victim.* reason=admin")


def test_phone_sized_and_dark(browser, server):
    ctx = browser.new_context(
        viewport={"width": 390, "height": 844}, color_scheme="dark", device_scale_factor=2
    )
    pg = ctx.new_page()
    pg.goto(f"http://127.0.0.1:{server.admin_port}/#journal")
    pg.wait_for_selector("#journal-table tr >> nth=1", timeout=10_000)
    assert pg.evaluate("document.documentElement.scrollWidth") <= 390
    bg = pg.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg == "rgb(18, 20, 22)", bg
    pg.goto(f"http://127.0.0.1:{server.admin_port}/#overview")
    pg.wait_for_selector("#status[data-state=live]", timeout=10_000)
    assert pg.evaluate("document.documentElement.scrollWidth") <= 390
    ctx.close()


def _open(browser, port: int, view: str, **ctx_args):
    """A page on `view`, live; its context and the list of its console errors."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, **ctx_args)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(f"http://127.0.0.1:{port}/#{view}")
    pg.wait_for_selector("#status[data-state=live]", timeout=10_000)
    return ctx, pg, errors


def test_a_queue_depth_falls_as_a_consumer_acknowledges(browser, tmp_path):
    queue = (
        "<SOW><Queue><Name>jobs</Name><UnderlyingTopic>work</UnderlyingTopic>"
        "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue></SOW>"
    )
    with ServerProcess(tmp_path / "q", extra=queue) as srv:
        publish_many(srv.port, "work", ["{}"] * 5, name="browser-q-pub").close()
        ctx, pg, errors = _open(browser, srv.admin_port, "queues")
        depth = (
            "() => { const r = [...document.querySelectorAll('#queues-table tr')]"
            ".find((tr) => tr.cells[0].textContent === 'jobs'); return r && r.cells[1].textContent; }"
        )
        pg.wait_for_function(f"({depth})() === '5 msg'", timeout=10_000)
        c = Raw(srv.port)
        c.logon("browser-consumer")
        c.send({"c": "subscribe", "t": "jobs", "cid": "q", "a": "processed", "o": "max_backlog=10"})
        assert c.ack("processed", "q")["status"] == "success"
        got = c.messages(5)
        row = pg.locator("#queues-table tr", has_text="jobs")
        pg.wait_for_function(f"({depth})() === '0 msg'", timeout=10_000)  # leased, not waiting
        pg.wait_for_function(
            "() => document.querySelector('#queues-table').textContent"
            ".includes('browser-consumer 5/10 msg')",
            timeout=10_000,
        )
        for h, _ in got[:2]:  # acknowledged one by one: the backlog falls with them
            c.send({"c": "sow_delete", "t": "jobs", "bm": h["bm"], "cid": "k", "a": "processed"})
            assert c.ack("processed", "k")["status"] == "success"
        pg.wait_for_function(
            "() => document.querySelector('#queues-table').textContent"
            ".includes('browser-consumer 3/10 msg')",
            timeout=10_000,
        )
        assert "2 msg" in row.inner_text()  # acked (total)
        c.close()
        ctx.close()
    assert errors == []


def test_run_a_journal_action_asks_then_runs(browser, tmp_path):
    actions = """<Actions><Action>
      <On><Module>amps-action-on-schedule</Module><Options><Every>1h</Every><Name>nightly</Name></Options></On>
      <Do><Module>amps-action-do-remove-journal</Module><Options><Age>7d</Age></Options></Do>
    </Action></Actions>"""
    with ServerProcess(tmp_path / "a", extra=actions) as srv:
        ctx, pg, errors = _open(browser, srv.admin_port, "journal")
        row = pg.locator("#actions-table tr", has_text="nightly")
        row.wait_for(timeout=10_000)
        asked: list[str] = []

        def answer(dialog, accept: bool) -> None:
            asked.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        pg.once("dialog", lambda d: answer(d, False))
        row.locator("button", has_text="Run now").click()
        assert asked and "nightly" in asked[0] and "remove-journal" in asked[0]
        time.sleep(1.5)
        assert "admin: ran action" not in srv.output()  # dismissed: nothing happens
        pg.once("dialog", lambda d: answer(d, True))
        row.locator("button", has_text="Run now").click()
        srv.wait_for_log(r"admin: ran action nightly")
        srv.wait_for_log(r"action nightly: remove-journal: nothing removed")
        pg.wait_for_function(
            "() => document.querySelector('#actions-table').textContent"
            ".includes('remove-journal: nothing removed')",
            timeout=10_000,
        )
        ctx.close()
    assert errors == []


def test_a_held_step_shows_its_reason_under_the_result(browser, tmp_path):
    actions = """<Actions><Action>
      <On><Module>amps-action-on-schedule</Module><Options><Every>1h</Every><Name>nightly</Name></Options></On>
      <Do><Module>amps-action-do-remove-journal</Module><Options><Age>0s</Age></Options></Do>
    </Action></Actions>"""
    with ServerProcess(tmp_path / "h", extra=actions, journal_size="64KB") as srv:
        pad = "y" * 200
        publish_many(srv.port, "console.t", [f'{{"p":"{pad}"}}'] * 600, name="held-pub").close()
        ctx, pg, errors = _open(browser, srv.admin_port, "journal")
        row = pg.locator("#actions-table tr", has_text="nightly")
        row.wait_for(timeout=10_000)
        pg.once("dialog", lambda d: d.accept())
        row.locator("button", has_text="Run now").click()
        srv.wait_for_log(r"action nightly: remove-journal held: ")
        pg.wait_for_function(
            "() => document.querySelector('#actions-table').innerText"
            ".includes('held: remove-journal: ')",
            timeout=10_000,
        )
        text = row.inner_text()
        assert "nothing removed" in text and "is not archived" in text, text
        ctx.close()
    assert errors == []


def test_an_unauthenticated_request_is_refused_once_authentication_is_configured(browser, tmp_path):
    from tests.security.servers import users_file

    d = tmp_path / "auth"
    d.mkdir()
    users_file(d / "users.db", {"root": "root-pw-1", "alice": "alice-pw-2"})
    auth = (
        f"<Authentication><PasswordFile>{d}/users.db</PasswordFile></Authentication>"
        "<Entitlement><Role><Name>ops</Name><Users>root</Users><Admin>true</Admin></Role>"
        "<Role><Name>desk</Name><Users>alice</Users><Subscribe>.*</Subscribe></Role></Entitlement>"
    )
    with ServerProcess(d, extra=auth) as srv:
        url = f"http://127.0.0.1:{srv.admin_port}/"
        from playwright.sync_api import Error

        ctx = browser.new_context()
        # a 401 with a Basic challenge and no credentials to answer it: headless Chromium
        # ends the navigation with this error (a desktop browser would ask for a password)
        with pytest.raises(Error, match="ERR_INVALID_AUTH_CREDENTIALS"):
            ctx.new_page().goto(url)
        ctx.close()
        srv.wait_for_log(r"admin_request peer=\S+ method=GET path=/ status=401")
        ctx = browser.new_context(http_credentials={"username": "alice", "password": "alice-pw-2"})
        resp = ctx.new_page().goto(url)
        assert resp is not None and resp.status == 403
        ctx.close()
        creds = {"username": "root", "password": "root-pw-1"}
        ctx, pg, errors = _open(browser, srv.admin_port, "overview", http_credentials=creds)
        ctx.close()
    assert errors == []
