"""Copy-on-write of a keyed transition: the add and remove actions of one commit, streamed.

A data file holding an id the transition updates or deletes is rewritten
without those rows (one small batch at a time), or only removed when every
one of its rows goes; the transition's puts are the Deliveries' own files,
linked into the table, where a Delivery holds no delete, and are streamed
into new files otherwise. Memory holds the changed ids and a few batches,
never a table, a file or a whole row group of wide rows per writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from combined.errors import LakeError
from combined.lake import _files
from combined.lake._files import LinkedFile, link_data_files, write_data_files
from combined.lake._store import LakeStore
from combined.lake._types import lake_type, to_lake, unviewed
from combined.protocol import _provenance as prov
from combined.runtime._memory import release_memory

if TYPE_CHECKING:
    import duckdb

    from combined.protocol._digest import DigestSet

_ID, _OP = "_combined_id", "_combined_op"
#: The operations whose id's current row leaves the table.
_REPLACING = ("update", "delete")
#: Arrow bytes the files being rewritten hold in flight at once, all of them
#: (see :func:`in_flight`): two files are rewritten at a time, on two
#: threads, only where both fit. Decoding and encoding release the GIL, but a
#: second file's buffers and its thread's heap come on top: two files of the
#: bench's wide rows at once held 63-68 MB of Arrow memory (+102 MB of RSS),
#: one at a time 34 MB (+59 MB), for no more CPU (bench/RESULTS.md).
REWRITE_BYTES = 64 << 20


@dataclass(slots=True)
class _Changes:
    """What a transition changes: the ids whose current rows go, and which Deliveries delete."""

    gone: pa.Array | None
    #: The Deliveries (by position in the linked files) holding at least one delete.
    deleting: set[int]
    #: Past ``SHARED_GONE`` v2 ids, ``gone``'s as (n, 2) 64-bit words alone (``gone`` None).
    words: np.ndarray | None = None

    def count(self) -> int:
        """How many ids go."""
        return len(self.words) if self.words is not None else len(self.gone or ())


def rewrite_actions(
    table: str | Path,
    files: list[str],
    schema: pa.Schema,
    data: Callable[[], pa.RecordBatchReader],
    *,
    every_file: bool = False,
    keyed: bool = True,
    store: LakeStore | None = None,
    linked: Sequence[LinkedFile] | None = None,
) -> list[Any]:
    """Copy-on-write of a keyed transition: the add and remove actions of one commit.

    ``data()`` returns a fresh reader over the transition's rows (with
    ``_combined_id`` and ``_combined_op``). Every data file holding an id the
    transition updates or deletes is rewritten without those rows (streamed,
    ``REWRITE_BATCH_ROWS`` at a time; a file all of whose rows go is only
    removed); the transition's puts go to new files. ``linked``: the
    Deliveries ``data()`` reads, in its order, with their statistics, when
    their columns are the table's: their ids and operations are read alone,
    and one that deletes nothing becomes a table file as it is (linked, not
    rewritten).

    With ``every_file`` (a table whose column types widen), every file is
    rewritten in ``schema`` and no remove action is returned: the commit
    overwrites the table. Unless ``keyed``, ``data()`` is an event stream: no
    row is replaced and every one (deletes included) is added as it is.
    """
    lake = store or LakeStore.at(table)
    if every_file or not keyed:
        linked = None  # (every row is rewritten in the new types, or added as it is)
    changes = _changed(data, schema, linked) if keyed else _Changes(None, set())
    gone = changes.gone
    if gone is None and every_file:
        gone = pa.array([], _id_type(schema))
    actions: list[Any] = []
    if changes.words is not None:
        # Many v2 ids: found by a binary search over their words (no Arrow array of them).
        doomed = _doomed_by_search(files, _word_set(changes), lake)
        release_memory()
        actions.extend(_rewritten(table, files, schema, doomed, every_file, lake))
    elif gone is not None and (len(gone) or every_file):
        # Which rows go, found for every file at once: one set of the changed ids per commit.
        doomed = _doomed_rows(files, gone, lake) if len(gone) else {}
        release_memory()  # (the scan's pages, before the rewrite's buffers: see _doomed_rows)
        actions.extend(_rewritten(table, files, schema, doomed, every_file, lake))
    actions.extend(_puts(table, schema, data, keyed, lake, linked, changes.deleting))
    return actions


def _changed(
    data: Callable[[], pa.RecordBatchReader],
    schema: pa.Schema,
    linked: Sequence[LinkedFile] | None,
) -> _Changes:
    """The ids the transition updates or deletes, in the table's id type (text or bytes)."""
    bound = sum(pq.read_metadata(str(path)).num_rows for path, *_ in linked or ())
    changed = _Gone(bound, words=_id_type(schema) == pa.binary())  # (v1's hex ids: arrays)
    deleting: set[int] = set()
    if linked is not None:
        for n, (path, *_) in enumerate(linked):
            with pq.ParquetFile(str(path)) as pf:
                for batch in pf.iter_batches(batch_size=65_536, columns=[_ID, _OP]):
                    ops = batch.column(1)
                    changed.add(pc.filter(batch.column(0), pc.is_in(ops, pa.array(_REPLACING))))
                    if pc.any(pc.equal(ops, "delete")).as_py():
                        deleting.add(n)
    else:
        for batch in data():
            ops = batch.column(batch.schema.get_field_index(_OP))
            ids = batch.column(batch.schema.get_field_index(_ID))
            changed.add(pc.filter(ids, pc.is_in(ops, pa.array(_REPLACING))))
    if changed.words is not None and changed.rows > SHARED_GONE:
        return _Changes(None, deleting, changed.words)
    id_type = _id_type(schema)
    gone = pa.concat_arrays([c.cast(id_type) for c in changed.arrays()]) if changed.any else None
    return _Changes(gone, deleting)


class _Gone:
    """The ids a transition replaces, gathered batch by batch.

    v2 ids (16 bytes each) are kept as their two 64-bit words only, in one
    array sized by ``bound`` (the Deliveries' rows: pages past the ids are
    never touched): as an Arrow array (4 bytes of offsets more an id),
    concatenated and then sorted by :class:`DigestSet`, every row of 5M
    changed held ~230 MB more at the commit's peak (bench/RESULTS.md).
    """

    def __init__(self, bound: int, words: bool) -> None:
        #: The words (None once an id is not 16 bytes, or for v1's text ids).
        self._buf: np.ndarray | None = np.empty((bound, 2), np.uint64) if words else None
        self._arrays: list[pa.Array] = []
        self.rows = 0
        self.any = False

    @property
    def words(self) -> np.ndarray | None:
        """The ids' words, (n, 2), or None."""
        return None if self._buf is None else self._buf[: self.rows]

    def add(self, ids: pa.Array) -> None:
        from combined.protocol._digest import fixed_width

        self.any = True
        if self._buf is not None:
            fixed = fixed_width(ids, 16) if len(ids) else np.empty(0, "S16")
            if fixed is not None:
                n = len(fixed)
                if self.rows + n > len(self._buf):  # (no bound: doubled)
                    grown = np.empty((max(2 * len(self._buf), self.rows + n), 2), np.uint64)
                    grown[: self.rows] = self._buf[: self.rows]
                    self._buf = grown
                self._buf[self.rows : self.rows + n] = fixed.view(np.uint64).reshape(-1, 2)
                self.rows += n
                return
            self._arrays.append(_from_words(self._buf[: self.rows]))
            self._buf = None
        self.rows += len(ids)
        self._arrays.append(ids)

    def arrays(self) -> list[pa.Array]:
        """The ids as Arrow arrays."""
        words = self.words
        return [_from_words(words)] if words is not None else self._arrays


def _from_words(words: np.ndarray) -> pa.Array:
    """16-byte ids given as their (n, 2) words, as a binary array."""
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), len(words), [None, pa.py_buffer(words)]
    )
    return fixed.cast(pa.binary())


def _id_type(schema: pa.Schema) -> pa.DataType:
    """The plain type of ``schema``'s ``_combined_id``: string (v1 digests) or binary (v2)."""
    if _ID not in schema.names:
        return pa.string()
    t = schema.field(_ID).type
    if pa.types.is_binary(t) or pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    return pa.string()


def _rewritten(
    table: str | Path,
    files: Sequence[str],
    schema: pa.Schema,
    doomed: dict[str, np.ndarray],
    every_file: bool,
    lake: LakeStore,
) -> list[Any]:
    """The actions of the files that lose rows (or of every file, with ``every_file``)."""

    def rewrite(local: str) -> tuple[list[Any], int]:  # a path or URL, as files() gives them
        out, flight = _kept_rows(table, local, schema, doomed.get(local), every_file, lake)
        if every_file:
            return out, flight  # (the overwrite removes every file)
        out.append(remove_action(local, table, lake))
        return out, flight

    # A file none of whose rows goes is not even opened.
    pending = [f for f in files if f in doomed or every_file]
    if not pending:
        return []
    # The first file on this thread: its footer tells the bytes a file holds in flight.
    actions, flight = rewrite(pending[0])
    if 2 * flight > REWRITE_BYTES:  # one at a time, on this thread
        for local in pending[1:]:
            actions.extend(rewrite(local)[0])
    else:  # two at a time: decoding and encoding release the GIL
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="rewrite") as pool:
            for done, _ in pool.map(rewrite, pending[1:]):
                actions.extend(done)
    # The threads' small buffers stay in their heaps until trimmed: ~130 MB
    # after 2M rows, which the usage step would otherwise stack on.
    release_memory()
    return actions


def _kept_rows(
    table: str | Path,
    local: str,
    schema: pa.Schema,
    doomed: np.ndarray | None,
    every_file: bool,
    lake: LakeStore,
) -> tuple[list[Any], int]:
    """The add actions of ``local``'s rows but ``doomed`` (row numbers): none when all go.

    And the bytes its rewrite holds in flight (:func:`in_flight`).
    """
    source = lake.open_input(local)
    with pq.ParquetFile(source) as pf:
        meta = pf.metadata
    rows, flight = meta.num_rows, in_flight(meta)
    if doomed is not None and len(doomed) >= rows and not every_file:
        return [], flight  # every row goes (a backlog that updates them all): nothing to read
    dictionaries = _dictionary_columns(meta, schema)
    # (the footer read once: the same file, its metadata given)
    with pq.ParquetFile(source, metadata=meta, read_dictionary=dictionaries) as pf:
        return _kept(table, pf, schema, _keep_mask(rows, doomed), lake, dictionaries), flight


def in_flight(meta: pq.FileMetaData) -> int:
    """About the Arrow bytes the rewrite of a file holds at its peak, from its footer.

    Its largest row group's compressed bytes (read whole), a batch read and
    its filtered copy (:func:`_files.read_batches`), and its writer's row
    group gathering and being encoded (two of ``ROW_GROUP_ROWS`` rows or
    ``ROW_GROUP_BYTES``), sized by the rows' average uncompressed bytes (near
    their Arrow bytes: 325 and ~380 a row of the bench's wide table). Files
    of the bench's narrow rows hold ~10 MB (estimated), of its wide ones
    ~40 (34 measured), of 300-byte random texts ~48 (48).
    """
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    rows = int(meta.num_rows)
    if rows <= 0 or not groups:
        return 0
    row = max(1, sum(int(g.total_byte_size) for g in groups) // rows)
    read = max(sum(g.column(c).total_compressed_size for c in range(g.num_columns)) for g in groups)
    group = min(_files.ROW_GROUP_BYTES, row * _files.ROW_GROUP_ROWS)
    batch = min(_files.READ_BATCH_BYTES, row * _files.REWRITE_BATCH_ROWS)
    return int(read) + 2 * batch + 2 * group


#: The provenance strings a Delivery holds one value of (a few, for ``_combined_op``).
CONSTANT_STRINGS = (
    "_combined_op",
    "_combined_run_id",
    "_combined_delivery_id",
    "_combined_producer",
)


def _dictionary_columns(meta: pq.FileMetaData, schema: pa.Schema) -> list[str]:
    """The constant provenance strings (:data:`CONSTANT_STRINGS`) a file dictionary-encodes.

    Read as dictionaries (:func:`_kept`), their values are decoded once a
    row group, not once a row (four strings of ~10-40 bytes a row), and the
    writer takes the dictionaries as they are: rewriting a 5M-row narrow
    table held ~10 MB less Arrow memory at its peak, for less CPU. Never a
    payload column, whatever its pages (nor the source position, a change
    stream's own in each row): a chunk whose dictionary overflowed is plain
    past it, and read as a dictionary costs more than as it is (every such
    column of the bench's wide table: +57 MB at the commit's peak).
    """
    if not meta.num_row_groups:
        return []
    first = meta.row_group(0)
    return [
        first.column(c).path_in_schema
        for c in range(first.num_columns)
        if first.column(c).path_in_schema in CONSTANT_STRINGS
        and schema.get_field_index(first.column(c).path_in_schema) >= 0
        and pa.types.is_string(schema.field(first.column(c).path_in_schema).type)
        and all(meta.row_group(g).column(c).has_dictionary_page for g in range(meta.num_row_groups))
    ]


def _kept(
    table: str | Path,
    pf: pq.ParquetFile,
    schema: pa.Schema,
    keep: pa.BooleanArray,
    lake: LakeStore,
    dictionaries: Sequence[str] = (),
) -> list[Any]:
    """The add actions of the rows of ``pf`` that ``keep`` marks.

    ``dictionaries``: string columns ``pf`` reads as dictionaries, written as such.
    """
    # Small batches (two files are rewritten at once, each holding a batch,
    # its filtered copy and a row group gathering), decoded on the calling
    # thread: the writer gathers them back into full row groups.
    batches = _files.read_batches(pf, _files.REWRITE_BATCH_ROWS, threads=False)
    target = _files.with_dictionaries(schema, dictionaries) if dictionaries else schema
    kept = (
        to_lake(unviewed(b).filter(keep.slice(offset, b.num_rows)), target)
        for offset, b in _offsets(batches)
    )
    return write_data_files(table, schema, kept, lake, dictionaries=dictionaries)


def _puts(
    table: str | Path,
    schema: pa.Schema,
    data: Callable[[], pa.RecordBatchReader],
    keyed: bool,
    lake: LakeStore,
    linked: Sequence[LinkedFile] | None,
    deleting: set[int],
) -> list[Any]:
    """The add actions of the transition's puts (its rows but the deletes)."""
    if linked is None:
        puts = (
            to_lake(b.filter(pc.not_equal(b.column(_OP), "delete")) if keyed else b, schema)
            for b in data()
        )
        return write_data_files(table, schema, puts, lake)
    whole = [f for n, f in enumerate(linked) if n not in deleting]
    actions = link_data_files(table, whole, lake)
    filtered = [f[0] for n, f in enumerate(linked) if n in deleting]
    if filtered:
        # (the string columns every such Delivery encodes as a dictionary: one stream of files)
        each = [set(_dictionary_columns(pq.read_metadata(str(p)), schema)) for p in filtered]
        dictionaries = sorted(set.intersection(*each))
        rows = _without_deletes(filtered, schema, dictionaries)
        actions.extend(write_data_files(table, schema, rows, lake, dictionaries=dictionaries))
    return actions


def _without_deletes(
    paths: Sequence[Path], schema: pa.Schema, dictionaries: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    """The rows of the Deliveries ``paths`` that are not deletes, ``dictionaries`` as such."""
    target = _files.with_dictionaries(schema, dictionaries) if dictionaries else schema
    for path in paths:
        with pq.ParquetFile(str(path), read_dictionary=dictionaries) as pf:
            for b in _files.read_batches(pf, _files.REWRITE_BATCH_ROWS, threads=False):
                kept = pc.not_equal(b.column(_OP), "delete")
                # (a batch without deletes as it is: a filter copies every value)
                whole = kept.null_count == 0 and pc.all(kept).as_py()
                yield to_lake(b if whole else b.filter(kept), target)


def _offsets(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Each batch with the number of rows before it."""
    offset = 0
    for batch in batches:
        yield offset, batch
        offset += batch.num_rows


def _doomed_rows(files: Sequence[str], gone: pa.Array, lake: LakeStore) -> dict[str, np.ndarray]:
    """The rows (file row numbers) of each of ``files`` whose id is in ``gone``.

    Past ``SHARED_GONE`` ids, or in a few small files (:func:`_small`), by
    :func:`_doomed_by_search`. Otherwise by one DuckDB query: the hash table
    of ``gone`` is built once and only the files' id columns are scanned
    (files without such a row are left out);
    each row found comes back as its file's place in ``files`` and its row
    number, in Arrow batches gathered file by file. On the lake's shared
    database, the scan's pages stay with DuckDB's allocator when it is done:
    the caller gives them back before rewriting.
    """
    if not files:
        return {}
    if len(gone) > SHARED_GONE or _small(files, lake):
        return _doomed_by_search(files, gone, lake)
    found: dict[int, list[np.ndarray]] = {}
    with lake.duck() if not lake.remote else _own_duck() as con:
        lake.attach(con)
        con.register("gone", pa.table({"id": gone}))
        con.register("named", pa.table({"name": [str(f) for f in files], "at": range(len(files))}))
        listing = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
        try:
            rows = con.sql(
                "SELECT n.at, p.file_row_number AS number, "
                "CASE WHEN n.at IS NULL THEN p.filename END AS strange FROM read_parquet("
                f"[{listing}], filename = true, file_row_number = true) p "
                "LEFT JOIN named n ON n.name = p.filename "
                "WHERE p._combined_id IN (SELECT id FROM gone)"
            )
            for batch in rows.to_arrow_reader(1 << 20):
                _gather(batch, found)
        finally:
            con.unregister("named")
            con.unregister("gone")
    return {files[at]: np.sort(np.concatenate(parts)) for at, parts in found.items()}


def _gather(batch: pa.RecordBatch, found: dict[int, list[np.ndarray]]) -> None:
    """Add a batch of (file's place, row number) to ``found``, by file."""
    at = batch.column(0)
    if at.null_count:  # a file the commit would keep whole though rows of it must go
        strange = batch.column(2).filter(at.is_null())[0].as_py()
        raise LakeError(
            f"the lake named its data file {strange!r} otherwise than its log does",
            hint="nothing was committed; report this with the lake's URL scheme",
        )
    places = at.to_numpy()
    numbers = batch.column(1).to_numpy()
    order = np.argsort(places, kind="stable")
    places, numbers = places[order], numbers[order]
    cuts = np.flatnonzero(np.diff(places)) + 1
    for chunk, rows in zip(np.split(places, cuts), np.split(numbers, cuts), strict=True):
        if len(chunk):
            found.setdefault(int(chunk[0]), []).append(rows)


#: The bytes of a table's files up to which a commit's rows are found by reading
#: their ids with Arrow, not by a DuckDB query: the query (its plan, two tables
#: registered, a join) cost ~9 ms a commit of a 100-row table, more than reading
#: the ids of a few MB of files. Asked of at most ``SMALL_FILES`` files (a remote
#: lake's sizes are HEAD requests, each asked once: ``LakeStore.sizes``).
SMALL_SCAN_BYTES = 4 << 20
SMALL_FILES = 16


def _small(files: Sequence[str], lake: LakeStore) -> bool:
    """Whether ``files`` are few and small enough to search without DuckDB."""
    if len(files) > SMALL_FILES:
        return False
    total = 0
    for f in files:
        total += lake.size(f)
        if total > SMALL_SCAN_BYTES:
            return False
    return True


#: Ids to remove up to which a commit's rows are found by DuckDB: on a local lake's
#: shared database (:meth:`LakeStore.duck`), whose hash table of a few MB costs less than
#: opening a database (~15 ms of CPU). Past it, by a binary search over the sorted ids
#: (:func:`_doomed_by_search`): DuckDB's hash table of millions of ids could not spill
#: under a small limit, and every row of 5M changed ran out of its memory.
SHARED_GONE = 65_536


@contextmanager
def _own_duck() -> Iterator[duckdb.DuckDBPyConnection]:
    """A small database of its own (a remote lake's few ids: its files read over HTTP)."""
    import duckdb

    con = duckdb.connect(":memory:", config={"threads": 2, "memory_limit": "64MB"})
    try:
        yield con
    finally:
        con.close()


def _word_set(changes: _Changes) -> DigestSet:
    """The set of many v2 ids held as words (``changes.words``, taken: sorted in place)."""
    from combined.protocol._digest import DigestSet

    words, changes.words = changes.words, None
    assert words is not None
    return DigestSet.of_words(words)


def _doomed_by_search(
    files: Sequence[str], gone: pa.Array | DigestSet, lake: LakeStore
) -> dict[str, np.ndarray]:
    """:func:`_doomed_rows` for many ids: each file's ids, a batch at a time, looked up
    in ``gone`` sorted once (memory: the sorted ids, ~16 bytes each, and one batch)."""
    from combined.protocol._digest import DigestSet

    member = gone if isinstance(gone, DigestSet) else DigestSet(gone)
    doomed: dict[str, np.ndarray] = {}
    for name in files:
        numbers: list[np.ndarray] = []
        at = 0
        with pq.ParquetFile(lake.open_input(name)) as pf:
            for batch in pf.iter_batches(batch_size=65_536, columns=[prov.ID]):
                # (a file delta-rs wrote holds its ids as views, which the lookup does not take)
                hit = member(_plain(batch.column(0))).to_numpy(zero_copy_only=False)
                numbers.append(np.flatnonzero(hit) + at)
                at += batch.num_rows
        rows = np.concatenate(numbers) if numbers else np.empty(0, np.int64)
        if len(rows):
            doomed[name] = rows
    return doomed


def _plain(ids: pa.Array) -> pa.Array:
    """``ids`` as the lake stores them: plain strings or binaries (views and
    dictionaries as their values)."""
    plain = lake_type(ids.type)
    return ids if plain == ids.type else ids.cast(plain)


def _keep_mask(rows: int, doomed: np.ndarray | None) -> pa.BooleanArray:
    """A mask of ``rows`` rows, false at the (row numbers) ``doomed``."""
    keep = np.ones(rows, dtype=bool)
    if doomed is not None and len(doomed):
        keep[doomed] = False
    mask: pa.BooleanArray = pa.array(keep)
    return mask


def remove_action(local: str, table: str | Path, store: LakeStore) -> Any:
    """The remove action of ``table``'s data file ``local`` (a path or URL, as files() gives it)."""
    from deltalake.transaction import RemoveAction

    return RemoveAction(
        path=_relative(local, table, store),
        data_change=True,
        deletion_timestamp=int(time.time() * 1000),
        size=store.size(local),
        partition_values={},
    )


def _relative(file: str, table: str | Path, store: LakeStore) -> str:
    """A data file's path relative to its table, as its remove action names it."""
    import os

    if store.remote:
        return file.removeprefix(str(table).rstrip("/") + "/")
    return os.path.relpath(file, table)
