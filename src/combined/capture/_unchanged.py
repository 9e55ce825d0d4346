"""Fill the TOAST values a change stream marked unchanged, out of core.

An update that leaves an out-of-line (TOAST) value alone does not carry it:
the stream names the column in ``_combined_unchanged`` instead. Before the
capture is reduced, each marked value is filled from the newest earlier
change of the same row in the capture, else from the lake's current row;
it is never written as null.

Only the marked rows' values are materialised: a narrow table of every
staged row's (ordinal, id, operation, marks, lineage), then, per marked
column, the values it takes (one as-of join within a lineage, one lookup of
the lake's rows of those ids). The staged rows then stream past one table
of the fills, joined by ordinal. Memory holds the fills (the values the
stream left out), never the capture's full rows: a backlog of any size
drains within the reduction's memory, spilling past it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from combined.capture._databases import files_sql, lit, spill_directory
from combined.capture._fill_file import fills_file, in_file, one_thread, write_fills
from combined.capture._lake_fills import (
    EventLake,
    is_bytes,
    lake_numbers_rows,
    newest_events,
    register_sequences,
    write_lake_values,
    write_staged_values,
)
from combined.delivery import ELEMENT_BYTES
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import duckdb

#: A change stream's list of columns whose (TOAST) value the change left as it was.
UNCHANGED = prov.UNCHANGED

_ORD = "_combined_ordinal"

#: DuckDB memory, in MB, while staged rows with filled values are delivered
#: part by part (plus the reduction's ``FILL_JOIN_MB`` for each filled
#: column): the rest of the reduction's memory only cached the tables their
#: windows are read from (the fills, the transition). A backlog of 500k wide
#: TOAST-unchanged updates peaked in its Deliveries with DuckDB at its 72 MB
#: (412-429 MB); at 40 MB the process peaked at 384-393 MB, CPU-seconds
#: within the noise, and at 24 MB its 8 MB windows of fills failed
#: (bench/RESULTS.md).
FILLED_OUTPUT_MB = 32
#: DuckDB memory, in KB, each filled column adds to a statement over the filled
#: rows: a 1,100-column table's column added with a default fills 1,100 columns
#: in one join; hashing its rows failed at 68 MB and passed at 64 KB a column
#: (141 MB). Twice that leaves room for wider values.
FILLED_COLUMN_KB = 128
#: DuckDB memory, in MB, a statement reading fills held in a file adds for each:
#: its Parquet reader's buffers (a window of filled lists of 500 short strings
#: failed its delivery at 32 MB plus its join's, and passed with 8 more).
FILL_FILE_MB = 8
#: One row's fills (bytes as text) past which its window is not bounded by
#: ``FILL_WINDOW_BYTES``: the output keeps the reduction's memory (a row's
#: 15 MB value failed at 40 MB).
LARGE_FILL_BYTES = 1 << 20


def any_marked(con: duckdb.DuckDBPyConnection, staged: str, *, deletes: bool = False) -> bool:
    """Whether a staged row (a delete, with ``deletes``: a key's move) names columns."""
    where = f"{quote_ident(prov.OP)} = 'delete' AND " if deletes else ""
    (found,) = con.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {staged} "
        f"WHERE {where}coalesce(len({UNCHANGED}), 0) > 0 LIMIT 1)"
    ).fetchall()[0]
    return bool(found)


@dataclass(frozen=True, slots=True)
class Resolved:
    """How staged rows read with their marked values filled (the view ``res``)."""

    #: The SELECT list over the rows ``r`` and their fills ``f0``, ``f1``, ...
    columns: str
    #: The SQL of a row's id.
    id_expr: str
    #: The tables of the filled values, one a group of columns the same changes
    #: mark: ``unc_fill_<n>(ord, v0, v1, ...)``.
    fills: tuple[str, ...] = ()
    #: The ordinals where a window of at most ``FILL_WINDOW_BYTES`` of fills starts.
    cuts: tuple[int, ...] = ()
    #: The largest fills (bytes as text) of one row: a window holds at most
    #: ``FILL_WINDOW_BYTES`` and one row's more.
    widest: int = 0
    #: The columns filled, one a table of ``fills``.
    marked: tuple[str, ...] = ()
    #: The SELECT list over ``r`` of a row no change marks: every column as staged.
    plain: str = ""
    #: How many of ``fills`` are views of a file (:mod:`._fill_file`), not tables.
    in_files: int = 0

    @property
    def filled(self) -> bool:
        """Whether any value was filled."""
        return bool(self.fills)

    def output_mb(self, per_column: int) -> int | None:
        """DuckDB's memory (MB) for delivering the filled rows, or None: the reduction's.

        Each staged part meets its own transition rows and, a column at a
        time (``per_column`` MB for each join), one window of fills: at most
        ``FILL_WINDOW_BYTES`` and one row's more.
        """
        if not self.fills or self.widest > LARGE_FILL_BYTES:
            return None
        return FILLED_OUTPUT_MB + self.join_mb(per_column)

    def join_mb(self, per_join: int) -> int:
        """DuckDB memory (MB) the fills add to a statement over the filled rows.

        ``per_join`` for each fill table's join, ``FILL_FILE_MB`` more for each
        read from a file, and ``FILLED_COLUMN_KB`` for each filled column (its
        vectors, and the text its hash builds).
        """
        joins = per_join * len(self.fills) + FILL_FILE_MB * self.in_files
        return joins + -(-len(self.marked) * FILLED_COLUMN_KB // 1024)

    def large(self) -> tuple[str, ...]:
        """The filled columns, where a row's fills exceed ``LARGE_FILL_BYTES`` (else none)."""
        return self.marked if self.widest > LARGE_FILL_BYTES else ()

    def sql(
        self, relation: str, ordinals: tuple[int, int] | None = None, plain: str | None = None
    ) -> str:
        """The rows of ``relation`` filled; ``ordinals``: the (lowest, highest) they hold.

        Each join builds its hash table on a column's fills (the rows stream
        past them); given ``ordinals``, on the fills of those rows only: a
        part of the capture meets its own fills, never the whole backlog's.
        ``plain``: the same rows, read apart: those no change marks are read
        from it, never joined (DuckDB gathers a join's short output chunks
        into vectors of up to 2,048 rows, so a join reads slices of 65 rows
        at least: of 300 kB rows that no fill concerns, 130 MB more at the peak).
        """
        within = "true" if ordinals is None else f"{_ORD} BETWEEN {ordinals[0]} AND {ordinals[1]}"
        marks = f"coalesce(len({UNCHANGED}), 0) > 0"
        rows = f"(SELECT *, {self.id_expr} AS _cid FROM {relation} WHERE {within}"
        if plain is None or not self.fills:
            return self._joined(f"{rows}) r", ordinals)
        unmarked = (
            f"(SELECT *, {self.id_expr} AS _cid FROM {plain} WHERE {within} AND NOT {marks}) r"
        )
        return f"SELECT {self.plain} FROM {unmarked} UNION ALL " + self._joined(
            f"{rows} AND {marks}) r", ordinals
        )

    def _joined(self, rows: str, ordinals: tuple[int, int] | None = None) -> str:
        """The SQL of ``rows`` (aliased ``r``) joined with their fills."""
        sql = f"SELECT {self.columns} FROM {rows}"
        for n, table in enumerate(self.fills):
            if ordinals is not None:
                table = f"(SELECT * FROM {table} WHERE ord BETWEEN {ordinals[0]} AND {ordinals[1]})"
            sql += f" LEFT JOIN {table} f{n} ON f{n}.ord = r.{_ORD}"
        return sql


def resolve_unchanged(
    con: duckdb.DuckDBPyConnection,
    *,
    staged: str,
    names: Sequence[str],
    payload: Sequence[str],
    id_expr: str,
    current_files: Sequence[str],
    open_file: Callable[[str], Any] = str,
    staged_parts: tuple[Sequence[Path], pa.Schema] | None = None,
    events: Callable[[], EventLake] | None = None,
) -> Resolved:
    """Create the view ``res``: the staged rows with their marked values filled.

    ``staged`` is the staged rows' relation (of columns ``names``),
    ``payload`` the source's columns, ``id_expr`` the SQL of a row's id. The
    view holds ``payload``, the other staged columns and ``_cid``; the
    returned :class:`Resolved` reads any part of the staged rows the same way.
    ``open_file`` opens a lake file for Arrow (``LakeStore.open_input``);
    ``staged_parts``: the staged files of ``staged`` and their schema, for Arrow.
    ``events``: the lake of an event stream (``sync_mode: append``), its files
    in place of ``current_files``, listed only when a change marks a value:
    each id's newest event stands for its current row (``newest_events``, by
    its Delivery's sequence).
    """
    rest = ", ".join(f"r.{quote_ident(n)}" for n in names if n not in payload)
    as_staged = ", ".join(f"r.{quote_ident(c)}" for c in payload)
    plain = f"{as_staged}, {rest}, r._cid"
    if not any_marked(con, staged):
        resolved = Resolved(plain, id_expr, plain=plain)
        con.execute(f"CREATE VIEW res AS {resolved.sql(staged)}")
        return resolved
    _lineage_table(con, staged, id_expr)
    lake_events = events() if events is not None else None
    if lake_events is not None:
        current_files = lake_events.files
    lake = f"read_parquet({files_sql(current_files)}, union_by_name = true)"
    # The lake's own columns only: one the capture added has no lake value.
    in_lake = _types(con, lake) if current_files else {}
    numbered = lake_numbers_rows(list(in_lake))
    if lake_events is not None and current_files:
        sequenced = prov.DELIVERY_ID in in_lake
        if sequenced:
            register_sequences(con, lake_events.sequences)
        lake = newest_events(current_files, numbered=numbered, sequenced=sequenced)
    staged_types = _types(con, staged)
    marked = _marked(con, payload)
    groups = _marked_alike(con, marked)
    fills = [
        _fill_group(
            con,
            n,
            [_Fill(c, c in in_lake, _cast_to(staged_types[c], in_lake.get(c))) for c in group],
            staged=staged,
            lake=lake,
            current_files=current_files,
            lake_rows=open_file if numbered else None,
            staged_parts=staged_parts,
            events=events is not None,
        )
        for n, group in enumerate(groups)
    ]
    con.execute("DROP TABLE unc_lin")
    con.execute("DROP TABLE IF EXISTS unc_seq")
    cols = _filled_columns(payload, groups)
    cuts, widest = _cuts(con, [name for name, _ in fills])
    resolved = Resolved(
        f"{cols}, {rest}, r._cid",
        id_expr,
        tuple(name for name, _ in fills),
        cuts,
        widest,
        tuple(marked),
        plain,
        in_files=sum(filed for _, filed in fills),
    )
    con.execute(f"CREATE VIEW res AS {resolved.sql(staged)}")
    return resolved


def _marked(con: duckdb.DuckDBPyConnection, payload: Sequence[str]) -> list[str]:
    """The payload columns some staged change (not a delete) marks unchanged, in order."""
    marked = [
        str(row[0])
        for row in con.execute(
            "SELECT DISTINCT c FROM (SELECT unnest(unc) AS c FROM unc_lin "
            "WHERE op <> 'delete') ORDER BY c"
        ).fetchall()
    ]
    return [c for c in marked if c in payload]


def _marked_alike(con: duckdb.DuckDBPyConnection, marked: list[str]) -> list[list[str]]:
    """The marked columns in groups that the same changes mark (one fill table a group).

    Columns marked by the same rows have the same carriers: a column added
    with a default marks every other column of the rows it fills, and one
    fill table (and join) a column made DuckDB's expression depth limit
    (1000) fail every capture of a 1,401-column table. Candidates share a
    fingerprint of their rows; a group is then checked exactly, and split
    into single columns if any change marks some of it only.
    """
    if len(marked) < 2:
        return [[c] for c in marked]
    rows = con.execute(
        "SELECT c, count(*), bit_xor(hash(ord)), sum(hash(ord)) FROM (SELECT ord, "
        "unnest(unc) AS c FROM unc_lin WHERE op <> 'delete') GROUP BY c"
    ).fetchall()
    position = {c: i for i, c in enumerate(marked)}
    alike: dict[tuple[Any, ...], list[str]] = {}
    for c, *fingerprint in rows:
        if c in position:
            alike.setdefault(tuple(fingerprint), []).append(str(c))
    groups: list[list[str]] = []
    for group in alike.values():
        group.sort(key=position.__getitem__)
        listed = "[" + ", ".join(lit(c) for c in group) + "]"
        (split,) = con.execute(
            "SELECT count(*) FROM unc_lin WHERE op <> 'delete' AND "
            f"len(list_intersect(unc, {listed})) NOT IN (0, {len(group)})"
        ).fetchall()[0]
        groups.extend([[c] for c in group] if split else [group])
    return sorted(groups, key=lambda g: position[g[0]])


def _filled_columns(payload: Sequence[str], groups: list[list[str]]) -> str:
    """The select list of ``payload``: a marked column from its fill, any other as staged."""
    where = {c: (n, j) for n, group in enumerate(groups) for j, c in enumerate(group)}
    cols = []
    for c in payload:
        q = quote_ident(c)
        if c in where:
            # A group's fills hold a row for each change that marks it, and only those.
            n, j = where[c]
            cols.append(f"CASE WHEN f{n}.ord IS NOT NULL THEN f{n}.v{j} ELSE r.{q} END AS {q}")
        else:
            cols.append(f"r.{q}")
    return ", ".join(cols)


#: The fill values (as text) a join by ordinal holds at a time: each staged part
#: meets its fills in windows of ordinals holding at most this much of them
#: (a part of small staged rows may hold many large unchanged values).
FILL_WINDOW_BYTES = 8 << 20


def _cuts(con: duckdb.DuckDBPyConnection, fills: Sequence[str]) -> tuple[tuple[int, ...], int]:
    """The ordinals where each window of at most ``FILL_WINDOW_BYTES`` of fills starts,
    and the largest fills of one row (from each fill's ``_n``, never its values)."""
    sizes = " UNION ALL ".join(f"SELECT ord, _n AS n FROM {t}" for t in fills)
    rows = con.execute(
        f"SELECT min(ord), max(n) FROM (SELECT ord, n, sum(n) OVER (ORDER BY ord) AS cum FROM "
        f"(SELECT ord, sum(n) AS n FROM ({sizes}) GROUP BY ord)) "
        f"GROUP BY cum // {FILL_WINDOW_BYTES} ORDER BY 1"
    ).fetchall()
    return tuple(int(r[0]) for r in rows), max((int(r[1]) for r in rows), default=0)


def _row_size(con: duckdb.DuckDBPyConnection, relation: str) -> str:
    """The SQL of the bytes (as text) of a row's values ``v0``, ``v1``, ... of ``relation``.

    Sized as a fill is made: read again from its table, 2,048 rows of a
    group's 30 kB of values held 60 MB, past a small reduction's memory.
    """
    # (a BLOB by its bytes: as text, a large one would be escaped whole; a list,
    # not a chain of +, so a group of many columns stays one expression deep)
    kinds = _types(con, relation)
    values = [f"coalesce({_size(v, kind)}, 0)" for v, kind in kinds.items() if v != "ord"]
    return f"CAST(list_sum([{', '.join(values)}]) + 16 AS BIGINT)"


def _size(value: str, kind: str) -> str:
    """The SQL of the bytes of ``value`` (of DuckDB type ``kind``) as text, a BLOB's as stored.

    A list's also counts ``ELEMENT_BYTES`` for each element: a list of many
    short strings is several times its text in DuckDB's vectors.
    """
    if kind == "BLOB":
        return f"octet_length({value})"
    text = f"strlen(CAST({value} AS VARCHAR))"
    if not kind.endswith("[]"):
        return text
    elements = value
    for _ in range(kind.count("[]") - 1):
        elements = f"flatten({elements})"
    return f"({text} + {ELEMENT_BYTES} * len({elements}))"


def _types(con: duckdb.DuckDBPyConnection, relation: str) -> dict[str, str]:
    """Each column of ``relation`` with its DuckDB type (``TIME``, ``VARCHAR[]``, ...)."""
    described = con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    return {str(row[0]): str(row[1]) for row in described}


#: (staged type, lake type) pairs whose lake value reads back into the staged
#: type exactly: the lake keeps a time of day as its text (Delta has no such
#: type). Any other mismatch is left to fail loudly rather than be cast with
#: a loss (a narrower decimal rounds, a coarser timestamp truncates).
_EXACT_READBACK = {("TIME", "VARCHAR"), ("TIME[]", "VARCHAR[]")}


def _cast_to(staged: str, lake: str | None) -> str | None:
    """The staged type ``staged``, when the lake holds the column as its text ``lake``."""
    return staged if (staged, lake) in _EXACT_READBACK else None


def _lineage_table(con: duckdb.DuckDBPyConnection, staged: str, id_expr: str) -> None:
    """``unc_lin``: each staged row's (ord, _cid, op, unc, _lin, _lin_ord), narrow.

    ``unc_need`` holds the (ord, _lin, _lin_ord, col) of each marked value.
    """
    op = quote_ident(prov.OP)
    con.execute(
        f"CREATE TABLE unc_rows AS SELECT {_ORD}, {op}, {UNCHANGED}, {id_expr} AS _cid "
        f"FROM {staged}"
    )
    lineage = lineage_sql(con, "unc_rows r", any_marked(con, staged, deletes=True))
    con.execute(
        f"CREATE TABLE unc_lin AS SELECT r.{_ORD} AS ord, r._cid, r.{op} AS op, "
        f"r.{UNCHANGED} AS unc, r._lin, r._lin_ord FROM {lineage}"
    )
    con.execute("DROP VIEW IF EXISTS lin_rows")
    con.execute("DROP TABLE unc_rows")


@dataclass(frozen=True, slots=True)
class _Fill:
    """One column of a fill group: whether the lake holds it, and the type it reads back as."""

    column: str
    in_lake: bool
    #: The staged type, when the lake stores the column as another (a ``time``
    #: as its text: Delta has no time of day); its value is read back as it.
    cast: str | None


def _fill_group(
    con: duckdb.DuckDBPyConnection,
    n: int,
    group: Sequence[_Fill],
    *,
    staged: str,
    lake: str,
    current_files: Sequence[str] = (),
    lake_rows: Callable[[str], Any] | None = None,
    staged_parts: tuple[Sequence[Path], pa.Schema] | None = None,
    events: bool = False,
) -> tuple[str, bool]:
    """``unc_fill_<n>(ord, v0, v1, ...)``: the values of each marked column of ``group``,
    and whether they are held in a file (:mod:`._fill_file`), not a table.

    The group's columns are marked by the same changes (:func:`_marked_alike`),
    so they share their carriers: for each, the newest earlier change in the
    row's lineage that carries the value (neither marked nor a delete), else
    (a lineage that starts in the lake) the lake's value, else null: one row
    for each change that marks them. The lake's value is read back as the
    staged type where the lake stores another (``cast``), which the
    reduction hashes and writes to the lake as every staged value.

    Every join builds its hash table on ordinals and ids, never on values:
    the values (the capture's, the lake's) stream past, so a backlog whose
    fills are many times the reduction's memory fills all the same. The
    lake's values come from a file Arrow wrote (:mod:`._lake_fills`),
    opening the lake's files by ``lake_rows``; None (or no spill directory):
    DuckDB reads them. So do the staged carriers' texts and byte strings,
    from ``staged_parts`` (the staged files and their schema). The fills are
    held in a file, not a table, where Parquet holds their types (:mod:`._fill_file`).
    ``events``: the lake holds an event stream (``lake`` its newest events,
    ``newest_events``); Arrow reads the same rows.
    """
    _pick_carriers(con, group[0].column)
    values = [f"v{j}" for j in range(len(group))]
    picked = ", ".join(f"{quote_ident(f.column)} AS v{j}" for j, f in enumerate(group))
    # From the capture: the staged values of the picked changes.
    parts = [
        f"SELECT p.ord, {', '.join(f's.{v}' for v in values)} FROM (SELECT {_ORD} AS ord, "
        f"{picked} FROM {staged} WHERE {_ORD} IN (SELECT pord FROM unc_pick)) s "
        "RIGHT JOIN (SELECT ord, pord FROM unc_pick WHERE pord IS NOT NULL) p ON s.ord = p.pord"
    ]
    from_lake = "false"
    if any(f.in_lake for f in group):
        from_lake = "_lin_ord < 0"
        # (a column the capture added has no lake value: null)
        held = ", ".join(
            (f"CAST({quote_ident(f.column)} AS {f.cast})" if f.cast else quote_ident(f.column))
            + f" AS v{j}"
            if f.in_lake
            else f"NULL AS v{j}"
            for j, f in enumerate(group)
        )
        parts.append(
            f"SELECT p.ord, {', '.join(f'l.{v}' for v in values)} FROM (SELECT _combined_id, "
            f"{held} FROM {lake} WHERE _combined_id IN "
            "(SELECT _lin FROM unc_pick WHERE pord IS NULL AND _lin_ord < 0)) l RIGHT JOIN "
            "(SELECT ord, _lin FROM unc_pick WHERE pord IS NULL AND _lin_ord < 0) p "
            "ON l._combined_id = p._lin"
        )
    # Neither: null (a lineage that starts in the capture with the value unknown).
    parts.append(
        f"SELECT ord, {', '.join(f'NULL AS {v}' for v in values)} FROM unc_pick "
        f"WHERE pord IS NULL AND NOT ({from_lake})"
    )
    name = f"unc_fill_{n}"
    select = _fills_select(con, parts)
    types = _types(con, f"({select})")
    spill = spill_directory(con)
    filed = spill is not None and in_file(list(types.values()))
    if spill is not None:
        lake_rows = lake_rows if from_lake != "false" else None
        newest = lake if events else None
        parts = _read_by_arrow(
            con, n, group, parts, spill, current_files, lake_rows, staged_parts, newest
        )
        select = _fills_select(con, parts)
    run = partial(one_thread, con, f"CREATE TABLE {name} AS {select}")
    if spill is not None and filed:  # (a table keeps its values in DuckDB's buffer pool)
        run = partial(write_fills, con, name, select, fills_file(spill, name), types)
    _within_largest(
        con,
        run,
        lambda: _largest_value(
            con,
            [f.column for f in group],
            staged,
            current_files if any(f.in_lake for f in group) else (),
        ),
    )
    for table in ("unc_need", "unc_cand", "unc_pick"):
        con.execute(f"DROP TABLE {table}")
    return name, filed


def _read_by_arrow(
    con: duckdb.DuckDBPyConnection,
    n: int,
    group: Sequence[_Fill],
    parts: list[str],
    spill: Path,
    current_files: Sequence[str],
    lake_rows: Callable[[str], Any] | None,
    staged_parts: tuple[Sequence[Path], pa.Schema] | None,
    events: str | None = None,
) -> list[str]:
    """``parts`` with the lake's values (``parts[1]``; ``lake_rows``: how to open its
    files; ``events``: the FROM item of an event stream's newest events) and the
    staged carriers' texts and bytes (``parts[0]``) read by Arrow into files of
    the spill directory (:mod:`._lake_fills`), each where it applies."""
    parts = list(parts)
    columns = [f.column for f in group]
    if lake_rows is not None:
        held_in = fills_file(spill, f"unc_lake_{n}")
        read = write_lake_values(con, current_files, columns, held_in, lake_rows, events=events)
        parts[1] = (
            f"SELECT ord, {_lake_file_values(group, read)} FROM read_parquet({lit(str(held_in))})"
        )
    if staged_parts is not None:
        files, schema = staged_parts
        if all(is_bytes(schema.field(c).type) for c in columns):
            held_in = fills_file(spill, f"unc_staged_{n}")
            write_staged_values(con, files, schema, columns, held_in)
            values = ", ".join(f"v{j}" for j in range(len(group)))
            parts[0] = f"SELECT ord, {values} FROM read_parquet({lit(str(held_in))})"
    return parts


def _fills_select(con: duckdb.DuckDBPyConnection, parts: Sequence[str]) -> str:
    """The fills of ``parts`` (each ``ord, v0, v1, ...``) with each row's size ``_n``."""
    # (one statement: the values take the type both sources fit, as a CASE over them would)
    union = "(" + " UNION ALL ".join(f"({p})" for p in parts) + ")"
    return f"SELECT *, {_row_size(con, union)} AS _n FROM {union}"


def _lake_file_values(group: Sequence[_Fill], read: Sequence[pa.DataType]) -> str:
    """The select list ``v0, v1, ...`` of the lake's values written by :func:`write_lake_values`
    (of types ``read``: null where no file it read holds the column)."""
    return ", ".join(
        (f"CAST(v{j} AS {f.cast}) AS v{j}" if f.cast else f"v{j}")
        if f.in_lake and not pa.types.is_null(t)
        else f"NULL AS v{j}"
        for j, (f, t) in enumerate(zip(group, read, strict=True))
    )


def _pick_carriers(con: duckdb.DuckDBPyConnection, column: str) -> None:
    """``unc_pick(ord, _lin, _lin_ord, pord)``: each change marking ``column``, and its carrier.

    ``pord`` is the newest earlier change of the same lineage that carries
    the value (neither marked nor a delete), null when there is none.
    """
    c = lit(column)
    carries = f"op NOT IN ('delete', 'truncate') AND NOT coalesce(list_contains(unc, {c}), false)"
    con.execute(
        "CREATE TABLE unc_need AS SELECT ord, _lin, _lin_ord FROM unc_lin "
        f"WHERE op <> 'delete' AND list_contains(unc, {c})"
    )
    # Earlier changes of the same lineages that carry the value, and for
    # each marked change the newest of them before it (pord).
    con.execute(
        "CREATE TABLE unc_cand AS SELECT l.ord, l._lin, l._lin_ord FROM unc_lin l "
        "SEMI JOIN unc_need n ON l._lin = n._lin AND l._lin_ord = n._lin_ord "
        f"WHERE {carries}"
    )
    con.execute(
        "CREATE TABLE unc_pick AS SELECT n.ord, n._lin, n._lin_ord, p.ord AS pord "
        "FROM unc_need n ASOF LEFT JOIN unc_cand p "
        "ON n._lin = p._lin AND n._lin_ord = p._lin_ord AND n.ord > p.ord"
    )


#: DuckDB memory (MB) a statement that must hold one value of ``s`` bytes is
#: given at least: ``VALUE_MEMORY_FACTOR * s`` more than its connection's
#: limit. Its Parquet reader holds a value's page compressed, decompressed
#: and as a vector: a lake file's one value of 20 MB (40 MB) needed 89 MB
#: (177 MB) to be read into a table, ~4.4 times its bytes (bench/RESULTS.md).
VALUE_MEMORY_FACTOR = 5
#: DuckDB memory each column's fills add to a change stream's reduction, in
#: MB: every statement over the filled rows joins each such column's fills,
#: and a hash join holds its partitions however few rows it builds on (~2 MB
#: for a scalar column, ~6 MB for a list): 40 rows filled in 14 columns
#: failed at 64 MB, 50 rows in 24 list columns at 128 MB.
FILL_JOIN_MB = 8


_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _largest_value(
    con: duckdb.DuckDBPyConnection,
    columns: Sequence[str],
    staged: str,
    current_files: Sequence[str],
) -> int:
    """An upper bound (bytes) of the DuckDB memory one read of ``columns``' values holds.

    The staged values are measured (Arrow: one value at a time, as it is),
    ``VALUE_MEMORY_FACTOR`` times each column's largest. The lake's are
    bounded from the files' footers: DuckDB reads a row group's columns a
    vector (up to 2,048 rows) at a time, so the bound is the largest row
    group's chunks of ``columns``, each ``VALUE_MEMORY_FACTOR`` times its
    bytes (a value's page is held compressed, decompressed and as a vector)
    and ``ELEMENT_BYTES`` for each of its values (a list's elements are
    16 bytes each in a vector: 143 lake rows of three lists of 5,000 short
    strings are a 1.2 MB dictionary-encoded chunk each, and 34 MB read).
    The lake's writer closes a row group at ``ROW_GROUP_BYTES`` of rows, so
    it is about the largest value (or one batch of rows), never the table.
    """
    largest = 0
    for column in columns:
        q = quote_ident(column)
        kind = _types(con, f"(SELECT {q} FROM {staged})")[column]
        measured = f"SELECT coalesce(max({_size(q, kind)}), 0) FROM {staged}"
        (value,) = con.execute(measured).fetchall()[0]
        largest += VALUE_MEMORY_FACTOR * int(value)
    if current_files:
        # (a nested column's leaves are named "a, list, element")
        picked = " OR ".join(
            f"path_in_schema = {lit(c)} OR starts_with(path_in_schema, {lit(c + ', ')})"
            for c in columns
        )
        (group,) = con.execute(
            "SELECT coalesce(max(n), 0) FROM (SELECT sum("
            f"{VALUE_MEMORY_FACTOR} * total_uncompressed_size + {ELEMENT_BYTES} * num_values) AS n "
            f"FROM parquet_metadata({files_sql(current_files)}) WHERE {picked} "
            "GROUP BY file_name, row_group_id)"
        ).fetchall()[0]
        largest = max(largest, int(group))
    return largest


def _within_largest(
    con: duckdb.DuckDBPyConnection, run: Callable[[], None], largest: Callable[[], int]
) -> None:
    """``run()`` (a statement on one thread); past DuckDB's memory, again with room for a value.

    A single value (or a vector of a lake row group's lists) is never
    spilled or split: a statement that must hold one larger than its
    connection's memory allows fails for memory. It then runs once more
    with ``largest()`` (bytes: :func:`_largest_value`) more, which the
    connection keeps (the reduction sets its own limit once the fills are
    sized).
    """
    import duckdb

    try:
        run()
        return
    except duckdb.OutOfMemoryException:
        pass
    (limit,) = con.execute("SELECT current_setting('memory_limit')").fetchall()[0]
    number, unit = str(limit).split()  # as DuckDB prints it: '61.0 MiB'
    held = float(number) * _UNITS[unit]
    # (kept: every later statement over the fills reads the value again)
    con.execute(f"SET memory_limit = '{int(held + largest())}B'")
    run()


def lineage_sql(con: duckdb.DuckDBPyConnection, rows: str, moved: bool) -> str:
    """``rows`` with ``_lin``, ``_lin_ord``: the history each row's values continue.

    A row's lineage starts at its id's last insert in the capture
    (``_lin_ord``, the insert's ordinal), or in the lake (``-1``); a row
    that moved to another key (a delete of the old key naming columns,
    then at the next ordinal the update of the new key) continues the old
    key's lineage, through any number of moves. Unchanged values resolve
    within a lineage, and from the lake by its first id (``_lin``).
    ``moved``: whether any delete names columns (else no row moved).
    """
    op, ordinal = quote_ident(prov.OP), _ORD
    if not moved:
        return f"(SELECT r.*, r._cid AS _lin, -1 AS _lin_ord FROM {rows}) r"
    con.execute(f"CREATE VIEW lin_rows AS SELECT r.* FROM {rows}")
    # Where a lineage of an id starts: its inserts, and the updates a move lands on.
    con.execute(
        f"CREATE TABLE lin_moves AS SELECT d.{ordinal} + 1 AS k, d._cid AS old "
        f"FROM lin_rows d WHERE d.{op} = 'delete' AND coalesce(len(d.{UNCHANGED}), 0) > 0"
    )
    con.execute(
        # (a null of the ids' own type: text in a v1 table, binary in a v2 one)
        f"CREATE TABLE lin_starts AS SELECT _cid, {ordinal} AS ord, "
        "CASE WHEN false THEN _cid END AS old "
        f"FROM lin_rows WHERE {op} = 'insert' UNION ALL "
        f"SELECT r._cid, r.{ordinal}, m.old FROM lin_rows r "
        f"JOIN lin_moves m ON r.{ordinal} = m.k"
    )
    # Each move's old key, and where that key's own lineage started before the move.
    con.execute(
        "CREATE TABLE lin_prev AS SELECT m.k, m.old, s.ord AS pk, s.old IS NOT NULL AS pmove "
        "FROM lin_moves m ASOF LEFT JOIN lin_starts s ON m.old = s._cid AND m.k - 1 >= s.ord"
    )
    con.execute(
        "CREATE TABLE lin_roots AS WITH RECURSIVE walk(k, old, pk, pmove) AS ("
        "SELECT k, old, pk, pmove FROM lin_prev UNION ALL "
        "SELECT w.k, p.old, p.pk, p.pmove FROM walk w JOIN lin_prev p ON p.k = w.pk "
        "WHERE w.pmove) "
        "SELECT k, old AS lin, coalesce(pk, -1) AS lin_ord FROM walk "
        "WHERE NOT coalesce(pmove, false)"
    )
    return (
        "(SELECT r.*, CASE WHEN s.ord IS NULL THEN r._cid WHEN s.old IS NULL THEN r._cid "
        "ELSE t.lin END AS _lin, CASE WHEN s.ord IS NULL THEN -1 WHEN s.old IS NULL THEN s.ord "
        "ELSE t.lin_ord END AS _lin_ord "
        "FROM lin_rows r ASOF LEFT JOIN lin_starts s "
        f"ON r._cid = s._cid AND r.{ordinal} >= s.ord LEFT JOIN lin_roots t ON t.k = s.ord) r"
    )
