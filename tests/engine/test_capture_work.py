"""The work a snapshot capture does for its rows, counted rather than timed.

An unchanged re-capture of a PostgreSQL table compares the staged rows'
digests with the lake's without streaming the staged rows through DuckDB,
and still tells a moved payload from an unchanged table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined.delivery import StagedParts
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
      orders:
        relation: public.orders
        key: [id]
"""


def _capture(project: Path) -> dict[str, Any]:
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["pg.orders"])
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        return dict(run.stats["orders"])
    finally:
        engine.close()


def _lake(project: Path) -> list[tuple[Any, ...]]:
    engine = Engine.open(project)
    try:
        rows = engine.sql("SELECT id, note, total FROM pg.orders ORDER BY id").to_pylist()
        return [(r["id"], r["note"], r["total"]) for r in rows]
    finally:
        engine.close()


def _source(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, note, total FROM orders ORDER BY id").fetchall()


def test_an_unchanged_recapture_compares_digests_without_scanning_the_staged_rows(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text, total numeric(12,2))")
        conn.execute(
            "INSERT INTO orders SELECT g, 'n' || (g % 97), g * 0.25 FROM generate_series(1, 6000) g"
        )
    project = tmp_path / "combined.yaml"
    project.write_text(PROJECT.format(dsn=pg_database))
    assert _capture(project)["inserts"] == 6000
    # Every stream DuckDB opens over a capture's staged parts reads all of its rows.
    scans: list[int] = []
    stream = StagedParts.__arrow_c_stream__

    def counted(self: StagedParts, requested_schema: object | None = None) -> object:
        scans.append(len(self.paths))
        return stream(self, requested_schema)

    monkeypatch.setattr(StagedParts, "__arrow_c_stream__", counted)
    unchanged = _capture(project)
    assert (unchanged["captured"], unchanged["updates"], unchanged["inserts"]) == (6000, 0, 0)
    assert unchanged["deliveries"] == 0
    # The fold of the staged digests read them as 64-bit words: DuckDB
    # hashed an `id || hash` text of every staged row (and every lake row).
    assert scans == []
    # Two rows' payloads swapped: the same ids and payload hashes, paired anew.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "UPDATE orders SET note = CASE id WHEN 1 THEN 'n2' ELSE 'n1' END, "
            "total = CASE id WHEN 1 THEN 0.50 ELSE 0.25 END WHERE id IN (1, 2)"
        )
    swapped = _capture(project)
    assert (swapped["updates"], swapped["inserts"], swapped["deletes"]) == (2, 0, 0)
    assert _lake(project) == _source(pg_database)
