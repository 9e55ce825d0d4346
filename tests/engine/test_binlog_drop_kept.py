"""A column dropped under ``drift.drop: evolve`` over a MariaDB binlog.

As over a PostgreSQL stream (``test_cdc_drop_kept.py``): the lake keeps the
column, with its former values on every row the binlog does not otherwise
change; a row updated, and a new row, hold null in it. The server logs no
row event for an update that sets a row to what it held (``SET qty = qty``,
even with ``binlog_row_image=FULL``); a row changed and changed back in the
backlog is the stream's unchanged row: it keeps its value, billed nothing.
"""

from __future__ import annotations

from typing import Any

from tests.engine._binlog import Binlog
from tests.engine.test_cdc_drop_kept import _captured, _drifts, _month

from combined.engine import Engine

BACKLOG = (
    "ALTER TABLE {t} DROP COLUMN note",
    "UPDATE {t} SET qty = -1 WHERE id = 1",
    "UPDATE {t} SET qty = qty WHERE id = 2",
    "UPDATE {t} SET qty = 99 WHERE id = 3",  # changed, then back: unchanged in the end
    "UPDATE {t} SET qty = 3 WHERE id = 3",
    "INSERT INTO {t} (id, qty) VALUES (501, 501)",
    "DELETE FROM {t} WHERE id = 500",
)

KEPT = [
    (1, -1, None, "update"),  # changed: no value of the dropped column
    (2, 2, "n2", "snapshot"),  # updated to what it was (no row event): as it was
    (3, 3, "n3", "snapshot"),  # changed and back: as it was, former value kept
    (499, 499, "n499", "snapshot"),
    (501, 501, None, "insert"),  # new: no value of the dropped column
]


def _open(binlog: Binlog) -> Engine:
    path = binlog.project()
    path.write_text(path.read_text() + "        drift: {drop: evolve}\n")
    return Engine.open(path)


def _lake(engine: Engine) -> list[tuple[Any, ...]]:
    rows = engine.sql(
        "SELECT id, qty, note, _combined_op AS op FROM db.items "
        "WHERE id IN (1, 2, 3, 499, 500, 501) ORDER BY id"
    ).to_pylist()
    return [(r["id"], r["qty"], r["note"], r["op"]) for r in rows]


def test_a_binlog_keeps_a_dropped_columns_values_on_rows_it_leaves_unchanged(
    binlog: Binlog,
) -> None:
    engine = _open(binlog)
    try:
        _captured(engine)
        binlog.sql(*BACKLOG)
        stats = _captured(engine)
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (1, 1, 1), stats
        # (a stream has no source count: the lake's side is checked, a mismatch fails the Run)
        assert stats["reconciliation"] == "not_reconciled", stats
        assert _lake(engine) == KEPT
        assert engine.sql("SELECT count(*) AS n FROM db.items").to_pylist() == [{"n": 500}]
        # billed: the 500 first seen, then id 501; the update of id 1 and the delete of id 500
        assert _month(engine) == (501, 501, 1, 1)

        # Nothing changed since: no row written or billed (an empty Delivery may commit
        # the stream's position), the drop not told again.
        again = _captured(engine)
        assert (again["captured"], again["updates"]) == (0, 0), again
        assert _month(engine) == (501, 501, 1, 1)
        assert _lake(engine) == KEPT
        assert _drifts(engine) == [("drop", "note", "evolve")]

        # Later, with the drop judged: the same for a row changed and back.
        binlog.sql(
            "UPDATE {t} SET qty = 0 WHERE id IN (3, 499)", "UPDATE {t} SET qty = 3 WHERE id = 3"
        )
        later = _captured(engine)
        assert later["updates"] == 1, later
        assert _lake(engine)[2:4] == [(3, 3, "n3", "snapshot"), (499, 0, None, "update")]
        assert _month(engine) == (501, 501, 2, 1)
    finally:
        engine.close()


def test_a_drop_read_after_changes_that_held_the_column_keeps_it_on_rows_left_unchanged(
    binlog: Binlog,
) -> None:
    # The backlog's changes before the drop hold the column, so the capture's
    # rows do (null after the drop): a row changed and back after the drop
    # lost its value and was billed.
    engine = _open(binlog)
    try:
        _captured(engine)
        binlog.sql("UPDATE {t} SET note = 'z' WHERE id = 499", *BACKLOG[:5])
        stats = _captured(engine)
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (0, 2, 0), stats
        assert _lake(engine)[:4] == [
            (1, -1, None, "update"),
            (2, 2, "n2", "snapshot"),
            (3, 3, "n3", "snapshot"),
            (499, 499, "z", "update"),  # its change before the drop
        ]
        assert _month(engine) == (500, 500, 2, 0)
    finally:
        engine.close()
