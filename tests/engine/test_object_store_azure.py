"""Every command on an ``az://`` lake, served by a real Azurite on 127.0.0.1.

Reached only through the store's usual environment
(``AZURE_STORAGE_USE_EMULATOR``, ``AZURITE_BLOB_STORAGE_URL``); nothing in
``combined.yaml`` but the URL. Before Azurite was supported, every test
failed at the write probe: "the lake at az://... names no Azure storage
account" (Arrow's filesystem was built for Azure's cloud, not the emulator).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.engine.test_replay import _shop

from combined.engine import Engine


def _cli(tools: Any, root: Path, *args: str) -> Any:
    done = tools.cli(root, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _json(tools: Any, root: Path, *args: str) -> Any:
    return json.loads(_cli(tools, root, *args, "--format", "json").stdout)


def _count(tools: Any, root: Path, query: str, *basis: str) -> int:
    (row,) = _json(tools, root, "sql", query, *basis)
    return int(next(iter(row.values())))


def test_capture_sql_history_repair_and_replay_on_an_azurite_lake(
    tmp_path: Path, tools: Any, az_container: str
) -> None:
    lake = f"az://{az_container}/lake"
    _shop(tmp_path, tools, lake)  # orders and customers, events by a cursor
    project = tmp_path / "combined.yaml"
    _cli(tools, tmp_path, "capture")  # the snapshot
    between = datetime.now(UTC).isoformat()
    tools.sql(
        tmp_path,
        "UPDATE orders SET status = 'shipped' WHERE id <= 10; DELETE FROM orders WHERE id > 190;"
        "INSERT INTO orders VALUES (500, 1, 'new', 1.0);"
        "INSERT INTO events SELECT id, 'shipped' FROM orders WHERE id BETWEEN 31 AND 60;",
    )
    _cli(tools, tmp_path, "capture")  # the incremental re-capture

    orders, shipped = "SELECT count(*) AS n FROM shop.orders", " WHERE status = 'shipped'"
    assert _count(tools, tmp_path, orders) == 191
    assert _count(tools, tmp_path, orders + shipped) == 10
    assert _count(tools, tmp_path, "SELECT count(*) AS n FROM shop.events") == 60
    assert _count(tools, tmp_path, orders, "--as-of", between) == 200
    first = _json(tools, tmp_path, "publications")[-1]["id"]
    assert _count(tools, tmp_path, orders + shipped, "--publication", first) == 0
    history = _json(tools, tmp_path, "history", "shop.orders")
    changes = [(v["inserts"], v["updates"], v["deletes"]) for v in history]
    assert changes == [(200, 0, 0), (1, 10, 10)]
    # every table is in the container, where Arrow and delta-rs both found it
    engine = Engine.open(project)
    try:
        table = engine.layout.store.join("shop", "orders")
        assert table.startswith(f"{lake}/") and engine.layout.store.exists(
            engine.run(history[-1]["run_id"])["deliveries"][0].path
        )
    finally:
        engine.close()

    # the catalog lost: repair restores publications and Runs from the lake's ledger
    publications = _json(tools, tmp_path, "publications")
    runs = _json(tools, tmp_path, "runs")
    (tmp_path / ".combined" / "catalog.db").unlink()
    _cli(tools, tmp_path, "repair")
    assert _json(tools, tmp_path, "publications") == publications
    assert [r["id"] for r in _json(tools, tmp_path, "runs")] == [r["id"] for r in runs]
    restored = _json(tools, tmp_path, "history", "shop.orders")
    kept = ("id", "run_id", "lake_version", "inserts", "updates", "deletes", "publications")
    assert [[v[k] for k in kept] for v in restored] == [[v[k] for k in kept] for v in history]
    assert _count(tools, tmp_path, orders + shipped, "--publication", first) == 0

    # the projection rebuilt from the raw Deliveries in the container equals the table
    for name, rows in {"shop.orders": 191, "shop.events": 60}.items():
        done = json.loads(_cli(tools, tmp_path, "replay", name, "--json").stdout)
        assert done["equal"], done
        assert done["replayed_rows"] == done["projection_rows"] == rows
