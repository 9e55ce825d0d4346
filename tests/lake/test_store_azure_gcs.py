"""The lake's own files (raw Deliveries, quarantine) on Azurite and fake-gcs-server.

Arrow's filesystem writes, copies, reads and deletes them, and DuckDB reads
their Parquet through it. Before, an ``az://`` store could not be reached on
the emulator at all (no account), a ``gs://`` one was built for Google's
cloud whatever ``STORAGE_EMULATOR_HOST`` said, and DuckDB's reads of an
``az://`` URL lost its container ("Location cannot start with a separator").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from combined.lake._probe import check_store
from combined.lake._store import LakeStore


def test_a_lake_file_is_put_copied_read_and_deleted_in_the_store(
    tmp_path: Path, cloud_lake_url: str
) -> None:
    store = LakeStore.at(cloud_lake_url)
    check_store(store)
    local = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), local)
    raw = store.join("_deliveries", "shop", "orders", "000000001.parquet")
    store.put(local, raw)
    assert store.exists(raw) and store.size(raw) == local.stat().st_size
    assert store.sha256(raw) == hashlib.sha256(local.read_bytes()).hexdigest()
    table = store.join("shop", "orders", "part-0.parquet")
    store.copy(raw, table)
    assert store.read_bytes(table) == local.read_bytes()
    assert store.read_table(table).column("v").to_pylist() == ["a", "b", "c"]
    with store.written(store.join("_quarantine", "q.parquet")) as (path, fs):
        pq.write_table(pa.table({"id": [9]}), path, filesystem=fs)
    assert store.parquet_schema(store.join("_quarantine", "q.parquet")).names == ["id"]

    con = duckdb.connect()
    try:
        source = store.duck_source(con, [raw, table])
        assert con.execute(f"SELECT sum(id) FROM {source}").fetchall() == [(12,)]
        named = store.arrow_source(con, "orders", [raw], store.parquet_schema(raw))
        assert con.execute(f"SELECT max(v) FROM {named}").fetchall() == [("c",)]
    finally:
        con.close()
    store.delete(raw)
    assert not store.exists(raw) and store.read_bytes(raw) is None
