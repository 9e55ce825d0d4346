"""A table without a key (``key: []``) mirrored row for row, repeats included.

Each row is identified by its content and its number among equal rows
(docs/identity.md, section 9): the lake holds the source's rows as a
multiset, a repeat is a row of its own, and only what changed is billed.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.conftest import SHOP_PROJECT

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
    _change(dsn, ROWS)
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn, extra=extra))
    return Engine.open(root / "combined.yaml")


def _change(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


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
        _change(
            pg_database,
            "DELETE FROM lines WHERE ctid = (SELECT min(ctid) FROM lines WHERE sku = 'a')",
            "UPDATE lines SET qty = 9 WHERE sku = 'b'",
            "INSERT INTO lines VALUES ('c', 3, NULL)",
        )
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
        _change(
            pg_database,
            "ALTER TABLE lines ADD COLUMN channel text",
        )
        assert _stats(engine) == (0, 0, 0)
        _change(
            pg_database,
            "UPDATE lines SET channel = 'web' WHERE sku = 'c'",
        )
        assert _stats(engine) == (1, 0, 1)
        assert _lake(engine) == _source(pg_database)
    finally:
        engine.close()


def test_a_range_or_an_explanation_of_a_keyless_table_is_refused(
    tmp_path: Path, pg_database: str
) -> None:
    # Its equal rows are numbered over the whole table: a range cannot be matched.
    engine = _open(tmp_path, pg_database)
    try:
        assert _stats(engine) == (5, 0, 0)
        with pytest.raises(ConfigError, match=r"no key \(key: \[\]\)"):
            engine.backfill("pg.lines", partitions=2, column="qty", lower="0", upper="10")
        # and explain, asked for a key, says to give the row's id and where to read it
        with pytest.raises(ConfigError, match=r"give the row by its id \(--id\)") as refused:
            engine.explain("pg.lines", ["a"])
        assert "_combined_id" in (refused.value.hint or "")
    finally:
        engine.close()


def test_repeats_replaced_by_other_repeats_are_seen(tmp_path: Path, pg_database: str) -> None:
    # Same row count, and every content twice on both sides: a fold by xor
    # cancels each pair and would take the new rows for the old ones.
    engine = _open(tmp_path, pg_database)
    try:
        _change(
            pg_database,
            "DELETE FROM lines",
            "INSERT INTO lines VALUES ('a', 1, NULL), ('a', 1, NULL)",
            "INSERT INTO lines VALUES ('b', 2, NULL), ('b', 2, NULL)",
        )
        assert _stats(engine) == (4, 0, 0)
        _change(
            pg_database,
            "UPDATE lines SET qty = qty + 10",
        )
        assert _stats(engine) == (4, 0, 4)
        assert _lake(engine) == _source(pg_database)
    finally:
        engine.close()


def test_a_keyless_table_past_the_reduction_memory_is_mirrored(
    tmp_path: Path, pg_database: str
) -> None:
    # 400k rows (a tenth of them 700 contents, each ~57 times) numbered and joined within
    # a 32 MiB reduction: its tables spill, nothing runs out of memory.
    engine = _open(tmp_path, pg_database)
    engine.close()
    project = tmp_path / "combined.yaml"
    project.write_text(
        project.read_text().replace("version: 1\n", "version: 1\nreduction_memory: 32MiB\n")
    )
    _change(
        pg_database,
        "INSERT INTO lines SELECT 'sku' || (CASE WHEN g % 10 = 0 THEN g % 1000 ELSE g END), "
        "g % 7, repeat('n', g % 50) FROM generate_series(1, 400000) g",
    )
    engine = Engine.open(project)
    try:
        inserted, _, _ = _stats(engine)
        assert inserted == 400_005
        assert _lake(engine) == _source(pg_database)
        _change(
            pg_database,
            "DELETE FROM lines WHERE sku = 'sku0'",
        )
        assert _stats(engine)[2] > 0
        assert _lake(engine) == _source(pg_database)
    finally:
        engine.close()


def test_discover_names_key_empty_for_a_table_without_one(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    _open(tmp_path, pg_database).close()
    _change(pg_database, "CREATE TABLE keyed (id int PRIMARY KEY)")
    found = tools.cli(tmp_path, "discover", "pg")
    assert found.returncode == 0, found.stderr
    listed = " ".join(found.stdout.split())

    def section(relation: str) -> str:
        return listed.split(relation)[1].split("public.")[0]

    assert "no key: `key: []` mirrors it" in section("public.lines")
    assert "no key:" not in section("public.keyed")


def test_an_event_stream_is_not_turned_into_a_mirror(tmp_path: Path, pg_database: str) -> None:
    # Its lake holds each capture's rows again, under ids of whole rows: a
    # mirror's reduction would meet repeated ids it never gave.
    engine = _open(tmp_path, pg_database, "        sync_mode: append\n")
    try:
        assert _stats(engine)[0] == 5
        assert _stats(engine)[0] == 5
    finally:
        engine.close()
    project = tmp_path / "combined.yaml"
    project.write_text(project.read_text().replace("        sync_mode: append\n", ""))
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "failed" and "holds an event stream" in (run.error or "")
        assert engine.sql("SELECT count(*) AS n FROM pg.lines").to_pylist() == [{"n": 10}]
    finally:
        engine.close()


#: The shop project's source (tests/conftest.py), reading one keyless table.
SQLITE_PROJECT = (
    SHOP_PROJECT.split("    datasets:")[0].format(catalog="sqlite:///.combined/catalog.db")
    + "    datasets:\n      lines:\n        key: {key}\n"
)


def test_repeats_of_a_keyless_table_name_key_empty_as_the_way_out(
    tmp_path: Path, tools: Any
) -> None:
    """A table with no key, its repeated rows held back: the hint names `key: []`, which works."""
    with closing(sqlite3.connect(tmp_path / "shop.db")) as conn:
        conn.executescript(
            "CREATE TABLE lines (sku TEXT, qty INTEGER);"
            "INSERT INTO lines VALUES ('a', 1), ('a', 1), ('b', 2);"
        )
    (tmp_path / "combined.yaml").write_text(SQLITE_PROJECT.format(key="[sku]"))
    held = tools.cli(tmp_path, "capture")
    said = " ".join((held.stdout + held.stderr).split())
    assert "duplicate key(s) of (sku)" in said, said
    assert "key: []" in said, said
    (tmp_path / "combined.yaml").write_text(SQLITE_PROJECT.format(key="[]"))
    done = tools.cli(tmp_path, "capture")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = tools.cli(tmp_path, "sql", "--format", "csv", "SELECT sku, qty FROM shop.lines")
    assert sorted(rows.stdout.split()[1:]) == ["a,1", "a,1", "b,2"]
