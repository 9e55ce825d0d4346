"""Whose a replication slot is: slot names are the server's, a logical slot one database's.

Two databases of one server whose tables share a schema and a name, captured
under one ``slot_prefix`` (two projects, or two sources of one project),
compute one slot name. The slot then belongs to whichever database made it
first: the other must never take it for its own leftover and drop it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from combined.errors import ConfigError

__all__ = ["refuse_foreign_slot"]


def refuse_foreign_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """Raise :class:`ConfigError` when slot ``slot`` exists, made in another database."""
    row = conn.execute(
        "SELECT database::text, current_database()::text FROM pg_replication_slots "
        "WHERE slot_name = %s AND database IS DISTINCT FROM current_database()",
        (slot,),
    ).fetchone()
    if row is not None:
        owner = "no database (physical)" if row[0] is None else f"database {row[0]!r}"
        raise ConfigError(
            f"replication slot {slot!r} belongs to {owner}, not to {row[1]!r} that the source's "
            "dsn names: slot names are shared by the server's databases (a capture there of a "
            "table of the same schema and name under the same slot_prefix takes this one)",
            hint="give this source a distinct `slot_prefix` (its slots and publications take "
            "other names); the slot is left to its database",
            slot=slot,
        )
