"""A lake the store lost is never written afresh: its captures are refused until a reset.

After the bucket was emptied (or a table's directory deleted, or ``lake:``
pointed elsewhere), the next capture found no table and created one at
version 0 as if it were a first capture: the history the catalog recorded
lost, every row billed again, and `combined sql` blaming a retention. A
capture now ends ``needs_review`` (exit 3) naming the missing table, and
writes nothing; `combined reset` records the decision to forget the table,
after which the next capture is a first capture (runtime/_lost.py,
runtime/_reset.py).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import data as cat
from combined.engine import Engine
from combined.lake._ledger import Ledger


def _shop(root: Path, tools: Any, lake: str = "./lake") -> Path:
    """The shop, its orders captured twice (lake versions 0 and 1, both published)."""
    project: Path = tools.make(root, orders=20)
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake}"))
    first = tools.cli(root, "capture", "shop.orders")
    assert first.returncode == 0, first.stderr
    tools.sql(root, "UPDATE orders SET status = 'shipped' WHERE id <= 5")
    second = tools.cli(root, "capture", "shop.orders")
    assert second.returncode == 0, second.stderr
    return project


def _files(where: Path) -> set[str]:
    """Every file under ``where``, relative to it."""
    return {str(p.relative_to(where)) for p in where.rglob("*") if p.is_file()}


def _catalog_row(project: Path) -> tuple[Any, ...]:
    engine = Engine.open(project)
    try:
        with engine.catalog.begin() as conn:
            row = cat.get_dataset(conn, "shop", "orders")
        return row.lake_version, row.last_sequence, row.current_version
    finally:
        engine.close()


def _alerted(project: Path) -> str:
    """The error of the one `alert.run_needs_review` in the project's activity feed."""
    engine = Engine.open(project)
    try:
        (alert,) = engine.activity(kind="alert.run_needs_review")
        return str(alert["body"]["error"])
    finally:
        engine.close()


def _said(result: Any) -> str:
    return " ".join((result.stdout + result.stderr).split())


def _assert_refused(result: Any, location: str) -> None:
    """The capture ended needs_review (exit 3) saying what happened, why, and what to do."""
    said = _said(result)
    assert result.returncode == 3, said
    assert "needs_review" in result.stdout
    assert f"shop.orders: its table at {location} is missing from the lake, though the " in said
    assert "the catalog recorded lake version 1 (committed 20" in said
    assert "nothing was read or written" in said
    assert "would lose its history" in said and "bill its rows' MAR again" in said
    assert "restore the lake" in said
    assert "`combined reset shop.orders --reason TEXT --yes`" in said


def test_a_capture_of_a_table_removed_from_the_lake_is_refused_and_writes_nothing(
    tmp_path: Path, tools: Any
) -> None:
    project = _shop(tmp_path, tools)
    lake = tmp_path / "lake"
    shutil.rmtree(lake / "shop" / "orders")
    before, row = _files(lake / "_deliveries") | _files(lake / "_usage"), _catalog_row(project)
    result = tools.cli(tmp_path, "capture", "shop.orders")
    _assert_refused(result, str(lake / "shop" / "orders"))
    assert not (lake / "shop" / "orders").exists()  # not created afresh at version 0
    assert _files(lake / "_deliveries") | _files(lake / "_usage") == before
    assert _catalog_row(project) == row
    assert "is missing from the lake" in _alerted(project)
    # What a query and the status say: the missing table, not a retention.
    query = tools.cli(tmp_path, "sql", "SELECT count(*) FROM shop.orders")
    assert query.returncode == 2, query.stderr
    assert f"its table at {lake / 'shop' / 'orders'} is missing from the lake" in _said(query)
    assert "combined reset shop.orders" in _said(query)
    status = tools.cli(tmp_path, "status", env={"COLUMNS": "1000"})  # (no path folded)
    assert status.returncode == 0, status.stderr
    assert f"shop.orders: its table at {lake / 'shop' / 'orders'} is missing" in _said(status)
    # A dataset never captured still has its first capture.
    assert tools.cli(tmp_path, "capture", "shop.customers").returncode == 0


def test_a_worker_ends_a_run_of_a_lost_table_needs_review_and_goes_on(
    tmp_path: Path, tools: Any
) -> None:
    _shop(tmp_path, tools)
    shutil.rmtree(tmp_path / "lake" / "shop" / "orders")
    assert tools.cli(tmp_path, "capture", "--enqueue", "shop").returncode == 0
    worked = tools.cli(tmp_path, "worker", "--once")
    assert worked.returncode == 0, worked.stderr
    con = sqlite3.connect(tmp_path / ".combined" / "catalog.db")
    try:
        state, error_type, error = con.execute(
            "SELECT state, error_type, error FROM runs ORDER BY created_at DESC, id LIMIT 1"
        ).fetchone()
    finally:
        con.close()
    assert (state, error_type) == ("needs_review", "TableMissing"), error
    # (its other dataset, never captured, named with the command that captures it alone)
    assert "`combined capture shop.customers` captures them meanwhile" in error
    assert not (tmp_path / "lake" / "shop" / "orders").exists()


def test_a_reset_is_recorded_and_the_next_capture_is_a_first_capture(
    tmp_path: Path, tools: Any
) -> None:
    project = _shop(tmp_path, tools)
    lake = tmp_path / "lake"
    raw = _files(lake / "_deliveries")
    shutil.rmtree(lake / "shop" / "orders")
    asked = tools.cli(tmp_path, "reset", "shop.orders", "--reason", "bucket emptied")
    assert asked.returncode == 1 and "pass --yes" in asked.stderr  # (stdin is no terminal)
    assert _catalog_row(project)[0] == 1
    reset = tools.cli(
        tmp_path, "reset", "shop.orders", "--reason", "bucket emptied", "--by", "ana", "--yes"
    )
    assert reset.returncode == 0, reset.stderr
    assert "shop.orders: reset; the catalog forgot lake version 1 of its table" in _said(reset)
    assert _catalog_row(project) == (None, 0, None)
    engine = Engine.open(project)
    try:
        (event,) = engine.activity(kind="dataset.reset")
        body = event["body"]
        assert (body["by"], body["reason"], body["dropped"]) == ("ana", "bucket emptied", [])
        forgot = body["forgotten"]
        assert (forgot["lake_version"], forgot["last_sequence"]) == (1, 2)
        assert forgot["table"] == "missing from the lake"
        assert forgot["location"] == str(lake / "shop" / "orders")
        (kept,) = Ledger(engine.layout).resets()  # a catalog rebuilt from the lake knows it
        assert kept["forgotten"] == forgot and kept["by"] == "ana"
        old = engine.publications(1)[0]["id"]
        (run,) = engine.capture(["shop.orders"])
        assert run.trigger == "first_sync" and run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["orders"]["inserts"] == 20
        assert engine.layout.dataset_table("shop", "orders").version() == 0
        # Published, though the table's version is older than the forgotten one's.
        assert run.publication_id is not None
        count = engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist()
        assert count == [{"n": 20}]
        (usage,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        assert usage["mar"] == 20  # billed once this month: the MAR table was kept
    finally:
        engine.close()
    assert raw <= _files(lake / "_deliveries")  # the raw layer keeps every Delivery
    query = tools.cli(tmp_path, "sql", "SELECT * FROM shop.orders", "--publication", old)
    assert query.returncode == 2, query.stderr
    assert "of the table `combined reset` forgot on" in _said(query)
    assert "(by ana: bucket emptied)" in _said(query)


def test_a_catalog_rebuilt_from_the_lake_keeps_the_reset_and_the_lost_table(
    tmp_path: Path, tools: Any
) -> None:
    """`combined repair` of a lost catalog: the ledger's publications name the lost table's
    versions (refused), and a reset made before it still holds (the new table published)."""
    project = _shop(tmp_path, tools)
    engine = Engine.open(project)
    try:
        old = engine.publications(1)[0]["id"]  # (it reads lake version 1 of the old table)
    finally:
        engine.close()
    tools.sql(tmp_path, "UPDATE orders SET status = 'lost' WHERE id = 20")
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0  # lake version 2
    shutil.rmtree(tmp_path / "lake" / "shop" / "orders")
    catalog = tmp_path / ".combined" / "catalog.db"
    catalog.unlink()
    refused = tools.cli(tmp_path, "capture", "shop.orders")  # (its repair restores the ledger)
    said = _said(refused)
    assert refused.returncode == 3, said
    assert "though the catalog recorded lake version 2 (published 20" in said
    reset = tools.cli(tmp_path, "reset", "shop.orders", "--reason", "lost", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0
    catalog.unlink()
    tools.sql(tmp_path, "UPDATE orders SET status = 'lost' WHERE id = 1")
    # The new table's lake version 1, published: older than the forgotten table's 2.
    again = tools.cli(tmp_path, "capture", "shop.orders")
    assert again.returncode == 0, _said(again)
    assert "and 1 dataset reset(s), from the lake" in again.stderr
    # Never read as the new table's lake version 1, which the lake holds now.
    query = tools.cli(tmp_path, "sql", "SELECT * FROM shop.orders", "--publication", old)
    assert query.returncode == 2, query.stdout
    assert "of the table `combined reset` forgot on" in _said(query)
    engine = Engine.open(project)
    try:
        assert engine.sql("SELECT status FROM shop.orders WHERE id = 1").to_pylist() == [
            {"status": "lost"}
        ]
    finally:
        engine.close()


def test_a_reset_removes_the_tables_the_lake_holds_only_when_asked(
    tmp_path: Path, tools: Any
) -> None:
    project = _shop(tmp_path, tools)
    project.write_text(
        project.read_text().replace("      orders:\n", "      orders:\n        history: true\n")
    )
    lake = tmp_path / "lake"
    tools.sql(tmp_path, "UPDATE orders SET status = 'lost' WHERE id = 1")
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0  # (its history)
    assert (lake / "_history" / "shop" / "orders").exists()
    refused = tools.cli(tmp_path, "reset", "shop.orders", "--reason", "again", "--yes")
    assert refused.returncode == 2, refused.stderr
    assert "pass --drop-table" in refused.stderr and str(lake / "_history") in refused.stderr
    assert (lake / "shop" / "orders").exists() and _catalog_row(project)[0] is not None
    shutil.rmtree(lake / "shop" / "orders")  # lost: the history stays, under the old sequences
    assert tools.cli(tmp_path, "reset", "shop.orders", "--reason", "x", "--yes").returncode == 2
    dropped = tools.cli(
        tmp_path, "reset", "shop.orders", "--reason", "again", "--yes", "--drop-table"
    )
    assert dropped.returncode == 0, dropped.stderr
    assert not (lake / "_history" / "shop" / "orders").exists()
    assert (lake / "_usage" / "shop" / "orders").exists()
    engine = Engine.open(project)
    try:
        (event,) = engine.activity(kind="dataset.reset")
        assert event["body"]["dropped"] == [str(lake / "_history" / "shop" / "orders")]
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        history = engine.sql("SELECT count(*) AS n FROM shop.orders__history").to_pylist()
        assert history == [{"n": 20}]  # mirrored anew, from the new table's first commit
    finally:
        engine.close()


@pytest.mark.parametrize("lake_url", ["s3"], indirect=True)
def test_an_object_store_lake_whose_prefix_was_emptied_is_refused(
    tmp_path: Path, tools: Any, lake_url: str, s3_endpoint: str
) -> None:
    import boto3
    from tests.conftest import s3_objects

    _shop(tmp_path, tools, lake_url)
    bucket = lake_url.removeprefix("s3://").split("/")[0]
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    for key in s3_objects(s3_endpoint, bucket, "lake/"):
        client.delete_object(Bucket=bucket, Key=key)
    result = tools.cli(tmp_path, "capture", "shop.orders")
    _assert_refused(result, f"{lake_url}/shop/orders")
    assert s3_objects(s3_endpoint, bucket, "lake/shop/") == []
    assert s3_objects(s3_endpoint, bucket, "lake/_usage/") == []
    status = json.loads(tools.cli(tmp_path, "status", "--format", "json").stdout)
    (orders,) = [s for s in status if s["dataset"] == "shop.orders"]
    assert orders["table_missing"] == f"{lake_url}/shop/orders"
    reset = tools.cli(tmp_path, "reset", "shop", "--reason", "bucket emptied", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "shop.customers: nothing to reset" in _said(reset)
    again = tools.cli(tmp_path, "capture", "shop.orders")
    assert again.returncode == 0, _said(again)
    assert s3_objects(s3_endpoint, bucket, "lake/shop/orders/_delta_log/")


def test_a_change_stream_whose_table_was_lost_is_refused_until_reset_and_a_new_snapshot(
    tmp_path: Path, tools: Any, cdc_db: Any
) -> None:
    """`cdc follow` stops at once (exit 3): its slot's position is the base of a
    checkpoint the lake lost. After a reset, teardown and setup take a new snapshot."""
    import psycopg

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 50) g")
    project = tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.items", ["id"])
    (tmp_path / "combined.yaml").write_text(project)
    assert tools.cli(tmp_path, "cdc", "setup", "pg").returncode == 0
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = -1 WHERE id = 1")
    assert tools.cli(tmp_path, "cdc", "follow", "pg", "--iterations", "1").returncode == 0
    table = tmp_path / "lake" / "pg" / "items"
    shutil.rmtree(table)
    refused = tools.cli(tmp_path, "cdc", "follow", "pg", "--iterations", "3")
    said = _said(refused)
    assert refused.returncode == 3, said
    assert said.count("needs_review") == 1  # (stopped at its first Run)
    assert f"pg.items: its table at {table} is missing from the lake" in said
    assert "start a change stream from a checkpoint whose base is gone" in said
    assert not table.exists()
    reset = tools.cli(tmp_path, "reset", "pg.items", "--reason", "lake lost", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "`combined cdc teardown pg --yes` then `combined cdc setup pg`" in _said(reset)
    assert tools.cli(tmp_path, "cdc", "teardown", "pg", "--yes").returncode == 0
    setup = tools.cli(tmp_path, "cdc", "setup", "pg")
    assert setup.returncode == 0, _said(setup)
    count = tools.cli(tmp_path, "sql", "--format", "json", "SELECT count(*) AS n FROM pg.items")
    assert json.loads(count.stdout) == [{"n": 50}]


class _Copies:
    """A copy of a table's directory, put back in its place later: on disk or in a bucket."""

    def __init__(self, root: Path, lake_url: str, endpoint: str | None) -> None:
        self.root, self.lake_url, self.endpoint = root, lake_url, endpoint
        self.kept: dict[str, bytes] = {}

    def _bucket(self) -> tuple[Any, str]:
        import boto3

        bucket = self.lake_url.removeprefix("s3://").split("/")[0]
        return boto3.client("s3", endpoint_url=self.endpoint), bucket

    def take(self, table: str) -> None:
        if self.endpoint is None:
            shutil.copytree(self.root / "lake" / table, self.root / "copy")
            return
        from tests.conftest import s3_objects

        client, bucket = self._bucket()
        for key in s3_objects(self.endpoint, bucket, f"lake/{table}/"):
            self.kept[key] = client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def put_back(self, table: str) -> None:
        if self.endpoint is None:
            shutil.rmtree(self.root / "lake" / table)
            shutil.copytree(self.root / "copy", self.root / "lake" / table)
            return
        from tests.conftest import s3_objects

        client, bucket = self._bucket()
        for key in s3_objects(self.endpoint, bucket, f"lake/{table}/"):
            client.delete_object(Bucket=bucket, Key=key)
        for key, body in self.kept.items():
            client.put_object(Bucket=bucket, Key=key, Body=body)

    def lake(self) -> dict[str, int]:
        """The lake's files (but the ledger's ended Runs) and their sizes."""
        if self.endpoint is None:
            where = self.root / "lake"
            files = {str(p.relative_to(where)): p.stat().st_size for p in where.rglob("*")}
        else:
            client, bucket = self._bucket()
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            files = {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}
        return {k: v for k, v in files.items() if "_combined/runs" not in k}


@pytest.mark.parametrize("lake_url", ["local", "s3"], indirect=True)
def test_a_table_restored_from_an_older_copy_is_refused_and_nothing_changes(
    tmp_path: Path, tools: Any, lake_url: str, request: pytest.FixtureRequest
) -> None:
    """The lake restored from a copy taken before the last capture: its table is there,
    at a Delta version behind the one the catalog recorded as committed."""
    endpoint = request.getfixturevalue("s3_endpoint") if lake_url.startswith("s3") else None
    copies = _Copies(tmp_path, lake_url, endpoint)
    project: Path = tools.make(tmp_path, orders=20)
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake_url}"))
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0  # lake version 0
    copies.take("shop/orders")
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 5")
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0  # lake version 1
    copies.put_back("shop/orders")
    tools.sql(tmp_path, "UPDATE orders SET status = 'lost' WHERE id = 20")
    lake, row = copies.lake(), _catalog_row(project)
    location = str(tmp_path / "lake") if endpoint is None else lake_url
    # `combined check` tells it before any capture (a load of each table's log)
    checked = tools.cli(tmp_path, "check")
    assert checked.returncode == 2, _said(checked)
    assert (
        f"fail lake tables: shop.orders: its table at {location}/shop/orders is at lake "
        "version 0, behind lake version 1" in _said(checked)
    )
    result = tools.cli(tmp_path, "capture", "shop.orders")
    said = _said(result)
    assert result.returncode == 3, said
    assert "needs_review" in result.stdout
    assert (
        f"shop.orders: its table at {location}/shop/orders is at lake version 0, behind lake "
        "version 1 (committed 20" in said
    )
    assert "restored from an older copy" in said and "nothing was read or written" in said
    assert "restore the newer copy of the table" in said
    assert "`combined reset shop.orders --reason TEXT --drop-table --yes`" in said
    assert copies.lake() == lake  # the table, raw layer and MAR as they were
    assert _catalog_row(project) == row
    assert "is at lake version 0, behind lake version 1" in _alerted(project)
    # The decision the hint offers: the table removed, captured afresh.
    reset = tools.cli(
        tmp_path, "reset", "shop.orders", "--reason", "old copy", "--drop-table", "--yes"
    )
    assert reset.returncode == 0, _said(reset)
    again = tools.cli(tmp_path, "capture", "shop.orders")
    assert again.returncode == 0, _said(again)


#: The step of a reset the store fails, once the catalog records a table still in the lake:
#: its decision's record (the ledger's first entry of resets), the table's removal (a batch
#: delete), and the ledger's mark that it is done (the second entry).
STEPS = {
    "record": {"method": "PUT", "contains": "_combined/resets/_delta_log/00000000000000000000"},
    "removal": {"method": "POST", "contains": "delete"},
    "done": {"method": "PUT", "contains": "_combined/resets/_delta_log/00000000000000000001"},
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_reset_stopped_at_any_step_is_finished_by_the_same_reset_with_a_true_record(
    tmp_path: Path, tools: Any, s3_faults: Any, step: str
) -> None:
    """A reset that removes its table records its decision first: the store failing a step
    leaves a reset the same command finishes, recording the table as removed by it (before,
    a ledger that failed after the removal left it recorded as missing from the lake)."""
    from combined.catalog._resets import resets

    project = _shop(tmp_path, tools, f"s3://{s3_faults.bucket}/lake")
    table = f"s3://{s3_faults.bucket}/lake/shop/orders"
    s3_faults.fail({**STEPS[step], "status": 500, "times": -1})
    args = ("reset", "shop.orders", "--drop-table", "--yes")
    first = tools.cli(tmp_path, *args, "--reason", "identity v2", "--by", "ana")
    assert first.returncode != 0 and s3_faults.faulted() > 0, _said(first)
    assert "combined reset shop.orders" in _said(first)  # (what finishes it)
    s3_faults.fail()
    again = tools.cli(tmp_path, *args, "--reason", "again", "--by", "bo")
    said = _said(again)
    assert again.returncode == 0, said
    assert "shop.orders: reset; the catalog forgot lake version 1 of its table" in said
    assert "which the reset removed from the lake" in said
    assert ("finished the reset ana began on 20" in said) is (step != "record")
    engine = Engine.open(project)
    try:
        (event,) = engine.activity(kind="dataset.reset")  # reset once
        body = event["body"]
        # Decided by the first reset, unless its decision's record was what failed.
        decided = ("bo", "again") if step == "record" else ("ana", "identity v2")
        assert (body["by"], body["reason"], body["dropped"]) == (*decided, [table])
        assert body["forgotten"]["table"] == "removed by the reset"
        assert body["forgotten"]["lake_version"] == 1
        (kept,) = Ledger(engine.layout).resets()
        assert (kept["state"], kept["forgotten"]) == ("done", body["forgotten"])
        with engine.catalog.begin() as conn:
            (row,) = resets(conn)
        assert (row.id, row.after_seq) == (kept["id"], kept["after_seq"])
        assert not engine.layout.dataset_table("shop", "orders").exists()
        (run,) = engine.capture(["shop.orders"])
        assert run.trigger == "first_sync" and run.state == "succeeded", run.error
    finally:
        engine.close()
