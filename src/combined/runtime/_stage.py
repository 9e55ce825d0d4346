"""Stage a capture's batches: ordinal, identity and payload hash, bounded parts.

Each batch gets its ordinal on the reading thread; hashing (DuckDB) and then
writing (Arrow IPC) run on one worker thread, so they overlap the next read
instead of following it. Both release the GIL, as does the ADBC reader.
Groups of batches pass from the reading thread to the worker without a
buffer in between: memory holds the group being filled, the group waiting to
be taken and the group being hashed and written, bounded by the batch size.
Writing a group costs a few percent of hashing it: a thread of its own let
it overlap the hashing but held one group more (~20 MB at the peak of the
benchmark's snapshots, for no measurable time).

Rows are hashed here, once, while they stream by: the reduction then reads
only the narrow ``(ordinal, _combined_id, _combined_payload_hash)`` columns
instead of computing them over the staged capture a second time. A change
stream's batches are not hashed here: a TOAST value its change left unchanged
must be resolved before the row's payload can be hashed (the reduction does it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from combined.capture._databases import KeptDatabase
from combined.capture._reduce import UNCHANGED
from combined.delivery import PartWriter, part_schema, read_part
from combined.lake import LARGE_ROW_BYTES
from combined.protocol import _provenance as prov
from combined.protocol._digest import DEFAULT_DIGEST, Digest, digest_type
from combined.protocol.identity import compute_identity, compute_payload_hash
from combined.runtime._fold import Fold
from combined.runtime._memory import release_memory

if TYPE_CHECKING:
    import duckdb

ORDINAL = "_combined_ordinal"
_DONE = None
#: Rows hashed together (in parallel, one DuckDB thread per chunk).
GROUP_ROWS = 131_072
#: ... and at most this many bytes of them: wide rows make smaller groups.
GROUP_BYTES = 16 * 2**20
#: DuckDB's hashing holds a multiple of the Arrow bytes of the rows in each of
#: its 2,048-row vectors (bytes' hex text, a list's element texts, 300
#: columns' texts: 2-12x), once per thread. Rows this wide on average ...
WIDE_ROW_BYTES = 1024
#: ... are hashed on one thread (reading such rows keeps the other core
#: busy), and cells this large on average (big values, long lists) ...
LARGE_CELL_BYTES = 256
#: ... in slices of this many bytes (at least one row).
HASH_SLICE_BYTES = 4 * 2**20
#: Arrow bytes hashed up to which a stager's DuckDB database is kept for the next stager.
KEEP_HASHED_BYTES = 16 * 2**20

# One stager's database kept for the next: opening one costs ~14 ms of CPU,
# more than hashing a small table (a capture of 200 small tables opened 200).
# Hashing leaves nothing in it (compute_identity unregisters what it scans);
# a stager that hashed more closes its own, so a long-lived process keeps no
# large allocator caches.
_KEPT = KeptDatabase()


_T = TypeVar("_T")


class Handoff(Generic[_T]):
    """A queue without room: an item offered waits in the slot until taken.

    A producer blocks until its consumer has taken the item, so nothing is
    buffered between two stages: a capture holds one group per thread and
    one in the slot, not a queue's worth (a group is ~10 MB of rows, plus
    the batches its slices keep alive).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[_T] = []
        self._busy = False  # an item was taken and its consumer is not done with it

    def offer(self, item: _T, timeout: float) -> bool:
        """Place ``item`` once the slot is free; False if it stayed full for ``timeout``."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._items, timeout):
                return False
            self._items.append(item)
            self._cond.notify_all()
            return True

    def wait_taken(self, timeout: float) -> bool:
        """Whether the slot was emptied (the offered item taken) within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._items, timeout)

    def wait_done(self, timeout: float) -> bool:
        """Whether the offered item was taken and its consumer done with it within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._items and not self._busy, timeout)

    def get(self) -> _T:
        """Take the item, waiting for one (its consumer then calls :meth:`done`)."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._items))
            item = self._items.pop()
            self._busy = True
            self._cond.notify_all()
            return item

    def done(self) -> None:
        """The item taken last is done with."""
        with self._cond:
            self._busy = False
            self._cond.notify_all()


#: An unhashed batch smaller than both is gathered with the next ones before it is written.
SMALL_ROWS = 8192
SMALL_BYTES = 4 * 2**20


class CaptureStager:
    """Write a capture's batches into staging parts, hashed and written on a worker thread."""

    def __init__(
        self,
        writer: PartWriter,
        *,
        key: Sequence[str],
        hash_rows: bool,
        by_content: bool = False,
        first_ordinal: int = 0,
        threads: int = 2,
        digest: Digest = DEFAULT_DIGEST,
    ) -> None:
        self.writer = writer
        #: The lake table's digest format (identity encoding v1 or v2).
        self.digest = digest
        self.key = list(key)
        # A keyless event stream's identity covers every payload column: a
        # column added mid-read would give rows read before it other ids, so
        # its rows are hashed by the reduction, over the whole capture's schema.
        # A table without a key mirrored by content (``key: []``) takes its rows'
        # payload hashes from here (a null column is left out of them, added
        # mid-read or not); the reduction numbers equal rows into ids.
        self.hash_rows = hash_rows and (bool(self.key) or by_content)
        self.ordinal = first_ordinal
        self.threads = threads  # DuckDB threads hashing a group
        self.batches = 0
        self._group: list[pa.RecordBatch] = []
        #: Small unhashed batches not written yet (:meth:`_write_small`).
        self._small: list[pa.RecordBatch] = []
        self._small_size = (0, 0)  # (their rows, their bytes)
        # reading thread -> worker (hash, then write), handing groups over
        # without a buffer in between.
        self._slot: Handoff[list[pa.RecordBatch] | None] = Handoff()
        self._error: BaseException | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._hashed_bytes = 0
        self._worker: threading.Thread | None = None
        #: The rows' fold (``runtime._fold``), when asked for before the first batch.
        self.fold: Fold | None = None
        #: Whether hashing waits until the fold shows the capture changed (:meth:`hash_staged`).
        self.deferred = False

    def fold_rows(self, *, defer: bool, fold: bool = True) -> None:
        """Fold every row from now on (``fold``); with ``defer``, stage them unhashed."""
        if self.hash_rows:
            self.fold, self.deferred = Fold() if fold else None, defer

    def put(self, batch: pa.RecordBatch) -> None:
        """Number ``batch`` and hand it on (blocks while the threads lag)."""
        self._raise()
        n = batch.num_rows
        # ordinal, ordinal + 1, ...: vectorised (a Python range costs the read loop ~80 ns a row).
        ones = pa.repeat(pa.scalar(1, pa.int64()), n)
        ordinals = pc.add(pc.cumulative_sum(ones), self.ordinal - 1)
        self.ordinal += n
        self._collect(batch.append_column(ORDINAL, ordinals))

    def _collect(self, batch: pa.RecordBatch) -> None:
        """Hand a numbered batch on: written now, or hashed and written with its group."""
        self.batches += 1
        if not self.hash_rows:
            # Nothing to overlap but the write: a change stream's batches (often
            # wide) are written on this thread, holding one batch at a time.
            self._write_small(batch)
            return
        if self._group and self._group[0].schema != batch.schema:
            self._send()
        self._group.append(batch)
        rows = sum(b.num_rows for b in self._group)
        # DuckDB splits an Arrow scan among its threads ~122,880 rows at a
        # time: a group keeps two threads busy, half of one keeps one busy.
        limit = GROUP_ROWS if self.threads > 1 else GROUP_ROWS // 2
        if rows >= limit or sum(b.nbytes for b in self._group) >= GROUP_BYTES:
            self._send()

    def _write_small(self, batch: pa.RecordBatch | None) -> None:
        """Write ``batch``, small ones gathered into one (``None``: write what is gathered).

        A change stream read one transaction at a time hands on a batch a
        transaction: 500k single-row transactions of a MariaDB binlog were
        staged as 500k record batches of one row, each read, scanned and
        delivered apart (764 MB peak, 529 CPU-s). Batches under
        :data:`SMALL_ROWS` rows and :data:`SMALL_BYTES` are gathered and
        written as one; a larger batch is written as it is, after them.
        """
        small = self._small
        big = batch is not None and (batch.num_rows >= SMALL_ROWS or batch.nbytes >= SMALL_BYTES)
        if small and (batch is None or big or small[0].schema != batch.schema):
            self._small, self._small_size = [], (0, 0)
            gathered = pa.Table.from_batches(small).combine_chunks()
            # (no rows: a table gives no batch; the empty one is written, as it was)
            for part in gathered.to_batches() or small[:1]:
                self.writer.write(part)
            small = self._small
        if batch is None:
            return
        if big:
            self.writer.write(batch)
            return
        small.append(batch)
        rows, nbytes = self._small_size
        self._small_size = rows, nbytes = rows + batch.num_rows, nbytes + batch.nbytes
        if rows >= SMALL_ROWS or nbytes >= SMALL_BYTES:
            self._write_small(None)

    def _send(self) -> None:
        # Batches travel in groups: DuckDB hashes the chunks of one group in
        # parallel, where a single batch would keep one core busy.
        group, self._group = self._group, []
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, daemon=True)
            self._worker.start()
        self._put(group, staged=_heavy(group))

    def _put(self, item: list[pa.RecordBatch] | None, *, staged: bool = False) -> None:
        """Hand ``item`` to the worker; ``staged``: return once it is hashed and written.

        A group of rows of megabytes (``LARGE_ROW_BYTES`` on average) is
        staged before the next is read: overlapping them held a row being
        read, one waiting in the slot and one being hashed (DuckDB's copies
        of its values included), and rows of 7-27 MB peaked over 400 MB.
        """
        # The worker's error is raised here, on the reading thread; the worker
        # keeps taking groups (and skips them) until it sees _DONE.
        worker = self._worker
        if worker is None:  # pragma: no cover - _send starts it first
            return
        placed = False
        waited = self._slot.wait_done if staged else self._slot.wait_taken
        while True:
            placed = placed or self._slot.offer(item, timeout=0.1)
            if placed and waited(timeout=0.1):
                return
            if item is not _DONE:
                self._raise()
            if not worker.is_alive():
                return

    def close(self, empty: pa.Schema) -> list[Path]:
        """Wait for every batch to be written; return the staged parts.

        A capture that read no batch still stages one empty part of the
        ``empty`` schema, so the reduction knows its columns.
        """
        if self.batches == 0:
            self.put(pa.RecordBatch.from_pylist([], schema=empty))
        if self._group:
            self._send()
        self._write_small(None)
        self._stop()
        self._raise()
        return self.writer.close()

    def abort(self) -> None:
        """Stop the threads without raising their error (the caller is failing already).

        The writer's open part is closed once the worker, its only other
        user, has stopped.
        """
        self._stop()
        self.writer.abort()

    def _stop(self) -> None:
        if self._worker is None:
            return
        self._put(_DONE)
        self._worker.join()
        self._worker = None
        if self._con is not None:
            con, self._con = self._con, None
            if not (self._hashed_bytes <= KEEP_HASHED_BYTES and _KEPT.give(con)):
                con.close()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            group = self._slot.get()
            if group is _DONE:
                return
            if self._error is None:
                try:
                    self._stage(group)
                except BaseException as exc:  # handed to the reading thread
                    self._error = exc
            # Hold nothing while waiting for the next group: its rows are written.
            del group
            self._slot.done()

    def _stage(self, group: list[pa.RecordBatch]) -> None:
        # A method of its own, so no batch (nor the group's ids and hashes
        # its slices share) outlives the write in a local of the loop above.
        if self.fold is not None:
            self.fold.add(self._duck(), pa.Table.from_batches(group))
        for batch in group if self.deferred else self._hashed(group):
            self.writer.write(batch)
        if _heavy(group):
            # What hashing a row of megabytes left in DuckDB's and Arrow's
            # caches (~40 MB), given back before the next row is read.
            release_memory()

    def hash_staged(self, parts: list[Path], writer: PartWriter) -> list[Path]:
        """Parts staged unhashed (``deferred``), written anew by ``writer`` with their digests.

        The fold showed the capture changed: it reduces as any other, from
        parts that carry every row's id and payload hash. The unhashed parts
        are erased once the hashed ones are written.
        """
        schema = part_schema(parts[-1])
        self.writer, self.deferred, self.fold, self.batches = writer, False, None, 0
        try:
            for part in parts:
                for batch in read_part(part):
                    self._collect(batch)
            if self.batches == 0:  # (an empty capture's part holds no batch)
                self._collect(pa.RecordBatch.from_pylist([], schema=schema))
            hashed = self.close(schema)
        except BaseException:
            self.abort()
            raise
        for part in parts:
            size = part.stat().st_size
            part.unlink()
            writer.area.account(-size, files=-1)  # (the staging limits count what it holds)
        return hashed

    def _duck(self) -> duckdb.DuckDBPyConnection:
        # Its own connection, closed with the stager (a thread's cached
        # connection would outlive the capture), or kept if it hashed little.
        if self._con is None:
            import duckdb

            kept = _KEPT.take()
            self._con = (
                kept
                if kept is not None
                else duckdb.connect(":memory:", config={"threads": self.threads})
            )
        return self._con

    def _hashed(self, group: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        names = group[0].schema.names
        if UNCHANGED in names or prov.OP in names:
            return group
        payload = [n for n in names if not n.startswith("_combined_")]
        table = pa.Table.from_batches(group)
        if table.num_rows == 0:  # every part carries the columns, an empty one too
            ids = hashes = pa.array([], digest_type(self.digest))
        else:
            ids, hashes = self._identify(table, payload)
        out, offset = [], 0
        for batch in group:
            n = batch.num_rows
            if self.key:
                batch = batch.append_column(prov.ID, ids.slice(offset, n))
            out.append(batch.append_column(prov.PAYLOAD_HASH, hashes.slice(offset, n)))
            offset += n
        return out

    def _identify(self, table: pa.Table, payload: list[str]) -> tuple[pa.Array, pa.Array]:
        """Ids (empty without a key) and payload hashes of ``table``'s rows.

        In slices where its rows are wide.
        """
        con = self._duck()
        self._hashed_bytes += table.nbytes
        row_bytes = table.nbytes // table.num_rows
        wide = row_bytes >= WIDE_ROW_BYTES
        con.execute(f"SET threads = {1 if wide else self.threads}")
        step = table.num_rows
        if row_bytes // max(len(payload), 1) >= LARGE_CELL_BYTES:
            step = max(1, HASH_SLICE_BYTES // row_bytes)
        ids, hashes = [], []
        for offset in range(0, table.num_rows, step):
            rows = table.slice(offset, step)
            if self.key:
                i, h = compute_identity(rows, self.key, payload, con=con, digest=self.digest)
                ids.append(i)
            else:
                h = compute_payload_hash(rows, payload, con=con, digest=self.digest)
            hashes.append(h)
        return _joined(ids, self.digest), _joined(hashes, self.digest)


def _heavy(group: list[pa.RecordBatch]) -> bool:
    """Whether ``group``'s rows hold megabytes (``LARGE_ROW_BYTES`` on average)."""
    rows = sum(b.num_rows for b in group)
    return bool(sum(b.nbytes for b in group) >= LARGE_ROW_BYTES * max(rows, 1))


def _joined(arrays: list[pa.Array], digest: Digest) -> pa.Array:
    """The digests of a group's slices as one array (the one slice as it is)."""
    if len(arrays) == 1:
        return arrays[0]
    return pa.concat_arrays(arrays) if arrays else pa.array([], digest_type(digest))
