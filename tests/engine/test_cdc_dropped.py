"""A captured table dropped: its changes before the drop reach the lake, then the review.

A reviewer running pgbench found that a ``pgbench -i`` run again (which drops
and creates its tables again) lost the changes committed between the last
capture and the drop: the capture ended ``needs_review`` before reading the
stream, and the teardown it asked for dropped the slot with them. The
capture now reads the stream up to the drop, commits those changes once,
and only then ends ``needs_review``, the refusal kept in the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine.test_cdc_capture import PROJECT

from combined import cdc
from combined.catalog import data as cat
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import text_to_lsn
from combined.connectors.postgres._replication import slot_status
from combined.engine import Engine

#: The lake's rows once ``_CHANGES`` are applied to the ten rows of the snapshot.
_AFTER = [(i, 50 if i == 5 else i) for i in (1, 2, 3, 4, 5, 7, 8, 9, 10)] + [(11, 110)]
_CHANGES = (
    "UPDATE items SET qty = 50 WHERE id = 5",
    "DELETE FROM items WHERE id = 6",
    "INSERT INTO items VALUES (11, 110)",
)


def _project(tmp_path: Path, cdc_db: Any, mode: str) -> Engine:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 10) g")
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(project + f"        sync_mode: {mode}\n")
    engine = Engine.open(tmp_path / "combined.yaml")
    (run,) = engine.capture()  # the stitched snapshot
    assert run.state == "succeeded", run.error
    return engine


def _run(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _run_together(dsn: str, *statements: str) -> None:
    """``statements`` in one transaction."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        for statement in statements:
            conn.execute(statement)


def _checkpoint(engine: Engine) -> dict[str, Any]:
    """Where the next read resumes: the newest commit's checkpoint, or the position a
    capture that changed no row kept after it (``lake._positions``)."""
    checkpoint = engine.committed_checkpoint("pg", "items")
    assert checkpoint is not None
    return dict(checkpoint)


def _rows(engine: Engine) -> list[tuple[Any, ...]]:
    rows = engine.sql("SELECT id, qty FROM pg.items ORDER BY id").to_pylist()
    return [(r["id"], r["qty"]) for r in rows]


def _ends_in_review(engine: Engine, tmp_path: Path, cdc_db: Any) -> Any:
    """The capture after the drop: needs_review, saying what happened and what to do."""
    dsn, slot = cdc_db.dsn, cdc_db.slot("public.items")
    (run,) = engine.capture()
    assert run.state == "needs_review", run.error
    assert "dropped" in (run.error or ""), run.error
    assert "combined cdc teardown" in (run.error or ""), run.error
    checkpoint = _checkpoint(engine)
    assert checkpoint["needs_snapshot"]["run_id"] == run.id, "the refusal is kept"
    # The slot is confirmed up to the commit of the changes before the drop, not past it.
    confirmed = slot_status(Settings(dsn), slot).confirmed_flush_lsn
    assert confirmed == text_to_lsn(checkpoint["lsn"]), (confirmed, checkpoint)
    return run


def _refused_again(engine: Engine, run: Any) -> None:
    """The next capture is refused with the kept refusal and commits nothing."""
    (again,) = engine.capture()
    assert again.state == "needs_review", again.error
    assert run.id in (again.error or ""), again.error


@pytest.mark.parametrize("mode", ["incremental", "append"])
def test_changes_before_a_drop_reach_the_lake_then_the_run_needs_review(
    tmp_path: Path, cdc_db: Any, mode: str
) -> None:
    engine = _project(tmp_path, cdc_db, mode)
    try:
        _run(cdc_db.dsn, *_CHANGES, "DROP TABLE items")
        run = _ends_in_review(engine, tmp_path, cdc_db)
        if mode == "incremental":
            assert _rows(engine) == _AFTER
        else:
            events = engine.sql(
                "SELECT id, qty, _combined_op AS op FROM pg.items "
                f"WHERE _combined_run_id = '{run.id}' ORDER BY id"
            ).to_pylist()
            assert [(e["id"], e["qty"], e["op"]) for e in events] == [
                (5, 50, "update"),
                (6, None, "delete"),
                (11, 110, "insert"),
            ]
        assert run.stats is not None and run.stats["items"]["captured"] == 3, run.stats
        (bill,) = engine.usage()  # the snapshot's ten inserts, then the three changes
        billed = (bill["mar"], bill["inserts"], bill["updates"], bill["deletes"])
        assert billed == (11, 11, 1, 1), bill
        with engine.catalog.begin() as conn:
            kinds = [e.kind for e in cat.activity(conn, run_id=run.id)]
        assert {"run.needs_review", "alert.run_needs_review", "checkpoint.held"} <= set(kinds)
        assert "dataset.changed" in kinds, kinds  # published: readable as committed
        _refused_again(engine, run)
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("columns", "published"),
    [
        ("id bigint PRIMARY KEY, qty int", False),
        ("id bigint PRIMARY KEY", False),
        ("id bigint PRIMARY KEY, qty int", True),  # added to the publication again
    ],
)
def test_a_table_created_again_under_its_name_is_not_read_as_the_old_one(
    tmp_path: Path, cdc_db: Any, columns: str, published: bool
) -> None:
    engine = _project(tmp_path, cdc_db, "incremental")
    try:
        values = "(1, 1000), (99, 99)" if "qty" in columns else "(1), (99)"
        publication = cdc_db.slot("public.items")
        again = [f"ALTER PUBLICATION {publication} ADD TABLE items"] if published else []
        _run(
            cdc_db.dsn,
            *_CHANGES,
            "DROP TABLE items",
            f"CREATE TABLE items ({columns})",
            *again,
            f"INSERT INTO items VALUES {values}",
        )
        run = _ends_in_review(engine, tmp_path, cdc_db)
        assert _rows(engine) == _AFTER  # the old table's changes, none of the new one's rows
        _refused_again(engine, run)
        # The way out the error names: a new snapshot, of the table as it is now.
        cdc.teardown(engine, "pg")
        (snapshot,) = engine.capture()
        if "qty" not in columns:  # judged by the drift policy, as any column gone
            assert "drop on field 'qty'" in (snapshot.error or ""), snapshot.error
            return
        assert snapshot.state == "succeeded", snapshot.error
        lake = engine.sql("SELECT id, qty FROM pg.items ORDER BY id").to_pylist()
        assert [(r["id"], r["qty"]) for r in lake] == [(1, 1000), (99, 99)]
    finally:
        engine.close()


def test_a_truncate_then_a_drop_empties_the_table_in_the_lake(tmp_path: Path, cdc_db: Any) -> None:
    engine = _project(tmp_path, cdc_db, "incremental")
    try:
        _run(cdc_db.dsn, *_CHANGES, "TRUNCATE items", "DROP TABLE items")
        run = _ends_in_review(engine, tmp_path, cdc_db)
        assert _rows(engine) == []
        _refused_again(engine, run)
    finally:
        engine.close()


def test_changes_in_the_transaction_that_drops_the_table_reach_the_lake(
    tmp_path: Path, cdc_db: Any
) -> None:
    engine = _project(tmp_path, cdc_db, "incremental")
    try:
        _run_together(cdc_db.dsn, *_CHANGES, "DROP TABLE items")
        run = _ends_in_review(engine, tmp_path, cdc_db)
        assert _rows(engine) == _AFTER
        _refused_again(engine, run)
    finally:
        engine.close()


def test_an_event_stream_whose_table_gained_a_column_before_the_drop(
    tmp_path: Path, cdc_db: Any
) -> None:
    # An event stream's added column is counted in the source (unfilled_columns):
    # a table that is gone has nothing to count.
    engine = _project(tmp_path, cdc_db, "append")
    try:
        _run(
            cdc_db.dsn,
            "ALTER TABLE items ADD COLUMN note text",
            "UPDATE items SET note = 'n' WHERE id = 5",
            "DROP TABLE items",
        )
        run = _ends_in_review(engine, tmp_path, cdc_db)
        events = engine.sql(
            f"SELECT id, note FROM pg.items WHERE _combined_run_id = '{run.id}'"
        ).to_pylist()
        assert events == [{"id": 5, "note": "n"}]
    finally:
        engine.close()


def _wal(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return text_to_lsn(row[0])


#: The ALTER, and the update that first streams the relation message carrying its column.
_ALTER = (
    "ALTER TABLE items ADD COLUMN note text DEFAULT 'd'",
    "UPDATE items SET note = 'n', qty = 55 WHERE id = 5",
)


@pytest.mark.parametrize("before", ["nothing", "apart", "together"])
def test_a_column_added_before_the_drop_cannot_be_filled_and_says_so(
    tmp_path: Path, cdc_db: Any, before: str
) -> None:
    """A column added since the lake's commit is filled from the source, which no longer
    has the table: the changes of the transactions committed before the one whose relation
    message first carries it are committed, the checkpoint (and the slot) held there, and
    the Run ends needs_review saying which were not. Before, nothing was committed: the
    teardown and setup the hint named then lost the changes made before the ALTER (the
    Run failed, retried for ever, on a missing relation before that)."""
    engine = _project(tmp_path, cdc_db, "incremental")
    try:
        changes = () if before == "nothing" else _CHANGES
        if before == "together":  # one transaction: a change of it before the ALTER too
            _run(cdc_db.dsn, *changes)
            held = _wal(cdc_db.dsn)
            _run_together(cdc_db.dsn, "UPDATE items SET qty = 70 WHERE id = 7", *_ALTER)
        else:
            _run(cdc_db.dsn, *changes, _ALTER[0])
            held = _wal(cdc_db.dsn)
            _run(cdc_db.dsn, _ALTER[1])
        _run(cdc_db.dsn, "DROP TABLE items")
        run = _ends_in_review(engine, tmp_path, cdc_db)
        error = run.error or ""
        assert "'note'" in error and "cannot be filled" in error, error
        assert "were not" in error, error
        assert _rows(engine) == (_AFTER if changes else [(i, i) for i in range(1, 11)])
        assert text_to_lsn(_checkpoint(engine)["lsn"]) <= held  # not past the column
        (bill,) = engine.usage()  # the snapshot's ten inserts, then the changes before it
        billed = (bill["mar"], bill["inserts"], bill["updates"], bill["deletes"])
        assert billed == ((11, 11, 1, 1) if changes else (10, 10, 0, 0)), bill
        _refused_again(engine, run)
        (bill,) = engine.usage()
        assert (bill["mar"], bill["inserts"], bill["updates"], bill["deletes"]) == billed
    finally:
        engine.close()


def test_a_column_added_in_a_transaction_larger_than_a_batch_commits_nothing(
    tmp_path: Path, cdc_db: Any
) -> None:
    # Rows of the transaction whose relation message carries the column were handed
    # over already (a full batch cut within it): they cannot be taken back, so nothing
    # is committed, the Run needs_review naming the columns, as before the stop.
    engine = _project(tmp_path, cdc_db, "incremental\n        batch_rows: 2")
    try:
        _run(cdc_db.dsn, *_CHANGES)
        _run_together(cdc_db.dsn, "UPDATE items SET qty = qty + 100 WHERE id <= 4", *_ALTER)
        _run(cdc_db.dsn, "DROP TABLE items")
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert _rows(engine) == [(i, i) for i in range(1, 11)]  # nothing committed
        assert "'note'" in (run.error or "") and "larger than a batch" in (run.error or "")
        confirmed = slot_status(Settings(cdc_db.dsn), cdc_db.slot("public.items"))
        assert confirmed.confirmed_flush_lsn == text_to_lsn(_checkpoint(engine)["lsn"])
    finally:
        engine.close()
