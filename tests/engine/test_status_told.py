"""What `combined status` and `combined runs` tell a person after a night unattended.

`status` showed freshness alone: a dataset whose captures all failed since
still read as published, with no sign of the failures. It now shows each
dataset's newest ended Run (its state and id, `combined run show ID` next),
read in one catalog query whatever the number of datasets. `runs` showed a
Run whose process was killed as `extracting` until a repair ended it; it now
says its worker is gone, and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from combined.api import create_app
from combined.engine import Engine

TOKEN = "t0ken-for-the-status-tests-0123456789"


@pytest.fixture
def pg_project(tmp_path: Path, pg_database: str) -> Iterator[Path]:
    """A project over a real PostgreSQL source (orders and customers), captured once."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, status text)")
        conn.execute("INSERT INTO orders SELECT g, 'placed' FROM generate_series(1, 30) g")
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 5) g")
    (tmp_path / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n"
        f"    config:\n      dsn: {pg_database}\n    datasets:\n"
        "      orders:\n        relation: public.orders\n        key: [id]\n"
        "      customers:\n        relation: public.customers\n        key: [id]\n"
    )
    yield tmp_path


def _said(result: Any) -> str:
    return " ".join((result.stdout + result.stderr).split())


def test_status_tells_each_datasets_last_run_and_its_failure(
    pg_project: Path, pg_database: str, tools: Any
) -> None:
    assert tools.cli(pg_project, "capture", "pg").returncode == 0
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders RENAME TO orders_gone")
    failed = tools.cli(pg_project, "capture", "pg.orders")
    assert failed.returncode == 1, _said(failed)
    runs = json.loads(tools.cli(pg_project, "runs", "--format", "json").stdout)
    bad, good = runs[0]["id"], runs[1]["id"]

    rows = json.loads(tools.cli(pg_project, "status", "--format", "json").stdout)
    last = {r["dataset"]: r["last_run"] for r in rows}
    assert last["pg.orders"]["id"] == bad and last["pg.orders"]["state"] == "failed"
    assert last["pg.customers"]["id"] == good and last["pg.customers"]["state"] == "succeeded"
    said = _said(tools.cli(pg_project, "status"))
    assert f"pg.orders: last run {bad} ended failed (`combined run show {bad}` tells why)" in said
    assert f"last run {good}" not in said
    csv = tools.cli(pg_project, "status", "--format", "csv").stdout.splitlines()
    assert csv[0].endswith(",last_run_id,last_run_state,last_run_ended_at")
    assert f",{bad},failed," in csv[1]

    # The API's status and the console's datasets page read the same rows.
    with TestClient(create_app(pg_project / "combined.yaml", token=TOKEN)) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        api = client.get("/v1/datasets", params={"slots": False}, headers=auth).json()
        (orders,) = [d for d in api["datasets"] if d["dataset"] == "pg.orders"]
        assert orders["last_run"]["id"] == bad and orders["last_run"]["state"] == "failed"
        client.post("/console/login", data={"token": TOKEN, "next": "/"})
        page = client.get("/").text
        assert f'href="/console/runs/{bad}" class="state-failed">failed</a>' in page

    # Back: the newest ended Run of each dataset succeeded, and nothing is told.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders_gone RENAME TO orders")
    assert tools.cli(pg_project, "capture", "pg.orders").returncode == 0
    assert "ended failed" not in _said(tools.cli(pg_project, "status"))


def test_status_reads_the_last_runs_in_one_query_whatever_the_datasets(
    pg_project: Path, tools: Any
) -> None:
    assert tools.cli(pg_project, "capture", "pg").returncode == 0
    assert tools.cli(pg_project, "capture", "pg.orders").returncode == 0
    engine = Engine.open(pg_project / "combined.yaml")
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    bind = engine.catalog.engine
    sa.event.listen(bind, "before_cursor_execute", seen)
    try:
        rows = engine.status(slots=False)
    finally:
        sa.event.remove(bind, "before_cursor_execute", seen)
        engine.close()
    assert {r["last_run"]["state"] for r in rows} == {"succeeded"}
    of_runs = [s for s in statements if "FROM runs" in s]
    assert len(of_runs) == 1, of_runs


def test_runs_tell_a_killed_captures_run_is_gone_and_write_nothing(
    pg_project: Path, pg_database: str, tools: Any
) -> None:
    import signal
    import subprocess
    import sys
    import time

    assert tools.cli(pg_project, "capture", "pg").returncode == 0
    with psycopg.connect(pg_database) as holder:
        holder.execute("LOCK TABLE customers IN ACCESS EXCLUSIVE MODE")  # the read waits
        capture = subprocess.Popen(
            [sys.executable, "-c", "from combined.cli import main; main()"]
            + ["capture", "pg.customers"],
            cwd=pg_project,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            (run,) = json.loads(
                tools.cli(pg_project, "runs", "--format", "json", "--limit", "1").stdout
            )
            if run["state"] == "extracting":
                break
            assert time.monotonic() < deadline and capture.poll() is None
            time.sleep(0.2)
        assert run["worker_gone"] is None  # alive: nothing said
        assert "worker gone" not in _said(tools.cli(pg_project, "runs"))
        capture.send_signal(signal.SIGKILL)
        capture.wait()
    listed = _said(tools.cli(pg_project, "runs"))
    assert "extracting (worker gone, last heard from 20" in listed
    assert "`combined repair` or the next worker ends it)" in listed
    shown = _said(tools.cli(pg_project, "run", "show", run["id"]))
    assert f"run {run['id']} extracting (worker gone, last heard from" in shown
    (again,) = json.loads(tools.cli(pg_project, "runs", "--format", "json", "--limit", "1").stdout)
    assert again["state"] == "extracting" and again["worker_gone"]["last_heard_at"]
    # The API and the console say it too.
    with TestClient(create_app(pg_project / "combined.yaml", token=TOKEN)) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        (api,) = client.get("/v1/runs", params={"limit": 1}, headers=auth).json()["runs"]
        assert api["id"] == run["id"] and api["worker_gone"]["last_heard_at"]
        one = client.get(f"/v1/runs/{run['id']}", headers=auth).json()["run"]
        assert one["state"] == "extracting" and one["worker_gone"]["last_heard_at"]
        client.post("/console/login", data={"token": TOKEN, "next": "/"})
        for page in ("/console/runs", f"/console/runs/{run['id']}"):
            assert "(worker gone, last heard from" in client.get(page).text, page
    # Nothing was written by the reads: the repair ends it, as before.
    assert tools.cli(pg_project, "repair").returncode == 0
    (ended,) = json.loads(tools.cli(pg_project, "runs", "--format", "json", "--limit", "1").stdout)
    assert ended["state"] == "failed" and ended["worker_gone"] is None
    with TestClient(create_app(pg_project / "combined.yaml", token=TOKEN)) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        (api,) = client.get("/v1/runs", params={"limit": 1}, headers=auth).json()["runs"]
        assert api["state"] == "failed" and api["worker_gone"] is None
