"""A declared cast changes the column's declared type, whatever the source type."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pymysql
import pytest

from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine
from combined.errors import ConfigError

PROJECT = """\
version: 1
lake: ./lake
sources:
  db:
    connector: {connector}
    config:
      dsn: {dsn}
      casts: {{"{column}": "text"}}
    datasets:
      spans:
        relation: {relation}
        key: [id]
"""


def _capture(tmp_path: Path, connector: str, dsn: str, column: str, relation: str) -> Engine:
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(connector=connector, dsn=dsn, column=column, relation=relation)
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return engine


def test_a_postgres_interval_cast_to_text_is_captured_as_text(
    tmp_path: Path, pg_database: str
) -> None:
    """casts: {"public.spans.iv": "text"} on an interval column: the read sent
    text, but discovery still declared month_day_nano_interval, so the capture
    failed ("declared month_day_nano_interval, the record holds string").
    """
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE spans (id int PRIMARY KEY, iv interval)")
        conn.execute("INSERT INTO spans VALUES (1, '1 day 2 hours'), (2, NULL)")
    engine = _capture(tmp_path, "postgres", pg_database, "public.spans.iv", "public.spans")
    try:
        assert engine.sql("SELECT id, iv FROM db.spans ORDER BY id").to_pylist() == [
            {"id": 1, "iv": "1 day 02:00:00"},
            {"id": 2, "iv": None},
        ]
    finally:
        engine.close()


def test_a_mariadb_time_cast_to_text_is_captured_as_text(
    tmp_path: Path, mariadb_database: str
) -> None:
    """casts: {"spans_t.dur": "text"} on a TIME column: discovery declared
    time64, the read sent text, and the capture failed as for PostgreSQL.
    """
    kwargs = Settings.from_config({"dsn": mariadb_database}).connect_kwargs()
    kwargs.pop("conv")
    kwargs.pop("cursorclass")
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE spans_t (id INT PRIMARY KEY, dur TIME)")
        cur.execute("INSERT INTO spans_t VALUES (1, '26:03:04'), (2, NULL)")
        conn.commit()
    engine = _capture(tmp_path, "mariadb", mariadb_database, "spans_t.dur", "spans_t")
    try:
        assert engine.sql("SELECT id, dur FROM db.spans ORDER BY id").to_pylist() == [
            {"id": 1, "dur": "26:03:04"},
            {"id": 2, "dur": None},
        ]
    finally:
        engine.close()


def _project(
    tmp_path: Path, connector: str, dsn: str, casts: dict[str, str], relation: str
) -> Engine:
    project = PROJECT.format(connector=connector, dsn=dsn, column="", relation=relation)
    project = project.replace('casts: {"": "text"}', f"casts: {json.dumps(casts)}")
    (tmp_path / "combined.yaml").write_text(project)
    return Engine.open(tmp_path / "combined.yaml")


def test_a_cast_names_a_column_whose_name_holds_a_dot_quoted(
    tmp_path: Path, pg_database: str
) -> None:
    """A range column named "a.b": the key "public.spans.a.b" was cut at the
    column's own dot, the cast filed under a relation "public.spans.a" and
    silently unused, and the refusal's hint said to declare that same key."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute('CREATE TABLE spans (id int PRIMARY KEY, "a.b" int4range, "x""y" interval)')
        conn.execute("INSERT INTO spans VALUES (1, '[1,5)', '1 day'), (2, NULL, NULL)")
    casts = {"public.spans.a.b": "text", 'public.spans."x""y"': "text"}
    engine = _project(tmp_path, "postgres", pg_database, casts, "public.spans")
    try:
        with pytest.raises(ConfigError) as info:
            engine.capture()
        assert info.value.hint is not None
        assert 'declare casts: {"public.spans.\\"a.b\\"": "text"}' in info.value.hint
    finally:
        engine.close()
    casts = {'public.spans."a.b"': "text", 'public.spans."x""y"': "text"}
    engine = _project(tmp_path, "postgres", pg_database, casts, "public.spans")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql('SELECT id, "a.b", "x""y" FROM db.spans ORDER BY id').to_pylist()
        assert rows == [
            {"id": 1, "a.b": "[1,5)", 'x"y': "1 day"},
            {"id": 2, "a.b": None, 'x"y': None},
        ]
    finally:
        engine.close()


def test_a_mariadb_cast_names_a_column_whose_name_holds_a_dot_in_backticks(
    tmp_path: Path, mariadb_database: str
) -> None:
    """The MariaDB form of the above: a POINT column named `a.b`; its refusal was a
    needs_review Run that `combined check` had passed, now an error before any Run."""
    kwargs = Settings.from_config({"dsn": mariadb_database}).connect_kwargs()
    kwargs.pop("conv")
    kwargs.pop("cursorclass")
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE pts (id INT PRIMARY KEY, `a.b` POINT)")
        cur.execute("INSERT INTO pts VALUES (1, POINT(1, 2)), (2, NULL)")
        conn.commit()
    engine = _project(tmp_path, "mariadb", mariadb_database, {"pts.a.b": "text"}, "pts")
    try:
        # Refused before any Run (a needs_review Run, which `check` passed).
        with pytest.raises(ConfigError) as info:
            engine.capture()
        assert 'declare casts: {"pts.`a.b`": "text"}' in (info.value.hint or "")
        with pytest.raises(ConfigError, match="has type point"):
            engine.check("db")
        assert engine.runs() == []
    finally:
        engine.close()
    engine = _project(tmp_path, "mariadb", mariadb_database, {"pts.`a.b`": "text"}, "pts")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql('SELECT id, "a.b" FROM db.spans ORDER BY id').to_pylist()
        assert rows == [{"id": 1, "a.b": "POINT(1 2)"}, {"id": 2, "a.b": None}]
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("column", "relation"),
    [
        ("Sales.T4.r", '\'"Sales"."T4"\''),  # the key `combined check`'s hint names
        ('\\"Sales\\".\\"T4\\".r', "Sales.T4"),
        ("Sales.T4.r", "Sales.T4"),
    ],
)
def test_a_cast_serves_a_quoted_relation_however_either_names_it(
    tmp_path: Path, pg_database: str, column: str, relation: str
) -> None:
    """A dataset of `"Sales"."T4"` found no cast keyed `Sales.T4.r` (its hint's own spelling):
    check failed pointing at that key again; keyed `"Sales"."T4".r`, the check passed and the
    capture failed (the read cast the column, the declared schema did not)."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "Sales"')
        conn.execute('CREATE TABLE "Sales"."T4" (id int PRIMARY KEY, r tstzrange)')
        conn.execute(
            'INSERT INTO "Sales"."T4" VALUES (1, \'[2024-01-01 00:00+00,2024-02-01 00:00+00)\')'
        )
    engine = _capture(tmp_path, "postgres", pg_database, column, relation)
    try:
        engine.check("db")
        ((value,),) = [tuple(r.values()) for r in engine.sql("SELECT r FROM db.spans").to_pylist()]
        assert value.startswith('["2024-01-01')
    finally:
        engine.close()
