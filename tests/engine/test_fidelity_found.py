"""Defects the random fidelity tests (``test_fidelity_random.py``) found, each pinned.

Each test captures a table as a ``snapshot`` and as a ``cdc`` dataset,
changes it, captures again and compares the lake with the source value by
value, the source read as its type's own text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine._binlog import Binlog

from combined.engine import Engine

PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      snap: {{relation: public.t, key: [{key}]}}
      feed: {{relation: public.t, key: [{key}], strategy: cdc}}
"""


def _open(tmp_path: Path, cdc_db: Any, key: str, *statements: str) -> Engine:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
    path = tmp_path / "combined.yaml"
    path.write_text(PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, key=key))
    cdc_db.slot("public.t")
    return Engine.open(path)


def _capture(engine: Engine) -> None:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error


def _change(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _source(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(query)]


def _lake(engine: Engine, dataset: str, columns: str) -> list[tuple[Any, ...]]:
    rows = engine.sql(f"SELECT {columns} FROM pg.{dataset} ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def test_an_inet_lands_as_its_own_text_from_the_snapshot_and_the_stream_alike(
    tmp_path: Path, cdc_db: Any
) -> None:
    # The snapshot read inet as CAST(c AS text), a function of its own that adds
    # the mask ('::1/128' for '::1', '1.2.3.4/32' for '1.2.3.4'), while the
    # stream sends the type's output ('::1'): a row's text changed with the
    # path that read it last.
    engine = _open(
        tmp_path,
        cdc_db,
        "id",
        "CREATE TABLE t (id int PRIMARY KEY, a inet, l inet[], n int)",
        "INSERT INTO t VALUES (1, '::1', ARRAY['1.2.3.4'::inet, NULL, '10.0.0.0/8'], 1),"
        " (2, '192.168.0.1/24', '{}', 2), (3, NULL, NULL, 3)",
    )
    try:
        _capture(engine)
        # The server's own text of each value (its output function).
        assert _source(cdc_db.dsn, "SELECT format('%s', a) FROM t WHERE id < 3 ORDER BY id") == [
            ("::1",),
            ("192.168.0.1/24",),
        ]
        for dataset in ("snap", "feed"):
            assert _lake(engine, dataset, "id, a, l") == [
                (1, "::1", ["1.2.3.4", None, "10.0.0.0/8"]),
                (2, "192.168.0.1/24", []),
                (3, None, None),
            ]
        _change(cdc_db.dsn, "UPDATE t SET a = '2001:db8::1', n = 5 WHERE id = 3")
        _capture(engine)
        for dataset in ("snap", "feed"):
            assert _lake(engine, dataset, "id, a")[2] == (3, "2001:db8::1")
    finally:
        engine.close()


def test_an_xml_lands_as_its_own_text_from_the_snapshot_and_the_stream_alike(
    tmp_path: Path, cdc_db: Any
) -> None:
    # The snapshot read xml as CAST(c AS text), its stored text, while the stream
    # sends the type's output, which drops a declaration of version 1.0 alone:
    # a no-op UPDATE turned '<?xml version="1.0"?><a/>' into '<a/>' in the lake.
    decl, standalone = '<?xml version="1.0"?><a/>', '<?xml version="1.0" standalone="yes"?><b/>'
    engine = _open(
        tmp_path,
        cdc_db,
        "id",
        "CREATE TABLE t (id int PRIMARY KEY, x xml, l xml[], b bool)",
        f"INSERT INTO t VALUES (1, '{decl}', ARRAY['{decl}'::xml, NULL, 'c'], true),"
        f" (2, '{standalone}', '{{}}', false), (3, NULL, NULL, true), (4, '', NULL, false)",
    )
    want = [
        (1, "<a/>", ["<a/>", None, "c"]),
        (2, standalone, []),
        (3, None, None),
        (4, "", None),
    ]
    try:
        _capture(engine)
        # The server's own text of each value (its output function).
        output = "SELECT format('%s', x) FROM t WHERE id IN (1, 2) ORDER BY id"
        assert _source(cdc_db.dsn, output) == [("<a/>",), (standalone,)]
        for dataset in ("snap", "feed"):
            assert _lake(engine, dataset, "id, x, l") == want
        _change(cdc_db.dsn, "UPDATE t SET b = b")  # each row streamed as it is
        _capture(engine)
        for dataset in ("snap", "feed"):
            assert _lake(engine, dataset, "id, x, l") == want
    finally:
        engine.close()


def test_an_array_of_numerics_over_38_digits_is_captured_as_their_text(
    tmp_path: Path, cdc_db: Any
) -> None:
    # numeric(50,20)[] read as list<decimal256>, which no identity encodes: every
    # capture failed ("cast it to text"), and a cdc dataset takes no casts.
    engine = _open(
        tmp_path,
        cdc_db,
        "id",
        "CREATE TABLE t (id int PRIMARY KEY, a numeric(50,20)[])",
        "INSERT INTO t VALUES (1, ARRAY[-999999999999999999999999999999.99999999999999999999,"
        " NULL, 0.00000000000000000001]), (2, '{}'), (3, NULL)",
    )
    source = (
        "SELECT id, (SELECT array_agg(x::text ORDER BY o) FROM unnest(a) WITH ORDINALITY u(x, o))"
        " FROM t ORDER BY id"
    )
    try:
        _capture(engine)
        _change(
            cdc_db.dsn,
            "UPDATE t SET a = ARRAY[1.5, NULL]::numeric(50,20)[] WHERE id = 3",
            "INSERT INTO t VALUES (4, ARRAY[12345678901234567890123456789.1])",
        )
        _capture(engine)
        want = [(i, [] if i == 2 else a) for i, a in _source(cdc_db.dsn, source)]
        assert want[0][1] == [
            "-999999999999999999999999999999.99999999999999999999",
            None,
            "0.00000000000000000001",
        ]
        for dataset in ("snap", "feed"):
            assert _lake(engine, dataset, "id, a") == want
    finally:
        engine.close()


def test_an_update_of_a_row_whose_key_is_stored_out_of_line_stays_that_rows(
    tmp_path: Path, cdc_db: Any
) -> None:
    # A key value stored out of line (TOAST) and left unchanged is not in the new
    # row: PostgreSQL sends it in the old key instead. The stream took the key as
    # NULL: the lake kept the old row and gained a row with a NULL key.
    long = "(SELECT string_agg(md5(i::text || {s}), '') FROM generate_series(1, 70) i)"
    engine = _open(
        tmp_path,
        cdc_db,
        "k, id",
        "CREATE TABLE t (k text, id int, v int, PRIMARY KEY (k, id))",
        "ALTER TABLE t ALTER COLUMN k SET STORAGE EXTERNAL",  # out of line past ~2 kB
        f"INSERT INTO t SELECT {long.format(s='g')}, g, g FROM generate_series(1, 4) g",
    )
    query = "SELECT md5(k), id, v FROM {} ORDER BY id"
    try:
        _capture(engine)
        _change(
            cdc_db.dsn,
            "UPDATE t SET v = -v WHERE id = 1",  # the key unchanged
            "UPDATE t SET id = 20 WHERE id = 2",  # half the key moved, its text not
            "DELETE FROM t WHERE id = 3",
        )
        _capture(engine)
        source = _source(cdc_db.dsn, query.format("t"))
        assert [r[1:] for r in source] == [(1, -1), (4, 4), (20, 2)]
        for dataset in ("snap", "feed"):
            assert [
                tuple(r.values()) for r in engine.sql(query.format(f"pg.{dataset}")).to_pylist()
            ] == source
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("type_", "value"),
    [
        ("timestamp", "'294276-12-31 23:59:59'"),
        ("timestamptz", "'294276-12-31 23:59:59+00'"),
        ("timestamp[]", "ARRAY['294276-12-31 23:59:59'::timestamp]"),
        ("int[]", "'{{1,2},{3,4}}'"),
    ],
)
def test_a_value_the_lake_cannot_hold_stops_the_stream_naming_its_column(
    tmp_path: Path, cdc_db: Any, type_: str, value: str
) -> None:
    # A timestamp past Arrow's range (year 294276, which PostgreSQL holds)
    # failed the stream's capture as "Python int too large to convert to C
    # long", a `failed` Run as if a retry could help; the snapshot named it.
    engine = _open(
        tmp_path,
        cdc_db,
        "id",
        f"CREATE TABLE t (id int PRIMARY KEY, v {type_})",
        "INSERT INTO t VALUES (1, NULL)",
    )
    try:
        _capture(engine)
        _change(cdc_db.dsn, f"UPDATE t SET v = {value} WHERE id = 1")
        for dataset in ("snap", "feed"):  # alone: the Run ends at the first dataset's error
            (run,) = engine.capture([f"pg.{dataset}"])
            assert run.state == "needs_review", run.error
            assert "column 'v'" in (run.error or "")
            assert engine.sql(f"SELECT v FROM pg.{dataset}").to_pylist() == [{"v": None}]
    finally:
        engine.close()


ARRAYS = ["bit(3)", "varbit(4)", "timetz", "pg_lsn", "macaddr8", "jsonpath"]


def test_arrays_of_every_text_type_stream_as_the_snapshot_reads_them(
    tmp_path: Path, cdc_db: Any
) -> None:
    # bit[], varbit[], timetz[], pg_lsn[], macaddr8[] and jsonpath[] were read
    # by the snapshot, and the stream failed on the first change of such a row
    # ("type oid 1561 without an arrow mapping").
    columns = ", ".join(f"a{i} {t}[]" for i, t in enumerate(ARRAYS))
    values = (
        "'{101,NULL}', '{\"\",1}', '{12:00:00+05:30}', '{0/1,FF/FF}',"
        " '{08:00:2b:01:02:03:04:05}', '{$.a}'"
    )
    engine = _open(
        tmp_path,
        cdc_db,
        "id",
        f"CREATE TABLE t (id int PRIMARY KEY, {columns})",
        f"INSERT INTO t VALUES (1, {values})",
    )
    texts = ", ".join(
        f"(SELECT array_agg(x::text ORDER BY o) FROM unnest(a{i}) WITH ORDINALITY u(x, o))"
        for i in range(len(ARRAYS))
    )
    names = ", ".join(f"a{i}" for i in range(len(ARRAYS)))
    try:
        _capture(engine)
        _change(cdc_db.dsn, f"INSERT INTO t VALUES (2, {values})", "UPDATE t SET a0 = '{000}'")
        _capture(engine)
        source = _source(cdc_db.dsn, f"SELECT id, {texts} FROM t ORDER BY id")
        assert source[1][1:] == (
            ["000"],
            ["", "1"],
            ["12:00:00+05:30"],
            ["0/1", "FF/FF"],
            ["08:00:2b:01:02:03:04:05"],
            ['$."a"'],
        )
        for dataset in ("snap", "feed"):
            assert _lake(engine, dataset, f"id, {names}") == source
    finally:
        engine.close()


def test_an_empty_char_lands_as_the_empty_text_it_is(tmp_path: Path, cdc_db: Any) -> None:
    # "char" stores '' as a zero byte: the snapshot's driver read it as "\x00".
    engine = _open(
        tmp_path,
        cdc_db,
        "id",
        'CREATE TABLE t (id int PRIMARY KEY, c "char", l "char"[])',
        "INSERT INTO t VALUES (1, '', ARRAY['', 'a', NULL]::\"char\"[]), (2, 'b', '{}')",
    )
    try:
        _capture(engine)
        _change(cdc_db.dsn, "INSERT INTO t VALUES (3, '', ARRAY['']::\"char\"[])")
        _capture(engine)
        want = [(1, "", ["", "a", None]), (2, "b", []), (3, "", [""])]
        for dataset in ("snap", "feed"):
            assert _lake(engine, dataset, "id, c, l") == want
    finally:
        engine.close()


def test_an_inet6_streams_as_the_text_the_server_writes(binlog: Binlog) -> None:
    # The binlog's INET6 was written by Python 3.11's rules: '::ffff:102:304' for
    # the server's '::ffff:1.2.3.4', '::102:304' for '::1.2.3.4'.
    addresses = ["::ffff:1.2.3.4", "::1.2.3.4", "::0.0.1.0", "::ffff:0:1.2.3.4", "2001:db8::1"]
    binlog.sql("ALTER TABLE {t} ADD COLUMN a INET6")
    engine = Engine.open(binlog.project())
    try:
        _capture(engine)
        binlog.sql(
            *(f"UPDATE {{t}} SET a = '{a}' WHERE id = {i}" for i, a in enumerate(addresses, 1))
        )
        _capture(engine)
        source = binlog.sql("SELECT id, CAST(a AS CHAR) FROM {t} WHERE id <= 5 ORDER BY id")
        assert [r[1] for r in source] == [
            "::ffff:1.2.3.4",
            "::1.2.3.4",
            "::100",
            "::ffff:0:102:304",
            "2001:db8::1",
        ]
        lake = engine.sql("SELECT id, a FROM db.items WHERE id <= 5 ORDER BY id").to_pylist()
        assert [tuple(r.values()) for r in lake] == [tuple(r) for r in source]
    finally:
        engine.close()


def test_far_dates_and_small_decimals_print_as_their_text(
    tmp_path: Path, cdc_db: Any, tools: Any
) -> None:
    """`combined sql` and `explain` failed (exit 70) on a date past 9999, which the lake keeps,
    and printed a decimal of 0.0000000001 as 1E-10."""
    engine = _open(
        tmp_path,
        cdc_db,
        "id",
        "CREATE TABLE t (id int PRIMARY KEY, d date, ts timestamptz, n numeric(38,10))",
        "INSERT INTO t VALUES (1, '10000-01-01', '0001-01-01 00:00+00 BC', -0.0000000001),"
        " (2, '2024-05-06', '2024-05-06 07:08:09+00', 0)",
    )
    try:
        _capture(engine)
    finally:
        engine.close()
    query = "SELECT id, d, ts, n FROM pg.snap ORDER BY id"
    shown = tools.cli(tmp_path, "sql", "--format", "json", query)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert [(r["d"], r["n"]) for r in rows] == [
        ("10000-01-01", "-0.0000000001"),
        ("2024-05-06", "0.0000000000"),
    ]
    assert rows[0]["ts"].startswith("0000-01-01") and rows[1]["ts"].startswith("2024-05-06")
    for fmt in ("csv", "table"):
        shown = tools.cli(tmp_path, "sql", "--format", fmt, query)
        assert shown.returncode == 0, shown.stderr
        assert "10000-01-01" in shown.stdout and "-0.0000000001" in shown.stdout
        assert "E-10" not in shown.stdout
    explained = tools.cli(tmp_path, "explain", "pg.snap", "1")
    assert explained.returncode == 0, explained.stderr
    assert "10000-01-01" in explained.stdout and '"-0.0000000001"' in explained.stdout
    assert "E-10" not in explained.stdout
