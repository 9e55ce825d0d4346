"""Catalog queries: relations, columns, types, keys, and cursor evidence.

Relation names are ``schema.table`` taken literally (no case folding, so the
names discovery reports work as they are); a part that holds a dot or a
double quote is written in double quotes. A bare ``table`` means
``public.table``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from combined.connectors._shared import split_qualified
from combined.connectors.abc import CursorCandidate, DatasetDiscovery, FieldInfo, Strategy
from combined.connectors.postgres._connect import Session
from combined.connectors.postgres._types import (
    ColumnPlan,
    PgType,
    plan_column,
)
from combined.errors import NotFoundError

_KINDS = {"r": "table", "p": "table", "v": "view", "m": "materialized_view", "f": "foreign_table"}
_CLOCK_DEFAULTS = (
    "now()",
    "CURRENT_TIMESTAMP",
    "clock_timestamp()",
    "statement_timestamp()",
    "transaction_timestamp()",
    "LOCALTIMESTAMP",
    "CURRENT_DATE",
)
# pg_trigger.tgtype bits
_ROW, _BEFORE, _INSERT, _UPDATE = 1, 2, 4, 16


def parse_relation(text: str) -> tuple[str, str]:
    """``schema.table`` (or bare ``table`` in ``public``) as (schema, table)."""
    parts = split_qualified(
        text, '"', 'name it schema.table (quote a part holding a dot: "my.schema".table)'
    )
    return ("public", parts[0]) if len(parts) == 1 else (parts[0], parts[1])


def relation_name(schema: str, table: str) -> str:
    """The ``schema.table`` text that :func:`parse_relation` reads back."""

    def part(p: str) -> str:
        return '"' + p.replace('"', '""') + '"' if ("." in p or '"' in p) else p

    return f"{part(schema)}.{part(table)}"


#: A nullable cursor candidate: what becomes of its NULLs is the dataset's choice.
_NULLABLE_EVIDENCE = (
    "nullable: a row with a null is in no cursor window, cursor.nulls decides "
    "(fail, include or exclude)"
)


@dataclass(frozen=True, slots=True)
class Relation:
    """One readable relation.

    ``reltuples`` is the estimate of what a read returns: for a table with
    partitions or inheritance children, theirs included. ``parents`` are the
    tables it inherits from (never a partitioned table: discovery leaves
    partitions out), ``children`` the tables directly below it.
    """

    oid: int
    schema: str
    table: str
    kind: str
    reltuples: float
    parents: tuple[str, ...] = ()
    children: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The dataset name (``schema.table``)."""
        return relation_name(self.schema, self.table)

    @property
    def ident(self) -> sql.Identifier:
        """The quoted ``"schema"."table"`` to use in SQL."""
        return sql.Identifier(self.schema, self.table)


@dataclass(frozen=True, slots=True)
class Column:
    """One ``pg_attribute`` row with its default."""

    relid: int
    num: int
    name: str
    typoid: int
    typmod: int
    notnull: bool
    source_type: str
    identity: str
    generated: str
    default: str | None


def _oid_array(oids: Iterable[int]) -> sql.Composable:
    text = "{" + ",".join(str(int(o)) for o in sorted(set(oids))) + "}"
    return sql.SQL("CAST({} AS oid[])").format(sql.Literal(text))


# A read of a table with partitions or inheritance children returns theirs
# too: its estimate sums every table below it that holds rows (a partitioned
# table holds none; its own reltuples, once analyzed, already is the total).
def _tables_below(root: str) -> str:
    """SQL: ``WITH`` table ``d(oid, depth)``, the relation ``root`` and every table below it."""
    return (
        f"WITH RECURSIVE d(oid, depth) AS (SELECT {root}, 0 UNION ALL"
        " SELECT i.inhrelid, d.depth + 1 FROM pg_inherits i JOIN d ON i.inhparent = d.oid"
        " WHERE d.depth < 64)"
    )


def _part(expr: str) -> str:
    """SQL of :func:`relation_name`'s quoting of one name part."""
    quoted = f"""'"' || replace({expr}, '"', '""') || '"'"""
    return f"""CASE WHEN {expr} ~ '[."]' THEN {quoted} ELSE {expr} END"""


_NAME_OF_K = f"{_part('kn.nspname::text')} || '.' || {_part('k.relname::text')}"
_RELATION_COLUMNS = sql.SQL(
    "SELECT c.oid::bigint, n.nspname::text, c.relname::text, c.relkind::text,"
    " CASE WHEN c.relhassubclass THEN ("
    + _tables_below("c.oid")
    + " SELECT COALESCE(sum(k.reltuples)"
    "   FILTER (WHERE k.reltuples >= 0 AND k.relkind <> 'p'), -1)"
    "   FROM d JOIN pg_class k ON k.oid = d.oid) ELSE c.reltuples END::float8,"
    " ARRAY(SELECT " + _NAME_OF_K + " FROM pg_inherits i"
    "   JOIN pg_class k ON k.oid = i.inhparent JOIN pg_namespace kn ON kn.oid = k.relnamespace"
    "   WHERE i.inhrelid = c.oid AND NOT c.relispartition ORDER BY i.inhseqno),"
    " ARRAY(SELECT " + _NAME_OF_K + " FROM pg_inherits i"
    "   JOIN pg_class k ON k.oid = i.inhrelid JOIN pg_namespace kn ON kn.oid = k.relnamespace"
    "   WHERE i.inhparent = c.oid ORDER BY kn.nspname, k.relname)"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')"
)


def _relation(row: Sequence[Any]) -> Relation:
    oid, schema, table, kind, reltuples, parents, children = row
    return Relation(
        oid, schema, table, kind, reltuples, tuple(parents or ()), tuple(children or ())
    )


def find_relation(session: Session, name: str) -> Relation:
    """The relation named ``name``; :class:`NotFoundError` when it does not exist."""
    schema, table = parse_relation(name)
    q = _RELATION_COLUMNS + sql.SQL(" AND n.nspname = {} AND c.relname = {}").format(
        sql.Literal(schema), sql.Literal(table)
    )
    rows = session.rows(q, "looking up the relation")
    if not rows:
        raise NotFoundError(
            f"relation {relation_name(schema, table)!r} does not exist",
            hint=_elsewhere(session, name, table)
            or "`combined discover SOURCE` lists the relations (names are case-sensitive)",
            relation=relation_name(schema, table),
        )
    return _relation(rows[0])


def find_relations(session: Session, names: Sequence[str]) -> list[Relation]:
    """The relations named ``names``, in their order, read in one query.

    As :func:`find_relation` for each (its :class:`NotFoundError` for the first
    name that does not exist), without a round trip to the server a name: a
    source of hundreds of tables is checked at once.
    """
    wanted = [parse_relation(name) for name in names]
    if not wanted:
        return []
    q = _RELATION_COLUMNS + sql.SQL(
        " AND (n.nspname, c.relname) IN"
        " (SELECT * FROM unnest(CAST({} AS text[]), CAST({} AS text[])))"
    ).format(sql.Literal([s for s, _ in wanted]), sql.Literal([t for _, t in wanted]))
    found = {(r[1], r[2]): _relation(r) for r in session.rows(q, "looking up the relations")}
    for name, key in zip(names, wanted, strict=True):
        if key not in found:
            find_relation(session, name)  # (raises, with its hint)
    return [found[key] for key in wanted]


#: The storage and cumulative write counters of a relation and every table below
#: it (partitions, inheritance children), from the server's statistics.
_MARKER = (
    _tables_below("{oid}::oid")
    + " SELECT current_setting('track_counts') = 'on', pg_postmaster_start_time()::text,"
    " bool_and(k.relkind IN ('r', 'p', 'm')),"
    " string_agg(concat_ws('.', d.oid, pg_relation_filenode(d.oid),"
    " pg_stat_get_tuples_inserted(d.oid), pg_stat_get_tuples_updated(d.oid),"
    " pg_stat_get_tuples_deleted(d.oid)), ',' ORDER BY d.oid)"
    " FROM d JOIN pg_class k ON k.oid = d.oid"
)


def change_marker(session: Session, rel: Relation) -> str | None:
    """A text that moves whenever ``rel``'s rows may have: storage and write counters.

    A table's own, or a partitioned (or inherited) table's and each of its
    partitions' (children's): an attached or detached partition changes it
    too. A view's is the marker of every table it reads (through other views
    too) with each view's definition. A hint, never proof: statistics reach
    the counters up to seconds after a write commits, and TRUNCATE counts no
    row (it gives the table new storage, which the marker holds). None for a
    table with a foreign partition, a server that keeps no counts, and a
    view that reads a foreign table or the clock, or calls a volatile function.
    """
    if rel.kind == "v":
        return _view_marker(session, rel)
    if rel.kind not in ("r", "p", "m"):
        return None
    query = sql.SQL(_MARKER).format(oid=sql.Literal(rel.oid))
    counting, started, local, tables = session.rows(query, "reading the table's statistics")[0]
    if not (counting and local and tables):
        return None
    return f"pg2:{started}:{tables}"


#: A view's rows follow from the relations its rules read (``pg_depend`` of its
#: ``pg_rewrite`` rule), recursively through views: each with its kind, a view's
#: definition, and whether a rule reads the clock or calls a volatile function
#: or one of a user's own that is not immutable (the functions a rule calls are
#: found in its node tree: ``pg_depend`` records no built-in one).
_VIEW_READS = """
WITH RECURSIVE v(oid, depth) AS (
  SELECT {oid}::oid, 0
  UNION
  SELECT dep.refobjid, v.depth + 1 FROM v
  JOIN pg_rewrite r ON r.ev_class = v.oid
  JOIN pg_depend dep ON dep.classid = 'pg_rewrite'::regclass AND dep.objid = r.oid
   AND dep.refclassid = 'pg_class'::regclass AND dep.refobjid <> v.oid
  WHERE v.depth < 32
)
SELECT k.oid::bigint, k.relkind::text,
       CASE WHEN k.relkind = 'v' THEN pg_get_viewdef(k.oid) END,
       EXISTS (SELECT 1 FROM pg_rewrite r
               WHERE r.ev_class = k.oid AND r.ev_action::text LIKE '%{{SQLVALUEFUNCTION%')
       OR EXISTS (SELECT 1 FROM pg_rewrite r,
               regexp_matches(r.ev_action::text, ':(?:funcid|opfuncid|aggfnoid|winfnoid) (\\d+)',
                              'g') AS m(fid)
               JOIN pg_proc f ON f.oid = m.fid[1]::oid
               WHERE r.ev_class = k.oid AND (f.provolatile = 'v' OR f.provolatile = 's'
                 AND (f.oid >= 16384 OR f.proname = ANY({clock}))))
FROM (SELECT DISTINCT oid FROM v) AS d JOIN pg_class k ON k.oid = d.oid
ORDER BY k.oid
"""

#: Built-in stable functions whose value moves with time, not with a write.
_CLOCK = ["now", "transaction_timestamp", "statement_timestamp", "age", "timeofday"]


def _view_marker(session: Session, view: Relation) -> str | None:
    """The marker of a view: its tables' markers and each view's definition (or None)."""
    reads = session.rows(
        sql.SQL(_VIEW_READS).format(oid=sql.Literal(view.oid), clock=sql.Literal(_CLOCK)),
        "reading the view's tables",
    )
    marks, definitions = [], []
    for oid, kind, definition, volatile in reads:
        if volatile or kind not in ("v", "r", "p", "m"):
            # (a foreign table, a sequence, the clock, a volatile function or a
            # function of one's own that may read tables: no counters tell)
            return None
        if kind == "v":
            definitions.append(f"{oid}:{definition}")
            continue
        table = Relation(oid, "", "", kind, -1.0, (), ())
        mark = change_marker(session, table)
        if mark is None:
            return None
        marks.append(mark)
    if not marks:
        return None  # (a view of constants or functions alone)
    text = "\n".join(definitions)
    return f"pgv1:{hashlib.sha256(text.encode()).hexdigest()[:32]}:{';'.join(marks)}"


def _elsewhere(session: Session, name: str, table: str) -> str | None:
    """For a bare name (read in ``public``): the relations of that name in other schemas."""
    if len(split_qualified(name, '"', "")) != 1:
        return None
    q = _RELATION_COLUMNS + sql.SQL(" AND c.relname = {} ORDER BY n.nspname").format(
        sql.Literal(table)
    )
    found = [relation_name(r[1], r[2]) for r in session.rows(q, "looking up the relation")]
    if not found:
        return None
    return (
        "a bare name is a relation of schema public; name the one to capture with its "
        f"schema: {', '.join(found[:5])}"
    )


def list_relations(session: Session, schemas: Sequence[str]) -> list[Relation]:
    """Tables, views, materialized views and foreign tables the role can SELECT.

    Partitions of a partitioned table are left out: the parent reads them.
    """
    q = _RELATION_COLUMNS + sql.SQL(
        " AND n.nspname = ANY(CAST({} AS text[])) AND NOT c.relispartition"
        " AND has_table_privilege(c.oid, 'SELECT') ORDER BY 2, 3"
    ).format(sql.Literal(list(schemas)))
    return [_relation(r) for r in session.rows(q, "listing relations")]


def columns(session: Session, relids: Iterable[int]) -> dict[int, list[Column]]:
    """The live columns of each relation, in attribute order."""
    q = sql.SQL(
        "SELECT a.attrelid::bigint, a.attnum::int, a.attname::text, a.atttypid::bigint,"
        " a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod),"
        " a.attidentity::text, a.attgenerated::text, pg_get_expr(d.adbin, d.adrelid)"
        " FROM pg_attribute a LEFT JOIN pg_attrdef d"
        " ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = ANY({}) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2"
    ).format(_oid_array(relids))
    out: dict[int, list[Column]] = defaultdict(list)
    for row in session.rows(q, "reading columns"):
        out[row[0]].append(Column(*row))
    return out


def load_types(session: Session, oids: Iterable[int]) -> dict[int, PgType]:
    """``pg_type`` rows for ``oids`` and, transitively, their bases and elements."""
    types: dict[int, PgType] = {}
    todo = set(oids)
    while todo:
        q = sql.SQL(
            "SELECT t.oid::bigint, format_type(t.oid, NULL), t.typtype::text,"
            " t.typcategory::text, t.typbasetype::bigint, t.typtypmod, t.typelem::bigint"
            " FROM pg_type t WHERE t.oid = ANY({})"
        ).format(_oid_array(todo))
        for row in session.rows(q, "reading types"):
            types[row[0]] = PgType(*row)
        todo = {
            o for t in types.values() for o in (t.basetype, t.elem) if o and o not in types
        } - todo
    return types


def column_plans(
    cols: Sequence[Column], types: Mapping[int, PgType], casts: Mapping[str, str] | None = None
) -> list[ColumnPlan]:
    """The read plan of every column (casts applied)."""
    casts = casts or {}
    return [
        plan_column(c.name, c.typoid, c.typmod, c.source_type, types, casts.get(c.name))
        for c in cols
    ]


@dataclass(frozen=True, slots=True)
class Index:
    """One index of a relation, by its key column names."""

    relid: int
    name: str
    primary: bool
    unique: bool
    columns: tuple[str, ...]
    partial: bool
    expressions: bool
    method: str
    #: Whether every key column is indexed under its own collation: an index
    #: under another one ("C" for a case-insensitive column) holds apart
    #: values that the column compares equal, so it proves no order tie-free.
    own_collations: bool = True


def indexes(session: Session, relids: Iterable[int]) -> dict[int, list[Index]]:
    """The indexes of each relation (key columns only, in index order)."""
    q = sql.SQL(
        "SELECT i.indrelid::bigint, ci.relname::text, i.indisprimary, i.indisunique,"
        " ARRAY(SELECT a.attname::text FROM unnest(CAST(i.indkey AS int2[]))"
        "   WITH ORDINALITY AS k(attnum, ord) JOIN pg_attribute a"
        "   ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        "   WHERE k.ord <= i.indnkeyatts ORDER BY k.ord),"
        " i.indpred IS NOT NULL, i.indexprs IS NOT NULL, am.amname::text,"
        " NOT EXISTS (SELECT FROM unnest(CAST(i.indkey AS int2[]),"
        "   CAST(i.indcollation AS oid[])) WITH ORDINALITY AS k(attnum, coll, ord)"
        "   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        "   WHERE k.ord <= i.indnkeyatts AND k.coll <> a.attcollation)"
        " FROM pg_index i JOIN pg_class ci ON ci.oid = i.indexrelid"
        " JOIN pg_am am ON am.oid = ci.relam"
        " WHERE i.indrelid = ANY({}) AND i.indisvalid ORDER BY 1, 2"
    ).format(_oid_array(relids))
    out: dict[int, list[Index]] = defaultdict(list)
    for rel, name, prim, uniq, cols, partial, exprs, method, own in session.rows(
        q, "reading indexes"
    ):
        out[rel].append(
            Index(rel, name, prim, uniq, tuple(cols or ()), partial, exprs, method, own)
        )
    return out


@dataclass(frozen=True, slots=True)
class Trigger:
    """One user trigger of a relation."""

    relid: int
    name: str
    function: str
    tgtype: int
    enabled: bool


def triggers(session: Session, relids: Iterable[int]) -> dict[int, list[Trigger]]:
    """The enabled user (non-internal) triggers of each relation."""
    q = sql.SQL(
        "SELECT t.tgrelid::bigint, t.tgname::text, p.proname::text, t.tgtype::int,"
        " t.tgenabled::text <> 'D' FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        " WHERE NOT t.tgisinternal AND t.tgrelid = ANY({}) ORDER BY 1, 2"
    ).format(_oid_array(relids))
    out: dict[int, list[Trigger]] = defaultdict(list)
    for row in session.rows(q, "reading triggers"):
        out[row[0]].append(Trigger(*row))
    return out


def keys(idx: Sequence[Index]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(primary key, unique keys) from full, non-partial unique indexes."""
    primary: tuple[str, ...] = ()
    unique: list[tuple[str, ...]] = []
    for i in idx:
        if not i.unique or i.partial or i.expressions or not i.columns:
            continue
        if i.primary:
            primary = i.columns
        else:
            unique.append(i.columns)
    return primary, tuple(unique)


def cursor_evidence(
    col: Column, plan: ColumnPlan, idx: Sequence[Index], trig: Sequence[Trigger]
) -> CursorCandidate | None:
    """A cursor candidate with what the catalog proves about ``col``; None without proof.

    Proof is a sequence (identity or ``nextval`` default), a clock default,
    or, for a temporal column, a BEFORE row trigger (which the catalog cannot
    show assigns this column: the evidence says so).
    """
    if not (plan.orderable_number or plan.temporal) or plan.route == "unsupported":
        return None
    facts: list[str] = []
    default = (col.default or "").strip()
    if col.identity == "a":
        facts.append("identity column (GENERATED ALWAYS): its sequence issues every value")
    elif col.identity == "d":
        facts.append(
            "identity column (GENERATED BY DEFAULT): its sequence issues values when an "
            "insert omits the column, an insert may still supply its own"
        )
    elif default.startswith("nextval("):
        facts.append(
            f"default {default}: a sequence issues values when an insert omits the column, "
            "an insert may still supply its own"
        )
    if plan.temporal and default in _CLOCK_DEFAULTS:
        facts.append(
            f"default {default}: set when an insert omits the column; "
            "no default maintains it on update"
        )
    on_update = False
    if plan.temporal:
        for t in trig:
            if t.enabled and t.tgtype & _ROW and t.tgtype & _BEFORE and t.tgtype & _UPDATE:
                on_update = True
                events = "INSERT OR UPDATE" if t.tgtype & _INSERT else "UPDATE"
                facts.append(
                    f"BEFORE {events} row trigger {t.name} (function {t.function}) may "
                    "maintain it: the catalog cannot prove which columns the function assigns"
                )
    if not facts:
        return None
    facts.append("not null" if col.notnull else _NULLABLE_EVIDENCE)
    leading = [i.name for i in idx if i.method == "btree" and i.columns[:1] == (col.name,)]
    facts.append(f"leads btree index {leading[0]}" if leading else "no btree index leads with it")
    facts.append(
        "values are assigned when a row is written, not when its transaction commits: "
        "a row can become visible after a larger value, so declare a lookback"
    )
    return CursorCandidate(col.name, "; ".join(facts), maintained_on_update=on_update)


def describe(
    rel: Relation,
    cols: Sequence[Column],
    types: Mapping[int, PgType],
    idx: Sequence[Index],
    trig: Sequence[Trigger],
    casts: Mapping[str, str] | None = None,
) -> DatasetDiscovery:
    """The discovery of one relation, its declared casts applied to its fields' types."""
    plans = column_plans(cols, types, casts)
    fields = tuple(
        FieldInfo(
            c.name, p.arrow_type_text, c.source_type, not c.notnull, identity=f"attnum {c.num}"
        )
        for c, p in zip(cols, plans, strict=True)
    )
    primary, unique = keys(idx)
    candidates = tuple(
        cand
        for c, p in zip(cols, plans, strict=True)
        if (cand := cursor_evidence(c, p, idx, trig)) is not None
    )
    # The cursor strategy needs one orderable column; a declared key (not
    # only a discovered one) serves incremental merges, so every sync mode stays.
    cursor_ok = any(p.orderable_number or p.temporal for p in plans)
    # A change stream carries a table's own rows (not an inheritance child's),
    # and its updates and deletes name a row by the primary key.
    cdc_ok = rel.kind in ("r", "p") and not rel.children and bool(primary)
    strategies: tuple[Strategy, ...] = ("snapshot", "cursor") if cursor_ok else ("snapshot",)
    return DatasetDiscovery(
        name=rel.name,
        relation=rel.name,
        kind=_KINDS.get(rel.kind, rel.kind),
        fields=fields,
        primary_key=primary,
        unique_keys=unique,
        cursor_candidates=candidates,
        strategies=(*strategies, "cdc") if cdc_ok else strategies,
        # reltuples is -1 until the relation is first vacuumed or analyzed; a
        # view has no storage to estimate.
        estimated_rows=int(rel.reltuples) if rel.reltuples >= 0 and rel.kind in "rpmf" else None,
        notes=notes(rel),
    )


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def notes(rel: Relation) -> tuple[str, ...]:
    """What reading ``rel`` means when other tables' rows are involved.

    A read of a partitioned table or of an inheritance parent returns the
    rows of every table below it. Partitions are not listed (the table reads
    them); inheritance children are, since they are tables of their own: a
    child captured next to its parent is captured twice.
    """
    out: list[str] = []
    if rel.kind == "p":
        out.append(
            f"partitioned table: a read returns the rows of its {len(rel.children)} "
            "partitions, which are not listed on their own"
        )
    elif rel.children:
        out.append(
            f"inheritance parent of {_listed(rel.children)}: a read returns their rows too, "
            "so capture it or them, not both; its change stream carries only its own rows, "
            "so strategy cdc is refused"
        )
    if rel.parents:
        out.append(
            f"inherits from {_listed(rel.parents)}, whose reads return this table's rows "
            "too: capture one or the other, not both"
        )
    return tuple(out)
