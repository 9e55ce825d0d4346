"""Projecting a commit the catalog already holds changes nothing."""

from __future__ import annotations

from pathlib import Path

from combined.catalog import data as cat
from combined.engine import Engine
from combined.lake import LakeTable
from combined.runtime._project import project_commit


def test_reprojecting_old_commits_moves_no_checkpoint_and_tells_no_event_twice(
    shop: Path, tools
) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        engine.capture(["shop.orders"])
        tools.sql(shop, "DELETE FROM orders WHERE id <= 5;")
        engine.capture(["shop.orders"])
        with engine.catalog.begin() as conn:
            before = cat.get_dataset(conn, "shop", "orders")
            events = len(cat.activity(conn, kind="delivery.committed", limit=1000))
        table = LakeTable(shop / "lake" / "shop" / "orders", "combined:shop/orders")
        for meta in reversed(table.commits()):  # oldest first, as a repair would
            project_commit(engine.catalog, engine.layout, "shop", "orders", meta)
        with engine.catalog.begin() as conn:
            after = cat.get_dataset(conn, "shop", "orders")
            assert len(cat.activity(conn, kind="delivery.committed", limit=1000)) == events
        assert after.current_version == before.current_version
        assert after.last_sequence == before.last_sequence
        assert after.lake_version == before.lake_version
    finally:
        engine.close()
