"""What the binlog holds that only a new snapshot mends ends the Run ``needs_review``.

Rows left or moved without a row event (a partition truncated or dropped, a
table renamed), a change logged without its whole row, compressed or by a
prepared XA transaction, a position purged from the server: no retry reads
them. The Runs ended ``failed``, which schedules and ``cdc follow`` retried
for ever and alerts told as "retry later", while the hint said to take a new
snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.engine._binlog import Binlog, binlog_table, lake, resnapshot

from combined import cdc
from combined.catalog import Run
from combined.engine import Engine

#: The command pair every such error names.
RESNAPSHOT = "`combined cdc teardown <source>` then `combined cdc setup <source>`"


def stopped_then_refused(engine: Engine) -> Run:
    """The capture that meets the statement commits the changes logged before it and stops
    there; the next one, starting at the statement, ends ``needs_review``, not retried."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    (run,) = engine.capture()
    assert run.state == "needs_review", run.error
    assert len(engine.run(run.id)["attempts"]) == 1  # not retried
    return run


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("ALTER TABLE {t} TRUNCATE PARTITION p0", "altered (TRUNCATE PARTITION)"),
        ("ALTER TABLE {t} DROP PARTITION p0", "altered (DROP PARTITION)"),
    ],
)
def test_a_partition_emptied_in_the_backlog_needs_a_new_snapshot(
    binlog: Binlog, statement: str, said: str
) -> None:
    """The partition's rows leave without row events: the capture stops, ``needs_review``,
    naming the command pair, and that pair's new snapshot lands the table as it is."""
    binlog.sql(
        "ALTER TABLE {t} PARTITION BY RANGE (id) "
        "(PARTITION p0 VALUES LESS THAN (100), PARTITION p1 VALUES LESS THAN MAXVALUE)"
    )
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("DELETE FROM {t} WHERE id = 300", statement)
        run = stopped_then_refused(engine)
        assert said in (run.error or "") and RESNAPSHOT in (run.error or "")
        assert engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py() == 499
        resnapshot(engine, binlog)
    finally:
        engine.close()


def test_a_key_column_dropped_in_the_backlog_needs_a_new_snapshot(binlog: Binlog) -> None:
    """A row image without the dataset's key cannot be matched to its lake row."""
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql("ALTER TABLE {t} DROP COLUMN id", "UPDATE {t} SET note = 'x' WHERE qty = 5")
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "lacks key column 'id'" in (run.error or "") and RESNAPSHOT in (run.error or "")
    finally:
        engine.close()


def test_follow_stops_at_a_renamed_table_as_at_a_purged_position(
    binlog: Binlog, tools: Any
) -> None:
    """`cdc follow` ends at once with exit 3 (a person must act) on a RENAME TABLE of the
    captured table in the backlog; it went on failing every capture, exit 1 at its end."""
    binlog.project()
    root = binlog.root
    setup = tools.cli(root, "cdc", "setup", "db")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    binlog.sql(
        "UPDATE {t} SET qty = 0 WHERE id = 1",
        f"RENAME TABLE {{t}} TO old_{binlog.table}",
        "CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))",
    )
    follow = tools.cli(root, "cdc", "follow", "db", "--every", "0", "--iterations", "3")
    assert follow.returncode == 3, follow.stdout + follow.stderr
    runs = [ln for ln in follow.stdout.splitlines() if " run " in ln]
    assert len(runs) == 2 and "needs_review" in runs[1], follow.stdout  # (the first: the update)
    assert "renamed" in follow.stderr and RESNAPSHOT in follow.stderr


@pytest.mark.parametrize(
    ("setting", "fix"),
    [
        ("binlog_row_image = 'MINIMAL'", "SET GLOBAL binlog_row_image = 'FULL'"),
        ("binlog_format = 'STATEMENT'", "SET GLOBAL binlog_format = 'ROW'"),
    ],
)
def test_a_writer_logging_less_than_full_rows_is_refused_with_the_fix(
    binlog: Binlog, setting: str, fix: str
) -> None:
    """A writer session with a partial row image, or logging statements, fails the capture.

    Neither says what the rows hold after the change; the error names the global setting that
    fixes it and the new snapshot, and nothing is committed. Only that snapshot mends the
    change already logged: the Run ends ``needs_review`` (it ended ``failed``, and schedules
    and followers retried it for ever, as "retry later").
    """
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql(f"SET SESSION {setting}", "UPDATE {t} SET qty = 7 WHERE id = 2")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert fix in (run.error or "")
        assert "`combined cdc teardown <source>` then `combined cdc setup <source>`" in (
            run.error or ""
        )
        assert len(engine.run(run.id)["attempts"]) == 1  # not retried
        assert engine.sql("SELECT qty FROM db.items WHERE id = 2").column("qty")[0].as_py() == 2
    finally:
        engine.close()


@contextmanager
def compressing(binlog: Binlog) -> Iterator[None]:
    """The server logging compressed events (a row or statement past 10 bytes), this test
    alone; the settings set back after."""
    ((on, least),) = binlog.sql(
        "SELECT @@GLOBAL.log_bin_compress, @@GLOBAL.log_bin_compress_min_len"
    )
    with binlog.alone():
        binlog.sql("SET GLOBAL log_bin_compress = ON", "SET GLOBAL log_bin_compress_min_len = 10")
        try:
            yield
        finally:
            binlog.sql(
                f"SET GLOBAL log_bin_compress = {int(on)}",
                f"SET GLOBAL log_bin_compress_min_len = {int(least)}",
            )


def logged_compressed(binlog: Binlog, *statements: str) -> list[str]:
    """Run ``statements`` with the server compressing its events (:func:`compressing`);
    the kinds of the events they logged (the position read with the server to this test
    alone: read before, another test's FLUSH BINARY LOGS could move them to a later file)."""
    with compressing(binlog):
        ((file, pos, *_),) = binlog.sql("SHOW MASTER STATUS")
        binlog.sql(*statements)
        return [str(e[2]) for e in binlog.sql(f"SHOW BINLOG EVENTS IN '{file}' FROM {pos}")]


def test_compressed_binlog_events_are_refused_never_skipped(binlog: Binlog) -> None:
    """``log_bin_compress=ON`` is a precondition ``check`` names; a compressed event fails a read.

    The binlog library maps MariaDB's compressed events to an event it does not
    parse, and a read listing the events it wants used to drop them unseen: a
    change logged while compression was on was silently lost.
    """
    from combined.errors import ConfigError

    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        with compressing(binlog):
            with pytest.raises(ConfigError) as err:
                engine.check("db")
            binlog.sql("INSERT INTO {t} SELECT seq, seq, REPEAT('c', 30) FROM seq_501_to_503")
        assert "log_bin_compress is ON" in str(err.value)
        assert "SET GLOBAL log_bin_compress = OFF" in (err.value.hint or "")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert "compressed event" in (run.error or "")
        assert "SET GLOBAL log_bin_compress = OFF" in (run.error or "")
        assert RESNAPSHOT in (run.error or "")
        assert engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py() == 500
    finally:
        engine.close()


def test_a_compressed_event_of_another_table_is_skipped(binlog: Binlog) -> None:
    """Another table's compressed rows events are skipped as its uncompressed ones are.

    Their table id is readable (the TABLE_MAP before them names it): they
    failed every capture of the server's every table, ``needs_review``, when
    ``log_bin_compress`` had been on once, though none held a followed row.
    """
    other = f"`other_{binlog.table}`"
    binlog.sql(f"CREATE TABLE {other} (id INT PRIMARY KEY, note VARCHAR(200))")
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        logged = logged_compressed(
            binlog,
            f"INSERT INTO {other} SELECT seq, REPEAT('o', 200) FROM seq_1_to_50",
            f"UPDATE {other} SET note = REPEAT('u', 100) WHERE id < 10",
            f"DELETE FROM {other} WHERE id > 40",
        )
        binlog.sql(
            "INSERT INTO {t} VALUES (501, 1, 'after')",
            "UPDATE {t} SET qty = 0 WHERE id = 1",
            "DELETE FROM {t} WHERE id = 2",
        )
        kinds = {f"{kind}_rows_compressed_v1" for kind in ("Write", "Update", "Delete")}
        assert kinds <= set(logged)
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
    finally:
        engine.close()


def test_compressed_statements_are_read_as_statements(binlog: Binlog) -> None:
    """A compressed statement (QUERY_COMPRESSED_EVENT) is decompressed and read as any other.

    Another table's DDL logged compressed failed every capture of the server's every
    table, ``needs_review``; the followed table's compressed TRUNCATE and ALTER take
    effect as when logged uncompressed.
    """
    binlog.first_state()
    other = f"`other_{binlog.table}`"
    logged = logged_compressed(
        binlog,
        f"CREATE TABLE {other} (id INT PRIMARY KEY, note VARCHAR(200))",
        f"ALTER TABLE {other} ADD COLUMN extra INT",
        f"TRUNCATE TABLE {other}",
        "TRUNCATE TABLE {t}",
        "ALTER TABLE {t} ADD COLUMN added INT NOT NULL DEFAULT 7",
    )
    binlog.sql("INSERT INTO {t} VALUES (501, 1, 'after', 8)", "UPDATE {t} SET qty = 2")
    assert logged.count("Query_compressed") >= 5, logged
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source() == [(501, 2, "after")]
        added = engine.sql("SELECT added FROM db.items").column("added").to_pylist()
        assert added == [8]
    finally:
        engine.close()


def test_a_purged_position_needs_a_new_snapshot_and_is_never_skipped(binlog: Binlog) -> None:
    """Binlogs purged past the checkpoint fail the capture, naming teardown then setup.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        with binlog.alone():
            binlog.sql("DELETE FROM {t} WHERE id = 1", "FLUSH BINARY LOGS")
            ((current, _, *_),) = binlog.sql("SHOW MASTER STATUS")
            # MariaDB keeps a binlog until its binlog checkpoint is written: retry a while
            deadline = time.monotonic() + 30
            while binlog.sql("SHOW BINARY LOGS")[0][0] != current:
                assert time.monotonic() < deadline, "the server kept the old binlogs"
                binlog.sql(f"PURGE BINARY LOGS TO '{current}'")
                time.sleep(0.2)
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (a person takes a new snapshot: no retry helps)
        error = run.error or ""
        assert "no longer on the server" in error and "combined cdc teardown" in error
        assert "combined cdc setup" in error
        assert len(engine.run(run.id)["attempts"]) == 1  # not transient: no blind retry
        assert engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py() == 500
        (status,) = cdc.status(engine, "db")
        assert status["committed_retained"] is False and status["may_stay_down_seconds"] == 0
        resnapshot(engine, binlog)
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("RENAME TABLE {t} TO old_{name}", "renamed"),
        ("DROP TABLE IF EXISTS nothing_here, {t}", "dropped"),
        ("ALTER TABLE {t} RENAME TO old_{name}", "altered (RENAME)"),
        ("ALTER TABLE {t} RENAME TO gone_{name}", "altered (RENAME)"),
        ("SET sql_log_bin = 0; DROP TABLE {t}", "dropped or renamed since"),
    ],
)
def test_a_table_renamed_or_dropped_in_the_log_needs_a_new_snapshot(
    binlog: Binlog, statement: str, said: str
) -> None:
    """DDL that takes the rows away without row events fails the capture, naming the way out.

    The table is created again under its name (or left renamed away), and the capture meets
    the statement in the log; a drop in a list, or a rename through ALTER TABLE, counts as
    well. A table gone whose drop the log does not hold (``sql_log_bin = 0``) fails at the
    log's end, nothing committed. Only a new snapshot mends it: the Run ends ``needs_review``
    (it ended ``failed``, retried for ever by schedules and followers).
    """
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql(
            "DELETE FROM {t} WHERE id = 1", *statement.replace("{name}", binlog.table).split("; ")
        )
        gone = "sql_log_bin" in statement  # (fails at the log's end: nothing committed)
        if "gone_" not in statement and not gone:  # a new table of the same name
            binlog.sql("CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))")
        run = engine.capture()[0] if gone else stopped_then_refused(engine)
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert said in (run.error or "") and "combined cdc teardown" in (run.error or "")
        count = engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py()
        assert count == (500 if gone else 499)
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("bound", "statement", "said"),
    [
        (1000, "EXCHANGE PARTITION p0 WITH TABLE {t}", "altered (EXCHANGE PARTITION)"),
        (1, "CONVERT TABLE {t} TO PARTITION p1 VALUES LESS THAN MAXVALUE", "CONVERT"),
    ],
)
def test_another_tables_alter_that_takes_the_tables_rows_needs_a_new_snapshot(
    binlog: Binlog, bound: int, statement: str, said: str
) -> None:
    """A partitioned table's ALTER that swaps a partition with the captured table, or makes
    the captured table its partition, moves the table's rows without row events, naming the
    table after its clause: only the ALTER's first table was judged, the capture succeeded
    and the lake kept the 500 rows the table no longer had."""
    p = f"`parts_{binlog.table}`"
    binlog.sql(
        f"CREATE TABLE {p} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40)) "
        f"PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN ({bound}))",
        f"INSERT INTO {p} VALUES (0, 0, 'swapped in')",
    )
    binlog.first_state()
    binlog.sql(f"ALTER TABLE {p} {statement}")
    if not binlog.sql(f"SHOW TABLES LIKE '{binlog.table}'"):  # a new table of the same name
        binlog.sql("CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))")
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error  # (only a new snapshot mends it)
        assert said in (run.error or "") and RESNAPSHOT in (run.error or "")
        assert len(lake(engine)) == 500
    finally:
        engine.close()


def test_a_dropped_database_needs_a_new_snapshot(mariadb_database: str, tmp_path: Path) -> None:
    """``DROP DATABASE`` names none of its tables: the table created again under the same
    names, the capture read the new table's rows as changes and kept every dropped row in
    the lake, silently (a review found the lake at 501 rows, the source at 1)."""
    base, _, query = mariadb_database.partition("?")
    name = f"{base.rsplit('/', 1)[1]}_dropped"
    dsn = f"{base}_dropped" + (f"?{query}" if query else "")
    server = Binlog(mariadb_database, tmp_path)
    server.sql(f"CREATE DATABASE `{name}`")
    try:
        with binlog_table(dsn, tmp_path) as binlog:
            binlog.first_state()
            binlog.sql(
                f"DROP DATABASE `{name}`",
                f"CREATE DATABASE `{name}`",
                f"USE `{name}`",
                "CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))",
                "INSERT INTO {t} VALUES (501, 1, 'new')",
            )
            engine = Engine.open(binlog.project())
            try:
                (run,) = engine.capture()
                assert run.state == "needs_review", run.error  # (only a new snapshot mends it)
                assert "dropped" in (run.error or "") and RESNAPSHOT in (run.error or "")
                assert len(lake(engine)) == 500
            finally:
                engine.close()
    finally:
        server.sql(f"DROP DATABASE IF EXISTS `{name}`")


def test_an_alter_ignore_that_deletes_duplicates_needs_a_new_snapshot(binlog: Binlog) -> None:
    """``ALTER IGNORE TABLE ... ADD UNIQUE`` deletes the rows the key finds twice and logs
    no row event: the capture succeeded, the lake kept rows the source no longer had."""
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql(
            "UPDATE {t} SET qty = 1 WHERE id <= 3", "ALTER IGNORE TABLE {t} ADD UNIQUE (qty)"
        )
        assert binlog.sql("SELECT count(*) FROM {t}") == [(498,)]
        run = stopped_then_refused(engine)  # (only a new snapshot mends it)
        assert "duplicates deleted" in (run.error or "")
        assert "combined cdc teardown" in (run.error or "")
    finally:
        engine.close()


def test_a_prepared_xa_transaction_is_refused_not_landed(binlog: Binlog) -> None:
    """MariaDB logs a two-phase XA transaction's rows at XA PREPARE.

    Before this change an XA transaction prepared, then rolled back, landed
    in the lake: a row the source never held, an update it never made.
    """
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        # A one-phase XA commit is logged as a plain transaction: it lands.
        binlog.sql(
            "XA START 'h0'",
            "INSERT INTO {t} VALUES (9000, 1, 'one')",
            "XA END 'h0'",
            "XA COMMIT 'h0' ONE PHASE",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        before = lake(engine)
        assert before[-1] == (9000, 1, "one")
        binlog.sql(
            "XA START 'h1'",
            "INSERT INTO {t} VALUES (9001, 1, 'never')",
            "UPDATE {t} SET note = 'never' WHERE id = 1",
            "XA END 'h1'",
            "XA PREPARE 'h1'",
        )
        binlog.sql("XA ROLLBACK 'h1'")
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "prepared XA transaction" in (run.error or "")
        assert "snapshot or cursor strategy" in (run.error or "")
        assert lake(engine) == before == binlog.source()
    finally:
        engine.close()


def with_events(binlog: Binlog) -> Engine:
    """The project, with ``events``: the table in ``sync_mode: append`` beside ``items``."""
    path = binlog.project()
    path.write_text(
        path.read_text() + f"      events:\n        relation: {binlog.table}\n"
        "        key: [id]\n        strategy: cdc\n        sync_mode: append\n"
    )
    return Engine.open(path)


@pytest.mark.parametrize(
    ("statement", "said", "again"),
    [
        ("DROP TABLE {t}", "dropped", True),
        ("RENAME TABLE {t} TO `gone_{name}`", "renamed", True),
        ("DROP TABLE {t}", "dropped", False),
        ("RENAME TABLE {t} TO `gone_{name}`", "renamed", False),
    ],
)
def test_the_changes_before_a_dropped_table_are_committed_before_the_review(
    binlog: Binlog, statement: str, said: str, again: bool
) -> None:
    """The changes logged before a ``DROP TABLE`` (or a rename) of the captured table are
    committed: the capture that meets the statement stops before it, and the next one,
    starting at it, ends ``needs_review``. Before, the first capture failed with nothing
    committed, and the new snapshot that mends the stream holds the new table's rows only:
    an append dataset never got the events logged before the drop (a review's OLTP load
    lost 19,544 of them). A table left dropped (or renamed away) is read with the columns
    the checkpoint recorded up to the statement: before, such a capture failed before the
    log was read."""
    engine = with_events(binlog)
    try:
        engine.capture()
        binlog.sql(
            "UPDATE {t} SET qty = -1 WHERE id = 1",
            "DELETE FROM {t} WHERE id = 2",
            "INSERT INTO {t} VALUES (501, 501, 'late')",
        )
        before = binlog.source()
        binlog.sql(statement.replace("{name}", binlog.table))
        if again:  # created again under its name (else the table is gone when the capture starts)
            binlog.sql(
                "CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))",
                "INSERT INTO {t} VALUES (7, 7, 'new table')",
            )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == before  # the table as it was just before the statement
        events = "SELECT _combined_op AS op, id FROM db.events WHERE _combined_op <> 'snapshot'"
        kept = [(r["op"], r["id"]) for r in engine.sql(f"{events} ORDER BY id").to_pylist()]
        assert kept == [("update", 1), ("delete", 2), ("insert", 501)]
        (run,) = engine.capture()  # starts at the statement
        assert run.state == "needs_review", run.error
        assert said in (run.error or "") and RESNAPSHOT in (run.error or "")
        if not again:
            binlog.sql("CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))")
        resnapshot(engine, binlog)
        after = [(r["op"], r["id"]) for r in engine.sql(f"{events} ORDER BY id").to_pylist()]
        assert set(kept) <= set(after)  # the events stay after it
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("inserts", "again"),
    [(False, True), (False, False), (True, True), (True, False)],
    ids=["lone-again", "lone-gone", "inserts-again", "inserts-gone"],
)
def test_a_truncate_before_a_drop_is_committed_once_before_the_review(
    binlog: Binlog, inserts: bool, again: bool
) -> None:
    """A ``TRUNCATE`` logged before a ``DROP TABLE`` of the captured table empties the table
    (the merge dataset) and is an event (the append one), committed and billed once; the next
    capture, starting at the DROP, ends ``needs_review``. Before, a lone TRUNCATE was no change
    to stop after (the read failed at the DROP, nothing committed), and a table gone when the
    capture started made its marker without the key: every capture ended ``needs_review``
    with "hold no value of 'id'", the TRUNCATE never committed, whatever followed it."""
    engine = with_events(binlog)
    try:
        engine.capture()
        later = ["INSERT INTO {t} VALUES (7, 7, 'after')"] if inserts else []
        binlog.sql("TRUNCATE TABLE {t}", *later)
        before = binlog.source()
        binlog.sql("DROP TABLE {t}")
        if again:
            binlog.sql("CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == before
        ops = "SELECT _combined_op AS op, id FROM db.events WHERE _combined_op <> 'snapshot'"
        kept = [(r["op"], r["id"]) for r in engine.sql(ops).to_pylist()]
        assert sorted(kept, key=str) == sorted(
            [("truncate", None)] + [("insert", 7)] * inserts, key=str
        )
        billed = {u["dataset"]: (u["mar"], u["updates"], u["deletes"]) for u in engine.usage()}
        # the merge dataset: every row deleted (id 7's insert after, an update of its row)
        assert billed == {"items": (500, int(inserts), 500 - inserts), "events": (500, 0, 0)}
        (run,) = engine.capture()  # starts at the DROP
        assert run.state == "needs_review", run.error
        assert "dropped" in (run.error or "") and RESNAPSHOT in (run.error or "")
        after = {u["dataset"]: (u["mar"], u["updates"], u["deletes"]) for u in engine.usage()}
        assert after == billed  # nothing billed twice
        if not again:
            binlog.sql("CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))")
        resnapshot(engine, binlog)
        assert ("truncate", None) in [(r["op"], r["id"]) for r in engine.sql(ops).to_pylist()]
    finally:
        engine.close()
