"""Copy-on-write: a file holding a changed id is rewritten without it, every other row kept."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined.errors import LakeError
from combined.lake import _files, _rewrite
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


@pytest.mark.parametrize(
    ("shared_gone", "small_bytes"),
    [(_rewrite.SHARED_GONE, 0), (_rewrite.SHARED_GONE, _rewrite.SMALL_SCAN_BYTES), (0, 0)],
    ids=["duckdb", "small files", "many ids"],
)
def test_rewritten_files_keep_every_row_but_the_changed_ones_across_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_gone: int, small_bytes: int
) -> None:
    # (Its rows found by a DuckDB query on the lake's shared database, by reading the
    # small files' ids, and by a search over many ids sorted.)
    monkeypatch.setattr(_rewrite, "SHARED_GONE", shared_gone)
    monkeypatch.setattr(_rewrite, "SMALL_SCAN_BYTES", small_bytes)
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
    # whose ids changed is left alone without being read (by DuckDB's query: the
    # ids of a few small files are read with Arrow, each file's alone).
    monkeypatch.setattr(_rewrite, "SMALL_SCAN_BYTES", 0)
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


def test_a_file_every_row_of_which_goes_is_not_read_and_a_delivery_without_deletes_is_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A backlog that updates every row of the table: the old files only go
    # (removed unread), and the Deliveries become the table's files as they
    # are; one that deletes a row is streamed without its deletes.
    import hashlib
    import json

    from combined.lake._files import FileStats

    table = tmp_path / "t"
    written = [write_data_files(table, SCHEMA, [_rows(list(range(k, k + 50)))]) for k in (0, 100)]
    files = [str(table / a.path) for actions in written for a in actions]
    deliveries = []
    for n, batch in enumerate(
        [
            pa.concat_batches([_rows(list(range(50)), "update"), _rows([500], "insert")]),
            pa.concat_batches([_rows(list(range(100, 149)), "update"), _rows([149], "delete")]),
        ]
    ):
        path = tmp_path / f"delivery-{n}.parquet"
        pq.write_table(pa.Table.from_batches([batch]), path)
        stats = FileStats(SCHEMA)
        stats.add(batch)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        deliveries.append((path, stats.to_json(), digest))
    whole: list[int] = []  # reads of every column: a file's rows, not only its ids
    real = pq.ParquetFile.iter_batches

    def recording(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("columns") is None:
            whole.append(self.metadata.num_rows)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)

    def data() -> pa.RecordBatchReader:
        batches = [b for path, *_ in deliveries for b in pq.read_table(path).to_batches()]
        return pa.RecordBatchReader.from_batches(SCHEMA, batches)

    actions = rewrite_actions(table, files, SCHEMA, data, linked=deliveries)
    # Every row of both table files goes: neither is read; only the Delivery
    # holding a delete is read whole (to leave its delete out).
    assert whole == [50]
    removed = {a.path for a in actions if not hasattr(a, "stats")}
    assert removed == {a.path for actions in written for a in actions}
    added = [a for a in actions if hasattr(a, "stats")]
    assert f"part-{deliveries[0][2][:32]}-c000.zstd.parquet" in {a.path for a in added}
    assert (table / added[0].path).stat().st_ino == deliveries[0][0].stat().st_ino  # linked
    got = pa.concat_tables([pq.read_table(table / a.path) for a in added])
    assert sorted(got.column("n").to_pylist()) == [*range(50), *range(100, 149), 500]
    assert set(got.column("_combined_op").to_pylist()) == {"update", "insert"}
    assert all(json.loads(a.stats)["numRecords"] for a in added)


def test_a_file_of_wide_rows_is_rewritten_a_few_rows_at_a_time(tmp_path: Path) -> None:
    # 1 MB values (compressible: the file is small on disk). The rewrite read
    # REWRITE_BATCH_ROWS (8,192) rows at a time whatever their width, so one
    # batch was the whole 48 MB file, and two files at once held over 1 GB at a
    # re-capture of 1,500 such rows. Reads now take about READ_BATCH_BYTES.
    wide = pa.schema([*SCHEMA, ("body", pa.string())])
    body = "".join(f"{i:08x}" for i in range(1 << 17))  # 1 MiB, no repeat inside a page

    def batch(ns: list[int], op: str) -> pa.RecordBatch:
        rows = _rows(ns, op)  # (a text of its own per row: no dictionary holds them)
        return pa.record_batch([*rows.columns, pa.array([f"{n}{body}" for n in ns])], schema=wide)

    table = tmp_path / "t"
    rows = [batch(list(range(k, k + 4)), "insert") for k in range(0, 48, 4)]
    written = write_data_files(table, wide, rows)
    files = [str(table / a.path) for a in written]
    on_disk, rows_bytes = Path(files[0]).stat().st_size, 48 << 20
    assert on_disk < 8 << 20 and pq.ParquetFile(files[0]).metadata.num_rows << 20 == rows_bytes
    change = pa.Table.from_batches([batch([5], "update")])

    def data() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(wide, change.to_batches())

    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        actions = rewrite_actions(table, files, wide, data)
    finally:
        pa.set_memory_pool(previous)
    added = [a for a in actions if hasattr(a, "stats")]
    got = pa.concat_tables([pq.read_table(table / a.path) for a in added])
    assert sorted(got.column("n").to_pylist()) == list(range(48))
    assert pool.max_memory() < 48 << 20, f"peak {pool.max_memory() >> 20} MiB"


def test_the_rows_a_small_change_replaces_are_found_without_opening_a_database(
    tmp_path: Path, duck_opens: list[object]
) -> None:
    # Opening a DuckDB database costs ~15 ms of CPU: a re-capture of 200
    # small tables, one row changed in each, opened one a table to find it;
    # then a query of the lake's shared database cost ~9 ms a table, where
    # reading the few ids of its small files costs well under one.
    for name in ("a", "b", "c"):
        table = tmp_path / name
        files = [str(table / a.path) for a in write_data_files(table, SCHEMA, [_rows([1, 2, 3])])]
        change = pa.Table.from_batches([_rows([2], "update")])

        def data(change: pa.Table = change) -> pa.RecordBatchReader:
            return pa.RecordBatchReader.from_batches(SCHEMA, change.to_batches())

        added = [a for a in rewrite_actions(table, files, SCHEMA, data) if hasattr(a, "stats")]
        got = pa.concat_tables([pq.read_table(table / a.path) for a in added])
        assert sorted(got.column("n").to_pylist()) == [1, 2, 3]
    assert duck_opens == []


def test_a_table_of_many_or_large_files_is_searched_by_duckdb(tmp_path: Path) -> None:
    store = LakeStore.at(str(tmp_path))
    table = tmp_path / "t"
    files = [str(table / a.path) for a in write_data_files(table, SCHEMA, [_rows([1, 2])])]
    size = Path(files[0]).stat().st_size
    assert _rewrite._small(files, store)
    assert not _rewrite._small(files * (_rewrite.SMALL_FILES + 1), store)
    enough = _rewrite.SMALL_SCAN_BYTES // size
    assert _rewrite._small(files * min(enough, _rewrite.SMALL_FILES), store)
    big = tmp_path / "big"
    wide = pa.array([os.urandom(1024) for _ in range(_rewrite.SMALL_SCAN_BYTES // 1024 + 64)])
    big.mkdir()
    pq.write_table(pa.table({"v": wide}), big / "f.parquet", compression="none")
    assert not _rewrite._small([str(big / "f.parquet")], store)


@pytest.mark.parametrize("binary", [True, False], ids=["v2", "v1"])
def test_many_ids_to_remove_are_found_by_a_search_over_them_sorted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binary: bool
) -> None:
    """Past ``SHARED_GONE`` ids, the rows to remove are found without DuckDB: its hash
    table of every id of a 5M-row re-capture whose every row changed ran out of its
    64 MB (it could not spill there). Here every id but a seventh, in three files."""
    monkeypatch.setattr(_rewrite, "SHARED_GONE", 10)

    def ident(i: int) -> bytes | str:
        return hashlib.md5(str(i).encode()).digest() if binary else f"id{i}"

    kind = pa.binary() if binary else pa.string()
    schema = pa.schema([("_combined_id", kind), ("_combined_op", pa.string()), ("n", pa.int64())])
    table, written, at = tmp_path / "t", [], 0
    for size in (120_000, 100_000, 80_000):
        ns = list(range(at, at + size))
        batch = pa.record_batch(
            [pa.array([ident(i) for i in ns], kind), pa.array(["insert"] * size), pa.array(ns)],
            schema=schema,
        )
        written += write_data_files(table, schema, [batch])
        at += size
    files = [str(table / a.path) for a in written]
    gone = pa.array([ident(i) for i in range(at) if i % 7 != 3] + [ident(at + 5)], kind)
    doomed = _rewrite._doomed_rows(files, gone, LakeStore.at(str(tmp_path)))
    assert set(doomed) == set(files)
    for name in files:
        ns = pq.read_table(name, columns=["n"]).column(0).to_pylist()
        assert doomed[name].tolist() == [k for k, i in enumerate(ns) if i % 7 != 3]
    few = _rewrite._doomed_rows(files, gone.slice(0, 5), LakeStore.at(str(tmp_path)))
    assert {k: v.tolist() for k, v in few.items()} == {files[0]: [0, 1, 2, 4, 5]}


def test_a_row_of_a_file_named_otherwise_than_the_log_names_it_stops_the_commit(
    tmp_path: Path,
) -> None:
    table = tmp_path / "t"
    (a,) = write_data_files(table, SCHEMA, [_rows(list(range(10)))])
    logged = str(table / a.path)
    elsewhere = tmp_path / "copy.parquet"
    elsewhere.write_bytes(Path(logged).read_bytes())
    store = LakeStore.at(str(tmp_path))
    found = _rewrite._doomed_rows([logged], pa.array(["id3"]), store)
    assert {k: v.tolist() for k, v in found.items()} == {logged: [3]}
    # DuckDB reports each row's file by the name it read: a name not in the log's list
    # (here a path listed as another one) is never taken as one of the log's files.
    with pytest.raises(LakeError, match="otherwise than its log does"):
        _rewrite._gather(
            pa.record_batch(
                {
                    "at": pa.array([None], pa.int64()),
                    "number": pa.array([3], pa.int64()),
                    "strange": pa.array([str(elsewhere)]),
                }
            ),
            {},
        )


@pytest.mark.parametrize("small_bytes", [_rewrite.SMALL_SCAN_BYTES, 0], ids=["arrow", "duckdb"])
def test_an_update_replaces_rows_of_a_file_delta_rs_wrote_with_view_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_bytes: int
) -> None:
    """delta-rs' merge that evolves a table writes its ids as string views, which the
    search over a small table's ids must take as plain strings (it failed every commit)."""
    from combined.lake._table import LakeTable

    monkeypatch.setattr(_rewrite, "SMALL_SCAN_BYTES", small_bytes)
    table = LakeTable(str(tmp_path), "t")

    def commit(sequence: int, rows: pa.Table) -> None:
        data = lambda: pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches())  # noqa: E731
        table.commit(
            first_sequence=sequence, last_sequence=sequence, mode="merge", data=data, metadata={}
        )

    def ids(ns: Iterable[int]) -> list[str]:
        return [f"{i:032x}" for i in ns]  # v1: 32 hex digits

    commit(
        1,
        pa.table(
            {
                "_combined_id": ids(range(5)),
                "_combined_op": ["insert"] * 5,
                "n": pa.array(range(5), pa.int64()),
            }
        ),
    )
    # A new column, as Combined committed one before its widening rewrite: delta-rs'
    # merge evolving the table (its files hold string views). Lakes keep such files.
    widened = pa.table(
        {
            "_combined_id": ids([1, 9]),
            "_combined_op": ["update", "insert"],
            "n": pa.array([11, 9], pa.int64()),
            "extra": ["a", "b"],
        }
    )
    (
        table.delta()
        .merge(
            source=widened,
            predicate="t._combined_id = s._combined_id",
            source_alias="s",
            target_alias="t",
            merge_schema=True,
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    kinds = {str(pq.read_schema(f).field("_combined_id").type) for f in table.files()}
    assert "string_view" in kinds
    commit(
        2,
        pa.table(
            {
                "_combined_id": ids([2]),
                "_combined_op": ["update"],
                "n": pa.array([22], pa.int64()),
                "extra": ["c"],
            }
        ),
    )
    got = LakeTable(str(tmp_path), "t").delta().to_pyarrow_table(columns=["n"]).column(0)
    assert sorted(got.to_pylist()) == [0, 3, 4, 9, 11, 22]


def test_ids_held_as_views_or_dictionaries_are_searched_as_plain_ones() -> None:
    plain = pa.array(["a", "b", None])
    for held in (
        plain.cast(pa.string_view()),
        plain.dictionary_encode(),
        plain.cast(pa.large_string()),
    ):
        assert _rewrite._plain(held).equals(plain)
    raw = pa.array([b"\x01" * 16, None], pa.binary())
    assert _rewrite._plain(raw.cast(pa.binary_view())).equals(raw)
