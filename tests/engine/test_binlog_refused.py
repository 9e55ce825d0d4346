"""Tables whose binlog does not say which rows changed are refused before any read.

A system-versioned table, a table a foreign key cascades into, a view: each
went by silently (the capture succeeded, the lake kept what the source lost).
"""

from __future__ import annotations

from tests.engine._binlog import Binlog, lake

from combined.engine import Engine


def test_a_system_versioned_table_is_refused_naming_the_way_out(binlog: Binlog) -> None:
    """Its binlog logs a DELETE as an update closing the row's period.

    Before this change a deleted row stayed in the lake and an update kept the old
    value (the history row's insert came after it under the same key).
    """
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("ALTER TABLE {t} ADD SYSTEM VERSIONING", "DELETE FROM {t} WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "failed" and "system-versioned" in (run.error or "")
        assert "snapshot or cursor strategy" in (run.error or "")
        assert lake(engine)[0][0] == 1  # nothing committed: the refusal, not a silent loss
    finally:
        engine.close()
    binlog.sql("DELETE FROM {t}")
    (tmp := binlog.root / "again").mkdir()
    binlog.root = tmp
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()  # a first snapshot of a versioned table
        assert run.state == "failed" and "system-versioned" in (run.error or "")
    finally:
        engine.close()


def test_a_table_a_foreign_key_cascades_into_is_refused(binlog: Binlog) -> None:
    """InnoDB applies ON DELETE/UPDATE CASCADE below the binlog: no row event.

    Before this change a parent's delete removed child rows at the source
    while the capture succeeded with no change: the lake kept them.
    """
    parent = f"`{binlog.table}_p`"
    binlog.sql(
        "DROP TABLE {t}",
        f"CREATE TABLE {parent} (id INT PRIMARY KEY) ENGINE=InnoDB",
        f"INSERT INTO {parent} VALUES (1)",
        "CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40), pid INT,"
        f" CONSTRAINT fk_h FOREIGN KEY (pid) REFERENCES {parent} (id) ON DELETE CASCADE)"
        " ENGINE=InnoDB",
        "INSERT INTO {t} VALUES (1, 1, 'a', 1)",
    )
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "failed", run.error
        assert "foreign key fk_h" in (run.error or "")
        assert "ON DELETE RESTRICT" in (run.error or "")
        binlog.sql(
            "ALTER TABLE {t} DROP FOREIGN KEY fk_h",
            f"ALTER TABLE {{t}} ADD CONSTRAINT fk_h FOREIGN KEY (pid) REFERENCES {parent} (id)",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
        binlog.sql("DROP TABLE {t}", f"DROP TABLE {parent}")


def test_a_view_is_refused_naming_the_way_out(binlog: Binlog) -> None:
    """The binlog logs a view's changes under its base table's name only.

    Before this change the first capture read the view's snapshot and every
    later one succeeded with no change: the lake kept the rows of that day.
    """
    base = binlog.table
    binlog.table = f"{base}_v"
    binlog.sql(f"CREATE VIEW {{t}} AS SELECT id, qty, note FROM `{base}`")
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "failed", run.error
        assert "is a view" in (run.error or "")
        assert "base table with cdc" in (run.error or "")
    finally:
        engine.close()
        binlog.sql("DROP VIEW {t}")
