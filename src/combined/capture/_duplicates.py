"""Keys a capture holds more than once: found, refused, and their rows for quarantine.

A mixin of :class:`~combined.capture._reduce.Reducer`: it reads the
reduction's views (``pay``, ``cap``) through the reduction's connection.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from combined.capture._databases import spill_directory
from combined.capture._dropped import unchanged_sql
from combined.capture._fingerprint import spread_to_buckets
from combined.delivery import read_part
from combined.errors import DuplicateKeys
from combined.protocol import _digest as dg
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa


def meeting_hashes(rows: str, column: str) -> str:
    """SQL: the 64-bit hashes of ``column`` that two of ``rows`` share.

    Sorted neighbours that are equal: several times cheaper than grouping
    the ids' text, and half the memory of a hash table over them (~60
    against ~130 MB for 2M ids). Equal ids always meet; the exact ids are
    compared wherever two hashes do.
    """
    return (
        "SELECT h FROM (SELECT h, lag(h) OVER (ORDER BY h) AS p "
        f"FROM (SELECT hash({column}) AS h FROM {rows})) WHERE h = p"
    )


#: What DuckDB holds of a change in a change stream's apply-order windows (its
#: id, operation, hashes and their lags, and the window's own state), for
#: :meth:`DuplicateChecks._window_buckets`.
WINDOW_BYTES_PER_CHANGE = 512

#: Bytes of id prefixes sorted at once by :func:`distinct_prefixes` (a bucket each).
PREFIX_PASS_BYTES = 16 * 2**20
_DIGEST_BYTES = 16


def distinct_prefixes(parts: Sequence[Path], spill: Path | None = None) -> bool:
    """Whether the staged binary ids of ``parts`` differ in their first 64 bits.

    True proves that no id is staged twice (equal ids share every bit); False
    only that two might be: the exact check decides. The ids are md5 digests
    (identity encoding v2), so their first 64 bits are uniform: a bucket of
    the top bits holds its share of the rows. The parts' id columns are read
    once; past :data:`PREFIX_PASS_BYTES` of prefixes, each goes to its
    bucket's file in ``spill`` (the parts' directory by default) and one
    bucket is sorted at a time. DuckDB's sort of the ids' hashes held the
    whole reduction memory at 20M rows (~250 MB) and took several times the
    CPU. Hex ids (v1) give False.
    """
    rows = sum(b.num_rows for path in parts for b in read_part(path))  # (headers only)
    bits = max(0, int(np.ceil(np.log2(max(rows * 8 / PREFIX_PASS_BYTES, 1)))))
    if not bits:
        prefixes = np.empty(rows, np.uint64)
        filled = _fill(prefixes, parts)
        return filled == rows and _distinct(prefixes)
    with tempfile.TemporaryDirectory(dir=spill or parts[0].parent, prefix="prefixes-") as tmp:
        stems = [Path(tmp, str(bucket)) for bucket in range(1 << bits)]
        if _spread(parts, bits, stems) != rows:
            return False
        return all(_distinct(np.fromfile(stem, np.uint64)) for stem in stems)


def _distinct(prefixes: np.ndarray) -> bool:
    """Whether no two of ``prefixes`` are equal (sorts them in place)."""
    prefixes.sort()
    return not bool(np.any(prefixes[1:] == prefixes[:-1]))


def _fill(out: np.ndarray, parts: Sequence[Path]) -> int:
    """Copy the parts' id prefixes into ``out``: how many (-1 for ids other than v2)."""
    at = 0
    for first in _first_words_of(parts):
        if first is None or at + len(first) > len(out):
            return -1
        out[at : at + len(first)] = first
        at += len(first)
    return at


def _spread(parts: Sequence[Path], bits: int, stems: Sequence[Path]) -> int:
    """Append each id prefix to the file of its top ``bits``: how many (-1: not v2)."""
    shift, seen = np.uint64(64 - bits), 0
    files = [open(stem, "wb") for stem in stems]  # noqa: SIM115 (closed below)
    try:
        for first in _first_words_of(parts):
            if first is None:
                return -1
            # One pass a batch (a radix sort of its bucket numbers), where a
            # mask a bucket scanned it once for each: 0.9 -> 0.6 CPU-s at 20M ids.
            spread_to_buckets(first, shift, files)
            seen += len(first)
    finally:
        for out in files:
            out.close()
    return seen


def _first_words_of(parts: Sequence[Path]) -> Iterator[np.ndarray | None]:
    """Each batch's id prefixes (a copy), read from the parts' id columns alone.

    Yields None (and stops) at a part whose ids are not v2 digests.
    """
    import pyarrow as pa

    for path in parts:
        # Read, not mapped: a mapping's pages of ids would stay in the RSS.
        with pa.OSFile(str(path)) as f:
            names = pa.ipc.open_file(f).schema.names
            if prov.ID not in names:
                yield None
                return
            # The id column alone: a compressed part's other columns are not decoded.
            only = pa.ipc.IpcReadOptions(included_fields=[names.index(prov.ID)])
            reader = pa.ipc.open_file(f, options=only)
            for i in range(reader.num_record_batches):
                first = _first_words(reader.get_batch(i).column(0))
                yield first
                if first is None:
                    return


def _first_words(ids: pa.Array) -> np.ndarray | None:
    """Each 16-byte id's first 8 bytes as an integer (a copy), or None for other ids."""
    import pyarrow as pa

    if not pa.types.is_binary(ids.type) or ids.null_count:
        return None
    n = len(ids)
    offsets = np.frombuffer(ids.buffers()[1], np.int32, n + 1, ids.offset * 4)
    if n and not bool(np.all(np.diff(offsets) == _DIGEST_BYTES)):
        return None
    data = np.frombuffer(ids.buffers()[2], np.uint8, n * _DIGEST_BYTES, int(offsets[0]))
    return data.view(np.uint64)[::2].copy()


class _Reduction(Protocol):
    """What the checks read of a reduction."""

    @property
    def con(self) -> duckdb.DuckDBPyConnection: ...

    sync_mode: str
    has_op: bool
    full: bool
    by_content: bool
    streamed: bool
    _has_order: bool
    _has_live: bool
    _buckets: list[str]
    _duck_limit: int
    _cut: int | None
    key: list[str]
    capture_schema: pa.Schema
    capture_files: list[Path]
    _ahead: Future[bool] | None
    _kcmp: str

    def same_as_current(self) -> bool: ...

    def by_fingerprints(self) -> Any: ...

    def _keys(self) -> str: ...

    def _prefixes_distinct(self) -> bool: ...

    def _stream_order(self) -> int | None: ...

    def _window_buckets(self, changes: int) -> list[str]: ...

    def _live_sql(self) -> str: ...

    def _bucket_changes(self, mine: str, after: str) -> None: ...

    def _stream_duplicates(self, limit: int) -> list[tuple[str, int, list[int]]]: ...

    def duplicates(self, limit: int = 1000) -> list[tuple[str, int, list[int]]]: ...

    def _repeated_sql(self) -> str: ...


class DuplicateChecks:
    """Duplicate keys of a full-row capture (a reduction's mixin)."""

    #: :func:`distinct_prefixes` started ahead of :meth:`duplicates` (:meth:`prefixes_ahead`).
    _ahead: Future[bool] | None = None
    #: Table ``live`` made (:meth:`_live_sql`); ``rep``'s buckets (:meth:`_window_buckets`).
    _has_live = False
    _buckets: list[str] = [""]  # noqa: RUF012 (replaced, never changed in place)

    def prefixes_ahead(self: _Reduction, pool: Executor) -> bool:
        """Start a first baseline's prefix check on ``pool``; whether it was started.

        A first baseline's Deliveries need nothing of the check: they are
        encoded while it runs (on a thread of ``pool``), and :meth:`duplicates`
        takes its answer after. A capture found to hold a key twice is then
        refused as before, its Deliveries erased with the Attempt's staging
        (never committed): ~0.1 CPU-s a million ids, no longer serial. A
        delta (not ``full``) has no such check: its ids were proved distinct.
        """
        whole = self.streamed and self.full and self.sync_mode != "append"
        if not whole or self.by_content or self.has_op:
            return False
        self._ahead = pool.submit(distinct_prefixes, self.capture_files, spill_directory(self.con))
        return True

    def _prefixes_distinct(self: _Reduction) -> bool:
        """:func:`distinct_prefixes` of the staged parts, spilling where the reduction does."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            return ahead.result()
        return distinct_prefixes(self.capture_files, spill_directory(self.con))

    def _may_repeat_ids(self: _Reduction) -> bool:
        """Whether two staged rows may share an id (their ids' 64-bit hashes meet)."""
        if self._prefixes_distinct():
            return False
        rows = self.con.execute(f"SELECT 1 FROM ({meeting_hashes('pay', prov.ID)}) LIMIT 1")
        return bool(rows.fetchall())

    def duplicates(self: _Reduction, limit: int = 1000) -> list[tuple[str, int, list[int]]]:
        """Ids present more than once in a full-row capture, with their ordinals.

        An event stream (``append``) has none: it keeps every row it reads and
        replaces none, so two equal rows (a keyless event read twice, the same
        event repeated) are two events, not a key that cannot choose a row.
        """
        if self.sync_mode == "append" or self.by_content:
            return []  # (a table without a key numbers its equal rows apart)
        if self.has_op:
            return self._stream_duplicates(limit)
        if not self.full or self.same_as_current():
            return []  # (see same_as_current: an unchanged capture holds each id once)
        if self.by_fingerprints() is not None:
            return []  # (its checks found each id once)
        if self.streamed and self._prefixes_distinct():
            return []  # (the staged ids differ in their first 64 bits)
        # A snapshot's staged columns as they are (no narrow table of its size).
        keys = (
            f"(SELECT _combined_ordinal AS ord, {prov.ID} AS _cid FROM pay)"
            if self.streamed
            else self._keys()
        )
        meet = meeting_hashes(keys, "_cid")
        rows = self.con.execute(
            "SELECT _cid, count(*), list(ord ORDER BY ord) "
            f"FROM {keys} WHERE hash(_cid) IN ({meet}) "
            f"GROUP BY _cid HAVING count(*) > 1 ORDER BY _cid LIMIT {int(limit)}"
        ).fetchall()
        return [(dg.digest_text(r[0]), int(r[1]), list(r[2])) for r in rows]

    def _stream_order(self: _Reduction) -> int | None:
        """The ids a change stream inserts while a row of them is there; their apply order.

        Makes table ``rep`` (those ids: inserted twice, or inserted while in
        the lake; none after a truncate) and table ``moved_out`` (``ord``,
        ``seq``) of the deletes that apply before the insert logged just
        before them. Changes apply in log order (``seq`` = twice the
        ordinal), but for a delete of the row a key held before a row moved
        onto it: a statement shifting a deferrable unique key through its
        own rows (``UPDATE t SET id = id + 1`` under ``REPLICA IDENTITY
        FULL``) logs row 1's move to key 2 before row 2's move away. Such a
        delete carries its row whole, the row the key held before the
        insert: it applies just before the insert and the key holds one row
        throughout. Its values may equal the inserted row's (rows alike
        beside their key): which of two equal rows it took changes nothing,
        where the key counted twice held the capture as duplicate keys.
        Returns the ordinal of the last truncate (``None``: none).
        """
        if self._has_order:
            return self._cut
        keys = self._keys()
        (cut,) = self.con.execute(
            f"SELECT max(ord) FROM {keys} WHERE _cop = 'truncate'"
        ).fetchall()[0]
        after = "" if cut is None else f" AND ord > {int(cut)}"
        changes = f"SELECT _cid, _cop, _chash, ord FROM {keys} WHERE _cop <> 'truncate'{after}"
        (inserts,) = self.con.execute(
            f"SELECT count(*) FROM ({changes}) WHERE _cop = 'insert'"
        ).fetchall()[0]
        for n, bucket in enumerate(self._window_buckets(int(inserts))):
            inserted = f"SELECT _cid FROM ({changes}) WHERE _cop = 'insert'{bucket}"
            held = (
                "false"
                if cut is not None
                else f"_cid IN (SELECT _kid FROM cur WHERE _kid IN ({inserted}))"
            )
            make = "CREATE OR REPLACE TABLE rep AS" if n == 0 else "INSERT INTO rep"
            self.con.execute(
                f"{make} SELECT _cid FROM ({inserted}) GROUP BY _cid HAVING count(*) > 1 OR {held}"
            )
        # The row before the insert: the change logged before it, or the lake's.
        lake = (
            "false"
            if cut is not None
            else "EXISTS (SELECT 1 FROM cur WHERE _kid = w._cid AND "
            f"{unchanged_sql('w._chash', '', self._kcmp)})"
        )
        (moves,) = self.con.execute(
            f"SELECT count(*) FROM ({changes}) WHERE _cid IN (SELECT _cid FROM rep)"
        ).fetchall()[0]
        self._buckets = self._window_buckets(int(moves))
        for n, bucket in enumerate(self._buckets):
            make = "CREATE OR REPLACE TABLE moved_out AS" if n == 0 else "INSERT INTO moved_out"
            self.con.execute(
                f"{make} WITH w AS (SELECT ord, _cid, _cop, _chash, "
                "lag(_cop) OVER o AS p_op, lag(ord) OVER o AS p_ord, lag(_chash) OVER o AS p_hash, "
                "lag(_cop, 2) OVER o AS pp_op, lag(_chash, 2) OVER o AS pp_hash "
                f"FROM ({changes}) WHERE _cid IN (SELECT _cid FROM rep WHERE true{bucket}) "
                "WINDOW o AS (PARTITION BY _cid ORDER BY ord)) "
                "SELECT ord, 2 * p_ord - 1 AS seq FROM w "
                "WHERE _cop = 'delete' AND p_op = 'insert' AND CASE "
                f"WHEN pp_op IS NULL THEN {lake} "
                "ELSE pp_op <> 'delete' AND pp_hash = _chash END"
            )
        self._has_order, self._cut = True, None if cut is None else int(cut)
        return self._cut

    def _window_buckets(self: _Reduction, changes: int) -> list[str]:
        """Filters (SQL) of ids, a bucket each, whose ``changes`` one statement orders at once.

        Finding the ids a stream inserts while they are there groups its
        inserts and orders each such id's changes in windows, all of them
        at once: 400k keys deleted and inserted again in one capture (800k
        changes) overran the reduction's DuckDB memory at the defaults,
        which those statements did not spill from. A bucket's changes fit
        that memory (:data:`WINDOW_BYTES_PER_CHANGE` each); most captures
        need one.
        """
        per = max(self._duck_limit // WINDOW_BYTES_PER_CHANGE, 1)
        count = -(-changes // per)
        if count <= 1:
            return [""]
        return [f" AND hash(_cid) % {count} = {b}" for b in range(count)]

    def _live_sql(self: _Reduction) -> str:
        """SQL: each id a change stream inserts while a row of it is there, and its most rows.

        Counted in apply order (:meth:`_stream_order`) from its lake row
        (none after a truncate): an insert adds a row, a delete takes one; a
        key change is a delete of the old id and an insert of the new one.
        Only a key the source does not keep unique (a nullable UNIQUE key's
        NULLs, a REPLICA IDENTITY FULL table keyed on a column with repeats)
        inserts an id that is there: the stream merged such rows into one
        lake row, the last change winning, and a row was lost without a
        word. Only the ids inserted while in the lake or inserted twice are
        counted, a bucket of them at a time (:meth:`_window_buckets`), into
        table ``live``; their ordinals are read for the few found
        (:meth:`_stream_duplicates`).
        """
        cut = self._stream_order()
        if self._has_live:
            return "SELECT _cid, n FROM live"
        after = "" if cut is None else f" AND ord > {cut}"
        for n, bucket in enumerate(self._buckets):  # (as _stream_order's windows)
            mine = f"SELECT _cid FROM rep WHERE true{bucket}"
            held = (
                "SELECT _kid FROM cur WHERE false"
                if cut is not None
                else f"SELECT DISTINCT _kid FROM cur WHERE _kid IN ({mine})"
            )
            # (A table: as a CTE, the window beside it overran 61 MB on 57k ids.)
            self.con.execute(f"CREATE OR REPLACE TABLE held AS {held}")
            self._bucket_changes(mine, after)
            make = "CREATE OR REPLACE TABLE live AS" if n == 0 else "INSERT INTO live"
            self.con.execute(
                f"{make} WITH r AS (SELECT _cid, _cop, "
                "CASE WHEN _cid IN (SELECT _kid FROM held) THEN 1 ELSE 0 END + "
                "sum(CASE _cop WHEN 'insert' THEN 1 WHEN 'delete' THEN -1 ELSE 0 END) "
                "OVER (PARTITION BY _cid ORDER BY seq) AS n FROM bc) "
                "SELECT _cid, max(n) AS n FROM r GROUP BY _cid "
                "HAVING max(n) FILTER (WHERE _cop = 'insert') > 1"
            )
        self.con.execute("DROP TABLE IF EXISTS held; DROP TABLE IF EXISTS bc")
        self._has_live = True
        return "SELECT _cid, n FROM live"

    def _bucket_changes(self: _Reduction, mine: str, after: str) -> None:
        """Table ``bc``: the changes of the ids ``mine`` selects, each with its apply order.

        A table before its window: the window over the changes joined to the
        whole of ``moved_out`` in one statement held both at once and overran
        DuckDB's share of the default memory (61 MB) on a bucket of 60k ids
        (a deferrable key rotated through 300k rows of a ``REPLICA IDENTITY
        FULL`` table, every delete moved out). The join builds on the
        bucket's changes, not on ``moved_out``, which grows with the stream.
        """
        self.con.execute(
            "CREATE OR REPLACE TABLE bc AS SELECT b._cid, b._cop, "
            "coalesce(m.seq, 2 * b.ord) AS seq FROM moved_out m RIGHT JOIN "
            f"(SELECT _cid, _cop, ord FROM {self._keys()} "
            f"WHERE _cop <> 'truncate'{after} AND _cid IN ({mine})) b ON m.ord = b.ord"
        )

    def _stream_duplicates(self: _Reduction, limit: int) -> list[tuple[str, int, list[int]]]:
        """Ids a change stream inserts while they are there (:meth:`_live_sql`), with ordinals."""
        live = self._live_sql()
        after = "" if self._cut is None else f" AND k.ord > {self._cut}"
        # Their ordinals (in apply order's terms: every change of the id after the truncate).
        rows = self.con.execute(
            f"WITH top AS (SELECT _cid, n FROM ({live}) ORDER BY _cid LIMIT {int(limit)}) "
            "SELECT t._cid, t.n, list(k.ord ORDER BY k.ord) FROM top t "
            f"JOIN {self._keys()} k ON k._cid = t._cid WHERE k._cop <> 'truncate'{after} "
            "GROUP BY t._cid, t.n ORDER BY t._cid"
        ).fetchall()
        return [(dg.digest_text(r[0]), int(r[1]), list(r[2])) for r in rows]

    def check_duplicates(self: _Reduction, dataset: str) -> None:
        """Raise DuplicateKeys when the capture holds a key twice (counted up to 1000)."""
        n = len(self.duplicates(limit=1001))
        if n:
            raise DuplicateKeys(
                f"the capture of {dataset} holds {n if n <= 1000 else 'more than 1000'} "
                f"duplicate key(s) of ({', '.join(self.key)}); nothing was committed for it",
                hint="fix the key in the source or declare a key that is unique; "
                "the duplicates are in quarantine (`combined quarantine list`)",
                duplicates=min(n, 1000),
            )

    def duplicate_rows(self: _Reduction) -> pa.Table:
        """The full rows whose key is duplicated (for quarantine)."""
        cols = ", ".join(
            quote_ident(n)
            for n in self.capture_schema.names
            if n not in (prov.ID, prov.PAYLOAD_HASH)
        )
        return self.con.sql(
            f"SELECT {cols}, _cid AS _combined_id FROM cap WHERE _cid IN "
            f"({self._repeated_sql()}) ORDER BY _combined_ordinal"
        ).to_arrow_table()

    def null_key_columns(self: _Reduction) -> list[str]:
        """The key columns holding NULL in a row of a duplicated key.

        The source may hold distinct values there that the read turned into
        NULL (MariaDB's zero dates under ``zero_dates: null``): the read then
        names that cause (``Extraction.null_key_hint``).
        """
        tests = ", ".join(f"bool_or({quote_ident(c)} IS NULL)" for c in self.key)
        found = self.con.execute(
            f"SELECT {tests} FROM cap WHERE _cid IN ({self._repeated_sql()})"
        ).fetchone()
        return [c for c, null in zip(self.key, found or (), strict=False) if null]

    def _repeated_sql(self: _Reduction) -> str:
        """SQL: the ids of the capture's duplicated keys."""
        if self.has_op:
            return f"SELECT _cid FROM ({self._live_sql()})"
        return "SELECT _cid FROM cap GROUP BY _cid HAVING count(*) > 1"
