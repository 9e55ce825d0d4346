"""A Run's end against a lake store that does not answer: bounded, and nothing lost.

The lake's ledger records each ended Run before the catalog does. Against a
store that accepted connections and never answered, delta-rs retried the
ledger's write for its default three minutes (``retry_timeout``: 180 s) before
the Run could end; the ledger's small records are now bounded tighter
(``lake._store.SMALL_REQUESTS``). A Run whose end the store refused is ended
in the catalog alone (``run.unledgered``), and the next Run's end writes it
to the ledger (``run.ledgered``): a catalog rebuilt from the lake keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined.engine import Engine
from combined.errors import LakeError
from combined.lake import LakeLayout
from combined.lake._ledger import Ledger


def test_a_ledger_write_to_a_store_that_never_answers_fails_within_its_bound(
    silent_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import S3_ENV

    port = silent_server.dsn.split("port=")[1].split()[0]
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():
        monkeypatch.setenv(key, value)
    ledger = Ledger(LakeLayout("s3://nowhere/lake"))
    record = {"run": {"id": "r1"}, "admission": None}
    # delta-rs' own bound was 180 s of retries; the ledger's is about 30 s.
    outcome = silent_server.outcome(lambda: ledger.run(record), 120)
    assert isinstance(outcome, LakeError), outcome
    assert "the lake's ledger (s3://nowhere/lake/_combined/runs) could not be written" in str(
        outcome.message
    )


@pytest.mark.parametrize("lake_url", ["s3"], indirect=True)
def test_a_run_ended_in_the_catalog_alone_is_ledgered_by_the_next_runs_end(
    tmp_path: Path, pg_database: str, tools: Any, lake_url: str, s3_faults: Any
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, status text)")
        conn.execute("INSERT INTO orders SELECT g, 'placed' FROM generate_series(1, 30) g")
    (tmp_path / "combined.yaml").write_text(
        f"version: 1\nlake: {lake_url}\nsources:\n  pg:\n    connector: postgres\n"
        f"    config:\n      dsn: {pg_database}\n    datasets:\n"
        "      orders:\n        relation: public.orders\n        key: [id]\n"
    )
    assert tools.cli(tmp_path, "capture", "pg").returncode == 0
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders RENAME TO orders_gone")
    s3_faults.fail({"contains": "_combined", "status": 503, "times": -1})
    failed = tools.cli(tmp_path, "capture", "pg.orders")
    said = " ".join((failed.stdout + failed.stderr).split())
    assert failed.returncode == 1, said
    assert "ended failed, in the catalog alone: the lake's ledger" in said
    (bad,) = json.loads(tools.cli(tmp_path, "runs", "--format", "json", "--limit", "1").stdout)
    assert bad["state"] == "failed" and "does not exist" in bad["error"]

    s3_faults.fail()  # the store is back
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders_gone RENAME TO orders")
    assert tools.cli(tmp_path, "capture", "pg.orders").returncode == 0
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        kept = {r["run"]["id"]: r["run"]["state"] for r in Ledger(engine.layout).runs()}
        assert kept[bad["id"]] == "failed"
        (ledgered,) = engine.activity(kind="run.ledgered")
        assert ledgered["run_id"] == bad["id"]
    finally:
        engine.close()
    # Once: a later Run's end writes it no more.
    assert tools.cli(tmp_path, "capture", "pg.orders").returncode == 0
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert len(engine.activity(kind="run.ledgered")) == 1
    finally:
        engine.close()
