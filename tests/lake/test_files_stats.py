"""Data files we write carry statistics every Delta reader accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Schema
from deltalake.transaction import create_table_with_add_actions

from combined.lake import LakeTable
from combined.lake._files import _add_action, write_data_files
from combined.quality._reconcile import lake_rows


def _committed_stats(path: Path, schema: pa.Schema, batch: pa.RecordBatch, rows: int) -> pa.Table:
    """Write ``batch`` as a new table at ``path``; check its rows; return its add stats."""
    actions = write_data_files(path, schema, [batch])
    create_table_with_add_actions(str(path), Schema.from_arrow(schema), actions)
    assert lake_rows(LakeTable(path, ""), 0) == rows
    return pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))


def test_non_finite_floats_and_far_timestamps_keep_their_row_counts(tmp_path: Path) -> None:
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([("x", pa.float64()), ("at", ts), ("n", pa.int64())])
    batch = pa.record_batch(
        [
            pa.array([1.5, float("inf"), float("nan")]),
            pa.array([0, 2**63 - 1, None], pa.int64()).cast(ts),
            pa.array([1, 2, 3]),
        ],
        schema=schema,
    )
    stats = _committed_stats(tmp_path / "t", schema, batch, rows=3)
    assert stats.column("num_records").to_pylist() == [3]
    assert stats.column("min.n").to_pylist() == [1]  # bounds are kept where they exist
    assert "min.x" not in stats.column_names or stats.column("min.x").to_pylist() == [None]


def test_data_files_gather_small_batches_into_full_row_groups_and_cut_files_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    from combined.lake import _files

    monkeypatch.setattr(_files, "FILE_ROWS", 2_500)
    monkeypatch.setattr(_files, "ROW_GROUP_ROWS", 1_000)
    schema = pa.schema([("n", pa.int64())])
    sizes = [300, 0, 700, 1, 999, 2_000, 1_000, 100]  # 5,100 rows in uneven batches
    batches, start = [], 0
    for size in sizes:
        batches.append(pa.record_batch([pa.array(range(start, start + size))], schema=schema))
        start += size
    actions = write_data_files(tmp_path / "t", schema, batches)
    files = [pq.ParquetFile(tmp_path / "t" / a.path) for a in actions]
    groups = [
        [f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups)] for f in files
    ]
    # Files of exactly FILE_ROWS rows, each of full row groups but its last.
    assert groups == [[1_000, 1_000, 500], [1_000, 1_000, 500], [100]]
    rows = [r for f in files for r in f.read().column("n").to_pylist()]
    assert rows == list(range(start))
    assert [a.stats and json.loads(a.stats)["numRecords"] for a in actions] == [2_500, 2_500, 100]


def test_a_struct_column_keeps_the_files_row_count(tmp_path: Path) -> None:
    # A flat null count for a struct made delta-rs drop the file's stats, so
    # reconciliation counted 0 rows and every capture of nested data needed review.
    inner = pa.struct([("a", pa.int64()), ("b", pa.list_(pa.string()))])
    schema = pa.schema([("id", pa.int64()), ("o", inner), ("m", pa.map_(pa.string(), pa.int64()))])
    batch = pa.record_batch(
        [
            pa.array([1, 2, 3]),
            pa.array([{"a": 1, "b": ["x"]}, {"a": None, "b": []}, None], inner),
            pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        ],
        schema=schema,
    )
    stats = _committed_stats(tmp_path / "t", schema, batch, rows=3)
    assert stats.column("null_count.m").to_pylist() == [1]


def test_a_file_whose_stats_delta_rs_cannot_parse_is_counted_from_its_footer(
    tmp_path: Path,
) -> None:
    # Lakes written before the fix above hold such files: their tables must
    # reconcile again, not stay short of every row of those files.
    schema = pa.schema([("id", pa.int64()), ("o", pa.struct([("a", pa.int64())]))])
    batch = pa.record_batch([pa.array([1, 2]), pa.array([{"a": 1}, None])], schema=schema)
    actions = write_data_files(tmp_path / "t", schema, [batch])
    stats = json.loads(actions[0].stats)
    flat = stats | {"nullCount": {"id": 0, "o": 1}}  # what the old writer wrote
    actions[0] = _add_action(actions[0].path, actions[0].size, json.dumps(flat))
    create_table_with_add_actions(str(tmp_path / "t"), Schema.from_arrow(schema), actions)
    assert lake_rows(LakeTable(tmp_path / "t", ""), 0) == 2
