"""Deliveries are streamed into bounded files that carry their own Delta statistics."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from combined.delivery import (
    Limits,
    StagedDelivery,
    StagingArea,
    delivery_id,
    file_hash,
    write_deliveries,
)
from combined.errors import StagingLimitExceeded
from combined.lake import ROW_GROUP_ROWS

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        ("_combined_id", pa.string()),
        ("_combined_delivery_id", pa.string()),
        ("n", pa.int64()),
        ("at", TS),
        ("name", pa.string()),
    ]
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def batch(start: int, rows: int) -> pa.RecordBatch:
    """Rows ``start..start+rows``: every third ``n`` and every fifth ``name`` is null."""
    ns = range(start, start + rows)
    return pa.record_batch(
        [
            pa.array([f"id{i}" for i in ns]),
            pa.nulls(rows, pa.string()),  # the writer stamps the delivery id
            pa.array([None if i % 3 == 0 else i * 10 for i in ns], pa.int64()),
            pa.array([T0 + timedelta(seconds=i) for i in ns], TS),
            pa.array([None if i % 5 == 0 else f"row {i}" for i in ns]),
        ],
        schema=SCHEMA,
    )


def write(area: StagingArea, batches: Any, **kw: Any) -> list[StagedDelivery]:
    args: dict[str, Any] = {
        "run_id": "run-1",
        "source": "shop",
        "dataset": "orders",
        "first_sequence": 7,
        "schema": SCHEMA,
        "schema_revision": 1,
        "max_rows": 1_000_000,
        "max_bytes": 2**40,
    }
    return write_deliveries(area, batches, **(args | kw))


def ids(deliveries: list[StagedDelivery]) -> list[str]:
    return [d.id for d in deliveries]


def test_max_rows_cuts_contiguous_deliveries_with_deterministic_ids(tmp_path: Path) -> None:
    area = StagingArea(tmp_path / "a", Limits())
    batches = [batch(0, 4), batch(4, 7), batch(11, 2)]
    out = write(area, iter(batches), max_rows=5)
    assert [d.record_count for d in out] == [5, 5, 3]
    assert [d.sequence for d in out] == [7, 8, 9]
    assert ids(out) == [delivery_id("run-1", "shop", "orders", s) for s in (7, 8, 9)]
    again = write(StagingArea(tmp_path / "b", Limits()), iter(batches), max_rows=5)
    assert ids(again) == ids(out)
    rows = pa.concat_tables([pq.read_table(d.path) for d in out])
    assert rows.column("_combined_id").to_pylist() == [f"id{i}" for i in range(13)]
    for d in out:
        table = pq.read_table(d.path)
        assert table.schema == SCHEMA
        assert table.column("_combined_delivery_id").to_pylist() == [d.id] * d.record_count
        assert d.path.name == f"{d.sequence:09d}-{d.id}.parquet"
        assert d.byte_count == d.path.stat().st_size
        assert d.content_hash == file_hash(d.path)
    assert area.files == 3
    assert area.bytes == sum(d.byte_count for d in out)


def test_max_bytes_cuts_after_the_chunk_that_reaches_it(tmp_path: Path) -> None:
    area = StagingArea(tmp_path, Limits())
    batches = [batch(i * 10, 10) for i in range(5)]
    out = write(area, iter(batches), max_bytes=batches[0].nbytes * 2)
    assert [d.record_count for d in out] == [20, 20, 10]
    assert [d.sequence for d in out] == [7, 8, 9]
    for d in out:
        stamped = pq.read_table(d.path).column("_combined_delivery_id")
        assert stamped.to_pylist() == [d.id] * d.record_count


def test_a_delivery_exactly_at_max_rows_leaves_no_empty_tail(tmp_path: Path) -> None:
    out = write(StagingArea(tmp_path, Limits()), iter([batch(0, 10)]), max_rows=5, allow_empty=True)
    assert [d.record_count for d in out] == [5, 5]


def test_stats_describe_the_file(tmp_path: Path) -> None:
    (d,) = write(StagingArea(tmp_path, Limits()), iter([batch(0, 30), batch(30, 12)]))
    assert d.stats is not None
    stats = json.loads(d.stats)
    table = pq.read_table(d.path)
    assert stats["numRecords"] == table.num_rows == 42
    assert stats["nullCount"] == {c: table.column(c).null_count for c in table.column_names}
    assert stats["nullCount"]["n"] == 14 and stats["nullCount"]["name"] == 9
    n = pc.min_max(table.column("n"))
    assert (stats["minValues"]["n"], stats["maxValues"]["n"]) == (10, 410)
    assert (stats["minValues"]["n"], stats["maxValues"]["n"]) == (
        n["min"].as_py(),
        n["max"].as_py(),
    )
    at = pc.min_max(table.column("at"))
    lo, hi = (datetime.fromisoformat(stats[k]["at"]) for k in ("minValues", "maxValues"))
    assert (lo, hi) == (at["min"].as_py(), at["max"].as_py()) == (T0, T0 + timedelta(seconds=41))


def test_allow_empty_gives_one_empty_delivery_with_its_stats(tmp_path: Path) -> None:
    area = StagingArea(tmp_path, Limits())
    assert write(area, iter([batch(0, 0)])) == []
    assert not list(tmp_path.rglob("*.parquet"))
    (d,) = write(area, iter([batch(0, 0)]), allow_empty=True)
    assert (d.sequence, d.record_count) == (7, 0)
    assert d.id == delivery_id("run-1", "shop", "orders", 7)
    assert pq.read_table(d.path).schema == SCHEMA
    assert d.stats is not None
    assert json.loads(d.stats)["numRecords"] == 0
    assert d.content_hash == file_hash(d.path)


def test_row_groups_are_bounded_and_deliveries_keep_their_order(tmp_path: Path) -> None:
    area = StagingArea(tmp_path, Limits())

    def stream() -> Iterator[pa.RecordBatch]:
        yield batch(0, ROW_GROUP_ROWS + 10)
        yield batch(ROW_GROUP_ROWS + 10, 5)

    (d,) = write(area, stream())
    meta = pq.ParquetFile(d.path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes == [ROW_GROUP_ROWS, 15]
    assert pq.read_table(d.path).column("_combined_id").to_pylist() == [
        f"id{i}" for i in range(ROW_GROUP_ROWS + 15)
    ]


def test_small_batches_gather_into_full_row_groups(tmp_path: Path) -> None:
    area = StagingArea(tmp_path, Limits())
    rows = ROW_GROUP_ROWS * 2 + 100
    (d,) = write(area, iter([batch(i, min(1000, rows - i)) for i in range(0, rows, 1000)]))
    meta = pq.ParquetFile(d.path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(sizes) == rows and len(sizes) == 3 and min(sizes[:2]) >= ROW_GROUP_ROWS
    assert pq.read_table(d.path).column("_combined_id").to_pylist() == [
        f"id{i}" for i in range(rows)
    ]


def test_a_failing_stream_stops_every_writer_and_raises_its_own_error(tmp_path: Path) -> None:
    area = StagingArea(tmp_path, Limits())

    def stream() -> Iterator[pa.RecordBatch]:
        yield batch(0, 10)
        yield batch(10, 10)
        raise RuntimeError("the source went away")

    with pytest.raises(RuntimeError, match="went away"):
        write(area, stream(), max_rows=5)


def test_a_writer_error_reaches_the_caller(tmp_path: Path) -> None:
    area = StagingArea(tmp_path, Limits(max_files=2))  # the third Delivery is over the limit
    with pytest.raises(StagingLimitExceeded):
        write(area, iter([batch(i * 5, 5) for i in range(20)]), max_rows=5)


def test_the_older_delivery_is_encoded_while_the_newer_one_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first Delivery's writer holds its first chunk until the second
    # Delivery's writer has one: the reader must get past a whole Delivery
    # (four chunks and its end) without waiting on the first writer.
    import threading

    from combined.lake import FileStats

    second_started = threading.Event()
    waited: list[bool] = []
    add = FileStats.add

    def gated(self: Any, chunk: pa.RecordBatch) -> None:
        did = chunk.column("_combined_delivery_id")[0].as_py()
        if did == delivery_id("run-1", "shop", "orders", 8):
            second_started.set()
        elif not waited:
            waited.append(second_started.wait(timeout=10))
        add(self, chunk)

    monkeypatch.setattr(FileStats, "add", gated)
    area = StagingArea(tmp_path / "a", Limits())
    out = write(area, (batch(i * 2, 2) for i in range(8)), max_rows=8)
    assert [d.record_count for d in out] == [8, 8]
    assert waited == [True]


def test_constant_columns_are_written_from_one_dictionary_value(tmp_path: Path) -> None:
    # The Delivery id and the transition's constants reach the file from a
    # one-value dictionary (not hashed row by row): the file reads back as
    # strings, with the Arrow schema a writer of plain strings stores.
    schema = SCHEMA.append(pa.field("_combined_run_id", pa.string()))
    rows = [
        b.append_column("_combined_run_id", pa.repeat("run-1", b.num_rows))
        for b in (batch(0, 40_000), batch(40_000, 30_000))
    ]
    constants = {"_combined_run_id": pa.scalar("run-1")}
    area = StagingArea(tmp_path / "a", Limits())
    (d,) = write(area, iter(rows), schema=schema, constants=constants)
    pf = pq.ParquetFile(d.path)
    assert pf.schema_arrow == schema
    plain = tmp_path / "plain.parquet"
    pq.write_table(schema.empty_table(), plain)
    stored = pq.ParquetFile(plain).metadata.metadata
    assert pf.metadata.metadata == stored
    table = pq.read_table(d.path)
    assert table.column("_combined_run_id").unique().to_pylist() == ["run-1"]
    assert table.column("_combined_delivery_id").unique().to_pylist() == [d.id]
    assert table.drop_columns(["_combined_delivery_id"]).equals(
        pa.Table.from_batches(rows).drop_columns(["_combined_delivery_id"])
    )
    for rg in range(pf.metadata.num_row_groups):
        for name in ("_combined_run_id", "_combined_delivery_id"):
            i = schema.get_field_index(name)
            assert "RLE_DICTIONARY" in pf.metadata.row_group(rg).column(i).encodings


def test_a_deliverys_sha256_is_read_through_one_small_buffer(tmp_path: Path) -> None:
    # Each Delivery is hashed when written and again before its commit. A new
    # 1 MiB block a read (allocated, filled, hashed, freed) left the CPU's
    # cache before it was hashed; one reused buffer of 256 KiB cost a quarter less.
    import hashlib
    import tracemalloc

    area = StagingArea(tmp_path / "a", Limits())
    (d,) = write(area, iter([batch(i, 20_000) for i in range(0, 400_000, 20_000)]))
    assert d.byte_count > 2**20
    tracemalloc.start()
    try:
        digest = file_hash(d.path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest == d.content_hash == hashlib.sha256(d.path.read_bytes()).hexdigest()
    assert peak < 2**19, peak


def test_deliveries_of_large_values_are_written_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows of values of megabytes: each writer holds a row group of them and
    # their encoding, so a second writer beside the first only adds its peak.
    import threading

    from combined.lake import FileStats

    lock, writing, most = threading.Lock(), [0], [0]
    add = FileStats.add

    def watched(self: Any, chunk: pa.RecordBatch) -> None:
        with lock:
            writing[0] += 1
            most[0] = max(most[0], writing[0])
        threading.Event().wait(0.02)  # (long enough for another writer to start)
        add(self, chunk)
        with lock:
            writing[0] -= 1

    monkeypatch.setattr(FileStats, "add", watched)
    batches = [batch(i * 2, 2) for i in range(8)]
    area = StagingArea(tmp_path / "one", Limits())
    out = write(area, iter(batches), max_rows=4, large_values=("name",))
    assert [d.record_count for d in out] == [4, 4, 4, 4]
    assert most == [1]
    area = StagingArea(tmp_path / "two", Limits())
    assert [d.record_count for d in write(area, iter(batches), max_rows=4)] == [4, 4, 4, 4]
    assert most == [2]  # (other rows: two at once)


def test_a_writers_queue_is_full_at_its_chunks_bytes_as_at_their_number() -> None:
    from combined.delivery._staging import CHUNK_BYTES, FEED_CHUNKS, _Feed

    def rows_of(nbytes: int) -> pa.RecordBatch:
        return pa.record_batch([pa.array([b"x" * nbytes], pa.binary())], names=["v"])

    feed = _Feed(maxsize=FEED_CHUNKS)
    feed.put(rows_of(3 * CHUNK_BYTES), block=False)  # (an empty queue takes any chunk)
    assert not feed.full()
    feed.put(rows_of(2 * CHUNK_BYTES), block=False)
    assert feed.full()
    with pytest.raises(queue.Full):
        feed.put(rows_of(1), block=False)
    assert feed.get().nbytes > 3 * CHUNK_BYTES
    assert not feed.full()
    feed.get()
    for _ in range(FEED_CHUNKS):  # small chunks: full at their number
        feed.put(rows_of(1), block=False)
    assert feed.full()
