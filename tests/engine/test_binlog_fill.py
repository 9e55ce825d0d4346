"""MariaDB binlog CDC: columns an ALTER TABLE gave the rows present, filled from the source.

The server logs no row event for the rows an ``ADD COLUMN`` gives a value;
the capture reads them in a consistent snapshot and lands each as an update
of the new columns alone, then reads the binlog on past that snapshot.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.engine._binlog import Binlog, lake

from combined.catalog import data as cat
from combined.engine import Engine

#: The writes after the ALTER, in the same backlog: a new row, a changed one, a deleted one.
AFTER = (
    "SET SESSION sql_mode = ''",  # an implicit default for a NOT NULL column
    "INSERT INTO {t} (id, qty, note) VALUES (9001, 5, 'new')",
    "UPDATE {t} SET qty = 77 WHERE id = 2",
    "DELETE FROM {t} WHERE id = 3",
)


def captured_then(engine: Engine, binlog: Binlog, *statements: str) -> Any:
    """Capture (the first snapshot), run ``statements`` on the source, capture again: that run."""
    engine.capture()
    binlog.sql(*statements)
    (run,) = engine.capture()
    return run


def rows(engine: Engine, binlog: Binlog, columns: tuple[str, ...]) -> tuple[list[Any], list[Any]]:
    """The lake's and the source's rows, every column as text."""
    lake_cols = ", ".join(f"CAST({c} AS VARCHAR) AS v_{c}" for c in ("id", "qty", "note", *columns))
    got = engine.sql(f"SELECT {lake_cols} FROM db.items ORDER BY id").to_pylist()
    source_cols = ", ".join(f"CAST(`{c}` AS CHAR)" for c in ("id", "qty", "note", *columns))
    want = binlog.sql(f"SELECT {source_cols} FROM {{t}} ORDER BY id")
    return [tuple(r.values()) for r in got], [tuple(r) for r in want]


@pytest.mark.parametrize(
    ("clauses", "columns"),
    [
        ("ADD COLUMN c VARCHAR(10) DEFAULT 'dflt'", ("c",)),
        ("ADD INDEX (qty), ADD c INT NOT NULL", ("c",)),
        ("ADD COLUMN IF NOT EXISTS (a INT, b INT DEFAULT 3)", ("a", "b")),
        ("ADD COLUMN g INT AS (qty * 2) PERSISTENT", ("g",)),
        ("ADD COLUMN n SERIAL, ADD UNIQUE (n)", ("n",)),
        ("ADD COLUMN c INT DEFAULT NULL COMMENT 'x, not null', ADD INDEX (qty)", ("c",)),
        # no space after DEFAULT: these went unfilled, null in the lake (and DEFAULT (NULL),
        # filled, left a false reconciliation mismatch)
        ("ADD COLUMN a INT DEFAULT(5), ADD b VARCHAR(5) DEFAULT'xy'", ("a", "b")),
        ("ADD COLUMN c INT DEFAULT (NULL)", ("c",)),
    ],
)
def test_a_column_added_with_a_value_for_the_rows_present_is_filled(
    binlog: Binlog, clauses: str, columns: tuple[str, ...]
) -> None:
    """Every row holds the value the ALTER gave it; later writes in the backlog win.

    Before this change the capture failed ("without a change in the binlog ...
    combined cdc teardown") for each clause but the last.
    """
    engine = Engine.open(binlog.project())
    try:
        alter = f"ALTER TABLE {{t}} {clauses}"
        run = captured_then(engine, binlog, "UPDATE {t} SET qty = -qty WHERE id = 1", alter, *AFTER)
        assert run.state == "succeeded", run.error
        got, want = rows(engine, binlog, columns)
        assert len(got) == 500 and got == want
        assert got[0][:3] == ("1", "-1", "n1") and ("9001", "5", "new") in [g[:3] for g in got]
        # reconciliation compares the filled columns' nulls, counted in the source
        with engine.catalog.begin() as conn:
            (body, *_) = [e.body for e in cat.activity(conn, kind="reconciliation", exact=True)]
        nulls = body["filled_nulls"]
        if "NULL" in clauses and "NOT NULL" not in clauses:
            assert nulls is None
        else:
            assert nulls and set(nulls) <= set(columns)
            assert all(n["source"] == n["lake"] for n in nulls.values()), nulls
        binlog.sql("UPDATE {t} SET qty = 8 WHERE id = 4")
        (run,) = engine.capture()  # the next capture goes on from the fill's run
        assert run.state == "succeeded", run.error
        assert rows(engine, binlog, columns)[0] == rows(engine, binlog, columns)[1]
    finally:
        engine.close()


def test_a_read_stopped_early_goes_on_past_the_rows_it_filled(binlog: Binlog) -> None:
    """`follow --max-changes` ends past the fill's snapshot: a row inserted after the ALTER
    lands with its insert, never as its key and new column alone.

    Before this change the read failed at the ALTER.
    """
    from combined.connectors.abc import ReadRequest
    from combined.connectors.mariadb import MariaDBSource
    from combined.protocol import RecordBatchMessage, StateMessage

    state = binlog.first_state()
    binlog.sql(
        "ALTER TABLE {t} ADD COLUMN c INT NOT NULL DEFAULT 7",
        *(f"INSERT INTO {{t}} (id, qty, note) VALUES ({i}, 1, 'x')" for i in range(901, 911)),
    )
    source = MariaDBSource({"dsn": binlog.dsn})
    request = ReadRequest(
        "items", binlog.table, ("id",), "cdc", state=state, options={"max_changes": 5}
    )
    messages = list(source.read(request))
    last = messages[-1]
    assert isinstance(last, StateMessage) and last.final
    batches = [m.batch.to_pylist() for m in messages if isinstance(m, RecordBatchMessage)]
    seen = [r for b in batches for r in b]
    assert len([r for r in seen if r["_combined_op"] == "update"]) == 510  # the inserted too
    inserted = [r["id"] for r in seen if r["_combined_op"] == "insert"]
    assert inserted == list(range(901, 911))
    assert all(r["c"] == 7 for r in seen)


@pytest.mark.parametrize(
    ("before", "backlog", "said"),
    [
        (
            (),
            ("UPDATE {t} SET qty = 0 WHERE id = 1", "ALTER TABLE {t} DROP COLUMN c"),
            "column 'c' ('ADD COLUMN c INT NOT NULL DEFAULT 7') is no longer in the table",
        ),
        # (another key now: the lake's rows cannot be matched by the dataset's)
        (
            ("ALTER TABLE {t} DROP PRIMARY KEY, ADD PRIMARY KEY (id, qty)",),
            (),
            "not a PRIMARY KEY or UNIQUE index",
        ),
        # the key made text: its fill landed every row again beside the old ones
        ((), ("ALTER TABLE {t} MODIFY id VARCHAR(20)",), "key column 'id' was redefined"),
    ],
)
def test_a_fill_that_cannot_hold_needs_a_new_snapshot(
    binlog: Binlog, before: tuple[str, ...], backlog: tuple[str, ...], said: str
) -> None:
    """A column gone again has no values to read; a key other than the table's cannot match
    a row read to its lake row: refused, naming the way out, nothing committed."""
    if before:
        binlog.sql(*before)
    engine = Engine.open(binlog.project())
    try:
        added = "ALTER TABLE {t} ADD COLUMN c INT NOT NULL DEFAULT 7"
        run = captured_then(engine, binlog, added, *backlog)
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert said in (run.error or "") and "combined cdc teardown" in (run.error or "")
        assert lake(engine)[0] == (1, 1, "n1")
    finally:
        engine.close()


def test_a_fill_met_between_a_migrations_drop_and_add_primary_key_is_retried(
    binlog: Binlog,
) -> None:
    """A capture that fell between a migration's DROP PRIMARY KEY and its ADD PRIMARY KEY
    ended needs_review (a new snapshot), and stopped a follower for good, though the
    key was back a moment later."""
    engine = Engine.open(binlog.project())
    try:
        run = captured_then(
            engine,
            binlog,
            "ALTER TABLE {t} ADD COLUMN c INT NOT NULL DEFAULT 7",
            "ALTER TABLE {t} DROP PRIMARY KEY",
        )
        assert run.state == "failed"  # (retried by a schedule or a follower)
        assert "holds no PRIMARY KEY now" in (run.error or "")
        assert "the next capture tries again" in (run.error or "")
        assert lake(engine)[0] == (1, 1, "n1")  # nothing committed
        binlog.sql("ALTER TABLE {t} ADD PRIMARY KEY (id)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        got, want = rows(engine, binlog, ("c",))
        assert got == want and {g[3] for g in got} == {"7"}
    finally:
        engine.close()


def test_columns_whose_values_a_modify_rewrote_are_filled(binlog: Binlog) -> None:
    """MODIFY cuts 'n123' to 'n1' and turns a NULL into NOT NULL's 0, logging no row event.

    Before this change the lake kept 'n123' and NULL, unlike the source.
    """
    engine = Engine.open(binlog.project())
    try:
        run = captured_then(
            engine,
            binlog,
            "SET SESSION sql_mode = ''",
            "UPDATE {t} SET qty = NULL WHERE id = 6",
            "ALTER TABLE {t} MODIFY note VARCHAR(2), CHANGE COLUMN qty qty INT NOT NULL",
            *AFTER,
        )
        assert run.state == "succeeded", run.error
        got = lake(engine)
        assert got == binlog.source() and got[4] == (6, 0, "n6") and got[100][2] == "n1"
    finally:
        engine.close()


def test_a_column_added_while_the_read_goes_on_is_filled(
    binlog: Binlog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ALTER committed after the read took the table's columns, before the read
    reached it: the fill kept only columns the read knew, so every row held null
    in the new column (until a later change), and the checkpoint moved past it."""
    from combined.connectors.mariadb._binlog import BinlogExtraction

    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql("UPDATE {t} SET qty = 0 WHERE id = 1")
        opened = BinlogExtraction._open

        def racing(self: BinlogExtraction) -> Any:
            out = opened(self)
            binlog.sql("ALTER TABLE {t} ADD COLUMN c INT NOT NULL DEFAULT 5")
            return out

        monkeypatch.setattr(BinlogExtraction, "_open", racing)
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        got, want = rows(engine, binlog, ("c",))
        assert got == want and {g[3] for g in got} == {"5"}
    finally:
        engine.close()


def test_a_change_logged_in_a_columns_former_type_names_the_way_out(binlog: Binlog) -> None:
    """A change logged before ``MODIFY`` changed its column's type is read in the new
    type, which may not hold it: the capture stops, and said only to leave the
    column out or capture another way; a new snapshot is what gets past it."""
    engine = Engine.open(binlog.project())
    try:
        run = captured_then(
            engine,
            binlog,
            "UPDATE {t} SET note = '1.5' WHERE id = 1",
            "UPDATE {t} SET note = CAST(id AS CHAR) WHERE id > 1",
            "ALTER TABLE {t} MODIFY note DECIMAL(10,0)",
        )
        assert run.state != "succeeded"
        assert "take a new snapshot" in (run.error or ""), run.error
    finally:
        engine.close()


def filler_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The columns of each read of every row a fill makes (the real read, noted)."""
    from combined.connectors.mariadb._binlog_fill import ColumnFill

    reads: list[tuple[str, ...]] = []
    read = ColumnFill.__call__

    def noted(self: ColumnFill, columns: Any) -> Any:
        reads.append(tuple(columns))
        return read(self, columns)

    monkeypatch.setattr(ColumnFill, "__call__", noted)
    return reads


def column_account(
    binlog: Binlog, monkeypatch: pytest.MonkeyPatch, columns: str
) -> tuple[Path, str, str]:
    """A project reading the table as a new account granted SELECT on ``columns`` alone
    (and the binlog): its file, the account, and the table's name for a GRANT."""
    user, password = f"cdc_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    table = f"`{binlog.dsn.rsplit('/', 1)[1]}`.`{binlog.table}`"
    binlog.sql(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT SELECT ({columns}) ON {table} TO '{user}'@'%'",
        f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, BINLOG MONITOR ON *.* TO '{user}'@'%'",
    )
    return binlog.project_as(user, password, monkeypatch), f"'{user}'@'%'", table


@pytest.mark.parametrize("changes", [("UPDATE {t} SET qty = 0 WHERE id = 1",), ()])
def test_a_column_a_grant_widened_is_filled_and_nothing_else_is(
    binlog: Binlog, monkeypatch: pytest.MonkeyPatch, changes: tuple[str, ...]
) -> None:
    """An account granted SELECT on one more column sees it in the catalog with no ALTER in
    the binlog: every row is filled, not only the rows changed after the grant (and with
    no change since, too).

    Before this change the capture succeeded with the column null on every row the log
    did not change after the grant (the source held 'n2').
    """
    path, user, table = column_account(binlog, monkeypatch, "id, qty")
    reads = filler_reads(monkeypatch)
    engine = Engine.open(path)
    try:
        run = captured_then(engine, binlog, "INSERT INTO {t} VALUES (9001, 5, 'secret')")
        assert run.state == "succeeded", run.error
        assert "note" not in engine.sql("SELECT * FROM db.items LIMIT 1").schema.names
        binlog.sql(f"GRANT SELECT (qty, note) ON {table} TO {user}")
        if changes:
            binlog.sql(*changes)
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
        assert lake(engine)[1] == (2, 2, "n2") and lake(engine)[-1] == (9001, 5, "secret")
        assert reads == [("note",)]
        # nothing appeared since: no fill, no read of every row
        binlog.sql("UPDATE {t} SET note = 'x' WHERE id = 3")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source() and reads == [("note",)]
    finally:
        engine.close()
        binlog.sql(f"DROP USER {user}")


def test_a_column_a_grant_revoked_is_a_drop(
    binlog: Binlog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog hides a column the account may no longer read: a ``drop`` drift, refused
    under the default ``drop: fail``, nothing committed.

    Before this change the next column of the same type took its place in the columns'
    identities (a column's position counted only the columns the account could see): the
    drop was never judged, and every row changed since landed null in it.
    """
    binlog.sql("ALTER TABLE {t} ADD COLUMN tag VARCHAR(40) DEFAULT 't'")
    path, user, table = column_account(binlog, monkeypatch, "id, qty, note, tag")
    engine = Engine.open(path)
    try:
        engine.capture()
        binlog.sql(f"REVOKE SELECT (note) ON {table} FROM {user}")
        for change in (
            "UPDATE {t} SET qty = 0 WHERE id = 1",
            "UPDATE {t} SET qty = 0 WHERE id = 2",
        ):
            binlog.sql(change)
            (run,) = engine.capture()  # (the first read still meets changes naming it)
            assert run.state != "succeeded", run.error
            assert "drop on field 'note'" in (run.error or ""), run.error
        assert lake(engine)[:2] == [(1, 1, "n1"), (2, 2, "n2")]
    finally:
        engine.close()
        binlog.sql(f"DROP USER {user}")


@pytest.mark.parametrize(
    ("options", "new_field"),
    [({}, "evolve"), ({"max_changes": 1}, "evolve"), ({}, "fail")],
)
def test_a_column_the_datasets_columns_list_gained_is_filled(
    binlog: Binlog, monkeypatch: pytest.MonkeyPatch, options: dict[str, int], new_field: str
) -> None:
    """``columns:`` naming one more column: every row takes its value, as in PostgreSQL; a
    read stopped early (``--max-changes``) fills too, and ``drift.new_field`` judges the
    column with its filled rows (refused, nothing lands; let in, every row is filled).

    Before this change only the rows changed after it held a value; the rest held null.
    """
    path = binlog.project()
    text = path.read_text()
    path.write_text(text + "        columns: [id, qty]\n")
    reads = filler_reads(monkeypatch)
    engine = Engine.open(path)
    try:
        run = captured_then(engine, binlog, "UPDATE {t} SET qty = 0 WHERE id = 1")
        assert run.state == "succeeded", run.error
    finally:
        engine.close()
    text += "        columns: [id, qty, note]\n"
    path.write_text(text + f"        drift: {{new_field: {new_field}}}\n")
    binlog.sql(*(f"UPDATE {{t}} SET qty = 7 WHERE id = {i}" for i in (4, 5, 6)))
    engine = Engine.open(path)
    try:
        (run,) = engine.capture(read_options=options)
        if new_field == "fail":
            assert run.state != "succeeded" and "new_field on field 'note'" in (run.error or "")
            assert "note" not in engine.sql("SELECT * FROM db.items LIMIT 1").schema.names
            engine.close()
            path.write_text(text)
            engine = Engine.open(path)
            (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
        assert reads == [("note",)] * (2 if new_field == "fail" else 1)
    finally:
        engine.close()
