"""The rows' fold (``runtime._fold``): every changed value moves it, row order does not.

Each type is folded through a real DuckDB: a value changed in one row, by as
little as the type holds (a nanosecond, the last digit of a 256-bit decimal,
one byte), must give another fold. Row order must not; a repeated row must.
"""

from __future__ import annotations

import datetime as dt
import decimal
import time
import uuid
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from combined.runtime._fold import Fold, expected_fold, fold_encoding, kept_fold

NS = 1_700_000_000_123_456_789
#: (type, the first row's value, the value it changes to); the other rows stay.
CHANGES: list[tuple[pa.DataType, Any, Any]] = [
    (pa.int64(), 1, 2),
    (pa.uint64(), 2**64 - 1, 2**64 - 2),
    (pa.int8(), 0, None),
    (pa.bool_(), True, False),
    (pa.float64(), 0.1, 0.1 + 2**-55),
    (pa.float32(), 1.5, 1.25),
    (pa.float16(), 1.5, 1.25),
    (pa.string(), "a", "b"),
    # DuckDB's hash of a text or bytes mixes its bytes 7 and 15 (of each 8) into 8
    # bits: these two change both and hash alike (one such change in 256 does).
    (pa.string(), "ACCOUNT -000001 ", "ACCOUNT~-000001."),
    (pa.binary(), b"aaaaaaa\x00aaaaaaa\x00", b"aaaaaaa\xffaaaaaaa\xd1"),
    (pa.binary(16), b"aaaaaaa\x00aaaaaaa\x00", b"aaaaaaa\xffaaaaaaa\xd1"),
    (pa.list_(pa.string()), ["ACCOUNT -000001 "], ["ACCOUNT~-000001."]),
    (pa.string(), "", None),
    (pa.large_string(), "x" * 100, "x" * 99 + "y"),
    (pa.binary(), b"\x00", b"\x00\x00"),
    (pa.binary(2), b"ab", b"ac"),
    (pa.date32(), dt.date(2026, 1, 1), dt.date(2026, 1, 2)),
    (pa.date64(), 86_400_000, 86_400_001),
    (pa.timestamp("us", tz="UTC"), 1, 2),
    (pa.timestamp("ns", tz="UTC"), NS, NS + 1),
    (pa.timestamp("ns"), NS, NS + 1),
    (pa.time64("ns"), 1, 2),
    (pa.duration("ns"), 1, 2),
    (pa.decimal128(38, 10), decimal.Decimal("1.0000000001"), decimal.Decimal("1.0000000002")),
    # DuckDB hashes a 128-bit integer (a decimal of 19 to 38 digits) as its two halves' hashes
    # xor-ed: -1 (both halves all ones) hashes as 0, x as x * 2**64.
    (pa.decimal128(38, 2), decimal.Decimal("0.00"), decimal.Decimal("-0.01")),
    (pa.decimal128(20, 0), decimal.Decimal(5), decimal.Decimal(5 * 2**64)),
    (pa.list_(pa.decimal128(30, 0)), [decimal.Decimal(0)], [decimal.Decimal(-1)]),
    # Hashed as a 64-bit decimal while it fits 18 digits at its scale, else as its text:
    # across the bound, on either side of it, and at a scale too large for 18 digits.
    (pa.decimal128(38, 2), decimal.Decimal("9" * 16 + ".99"), decimal.Decimal("1" + "0" * 16)),
    (pa.decimal128(38, 2), decimal.Decimal("-" + "9" * 16 + ".99"), decimal.Decimal("-1e16")),
    (pa.decimal128(38, 2), decimal.Decimal("1e20"), decimal.Decimal("100000000000000000000.01")),
    (pa.decimal128(38, 2), decimal.Decimal(-1), decimal.Decimal(1)),
    (pa.decimal128(38, 20), decimal.Decimal("0.1"), decimal.Decimal("0.1" + "0" * 18 + "1")),
    (pa.decimal128(19, 18), decimal.Decimal("0.5"), decimal.Decimal("-0.5")),
    (pa.list_(pa.decimal128(38, 2)), [decimal.Decimal(1), None], [None, decimal.Decimal(1)]),
    (pa.list_(pa.decimal128(38, 2)), [decimal.Decimal("1e20")], [decimal.Decimal("1e20") + 1]),
    (pa.decimal256(60, 2), decimal.Decimal("9" * 57 + ".99"), decimal.Decimal("9" * 57 + ".98")),
    (pa.list_(pa.string()), ["a", None], [None, "a"]),
    (pa.list_(pa.int64()), [1], [1, 1]),
    (pa.list_(pa.int64()), [], None),
    (pa.list_(pa.int64()), [], [None]),
    (pa.large_list(pa.string()), [None], None),
    (pa.list_(pa.string()), ["ab", "c"], ["a", "bc"]),
    (pa.list_(pa.int64(), 2), [1, None], None),
    (pa.uuid(), uuid.UUID(int=1).bytes, uuid.UUID(int=2).bytes),
    # (a UUID too: its halves xor-ed, the first with its top bit flipped; both hash as 0)
    (pa.uuid(), uuid.UUID(int=2**127).bytes, uuid.UUID(int=2**127 + 2**64 + 1).bytes),
    (pa.json_(), '{"a": 1}', '{"a":1}'),
    (pa.dictionary(pa.int32(), pa.string()), "a", "b"),
]


def _fold(*tables: pa.Table) -> Fold:
    fold = Fold()
    con = duckdb.connect()
    for table in tables:
        fold.add(con, table)
    con.close()
    return fold


def _table(t: pa.DataType, first: Any, others: list[Any] | None = None) -> pa.Table:
    values = [first] + ([None] if others is None else others)
    return pa.table(
        {
            "id": pa.array(range(len(values)), pa.int64()),
            "v": pa.array(values, t),
            "_combined_ordinal": pa.array(range(len(values)), pa.int64()),
        }
    )


@pytest.mark.parametrize(("t", "before", "after"), CHANGES, ids=lambda x: str(x)[:30])
def test_a_changed_value_moves_the_fold(t: pa.DataType, before: Any, after: Any) -> None:
    old, new = _fold(_table(t, before)), _fold(_table(t, after))
    assert old.record("m") is not None, f"{t} is not folded"
    assert not new.matches(old.record("m") or {})
    assert _fold(_table(t, before)).matches(old.record("m") or {})


def test_row_order_and_batches_do_not_move_the_fold_but_a_repeat_does() -> None:
    rows = pa.table({"id": [1, 2, 3], "name": ["a", "b", None]})
    whole = _fold(rows).record("m")
    assert whole is not None
    assert _fold(rows.take([2, 0, 1])).matches(whole)
    assert _fold(rows.slice(0, 1), rows.slice(1)).matches(whole)
    assert not _fold(pa.concat_tables([rows, rows.slice(0, 1)])).matches(whole)
    # Values moved between columns of one type are another row.
    swapped = pa.table({"id": [1, 2, 3], "name": ["a", "b", None], "other": ["b", "a", None]})
    assert not _fold(swapped.select(["id", "other"]).rename_columns(["id", "name"])).matches(whole)


def test_rows_of_long_lists_are_folded_in_slices_to_the_same_fold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 300 rows of a list of 5,000 strings weigh ~28 MB as DuckDB holds them:
    # folded whole, a vector of them held ~100 MB; in slices, the same sums.
    long = [str(j) for j in range(5000)]
    rows = pa.table({"id": range(300), "tags": [long[: 4000 + i] for i in range(300)]})
    sliced = _fold(rows)
    registered: list[int] = []
    real = duckdb.DuckDBPyConnection.register

    def counted(con: duckdb.DuckDBPyConnection, name: str, data: Any) -> Any:
        registered.append(data.num_rows)
        return real(con, name, data)

    monkeypatch.setattr(duckdb.DuckDBPyConnection, "register", counted)
    assert _fold(rows).matches(sliced.record("m") or {})
    assert len(registered) > 1 and sum(registered) == 300
    monkeypatch.setattr("combined.runtime._fold.SLICE_BYTES", 1 << 40)
    registered.clear()
    assert _fold(rows).matches(sliced.record("m") or {})
    assert registered == [300]


def test_a_column_added_renamed_or_retyped_is_another_fold() -> None:
    rows = pa.table({"id": [1, 2], "n": pa.array([1, 2], pa.int32())})
    whole = _fold(rows).record("m")
    assert whole is not None
    assert not _fold(rows.append_column("x", pa.nulls(2, pa.int64()))).matches(whole)
    assert not _fold(rows.rename_columns(["id", "m"])).matches(whole)
    assert not _fold(rows.cast(pa.schema([("id", pa.int64()), ("n", pa.int64())]))).matches(whole)
    # A later batch with other columns (a column added mid-read): no fold at all.
    assert _fold(rows, rows.append_column("x", pa.nulls(2))).record("m") is None


@pytest.mark.parametrize(
    "column",
    [
        # (DuckDB scans a duration as an INTERVAL of microseconds)
        pa.array([[1]], pa.list_(pa.duration("ns"))),
        # DuckDB hashes [[1], [2]] as [[1, 2]], a null struct as {a: null}:
        pa.array([[[1], [2]]], pa.list_(pa.list_(pa.int64()))),
        pa.array([{"a": None}], pa.struct([("a", pa.int64())])),
        pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
    ],
    ids=["list of durations", "list of lists", "struct", "map"],
)
def test_a_column_duckdb_cannot_hash_apart_is_not_folded(column: pa.Array) -> None:
    assert _fold(pa.table({"id": [1], "v": column})).record("m") is None


def test_a_column_duckdb_cannot_scan_exactly_is_not_folded() -> None:
    union = pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1])])
    assert _fold(pa.table({"id": [1], "u": union})).record("m") is None


def test_a_recorded_fold_applies_to_the_version_and_marker_it_was_taken_at() -> None:
    recorded = _fold(pa.table({"id": [1]})).record("pg1:x")
    assert recorded is not None and recorded["encoding"] == fold_encoding()
    last = {"capture_fold": recorded, "lake_version": 3}

    def kept(version: int) -> bool:
        return version == 3

    assert expected_fold(last, "pg1:x", kept) == recorded
    assert expected_fold(last, "pg1:x", lambda v: False) is None  # another commit since
    assert expected_fold(last, "pg1:y", kept) is None  # the source wrote since
    assert expected_fold(last, None, kept) is None  # the source gives no marker
    other = {**recorded, "encoding": "duckdb-hash-sum2/0.0.1"}
    assert expected_fold({**last, "capture_fold": other}, "pg1:x", kept) is None


def test_a_kept_fold_applies_after_the_commit_and_at_the_version_it_was_read_at() -> None:
    """The fold of a capture that changed nothing stands for the table at the version it read."""
    committed = _fold(pa.table({"id": [1]})).record("pg1:x")
    unchanged = _fold(pa.table({"id": [1]})).record("pg1:y")  # (the marker moved, no row)
    last = {"capture_fold": committed, "lake_version": 3, "run_id": "r1"}
    kept = kept_fold(unchanged, last, 5)  # (read at 5: a compaction after 3)
    assert kept is not None and kept["read"] == {"after_run": "r1", "lake_version": 5}

    def since(version: int) -> bool:
        return version >= 5

    assert expected_fold(last, "pg1:y", since, kept) == kept
    assert expected_fold(last, "pg1:x", since, kept) is None  # (the commit's: 3 is not kept)
    assert expected_fold(last, "pg1:y", lambda v: False, kept) is None  # a commit since 5
    assert expected_fold(last, "pg1:z", since, kept) is None  # the source wrote since
    # Folded after another commit (another Run's, or another table's of the same name).
    assert expected_fold({**last, "run_id": "r2"}, "pg1:y", since, kept) is None
    assert kept_fold(None, last, 5) is None and kept_fold(unchanged, None, 5) is None


def test_a_wide_decimal_that_fits_18_digits_folds_as_cheaply_as_a_narrow_one() -> None:
    """A decimal(38,2) whose values fit 18 digits folds at under 3x a decimal(18,2).

    Folded as its text, each value of a 19-38-digit decimal cost ~0.2 us (the
    printing of a 128-bit decimal: 0.44 CPU-s for 2M values, 18x the 64-bit
    column; bench shape ``numeric38``'s unchanged re-capture spent half its
    CPU there). Now such a value is hashed as the 64-bit decimal it fits.
    One DuckDB thread, CPU time, the best of three.
    """
    values = pc.multiply(pa.array(range(2_000_000), pa.int64()), 7919)
    con = duckdb.connect()
    con.execute("SET threads = 1")

    def cpu(t: pa.DataType) -> float:
        table = pa.table({"v": values.cast(pa.decimal128(19, 0)).cast(t)})
        best = float("inf")
        for _ in range(3):
            before = time.process_time()
            Fold().add(con, table)
            best = min(best, time.process_time() - before)
        return best

    narrow, wide = cpu(pa.decimal128(18, 2)), cpu(pa.decimal128(38, 2))
    assert wide < 3 * narrow + 0.02, f"decimal(38,2) {wide:.3f} s, decimal(18,2) {narrow:.3f} s"
