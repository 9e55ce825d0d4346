"""What the source's role may do, told before any Run: read a dataset's columns, stream changes.

A role without SELECT on a captured column, without USAGE on its schema, or
without REPLICATION for a ``cdc`` dataset passed ``combined check`` and
failed the first capture (``needs_auth``). The catalog answers each of these
without reading a row: one query for every relation of a preflight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from combined.connectors.postgres._connect import Session
from combined.errors import AuthRejected

__all__ = ["Grants", "grants", "refuse_denied", "refuse_unreplicating"]


@dataclass(frozen=True, slots=True)
class Grants:
    """What the session's role may do with one relation, and who that role is."""

    role: str
    #: Whether the role may stream changes (REPLICATION, a superuser, or on Amazon RDS
    #: a member of ``rds_replication``, which stands for the attribute there).
    replication: bool
    #: Whether the role holds USAGE on the relation's schema.
    usage: bool
    #: The relation's columns the role may not SELECT.
    denied: frozenset[str]


_GRANTS = """
SELECT c.oid::bigint, current_user::text,
  (SELECT r.rolsuper OR r.rolreplication FROM pg_roles r WHERE r.rolname = current_user)
    OR EXISTS (SELECT 1 FROM pg_roles g WHERE g.rolname = 'rds_replication'
      AND pg_has_role(current_user, g.oid, 'MEMBER')),
  has_schema_privilege(c.relnamespace, 'USAGE'),
  coalesce(array_agg(a.attname::text ORDER BY a.attnum)
    FILTER (WHERE NOT has_column_privilege(c.oid, a.attnum, 'SELECT')), '{{}}')
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.oid = ANY(CAST({} AS oid[]))
GROUP BY c.oid, c.relnamespace
"""


def grants(session: Session, oids: Sequence[int]) -> dict[int, Grants]:
    """:class:`Grants` of each relation of ``oids`` (by oid)."""
    if not oids:
        return {}
    rows = session.rows(
        sql.SQL(_GRANTS).format(sql.Literal([int(o) for o in oids])),
        "reading the role's privileges",
    )
    return {
        int(oid): Grants(str(role), bool(replication), bool(usage), frozenset(denied or ()))
        for oid, role, replication, usage, denied in rows
    }


def refuse_denied(
    dataset: str, schema: str, table: str, columns: Sequence[str], found: Grants | None
) -> None:
    """Raise :class:`AuthRejected` when the role may not read ``columns`` of the relation."""
    if found is None:
        return
    relation = sql.Identifier(schema, table).as_string(None)
    role = sql.Identifier(found.role).as_string(None)
    if not found.usage:
        raise AuthRejected(
            f"dataset {dataset}: the postgres role {found.role!r} may not use schema "
            f"{schema!r}, so it cannot read {relation}",
            hint=f"as the schema's owner or a superuser: GRANT USAGE ON SCHEMA "
            f"{sql.Identifier(schema).as_string(None)} TO {role}",
            dataset=dataset,
        )
    denied = [c for c in columns if c in found.denied]
    if denied:
        grant = f"as the table's owner or a superuser: GRANT SELECT ON {relation} TO {role}"
        if len(denied) == len(columns):
            what = "any of its columns"
        else:
            listed = ", ".join(sql.Identifier(c).as_string(None) for c in denied)
            what = f"column(s) {listed}"
            grant += f", or GRANT SELECT ({listed}) ON {relation} TO {role}"
        raise AuthRejected(
            f"dataset {dataset}: the postgres role {found.role!r} may not read {what} of "
            f"{relation}",
            hint=f"{grant}; or leave the columns out with a `columns:` list",
            dataset=dataset,
        )


def refuse_unreplicating(dataset: str, found: Grants | None) -> None:
    """Raise :class:`AuthRejected` when a ``cdc`` dataset's role may not stream changes."""
    if found is None or found.replication:
        return
    role = sql.Identifier(found.role).as_string(None)
    raise AuthRejected(
        f"dataset {dataset}: the postgres role {found.role!r} may not stream changes "
        "(strategy: cdc needs the REPLICATION attribute)",
        hint=f"as a superuser: ALTER ROLE {role} WITH REPLICATION (on Amazon RDS: GRANT "
        f"rds_replication TO {role}); or capture the dataset with strategy: snapshot or cursor",
        dataset=dataset,
    )
