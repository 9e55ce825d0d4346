"""A capture's staged parts, as the stream DuckDB scans."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from combined.delivery import Limits, PartWriter, StagedParts, StagingArea
from combined.delivery._staging import ELEMENT_BYTES, SCAN_BATCH_BYTES, VECTOR_ROWS, scan_weight


def _staged(tmp_path: Path, table: pa.Table) -> StagedParts:
    writer = PartWriter(StagingArea(tmp_path / "s", Limits()), "s/d/capture", 10**6, 2**40)
    for batch in table.to_batches():
        writer.write(batch)
    return StagedParts(writer.close(), table.schema)


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
