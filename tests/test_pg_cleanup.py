"""A PostgreSQL test's teardown leaves nothing on the server, whatever the test did.

Once, a CDC test failed midway (the server's ``max_replication_slots`` was
exhausted by parallel runs) and its teardown dropped none of its three
slots: they retained 8 GB of WAL and every later CDC test failed with "all
replication slots are in use". The teardown now finds what to drop on the
server (the test database's slots, the prefix's slots and publications),
not in a list the test kept, and a slot still streamed is ended first.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from tests.conftest import CdcDatabase
from tests.pg_cleanup import drop_database

from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._publication import ensure_publication
from combined.connectors.postgres._replication import ReplicationStream, create_slot
from combined.connectors.postgres._stitch import slot_name

pytestmark = pytest.mark.postgres


def _left(server: str, name: str, prefix: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(server) as conn:
        return conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s "
            "UNION ALL SELECT datname FROM pg_database WHERE datname = %s "
            "UNION ALL SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s",
            (name, name, prefix + "%"),
        ).fetchall()


def test_a_failed_cdc_test_leaves_no_slot_publication_or_database(pg_server_dsn: str) -> None:
    """Slots the test never named, one still streamed: the teardown drops them all."""
    with psycopg.connect(pg_server_dsn) as conn:
        row = conn.execute("SHOW wal_level").fetchone()
    if not row or row[0] != "logical":
        pytest.skip("logical decoding needs wal_level=logical")
    name = f"combined_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db = CdcDatabase(make_conninfo(pg_server_dsn, dbname=name))
    holder = None
    try:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
        pg = Settings(db.dsn)
        # what two datasets' first captures stand up; the test never asked slot() for them
        for relation in ("public.a", "public.b"):
            slot = slot_name(db.prefix, relation)
            ensure_publication(pg, slot, [relation])
            create_slot(pg, slot).release_snapshot()
        create_slot(pg, f"other_{uuid.uuid4().hex[:8]}").release_snapshot()  # any name
        # a stream the failed test never closed: its walsender holds the slot
        holder = ReplicationStream(pg, slot, slot, 0)
        assert len(_left(pg_server_dsn, name, db.prefix)) == 6  # 3 slots, db, 2 by prefix
        db.drop()  # the cdc_db fixture's teardown
        assert _left(pg_server_dsn, name, db.prefix) == [(name,)]
        with psycopg.connect(db.dsn) as conn:
            assert conn.execute("SELECT pubname FROM pg_publication").fetchall() == []
    finally:
        drop_database(pg_server_dsn, name)  # the pg_database fixture's teardown
        if holder is not None:
            holder.close()
    assert _left(pg_server_dsn, name, db.prefix) == []
