"""Fixtures for the MariaDB connector: a real server, one database per session, tables per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pymysql
import pytest

from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb import MariaDBSource
from combined.connectors.mariadb._connect import Settings
from combined.protocol import RecordBatchMessage, StateMessage


def admin_connection(dsn: str) -> Any:
    """An autocommit PyMySQL connection with the driver's usual conversions."""
    kwargs = Settings.from_config({"dsn": dsn}).connect_kwargs()
    for key in ("conv", "cursorclass", "read_timeout", "write_timeout"):
        kwargs.pop(key)
    return pymysql.connect(**kwargs)


class Admin:
    """Runs setup and mutation SQL against the test database."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = admin_connection(dsn)

    def sql(self, *statements: str) -> None:
        """Run each statement."""
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        """The rows of ``query``."""
        with self.conn.cursor() as cur:
            cur.execute(query)
            return list(cur.fetchall())

    def half_packet(self) -> int:
        """Bytes of a value of which two make a row over ``max_allowed_packet`` (each under it)."""
        ((packet,),) = self.rows("SELECT @@global.max_allowed_packet")
        return int(packet) // 2 + 4096

    def drop_all(self) -> None:
        """Drop every table and view the test left behind."""
        for name, kind in self.rows(
            "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE()"
        ):
            self.sql(f"DROP {'VIEW' if kind == 'VIEW' else 'TABLE'} IF EXISTS `{name}`")


@pytest.fixture
def admin(mariadb_database: str) -> Iterator[Admin]:
    """Setup SQL on the session's database; the test's tables are dropped afterwards."""
    a = Admin(mariadb_database)
    try:
        yield a
    finally:
        a.drop_all()
        a.conn.close()


@pytest.fixture
def binlog_on(admin: Admin) -> None:
    """The server writes a binary log: else the test fails (services required) or is skipped."""
    from tests.conftest import REQUIRE

    if str(admin.rows("SELECT @@log_bin")[0][0]) != "1":
        if REQUIRE:
            pytest.fail("the MariaDB server has log_bin OFF (.ci/run turns it on)")
        pytest.skip("the MariaDB server has log_bin OFF (.ci/run turns it on)")


@pytest.fixture
def source(mariadb_database: str) -> Iterator[MariaDBSource]:
    """A source on the session's test database."""
    src = MariaDBSource({"dsn": mariadb_database})
    try:
        yield src
    finally:
        src.close()


@pytest.fixture
def make_request() -> Callable[..., ReadRequest]:
    """Build a ReadRequest for ``table`` of the test database."""

    def make(table: str, **kw: Any) -> ReadRequest:
        kw.setdefault("key", ("id",))
        kw.setdefault("strategy", "snapshot")
        kw.setdefault("relation", table)
        return ReadRequest(dataset=table, **kw)

    return make


def batches(messages: Any) -> list[pa.RecordBatch]:
    """The record batches among ``messages``."""
    return [m.batch for m in messages if isinstance(m, RecordBatchMessage)]


def states(messages: Any) -> list[StateMessage]:
    """The state messages among ``messages``."""
    return [m for m in messages if isinstance(m, StateMessage)]


def table_of(messages: Any) -> pa.Table:
    """All record batches of ``messages`` as one table."""
    return pa.Table.from_batches(batches(messages))


class Tools:
    """Message helpers handed to tests as the ``mt`` fixture (tests are not a package)."""

    batches = staticmethod(batches)
    states = staticmethod(states)
    table_of = staticmethod(table_of)


@pytest.fixture
def mt() -> type[Tools]:
    """Message helpers."""
    return Tools
