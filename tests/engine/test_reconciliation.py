"""Counts are reconciled before publication; a capture that does not reconcile is not published."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from combined.catalog import data as cat
from combined.engine import Engine


def test_a_cursor_capture_is_not_reconciled_against_the_source(tmp_path: Path, tools) -> None:
    tools.make(tmp_path)
    tools.sql(
        tmp_path,
        "CREATE TABLE log (id INTEGER PRIMARY KEY, v TEXT);"
        "INSERT INTO log (v) VALUES ('a'), ('b');",
    )
    text = (tmp_path / "combined.yaml").read_text() + (
        "      log:\n        key: [id]\n        strategy: cursor\n"
        "        cursor: {column: id, trust: 'rowid alias'}\n"
    )
    (tmp_path / "combined.yaml").write_text(text)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.stats is not None
        assert run.stats["orders"]["reconciliation"] == "reconciled"
        assert run.stats["log"]["reconciliation"] == "not_reconciled"
    finally:
        engine.close()


def test_a_lake_changed_behind_the_catalog_is_not_published(shop: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    engine = Engine.open(shop / "combined.yaml")
    try:
        (first,) = engine.capture(["shop.orders"])
        path = shop / "lake" / "shop" / "orders"
        dt = DeltaTable(str(path))
        schema = pa.schema(dt.schema().to_arrow())
        stray = pa.Table.from_pylist(
            [{"id": 9999, "_combined_id": "f" * 32, "_combined_op": "insert"}], schema=schema
        )
        write_deltalake(str(path), stray, mode="append")  # a writer that is not Combined
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "needs_review"
        assert "does not reconcile" in (run.error or "")
        # the stray row was reduced away as a delete, so the lake holds the source's 200
        # rows while the version chain, which never saw the stray row, claims 199
        assert "the lake holds 200 rows, its version claims 199" in (run.error or "")
        assert engine.publications(1)[0]["id"] == first.publication_id
        with engine.catalog.begin() as conn:
            alerts = cat.activity(conn, kind="alert.reconciliation_failed")
        assert len(alerts) == 1 and alerts[0].body["version_rows"] == 199
    finally:
        engine.close()
