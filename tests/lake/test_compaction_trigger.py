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
from combined.lake import LakeLayout
from combined.lake._maintain import SMALL_FILE_BYTES, file_count, small_file_count
from combined.runtime._compaction import compact_if_due

SCHEMA = pa.schema([("n", pa.int64()), ("blob", pa.binary())])


def _append(layout: LakeLayout, nbytes: int, *, create: bool = False) -> None:
    """One commit of one data file holding about ``nbytes`` of incompressible bytes."""
    table = layout.dataset_table("s", "d")
    rows = pa.record_batch([pa.array([1], pa.int64()), pa.array([os.urandom(nbytes)])], SCHEMA)
    table.append_batches(SCHEMA, iter([rows]), create=create, metadata={})


def test_large_files_never_trigger_a_captures_compaction_and_small_ones_do(
    tmp_path: Path,
) -> None:
    layout = LakeLayout(tmp_path / "lake")
    catalog = Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}")
    table = layout.dataset_table("s", "d")
    _append(layout, SMALL_FILE_BYTES + 200_000, create=True)
    for _ in range(3):
        _append(layout, SMALL_FILE_BYTES + 200_000)
    assert (file_count(table), small_file_count(table)) == (4, 0)
    compact_if_due(catalog, layout, "s", "d", "r1", threshold=2)
    assert file_count(table) == 4  # four large files: nothing to gain, nothing rewritten
    for _ in range(3):
        _append(layout, 10)
    assert (file_count(table), small_file_count(table)) == (7, 3)
    compact_if_due(catalog, layout, "s", "d", "r2", threshold=2)
    assert file_count(table) < 7  # three small files, past the threshold: compacted
