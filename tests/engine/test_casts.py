"""A declared cast changes the column's declared type, whatever the source type."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pymysql

from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine

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
