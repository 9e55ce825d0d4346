"""The statement that gives a table the replica identity a ``cdc`` dataset needs.

A hint that said only "add a primary key" or "make the key the replica
identity" left the user to find which index PostgreSQL would take and how
to say so, while a table often has one: a unique index over NOT NULL
columns serves through ``REPLICA IDENTITY USING INDEX``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from combined.connectors.postgres._catalog import parse_relation, relation_name
from combined.errors import SchemaMismatch

if TYPE_CHECKING:  # (a snapshot capture imports no change-capture module)
    from combined.connectors.abc import ReadRequest
    from combined.connectors.postgres._tree import Rows


__all__ = ["identity_hint", "require_key_identity"]

_KEY_COLUMNS = (
    "FROM unnest(CAST(i.indkey AS int2[])) WITH ORDINALITY AS k(attnum, ord)"
    " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
    " WHERE k.ord <= i.indnkeyatts"
)

#: The indexes ``ALTER TABLE ... REPLICA IDENTITY USING INDEX`` takes: unique, immediate,
#: valid, not partial, without expressions, over NOT NULL key columns; narrowest first.
_CANDIDATES = (
    "SELECT ci.relname::text, i.indisprimary,"
    f" ARRAY(SELECT a.attname::text {_KEY_COLUMNS} ORDER BY k.ord)"
    " FROM pg_index i JOIN pg_class ci ON ci.oid = i.indexrelid"
    " JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = {} AND c.relname = {} AND c.relkind = 'r' AND i.indisunique"
    " AND i.indimmediate AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL"
    f" AND NOT EXISTS (SELECT {_KEY_COLUMNS} AND NOT a.attnotnull)"
    " ORDER BY i.indnkeyatts, i.indisprimary DESC, 1"
)


def identity_hint(rows: Rows, schema: str, table: str, key: Sequence[str], otherwise: str) -> str:
    """The hint giving table ``schema.table`` a replica identity that carries ``key``.

    The statement that makes its narrowest fitting index the identity
    (``DEFAULT`` for its primary key, else ``USING INDEX``), or
    ``otherwise`` when no index fits (nor does any for a partitioned table,
    whose identity does not reach its partitions); ``REPLICA IDENTITY FULL``
    after it.
    """
    alter = f"ALTER TABLE {sql.Identifier(schema, table).as_string(None)} REPLICA IDENTITY"
    found = rows(sql.SQL(_CANDIDATES).format(sql.Literal(schema), sql.Literal(table)))
    fits = [(name, primary) for name, primary, cols in found if set(key) <= set(cols or ())]
    if not fits:
        return f"{otherwise}, or {alter} FULL"
    name, primary = fits[0]
    if primary:
        return f"{alter} DEFAULT (its primary key), or {alter} FULL"
    return f"{alter} USING INDEX {sql.Identifier(name).as_string(None)}, or {alter} FULL"


#: The relation, then (a partitioned table's) every table below it: schema, name,
#: relkind, relreplident and the key columns of the index serving as its replica
#: identity (NULL when none does: ``FULL``, ``NOTHING``, or no primary key).
_IDENTITIES = (
    "WITH RECURSIVE below(oid, depth) AS ("
    " SELECT c.oid, 0 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    "  WHERE n.nspname = {} AND c.relname = {}"
    " UNION ALL SELECT i.inhrelid, b.depth + 1 FROM pg_inherits i JOIN below b"
    "  ON i.inhparent = b.oid JOIN pg_class p ON p.oid = b.oid"
    "  WHERE p.relkind = 'p' AND b.depth < 64)"
    " SELECT n.nspname::text, c.relname::text, c.relkind::text, c.relreplident::text,"
    f" (SELECT ARRAY(SELECT a.attname::text {_KEY_COLUMNS} ORDER BY k.ord) FROM pg_index i"
    "  WHERE i.indrelid = c.oid AND CASE c.relreplident WHEN 'd' THEN i.indisprimary"
    "  WHEN 'i' THEN i.indisreplident ELSE false END LIMIT 1)"
    " FROM below b JOIN pg_class c ON c.oid = b.oid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " ORDER BY b.depth, 1, 2"
)


#: The partitions a refusal names after the first, at most.
_LISTED = 5


def require_key_identity(rows: Rows, request: ReadRequest) -> None:
    """Raise :class:`SchemaMismatch` when a key column of ``request`` is outside the
    replica identity of a table whose changes its stream carries.

    A delete (and a key change) carries the old row's replica identity only,
    that of the table the row lives in: for a partitioned table, each of its
    partitions (the publication sends the changes of each under its own
    identity; the partitioned table's does not reach them). ``FULL`` carries
    every column; a table with no identity is refused elsewhere (its updates
    and deletes could not be published at all).
    """
    schema, table = parse_relation(request.relation)
    found = rows(sql.SQL(_IDENTITIES).format(sql.Literal(schema), sql.Literal(table)))
    if not found:
        return  # (a missing relation is refused with its own words)
    leaves = [r for r in found[1:] if r[2] != "p"] if found[0][2] == "p" else []
    short = [r for r in leaves or found[:1] if _missing(request.key, r)]
    if short:
        raise _outside(rows, request, short, relation_name(schema, table) if leaves else None)


def _missing(key: Sequence[str], row: Sequence[Any]) -> list[str]:
    """The columns of ``key`` outside the identity of one ``_IDENTITIES`` row."""
    identity = row[4]
    if row[3] == "f" or identity is None:
        return []
    return [k for k in key if k not in identity]


def _outside(
    rows: Rows, request: ReadRequest, short: Sequence[Sequence[Any]], root: str | None
) -> SchemaMismatch:
    """The refusal naming the first table in ``short`` (a partition of ``root``, if any)."""
    schema, table, _, _, identity = short[0]
    name = relation_name(schema, table)
    where = f"{name}, a partition of {root}," if root else name
    others = [relation_name(s, t) for s, t, *_ in short[1:]]
    listed = ", ".join(others[:_LISTED])
    if len(others) > _LISTED:
        listed += f" and {len(others) - _LISTED} more"
    more = f"; other partitions leave it out too: {listed}" if others else ""
    return SchemaMismatch(
        f"dataset {request.dataset!r} is keyed on {', '.join(_missing(request.key, short[0]))}, "
        f"which deletes do not carry (the replica identity of {where} is "
        f"{', '.join(sorted(identity))}{more})",
        hint=identity_hint(
            rows,
            schema,
            table,
            request.key,
            "make the key the replica identity (a primary key or a unique index over "
            "NOT NULL columns)",
        ),
        dataset=request.dataset,
    )
