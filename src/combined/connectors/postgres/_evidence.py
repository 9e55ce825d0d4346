"""Evidence for ``combined plan``: is a declared key unique, how long is WAL kept."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from psycopg import sql

from combined.connectors.abc import KeyMeasure, StreamOwner
from combined.connectors.postgres._catalog import parse_relation
from combined.connectors.postgres._connect import Session, Settings
from combined.connectors.postgres._slot_owner import marked_by_another


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


#: The database's pgoutput slots whose names start as a prefix's do, the WAL each
#: holds back (bytes from its restart position to the server's current one), and the
#: comment of its publication (a project's mark: ``_slot_owner``).
_PREFIXED_SLOTS = """
SELECT s.slot_name::text, s.active, s.wal_status,
       pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint,
       obj_description(p.oid, 'pg_publication')
FROM pg_replication_slots s
     LEFT JOIN pg_publication p ON p.pubname = s.slot_name,
     LATERAL (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()
                          ELSE pg_current_wal_lsn() END AS lsn) w
WHERE s.database = current_database() AND s.plugin = 'pgoutput'
  AND starts_with(s.slot_name::text, {})
ORDER BY 1
"""


def undeclared_slots(
    settings: Settings, start: str, declared: Collection[str], owner: StreamOwner | None
) -> list[dict[str, Any]]:
    """Slots of this database whose names begin with ``start`` (a slot prefix's:
    ``_stitch.slot_name_start``) that are none of ``declared``, nor another project's.

    A cdc dataset removed from the project leaves its slot, which keeps the
    server's WAL from being recycled until someone drops it; nothing else
    tells. A slot whose publication carries another project's mark is that
    project's (``_slot_owner``), and left out; one whose publication has no
    mark may be another's too (made before the marks): it is reported, never
    dropped.
    """
    query = sql.SQL(_PREFIXED_SLOTS).format(sql.Literal(start))
    session = Session(settings)
    try:
        rows = session.rows(query, "listing the database's replication slots")
    finally:
        session.close()
    return [
        {"slot": str(name), "active": bool(active), "wal_status": status, "retained_bytes": held}
        for name, active, status, held, comment in rows
        if name not in declared and not marked_by_another(comment, owner)
    ]
