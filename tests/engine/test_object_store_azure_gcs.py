"""Every command on an ``az://`` and a ``gs://`` lake, on emulators on 127.0.0.1.

``az://`` on Azurite, ``gs://`` on fake-gcs-server behind the adapter that
adds GCS's XML uploads (``tests/_gcs_xml.py``; the ``cloud_lake_url``
fixture). Reached only through each store's usual environment
(``AZURE_STORAGE_USE_EMULATOR``, ``AZURITE_BLOB_STORAGE_URL``;
``STORAGE_EMULATOR_HOST``); nothing in ``combined.yaml`` but the URL. Before
Azurite was supported, every capture failed at the write probe: "the lake at
az://... names no Azure storage account" (Arrow's filesystem was built for
Azure's cloud, not the emulator); and DuckDB's reads of the lake dropped an
``az://`` URL's container.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.engine.test_replay import _shop

from combined.engine import Engine

ORDERS, SHIPPED = "SELECT count(*) AS n FROM shop.orders", " WHERE status = 'shipped'"


def _cli(tools: Any, root: Path, *args: str) -> Any:
    done = tools.cli(root, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _count(engine: Engine, query: str, **basis: Any) -> int:
    (row,) = engine.sql(query, **basis).to_pylist()
    return int(next(iter(row.values())))


def _captured_twice(tools: Any, root: Path, lake: str) -> str:
    """A snapshot and an incremental re-capture by the CLI; the instant between them."""
    _shop(root, tools, lake)  # orders and customers, events by a cursor
    _cli(tools, root, "capture")
    between = datetime.now(UTC).isoformat()
    tools.sql(
        root,
        "UPDATE orders SET status = 'shipped' WHERE id <= 10; DELETE FROM orders WHERE id > 190;"
        "INSERT INTO orders VALUES (500, 1, 'new', 1.0);"
        "INSERT INTO events SELECT id, 'shipped' FROM orders WHERE id BETWEEN 31 AND 60;",
    )
    _cli(tools, root, "capture")
    return between


def test_capture_sql_history_repair_and_replay_on_an_azure_or_gcs_lake(
    tmp_path: Path, tools: Any, cloud_lake_url: str
) -> None:
    lake = cloud_lake_url
    between = _captured_twice(tools, tmp_path, lake)
    (row,) = json.loads(
        _cli(tools, tmp_path, "sql", ORDERS, "--as-of", between, "--format", "json").stdout
    )
    assert row == {"n": 200}
    project = tmp_path / "combined.yaml"
    engine = Engine.open(project)
    try:
        assert (_count(engine, ORDERS), _count(engine, ORDERS + SHIPPED)) == (191, 10)
        assert _count(engine, "SELECT count(*) AS n FROM shop.events") == 60
        first = engine.publications()[-1]["id"]
        assert _count(engine, ORDERS + SHIPPED, publication=first) == 0
        history = engine.history("shop.orders")
        changes = [(v["inserts"], v["updates"], v["deletes"]) for v in history]
        assert changes == [(200, 0, 0), (1, 10, 10)]
        (delivery, *_) = engine.run(history[-1]["run_id"])["deliveries"]
        assert delivery.path.startswith(f"{lake}/_deliveries/")
        assert engine.layout.store.sha256(delivery.path) == delivery.content_hash
        publications, runs = engine.publications(), [r.id for r in engine.runs()]
    finally:
        engine.close()

    # the catalog lost: repair restores publications and Runs from the lake's ledger
    (tmp_path / ".combined" / "catalog.db").unlink()
    _cli(tools, tmp_path, "repair")
    engine = Engine.open(project)
    try:
        assert engine.publications() == publications
        assert [r.id for r in engine.runs()] == runs
        kept = ("id", "run_id", "lake_version", "inserts", "updates", "deletes", "publications")
        restored = engine.history("shop.orders")
        assert [[v[k] for k in kept] for v in restored] == [[v[k] for k in kept] for v in history]
        assert _count(engine, ORDERS + SHIPPED, publication=first) == 0
        # the projection rebuilt from the raw Deliveries in the container equals the table
        for name, rows in {"shop.orders": 191, "shop.events": 60}.items():
            done = engine.replay(name)
            assert done.equal, done
            assert done.replayed_rows == done.projection_rows == rows
    finally:
        engine.close()
