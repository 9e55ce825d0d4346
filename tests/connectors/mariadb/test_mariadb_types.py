"""Every common MariaDB type reaches Arrow exactly: values, NULLs, extremes, unicode, zero dates."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from combined.connectors.mariadb import MariaDBSource
from combined.errors import ConfigError, NotFoundError, SchemaMismatch, UnsupportedType

TYPES = """
CREATE TABLE t (
  id INT PRIMARY KEY,
  i8 TINYINT, u8 TINYINT UNSIGNED, i16 SMALLINT, u16 SMALLINT UNSIGNED,
  i24 MEDIUMINT, u24 MEDIUMINT UNSIGNED, i32 INT, u32 INT UNSIGNED,
  i64 BIGINT, u64 BIGINT UNSIGNED,
  dc DECIMAL(38,10), dec65 DECIMAL(65,30), f FLOAT, d DOUBLE,
  b1 BIT(1), b64 BIT(64),
  c CHAR(5), vc VARCHAR(50), tx TEXT, lt LONGTEXT, en ENUM('red','green'), st SET('a','b','c'),
  js JSON, bn BINARY(4), vb VARBINARY(10), bl BLOB,
  dt DATE, tm TIME(6), dtm DATETIME(6), ts TIMESTAMP(6) NULL DEFAULT NULL, yr YEAR
)
"""

EXPECTED_TYPES = {
    "i8": pa.int8(),
    "u8": pa.uint8(),
    "i16": pa.int16(),
    "u16": pa.uint16(),
    "i24": pa.int32(),
    "u24": pa.uint32(),
    "i32": pa.int32(),
    "u32": pa.uint32(),
    "i64": pa.int64(),
    "u64": pa.uint64(),
    "dc": pa.decimal128(38, 10),
    "dec65": pa.decimal256(65, 30),
    "f": pa.float32(),
    "d": pa.float64(),
    "b1": pa.bool_(),
    "b64": pa.uint64(),
    "c": pa.string(),
    "vc": pa.string(),
    "tx": pa.string(),
    "lt": pa.string(),
    "en": pa.string(),
    "st": pa.string(),
    "js": pa.string(),
    "bn": pa.binary(),
    "vb": pa.binary(),
    "bl": pa.binary(),
    "dt": pa.date32(),
    "tm": pa.time64("us"),
    "dtm": pa.timestamp("us"),
    "ts": pa.timestamp("us", tz="UTC"),
    "yr": pa.int16(),
}

MAX_ROW = (
    "(1, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, "
    "9223372036854775807, 18446744073709551615, "
    "9999999999999999999999999999.9999999999, "
    "99999999999999999999999999999999999.999999999999999999999999999999, "
    "3.40282e38, 1.7976931348623157e308, b'1', CAST(18446744073709551615 AS UNSIGNED), "
    "'héllo', '日本語 ✓ 🎉', 'long text', REPEAT('x', 100000), 'green', 'a,c', "
    "'{\"k\": [1, 2.5, \"ü\"]}', x'00010200', x'ff00', x'deadbeef', "
    "'9999-12-31', '23:59:59.999999', '9999-12-31 23:59:59.999999', "
    "'2038-01-19 03:14:07.999999', 2155)"
)
MIN_ROW = (
    "(2, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, "
    "-9223372036854775808, 0, -0.0000000001, -0.000000000000000000000000000001, "
    "-1.17549e-38, 2.2250738585072014e-308, b'0', b'0', "
    "'', '', '', '', 'red', '', '[]', x'00000000', x'', x'', "
    "'1000-01-01', '00:00:00', '1000-01-01 00:00:00', '1970-01-01 00:00:01', 1901)"
)
NULL_ROW = "(3" + ", NULL" * (len(EXPECTED_TYPES)) + ")"


def read_all(source: MariaDBSource, make_request: Any, mt: Any, table: str, **kw: Any) -> Any:
    ext = source.read(make_request(table, **kw))
    try:
        return mt.table_of(list(ext))
    finally:
        ext.finish("success")


def test_every_type_round_trips_with_extremes_nulls_and_unicode(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(TYPES, f"INSERT INTO t VALUES {MAX_ROW}, {MIN_ROW}, {NULL_ROW}")
    table = read_all(source, make_request, mt, "t").sort_by("id")
    for name, arrow in EXPECTED_TYPES.items():
        assert table.schema.field(name).type == arrow, name
    hi, lo, nul = table.to_pylist()
    assert all(v is None for k, v in nul.items() if k != "id")
    assert (hi["i8"], hi["u8"], hi["i16"], hi["u16"]) == (127, 255, 32767, 65535)
    assert (hi["i24"], hi["u24"], hi["i32"], hi["u32"]) == (8388607, 16777215, 2**31 - 1, 2**32 - 1)
    assert (hi["i64"], hi["u64"]) == (2**63 - 1, 2**64 - 1)
    assert (lo["i8"], lo["i16"], lo["i24"], lo["i32"], lo["i64"]) == (
        -128,
        -32768,
        -8388608,
        -(2**31),
        -(2**63),
    )
    assert hi["dc"] == Decimal("9999999999999999999999999999.9999999999")
    assert hi["dec65"] == Decimal(
        "99999999999999999999999999999999999.999999999999999999999999999999"
    )
    assert lo["dc"] == Decimal("-0.0000000001")
    assert lo["dec65"] == Decimal("-0.000000000000000000000000000001")
    assert hi["f"] == pa.scalar(3.40282e38, pa.float32()).as_py()
    assert hi["d"] == 1.7976931348623157e308 and lo["d"] == 2.2250738585072014e-308
    assert (hi["b1"], lo["b1"], hi["b64"], lo["b64"]) == (True, False, 2**64 - 1, 0)
    assert (hi["c"], hi["vc"], hi["tx"]) == ("héllo", "日本語 ✓ 🎉", "long text")
    assert hi["lt"] == "x" * 100_000 and lo["vc"] == ""
    assert (hi["en"], hi["st"], lo["st"]) == ("green", "a,c", "")
    assert hi["js"] is not None and '"ü"' in hi["js"]
    assert (hi["bn"], hi["vb"], hi["bl"]) == (b"\x00\x01\x02\x00", b"\xff\x00", b"\xde\xad\xbe\xef")
    assert lo["bn"] == b"\x00\x00\x00\x00" and lo["vb"] == b""
    assert (hi["dt"], lo["dt"]) == (date(9999, 12, 31), date(1000, 1, 1))
    assert (hi["tm"], lo["tm"]) == (time(23, 59, 59, 999999), time(0, 0))
    assert hi["dtm"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert hi["ts"] == datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC)
    assert lo["ts"] == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert (hi["yr"], lo["yr"]) == (2155, 1901)


def test_float_values_keep_their_bits(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE fl (id INT PRIMARY KEY, f FLOAT, d DOUBLE)",
        "INSERT INTO fl VALUES (1, 0.1, 0.1), (2, 1e-45, 5e-324), "
        "(3, 16777217, 0.30000000000000004)",
    )
    rows = read_all(source, make_request, mt, "fl").sort_by("id").to_pylist()
    f32 = [pa.scalar(v, pa.float32()).as_py() for v in (0.1, 1e-45, 16777216.0)]
    assert [r["f"] for r in rows] == f32
    assert [r["d"] for r in rows] == [0.1, 5e-324, 0.30000000000000004]


def test_timestamp_is_read_in_utc_whatever_the_server_zone(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE tz (id INT PRIMARY KEY, ts TIMESTAMP NULL, dtm DATETIME)",
        "SET time_zone = '+05:00'",
        "INSERT INTO tz VALUES (1, '2026-03-01 12:00:00', '2026-03-01 12:00:00')",
    )
    (row,) = read_all(source, make_request, mt, "tz").to_pylist()
    assert row["ts"] == datetime(2026, 3, 1, 7, 0, tzinfo=UTC)  # stored as an instant
    assert row["dtm"] == datetime(2026, 3, 1, 12, 0)  # a wall clock, kept as written


def _zero_table(admin: Any) -> None:
    admin.sql(
        "SET SESSION sql_mode = ''",
        "CREATE TABLE z (id INT PRIMARY KEY, d DATE, dtm DATETIME, ts TIMESTAMP NULL)",
        "INSERT INTO z VALUES (1, '2026-01-02', '2026-01-02 03:04:05', '2026-01-02 03:04:05'), "
        "(2, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00'), "
        "(3, '2020-00-15', '2020-05-00 00:00:00', NULL), (4, NULL, NULL, NULL)",
    )


def test_a_zero_date_is_refused_naming_the_column_and_the_ways_out(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _zero_table(admin)
    with pytest.raises(SchemaMismatch) as info:
        read_all(source, make_request, mt, "z")
    assert "'d'" in info.value.message and "0000-00-00" in info.value.message
    assert info.value.hint is not None
    # (the cast as the source's config names it, table and column: "d" alone was refused)
    assert "zero_dates: null" in info.value.hint and '"z.d": "text"' in info.value.hint


def test_zero_dates_become_nulls_only_when_asked(
    admin: Any, mariadb_database: str, make_request: Any, mt: Any
) -> None:
    _zero_table(admin)
    src = MariaDBSource({"dsn": mariadb_database, "zero_dates": "null"})
    try:
        rows = read_all(src, make_request, mt, "z").sort_by("id").to_pylist()
    finally:
        src.close()
    assert rows[0]["d"] == date(2026, 1, 2) and rows[0]["ts"] is not None
    assert [(r["d"], r["dtm"], r["ts"]) for r in rows[1:]] == [(None, None, None)] * 3


def test_zero_dates_can_be_read_as_text_through_casts(
    admin: Any, mariadb_database: str, make_request: Any, mt: Any
) -> None:
    _zero_table(admin)
    casts = {"z.d": "text", "z.dtm": "text", "z.ts": "text"}
    src = MariaDBSource({"dsn": mariadb_database, "casts": casts})
    try:
        table = read_all(src, make_request, mt, "z").sort_by("id")
    finally:
        src.close()
    assert table.schema.field("d").type == pa.string()
    assert table.column("d").to_pylist() == ["2026-01-02", "0000-00-00", "2020-00-15", None]
    assert table.column("dtm").to_pylist()[1] == "0000-00-00 00:00:00"


def test_a_time_beyond_a_day_is_refused_unless_cast_to_text(
    admin: Any, source: MariaDBSource, mariadb_database: str, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE tm (id INT PRIMARY KEY, t TIME)",
        "INSERT INTO tm VALUES (1, '10:00:00'), (2, '-01:00:00'), (3, '838:59:59')",
    )
    with pytest.raises(SchemaMismatch, match="'t'.*not a time of day") as info:
        read_all(source, make_request, mt, "tm")
    assert info.value.hint is not None and '"tm.t": "text"' in info.value.hint
    src = MariaDBSource({"dsn": mariadb_database, "casts": {"tm.t": "text"}})
    try:
        values = read_all(src, make_request, mt, "tm").sort_by("id").column("t").to_pylist()
    finally:
        src.close()
    assert values == ["10:00:00", "-01:00:00", "838:59:59"]


def test_an_unsupported_type_is_refused_with_the_cast_that_reads_it(
    admin: Any, source: MariaDBSource, mariadb_database: str, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE geo (id INT PRIMARY KEY, p POINT)",
        "INSERT INTO geo VALUES (1, POINT(1, 2))",
    )
    (field,) = [f for f in source.discover().dataset("geo").fields if f.name == "p"]  # type: ignore[union-attr]
    assert field.arrow_type == "unsupported"
    with pytest.raises(UnsupportedType) as info:
        read_all(source, make_request, mt, "geo")
    assert info.value.hint is not None and '"geo.p": "text"' in info.value.hint
    src = MariaDBSource({"dsn": mariadb_database, "casts": {"geo.p": "text"}})
    try:
        assert read_all(src, make_request, mt, "geo").column("p").to_pylist() == ["POINT(1 2)"]
    finally:
        src.close()


def test_a_preflight_of_many_datasets_reads_the_catalog_in_a_few_queries(
    admin: Any,
    source: MariaDBSource,
    mariadb_database: str,
    make_request: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two queries a dataset (its relation, its columns) cost a round trip each: a
    source of hundreds of small tables waited before its Run began."""
    from combined.connectors.mariadb import _connect

    admin.sql(*(f"CREATE TABLE t{n} (id INT PRIMARY KEY, v TEXT)" for n in range(30)))
    admin.sql("CREATE TABLE `Mixed.Case` (id INT PRIMARY KEY, p POINT)")
    queries: list[str] = []
    rows = _connect.Session.rows

    def counted(self: Any, query: str, what: str, *args: Any, **kwargs: Any) -> Any:
        queries.append(what)
        return rows(self, query, what, *args, **kwargs)

    monkeypatch.setattr(_connect.Session, "rows", counted)
    requests = [make_request(f"t{n}") for n in range(30)]
    source.preflight(requests)
    assert len([q for q in queries if "table" in q or "column" in q]) <= 3, queries
    # each relation's own columns are still checked: the geometry of the 31st
    mixed = make_request("m", relation="`Mixed.Case`")
    with pytest.raises(ConfigError, match="POINT|point"):
        source.preflight([*requests, mixed])
    with pytest.raises(NotFoundError, match="'gone' does not exist"):
        source.preflight([*requests, make_request("gone"), mixed])


@pytest.mark.parametrize(
    ("wide", "narrow", "held"),
    [
        (pa.int32(), pa.int8(), True),
        (pa.int8(), pa.int32(), False),
        (pa.int64(), pa.uint32(), True),
        (pa.int32(), pa.uint32(), False),  # (INT to INT UNSIGNED: neither holds the other)
        (pa.uint32(), pa.int8(), False),
        (pa.decimal128(10, 2), pa.decimal128(5, 2), True),
        (pa.decimal128(10, 4), pa.decimal128(10, 2), False),  # (fewer digits before the point)
        (pa.int32(), pa.int32(), False),
        (pa.int32(), pa.string(), False),
    ],
)
def test_which_type_holds_every_value_of_another(
    wide: pa.DataType, narrow: pa.DataType, held: bool
) -> None:
    from combined.connectors.mariadb._types import holds

    assert holds(wide, narrow) is held


def test_a_key_hint_names_zero_dates_only_where_the_read_made_them_null() -> None:
    """Only a date or timestamp key column read under ``zero_dates: null`` is named; a
    nullable one may hold the source's own NULLs too, and a cdc read names no cast."""
    from combined.connectors.mariadb._types import SourceColumn, plan_column, zero_date_key_hint

    def plan(name: str, data_type: str, nullable: bool) -> Any:
        return plan_column(SourceColumn(name, data_type, data_type, nullable, None, None))

    plans = {
        "d": plan("d", "date", False),
        "n": plan("n", "datetime", True),
        "i": plan("i", "int", True),
    }
    whole = zero_date_key_hint(plans, ["d"], "null", casts=True) or ""
    assert whole.startswith("key column 'd' holds zero dates, and zero_dates: null")
    assert "set zero_dates: error" in whole and 'casts: {"<table>.d": "text"}' in whole
    nullable = zero_date_key_hint(plans, ["n", "i"], "null", casts=False) or ""
    assert nullable.startswith("key column 'n' holds NULL or zero dates")
    assert "casts" not in nullable
    assert zero_date_key_hint(plans, ["i"], "null", casts=True) is None
    assert zero_date_key_hint(plans, ["d"], "error", casts=True) is None
