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
