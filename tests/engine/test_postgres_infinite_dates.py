"""PostgreSQL dates of ``infinity`` and ``-infinity`` (``valid_to = 'infinity'``).

Every read of such a table stopped: the snapshot and a cursor read with "holds
infinity or a value arrow cannot hold" and a hint to cast the column to text,
the stream with "not a valid date32[day]". They now land as the day counts
+-(2**31 - 1), which DuckDB (and so ``combined sql``) reads as +-infinity.
Each test compares the lake's day counts with the source's, value by value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine.test_postgres_drift import _sql

from combined.engine import Engine

TABLE = "CREATE TABLE t (id int PRIMARY KEY, u int NOT NULL, d date, da date[])"
ROWS = (
    "INSERT INTO t VALUES ({o} + 1, {o} + 1, 'infinity', '{{infinity,-infinity,NULL}}'),"
    " ({o} + 2, {o} + 2, '-infinity', NULL), ({o} + 3, {o} + 3, '5874897-12-31', '{{}}'),"
    " ({o} + 4, {o} + 4, '4714-11-24 BC', '{{2024-02-29,infinity}}'),"
    " ({o} + 5, {o} + 5, '2024-02-29', NULL), ({o} + 6, {o} + 6, NULL, '{{-infinity}}')"
)
INF = 2**31 - 1


def _days(column: str) -> str:
    """PostgreSQL: a date's day count since 1970, DuckDB's for +-infinity."""
    return (
        f"CASE WHEN {column} = 'infinity' THEN {INF} WHEN {column} = '-infinity' THEN -{INF}"
        f" ELSE {column} - DATE '1970-01-01' END"
    )


SOURCE = (
    f"SELECT id, {_days('d')}, d = 'infinity', d = '-infinity',"
    f" CASE WHEN da IS NOT NULL THEN ARRAY(SELECT {_days('x')} FROM unnest(da) x) END"
    " FROM t ORDER BY id"
)
# DuckDB: the day count is the stored one, and 'infinity'::date compares with it.
LAKE = (
    "SELECT id, d - DATE '1970-01-01', d = 'infinity'::date, d = '-infinity'::date,"
    " [x - DATE '1970-01-01' FOR x IN da] FROM pg.items ORDER BY id"
)


def _source(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(SOURCE))


def _lake_rows(engine: Engine, query: str) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in engine.sql(query).to_pylist()]


def _lake(engine: Engine) -> list[tuple[Any, ...]]:
    return _lake_rows(engine, LAKE)


def _opened(tmp_path: Path, dsn: str, tools: Any, read: str) -> Engine:
    """A project capturing ``public.t`` as ``pg.items``, read as ``read`` says."""
    project = tools.pg_cdc_project(dsn, "unused", "public.t", ["id"])
    (tmp_path / "combined.yaml").write_text(project.replace("        strategy: cdc\n", read))
    return Engine.open(tmp_path / "combined.yaml")


def _capture(engine: Engine) -> Any:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return run


def _same(engine: Engine, dsn: str, rows: int) -> None:
    source = _source(dsn)
    lake = _lake(engine)
    assert len(lake) == rows and lake == source
    assert {INF, -INF} <= {r[1] for r in source}  # the infinities are there


@pytest.mark.parametrize(
    "read",
    ["", "        strategy: cursor\n        cursor: {column: u, trust: a sequence}\n"],
    ids=["snapshot", "cursor"],
)
def test_infinite_dates_land_as_duckdbs_infinities(
    tmp_path: Path, pg_database: str, read: str, tools: Any
) -> None:
    _sql(pg_database, TABLE, ROWS.format(o=0))
    engine = _opened(tmp_path, pg_database, tools, read)
    try:
        _capture(engine)
        _same(engine, pg_database, 6)
        # More rows, and a change to the infinite ones, in a second commit.
        _sql(
            pg_database,
            ROWS.format(o=10),
            "UPDATE t SET d = '-infinity', u = u + 100 WHERE id = 1",
            "UPDATE t SET d = 'infinity', u = u + 100 WHERE id = 2",
        )
        _capture(engine)
        _same(engine, pg_database, 12)
        text = engine.sql("SELECT CAST(d AS VARCHAR) AS d FROM pg.items WHERE id IN (11, 12)")
        assert sorted(r["d"] for r in text.to_pylist()) == ["-infinity", "infinity"]
        # `combined sql` wrote "<value out of range: 2147483647>" for them.
        query = "SELECT id, d, da FROM pg.items WHERE id IN (1, 2, 3, 4) ORDER BY id"
        out = tools.cli(tmp_path, "sql", query, "--format", "json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [
            {"id": 1, "d": "-infinity", "da": ["infinity", "-infinity", None]},
            {"id": 2, "d": "infinity", "da": None},
            {"id": 3, "d": "5874897-12-31", "da": []},
            {"id": 4, "d": "-4713-11-24", "da": ["2024-02-29", "infinity"]},
        ]
    finally:
        engine.close()


@pytest.fixture
def opened(tmp_path: Path, cdc_db: Any, tools: Any) -> Callable[..., Engine]:
    """Run the statements, then open a project capturing ``public.t`` by cdc."""

    def open_(*statements: str) -> Engine:
        _sql(cdc_db.dsn, *statements)
        project = tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.t", ["id"])
        (tmp_path / "combined.yaml").write_text(project)
        cdc_db.slot("public.t")
        return Engine.open(tmp_path / "combined.yaml")

    return open_


def test_infinite_dates_stream_as_the_snapshot_reads_them(
    opened: Callable[..., Engine], cdc_db: Any
) -> None:
    engine = opened(TABLE, ROWS.format(o=0))
    try:
        _capture(engine)
        _sql(
            cdc_db.dsn,
            ROWS.format(o=10),
            "UPDATE t SET d = '-infinity', da = '{infinity}' WHERE id = 1",
            "UPDATE t SET d = 'infinity' WHERE id IN (2, 5)",
            "DELETE FROM t WHERE id = 11",
        )
        _capture(engine)
        _same(engine, cdc_db.dsn, 11)
    finally:
        engine.close()


def test_an_infinite_date_in_the_key_streams_its_updates_and_deletes(
    tmp_path: Path, cdc_db: Any, tools: Any
) -> None:
    # valid_to in the key: the stream finds the lake row by its infinite date.
    _sql(
        cdc_db.dsn,
        "CREATE TABLE t (id int, d date, v text, PRIMARY KEY (id, d))",
        "INSERT INTO t VALUES (1, 'infinity', 'a'), (1, '2024-01-01', 'b'),"
        " (2, '-infinity', 'c'), (3, 'infinity', 'd')",
    )
    project = tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.t", ["id", "d"])
    (tmp_path / "combined.yaml").write_text(project)
    cdc_db.slot("public.t")
    engine = Engine.open(tmp_path / "combined.yaml")
    query = "SELECT id, {}, v FROM {} ORDER BY id, v"
    try:
        _capture(engine)
        _sql(
            cdc_db.dsn,
            "UPDATE t SET v = 'a2' WHERE id = 1 AND d = 'infinity'",
            "UPDATE t SET d = 'infinity' WHERE id = 2",  # a key change
            "DELETE FROM t WHERE id = 3",
            "INSERT INTO t VALUES (4, '-infinity', 'e')",
        )
        _capture(engine)
        lake = _lake_rows(engine, query.format("d - DATE '1970-01-01'", "pg.items"))
        with psycopg.connect(cdc_db.dsn) as conn:
            source = list(conn.execute(query.format(_days("d"), "t")))
        assert lake == source == [(1, INF, "a2"), (1, 19723, "b"), (2, INF, "c"), (4, -INF, "e")]
    finally:
        engine.close()


def test_a_partitioned_backfill_reconciles_infinite_dates(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    # The source's count of each range is compared with what landed in it.
    _sql(pg_database, TABLE, ROWS.format(o=0), ROWS.format(o=10))
    engine = _opened(tmp_path, pg_database, tools, "")
    try:
        run = engine.backfill("pg.items", partitions=2, lower="1", upper="100")
        assert run.state == "succeeded", run.error
        _same(engine, pg_database, 12)
    finally:
        engine.close()


# Timestamps of +-infinity stopped every read too; they land as the microsecond
# counts +-(2**63 - 1), DuckDB's own, in the replica identity too.
TS_TABLE = "CREATE TABLE t (id int, ts timestamp, tz timestamptz, PRIMARY KEY (id, tz))"
TS_ROWS = (
    "INSERT INTO t VALUES ({o} + 1, 'infinity', '-infinity'), ({o} + 2, '-infinity', 'infinity'),"
    " ({o} + 3, '2024-02-29 12:00', '2024-02-29 12:00+00'), ({o} + 4, NULL, 'infinity')"
)
TS_INF = 2**63 - 1


def _micros(column: str, cast: str = "", of: str = "(extract(epoch FROM {}) * 1e6)") -> str:
    """A timestamp's microseconds since 1970, DuckDB's counts for +-infinity."""
    return (
        f"CASE WHEN {column} = 'infinity'{cast} THEN {TS_INF}"
        f" WHEN {column} = '-infinity'{cast} THEN -{TS_INF} ELSE {of.format(column)}::bigint END"
    )


def test_infinite_timestamps_land_by_snapshot_and_stream(
    opened: Callable[..., Engine], cdc_db: Any
) -> None:
    source = f"SELECT id, {_micros('ts')}, {_micros('tz')} FROM t ORDER BY id, tz"
    ts, tz = (
        _micros(c, f"::{t}", "epoch_us({})")
        for c, t in (("ts", "timestamp"), ("tz", "timestamptz"))
    )
    lake = f"SELECT id, {ts}, {tz} FROM pg.items ORDER BY id, tz"
    engine = opened(TS_TABLE, TS_ROWS.format(o=0))
    try:
        _capture(engine)  # the stitched snapshot
        _sql(
            cdc_db.dsn,
            TS_ROWS.format(o=10),
            "UPDATE t SET ts = '-infinity' WHERE id = 1",
            "UPDATE t SET tz = '2020-01-01 00:00+00' WHERE id = 2",  # a key change
            "DELETE FROM t WHERE id = 14",
        )
        _capture(engine)
        with psycopg.connect(cdc_db.dsn) as conn:
            want = list(conn.execute(source))
        assert _lake_rows(engine, lake) == want and len(want) == 7
        assert {TS_INF, -TS_INF} <= {r[1] for r in want} | {r[2] for r in want}
    finally:
        engine.close()
