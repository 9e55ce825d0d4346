"""Columns added with a default on a CDC table: filled, anchored, reconciled (issue 23, #26).

``ALTER TABLE ... ADD COLUMN ... DEFAULT`` gives every existing row a value
no change in the stream carries. These tests cover what the first fill left
out: a run stopped early, a nullable column's reconciliation, and an event
stream (``sync_mode: append``). Partitioned tables: tests/engine/test_cdc_partitioned.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined import cdc
from combined.catalog import data as cat
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import text_to_lsn
from combined.connectors.postgres._replication import slot_status
from combined.engine import Engine
from combined.lake import LakeTable

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
      t:
        relation: public.t
        key: [id]
        strategy: cdc
        sync_mode: {mode}
"""


def _project(tmp_path: Path, cdc_db: Any, mode: str = "incremental") -> str:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 100) g")
    # small batches: the fill hands over full batches as it reads, and they count
    # towards --max-changes
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, mode=mode) + "        batch_rows: 16\n"
    )
    cdc_db.slot("public.t")
    return str(cdc_db.dsn)


def _captured_then(engine: Engine, dsn: str, *statements: str) -> None:
    """A first capture that succeeds, then ``statements`` in the source."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _lake(engine: Engine, columns: str) -> list[tuple[object, ...]]:
    rows = engine.sql(f"SELECT {columns} FROM pg.t ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def _source(dsn: str, columns: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(f"SELECT {columns} FROM t ORDER BY id"))


def _events(engine: Engine, kind: str) -> list[dict[str, Any]]:
    with engine.catalog.begin() as conn:
        return [e.body for e in cat.activity(conn, kind=kind, exact=True)]


def test_a_run_stopped_early_never_publishes_a_row_of_the_new_columns_alone(
    tmp_path: Path, cdc_db: Any
) -> None:
    """A key inserted after the ALTER lands whole, even in a run cut by ``--max-changes``.

    Reproduction: 100 rows captured, then ``ALTER TABLE t ADD COLUMN flag
    boolean NOT NULL DEFAULT false``, an update of row 1 (the first change
    showing the column: the fill reads every row, 101 included), then
    ``INSERT INTO t VALUES (101, 101, true)``. ``cdc follow --max-changes 5``
    stopped after the fill's 100 rows, before the insert: the lake published
    row 101 as ``(101, NULL, false)``, a row the source never held.
    """
    dsn = _project(tmp_path, cdc_db)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _captured_then(
            engine,
            dsn,
            "ALTER TABLE t ADD COLUMN flag boolean NOT NULL DEFAULT false",
            "UPDATE t SET v = -1 WHERE id = 1",
            "INSERT INTO t VALUES (101, 101, true)",
        )
        (run,) = cdc.follow(engine, "pg", every=0, max_changes=5, iterations=1)
        assert run.state == "succeeded", run.error
        assert _lake(engine, "id, v, flag") == _source(dsn, "id, v, flag")
        assert engine.sql("SELECT count(*) AS n FROM pg.t WHERE v IS NULL").to_pylist() == [
            {"n": 0}
        ]
        # the slot still never runs ahead of the lake
        meta = LakeTable(tmp_path / "lake" / "pg" / "t", "combined:pg/t").latest_commit()
        assert meta is not None
        confirmed = slot_status(Settings(dsn), cdc_db.slot("public.t")).confirmed_flush_lsn
        assert confirmed is not None and confirmed <= text_to_lsn(meta["checkpoint"]["lsn"])
        (run,) = engine.capture()  # nothing left over: no change applied twice
        assert run.state == "succeeded", run.error
        assert _lake(engine, "id, v, flag") == _source(dsn, "id, v, flag")
    finally:
        engine.close()


def test_a_filled_nullable_column_is_reconciled_against_the_source(
    tmp_path: Path, cdc_db: Any
) -> None:
    """A nullable column added with a default has its nulls compared, lake against source.

    Reproduction: after ``ALTER TABLE t ADD COLUMN x int DEFAULT 5`` (no
    NOT NULL) the capture filled the column, but reconciliation checked only
    NOT NULL columns: a fill that left nulls behind would have passed. Now
    the reconciliation event carries ``filled_nulls``, counted in the source
    in a snapshot holding the same transactions as the lake's commit.
    """
    dsn = _project(tmp_path, cdc_db)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _captured_then(
            engine,
            dsn,
            "ALTER TABLE t ADD COLUMN x int DEFAULT 5",
            "UPDATE t SET x = NULL WHERE id IN (2, 3)",
            "INSERT INTO t VALUES (101, 101, NULL)",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["t"]["reconciliation"] != "mismatch"
        assert _lake(engine, "id, v, x") == _source(dsn, "id, v, x")
        body = _events(engine, "reconciliation")[0]
        assert body["filled_nulls"] == {"x": {"source": 3, "lake": 3}}
        assert not _events(engine, "alert.reconciliation_failed")
        (run,) = engine.capture()  # nothing filled: nothing counted
        assert _events(engine, "reconciliation")[0]["filled_nulls"] is None
    finally:
        engine.close()


def test_a_column_added_with_no_change_after_it_is_filled_at_the_runs_end(
    tmp_path: Path, cdc_db: Any
) -> None:
    """No change of the table follows the ALTER: no relation message shows the column.

    Before, the lake lacked the column, and the capture succeeded, until some
    later change of the table showed it. Now each run compares the catalog's
    columns, read before its end is set, with the lake's, and fills what
    differs at its end, reconciled as any fill is.
    """
    dsn = _project(tmp_path, cdc_db)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _captured_then(engine, dsn, "ALTER TABLE t ADD COLUMN flag boolean NOT NULL DEFAULT true")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["t"]["updates"] == 100
        assert _lake(engine, "id, v, flag") == _source(dsn, "id, v, flag")
        body = _events(engine, "reconciliation")[0]
        assert body["filled_nulls"] == {"flag": {"source": 0, "lake": 0}}
        (run,) = engine.capture()  # filled once
        assert run.stats is not None and run.stats["t"]["captured"] == 0
    finally:
        engine.close()


def test_an_append_dataset_is_not_filled_and_an_alert_says_why(tmp_path: Path, cdc_db: Any) -> None:
    """An event stream keeps the events the source sent; the rows a default gave a value are named.

    Reproduction: an ``append`` CDC dataset saw ``ALTER TABLE t ADD COLUMN
    flag boolean NOT NULL DEFAULT false``: its events silently held no
    value for the 99 rows no event since changed, and nothing said so.
    """
    dsn = _project(tmp_path, cdc_db, mode="append")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _captured_then(
            engine,
            dsn,
            "ALTER TABLE t ADD COLUMN flag boolean NOT NULL DEFAULT false",
            "UPDATE t SET v = -1 WHERE id = 1",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        # the events as the source sent them: 100 snapshot rows and one update
        rows = engine.sql("SELECT count(*) AS n, count(flag) AS f FROM pg.t").to_pylist()
        assert rows == [{"n": 101, "f": 1}]
        (alert,) = _events(engine, "alert.column_not_filled")
        assert alert["columns"] == {"flag": 100}
        assert "sync_mode: append" in alert["message"] and "incremental" in alert["remedy"]
        (run,) = engine.capture()  # the column is known now: no second alert
        assert len(_events(engine, "alert.column_not_filled")) == 1
    finally:
        engine.close()


def test_a_count_knows_which_transactions_its_snapshot_saw(tmp_path: Path, cdc_db: Any) -> None:
    """The check is skipped when a write races the count: the count tells which it saw.

    A transaction committed before the count is in it; one still open while
    the count read (committed after, before the count's WAL position) is
    not, though the stream shows it before that position: the lake's commit
    would hold it and the count not, so the run drops that dataset's counts.
    """
    from combined.connectors.postgres._fill import count_nulls

    dsn = _project(tmp_path, cdc_db)
    with psycopg.connect(dsn) as before, psycopg.connect(dsn) as racing:
        before.execute("UPDATE t SET v = NULL WHERE id = 1")
        seen = before.execute("SELECT pg_current_xact_id()::text").fetchone()
        before.commit()
        racing.execute("UPDATE t SET v = NULL WHERE id = 2")
        unseen = racing.execute("SELECT pg_current_xact_id()::text").fetchone()
        count = count_nulls(Settings(dsn), "public.t", ["v"])
        racing.commit()
    assert seen is not None and unseen is not None
    assert count.nulls == {"v": 1} and count.rows == 100
    assert count.sees(int(seen[0]) & 0xFFFFFFFF)
    assert not count.sees(int(unseen[0]) & 0xFFFFFFFF)
    assert not count.sees((int(unseen[0]) + 5) & 0xFFFFFFFF)  # began after the count


def test_writes_racing_the_count_never_make_a_false_mismatch(tmp_path: Path, cdc_db: Any) -> None:
    """Under a steady stream of writes the filled columns' check is exact or skipped.

    A writer toggles the new columns between a value and null, one row per
    transaction, throughout several captures that each fill a new column:
    the count and the lake's commit must describe the same transactions, or
    the run must skip the check (``filled_nulls`` null), never report a
    mismatch the lake does not have.
    """
    import threading

    dsn = _project(tmp_path, cdc_db)
    engine = Engine.open(tmp_path / "combined.yaml")
    done = threading.Event()
    columns: list[str] = []

    def write() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            i = 0
            while not done.is_set():
                for c in list(columns):
                    conn.execute(
                        f"UPDATE t SET {c} = CASE WHEN {c} IS NULL THEN 1 END WHERE id = %s",
                        (i % 100 + 1,),
                    )
                i += 1

    writer = threading.Thread(target=write, daemon=True)
    try:
        _captured_then(engine, dsn)
        writer.start()
        for n in range(3):
            _captured_then(engine, dsn, f"ALTER TABLE t ADD COLUMN x{n} int DEFAULT {n}")
            columns.append(f"x{n}")
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert run.stats is not None and run.stats["t"]["reconciliation"] != "mismatch"
            checked = _events(engine, "reconciliation")[0]["filled_nulls"]
            if checked is not None:
                assert all(v["source"] == v["lake"] for v in checked.values()), checked
        assert not _events(engine, "alert.reconciliation_failed")
    finally:
        done.set()
        if writer.is_alive():
            writer.join()
        engine.close()


def test_a_wide_table_gets_a_column_filled_in_one_join(tmp_path: Path, cdc_db: Any) -> None:
    # The fill marks every other column unchanged on the same rows: one fill
    # table (and one join) a column made DuckDB's expression depth limit
    # (1000) fail every capture of a 1,401-column table, and took minutes at 300.
    columns = [f"c{i}" for i in range(1100)]
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE t (id int PRIMARY KEY, {', '.join(f'{c} int' for c in columns)})"
        )
        conn.execute(
            f"INSERT INTO t SELECT g, {', '.join(f'g + {i}' for i in range(len(columns)))} "
            "FROM generate_series(1, 40) g"
        )
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, mode="incremental")
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE t ADD COLUMN extra text DEFAULT 'd'")
            conn.execute("UPDATE t SET c5 = -1 WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        picked = "id, c0, c5, c1099, extra"
        lake = engine.sql(f"SELECT {picked} FROM pg.t ORDER BY id").to_pylist()
        with psycopg.connect(cdc_db.dsn) as conn:
            source = conn.execute(f"SELECT {picked} FROM t ORDER BY id").fetchall()
        assert [tuple(r.values()) for r in lake] == source
        # every filled column, not only those picked: the first 50 summed on both sides
        total = f"SELECT sum({' + '.join(columns[:50])}) AS s FROM "
        with psycopg.connect(cdc_db.dsn) as conn:
            row = conn.execute(total + "t").fetchone()
        assert row is not None
        assert engine.sql(total + "pg.t").to_pylist()[0]["s"] == row[0]
    finally:
        engine.close()


def test_filled_values_are_the_streams_text_not_a_cast_to_text(tmp_path: Path, cdc_db: Any) -> None:
    """The fill reads each value's output function, as the stream sends it.

    Reproduction: the fill read ``column::text``, which is not the output
    function for every type: a boolean added with ``DEFAULT true`` read
    ``'true'``, which the stream's parser (``t``/``f``) took for false, on
    every row; an inet gained its ``/32``, a ``char(4)`` lost its trailing
    blanks.
    """
    dsn = _project(tmp_path, cdc_db)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _captured_then(
            engine,
            dsn,
            "ALTER TABLE t ADD COLUMN flag boolean NOT NULL DEFAULT true,"
            " ADD COLUMN ip inet DEFAULT '10.0.0.1', ADD COLUMN c char(4) DEFAULT 'ab'",
            "UPDATE t SET v = -1 WHERE id = 1",  # streamed: the form the fill must match
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT DISTINCT flag, ip, c FROM pg.t").to_pylist()
        assert len(rows) == 1, rows  # the streamed row 1 and the 99 filled ones agree
        assert rows[0]["flag"] is True and rows[0]["c"] == "ab  "
        assert rows[0]["ip"] == "10.0.0.1", rows
    finally:
        engine.close()


@pytest.mark.parametrize(
    "added",
    ["int DEFAULT 7", "int NOT NULL DEFAULT 7", "timestamptz DEFAULT clock_timestamp()"],
    ids=["default", "not-null", "volatile"],
)
@pytest.mark.parametrize(
    "gone",
    [
        ("ALTER TABLE t DROP COLUMN c",),
        ("ALTER TABLE t DROP COLUMN c", "UPDATE t SET v = -2 WHERE id = 2"),
        ("ALTER TABLE t RENAME COLUMN c TO d", "UPDATE t SET v = -2 WHERE id = 2"),
    ],
    ids=["dropped", "dropped-then-changed", "renamed"],
)
def test_a_column_added_with_a_default_and_dropped_in_one_backlog_needs_a_snapshot(
    tmp_path: Path, cdc_db: Any, added: str, gone: tuple[str, ...]
) -> None:
    """The stream showed the column, the source no longer has it: refused, not null.

    Reproduction: 100 rows captured, then ``ALTER TABLE t ADD COLUMN c int
    DEFAULT 7``, an update of row 1 (its relation message shows ``c``), a
    row inserted with ``c``, ``ALTER TABLE t DROP COLUMN c``. The fill found
    ``c`` gone and let it be: the capture succeeded (``drop: evolve``) with
    ``c`` 7 in rows 1 and 101 and null in the 99 rows that held 7 while it
    existed (renamed to ``d``: ``d`` filled, ``c`` left so). Now the capture
    ends ``needs_review``, naming the column and the new snapshot, and
    commits nothing; the column left out of ``columns:``, it captures on.
    """
    dsn = _project(tmp_path, cdc_db)
    config = tmp_path / "combined.yaml"
    config.write_text(config.read_text() + "        drift: {drop: evolve, rename: evolve}\n")
    engine = Engine.open(config)
    try:
        _captured_then(
            engine,
            dsn,
            f"ALTER TABLE t ADD COLUMN c {added}",
            "UPDATE t SET v = -1 WHERE id = 1",
            "INSERT INTO t (id, v) VALUES (101, 101)",
            *gone,
        )
        for _ in range(2):  # every retry reads the same relation message
            (run,) = engine.capture()
            assert run.state == "needs_review", run.error
            assert run.error is not None
            assert "column 'c' of public.t" in run.error and "dropped or renamed" in run.error
            assert "`combined cdc teardown` then `combined cdc setup`" in run.error
            assert "leave 'c' out of the dataset's `columns:`" in run.error
            assert _lake(engine, "id, v") == [(i, i) for i in range(1, 101)]  # none committed
            assert "c" not in engine.sql("SELECT * FROM pg.t LIMIT 0").schema.names
    finally:
        engine.close()
    # the hint's other way out: the column left out, the stream read on
    config.write_text(config.read_text() + "        columns: [id, v]\n")
    engine = Engine.open(config)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake(engine, "id, v") == _source(dsn, "id, v")
    finally:
        engine.close()
