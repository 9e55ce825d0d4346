"""Unusual file shapes read directly: real files, real DuckDB, no engine.

Each test here once lost or changed a value without an error.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from combined.connectors.abc import ReadRequest
from combined.connectors.files import FilesSource
from combined.errors import SchemaMismatch, SourceError
from combined.protocol import RecordBatchMessage

#: Past DuckDB's default sample of 20,480 rows.
_PAST_SAMPLE = 30_000


def _rows(
    root: Path,
    relation: str,
    columns: tuple[str, ...] | None = None,
    file_sets: dict[str, object] | None = None,
) -> pa.Table:
    source = FilesSource({"path": str(root), **({"files": file_sets} if file_sets else {})})
    request = ReadRequest(
        dataset="d", relation=relation, key=("id",), strategy="snapshot", columns=columns
    )
    extraction = source.read(request)
    try:
        batches = [m.batch for m in extraction if isinstance(m, RecordBatchMessage)]
    finally:
        extraction.finish("abort")
    return pa.Table.from_batches(batches)


def test_a_json_key_first_seen_past_the_sample_is_read(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "v": i}) for i in range(_PAST_SAMPLE)]
    lines.append(json.dumps({"id": _PAST_SAMPLE, "v": 0, "late": "kept"}))
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a.jsonl").write_text("\n".join(lines) + "\n")
    table = _rows(tmp_path, "events/*.jsonl")
    assert "late" in table.column_names
    assert table.column("late").drop_null().to_pylist() == ["kept"]


def test_a_csv_value_past_the_sample_is_not_cast_to_the_sampled_type(tmp_path: Path) -> None:
    body = "".join(f"{i},{10_000 + i}\n" for i in range(_PAST_SAMPLE))
    (tmp_path / "zips").mkdir()
    (tmp_path / "zips" / "a.csv").write_text("id,zip\n" + body + f"{_PAST_SAMPLE},01234\n")
    table = _rows(tmp_path, "zips/*.csv")
    last = table.filter(pc.equal(table.column("id"), _PAST_SAMPLE)).to_pylist()
    assert [str(r["zip"]) for r in last] == ["01234"]


def test_a_parquet_decimal_past_38_digits_is_refused_not_read_as_a_double(
    tmp_path: Path,
) -> None:
    wide = Decimal("1" * 60 + ".5")
    table = pa.table(
        {
            "id": [1],
            "amount": pa.array([wide], pa.decimal256(76, 1)),
            "nested": pa.array([{"x": wide}], pa.struct([("x", pa.decimal256(70, 1))])),
        }
    )
    (tmp_path / "ledger").mkdir()
    pq.write_table(table, tmp_path / "ledger" / "a.parquet")
    with pytest.raises(SchemaMismatch) as info:
        _rows(tmp_path, "ledger/*.parquet")
    assert info.value.context == {
        "relation": "ledger/*.parquet",
        "file": "ledger/a.parquet",
        "column": "amount",
    }
    assert "decimal(38, s)" in (info.value.hint or "")
    with pytest.raises(SchemaMismatch, match="'nested'"):
        _rows(tmp_path, "ledger/*.parquet", columns=("id", "nested"))
    # A read that leaves the wide columns out reads the rest.
    assert _rows(tmp_path, "ledger/*.parquet", columns=("id",)).to_pylist() == [{"id": 1}]


def test_an_empty_csv_or_json_file_holds_no_row_and_adds_no_column(tmp_path: Path) -> None:
    for ext, body in (("csv", "id,name\n1,a\n"), ("jsonl", '{"id": 1, "name": "a"}\n')):
        (tmp_path / ext).mkdir()
        (tmp_path / ext / f"a.{ext}").write_text(body)
        (tmp_path / ext / f"b.{ext}").write_text("")  # an export of an hour without rows
        assert _rows(tmp_path, f"{ext}/*.{ext}").to_pylist() == [{"id": 1, "name": "a"}]


def test_only_empty_files_are_refused_like_no_file(tmp_path: Path) -> None:
    (tmp_path / "orders").mkdir()
    (tmp_path / "orders" / "a.csv").write_text("")
    with pytest.raises(SourceError, match="only 1 empty files") as info:
        _rows(tmp_path, "orders/*.csv")
    assert "allow_empty" in (info.value.hint or "")


def test_a_truncated_gzip_file_is_named_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "orders").mkdir()
    whole = gzip.compress(b"".join(b"%d,x\n" % i for i in range(5_000)))
    (tmp_path / "orders" / "a.csv.gz").write_bytes(gzip.compress(b"id,name\n1,a\n"))
    (tmp_path / "orders" / "b.csv.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SchemaMismatch) as info:
        _rows(tmp_path, "orders/*.csv.gz")
    assert info.value.context.get("file") == "orders/b.csv.gz"
    assert "rename" in (info.value.hint or "")


_HUGE = 12345678901234567890123  # past 64 bits: DuckDB read it as 1.2345678901234568e+22


def test_json_integers_past_64_bits_are_read_exactly(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        f'{{"id": 1, "n": {_HUGE}, "f": 0.5}}\n{{"id": 2, "n": -9223372036854775809, "f": 2}}\n'
    )
    table = _rows(tmp_path, "*.jsonl")
    assert table.schema.field("n").type == pa.decimal128(38, 0)
    assert table.column("n").to_pylist() == [Decimal(_HUGE), Decimal(-9223372036854775809)]
    # Fractions and integers a double keeps exactly stay doubles.
    assert table.schema.field("f").type == pa.float64()


def test_json_integers_a_double_would_round_beside_fractions_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1, "n": 9007199254740993}\n{"id": 2, "n": 1.5}\n')
    with pytest.raises(SchemaMismatch, match="'n' .* holds integers beyond 2\\*\\*53 beside"):
        _rows(tmp_path, "*.jsonl")
    (tmp_path / "a.jsonl").write_text(f'{{"id": 1, "n": {_HUGE}{_HUGE}}}\n')
    with pytest.raises(SchemaMismatch, match="integers of more than 38 digits"):
        _rows(tmp_path, "*.jsonl")


@pytest.mark.parametrize(
    ("declared", "read"),
    [("VARCHAR", str(_HUGE)), ("DECIMAL(38,0)", Decimal(_HUGE)), ("HUGEINT", Decimal(_HUGE))],
)
def test_a_declared_json_column_is_parsed_as_declared_not_cast_from_a_double(
    tmp_path: Path, declared: str, read: object
) -> None:
    (tmp_path / "a.jsonl").write_text(f'{{"id": 1, "n": {_HUGE}, "other": "x"}}\n')
    table = _rows(tmp_path, "s", file_sets={"s": {"glob": "*.jsonl", "columns": {"n": declared}}})
    assert table.column("n").to_pylist() == [read]
    assert table.column("other").to_pylist() == ["x"]


@pytest.mark.parametrize(
    ("last", "second"), [("31/12/2024", "2024-02-01"), ("12/31/2024", "01/02/2024")]
)
def test_csv_dates_past_the_sample_decide_their_format(
    tmp_path: Path, last: str, second: str
) -> None:
    """The read takes the types inferred from every row, dates included.

    Every sampled date reads both ways (01/02/2024); the last row decides:
    day first, or no date format at all (DuckDB knows no month-first one).
    """
    body = "".join(f"{i},0{1 + i % 9}/0{1 + i % 9}/2024\n" for i in range(_PAST_SAMPLE))
    body = body.replace("\n1,02/02/2024\n", "\n1,01/02/2024\n")
    (tmp_path / "a.csv").write_text("id,d\n" + body + f"{_PAST_SAMPLE},{last}\n")
    table = _rows(tmp_path, "*.csv")
    first = table.filter(pc.equal(table.column("id"), 1)).column("d").to_pylist()
    assert [str(d) for d in first] == [second]


def test_json_keys_differing_only_in_case_keep_their_values(tmp_path: Path) -> None:
    """DuckDB names the second key `name_1`; a read typed by that name found no such key."""
    (tmp_path / "a.jsonl").write_text(
        '{"id": 1, "Name": "a"}\n{"id": 2, "name": "b"}\n{"id": 3, "Name": "c", "name": "d"}\n'
    )
    table = _rows(tmp_path, "*.jsonl")
    assert table.column_names == ["id", "Name", "name_1"]
    assert table.column("Name").to_pylist() == ["a", None, "c"]
    assert table.column("name_1").to_pylist() == [None, "b", "d"]


@pytest.mark.parametrize(
    ("value", "column"),
    [(f'"n": {_HUGE}', "n"), ('"x": 1e400', "x"), (f'"o": {{"big": {_HUGE}, "f": 1.5}}', "o")],
)
def test_numbers_a_double_would_round_beside_keys_differing_only_in_case_are_refused(
    tmp_path: Path, value: str, column: str
) -> None:
    """Such files were read as inferred, their numbers unchecked: the integer landed
    as 1.2345678901234568e+22 and 1e400 as infinity, without a word."""
    (tmp_path / "a.jsonl").write_text(f'{{"id": 1, "Name": "a", "name": "b", {value}}}\n')
    with pytest.raises(SchemaMismatch, match=f"'{column}' .* keys that differ only in case"):
        _rows(tmp_path, "*.jsonl")
    (tmp_path / "a.jsonl").write_text('{"id": 1, "Name": "a", "name": "b", "n": 2.5}\n')
    assert _rows(tmp_path, "*.jsonl").column("n").to_pylist() == [2.5]


@pytest.mark.parametrize(
    ("value", "column"),
    [
        (f'{{"o": {{"big": {_HUGE}, "f": 1.5}}}}', "o"),  # a field of an object
        (f'{{"o": {{"s": {{"x": [1.5, {2**53 + 1}]}}}}}}', "o"),  # in an array in objects
        (f'{{"l": [{{"v": 1.5}}, {{"v": {_HUGE}}}]}}', "l"),  # in objects in an array
        (f'{{"m": [[1.5], [-{_HUGE}]]}}', "m"),  # in an array of arrays
    ],
)
def test_json_integers_inside_objects_and_arrays_a_double_would_round_are_refused(
    tmp_path: Path, value: str, column: str
) -> None:
    # DuckDB types such a value DOUBLE inside its STRUCT or list, and rounded
    # it without a word: 12345678901234567890123 landed as 1.2345678901234568e+22.
    (tmp_path / "a.jsonl").write_text(f'{{"id": 1, {value[1:-1]}}}\n{{"id": 2}}\n')
    with pytest.raises(SchemaMismatch, match=f"'{column}' .* inside its objects or arrays"):
        _rows(tmp_path, "*.jsonl")
    # Declared JSON, the value is kept as written.
    table = _rows(tmp_path, "s", file_sets={"s": {"glob": "*.jsonl", "columns": {column: "JSON"}}})
    assert str(_HUGE) in str(table.column(column)[0]) or str(2**53 + 1) in str(
        table.column(column)[0]
    )


def test_json_numbers_inside_objects_a_double_keeps_are_read_as_before(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        '{"id": 1, "o": {"f": 1.5, "n": 9007199254740992, "s": "12345678901234567890123"}}\n'
    )
    (row,) = _rows(tmp_path, "*.jsonl").column("o").to_pylist()
    assert row == {"f": 1.5, "n": 9007199254740992.0, "s": "12345678901234567890123"}


def test_a_csv_field_of_megabytes_is_read_whole(tmp_path: Path) -> None:
    """DuckDB's default longest row, 2,000,000 bytes, refused this valid file ("fix or
    remove the file", naming line 1)."""
    blob = "x" * 3_000_000 + '""' + "\n" + "y" * 10
    (tmp_path / "a.csv").write_text(f'id,blob\n1,"{blob}"\n2,z\n')
    table = _rows(tmp_path, "*.csv")
    assert table.column("blob").to_pylist() == [blob.replace('""', '"'), "z"]


@pytest.mark.parametrize(
    ("name", "write"),
    [
        ("a.parquet", [1_700_000_000_123_456_000, -1]),  # -1 ns landed as 1970-01-01 00:00
        ("b.parquet", pa.array([1_700_000_000_123_456_789], pa.timestamp("ns", "Asia/Tokyo"))),
    ],
)
def test_parquet_timestamps_finer_than_a_microsecond_are_refused_not_cut(
    tmp_path: Path, name: str, write: object
) -> None:
    """The lake keeps microseconds: 22:13:20.123456789 landed as 22:13:20.123456."""
    ts = write if isinstance(write, pa.Array) else pa.array(write, pa.timestamp("ns"))
    pq.write_table(pa.table({"id": list(range(1, len(ts) + 1)), "ts": ts}), tmp_path / name)
    with pytest.raises(SchemaMismatch, match="'ts' .* timestamps finer than a microsecond"):
        _rows(tmp_path, name)
    # Declared, they are read as declared: cut knowingly, or kept as text.
    table = _rows(tmp_path, "s", file_sets={"s": {"glob": name, "columns": {"ts": "VARCHAR"}}})
    assert "123456" in str(table.column("ts")[0])


def test_nanosecond_parquet_timestamps_of_whole_microseconds_are_read(tmp_path: Path) -> None:
    """pandas writes nanoseconds by default; values from microsecond clocks lose nothing."""
    ts = pa.array([1_700_000_000_123_456_000, None], pa.timestamp("ns"))
    pq.write_table(pa.table({"id": [1, 2], "ts": ts}), tmp_path / "a.parquet")
    table = _rows(tmp_path, "*.parquet")
    assert table.column("ts").cast(pa.int64()).to_pylist() == [1_700_000_000_123_456_000, None]


def test_json_records_of_two_hundred_keys_and_more_are_read(tmp_path: Path) -> None:
    """DuckDB infers an object of 200 keys or more as a MAP, and then refused every
    record as 'non-record JSON', asking for one object per line: which it was."""
    (tmp_path / "events").mkdir()
    lines = [json.dumps({"id": i, **{f"k{k}": i * k for k in range(250)}}) for i in range(3)]
    (tmp_path / "events" / "a.jsonl").write_text("\n".join(lines) + "\n")
    table = _rows(tmp_path, "events/*.jsonl")
    assert table.num_columns == 251 and table.column("k249").to_pylist() == [0, 249, 498]
    assert table.schema.field("k7").type == pa.int64()


def test_a_json_record_with_an_empty_key_is_refused_naming_the_key(tmp_path: Path) -> None:
    """DuckDB names no column "": it refused the record as 'non-record JSON', and the
    hint asked for one object per line, which it was."""
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "a.jsonl").write_text('{"id": 1, "": 2}\n')
    with pytest.raises(SchemaMismatch) as info:
        _rows(tmp_path, "e/*.jsonl")
    assert info.value.hint is not None and 'an empty key ("")' in info.value.hint
    assert info.value.context["file"] == "e/a.jsonl"
