"""Outside readers read a dataset at a publication's Delta version (docs/readers.md).

``combined publications --json`` maps each publication to each dataset's
Delta version and table URI; deltalake, DuckDB and Polars read that version
and see exactly what ``combined sql --publication`` sees, on a local and an
S3 lake, while the table's head is ahead of the newest publication (a capture
committed and killed before it was published). Before this, nothing said
which Delta version a publication meant.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pyarrow as pa

from combined.engine import Engine

QUERY = "SELECT id, status FROM shop.orders ORDER BY id"


def _published(tmp_path: Path, tools: Any, lake_url: str) -> list[dict[str, Any]]:
    """Two publications, then a commit the next capture never published; the map."""
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake_url}"))
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'lost' WHERE id > 100;")
    killed = tools.cli(tmp_path, "capture", "shop.orders", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tools.cli(tmp_path, "publications", "--json")
    assert out.returncode == 0, out.stderr
    mapping: list[dict[str, Any]] = json.loads(out.stdout)
    return mapping


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    ids, statuses = table.column("id").to_pylist(), table.column("status").to_pylist()
    return sorted(zip(ids, statuses, strict=True))


def _published_rows(engine: Engine, publication: str) -> list[tuple[Any, ...]]:
    return _rows(engine.sql(QUERY, publication=publication))


def test_publications_json_maps_each_publication_to_delta_versions(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    from deltalake import DeltaTable

    mapping = _published(tmp_path, tools, lake_url)
    assert [len(p["datasets"]) for p in mapping] == [2, 2]  # the basis, not only the members
    newest, first = mapping
    orders = newest["datasets"]["shop.orders"]
    assert orders["table_uri"].endswith("shop/orders")
    assert orders["table_uri"].startswith("s3://" if "://" in lake_url else "/")
    assert first["datasets"]["shop.orders"]["delta_version"] < orders["delta_version"]
    customers = [p["datasets"]["shop.customers"]["delta_version"] for p in mapping]
    assert customers[0] == customers[1]  # not captured again: the same version
    # the head is ahead of the newest publication: it holds rows never published
    head = DeltaTable(orders["table_uri"])
    assert head.version() > orders["delta_version"]
    assert "lost" in head.to_pyarrow_table().column("status").to_pylist()
    # per dataset
    out = tools.cli(tmp_path, "publications", "shop.orders", "--json", "--limit", "1")
    assert out.returncode == 0, out.stderr
    (only,) = json.loads(out.stdout)
    assert only["datasets"] == {"shop.orders": orders}
    out = tools.cli(tmp_path, "publications", "shop.nope", "--json")
    assert out.returncode == 2 and "unknown dataset" in out.stderr


def test_deltalake_duckdb_and_polars_read_exactly_what_was_published(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    import duckdb
    import polars as pl
    from deltalake import DeltaTable

    mapping = _published(tmp_path, tools, lake_url)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        for publication in mapping:
            orders = publication["datasets"]["shop.orders"]
            uri, version = orders["table_uri"], orders["delta_version"]
            expected = _published_rows(engine, publication["publication"])
            assert "lost" not in {status for _, status in expected}
            # deltalake
            dt = DeltaTable(uri, version=version)
            assert _rows(dt.to_pyarrow_table(columns=["id", "status"])) == expected
            # DuckDB, over the version's Arrow dataset
            con = duckdb.connect()
            con.register("orders", DeltaTable(uri, version=version).to_pyarrow_dataset())
            got = con.sql("SELECT id, status FROM orders ORDER BY id").fetchall()
            con.close()
            assert got == expected
            # Polars
            frame = pl.read_delta(uri, version=version, credential_provider=None)
            assert _rows(frame.select("id", "status").to_arrow()) == expected
    finally:
        engine.close()
