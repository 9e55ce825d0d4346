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


def test_nested_schemas_choose_their_flat_columns_too(tmp_path: Path) -> None:
    # A nested field used to give every column a dictionary (the writer's
    # default): unique keys, texts and the digests were encoded twice.
    rows = 10_000
    batch = pa.record_batch(
        {
            "tags": pa.array([["a", "b"][: i % 3] for i in range(rows)]),
            "s": pa.array([{"x": i % 2, "y": "k"} for i in range(rows)]),
            "id": pa.array(range(rows), pa.int64()),
            "status": pa.array([("open", "paid")[i % 2] for i in range(rows)]),
            "_combined_id": pa.array([f"{i:032x}" for i in range(rows)]),
        }
    )
    chosen = dictionary_columns(batch.schema, batch)
    assert chosen == ["tags.list.element", "s.x", "s.y", "status"]
    everything = dictionary_columns(batch.schema, None)
    assert everything == ["tags.list.element", "s.x", "s.y", "id", "status"]
    path = tmp_path / "f.parquet"
    with parquet_writer(path, batch.schema, sample=batch) as writer:
        writer.write_batch(batch)
    enc = _encodings(path)
    assert "RLE_DICTIONARY" in enc["tags.list.element"] and "RLE_DICTIONARY" in enc["status"]
    assert "RLE_DICTIONARY" not in enc["id"] and "RLE_DICTIONARY" not in enc["_combined_id"]
    assert "DELTA_LENGTH_BYTE_ARRAY" in enc["_combined_id"]
    assert pq.read_table(path).equals(pa.Table.from_batches([batch]))


def test_a_dotted_name_keeps_the_writer_default() -> None:
    batch = pa.record_batch({"a.b": pa.array([[1], [2]]), "_combined_id": pa.array(["x", "y"])})
    assert dictionary_columns(batch.schema, batch) is True


def _digests(rows: int) -> pa.RecordBatch:
    import hashlib

    ids = [hashlib.md5(str(i).encode()).digest() for i in range(rows)]
    return pa.record_batch(
        {
            "id": pa.array(range(rows), pa.int64()),
            "_combined_id": pa.array(ids, pa.binary()),
            "_combined_payload_hash": pa.array(ids[::-1], pa.binary()),
        }
    )


def test_digests_are_stored_without_a_length_before_each(tmp_path: Path) -> None:
    # PLAIN puts a 4-byte length before every 16-byte digest, which zstd
    # then has to squeeze out of random bytes: DELTA_LENGTH_BYTE_ARRAY stores
    # the digests back to back, smaller and cheaper to write and to read.
    import duckdb

    batch = _digests(50_000)
    path = tmp_path / "f.parquet"
    with parquet_writer(path, batch.schema, sample=batch) as writer:
        writer.write_batch(batch)
    enc = _encodings(path)
    for name in ("_combined_id", "_combined_payload_hash"):
        assert "DELTA_LENGTH_BYTE_ARRAY" in enc[name]
        assert "PLAIN" not in enc[name] and "RLE_DICTIONARY" not in enc[name]
    assert "DELTA_LENGTH_BYTE_ARRAY" not in enc["id"]
    meta = pq.ParquetFile(path).metadata
    stored = sum(
        meta.row_group(rg).column(c).total_compressed_size
        for rg in range(meta.num_row_groups)
        for c in (1, 2)
    )
    assert stored < 2 * 50_000 * 16 * 1.02  # ~16 bytes a digest, no length prefixes
    assert pq.read_table(path).equals(pa.Table.from_batches([batch]))
    # The lake's other readers decode it alike.
    rows = (
        duckdb.connect()
        .execute(f"SELECT count(DISTINCT _combined_id), min(_combined_payload_hash) FROM '{path}'")
        .fetchall()
    )
    assert rows == [(50_000, min(batch.column(2).to_pylist()))]


def test_hex_digests_take_the_encoding_too_nested_schemas_do_not(tmp_path: Path) -> None:
    from combined.lake._files import digest_encoding

    hexed = pa.schema([("_combined_id", pa.string()), ("n", pa.int64())])
    assert digest_encoding(hexed, ["n"]) == {"_combined_id": "DELTA_LENGTH_BYTE_ARRAY"}
    assert digest_encoding(hexed, True) is None  # exclusive with a dictionary on every column
    assert digest_encoding(pa.schema([("n", pa.int64())]), ["n"]) is None


def test_a_schema_parquet_cannot_name_keeps_the_writer_default() -> None:
    # An empty struct has no leaf: the probe that names the leaves fails, the choice does not.
    schema = pa.schema([("s", pa.struct([])), ("l", pa.list_(pa.int64()))])
    assert dictionary_columns(schema, None) is True


def test_digests_are_stored_uncompressed_without_statistics(tmp_path: Path) -> None:
    # Random bytes: zstd gains nothing on them and their min/max skips nothing.
    rows = 5_000
    batch = pa.record_batch(
        {
            "id": pa.array(range(rows), pa.int64()),
            "_combined_id": pa.array([i.to_bytes(16, "big") for i in range(rows)], pa.binary()),
            "_combined_payload_hash": pa.array([bytes(16)] * rows, pa.binary()),
        }
    )
    path = tmp_path / "d.parquet"
    with parquet_writer(path, batch.schema, sample=batch) as writer:
        writer.write_batch(batch)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    columns = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    for name in ("_combined_id", "_combined_payload_hash"):
        assert columns[name].compression == "UNCOMPRESSED"
        assert not columns[name].is_stats_set
    assert columns["id"].compression == "ZSTD" and columns["id"].is_stats_set
    assert pq.read_table(path).equals(pa.Table.from_batches([batch]))
    # hex digests (identity encoding v1) are text of half their bits' entropy: compressed
    hexed = pa.record_batch({"_combined_id": pa.array([f"{i:032x}" for i in range(rows)])})
    path = tmp_path / "h.parquet"
    with parquet_writer(path, hexed.schema, sample=hexed) as writer:
        writer.write_batch(hexed)
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert column.compression == "ZSTD" and not column.is_stats_set


def test_dictionary_given_columns_read_back_as_strings(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("status", pa.string())])
    status = pa.array(["open", "paid", "open"]).dictionary_encode()
    given = pa.record_batch(
        [pa.array([1, 2, 3]), status],
        names=["id", "status"],
    )
    path = tmp_path / "s.parquet"
    with parquet_writer(path, schema, sample=given, dictionaries=["status"]) as writer:
        writer.write_batch(given)
    assert pq.read_schema(path) == schema
    assert pq.read_table(path).column("status").to_pylist() == ["open", "paid", "open"]
    plain = tmp_path / "p.parquet"
    pq.write_table(schema.empty_table(), plain)
    assert pq.ParquetFile(path).metadata.metadata == pq.ParquetFile(plain).metadata.metadata


def test_columns_of_large_values_are_written_without_statistics(tmp_path: Path) -> None:
    # pyarrow copies a column chunk's values to find its min and max, then
    # drops any over 4 KB: one 50 MB string held ~300 MB more while written.
    # A column the first rows (or the caller) say holds such values gets none.
    batch = _batch(3).append_column("body", pa.array(["x" * 5000, "short", None]))
    batch = batch.append_column("note", pa.array(["a", "b", "c"]))
    path = tmp_path / "f.parquet"
    with parquet_writer(path, batch.schema, sample=batch, large_values=["note"]) as writer:
        writer.write_batch(batch)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    stats = {
        meta.column(c).path_in_schema: meta.column(c).statistics for c in range(len(batch.schema))
    }
    assert stats["body"] is None and stats["note"] is None
    assert stats["status"] is not None and stats["id"] is not None
