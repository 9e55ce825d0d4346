"""Data files we write carry statistics every Delta reader accepts."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.transaction import create_table_with_add_actions

from combined.lake._files import write_data_files
from combined.quality._reconcile import lake_rows


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
    actions = write_data_files(tmp_path / "t", schema, [batch])
    create_table_with_add_actions(str(tmp_path / "t"), Schema.from_arrow(schema), actions)
    assert lake_rows(tmp_path / "t", 0) == 3
    stats = pa.table(DeltaTable(str(tmp_path / "t")).get_add_actions(flatten=True))
    assert stats.column("num_records").to_pylist() == [3]
    assert stats.column("min.n").to_pylist() == [1]  # bounds are kept where they exist
    assert "min.x" not in stats.column_names or stats.column("min.x").to_pylist() == [None]
