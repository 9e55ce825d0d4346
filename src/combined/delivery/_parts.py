"""Staged capture parts: the batches a capture staged, as Arrow IPC files under its
staging area, and the stream DuckDB scans them as (:class:`StagedParts`)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc

from combined.delivery._staging import StagingArea
from combined.lake import to_lake
from combined.protocol import _provenance as prov

#: The staged capture parts are Arrow IPC files: written as the batches are
#: held in memory and read back without decoding (Parquet cost the stager
#: ~0.4 CPU-s to encode and the reduction ~0.6 CPU-s to decode per 2M rows,
#: for files that live only until the commit).
PART_SUFFIX = ".arrow"


def _ipc_options(compression: str) -> pa.ipc.IpcWriteOptions:
    return pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)


#: What a staged batch of wide rows (over ``SCAN_BATCH_BYTES / VECTOR_ROWS``,
#: 512 B, on average) weighs at most: a heavier one is staged in slices. Each
#: batch of a part of such batches is read in a mapping of its own (see
#: :func:`_mapped_alone`), which holds every page a scan of it read until its
#: last slice goes: a change stream of 300 mostly-null columns staged 31,000
#: rows (61 MB) a batch, and ~96 MB of its part was resident while its rows
#: were delivered (a 50,000-row backlog peaked at 483-499 MB).
STAGED_BATCH_BYTES = 4 << 20


def _staged_slices(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """``batch`` as it is staged: whole, or (wide rows over ``STAGED_BATCH_BYTES``) in slices.

    A slice holds more than ``GATHERED_ROWS`` rows (a last, shorter one
    joins the one before): a joined scan reads no fewer together
    (:func:`least_rows`), and would copy shorter ones into one.
    """
    rows, nbytes = batch.num_rows, int(batch.nbytes)
    if nbytes <= STAGED_BATCH_BYTES or nbytes <= rows * (SCAN_BATCH_BYTES // VECTOR_ROWS):
        yield batch
        return
    step = max(GATHERED_ROWS + 1, rows * STAGED_BATCH_BYTES // nbytes)
    starts = list(range(0, rows, step))
    if len(starts) > 1 and rows - starts[-1] <= GATHERED_ROWS:
        starts.pop()
    ends = [*starts[1:], rows]
    for start, end in zip(starts, ends, strict=True):
        yield batch.slice(start, end - start)


class PartWriter:
    """Writes a stream of batches as bounded Arrow IPC parts under staging."""

    def __init__(self, area: StagingArea, prefix: str, max_rows: int, max_bytes: int) -> None:
        self.area = area
        self.prefix = prefix
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.parts: list[Path] = []
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._rows = 0
        self._bytes = 0
        self._accounted = 0  # bytes of the open part already counted by the area
        self._schema: pa.Schema | None = None

    def again(self, name: str) -> PartWriter:
        """A writer of other parts, named ``name``, under the same limits."""
        return PartWriter(self.area, f"{self.prefix}-{name}", self.max_rows, self.max_bytes)

    def write(self, batch: pa.RecordBatch) -> None:
        """Append a batch, cutting a new part at the row or byte limit."""
        if self._writer is None and batch.num_rows == 0:
            self._roll(batch)  # an empty capture still has a part with its schema
        if self._schema is not None and not batch.schema.equals(self._schema):
            self._roll(batch)  # a widened schema starts a new part
        for piece in _staged_slices(batch):
            self._append(piece)

    def _append(self, batch: pa.RecordBatch) -> None:
        offset = 0
        while offset < batch.num_rows:
            if self._writer is None or self._full():
                self._roll(batch.slice(offset))
            room = self.max_rows - self._rows
            chunk = batch.slice(offset, room)
            assert self._writer is not None
            self._writer.write_batch(chunk)
            self._rows += chunk.num_rows
            self._bytes += chunk.nbytes
            offset += chunk.num_rows
            self._account()  # as it is written: a limit stops the run near it, not a part later

    def _full(self) -> bool:
        return self._rows >= self.max_rows or self._bytes >= self.max_bytes

    def _account(self) -> None:
        """Count the bytes the open part holds on disk that are not counted yet."""
        size = self.parts[-1].stat().st_size
        self.area.account(size - self._accounted)
        self._accounted = size

    def _roll(self, first: pa.RecordBatch) -> None:
        self._close_current()
        path = self.area.path(f"{self.prefix}/part-{len(self.parts):06d}{PART_SUFFIX}")
        self._schema = schema = first.schema
        self._writer = pa.ipc.new_file(
            str(path), schema, options=_ipc_options(self.area.limits.compression)
        )
        self.parts.append(path)
        self._rows = self._bytes = self._accounted = 0
        self.area.account(0, files=1)

    def _close_current(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._account()

    def close(self) -> list[Path]:
        """Finish the last part; returns every part written."""
        self._close_current()
        return self.parts

    def abort(self) -> None:
        """Close the open part, counting no more of it (the failing capture's staging is erased)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except (OSError, pa.ArrowException):  # pragma: no cover - failing already
                pass


def part_schema(path: Path) -> pa.Schema:
    """The schema of a staged part."""
    with pa.OSFile(str(path)) as f:
        schema: pa.Schema = pa.ipc.open_file(f).schema
        return schema


def read_part(path: Path) -> Iterator[pa.RecordBatch]:
    """A staged part's batches as written.

    The file is mapped, nothing is copied or decoded: a scan touches only
    the pages of the columns it reads, and the mapping goes with the last of
    its batches (memory holds a part's pages while it is read, not the capture's).
    """
    with pa.memory_map(str(path)) as f:
        reader = pa.ipc.open_file(f)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def part_batches(path: Path) -> int:
    """How many batches a staged part holds."""
    with pa.memory_map(str(path)) as f:
        count: int = pa.ipc.open_file(f).num_record_batches
        return count


def read_part_batch(path: Path, index: int) -> pa.RecordBatch:
    """Batch ``index`` of a staged part, in a mapping of its own.

    The pages it reads leave memory with the batch: one mapping of the
    whole part holds every page read from it until its last batch goes.
    """
    with pa.memory_map(str(path)) as f:
        batch: pa.RecordBatch = pa.ipc.open_file(f).get_batch(index)
        return batch


#: Rows DuckDB evaluates an expression over at a time (its vector size).
VECTOR_ROWS = 2048
#: What a batch a scan hands DuckDB weighs at most (bytes, see
#: :func:`scan_weight`) when its rows are heavier than this over ``VECTOR_ROWS``.
#: DuckDB evaluates a batch's rows a vector at a time, and hashing a vector of
#: lists (their canonical text, ``array_to_string``) held ~7 times its weight
#: in each thread: 2,216 rows of 11 kB text arrays, or 3,000 rows of three
#: 2 kB lists, ran out of a change stream reduction's 64 MB at every retry
#: (cut at 4 MB they still did, at 2 MB they passed: see
#: tests/runtime/test_reduce_streamed.py).
SCAN_BATCH_BYTES = 1 << 20
#: What a batch weighs at most where a scan only copies its rows out (a part's
#: delivered rows): cut at 1 MB, 3,750 rows of 20 kB texts held 489 MB
#: delivered, at 4 MB 356 MB; whole, 6,000 rows of 5,000-element lists asked
#: DuckDB for 1 GB at once, and at 16 MB 3,000 of 500 filled ones failed in
#: the reduction's 70 MB.
COPY_BATCH_BYTES = 4 << 20
#: Bytes DuckDB holds for each element of a list beside the element's own (a
#: string's 16-byte header), which Arrow's 4-byte offsets undercount.
ELEMENT_BYTES = 16


#: Chunks of at most this many rows a DuckDB join gathers into one of up to
#: ~2,048 rows (its caching operators), unless a column is a list, a map or an
#: array: a change stream's filled rows of three 20 kB byte strings, cut into
#: 17-row slices (or 64-row ones), reached the hash that follows the fill join
#: as 2,048-row vectors, 570 MB of anonymous memory outside DuckDB's limit;
#: cut into 65-row slices, 160 MB. A slice of rows whose values hold no list
#: holds more than this many where a join reads it (the staged provenance's
#: list, ``_combined_unchanged``, leaves a join before its output); a scan
#: that is hashed without a join is cut finer (three rows of 300 kB bytes
#: hashed held ~50 MB in each thread, 65 of them ~160 MB).
GATHERED_ROWS = 64


def scan_weight(batch: pa.RecordBatch) -> int:
    """``batch``'s Arrow bytes, and ``ELEMENT_BYTES`` for each element of its lists."""
    weight: int = batch.nbytes
    nested = list(batch.columns)
    while nested:
        column = nested.pop()
        if isinstance(column, pa.MapArray):  # (no flatten: its entries by their offsets)
            offsets = column.offsets
            weight += ELEMENT_BYTES * (offsets[-1].as_py() - offsets[0].as_py())
        elif isinstance(column, pa.ListArray | pa.LargeListArray):
            nested.append(column.flatten())
            weight += ELEMENT_BYTES * len(nested[-1])
        elif isinstance(column, pa.StructArray):  # (a list in a struct: its elements too)
            nested.extend(column.flatten())
    return weight


def _nested(kind: pa.DataType) -> bool:
    """Whether DuckDB reads ``kind`` as (or as holding) a list, a map or an array."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        return True
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list_view(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_nested(kind.field(i).type) for i in range(kind.num_fields))
    return False


def least_rows(schema: pa.Schema, *, joined: bool) -> int:
    """The fewest rows a slice of ``schema`` a scan reads holds (``joined``: a join reads it).

    A join's slices of rows whose values hold no list hold more than
    ``GATHERED_ROWS``: DuckDB would gather shorter ones into a vector of up
    to 2,048 rows again.
    """
    values = (f for f in schema if not f.name.startswith(prov.PREFIX))
    return GATHERED_ROWS + 1 if joined and not any(_nested(f.type) for f in values) else 1


def scan_slices(
    batch: pa.RecordBatch, budget: int = SCAN_BATCH_BYTES, least: int = 1
) -> Iterator[pa.RecordBatch]:
    """``batch`` in slices weighing at most ``budget`` (whole if its vectors do).

    A slice holds at least ``least`` rows (a last one that would hold fewer
    joins the one before).
    """
    rows = batch.num_rows
    step = max(1, least, rows * budget // max(scan_weight(batch), 1))
    if step >= min(rows, VECTOR_ROWS):
        yield batch
        return
    starts = list(range(0, rows, step))
    if rows - starts[-1] < least:
        starts.pop()  # (at least two: step < rows)
    for i, offset in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else rows
        yield batch.slice(offset, end - offset)


#: A staged part of wide rows (over ``SCAN_BATCH_BYTES / VECTOR_ROWS``, 512 B,
#: on average) whose batches average more than this is read a batch to a
#: mapping. A mapping of its own costs a batch ~0.17 ms (its footer read again,
#: its pages faulted in anew): a change stream's 4,096-row batches of narrow
#: rows, so read, took a 500k-change reduction from 3.4-3.8 to 4.2 CPU-s, and
#: 65,536-row batches of 80-byte rows scanned 15-20% slower.
MAPPED_ALONE_BYTES = 1 << 20


def _mapped_alone(path: Path) -> bool:
    """Whether ``path``'s batches are read a batch to a mapping (heavy batches of wide rows)."""
    size = path.stat().st_size
    with pa.memory_map(str(path)) as f:
        reader = pa.ipc.open_file(f)
        count: int = reader.num_record_batches
        rows: int = sum(reader.get_batch(i).num_rows for i in range(count))  # (their headers)
    wide = size // max(rows, 1) > SCAN_BATCH_BYTES // VECTOR_ROWS
    return count > 0 and wide and size // count > MAPPED_ALONE_BYTES


def read_staged(path: Path, *, alone: bool | None = None) -> Iterator[pa.RecordBatch]:
    """A staged part's batches: in one mapping, or (heavy batches of wide rows) one each.

    ``alone``: whether they are read a batch to a mapping, if known
    (else :func:`_mapped_alone` finds it). Where a part's batches are taken
    whole and queued (a first baseline's rows, straight to the Delivery
    writers), one mapping kept every page read of the part until its last
    batch went: a part of 1-row batches of 7-27 MB had ~200 MB of its pages
    resident while they were delivered.
    """
    if not (_mapped_alone(path) if alone is None else alone):
        return read_part(path)
    return (read_part_batch(path, i) for i in range(part_batches(path)))


class StagedParts:
    """A capture's staged parts as one stream of ``schema``, read anew by each scan.

    DuckDB asks an object with ``__arrow_c_stream__`` for a new stream each
    time a query scans it, so a view over it can be read again and again; each
    scanning thread holds the batch it is on, nothing is read ahead (a
    pyarrow dataset's scanner read ~100 MB ahead). A part written before a
    column appeared reads it as null; a narrower type is cast to ``schema``'s.
    Batches of wide rows are cut (:func:`scan_slices`) at ``budget`` bytes;
    ``joined``: a join reads the stream (and its slices are not too short).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        schema: pa.Schema,
        *,
        budget: int = SCAN_BATCH_BYTES,
        joined: bool = False,
    ) -> None:
        self.paths = list(paths)
        self.schema = schema
        self.budget = budget
        self.joined = joined
        #: The (lowest, highest) ordinal a scan reads: other rows are skipped unread.
        self.ordinals: tuple[int, int] | None = None
        #: Whether a scan reads only the rows a change marks (True), or only the others.
        self.marked: bool | None = None
        self._rows: int | None = None
        self._alone: dict[Path, bool] = {}  # (each part's, as :func:`_mapped_alone` finds)

    def within(self, ordinals: tuple[int, int], *, marked: bool | None = None) -> StagedParts:
        """These parts' rows whose ordinals lie in ``ordinals`` (sharing what was read of them).

        ``marked``: only the rows whose change marks a column unchanged
        (``_combined_unchanged``), or (False) only the others. The rows
        are picked by their ordinals and marks alone, before DuckDB reads
        them: a window of a part read the whole part before its rows were
        picked, so a part of 2,200 changes of 300 kB met its 25 windows of
        fills in 25 scans of all of it (440 MB each), 9 s of a reduction's 15.
        """
        restricted = copy.copy(self)
        restricted.ordinals, restricted.marked, restricted._rows = ordinals, marked, None
        return restricted

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every staged row, part by part, as batches of ``schema``.

        A part of heavy batches of wide rows (``MAPPED_ALONE_BYTES``) is
        read a batch to a mapping, so the pages a scan read leave the process
        with the batch: in one mapping of the part, a scan of 125 MB of staged
        wide rows held them all by its end. A joined scan's batches shorter
        than :func:`least_rows` are read together (a change stream stages rows
        of 300 kB thirteen to a batch).
        """
        least = self.least
        short: list[pa.RecordBatch] = []
        for path in self.paths:
            for batch in self._read(path):
                if self.ordinals is not None:
                    batch = rows_within(batch, self.ordinals, self.marked)
                    if not batch.num_rows:
                        continue
                if not batch.schema.equals(self.schema):
                    batch = to_lake(batch, self.schema)
                if short or batch.num_rows < least:
                    short.append(batch)
                    if sum(b.num_rows for b in short) < least:
                        continue
                    batch, short = pa.concat_batches(short), []
                yield from scan_slices(batch, self.budget, least)
        if short:
            yield pa.concat_batches(short)

    def _read(self, path: Path) -> Iterator[pa.RecordBatch]:
        """``path``'s batches: in one mapping, or (heavy batches of wide rows) one each."""
        if path not in self._alone:
            self._alone[path] = _mapped_alone(path)
        return read_staged(path, alone=self._alone[path])

    @property
    def least(self) -> int:
        """The fewest rows a slice holds (:func:`least_rows`)."""
        return least_rows(self.schema, joined=self.joined)

    def heaviest_row(self) -> int:
        """The weight (:func:`scan_weight`) of the heaviest batch's rows, on average.

        Read as a scan reads them (a part of heavy batches of wide rows a
        batch to a mapping): weighing touches a page of each string column's
        offsets, and the kernel maps the pages around each, ~32 MB of a part
        of 300 columns in one mapping.
        """
        return max(
            (
                -(-scan_weight(b) // b.num_rows)
                for path in self.paths
                for b in self._read(path)
                if b.num_rows
            ),
            default=0,
        )

    def count_rows(self) -> int:
        """The staged rows, from the batches' headers (mapped: their data is not read)."""
        if self._rows is None:
            batches = (b for path in self.paths for b in read_part(path))
            if self.ordinals is not None:
                batches = (rows_within(b, self.ordinals, self.marked) for b in batches)
            self._rows = sum(b.num_rows for b in batches)
        return self._rows

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """A new stream over the parts (the Arrow PyCapsule interface)."""
        reader = pa.RecordBatchReader.from_batches(self.schema, self.batches())
        return reader.__arrow_c_stream__(requested_schema)


def rows_within(
    batch: pa.RecordBatch,
    ordinals: tuple[int, int],
    marked: bool | None = None,
    *,
    ordinal: str = prov.ORDINAL,
) -> pa.RecordBatch:
    """``batch``'s rows whose ``ordinal`` lies in ``ordinals`` (and marks agree with ``marked``).

    Picked from those two columns alone, and the batch kept as it is where
    it holds all or none (a mapped batch's other columns are not read).
    """
    column = batch.column(ordinal)
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or high < ordinals[0] or low > ordinals[1]:
        return batch.slice(0, 0)
    inside = None
    if not ordinals[0] <= low <= high <= ordinals[1]:
        inside = pc.and_(pc.greater_equal(column, ordinals[0]), pc.less_equal(column, ordinals[1]))
    if marked and prov.UNCHANGED not in batch.schema.names:
        return batch.slice(0, 0)  # (staged before any change marked a column: none is)
    if marked is not None and prov.UNCHANGED in batch.schema.names:
        marks = pc.fill_null(
            pc.greater(pc.list_value_length(batch.column(prov.UNCHANGED)), 0), False
        )
        marks = marks if marked else pc.invert(marks)
        inside = marks if inside is None else pc.and_(inside, marks)
    if inside is None:
        return batch
    if not pc.any(inside).as_py():
        return batch.slice(0, 0)
    return batch if pc.all(inside).as_py() else batch.filter(inside)
