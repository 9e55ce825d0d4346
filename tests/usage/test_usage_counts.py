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


def test_a_first_keyed_transition_bills_like_the_general_path(tmp_path: Path) -> None:
    lake = LakeLayout(tmp_path / "lake")
    ids = [f"id{i}" for i in range(1000)]
    ops = ["insert" if i % 3 else "update" for i in range(1000)]
    keyed = _changes(tmp_path / "1.parquet", ids, ops)
    fast = record_usage(lake, "s", "fast", keyed, month="2026-11", unique=True)["2026-11"]
    general = record_usage(lake, "s", "general", keyed, month="2026-11")["2026-11"]
    assert fast == general == {"mar": 1000, "inserts": 666, "updates": 334, "deletes": 0}
    assert fast == month_counts(lake, "s", "fast", "2026-11")
    # once the identities are known, the same transition again bills nothing
    version = LakeTable(lake.usage("s", "fast"), "x").version()
    again = record_usage(lake, "s", "fast", keyed, month="2026-11", unique=True)["2026-11"]
    assert again == fast
    assert LakeTable(lake.usage("s", "fast"), "x").version() == version


def test_an_event_stream_repeating_an_identity_is_billed_once(tmp_path: Path) -> None:
    lake = LakeLayout(tmp_path / "lake")
    events = _changes(tmp_path / "e.parquet", ["a", "a", "a", "b"], ["insert"] * 3 + ["delete"])
    got = record_usage(lake, "s", "d", events, month="2026-11")["2026-11"]
    assert got == {"mar": 2, "inserts": 1, "updates": 0, "deletes": 1}
    assert got == month_counts(lake, "s", "d", "2026-11")
