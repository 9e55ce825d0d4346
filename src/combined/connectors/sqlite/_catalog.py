"""What the SQLite catalog proves about a relation: columns, keys, cursor evidence.

Everything here is read from ``PRAGMA`` table-valued functions and
``sqlite_schema``; nothing is guessed from a column's name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from combined.connectors.abc import CursorCandidate, DatasetDiscovery, FieldInfo
from combined.connectors.sqlite._connection import Connection, fetch, scalar
from combined.connectors.sqlite._types import ColumnPlan, column_type, quote_ident
from combined.errors import NotFoundError

#: Relation kinds read as datasets (``shadow`` tables belong to virtual tables).
_KINDS = ("table", "view", "virtual")
_AUTOINCREMENT = re.compile(r"\bAUTOINCREMENT\b", re.IGNORECASE)
_INSERT_TIME_DEFAULTS = ("current_timestamp", "current_date", "current_time")


@dataclass(frozen=True, slots=True)
class Relation:
    """One table or view of the ``main`` schema, under its catalog spelling."""

    name: str
    kind: str
    without_rowid: bool
    sql: str | None


@dataclass(frozen=True, slots=True)
class Column:
    """One column as ``PRAGMA table_xinfo`` reports it."""

    name: str
    declared: str
    notnull: bool
    default: str | None
    pk: int


@dataclass(frozen=True, slots=True)
class Index:
    """One index as ``PRAGMA index_list``/``index_xinfo`` report it."""

    name: str
    unique: bool
    origin: str
    partial: bool
    #: Key columns in order; ``None`` for an expression (or the rowid).
    columns: tuple[str | None, ...]


def relations(conn: Connection) -> list[Relation]:
    """Every user table, view and virtual table of the ``main`` schema, by name."""
    rows = fetch(
        conn,
        "SELECT l.name AS name, l.type AS kind, l.wr AS wr, s.sql AS sql "
        "FROM pragma_table_list AS l LEFT JOIN sqlite_schema AS s "
        "ON s.name = l.name AND s.type IN ('table', 'view') "
        "WHERE l.schema = 'main' AND l.name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
        "ORDER BY l.name",
    )
    return [
        Relation(r["name"], r["kind"], bool(r["wr"]), r["sql"]) for r in rows if r["kind"] in _KINDS
    ]


def find_relation(conn: Connection, name: str) -> Relation:
    """The relation called ``name`` (SQLite names are case-insensitive)."""
    for rel in relations(conn):
        if rel.name == name:
            return rel
    for rel in relations(conn):
        if rel.name.casefold() == name.casefold():
            return rel
    raise NotFoundError(
        f"relation {name!r} does not exist in the sqlite database",
        hint="`combined discover SOURCE` lists the source's tables and views",
        relation=name,
    )


def columns(conn: Connection, rel: Relation) -> list[Column]:
    """The relation's readable columns in ``SELECT *`` order."""
    # hidden 1 marks a virtual table's hidden columns; 2 and 3 are generated
    # columns, which SELECT * returns like any other.
    rows = fetch(
        conn,
        'SELECT name, type, "notnull", dflt_value, pk, hidden FROM pragma_table_xinfo(?) '
        "WHERE hidden != 1 ORDER BY cid",
        (rel.name,),
    )
    return [
        Column(r["name"], r["type"] or "", bool(r["notnull"]), r["dflt_value"], int(r["pk"]))
        for r in rows
    ]


def indexes(conn: Connection, rel: Relation) -> list[Index]:
    """The relation's indexes with their key columns (views have none)."""
    if rel.kind != "table":
        return []
    out: list[Index] = []
    for r in fetch(conn, "SELECT * FROM pragma_index_list(?) ORDER BY name", (rel.name,)):
        keys = fetch(
            conn,
            "SELECT name FROM pragma_index_xinfo(?) WHERE key = 1 ORDER BY seqno",
            (r["name"],),
        )
        out.append(
            Index(
                name=r["name"],
                unique=bool(r["unique"]),
                origin=r["origin"],
                partial=bool(r["partial"]),
                columns=tuple(k["name"] for k in keys),
            )
        )
    return out


def primary_key(cols: Sequence[Column]) -> tuple[str, ...]:
    """The declared primary key, in key order."""
    return tuple(c.name for c in sorted((c for c in cols if c.pk), key=lambda c: c.pk))


def rowid_alias(rel: Relation, cols: Sequence[Column], idx: Sequence[Index]) -> str | None:
    """The column that aliases the rowid, if any.

    Only a single-column primary key declared exactly ``INTEGER`` of a rowid
    table aliases the rowid; ``INTEGER PRIMARY KEY DESC`` does not, and is
    told apart by the separate index SQLite then builds (origin ``pk``).
    """
    if rel.kind != "table" or rel.without_rowid:
        return None
    pk = [c for c in cols if c.pk]
    if len(pk) != 1 or pk[0].declared.strip().upper() != "INTEGER":
        return None
    if any(i.origin == "pk" for i in idx):
        return None
    return pk[0].name


def next_rowid(conn: Connection, rel: Relation, top: int) -> int:
    """The rowid sqlite gives the table's next row, given its largest rowid ``top``.

    ``max(rowid) + 1``; with AUTOINCREMENT, past the largest id the table
    ever held (``sqlite_sequence``), which outlives deleted rows.
    """
    if not (rel.sql and _AUTOINCREMENT.search(rel.sql)):
        return top + 1
    seq = scalar(conn, "SELECT seq FROM sqlite_sequence WHERE name = ?", (rel.name,))
    return max(top, int(seq or 0)) + 1


def plans(rel: Relation, cols: Sequence[Column], idx: Sequence[Index]) -> list[ColumnPlan]:
    """Column plans with the nullability the catalog proves."""
    alias = rowid_alias(rel, cols, idx)
    out: list[ColumnPlan] = []
    for c in cols:
        # A rowid alias is never NULL; a WITHOUT ROWID primary key enforces
        # NOT NULL. An ordinary rowid table's other primary keys may hold NULL.
        proven = c.notnull or c.name == alias or (rel.without_rowid and c.pk > 0)
        out.append(ColumnPlan(c.name, c.declared, column_type(c.declared), not proven))
    return out


def unique_keys(
    cols_plans: Sequence[ColumnPlan], idx: Sequence[Index], pk: tuple[str, ...]
) -> tuple[tuple[str, ...], ...]:
    """Unique indexes that prove a key: whole-table, plain columns, all NOT NULL.

    A partial index proves uniqueness only of its subset, an expression index
    not of the columns, and SQLite lets a UNIQUE column hold many NULLs.
    """
    nullable = {p.name: p.nullable for p in cols_plans}
    keys: list[tuple[str, ...]] = []
    for i in idx:
        if not i.unique or i.partial or any(c is None for c in i.columns):
            continue
        cols = tuple(c for c in i.columns if c is not None)
        if cols == pk or cols in keys or any(nullable.get(c, True) for c in cols):
            continue
        keys.append(cols)
    return tuple(keys)


def cursor_candidates(
    rel: Relation,
    cols: Sequence[Column],
    cols_plans: Sequence[ColumnPlan],
    idx: Sequence[Index],
) -> tuple[CursorCandidate, ...]:
    """Columns a cursor could use, each with the catalog facts that support it."""
    out: list[CursorCandidate] = []
    alias = rowid_alias(rel, cols, idx)
    if alias is not None:
        if rel.sql and _AUTOINCREMENT.search(rel.sql):
            evidence = (
                "integer primary key autoincrement: rowid alias; sqlite assigns each new row "
                "an id larger than any the table ever held, unless a row is inserted with an "
                "explicit id"
            )
        else:
            evidence = (
                "integer primary key: rowid alias; sqlite assigns a new row max(rowid) + 1 "
                "unless it is inserted with an explicit id, so once the rows with the largest "
                "ids are deleted new rows reuse the ids of deleted rows, at or below the "
                "checkpoint, and a cursor never reads them: a capture then stops for review "
                "(AUTOINCREMENT prevents the reuse)"
            )
        out.append(CursorCandidate(alias, evidence))
    leading = {i.columns[0]: i.name for i in idx if i.columns and not i.partial and i.columns[0]}
    by_name = {c.name: c for c in cols}
    for plan in cols_plans:
        if plan.name == alias or plan.nullable or not plan.type.cursor_capable:
            continue
        facts: list[str] = []
        if plan.name in leading:
            facts.append(
                f"leads index {leading[plan.name]!r}, so keyset reads are ordered and cheap"
            )
        default = (by_name[plan.name].default or "").strip().lower()
        if default in _INSERT_TIME_DEFAULTS:
            facts.append(
                f"defaults to {default} on insert (utc text) unless a value is given; "
                "updates do not change it"
            )
        if not facts:
            continue
        out.append(
            CursorCandidate(
                plan.name,
                "not null; "
                + "; ".join(facts)
                + "; the catalog does not prove that values only grow, so declare the trust basis",
            )
        )
    return tuple(out)


def describe(conn: Connection, rel: Relation) -> DatasetDiscovery:
    """Discovery of one relation (call inside a read transaction for consistency)."""
    cols = columns(conn, rel)
    idx = indexes(conn, rel)
    cols_plans = plans(rel, cols, idx)
    pk = primary_key(cols) if rel.kind == "table" else ()
    estimated: int | None = None
    if rel.kind == "table":
        # count(*) is exact and cheap enough on SQLite; views and virtual
        # tables would run their query, so they are not counted.
        estimated = int(scalar(conn, f"SELECT count(*) FROM {quote_ident(rel.name)}"))
    return DatasetDiscovery(
        name=rel.name,
        relation=rel.name,
        kind=rel.kind,
        fields=tuple(
            FieldInfo(p.name, p.type.arrow_name, p.declared, p.nullable) for p in cols_plans
        ),
        primary_key=pk,
        unique_keys=unique_keys(cols_plans, idx, pk),
        cursor_candidates=cursor_candidates(rel, cols, cols_plans, idx),
        strategies=("snapshot", "cursor"),
        estimated_rows=estimated,
    )
