"""The lake's values a change stream's fills take, read by Arrow into a file of small row groups.

A marked value whose lineage starts in the lake takes the lake's value of
the row's id. DuckDB reads a lake file's row group a vector (up to 2,048
rows) at a time, each list's elements whole and 16 bytes each: the lake's
writer closes a row group at 16 MB of rows, so 143 rows of three lists of
5,000 short strings were one row group, 34 MB of vectors, and reading them
with their ids (joined to the changes) failed a 256 MiB reduction's fills
for memory whatever room they were given. DuckDB now reads only the lake's
ids, to find the file and row each change's value lies in; Arrow reads
those rows' values as stored (4 bytes an element beside its characters),
a row group's batch at a time, and writes them with their change's ordinal
to a Parquet file of ~2 MB row groups, which DuckDB reads a few rows at a
time and with no join.

Every fill from the lake is read this way, lists or not: DuckDB's scan of
the lake's large texts, JSON or byte strings, feeding that join, kept every
value it read outside its memory limit until the statement ended (1,000
rows of 200 kB-1 MB JSON: 1 GB, the limit 150 MB).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from combined.capture._databases import files_sql
from combined.delivery import ELEMENT_BYTES, read_part, scan_weight
from combined.lake import lake_type, to_lake
from combined.protocol import _provenance as prov
from combined.runtime._memory import release_memory

if TYPE_CHECKING:
    import duckdb

#: Bytes of the lake's rows decoded at a time (a batch of a row group).
READ_BYTES = 8 << 20
#: DuckDB bytes (``scan_weight``) a row group of the written file holds, about.
GROUP_BYTES = 2 << 20

_ID = "_combined_id"
_ORDINAL = "_combined_ordinal"


def write_lake_values(
    con: duckdb.DuckDBPyConnection,
    files: Sequence[str],
    columns: Sequence[str],
    path: Path,
    open_file: Callable[[str], Any] = str,
    *,
    events: str | None = None,
) -> list[pa.DataType]:
    """Write ``path``: ``(ord, v0, v1, ...)`` for each change of ``unc_pick`` filled from the lake.

    ``vj`` is the lake's value of ``columns[j]`` in the current row of the
    change's lineage id (``_lin``), null where the lake holds no such row or
    a file no such column. DuckDB reads the ids of the lake's current
    ``files``, finding where each wanted row lies; Arrow opens the files
    holding one by ``open_file`` (an object store's through its filesystem)
    to read those rows' values. ``events``: the files hold an event stream,
    whose current row of an id is its newest event: the FROM item of those
    (:func:`newest_events`, numbered). Returns each ``vj``'s type (null: no
    file read holds the column).
    """
    lake = events or (
        f"read_parquet({files_sql(files)}, union_by_name = true, filename = '{_FILE}', "
        "file_row_number = true)"
    )
    found = con.sql(
        f"SELECT p.ord, l.{_FILE}, l.file_row_number FROM (SELECT ord, _lin FROM unc_pick "
        f"WHERE pord IS NULL AND _lin_ord < 0) p LEFT JOIN (SELECT {_FILE}, file_row_number, "
        f"{_ID} FROM {lake}) l ON l.{_ID} = p._lin ORDER BY l.{_FILE}, l.file_row_number"
    ).to_arrow_table()
    ords = found.column("ord").to_numpy()
    rows = found.column("file_row_number").fill_null(-1).to_numpy()
    # Each file's changes, in a run of their own (sorted by file); the last run: none.
    named = found.column(_FILE).combine_chunks().dictionary_encode()
    held = named.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    starts = [0, *(np.flatnonzero(np.diff(held)) + 1).tolist(), len(held)]
    runs = [(int(held[a]), a, b) for a, b in zip(starts, starts[1:], strict=False) if a < b]
    opened = {
        i: pq.ParquetFile(open_file(named.dictionary[i].as_py())) for i, _, _ in runs if i >= 0
    }
    try:
        types = _lake_types([pf.schema_arrow for pf in opened.values()], columns)
        schema = pa.schema(
            [pa.field("ord", pa.int64())] + [pa.field(f"v{j}", t) for j, t in enumerate(types)]
        )
        written = 0
        with _spill_writer(path, schema) as writer:
            for i, a, b in runs:
                if i >= 0:
                    batches = _lake_rows(opened[i], columns, types, rows[a:b], ords[a:b], schema)
                else:  # (ids the lake does not hold)
                    nulls = [pa.nulls(b - a, t) for t in types]
                    batches = iter(
                        [pa.RecordBatch.from_arrays([pa.array(ords[a:b]), *nulls], schema=schema)]
                    )
                for batch in batches:
                    written += _write(writer, batch)
                    del batch
                    release_memory()  # (a row group's freed pages: the heaps keep them else)
                if i >= 0:
                    opened.pop(i).close()
    finally:
        for pf in opened.values():
            pf.close()
    if written != found.num_rows:  # (never: every change is read once, from its file or as null)
        raise RuntimeError(f"the lake's values of {found.num_rows} filled changes were {written}")
    return types


def write_staged_values(
    con: duckdb.DuckDBPyConnection,
    files: Sequence[Path],
    staged: pa.Schema,
    columns: Sequence[str],
    path: Path,
) -> None:
    """Write ``path``: ``(ord, v0, ...)`` for each change of ``unc_pick`` carried by a staged one.

    ``vj`` is ``columns[j]`` of the carrier, the staged change ``pord``.
    DuckDB reads only ``unc_pick``'s ordinals; Arrow reads the staged parts
    ``files`` (mapped, each batch as ``staged``, the parts' schema: a part
    written before a column appeared holds it as null), taking the carriers'
    rows a batch at a time: DuckDB's scan of the staged rows, feeding the
    join that picked the carriers, held every large value it read until the
    statement ended (160 rows of 1 MB texts inserted and updated in one
    backlog: 210 MB).
    """
    found = con.sql(
        "SELECT ord, pord FROM unc_pick WHERE pord IS NOT NULL ORDER BY pord"
    ).to_arrow_table()
    ords, pords = found.column("ord").to_numpy(), found.column("pord").to_numpy()
    read = pa.schema([staged.field(_ORDINAL), *(staged.field(c) for c in columns)])
    types = [_takeable(read.field(c).type) for c in columns]
    schema = pa.schema(
        [pa.field("ord", pa.int64())] + [pa.field(f"v{j}", t) for j, t in enumerate(types)]
    )
    written = 0
    with _spill_writer(path, schema) as writer:
        for file in files:
            for batch in read_part(file):
                for picked in _carried(batch, read, pords, ords, types, schema):
                    written += _write(writer, picked)
                    del picked
                    release_memory()  # (as the lake's rows above)
    if written != found.num_rows:  # (never: every carrier is a staged change)
        raise RuntimeError(f"the staged values of {found.num_rows} filled changes were {written}")


def _carried(
    batch: pa.RecordBatch,
    read: pa.Schema,
    pords: np.ndarray[Any, Any],
    ords: np.ndarray[Any, Any],
    types: Sequence[pa.DataType],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """``(ord, v0, ...)`` of the carriers ``pords`` (ascending) in ``batch``, changes ``ords``."""
    if not batch.num_rows or not len(pords):
        return
    held = batch.column(_ORDINAL).to_numpy()
    a, b = np.searchsorted(pords, [held.min(), held.max() + 1])
    if a == b:
        return
    want = pords[a:b]
    order = np.argsort(held, kind="stable")
    at = order[np.minimum(np.searchsorted(held, want, sorter=order), len(held) - 1)]
    hit = held[at] == want
    if not hit.any():
        return
    batch = to_lake(batch, read)  # (a column the part lacks: nulls)
    arrays = [batch.column(j + 1).cast(t) for j, t in enumerate(types)]
    yield from _taken(arrays, types, at[hit], ords[a:b][hit], schema)


@dataclass(frozen=True, slots=True)
class EventLake:
    """An event stream's (``sync_mode: append``) lake: its files, and the sequence
    of each Delivery its commits recorded (by Delivery id)."""

    files: Sequence[str]
    sequences: Mapping[str, int] = field(default_factory=dict)


def register_sequences(con: duckdb.DuckDBPyConnection, sequences: Mapping[str, int]) -> None:
    """Create the table ``unc_seq(did, seq)``: each Delivery's sequence (:func:`newest_events`)."""
    rows = pa.table(
        {
            "did": pa.array(list(sequences), pa.string()),
            "seq": pa.array(list(sequences.values()), pa.int64()),
        }
    )
    con.execute("DROP TABLE IF EXISTS unc_seq")
    con.from_arrow(rows).create("unc_seq")


def newest_events(files: Sequence[str], *, numbered: bool, sequenced: bool = False) -> str:
    """A FROM item: in an event stream's (``sync_mode: append``) lake ``files``, the
    newest event of each id a change of ``unc_pick`` is filled from; none where it is
    a delete (the lake of a merged table holds no row of a deleted id).

    Newest is the event of the latest Delivery (``sequenced``: by its
    sequence, ``unc_seq``, :func:`register_sequences`), which a dataset's
    captures number one after another in the stream's order, a transaction
    cut into several Deliveries too; within one, its later row (``numbered``:
    the rows carry their file and number): a Delivery holds the stream in
    order, and a compaction keeps each file's rows in theirs. An event whose
    Delivery no commit of the table records (a file without the column,
    ``unc_seq`` without its id) comes after those that have one, and they
    are ranked as before: a later capture's first (``_combined_ingested_at``:
    captures of a dataset commit one after another under its lease), then
    the source's order: its position (:func:`_position_order`: a PostgreSQL
    commit's LSN, a binlog event's place), its emission time (a snapshot's
    rows have none: before the stream's changes), and the later row of its
    file (two files' names do not follow the stream).

    Only the wanted ids' events are ranked: the lake is read for their rows alone.
    """
    every = "l.*" if sequenced else "*"
    return (
        f"(SELECT {every} FROM {_event_scan(files, numbered, sequenced)} WHERE {_ID} IN "
        "(SELECT _lin FROM unc_pick WHERE pord IS NULL AND _lin_ord < 0) "
        f"QUALIFY row_number() OVER (PARTITION BY {_ID} ORDER BY "
        f"{event_order(numbered, sequenced)}) = 1 "
        f"AND {prov.OP} IS DISTINCT FROM 'delete')"
    )


def _event_scan(files: Sequence[str], numbered: bool, sequenced: bool) -> str:
    """A FROM item: an event stream's lake ``files`` (:func:`newest_events`)."""
    numbering = f", filename = '{_FILE}', file_row_number = true" if numbered else ""
    scan = f"read_parquet({files_sql(files)}, union_by_name = true{numbering})"
    if sequenced:
        scan = f"{scan} l LEFT JOIN unc_seq ON unc_seq.did = l.{prov.DELIVERY_ID}"
    return scan


def event_order(numbered: bool, sequenced: bool) -> str:
    """SQL: an ORDER BY of an event stream's events, newest first (:func:`newest_events`)."""
    return ", ".join(f"{t} DESC NULLS LAST" for t in _event_terms(numbered, sequenced))


def event_rank(numbered: bool, sequenced: bool) -> str:
    """SQL: a STRUCT of an event's place in :func:`event_order`, the newest greatest.

    Each of its terms as two fields, whether it is set and its value: a
    null term sorts below every value (NULLS LAST, newest first), where a
    STRUCT's null field would sort above them.
    """
    fields = []
    for n, term in enumerate(_event_terms(numbered, sequenced)):
        fields += [f"'s{n}': (({term}) IS NOT NULL)", f"'v{n}': ({term})"]
    return "{" + ", ".join(fields) + "}"


def _event_terms(numbered: bool, sequenced: bool) -> list[str]:
    """SQL: what ranks an event stream's events, each newest first (:func:`newest_events`)."""
    terms = []
    if sequenced:
        terms.append("unc_seq.seq")
        if numbered:  # (within one Delivery, its later row)
            terms.append("CASE WHEN unc_seq.seq IS NOT NULL THEN file_row_number END")
    terms += [prov.INGESTED_AT, _position_order(prov.SOURCE_POSITION), prov.EMITTED_AT]
    if numbered:
        terms += [_FILE, "file_row_number"]
    return terms


def lake_events(
    files: Sequence[str], keep: Sequence[str], *, numbered: bool, sequenced: bool
) -> str:
    """SQL: every event of an event stream's lake ``files``: its ``keep`` columns,
    its op ``_kop`` and its rank ``_rank`` (:func:`event_rank`)."""
    return (
        f"SELECT {', '.join(keep)}, {prov.OP} AS _kop, {event_rank(numbered, sequenced)} "
        f"AS _rank FROM {_event_scan(files, numbered, sequenced)}"
    )


def _position_order(column: str) -> str:
    """SQL: a source position as text that sorts in the source's order.

    A PostgreSQL LSN (``16/B374D848``) with both halves padded to 8 hex
    digits, a binlog's ``file:position`` with its offset padded to 20
    digits; any other as it is.
    """
    lsn = "'^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$'"
    return (
        f"CASE WHEN regexp_matches({column}, {lsn}) THEN "
        f"lpad(upper(split_part({column}, '/', 1)), 8, '0') || '/' || "
        f"lpad(upper(split_part({column}, '/', 2)), 8, '0') "
        f"WHEN regexp_matches({column}, ':[0-9]{{1,20}}$') THEN "
        f"regexp_extract({column}, '^(.*):[0-9]+$', 1) || ':' || "
        f"lpad(regexp_extract({column}, ':([0-9]+)$', 1), 20, '0') "
        f"ELSE {column} END"
    )


def lake_numbers_rows(columns: Sequence[str]) -> bool:
    """Whether the lake's rows can be numbered (:func:`write_lake_values`): DuckDB's
    ``file_row_number`` cannot be named otherwise, so no lake column may take it."""
    return "file_row_number" not in columns and _FILE not in columns


#: The column naming each lake row's file (DuckDB's ``filename``, named apart
#: from any column of the lake's).
_FILE = "_combined_file"


def _lake_types(schemas: Sequence[pa.Schema], columns: Sequence[str]) -> list[pa.DataType]:
    """The type each of ``columns`` takes across the lake's files (as DuckDB's
    ``union_by_name`` would: the widest of them, a view as its plain type),
    null where no file holds it."""
    types: list[pa.DataType] = []
    for c in columns:
        # (each as its plain type first: Arrow unifies no view with its plain type,
        # and delta-rs rewrites a merged file's strings as views beside plain ones)
        held = [lake_type(s.field(c).type) for s in schemas if s.get_field_index(c) >= 0]
        if not held:
            types.append(pa.null())
            continue
        fields = [pa.schema([pa.field(c, t)]) for t in held]
        types.append(pa.unify_schemas(fields, promote_options="permissive").field(c).type)
    return types


def _lake_rows(
    pf: pq.ParquetFile,
    columns: Sequence[str],
    types: Sequence[pa.DataType],
    rows: np.ndarray[Any, Any],
    ords: np.ndarray[Any, Any],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """``(ord, v0, ...)``: the values of ``pf``'s rows ``rows`` (ascending), for changes ``ords``.

    Only the row groups holding one of them are decoded, a batch of about
    ``READ_BYTES`` at a time.
    """
    present = [c for c in columns if pf.schema_arrow.get_field_index(c) >= 0]
    if not present:  # (a file without the columns: its rows' values are null)
        nulls = [pa.nulls(len(rows), t) for t in types]
        yield pa.RecordBatch.from_arrays([pa.array(ords), *nulls], schema=schema)
        return
    meta = pf.metadata
    first = 0
    for group in range(meta.num_row_groups):
        size, count = meta.row_group(group).total_byte_size, meta.row_group(group).num_rows
        lo, hi = np.searchsorted(rows, [first, first + count])
        if lo == hi:
            first += count
            continue
        step = max(1, READ_BYTES * count // size) if size > 0 else count
        start = first
        for batch in pf.iter_batches(
            batch_size=step, row_groups=[group], columns=present, use_threads=False
        ):
            a, b = np.searchsorted(rows, [start, start + batch.num_rows])
            if a < b:
                # (cast first: a view, as delta-rs writes strings, has no ``take``)
                arrays = [
                    batch.column(c).cast(t) if c in present else None
                    for c, t in zip(columns, types, strict=True)
                ]
                yield from _taken(arrays, types, rows[a:b] - start, ords[a:b], schema)
            start += batch.num_rows
        first += count


def _taken(
    arrays: Sequence[pa.Array | None],
    types: Sequence[pa.DataType],
    at: np.ndarray[Any, Any],
    ords: np.ndarray[Any, Any],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """``(ord, v0, ...)``: ``arrays``' rows ``at`` (None: nulls) for changes ``ords``,
    about ``READ_BYTES`` of values a batch.

    A row taken for many changes (a value several updates in a row leave
    alone) is copied for each: taken at once, 2,100 copies of a 1 MB text
    pass a string array's 2 GiB and the take fails.
    """
    sizes = np.zeros(len(at), np.int64)
    for array in arrays:
        if array is not None:
            sizes += _row_bytes(array)[at]
    ends = np.cumsum(sizes)
    start = 0
    while start < len(at):
        before = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, before + READ_BYTES, side="right")), start + 1)
        rows = pa.array(at[start:stop])
        values = [
            pa.nulls(stop - start, t) if array is None else array.take(rows)
            for array, t in zip(arrays, types, strict=True)
        ]
        yield pa.RecordBatch.from_arrays([pa.array(ords[start:stop]), *values], schema=schema)
        start = stop


def _row_bytes(array: pa.Array) -> np.ndarray[Any, Any]:
    """Each row's bytes in ``array``, about (a list's elements ``ELEMENT_BYTES`` each beside
    their own bytes; a value of another type ``ELEMENT_BYTES``)."""
    t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        counts = np.asarray(pc.fill_null(pc.list_value_length(array), 0), np.int64)
        inner = _row_bytes(pc.list_flatten(array))
        parents = np.asarray(pc.list_parent_indices(array), np.int64)
        held = np.bincount(parents, weights=inner, minlength=len(array)).astype(np.int64)
        return counts * ELEMENT_BYTES + held
    if is_bytes(t, views=False):
        return np.asarray(pc.fill_null(pc.binary_length(array), 0), np.int64)
    return np.full(len(array), ELEMENT_BYTES, np.int64)


_PLAIN = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)
_VIEWS = (pa.types.is_string_view, pa.types.is_binary_view)


def is_bytes(t: pa.DataType, *, views: bool = True) -> bool:
    """Whether ``t`` holds texts or byte strings (``views``: their view types too)."""
    return any(check(t) for check in (*_PLAIN, *_VIEWS) if views or check not in _VIEWS)


def _takeable(t: pa.DataType) -> pa.DataType:
    """``t``, or for a view (which has no ``take``) its large plain type."""
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    return t


def _spill_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer of fills read back once: plain pages, statistics only on the ordinals.

    pyarrow's default dictionary pages cost its writer four times the plain
    pages (50,000 arrays of 1,000 integers: 1.25 against 0.33 CPU-s; a
    backlog filling them took ~3 CPU-s less in ~26) for a file scanned once.
    """
    return pq.ParquetWriter(
        str(path),
        schema,
        compression="none",
        use_dictionary=False,
        write_statistics=["ord"],
    )


def _write(writer: pq.ParquetWriter, batch: pa.RecordBatch) -> int:
    """``batch`` in row groups of about ``GROUP_BYTES`` as DuckDB holds them; its rows."""
    if batch.num_rows:
        rows = max(1, GROUP_BYTES * batch.num_rows // max(1, scan_weight(batch)))
        writer.write_batch(batch, row_group_size=rows)
    return int(batch.num_rows)
