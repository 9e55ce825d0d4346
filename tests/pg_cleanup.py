"""What a PostgreSQL test leaves on the server, found there and dropped, pass or fail.

A logical replication slot belongs to one database and retains WAL until it
is dropped. ``DROP DATABASE`` drops the database's idle slots, but refuses
the database while a walsender streams from one of them, even ``WITH
(FORCE)``: a test that failed with a stream still open left both on the
server (measured: its teardown waited 10 s for the slot, failed, and the
slot, idle once the test process ended, retained WAL from then on). Three slots
leaked so once held 8 GB of WAL and every slot of a server with
``max_replication_slots = 10``. The teardown finds what to drop on the
server (by database, by name prefix), not in a list the test kept, and ends
the walsenders first.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def database_of(dsn: str) -> str:
    """The database a DSN (URL or ``key=value``) connects to."""
    return str(conninfo_to_dict(dsn)["dbname"])


def _like(prefix: str) -> str:
    """A LIKE pattern for the names ``<prefix>_...`` (``_`` is a wildcard otherwise)."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "\\_%"


def drop_slots(dsn: str, *, database: str | None = None, prefix: str | None = None) -> list[str]:
    """Drop every slot of ``database`` and every slot named ``<prefix>_...``; their names.

    ``dsn`` is any database of the server. The walsender that holds a slot is
    ended first (a slot is dropped only when no process holds it); a logical
    slot is dropped from its own database, as the server requires. Every slot
    is tried; the first failure is raised after the last.
    """
    from combined.connectors.postgres._connect import Settings
    from combined.connectors.postgres._replication import drop_slot

    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT slot_name, database FROM pg_replication_slots "
            "WHERE database = %s OR slot_name LIKE %s ORDER BY slot_name",
            (database, None if prefix is None else _like(prefix)),
        ).fetchall()
        if not found:
            return []
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = ANY(%s) AND active_pid IS NOT NULL",
            ([name for name, _ in found],),
        )
    failures: list[Exception] = []
    for name, db in found:
        at = dsn if db is None else make_conninfo(dsn, dbname=db)
        try:
            drop_slot(Settings(at), name)
        except Exception as exc:  # noqa: BLE001 - the others are still dropped
            failures.append(exc)
    if failures:
        raise failures[0]
    return [name for name, _ in found]


def drop_publications(dsn: str, prefix: str) -> list[str]:
    """Drop the publications named ``<prefix>_...`` of ``dsn``'s database; their names."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [
            str(r[0])
            for r in conn.execute(
                "SELECT pubname FROM pg_publication WHERE pubname LIKE %s", (_like(prefix),)
            )
        ]
        for name in names:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
    return names


def roll_back_prepared(server_dsn: str, database: str) -> list[str]:
    """Roll back every prepared transaction of ``database``; their ids.

    A prepared transaction outlives its session and the server's restarts:
    one a test left holds every first capture of the server (creating a slot
    waits for it) and its database (``DROP DATABASE`` refuses it) for ever.
    ``ROLLBACK PREPARED`` runs in the database that prepared it.
    """
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (database,)
        ).fetchall()
    if not found:
        return []
    with psycopg.connect(make_conninfo(server_dsn, dbname=database), autocommit=True) as conn:
        for (gid,) in found:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    return [str(gid) for (gid,) in found]


def drop_database(server_dsn: str, name: str) -> None:
    """Drop database ``name``, its prepared transactions and slots first: whatever the
    test left in it goes too."""
    try:
        roll_back_prepared(server_dsn, name)
        drop_slots(server_dsn, database=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
