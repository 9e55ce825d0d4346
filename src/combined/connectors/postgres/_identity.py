"""The statement that gives a table the replica identity a ``cdc`` dataset needs.

A hint that said only "add a primary key" or "make the key the replica
identity" left the user to find which index PostgreSQL would take and how
to say so, while a table often has one: a unique index over NOT NULL
columns serves through ``REPLICA IDENTITY USING INDEX``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg import sql

if TYPE_CHECKING:  # (a snapshot capture imports no change-capture module)
    from combined.connectors.postgres._tree import Rows


__all__ = ["identity_hint"]

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
