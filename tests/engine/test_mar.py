"""MAR: retries, duplicates, re-committed sequences and unchanged refreshes add nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from combined.catalog import data as cat
from combined.engine import Engine
from combined.lake import LakeTable
from combined.runtime._project import project_commit


def _usage(engine: Engine, dataset: str) -> dict[str, Any]:
    (row,) = [u for u in engine.usage() if u["dataset"] == dataset]
    return {k: row[k] for k in ("month", "mar", "inserts", "updates", "deletes")}


def _billed(engine: Engine) -> list[dict[str, Any]]:
    """Every usage row without its bookkeeping time."""
    return [{k: v for k, v in u.items() if k != "updated_at"} for u in engine.usage()]


def _deliveries(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.catalog.begin() as conn:
        return [
            (d.id, d.dataset, d.sequence, d.state, d.record_count, d.lake_version)
            for d in cat.deliveries(conn, source="shop")
        ]


def _orders_lake(root: Path) -> LakeTable:
    return LakeTable(root / "lake" / "shop" / "orders", "combined:shop/orders")


def _capture_with_changes(engine: Engine, root: Path, tools: Any) -> None:
    (first,) = engine.capture()
    assert first.state == "succeeded", first.error
    tools.sql(
        root,
        "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
        "DELETE FROM orders WHERE id > 195;"
        "INSERT INTO orders VALUES (500, 3, 'placed', 1.0);",
    )
    (second,) = engine.capture()
    assert second.state == "succeeded", second.error


def test_unchanged_refresh_adds_nothing(shop: Path, tools: Any) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        _capture_with_changes(engine, shop, tools)
        before = _billed(engine)
        assert _usage(engine, "orders")["mar"] == 201
        for _ in range(2):
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert run.stats is not None
            assert all(s["deliveries"] == 0 for s in run.stats.values())
        assert _billed(engine) == before
    finally:
        engine.close()


def test_a_keyed_transition_bills_the_ids_its_deliveries_hold(shop: Path, tools: Any) -> None:
    # An incremental transition's Deliveries hold exactly its changes: MAR
    # reads their ids there, and no change list is written beside them.
    engine = Engine.open(shop / "combined.yaml")
    try:
        _capture_with_changes(engine, shop, tools)
        assert _usage(engine, "orders") == {
            "month": _usage(engine, "orders")["month"],
            "mar": 201,
            "inserts": 201,  # 200 in the baseline (billed as inserts), then id 500
            "updates": 10,
            "deletes": 5,
        }
        commits = _orders_lake(shop).commits()
        assert [(c["changes_from"], c["changes_file"]) for c in commits] == [
            ("deliveries", None)
        ] * 2
        raw = shop / "lake" / "_deliveries" / "shop" / "orders"
        assert not [p for p in raw.rglob("*") if "transition" in p.name]
    finally:
        engine.close()


def test_projecting_a_commit_again_bills_nothing_and_duplicates_nothing(
    shop: Path, tools: Any
) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        _capture_with_changes(engine, shop, tools)
        usage = _billed(engine)
        deliveries = _deliveries(engine)
        history = engine.history("shop.orders")
        with engine.catalog.begin() as conn:
            dataset = cat.get_dataset(conn, "shop", "orders")
        commits = _orders_lake(shop).commits()
        assert len(commits) == 2
        # every commit of the lake, projected once more in lake order (as repair would)
        for meta in reversed(commits):
            project_commit(engine.catalog, engine.layout, "shop", "orders", meta)
        assert _billed(engine) == usage
        assert _deliveries(engine) == deliveries
        ids = [d[0] for d in deliveries]
        assert len(ids) == len(set(ids))
        assert engine.history("shop.orders") == history
        with engine.catalog.begin() as conn:
            again = cat.get_dataset(conn, "shop", "orders")
        assert (again.current_version, again.lake_version, again.last_sequence) == (
            dataset.current_version,
            dataset.lake_version,
            dataset.last_sequence,
        )
        (run,) = engine.capture()  # and the next capture sees nothing new
        assert run.state == "succeeded" and _billed(engine) == usage
    finally:
        engine.close()


def test_re_committed_sequence_is_skipped_and_bills_nothing(shop: Path, tools: Any) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        _capture_with_changes(engine, shop, tools)
        usage = _billed(engine)
        lake = _orders_lake(shop)
        version = lake.version()
        newest = lake.latest_commit()
        assert newest is not None

        def data() -> pa.RecordBatchReader:
            raise AssertionError("a skipped commit must not read its data")

        result = lake.commit(
            first_sequence=newest["first_sequence"],
            last_sequence=newest["last_sequence"],
            mode="merge",
            data=data,
            metadata=newest,
        )
        assert result.skipped
        assert result.lake_version == newest["lake_version"]
        assert lake.version() == version
        (run,) = engine.capture()
        assert run.state == "succeeded"
        assert _billed(engine) == usage
    finally:
        engine.close()


ROWS = [{"id": i, "qty": i * 10} for i in range(1, 6)]


def _scripted(root: Path, script: list[dict[str, Any]]) -> Engine:
    project = {
        "version": 1,
        "lake": "./lake",
        "catalog": "sqlite:///.combined/catalog.db",
        "sources": {
            "api": {
                "connector": "scripted",
                "config": {
                    "datasets": {"orders": {"fields": {"id": "int64", "qty": "int64"}}},
                    "script": script,
                    "state_file": str(root / "reads.json"),
                },
                "datasets": {"orders": {"key": ["id"], "batch_rows": 2}},
            }
        },
    }
    (root / "combined.yaml").write_text(json.dumps(project))
    return Engine.open(root / "combined.yaml")


def test_retried_run_after_transient_failures_bills_each_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    # four reads fail after the first batch was staged: the Run's three Attempts and
    # the first Attempt of its retry; the retry's second Attempt reads everything
    step = {"rows": ROWS, "fail": "unavailable", "fail_times": 4, "after_batches": 1}
    engine = _scripted(tmp_path, [step])
    try:
        (failed,) = engine.capture()
        assert failed.state == "failed"
        assert len(engine.run(failed.id)["attempts"]) == 3
        assert engine.usage() == []
        retried = engine.retry(failed.id)
        assert retried.state == "succeeded", retried.error
        assert len(engine.run(retried.id)["attempts"]) == 2
        assert engine.sql("SELECT id, qty FROM api.orders ORDER BY id").to_pylist() == ROWS
        (usage,) = _billed(engine)
        assert (usage["mar"], usage["inserts"], usage["updates"], usage["deletes"]) == (5, 5, 0, 0)
        deliveries = engine.run(retried.id)["deliveries"]
        assert [(d.state, d.record_count) for d in deliveries] == [("committed", 5)]
        (again,) = engine.capture()  # the same rows again: an unchanged refresh
        assert again.state == "succeeded", again.error
        assert _billed(engine) == [usage]
    finally:
        engine.close()


def test_a_capture_delivering_a_row_twice_bills_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    twice = [*ROWS, {"id": 3, "qty": 31}]
    engine = _scripted(tmp_path, [{"rows": ROWS}, {"rows": twice}])
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        usage = _billed(engine)
        (dup,) = engine.capture()
        assert dup.state == "needs_review"
        assert _billed(engine) == usage
        assert engine.sql("SELECT id, qty FROM api.orders ORDER BY id").to_pylist() == ROWS
    finally:
        engine.close()


def _table_rows(stdout: str) -> list[list[str]]:
    """The body rows of a rich table, as cell texts."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("│"):
            out.append([c.strip() for c in line.strip("│").split("│")])
    return out


def test_usage_cli_shows_mar_and_operations_per_dataset_for_a_month(shop: Path, tools: Any) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        _capture_with_changes(engine, shop, tools)
        month = _usage(engine, "orders")["month"]
    finally:
        engine.close()
    wide = {"COLUMNS": "200"}
    shown = tools.cli(shop, "usage", "--month", month, env=wide)
    assert shown.returncode == 0, shown.stderr
    assert _table_rows(shown.stdout) == [
        [month, "shop", "customers", "20", "20", "0", "0"],
        [month, "shop", "orders", "201", "201", "10", "5"],
    ]
    empty = tools.cli(shop, "usage", "--month", "1999-01", env=wide)
    assert empty.returncode == 0, empty.stderr
    assert "MAR" in empty.stdout  # the table is there, with no rows
    assert _table_rows(empty.stdout) == []


#: A capture of shop.orders that stops in its MAR billing, once it has read the
#: identities already billed, until the file ``go`` exists (``billing`` says it got there).
_CAPTURE_HELD_IN_ITS_BILLING = """
import sys, time
from pathlib import Path
import combined.usage as usage
from combined.engine import Engine

root = Path(sys.argv[1])
counts = usage._committed_counts

def held(*args, **kwargs):
    (root / "billing").touch()
    while not (root / "go").exists():
        time.sleep(0.05)
    return counts(*args, **kwargs)

usage._committed_counts = held
engine = Engine.open(root / "combined.yaml")
(run,) = engine.capture(["shop.orders"])
print(run.state, run.error)
"""


def test_a_repair_while_a_capture_bills_its_commit_never_bills_it_twice(
    shop: Path, tools: Any
) -> None:
    assert tools.cli(shop, "capture").returncode == 0
    tools.sql(
        shop,
        "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
        "INSERT INTO orders VALUES (500, 3, 'placed', 1.0), (501, 3, 'placed', 2.0);",
    )
    # another process repairs while the capture bills its lake commit
    out, repaired = tools.while_held(
        shop, _CAPTURE_HELD_IN_ITS_BILLING, "billing", lambda: tools.cli(shop, "repair")
    )
    assert repaired.returncode == 0, repaired.stderr
    assert out.split()[0] == "succeeded", out
    engine = Engine.open(shop / "combined.yaml")
    try:
        usage = _usage(engine, "orders")
        assert (usage["mar"], usage["inserts"], usage["updates"], usage["deletes"]) == (
            202,
            202,
            10,
            0,
        )
    finally:
        engine.close()
