"""A capture's own compaction counts small files only: large Deliveries never trigger it.

Before, the trigger counted every data file: a snapshot of a few million
rows (dozens of Deliveries of several MB) was compacted in its own capture,
its whole table rewritten, and its peak memory went from ~330 to ~820 MB
(``make bench``, case 8 at 4M rows), for readers that 47 files of 5 MB do not
slow down.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.config._retention import DEFAULT_COMPACT_FILES
from combined.lake import LakeLayout
from combined.lake._ledger import Ledger
from combined.lake._maintain import SMALL_FILE_BYTES, file_count, small_file_count
from combined.runtime._compaction import compact_if_due, compact_ledger_if_due

SCHEMA = pa.schema([("n", pa.int64()), ("blob", pa.binary())])


def _append(layout: LakeLayout, *sizes: int) -> None:
    """A commit a size: one data file holding about that many incompressible bytes."""
    table = layout.dataset_table("s", "d")
    for nbytes in sizes:
        rows = pa.record_batch([pa.array([1], pa.int64()), pa.array([os.urandom(nbytes)])], SCHEMA)
        table.append_batches(SCHEMA, iter([rows]), create=not table.exists(), metadata={})


def _lake(tmp_path: Path) -> tuple[LakeLayout, Catalog]:
    return LakeLayout(tmp_path / "lake"), Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}")


def test_large_files_never_trigger_a_captures_compaction_and_small_ones_do(
    tmp_path: Path,
) -> None:
    layout, catalog = _lake(tmp_path)
    table = layout.dataset_table("s", "d")
    _append(layout, *[SMALL_FILE_BYTES + 200_000] * 4)
    assert (file_count(table), small_file_count(table)) == (4, 0)
    compact_if_due(catalog, layout, "s", "d", "r1", threshold=2)
    assert file_count(table) == 4  # four large files: nothing to gain, nothing rewritten
    _append(layout, 10, 10, 10)
    assert (file_count(table), small_file_count(table)) == (7, 3)
    compact_if_due(catalog, layout, "s", "d", "r2", threshold=2)
    assert file_count(table) < 7  # three small files, past the threshold: compacted


def test_a_captures_compaction_merges_the_small_files_and_never_rewrites_the_table(
    tmp_path: Path,
) -> None:
    # Before, its target was the table's (100 MB): every file under it was
    # binned, and 33 small CDC commits rewrote a whole table of 7 MB files.
    layout, catalog = _lake(tmp_path)
    table = layout.dataset_table("s", "d")
    _append(layout, *[3 * SMALL_FILE_BYTES] * 3)
    large = set(table.files())
    _append(layout, *[1_000] * 4)
    compact_if_due(catalog, layout, "s", "d", "r1", threshold=2)
    assert large <= set(table.files())  # the three large files stay as they were
    assert (file_count(table), small_file_count(table)) == (4, 1)
    with catalog.begin() as conn:
        (event,) = cat.activity(conn, kind="maintenance.compacted")
    assert event.body["table"] == "data" and event.body["files_removed"] == 4


def test_a_captures_compaction_keeps_the_ledger_in_few_files_and_every_record(
    tmp_path: Path,
) -> None:
    # A Run and a publication record each capture, a file each: never compacted before.
    layout, catalog = _lake(tmp_path)
    ledger = Ledger(layout)
    for n in range(DEFAULT_COMPACT_FILES + 2):
        ledger.run({"run": {"id": f"r{n}"}, "state": "succeeded"})
    runs = ledger.table("runs")
    assert small_file_count(runs) == DEFAULT_COMPACT_FILES + 2
    compact_ledger_if_due(catalog, layout, "r-last")
    assert file_count(runs) == 1
    assert sorted(r["id"] for r in ledger.runs()) == sorted(
        f"r{n}" for n in range(DEFAULT_COMPACT_FILES + 2)
    )
    with catalog.begin() as conn:
        (event,) = cat.activity(conn, kind="maintenance.compacted")
    assert event.body["table"] == "ledger runs" and event.source is None
