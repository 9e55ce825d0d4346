"""Values of columns a change stream shows arriving, for the rows it will never send.

``ALTER TABLE ... ADD COLUMN ... DEFAULT`` gives every existing row a value
without a change in the stream: only rows changed afterwards carry it. When
a relation message shows a column the lake does not hold, the assembler
reads the key and the new columns of every row from the source
(:class:`ColumnFill`) and puts each in the stream as an update that leaves
every other column unchanged (as a TOAST value the server did not send), at
the place of the first change that showed the column.

The read happens later than that place, at some position ``T``. It is
anchored by reading the stream on to ``T`` (:attr:`ColumnFill.lsn`) before
the run ends: a row changed between the ALTER and ``T`` has that change in
the stream after the filled value, and the last change wins; a row the
read does not hold was deleted meanwhile, and its delete follows too. A row
the read holds that was inserted after the ALTER is filled before its
insert: the run ends only past ``T``, so the insert lands in the same commit.
A column gone by ``T`` (dropped or renamed since) took the values the source
gave the rows with it: the capture needs a new snapshot (:func:`_gone`).

:func:`count_nulls` counts the filled columns' nulls in one snapshot, for
reconciliation, with what it needs to tell whether the lake's commit holds
the same transactions.

A column whose type changed (``ALTER COLUMN ... TYPE``, with or without
``USING``) had its values rewritten in place, with no change in the stream
either: a relation message showing another type (or type modifier) than the
one recorded with the last checkpoint has the column filled the same way.
When no change of the table follows the ``ALTER`` in a run, no relation
message shows it: the run compares the table's columns as the catalog
holds them when it starts (:func:`relations_now`) with the recorded ones,
and fills at its end what differs. So it does with an enum label renamed,
and with a table written anew (:mod:`._rewrite`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from combined.connectors.postgres._catalog import parse_relation
from combined.connectors.postgres._connect import Settings, connect_error, query_error
from combined.connectors.postgres._pgoutput import Relation, RelationColumn, text_to_lsn
from combined.connectors.postgres._replication import SESSION_SETTINGS
from combined.connectors.postgres._rewrite import Marks, read_marks
from combined.errors import NeedsSnapshot

__all__ = [
    "ColumnFill",
    "FillCount",
    "FillDeferred",
    "count_nulls",
    "not_null_columns",
    "relations_now",
]

_FETCH = 10_000


class FillDeferred(Exception):
    """A filled column's type is another one now than the relation message's: a later
    ``ALTER`` changed it again, and its own relation message (or the run's comparison
    with the catalog) fills it in that type. Raised before any row is read."""


#: A table's columns' (name, type oid, type modifier), as the catalog holds them now.
_TYPES = (
    "SELECT attname::text, atttypid::bigint, atttypmod::int FROM pg_attribute"
    " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
)


class ColumnFill:
    """Reads columns of every row as pgoutput renders them (its session settings, as text).

    :attr:`lsn` is the server's WAL position after the last read: the
    stream must be read at least that far for the filled values to hold.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.lsn = 0

    def __call__(
        self, relation: str, columns: Sequence[str], types: Mapping[str, tuple[int, int]]
    ) -> Iterator[tuple[bytes | None, ...]]:
        """Each row's ``columns`` in the wire's text form (``None`` for null), where
        each column in ``types`` still has that (type oid, modifier): else
        :class:`FillDeferred`. The table is locked against an ``ALTER`` first, so
        the types checked are those of the values read."""
        schema, table = parse_relation(relation)
        # Each value's output function, as the stream sends it: a cast to text is
        # not always that (``true``, not ``t``; an inet's ``/32``; a char(n) without
        # its trailing blanks). ``format`` makes NULL '' (and ``IS NOT NULL`` is
        # false for a composite value holding a null: ``num_nulls`` is not).
        texts = (
            sql.SQL("CASE WHEN num_nulls({0}) = 0 THEN format('%s', {0}) END").format(
                sql.Identifier(c)
            )
            for c in columns
        )
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(texts), sql.Identifier(schema, table)
        )
        try:
            conn = psycopg.connect(self._settings.conninfo())
        except psycopg.Error as exc:
            raise connect_error(exc, self._settings) from None
        try:
            with conn:
                for name, value in SESSION_SETTINGS.items():
                    conn.execute("SELECT set_config(%s, %s, false)", (name, value))
                conn.commit()
                with conn.transaction(), conn.cursor(name=f"fill_{uuid.uuid4().hex}") as cur:
                    ident = sql.Identifier(schema, table)
                    conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(ident))
                    found = conn.execute(_TYPES, (ident.as_string(conn),)).fetchall()
                    now = {str(r[0]): (int(r[1]), int(r[2])) for r in found}
                    gone = [c for c in types if c not in now]
                    if gone:
                        raise _gone(relation, gone)
                    if any(now.get(c) != pair for c, pair in types.items()):
                        raise FillDeferred(relation)
                    cur.execute(query)
                    while rows := cur.fetchmany(_FETCH):
                        for row in rows:
                            yield tuple(None if v is None else str(v).encode() for v in row)
                at = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                assert at is not None
                self.lsn = max(self.lsn, text_to_lsn(at[0]))
        except psycopg.Error as exc:
            raise query_error(
                exc, self._settings, f"reading the columns added to {relation}"
            ) from None


def _gone(relation: str, columns: Sequence[str]) -> NeedsSnapshot:
    """The refusal of a fill whose ``columns`` left the table before they were read.

    A column a relation message showed (added, or of a new type) and that
    was dropped or renamed since held values for the rows the stream does not
    carry: the default the ``ADD COLUMN`` gave them, or the values an ``ALTER
    ... TYPE`` rewrote. PostgreSQL clears a dropped column's default and
    missing value (``pg_attrdef``, ``attmissingval``), so nothing tells
    them, or even whether there was one; the lake would hold null instead.
    Every retry reads the same relation message: only a new snapshot mends it.
    """
    names = ", ".join(repr(c) for c in columns)
    return NeedsSnapshot(
        f"column {names} of {relation}, which the change stream shows added or rewritten, "
        "was dropped or renamed before this capture could read it: the values the source "
        "gave its rows without a change in the stream (a default) are gone, and the lake "
        "would hold null in every row not changed while the column existed",
        hint="run `combined cdc teardown` then `combined cdc setup` for the source: a new "
        f"snapshot takes the table as it is now; or leave {names} out of the dataset's "
        "`columns:` to capture on without it",
        relation=relation,
        column=columns[0],
    )


def not_null_columns(settings: Settings, relation: str) -> tuple[str, ...]:
    """The columns of ``relation`` the source declares NOT NULL (reconciliation checks them)."""
    schema, table = parse_relation(relation)
    try:
        with psycopg.connect(settings.conninfo(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attnum > 0 AND NOT attisdropped AND attnotnull ORDER BY attnum",
                (sql.Identifier(schema, table).as_string(None),),
            ).fetchall()
    except psycopg.Error as exc:
        raise query_error(exc, settings, f"reading the NOT NULL columns of {relation}") from None
    return tuple(str(r[0]) for r in rows)


#: A table's streamed columns as pgoutput's relation message describes them:
#: generated columns are not streamed; the replica identity's columns are the key
#: (every column under ``REPLICA IDENTITY FULL``).
_RELATION = (
    "SELECT c.oid::bigint, n.nspname::text, c.relname::text, c.relreplident::text,"
    " a.attname::text, a.atttypid::bigint, a.atttypmod::int,"
    " c.relreplident = 'f' OR a.attnum = ANY(coalesce(i.indkey::int2[], '{}'))"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " JOIN pg_attribute a ON a.attrelid = c.oid"
    " LEFT JOIN pg_index i ON i.indrelid = c.oid AND CASE c.relreplident"
    " WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END"
    " WHERE c.oid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"
    " AND a.attgenerated = '' ORDER BY a.attnum"
)


def relations_now(
    settings: Settings, relations: Sequence[str]
) -> tuple[list[tuple[Relation, Marks]], int]:
    """``relations``' columns, types and keys as the catalog holds them now, as a
    relation message would show them (see the module's text), each with its enum
    labels and files (:mod:`._rewrite`), and the WAL position after the read."""
    out: list[tuple[Relation, Marks]] = []
    try:
        with psycopg.connect(settings.conninfo(), autocommit=True) as conn:
            for relation in relations:
                name = sql.Identifier(*parse_relation(relation)).as_string(None)
                found = conn.execute(_RELATION, (name,)).fetchall()
                oid, namespace, table, identity = found[0][:4]
                columns = (
                    RelationColumn(str(c), int(t), int(m), bool(k)) for *_, c, t, m, k in found
                )
                shown = Relation(int(oid), str(namespace), str(table), str(identity), (*columns,))
                out.append((shown, read_marks(lambda q: conn.execute(q).fetchall(), int(oid))))
            at = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    except psycopg.Error as exc:
        raise query_error(exc, settings, f"reading the columns of {', '.join(relations)}") from None
    assert at is not None
    return out, text_to_lsn(at[0])


@dataclass(frozen=True, slots=True)
class FillCount:
    """Nulls of each filled column in one snapshot of the source, and where it stands.

    ``lsn`` is the WAL position read after the snapshot: every transaction
    the snapshot sees committed before it. ``xmax`` and ``running`` (full
    transaction ids) say which transactions the snapshot does not see, so
    that a transaction the stream shows before ``lsn`` can be checked
    against it (:meth:`sees`).
    """

    nulls: dict[str, int]
    rows: int
    lsn: int
    xmin: int
    xmax: int
    running: frozenset[int]

    def sees(self, xid: int) -> bool:
        """Whether the snapshot sees the (committed) transaction of 32-bit ``xid``."""
        # The full id nearest ``xmax`` (32-bit ids compare within 2^31 of each other).
        diff = (xid - self.xmax) & 0xFFFFFFFF
        full = self.xmax + (diff - (1 << 32) if diff >= 1 << 31 else diff)
        return full < self.xmin or (full < self.xmax and full not in self.running)


def count_nulls(settings: Settings, relation: str, columns: Sequence[str]) -> FillCount:
    """Count the rows of ``relation`` and the nulls of ``columns`` in one snapshot."""
    schema, table = parse_relation(relation)
    counts = sql.SQL(", ").join(
        # (``IS NULL`` is true for a composite value whose every field is null)
        sql.SQL("count(*) FILTER (WHERE num_nulls({}) = 1)").format(sql.Identifier(c))
        for c in columns
    )
    query = sql.SQL("SELECT pg_current_snapshot()::text, count(*), {} FROM {}").format(
        counts, sql.Identifier(schema, table)
    )
    try:
        with psycopg.connect(settings.conninfo()) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            row = conn.execute(query).fetchone()
            at = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    except psycopg.Error as exc:
        raise query_error(exc, settings, f"counting the filled columns of {relation}") from None
    assert row is not None and at is not None
    xmin, xmax, running = str(row[0]).split(":")
    return FillCount(
        nulls={c: int(n) for c, n in zip(columns, row[2:], strict=True)},
        rows=int(row[1]),
        lsn=text_to_lsn(at[0]),
        xmin=int(xmin),
        xmax=int(xmax),
        running=frozenset(int(x) for x in running.split(",") if x),
    )
