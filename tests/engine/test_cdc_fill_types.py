"""Values filled from the lake keep the stream's type, whatever type the lake stores them as.

A change that leaves a TOAST value out, and the fill of a column added with
a default (every other column left as it was), take the row's values from
the lake. The lake stores some types differently than the stream stages
them (Delta has no time of day: ``time`` and ``time[]`` are text in the
lake, time64 in the stream). Reproduction: a CDC table with a ``time``
column failed its capture after ``ALTER TABLE ... ADD COLUMN ... DEFAULT``
with DuckDB's "Cannot mix values of type TIME and VARCHAR", as did a
TOAST-unchanged ``time[]``. The other types whose lake form is text
(``timetz``, unconstrained ``numeric``, ``numeric(50,10)``, ``jsonb``,
``uuid``) and the typed ones ride along: every value must land unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

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
      typed:
        relation: public.typed
        key: [id]
        strategy: cdc
"""

TABLE = """
CREATE TABLE typed (
  id int PRIMARY KEY, n int, tm time, tmz timetz, free numeric, wide numeric(50,10),
  amount numeric(20,6), doc jsonb, uid uuid, d date, ts timestamp, tstz timestamptz,
  tms time[], nums int[], body text)
"""

#: Row ``g``: some NULLs; every 4th row's ``tms`` (400 times) and ``body`` kept out of line.
ROWS = """
INSERT INTO typed SELECT g, g,
  CASE WHEN g % 7 = 0 THEN NULL ELSE time '00:00:00.000001' + g * interval '917.25 seconds' END,
  CASE WHEN g % 7 = 1 THEN NULL ELSE timetz '10:11:12.5+05:30' + g * interval '1 minute' END,
  CASE WHEN g % 5 = 0 THEN NULL ELSE g::numeric / 7 END,
  (g * 12345678901234567890.0123456789)::numeric(50,10),
  (g * 1234.567891)::numeric(20,6),
  jsonb_build_object('k', g, 'l', jsonb_build_array(1.50, NULL)),
  md5(g::text)::uuid, date '2000-02-28' + g,
  timestamp '1999-12-31 23:59:59.999999' + g * interval '1 minute',
  timestamptz '2024-06-30 22:00:00+02' + g * interval '1.5 seconds',
  CASE WHEN g % 4 = 0
    THEN (SELECT array_agg(time '12:00' + i * interval '1.000001 second')
          FROM generate_series(1, 400) i)
    ELSE ARRAY[time '23:59:59.999999', NULL, time '00:00'] END,
  ARRAY[g, NULL, -g],
  CASE WHEN g % 4 = 0
    THEN (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 80) i)
    ELSE 'short ' || g END
FROM generate_series(1, 40) g
"""

OLD = "id, tm, tmz, free, wide, amount, doc, uid, d, ts, tstz, tms, nums, md5(body) AS body"


@pytest.fixture
def typed(tmp_path: Path, cdc_db: Any) -> tuple[Engine, str]:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute("ALTER TABLE typed ALTER COLUMN tms SET STORAGE EXTERNAL")
        conn.execute("ALTER TABLE typed ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute(ROWS)
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    cdc_db.slot("public.typed")
    return Engine.open(tmp_path / "combined.yaml"), str(cdc_db.dsn)


def _capture(engine: Engine) -> None:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error


def _lake(engine: Engine, columns: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = engine.sql(
        f"SELECT {columns} FROM pg.typed ORDER BY id"
    ).to_pylist()
    return rows


def _types(engine: Engine) -> list[tuple[object, ...]]:
    return [tuple(r.values()) for r in engine.sql("DESCRIBE SELECT * FROM pg.typed").to_pylist()]


def _changed(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _source_n(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT n FROM typed ORDER BY id")]


def test_unchanged_toast_values_of_a_time_array_fill_from_the_lake(
    typed: tuple[Engine, str],
) -> None:
    engine, dsn = typed
    try:
        _capture(engine)  # the stitched snapshot
        before, types = _lake(engine, OLD), _types(engine)
        assert any(len(r["tms"] or []) == 400 for r in before)  # type: ignore[arg-type]
        # tms and body are left out of the stream (unchanged TOAST values)
        _changed(dsn, "UPDATE typed SET n = n + 1000")
        _capture(engine)
        assert _lake(engine, OLD) == before
        assert [r["n"] for r in _lake(engine, "n")] == _source_n(dsn)
        assert _types(engine) == types  # the lake's schema is unchanged
    finally:
        engine.close()


def test_a_column_added_with_a_default_fills_rows_of_every_type(
    typed: tuple[Engine, str],
) -> None:
    engine, dsn = typed
    try:
        _capture(engine)
        before, types = _lake(engine, OLD), _types(engine)
        # every row gains x: the fill leaves every other column as the lake holds it
        _changed(
            dsn,
            "ALTER TABLE typed ADD COLUMN x int NOT NULL DEFAULT 5",
            "UPDATE typed SET x = -1, n = -1 WHERE id = 1",
        )
        _capture(engine)
        assert _lake(engine, OLD) == before
        assert [r["n"] for r in _lake(engine, "n")] == _source_n(dsn)
        assert [r["x"] for r in _lake(engine, "x")] == [-1] + [5] * 39
        assert _types(engine)[: len(types)] == types
        # a second round of the same: the filled rows read back from the lake again
        _changed(dsn, "UPDATE typed SET n = n + 1")
        _capture(engine)
        assert _lake(engine, OLD) == before
        assert [r["n"] for r in _lake(engine, "n")] == _source_n(dsn)
    finally:
        engine.close()
