"""Evidence for ``combined plan``: is a declared key unique, how long is WAL kept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from combined.connectors.abc import KeyMeasure
from combined.connectors.postgres._catalog import parse_relation
from combined.connectors.postgres._connect import Session, Settings


def measure_key(settings: Settings, relation: str, key: Sequence[str]) -> KeyMeasure:
    """Rows, distinct complete keys and rows with a null key part, in one scan."""
    schema, table = parse_relation(relation)
    cols = [sql.Identifier(k) for k in key]
    query = sql.SQL(
        "SELECT count(*), count(DISTINCT ({keys})) FILTER (WHERE NOT ({nulls})), "
        "count(*) FILTER (WHERE {nulls}) FROM {rel}"
    ).format(
        keys=sql.SQL(", ").join(cols),
        nulls=sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(c) for c in cols),
        rel=sql.Identifier(schema, table),
    )
    session = Session(settings)
    try:
        ((rows, distinct, nulls),) = session.rows(query, f"measuring the key of {relation}")
    finally:
        session.close()
    return KeyMeasure(int(rows), int(distinct), int(nulls), query.as_string(None))


#: The server's WAL keep settings and its average WAL rate since its statistics were reset.
RETENTION_QUERY = (
    "SELECT current_setting('max_slot_wal_keep_size'), current_setting('wal_keep_size'), "
    "w.wal_bytes, extract(epoch FROM now() - w.stats_reset), w.stats_reset "
    "FROM pg_stat_wal w"
)


def wal_retention(settings: Settings) -> dict[str, Any]:
    """How much WAL the server keeps for a slot, and how fast it writes WAL."""
    session = Session(settings)
    try:
        ((keep, wal_keep, written, seconds, reset),) = session.rows(
            RETENTION_QUERY, "reading the WAL retention settings"
        )
    finally:
        session.close()
    rate = float(written) / float(seconds) if written and seconds else None
    return {
        "kind": "wal",
        "max_slot_wal_keep_size": str(keep),
        "wal_keep_size": str(wal_keep),
        "wal_bytes_per_second": rate,
        "rate_since": str(reset),
        "query": RETENTION_QUERY,
    }
