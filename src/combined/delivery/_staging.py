"""Run-scoped staging and the Delivery writer.

Everything a Run writes before its lake commit lives under
``<lake>/_staging/<run_id>/`` and is accounted against the run's byte, file
and path limits: a breach fails the Run and leaves the lake untouched.
"""

from __future__ import annotations

import copy
import hashlib
import queue
import shutil
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
import pyarrow.parquet as pq

from combined.errors import StagingLimitExceeded
from combined.lake import (
    FileStats,
    RowGroups,
    confined,
    constant_dictionary,
    dictionary_columns_taken,
    parquet_writer,
    to_lake,
)
from combined.protocol import _provenance as prov


@dataclass(frozen=True, slots=True)
class Limits:
    """Run-scoped staging limits."""

    max_bytes: int = 20 * 2**30
    max_files: int = 10_000
    max_path_length: int = 240
    #: Codec of the staged capture parts (private and short-lived: cheap to write):
    #: ``none``, ``lz4`` or ``zstd`` (Arrow IPC buffer compression).
    compression: str = "none"


class StagingArea:
    """The private, run-scoped directory a Run stages into."""

    def __init__(self, root: Path, limits: Limits) -> None:
        self.root = root
        self.limits = limits
        self.bytes = 0
        self.files = 0
        self._lock = threading.Lock()  # partitions stage from several threads

    def path(self, relative: str) -> Path:
        """A confined path under the staging root (created parents)."""
        p = confined(self.root, relative, self.limits.max_path_length)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def account(self, nbytes: int, files: int = 0) -> None:
        """Add written bytes and files; raise when a limit is exceeded."""
        with self._lock:
            self.bytes += nbytes
            self.files += files
        if self.bytes > self.limits.max_bytes:
            raise StagingLimitExceeded(
                f"the run staged {self.bytes} bytes, over the limit of {self.limits.max_bytes}",
                hint="raise staging.max_bytes in combined.yaml, capture fewer datasets at once, "
                "or stage compressed (staging.compression: zstd)",
            )
        if self.files > self.limits.max_files:
            raise StagingLimitExceeded(
                f"the run staged {self.files} files, over the limit of {self.limits.max_files}",
                hint="raise staging.max_files or delivery.max_rows in combined.yaml",
            )

    def erase(self, relative: str) -> None:
        """Erase a private staging subtree (never the raw layer)."""
        shutil.rmtree(confined(self.root, relative, 10_000), ignore_errors=True)

    def erase_all(self) -> None:
        """Erase the whole run staging directory."""
        shutil.rmtree(self.root, ignore_errors=True)


#: The staged capture parts are Arrow IPC files: written as the batches are
#: held in memory and read back without decoding (Parquet cost the stager
#: ~0.4 CPU-s to encode and the reduction ~0.6 CPU-s to decode per 2M rows,
#: for files that live only until the commit).
PART_SUFFIX = ".arrow"


def _ipc_options(compression: str) -> pa.ipc.IpcWriteOptions:
    return pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)


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
        if not self._alone[path]:
            return read_part(path)
        return (read_part_batch(path, i) for i in range(part_batches(path)))

    @property
    def least(self) -> int:
        """The fewest rows a slice holds (:func:`least_rows`)."""
        return least_rows(self.schema, joined=self.joined)

    def heaviest_row(self) -> int:
        """The weight (:func:`scan_weight`) of the heaviest batch's rows, on average."""
        return max(
            (
                -(-scan_weight(b) // b.num_rows)
                for path in self.paths
                for b in read_part(path)
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


@dataclass(frozen=True, slots=True)
class StagedDelivery:
    """A Delivery file staged for commit."""

    id: str
    source: str
    dataset: str
    sequence: int
    schema_revision: int
    record_count: int
    byte_count: int
    content_hash: str
    path: Path
    #: The file's Delta statistics (JSON), so a commit can add it without reading it.
    stats: str | None = None


def delivery_id(run_id: str, source: str, dataset: str, sequence: int) -> str:
    """The deterministic id of a Delivery."""
    return hashlib.sha256(f"{run_id}|{source}|{dataset}|{sequence}".encode()).hexdigest()[:32]


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes.

    Read into one reused buffer of 256 KiB (``hashlib.file_digest``), where
    a new 1 MiB block a read left the cache before it was hashed: 0.17 ->
    0.12 CPU-s for 184 MB of Deliveries, each hashed when written and again
    before its commit.
    """
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


#: Chunks queued for each Delivery's writer: memory holds a few chunks, never a
#: Delivery. With one, the reader waits on the filling Delivery's writer chunk by
#: chunk, and the two writers mostly took turns; with four, the older Delivery's
#: writer still has chunks to encode while the newer one fills (a first
#: baseline's Deliveries: 3.7-4.1 s -> 3.0-3.2 s at 2M rows, +13-23 MB).
FEED_CHUNKS = 4
#: Arrow bytes of a chunk, at most (a batch of wide rows is cut into several):
#: the feeds' chunks are what the writers hold beside their row groups, and
#: four 16k-row batches of a wide table's backlog held ~25 MB a writer.
CHUNK_BYTES = 2 << 20
#: Rows of a constant column built once per Delivery and sliced for each chunk
#: (the output's chunks are shorter; a longer one gets its own).
FEED_ROWS = 65_536


@dataclass(frozen=True, slots=True)
class _Target:
    """Where and how a run's Deliveries of one dataset are written."""

    area: StagingArea
    run_id: str
    source: str
    dataset: str
    schema: pa.Schema
    schema_revision: int
    #: Columns every row holds one value of (the constant provenance), with that value.
    constants: Mapping[str, pa.Scalar] = field(default_factory=dict)
    #: Columns whose values may be too large for Parquet statistics (see ``parquet_writer``).
    large_values: Collection[str] = ()


class _Stamp:
    """Sets a Delivery's constant columns on each chunk: its id, and the transition's constants.

    The string ones the file's writer takes as one-value dictionaries
    (:func:`combined.lake.dictionary_columns_taken`) are given as such, sliced
    from one array (their chunks share one dictionary); the others repeat
    their value (only the Delivery id is set over what the chunk holds:
    the other constants are the values its rows were given already).
    """

    def __init__(self, schema: pa.Schema, values: Mapping[str, pa.Scalar]) -> None:
        self.schema = schema
        self.values = values
        self.dictionaries: dict[str, pa.Array] = {}

    def start(self, writer: pq.ParquetWriter) -> None:
        """Use the dictionaries ``writer`` takes."""
        taken = dictionary_columns_taken(writer)
        self.dictionaries = {
            n: constant_dictionary(v, FEED_ROWS) for n, v in self.values.items() if n in taken
        }

    def __call__(self, chunk: pa.RecordBatch) -> pa.RecordBatch:
        n = chunk.num_rows
        for name, value in self.values.items():
            array = self.dictionaries.get(name)
            if array is None and name != prov.DELIVERY_ID:
                continue
            i = self.schema.get_field_index(name)
            if array is None:
                column: pa.Array = pa.repeat(value, n)
            elif n <= len(array):
                column = array.slice(0, n)
            else:
                column = constant_dictionary(value, n)
            chunk = chunk.set_column(i, pa.field(name, column.type), column)
        return chunk


def _write_delivery(
    target: _Target, seq: int, feed: queue.Queue[pa.RecordBatch | None]
) -> StagedDelivery:
    """Write Delivery ``seq`` from the chunks ``feed`` brings until its ``None``."""
    area, schema = target.area, target.schema
    did = delivery_id(target.run_id, target.source, target.dataset, seq)
    path = area.path(f"{target.source}/{target.dataset}/deliveries/{seq:09d}-{did}.parquet")
    area.account(0, files=1)
    stats = FileStats(schema)
    values = {
        **target.constants,
        prov.DELIVERY_ID: pa.scalar(did, schema.field(prov.DELIVERY_ID).type),
    }
    stamp = _Stamp(schema, {n: v for n, v in values.items() if n in schema.names})
    chunk = feed.get()
    # The first chunk decides which columns get a dictionary (its
    # Delivery id is still null: constant either way).
    constants = [n for n, v in stamp.values.items() if v.is_valid]
    with parquet_writer(
        path, schema, sample=chunk, dictionaries=constants, large_values=target.large_values
    ) as writer:
        stamp.start(writer)
        groups = RowGroups(writer)  # chunks gather into full row groups
        accounted = 0
        while chunk is not None:
            chunk = stamp(chunk)
            stats.add(chunk)
            groups.add(chunk)
            size = path.stat().st_size  # row groups reach the file as they fill
            area.account(size - accounted)
            accounted = size
            chunk = feed.get()
        groups.close()
    size = path.stat().st_size
    area.account(size - accounted)
    return StagedDelivery(
        id=did,
        source=target.source,
        dataset=target.dataset,
        sequence=seq,
        schema_revision=target.schema_revision,
        record_count=stats.rows,
        byte_count=size,
        content_hash=file_hash(path),
        path=path,
        stats=stats.to_json(),
    )


class _Feed(queue.Queue):  # type: ignore[type-arg]
    """A writer's queue of chunks: full at ``maxsize`` chunks, or their bytes at ``CHUNK_BYTES``.

    For rows that may hold values of megabytes (the reduction's
    ``large_values``): a chunk holds at least a row, so such rows made
    chunks of megabytes, and four rows of 5-10 MB byte strings were queued
    for each writer. An empty queue takes any chunk. (Not for other rows: a
    slice's ``nbytes`` counts a dictionary's or a view's data buffers
    whole.)
    """

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self._bytes = 0

    def _put(self, item: pa.RecordBatch | None) -> None:
        super()._put(item)
        self._bytes += 0 if item is None else item.nbytes

    def _get(self) -> pa.RecordBatch | None:
        item = super()._get()
        self._bytes -= 0 if item is None else item.nbytes
        return item

    def _qsize(self) -> int:
        return max(len(self.queue), self._bytes // CHUNK_BYTES)


class _Writers:
    """At most two Deliveries written at once (one of large values), each fed its chunks
    through a bounded queue."""

    def __init__(self, pool: ThreadPoolExecutor, target: _Target, first_sequence: int) -> None:
        self.pool, self.target, self.first_sequence = pool, target, first_sequence
        #: Deliveries being written, oldest first: their chunk feed and their result.
        self.active: list[tuple[queue.Queue[pa.RecordBatch | None], Future[StagedDelivery]]] = []
        self.done: list[StagedDelivery] = []
        self.opened = 0

    def open(self) -> None:
        """Start the next Delivery (waiting for the older of two to finish first).

        Rows holding values of megabytes are written one Delivery at a time,
        its queue bounded by bytes too (:class:`_Feed`): each writer holds a
        row group of them and their encoding (a byte string's page,
        compressed and not), and a backlog of 5-10 MB byte strings peaked
        ~30 MB higher with two (bench/RESULTS.md).
        """
        large = bool(self.target.large_values)
        if len(self.active) == (1 if large else 2):
            self.done.append(self.active.pop(0)[1].result())
        feed: queue.Queue[pa.RecordBatch | None] = (_Feed if large else queue.Queue)(FEED_CHUNKS)
        seq = self.first_sequence + self.opened
        self.active.append((feed, self.pool.submit(_write_delivery, self.target, seq, feed)))
        self.opened += 1

    def send(self, item: pa.RecordBatch | None, i: int = -1, *, quiet: bool = False) -> None:
        """Give the Delivery ``i`` (the newest) a chunk, or its end (``None``)."""
        feed, result = self.active[i]
        while True:
            try:
                feed.put(item, timeout=0.1)
                return
            except queue.Full:
                if result.done():  # the writer failed: its error, not a wait
                    if not quiet:
                        result.result()
                    return

    def finish(self) -> list[StagedDelivery]:
        """Every Delivery written, in sequence order."""
        return self.done + [result.result() for _, result in self.active]

    def abandon(self) -> None:
        """End the feeds of writers still running (a failed stream's staging is erased)."""
        for i in range(len(self.active)):
            if not self.active[i][1].done():
                self.send(None, i, quiet=True)


def _chunk_rows(batch: pa.RecordBatch) -> int:
    """Rows of ``batch`` a chunk takes: at most about ``CHUNK_BYTES`` of them, at least one."""
    rows: int = batch.num_rows
    return max(1, rows * CHUNK_BYTES // max(int(batch.nbytes), 1))


def write_deliveries(
    area: StagingArea,
    batches: Iterable[pa.RecordBatch],
    *,
    run_id: str,
    source: str,
    dataset: str,
    first_sequence: int,
    schema: pa.Schema,
    schema_revision: int,
    max_rows: int,
    max_bytes: int,
    allow_empty: bool = False,
    constants: Mapping[str, pa.Scalar] | None = None,
    large_values: Collection[str] = (),
) -> list[StagedDelivery]:
    """Cut ``batches`` into bounded Delivery files with deterministic ids.

    Each Delivery streams to a writer thread as its chunks arrive, and two
    Deliveries are encoded at a time (Parquet encoding is the cost, and it
    releases the GIL): memory holds a few chunks, never a whole Delivery.
    Each file's Delta statistics are gathered on the way. With
    ``allow_empty``, a stream without rows still yields one empty Delivery
    (a commit that only carries a checkpoint). ``constants``: columns every
    row of ``batches`` holds one value of, with that value (written from it);
    ``large_values``: columns a row may hold a value of megabytes in.
    """
    target = _Target(
        area, run_id, source, dataset, schema, schema_revision, constants or {}, large_values
    )
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="delivery") as pool:
        writers = _Writers(pool, target, first_sequence)
        current = False  # whether the newest active Delivery still takes chunks
        rows = nbytes = 0
        try:
            for batch in batches:
                offset, most = 0, _chunk_rows(batch)
                while offset < batch.num_rows:
                    if not current:
                        writers.open()
                        current, rows, nbytes = True, 0, 0
                    chunk = batch.slice(offset, min(max_rows - rows, most))
                    writers.send(chunk)
                    rows += chunk.num_rows
                    nbytes += chunk.nbytes
                    offset += chunk.num_rows
                    if rows >= max_rows or nbytes >= max_bytes:
                        writers.send(None)
                        current = False
            if not current and allow_empty and writers.opened == 0:
                writers.open()
                current = True
            if current:
                writers.send(None)
                current = False
            return writers.finish()
        finally:
            writers.abandon()
