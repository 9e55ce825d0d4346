"""A Run's steps share each table's load until the Run writes the table.

Each load of a table on an object store lists its log and reads every entry
since the last checkpoint; a capture's steps loaded each table ten times.
Sharing must never hide the Run's own writes from the steps after them.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from combined.lake import LakeTable, shared_loads
from combined.lake._maintain import compact

SCHEMA = pa.schema([("n", pa.int64())])


def _rows(*values: int) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_batches(SCHEMA, [pa.record_batch([pa.array(values)], SCHEMA)])


def _commit(table: LakeTable, sequence: int) -> int:
    return table.commit(
        first_sequence=sequence,
        last_sequence=sequence,
        mode="append",
        data=lambda: _rows(sequence),
        metadata={"run_id": f"r{sequence}"},
        needs_merge=False,
    ).lake_version


def test_views_in_a_block_share_a_load_and_see_every_write_of_the_block(tmp_path: Path) -> None:
    write_deltalake(tmp_path / "t", _rows(0))
    table = LakeTable(tmp_path / "t", "combined:s/d")
    with shared_loads():
        first = table.pinned()
        assert first.version() == 0
        again = LakeTable(tmp_path / "t", "combined:s/d").pinned()  # another step's own object
        assert again.delta() is first.delta()
        assert _commit(table, 1) == 1
        after = table.pinned()
        assert after.version() == 1 and after.committed_sequence() == 1
        assert first.version() == 0  # a view keeps the version it read
        table.append_batches(SCHEMA, iter(_rows(2).read_all().to_batches()), create=False)
        appended = table.pinned()
        assert appended.version() == 2
        assert compact(table, "test") is not None  # a maintenance commit, on its own load
        assert table.pinned().version() == 3
        assert sorted(table.pinned().delta().to_pyarrow_table().column("n").to_pylist()) == [
            0,
            1,
            2,
        ]
    assert table.pinned().delta() is not table.pinned().delta()  # outside a block: each its own


def test_blocks_do_not_share_with_each_other(tmp_path: Path) -> None:
    # A worker's next Run must read what other processes committed since.
    write_deltalake(tmp_path / "t", _rows(0))
    table = LakeTable(tmp_path / "t", "combined:s/d")
    with shared_loads():
        assert table.pinned().version() == 0
    write_deltalake(tmp_path / "t", _rows(1), mode="append")  # another process's commit
    with shared_loads():
        assert table.pinned().version() == 1
