"""A dataset's declared key is the one its lake's ids were computed from.

An id is the digest of the key's values (docs/identity.md). Declaring
another key made every row a new id: a cursor's re-read rows were stored
again beside their old versions (the lake held each row twice), a
snapshot's were deleted and inserted again, and both were billed twice.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from combined.engine import Engine

SQLITE = """\
version: 1
lake: ./lake
sources:
  s:
    connector: sqlite
    config:
      path: ./shop.db
    datasets:
      items:
        key: {key}
        strategy: cursor
        cursor: {{column: u, lookback: 10, trust: "set by the application"}}
"""

PG = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      items:
        relation: public.items
        key: {key}
        drift: {{rename: evolve}}
"""


def _open(tmp_path: Path, text: str) -> Engine:
    (tmp_path / "combined.yaml").write_text(text)
    return Engine.open(tmp_path / "combined.yaml")


def _rows(engine: Engine) -> list[tuple[object, ...]]:
    query = "SELECT a, b, v FROM s.items ORDER BY a, b"
    return [tuple(r.values()) for r in engine.sql(query).to_pylist()]


def test_another_key_is_refused_before_any_row_is_stored_twice(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "shop.db")
    con.execute("CREATE TABLE items (a INTEGER PRIMARY KEY, b INTEGER, v TEXT, u INTEGER)")
    con.executemany("INSERT INTO items VALUES (?, ?, 'x', ?)", [(i, 10 * i, i) for i in range(5)])
    con.commit()
    engine = _open(tmp_path, SQLITE.format(key="[a, b]"))
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
    finally:
        engine.close()
    con.execute("UPDATE items SET v = 'y', u = 6 WHERE a = 1")
    con.commit()
    engine = _open(tmp_path, SQLITE.format(key="[a]"))
    try:
        (run,) = engine.capture()
        assert run.state != "succeeded"
        assert "(a, b)" in str(run.error) and "(a)" in str(run.error)
        assert "another name" in str(run.error)
        assert _rows(engine) == [(i, 10 * i, "x") for i in range(5)]  # nothing was committed
        assert engine.usage()[0]["mar"] == 5
    finally:
        engine.close()
    engine = _open(tmp_path, SQLITE.format(key="[a, b]"))  # the key declared again
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["updates"] == 1
        assert _rows(engine) == [(i, 10 * i, "y" if i == 1 else "x") for i in range(5)]
    finally:
        engine.close()
    con.close()


def test_a_key_column_renamed_at_the_source_keeps_its_ids(tmp_path: Path, pg_database: str) -> None:
    # A rename keeps the column's values, so the ids under its new name are
    # the same: declaring the renamed key is accepted and changes no row.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 5) g")
    engine = _open(tmp_path, PG.format(dsn=pg_database, key="[id]"))
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
    finally:
        engine.close()
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE items RENAME COLUMN id TO item_id")
    engine = _open(tmp_path, PG.format(dsn=pg_database, key="[item_id]"))
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert (run.stats["items"]["inserts"], run.stats["items"]["deletes"]) == (0, 0)
        (again,) = engine.capture()
        assert again.state == "succeeded", again.error
        rows = engine.sql("SELECT item_id, v FROM pg.items ORDER BY item_id").to_pylist()
        assert rows == [{"item_id": i, "v": "x"} for i in range(1, 6)]
    finally:
        engine.close()
