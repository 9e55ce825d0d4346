"""Two catalogs billing one dataset of a shared lake at once never bill an identity twice.

Within one project a dataset's lease keeps its billing to one process at a
time. Two projects (two catalogs) pointing at the same lake prefix have no
lease in common: both project the same lake commit (each catches its catalog
up with the lake), or each its own commit, and both append to the dataset's
MAR table. Before, each computed what was new from the version it read and
then appended on the table's newest version: the identities the other had
just billed were billed again, and the counts carried in the later commit,
computed from the older version, dropped what the other had added.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined import usage
from combined.lake import LakeLayout, LakeTable
from combined.usage import month_counts, record_usage

MONTH = "2026-11"


def _changes(lake: LakeLayout, name: str, ids: list[str], ops: list[str]) -> str:
    """A change list in the lake (where a projection bills its Deliveries from)."""
    location = lake.store.join("changes", name)
    rows = pa.table({"_combined_id": ids, "op": ops})
    pq.write_table(rows, lake.store.path(location), filesystem=lake.store.fs)
    return location


def _billed_rows(lake: LakeLayout) -> list[tuple[str, str]]:
    table = LakeTable(lake.usage("s", "d"), "x", lake.store)
    rows = pa.concat_tables(lake.store.read_table(f) for f in table.files()).to_pylist()
    return sorted((r["_combined_id"], r["op"]) for r in rows)


def _billed_while_the_other_bills(
    monkeypatch: pytest.MonkeyPatch, lake: LakeLayout, mine: str, theirs: str
) -> dict[str, int]:
    """Bill ``mine`` after an ``a`` insert; the other catalog bills ``theirs`` meanwhile.

    The other one bills once this one has read the MAR table, before it commits.
    """
    record_usage(lake, "s", "d", _changes(lake, "0.parquet", ["a"], ["insert"]), month=MONTH)
    counted = usage._count_added
    raced = False

    def count_as_the_other_catalog_bills(con: Any, new: str, existing: str) -> Any:
        nonlocal raced
        row = counted(con, new, existing)
        if not raced:
            raced = True
            record_usage(LakeLayout(lake.root), "s", "d", theirs, month=MONTH)
        return row

    monkeypatch.setattr(usage, "_count_added", count_as_the_other_catalog_bills)
    return record_usage(lake, "s", "d", mine, month=MONTH)[MONTH]


@pytest.mark.parametrize("lake_url", ["s3"], indirect=True)
def test_the_same_commit_billed_by_two_catalogs_at_once_is_billed_once(
    lake_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = LakeLayout(lake_url)
    change = _changes(lake, "1.parquet", ["b", "c"], ["insert", "update"])
    got = _billed_while_the_other_bills(monkeypatch, lake, change, change)
    assert _billed_rows(lake) == [("a", "insert"), ("b", "insert"), ("c", "update")]
    assert got == {"mar": 3, "inserts": 2, "updates": 1, "deletes": 0}
    assert month_counts(lake, "s", "d", MONTH) == got


@pytest.mark.parametrize("lake_url", ["s3"], indirect=True)
def test_two_commits_billed_by_two_catalogs_at_once_both_count(
    lake_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = LakeLayout(lake_url)
    mine = _changes(lake, "1.parquet", ["b", "c"], ["insert", "insert"])
    theirs = _changes(lake, "2.parquet", ["c", "d"], ["insert", "delete"])
    got = _billed_while_the_other_bills(monkeypatch, lake, mine, theirs)
    billed = [("a", "insert"), ("b", "insert"), ("c", "insert"), ("d", "delete")]
    assert _billed_rows(lake) == billed
    assert got == {"mar": 4, "inserts": 3, "updates": 0, "deletes": 1}
    # what the next billing starts from: the counts carried by the newest usage commit
    after = _changes(lake, "3.parquet", ["a"], ["insert"])
    assert record_usage(lake, "s", "d", after, month=MONTH)[MONTH] == got
    assert month_counts(lake, "s", "d", MONTH) == got


@pytest.mark.parametrize("lake_url", ["s3"], indirect=True)
def test_a_first_commit_billed_by_two_catalogs_at_once_is_billed_once(
    lake_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = LakeLayout(lake_url)
    change = _changes(lake, "1.parquet", ["a", "b"], ["insert", "insert"])
    first = usage._first_usage
    raced = False

    def first_as_the_other_catalog_bills(*args: Any) -> Any:
        nonlocal raced
        if not raced:  # this one found no usage table; the other creates it first
            raced = True
            record_usage(LakeLayout(lake.root), "s", "d", change, month=MONTH, unique=True)
        return first(*args)

    monkeypatch.setattr(usage, "_first_usage", first_as_the_other_catalog_bills)
    got = record_usage(lake, "s", "d", change, month=MONTH, unique=True)[MONTH]
    assert _billed_rows(lake) == [("a", "insert"), ("b", "insert")]
    assert got == {"mar": 2, "inserts": 2, "updates": 0, "deletes": 0}
    assert month_counts(lake, "s", "d", MONTH) == got
