"""The last step of a reduction: the rows to deliver, with their constant provenance.

Columns constant over a transition are added to each batch as Arrow
constants: DuckDB would print the same strings into every row.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from combined.capture._fill_file import one_thread, single_thread
from combined.capture._unchanged import Resolved
from combined.delivery import (
    CHUNK_BYTES,
    COPY_BATCH_BYTES,
    StagedParts,
    part_batches,
    read_part,
    read_part_batch,
    read_staged,
)
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident
from combined.runtime._memory import purge_duckdb

if TYPE_CHECKING:
    import duckdb

#: Rows per output batch. DuckDB's reader runs several batches ahead of its
#: consumer: 64k-row batches of a typical table held ~150 MB, 16k-row ones
#: ~80 MB. The Delivery writer gathers them back into full row groups.
OUTPUT_BATCH_ROWS = 16_384
#: Bytes of a joined output batch, about (:func:`_joined_rows`): fewer rows
#: than ``OUTPUT_BATCH_ROWS`` where they are wide.
OUTPUT_BATCH_BYTES = 8 << 20

#: A statement :func:`by_part` runs over a part's rows (hashing them) runs on
#: one thread when the shortest slice a join reads of them weighs more than
#: this: 65 rows of three 100 kB byte strings, filled and hashed (their hex
#: text), held ~160 MB in each of two threads. (Lists are cut finer: DuckDB
#: never gathers them.)
ALONE_SLICE_BYTES = 8 << 20

#: Provenance columns holding instants (given as ISO 8601 text in the constants).
_TIMES = frozenset({prov.EMITTED_AT, prov.OBSERVED_AT, prov.INGESTED_AT})


class _Constants:
    """Columns holding one value, built once and sliced for each batch (zero-copy)."""

    def __init__(self, scalars: dict[str, pa.Scalar], rows: int) -> None:
        self.scalars = scalars
        self.arrays = {name: pa.repeat(scalar, rows) for name, scalar in scalars.items()}

    def add(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with every constant column appended."""
        n = batch.num_rows
        for name, array in self.arrays.items():
            if n > len(array):  # a longer batch than promised: built for it alone
                array = pa.repeat(self.scalars[name], n)
            batch = batch.append_column(name, array.slice(0, n))
        return batch


def constant_columns(
    capture_schema: pa.Schema, constants: dict[str, Any]
) -> tuple[str, dict[str, pa.Scalar]]:
    """The SQL of the provenance the staged rows carry, and the constant provenance's values.

    ``constants`` holds the transition's ``observed_at``, ``ingested_at``,
    ``run_id``, ``producer`` and ``position``; a staged column (a change
    stream's emission time and position) wins over a constant.
    """
    types = {f.name: f.type for f in prov.provenance_fields()}
    fixed: dict[str, Any] = {
        prov.OBSERVED_AT: constants["observed_at"],
        prov.INGESTED_AT: constants.get("ingested_at"),
        prov.RUN_ID: constants["run_id"],
        prov.DELIVERY_ID: None,  # each Delivery's writer stamps its own
        prov.PRODUCER: constants["producer"],
    }
    provenance = ""
    for name in (prov.EMITTED_AT, prov.SOURCE_POSITION):
        if name in capture_schema.names:
            provenance += f", c.{quote_ident(name)} AS {name}"
        else:
            fixed[name] = constants.get("position") if name == prov.SOURCE_POSITION else None
    scalars = {
        name: pa.scalar(
            datetime.fromisoformat(value) if isinstance(value, str) and name in _TIMES else value,
            types[name],
        )
        for name, value in fixed.items()
    }
    return provenance, scalars


def staged_rows(
    paths: Sequence[Path],
    payload: Sequence[str],
    op: str,
    scalars: dict[str, pa.Scalar],
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Every staged row, part by part, with its operation ``op`` and the constant provenance.

    A part staged before a column appeared lacks it, and a widened
    column keeps its narrower type there: the lake conversion that
    follows fills and casts them, as it does any batch.
    """
    wanted = {*payload, prov.ID, prov.PAYLOAD_HASH, prov.EMITTED_AT, prov.SOURCE_POSITION}
    constants = _Constants({prov.OP: pa.scalar(op, pa.string()), **scalars}, batch_rows)
    for path in paths:
        for batch in read_staged(path):  # (heavy batches of wide rows: a mapping each)
            batch = batch.select([n for n in batch.schema.names if n in wanted])
            for offset in range(0, batch.num_rows, batch_rows):
                yield constants.add(batch.slice(offset, batch_rows))


_ORDINAL = "_combined_ordinal"
#: The name one staged part is registered under while its rows are delivered.
_PART = "staged_part"
#: The name the same rows are registered under, read apart from any join.
_PLAIN = "staged_plain"

#: A staged part with the lowest and highest ordinal it holds.
PartRange = tuple[Path, tuple[int, int]]


def part_ranges(paths: Sequence[Path], cuts: Sequence[int] = ()) -> list[PartRange]:
    """Each staged part that holds rows, with its (lowest, highest) ordinal.

    Read from the mapped parts' ordinal column alone. ``cuts``: ordinals
    where a part's range is split (a window of fills starts there): a part
    then appears once for each of its windows, in ordinal order.
    """
    out: list[PartRange] = []
    for path in paths:
        low = high = None
        for batch in read_part(path):
            if not batch.num_rows:
                continue
            bounds = pc.min_max(batch.column(_ORDINAL))
            lo, hi = int(bounds["min"].as_py()), int(bounds["max"].as_py())
            low, high = lo if low is None else min(low, lo), hi if high is None else max(high, hi)
        if low is not None and high is not None:
            out.extend((path, window) for window in _windows(low, high, cuts))
    return out


def _windows(low: int, high: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    """[low, high] split at every cut inside it."""
    inside = cuts[bisect.bisect_right(cuts, low) : bisect.bisect_right(cuts, high)]
    starts = [low, *inside]
    return list(zip(starts, [c - 1 for c in inside] + [high], strict=True))


def in_order(ranges: Sequence[PartRange]) -> bool:
    """Whether the parts' ordinals increase from one part to the next (none overlap)."""
    return all(a[1][1] < b[1][0] for a, b in zip(ranges, ranges[1:], strict=False))


def by_part(
    con: duckdb.DuckDBPyConnection,
    table: str,
    ranges: Sequence[PartRange],
    schema: pa.Schema,
    select: Callable[[str, str, tuple[int, int]], str],
    *,
    whole: str,
    roomier: Callable[[], object] | None = None,
) -> None:
    """Create ``table`` from ``select(part, plain, ordinals)`` of each staged part in turn.

    ``part`` is the part's rows in ``ordinals`` as a join reads them,
    ``plain`` the same rows read apart from any join (:class:`StagedParts`).
    Without parts (an empty capture), from ``whole``, the same over every staged row.
    ``roomier``: gives the connection more memory; a part that ran out of
    memory (its statement added nothing) runs once more after it.
    """
    import duckdb

    if not ranges:
        con.execute(f"CREATE TABLE {table} AS {whole}")
    parts: dict[Path, tuple[StagedParts, StagedParts, bool]] = {}  # (shared by its windows)
    for n, (path, ordinals) in enumerate(ranges):
        if path not in parts:
            part = StagedParts([path], schema, joined=True)
            alone = part.least * part.heaviest_row() > ALONE_SLICE_BYTES
            parts[path] = (part, StagedParts([path], schema), alone)
        part, plain, alone = parts[path]
        con.register(_PART, part.within(ordinals, marked=True))
        con.register(_PLAIN, plain.within(ordinals, marked=False))
        try:
            sql = select(_PART, _PLAIN, ordinals)
            statement = f"CREATE TABLE {table} AS {sql}" if n == 0 else f"INSERT INTO {table} {sql}"
            try:
                if alone:
                    one_thread(con, statement)
                else:
                    con.execute(statement)
            except duckdb.OutOfMemoryException:
                if roomier is None:
                    raise
                roomier()
                roomier = None  # (once: the connection keeps the room)
                con.execute(statement)
        finally:
            con.unregister(_PART)
            con.unregister(_PLAIN)


@dataclass(frozen=True, slots=True)
class Delivered:
    """What a reduction delivers of each staged part: its columns and which rows."""

    #: The source's columns.
    payload: Sequence[str]
    #: The SQL of the staged provenance columns (see :func:`constant_columns`).
    provenance: str
    #: How the staged rows read with their unchanged values filled (None: as staged).
    resolved: Resolved | None
    #: A full refresh's table of every row's (ord, _cid, _chash); None: the transition ``tr``.
    keys: str | None
    #: The name of the whole capture's staged rows (for the columns' types).
    staged: str
    #: The key columns the deletes of ids no staged row holds take from table
    #: ``gone`` (an event stream's new snapshot: ``capture._resnapshot``); else none.
    gone: Sequence[str] = ()

    def select(self) -> str:
        """The output's columns over ``c`` (the staged rows) and ``tr`` (the chosen)."""
        cols = ", ".join(f"c.{quote_ident(n)}" for n in self.payload)
        return (
            f"{cols}, tr.id AS {prov.ID}, tr.op AS {prov.OP}, "
            f"tr.new_hash AS {prov.PAYLOAD_HASH}{self.provenance}"
        )

    def rows(self, relation: str, ordinals: tuple[int, int]) -> str:
        """The SQL of the rows of ``relation`` (ordinals in ``ordinals``), filled."""
        if self.resolved is None:
            return f"SELECT * FROM {relation}"
        return self.resolved.sql(relation, ordinals)

    def chosen(self, ordinals: tuple[int, int]) -> str:
        """The SQL of the rows to deliver whose ordinals lie in ``ordinals``."""
        within = f"ord BETWEEN {ordinals[0]} AND {ordinals[1]}"
        if self.keys is not None:
            return (
                "SELECT ord, _cid AS id, 'snapshot' AS op, _chash AS new_hash "
                f"FROM {self.keys} WHERE {within}"
            )
        return f"SELECT ord, id, op, new_hash FROM tr WHERE op <> 'same' AND {within}"

    def unstaged(self) -> str | None:
        """The SQL of the deletes of ids no staged row holds (a whole capture's), if any."""
        if self.keys is not None:
            return None
        none = self.rows(f"(SELECT * FROM {self.staged} LIMIT 0)", (0, -1))
        # (built on the empty side, written on the right: built on the deletes, a
        # snapshot's 2M of them ran out of DuckDB's 61 MB in a re-capture)
        on = f"c.{_ORDINAL} = tr.ord"
        if self.gone:
            keys = ", ".join(quote_ident(k) for k in self.gone)
            none = f"SELECT n.* EXCLUDE ({keys}), g.* FROM gone g LEFT JOIN ({none}) n ON false"
            on = "c._kid = tr.id"
        return (
            f"SELECT {self.select()} FROM "
            "(SELECT * FROM tr WHERE ord IS NULL AND op <> 'same') tr "
            f"LEFT JOIN ({none}) c ON {on}"
        )


def part_rows(
    con: duckdb.DuckDBPyConnection,
    ranges: Sequence[PartRange],
    schema: pa.Schema,
    delivered: Delivered,
    *,
    ordered: bool,
    fixed: _Constants,
    batch_rows: int,
    roomier: Callable[[], object] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows to deliver, one staged part (of ``schema``) at a time, in the parts' order.

    Each part's rows meet the transition's rows (or a full refresh's keys)
    and the fills of their own ordinal range: each join builds its hash table
    on a part's share, never on the whole backlog's, and no part is read
    ahead of the next. ``ordered``: each part's rows in ordinal order (an
    event stream's; the parts' own order is the ordinals').

    ``roomier``: gives the connection more memory. A part that ran out of
    memory before it gave a row is read again after it; without it (or
    after a row), the error stands.
    """
    select = delivered.select()
    large = delivered.resolved is not None and bool(delivered.resolved.large())
    parts: dict[Path, tuple[StagedParts, int]] = {}  # (shared by its windows: weighed once)
    for path, ordinals in ranges:
        if delivered.resolved is None and delivered.keys is None and not ordered:
            taken = _taken(con, path, ordinals, schema, delivered)
            if taken is not None:
                yield from (fixed.add(b) for b in taken.batches(batch_rows))
                continue
        sql = (
            f"SELECT {select} FROM ({delivered.rows(_PART, ordinals)}) c "
            f"JOIN ({delivered.chosen(ordinals)}) tr ON c.{_ORDINAL} = tr.ord"
            + (" ORDER BY tr.ord" if ordered else "")
        )
        if path not in parts:
            part = StagedParts([path], schema, budget=COPY_BATCH_BYTES, joined=True)
            parts[path] = (part, _joined_rows(part, batch_rows))
        part, rows = parts[path]
        con.register(_PART, part.within(ordinals))
        try:
            if large:
                yield from (fixed.add(b) for b in _large_batches(con, sql, rows, roomier))
            else:
                yield from (fixed.add(b) for b in _part_batches(con, sql, rows, roomier))
        finally:
            con.unregister(_PART)
    unstaged = delivered.unstaged()
    if unstaged is not None:
        for batch in con.sql(unstaged).to_arrow_reader(batch_rows):
            yield fixed.add(batch)


def _joined_rows(part: StagedParts, batch_rows: int) -> int:
    """Rows of a batch of ``part``'s joined output: ``OUTPUT_BATCH_BYTES`` of them, about.

    A Delivery's chunks slice a batch, which stays whole until its last
    chunk is written: 16,384 rows of 300 columns (40 MB a batch) left the
    two writers' queues holding ~50 MB more at a wide backlog's peak. A
    row weighs as its staged part's heaviest (the fills a statement meets
    come in windows of ``FILL_WINDOW_BYTES``, which end a batch). The rows
    are a power of two (DuckDB hands its 2,048-row vectors over whole):
    each batch costs a Python pass over every column (2 MB batches of 300
    columns: +1.5 CPU-s in 14).
    """
    rows = max(1, min(batch_rows, OUTPUT_BATCH_BYTES // max(1, part.heaviest_row())))
    return 1 << (rows.bit_length() - 1)


def _part_batches(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    batch_rows: int,
    roomier: Callable[[], object] | None,
) -> Iterator[pa.RecordBatch]:
    """``sql``'s batches; out of memory before its first, once more given ``roomier``'s room.

    A CDC backlog's filled rows are delivered at a lowered memory: on data
    that needed more (wide unchanged values, 4,000 rows), the capture failed
    for memory, and every retry of it alike, the dataset stuck behind it.
    """
    import duckdb

    def started() -> tuple[pa.RecordBatchReader, pa.RecordBatch | None]:
        reader = con.sql(sql).to_arrow_reader(batch_rows)
        return reader, next(iter(reader), None)

    try:
        reader, first = started()
    except duckdb.OutOfMemoryException:
        if roomier is None:
            raise
        roomier()
        reader, first = started()
    if first is not None:
        yield first
        yield from reader


def _large_batches(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    batch_rows: int,
    roomier: Callable[[], object] | None,
) -> Iterator[pa.RecordBatch]:
    """:func:`_part_batches` of rows filled with values of megabytes: on one thread, then purged.

    Each of DuckDB's threads reads a row group of the fills and joins it,
    a few values of megabytes each; and what a statement freed stayed in
    DuckDB's jemalloc (~60-100 MB resident beside 2-40 MB allocated) until
    its decay, which only DuckDB's next allocations advance. A backlog of
    5-10 MB byte strings peaked ~30 MB lower with both (bench/RESULTS.md,
    forty-eighth session).
    """
    with single_thread(con):
        yield from _part_batches(con, sql, batch_rows, roomier)
    purge_duckdb()


def _taken(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    ordinals: tuple[int, int],
    schema: pa.Schema,
    delivered: Delivered,
) -> _Taken | None:
    """A part's rows to deliver, taken by position from the mapped part, or None.

    A transition's rows of a part whose ordinals run one by one from its
    first row are its rows at ``ord - first``: taken in Arrow, the part's
    other rows (most of a re-capture's) are neither scanned nor converted
    by DuckDB. None (the caller joins in DuckDB) where the part's ordinals
    have gaps or its columns are not ``schema``'s (a part staged before a
    column appeared or widened).
    """
    part = pa.Table.from_batches(list(read_part(path)))  # (only its ordinals are read)
    staged = [n for n in (prov.EMITTED_AT, prov.SOURCE_POSITION) if n in schema.names]
    names = [*delivered.payload, *staged]
    if not part.num_rows or any(
        n not in part.schema.names or part.schema.field(n).type != schema.field(n).type
        for n in (*names, _ORDINAL)
    ):
        return None
    first = int(part.column(_ORDINAL)[0].as_py())
    expected = pa.array(np.arange(first, first + part.num_rows)).cast(
        part.schema.field(_ORDINAL).type
    )
    if not part.column(_ORDINAL).equals(pa.chunked_array([expected])):
        return None
    chosen = con.sql(f"{delivered.chosen(ordinals)} ORDER BY ord").to_arrow_table()
    ords = chosen.column("ord")
    if (
        chosen.num_rows
        and not first <= pc.min(ords).as_py() <= pc.max(ords).as_py() < first + part.num_rows
    ):
        return None  # (rows of no part: joined, never dropped)
    return _Taken(path, names, chosen, first, delivered.payload)


#: Bytes of the staged rows one taken batch holds at most (one row at least): a
#: Delivery's chunk (``CHUNK_BYTES``). Its chunks slice a batch, which stays whole until
#: the last is written: a wide backlog's whole part taken at once (64 MB) held ~195 MB
#: with the writers' queues (8 MB windows: ~6 MB more at the peak than 2 MB ones).
TAKE_BYTES = CHUNK_BYTES


@dataclass(frozen=True, slots=True)
class _Taken:
    """A part's chosen rows (``chosen``: ord, id, op, new_hash, by ord), each taken from
    the staged batch holding it, a window of at most ``TAKE_BYTES`` at a time."""

    path: Path
    names: list[str]
    chosen: pa.Table
    first: int
    payload: Sequence[str]

    @property
    def num_rows(self) -> int:
        """How many rows are taken."""
        return int(self.chosen.num_rows)

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows to deliver, in ordinal order, in batches of at most ``batch_rows``.

        Each staged batch is mapped on its own: the pages read leave memory
        with it, where one mapping of the part held every page read until its end.
        """
        index = np.asarray(self.chosen.column("ord").to_numpy()) - self.first
        start = 0
        for i in range(part_batches(self.path)):
            part = read_part_batch(self.path, i).select(self.names)
            end = start + part.num_rows
            lo, hi = (int(x) for x in np.searchsorted(index, [start, end]))
            width = max(1, part.nbytes // max(1, part.num_rows))
            step = max(1, min(batch_rows, TAKE_BYTES // width))
            for at in range(lo, hi, step):
                n = min(step, hi - at)
                yield self._window(part, index[at : at + n] - start, self.chosen.slice(at, n))
            start = end

    def _window(self, part: pa.RecordBatch, rows: Any, chosen: pa.Table) -> pa.RecordBatch:
        taken = part.take(pa.array(rows))
        ids = chosen.combine_chunks()
        columns = {n: taken.column(n) for n in self.payload}
        columns |= {prov.ID: ids.column("id").chunk(0), prov.OP: ids.column("op").chunk(0)}
        columns |= {prov.PAYLOAD_HASH: ids.column("new_hash").chunk(0)}
        columns |= {n: taken.column(n) for n in self.names[len(self.payload) :]}
        return pa.record_batch(columns)
