"""MariaDB binlog CDC through the engine: stitched snapshot, then the binlog, exactly once.

These need a server with the binary log on (``log_bin``, ``binlog_format=ROW``,
``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``); ``.ci/run``
configures the machine's MariaDB so, and under ``COMBINED_REQUIRE_SERVICES=1``
a server without it fails these tests instead of skipping them.
"""

from __future__ import annotations

import fcntl
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pymysql
import pytest

from combined import cdc
from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine
from combined.lake import LakeTable

PROJECT = """\
version: 1
lake: ./lake
sources:
  db:
    connector: {connector}
    config:
      dsn: {dsn}
    datasets:
      items:
        relation: {table}
        key: [id]
        strategy: cdc
"""


class Binlog:
    """A table in a database of a server that writes a row-based binlog."""

    def __init__(self, dsn: str, root: Path) -> None:
        self.dsn = dsn
        self.root = root
        self.table = f"items_{uuid.uuid4().hex[:8]}"
        self.lock: IO[str] | None = None

    @contextmanager
    def alone(self) -> Iterator[None]:
        """The server to this test alone while it changes what every test's reads of the
        binlog meet: the other tests of a binlog end first, and none starts meanwhile."""
        assert self.lock is not None
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_SH)

    def sql(self, *statements: str) -> list[tuple[Any, ...]]:
        kwargs = Settings.from_config({"dsn": self.dsn}).connect_kwargs()
        kwargs.pop("conv")
        kwargs.pop("cursorclass")
        out: list[tuple[Any, ...]] = []
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement.replace("{t}", f"`{self.table}`"))
                out = list(cur.fetchall())
        return out

    def project(self, connector: str = "mariadb") -> Path:
        path = self.root / "combined.yaml"
        path.write_text(PROJECT.format(connector=connector, dsn=self.dsn, table=self.table))
        return path

    def project_as(self, user: str, password: str, monkeypatch: pytest.MonkeyPatch) -> Path:
        """The project, reading as ``user`` (its password from the environment)."""
        path = self.project()
        host = self.dsn.split("@", 1)[1]
        path.write_text(
            path.read_text().replace(
                f"dsn: {self.dsn}",
                f"dsn: mysql://{user}@{host}\n"
                '      password: {secret: "env:COMBINED_TEST_BINLOG_PASSWORD"}',
            )
        )
        monkeypatch.setenv("COMBINED_TEST_BINLOG_PASSWORD", password)
        return path

    def source(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.sql("SELECT id, qty, note FROM {t} ORDER BY id")]

    def first_state(self) -> dict[str, Any]:
        """Capture once (the stitched snapshot); the checkpoint it committed."""
        engine = Engine.open(self.project())
        try:
            engine.capture()
        finally:
            engine.close()
        return self.checkpoint()

    def checkpoint(self) -> dict[str, Any]:
        meta = LakeTable(self.root / "lake" / "db" / "items", "combined:db/items").latest_commit()
        assert meta is not None
        return dict(meta["checkpoint"])


def lake(engine: Engine) -> list[tuple[Any, ...]]:
    rows = engine.sql("SELECT id, qty, note FROM db.items ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def resnapshot(engine: Engine, binlog: Binlog) -> None:
    """The way out a hint names: teardown, then setup's new snapshot lands the source."""
    cdc.teardown(engine, "db")
    _, run = cdc.setup(engine, "db")
    assert run.state == "succeeded", run.error
    assert lake(engine) == binlog.source()


#: Held shared by every test of a binlog, exclusively by one changing what all their reads
#: meet (a global variable, the binlog files): a capture of another test running meanwhile
#: on the other worker failed ("log_bin_compress is ON", a compressed event, a purged file).
_SERVER_LOCK = Path(tempfile.gettempdir()) / "combined-tests-mariadb-server.lock"


@pytest.fixture
def binlog(mariadb_database: str, tmp_path: Path) -> Iterator[Binlog]:
    from tests.conftest import REQUIRE

    b = Binlog(mariadb_database, tmp_path)
    ((log_bin,),) = b.sql("SELECT @@log_bin")
    if str(log_bin) != "1":
        message = "the MariaDB server has log_bin OFF (.ci/run turns it on)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    with open(_SERVER_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        b.lock = lock
        try:
            b.sql(
                "CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40)) ENGINE=InnoDB",
                "INSERT INTO {t} SELECT seq, seq, CONCAT('n', seq) FROM seq_1_to_500",
            )
            yield b
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def test_stitched_snapshot_then_binlog_lands_every_change_once(binlog: Binlog) -> None:
    """Inserts, updates, deletes and a primary-key change stream after the first snapshot.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
        first = binlog.checkpoint()
        assert first["stitched"] is True and ":" in first["binlog"]

        binlog.sql(
            "INSERT INTO {t} VALUES (501, 1, 'new')",
            "DELETE FROM {t} WHERE id BETWEEN 10 AND 14",
            "UPDATE {t} SET qty = 99 WHERE id <= 3",
            "UPDATE {t} SET id = 1000, note = 'moved' WHERE id = 20",  # a primary-key change
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["deletes"] == 6
        assert lake(engine) == binlog.source()
        row = engine.sql(
            "SELECT _combined_op AS op, _combined_source_position AS pos FROM db.items WHERE id = 2"
        ).to_pylist()[0]
        assert row["op"] == "update" and ":" in row["pos"]

        # a quiet capture (another table changes) still moves the checkpoint
        before = binlog.checkpoint()["binlog"]
        binlog.sql("CREATE TABLE other_{t} (id INT)".replace("{t}", binlog.table))
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert binlog.checkpoint()["binlog"] != before
        assert lake(engine) == binlog.source()
    finally:
        engine.close()


def test_truncate_empties_the_table_and_a_new_column_evolves(binlog: Binlog) -> None:
    """TRUNCATE lands as explicit deletes; ALTER TABLE ADD COLUMN between captures evolves.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    from combined.catalog import data as cat

    engine = Engine.open(binlog.project("mysql"))  # the same connector, as `mysql`
    try:
        engine.capture()
        binlog.sql(
            "UPDATE {t} SET qty = 0 WHERE id = 1",
            "TRUNCATE TABLE {t}",
            "INSERT INTO {t} VALUES (1, 5, 'again'), (900, 9, 'z')",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["deletes"] == 499
        assert lake(engine) == binlog.source()

        binlog.sql(
            "UPDATE {t} SET qty = -1 WHERE id = 1",
            "ALTER TABLE {t} ADD COLUMN extra INT",
            "UPDATE {t} SET extra = 42 WHERE id = 900",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, qty, extra FROM db.items ORDER BY id").to_pylist()
        assert rows == [
            {"id": 1, "qty": -1, "extra": None},
            {"id": 900, "qty": 9, "extra": 42},
        ]
        with engine.catalog.begin() as conn:
            drift = cat.activity(conn, kind="drift")
        assert [(d.body["class"], d.body["field"]) for d in drift] == [("new_field", "extra")]
    finally:
        engine.close()


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


def test_compressed_binlog_events_are_refused_never_skipped(binlog: Binlog) -> None:
    """``log_bin_compress=ON`` is a precondition ``check`` names; a compressed event fails a read.

    The binlog library maps MariaDB's compressed events to an event it does not
    parse, and a read listing the events it wants used to drop them unseen: a
    change logged while compression was on was silently lost.
    """
    from combined.errors import ConfigError

    binlog.sql("ALTER TABLE {t} MODIFY note VARCHAR(2000)")
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        ((old,),) = binlog.sql("SELECT @@GLOBAL.log_bin_compress")
        with binlog.alone():
            binlog.sql("SET GLOBAL log_bin_compress = ON")
            try:
                with pytest.raises(ConfigError) as err:
                    engine.check("db")
                # rows far past log_bin_compress_min_len: MariaDB 10.11 logs them compressed
                binlog.sql("INSERT INTO {t} SELECT seq, seq, REPEAT('c', 2000) FROM seq_501_to_503")
            finally:
                binlog.sql(f"SET GLOBAL log_bin_compress = {int(old)}")
        assert "log_bin_compress is ON" in str(err.value)
        assert "SET GLOBAL log_bin_compress = OFF" in (err.value.hint or "")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert "compressed event" in (run.error or "")
        assert "cdc teardown" in (run.error or "")
        assert engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py() == 500
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


def test_a_large_transaction_streams_in_bounded_batches(binlog: Binlog) -> None:
    """One 30,000-row transaction is yielded in batches of at most batch_rows, state last.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    from combined.connectors.abc import ReadRequest
    from combined.connectors.mariadb import MariaDBSource
    from combined.protocol import RecordBatchMessage, StateMessage

    state = binlog.first_state()
    binlog.sql(
        "START TRANSACTION",
        "INSERT INTO {t} SELECT seq, 1, 'big' FROM seq_1001_to_31000",
        "UPDATE {t} SET qty = -qty WHERE id <= 500",
        "COMMIT",
    )
    source = MariaDBSource({"dsn": binlog.dsn})
    request = ReadRequest("items", binlog.table, ("id",), "cdc", state=state, batch_rows=1000)
    messages = list(source.read(request))
    batches = [m.batch for m in messages if isinstance(m, RecordBatchMessage)]
    states = [m for m in messages if isinstance(m, StateMessage)]
    assert max(b.num_rows for b in batches) <= 1000
    assert sum(b.num_rows for b in batches) == 30_500
    # rows come before the commit that covers them: one state after all of them, then final
    assert isinstance(messages[-1], StateMessage) and messages[-1].final
    assert [s.final for s in states] == [False, True]
    assert messages.index(states[0]) == len(batches)
    assert states[0].state["binlog"] != state["binlog"]


def test_status_shows_the_retention_and_how_long_to_stay_down(binlog: Binlog) -> None:
    """`cdc status` reports the committed position, the server's retention and the margin.

    Before this change `cdc status` knew only replication slots (and `status` showed a binlog
    dataset's "slot" as all nulls).
    """
    ((old,),) = binlog.sql("SELECT @@binlog_expire_logs_seconds")
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql("SET GLOBAL binlog_expire_logs_seconds = 86400")
        (status,) = cdc.status(engine, "db")
        assert status["committed_position"] == binlog.checkpoint()["binlog"]
        assert status["retention_seconds"] == 86400
        assert status["committed_retained"] is True
        assert 0 < status["may_stay_down_seconds"] <= 86400
        (row,) = engine.status()
        assert row["slot"]["retention_seconds"] == 86400
        assert row["slot"]["committed_retained"] is True
        assert "binlog" in cdc.setup(engine, "db")[0][0]
    finally:
        binlog.sql(f"SET GLOBAL binlog_expire_logs_seconds = {int(old)}")
        engine.close()


def test_check_names_each_missing_grant_and_setting_with_its_fix(
    binlog: Binlog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`combined check` on a cdc source verifies the binlog preconditions and names the fix.

    Before this change `check` only connected, and the missing grants surfaced mid-capture.
    """
    from combined.errors import ConfigError

    user, password = f"cdc_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = binlog.dsn.rsplit("/", 1)[1]
    binlog.sql(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT SELECT ON `{database}`.* TO '{user}'@'%'",
    )
    engine = Engine.open(binlog.project_as(user, password, monkeypatch))
    try:
        with pytest.raises(ConfigError) as err:
            engine.check("db")
        assert "REPLICATION SLAVE and REPLICATION CLIENT" in str(err.value)
        assert f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'" in (
            err.value.hint or ""
        )
        assert password not in str(err.value) + (err.value.hint or "")
        # a capture: a person must grant them (it ended "failed", exit 1: retry later)
        (run,) = engine.capture()
        assert run.state == "needs_auth", run.error
        assert "GRANT REPLICATION SLAVE, REPLICATION CLIENT" in (run.error or "")
        binlog.sql(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'%'")
        engine.check("db")
        # those grants and SELECT are all a capture needs
        for change in ("DELETE FROM {t} WHERE id = 3", "UPDATE {t} SET qty = 0 WHERE id = 4"):
            binlog.sql(change)
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
        with binlog.alone():
            binlog.sql("SET GLOBAL binlog_row_image = 'NOBLOB'")
            try:
                with pytest.raises(ConfigError) as err:
                    engine.check("db")
            finally:
                binlog.sql("SET GLOBAL binlog_row_image = 'FULL'")
        assert "binlog_row_image is NOBLOB" in str(err.value)
        assert "SET GLOBAL binlog_row_image = 'FULL'" in (err.value.hint or "")
    finally:
        engine.close()
        binlog.sql(f"DROP USER '{user}'@'%'")


BOUNDARIES = ["after_staging", "during_commit", "after_commit", "after_projection"]


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_crash_at_any_boundary_loses_and_duplicates_nothing(
    binlog: Binlog, tools: Any, boundary: str
) -> None:
    """SIGKILL at each commit boundary of a binlog capture, then capture again: exactly once.

    The backlog adds a column with a default, whose values the capture reads
    from the source (it failed there before). Before this change the mariadb
    connector refused ``strategy: cdc`` outright.
    """
    binlog.project()
    ok = tools.cli(binlog.root, "capture")
    assert ok.returncode == 0, ok.stderr
    binlog.sql(
        "UPDATE {t} SET qty = qty + 1000 WHERE id <= 300",
        "DELETE FROM {t} WHERE id > 450",
        "ALTER TABLE {t} ADD COLUMN c VARCHAR(10) DEFAULT 'dflt'",
        "INSERT INTO {t} SELECT seq, seq, 'late', 'c' FROM seq_600_to_700",
        "UPDATE {t} SET id = 5000 WHERE id = 7",
    )
    killed = tools.cli(binlog.root, "capture", env={"COMBINED_FAULT": boundary})
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    binlog.sql("INSERT INTO {t} VALUES (9000, 1, 'after the crash', 'x')")
    again = tools.cli(binlog.root, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(binlog.root / "combined.yaml")
    try:
        assert lake(engine) == binlog.source()
        dup = engine.sql("SELECT count(*) - count(DISTINCT id) AS d FROM db.items").column("d")[0]
        assert dup.as_py() == 0
        filled = engine.sql("SELECT id, c FROM db.items ORDER BY id").to_pylist()
        assert [tuple(r.values()) for r in filled] == binlog.sql(
            "SELECT id, c FROM {t} ORDER BY id"
        )
    finally:
        engine.close()


def test_the_cdc_commands_drive_a_binlog_source(binlog: Binlog, tools: Any) -> None:
    """`combined check`, `cdc setup`, `status`, `follow` and `teardown` on a MariaDB source.

    Before this change `check` only connected, and `cdc setup` refused the mariadb connector
    ("cannot capture changes").
    """
    binlog.project()
    root = binlog.root
    ok = tools.cli(root, "check")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    setup = tools.cli(root, "cdc", "setup", "db")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "binary log settings and grants verified" in setup.stdout
    assert "succeeded" in setup.stdout

    binlog.sql("UPDATE {t} SET note = 'followed' WHERE id <= 10", "DELETE FROM {t} WHERE id = 11")
    follow = tools.cli(root, "cdc", "follow", "db", "--every", "0", "--iterations", "2")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    status = tools.cli(root, "cdc", "status", "db", env={"COLUMNS": "200"})
    assert status.returncode == 0, status.stdout + status.stderr
    position = binlog.checkpoint()["binlog"]
    assert position in status.stdout and "may stay down" in status.stdout

    engine = Engine.open(root / "combined.yaml")
    try:
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
    down = tools.cli(root, "cdc", "teardown", "db", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "checkpoint voided" in down.stdout
    again = tools.cli(root, "capture")  # a new stitched snapshot, reconciled with the lake
    assert again.returncode == 0, again.stdout + again.stderr
    assert binlog.checkpoint()["stitched"] is True


@pytest.mark.parametrize("anchor", ["pinned", "table_lock"])
def test_writers_during_the_first_snapshot_land_exactly_once(
    binlog: Binlog, anchor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transactions committed while the stitched snapshot is read are in it or in the stream.

    Each transaction committed before the anchored position is in the snapshot, every later
    one in the binlog from that position: the lake equals the source, nothing twice. The
    position is MariaDB's pinned one, or (``table_lock``, what a MySQL server gets) the one
    read under a brief read lock on the table while the snapshot opens. Before this change
    the mariadb connector refused ``strategy: cdc`` outright.
    """
    import threading

    from combined.connectors.mariadb import _binlog_stitch, _extract

    if anchor == "table_lock":  # the MySQL path, on this MariaDB server
        monkeypatch.setattr(_binlog_stitch, "pins_snapshots", lambda settings: False)

    binlog.sql("INSERT INTO {t} SELECT seq, seq, 'bulk' FROM seq_501_to_40000")
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        n = 100_000
        while not stop.is_set():
            n += 1
            written[0] += 1
            binlog.sql(
                f"INSERT INTO {{t}} VALUES ({n}, 0, 'w')",
                f"UPDATE {{t}} SET qty = qty + 1 WHERE id = {n % 40000 + 1}",
                f"DELETE FROM {{t}} WHERE id = {n - 5}",
            )

    # The read goes on past its first batch only once the writer has committed
    # ten more transactions: a loaded machine once let the whole read pass
    # while it committed five. (Until the first batch, the bulk read's twin
    # snapshot holds writers back: docs of connectors/mariadb/_arrow_read.py.)
    read = _extract.MariaDBExtraction._whole

    def after_writes(self: Any, work: Any) -> Any:
        messages = read(self, work)
        first = next(messages, None)
        floor, deadline = written[0] + 10, time.monotonic() + 60
        while written[0] < floor and time.monotonic() < deadline:
            time.sleep(0.01)
        if first is not None:
            yield first
        yield from messages

    monkeypatch.setattr(_extract.MariaDBExtraction, "_whole", after_writes)
    thread = threading.Thread(target=writer)
    thread.start()
    engine = Engine.open(binlog.project())
    try:
        try:
            before = written[0]
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert written[0] > before + 5  # the writer committed while the snapshot was read
        finally:
            stop.set()
            thread.join()
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("RENAME TABLE {t} TO old_{name}", "renamed"),
        ("DROP TABLE IF EXISTS nothing_here, {t}", "dropped"),
        ("ALTER TABLE {t} RENAME TO old_{name}", "altered (RENAME)"),
        ("ALTER TABLE {t} RENAME TO gone_{name}", "dropped or renamed since"),
    ],
)
def test_a_table_renamed_or_dropped_in_the_log_needs_a_new_snapshot(
    binlog: Binlog, statement: str, said: str
) -> None:
    """DDL that takes the rows away without row events fails the capture, naming the way out.

    The table is created again under its name, so the capture meets the statement in the log;
    a drop in a list, or a rename through ALTER TABLE, counts as well. A table still gone
    fails before the log is read. Only a new snapshot mends it: the Run ends ``needs_review``
    (it ended ``failed``, retried for ever by schedules and followers).
    """
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql("DELETE FROM {t} WHERE id = 1", statement.replace("{name}", binlog.table))
        if "gone_" not in statement:  # a new table of the same name
            binlog.sql("CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert said in (run.error or "") and "combined cdc teardown" in (run.error or "")
        assert engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py() == 500
    finally:
        engine.close()


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
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert "duplicates deleted" in (run.error or "")
        assert "combined cdc teardown" in (run.error or "")
    finally:
        engine.close()


def test_max_changes_ends_a_read_at_a_transaction_boundary(binlog: Binlog) -> None:
    """`follow --max-changes` reads end after the transaction that reaches the limit, whole.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    from combined.connectors.abc import ReadRequest
    from combined.connectors.mariadb import MariaDBSource
    from combined.protocol import RecordBatchMessage, StateMessage

    state = binlog.first_state()
    binlog.sql(
        "UPDATE {t} SET qty = -qty WHERE id <= 10",
        "UPDATE {t} SET qty = -qty WHERE id BETWEEN 11 AND 20",
    )
    source = MariaDBSource({"dsn": binlog.dsn})

    def read(state: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = ReadRequest(
            "items", binlog.table, ("id",), "cdc", state=state, options={"max_changes": 5}
        )
        messages = list(source.read(request))
        last = messages[-1]
        assert isinstance(last, StateMessage) and last.final
        rows = sum(m.batch.num_rows for m in messages if isinstance(m, RecordBatchMessage))
        return rows, dict(last.state)

    first, state = read(state)
    second, state = read(state)
    third, _ = read(state)
    assert (first, second, third) == (10, 10, 0)


def test_text_of_every_unicode_and_latin1_charset_lands_as_the_server_reads_it(
    binlog: Binlog,
) -> None:
    """UTF-16/32 and UCS-2 are big-endian in the log; latin1 is MariaDB's cp1252.

    Before this change a utf16 column read 'ü' from the log as '\\ufc00' (Python's
    utf16 took the machine's order), a utf32 or ucs2 one failed the capture, and so
    did a latin1 value holding one of cp1252's unassigned bytes (0x81).
    """
    columns = ("u16", "u32", "u2", "u16le", "l1")
    charsets = ("utf16", "utf32", "ucs2", "utf16le", "latin1")
    binlog.sql(
        "DROP TABLE {t}",
        "CREATE TABLE {t} (id INT PRIMARY KEY, "
        + ", ".join(
            f"{c} VARCHAR(20) CHARACTER SET {s}" for c, s in zip(columns, charsets, strict=True)
        )
        + ") ENGINE=InnoDB",
    )
    row = "({id}, 'ü€😀', 'ü€😀', 'ü€', 'ü€😀', CONCAT('é€', CONVERT(x'819d' USING latin1)))"
    binlog.sql("INSERT INTO {t} VALUES " + row.format(id=1))
    query = f"SELECT id, {', '.join(columns)} FROM {{}} ORDER BY id"
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        binlog.sql(
            "INSERT INTO {t} VALUES " + row.format(id=2),
            "UPDATE {t} SET id = 3, u16 = 'ÿ', l1 = 'Ÿ' WHERE id = 1",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql(query.format("db.items")).to_pylist()
        assert [tuple(r.values()) for r in rows] == binlog.sql(query.format("{t}"))
        assert rows[0]["u32"] == "ü€😀" and rows[0]["l1"] == "é€\x81\x9d"
    finally:
        engine.close()


def test_zero_dates_null_as_yaml_spells_it_reads_zero_dates_as_nulls(binlog: Binlog) -> None:
    """``zero_dates: null``, as the docs and the error's hint write it, is a YAML null.

    Before this change it failed every capture: "zero_dates must be 'error' or 'null', not None".
    """
    binlog.sql(
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} ADD COLUMN d DATE",
        "UPDATE {t} SET d = IF(id % 2 = 0, '0000-00-00', '2024-02-29')",
    )
    path = binlog.project()
    path.write_text(path.read_text().replace("      dsn:", "      zero_dates: null\n      dsn:"))
    query = "SELECT id, CAST(d AS {}) AS d FROM {} WHERE id <= 4 ORDER BY id"
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("SET SESSION sql_mode = ''", "UPDATE {t} SET d = '0000-00-00' WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        lake_rows = engine.sql(query.format("varchar", "db.items")).to_pylist()
        assert [tuple(r.values()) for r in lake_rows] == [
            (1, None),
            (2, None),
            (3, "2024-02-29"),
            (4, None),
        ]
    finally:
        engine.close()


def test_a_value_a_cdc_dataset_cannot_hold_names_columns_not_a_cast(binlog: Binlog) -> None:
    """The snapshot's and the binlog's refusals named a cast, which a cdc dataset refuses."""
    binlog.sql(
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} ADD COLUMN tm TIME, ADD COLUMN d DATE",
        "UPDATE {t} SET d = '0000-00-00' WHERE id = 3",
    )
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()  # the snapshot meets the zero date
        assert "set zero_dates: null" in (run.error or "")
        assert "leave 'd' out of the dataset's `columns:`" in (run.error or "")
        binlog.sql("UPDATE {t} SET d = NULL")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("UPDATE {t} SET tm = '30:00:00' WHERE id = 2")
        (run,) = engine.capture()  # the binlog meets the 30-hour TIME
        assert run.state == "needs_review"
        assert "leave 'tm' out of the dataset's `columns:`" in (run.error or "")
        assert "declare casts" not in (run.error or "")
    finally:
        engine.close()


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


def test_rows_a_nullable_unique_key_repeats_are_held_not_merged(binlog: Binlog) -> None:
    # A UNIQUE key over a nullable column lets many rows hold NULL. The
    # snapshot held such rows in quarantine; the stream merged them into one
    # lake row, the last written winning, and the run succeeded: a row lost.
    binlog.sql(
        "DROP TABLE {t}",
        "CREATE TABLE {t} (id INT NULL, qty INT, note TEXT, UNIQUE KEY (id))",
        "INSERT INTO {t} VALUES (1, 1, 'a'), (2, 2, 'b')",
    )
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql(
            "INSERT INTO {t} VALUES (NULL, 3, 'c'), (NULL, 4, 'd')",
            "UPDATE {t} SET qty = 20 WHERE id = 2",
        )
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "holds 1 duplicate key(s) of (id)" in (run.error or "")
        assert lake(engine) == [(1, 1, "a"), (2, 2, "b")]  # nothing committed
        (entry,) = engine.quarantine()
        assert entry["record_count"] == 2  # the two NULL rows, not the update of id 2
        binlog.sql("DELETE FROM {t} WHERE qty = 3")
        # Read again from the same checkpoint, the stream ends with one row of
        # NULL: the delete names the row it takes (the first), not the last
        # inserted, and applies before that insert. Nothing is lost.
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert (
            set(lake(engine)) == set(binlog.source()) == {(1, 1, "a"), (2, 20, "b"), (None, 4, "d")}
        )
        # A key change was the old key's delete and the new key's update,
        # which replaced the row NULL held: a row lost. It is an insert, held.
        binlog.sql("UPDATE {t} SET id = NULL WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "holds 1 duplicate key(s) of (id)" in (run.error or "")
        assert set(lake(engine)) == {(1, 1, "a"), (2, 20, "b"), (None, 4, "d")}
    finally:
        engine.close()


def test_statements_on_a_table_whose_name_holds_a_dot_are_followed(binlog: Binlog) -> None:
    """A TRUNCATE or an ALTER of `` `dot.items` `` was read as one of table ``items`` in
    database ``dot``: the lake kept the truncated rows, and the added column unfilled."""
    from combined.connectors.mariadb import MariaDBSource

    dotted = f"dot.{binlog.table}"
    binlog.sql(f"RENAME TABLE {{t}} TO `{dotted}`")
    binlog.table = dotted
    path = binlog.project()
    path.write_text(path.read_text().replace(f"relation: {dotted}", f"relation: '`{dotted}`'"))
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("INSERT INTO {t} VALUES (501, 501, 'n501')", "TRUNCATE TABLE {t}")
        binlog.sql("INSERT INTO {t} VALUES (7, 7, 'after')")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source() == [(7, 7, "after")]
        binlog.sql("ALTER TABLE {t} ADD COLUMN w INT NOT NULL DEFAULT 9")
        binlog.sql("INSERT INTO {t} VALUES (8, 8, 'later', 1)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, w FROM db.items ORDER BY id").to_pylist()
        assert [(r["id"], r["w"]) for r in rows] == [(7, 9), (8, 1)]
    finally:
        engine.close()
    source = MariaDBSource({"dsn": binlog.dsn})
    try:
        assert source.measure_key(f"`{dotted}`", ["id"]).rows == 2
    finally:
        source.close()
