"""Identity encoding v2 (binary digests) beside lakes written with v1 (hex digests).

A lake written before v2 holds its ids and payload hashes as 32 hex digits.
After the upgrade it must still capture, reconcile, bill MAR and compare
correctly: each table keeps the format it was created with (docs/identity.md,
section 7), and a v1 id is exactly the hex of the v2 id of the same key.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from combined.engine import Engine
from combined.lake._types import lake_schema
from combined.protocol import _digest
from combined.protocol.identity import identity_python


def _capture(project: Path, *datasets: str) -> dict[str, dict[str, object]]:
    engine = Engine.open(project)
    try:
        runs = engine.capture(list(datasets))
        for run in runs:
            assert run.state == "succeeded", run.error
        return {k: v for run in runs for k, v in (run.stats or {}).items()}
    finally:
        engine.close()


def _table(root: Path, dataset: str) -> pa.Table:
    table = DeltaTable(str(root / "lake" / "shop" / dataset)).to_pyarrow_table()
    return table.cast(lake_schema(table.schema))  # (views as plain strings and binaries)


def _usage(project: Path, dataset: str) -> dict[str, object]:
    engine = Engine.open(project)
    try:
        (usage,) = [u for u in engine.usage() if u["dataset"] == dataset]
        return usage
    finally:
        engine.close()


def _id_types(root: Path, area: str, dataset: str) -> set[pa.DataType]:
    files = (root / "lake" / area / "shop" / dataset).rglob("*.parquet")
    return {pq.read_schema(f).field("_combined_id").type for f in files}


def _write_v1_lake(shop: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The v1 code path: every digest written as hex, as before encoding v2.
    monkeypatch.setattr(_digest, "DEFAULT_DIGEST", "hex")
    _capture(shop / "combined.yaml", "shop.orders")
    monkeypatch.undo()
    ids = _table(shop, "orders").column("_combined_id")
    assert ids.type == pa.string() and all(len(v) == 32 for v in ids.to_pylist())


def test_a_v1_lake_keeps_capturing_reconciling_and_billing_after_the_upgrade(
    shop: Path, tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_v1_lake(shop, monkeypatch)
    project = shop / "combined.yaml"
    # Unchanged: nothing written, nothing billed.
    assert _capture(project, "shop.orders")["orders"]["captured"] == 200
    assert _usage(project, "orders")["mar"] == 200
    tools.sql(
        shop,
        "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
        "DELETE FROM orders WHERE id > 195;"
        "INSERT INTO orders VALUES (500, 3, 'placed', 1.0);",
    )
    stats = _capture(project, "shop.orders")["orders"]
    assert (stats["inserts"], stats["updates"], stats["deletes"]) == (1, 10, 5)
    assert stats["reconciliation"] == "reconciled"
    table = _table(shop, "orders").sort_by("id")
    assert table.column("id").to_pylist() == [r[0] for r in tools.rows(shop, "orders")]
    assert table.column("status").to_pylist()[:10] == ["shipped"] * 10
    # The table and its MAR identities stay hex: one format per table.
    assert table.column("_combined_id").type == pa.string()
    assert _id_types(shop, "_usage", "orders") == {pa.string()}
    usage = _usage(project, "orders")
    # 200 first seen + 1 insert: the updated and deleted ids were billed already.
    assert usage["mar"] == 201
    assert (usage["inserts"], usage["updates"], usage["deletes"]) == (201, 10, 5)
    # A dataset first captured after the upgrade is v2 in the same lake.
    _capture(project, "shop.customers")
    assert _table(shop, "customers").column("_combined_id").type == pa.binary()
    assert _id_types(shop, "_usage", "customers") == {pa.binary()}


def test_v1_and_v2_lakes_of_one_source_compare_id_for_id(
    shop: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _write_v1_lake(shop, monkeypatch)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(shop / "shop.db", fresh / "shop.db")
    shutil.copy(shop / "combined.yaml", fresh / "combined.yaml")
    _capture(fresh / "combined.yaml", "shop.orders")
    v1 = _table(shop, "orders").sort_by("id")
    v2 = _table(fresh, "orders").sort_by("id")
    assert v2.column("_combined_id").type == pa.binary()
    assert [b.hex() for b in v2.column("_combined_id").to_pylist()] == v1.column(
        "_combined_id"
    ).to_pylist()
    assert [b.hex() for b in v2.column("_combined_payload_hash").to_pylist()] == v1.column(
        "_combined_payload_hash"
    ).to_pylist()
    assert v1.column("_combined_id")[6].as_py() == identity_python([7], [pa.int64()])


def test_a_table_replaced_in_the_other_format_during_a_capture_is_refused() -> None:
    from types import SimpleNamespace

    from combined.errors import LakeError
    from combined.runtime._reduce import _digest

    plan = SimpleNamespace(source="shop", name="orders")
    hexed = pa.schema([("id", pa.int64()), ("_combined_id", pa.string())])
    raw = pa.schema([("id", pa.int64()), ("_combined_id", pa.binary())])
    assert _digest(plan, hexed, hexed) == "hex"  # type: ignore[arg-type]
    assert _digest(plan, None, raw) == "binary"  # type: ignore[arg-type]
    assert _digest(plan, hexed, pa.schema([("id", pa.int64())])) == "hex"  # type: ignore[arg-type]
    with pytest.raises(LakeError, match="identity encoding changed during the capture"):
        _digest(plan, hexed, raw)  # type: ignore[arg-type]


def test_a_dataset_moves_to_v2_by_a_recorded_reset_billed_once_a_month(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/identity.md section 7: a table removed by hand has its capture refused now (the
    catalog records it: tests/engine/test_lake_table_lost.py); `combined reset --drop-table`
    removes it by a recorded decision, and the next capture makes a v2 table, its rows
    billed against the kept (v1) MAR table: not again this month."""
    from combined.errors import ConfigError

    _write_v1_lake(shop, monkeypatch)
    project = shop / "combined.yaml"
    engine = Engine.open(project)
    try:
        with pytest.raises(ConfigError, match="--drop-table"):
            engine.reset(["shop.orders"], by="ana", reason="identity v2")
        assert _table(shop, "orders").column("_combined_id").type == pa.string()  # untouched
        (told,) = engine.reset(["shop.orders"], by="ana", reason="identity v2", drop_table=True)
        assert told["dropped"] == [str(shop / "lake" / "shop" / "orders")]
        (event,) = engine.activity(kind="dataset.reset")
        assert event["body"]["reason"] == "identity v2"
    finally:
        engine.close()
    assert _capture(project, "shop.orders")["orders"]["inserts"] == 200
    assert _table(shop, "orders").column("_combined_id").type == pa.binary()
    assert _id_types(shop, "_usage", "orders") == {pa.string()}  # the MAR table kept its own
    assert _usage(project, "orders")["mar"] == 200
