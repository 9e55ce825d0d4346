"""A read aborted from another thread (an Attempt's deadline, a cancel) ends the statement it
is blocked in, on the server, instead of waiting for it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from tests.connectors.mariadb.conftest import Admin

from combined.connectors.abc import CursorSpec
from combined.connectors.mariadb import MariaDBExtraction, MariaDBSource


def _running(admin: Admin, text: str) -> int:
    """Statements other than the asking one whose text holds ``text``."""
    ((count,),) = admin.rows(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
        f"AND INFO LIKE '%{text}%' AND INFO NOT LIKE '%PROCESSLIST%'"
    )
    return int(count)


@pytest.mark.parametrize("strategy", ["snapshot", "cursor"])
def test_a_read_waiting_for_a_locked_table_is_aborted_at_once(
    admin: Admin,
    source: MariaDBSource,
    make_request: Any,
    mariadb_database: str,
    strategy: str,
) -> None:
    """Reproduction: a table another session holds ``LOCK TABLES ... WRITE`` on
    kept the read's statement waiting for the lock (a day, the server's
    ``lock_wait_timeout``), and an abort waited with it. The abort now ends
    the statement with ``KILL QUERY`` and returns within moments."""
    admin.sql("CREATE TABLE held (id INT PRIMARY KEY) ENGINE=InnoDB", "INSERT INTO held VALUES (1)")
    holder = Admin(mariadb_database)
    cursor = CursorSpec("id", trust="test") if strategy == "cursor" else None
    ext = source.read(make_request("held", strategy=strategy, cursor=cursor))
    assert isinstance(ext, MariaDBExtraction)
    ext.bulk = False  # (the bulk path's table lock would wait for the holder first)
    failures: list[BaseException] = []

    def read() -> None:
        try:
            list(ext)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            failures.append(exc)

    holder.sql("LOCK TABLES held WRITE")
    # Unlocked at the latest after 8 s: an abort that waits for the statement ends too.
    unlock = threading.Timer(8, holder.sql, ["UNLOCK TABLES"])
    unlock.start()
    try:
        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 10
        while not _running(admin, "held") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running(admin, "held"), "the read never waited for the lock"
        started = time.monotonic()
        ext.finish("abort")
        took = time.monotonic() - started
        reader.join(10)
        assert not reader.is_alive() and failures
        assert took < 5, f"the abort took {took:.1f} s"
        assert _running(admin, "held") == 0, "the read's statement still runs on the server"
    finally:
        unlock.cancel()
        unlock.join()
        holder.sql("UNLOCK TABLES")
        holder.conn.close()


def test_a_cancel_that_cannot_be_sent_is_logged_without_the_password(
    admin: Admin, mariadb_database: str, monkeypatch: Any, caplog: Any
) -> None:
    """The warning of a KILL QUERY that failed carries the driver's words, scrubbed: a
    driver or proxy that echoes the connection's password does not put it in the log."""
    import uuid

    import pymysql

    from combined.connectors.mariadb import _connect

    suffix = uuid.uuid4().hex[:8]
    user, password = f"k_{suffix}", f"pw-{suffix}-secret"
    server = _connect.Settings.from_config({"dsn": mariadb_database})
    database = server.database
    admin.sql(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT SELECT ON `{database}`.* TO '{user}'@'%'",
    )
    try:
        dsn = f"mysql://{user}@{server.host}:{server.port}/{database}"
        settings = _connect.Settings.from_config({"dsn": dsn, "password": password})
        session = _connect.Session(settings)

        def refused(settings: Any, connection_id: int) -> None:
            raise pymysql.err.OperationalError(2013, f"lost connection ({password}) {user}")

        monkeypatch.setattr(_connect, "kill_query", refused)
        with caplog.at_level("WARNING", logger=_connect._log.name):
            session.cancel()
        session.close()
        said = caplog.text
        assert "could not end the statement of mariadb connection" in said and user in said
        assert password not in said
    finally:
        admin.sql(f"DROP USER IF EXISTS '{user}'@'%'")
