"""A column dropped under ``drift.drop: evolve``: the lake keeps its former values.

A dropped column is no change of a row's data: a snapshot (or cursor)
re-capture leaves the rows that did not otherwise change as they are, with
the column's former values, and bills none of them. Rows whose other values
changed, and new rows, hold null in it (docs/configuration.md, "drift").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from combined.catalog import data as cat
from combined.engine import Engine


def _project(tools: Any, root: Path, settings: str = "") -> Path:
    """The shop of 5 orders; ``orders`` takes a drop (and ``settings``, YAML lines)."""
    project: Path = tools.make(root, orders=5)
    text = project.read_text().split("      orders:")[0]
    dataset = "      orders:\n        key: [id]\n        drift: {drop: evolve}\n"
    project.write_text(text + dataset + settings)
    return project


def _captured(engine: Engine) -> dict[str, Any]:
    """A capture of the orders, which succeeds: its stats."""
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    stats: dict[str, Any] = run.stats["orders"]
    return stats


def _lake(engine: Engine) -> list[tuple[Any, ...]]:
    rows = engine.sql(
        "SELECT id, status, total, _combined_op AS op FROM shop.orders ORDER BY id"
    ).to_pylist()
    return [(r["id"], r["status"], r["total"], r["op"]) for r in rows]


def _month(engine: Engine) -> tuple[int, int, int, int]:
    (orders,) = [u for u in engine.usage() if u["dataset"] == "orders"]
    return orders["mar"], orders["inserts"], orders["updates"], orders["deletes"]


def _drop_then_change(tools: Any, root: Path) -> None:
    tools.sql(
        root,
        "ALTER TABLE orders DROP COLUMN status; UPDATE orders SET total = 9 WHERE id = 1;"
        "INSERT INTO orders VALUES (6, 2, 7.5); DELETE FROM orders WHERE id = 5;",
    )


KEPT = [
    (1, None, 9.0, "update"),  # changed: no value of the dropped column
    (2, "placed", 3.0, "snapshot"),  # unchanged: as they were, former values kept
    (3, "placed", 4.5, "snapshot"),
    (4, "placed", 6.0, "snapshot"),
    (6, None, 7.5, "insert"),  # new: no value of the dropped column
]


def test_a_snapshot_keeps_a_dropped_columns_values_on_rows_that_did_not_change(
    tmp_path: Path, tools: Any
) -> None:
    engine = Engine.open(_project(tools, tmp_path))
    try:
        _captured(engine)
        _drop_then_change(tools, tmp_path)
        stats = _captured(engine)
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (1, 1, 1)
        assert stats["reconciliation"] == "reconciled"
        assert _lake(engine) == KEPT
        # billed: the 5 first seen, then id 6; the update of id 1 and the delete of id 5
        assert _month(engine) == (6, 6, 1, 1)
        with engine.catalog.begin() as conn:
            (drift,) = cat.activity(conn, kind="drift")
        assert (drift.body["class"], drift.body["field"], drift.body["outcome"]) == (
            "drop",
            "status",
            "evolve",
        )
        usage = engine.usage()

        # Captured again: nothing changed, nothing delivered or billed.
        again = _captured(engine)
        assert again["updates"] == 0 and again["deliveries"] == 0
        assert engine.usage() == usage
        assert _lake(engine) == KEPT

        # A row changed later loses the value then, and only it.
        tools.sql(tmp_path, "UPDATE orders SET total = 1 WHERE id = 2;")
        assert _captured(engine)["updates"] == 1
        assert _lake(engine)[1] == (2, None, 1.0, "update")
        assert _lake(engine)[2] == (3, "placed", 4.5, "snapshot")

        replayed = engine.replay("shop.orders")
        assert replayed.equal, replayed
    finally:
        engine.close()

    # The row explained: its one version, the value the lake keeps.
    found = tools.cli(tmp_path, "explain", "shop.orders", "3", "--json")
    assert found.returncode == 0, found.stderr
    explained = json.loads(found.stdout)
    assert [v["op"] for v in explained["versions"]] == ["snapshot"]
    assert explained["current"][0]["status"] == "placed"


def test_a_cursor_read_keeps_a_dropped_columns_values_on_rows_read_again_unchanged(
    tmp_path: Path, tools: Any
) -> None:
    # A cursor reads again the rows of its lookback: one unchanged
    # there is no update, and keeps its value of the dropped column.
    cursor = "        strategy: cursor\n        cursor: {column: id, trust: rowid, lookback: 2}\n"
    engine = Engine.open(_project(tools, tmp_path, cursor))
    try:
        _captured(engine)
        tools.sql(
            tmp_path,
            "ALTER TABLE orders DROP COLUMN status; INSERT INTO orders VALUES (6, 2, 7.5);",
        )
        stats = _captured(engine)
        assert (stats["inserts"], stats["updates"]) == (1, 0)
        assert [r[1] for r in _lake(engine)] == ["placed"] * 5 + [None]
        assert _month(engine) == (6, 6, 0, 0)
    finally:
        engine.close()
