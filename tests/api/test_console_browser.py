"""The web console in a real headless Chromium, against a real `combined serve` and worker.

Screenshots of every step are kept in ``test-artifacts/console/<test>/``
(the ``artifacts`` fixture). The browser may reach nothing but the server:
any other request is aborted and fails the test, so the pages (and /docs)
work offline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

pytestmark = pytest.mark.chromium

TOKEN = "console-t0ken-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WITH_TOKEN = {"COMBINED_API_TOKEN": TOKEN}
#: How long a page may take to show a Run's end (a worker polls every 0.2 s).
SETTLE_MS = 90_000


@contextmanager
def worker(root: Path) -> Iterator[subprocess.Popen[str]]:
    """``combined worker --poll 0.2`` in ``root`` until the block ends (SIGTERM)."""
    process = subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", "worker", "--poll", "0.2"],
        cwd=root,
        env={**os.environ, "COMBINED_RETRY_BACKOFF_S": "0", "COMBINED_API_TOKEN": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()


class Offline:
    """A browser context that may reach only ``base``: every other request is aborted."""

    def __init__(self, browser: Browser, base: str) -> None:
        self.base = base
        self.context: BrowserContext = browser.new_context(viewport={"width": 1280, "height": 900})
        self.urls: list[str] = []
        self.refused: list[str] = []
        self.context.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        url = route.request.url
        self.urls.append(url)
        if url.startswith((self.base, "data:")):
            route.continue_()
        else:
            self.refused.append(url)
            route.abort()

    def page(self) -> Page:
        return self.context.new_page()

    def close(self) -> None:
        self.context.close()
        assert self.refused == [], f"the console reached outside its server: {self.refused}"
        leaked = [u for u in self.urls if TOKEN in u]
        assert leaked == [], "the API token appeared in a URL"


@pytest.fixture
def offline(browser: Browser) -> Iterator[Any]:
    """Open offline browser contexts (closed, and checked, at the end)."""
    opened: list[Offline] = []

    def open_context(base: str) -> Offline:
        opened.append(Offline(browser, base))
        return opened[-1]

    yield open_context
    for context in opened:
        context.close()


def log_in(page: Page, base: str, path: str = "/") -> None:
    """Open ``path``, be sent to the login, paste the token, land on ``path``."""
    page.goto(base + path)
    assert page.url.startswith(f"{base}/console/login?next="), page.url
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(base + path)


def flash(page: Page) -> str:
    return page.inner_text(".flash")


def test_pages_load_after_login_and_a_request_without_a_session_goes_to_the_login(
    shop: Path, tools: Any, offline: Any, artifacts: Path
) -> None:
    with tools.serving(shop, "--no-schedule", env=WITH_TOKEN) as (base, _):
        browser = offline(base)
        page = browser.page()
        page.goto(f"{base}/console/runs")
        assert page.url == f"{base}/console/login?next=%2Fconsole%2Fruns"
        page.screenshot(path=artifacts / "01-login.png")
        page.fill("input[name=token]", TOKEN + "-wrong")
        page.click("button[type=submit]")
        assert "not this server's API token" in page.inner_text(".flash.error")
        assert browser.context.cookies() == []
        page.fill("input[name=token]", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/console/runs")
        assert page.inner_text("h1") == "Runs"

        (cookie,) = browser.context.cookies()
        assert cookie["name"] == "combined_console"
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]
        assert page.evaluate("document.cookie") == ""  # a script cannot read it

        pages = {
            "/": "Datasets",
            "/console/runs": "Runs",
            "/console/quarantine": "Quarantine",
            "/console/activity": "Activity",
            "/console/usage": "Monthly active rows",
            "/console/datasets/shop/orders": "shop.orders",
        }
        for number, (path, heading) in enumerate(pages.items(), start=2):
            answer = page.goto(base + path)
            assert answer is not None and answer.status == 200, path
            assert page.inner_text("h1").startswith(heading), path
            page.screenshot(
                path=artifacts / f"{number:02d}-{heading.split()[0]}.png", full_page=True
            )
        page.goto(base + "/")
        assert page.locator("tr[data-dataset]").count() == 2
        assert "never published" in page.inner_text("tr[data-dataset='shop.orders']")

        # /docs: Swagger UI, from this server's own assets, without a bearer header
        page.goto(f"{base}/docs")
        page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
        assert page.inner_text(".swagger-ui .info .title").startswith("Combined")
        page.locator(".opblock-summary-path", has_text="/v1/datasets").first.wait_for()
        page.screenshot(path=artifacts / "08-docs.png")
        # its calls still need the bearer token: given to its Authorize button, they work
        page.click(".swagger-ui button.authorize")
        page.fill(".swagger-ui .auth-container input", TOKEN)
        page.click(".swagger-ui .auth-btn-wrapper button.authorize")
        page.click(".swagger-ui .btn-done")
        queue = page.locator(".opblock-get", has_text="/v1/queue")
        queue.locator(".opblock-summary").click()
        queue.locator("button.try-out__btn").click()
        with page.expect_response(f"{base}/v1/queue?limit=100") as called:
            queue.locator("button.execute").click()
        assert called.value.status == 200 and called.value.json() == {"runs": []}
        assert called.value.request.headers["authorization"] == f"Bearer {TOKEN}"
        page.screenshot(path=artifacts / "09-docs-called.png")

        page.goto(base + "/")
        page.click("header form.logout button")
        page.wait_for_url(f"{base}/console/login")
        page.goto(f"{base}/console/usage")
        assert page.url == f"{base}/console/login?next=%2Fconsole%2Fusage"


def test_a_capture_started_from_the_page_appears_and_finishes(
    shop: Path, tools: Any, offline: Any, artifacts: Path
) -> None:
    with tools.serving(shop, "--no-schedule", env=WITH_TOKEN) as (base, _), worker(shop):
        browser = offline(base)
        feed = browser.page()
        log_in(feed, base, "/console/activity")
        page = browser.page()  # the same session, another tab
        page.goto(base + "/")
        page.click("button[data-capture='shop.orders']")
        page.wait_for_url(base + "/")
        told = flash(page)
        found = re.search(r"run (r[\w-]+) queued: shop \(orders\)", told)
        assert found, told
        run_id = found.group(1)
        page.screenshot(path=artifacts / "01-queued.png")

        page.goto(f"{base}/console/runs")
        row = page.locator(f"tr[data-run='{run_id}']")
        row.locator(".state-succeeded").wait_for(timeout=SETTLE_MS)  # refreshed in place
        page.screenshot(path=artifacts / "02-runs.png", full_page=True)
        page.goto(f"{base}/console/runs/{run_id}")
        assert page.inner_text("#run-state") == "succeeded"
        assert "200 records in 1 deliveries, 1 committed" in page.inner_text("#run-progress")
        assert "worker:" in page.inner_text("table.attempts")  # its Attempt
        page.screenshot(path=artifacts / "03-run.png", full_page=True)

        # the feed opened before the capture showed it without a reload
        feed.locator("tr[data-kind='run.succeeded']").wait_for(timeout=SETTLE_MS)
        assert feed.url == f"{base}/console/activity"
        assert feed.locator("tr[data-kind='run.queued']").count() == 1
        feed.screenshot(path=artifacts / "04-activity.png", full_page=True)

        page.goto(f"{base}/console/datasets/shop/orders")
        (point,) = page.locator("svg.chart circle.point").all()
        assert point.get_attribute("data-value") == "200"
        assert page.locator("tr.version").count() == 1
        assert run_id in page.inner_text("tr.version")
        page.screenshot(path=artifacts / "05-history.png", full_page=True)
        page.goto(f"{base}/console/usage")
        (bar,) = page.locator("svg.chart rect.bar").all()
        assert bar.get_attribute("data-value") == "200"
        page.screenshot(path=artifacts / "06-usage.png", full_page=True)
        page.goto(base + "/")
        row_text = page.inner_text("tr[data-dataset='shop.orders']")
        assert " old" in row_text and run_id not in row_text  # published, nothing queued


def test_a_failed_run_is_retried_from_its_page(
    shop: Path, tools: Any, offline: Any, artifacts: Path
) -> None:
    (shop / "shop.db").rename(shop / "away.db")
    with tools.serving(shop, "--no-schedule", env=WITH_TOKEN) as (base, _), worker(shop):
        page = offline(base).page()
        log_in(page, base, "/console/datasets/shop/orders")
        page.click("button[data-capture='shop.orders']")
        run_id = re.search(r"run (r[\w-]+) queued", flash(page)).group(1)  # type: ignore[union-attr]
        page.goto(f"{base}/console/runs/{run_id}")
        page.locator("#run-state .state-failed").wait_for(timeout=SETTLE_MS)
        assert page.locator("dd.error").count() == 1
        page.screenshot(path=artifacts / "01-failed.png", full_page=True)

        (shop / "away.db").rename(shop / "shop.db")
        page.click(f"button[data-retry='{run_id}']")
        page.wait_for_url(re.compile(r".*/console/runs/r[\w-]+$"))
        assert not page.url.endswith(run_id)
        assert f"a retry of {run_id}" in flash(page)
        page.locator("#run-state .state-succeeded").wait_for(timeout=SETTLE_MS)
        assert f"retry, a retry of {run_id}" in page.inner_text("section#run dl")
        page.screenshot(path=artifacts / "02-retried.png", full_page=True)


def test_a_queued_run_is_canceled_from_its_page(
    shop: Path, tools: Any, offline: Any, artifacts: Path
) -> None:
    """No worker runs: the queued Run waits, and its Cancel button ends it at once."""
    with tools.serving(shop, "--no-schedule", env=WITH_TOKEN) as (base, _):
        page = offline(base).page()
        log_in(page, base, "/console/datasets/shop/orders")
        page.click("button[data-capture='shop.orders']")
        run_id = re.search(r"run (r[\w-]+) queued", flash(page)).group(1)  # type: ignore[union-attr]
        page.goto(f"{base}/console/runs/{run_id}")
        page.fill("input[name='reason']", "wrong dataset")
        page.click(f"button[data-cancel='{run_id}']")
        assert f"run {run_id} canceled by console" in flash(page)
        page.locator("#run-state .state-canceled").wait_for(timeout=SETTLE_MS)
        assert page.locator(f"button[data-cancel='{run_id}']").count() == 0
        page.screenshot(path=artifacts / "01-canceled.png", full_page=True)
    shown = tools.cli(shop, "run", "show", run_id)
    assert "canceled" in shown.stdout and "wrong dataset" in shown.stdout


def test_a_quarantine_entry_is_released_from_the_page_with_a_name_and_a_reason(
    shop: Path, tools: Any, offline: Any, artifacts: Path
) -> None:
    tools.sql(
        shop,
        "CREATE TABLE people (id INTEGER, name TEXT); "
        "INSERT INTO people VALUES (1, 'a'), (1, 'b'), (2, 'c');",
    )
    project = shop / "combined.yaml"
    project.write_text(project.read_text() + "      people:\n        key: [id]\n")
    assert tools.cli(shop, "capture", "shop.people").returncode == 3  # needs review
    with tools.serving(shop, "--no-schedule", env=WITH_TOKEN) as (base, _):
        (entry,) = httpx.get(f"{base}/v1/quarantine", headers=AUTH).json()["entries"]
        page = offline(base).page()
        log_in(page, base, "/console/quarantine")
        article = page.locator(f"article[data-entry='{entry['id']}']")
        assert "2 records" in article.inner_text()
        page.screenshot(path=artifacts / "01-awaiting.png", full_page=True)
        article.locator("h2 a").click()  # its records, to decide on
        page.wait_for_url(f"{base}/console/quarantine/{entry['id']}")
        assert page.locator("table.records tbody tr").count() == 2
        cells = page.locator("table.records tbody td").all_inner_texts()
        assert cells[:2] == ["1", "a"] and cells[4:6] == ["1", "b"]
        page.screenshot(path=artifacts / "01-records.png", full_page=True)
        page.go_back()
        article = page.locator(f"article[data-entry='{entry['id']}']")

        release = article.locator("form.release")
        release.locator("button").click()  # the browser asks for the name first
        assert release.locator("input[name=by]").evaluate("e => e.validity.valueMissing")
        assert page.url == f"{base}/console/quarantine"

        # without the browser's check, the server refuses a blank reason itself
        release.locator("input[name=by]").fill("ana")
        release.locator("input[name=reason]").evaluate("e => e.removeAttribute('required')")
        release.locator("button").click()
        page.wait_for_load_state()
        assert "needs your name and a reason" in page.inner_text(".flash.error")
        assert page.locator(f"article[data-entry='{entry['id']}']").count() == 1
        page.screenshot(path=artifacts / "02-refused.png", full_page=True)

        release = page.locator(f"article[data-entry='{entry['id']}'] form.release")
        release.locator("input[name=by]").fill("ana")
        release.locator("input[name=reason]").fill("the duplicate ids are a known export bug")
        release.locator("button").click()
        page.wait_for_url(f"{base}/console/quarantine")
        assert flash(page) == f"entry {entry['id']} released by ana"
        assert page.locator("article.entry").count() == 0
        page.screenshot(path=artifacts / "03-released.png", full_page=True)

        (decided,) = httpx.get(
            f"{base}/v1/quarantine", params={"all": "true"}, headers=AUTH
        ).json()["entries"]
        assert (decided["decision"], decided["decided_by"]) == ("released", "ana")
        events = httpx.get(
            f"{base}/v1/activity", params={"kind": "quarantine"}, headers=AUTH
        ).json()["events"]
        assert any("known export bug" in str(e["body"]) for e in events)


class _ForgingSite(BaseHTTPRequestHandler):
    """Another site: its page submits a form to the console as soon as it loads."""

    target = ""

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        page = (
            f'<form id="f" method="post" action="{self.target}">'
            '<input name="csrf" value="guessed"><input name="next" value="/"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_forged_form_post_is_refused(
    shop: Path, tools: Any, browser: Browser, artifacts: Path
) -> None:
    with tools.serving(shop, "--no-schedule", env=WITH_TOKEN) as (base, _):
        context = browser.new_context()
        page = context.new_page()
        log_in(page, base)
        target = f"{base}/console/datasets/shop/orders/capture"
        # a post with this session's cookie but without its CSRF token
        forms: list[dict[str, str | float | bool]] = [
            {"csrf": "forged", "next": "/"},
            {"next": "/"},
        ]
        for form in forms:
            refused = page.request.post(target, form=form, max_redirects=0)
            assert refused.status == 403, form
            assert "CSRF token" in refused.text()
        # the page's own form, its token tampered with
        page.goto(base + "/")
        page.locator("tr[data-dataset='shop.orders'] input[name=csrf]").evaluate(
            "e => e.value = 'tampered'"
        )
        page.click("button[data-capture='shop.orders']")
        assert page.inner_text("h1") == "Refused"
        page.screenshot(path=artifacts / "01-tampered.png")

        # a page on another site that submits the form as it loads
        _ForgingSite.target = target
        site = HTTPServer(("127.0.0.1", 0), _ForgingSite)
        threading.Thread(target=site.serve_forever, daemon=True).start()
        try:
            with page.expect_response(target) as answer:
                page.goto(f"http://localhost:{site.server_address[1]}/")
            assert answer.value.status == 403
            page.screenshot(path=artifacts / "02-cross-site.png")
        finally:
            site.shutdown()
            site.server_close()
        context.close()
        assert httpx.get(f"{base}/v1/queue", headers=AUTH).json() == {"runs": []}
