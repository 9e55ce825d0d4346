"""The bulk path reads native values where connectorx's are exact, and they equal the row path's.

Every column the bulk path selects as it is (not as the server's text) is
compared here with the row path's read of the same rows, over every type
the connector supports and the edge values of each: a native column that
differs fails the comparison.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from combined.connectors.mariadb import MariaDBExtraction, MariaDBSource
from combined.connectors.mariadb import _arrow_read as bulk
from combined.connectors.mariadb._types import Layout, SourceColumn, plan_column
from combined.errors import SchemaMismatch

_TYPES = """CREATE TABLE t (id INT PRIMARY KEY,
  i8 TINYINT, b TINYINT(1), u8 TINYINT UNSIGNED, i16 SMALLINT, u16 SMALLINT UNSIGNED,
  i24 MEDIUMINT, u24 MEDIUMINT UNSIGNED, i32 INT, u32 INT UNSIGNED,
  i64 BIGINT, u64 BIGINT UNSIGNED, y YEAR,
  d122 DECIMAL(12,2), d2810 DECIMAL(28,10), d180 DECIMAL(18,0), d1010 DECIMAL(10,10),
  d190 DECIMAL(19,0), d2911 DECIMAL(29,11), d3810 DECIMAL(38,10), d6530 DECIMAL(65,30),
  du DECIMAL(12,2) UNSIGNED, f FLOAT, g DOUBLE, bit1 BIT(1), bit8 BIT(8), bit64 BIT(64),
  c CHAR(5), vc VARCHAR(40), l1 VARCHAR(10) CHARACTER SET latin1, tx TEXT, lt LONGTEXT,
  e ENUM('a','b'), st SET('x','y'), j JSON, uu UUID, ip4 INET4, ip6 INET6,
  bn BINARY(4), vb VARBINARY(8), bl BLOB, tm TIME(6),
  da DATE, dt DATETIME(6), ts TIMESTAMP(6) NULL,
  nda DATE NOT NULL DEFAULT '2000-01-01', ndt DATETIME NOT NULL DEFAULT '2000-01-01',
  nts TIMESTAMP(3) NOT NULL DEFAULT '2000-01-01', cb VARCHAR(10) COLLATE utf8mb4_bin,
  eb ENUM('x','y') COLLATE utf8mb4_bin) ENGINE=InnoDB"""
_COLUMNS = (
    "id, i8, b, u8, i16, u16, i24, u24, i32, u32, i64, u64, y, d122, d2810, d180, d1010, "
    "d190, d2911, d3810, d6530, du, f, g, bit1, bit8, bit64, c, vc, l1, tx, lt, e, st, j, uu, "
    "ip4, ip6, bn, vb, bl, tm, da, dt, ts, nda, ndt, nts"
)
_HIGH = (
    "(1, 127, 1, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, "
    "9223372036854775807, 18446744073709551615, 2155, 9999999999.99, "
    "999999999999999999.9999999999, 999999999999999999, 0.9999999999, "
    "9999999999999999999, 999999999999999999.99999999999, "
    "9999999999999999999999999999.9999999999, "
    "99999999999999999999999999999999999.999999999999999999999999999999, 9999999999.99, "
    "3.40282e38, 1.7976931348623157e308, b'1', b'11111111', "
    "b'1111111111111111111111111111111111111111111111111111111111111111', "
    "'ab ', 'héllo 🐬 日本', 'café', 't', REPEAT('l', 70000), 'b', 'x,y', "
    "'{\"k\": [1, 2.5]}', '123e4567-e89b-12d3-a456-426614174000', '10.0.0.1', '::1', "
    "x'00ff0000', x'deadbeef', x'00', '23:59:59.999999', '9999-12-31', "
    "'9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999999', '9999-12-31', "
    "'9999-12-31 23:59:59', '2038-01-19 03:14:07.999')"
)
_LOW = (
    "(2, -128, -1, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, 0, "
    "-9999999999.99, -999999999999999999.9999999999, -999999999999999999, -0.0000000001, "
    "-9999999999999999999, -0.00000000001, -0.0000000001, "
    "-0.000000000000000000000000000001, 0, -1.17549e-38, 2.2250738585072014e-308, b'0', "
    "b'0', b'0', '', '', '', '', '', 'a', '', '[]', '00000000-0000-0000-0000-000000000000', "
    "'0.0.0.0', '::', x'00000000', x'', x'', '00:00:00', '1000-01-01', "
    "'1000-01-01 00:00:00', '1970-01-01 00:00:01', '1000-01-01', '1000-01-01 00:00:00', "
    "'1970-01-01 00:00:01')"
)
_MIDDLE = (
    "(3, 0, 0, 1, -1, 1, -1, 1, -1, 1, -1, 9223372036854775808, 1901, 0.01, 0.1, 1, "
    "0.5, 1, 0.1, 0.1, 0.1, 0.01, 0.1, 0.30000000000000004, b'1', b'10000001', "
    "b'1000000000000000000000000000000000000000000000000000000000000000', 'x', 'ü', 'ÿ', "
    "'a\\nb', '', 'a', 'x', 'null', 'ffffffff-ffff-ffff-ffff-ffffffffffff', "
    "'255.255.255.255', 'ffff::1', x'01020304', x'01', x'02', '12:30:00.5', '2024-02-29', "
    "'2024-03-31 02:30:00', '2024-03-31 01:00:00', '2024-02-29', '2024-03-31 02:30:00', "
    "'2024-10-27 01:00:00.5')"
)
#: Instants on both sides of Europe's 2024 daylight-saving changes, written at +01:00/+02:00.
_DST = [
    ("+01:00", 4, "2024-03-31 01:59:59.999999"),  # 00:59:59.999999 UTC, last CET moment
    ("+02:00", 5, "2024-03-31 03:00:00"),  # 01:00 UTC, first CEST moment
    ("+02:00", 6, "2024-10-27 02:59:59.999999"),  # 00:59:59.999999 UTC, last CEST moment
    ("+01:00", 7, "2024-10-27 02:00:00"),  # 01:00 UTC, the repeated hour in CET
]


def _read(source: MariaDBSource, request: Any, *, use_bulk: bool) -> tuple[str, pa.Table]:
    ext = source.read(request)
    assert isinstance(ext, MariaDBExtraction)
    ext.bulk = use_bulk
    try:
        batches = [m.batch for m in ext if hasattr(m, "batch")]
    finally:
        ext.finish("success")
    table = pa.Table.from_batches(batches) if batches else pa.table({})
    return ext.path, table.sort_by("id")


def _both(source: MariaDBSource, request: Any) -> tuple[pa.Table, pa.Table]:
    path, fast = _read(source, request, use_bulk=True)
    assert path == "bulk"
    path, slow = _read(source, request, use_bulk=False)
    assert path == "rows"
    return fast, slow


def _assert_equal(fast: pa.Table, slow: pa.Table) -> None:
    assert fast.schema.equals(slow.schema), (fast.schema, slow.schema)
    for name in fast.column_names:
        assert fast.column(name).equals(slow.column(name)), name


def test_every_type_and_edge_value_reads_in_bulk_as_on_the_row_path(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    admin.sql(_TYPES, f"INSERT INTO t ({_COLUMNS}) VALUES {_HIGH}, {_LOW}, {_MIDDLE}")
    admin.sql("INSERT INTO t (id) VALUES (8)")  # NULL wherever NULL is allowed
    admin.sql("INSERT INTO t (id, cb, eb) VALUES (9, 'é🐬 B', 'y')")  # binary collations
    for zone, i, at in _DST:
        admin.sql(f"SET time_zone = '{zone}'", f"INSERT INTO t (id, ts) VALUES ({i}, '{at}')")
    admin.sql("SET time_zone = '+00:00'")
    fast, slow = _both(source, make_request("t"))
    _assert_equal(fast, slow)
    rows = {r["id"]: r for r in fast.to_pylist()}
    assert rows[1]["u64"] == 2**64 - 1 and rows[3]["u64"] == 2**63
    assert rows[2]["i64"] == -(2**63) and rows[2]["b"] == -1 and rows[1]["b"] == 1
    assert (rows[1]["y"], rows[2]["y"], rows[3]["y"]) == (2155, 0, 1901)
    assert (rows[1]["bit1"], rows[1]["bit8"], rows[1]["bit64"]) == (True, 255, 2**64 - 1)
    assert str(rows[1]["d2810"]) == "999999999999999999.9999999999"
    assert str(rows[1]["d2911"]) == "999999999999999999.99999999999"  # text: not rounded
    assert str(rows[1]["d190"]) == "9999999999999999999"
    assert rows[8]["u64"] is None and rows[8]["ts"] is None and rows[8]["d122"] is None
    utc = [str(rows[i]["ts"]) for i in (4, 5, 6, 7)]
    assert utc == [
        "2024-03-31 00:59:59.999999+00:00",
        "2024-03-31 01:00:00+00:00",
        "2024-10-27 00:59:59.999999+00:00",
        "2024-10-27 01:00:00+00:00",
    ]


def _zero_dates(admin: Any) -> None:
    admin.sql(
        "SET SESSION sql_mode = ''",
        "CREATE TABLE z (id INT PRIMARY KEY, d DATE NOT NULL, dt DATETIME(6) NOT NULL, "
        "ts TIMESTAMP NOT NULL DEFAULT '2000-01-01', nd DATE NULL, ndt DATETIME NULL)",
        "INSERT INTO z VALUES (1, '2021-03-04', '2021-03-04 05:06:07.5', '2021-03-04 05:06:07',"
        " '2021-03-04', NULL), (2, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00',"
        " '0000-00-00', '2020-05-00 00:00:00'), (3, '2020-00-15', '2020-05-00 10:00:00',"
        " '2021-03-04 05:06:07', NULL, '0000-00-00 00:00:00')",
    )


def test_zero_dates_read_in_bulk_as_on_the_row_path_under_both_policies(
    admin: Any, mariadb_database: str, make_request: Any
) -> None:
    _zero_dates(admin)
    src = MariaDBSource({"dsn": mariadb_database, "zero_dates": "null"})
    try:
        fast, slow = _both(src, make_request("z"))
    finally:
        src.close()
    _assert_equal(fast, slow)
    assert fast.column("d").to_pylist()[1:] == [None, None]
    assert fast.column("ndt").to_pylist() == [None, None, None]
    assert fast.column("dt").to_pylist()[0].microsecond == 500_000


@pytest.mark.parametrize("column", ["d", "dt", "ts", "nd", "ndt"])
def test_a_zero_date_is_refused_in_bulk_naming_the_column(
    admin: Any, mariadb_database: str, make_request: Any, column: str
) -> None:
    """NOT NULL columns read natively (a NULL is a zero date), nullable ones as text."""
    _zero_dates(admin)
    src = MariaDBSource({"dsn": mariadb_database})
    try:
        for use_bulk in (True, False):
            request = make_request("z", columns=("id", column))
            with pytest.raises(SchemaMismatch, match="zero date") as info:
                _read(src, request, use_bulk=use_bulk)
            assert repr(column) in info.value.message
            assert info.value.hint is not None and "zero_dates: null" in info.value.hint
    finally:
        src.close()


def _plan(name: str, data_type: str, column_type: str, nullable: bool = True, **kw: Any) -> Any:
    precision, scale = kw.get("precision"), kw.get("scale")
    return plan_column(SourceColumn(name, data_type, column_type, nullable, precision, scale))


def test_the_bulk_select_list_casts_to_text_only_what_connectorx_cannot_read_exactly() -> None:
    plans = [
        _plan("id", "bigint", "bigint(20)", False),
        _plan("u", "bigint", "bigint(20) unsigned"),
        _plan("s", "varchar", "varchar(16)"),
        _plan("total", "decimal", "decimal(12,2)", precision=12, scale=2),
        _plan("wide", "decimal", "decimal(38,10)", precision=38, scale=10),
        _plan("fine", "decimal", "decimal(20,11)", precision=20, scale=11),
        _plan("j", "json", "json"),
        _plan("at", "timestamp", "timestamp(6)", False),
        _plan("maybe", "datetime", "datetime"),
    ]
    at = "IF(MONTH(`at`) = 0 OR DAYOFMONTH(`at`) = 0, NULL, `at`) AS `at`"
    assert bulk.select_list(Layout.of(plans)) == ", ".join(
        [
            "`id` AS `id`",
            "`u` AS `u`",
            "`s` AS `s`",
            "`total` AS `total`",
            "CAST(`wide` AS CHAR) AS `wide`",
            "CAST(`fine` AS CHAR) AS `fine`",
            "CAST(`j` AS CHAR) AS `j`",
            at,
            "CAST(`maybe` AS CHAR) AS `maybe`",  # a NULL and a zero date must be told apart
        ]
    )
    native = bulk.select_list(Layout.of(plans, "null"))
    assert native.endswith(
        "IF(MONTH(`maybe`) = 0 OR DAYOFMONTH(`maybe`) = 0, NULL, `maybe`) AS `maybe`"
    )


def test_the_pacer_sleeps_most_of_the_last_wait_and_halves_once_batches_are_there() -> None:
    """connectorx holds the GIL while it waits: the pause before ``next()`` is spent without it."""
    pacer = bulk.Pacer()
    assert pacer.pause == 0.0  # the first batch is asked for at once
    pacer.waited(0.1)  # the server took 100 ms: sleep 90 ms of the next one
    assert pacer.pause == pytest.approx(0.09)
    pacer.waited(0.02)  # 110 ms in all: the read's pace
    assert pacer.pause == pytest.approx(0.099)
    pacer.waited(0.0)  # the batch was there: the consumer is the slower, sleep less
    assert pacer.pause == pytest.approx(0.0495)
    for _ in range(20):
        pacer.waited(0.0)
    assert pacer.pause < 1e-6
    pacer.waited(10.0)  # a slow server: the pause stays short
    assert pacer.pause == bulk.Pacer.LONGEST
