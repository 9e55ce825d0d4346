"""A column dropped and added again under its name while its changes wait in the binlog.

The ADD makes a new column: no value of the dropped one may stay in it. The
server logs no row event for the rows present, which hold the new column's
default (NULL here): the lake must hold what the source holds.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.engine._binlog import Binlog
from tests.engine.test_binlog_columns import lake_rows, source_rows

from combined.catalog import data as cat
from combined.connectors.mariadb._binlog_fill import left_columns
from combined.engine import Engine


def _rows(engine: Engine) -> list[tuple[Any, ...]]:
    return lake_rows(engine, "id, qty, b")


def _landed(engine: Engine, binlog: Binlog) -> list[tuple[Any, ...]]:
    """Capture: the lake's rows, once checked to be the source's."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    got = _rows(engine)
    assert got == source_rows(binlog, "id, qty, b")
    return got


def _captured(binlog: Binlog, drift: str = "drop: evolve", *, b: bool = True) -> Engine:
    """The table captured once (with a column ``b``, ``-qty``, unless not ``b``)."""
    if b:
        binlog.sql("ALTER TABLE {t} ADD COLUMN b INT", "UPDATE {t} SET b = -qty")
    path = binlog.project()
    path.write_text(path.read_text() + f"        drift: {{{drift}}}\n")
    engine = Engine.open(path)
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return engine


BACKLOGS = {
    "two statements, a row between": [
        "ALTER TABLE {t} DROP COLUMN b",
        "UPDATE {t} SET qty = 20 WHERE id = 2",
        "ALTER TABLE {t} ADD COLUMN b INT",
    ],
    "one statement": ["ALTER TABLE {t} DROP COLUMN b, ADD COLUMN b INT"],
    # every former value past 127 does not fit: the next capture failed on them
    "a narrower type": ["ALTER TABLE {t} DROP COLUMN b", "ALTER TABLE {t} ADD COLUMN b TINYINT"],
}


@pytest.mark.parametrize("backlog", list(BACKLOGS))
def test_a_column_dropped_and_added_again_holds_none_of_the_dropped_ones_values(
    binlog: Binlog, backlog: str
) -> None:
    """Before, the read matched the logged columns to the table's by name: every row
    the log did not change after the ADD kept the dropped column's value (-4 where
    the source holds NULL), and with a narrower type the next capture failed
    on the former values ("Integer value ... not in range")."""
    engine = _captured(binlog, "drop: evolve, narrowed_type: evolve")
    try:
        binlog.sql(
            "UPDATE {t} SET b = 7, qty = 10 WHERE id = 1",  # a change before the drop
            *BACKLOGS[backlog],
            "UPDATE {t} SET b = 9 WHERE id = 3",  # changes after the ADD
            "UPDATE {t} SET qty = 40 WHERE id = 4",
        )
        assert _landed(engine, binlog)[:4] == [
            (1, 10, None),
            (2, 20 if "between" in backlog else 2, None),
            (3, 3, 9),
            (4, 40, None),
        ]
        with engine.catalog.begin() as conn:  # (the source's nulls counted, as the lake's)
            (body, *_) = [e.body for e in cat.activity(conn, kind="reconciliation", exact=True)]
        assert body["filled_nulls"] == {"b": {"source": 499, "lake": 499}}
        binlog.sql("UPDATE {t} SET qty = 50 WHERE id = 5")
        _landed(engine, binlog)  # (started past the ADD: the new column's own type)
    finally:
        engine.close()


def test_a_column_dropped_in_one_capture_and_added_again_in_the_next_is_a_new_column(
    binlog: Binlog,
) -> None:
    """The lake keeps a dropped column's values under `drop: evolve`; the ADD of its name
    in a later backlog left them on every row the log did not change since."""
    engine = _captured(binlog)
    try:
        binlog.sql("ALTER TABLE {t} DROP COLUMN b", "UPDATE {t} SET qty = 20 WHERE id = 2")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _rows(engine)[:3] == [(1, 1, -1), (2, 20, None), (3, 3, -3)]  # (kept, as dropped)
        binlog.sql("ALTER TABLE {t} ADD COLUMN b INT", "UPDATE {t} SET b = 9 WHERE id = 3")
        assert _landed(engine, binlog)[:3] == [(1, 1, None), (2, 20, None), (3, 3, 9)]
    finally:
        engine.close()


@pytest.mark.parametrize("away", ["DROP COLUMN b", "DROP IF EXISTS `b`", "RENAME COLUMN b TO c"])
def test_a_column_added_taken_away_and_added_again_in_one_backlog_keeps_no_first_value(
    binlog: Binlog, away: str
) -> None:
    """A column new to the lake: the values its first life logged landed on the rows
    they changed, where the source holds the second one's NULL."""
    engine = _captured(binlog, b=False)
    try:
        binlog.sql(
            "ALTER TABLE {t} ADD COLUMN b INT",
            "UPDATE {t} SET b = 5 WHERE id <= 3",
            f"ALTER TABLE {{t}} {away}",
            "ALTER TABLE {t} ADD COLUMN b INT",
            "UPDATE {t} SET b = 9 WHERE id = 3",
        )
        assert _landed(engine, binlog)[:3] == [(1, 1, None), (2, 2, None), (3, 3, 9)]
    finally:
        engine.close()


def test_a_drop_between_changes_is_judged_by_the_drop_policy(binlog: Binlog) -> None:
    """The ADD's fill that follows does not hide the DROP from `drop: fail` (the default):
    nothing is committed, as for a DROP alone."""
    engine = _captured(binlog, "narrowed_type: fail")
    try:
        binlog.sql("UPDATE {t} SET b = 7 WHERE id = 1", *BACKLOGS["two statements, a row between"])
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "drop on field 'b'" in (run.error or "")
        assert _rows(engine)[:2] == [(1, 1, -1), (2, 2, -2)]
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("alter", "left"),
    [
        ("`t` DROP b, DROP INDEX i, DROP PRIMARY KEY, ALTER COLUMN c DROP DEFAULT", ["b"]),
        ("`t` DROP COLUMN IF EXISTS `we``ird`, DROP FOREIGN KEY f, DROP CHECK k", ["we`ird"]),
        ("`t` CHANGE a b INT, RENAME COLUMN c TO d, MODIFY e INT", ["a", "c"]),
        ("`t` ADD x INT COMMENT 'drop y', DROP COLUMN period", ["period"]),
    ],
)
def test_the_names_an_alter_takes_away_are_read_from_its_clauses(
    alter: str, left: list[str]
) -> None:
    """A DROP of an index, a key, a constraint or a default takes no column away."""
    assert left_columns(alter) == left
