"""Catalog queries: tables, views, columns, keys and cursor evidence.

Everything is read from ``information_schema`` of the dsn's database, which
lists only what the account may see. A relation is named ``table`` (in the
dsn's database) or ``database.table``; names are taken literally.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from combined.connectors._shared import split_qualified
from combined.connectors.abc import CursorCandidate, DatasetDiscovery, FieldInfo, Strategy
from combined.connectors.mariadb._connect import Session, quote_ident
from combined.connectors.mariadb._types import ColumnPlan, SourceColumn, plan_column
from combined.errors import ConfigError, NotFoundError

_KINDS = {"BASE TABLE": "table", "VIEW": "view", "SYSTEM VERSIONED": "table"}
#: Storage engines whose tables a consistent snapshot covers.
TRANSACTIONAL_ENGINES = ("InnoDB", "XtraDB", "RocksDB", "TokuDB", "NDBCLUSTER")
_CLOCK_DEFAULTS = ("current_timestamp", "now()", "localtimestamp")
# A table a view reads: the server stores view definitions with every table
# written `database`.`table` after FROM or JOIN (a CTE's name is one part).
_TABLE_REF = re.compile(r"\b(?:from|join)\s*\(*\s*`((?:[^`]|``)+)`\.`((?:[^`]|``)+)`", re.I)
_VIEW_DEPTH = 16


#: A nullable cursor candidate: what becomes of its NULLs is the dataset's choice.
_NULLABLE_EVIDENCE = (
    "nullable: a row with a null is in no cursor window, cursor.nulls decides "
    "(fail, include or exclude)"
)


@dataclass(frozen=True, slots=True)
class Relation:
    """One readable table or view."""

    database: str
    table: str
    kind: str
    engine: str | None
    rows: int | None
    #: A system-versioned table (its binary log records a delete as an update).
    versioned: bool = False

    @property
    def name(self) -> str:
        """The dataset name: ``table``, qualified when outside the dsn's database."""
        return self.table

    @property
    def ident(self) -> str:
        """The quoted ``database`.`table`` to use in SQL."""
        return f"{quote_ident(self.database)}.{quote_ident(self.table)}"

    @property
    def transactional(self) -> bool:
        """Whether the relation is a table of an engine a consistent snapshot covers.

        A view is not: :func:`snapshot_covers` decides from the tables it reads.
        """
        return (self.engine or "") in TRANSACTIONAL_ENGINES


@dataclass(frozen=True, slots=True)
class Index:
    """One index of a table, by its key column names (None for an expression part)."""

    name: str
    unique: bool
    columns: tuple[str | None, ...]


def parse_relation(text: str, database: str) -> tuple[str, str]:
    """``table`` or ``database.table`` as (database, table); backticks quote a part."""
    parts = split_qualified(
        text, "`", "name it table or database.table (quote a part holding a dot in backticks)"
    )
    return (database, parts[0]) if len(parts) == 1 else (parts[0], parts[1])


_RELATIONS = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE, ENGINE, TABLE_ROWS "
    "FROM information_schema.TABLES WHERE TABLE_TYPE IN ('BASE TABLE', 'VIEW', 'SYSTEM VERSIONED')"
)


def _relation(row: Sequence[str | None]) -> Relation:
    db, table, kind, engine, rows = row
    return Relation(
        str(db),
        str(table),
        _KINDS.get(str(kind), "table"),
        engine,
        int(rows) if rows else None,
        versioned=str(kind) == "SYSTEM VERSIONED",
    )


def list_relations(session: Session, database: str) -> list[Relation]:
    """The tables and views of ``database`` the account can see, by name."""
    q = f"{_RELATIONS} AND TABLE_SCHEMA = {session.literal(database)} ORDER BY TABLE_NAME"
    return [_relation(r) for r in session.rows(q, "listing tables")]


def find_relation(session: Session, name: str, database: str) -> Relation:
    """The relation named ``name``; :class:`NotFoundError` when it does not exist."""
    db, table = parse_relation(name, database)
    q = (
        f"{_RELATIONS} AND TABLE_SCHEMA = {session.literal(db)}"
        f" AND TABLE_NAME = {session.literal(table)}"
    )
    rows = session.rows(q, "looking up the table")
    if not rows:
        _refuse_sequence(session, db, table, name)
        dotted = "." in name and "`" not in name  # (read as database.table)
        raise NotFoundError(
            f"table {table!r} does not exist in database {db!r} (or the account cannot see it)",
            hint="`combined discover SOURCE` lists the tables and views; grant SELECT if it is "
            "missing"
            + (
                f"; {name!r} reads as database.table: quote a name holding a dot in backticks "
                f"(`{name.replace('`', '``')}`)"
                if dotted
                else ""
            ),
            relation=name,
        )
    return _relation(rows[0])


def _refuse_sequence(session: Session, db: str, table: str, name: str) -> None:
    """A ``SEQUENCE`` is no table to capture: say so (it was "does not exist")."""
    kind = session.rows(
        "SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
        f"{session.literal(db)} AND TABLE_NAME = {session.literal(table)}",
        "looking up the table",
    )
    if kind and str(kind[0][0]).upper() == "SEQUENCE":
        raise NotFoundError(
            f"{table!r} in database {db!r} is a SEQUENCE: it holds the sequence's counters, "
            "not rows to capture",
            hint="name a table or a view (`combined discover SOURCE` lists them)",
            relation=name,
        )


def find_relations(session: Session, names: Sequence[str], database: str) -> dict[str, Relation]:
    """Each relation of ``names`` by its name, in one query a database.

    :class:`NotFoundError` names the first of ``names`` that does not exist.
    """
    wanted = {name: parse_relation(name, database) for name in names}
    by_db: dict[str, set[str]] = defaultdict(set)
    for db, table in wanted.values():
        by_db[db].add(table)
    found: dict[tuple[str, str], Relation] = {}
    for db, tables in by_db.items():
        listed = ", ".join(session.literal(t) for t in sorted(tables))
        q = f"{_RELATIONS} AND TABLE_SCHEMA = {session.literal(db)} AND TABLE_NAME IN ({listed})"
        for row in session.rows(q, "looking up the tables"):
            rel = _relation(row)
            found[(rel.database, rel.table)] = rel
    out: dict[str, Relation] = {}
    for name, (db, table) in wanted.items():
        # Not found by its exact spelling: the one lookup raises, or matches as the server does.
        out[name] = found.get((db, table)) or find_relation(session, name, database)
    return out


def change_marker(session: Session, rel: Relation) -> str | None:
    """A text that moves whenever ``rel``'s rows may have: its creation and last write.

    A hint, never proof: ``UPDATE_TIME`` is kept to the second (a write in
    the second a read began leaves it as it was) and in memory (NULL after
    a restart, until the next write). None for a view, a partitioned InnoDB
    table, or a table whose engine keeps no time.
    """
    if rel.kind == "view":
        return None
    q = (
        "SELECT CREATE_TIME, UPDATE_TIME FROM information_schema.TABLES"
        f" WHERE TABLE_SCHEMA = {session.literal(rel.database)}"
        f" AND TABLE_NAME = {session.literal(rel.table)}"
    )
    rows = session.rows(q, "reading the table's last write time")
    if not rows or rows[0][1] is None:
        return None
    created, written = rows[0]
    return f"mdb1:{created}:{written}"


def snapshot_covers(session: Session, rel: Relation, depth: int = 0) -> bool:
    """Whether a consistent snapshot covers every table ``rel`` reads.

    A table: its engine decides. A view: every table its stored definition
    reads, views followed, must be covered; a definition the account cannot
    see, or a table it names that cannot be found, proves nothing.
    """
    if rel.kind != "view":
        return rel.transactional
    if depth >= _VIEW_DEPTH:
        return False
    rows = session.rows(
        "SELECT VIEW_DEFINITION FROM information_schema.VIEWS"
        f" WHERE TABLE_SCHEMA = {session.literal(rel.database)}"
        f" AND TABLE_NAME = {session.literal(rel.table)}",
        "reading the view's definition",
    )
    definition = str(rows[0][0] or "") if rows else ""
    if not definition:
        return False
    for db, table in set(_TABLE_REF.findall(definition)):
        q = (
            f"{_RELATIONS} AND TABLE_SCHEMA = {session.literal(db.replace('``', '`'))}"
            f" AND TABLE_NAME = {session.literal(table.replace('``', '`'))}"
        )
        found = session.rows(q, "looking up the view's tables")
        if not found or not snapshot_covers(session, _relation(found[0]), depth + 1):
            return False
    return True


def columns(
    session: Session, database: str, tables: Sequence[str]
) -> dict[str, list[SourceColumn]]:
    """The columns of each table of ``database``, in ordinal order."""
    if not tables:
        return {}
    names = ", ".join(session.literal(t) for t in tables)
    q = (
        "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE,"
        " NUMERIC_PRECISION, NUMERIC_SCALE, COLUMN_DEFAULT, EXTRA, CHARACTER_OCTET_LENGTH,"
        " ORDINAL_POSITION FROM information_schema.COLUMNS"
        f" WHERE TABLE_SCHEMA = {session.literal(database)} AND TABLE_NAME IN ({names})"
        " ORDER BY TABLE_NAME, ORDINAL_POSITION"
    )
    out: dict[str, list[SourceColumn]] = defaultdict(list)
    for table, name, dt, ct, nullable, prec, scale, default, extra, octets, at in session.rows(
        q, "reading columns"
    ):
        out[str(table)].append(
            SourceColumn(
                name=str(name),
                data_type=str(dt),
                column_type=str(ct),
                nullable=nullable == "YES",
                precision=int(prec) if prec is not None else None,
                scale=int(scale) if scale is not None else None,
                default=default,
                extra=str(extra or ""),
                octets=int(octets) if octets is not None else None,
                position=int(at),
            )
        )
    return out


def indexes(session: Session, database: str, tables: Sequence[str]) -> dict[str, list[Index]]:
    """The indexes of each table, key columns in index order."""
    if not tables:
        return {}
    names = ", ".join(session.literal(t) for t in tables)
    q = (
        "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, COLUMN_NAME"
        " FROM information_schema.STATISTICS"
        f" WHERE TABLE_SCHEMA = {session.literal(database)} AND TABLE_NAME IN ({names})"
        " ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX"
    )
    grouped: dict[tuple[str, str], list[tuple[str, str | None]]] = defaultdict(list)
    for table, index, non_unique, column in session.rows(q, "reading indexes"):
        grouped[(str(table), str(index))].append((str(non_unique), column))
    out: dict[str, list[Index]] = defaultdict(list)
    for (table, index), parts in grouped.items():
        out[table].append(Index(index, parts[0][0] == "0", tuple(c for _, c in parts)))
    return out


def column_record(cols: Sequence[SourceColumn]) -> dict[str, list[object]]:
    """What a binlog checkpoint keeps of each column (``columns``): enough to plan it
    again once the table no longer has it (:func:`recorded_columns`)."""
    return {
        c.name: [c.data_type, c.column_type, c.nullable, c.precision, c.scale, c.octets]
        for c in cols
    }


def recorded_columns(state: Mapping[str, object] | None) -> list[SourceColumn]:
    """The columns a checkpoint recorded (none before checkpoints recorded them).

    A change logged before an ``ALTER TABLE ... DROP COLUMN`` names the
    dropped column with its value; the catalog no longer has it when the
    read starts, and its plan comes from here.
    """
    kept = (state or {}).get("columns")
    if not isinstance(kept, Mapping):
        return []
    out = []
    for name, (data_type, column_type, nullable, precision, scale, octets) in kept.items():
        out.append(
            SourceColumn(
                str(name),
                str(data_type),
                str(column_type),
                bool(nullable),
                precision,
                scale,
                octets=octets,
            )
        )
    return out


def column_plans(
    cols: Sequence[SourceColumn], casts: Mapping[str, str] | None = None, table: str | None = None
) -> list[ColumnPlan]:
    """The read plan of every column (casts applied) of ``table``."""
    casts = casts or {}
    unknown = sorted(set(casts) - {c.name for c in cols})
    if unknown:
        raise ConfigError(
            f"a cast names column {unknown[0]!r}, which the table does not have",
            hint="fix the casts option",
            column=unknown[0],
        )
    return [dataclasses.replace(plan_column(c, casts.get(c.name)), table=table) for c in cols]


def keys(
    idx: Sequence[Index], plans: Sequence[ColumnPlan]
) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(primary key, unique keys): unique indexes over plain NOT NULL columns only.

    A UNIQUE index lets many rows hold NULL, and an expression part proves
    nothing about the columns.
    """
    nullable = {p.name: p.nullable for p in plans}
    primary: tuple[str, ...] = ()
    unique: list[tuple[str, ...]] = []
    for i in idx:
        if not i.unique or any(c is None for c in i.columns):
            continue
        cols = tuple(c for c in i.columns if c is not None)
        if i.name == "PRIMARY":
            primary = cols
        elif not any(nullable.get(c, True) for c in cols):
            unique.append(cols)
    return primary, tuple(unique)


def cursor_evidence(
    col: SourceColumn, plan: ColumnPlan, idx: Sequence[Index]
) -> CursorCandidate | None:
    """A cursor candidate with what the catalog proves about ``col``; None without proof.

    Proof is ``AUTO_INCREMENT``, or, for a temporal column, a clock default
    or ``ON UPDATE CURRENT_TIMESTAMP``.
    """
    if not plan.orderable:
        return None
    facts: list[str] = []
    extra = col.extra.lower()
    default = (col.default or "").strip().lower()
    if "auto_increment" in extra:
        facts.append(
            "auto_increment: the server issues increasing values when an insert omits the "
            "column, an insert may still supply its own"
        )
    if plan.temporal and "on update current_timestamp" in extra:
        facts.append(
            "ON UPDATE CURRENT_TIMESTAMP: the server sets it on every update that changes the "
            "row, unless the update assigns it"
        )
    if plan.temporal and default.startswith(_CLOCK_DEFAULTS):
        facts.append(f"default {col.default}: set when an insert omits the column")
    if not facts:
        return None
    facts.append("not null" if not col.nullable else _NULLABLE_EVIDENCE)
    leading = [i.name for i in idx if i.columns[:1] == (col.name,)]
    facts.append(f"leads index {leading[0]}" if leading else "no index leads with it")
    facts.append(
        "values are assigned when a row is written, not when its transaction commits: "
        "a row can become visible after a larger value, so declare a lookback"
    )
    on_update = plan.temporal and "on update current_timestamp" in extra
    return CursorCandidate(col.name, "; ".join(facts), maintained_on_update=on_update)


def describe(
    rel: Relation,
    cols: Sequence[SourceColumn],
    idx: Sequence[Index],
    casts: Mapping[str, str] | None = None,
) -> DatasetDiscovery:
    """The discovery of one relation, its declared casts applied to its fields' types."""
    plans = column_plans(cols, casts, rel.table)
    fields = tuple(
        FieldInfo(
            c.name,
            p.arrow_type_text,
            c.column_type,
            c.nullable,
            # (the table's position: one the account may not read still counts)
            f"position {c.position or i} {c.column_type}",
        )
        for i, (c, p) in enumerate(zip(cols, plans, strict=True), 1)
    )
    primary, unique = keys(idx, plans)
    candidates = tuple(
        cand
        for c, p in zip(cols, plans, strict=True)
        if (cand := cursor_evidence(c, p, idx)) is not None
    )
    cursor_ok = any(p.orderable for p in plans)
    # The binlog's full row images name a row by a declared key: a primary
    # key or a unique one over NOT NULL columns, of a table a consistent
    # snapshot covers (the stitched first capture), not system-versioned.
    cdc_ok = (
        rel.kind == "table" and rel.transactional and not rel.versioned and bool(primary or unique)
    )
    strategies: tuple[Strategy, ...] = ("snapshot", "cursor") if cursor_ok else ("snapshot",)
    return DatasetDiscovery(
        name=rel.name,
        relation=rel.name,
        kind=rel.kind,
        fields=fields,
        primary_key=primary,
        unique_keys=unique,
        cursor_candidates=candidates,
        strategies=(*strategies, "cdc") if cdc_ok else strategies,
        # TABLE_ROWS is InnoDB's estimate; a view has none.
        estimated_rows=rel.rows if rel.kind == "table" else None,
    )
