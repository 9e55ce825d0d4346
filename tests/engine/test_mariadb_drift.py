"""Schema drift over a real MariaDB source: a renamed column meets the rename policy."""

from __future__ import annotations

import uuid
from pathlib import Path

import pymysql

from combined.catalog import data as cat
from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine

PROJECT = """\
version: 1
lake: ./lake
sources:
  shop:
    connector: mariadb
    config:
      dsn: {dsn}
    datasets:
      items:
        relation: {table}
        key: [id]
        drift: {{rename: {rename}, drop: evolve, new_field: evolve}}
"""


def _sql(dsn: str, *statements: str) -> None:
    kwargs = Settings.from_config({"dsn": dsn}).connect_kwargs()
    kwargs.pop("conv")
    kwargs.pop("cursorclass")
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        conn.commit()


def test_a_renamed_column_meets_the_rename_policy(tmp_path: Path, mariadb_database: str) -> None:
    """With drift {rename: fail, drop: evolve, new_field: evolve}, ALTER TABLE
    ... CHANGE c label evolved silently as a drop and a new field. MariaDB
    keeps a renamed column at its position with its type: that is a rename.
    """
    table = f"items_{uuid.uuid4().hex[:8]}"
    _sql(
        mariadb_database,
        f"CREATE TABLE {table} (id INT PRIMARY KEY, a INT, c VARCHAR(20))",
        f"INSERT INTO {table} VALUES (1, 1, 'c1'), (2, 2, 'c2')",
    )
    project = tmp_path / "combined.yaml"
    project.write_text(PROJECT.format(dsn=mariadb_database, table=table, rename="fail"))
    engine = Engine.open(project)
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        _sql(mariadb_database, f"ALTER TABLE {table} CHANGE c label VARCHAR(20)")
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "rename on field 'label' (was 'c') (policy: fail)" in (run.error or "")
        with engine.catalog.begin() as conn:
            (event,) = cat.activity(conn, kind="drift")
        assert (event.body["class"], event.body["from"]) == ("rename", "c")
    finally:
        engine.close()


def test_a_column_added_with_a_default_under_a_cursor_is_filled_on_every_row(
    tmp_path: Path, mariadb_database: str
) -> None:
    """A cursor read carries the rows past its checkpoint: the default's
    value on every older row stayed NULL in the lake, and the capture passed."""
    table = f"items_{uuid.uuid4().hex[:8]}"
    _sql(
        mariadb_database,
        f"CREATE TABLE {table} (id INT PRIMARY KEY, a INT, u INT NOT NULL)",
        f"INSERT INTO {table} VALUES (1, 1, 1), (2, 2, 2), (3, 3, 3)",
    )
    project = tmp_path / "combined.yaml"
    text = PROJECT.format(dsn=mariadb_database, table=table, rename="fail")
    cursor = "        strategy: cursor\n        cursor: {column: u, trust: a sequence}\n"
    project.write_text(text + cursor)
    engine = Engine.open(project)
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        _sql(
            mariadb_database,
            f"ALTER TABLE {table} ADD COLUMN flag INT NOT NULL DEFAULT 7",
            f"INSERT INTO {table} VALUES (4, 4, 4, 0)",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, flag FROM shop.items ORDER BY id").to_pylist()
        assert [(r["id"], r["flag"]) for r in rows] == [(1, 7), (2, 7), (3, 7), (4, 0)]
    finally:
        engine.close()
