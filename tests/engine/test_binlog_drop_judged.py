"""A column dropped while changes that hold it wait in the binlog is judged as a drop.

The capture that reads those changes carries the column; the next one does
not, but the last commit had recorded the source's columns without it, so it
counted as judged. Under ``drop: fail`` both captures succeeded, the drop
never told (found by a review of the re-added column's fix).
"""

from __future__ import annotations

from tests.engine._binlog import Binlog
from tests.engine.test_binlog_readd import _captured

from combined.catalog import data as cat
from combined.engine import Engine


def _succeeds(engine: Engine) -> None:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error


def test_a_drop_read_after_changes_that_hold_the_column_is_judged_by_its_policy(
    binlog: Binlog,
) -> None:
    engine = _captured(binlog, "drop: fail")
    try:
        binlog.sql("UPDATE {t} SET b = 7, qty = 10 WHERE id = 1", "ALTER TABLE {t} DROP COLUMN b")
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "schema drift" in (run.error or "") and "drop on field 'b'" in (run.error or "")
        (again,) = engine.capture()  # still held: nothing was committed
        assert again.state == "needs_review", again.error
    finally:
        engine.close()


def test_an_evolved_drop_is_told_once(binlog: Binlog) -> None:
    engine = _captured(binlog, "drop: evolve")
    try:
        binlog.sql("UPDATE {t} SET b = 7, qty = 10 WHERE id = 1", "ALTER TABLE {t} DROP COLUMN b")
        _succeeds(engine)
        binlog.sql("UPDATE {t} SET qty = 11 WHERE id = 2")
        _succeeds(engine)
        with engine.catalog.begin() as conn:
            events = cat.activity(conn, kind="drift")
        told = [e.body for e in events if e.body.get("class") == "drop"]
        assert [(b["field"], b["outcome"]) for b in told] == [("b", "evolve")], told
    finally:
        engine.close()


def test_a_rename_read_by_a_capture_of_no_change_is_left_to_its_policy(binlog: Binlog) -> None:
    """A review of the drop's fix: a RENAME COLUMN read by a capture that carried no row
    was judged a drop (its rows still held the old name), stopping a follower whose
    policy evolves renames."""
    engine = _captured(binlog, "rename: evolve, new_field: evolve")
    try:
        binlog.sql("ALTER TABLE {t} RENAME COLUMN b TO b2")
        _succeeds(engine)
        binlog.sql("UPDATE {t} SET qty = 11 WHERE id = 2")
        _succeeds(engine)
    finally:
        engine.close()
