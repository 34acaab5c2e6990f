"""The console's SOW view in a real browser (headless Chromium through Playwright, as
tests/e2e/test_console_browser.py; skipped without them, outside CI): the topics' table from
the event stream, and a query from the form, answered by `GET /sow/<topic>` (docs/console.md).
With TICKERTAPE_SCREENSHOTS=1 the screenshot goes to docs/console-sow.png."""

from __future__ import annotations

import json
import os

from tests.e2e.test_console_browser import DOCS, _open, browser  # noqa: F401 - a fixture
from tests.support.proc import ServerProcess
from tests.support.raw import publish_many

SOW = "<SOW><Topic><Name>prices</Name><Key>/sym</Key></Topic></SOW>"


def test_the_sow_view_lists_topics_and_runs_a_query(browser, tmp_path):  # noqa: F811
    out = DOCS if os.environ.get("TICKERTAPE_SCREENSHOTS") else tmp_path
    with ServerProcess(tmp_path / "s", extra=SOW) as srv:
        docs = [json.dumps({"sym": f"S{i:02}", "px": i, "venue": "X"}) for i in range(20)]
        publish_many(srv.port, "prices", docs, name="browser-sow-pub").close()
        ctx, pg, errors = _open(browser, srv.admin_port, "sow")
        pg.wait_for_function(
            "() => document.querySelector('#sow-table').textContent.includes('20 rec')",
            timeout=10_000,
        )
        pg.fill("#sow-filter", "/px >= 10")
        pg.fill("#sow-order", "/px DESC")
        pg.fill("#sow-top", "5")
        pg.click("#sow-query button")
        pg.wait_for_function(
            "() => document.querySelector('#sow-result').textContent"
            " === '5 of 10 matching records of prices'",
            timeout=10_000,
        )
        cells = pg.eval_on_selector_all(
            "#sow-records tr td:last-child",
            "(tds) => tds.map((td) => JSON.parse(td.textContent).px)",
        )
        assert cells == [19, 18, 17, 16, 15]
        pg.fill("#sow-filter", "/px >")
        pg.click("#sow-query button")
        pg.wait_for_function(
            "() => document.querySelector('#sow-result').textContent.startsWith('Query refused')",
            timeout=10_000,
        )
        pg.fill("#sow-filter", "/px < 3")
        pg.click("#sow-query button")
        pg.wait_for_function(
            "() => document.querySelector('#sow-result').textContent.startsWith('3 of 3')",
            timeout=10_000,
        )
        pg.screenshot(path=str(out / "console-sow.png"), full_page=True)
        ctx.close()
    # the refused query's 400 is the browser's one console error
    assert [e for e in errors if "status of 400" not in e] == []
