"""A table without a key (``key: []``) mirrored row for row, repeats included.

Each row is identified by its content and its number among equal rows
(docs/identity.md, section 9): the lake holds the source's rows as a
multiset, a repeat is a row of its own, and only what changed is billed.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psycopg
import pytest

from combined.engine import Engine
from combined.errors import ConfigError

PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      lines:
        key: []
{extra}"""

ROWS = """
CREATE TABLE lines (sku text, qty int, note text);
INSERT INTO lines VALUES ('a', 1, NULL), ('a', 1, NULL), ('a', 1, NULL),
  ('b', 2, 'x'), ('c', 3, NULL);
"""


def _open(root: Path, dsn: str, extra: str = "") -> Engine:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ROWS)
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn, extra=extra))
    return Engine.open(root / "combined.yaml")


def _source(dsn: str) -> Counter[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return Counter(conn.execute("SELECT sku, qty, note FROM lines").fetchall())


def _lake(engine: Engine) -> Counter[tuple[object, ...]]:
    rows = engine.sql("SELECT sku, qty, note FROM pg.lines").to_pylist()
    return Counter((r["sku"], r["qty"], r["note"]) for r in rows)


def _stats(engine: Engine) -> tuple[int, int, int]:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    s = run.stats["lines"]
    return s["inserts"], s["updates"], s["deletes"]


@pytest.mark.parametrize("sync_mode", ["incremental", "full_refresh"])
def test_a_table_without_a_key_is_mirrored_with_its_repeats(
    tmp_path: Path, pg_database: str, sync_mode: str
) -> None:
    extra = f"        sync_mode: {sync_mode}\n"
    engine = _open(tmp_path, pg_database, extra)
    try:
        assert _stats(engine) == (5, 0, 0)
        assert _lake(engine) == _source(pg_database)

        # one repeat gone, one row changed, one more repeat of another row
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute(
                "DELETE FROM lines WHERE ctid = (SELECT min(ctid) FROM lines WHERE sku = 'a')"
            )
            conn.execute("UPDATE lines SET qty = 9 WHERE sku = 'b'")
            conn.execute("INSERT INTO lines VALUES ('c', 3, NULL)")
        # a repeat less (-1), b changed (-1 +1: no key tells it is the same row), c again (+1)
        assert _stats(engine) == (2, 0, 2)
        assert _lake(engine) == _source(pg_database)

        # nothing changed: nothing billed, nothing delivered
        usage = engine.usage()
        assert _stats(engine) == (0, 0, 0)
        assert engine.usage() == usage
        assert _lake(engine) == _source(pg_database)

        # every id differs, and MAR counts each row that came or went once
        ids = engine.sql("SELECT count(DISTINCT _combined_id) AS n FROM pg.lines").to_pylist()
        assert ids == [{"n": 5}]
        (month,) = engine.usage()
        assert (month["inserts"], month["deletes"]) == (7, 2)

        replayed = engine.replay("pg.lines")
        assert replayed.equal, replayed
    finally:
        engine.close()


def test_a_column_added_without_values_keeps_every_row(tmp_path: Path, pg_database: str) -> None:
    # The content leaves a null column out, as the payload hash does: a new
    # empty column is no change to any row (a key would not change either).
    engine = _open(tmp_path, pg_database)
    try:
        assert _stats(engine) == (5, 0, 0)
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("ALTER TABLE lines ADD COLUMN channel text")
        assert _stats(engine) == (0, 0, 0)
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE lines SET channel = 'web' WHERE sku = 'c'")
        assert _stats(engine) == (1, 0, 1)
        assert _lake(engine) == _source(pg_database)
    finally:
        engine.close()


def test_a_range_of_a_table_without_a_key_is_refused(tmp_path: Path, pg_database: str) -> None:
    # Its equal rows are numbered over the whole table: a range cannot be matched.
    engine = _open(tmp_path, pg_database)
    try:
        assert _stats(engine) == (5, 0, 0)
        with pytest.raises(ConfigError, match=r"no key \(key: \[\]\)"):
            engine.backfill("pg.lines", partitions=2, column="qty", lower="0", upper="10")
    finally:
        engine.close()
