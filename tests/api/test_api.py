"""The HTTP API over a real project: auth, reads, queued actions, errors, no secrets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from combined.api import create_app
from combined.errors import ConfigError

TOKEN = "t0ken-for-the-api-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(shop: Path) -> Iterator[TestClient]:
    """The API over the shop project, its lifespan running."""
    with TestClient(create_app(shop / "combined.yaml", token=TOKEN), headers=AUTH) as c:
        yield c


def test_every_endpoint_but_health_needs_the_token(shop: Path) -> None:
    with TestClient(create_app(shop / "combined.yaml", token=TOKEN)) as anon:
        assert anon.get("/health").json() == {"status": "ok"}
        assert anon.head("/health").status_code == 200
        for path in ("/v1/runs", "/v1/datasets", "/openapi.json", "/redoc", "/v1/nowhere"):
            refused = anon.get(path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"] == "Bearer"
        # The console's pages and /docs ask a browser to log in (tests/api/test_console*.py).
        for path in ("/", "/docs", "/console/runs"):
            sent = anon.get(path, follow_redirects=False)
            assert sent.status_code == 303, path
            assert sent.headers["location"].startswith("/console/login?next="), path
        wrong = anon.get("/v1/runs", headers={"Authorization": f"Bearer {TOKEN}x"})
        assert wrong.status_code == 401
        basic = anon.get("/v1/runs", headers={"Authorization": f"Basic {TOKEN}"})
        assert basic.status_code == 401
        assert anon.post("/v1/sources/shop/captures").status_code == 401
        assert anon.get("/v1/runs", headers=AUTH).status_code == 200
        assert anon.get("/openapi.json", headers=AUTH).json()["info"]["title"] == "Combined"
    # nothing was queued by the refused request
    with TestClient(create_app(shop / "combined.yaml", token=TOKEN), headers=AUTH) as c:
        assert c.get("/v1/queue").json() == {"runs": []}


def test_the_api_refuses_to_start_without_a_token(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COMBINED_API_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="COMBINED_API_TOKEN is not set"):
        create_app(shop / "combined.yaml")
    with pytest.raises(ConfigError, match="shorter than 16"):
        create_app(shop / "combined.yaml", token="short")
    # a token no client could send as written: it started, and nobody could log in
    for unsendable in (
        f"{TOKEN} ",
        " " * 16,
        f"{TOKEN}\r",
        f"{TOKEN[:8]}\t{TOKEN[8:]}",
        f"{TOKEN}é",
    ):
        with pytest.raises(ConfigError, match="starts or ends with a space, or holds a line"):
            create_app(shop / "combined.yaml", token=unsendable)
    spaced = f"{TOKEN[:8]} {TOKEN[8:]}"  # (a space inside is sent as written: it was taken)
    with TestClient(create_app(shop / "combined.yaml", token=spaced)) as c:
        assert c.get("/v1/runs", headers={"Authorization": f"Bearer {spaced}"}).status_code == 200
    monkeypatch.setenv("COMBINED_API_TOKEN", TOKEN)
    with TestClient(create_app(shop / "combined.yaml")) as c:
        assert c.get("/v1/runs").status_code == 401
        assert c.get("/v1/runs", headers=AUTH).status_code == 200
    monkeypatch.delenv("COMBINED_API_TOKEN")
    local = "http://127.0.0.1"  # without a token, only a loopback Host is answered
    with TestClient(create_app(shop / "combined.yaml", allow_no_auth=True), base_url=local) as c:
        assert c.get("/v1/runs").status_code == 200


def test_a_capture_queued_through_the_api_is_executed_by_a_worker_and_visible(
    shop: Path, tools: Any, client: TestClient
) -> None:
    queued = client.post("/v1/datasets/shop/orders/captures")
    assert queued.status_code == 202, queued.text
    run_id = queued.json()["run_id"]
    assert queued.json()["run"]["state"] == "queued"
    assert [r["id"] for r in client.get("/v1/queue").json()["runs"]] == [run_id]
    # the request read nothing: no table until a worker executes the Run
    assert not (shop / "lake" / "shop" / "orders").exists()
    status = {d["dataset"]: d for d in client.get("/v1/datasets").json()["datasets"]}
    assert status["shop.orders"]["version"] is None

    worked = tools.cli(shop, "worker", "--once")
    assert worked.returncode == 0, worked.stderr

    run = client.get(f"/v1/runs/{run_id}").json()
    assert run["run"]["state"] == "succeeded", run["run"]["error"]
    assert run["run"]["stats"]["orders"]["inserts"] == 200
    (attempt,) = run["attempts"]
    assert attempt["worker"].startswith("worker:") and attempt["outcome"] == "succeeded"
    assert {d["state"] for d in run["deliveries"]} == {"committed"}
    assert run["admission"]["config"]["source"] == "shop"
    assert client.get("/v1/queue").json() == {"runs": []}

    one = client.get("/v1/datasets/shop/orders").json()
    assert one["version"] is not None and one["published_at"] is not None
    assert one["queued_runs"] == []
    pubs = client.get("/v1/publications").json()["publications"]
    assert pubs[0]["id"] == run["run"]["publication_id"]
    assert [(m["dataset"], m["changed"]) for m in pubs[0]["member_rows"]] == [("orders", True)]
    (version,) = client.get("/v1/datasets/shop/orders/history").json()["versions"]
    assert version["run_id"] == run_id and version["row_count"] == 200
    assert pubs[0]["id"] in version["publications"]
    (usage,) = client.get("/v1/usage").json()["usage"]
    assert (usage["dataset"], usage["mar"]) == ("orders", 200)
    kinds = [
        e["kind"] for e in client.get("/v1/activity", params={"run_id": run_id}).json()["events"]
    ]
    # (the read ends, with its outcome, once the Run's commit is published)
    assert kinds[:2] == ["read.ended", "run.succeeded"] and "dataset.changed" in kinds
    assert kinds[-1] == "run.queued"
    listed = client.get("/v1/runs", params={"state": "succeeded"}).json()["runs"]
    assert [r["id"] for r in listed] == [run_id]
    assert client.get("/v1/runs", params={"state": "queued"}).json()["runs"] == []


def test_a_source_capture_names_every_run_that_captures_its_datasets(client: TestClient) -> None:
    """A source whose datasets were queued in two Runs answered the first alone: a client
    waiting on it took the source for captured when one of its datasets was."""
    first = client.post("/v1/datasets/shop/customers/captures").json()
    assert first["parts"] == [
        {"run_id": first["run_id"], "datasets": ["customers"], "joined": False}
    ]
    second = client.post("/v1/sources/shop/captures").json()  # orders: a new Run
    assert second["run_id"] != first["run_id"]
    again = client.post("/v1/sources/shop/captures").json()  # both joined
    parts = {p["run_id"]: (p["datasets"], p["joined"]) for p in again["parts"]}
    assert parts == {
        first["run_id"]: (["customers"], True),
        second["run_id"]: (["orders"], True),
    }


def test_a_source_capture_and_a_retry_are_queued_not_run(
    shop: Path, tools: Any, client: TestClient
) -> None:
    (shop / "shop.db").rename(shop / "away.db")
    run_id = client.post("/v1/sources/shop/captures").json()["run_id"]
    assert tools.cli(shop, "worker", "--once").returncode == 0
    failed = client.get(f"/v1/runs/{run_id}").json()["run"]
    assert failed["state"] == "failed" and failed["datasets"] == ["customers", "orders"]
    (shop / "away.db").rename(shop / "shop.db")

    retry = client.post(f"/v1/runs/{run_id}/retry")
    assert retry.status_code == 202, retry.text
    assert retry.json()["run"]["state"] == "queued"
    assert retry.json()["run"]["retry_of"] == run_id
    again = client.post(f"/v1/runs/{run_id}/retry")  # one retry of a failure at a time
    assert again.status_code == 409
    assert "was retried by run" in again.json()["error"]["message"]
    assert tools.cli(shop, "worker", "--once").returncode == 0
    done = client.get(f"/v1/runs/{retry.json()['run_id']}").json()["run"]
    assert done["state"] == "succeeded", done["error"]


def test_a_queued_run_is_canceled_through_the_api(
    shop: Path, tools: Any, client: TestClient
) -> None:
    run_id = client.post("/v1/datasets/shop/orders/captures").json()["run_id"]
    anon = client.post(f"/v1/runs/{run_id}/cancel", headers={"Authorization": ""})
    assert anon.status_code == 401
    canceled = client.post(f"/v1/runs/{run_id}/cancel", json={"reason": "wrong day"})
    assert canceled.status_code == 202, canceled.text
    run = canceled.json()["run"]
    assert run["state"] == "canceled"
    assert (run["canceled_by"], run["cancel_reason"]) == ("api", "wrong day")
    assert client.get("/v1/queue").json() == {"runs": []}
    assert tools.cli(shop, "worker", "--once").returncode == 0  # nothing to take
    assert client.get(f"/v1/runs/{run_id}").json()["run"]["state"] == "canceled"
    events = client.get("/v1/activity", params={"run_id": run_id, "kind": "run.canceled"})
    (event,) = events.json()["events"]
    assert event["body"]["by"] == "api" and event["body"]["reason"] == "wrong day"
    again = client.post(f"/v1/runs/{run_id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["message"] == (
        f"run {run_id} already ended canceled: there is nothing to cancel"
    )
    assert client.post("/v1/runs/r-nope/cancel").status_code == 404
    named = client.post("/v1/datasets/shop/customers/captures").json()["run_id"]
    by = client.post(f"/v1/runs/{named}/cancel", json={"by": "ops-bot"}).json()["run"]
    assert (by["canceled_by"], by["cancel_reason"]) == ("ops-bot", None)


def test_a_reset_through_the_api_needs_a_reason_and_drops_tables_only_when_asked(
    shop: Path, tools: Any, client: TestClient
) -> None:
    """`combined reset` over HTTP: a reason required, the table the lake holds removed only
    with "drop_table": true, the same token and cross-site guard as every other action."""
    assert tools.cli(shop, "capture", "shop.orders").returncode == 0
    table, path = shop / "lake" / "shop" / "orders", "/v1/datasets/shop/orders/reset"
    asked = {"reason": "identity v2", "by": "ana", "drop_table": True}
    assert client.post(path, json=asked, headers={"Authorization": ""}).status_code == 401
    other_site = client.post(path, json=asked, headers={"Origin": "https://elsewhere.example"})
    assert other_site.status_code == 403
    unsaid = client.post(path, json={"drop_table": True})
    assert unsaid.status_code == 422 and "body field 'reason'" in unsaid.text
    blank = client.post(path, json={"reason": "  ", "drop_table": True})
    assert blank.status_code == 400 and "none was given" in blank.json()["error"]["message"]
    misspelt = client.post(path, json={"reason": "v2", "drop_tables": True})
    assert misspelt.status_code == 422 and "body field 'drop_tables'" in misspelt.text
    kept = client.post(path, json={"reason": "v2"})
    assert kept.status_code == 400, kept.text
    assert f"holds its table at {table}" in kept.json()["error"]["message"]
    assert '"drop_table": true' in kept.json()["error"]["hint"]
    assert client.post("/v1/datasets/shop/nope/reset", json=asked).status_code == 404
    assert table.exists()  # none of them reset anything
    assert client.get("/v1/activity", params={"kind": "dataset.reset"}).json()["events"] == []
    done = client.post(path, json=asked)
    assert done.status_code == 200, done.text
    (report,) = done.json()["resets"]
    assert (report["dataset"], report["reset"], report["dropped"]) == (
        "shop.orders",
        True,
        [str(table)],
    )
    assert report["forgotten"]["lake_version"] == 0 and not table.exists()
    (event,) = client.get("/v1/activity", params={"kind": "dataset.reset"}).json()["events"]
    assert (event["body"]["by"], event["body"]["reason"]) == ("ana", "identity v2")
    source = client.post("/v1/sources/shop/reset", json={"reason": "again"})
    assert source.status_code == 200, source.text
    assert [r["reset"] for r in source.json()["resets"]] == [False, False]  # nothing recorded
    captured = tools.cli(shop, "capture", "shop.orders")
    assert captured.returncode == 0 and "200 read, +200 ~0 -0" in captured.stdout  # afresh


def test_a_run_id_is_matched_as_written_never_as_a_pattern(client: TestClient) -> None:
    """`%-287f6b74` canceled the Run ending so (LIKE's wildcard), `R2026...` found `r2026...`
    (SQLite's LIKE ignores case), and an id of 50,001 characters answered 500 with the SQL."""
    run_id = client.post("/v1/datasets/shop/orders/captures").json()["run_id"]
    assert client.get(f"/v1/runs/{run_id[:10]}").json()["run"]["id"] == run_id  # a prefix
    for asked in (f"%{run_id[-9:]}", f"{run_id[:6]}_", run_id.upper(), "a" * 50_001):
        missing = client.get(f"/v1/runs/{asked}")
        assert missing.status_code == 404, (asked[:20], missing.text[:300])
        assert "SELECT" not in missing.text
        assert client.post(f"/v1/runs/{asked}/cancel").status_code == 404
    assert client.get(f"/v1/runs/{run_id}").json()["run"]["state"] == "queued"


def test_engine_errors_answer_with_a_status_a_message_and_a_hint(client: TestClient) -> None:
    missing = client.get("/v1/runs/r-nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NotFoundError"
    assert missing.json()["error"]["message"] == "no run 'r-nope'"
    assert missing.json()["error"]["hint"]
    unknown = client.post("/v1/datasets/shop/nope/captures")
    assert unknown.status_code == 404
    assert "unknown dataset 'nope'" in unknown.json()["error"]["message"]
    assert "orders" in unknown.json()["error"]["hint"]
    assert client.post("/v1/sources/nope/captures").status_code == 404
    assert client.get("/v1/datasets/shop/nope/history").status_code == 404
    assert client.get("/v1/usage", params={"month": "2026-13"}).status_code == 422
    assert client.get("/v1/runs", params={"limit": -1}).status_code == 422
    assert client.get("/v1/runs", params={"state": "sleeping"}).status_code == 422
    assert client.get("/v1/quarantine/nope").status_code == 404
    assert client.get("/v1/queue").json() == {"runs": []}  # none of them queued anything
    # FastAPI's own answers ({"detail": [...]}, the input echoed) are error bodies too
    for answer, says in (
        (client.get("/v1/runs", params={"limit": -1}), "query parameter 'limit': "),
        (client.get("/v1/quarantine/Q", params={"limit": 0}), "query parameter 'limit': "),
        (client.post("/v1/runs/r-x/cancel", json={"by": ""}), "body field 'by': "),
        (client.get("/v1/nowhere"), "Not Found"),
    ):
        body = answer.json()
        assert set(body) == {"error"} and says in body["error"]["message"], body
        assert body["error"]["hint"] and body["error"]["type"] in ("ValidationError", "NotFound")
    assert client.post("/v1/runs").status_code == 405
    assert client.post("/v1/runs").json()["error"]["type"] == "HTTPError"


def test_a_retry_of_a_run_that_succeeded_is_a_conflict(
    shop: Path, tools: Any, client: TestClient
) -> None:
    assert tools.cli(shop, "capture", "shop.orders").returncode == 0
    (run,) = client.get("/v1/runs").json()["runs"]
    refused = client.post(f"/v1/runs/{run['id']}/retry")
    assert refused.status_code == 409
    assert (
        refused.json()["error"]["message"]
        == f"run {run['id']} succeeded; there is nothing to retry"
    )
    assert "combined capture shop" in refused.json()["error"]["hint"]


def test_quarantine_is_listed_shown_and_decided_with_a_reason(
    shop: Path, tools: Any, client: TestClient
) -> None:
    tools.sql(
        shop,
        "CREATE TABLE people (id INTEGER, name TEXT);"
        "INSERT INTO people VALUES (1, 'a'), (2, 'b'), (2, 'c'), (3, 'd');",
    )
    project = shop / "combined.yaml"
    project.write_text(project.read_text() + "      people:\n        key: [id]\n")
    assert tools.cli(shop, "capture", "shop.people").returncode == 3  # needs review
    with TestClient(create_app(project, token=TOKEN), headers=AUTH) as c:
        (entry,) = c.get("/v1/quarantine").json()["entries"]
        assert entry["reason"].startswith("duplicate key") and entry["record_count"] == 2
        shown = c.get(f"/v1/quarantine/{entry['id']}").json()
        assert sorted(r["name"] for r in shown["records"]) == ["b", "c"]
        for body in ({}, {"by": "ana"}, {"reason": "", "by": "ana"}, {"reason": "ok"}):
            refused = c.post(f"/v1/quarantine/{entry['id']}/release", json=body)
            assert refused.status_code == 422, body
        blank = c.post(f"/v1/quarantine/{entry['id']}/release", json={"reason": "  ", "by": "ana"})
        assert blank.status_code == 400
        assert (
            blank.json()["error"]["message"] == "a quarantine decision records who took it and why"
        )
        assert c.get("/v1/quarantine").json()["entries"] != []  # still undecided
        released = c.post(
            f"/v1/quarantine/{entry['id']}/release",
            json={"reason": "known double entry", "by": "ana"},
        )
        assert released.status_code == 200, released.text
        assert released.json()["entry"]["decision"] == "released"
        assert c.get("/v1/quarantine").json()["entries"] == []
        (decided,) = c.get("/v1/quarantine", params={"all": True}).json()["entries"]
        assert (decided["decision"], decided["decided_by"]) == ("released", "ana")
        discarded = c.post(
            f"/v1/quarantine/{entry['id']}/discard", json={"reason": "cleaned up", "by": "ana"}
        )
        assert discarded.status_code == 200, discarded.text
        assert not Path(entry["path"]).exists()
        again = c.post(
            f"/v1/quarantine/{entry['id']}/discard", json={"reason": "again", "by": "ana"}
        )
        assert again.status_code == 409
        assert "already discarded by ana" in again.json()["error"]["message"]
        events = c.get("/v1/activity", params={"dataset": "people"}).json()["events"]
        decisions = [
            e for e in events if e["kind"] in ("quarantine.released", "quarantine.discarded")
        ]
        assert [(e["kind"], e["body"]["reason"]) for e in decisions] == [
            ("quarantine.discarded", "cleaned up"),
            ("quarantine.released", "known double entry"),
        ]


SECRET = "pw-Never-Shown-7731"


def test_no_response_holds_a_secret(
    shop: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A source whose password is a secret reference, and a server that refuses
    # the connection: its Run fails with errors quoting the configuration.
    tools.add_pg_source(shop, "crm", "postgresql://u@127.0.0.1:1/db", "CRM_PW")
    monkeypatch.setenv("CRM_PW", SECRET)
    project = shop / "combined.yaml"
    with TestClient(create_app(project, token=TOKEN), headers=AUTH) as c:
        run_id = c.post("/v1/sources/crm/captures").json()["run_id"]
        worked = tools.cli(shop, "worker", "--once", env={"CRM_PW": SECRET})
        assert worked.returncode == 0, worked.stderr
        bodies = [
            c.get(path).text
            for path in (
                f"/v1/runs/{run_id}",
                "/v1/runs",
                "/v1/activity",
                "/v1/datasets",
                "/v1/queue",
                "/v1/publications",
            )
        ]
        run = json.loads(bodies[0])
        assert run["run"]["state"] == "failed" and run["run"]["error"]
        assert run["admission"]["config"]["config"]["password"] == {"secret": "env:CRM_PW"}
        for body in bodies:
            assert SECRET not in body
        assert SECRET not in worked.stderr


def _serve(root: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", "serve", *args],
        cwd=root,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_runs_a_real_server_that_checks_the_token(shop: Path, tools: Any) -> None:
    with tools.serving(shop, env={"COMBINED_API_TOKEN": TOKEN}) as (base, server):
        assert httpx.get(f"{base}/health").json() == {"status": "ok"}
        assert httpx.get(f"{base}/v1/runs").status_code == 401
        assert httpx.get(f"{base}/v1/runs", headers=AUTH).json() == {"runs": []}
        queued = httpx.post(f"{base}/v1/datasets/shop/orders/captures", headers=AUTH)
        assert queued.status_code == 202
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    # uvicorn shuts down gracefully, then the command ends as SIGTERM ends any
    assert "Finished server process" in err
    assert server.returncode == 143
    assert not (shop / "lake" / "shop" / "orders").exists()  # serving read nothing


def test_serve_refuses_to_start_without_a_token_or_off_loopback(shop: Path) -> None:
    env = {"COMBINED_API_TOKEN": ""}
    for args, said in (
        ((), "COMBINED_API_TOKEN is not set"),
        (("--insecure-no-auth", "--host", "0.0.0.0"), "--insecure-no-auth serves anyone"),
    ):
        server = _serve(shop, *args, env=env)
        try:
            _, err = server.communicate(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
                server.communicate()
        assert server.returncode == 2, err
        assert said in err


def test_the_command_line_does_not_load_the_api_layer() -> None:
    # `combined --help` stays instant and the core install needs no FastAPI.
    code = (
        "import sys; import combined.cli, combined.engine; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'combined.api._app') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _retry_at_once(root: Path, requests: int = 3, rounds: int = 4) -> None:
    """Fail a capture, then send its retry ``requests`` times at once: one Run is queued."""
    for _ in range(rounds):
        _retry_round(root, requests)


def _retry_round(root: Path, requests: int) -> None:
    import threading

    from combined.engine import Engine

    (root / "shop.db").rename(root / "away.db")
    engine = Engine.open(root / "combined.yaml")
    try:
        (failed,) = engine.capture(["shop.orders"])
    finally:
        engine.close()
    (root / "away.db").rename(root / "shop.db")
    assert failed.state == "failed"
    start = threading.Barrier(requests)
    answers: list[int] = []
    with TestClient(create_app(root / "combined.yaml", token=TOKEN), headers=AUTH) as c:

        def retry() -> None:
            start.wait()
            answers.append(c.post(f"/v1/runs/{failed.id}/retry").status_code)

        threads = [threading.Thread(target=retry) for _ in range(requests)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        queued = c.get("/v1/queue").json()["runs"]
    assert sorted(answers) == [202] + [409] * (requests - 1)
    assert len([r for r in queued if r["retry_of"] == failed.id]) == 1


def test_a_retry_sent_again_at_once_queues_one_run(shop: Path) -> None:
    # A client that sent POST /v1/runs/RUN/retry again (its first request was
    # slow: a retry repairs first) got two or three retries queued, each
    # reading the source again under the old admission.
    _retry_at_once(shop)


@pytest.mark.postgres
def test_a_retry_sent_again_at_once_queues_one_run_on_a_postgresql_catalog(
    tmp_path: Path, tools: Any, pg_database: str
) -> None:
    tools.make(tmp_path, catalog=pg_database)
    _retry_at_once(tmp_path)


def test_a_defect_is_one_redacted_line_and_the_server_logs_no_traceback(
    shop: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Starlette re-raises what its outermost layer handles, and the server
    # then logs the traceback: a DSN with its password among its values.
    app = create_app(shop / "combined.yaml", token=TOKEN)

    @app.get("/v1/boom")
    def boom() -> None:
        raise RuntimeError("cannot reach postgresql://app:s3cr3t-pw@db.internal/shop")

    with TestClient(app, headers=AUTH) as c, caplog.at_level("DEBUG"):
        answer = c.get("/v1/boom")
    assert answer.status_code == 500
    body = answer.json()
    assert "s3cr3t-pw" not in json.dumps(body) and "RuntimeError" in json.dumps(body)
    assert caplog.records, "the defect is logged"
    assert all("s3cr3t-pw" not in r.getMessage() and r.exc_info is None for r in caplog.records)
