"""A snapshot re-capture's changed rows, found by sorting 64-bit fingerprints, then joined exactly.

A re-capture is mostly rows the lake holds already. Joining every staged
(id, payload hash) pair with the lake's in DuckDB builds a hash table of the
whole table's 16-byte digests: at 5M rows ~1.4 CPU-s in one pass, and more
than the reduction's memory, so it ran in six passes over id ranges, each
scanning both sides again (~2.5 CPU-s), after a duplicate check that sorted
every id's hash (~0.6 CPU-s and the reduction's memory peak).

Here each side is read twice, as fixed-width words of its digests (a v2
digest's 16 bytes are two 64-bit words, viewed in place, never copied or
printed): first each row's fingerprint ``f`` (from the id's first word and
the payload hash's first) goes into one array per side, 8 bytes a row; both
are sorted, and the fingerprints found on one side only are the candidates.
Then the rows of the candidates (and, for the duplicate check, the lake's
rows that share an id word with a candidate) are kept, with their digests,
and meet in an exact join on the 16-byte ids: a few percent of the rows.

A row left out is one whose fingerprint is on both sides: its pair is on
both sides unless two different pairs share 64 bits. That is checked, not
assumed: a second word ``g`` of every row (from the digests' other words)
is folded by xor over each side, and the rows matched by fingerprint must
fold alike on both sides; a mismatch (or a fingerprint repeated within a
side) returns None, and the reduction joins every row as before.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from combined.capture._databases import spill_directory
from combined.delivery import part_schema, read_part
from combined.protocol import _digest as dg
from combined.protocol import _provenance as prov
from combined.runtime._memory import release_memory, room_left

if TYPE_CHECKING:
    import duckdb

    from combined.capture._transition import Transition
    from combined.delivery import StagedParts

#: Odd multipliers mixing the payload hash's words into the id's (a bijection of 64 bits).
_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xC2B2AE3D27D4EB4F)
#: Slices of one sorted fingerprint array looked up in the other (bounds the lookups' memory).
_MERGE_CHUNKS = 16
#: Bits of a fingerprint that index the candidates' prefilter: at least
#: ``_PREFILTER_BITS`` (2**22 bytes), four more than the values' own up to
#: ``_PREFILTER_MAX_BITS`` (16 MB). A fixed map filled with the changes of a
#: larger table let more lookups through to the exact search: 20M lookups in
#: 640k values took 1.17 CPU-s at 22 bits, 0.63 at 24 (0.10 at 5M in 160k).
_PREFILTER_BITS = 22
_PREFILTER_MAX_BITS = 24
#: Reduction memory a row of a re-capture's fingerprints takes, both sides (8 bytes
#: a side, and the room to read and sort them): past the room left for them
#: (:func:`print_room`), they are sorted by bucket.
PRINT_BYTES_PER_ROW = 32
#: Bytes a one-sided row holds while candidates are gathered and joined (both sides'
#: kept columns and the join's): past a ``CANDIDATE_SHARE``-th of the reduction's
#: memory over this, every row is joined in DuckDB instead (in its own share, spilling).
CANDIDATE_BYTES = 128
#: At the whole memory, every row of the wide shape's 1M changed (2M one-sided
#: fingerprints, just under it) was gathered and joined at ~520 MB (bench/RESULTS.md).
CANDIDATE_SHARE = 4
#: The least share of the reduction memory the fingerprints get, whatever the process holds.
PRINT_ROOM_SHARE = 4

Words = np.ndarray[Any, np.dtype[np.uint64]]


def digest_words(column: pa.Array) -> Words | None:
    """The (n, 2) 64-bit words of a column of 16-byte digests, viewed in place.

    None when a value is null or not 16 bytes long (the caller joins
    exactly instead).
    """
    fixed = dg.fixed_width(column, 16)
    return None if fixed is None else fixed.view(np.uint64).reshape(-1, 2)


@dataclass(slots=True)
class Prints:
    """One batch's fingerprints ``f``, check words ``g`` and ids' first words."""

    f: Words
    g: Words
    ids: Words


def parts_carry(paths: Iterable[Path], columns: Iterable[str]) -> bool:
    """Whether every staged part at ``paths`` has each of ``columns`` (from its header)."""
    wanted = set(columns)
    return all(wanted <= set(part_schema(p).names) for p in paths)


def prints(ids: pa.Array, hashes: pa.Array) -> Prints | None:
    """The fingerprints of a batch's (id, payload hash) pairs (None: not 16-byte digests)."""
    i, h = digest_words(ids), digest_words(hashes)
    if i is None or h is None:
        return None
    return Prints(i[:, 0] ^ (h[:, 0] * _K1), i[:, 1] ^ (h[:, 1] * _K2), i[:, 0])


#: The murmur3 finalizer's multipliers: it mixes a 64-bit word bijectively and
#: non-linearly, so the xor of mixed terms is no function of the xors of their parts.
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S = np.uint64(33)


def _mixed(x: Words) -> Words:
    """Each of ``x`` mixed (murmur3's fmix64); ``x`` is overwritten."""
    x ^= x >> _S
    x *= _M1
    x ^= x >> _S
    x *= _M2
    x ^= x >> _S
    return x


def pair_folds(batches: Iterable[tuple[pa.Array, pa.Array]]) -> tuple[int, int, int] | None:
    """The pairs of ``batches``' (id, payload hash) digests: how many, and two 64-bit folds.

    The folds xor one term a pair each, a mix of the id's and the hash's
    words (the first words for one fold, the second for the other): a
    128-bit digest of the set of pairs that no reordering changes, and that
    two different sets (a payload moved to another id, a row repeated in
    place of another) share with a chance of ~2^-128. Read from the
    digests' words in place, without the text DuckDB's ``hash(id || hash)``
    concatenates for each row. None where a digest is null or not 16 bytes.
    """
    rows, a, b = 0, 0, 0
    for ids, hashes in batches:
        i, h = digest_words(ids), digest_words(hashes)
        if i is None or h is None:
            return None
        rows += len(i)
        a ^= _xor(_mixed(i[:, 0] ^ (h[:, 0] * _K1)))
        b ^= _xor(_mixed(h[:, 1] ^ (i[:, 1] * _K2)))
    return rows, a, b


def _xor(words: Words) -> int:
    """The xor of ``words`` (0 for none)."""
    return int(np.bitwise_xor.reduce(words)) if len(words) else 0


def _fill(batches: Iterable[tuple[pa.Array, pa.Array]], rows: int) -> tuple[Words, int] | None:
    """Every row's fingerprint (unsorted) and the xor of the check words, or None."""
    out: Words = np.empty(rows, np.uint64)
    at, g = 0, 0
    for ids, hashes in batches:
        p = prints(ids, hashes)
        if p is None or at + len(p.f) > rows:
            return None
        out[at : at + len(p.f)] = p.f
        at, g = at + len(p.f), g ^ _xor(p.g)
    return (out, g) if at == rows else None


def _repeats(sorted_prints: Words) -> bool:
    """Whether a sorted array holds a value twice."""
    return bool(np.any(sorted_prints[1:] == sorted_prints[:-1]))


def one_sided(mine: Words, theirs: Words, most: int | None = None) -> Words | None:
    """The (sorted) values of two sorted arrays of distinct values that only one of them holds.

    Each value of ``mine`` is looked up in ``theirs``, a slice of
    ``_MERGE_CHUNKS`` at a time (sorted lookups: each starts where the last
    one ended), and the values of ``theirs`` met are marked: linear in the
    rows past the two sorts, and memory holds one slice's positions and a
    byte a value of ``theirs``. Sorting both arrays again as one, a range
    at a time, took 4.5 CPU-s at 20M rows a side, against 0.7.

    None once more than ``most`` are found: a re-capture whose every row of
    5M changed gathered 10M one-sided values (80 MB, and as much again to
    join them) only for the caller to join every row instead.
    """
    if not len(mine) or not len(theirs):
        alone = np.concatenate([mine, theirs])  # (one is empty: the other, sorted)
        return None if most is not None and len(alone) > most else alone
    met = np.zeros(len(theirs), np.bool_)
    found: list[Words] = []
    step, count = -(-len(mine) // _MERGE_CHUNKS), 0
    for start in range(0, len(mine), step):
        part = mine[start : start + step]
        at = np.searchsorted(theirs, part)
        np.minimum(at, len(theirs) - 1, out=at)
        hit = theirs[at] == part
        met[at[hit]] = True
        found.append(part[~hit])
        count += len(found[-1])
        if most is not None and count > most:
            return None
    if most is not None and count + len(theirs) - int(np.count_nonzero(met)) > most:
        return None
    found.append(theirs[~met])
    alone = np.concatenate(found)
    alone.sort()  # (the values of one side only: the changes, a few percent)
    return alone


class Members:
    """Membership in a sorted array of fingerprints: a bitmap of their top bits, then exact."""

    def __init__(self, values: Words) -> None:
        self.values = values
        bits = min(max(_PREFILTER_BITS, len(values).bit_length() + 4), _PREFILTER_MAX_BITS)
        shift = np.uint64(64 - bits)
        self._shift = shift
        self._map = np.zeros(1 << bits, np.bool_)
        self._map[values >> shift] = True

    def __call__(self, f: Words) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Which of ``f`` are members."""
        hit: np.ndarray[Any, np.dtype[np.bool_]] = self._map[f >> self._shift]
        if hit.any() and len(self.values):
            maybe = f[hit]
            at = np.minimum(np.searchsorted(self.values, maybe), len(self.values) - 1)
            hit[hit] = self.values[at] == maybe
        return hit


@dataclass(slots=True)
class Candidates:
    """The rows of both sides that may differ, with the checks that the rest do not."""

    #: Staged rows: (ord, _cid, _chash).
    staged: pa.Table
    #: Lake rows: (_kid, _khash, _kf): ``_kf`` false for a row kept only for the duplicate check.
    current: pa.Table


Reader = Callable[[], Iterator[pa.RecordBatch]]


def candidates(
    staged: Reader,
    staged_rows: int,
    current: Reader,
    current_rows: int,
    spill: Spill = None,
    current_schema: pa.Schema | None = None,
    most: int | None = None,
) -> Candidates | None:
    """The rows of a snapshot re-capture and of the lake that may differ, or None.

    ``staged()`` yields batches of (ord, id, payload hash), ``current()`` of
    the lake's (id, payload hash), each read twice. None: digests that are
    not 16 bytes, a fingerprint repeated within a side (a repeated row, or
    64 bits shared by two), or rows matched by fingerprint that are not the
    same pairs (their check words fold differently): the caller joins
    every row instead. ``spill`` (a directory and the bits of a bucket)
    sorts the fingerprints a bucket at a time (see :func:`_spread`).
    ``current_schema`` names the lake rows' columns kept (its last is ``_kf``):
    the two digests, and any columns after them. None too past ``most``
    one-sided fingerprints: their rows would be gathered in memory (a
    re-capture of a table whose every row changed held ~700 MB at 2M rows),
    where the join of every row spills.
    """
    if spill is None:
        found = _one_sided_at_once(staged, staged_rows, current, current_rows, most)
    else:
        found = _one_sided_by_bucket(staged, staged_rows, current, current_rows, *spill, most)
    if found is None:
        return None
    alone, g = Members(found[0]), found[1]
    ours = _kept(staged(), alone, 1, None, _STAGED)
    if ours is None:
        return None
    lake = _kept(current(), alone, 0, Members(np.unique(ours[2])), current_schema or _CURRENT)
    if lake is None or g ^ ours[1] != lake[1]:
        return None  # (rows matched by fingerprint that are not the same pairs)
    return Candidates(ours[0], lake[0])


#: Where a large re-capture's fingerprints wait, by bucket: a directory and the bucket bits.
Spill = tuple[Path, int] | None


def print_room(limit: int) -> int:
    """The reduction memory (``limit``) left for a re-capture's fingerprints, in bytes.

    The limit less the resident memory the process holds already (its
    libraries' mapped pages, its imports' heaps, what the extraction left,
    the reduction's database: ``runtime._memory.held_resident``), never
    under a ``PRINT_ROOM_SHARE``-th of it. Held at once, a 5M-row table's
    fingerprints (80 MB, sorted in place) came on top of ~120 MB held and
    of the lake read's own buffers: the reduction's peak (bench/RESULTS.md);
    by bucket they are written to files as they are read, and sorted a
    bucket at a time (at the default 256 MiB and a 5M-row table, 4).
    """
    return room_left(limit, PRINT_ROOM_SHARE)


def _one_sided_at_once(
    staged: Reader, staged_rows: int, current: Reader, current_rows: int, most: int | None
) -> tuple[Words, int] | None:
    """The one-sided fingerprints (sorted) and the xor of every check word, both sides at once.

    None past ``most`` of them (and see :func:`_fill`, :func:`_one_sided_prints`).
    """
    theirs = _fill(((b.column(0), b.column(1)) for b in current()), current_rows)
    release_memory()  # (what the lake's reader leaves in the heaps: ~20 MB at 5M rows)
    mine = _fill(((b.column(1), b.column(2)) for b in staged()), staged_rows)
    if mine is None or theirs is None:
        return None
    alone = _one_sided_prints(mine[0], theirs[0], most)
    return None if alone is None else (alone, mine[1] ^ theirs[1])


def _one_sided_by_bucket(
    staged: Reader,
    staged_rows: int,
    current: Reader,
    current_rows: int,
    spill: Path,
    bits: int,
    most: int | None,
) -> tuple[Words, int] | None:
    """:func:`_one_sided_at_once`, holding one bucket of both sides' fingerprints at a time."""
    with tempfile.TemporaryDirectory(dir=spill, prefix="prints-") as tmp:
        theirs = _spread(
            ((b.column(0), b.column(1)) for b in current()), current_rows, bits, Path(tmp, "c")
        )
        mine = _spread(
            ((b.column(1), b.column(2)) for b in staged()), staged_rows, bits, Path(tmp, "s")
        )
        if mine is None or theirs is None:
            return None
        # What both reads left in the heaps and DuckDB's jemalloc (~20-40 MB at
        # 5M rows), given back before the buckets' arrays come on top of it.
        release_memory()
        found: list[Words] = []
        left = most
        for bucket in range(1 << bits):  # (in order: the buckets are the top bits)
            alone = _one_sided_prints(
                np.fromfile(Path(tmp, f"s{bucket}"), np.uint64),
                np.fromfile(Path(tmp, f"c{bucket}"), np.uint64),
                left,
            )
            if alone is None:
                return None
            found.append(alone)
            left = None if left is None else left - len(alone)
    return np.concatenate(found), mine ^ theirs


def _spread(
    batches: Iterable[tuple[pa.Array, pa.Array]], rows: int, bits: int, stem: Path
) -> int | None:
    """Write each row's fingerprint to the file of its bucket (its top ``bits``).

    Returns the xor of the check words, or None (see :func:`_fill`). At 20M
    rows both sides' arrays held 320 MB (over 580 MB at the peak); the files
    are written once and read back a bucket at a time.
    """
    shift, g, seen = np.uint64(64 - bits), 0, 0
    files = [open(f"{stem}{b}", "wb") for b in range(1 << bits)]  # noqa: SIM115 (closed below)
    try:
        for ids, hashes in batches:
            p = prints(ids, hashes)
            if p is None:
                return None
            seen, g = seen + len(p.f), g ^ _xor(p.g)
            spread_to_buckets(p.f, shift, files)
    finally:
        for out in files:
            out.close()
    return g if seen == rows else None


def spread_to_buckets(f: Words, shift: np.uint64, files: list[Any]) -> None:
    """Append each of ``f`` to the file of its bucket (its bits from ``shift`` up): linear.

    A stable sort of 16-bit keys is a radix sort: one pass whatever the
    buckets, where a mask a bucket scanned the batch once for each.
    """
    top = (f >> shift).astype(np.uint16)
    order = np.argsort(top, kind="stable")
    ends = np.cumsum(np.bincount(top, minlength=len(files))).tolist()
    grouped = f[order]
    for bucket, out in enumerate(files):
        grouped[ends[bucket - 1] if bucket else 0 : ends[bucket]].tofile(out)


def _one_sided_prints(mine: Words, theirs: Words, most: int | None = None) -> Words | None:
    """The fingerprints of one side only, sorted (None: one repeated within a side, or
    more than ``most`` of them).

    Sorts both arrays in place.
    """
    mine.sort()
    theirs.sort()
    if _repeats(mine) or _repeats(theirs):
        return None
    return one_sided(mine, theirs, most)


_STAGED = pa.schema([("ord", pa.int64()), ("_cid", pa.binary()), ("_chash", pa.binary())])
_CURRENT = pa.schema([("_kid", pa.binary()), ("_khash", pa.binary()), ("_kf", pa.bool_())])


def _kept(
    batches: Iterator[pa.RecordBatch],
    alone: Members,
    first: int,
    ids: Members | None,
    schema: pa.Schema,
) -> tuple[pa.Table, int, Words] | None:
    """The rows of ``batches`` whose fingerprint is one-sided (or whose id word is in ``ids``).

    Their digests are columns ``first`` and ``first + 1``. Returns the rows
    (their first columns, in ``schema``), the xor of the one-sided rows'
    check words and the kept rows' id words. With ``ids``, a last column
    tells the one-sided rows from the ones kept for their id alone.
    """
    width = len(schema) - (ids is not None)
    kept: list[pa.RecordBatch] = []
    words: list[Words] = [np.empty(0, np.uint64)]
    g = 0
    for batch in batches:
        p = prints(batch.column(first), batch.column(first + 1))
        if p is None:
            return None  # (the rows changed between the two reads)
        hit = alone(p.f)
        g ^= _xor(p.g[hit])
        keep = hit if ids is None else hit | ids(p.ids)
        if not keep.any():
            continue
        columns = [c.cast(t) for c, t in zip(batch.columns[:width], schema.types, strict=False)]
        if ids is not None:
            columns.append(pa.array(hit))
        kept.append(pa.RecordBatch.from_arrays(columns, schema=schema).filter(pa.array(keep)))
        words.append(p.ids[keep])
    return pa.Table.from_batches(kept, schema), g, np.concatenate(words)


class _Reduction(Protocol):
    """What the fingerprints read and write of a reduction."""

    @property
    def con(self) -> duckdb.DuckDBPyConnection: ...

    streamed: bool
    digest: dg.Digest
    transition: Transition | None
    _fingerprinted: bool | None
    _has_current: bool
    _staged: StagedParts
    _lake_files: list[str] | None
    _current_files: list[str]
    memory_limit: int
    key: list[str]
    #: The payload compared by value, in the lake's types (None: compared by digests).
    by_values: pa.Schema | None
    _value_joined: bool
    #: The lake's columns the capture lacks (``capture._dropped``).
    dropped: list[str]

    def _current_rows(self) -> int: ...

    def _join_current(
        self, last: str, current: str, cut: int | None, passes: int | None = None
    ) -> Transition: ...

    def _join_candidates(self, found: Candidates) -> bool: ...

    def _lake_digests(self) -> Iterator[pa.RecordBatch]: ...

    def _spill(self, rows: int) -> Spill: ...
    def _most_candidates(self) -> int: ...

    def _by_values(self) -> Candidates | None: ...


class Fingerprints:
    """A snapshot re-capture reduced by fingerprints (a reduction's mixin)."""

    #: Whether the transition was found from fingerprints (None: not tried yet).
    _fingerprinted: bool | None = None

    def by_fingerprints(self: _Reduction) -> Transition | None:
        """A snapshot re-capture's transition from the rows whose fingerprints differ.

        None where it does not apply (not a v2 snapshot re-capture) or its
        checks refuse (see above), and where the capture may repeat an id:
        its candidates hold two rows of one id, or a candidate's id is a
        lake row's that another staged row matched. The reduction then
        joins every row (and checks duplicates).
        """
        if self._fingerprinted is None:
            self._fingerprinted = False
            columns = ["_combined_ordinal", prov.ID, prov.PAYLOAD_HASH]
            if self.by_values is not None:
                found = self._by_values()
                if found is not None:
                    release_memory()  # (the fingerprints' freed arrays, before the join's)
                    self._value_joined = True  # (the rows left out are unchanged)
                    self._fingerprinted = self._value_joined = self._join_candidates(found)
            elif (
                self.streamed
                and not self.dropped  # (a lake row's stored digest may not be compared)
                and self._has_current
                and self.digest == dg.BINARY
                and parts_carry(self._staged.paths, columns)
            ):
                # The parts' own three columns (never the whole rows cast to the
                # reduction's schema, which a wide table's parts may need).
                rows = self._staged.count_rows()
                try:
                    found = candidates(
                        lambda: (
                            b.select(columns) for p in self._staged.paths for b in read_part(p)
                        ),
                        rows,
                        self._lake_digests,
                        self._current_rows(),
                        self._spill(max(rows, self._current_rows())),
                        most=self._most_candidates(),
                    )
                except (pa.ArrowInvalid, KeyError):
                    found = None  # (a lake file without the digest columns)
                if found is not None:
                    release_memory()  # (the fingerprints' freed arrays, before the join's)
                    self._fingerprinted = self._join_candidates(found)
        return self.transition if self._fingerprinted else None

    @property
    def compared_by_value(self: _Reduction) -> bool:
        """Whether the transition was found by comparing values (``capture._values``)."""
        return self.by_values is not None and bool(self._fingerprinted)

    def _by_values(self: _Reduction) -> Candidates | None:
        """The candidates of a capture staged unhashed, found by comparing values (``_values``)."""
        from combined.capture._values import CURRENT, Misaligned, ValuePrints, exact

        if not (self._has_current and self.digest == dg.BINARY and self.by_values is not None):
            return None
        import duckdb

        rows, current = self._staged.count_rows(), self._current_rows()
        with tempfile.TemporaryDirectory(dir=spill_directory(self.con), prefix="values-") as cache:
            prints = ValuePrints(
                self.con,
                self.by_values,
                self.key,
                self._staged.paths,
                self._current_files,
                Path(cache),
            )
            try:
                if not prints.agree():
                    return None  # (DuckDB reads a column of one side in another type)
                found = candidates(
                    prints.staged,
                    rows,
                    prints.current,
                    current,
                    self._spill(max(rows, current)),
                    CURRENT,
                    most=self._most_candidates(),
                )
            except (duckdb.Error, Misaligned):
                return None  # (a lake file read otherwise: every row is hashed instead)
        if found is None:
            return None
        return exact(self.con, found, self._staged.paths, self.key, self.digest)

    def _most_candidates(self: _Reduction) -> int:
        """How many one-sided fingerprints the candidates may gather in memory."""
        return max(self.memory_limit // CANDIDATE_SHARE // CANDIDATE_BYTES, 65_536)

    def _spill(self: _Reduction, rows: int) -> Spill:
        """Where and in how many buckets ``rows`` fingerprints a side are sorted (None: at once)."""
        buckets = -(-rows * PRINT_BYTES_PER_ROW // print_room(self.memory_limit))
        if buckets <= 1:
            return None
        directory = spill_directory(self.con)
        if directory is None:
            return None  # (nowhere to write them: at once, as smaller ones)
        return directory, (buckets - 1).bit_length()

    def _lake_digests(self: _Reduction) -> Iterator[pa.RecordBatch]:
        """The lake's (id, payload hash) batches.

        A local lake's files are read by pyarrow, one thread, two columns:
        read through DuckDB into Arrow, the lake's 5M digests twice left
        ~20 MB more in the heaps after the reduction (and on the commit's
        peak), at about the same CPU. A remote lake or a backfill's range
        of it is read through the reduction's ``cur`` view.
        """
        if self._lake_files is None:
            yield from self.con.sql("SELECT _kid, _khash FROM cur").to_arrow_reader(65_536)
            return
        columns = [prov.ID, prov.PAYLOAD_HASH]
        for path in self._lake_files:
            with pq.ParquetFile(path) as pf:
                yield from pf.iter_batches(batch_size=65_536, columns=columns, use_threads=False)

    def _join_candidates(self: _Reduction, found: Candidates) -> bool:
        """Join the candidate rows exactly into ``tr``; False if an id may repeat."""
        con = self.con
        con.register("fp_mine", found.staged)
        con.register("fp_theirs", found.current)
        try:
            repeated = con.execute(
                "SELECT 1 FROM (SELECT _cid FROM fp_mine GROUP BY _cid HAVING count(*) > 1) "
                "UNION ALL SELECT 1 FROM fp_mine JOIN fp_theirs ON _cid = _kid WHERE NOT _kf "
                "LIMIT 1"
            ).fetchall()
            if not repeated:
                self._join_current(
                    "SELECT ord, _cid, _chash, 'upsert' AS _cop FROM fp_mine",
                    "(SELECT _kid, _khash FROM fp_theirs WHERE _kf)",
                    cut=None,
                    passes=1,
                )
        finally:
            con.unregister("fp_mine")
            con.unregister("fp_theirs")
        return not repeated
