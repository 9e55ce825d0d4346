"""A column dropped under ``drift.drop: evolve`` over a PostgreSQL change stream.

As a snapshot's re-read (``test_drop_kept.py``): the lake keeps the column,
with its former values on every row the stream does not otherwise change.
An update that leaves the other columns as they were (``SET qty = qty``,
which pgoutput streams as an update) changes nothing, keeps the value and
bills nothing; a row updated otherwise, and a new row, hold null in it.
The updates leave a TOASTed text alone (streamed as unchanged, filled from
the lake), which the comparison meets as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from tests.engine.test_cdc_capture import PROJECT

from combined.catalog import data as cat
from combined.engine import Engine

#: A text of 3,200 characters of a row's id, stored out of line (never compressed).
BODY = "repeat(md5(id::text), 100)"

BACKLOG = (
    "ALTER TABLE items DROP COLUMN c",
    "UPDATE items SET qty = 10 WHERE id = 1",
    "UPDATE items SET qty = qty WHERE id = 2",
    "UPDATE items SET qty = 99 WHERE id = 3",  # changed, then back: unchanged in the end
    "UPDATE items SET qty = 3 WHERE id = 3",
    f"INSERT INTO items SELECT id, id, {BODY} FROM (VALUES (6)) v (id)",
    "DELETE FROM items WHERE id = 5",
)

KEPT = [
    (1, 10, None, "update"),  # changed: no value of the dropped column
    (2, 2, "c2", "snapshot"),  # updated to what it was: as it was, former value kept
    (3, 3, "c3", "snapshot"),
    (4, 4, "c4", "snapshot"),
    (6, 6, None, "insert"),  # new: no value of the dropped column
]


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _open(tmp_path: Path, cdc_db: Any, settings: str = "") -> Engine:
    _sql(
        cdc_db.dsn,
        "CREATE TABLE items (id bigint PRIMARY KEY, qty int, body text, c text)",
        "ALTER TABLE items ALTER COLUMN body SET STORAGE EXTERNAL",
        "INSERT INTO items SELECT id, id, NULL, 'c' || id FROM generate_series(1, 5) id",
        f"UPDATE items SET body = {BODY}",
    )
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(project + "        drift: {drop: evolve}\n" + settings)
    return Engine.open(tmp_path / "combined.yaml")


def _captured(engine: Engine) -> dict[str, Any]:
    """A capture that succeeds: its stats of ``items``."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    stats: dict[str, Any] = run.stats["items"]
    return stats


def _lake(engine: Engine) -> list[tuple[Any, ...]]:
    """The lake's rows (id, qty, c, op), once checked to hold every row's whole body."""
    rows = engine.sql(
        f"SELECT id, qty, c, _combined_op AS op, body = {BODY} AS whole FROM pg.items ORDER BY id"
    ).to_pylist()
    assert all(r["whole"] for r in rows), rows
    return [(r["id"], r["qty"], r["c"], r["op"]) for r in rows]


def _drifts(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.catalog.begin() as conn:
        events = cat.activity(conn, kind="drift")
    return [(e.body["class"], e.body["field"], e.body["outcome"]) for e in events]


def _month(engine: Engine) -> tuple[int, int, int, int]:
    (items,) = [u for u in engine.usage() if u["dataset"] == "items"]
    return items["mar"], items["inserts"], items["updates"], items["deletes"]


def test_a_change_stream_keeps_a_dropped_columns_values_on_rows_it_leaves_unchanged(
    tmp_path: Path, cdc_db: Any
) -> None:
    engine = _open(tmp_path, cdc_db)
    try:
        _captured(engine)
        _sql(cdc_db.dsn, *BACKLOG)
        stats = _captured(engine)
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (1, 1, 1), stats
        # (a stream has no source count: the lake's side is checked, a mismatch fails the Run)
        assert stats["reconciliation"] == "not_reconciled", stats
        assert _lake(engine) == KEPT
        # billed: the 5 first seen, then id 6; the update of id 1 and the delete of id 5
        assert _month(engine) == (6, 6, 1, 1)
        # Nothing changed since: no row written or billed (an empty Delivery may commit
        # the stream's position), the drop not told again.
        again = _captured(engine)
        assert (again["captured"], again["updates"]) == (0, 0), again
        assert _month(engine) == (6, 6, 1, 1)
        assert _lake(engine) == KEPT
        assert _drifts(engine) == [("drop", "c", "evolve")]

        # Later, with the drop judged: the same for a row set to what it held.
        _sql(
            cdc_db.dsn,
            "UPDATE items SET qty = qty WHERE id = 3",
            "UPDATE items SET qty = 0 WHERE id = 4",
        )
        later = _captured(engine)
        assert later["updates"] == 1, later
        assert _lake(engine)[2:4] == [(3, 3, "c3", "snapshot"), (4, 0, None, "update")]
        assert _month(engine) == (6, 6, 2, 1)
    finally:
        engine.close()


def test_an_event_stream_keeps_each_change_after_a_drop_as_an_event_without_the_column(
    tmp_path: Path, cdc_db: Any
) -> None:
    # An event stream never compares with its lake: the update to what the
    # row held is an event too, without the column, billed as an update.
    engine = _open(tmp_path, cdc_db, "        sync_mode: append\n")
    try:
        _captured(engine)
        _sql(cdc_db.dsn, *BACKLOG)
        stats = _captured(engine)
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (1, 4, 1), stats
        rows = engine.sql(
            "SELECT qty, c, _combined_op AS op FROM pg.items WHERE id = 2 ORDER BY op"
        ).to_pylist()
        assert [(r["qty"], r["c"], r["op"]) for r in rows] == [
            (2, "c2", "snapshot"),
            (2, None, "update"),
        ]
        assert _month(engine) == (6, 6, 3, 1)  # rows 1, 2 and 3 updated (3 twice)
    finally:
        engine.close()


def test_a_drop_read_after_changes_that_held_the_column_keeps_it_on_rows_left_unchanged(
    tmp_path: Path, cdc_db: Any
) -> None:
    # The backlog's changes before the drop hold the column, so the capture's
    # rows do (null after the drop): its rows were compared with the lake's
    # over it, and every row the stream touched after the drop lost its value
    # and was billed, updated to what it held or not.
    engine = _open(tmp_path, cdc_db)
    try:
        _captured(engine)
        _sql(
            cdc_db.dsn,
            "UPDATE items SET c = 'z' WHERE id = 4",
            "UPDATE items SET c = NULL WHERE id = 5",  # (as a snapshot after the drop: kept)
            *BACKLOG[:5],
        )
        stats = _captured(engine)
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (0, 2, 0), stats
        assert _lake(engine) == [
            (1, 10, None, "update"),
            (2, 2, "c2", "snapshot"),
            (3, 3, "c3", "snapshot"),
            (4, 4, "z", "update"),  # its change before the drop
            (5, 5, "c5", "snapshot"),
        ]
        assert _month(engine) == (5, 5, 2, 0)
    finally:
        engine.close()
