"""Which columns a lake or staging file encodes with a dictionary."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from combined.lake import parquet_writer
from combined.lake._files import dictionary_columns


def _batch(rows: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(rows), pa.int64()),
            "status": pa.array([("open", "paid", "void")[i % 3] for i in range(rows)]),
            "flag": pa.array([i % 2 == 0 for i in range(rows)]),
            "_combined_id": pa.array(["0" * 32] * rows),  # a digest: never, even constant
            "_combined_run_id": pa.array(["r1"] * rows),
        }
    )


def _encodings(path: Path) -> dict[str, set[str]]:
    meta = pq.ParquetFile(path).metadata
    out: dict[str, set[str]] = {}
    for rg in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            col = meta.row_group(rg).column(c)
            out.setdefault(col.path_in_schema, set()).update(col.encodings)
    return out


def test_repeated_values_get_a_dictionary_unique_ones_do_not(tmp_path: Path) -> None:
    batch = _batch(10_000)
    assert dictionary_columns(batch.schema, batch) == ["status", "_combined_run_id"]
    path = tmp_path / "f.parquet"
    with parquet_writer(path, batch.schema, sample=batch) as writer:
        writer.write_batch(batch)
    enc = _encodings(path)
    assert "RLE_DICTIONARY" in enc["status"] and "RLE_DICTIONARY" in enc["_combined_run_id"]
    assert "RLE_DICTIONARY" not in enc["id"] and "RLE_DICTIONARY" not in enc["_combined_id"]
    assert pq.read_table(path).equals(pa.Table.from_batches([batch]))


def test_without_a_sample_every_column_but_the_digests(tmp_path: Path) -> None:
    batch = _batch(10)
    assert dictionary_columns(batch.schema, None) == ["id", "status", "flag", "_combined_run_id"]
    empty = batch.slice(0, 0)
    assert dictionary_columns(batch.schema, empty) == ["id", "status", "flag", "_combined_run_id"]


def test_nested_schemas_keep_the_writer_default() -> None:
    batch = pa.record_batch({"a": pa.array([[1], [2]]), "_combined_id": pa.array(["x", "y"])})
    assert dictionary_columns(batch.schema, batch) is True
