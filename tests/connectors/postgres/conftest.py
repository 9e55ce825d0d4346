"""Fixtures for the PostgreSQL connector: a real server, one private schema per test."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from combined.connectors.abc import ReadRequest
from combined.connectors.postgres import PostgresSource
from combined.protocol import RecordBatchMessage, StateMessage

DSN_VAR = "COMBINED_TEST_PG_DSN"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The server DSN (CI sets COMBINED_TEST_PG_DSN); skip locally when unset."""
    dsn = os.environ.get(DSN_VAR)
    if not dsn:
        if os.environ.get("COMBINED_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{DSN_VAR} is not set but COMBINED_REQUIRE_SERVICES=1")
        pytest.skip(f"{DSN_VAR} is not set: no PostgreSQL server to test against")
    return dsn


@pytest.fixture
def dsn(pg_database: str) -> Iterator[str]:
    """A fresh database, once logical decoding is known to be available (slot tests).

    Its own database, not the server's shared one: whatever slot a failed
    test left in it is dropped with it (``pg_database``).
    """
    with psycopg.connect(pg_database) as conn:
        row = conn.execute("SHOW wal_level").fetchone()
    if not row or row[0] != "logical":
        reason = f"wal_level is {row[0] if row else '?'}, logical decoding needs 'logical'"
        if os.environ.get("COMBINED_REQUIRE_SERVICES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    yield pg_database


@pytest.fixture
def admin(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit psycopg connection for setting up and mutating test data."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def schema(admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A uniquely named schema, dropped (with everything in it) afterwards."""
    name = f"combined_pg_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def source(pg_dsn: str, schema: str) -> Iterator[PostgresSource]:
    """A source on the test server listing only the test schema."""
    src = PostgresSource({"dsn": pg_dsn, "schemas": [schema]})
    try:
        yield src
    finally:
        src.close()


@pytest.fixture
def make_request(schema: str) -> Callable[..., ReadRequest]:
    """Build a ReadRequest for ``table`` of the test schema."""

    def make(table: str, **kw: Any) -> ReadRequest:
        kw.setdefault("key", ("id",))
        kw.setdefault("strategy", "snapshot")
        kw.setdefault("relation", f"{schema}.{table}")
        return ReadRequest(dataset=table, **kw)

    return make


class PgTools:
    """Helpers handed to tests as the ``pgt`` fixture (tests are not a package)."""

    @staticmethod
    def batches(messages: Any) -> list[pa.RecordBatch]:
        """The record batches among ``messages``."""
        return [m.batch for m in messages if isinstance(m, RecordBatchMessage)]

    @staticmethod
    def states(messages: Any) -> list[StateMessage]:
        """The state messages among ``messages``."""
        return [m for m in messages if isinstance(m, StateMessage)]

    @staticmethod
    def table_of(messages: Any) -> pa.Table:
        """All record batches of ``messages`` as one table."""
        found = PgTools.batches(messages)
        return pa.Table.from_batches(found) if found else pa.table({})

    @staticmethod
    def backend_alive(admin: psycopg.Connection[Any], pid: int) -> bool:
        """Whether server process ``pid`` still exists."""
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        return bool(row and row[0])

    @staticmethod
    def wait_backend_gone(admin: psycopg.Connection[Any], pid: int, seconds: float = 15.0) -> bool:
        """Poll until backend ``pid`` has exited (a closed socket ends it asynchronously)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not PgTools.backend_alive(admin, pid):
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def wait_transaction_over(
        admin: psycopg.Connection[Any], pid: int, seconds: float = 5.0
    ) -> bool:
        """Poll until backend ``pid`` holds no transaction: idle (a kept session) or gone."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if PgTools.backend_state(admin, pid) in (None, "idle"):
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def backend_state(admin: psycopg.Connection[Any], pid: int) -> str | None:
        """``pg_stat_activity.state`` of ``pid`` (``idle in transaction``, ...), None if gone."""
        row = admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        return None if row is None else str(row[0])


@pytest.fixture
def pgt() -> type[PgTools]:
    """Message and server-process helpers."""
    return PgTools
