"""Every common PostgreSQL type round-trips with exact values; the rest fail loudly."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from combined.connectors.postgres import PostgresSource
from combined.connectors.postgres._types import (
    NUMERIC,
    PgType,
    jsonable,
    numeric_typmod,
    plan_column,
    value_from_text,
)
from combined.errors import ConfigError, SchemaMismatch, UnsupportedType

SETUP = """
CREATE TYPE {s}.mood AS ENUM ('sad', 'happy');
CREATE DOMAIN {s}.posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN {s}.money2 AS numeric(12, 2);
CREATE DOMAIN {s}.intlist AS integer[];
CREATE TABLE {s}.t (
  id int PRIMARY KEY,
  i2 smallint, i4 integer, i8 bigint, f4 real, f8 double precision, b boolean,
  n numeric(38, 10), n2 numeric(20, 4), nbig numeric(50, 5), nneg numeric(5, -2),
  nu numeric,
  tz timestamptz, ts timestamp, d date, tm time, ttz timetz, iv interval,
  u uuid, j json, jb jsonb, by bytea,
  arr integer[], tarr text[], narr numeric(8, 2)[], tzarr timestamptz[],
  uarr uuid[], jarr jsonb[], earr {s}.mood[],
  e {s}.mood, dom {s}.posint, dnum {s}.money2, darr {s}.intlist,
  c char(3), vc varchar(10), ip inet, mac macaddr, bits bit(4), x xml, o oid
);
INSERT INTO {s}.t VALUES (
  1, -32768, 2147483647, 9223372036854775807, 1.5, -2.25, true,
  '1234567890123456789012345678.0123456789', '-0.0001',
  '123456789012345678901234567890123456789012345.12345',
  12345,
  '3.14159265358979323846264338327950288419716939937510',
  '2024-01-02 03:04:05.123456+02', '1999-12-31 23:59:59.999999', '2024-02-29',
  '23:59:59.999999', '03:04:05+02', '1 year 2 mons 3 days 04:05:06.789',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"b":1,  "a":2}}', '{{"b":1,"a":2}}', '\\x00ff10',
  '{{1,NULL,3}}', '{{"a,b","c\\"d"}}', '{{1.25,NULL}}', '{{"2024-01-01 00:00:00+00"}}',
  '{{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}}', ARRAY['{{"k":[1,2]}}'::jsonb], '{{sad,happy}}',
  'happy', 5, '12.34', '{{7,8}}',
  'ab', 'xyz', '192.168.0.1/24', '08:00:2b:01:02:03', '1010', '<a>1</a>', 3000000000
);
INSERT INTO {s}.t (id, nu, arr) VALUES (2, 'NaN', '{{}}');
INSERT INTO {s}.t (id, nu) VALUES (3, 'Infinity');
"""

EXPECTED_TYPES = {
    "id": pa.int32(),
    "i2": pa.int16(),
    "i4": pa.int32(),
    "i8": pa.int64(),
    "f4": pa.float32(),
    "f8": pa.float64(),
    "b": pa.bool_(),
    "n": pa.decimal128(38, 10),
    "n2": pa.decimal128(20, 4),
    "nbig": pa.decimal256(50, 5),
    "nneg": pa.decimal128(7, 0),  # numeric(5, -2): integers of up to 7 digits
    "nu": pa.string(),
    "tz": pa.timestamp("us", tz="UTC"),
    "ts": pa.timestamp("us"),
    "d": pa.date32(),
    "tm": pa.time64("us"),
    "ttz": pa.string(),
    "iv": pa.string(),  # read through its cast: an interval has no identity encoding
    "u": pa.string(),
    "j": pa.string(),
    "jb": pa.string(),
    "by": pa.binary(),
    "arr": pa.list_(pa.int32()),
    "tarr": pa.list_(pa.string()),
    "narr": pa.list_(pa.decimal128(8, 2)),
    "tzarr": pa.list_(pa.timestamp("us", tz="UTC")),
    "uarr": pa.list_(pa.string()),
    "jarr": pa.list_(pa.string()),
    "earr": pa.list_(pa.string()),
    "e": pa.string(),
    "dom": pa.int32(),
    "dnum": pa.decimal128(12, 2),
    "darr": pa.list_(pa.int32()),
    "c": pa.string(),
    "vc": pa.string(),
    "ip": pa.string(),
    "mac": pa.string(),
    "bits": pa.string(),
    "x": pa.string(),
    "o": pa.int64(),
}

EXPECTED_ROW = {
    "id": 1,
    "i2": -32768,
    "i4": 2147483647,
    "i8": 9223372036854775807,
    "f4": 1.5,
    "f8": -2.25,
    "b": True,
    "n": Decimal("1234567890123456789012345678.0123456789"),
    "n2": Decimal("-0.0001"),
    "nbig": Decimal("123456789012345678901234567890123456789012345.12345"),
    "nneg": Decimal("12300"),
    "nu": "3.14159265358979323846264338327950288419716939937510",
    "tz": datetime(2024, 1, 2, 1, 4, 5, 123456, tzinfo=UTC),
    "ts": datetime(1999, 12, 31, 23, 59, 59, 999999),
    "d": date(2024, 2, 29),
    "tm": time(23, 59, 59, 999999),
    "ttz": "03:04:05+02",
    "iv": "1 year 2 mons 3 days 04:05:06.789",
    "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "j": '{"b":1,  "a":2}',
    "jb": '{"a": 2, "b": 1}',
    "by": b"\x00\xff\x10",
    "arr": [1, None, 3],
    "tarr": ["a,b", 'c"d'],
    "narr": [Decimal("1.25"), None],
    "tzarr": [datetime(2024, 1, 1, tzinfo=UTC)],
    "uarr": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    "jarr": ['{"k": [1, 2]}'],
    "earr": ["sad", "happy"],
    "e": "happy",
    "dom": 5,
    "dnum": Decimal("12.34"),
    "darr": [7, 8],
    "c": "ab ",
    "vc": "xyz",
    "ip": "192.168.0.1/24",
    "mac": "08:00:2b:01:02:03",
    "bits": "1010",
    "x": "<a>1</a>",
    "o": 3000000000,
}


def _read(source, make_request, table="t", **kw):
    ext = source.read(make_request(table, **kw))
    try:
        return list(ext)
    finally:
        ext.finish("success")


def test_every_common_type_round_trips_exactly(admin, schema, source, make_request, pgt):
    admin.execute(SETUP.format(s=schema))
    table = pgt.table_of(_read(source, make_request, options={"casts": {"iv": "text"}}))
    table = table.sort_by("id")
    assert {f.name: f.type for f in table.schema} == EXPECTED_TYPES
    rows = table.to_pylist()
    assert rows[0] == EXPECTED_ROW
    # Values without a decimal form stay exact text; nulls stay nulls, never invented.
    assert [r["nu"] for r in rows] == [EXPECTED_ROW["nu"], "NaN", "Infinity"]
    assert rows[1]["arr"] == [] and rows[2]["arr"] is None
    assert all(v is None for k, v in rows[2].items() if k not in ("id", "nu"))


def test_discovery_reports_the_types_a_read_produces(admin, schema, source):
    admin.execute(SETUP.format(s=schema))
    found = source.discover().dataset(f"{schema}.t")
    assert found is not None
    # The interval as its own type: the read refuses it unless cast (as the round trip does).
    assert {f.name: f.arrow_type for f in found.fields} == {
        **{k: str(v) for k, v in EXPECTED_TYPES.items()},
        "iv": "month_day_nano_interval",
    }
    by_name = {f.name: f for f in found.fields}
    assert by_name["n2"].source_type == "numeric(20,4)"
    assert by_name["dom"].source_type == f"{schema}.posint"
    assert by_name["id"].nullable is False and by_name["i2"].nullable is True


def test_timestamps_before_the_common_era_keep_their_instant(admin, schema, source, make_request):
    admin.execute(f"CREATE TABLE {schema}.t (id int, ts timestamp, d date)")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, '0044-03-15 12:00:00 BC', '0044-03-15 BC')")
    messages = _read(source, make_request)
    batch = messages[0].batch
    # Python's datetime stops at year 1: compare raw Unix units with the server's own.
    epoch_us, epoch_days = admin.execute(
        f"SELECT (extract(epoch FROM ts) * 1000000)::bigint, d - '1970-01-01'::date FROM {schema}.t"
    ).fetchone()
    assert batch.column("ts").view(pa.int64())[0].as_py() == epoch_us
    assert batch.column("d").view(pa.int32())[0].as_py() == epoch_days
    assert epoch_us < -60_000_000_000 * 1_000_000  # truly before the common era


def test_infinite_dates_read_as_duckdbs_infinities(admin, schema, source, make_request):
    """They stopped the read ("holds infinity or a value arrow cannot hold"):
    now the day counts +-(2**31 - 1), DuckDB's 'infinity' and '-infinity'."""
    admin.execute(f"CREATE TABLE {schema}.t (id int, d date, da date[])")
    admin.execute(
        f"INSERT INTO {schema}.t VALUES (1, 'infinity', '{{-infinity,NULL,infinity}}'),"
        " (2, '-infinity', NULL), (3, '5874897-12-31', '{4714-11-24 BC}'), (4, NULL, '{}')"
    )
    batch = _read(source, make_request)[0].batch.sort_by("id")
    inf = 2**31 - 1
    assert batch.column("d").view(pa.int32()).to_pylist() == [inf, -inf, 2145042905, None]
    lists = batch.column("da")
    assert lists.is_null().to_pylist() == [False, True, False, False]
    assert lists.values.view(pa.int32()).to_pylist() == [-inf, None, inf, -2440588]
    assert pc.list_value_length(lists).to_pylist() == [3, None, 1, 0]
    duck = duckdb.connect().sql("SELECT 'infinity'::date AS p, '-infinity'::date AS n")
    assert duck is not None
    duck = duck.to_arrow_table()
    assert [duck.column(c).chunk(0).view(pa.int32())[0].as_py() for c in "pn"] == [inf, -inf]


def test_infinite_timestamps_read_as_duckdbs_infinities(admin, schema, source, make_request):
    """They stopped the read as the dates did: now the microsecond counts
    +-(2**63 - 1), DuckDB's 'infinity' and '-infinity' (the identity's ``t`` and
    ``z`` texts ``infinity``/``-infinity``, docs/identity.md)."""
    admin.execute(
        f"CREATE TABLE {schema}.t (id int, ts timestamp, tz timestamptz, za timestamptz[])"
    )
    admin.execute(
        f"INSERT INTO {schema}.t VALUES"
        " (1, 'infinity', '-infinity', '{-infinity,NULL,infinity}'),"
        " (2, '-infinity', 'infinity', NULL),"
        " (3, '294246-12-31 23:59:59', '4713-01-01 00:00:00+00 BC', '{2024-01-01 00:00:00+00}')"
    )
    batch = _read(source, make_request)[0].batch.sort_by("id")
    inf = 2**63 - 1
    far = admin.execute(
        "SELECT (extract(epoch FROM ts) * 1000000)::bigint,"
        f" (extract(epoch FROM tz) * 1000000)::bigint FROM {schema}.t WHERE id = 3"
    ).fetchone()
    assert batch.column("ts").view(pa.int64()).to_pylist() == [inf, -inf, far[0]]
    assert batch.column("tz").view(pa.int64()).to_pylist() == [-inf, inf, far[1]]
    assert batch.column("za").values.view(pa.int64()).to_pylist() == [
        -inf,
        None,
        inf,
        1_704_067_200_000_000,
    ]
    duck = duckdb.connect().sql("SELECT 'infinity'::timestamp AS p, '-infinity'::timestamp AS n")
    assert duck is not None
    duck = duck.to_arrow_table()
    assert [duck.column(c).chunk(0).view(pa.int64())[0].as_py() for c in "pn"] == [inf, -inf]


@pytest.mark.parametrize(
    ("decl", "value", "cast", "expected"),
    [
        ("time", "24:00:00", "24:00:00", "24:00:00"),
        ("integer[]", "{{1,2},{3,4}}", "{{1,2},{3,4}}", "2-dimensional"),
        # The driver's own words, naming no column, with a hint of casts:
        # {"<table>.<column>": "text"} for the user to fill in.
        ("integer[]", "[5:6]={1,2}", "[5:6]={1,2}", "subscripts start at neither 0 nor 1"),
        ("numeric(10,2)", "NaN", "NaN", "NaN"),
    ],
)
def test_values_arrow_cannot_hold_fail_unless_cast(
    admin, schema, source, make_request, pg_dsn, decl, value, cast, expected
):
    admin.execute(f"CREATE TABLE {schema}.t (id int, v {decl})")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, %s)", (value,))
    with pytest.raises(SchemaMismatch) as info:
        _read(source, make_request)
    assert expected in info.value.message and "'v'" in info.value.message
    # The hint's option as written works (it said casts: {"v": "text"}, which
    # the source's `casts`, keyed table.column, refused).
    assert f'casts: {{"{schema}.t.v": "text"}}' in (info.value.hint or "")
    casting = PostgresSource(
        {"dsn": pg_dsn, "schemas": [schema], "casts": {f"{schema}.t.v": "text"}}
    )
    messages = _read(casting, make_request)
    assert messages[0].batch.column("v").to_pylist() == [cast]
    messages = _read(source, make_request, options={"casts": {"v": "text"}})
    assert messages[0].batch.column("v").to_pylist() == [cast]


def test_an_interval_read_as_itself_is_refused_naming_the_cast(admin, schema, source, make_request):
    """Its Arrow type has no identity encoding: a capture would fail after reading it all."""
    admin.execute(f"CREATE TABLE {schema}.t (id int, v interval)")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, '3000000 hours')")
    with pytest.raises(ConfigError) as info:
        _read(source, make_request)
    assert "column 'v'" in info.value.message and "casts" in (info.value.hint or "")
    messages = _read(source, make_request, options={"casts": {"v": "text"}})
    assert messages[0].batch.column("v").to_pylist() == ["3000000:00:00"]


@pytest.mark.parametrize(
    ("decl", "value", "text"),
    [
        ("money", "12.34", None),
        ("int4range", "[1,5)", "[1,5)"),
        ("point", "(1,2)", "(1,2)"),
        ("tsvector", "a b", "'a' 'b'"),
    ],
)
def test_unmappable_types_name_the_column(admin, schema, source, make_request, decl, value, text):
    admin.execute(f"CREATE TABLE {schema}.t (id int, v {decl})")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, %s)", (value,))
    with pytest.raises(UnsupportedType) as info:
        _read(source, make_request)
    assert "'v'" in info.value.message and decl in info.value.message
    assert info.value.context["column"] == "v"
    got = _read(source, make_request, options={"casts": {"v": "text"}})[0].batch
    if text is not None:
        assert got.column("v").to_pylist() == [text]
    else:  # money's text depends on lc_monetary: a numeric cast is exact
        numeric = _read(source, make_request, options={"casts": {"v": "numeric(12,2)"}})
        assert numeric[0].batch.column("v").to_pylist() == [Decimal("12.34")]
        assert numeric[0].batch.schema.field("v").type == pa.decimal128(12, 2)


def test_a_cast_of_an_unknown_column_or_type_is_refused(admin, schema, source, make_request):
    admin.execute(f"CREATE TABLE {schema}.t (id int, v money)")
    with pytest.raises(ConfigError, match="'nope'"):
        _read(source, make_request, options={"casts": {"nope": "text"}})
    with pytest.raises(ConfigError, match="not supported"):
        _read(source, make_request, options={"casts": {"v": "text; drop table x"}})


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(
        st.decimals(
            min_value=Decimal("-1e27"),
            max_value=Decimal("1e27"),
            places=10,
            allow_nan=False,
            allow_infinity=False,
        ),
        min_size=1,
        max_size=40,
    )
)
def test_numeric_values_are_exact(admin, schema, source, make_request, values):
    table = f"n_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE TABLE {schema}.{table} (id serial, v numeric(38, 10))")
    with admin.cursor() as cur:
        cur.executemany(f"INSERT INTO {schema}.{table} (v) VALUES (%s)", [(v,) for v in values])
    messages = _read(source, make_request, table=table)
    got = pa.Table.from_batches([m.batch for m in messages[:-1]]).sort_by("id")
    assert got.column("v").to_pylist() == values


# -- mapping decisions without a server ----------------------------------------


def _types() -> dict[int, PgType]:
    return {
        NUMERIC: PgType(NUMERIC, "numeric", "b", "N", 0, -1, 0),
        1231: PgType(1231, "numeric[]", "b", "A", 0, -1, NUMERIC),
        9001: PgType(9001, "amount", "d", "N", NUMERIC, numeric_typmod_for(12, 2), 0),
        9002: PgType(9002, "amounts", "d", "A", 1231, numeric_typmod_for(8, 3), 0),
        9003: PgType(9003, "mood", "e", "E", 0, -1, 0),
        9004: PgType(9004, "pt", "b", "G", 0, -1, 0),
    }


def numeric_typmod_for(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def test_numeric_typmod_decodes_precision_and_negative_scale():
    assert numeric_typmod(-1) is None
    assert numeric_typmod(numeric_typmod_for(20, 4)) == (20, 4)
    assert numeric_typmod(numeric_typmod_for(5, -2)) == (5, -2)


@pytest.mark.parametrize(
    ("precision", "scale", "wanted"),
    [
        (5, -2, pa.decimal128(7, 0)),
        (3, 5, pa.decimal128(5, 5)),
        (37, -3, pa.decimal256(40, 0)),
        (1, 77, None),
        (70, -7, None),
        (38, 38, pa.decimal128(38, 38)),
    ],
)
def test_a_numeric_typmod_reads_as_the_decimal_holding_its_values_in_snapshot_and_stream(
    precision: int, scale: int, wanted: pa.DataType | None
) -> None:
    # decimal128(5, -2) or (3, 5) is held by neither DuckDB, Parquet, Delta
    # nor the identity: every capture of such a column failed at staging.
    from combined.connectors.postgres._text import arrow_type

    typmod = numeric_typmod_for(precision, scale)
    plan = plan_column("n", NUMERIC, typmod, "numeric", {})
    assert plan.arrow_type == (pa.string() if wanted is None else wanted)
    assert arrow_type(NUMERIC, typmod) == plan.arrow_type
    # numeric[]: over 38 digits as text, which a list of decimals cannot be identified by
    element = pa.string() if pa.types.is_decimal256(plan.arrow_type) else plan.arrow_type
    assert arrow_type(1231, typmod) == pa.list_(element)
    types = {1231: PgType(1231, "numeric[]", "b", "A", 0, -1, NUMERIC)}
    assert plan_column("a", 1231, typmod, "numeric[]", types).arrow_type == pa.list_(element)


def test_domains_resolve_to_their_base_with_the_domains_typmod():
    types = _types()
    assert plan_column("a", 9001, -1, "amount", types).arrow_type == pa.decimal128(12, 2)
    over_array = plan_column("a", 9002, -1, "amounts", types)
    assert over_array.arrow_type == pa.list_(pa.decimal128(8, 3)) and over_array.ndims_check
    assert plan_column("a", NUMERIC, -1, "numeric", types).arrow_type == pa.string()
    assert plan_column("a", 9003, -1, "mood", types).arrow_type == pa.string()
    geometric = plan_column("a", 9004, -1, "pt", types)
    assert geometric.route == "unsupported" and "pt" in (geometric.reason or "")


def test_values_read_as_text_become_exact_python_values():
    types = _types()
    num = plan_column("a", NUMERIC, numeric_typmod_for(20, 4), "numeric(20,4)", types)
    assert value_from_text("1.2500", num, hint="h") == Decimal("1.2500")
    with pytest.raises(SchemaMismatch) as info:
        value_from_text("NaN", num, hint="what to do")
    assert info.value.hint == "what to do"
    assert jsonable(datetime(2024, 1, 1, tzinfo=UTC)) == "2024-01-01T00:00:00+00:00"
    assert jsonable(Decimal("1.50")) == "1.50" and jsonable(7) == 7
