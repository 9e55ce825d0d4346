"""Partitioned and inheritance parents through snapshot, cursor and backfill captures."""

from __future__ import annotations

from pathlib import Path

import psycopg

from combined.engine import Engine

PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      measures:
        relation: public.measures
        key: [id, day]
        batch_rows: 700
      measures_by_cursor:
        relation: public.measures
        key: [id, day]
        strategy: cursor
        cursor:
          column: id
          trust: "measures.id is a bigserial assigned on insert"
      animals:
        relation: public.animals
        key: [id]
"""

SETUP = """
CREATE TABLE measures (id bigserial, day date NOT NULL, v int, PRIMARY KEY (id, day))
  PARTITION BY RANGE (day);
CREATE TABLE measures_2024 PARTITION OF measures
  FOR VALUES FROM ('2024-01-01') TO ('2025-01-01') PARTITION BY RANGE (day);
CREATE TABLE measures_2024_h1 PARTITION OF measures_2024
  FOR VALUES FROM ('2024-01-01') TO ('2024-07-01');
CREATE TABLE measures_2024_h2 PARTITION OF measures_2024
  FOR VALUES FROM ('2024-07-01') TO ('2025-01-01');
CREATE TABLE measures_2025 PARTITION OF measures FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE measures_rest PARTITION OF measures DEFAULT;
INSERT INTO measures (day, v)
  SELECT DATE '2024-01-01' + (g % 1000), g FROM generate_series(1, 3000) g;
CREATE TABLE animals (id int PRIMARY KEY, name text);
CREATE TABLE dogs (breed text) INHERITS (animals);
INSERT INTO animals VALUES (1, 'generic');
INSERT INTO dogs VALUES (2, 'rex', 'collie'), (3, 'fido', 'pug');
"""


def _source(dsn: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(query))


def test_a_partitioned_parent_lands_every_partitions_rows_once(
    tmp_path: Path, pg_database: str, tools
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(SETUP)
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        runs = engine.capture(["pg.measures", "pg.measures_by_cursor"])
        assert [r.state for r in runs] == ["succeeded"], [r.error for r in runs]
        (run,) = runs
        assert run.stats is not None
        assert run.stats["measures"]["reconciliation"] == "reconciled"
        query = "SELECT id, day, v FROM {} ORDER BY id"
        expected = _source(pg_database, query.format("measures"))
        assert len(expected) == 3000
        for name in ("measures", "measures_by_cursor"):
            lake = engine.sql(query.format(f"pg.{name}")).to_pylist()
            assert [tuple(r.values()) for r in lake] == expected
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE measures SET day = '2025-06-01', v = -1 WHERE id <= 10")
            conn.execute("DELETE FROM measures WHERE id BETWEEN 11 AND 20")
            conn.execute(
                "INSERT INTO measures (day, v) VALUES ('2030-01-01', 7), ('2024-08-08', 8)"
            )
        (run,) = engine.capture(["pg.measures", "pg.measures_by_cursor"])
        assert run.state == "succeeded", run.error
        assert engine.sql(query.format("pg.measures")).num_rows == 2992
        lake = engine.sql(query.format("pg.measures")).to_pylist()
        assert [tuple(r.values()) for r in lake] == _source(pg_database, query.format("measures"))
        # The cursor reads what follows its watermark, across every partition.
        latest = engine.sql("SELECT max(id) AS m FROM pg.measures_by_cursor").to_pylist()
        assert latest == [{"m": 3002}]
    finally:
        engine.close()

    backfill = tools.cli(
        tmp_path, "backfill", "pg.measures", "--partitions", "3", "--from", "1", "--to", "3003"
    )
    assert backfill.returncode == 0, backfill.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        lake = engine.sql("SELECT id, day, v FROM pg.measures ORDER BY id").to_pylist()
        assert [tuple(r.values()) for r in lake] == _source(
            pg_database, "SELECT id, day, v FROM measures ORDER BY id"
        )
    finally:
        engine.close()


def test_an_inheritance_parent_reads_as_sql_reads_it_with_its_children(
    tmp_path: Path, pg_database: str, tools
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(SETUP)
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database))
    # Discovery lists the child next to its parent, and says what that means.
    found = tools.cli(tmp_path, "discover", "pg", env={"COLUMNS": "400"})
    assert found.returncode == 0, found.stderr
    assert "note: inheritance parent of public.dogs: a read returns their rows too" in found.stdout
    assert "note: inherits from public.animals, whose reads return" in found.stdout
    assert "note: partitioned table: a read returns the rows of its 3 partitions" in found.stdout
    assert "measures_2024" not in found.stdout
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture(["pg.animals"])
        assert run.state == "succeeded", run.error
        lake = engine.sql("SELECT id, name FROM pg.animals ORDER BY id").to_pylist()
        assert [tuple(r.values()) for r in lake] == [(1, "generic"), (2, "rex"), (3, "fido")]
    finally:
        engine.close()
