"""A snapshot re-capture compared with the lake by value: only the rows that differ are hashed.

Hashing every row (md5 of the canonical texts, ``docs/identity.md``) costs
more CPU than reading it, and a re-capture is mostly rows the lake holds
as they are. Where the previous capture staged the same columns in the
same types, and the lake stores each in a type the capture's maps to
exactly, staging leaves the rows of a large table unhashed
(``runtime._extract``) and the reduction compares values instead (Run
stats ``compared: values``):

- each row of both sides, the staged ones cast to the lake's types and the
  lake's files as stored, is hashed by DuckDB's vectorised ``hash()``:
  its key forward and reversed, its payload forward and reversed (the
  terms of ``runtime._fold``, which work around what DuckDB's hash loses);
- those four words make a pseudo id and a pseudo payload hash of 16 bytes
  each, which go through the fingerprints of ``capture._fingerprint``
  (sorted, one-sided, checked by their second words: 128 bits a row);
- the staged rows whose fingerprint is on their side only are hashed then
  (md5, as any capture's), the lake's carry their stored digests, and both
  meet in the exact join as the digests' candidates do.

Each side's words are computed once: kept in a file between the
fingerprints' two reads (the lake's second read takes back only its
stored digests, checked row by row by its key's hash).

A row left out is one whose key and payload values hash alike on both
sides. Any refusal (a repeated row, a repeated key, another DuckDB type on
one side, a lake read in another order) leaves the reduction to hash every
row in SQL, as for any capture staged unhashed (``compared: digests``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from combined.capture._databases import files_sql
from combined.capture._fingerprint import Candidates
from combined.delivery import read_part
from combined.lake._types import lake_type, to_lake
from combined.protocol._digest import Digest
from combined.protocol.identity import compute_identity, quote_ident
from combined.runtime._fold import _scalar, _terms

if TYPE_CHECKING:
    import duckdb

ORDINAL = "_combined_ordinal"
_BATCH_ROWS = 65_536
#: The lake rows' columns the fingerprints keep: pseudo digests, stored digests, one-sided.
CURRENT = pa.schema(
    [
        ("_pid", pa.binary()),
        ("_phash", pa.binary()),
        ("_kid", pa.binary()),
        ("_khash", pa.binary()),
        ("_kf", pa.bool_()),
    ]
)


def comparable(staged: pa.Schema, lake: pa.Schema | None, key: Sequence[str]) -> pa.Schema | None:
    """The payload to compare, in the lake's types, or None where values cannot be compared.

    Every payload column of one side is one of the other, and the lake
    stores it in the type the staged one maps to without losing a value
    (strings and bytes of any layout, timestamps to the microsecond, small
    floats, unsigned integers; scalars and lists of them). Nanoseconds,
    times, intervals, wide decimals, structs and maps are not compared.
    """
    if lake is None or not key:
        return None
    ours = [f for f in staged if not f.name.startswith("_combined_")]
    theirs = {f.name: f.type for f in lake if not f.name.startswith("_combined_")}
    if sorted(f.name for f in ours) != sorted(theirs) or not set(key) <= set(theirs):
        return None
    fields = []
    for f in ours:
        stored = theirs[f.name]
        if not _same(lake_form(f.type), stored):
            return None
        fields.append(pa.field(f.name, stored))
    return pa.schema(fields)


def lake_form(t: pa.DataType) -> pa.DataType | None:
    """The type the lake stores a staged ``t`` in, where no two values meet (None: not compared).

    The lake's own mapping (``lake_type``), for the scalars the fold hashes
    as DuckDB scans them (and ``float16``, widened exactly), and lists of
    them: not nanoseconds (the lake keeps microseconds), times and nulls
    (stored as text), nor what the fold does not hash (``runtime._fold``).
    """
    if pa.types.is_dictionary(t):
        return lake_form(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = lake_form(t.value_type)
        nested = inner is None or pa.types.is_list(inner)
        return None if nested else pa.list_(inner)
    lossy = (
        pa.types.is_timestamp(t) and t.unit == "ns" or pa.types.is_time(t) or pa.types.is_null(t)
    )
    exact = _scalar(t) or pa.types.is_float16(t)
    return lake_type(t) if exact and not lossy else None


def _same(ours: pa.DataType | None, stored: pa.DataType) -> bool:
    """Whether the lake's ``stored`` type is ``ours`` (a list's element field name aside)."""
    if ours is None:
        return False
    if pa.types.is_list(ours):
        lists = pa.types.is_list(stored) or pa.types.is_large_list(stored)
        return bool(lists and ours.value_type == stored.value_type)
    return bool(ours == stored)


class ValuePrints:
    """The hashes of both sides' rows, read as pseudo digests (see the module's docstring)."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        payload: pa.Schema,
        key: Sequence[str],
        parts: Sequence[Path],
        lake_files: Sequence[str],
        cache: Path,
    ) -> None:
        """``cache``: a directory for each row's hashes between the two reads of a side."""
        self.con, self.payload, self.parts = con, payload, list(parts)
        self.lake_files = list(lake_files)
        ordered = pa.schema(sorted(payload, key=lambda f: f.name))
        keyed = pa.schema([payload.field(k) for k in key])
        k, p = _terms(keyed), _terms(ordered)
        self._key_hash = f"hash({', '.join(k)})"
        self._hashes = (
            f"{self._key_hash}, hash({', '.join(reversed(k))}), "
            f"hash({', '.join(p)}), hash({', '.join(reversed(p))})"
        )
        self._columns = ", ".join(quote_ident(f.name) for f in payload)
        #: The lake's payload columns as read (:meth:`agree`).
        self._lake_columns = self._columns
        self._staged_words = Words(cache, "staged", 5)  # (ordinal, key x2, payload x2)
        self._lake_words = Words(cache, "lake", 4)

    def agree(self) -> bool:
        """Whether DuckDB reads both sides' columns in the same types (their hashes compare).

        A column no lake file holds yet (added to the table's schema since
        its files were written) is null in every lake row, read as such.
        """
        empty = pa.table({f.name: pa.array([], f.type) for f in self.payload})
        self.con.register("_vp_types", empty)
        try:
            ours = self.con.sql(f"DESCRIBE SELECT {self._columns} FROM _vp_types").fetchall()
        finally:
            self.con.unregister("_vp_types")
        files = self.con.sql(f"DESCRIBE SELECT * FROM {self._files()} LIMIT 0").fetchall()
        held = {str(r[0]): str(r[1]) for r in files}
        self._lake_columns = ", ".join(
            quote_ident(str(name))
            if name in held
            else f"CAST(NULL AS {kind}) AS {quote_ident(name)}"
            for name, kind in (r[:2] for r in ours)
        )
        return all(held.get(str(name), kind) == kind for name, kind in (r[:2] for r in ours))

    def staged(self) -> Iterator[pa.RecordBatch]:
        """Batches of (ordinal, pseudo id, pseudo payload hash) of every staged row.

        Hashed at the first read, read back from the cache at the next.
        """
        names = ["ord", "_pid", "_phash"]
        if self._staged_words.done:
            for words in self._staged_words.chunks(_BATCH_ROWS):
                ords = pa.array(words[:, 0].view(np.int64))
                yield pa.record_batch([ords, *_pseudo(words[:, 1:])], names)
            return
        schema = self.payload.append(pa.field(ORDINAL, pa.int64()))
        reader = pa.RecordBatchReader.from_batches(
            schema, (to_lake(b, schema) for p in self.parts for b in read_part(p))
        )
        self.con.register("_vp_staged", reader)
        try:
            rows = self.con.sql(f"SELECT {ORDINAL}, {self._hashes} FROM _vp_staged")
            for batch in rows.to_arrow_reader(_BATCH_ROWS):
                words = _words(batch, 0, 5)
                self._staged_words.write(words)
                yield pa.record_batch([batch.column(0), *_pseudo(words[:, 1:])], names)
        except BaseException:
            self._staged_words.close()  # (a read abandoned: the cache is not done)
            raise
        finally:
            self.con.unregister("_vp_staged")
        self._staged_words.finish()

    def current(self) -> Iterator[pa.RecordBatch]:
        """Batches of (pseudo id, pseudo payload hash, id, payload hash) of the lake's rows.

        Hashed at the first read; at the next, the words come back from the
        cache and only the stored digests and the key's hash are read again,
        the key's hash checking that each row is the one cached.
        """
        again = self._lake_words.done
        # Each read gives the rows in the files' order: the second is checked
        # against the first. On one thread: two threads' chunks wait for their
        # turn in that order, ~+30 MB over a 5M-row lake, for no less CPU.
        settings = "current_setting('preserve_insertion_order'), current_setting('threads')"
        order, threads = self.con.sql(f"SELECT {settings}").fetchall()[0]
        self.con.execute("SET preserve_insertion_order = true")
        self.con.execute("SET threads = 1")
        try:
            yield from self._current(again)
        finally:
            self.con.execute(f"SET preserve_insertion_order = {bool(order)}")
            self.con.execute(f"SET threads = {int(threads)}")

    def _current(self, again: bool) -> Iterator[pa.RecordBatch]:
        rows = self.con.sql(
            f"SELECT {self._key_hash if again else self._hashes}, _combined_id, "
            f"_combined_payload_hash FROM (SELECT {self._lake_columns}, _combined_id, "
            f"_combined_payload_hash FROM {self._files()})"
        )
        try:
            for batch in rows.to_arrow_reader(_BATCH_ROWS):
                if again:
                    words = self._lake_words.take(batch.num_rows)
                    if len(words) != batch.num_rows or not np.array_equal(
                        words[:, 0], batch.column(0).to_numpy().view(np.uint64)
                    ):
                        raise Misaligned("the lake's rows were read in another order")
                else:
                    words = _words(batch, 0, 4)
                    self._lake_words.write(words)
                digests = batch.columns[-2:]
                yield pa.record_batch([*_pseudo(words), *digests], names=CURRENT.names[:4])
        except BaseException:
            self._lake_words.close()  # (a read abandoned: the cache is not done)
            raise
        if again:
            self._lake_words.close()
        else:
            self._lake_words.finish()

    def _files(self) -> str:
        return f"read_parquet({files_sql(self.lake_files)}, union_by_name = true)"


def _words(batch: pa.RecordBatch, at: int, width: int) -> np.ndarray:
    """Columns ``at``.. of ``batch`` (integers) as the rows of a (n, ``width``) uint64 array."""
    words = np.empty((batch.num_rows, width), np.uint64)
    for i in range(width):
        words[:, i] = batch.column(at + i).to_numpy(zero_copy_only=False).view(np.uint64)
    return words


def _pseudo(words: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """The 16-byte pseudo id and payload hash of each row of its four hash words."""
    return _pair(words[:, 0], words[:, 1]), _pair(words[:, 2], words[:, 3])


class Misaligned(Exception):
    """A second read of the lake's rows did not give them in the first read's order."""


class Words:
    """Rows of 64-bit words written once to a file, then read back in order (not mapped)."""

    def __init__(self, directory: Path, name: str, width: int) -> None:
        self.path, self.width, self.done = directory / name, width, False
        self._file: Any = None

    def write(self, words: np.ndarray) -> None:
        """Append rows (the first read)."""
        if self._file is None:
            self._file = open(self.path, "wb")  # noqa: SIM115 (closed by finish)
        words.tofile(self._file)

    def finish(self) -> None:
        """Every row is written: the next read takes them back."""
        if self._file is None:
            self.path.write_bytes(b"")
        else:
            self._file.close()
            self._file = None
        self.done = True

    def take(self, rows: int) -> np.ndarray:
        """The next ``rows`` rows (fewer at the end)."""
        if self._file is None:
            self._file = open(self.path, "rb")  # noqa: SIM115 (closed by close)
        words = np.fromfile(self._file, np.uint64, rows * self.width)
        return words.reshape(-1, self.width)

    def chunks(self, rows: int) -> Iterator[np.ndarray]:
        """Every row back, ``rows`` at a time."""
        try:
            while len(words := self.take(rows)):
                yield words
        finally:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _pair(first: np.ndarray, second: np.ndarray) -> pa.Array:
    """Two 64-bit words a row as a binary array of 16-byte values."""
    n = len(first)
    words = np.empty((n, 2), np.uint64)
    words[:, 0], words[:, 1] = first, second
    offsets = np.arange(0, 16 * n + 1, 16, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(words)])


def exact(
    con: duckdb.DuckDBPyConnection,
    found: Candidates,
    parts: Sequence[Path],
    key: Sequence[str],
    digest: Digest,
) -> Candidates:
    """The candidates with their real digests: the staged ones hashed now, the lake's as stored.

    Only the candidates' staged rows are read out of the parts and hashed,
    as staging hashes rows (``compute_identity``), a group at a time: memory
    holds a group's rows and the candidates' (ordinal, id, hash).
    """
    wanted = np.unique(found.staged.column("ord").to_numpy())
    hashed: list[pa.Table] = []
    group: list[pa.RecordBatch] = []
    for part in parts:
        for batch in read_part(part):
            chosen = _chosen(batch, wanted)
            if chosen is not None:
                group.append(chosen)
            if sum(b.num_rows for b in group) >= _GROUP_ROWS:
                hashed.append(_hashed(con, group, key, digest))
                group = []
    hashed.append(_hashed(con, group, key, digest))
    return Candidates(pa.concat_tables(hashed), found.current.select(["_kid", "_khash", "_kf"]))


def _chosen(batch: pa.RecordBatch, wanted: np.ndarray) -> pa.RecordBatch | None:
    """The rows of a staged ``batch`` whose ordinals ``wanted`` (sorted, distinct) holds, or None.

    Staging numbers rows one by one, so a batch's ordinals are a run
    ``first, first + 1, ...``: the wanted ones in its range are its rows at
    ``ord - first``, found by two binary searches (a set of the wanted
    ordinals built for every batch cost ~0.5 CPU-s at 5M rows). A batch
    numbered otherwise is matched ordinal by ordinal.
    """
    n = batch.num_rows
    if not n or not len(wanted):
        return None
    ords = batch.column(ORDINAL).to_numpy()
    first, last = int(ords[0]), int(ords[-1])
    if last - first == n - 1 and np.array_equal(ords, np.arange(first, last + 1)):
        lo, hi = np.searchsorted(wanted, [first, last + 1])
        return batch.take(pa.array(wanted[lo:hi] - first)) if hi > lo else None
    at = np.minimum(np.searchsorted(wanted, ords), len(wanted) - 1)
    keep = wanted[at] == ords
    return batch.filter(pa.array(keep)) if keep.any() else None


#: Candidate rows hashed together.
_GROUP_ROWS = 131_072
_HASHED = pa.schema([("ord", pa.int64()), ("_cid", pa.binary()), ("_chash", pa.binary())])


def _hashed(
    con: duckdb.DuckDBPyConnection,
    group: list[pa.RecordBatch],
    key: Sequence[str],
    digest: Digest,
) -> pa.Table:
    """(ordinal, id, payload hash) of ``group``'s rows, hashed as staging hashes them."""
    if not group or not sum(b.num_rows for b in group):
        return _HASHED.empty_table()
    table = pa.Table.from_batches(group)
    payload = [n for n in table.schema.names if not n.startswith("_combined_")]
    ids, hashes = compute_identity(table, list(key), payload, con=con, digest=digest)
    return pa.table([table.column(ORDINAL), ids, hashes], schema=_HASHED)
