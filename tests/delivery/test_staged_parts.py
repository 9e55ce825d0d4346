"""A capture's staged parts, as the stream DuckDB scans."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from combined.delivery import Limits, PartWriter, StagedParts, StagingArea, _parts
from combined.delivery._parts import (
    COPY_BATCH_BYTES,
    ELEMENT_BYTES,
    GATHERED_ROWS,
    SCAN_BATCH_BYTES,
    VECTOR_ROWS,
    _mapped_alone,
    scan_weight,
)


def _staged(
    tmp_path: Path, table: pa.Table, *, rows: int | None = None, joined: bool = False
) -> StagedParts:
    """``table`` staged (in batches of ``rows``), as a scan reads it (``joined``: a join)."""
    writer = PartWriter(StagingArea(tmp_path / "s", Limits()), "s/d/capture", 10**6, 2**40)
    for batch in table.to_batches(rows):
        writer.write(batch)
    return StagedParts(writer.close(), table.schema, joined=joined)


def test_wide_rows_reach_a_scan_in_slices_no_vector_of_which_passes_the_limit(
    tmp_path: Path,
) -> None:
    n = 3000
    table = pa.table({"id": range(n), "v": ["x" * 10_000 + str(i) for i in range(n)]})
    staged = _staged(tmp_path, table)
    batches = list(staged.batches())
    assert len(batches) > 1
    assert all(scan_weight(b) <= SCAN_BATCH_BYTES for b in batches)
    assert pa.Table.from_batches(batches).equals(table)
    assert pa.table(staged).equals(table)  # (the stream DuckDB reads)


def test_narrow_rows_reach_a_scan_in_the_batches_they_were_staged_in(tmp_path: Path) -> None:
    n = 4 * VECTOR_ROWS
    table = pa.table({"id": range(n), "v": [str(i) for i in range(n)]})
    batches = list(_staged(tmp_path, table).batches())
    assert [b.num_rows for b in batches] == [n]


def test_lists_of_many_short_strings_weigh_their_elements(tmp_path: Path) -> None:
    # 2,048 rows of 500 two-character strings are 6 MB to Arrow, three times
    # that in DuckDB's vectors (a string's 16-byte header each).
    n = VECTOR_ROWS
    table = pa.table({"id": range(n), "tags": [[f"{j % 10}{j % 7}" for j in range(500)]] * n})
    (batch,) = table.to_batches()
    assert scan_weight(batch) >= batch.nbytes + ELEMENT_BYTES * 500 * n
    staged = _staged(tmp_path, table)
    batches = list(staged.batches())
    assert all(scan_weight(b) <= SCAN_BATCH_BYTES for b in batches)
    assert pa.Table.from_batches(batches).equals(table)


def test_maps_and_lists_in_structs_weigh_their_entries_and_are_staged_in_slices(
    tmp_path: Path,
) -> None:
    # A map's entries are a list's elements to DuckDB; Arrow flattens no map
    # (a staged part of maps failed its scan with ArrowNotImplementedError).
    n = VECTOR_ROWS
    entries = [(f"k{j}", j) for j in range(500)]
    table = pa.table(
        {"id": range(n), "m": pa.array([entries] * n, pa.map_(pa.string(), pa.int64()))}
    )
    (batch,) = table.to_batches()
    assert scan_weight(batch) >= batch.nbytes + ELEMENT_BYTES * 500 * n
    assert scan_weight(batch.slice(10, 2)) < ELEMENT_BYTES * 500 * 3 + batch.nbytes
    held = pa.RecordBatch.from_pydict({"s": [{"tags": ["x"] * 500}] * 4})  # (a list in a struct)
    assert scan_weight(held) >= held.nbytes + ELEMENT_BYTES * 500 * 4
    batches = list(_staged(tmp_path, table).batches())
    assert len(batches) > 1 and pa.Table.from_batches(batches).equals(table)


def _wide(n: int, width: int) -> pa.Table:
    return pa.table({"id": range(n), "v": [b"x" * width + str(i).encode() for i in range(n)]})


def test_a_joined_scan_of_wide_rows_reads_slices_duckdb_does_not_gather_again(
    tmp_path: Path,
) -> None:
    # 1 MB holds 17 rows of 60 kB; a join gathers chunks of 64 rows or fewer
    # into vectors of up to 2,048, so a joined scan reads more than 64.
    table = _wide(1000, 60_000)
    assert table.nbytes // 1000 * 17 <= SCAN_BATCH_BYTES
    joined = list(_staged(tmp_path / "j", table, joined=True).batches())
    assert len(joined) > 1
    assert all(b.num_rows > GATHERED_ROWS for b in joined)
    assert pa.Table.from_batches(joined).equals(table)
    alone = list(_staged(tmp_path / "a", table).batches())
    assert all(scan_weight(b) <= SCAN_BATCH_BYTES for b in alone)
    assert pa.Table.from_batches(alone).equals(table)


def test_a_joined_scan_reads_batches_staged_too_short_together(tmp_path: Path) -> None:
    # A change stream stages rows of 300 kB some thirteen to a batch (4 MB).
    table = _wide(200, 300_000)
    staged = _staged(tmp_path, table, rows=13, joined=True)
    batches = list(staged.batches())
    assert all(b.num_rows > GATHERED_ROWS for b in batches[:-1])
    assert pa.Table.from_batches(batches).equals(table)
    assert pa.table(staged).equals(table)


def test_a_joined_scan_of_lists_is_cut_by_weight_alone(tmp_path: Path) -> None:
    # DuckDB never gathers chunks holding a list: they are cut as finely as they weigh.
    n = 1000
    table = pa.table({"id": range(n), "tags": [["x" * 2_000] * 30] * n})
    batches = list(_staged(tmp_path, table, joined=True).batches())
    assert all(scan_weight(b) <= SCAN_BATCH_BYTES for b in batches)
    assert min(b.num_rows for b in batches) <= GATHERED_ROWS
    assert pa.Table.from_batches(batches).equals(table)


def test_only_heavy_batches_of_wide_rows_are_read_a_batch_to_a_mapping(tmp_path: Path) -> None:
    # A mapping of its own costs a batch ~0.17 ms: narrow rows' batches share
    # their part's; 4 MB batches of 20 kB rows each leave with their pages.
    narrow = pa.table({"id": range(200_000), "v": [f"v{i}" * 20 for i in range(200_000)]})
    wide = _wide(600, 20_000)
    for table, rows, alone in ((narrow, 65_536, False), (narrow, 4096, False), (wide, 200, True)):
        staged = _staged(tmp_path / f"{rows}-{alone}", table, rows=rows)
        (part,) = staged.paths
        assert _mapped_alone(part) is alone
        assert pa.Table.from_batches(list(staged.batches())).equals(table)


def test_a_window_reads_only_its_ordinals_and_marks(tmp_path: Path) -> None:
    n = 1000
    marks = [["v"] if i % 3 == 0 else ([] if i % 3 == 1 else None) for i in range(n)]
    table = pa.table(
        {
            "_combined_ordinal": pa.array(range(n), pa.int64()),
            "v": [f"value {i}" for i in range(n)],
            "_combined_unchanged": pa.array(marks, pa.list_(pa.string())),
        }
    )
    staged = _staged(tmp_path, table, rows=64)
    window = staged.within((100, 299))
    ords = pa.table(window).column("_combined_ordinal").to_pylist()
    assert ords == list(range(100, 300))
    assert window.count_rows() == 200 and staged.count_rows() == n
    marked = pa.table(staged.within((100, 299), marked=True)).column("_combined_ordinal")
    assert marked.to_pylist() == [i for i in range(100, 300) if i % 3 == 0]
    plain = pa.table(staged.within((100, 299), marked=False)).column("_combined_ordinal")
    assert plain.to_pylist() == [i for i in range(100, 300) if i % 3 != 0]
    assert staged.within((n, 2 * n)).count_rows() == 0
    assert pa.table(staged).equals(table)  # (the parts themselves, whole)


def test_a_part_staged_before_any_mark_holds_unmarked_rows_only(tmp_path: Path) -> None:
    # A part written before the stream's first marked change has no
    # _combined_unchanged column: its rows read as unmarked, as the scan's
    # schema gives them a null list (MariaDB's binlog fills failed on it).
    n = 300
    early = pa.table({"_combined_ordinal": pa.array(range(n), pa.int64()), "v": range(n)})
    writer = PartWriter(StagingArea(tmp_path / "s", Limits()), "s/d/capture", 10**6, 2**40)
    writer.write(early.to_batches()[0])
    schema = early.schema.append(pa.field("_combined_unchanged", pa.list_(pa.string())))
    staged = StagedParts(writer.close(), schema)
    plain = pa.table(staged.within((10, 19), marked=False))
    assert plain.column("v").to_pylist() == list(range(10, 20))
    assert plain.column("_combined_unchanged").null_count == 10
    assert staged.within((10, 19), marked=True).count_rows() == 0


def _mapped_kb(path: Path) -> int:
    """Resident kB of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and not head[0].endswith(":"):  # a mapping's first line
            inside = head[-1] == str(path)
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
def test_a_scan_of_a_heavy_batch_of_wide_rows_holds_a_few_megabytes_of_its_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A change stream of 300 mostly-null columns staged 31,000 rows (61 MB)
    # a batch; a scan read it in 4 MB slices of one mapping, which held every
    # page read by its last (~96 MB of a 50,000-row backlog's peak).
    n = 30_000
    null = np.arange(n) % 20 != 0
    columns = {"id": pa.array(range(n), pa.int64())}
    for i in range(150):
        columns[f"i{i}"] = pa.array(np.arange(n) * i, pa.int64(), mask=null)
        columns[f"s{i}"] = pa.array([f"v{i}-{j}" for j in range(n)], pa.string(), mask=null)
    table = pa.table(columns)
    assert table.nbytes > 40 << 20
    writer = PartWriter(StagingArea(tmp_path / "s", Limits()), "s/d/capture", 10**6, 2**40)
    writer.write(table.to_batches()[0])
    (part,) = writer.close()
    staged = StagedParts([part], table.schema, budget=COPY_BATCH_BYTES, joined=True)
    weighed: list[int] = []  # (the part's pages at each batch its heaviest row weighs)

    def weighing(batch: pa.RecordBatch) -> int:
        weighed.append(_mapped_kb(part))
        return scan_weight(batch)

    with monkeypatch.context() as m:
        m.setattr(_parts, "scan_weight", weighing)
        assert staged.heaviest_row() > 0
    assert max(weighed) < 8 << 10, f"{max(weighed) >> 10} MB of the part resident, weighed"
    held, copies = 0, []
    for batch in staged.batches():
        copies.append(batch.serialize())  # (every page of its values read, as a scan copies)
        held = max(held, _mapped_kb(part))
    assert held > 0
    assert held < 16 << 10, f"{held >> 10} MB of the part resident during its scan"
    read = [pa.ipc.read_record_batch(c, table.schema) for c in copies]
    assert pa.Table.from_batches(read).equals(table)
