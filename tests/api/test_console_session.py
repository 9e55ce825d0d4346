"""The console's session and forms over the real application (no browser needed).

Its cookie's flags, its CSRF check, what it does without a token, /docs
served from the package, and the charts' geometry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from combined.api import create_app
from combined.api._console._charts import bar_chart, line_chart, nice_ceiling

TOKEN = "console-t0ken-0123456789abcdef"
LOCAL = "http://127.0.0.1:8000"


@pytest.fixture
def app_client(shop: Path) -> Iterator[TestClient]:
    with TestClient(create_app(shop / "combined.yaml", token=TOKEN), base_url=LOCAL) as c:
        yield c


def log_in(client: TestClient, token: str = TOKEN) -> str:
    """Log ``client`` in; the CSRF token its pages carry."""
    answer = client.post("/console/login", data={"token": token, "next": "/"})
    assert answer.status_code == 200, answer.text
    return csrf_of(answer.text)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


def test_the_session_cookie_is_signed_http_only_strict_and_holds_no_token(
    app_client: TestClient,
) -> None:
    sent = app_client.post(
        "/console/login", data={"token": TOKEN, "next": "/console/runs"}, follow_redirects=False
    )
    assert sent.status_code == 303 and sent.headers["location"] == "/console/runs"
    cookie = sent.headers["set-cookie"]
    assert cookie.startswith("combined_console=")
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/", "max-age=43200"} <= flags
    value = cookie.split(";")[0].split("=", 1)[1]
    body = json.loads(base64.b64decode(value.split(".")[0]))
    assert body["auth"] is True and set(body) == {"auth", "csrf"}
    assert TOKEN not in json.dumps(body)

    # a cookie whose body was changed loses its signature: the login again
    forged = base64.b64encode(json.dumps({"auth": True, "csrf": "x"}).encode()).decode()
    stranger = TestClient(app_client.app, base_url=LOCAL)
    stranger.cookies.set("combined_console", f"{forged}.{value.split('.', 1)[1]}")
    refused = stranger.get("/", follow_redirects=False)
    assert refused.status_code == 303 and refused.headers["location"] == "/console/login?next=%2F"


def test_a_session_of_another_token_is_not_one_of_this_server(shop: Path) -> None:
    with TestClient(create_app(shop / "combined.yaml", token=TOKEN), base_url=LOCAL) as a:
        log_in(a)
        cookie = a.cookies["combined_console"]
    other = TOKEN[::-1]
    with TestClient(create_app(shop / "combined.yaml", token=other), base_url=LOCAL) as b:
        b.cookies.set("combined_console", cookie)
        sent = b.get("/console/runs", follow_redirects=False)
        assert sent.status_code == 303
        assert sent.headers["location"] == "/console/login?next=%2Fconsole%2Fruns"


def test_a_copy_of_a_cookie_logged_out_opens_nothing(app_client: TestClient) -> None:
    """Log out cleared the browser's cookie only: a copy taken before still opened every
    page for its 12 hours (found by an API review)."""
    csrf = log_in(app_client)
    copy = app_client.cookies["combined_console"]
    out = app_client.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    thief = TestClient(app_client.app, base_url=LOCAL)
    thief.cookies.set("combined_console", copy)
    sent = thief.get("/console/runs", follow_redirects=False)
    assert sent.status_code == 303 and sent.headers["location"].startswith("/console/login")
    log_in(app_client)  # a new login opens a new session
    assert app_client.get("/console/runs", follow_redirects=False).status_code == 200


def test_a_logout_holds_for_every_server_on_the_catalog(shop: Path, tools: Any) -> None:
    """A logout was remembered only in the server process that took it: a copy of the
    cookie opened every page again on a second `combined serve` of the same project,
    or on this one restarted."""
    with TestClient(create_app(shop / "combined.yaml", token=TOKEN), base_url=LOCAL) as here:
        csrf = log_in(here)
        copy = here.cookies["combined_console"]
        with tools.serving(shop, env={"COMBINED_API_TOKEN": TOKEN}) as (base, _):
            there = httpx.get(f"{base}/console/runs", cookies={"combined_console": copy})
            assert there.status_code == 200
            here.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
            there = httpx.get(f"{base}/console/runs", cookies={"combined_console": copy})
            assert there.status_code == 303
            assert there.headers["location"].startswith("/console/login")
    catalog = sqlite3.connect(shop / ".combined" / "catalog.db")
    try:
        (kept,) = catalog.execute("SELECT session FROM console_logouts").fetchone()
    finally:
        catalog.close()
    assert kept == hashlib.sha256(csrf.encode()).hexdigest()  # (the token itself is not kept)


def test_the_login_sends_only_to_this_servers_pages(app_client: TestClient) -> None:
    for target in ("//evil.example/", "https://evil.example/", "\\\\evil", "evil"):
        sent = app_client.post(
            "/console/login", data={"token": TOKEN, "next": target}, follow_redirects=False
        )
        assert sent.headers["location"] == "/", target
    wrong = app_client.post("/console/login", data={"token": "nope", "next": "/"})
    assert wrong.status_code == 401 and "not this server&#39;s API token" in wrong.text


def test_a_form_without_the_sessions_csrf_token_is_refused(
    app_client: TestClient, shop: Path
) -> None:
    anonymous = app_client.post("/console/datasets/shop/orders/capture", follow_redirects=False)
    assert anonymous.status_code == 303
    assert anonymous.headers["location"].startswith("/console/login?next=")
    csrf = log_in(app_client)
    for form in ({}, {"csrf": ""}, {"csrf": csrf + "x"}, {"csrf": csrf[:-1]}):
        refused = app_client.post("/console/datasets/shop/orders/capture", data=form)
        assert refused.status_code == 403, form
        assert "CSRF token" in refused.text
    assert app_client.get("/v1/queue", headers={"Authorization": f"Bearer {TOKEN}"}).json() == {
        "runs": []
    }
    queued = app_client.post("/console/datasets/shop/orders/capture", data={"csrf": csrf})
    assert queued.status_code == 200 and re.search(
        r"run r[\w-]+ queued: shop \(orders\)", queued.text
    )
    again = app_client.post("/console/datasets/shop/orders/capture", data={"csrf": csrf})
    assert "joined: shop (orders), already queued" in again.text  # as capture --enqueue
    # an unknown dataset is told on the page, with what to do
    unknown = app_client.post("/console/datasets/shop/nope/capture", data={"csrf": csrf})
    assert 'class="flash error"' in unknown.text and "nope" in unknown.text


def test_the_session_opens_docs_and_the_schema_but_not_the_json_api(
    app_client: TestClient,
) -> None:
    assert app_client.get("/openapi.json").status_code == 401
    log_in(app_client)
    docs = app_client.get("/docs")
    assert docs.status_code == 200
    sources = re.findall(r'(?:src|href|url)\s*[:=]\s*["\']([^"\']+)', docs.text)
    assert sources and all(s.startswith("/") for s in sources), sources
    for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"):
        assert app_client.get(asset).status_code == 200, asset
    schema = app_client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    refused = app_client.get("/v1/runs")  # the API: the bearer token, never a cookie
    assert refused.status_code == 401
    assert app_client.get("/redoc").status_code == 401  # not served (it needs a CDN)


def test_console_pages_forbid_framing_and_foreign_scripts(app_client: TestClient) -> None:
    log_in(app_client)
    page = app_client.get("/console/activity")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["cache-control"] == "no-store"
    assert "<script>" not in page.text and "http" not in re.sub(r'href="/[^"]*"', "", page.text)
    assert app_client.get("/console/static/console.js").status_code == 200
    missing = app_client.get("/console/runs/r-nope")
    assert missing.status_code == 404 and "no run &#39;r-nope&#39;" in missing.text


def test_without_a_token_the_console_opens_at_once_and_still_checks_csrf(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--insecure-no-auth (loopback only): no login, but forms carry a CSRF token."""
    monkeypatch.delenv("COMBINED_API_TOKEN", raising=False)
    app = create_app(shop / "combined.yaml", allow_no_auth=True)
    with TestClient(app, base_url=LOCAL) as c:
        home = c.get("/", follow_redirects=False)
        assert home.status_code == 200 and "Log out" not in home.text
        assert "httponly" in home.headers["set-cookie"].lower()
        assert (
            c.get("/console/login?next=/console/runs", follow_redirects=False).headers["location"]
            == "/console/runs"
        )
        refused = c.post("/console/datasets/shop/orders/capture", data={"csrf": "guess"})
        assert refused.status_code == 403
        fresh = TestClient(app, base_url=LOCAL)  # another browser: its own session and token
        assert fresh.post("/console/datasets/shop/orders/capture", data={}).status_code == 403
        queued = c.post("/console/datasets/shop/orders/capture", data={"csrf": csrf_of(home.text)})
        assert "queued: shop (orders)" in queued.text
    # a foreign Host is refused before the console, as for the API
    with TestClient(app, base_url="http://evil.example") as c:
        assert c.get("/").status_code == 421


def test_charts_place_their_marks_on_a_rounded_scale() -> None:
    assert [nice_ceiling(v) for v in (0, 1, 3, 10, 11, 180, 200, 201, 7000)] == [
        1, 1, 5, 10, 20, 200, 200, 500, 10000,
    ]  # fmt: skip
    bars = bar_chart([("2026-10", 100), ("2026-11", 200)], "rows")
    assert [m.value for m in bars.marks] == [100, 200]
    short, tall = bars.marks
    assert tall.height == 2 * short.height and tall.y < short.y
    assert [label for _, label in bars.y_ticks] == ["0", "100", "200"]
    start = datetime(2026, 11, 1, tzinfo=UTC)
    line = line_chart(
        [(start + timedelta(hours=2), 50), (start, 10), (start + timedelta(hours=1), 30)], "rows"
    )
    xs = [m.x for m in line.marks]
    assert [m.value for m in line.marks] == [10, 30, 50] and xs == sorted(xs)
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1])  # placed by time
    assert line.line.count(",") == 3
    assert line_chart([], "rows").marks == [] and bar_chart([], "rows").marks == []
