"""The bulk path of a snapshot read (connectorx into Arrow): the row path's meaning, faster.

Each test reads through the bulk path (``ext.path == "bulk"``) and, where the
meaning is at stake, compares it with the row path's read of the same rows.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from combined.connectors.mariadb import MariaDBExtraction, MariaDBSource
from combined.connectors.mariadb import _arrow_read as bulk
from combined.connectors.mariadb._connect import Settings
from combined.connectors.mariadb._types import Layout, plan_column
from combined.errors import CombinedError, ProtocolViolation, SchemaMismatch

_TYPES = """CREATE TABLE t (
  id BIGINT PRIMARY KEY, d DECIMAL(12,2), big DECIMAL(38,10), huge DECIMAL(65,30),
  u BIGINT UNSIGNED, f FLOAT, g DOUBLE, bit1 BIT(1), bits BIT(12), y YEAR,
  s VARCHAR(40), tx TEXT, b BLOB, bin BINARY(4), j JSON, e ENUM('a','b'), st SET('x','y'),
  dt DATETIME(6), ts TIMESTAMP(6) NULL, da DATE, tm TIME(3)) ENGINE=InnoDB"""
_ROW = (
    "(1, 12.34, 1234567890123456789012345678.0123456789, "
    "12345678901234567890123456789012345.123456789012345678901234567891, "
    "18446744073709551615, 16777216, 0.1, b'1', b'101010101010', 1999, "
    "'héllo 🐬', REPEAT('z', 5000), x'00ff10', x'0102', '{\"k\": [1, 2]}', 'b', 'x,y', "
    "'2020-02-29 23:59:59.123456', '2020-06-01 12:00:00.5', '1970-01-01', '23:59:59.999')"
)
_NULLS = "(2" + ", NULL" * 20 + ")"


def _read(source: MariaDBSource, request: Any, *, use_bulk: bool = True) -> tuple[Any, list[Any]]:
    ext = source.read(request)
    assert isinstance(ext, MariaDBExtraction)
    ext.bulk = use_bulk
    msgs = list(ext)
    ext.finish("success")
    return ext, msgs


def test_bulk_reads_every_type_as_the_row_path_does(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(_TYPES, "SET time_zone = '+05:00'", f"INSERT INTO t VALUES {_ROW}, {_NULLS}")
    fast, msgs = _read(source, make_request("t"))
    assert fast.path == "bulk"
    slow, row_msgs = _read(source, make_request("t"), use_bulk=False)
    assert slow.path == "rows"
    table = mt.table_of(msgs).sort_by("id")
    assert table.equals(mt.table_of(row_msgs).sort_by("id"))
    first = table.to_pylist()[0]
    assert table.schema.field("d").type == pa.decimal128(12, 2)
    assert first["d"] == Decimal("12.34")
    assert first["big"] == Decimal("1234567890123456789012345678.0123456789")
    assert table.schema.field("huge").type == pa.decimal256(65, 30)
    assert first["huge"] == Decimal(
        "12345678901234567890123456789012345.123456789012345678901234567891"
    )
    assert first["u"] == 2**64 - 1 and first["f"] == 16777216.0
    assert (first["bit1"], first["bits"], first["y"]) == (True, 0b101010101010, 1999)
    assert first["s"] == "héllo 🐬" and first["tx"] == "z" * 5000
    assert (first["b"], first["bin"]) == (b"\x00\xff\x10", b"\x01\x02\x00\x00")
    assert first["j"].replace(" ", "") == '{"k":[1,2]}'
    assert (first["e"], first["st"]) == ("b", "x,y")
    # A TIMESTAMP written at +05:00 is read at the session's +00:00: UTC.
    assert str(first["ts"]) == "2020-06-01 07:00:00.500000+00:00"
    assert str(first["dt"]) == "2020-02-29 23:59:59.123456"
    assert all(v is None for k, v in table.to_pylist()[1].items() if k != "id")


def test_bulk_zero_dates_follow_the_reads_policy(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "SET SESSION sql_mode = ''",
        "CREATE TABLE z (id INT PRIMARY KEY, d DATE NOT NULL, dt DATETIME NOT NULL)",
        "INSERT INTO z VALUES (1, '0000-00-00', '0000-00-00 00:00:00'),"
        " (2, '2021-03-04', '2021-03-04 05:06:07')",
    )
    with pytest.raises(SchemaMismatch, match="zero date"):
        _read(source, make_request("z"))
    ext, msgs = _read(source, make_request("z", options={"zero_dates": "null"}))
    assert ext.path == "bulk"
    assert mt.table_of(msgs).sort_by("id").column("d").to_pylist()[0] is None
    ext, msgs = _read(
        source, make_request("z", options={"casts": {"d": "text"}, "zero_dates": "null"})
    )
    assert mt.table_of(msgs).sort_by("id").column("d").to_pylist() == ["0000-00-00", "2021-03-04"]


def test_bulk_batches_are_bounded_and_the_read_keeps_its_receipt(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE o (id BIGINT PRIMARY KEY, total DECIMAL(12,2)) ENGINE=InnoDB",
        "INSERT INTO o SELECT seq, seq * 1.25 FROM seq_1_to_1000",
    )
    ext, msgs = _read(
        source, make_request("o", batch_rows=128, options={"control_totals": "total"})
    )
    assert ext.path == "bulk"
    sizes = [b.num_rows for b in mt.batches(msgs)]
    assert sum(sizes) == 1000 and max(sizes) <= 128
    assert ext.receipt.rows == 1000 and ext.receipt.source_token
    assert ext.snapshot_pin is not None and ext.snapshot_pin["binlog"]
    assert ext.control_totals is not None and ext.control_totals.sum == "625625.00"
    # Near batch_bytes too: 2 KB rows under a 64 KB target.
    admin.sql("CREATE TABLE w (id INT PRIMARY KEY, v VARCHAR(2000)) ENGINE=InnoDB")
    admin.sql("INSERT INTO w SELECT seq, REPEAT('w', 2000) FROM seq_1_to_300", "ANALYZE TABLE w")
    ext, msgs = _read(source, make_request("w", options={"batch_bytes": 65536}))
    assert max(b.num_rows for b in mt.batches(msgs)) <= 64


def test_bulk_snapshot_is_the_controlling_transactions(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    """Rows committed after the read began are in neither the rows nor the control totals."""
    admin.sql(
        "CREATE TABLE o (id BIGINT PRIMARY KEY, n INT) ENGINE=InnoDB",
        "INSERT INTO o SELECT seq, 0 FROM seq_1_to_3000",
    )
    ext = source.read(make_request("o", batch_rows=100, options={"control_totals": True}))
    assert isinstance(ext, MariaDBExtraction)
    it = iter(ext)
    first = next(it)
    admin.sql(
        "INSERT INTO o VALUES (9001, 1)", "DELETE FROM o WHERE id > 2000", "UPDATE o SET n = 9"
    )
    table = mt.table_of([first, *it])
    assert ext.path == "bulk" and table.num_rows == 3000
    assert set(table.column("n").to_pylist()) == {0}
    assert ext.control_totals is not None and ext.control_totals.rows == 3000
    ext.finish("success")


@pytest.fixture
def account(admin: Any, mariadb_database: str) -> Iterator[tuple[str, str]]:
    """A user of its own with a password full of URL syntax; dropped afterwards."""
    user = f"cbulk_{secrets.token_hex(4)}"
    password = f"p@ss/w:rd?#%{secrets.token_hex(4)}"
    admin.sql(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"CREATE USER '{user}'@'localhost' IDENTIFIED BY '{password}'",
    )
    try:
        yield user, password
    finally:
        admin.sql(f"DROP USER IF EXISTS '{user}'@'%'", f"DROP USER IF EXISTS '{user}'@'localhost'")


def _grant(admin: Any, user: str, what: str) -> None:
    (db,) = admin.rows("SELECT DATABASE()")[0]
    for host in ("%", "localhost"):
        admin.sql(f"GRANT {what} ON `{db}`.* TO '{user}'@'{host}'")


def test_an_account_without_lock_tables_keeps_the_row_path(
    admin: Any, mariadb_database: str, account: tuple[str, str], make_request: Any, mt: Any
) -> None:
    user, password = account
    admin.sql("CREATE TABLE o (id INT PRIMARY KEY) ENGINE=InnoDB", "INSERT INTO o VALUES (1), (2)")
    dsn = mariadb_database.replace("//root@", f"//{user}@")
    _grant(admin, user, "SELECT")
    src = MariaDBSource({"dsn": dsn, "password": password})
    try:
        ext, msgs = _read(src, make_request("o"))
        assert ext.path == "rows" and mt.table_of(msgs).num_rows == 2
        _grant(admin, user, "LOCK TABLES")
        ext, msgs = _read(src, make_request("o"))
        assert ext.path == "bulk" and mt.table_of(msgs).num_rows == 2
    finally:
        src.close()


def test_a_view_is_read_by_rows_saying_why(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    """connectorx holds the GIL while a statement runs: a view's (anything, a
    sleep) could not be ended by a deadline or a cancel, so the row path reads it."""
    admin.sql(
        "CREATE TABLE o (id INT PRIMARY KEY) ENGINE=InnoDB",
        "INSERT INTO o VALUES (1), (2)",
        "CREATE VIEW ov AS SELECT id FROM o",
    )
    ext, msgs = _read(source, make_request("o"))
    assert ext.path == "bulk"
    ext, msgs = _read(source, make_request("ov"))
    assert ext.path == "rows" and mt.table_of(msgs).num_rows == 2
    assert ext.bulk_failure is not None and "a view is read by rows" in ext.bulk_failure


def test_bulk_errors_never_show_the_password(
    admin: Any, mariadb_database: str, account: tuple[str, str]
) -> None:
    user, password = account
    _grant(admin, user, "SELECT")
    admin.sql("CREATE TABLE o (id INT PRIMARY KEY)")
    dsn = mariadb_database.replace("//root@", f"//{user}@")
    settings = Settings.from_config({"dsn": dsn, "password": password})
    layout = Layout.of([plan_column_of("id")])
    twin = bulk.SnapshotTwin(settings, "o")
    # The server echoes the unknown column's name: the password, here.
    query = f"SELECT `{password}` AS id FROM o"
    with pytest.raises(CombinedError) as caught:
        list(bulk.stream(settings, query, layout, "o", 10, twin))
    text = f"{caught.value} {caught.value.context}"
    assert password not in text and "***" in text
    wrong = Settings.from_config({"dsn": dsn, "password": password + "x"})
    with pytest.raises(CombinedError) as caught:
        list(bulk.stream(wrong, "SELECT 1 AS id", layout, "o", 10, twin))
    assert password not in f"{caught.value} {caught.value.context}"
    assert caught.value.__cause__ is None and caught.value.__context__ is None


def plan_column_of(name: str) -> Any:
    from combined.connectors.mariadb._types import SourceColumn

    return plan_column(SourceColumn(name, "int", "int(11)", False, 10, 0))


def _bulk_read_under_way(
    admin: Any, source: MariaDBSource, make_request: Any
) -> tuple[MariaDBExtraction, Iterator[Any]]:
    """A bulk read of a 400,000-row table ``big``, its first batch taken."""
    admin.sql(
        "CREATE TABLE big (id BIGINT PRIMARY KEY, pad VARCHAR(200)) ENGINE=InnoDB",
        "INSERT INTO big SELECT seq, REPEAT('p', 200) FROM seq_1_to_400000",
    )
    ext = source.read(make_request("big", batch_rows=1000))
    assert isinstance(ext, MariaDBExtraction)
    it = iter(ext)
    next(it)
    assert ext.path == "bulk"
    return ext, it


def _bulk_sessions(admin: Any) -> list[int]:
    """The ids of the server's sessions running the bulk read of ``big``."""
    rows = admin.rows(
        "SELECT ID FROM information_schema.PROCESSLIST "
        "WHERE INFO LIKE 'SELECT `id` AS `id`, `pad` AS `pad`%' AND ID <> CONNECTION_ID()"
    )
    return [int(r[0]) for r in rows]


def test_an_aborted_bulk_read_stops_at_its_next_batch_and_ends_its_connection(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    ext, it = _bulk_read_under_way(admin, source, make_request)
    assert _bulk_sessions(admin)  # the bulk read is still under way
    assert ext.finish("abort").receipt is not None
    with pytest.raises(ProtocolViolation):
        next(it)
    for _ in range(100):
        if not _bulk_sessions(admin):
            break
        time.sleep(0.05)
    assert not _bulk_sessions(admin)


def test_a_bulk_read_whose_connection_is_killed_fails_retryably_and_never_panics(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    """connectorx panics (pyo3's PanicException, a BaseException) on a lost connection.

    It escaped the capture as a crash; it is the source's failure, to retry.
    """
    ext, it = _bulk_read_under_way(admin, source, make_request)
    (session,) = _bulk_sessions(admin)
    admin.sql(f"KILL CONNECTION {session}")
    with pytest.raises(CombinedError) as caught:
        for _ in it:
            pass
    assert caught.value.transient, caught.value
    assert "connection" in str(caught.value)
    ext.finish("abort")


def test_bulk_rows_and_control_totals_share_one_snapshot_under_steady_writes(
    admin: Any, mariadb_database: str, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    """A writer commits every few milliseconds while the read opens its two snapshots.

    Without the table lock the bulk connection's snapshot opens later than
    the controlling one's and holds rows the control totals do not count.
    """
    import threading

    from tests.connectors.mariadb.conftest import admin_connection

    admin.sql(
        "CREATE TABLE o (id BIGINT PRIMARY KEY, n INT) ENGINE=InnoDB",
        "INSERT INTO o SELECT seq, 0 FROM seq_1_to_2000",
    )
    stop = threading.Event()

    def write() -> None:
        conn = admin_connection(mariadb_database)
        i = 10_000
        try:
            with conn.cursor() as cur:
                while not stop.is_set():
                    i += 1
                    cur.execute(f"INSERT INTO o VALUES ({i}, 1)")
        finally:
            conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(3):
            time.sleep(0.2)
            ext, msgs = _read(source, make_request("o", options={"control_totals": True}))
            assert ext.path == "bulk" and ext.control_totals is not None
            assert mt.table_of(msgs).num_rows == ext.control_totals.rows
    finally:
        stop.set()
        writer.join()
    (count,) = admin.rows("SELECT COUNT(*) FROM o")[0]
    assert count > 2000  # the writer did write between the reads


def test_a_bulk_read_that_cannot_connect_is_read_by_rows_in_the_same_snapshot(
    admin: Any, mariadb_database: str, account: tuple[str, str], make_request: Any, mt: Any
) -> None:
    """Two connections allowed: the read's and the lock's; connectorx's third is refused."""
    user, password = account
    admin.sql("CREATE TABLE o (id INT PRIMARY KEY) ENGINE=InnoDB", "INSERT INTO o VALUES (1), (2)")
    _grant(admin, user, "SELECT, LOCK TABLES")
    for host in ("%", "localhost"):
        admin.sql(f"ALTER USER '{user}'@'{host}' WITH MAX_USER_CONNECTIONS 2")
    dsn = mariadb_database.replace("//root@", f"//{user}@")
    src = MariaDBSource({"dsn": dsn, "password": password})
    try:
        ext, msgs = _read(src, make_request("o", options={"control_totals": True}))
    finally:
        src.close()
    assert ext.path == "rows" and ext.bulk_failure is not None
    # Refused, or (connectorx retries) let in once the lock's session timed out and
    # closed: then the bulk snapshot is not known equal. The row path reads either way.
    assert "connections" in ext.bulk_failure or "not known equal" in ext.bulk_failure
    assert password not in ext.bulk_failure
    assert mt.table_of(msgs).num_rows == 2
    assert ext.control_totals is not None and ext.control_totals.rows == 2


def _waiting(admin: Any, statement: str) -> bool:
    """Whether another session waits on a lock while running ``statement``."""
    return bool(
        admin.rows(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = "
            f"'{statement}' AND STATE LIKE 'Waiting for%lock%'"
        )[0][0]
    )


@pytest.mark.timeout(60)
def test_an_open_writer_of_the_table_leaves_the_read_to_the_row_path_in_time(
    admin: Any, mariadb_database: str, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    """The table lock waits ``LOCK_WAIT_SECONDS`` for a writer, not the server's day or year."""
    from tests.connectors.mariadb.conftest import admin_connection

    from combined.connectors.mariadb._binlog_anchor import LOCK_WAIT_SECONDS

    admin.sql("CREATE TABLE o (id INT PRIMARY KEY) ENGINE=InnoDB", "INSERT INTO o VALUES (1), (2)")
    writer = admin_connection(mariadb_database)
    try:
        with writer.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute("INSERT INTO o VALUES (3)")  # open: holds the table's write lock
        began = time.monotonic()
        ext, msgs = _read(source, make_request("o", options={"control_totals": True}))
        took = time.monotonic() - began
        assert ext.path == "rows" and ext.bulk_failure is not None
        assert f"within {LOCK_WAIT_SECONDS} s" in ext.bulk_failure
        assert LOCK_WAIT_SECONDS - 1 < took < LOCK_WAIT_SECONDS + 20
        assert mt.table_of(msgs).column("id").to_pylist() == [1, 2]
        assert ext.control_totals is not None and ext.control_totals.rows == 2
        with writer.cursor() as cur:
            cur.execute("COMMIT")
    finally:
        writer.close()
    # No read lock is left behind: a writer locks the table at once.
    admin.sql("SET SESSION lock_wait_timeout = 2", "LOCK TABLES o WRITE", "UNLOCK TABLES")


@pytest.mark.timeout(60, method="thread")  # connectorx blocks in Rust: no signal gets in
def test_a_writer_queued_behind_the_twin_lock_drops_the_bulk_read(
    admin: Any, mariadb_database: str
) -> None:
    """A ``LOCK TABLES t WRITE`` queued behind the twin's read lock blocks connectorx.

    The server closes the lock's session at the deadline (connectorx may hold
    the GIL: no Python thread would run); the writer then writes, so the bulk
    snapshot, opened later, is not the controlling one's: the bulk read is
    dropped (its caller reads by rows), and nothing stays locked. The writer
    is a process of its own: a thread of this one would wait for the GIL.
    """
    import subprocess
    import sys

    admin.sql("CREATE TABLE o (id INT PRIMARY KEY) ENGINE=InnoDB", "INSERT INTO o VALUES (1), (2)")
    settings = Settings.from_config({"dsn": mariadb_database})
    twin = bulk.SnapshotTwin(settings, "o")
    assert twin.hold()
    script = (
        "import sys\n"
        "from tests.connectors.mariadb.conftest import admin_connection\n"
        "conn = admin_connection(sys.argv[1])\n"
        "cur = conn.cursor()\n"
        "cur.execute('SET SESSION lock_wait_timeout = 30')\n"  # the old code: fails, no hang
        "cur.execute('LOCK TABLES o WRITE')\n"
        "cur.execute('INSERT INTO o VALUES (3)')\n"
        "cur.execute('UNLOCK TABLES')\n"
        "conn.close()\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", script, mariadb_database])
    try:
        for _ in range(500):
            if _waiting(admin, "LOCK TABLES o WRITE"):
                break
            time.sleep(0.02)
        assert _waiting(admin, "LOCK TABLES o WRITE")
        began = time.monotonic()
        try:
            started = bulk.start(settings, "SELECT CAST(id AS CHAR) AS id FROM o", 10, twin)
        except CombinedError as exc:  # the twin let go before the bulk snapshot was seen
            assert "not known equal" in exc.message
        else:  # seen open under the lock: the writer's row is not in it
            assert started.first is not None
            assert sorted(started.first.column(0).to_pylist()) == ["1", "2"]
            started.reader.close()
        assert time.monotonic() - began < 25
    finally:
        twin.release()
        assert writer.wait(40) == 0
    assert admin.rows("SELECT COUNT(*) FROM o")[0][0] == 3


def test_a_bulk_batch_of_mostly_null_columns_is_bounded_by_what_it_weighs_in_arrow(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # The server stores a NULL in no bytes: its average row length (~50
    # bytes here) made 16 MiB batches of 65,536 rows weigh 127 MB in Arrow.
    columns = ", ".join(
        f"c{i} {('BIGINT', 'DECIMAL(12,2)', 'DATETIME(6)')[i % 3]}" for i in range(90)
    )
    admin.sql(
        f"CREATE TABLE sparse (id BIGINT PRIMARY KEY, {columns}) ENGINE=InnoDB",
        "INSERT INTO sparse (id, c0) SELECT seq, seq FROM seq_1_to_20000",
        "ANALYZE TABLE sparse",
    )
    budget = 1 << 20
    ext, msgs = _read(source, make_request("sparse", options={"batch_bytes": budget}))
    assert ext.path == "bulk"
    sizes = [b.nbytes for b in mt.batches(msgs)]
    assert sum(b.num_rows for b in mt.batches(msgs)) == 20000
    assert max(sizes) <= budget * 1.25, sizes


def test_a_row_longer_than_the_packet_limit_is_read_by_rows_after_the_bulk_read(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # connectorx refuses a row packet over max_allowed_packet wherever it
    # comes: a long row after the first batch failed the whole read.
    half = admin.half_packet()
    admin.sql(
        "CREATE TABLE longrow (id INT PRIMARY KEY, b LONGBLOB, c LONGTEXT) ENGINE=InnoDB",
        "INSERT INTO longrow SELECT seq, REPEAT('a', 1000), 'é' FROM seq_1_to_3000",
        f"INSERT INTO longrow VALUES (5000, REPEAT('b', {half}), REPEAT('c', {half}))",
        "INSERT INTO longrow VALUES (5001, 'b', NULL)",
        "ANALYZE TABLE longrow",
    )
    ext, msgs = _read(source, make_request("longrow", options={"batch_bytes": 1 << 20}))
    assert ext.path == "bulk" and ext.long_rows == 1, (ext.path, ext.bulk_failure)
    table = mt.table_of(msgs).sort_by("id")
    assert table.column("id").to_pylist() == [*range(1, 3001), 5000, 5001]
    long = table.slice(3000, 1).to_pylist()[0]
    assert (len(long["b"]), len(long["c"])) == (half, half)
    assert table.column("c")[3001].as_py() is None and table.column("c")[0].as_py() == "é"
    assert ext.authority.receipt.rows == 3002


def test_bulk_batches_are_sized_by_the_rows_when_the_tables_statistics_are_stale(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # Before ANALYZE TABLE InnoDB counts no off-page BLOB page: 50 rows of
    # 4 MB read as 178 KB each, one 200 MB batch. Here the statistics are
    # kept from before the values grew.
    admin.sql(
        "CREATE TABLE stale (id INT PRIMARY KEY, b LONGBLOB) ENGINE=InnoDB "
        "STATS_PERSISTENT=1 STATS_AUTO_RECALC=0",
        "INSERT INTO stale SELECT seq, 'x' FROM seq_1_to_200",
        "ANALYZE TABLE stale",
        "UPDATE stale SET b = REPEAT(CHAR(64 + id % 26), 32768)",
    )
    ((avg,),) = admin.rows(
        "SELECT AVG_ROW_LENGTH FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'stale'"
    )
    assert int(avg) < 1000  # (the statistic says so little)
    budget = 1 << 20
    ext, msgs = _read(source, make_request("stale", options={"batch_bytes": budget}))
    assert ext.path == "bulk"
    sizes = [b.nbytes for b in mt.batches(msgs)]
    assert max(sizes) <= budget * 1.25, sizes
    table = mt.table_of(msgs).sort_by("id")
    assert [len(v) for v in table.column("b").to_pylist()] == [32768] * 200


def test_rows_of_megabytes_are_read_by_rows_without_starting_the_bulk_read(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # connectorx gains nothing on rows of a sixteenth of a batch and reads
    # ahead of its consumer without a bound: a table of 1-31 MB rows peaked
    # ~70-95 MB higher through it. The rows' weight is known before it starts.
    admin.sql(
        "CREATE TABLE heavy (id INT PRIMARY KEY, b LONGBLOB) ENGINE=InnoDB",
        "INSERT INTO heavy SELECT seq, REPEAT(CHAR(64 + seq % 26), 65536) FROM seq_1_to_40",
        "ANALYZE TABLE heavy",
    )
    ext, msgs = _read(source, make_request("heavy", options={"batch_bytes": 1 << 20}))
    assert ext.path == "rows" and "megabytes" in (ext.bulk_failure or ""), ext.bulk_failure
    table = mt.table_of(msgs).sort_by("id")
    assert [len(v) for v in table.column("b").to_pylist()] == [65536] * 40


def test_long_text_of_other_character_sets_is_weighed_as_sent(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # Text reaches connectorx in utf8mb4: a latin1 'é' of one byte is sent
    # as two, so a value of 8.4 MB in latin1 makes a row of 16.8 MB.
    half = admin.half_packet()
    admin.sql(
        "CREATE TABLE cs (id INT PRIMARY KEY, l LONGTEXT CHARACTER SET latin1, "
        "u LONGTEXT CHARACTER SET utf32) ENGINE=InnoDB",
        "INSERT INTO cs SELECT seq, 'é', 'ü🐬' FROM seq_1_to_3000",
        f"INSERT INTO cs VALUES (5000, REPEAT(_latin1 x'e9', {half}), 'x')",
        "ANALYZE TABLE cs",
    )
    ext, msgs = _read(source, make_request("cs", options={"batch_bytes": 1 << 20}))
    assert ext.path == "bulk" and ext.long_rows == 1, (ext.path, ext.bulk_failure)
    table = mt.table_of(msgs).sort_by("id")
    assert table.num_rows == 3001
    assert table.column("u")[0].as_py() == "ü🐬" and table.column("l")[0].as_py() == "é"
    assert table.column("l")[3000].as_py() == "é" * half
