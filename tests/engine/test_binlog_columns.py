"""Columns reordered, renamed or swapped by name while their changes wait in the binlog.

A rename logs no row event: the rows present hold their values under the new
name. Rows must land in the columns the source holds them in, never swapped.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.engine._binlog import Binlog, lake
from tests.engine.test_binlog_fill import captured_then

from combined.engine import Engine


def lake_rows(engine: Engine, columns: str = "id, qty, b, note") -> list[tuple[Any, ...]]:
    rows = engine.sql(f"SELECT {columns} FROM db.items ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def source_rows(binlog: Binlog, columns: str = "id, qty, b, note") -> list[tuple[Any, ...]]:
    return [tuple(r) for r in binlog.sql(f"SELECT {columns} FROM {{t}} ORDER BY id")]


SWAPS = {
    "three renames": [
        "ALTER TABLE {t} RENAME COLUMN qty TO tmp",
        "ALTER TABLE {t} RENAME COLUMN b TO qty",
        "ALTER TABLE {t} RENAME COLUMN tmp TO b",
    ],
    "one statement": ["ALTER TABLE {t} RENAME COLUMN qty TO b, RENAME COLUMN b TO qty"],
    "changes": [
        "ALTER TABLE {t} CHANGE qty tmp INT",
        "ALTER TABLE {t} CHANGE b qty INT",
        "ALTER TABLE {t} CHANGE tmp b INT",
    ],
}


@pytest.mark.parametrize("swap", list(SWAPS))
def test_two_columns_swapped_by_name_with_changes_pending_land_unswapped(
    binlog: Binlog, swap: str
) -> None:
    """Before, RENAME COLUMN went by: every row not changed after the swap kept the other
    column's value under each name (497 of 500 rows swapped)."""
    binlog.sql("ALTER TABLE {t} ADD COLUMN b INT", "UPDATE {t} SET b = -qty")
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("UPDATE {t} SET qty = 1000 + id WHERE id <= 3")  # pending before the swap
        binlog.sql(*SWAPS[swap])
        binlog.sql("UPDATE {t} SET note = 'after' WHERE id BETWEEN 4 AND 6")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake_rows(engine) == source_rows(binlog)
        assert lake_rows(engine)[0] == (1, -1, 1001, "n1")
    finally:
        engine.close()


def test_a_row_changed_between_the_renames_lands_as_the_source_holds_it(
    binlog: Binlog,
) -> None:
    """A change logged while a column had the swap's interim name lacks the other; the
    renames' fills that follow read both names again. (Until the second fill kept
    the first one's column, its batch lacked it: the drift rules held the capture
    for review, and under ``drop: evolve`` the column landed null.)"""
    binlog.sql("ALTER TABLE {t} ADD COLUMN b INT", "UPDATE {t} SET b = -qty")
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        before = lake_rows(engine)
        binlog.sql(
            "ALTER TABLE {t} RENAME COLUMN qty TO tmp",
            "UPDATE {t} SET tmp = 3000 + id WHERE id = 7",
            "ALTER TABLE {t} RENAME COLUMN b TO qty",
            "ALTER TABLE {t} RENAME COLUMN tmp TO b",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake_rows(engine) == source_rows(binlog) != before
        assert lake_rows(engine)[6] == (7, -7, 3007, "n7")
    finally:
        engine.close()


def test_a_column_renamed_to_a_new_name_holds_every_rows_value(binlog: Binlog) -> None:
    """Before, the new name held values only on rows changed after the rename (the rest
    null), and the old name kept the values the source no longer has under it."""
    path = binlog.project()
    path.write_text(path.read_text() + "        drift: {rename: evolve}\n")
    engine = Engine.open(path)
    try:
        engine.capture()
        binlog.sql(
            "ALTER TABLE {t} RENAME COLUMN note TO label",
            "UPDATE {t} SET qty = 0 WHERE id = 2",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        lake = engine.sql("SELECT id, label FROM db.items ORDER BY id").to_pylist()
        source = binlog.sql("SELECT id, label FROM {t} ORDER BY id")
        assert [(r["id"], r["label"]) for r in lake] == [tuple(r) for r in source]
    finally:
        engine.close()


def test_columns_moved_first_or_after_between_captures_keep_their_values(
    binlog: Binlog,
) -> None:
    """The log names each row's columns: a reorder mid-stream moves no value (held before)."""
    binlog.sql("ALTER TABLE {t} ADD COLUMN b INT", "UPDATE {t} SET b = -qty")
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql(
            "UPDATE {t} SET qty = 1000 + id WHERE id <= 3",
            "ALTER TABLE {t} MODIFY note VARCHAR(40) FIRST",
            "UPDATE {t} SET qty = 2000 + id WHERE id BETWEEN 4 AND 6",
            "ALTER TABLE {t} MODIFY qty INT AFTER b",
            "UPDATE {t} SET note = 'after', b = 5 WHERE id BETWEEN 7 AND 9",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake_rows(engine) == source_rows(binlog)
    finally:
        engine.close()


def test_a_change_logged_without_column_names_is_refused_naming_the_setting(
    binlog: Binlog,
) -> None:
    """Before, a change logged while binlog_row_metadata was MINIMAL failed as lacking the
    key column, with the hint to fix the dataset's `key:`."""
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        with binlog.alone():
            binlog.sql("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
            try:
                binlog.sql("UPDATE {t} SET qty = 7 WHERE id = 2")
            finally:
                binlog.sql("SET GLOBAL binlog_row_metadata = 'FULL'")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert "logged while binlog_row_metadata was not FULL" in (run.error or "")
        assert engine.sql("SELECT qty FROM db.items WHERE id = 2").column("qty")[0].as_py() == 2
    finally:
        engine.close()


def test_two_fills_with_no_row_between_keep_the_first_ones_column(binlog: Binlog) -> None:
    """A row changed, then two ALTERs each giving the rows a value: the second
    fill's batch held the columns of the rows before it and its own, not the
    first fill's, which landed null on every row, silently, and stayed so."""
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql(
            "UPDATE {t} SET qty = 9 WHERE id = 1",
            "ALTER TABLE {t} ADD COLUMN c INT DEFAULT 5",
            "ALTER TABLE {t} ADD COLUMN d INT DEFAULT 6",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, qty, c, d FROM db.items ORDER BY id").to_pylist()
        source = binlog.sql("SELECT id, qty, c, d FROM {t} ORDER BY id")
        assert [tuple(r.values()) for r in rows] == [tuple(r) for r in source]
        assert rows[0] == {"id": 1, "qty": 9, "c": 5, "d": 6}
    finally:
        engine.close()


def _captured_with_b(binlog: Binlog) -> Engine:
    """The table with a column ``b`` (``-qty``) captured once, its drops evolving."""
    binlog.sql("ALTER TABLE {t} ADD COLUMN b INT", "UPDATE {t} SET b = -qty")
    path = binlog.project()
    path.write_text(path.read_text() + "        drift: {drop: evolve}\n")
    engine = Engine.open(path)
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return engine


def test_a_value_updated_then_its_column_dropped_keeps_the_update_under_drop_evolve(
    binlog: Binlog,
) -> None:
    """The read planned its columns from the catalog at its start, which no longer had
    the dropped one: the update logged before the drop landed null in it, silently
    (the other rows kept their values), as did every later capture."""
    engine = _captured_with_b(binlog)
    try:
        binlog.sql("UPDATE {t} SET b = 777 WHERE id = 1", "ALTER TABLE {t} DROP COLUMN b")
        binlog.sql("UPDATE {t} SET qty = 70 WHERE id = 2")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, qty, b FROM db.items ORDER BY id").to_pylist()
        assert rows[:3] == [
            {"id": 1, "qty": 1, "b": 777},
            {"id": 2, "qty": 70, "b": None},  # changed after the drop: the column is gone
            {"id": 3, "qty": 3, "b": -3},
        ]
    finally:
        engine.close()


def test_a_column_added_then_another_dropped_keeps_the_dropped_ones_values(
    binlog: Binlog,
) -> None:
    """The ADD's fill, with no row before it in the read, left out the column the
    backlog's DROP removed: it landed null on every row under `drop: evolve`, where a
    DROP alone kept the values (found by a MariaDB review)."""
    engine = _captured_with_b(binlog)
    try:
        binlog.sql("ALTER TABLE {t} ADD COLUMN x INT DEFAULT 1", "ALTER TABLE {t} DROP COLUMN b")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, qty, b, x FROM db.items ORDER BY id").to_pylist()
        assert rows[:2] == [
            {"id": 1, "qty": 1, "b": -1, "x": 1},
            {"id": 2, "qty": 2, "b": -2, "x": 1},
        ]
        assert all(r["b"] == -r["qty"] and r["x"] == 1 for r in rows)
    finally:
        engine.close()


def test_a_column_narrowed_after_a_wider_value_was_logged_is_followed(binlog: Binlog) -> None:
    """`UPDATE qty = 300; UPDATE qty = 5; ALTER TABLE MODIFY qty TINYINT` (every value then
    fits): the update logged before the ALTER was read as the new type, 300 did not fit
    int8, and every capture stopped there, needs_review (found by a MariaDB review)."""
    binlog.sql("UPDATE {t} SET qty = id % 100")
    path = binlog.project()
    path.write_text(path.read_text() + "        drift: {narrowed_type: evolve}\n")
    engine = Engine.open(path)
    try:
        narrowing = ("UPDATE {t} SET qty = 300 WHERE id = 1", "UPDATE {t} SET qty = 5 WHERE id = 1")
        run = captured_then(engine, binlog, *narrowing, "ALTER TABLE {t} MODIFY qty TINYINT")
        assert run.state == "succeeded", run.error
        assert binlog.checkpoint()["narrowed"].keys() == {"qty"}  # (kept while it may be met)
        assert lake(engine) == binlog.source()
        binlog.sql("UPDATE {t} SET qty = -7 WHERE id = 2")
        (run,) = engine.capture()  # started past the ALTER: the column narrows, as declared
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source() and "narrowed" not in binlog.checkpoint()
    finally:
        engine.close()


def test_a_dropped_columns_record_lasts_until_a_read_starts_past_the_drop(
    binlog: Binlog,
) -> None:
    """A read stopped early (--max-changes) before the change naming the dropped column
    leaves the column in its checkpoint's record; the next read takes it from there."""
    engine = _captured_with_b(binlog)
    try:
        binlog.sql(
            "UPDATE {t} SET qty = 60 WHERE id = 4",
            "UPDATE {t} SET b = 555 WHERE id = 5",
            "ALTER TABLE {t} DROP COLUMN b",
        )
        (run,) = engine.capture(read_options={"max_changes": 1})
        assert run.state == "succeeded", run.error
        state = engine.sql("SELECT b FROM db.items WHERE id = 5").to_pylist()
        assert state == [{"b": -5}]  # not read yet
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT b FROM db.items WHERE id = 5").to_pylist() == [{"b": 555}]
        assert "b" in binlog.checkpoint()["columns"] and "b" in binlog.checkpoint()["gone"]
        binlog.sql("UPDATE {t} SET qty = 80 WHERE id = 6")
        (run,) = engine.capture()  # started past the drop: the record lets the column go
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT qty, b FROM db.items WHERE id = 6").to_pylist() == [
            {"qty": 80, "b": None}
        ]
        kept = binlog.checkpoint()
        assert "b" not in kept["columns"] and "gone" not in kept
        assert list(kept["columns"]) == ["id", "qty", "note"]
    finally:
        engine.close()
