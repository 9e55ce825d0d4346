"""An inserts-only commit registers the Delivery files themselves as the table's data files."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from combined.delivery import Limits, StagedDelivery, StagingArea, write_deliveries
from combined.errors import ProtocolViolation
from combined.lake import CommitMode, CommitResult, LakeTable, link_data_files

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        ("_combined_id", pa.string()),
        ("_combined_op", pa.string()),
        ("_combined_delivery_id", pa.string()),
        ("n", pa.int64()),
        ("at", TS),
    ]
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
APP = "combined:shop/orders"


def rows(start: int, count: int, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    ns = range(start, start + count)
    columns = [
        pa.array([f"id{i}" for i in ns]),
        pa.array(["insert"] * count),
        pa.nulls(count, pa.string()),
        pa.array([None if i % 4 == 0 else i for i in ns], pa.int64()),
        pa.array([T0 + timedelta(minutes=i) for i in ns], TS),
    ]
    columns += [
        pa.array([i] * count, schema.field(i).type) for i in range(len(SCHEMA), len(schema))
    ]
    return pa.record_batch(columns, schema=schema)


def deliver(
    tmp_path: Path,
    first: int,
    batches: list[pa.RecordBatch],
    max_rows: int = 1_000_000,
    schema: pa.Schema = SCHEMA,
) -> list[StagedDelivery]:
    return write_deliveries(
        StagingArea(tmp_path / "staging", Limits()),
        iter(batches),
        run_id=f"run-{first}",
        source="shop",
        dataset="orders",
        first_sequence=first,
        schema=schema,
        schema_revision=1,
        max_rows=max_rows,
        max_bytes=2**40,
        allow_empty=True,
    )


def files(deliveries: list[StagedDelivery]) -> list[tuple[Path, str]]:
    return [(d.path, d.stats) for d in deliveries if d.stats is not None]


class Commit:
    """Commits deliveries to one table, recording whether rows were read and the hook ran."""

    def __init__(self, path: Path) -> None:
        self.table = LakeTable(path, APP)
        self.read = 0
        self.hooked = 0

    def __call__(
        self,
        deliveries: list[StagedDelivery],
        *,
        mode: CommitMode = "append",
        needs_merge: bool = False,
        first: int | None = None,
    ) -> CommitResult:
        paths = [d.path for d in deliveries]
        schema = pq.read_schema(str(paths[0]))

        def data() -> pa.RecordBatchReader:
            self.read += 1
            return pa.RecordBatchReader.from_batches(
                schema, (b for p in paths for b in pq.read_table(p).to_batches())
            )

        def before_write() -> None:
            self.hooked += 1

        seqs = [d.sequence for d in deliveries]
        return self.table.commit(
            first_sequence=seqs[0] if first is None else first,
            last_sequence=seqs[-1],
            mode=mode,
            data=data,
            metadata={
                "first_sequence": seqs[0],
                "last_sequence": seqs[-1],
                "ingested_at": T0.isoformat(),
            },
            needs_merge=needs_merge,
            before_write=before_write,
            files=files(deliveries),
        )


def lake_ids(path: Path) -> list[str]:
    ids = DeltaTable(str(path)).to_pyarrow_table().column("_combined_id").to_pylist()
    return sorted(str(i) for i in ids)


def table_files(path: Path) -> list[Path]:
    return [Path(u.removeprefix("file://")) for u in DeltaTable(str(path)).file_uris()]


def test_a_first_commit_creates_the_table_from_hard_linked_deliveries(tmp_path: Path) -> None:
    out = deliver(tmp_path, 1, [rows(0, 5), rows(5, 4)], max_rows=6)
    commit = Commit(tmp_path / "lake" / "t")
    result = commit(out)
    assert not result.skipped and result.lake_version == 0
    assert (commit.read, commit.hooked) == (0, 1)  # the rows were linked, not read
    assert commit.table.committed_sequence() == 2
    expected = pa.concat_tables([pq.read_table(d.path) for d in out])
    got = DeltaTable(str(tmp_path / "lake" / "t")).to_pyarrow_table()
    assert got.sort_by("_combined_id").equals(expected.sort_by("_combined_id"))
    linked = table_files(tmp_path / "lake" / "t")
    assert sorted(p.stat().st_ino for p in linked) == sorted(d.path.stat().st_ino for d in out)
    assert all(p.parent == tmp_path / "lake" / "t" for p in linked)
    for p in linked:
        os.remove(p)
    assert sum(pq.read_table(d.path).num_rows for d in out) == 9  # the raw files survive


def test_later_commits_append_and_repeats_and_gaps_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "lake" / "t"
    commit = Commit(path)
    first = deliver(tmp_path, 1, [rows(0, 3)])
    second = deliver(tmp_path, 2, [rows(3, 4)], max_rows=2)
    assert commit(first).lake_version == 0
    result = commit(second)
    assert (result.lake_version, result.skipped) == (1, False)
    assert commit.table.committed_sequence() == 3
    assert lake_ids(path) == sorted(f"id{i}" for i in range(7))
    assert len(table_files(path)) == 3
    again = commit(second)
    assert again.skipped and again.lake_version == 1 and commit.table.version() == 1
    assert commit.hooked == 2 and commit.read == 0
    with pytest.raises(ProtocolViolation, match="does not follow"):
        commit(deliver(tmp_path, 5, [rows(9, 1)]))
    assert commit.table.version() == 1


def test_an_empty_delivery_still_commits_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "lake" / "t"
    commit = Commit(path)
    (empty,) = deliver(tmp_path, 1, [])
    assert commit([empty]).lake_version == 0  # creates the table with no data file
    assert commit.table.schema().names == SCHEMA.names  # type: ignore[union-attr]
    assert table_files(path) == [] and list(path.glob("*.parquet")) == []
    commit(deliver(tmp_path, 2, [rows(0, 2)]))
    (empty,) = deliver(tmp_path, 3, [])
    result = commit([empty])
    assert (result.lake_version, result.skipped) == (2, False)
    assert commit.table.committed_sequence() == 3
    assert len(table_files(path)) == 1 and len(list(path.glob("*.parquet"))) == 1
    assert commit.read == 0


def test_the_delta_log_carries_each_file_statistics(tmp_path: Path) -> None:
    out = deliver(tmp_path, 1, [rows(0, 10), rows(10, 7)], max_rows=8)
    commit = Commit(tmp_path / "t")
    commit(out)
    log = pa.table(DeltaTable(str(tmp_path / "t")).get_add_actions(flatten=True))
    by_size = {d.byte_count: pq.read_table(d.path) for d in out}
    assert sorted(log.column("size_bytes").to_pylist()) == sorted(by_size)
    for i in range(log.num_rows):
        file = by_size[log.column("size_bytes")[i].as_py()]
        n, at = pc.min_max(file.column("n")), pc.min_max(file.column("at"))
        assert log.column("num_records")[i].as_py() == file.num_rows
        assert log.column("null_count.n")[i].as_py() == file.column("n").null_count
        assert log.column("min.n")[i].as_py() == n["min"].as_py()
        assert log.column("max.n")[i].as_py() == n["max"].as_py()
        assert log.column("min.at")[i].as_py() == at["min"].as_py()
        assert log.column("max.at")[i].as_py() == at["max"].as_py()
    assert sorted(log.column("num_records").to_pylist()) == [1, 8, 8]


def test_commits_that_cannot_link_read_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "t"
    commit = Commit(path)
    commit(deliver(tmp_path, 1, [rows(0, 2)]))
    commit(deliver(tmp_path, 2, [rows(2, 2)]), needs_merge=True)  # a merge may rewrite
    assert commit.read == 1
    wide = SCHEMA.append(pa.field("extra", pa.int64()))
    commit(deliver(tmp_path, 3, [rows(4, 2, wide)], schema=wide))  # the table must evolve
    assert commit.read == 2
    assert "extra" in commit.table.schema().names  # type: ignore[union-attr]
    # A full refresh in the table's schema links its Deliveries (h-refresh); in another, reads.
    commit(deliver(tmp_path, 4, [rows(6, 1, wide)], schema=wide), mode="overwrite")
    assert commit.read == 2
    assert lake_ids(path) == ["id6"]
    commit(deliver(tmp_path, 5, [rows(7, 1)]), mode="overwrite")
    assert commit.read == 3
    assert lake_ids(path) == ["id7"]
    assert commit.table.committed_sequence() == 5


def test_link_data_files_skips_empty_files_and_creates_the_table_dir(tmp_path: Path) -> None:
    empty, full = deliver(tmp_path, 1, []) + deliver(tmp_path, 2, [rows(0, 3)])
    target = tmp_path / "new" / "table"
    (action,) = link_data_files(target, files([empty, full]))
    linked = target / action.path
    assert action.path.startswith("part-") and action.path.endswith("-c000.zstd.parquet")
    assert action.size == full.byte_count == linked.stat().st_size
    assert action.stats == full.stats and action.data_change
    assert json.loads(action.stats)["numRecords"] == 3
    assert linked.stat().st_ino == full.path.stat().st_ino
    assert os.listdir(target) == [action.path]


@pytest.fixture
def other_device(tmp_path: Path) -> Iterator[Path]:
    """A directory on another filesystem than ``tmp_path``, where a hard link cannot go."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm to stand for another filesystem")
    other = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        if other.stat().st_dev == tmp_path.stat().st_dev:
            pytest.skip("/dev/shm is on the same filesystem as tmp_path")
        yield other
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_across_filesystems_the_file_is_copied(tmp_path: Path, other_device: Path) -> None:
    (d,) = deliver(other_device, 1, [rows(0, 4)])
    assert d.stats is not None
    (action,) = link_data_files(tmp_path / "t", [(d.path, d.stats)])
    copy = tmp_path / "t" / action.path
    assert copy.stat().st_ino != d.path.stat().st_ino
    assert copy.read_bytes() == d.path.read_bytes()
