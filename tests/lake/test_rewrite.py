"""Copy-on-write: a file holding a changed id is rewritten without it, every other row kept."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined.lake import _files
from combined.lake._files import write_data_files
from combined.lake._rewrite import rewrite_actions
from combined.lake._store import LakeStore

SCHEMA = pa.schema(
    [("_combined_id", pa.string()), ("_combined_op", pa.string()), ("n", pa.int64())]
)


def _rows(ns: list[int], op: str = "insert") -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([f"id{i}" for i in ns]), pa.array([op] * len(ns)), pa.array(ns, pa.int64())],
        schema=SCHEMA,
    )


def test_rewritten_files_keep_every_row_but_the_changed_ones_across_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small row groups and read batches: one file is read in many batches, and
    # each batch must meet its own rows' verdicts (kept or dropped), not a neighbour's.
    monkeypatch.setattr(_files, "ROW_GROUP_ROWS", 7)
    monkeypatch.setattr(_files, "REWRITE_BATCH_ROWS", 5)
    table = tmp_path / "t"
    first = write_data_files(table, SCHEMA, [_rows(list(range(100)))])
    second = write_data_files(table, SCHEMA, [_rows(list(range(100, 130)))])
    untouched = write_data_files(table, SCHEMA, [_rows(list(range(200, 210)))])
    files = [str(table / a.path) for a in first + second + untouched]  # as LakeTable.files()
    assert pq.ParquetFile(files[0]).metadata.num_row_groups > 10

    updated, deleted, inserted = [3, 4, 41, 42, 43, 99, 100], [17, 64, 129], [500, 501]
    change = pa.Table.from_batches(
        [_rows(updated, "update"), _rows(deleted, "delete"), _rows(inserted, "insert")]
    )

    def data() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(SCHEMA, change.to_batches(max_chunksize=4))

    actions = rewrite_actions(table, files, SCHEMA, data)
    removed = {a.path for a in actions if not hasattr(a, "stats")}
    assert removed == {a.path for a in first + second}  # the untouched file stays
    added = [a for a in actions if hasattr(a, "stats")]
    got = pa.concat_tables([pq.read_table(table / a.path) for a in added + untouched])
    expected = sorted(
        [i for i in range(130) if i not in updated + deleted]
        + updated
        + inserted
        + list(range(200, 210))
    )
    assert sorted(got.column("n").to_pylist()) == expected
    ops = dict(
        zip(got.column("n").to_pylist(), got.column("_combined_op").to_pylist(), strict=True)
    )
    assert all(ops[i] == "update" for i in updated)
    assert all(ops[i] == "insert" for i in ops if i not in updated)


def test_the_changed_ids_meet_every_file_once_and_untouched_files_are_not_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The set of changed ids is built once per commit, for every file at once
    # (it was rebuilt for each 65,536-row batch of each file): a file none of
    # whose ids changed is left alone without being read.
    table = tmp_path / "t"
    written = [write_data_files(table, SCHEMA, [_rows(list(range(k, k + 50)))]) for k in (0, 100)]
    files = [str(table / a.path) for actions in written for a in actions]
    opened: list[str] = []
    real = LakeStore.open_input

    def recording(self: LakeStore, path: str) -> object:
        opened.append(path)
        return real(self, path)

    monkeypatch.setattr(LakeStore, "open_input", recording)
    change = pa.Table.from_batches([_rows([120, 121], "update"), _rows([130], "delete")])

    def data() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(SCHEMA, change.to_batches())

    actions = rewrite_actions(table, files, SCHEMA, data)
    assert opened == [files[1]]
    removed = [a.path for a in actions if not hasattr(a, "stats")]
    assert removed == [written[1][0].path]
    added = [a for a in actions if hasattr(a, "stats")]
    got = pa.concat_tables([pq.read_table(table / a.path) for a in added])
    assert sorted(got.column("n").to_pylist()) == [n for n in range(100, 150) if n != 130]
