"""The capture stager: ordinals, hashes and parts, written off the reading thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from combined.capture._databases import KeptDatabase
from combined.delivery import PartWriter, StagedParts, StagingArea, part_schema, read_part
from combined.delivery._staging import Limits
from combined.errors import StagingLimitExceeded
from combined.protocol.identity import compute_identity, identity_python, payload_hash_python
from combined.runtime import _stage as stager_module
from combined.runtime._stage import GROUP_ROWS, ORDINAL, CaptureStager, Handoff

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def batch(start: int, n: int, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    cols = {
        "id": list(range(start, start + n)),
        "name": [None if i % 7 == 0 else f"n{i}" for i in range(start, start + n)],
        "score": [i / 4 for i in range(start, start + n)],
        "extra": [f"x{i}" for i in range(start, start + n)],
    }
    return pa.RecordBatch.from_pydict({f.name: cols[f.name] for f in schema}, schema=schema)


def part_table(path: Path) -> pa.Table:
    """A staged part's rows."""
    return pa.Table.from_batches(list(read_part(path)), schema=part_schema(path))


def stager(tmp_path: Path, *, hash_rows: bool = True, max_bytes: int = 2**40) -> CaptureStager:
    area = StagingArea(tmp_path, Limits(max_bytes=max_bytes))
    writer = PartWriter(area, "src/ds/capture", max_rows=100_000, max_bytes=2**30)
    return CaptureStager(writer, key=["id"], hash_rows=hash_rows, first_ordinal=10)


def test_rows_keep_their_order_ordinals_and_get_the_canonical_hashes(tmp_path: Path) -> None:
    s = stager(tmp_path)
    sizes = [1000, GROUP_ROWS, 5, 0, 70_000]
    start = 0
    for n in sizes:
        s.put(batch(start, n))
        start += n
    parts = s.close(SCHEMA)
    staged = pa.concat_tables([part_table(p) for p in parts])
    assert staged.num_rows == sum(sizes)
    assert staged.column("id").to_pylist() == list(range(sum(sizes)))
    assert staged.column(ORDINAL).to_pylist() == list(range(10, 10 + sum(sizes)))
    # Every staged hash is the one the reference encoding gives, row by row.
    for row in staged.slice(0, 50).to_pylist() + staged.slice(GROUP_ROWS, 50).to_pylist():
        # (identity encoding v2: the digest's 16 bytes, whose hex is the v1 id)
        assert row["_combined_id"].hex() == identity_python([row["id"]], [pa.int64()])
        values = {f.name: row[f.name] for f in SCHEMA}
        assert row["_combined_payload_hash"].hex() == payload_hash_python(values, SCHEMA)


def test_a_column_added_mid_read_hashes_like_a_null_in_earlier_rows(tmp_path: Path) -> None:
    wide = SCHEMA.append(pa.field("extra", pa.string()))
    s = stager(tmp_path)
    s.put(batch(0, 3))
    s.put(batch(3, 3, wide).set_column(3, "extra", pa.nulls(3, pa.string())))
    parts = s.close(SCHEMA)
    staged = pa.Table.from_batches(list(StagedParts(parts, part_schema(parts[-1])).batches()))
    hashes = staged.column("_combined_payload_hash").to_pylist()
    # A row with the new column null hashes as if the column were absent.
    assert staged.num_rows == 6
    rows = pa.Table.from_batches([batch(0, 6)]).to_pylist()
    assert [h.hex() for h in hashes] == [payload_hash_python(r, SCHEMA) for r in rows]


def test_without_hashing_rows_are_staged_as_read(tmp_path: Path) -> None:
    s = stager(tmp_path, hash_rows=False)
    s.put(batch(0, 5))
    (part,) = s.close(SCHEMA)
    assert part_schema(part).names == [*SCHEMA.names, ORDINAL]


def test_small_unhashed_batches_are_staged_gathered_in_order(tmp_path: Path) -> None:
    # A change stream read a transaction at a time hands on a batch a
    # transaction: 500k single-row MariaDB transactions were staged as 500k
    # record batches of one row, each read and delivered apart (764 MB peak).
    s = stager(tmp_path, hash_rows=False)
    for i in range(3000):
        s.put(batch(i, 1))
    s.put(batch(3000, 20_000))  # a large batch is written as it is, after them
    s.put(batch(23_000, 2))
    (part,) = s.close(SCHEMA)
    with pa.memory_map(str(part)) as source:
        assert pa.ipc.open_file(source).num_record_batches <= 3
    rows = part_table(part)
    assert rows.column("id").to_pylist() == list(range(23_002))
    assert rows.column(ORDINAL).to_pylist() == list(range(10, 23_012))


def test_an_empty_capture_stages_one_empty_part_with_its_columns(tmp_path: Path) -> None:
    s = stager(tmp_path)
    (part,) = s.close(SCHEMA)
    table = part_table(part)
    assert table.num_rows == 0
    assert table.column_names == [*SCHEMA.names, ORDINAL, "_combined_id", "_combined_payload_hash"]


def test_an_empty_change_stream_stages_one_empty_part(tmp_path: Path) -> None:
    # Its empty batch waits with the small ones, and a table of no rows has no
    # batch: a quiet cdc capture (another table changed) staged no part and
    # failed with "list index out of range".
    s = stager(tmp_path, hash_rows=False)
    (part,) = s.close(SCHEMA)
    assert part_table(part).num_rows == 0


def test_a_write_error_reaches_the_reading_thread(tmp_path: Path) -> None:
    s = stager(tmp_path, max_bytes=10_000)
    with pytest.raises(StagingLimitExceeded):
        for i in range(50):
            s.put(batch(i * GROUP_ROWS, GROUP_ROWS))
        s.close(SCHEMA)
    s.abort()  # idempotent after a failure: the threads are gone


def test_a_keyless_capture_is_left_for_the_reduction_to_hash(tmp_path: Path) -> None:
    area = StagingArea(tmp_path, Limits())
    writer = PartWriter(area, "src/ds/capture", max_rows=100_000, max_bytes=2**30)
    s = CaptureStager(writer, key=[], hash_rows=True)
    s.put(batch(0, 5))
    (part,) = s.close(SCHEMA)
    # Its identity covers every column: it must be computed over the whole capture's schema.
    assert part_schema(part).names == [*SCHEMA.names, ORDINAL]


class _SlowFailingWriter:
    """Fails its first write after a while, so the reading thread waits at the full slot."""

    def __init__(self) -> None:
        self.calls = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.calls += 1
        time.sleep(0.5)
        if self.calls == 1:
            raise StagingLimitExceeded("the disk is full", hint="free some")

    def close(self) -> list[Path]:
        return []

    def abort(self) -> None:
        self.aborted = True


def test_a_failed_write_never_leaves_a_stage_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stager_module, "GROUP_ROWS", 1)
    s = CaptureStager(_SlowFailingWriter(), key=["id"], hash_rows=True)  # type: ignore[arg-type]
    handoff = s._slot
    get = handoff.get

    def slow_get(*args: Any, **kwargs: Any) -> Any:
        # Widen the window between the write's failure and the worker's next
        # take, where the reading thread's hand-off times out.
        if s._error is not None:
            time.sleep(0.3)
        return get(*args, **kwargs)

    monkeypatch.setattr(handoff, "get", slow_get)
    outcome: list[str] = []

    def read() -> None:
        try:
            for i in range(20):
                s.put(batch(i, 1))
            s.close(SCHEMA)
        except StagingLimitExceeded:
            s.abort()
            outcome.append("raised and stopped")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "the stager hung after a failed write"
    assert outcome == ["raised and stopped"]
    assert getattr(s.writer, "aborted", False)  # its writer's open part is let go too


def test_aborting_a_part_writer_closes_its_open_part(tmp_path: Path) -> None:
    # A failing capture aborts its writer: the open part's file is finished
    # and let go at once, not whenever the writer is collected.
    area = StagingArea(tmp_path, Limits())
    writer = PartWriter(area, "src/ds/capture", max_rows=100, max_bytes=2**30)
    writer.write(batch(0, 150))
    first, second = writer.parts
    writer.abort()
    assert part_table(second).num_rows == 50  # its footer is written: the file is closed
    assert part_table(first).num_rows == 100
    writer.abort()  # twice: nothing open, nothing to do
    # The open part counted as it was written, its footer (written by abort) not.
    size = first.stat().st_size
    assert size < area.bytes < size + second.stat().st_size


def test_an_aborted_capture_closes_its_open_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read that fails mid-way aborts its stager: once the worker has
    # stopped, the part it was writing is finished and let go.
    monkeypatch.setattr(stager_module, "GROUP_ROWS", 1000)  # groups reach the worker
    area = StagingArea(tmp_path, Limits())
    writer = PartWriter(area, "src/ds/capture", max_rows=100_000, max_bytes=2**30)
    s = CaptureStager(writer, key=["id"], hash_rows=True)
    for start in range(0, 3000, 500):
        s.put(batch(start, 500))
    s.abort()
    (part,) = writer.parts
    table = part_table(part)  # readable: its footer was written
    assert table.num_rows in (1000, 2000, 3000)  # the groups handed over, whole


def test_parts_use_the_staging_codec(tmp_path: Path) -> None:
    sizes, tables = {}, {}
    for codec in ("none", "lz4", "zstd"):
        area = StagingArea(tmp_path / codec, Limits(compression=codec))
        writer = PartWriter(area, "src/ds/capture", max_rows=100_000, max_bytes=2**30)
        s = CaptureStager(writer, key=["id"], hash_rows=True)
        s.put(batch(0, 1000))
        (part,) = s.close(SCHEMA)
        sizes[codec], tables[codec] = part.stat().st_size, part_table(part)
    # The same rows, in fewer bytes where a codec compresses them.
    assert tables["none"].num_rows == 1000
    assert tables["none"].equals(tables["lz4"]) and tables["none"].equals(tables["zstd"])
    assert sizes["lz4"] < sizes["none"] and sizes["zstd"] < sizes["none"]


def test_staged_parts_read_as_one_stream_of_the_capture_schema(tmp_path: Path) -> None:
    # A part written before a column appeared reads it as null; a narrower
    # type is cast; each stream reads the parts anew (DuckDB scans a view twice).
    area = StagingArea(tmp_path, Limits())
    writer = PartWriter(area, "src/ds/capture", max_rows=2, max_bytes=2**30)
    narrow = pa.schema([("id", pa.int32())])
    writer.write(pa.RecordBatch.from_pydict({"id": [1, 2, 3]}, schema=narrow))
    wide = pa.schema([("id", pa.int64()), ("extra", pa.string())])
    writer.write(pa.RecordBatch.from_pydict({"id": [4], "extra": ["x"]}, schema=wide))
    parts = writer.close()
    assert len(parts) == 3  # two of at most 2 rows, then the widened schema's
    staged = StagedParts(parts, wide)
    assert staged.count_rows() == 4
    import duckdb

    con = duckdb.connect()
    con.register("staged", staged)
    con.execute("CREATE VIEW v AS SELECT * FROM staged")
    for _ in range(2):
        assert con.execute("SELECT id, extra FROM v ORDER BY id").fetchall() == [
            (1, None),
            (2, None),
            (3, None),
            (4, "x"),
        ]
    con.close()


def test_a_handoff_holds_one_item_until_it_is_taken() -> None:
    slot: Handoff[int] = Handoff()
    assert slot.offer(1, timeout=0.01)
    assert not slot.wait_taken(timeout=0.01)  # nobody took it yet
    assert not slot.offer(2, timeout=0.01)  # no room for a second item
    taken: list[int] = []
    consumer = threading.Thread(target=lambda: taken.append(slot.get()))
    consumer.start()
    assert slot.wait_taken(timeout=5)
    consumer.join(5)
    assert taken == [1]
    assert slot.offer(2, timeout=0.01)
    assert slot.get() == 2


# Stages two batches of wide rows in a fresh interpreter and prints how far
# the process's peak RSS rose over it (the rows are built before the peak is
# reset): the stager's hashing, its DuckDB above all, and the part it writes.
_WIDE_PROBE = """
import os, sys, tempfile
from pathlib import Path
import pyarrow as pa
from combined.delivery import PartWriter, StagingArea
from combined.delivery._staging import Limits
from combined.runtime._stage import CaptureStager

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024

if sys.argv[1] == "bytes":  # 5 MB values
    values = [pa.array([os.urandom(5 << 20) for _ in range(3)], pa.binary()) for _ in range(2)]
else:  # lists of 1,000 ints
    values = [pa.array([range(j, j + 1000) for j in range(4000)], pa.list_(pa.int32()))] * 2
batches = [
    pa.record_batch({"id": pa.array(range(i * len(v), (i + 1) * len(v)), pa.int64()), "v": v})
    for i, v in enumerate(values)
]
with tempfile.TemporaryDirectory() as tmp:
    writer = PartWriter(
        StagingArea(Path(tmp), Limits(max_bytes=2**40)), "s/d/capture", 100_000, 2**30
    )
    stager = CaptureStager(writer, key=["id"], hash_rows=True)
    base = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    for b in batches:
        stager.put(b)
    stager.close(batches[0].schema)
    print((status("VmHWM") - base) >> 20)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(("kind", "limit_mb"), [("bytes", 120), ("lists", 160)])
def test_hashing_wide_rows_holds_a_few_rows_texts_not_a_groups(kind: str, limit_mb: int) -> None:
    # DuckDB holds each value's hex or each element's text, for every row of
    # its vector and per thread: the same staging rose 150-260 MB (bytes)
    # and ~265 MB (lists) when a group was hashed at once on two threads.
    out = subprocess.run(
        [sys.executable, "-c", _WIDE_PROBE, kind], capture_output=True, text=True, check=True
    )
    assert int(out.stdout) < limit_mb


def test_wide_rows_hashed_in_slices_get_the_same_digests(tmp_path: Path) -> None:
    values = pa.array([bytes([i]) * (1_000_000 + i) for i in range(12)], pa.binary())
    rows = pa.record_batch({"id": pa.array(range(12), pa.int64()), "v": values})
    s = stager(tmp_path)
    s.put(rows)
    staged = pa.concat_tables([part_table(p) for p in s.close(rows.schema)])
    whole = compute_identity(pa.Table.from_batches([rows]), ["id"], ["id", "v"], digest="binary")
    assert staged.column("_combined_id").to_pylist() == whole[0].to_pylist()
    assert staged.column("_combined_payload_hash").to_pylist() == whole[1].to_pylist()


def test_stagers_of_small_tables_hash_on_one_database_and_a_large_ones_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening a DuckDB database costs ~14 ms of CPU, more than hashing a small
    # table: a capture of 200 small tables opened 200.
    import duckdb

    monkeypatch.setattr(stager_module, "_KEPT", KeptDatabase())
    opened: list[Any] = []
    connect = duckdb.connect

    def counted(*args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        opened.append(kwargs.get("config"))
        return connect(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", counted)
    for n in range(3):
        s = stager(tmp_path / f"small{n}")
        s.put(batch(n * 100, 100))
        (part,) = s.close(SCHEMA)
        row = part_table(part).slice(0, 1).to_pylist()[0]
        assert row["_combined_id"].hex() == identity_python([n * 100], [pa.int64()])
    assert len(opened) == 1 and stager_module._KEPT.held is not None
    monkeypatch.setattr(stager_module, "KEEP_HASHED_BYTES", 1000)  # (a large one, here)
    s = stager(tmp_path / "large")
    s.put(batch(0, 100))
    s.close(SCHEMA)
    assert (
        len(opened) == 1 and stager_module._KEPT.held is None
    )  # (it took the kept one, then closed it)
