"""Run-scoped staging and the Delivery writer.

Everything a Run writes before its lake commit lives under
``<lake>/_staging/<run_id>/`` and is accounted against the run's byte, file
and path limits: a breach fails the Run and leaves the lake untouched.
"""

from __future__ import annotations

import hashlib
import queue
import shutil
import threading
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq

from combined.errors import StagingLimitExceeded
from combined.lake import (
    LARGE_ROW_BYTES,
    FileStats,
    RowGroups,
    confined,
    constant_dictionary,
    dictionary_columns_taken,
    parquet_writer,
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

    def open(self, first: pa.RecordBatch | None = None) -> None:
        """Start the next Delivery, whose rows start with ``first``'s (waiting for the older
        of two to finish first).

        Rows holding values of megabytes (the reduction's ``large_values``,
        or ``first``'s rows, ``LARGE_ROW_BYTES`` on average) are written one
        Delivery at a time, its queue bounded by bytes too (:class:`_Feed`):
        each writer holds a row group of them and their encoding (a byte
        string's page, compressed and not), and a backlog of 5-10 MB byte
        strings peaked ~30 MB higher with two (bench/RESULTS.md); a first
        baseline of rows of 7-27 MB queued four rows a writer.
        """
        large = bool(self.target.large_values) or (
            first is not None and first.nbytes >= LARGE_ROW_BYTES * max(first.num_rows, 1)
        )
        while len(self.active) >= (1 if large else 2):
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
                        writers.open(batch)
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
