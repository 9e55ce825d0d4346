"""MAR counts carried in the usage commits agree with a recount and never double."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from combined.lake import LakeLayout, LakeTable
from combined.usage import month_counts, record_usage


def _changes(path: Path, ids: list[str], ops: list[str]) -> Path:
    pq.write_table(pa.table({"_combined_id": ids, "op": ops}), str(path))
    return path


def test_counts_travel_with_the_rows_and_match_a_recount(tmp_path: Path) -> None:
    lake = LakeLayout(tmp_path / "lake")
    first = _changes(tmp_path / "1.parquet", ["a", "b"], ["insert", "insert"])
    second = _changes(tmp_path / "2.parquet", ["a", "c", "b"], ["update", "insert", "delete"])
    assert record_usage(lake, "s", "d", first, month="2026-11")["2026-11"]["mar"] == 2
    got = record_usage(lake, "s", "d", second, month="2026-11")["2026-11"]
    assert got == {"mar": 3, "inserts": 3, "updates": 1, "deletes": 1}
    assert got == month_counts(lake, "s", "d", "2026-11")
    # the same transition again (a retried projection) adds nothing and writes nothing
    version = LakeTable(lake.usage("s", "d"), "x").version()
    assert record_usage(lake, "s", "d", second, month="2026-11")["2026-11"] == got
    assert LakeTable(lake.usage("s", "d"), "x").version() == version
    # a new month starts from zero
    december = record_usage(lake, "s", "d", first, month="2026-12")["2026-12"]
    assert december == {"mar": 2, "inserts": 2, "updates": 0, "deletes": 0}
    assert month_counts(lake, "s", "d", "2026-11") == got
