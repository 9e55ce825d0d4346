"""Where a bounded CDC read ends: its own end marker, against a real slot.

A bounded run writes a non-transactional logical message (``combined.end``,
its token) when it starts and ends when the stream delivers it. Each test
creates its own table, publication and slot and drops them afterwards.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from tests.pg_cleanup import drop_database

from combined.connectors.postgres._cdc import CdcExtraction
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import text_to_lsn
from combined.connectors.postgres._publication import drop_publication, ensure_publication
from combined.connectors.postgres._replication import END_PREFIX, create_slot, drop_slot
from combined.protocol import OP_COLUMN, POSITION_COLUMN, RecordBatchMessage, StateMessage

pytestmark = pytest.mark.postgres


@dataclass
class Slot:
    """One test's table, publication and slot on one database."""

    dsn: str
    table: str
    pub: str
    slot: str
    start: int

    def read(self, start: int | str | None = None, **kw: Any) -> tuple[list[int], StateMessage]:
        """A bounded read from ``start``: the ids it yields, and its final state."""
        ex = CdcExtraction(
            Settings(self.dsn),
            slot=self.slot,
            publication=self.pub,
            datasets={"t": self.table},
            start_lsn=self.start if start is None else start,
            end_lsn="current",
            **kw,
        )
        try:
            out = list(ex)
        finally:
            ex.finish("success")
        ids = [
            r["id"]
            for m in out
            if isinstance(m, RecordBatchMessage)
            for r in m.batch.to_pylist()
            if r[OP_COLUMN] == "insert"
        ]
        states = [m for m in out if isinstance(m, StateMessage)]
        assert states and states[-1].final
        return ids, states[-1]


def _stand_up(dsn: str) -> Iterator[Slot]:
    sfx = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    table, pub, slot = f"cdc_end_{sfx}", f"cdc_end_pub_{sfx}", f"cdc_end_slot_{sfx}"
    pg = Settings(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        conn.execute(f"CREATE TABLE {table}_other (id serial PRIMARY KEY, v text)")
        try:
            ensure_publication(pg, pub, [table])
            with create_slot(pg, slot) as handle:
                start = handle.consistent_point
            yield Slot(dsn, table, pub, slot, start)
        finally:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            drop_slot(pg, slot)
            drop_publication(pg, pub)
            conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_other")


@pytest.fixture
def env(dsn: str) -> Iterator[Slot]:
    yield from _stand_up(dsn)


class Writer:
    """A session committing small transactions until stopped: ids, in commit order."""

    def __init__(self, dsn: str, table: str) -> None:
        self.ids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(dsn, table), daemon=True)
        self._thread.start()

    def _run(self, dsn: str, table: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            i = 0
            while not self._stop.is_set():
                i += 1
                conn.execute(f"INSERT INTO {table} (id, v) VALUES (%s, 'w')", (i,))
                self.ids.append(i)
                time.sleep(0.002)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(10)
        return self.ids


def _emit(dsn: str, prefix: str, content: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_logical_emit_message(false, %s, %s)::text", (prefix, content)
        ).fetchone()
    assert row is not None
    return text_to_lsn(row[0])


def test_a_read_ends_at_its_own_marker_and_skips_other_markers(env: Slot) -> None:
    with psycopg.connect(env.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {env.table} VALUES (1, 'a')")
        # Another run's marker and another tool's message, before this run's
        # (the stream delivers both): ending at either would lose row 2.
        stale = _emit(env.dsn, END_PREFIX, uuid.uuid4().hex)
        _emit(env.dsn, "someone.else", "x")
        conn.execute(f"INSERT INTO {env.table} VALUES (2, 'b')")
    ids, final = env.read()
    assert ids == [1, 2]
    # The final checkpoint is the run's own marker, past the stale one.
    assert text_to_lsn(final.state["lsn"]) > stale


def test_a_read_with_no_other_writer_ends_at_once(env: Slot) -> None:
    with psycopg.connect(env.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {env.table} VALUES (1, 'a')")
    began = time.monotonic()
    ids, first = env.read()
    assert ids == [1] and time.monotonic() - began < 2.0
    began = time.monotonic()
    ids, _ = env.read(first.state["lsn"])  # nothing new: ends at its marker too
    assert ids == [] and time.monotonic() - began < 2.0


def test_a_read_ends_at_once_while_another_session_writes_unrelated_wal(env: Slot) -> None:
    writer = Writer(env.dsn, f"{env.table}_other")
    try:
        with psycopg.connect(env.dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {env.table} VALUES (1, 'a')")
        time.sleep(0.3)
        took = []
        state: str | int = env.start
        for _ in range(3):
            began = time.monotonic()
            ids, final = env.read(state)
            took.append(time.monotonic() - began)
            state = final.state["lsn"]
    finally:
        writer.stop()
    assert max(took) < 2.0, took


def test_every_transaction_committed_before_the_marker_is_read_once(env: Slot) -> None:
    # Commits race the marker: each lands in exactly one of two reads, in order.
    writer = Writer(env.dsn, env.table)
    try:
        time.sleep(0.3)
        first, state = env.read()
        time.sleep(0.2)
    finally:
        written = writer.stop()
    second, _ = env.read(state.state["lsn"])
    assert first and second
    assert first + second == written
    assert max(first) < min(second)


def test_a_server_that_refuses_the_marker_ends_at_its_wal_position(
    pg_server_dsn: str,
) -> None:
    # EXECUTE revoked in a database of the test's own (function privileges are
    # per database), from a role without superuser: the run falls back.
    db, role = f"cdc_end_{uuid.uuid4().hex[:8]}", f"cdc_end_r_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    owner_dsn = psycopg.conninfo.make_conninfo(pg_server_dsn, dbname=db)
    role_dsn = psycopg.conninfo.make_conninfo(pg_server_dsn, dbname=db, user=role)
    try:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute(
                "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text), "
                "pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC"
            )
            for grant in ("GRANT ALL ON SCHEMA public TO {}", "GRANT CREATE ON DATABASE {} TO {}"):
                names = (
                    [sql.Identifier(role)]
                    if grant.count("{}") == 1
                    else [sql.Identifier(db), sql.Identifier(role)]
                )
                conn.execute(sql.SQL(grant).format(*names))
        with psycopg.connect(role_dsn, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT pg_logical_emit_message(false, 'x', 'y')")
        for s in _stand_up(role_dsn):
            with psycopg.connect(role_dsn, autocommit=True) as conn:
                conn.execute(f"INSERT INTO {s.table} VALUES (1, 'a')")
            ids, _ = s.read()
            assert ids == [1]
    finally:
        drop_database(pg_server_dsn, db)  # with any slot the test left in it
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_positions_of_a_read_lie_before_its_final_state(env: Slot) -> None:
    with psycopg.connect(env.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {env.table} VALUES (1, 'a')")
    ex = CdcExtraction(
        Settings(env.dsn),
        slot=env.slot,
        publication=env.pub,
        datasets={"t": env.table},
        start_lsn=env.start,
        end_lsn="current",
    )
    out = list(ex)
    ex.finish("success")
    final = [m for m in out if isinstance(m, StateMessage)][-1]
    positions = [
        text_to_lsn(p)
        for m in out
        if isinstance(m, RecordBatchMessage)
        for p in m.batch.column(POSITION_COLUMN).to_pylist()
    ]
    assert positions and max(positions) < text_to_lsn(final.state["lsn"])
