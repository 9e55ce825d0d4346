"""Reduce a staged capture to the sparse transition, out of core, in DuckDB.

Every strategy stages what it read; the reduction compares it with the
current state by (``_combined_id``, ``_combined_payload_hash``):

- ``snapshot``: the capture is the whole relation; ids missing from it are
  explicit deletes.
- ``cursor`` / ``cdc``: the capture is a delta; the last change per id wins
  and absent ids are untouched.

Only ids, hashes and operations are materialised (O(changes) after the first
baseline); full rows stream from the staged parts (Arrow IPC) to the Deliveries.
DuckDB spills to the run's staging directory past ``memory_limit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from combined.capture._databases import (
    KEEP_STAGED_BYTES,
    close_database,
    files_sql,
    open_database,
)
from combined.capture._deliver import STAGED as _STAGED
from combined.capture._deliver import Output
from combined.capture._dropped import COMPARED, compared, current_sql, dropped_columns
from combined.capture._duplicates import DuplicateChecks
from combined.capture._fingerprint import Fingerprints, pair_folds, parts_carry
from combined.capture._join import (
    JOIN_BYTES_PER_ROW,
    MAX_JOIN_PASSES,
    Join,
    _id_ranges,
    _in_range,
)
from combined.capture._lake_fills import EventLake
from combined.capture._output import OUTPUT_BATCH_ROWS, by_part, part_ranges
from combined.capture._resnapshot import against_events
from combined.capture._soft import deleted_sql
from combined.capture._stats import Stats
from combined.capture._transition import DIGEST_CLASSES, Transition, transition_digest
from combined.capture._unchanged import (
    FILL_JOIN_MB,
    UNCHANGED,
    VALUE_MEMORY_FACTOR,
    Resolved,
    resolve_unchanged,
)
from combined.delivery import StagedParts, read_part
from combined.protocol import _digest as dg
from combined.protocol import _provenance as prov
from combined.protocol.identity import (
    content_id_sql,
    duckdb_scannable_schema,
    identity_sql,
    quote_ident,
    streamed_payload_hash_sql,
)

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "DIGEST_CLASSES",
    "JOIN_BYTES_PER_ROW",
    "MAX_JOIN_PASSES",
    "OUTPUT_BATCH_ROWS",
    "UNCHANGED",
    "Reducer",
    "Transition",
    "_id_ranges",
    "_in_range",
    "transition_digest",
]

#: A change stream's reduction (rows with operations) gives DuckDB this share
#: of the reduction memory: it materialises narrow tables that it scans (the
#: lineage, the fills, the keys, the transition), which spill cheaply, and
#: builds its joins on ids and ordinals. At a half, a backlog of 500k wide
#: TOAST-unchanged updates peaked ~100 MB lower (541 -> 441 MB) for the same
#: CPU-seconds; at a quarter (64 MB at the default), ~60 MB lower again
#: (bench/RESULTS.md).
CHANGE_STREAM_SHARE = 4
#: The least DuckDB memory a reduction is given, in MB.
MIN_DUCK_MB = 64
#: A snapshot re-capture joined row by row (its fingerprints refused, or found
#: too many rows changed to gather them) gives DuckDB this share of the
#: reduction memory: the tables of every row it makes (its keys, the lake's,
#: the transition) spill to the run's staging, and the join goes in passes over
#: id ranges sized by the share. At the whole limit, on top of what the process
#: held, a 2M-row re-capture whose every row changed peaked at ~530 MB
#: (bench/RESULTS.md). Only this work is bounded: a change stream's fills keep
#: their memory (they build hash tables that do not spill).
WHOLE_JOIN_SHARE = 4
#: At most this many passes of such a join: each scans both sides' tables again
#: (spilled), where DuckDB's hash join spills its own partitions for less. Every
#: row of 5M narrow ones changed: 6 passes 43-46 CPU-s, 2 passes 41.6, one 38.5,
#: for the same peak (the commit's, ~415 MB); the join held ~310 MB in one pass
#: at the whole reduction memory (bench/RESULTS.md).
WHOLE_JOIN_PASSES = 2

log = logging.getLogger(__name__)


def _duck_mb(nbytes: int) -> int:
    """A DuckDB memory limit in MB for ``nbytes``, at least ``MIN_DUCK_MB``."""
    return max(nbytes // 2**20, MIN_DUCK_MB)


class Reducer(DuplicateChecks, Fingerprints, Join, Stats, Output):
    """One dataset's reduction, in its own DuckDB connection."""

    # How the capture reduces (set by _modes).
    full: bool
    payload: list[str]
    key: list[str]
    has_op: bool
    soft: str | None
    prehashed: bool
    streamed: bool
    all_new: bool
    #: Payload columns a row may hold a value of more than ``LARGE_FILL_BYTES`` in.
    large_values: tuple[str, ...] = ()
    #: The key columns an event stream's new snapshot's deletes take (``capture._resnapshot``).
    _gone: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        capture_files: Sequence[Path],
        capture_schema: pa.Schema,
        current_files: Sequence[str],
        key: Sequence[str],
        strategy: str,
        sync_mode: str,
        memory_limit: int,
        spill_dir: Path,
        baseline: bool,
        full: bool | None = None,
        current_filter: str | None = None,
        lake: Any = None,
        digest: dg.Digest | None = None,
        deletes: Mapping[str, Any] | None = None,
        dataset: str = "the dataset",
        same: bool = False,
        values: pa.Schema | None = None,
        events: Callable[[], EventLake] | None = None,
        lake_schema: pa.Schema | None = None,
        gone: Sequence[str] = (),
    ) -> None:
        """``same``: staging showed the capture equal to the committed one (``runtime._fold``).

        ``values``: a snapshot staged unhashed, compared with the lake by the
        values of these payload columns (``capture._values``). ``events``:
        an event stream's (``append``) lake, which it is never compared
        with (``current_files`` is empty): listed only for the values its
        changes left unchanged, filled from each id's newest event.
        ``lake_schema``: the lake's, whose columns the capture lacks (dropped
        at the source) are compared around (``capture._dropped``), as are
        ``gone``: columns its rows hold only from changes read before the
        source dropped them.
        """
        #: The table's digest format (v1 hex, v2 binary); staged digests tell it.
        self.digest: dg.Digest = digest or (
            dg.digest_of(capture_schema) if prov.ID in capture_schema.names else dg.HEX
        )
        self._t = dg.digest_sql_type(self.digest)

        # In memory, spilling to the run's staging past ``memory_limit``: the narrow tables
        # it materialises are evicted to disk when they must be, so a table several times
        # larger than the limit still reduces. ``lake`` (a LakeStore) reads ``current_files``.
        self.memory_limit = memory_limit
        self.capture_schema, self.sync_mode, self.baseline = capture_schema, sync_mode, baseline
        # ``current_filter`` (SQL over the lake's columns): a backfill's range of the current state.
        self._has_keys = False
        # Tables rep and moved_out, and the last truncate's ordinal (DuplicateChecks._stream_order).
        self._has_order, self._cut = False, None
        self._same: bool | None = True if same else None
        self._fingerprinted = None
        self._current_count: int | None = None
        self.transition: Transition | None = None
        self._has_current = bool(current_files)
        # (the fingerprints read a local lake's files without DuckDB: see _fingerprint)
        local = not current_filter and not any("://" in str(f) for f in current_files)
        self._lake_files = list(current_files) if local else None
        self._current_files = list(current_files)
        self.by_values = values if current_files and not current_filter else None
        self.dataset = dataset
        self._modes(key, strategy, full, deletes, dataset)
        #: The lake's source columns the capture lacks: each lake row is compared
        #: over the capture's columns (``_kcmp``), never by its stored hash alone.
        self.dropped = dropped_columns(lake_schema, self.payload, gone) if current_files else []
        self._lake_schema = lake_schema
        self._kcmp = COMPARED if self.dropped else "_khash"
        if self.dropped:
            self._lake_files = self.by_values = None  # (no stored digest stands for a row)
        # A keyless mirror makes tables of its every row's keys and transition,
        # beside the Deliveries' buffers: at the whole limit a 5M-row first
        # capture peaked at 525 MB, at a half at 338 MB (their spills are
        # cheap: bench/RESULTS.md).
        share = CHANGE_STREAM_SHARE if self.has_op else 2 if self.by_content else 1
        self._duck_limit = memory_limit // share
        if not capture_files:
            raise ValueError("a reduction needs at least one staged part (it may be empty)")
        self.capture_files = list(capture_files)
        # A small capture's database is kept for the next reduction (_databases).
        self._keep = (lake is None or not lake.remote) and sum(
            Path(p).stat().st_size for p in capture_files
        ) <= KEEP_STAGED_BYTES
        self._open_lake: Callable[[str], Any] = str if lake is None else lake.open_input
        # The staged parts (Arrow IPC), scanned as one stream of the capture's
        # schema (in types DuckDB scans: a float16 column arrives as float32).
        self._staged = StagedParts(self.capture_files, duckdb_scannable_schema(capture_schema))
        self._opening = (spill_dir, lake, current_files, current_filter)
        self._events = events
        self._con: duckdb.DuckDBPyConnection | None = None
        #: An unchanged capture's empty ``tr`` waits for the database (see _unchanged).
        self._tr_empty = False
        # (a change stream's unchanged values resolve as the views are made)
        self._resolved: Resolved | None = None
        if not same or UNCHANGED in capture_schema.names:
            self._open()
        if self._first_delta():
            # A first delta (a cursor's first read) that holds each id once
            # needs no deduplicating either: it is a first baseline too.
            self.streamed = self.all_new = True

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The reduction's connection: its database opened with its views on first use."""
        return self._con if self._con is not None else self._open()

    def _open(self) -> duckdb.DuckDBPyConnection:
        """Open the database, register the staged parts and make the views over them.

        A capture that staging already found unchanged (``same``) never
        needs them: its database is not opened at all, where its opening,
        views and emptying cost ~10 ms of CPU, most of an unchanged small
        table's reduction.
        """
        spill_dir, lake, current_files, current_filter = self._opening
        self._database = open_database(_duck_mb(self._duck_limit), spill_dir)
        con = self._con = self._database.cursor()
        if lake is not None:
            lake.attach(con)
        op_expr = self._op_sql()
        id_expr = identity_sql(self.key, self.capture_schema, self.digest)
        # (a row of large byte strings hashed in pieces: docs/identity.md, section 4)
        hash_expr = streamed_payload_hash_sql(con, self.payload, self.capture_schema, self.digest)
        # (a registered object is the connection's own: see cursor())
        con.register(_STAGED, self._staged)
        self._capture_views(id_expr, hash_expr, op_expr, current_files)
        self._current_view(current_files, current_filter)
        if self._tr_empty:
            self._empty_transition()
        return con

    def _first_delta(self) -> bool:
        """Whether the capture is a pre-hashed first delta whose ids are distinct."""
        return (
            not self.streamed
            and self.prehashed
            and not self.has_op
            and self.soft is None
            and self.sync_mode == "incremental"
            and not self._has_current
            and not self._may_repeat_ids()
        )

    def _modes(
        self,
        key: Sequence[str],
        strategy: str,
        full: bool | None,
        deletes: Mapping[str, Any] | None,
        dataset: str,
    ) -> None:
        """How the capture reduces: whole or delta, its key, flag, hashes and operations."""
        capture_schema = self.capture_schema
        #: Whether the capture is the whole relation (absent ids are deletes).
        self.full = strategy == "snapshot" if full is None else full
        #: Whether the capture is a change stream's (a stitched snapshot, or changes).
        self._streamed = strategy == "cdc"
        self.payload = [
            f.name
            for f in capture_schema
            if f.name not in prov.CONTROL_COLUMNS and not f.name.startswith("_combined_")
        ]
        self.key = list(key) or self.payload
        self._keyed = bool(key)
        #: A whole capture of a table without a key (``key: []``) that mirrors it:
        #: each row is identified by its content and its number among equal rows.
        self.by_content = not key and self.full and self.sync_mode != "append"
        self.has_op = prov.OP in capture_schema.names
        #: SQL: whether a row's soft-delete flag says deleted (None: no flag declared).
        self.soft = deleted_sql(deletes, capture_schema, dataset) if deletes else None
        #: Whether the staged parts carry each row's id and payload hash already.
        self.prehashed = (
            prov.ID in capture_schema.names
            and prov.PAYLOAD_HASH in capture_schema.names
            and UNCHANGED not in capture_schema.names
        )
        #: A whole, pre-hashed capture without operations (a snapshot): its
        #: duplicates are refused, so no row needs deduplicating, and its
        #: staged (ordinal, id, hash) columns are read as they are, never
        #: materialised as a table of the capture's size.
        self.streamed = (
            self.prehashed
            and not self.has_op
            and self.soft is None
            and self.full
            and self.sync_mode == "incremental"
        )
        #: ... and nothing to compare it with (a first baseline): every row is
        #: new. A first delta whose ids are distinct joins them (below).
        self.all_new = self.streamed and not self._has_current

    #: Whether the transition is being joined from candidates found by value.
    _value_joined = False
    #: Whether DuckDB's memory was cut for a join of every row (``_bound_whole_join``).
    _whole_bound = False

    def _bound_whole_join(self) -> None:
        """Give DuckDB a ``WHOLE_JOIN_SHARE`` of the memory: a snapshot re-capture joins every row.

        A whole, keyed capture without operations or fills against the lake's
        rows: its every statement (hashing into ``keys``, the duplicate
        check's aggregate, the join by id ranges, ``tr``) streams or spills.
        """
        if self._whole_bound or self.has_op or not self.full or not self._has_current:
            return
        if self.by_content or self._resolved is not None:
            return
        self._whole_bound = True
        self._duck_limit = min(self._duck_limit, self.memory_limit // WHOLE_JOIN_SHARE)
        self.con.execute(f"SET memory_limit = '{_duck_mb(self._duck_limit)}MB'")

    def _whole_passes(self) -> int:
        """Passes of a join of every staged row with every current one, at DuckDB's share."""
        rows = max(self._staged.count_rows(), self._current_rows())
        return min(self._join_passes(rows, self._duck_limit), WHOLE_JOIN_PASSES)

    @property
    def whole_staged(self) -> bool:
        """Whether a join's captured rows stand for every staged row, the rest unchanged.

        A streamed snapshot's, or the candidates of one compared by value
        (``by_fingerprints``).
        """
        return self.streamed or self._value_joined

    def _op_sql(self) -> str:
        """SQL: a captured row's operation (``upsert`` where the capture carries none)."""
        op_expr = f"{quote_ident(prov.OP)}" if self.has_op else "'upsert'"
        if self.soft is not None:
            # A flagged row (a CDC update setting the flag included) deletes its key.
            op_expr = (
                f"CASE WHEN {op_expr} <> 'truncate' AND {self.soft} THEN 'delete' "
                f"ELSE {op_expr} END"
            )
        return op_expr

    def _capture_views(
        self, id_expr: str, hash_expr: str, op_expr: str, current_files: Sequence[str]
    ) -> None:
        """Views ``pay`` (the payload as staged) and ``cap`` (with id, hash and operation)."""
        names = self.capture_schema.names
        if UNCHANGED in names:
            self._resolved = resolve_unchanged(
                self.con,
                staged=_STAGED,
                names=names,
                payload=self.payload,
                id_expr=id_expr,
                current_files=current_files,
                open_file=self._open_lake,
                staged_parts=(self.capture_files, self._staged.schema),
                events=self._events,
            )
            if self._resolved.fills:
                mb = _duck_mb(self._duck_limit) + self._resolved.join_mb(FILL_JOIN_MB)
                self.large_values = self._resolved.large()
                if self.large_values:
                    # Each statement over the filled rows holds a row's values whole.
                    mb += VALUE_MEMORY_FACTOR * self._resolved.widest // 2**20
                self.con.execute(f"SET memory_limit = '{mb}MB'")
            self.con.execute("CREATE VIEW pay AS SELECT * FROM res")
            source = "res"
        else:
            # The payload as staged: what the Deliveries read, never re-hashed.
            self.con.execute(f"CREATE VIEW pay AS SELECT * FROM {_STAGED}")
            source = f"(SELECT *, {id_expr} AS _cid FROM pay)"
            if self.prehashed:
                # Staging hashed every row as it streamed by (see runtime._stage).
                source = f"(SELECT *, {prov.ID} AS _cid FROM pay)"
                hash_expr = prov.PAYLOAD_HASH
            elif self.by_content:
                # Equal rows are numbered (which of them is first does not
                # matter: they are equal), so repeats are rows of their own;
                # a content held once is number 1 (``repeats``: the others).
                if prov.PAYLOAD_HASH in names:
                    hash_expr = prov.PAYLOAD_HASH  # (hashed as staging streamed it)
                self._content_hash = hash_expr
                self.con.execute("CREATE TABLE repeats (ord BIGINT, _k BIGINT)")  # (_keys fills it)
                content_id = content_id_sql("p._h", "coalesce(r._k, 1)", self.digest)
                source = (
                    f"(SELECT p.*, {content_id} AS _cid FROM (SELECT *, {hash_expr} AS _h "
                    "FROM pay) p LEFT JOIN repeats r ON p._combined_ordinal = r.ord)"
                )
                hash_expr = "_h"
        self._cap = f"{hash_expr} AS _chash, {op_expr} AS _cop"
        self.con.execute(
            f"CREATE VIEW cap AS SELECT *, {hash_expr} AS _chash, {op_expr} AS _cop "
            f"FROM {source} AS s0"
        )

    def _current_view(self, current_files: Sequence[str], current_filter: str | None) -> None:
        """View ``cur``: the lake's current (id, payload hash) pairs, in a backfill's range."""
        if self.dropped and self._lake_schema is not None:
            select = current_sql(
                files_sql(current_files),
                current_filter,
                lake=self._lake_schema,
                capture=self.capture_schema,
                payload=compared(self.payload, self.dropped),
                dropped=self.dropped,
                digest=self.digest,
            )
            self.con.execute(f"CREATE VIEW cur AS {select}")
        elif current_files:
            self.con.execute(
                "CREATE VIEW cur AS SELECT _combined_id AS _kid, _combined_payload_hash AS _khash "
                f"FROM read_parquet({files_sql(current_files)}, union_by_name = true)"
                + (f" WHERE {current_filter}" if current_filter else "")
            )
        else:
            self.con.execute(
                f"CREATE VIEW cur AS SELECT NULL::{self._t} AS _kid, NULL::{self._t} AS _khash "
                "WHERE false"
            )

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of this reduction's database that sees its views, for another thread."""
        con = self.con.cursor()
        con.register(_STAGED, self._staged)
        return con

    def close(self) -> None:
        """Close the DuckDB connection and its database (and its spill files), if opened."""
        if self._con is not None:
            self._con.close()
            close_database(self._database, self._keep)

    def _keys(self) -> str:
        """The narrow (ordinal, id, hash, op) table: every row hashed exactly once."""
        if not self._has_keys:
            self._bound_whole_join()
            if self.by_content:
                self._number_repeats()
            keys = "SELECT _combined_ordinal AS ord, _cid, _chash, _cop FROM {}"
            resolved = self._resolved
            if resolved is not None and resolved.filled:
                # One staged part at a time: its fills' hash tables hold its own.
                ranges = part_ranges(self.capture_files, resolved.cuts)
                by_part(
                    self.con,
                    "keys",
                    ranges,
                    self._staged.schema,
                    lambda rows, plain, o: keys.format(
                        f"(SELECT *, {self._cap} FROM ({resolved.sql(rows, o, plain)}))"
                    ),
                    whole=keys.format("cap"),
                    roomier=self._roomier,
                )
            else:
                self.con.execute(f"CREATE TABLE keys AS {keys.format('cap')}")
            self._has_keys = True
        return "keys"

    def _roomier(self) -> None:
        """The whole reduction memory, on one thread, for a statement over filled rows.

        Hashing lists holds ~8 times their bytes in DuckDB's vectors: a window
        of filled lists of 25,000 short strings each peaked at 195 MB.
        """
        (held,) = self.con.execute("SELECT current_setting('memory_limit')").fetchall()[0]
        log.warning(
            "%s: its filled rows needed more than DuckDB's %s; hashing them on one "
            "thread with the whole reduction memory (%d MB)",
            self.dataset,
            held,
            self.memory_limit // 2**20,
        )
        self.con.execute(f"SET memory_limit = '{_duck_mb(self.memory_limit)}MB'; SET threads = 1")

    def _number_repeats(self) -> None:
        """Table ``repeats``: the (ordinal, number) of each row whose content repeats.

        Only those rows are numbered in a window: a window over every row,
        sorted again by ordinal for the output, ran out of DuckDB's memory
        at 20M rows and half the reduction memory; an aggregate spills.
        """
        hashed = f"(SELECT _combined_ordinal AS ord, {self._content_hash} AS _h FROM pay)"
        self.con.execute(
            "INSERT INTO repeats SELECT ord, row_number() OVER (PARTITION BY _h ORDER BY ord) "
            f"AS _k FROM {hashed} WHERE _h IN (SELECT _h FROM {hashed} GROUP BY _h "
            "HAVING count(*) > 1)"
        )

    def reduce(self, con: duckdb.DuckDBPyConnection | None = None) -> Transition:
        """Materialise the transition's ids and operations; return its counts.

        A first baseline (``all_new``) only reads the staged columns, and may
        do so on ``con``, a cursor of this reduction's database, from another thread.
        """
        if self.all_new:
            return self._stats_all_new(con)
        if self.same_as_current():
            return self._unchanged()
        if self.streamed or self.by_values is not None:
            found = self.by_fingerprints()
            if found is not None:
                return found
        if self.streamed:
            # A snapshot re-capture: its staged (id, hash) columns meet the
            # lake's as they are (plain columns, nothing computed in the join).
            last = (
                f"SELECT _combined_ordinal AS ord, {prov.ID} AS _cid, "
                f"{prov.PAYLOAD_HASH} AS _chash, 'upsert' AS _cop FROM pay"
            )
            self._bound_whole_join()
            return self._join_current(last, "cur", cut=None, passes=self._whole_passes())
        keys = self._keys()
        lake = self._events() if self._resnapshot() and self._events is not None else None
        if lake is not None and lake.files:
            return self._against_events(lake, keys)
        if self.sync_mode == "append":
            self.con.execute(
                "CREATE TABLE tr AS SELECT _cid AS id, "
                f"CASE WHEN _cop = 'upsert' THEN {self._first_op} "
                f"WHEN {self._moved_onto()} THEN 'insert' ELSE _cop END AS op, "
                f"_chash AS new_hash, NULL::{self._t} AS old_hash, ord FROM {keys}"
            )
            return self._stats()
        return self._reduce_changes(keys)

    def _against_events(self, lake: EventLake, keys: str) -> Transition:
        """An event stream's new snapshot against each id's newest event (``capture._resnapshot``).

        At DuckDB's ``WHOLE_JOIN_SHARE`` on one thread: the lake's events spill
        and are ranked in passes sized by it; its joins spill too (at 64 MB on
        two threads, a 500k-row join ran out of it). The output, of the
        changes alone, runs as before.
        """
        settings = "SELECT current_setting('memory_limit'), current_setting('threads')"
        (held, threads) = self.con.execute(settings).fetchall()[0]
        mb = _duck_mb(min(self._duck_limit, self.memory_limit // WHOLE_JOIN_SHARE))
        self.con.execute(f"SET memory_limit = '{mb}MB'; SET threads = 1")
        try:
            against_events(self.con, lake, keys, self.key, self._t, mb * 2**20)
        finally:  # whatever the comparison raised, the connection gets its settings back
            self.con.execute(f"SET memory_limit = '{held}'; SET threads = {threads}")
        self._gone = tuple(self.key)  # (its deletes' keys: table ``gone``)
        found = self._stats()
        self.transition = replace(found, events=found.changes)
        return self.transition

    def _resnapshot(self) -> bool:
        """Whether the capture is a change stream's new snapshot of a keyed table: the
        whole table (no operations) read into an event stream that holds events
        already (``capture._resnapshot``). A keyless one is appended whole, as
        inserts; so is every capture of a ``snapshot`` dataset in ``append``
        mode, whose table keeps each capture's rows (a periodic snapshot)."""
        full = self.full and not self.has_op
        return full and self._streamed and self._keyed and not self.baseline

    def _moved_onto(self) -> str:
        """SQL: whether a change is a row's move to a new key, kept as an event of its own.

        A change stream sends such a move as the old key's delete and the new
        key's insert, or its update where the move left values unchanged (the
        delete names them: ``capture._unchanged`` fills them from the old
        key). An event stream keeps the new key's insert either way, as a
        merged table applies it.
        """
        if UNCHANGED not in self.capture_schema.names:
            return "false"
        return (
            f"_cop = 'update' AND ord IN (SELECT _combined_ordinal + 1 FROM {_STAGED} "
            f"WHERE {quote_ident(prov.OP)} = 'delete' AND coalesce(len({UNCHANGED}), 0) > 0)"
        )

    def _unchanged(self) -> Transition:
        """No changes: an empty transition table, for whatever reads it next.

        (Made when the database opens, if it is not open yet: most often
        nothing reads it.)
        """
        if self._con is None:
            self._tr_empty = True
        else:
            self._empty_transition()
        rows = self._staged.count_rows()  # (a snapshot's pay is its staged parts)
        self.transition = Transition(unchanged=int(rows), captured=int(rows))
        return self.transition

    def _empty_transition(self) -> None:
        t = self._t
        self.con.execute(
            f"CREATE TABLE tr (id {t}, op VARCHAR, new_hash {t}, old_hash {t}, ord BIGINT)"
        )

    def _reduce_changes(self, keys: str) -> Transition:
        """The transition of keyed changes: each id's last one, against the current rows."""
        con = self.con
        # A truncate in a change stream empties the table at that point: only
        # changes after the last truncate survive, and every other row goes.
        cut, changes, order = None, keys, "ord"
        if self.has_op:
            cut = self._stream_order()
            if con.execute("SELECT 1 FROM moved_out LIMIT 1").fetchall():
                # A delete of a row a key held before a row moved onto it applies
                # first. Its order is a table before the window: the join to
                # moved_out inside it overran DuckDB's share of the default memory
                # (a deferrable key rotated through 300k rows, every delete moved).
                con.execute(
                    "CREATE OR REPLACE TABLE keyseq AS SELECT k.*, coalesce(m.seq, 2 * k.ord) "
                    f"AS seq FROM {keys} k LEFT JOIN moved_out m USING (ord)"
                )
                changes, order = "keyseq", "seq"
        after = "" if cut is None else f" AND ord > {cut}"
        last = f"SELECT _cid, _chash, _cop, ord FROM {changes} WHERE _cop <> 'truncate'{after}"
        if self.has_op or not self.full:
            # Several changes of one row: the last one wins. (A full-row capture
            # was checked for duplicate keys already, and needs no window.)
            last += f" QUALIFY row_number() OVER (PARTITION BY _cid ORDER BY {order} DESC) = 1"
        if not self._has_current:
            # Nothing to compare with: every row is new (a delete of an absent row is moot).
            con.execute(
                "CREATE TABLE tr AS SELECT _cid AS id, CASE WHEN _cop = 'delete' THEN 'same' "
                f"ELSE {self._first_op} END AS op, "
                "CASE WHEN _cop = 'delete' THEN NULL ELSE _chash END AS new_hash, "
                f"NULL::{self._t} AS old_hash, ord FROM ({last})"
            )
            return self._stats()
        # Both sides are plain tables before they meet: computed identities
        # inside a join do not spill well. A delta (a cursor read, a change
        # stream without a truncate) meets only the current rows of its own
        # ids: its LEFT JOIN leaves every other row as it is, so a table of
        # the whole lake's ids (~200 MB at 2M rows) would only be scanned.
        mine = "" if self._whole(cut) else f" WHERE _kid IN (SELECT _cid FROM {keys})"
        kcmp = f", {COMPARED}" if self.dropped else ""
        con.execute(f"CREATE TABLE curk AS SELECT _kid, _khash{kcmp} FROM cur{mine}")
        if self._whole_bound:
            # A snapshot's every row against the lake's, in passes sized by
            # DuckDB's share: ``keys`` is a plain table of them already.
            return self._join_current(last, "curk", cut=cut, passes=self._whole_passes())
        # The last changes are a plain table too, and a change stream's meet the
        # current rows in passes over id ranges sized by its share of the memory:
        # computed by a window inside one join, a 600k-change MariaDB backlog (one
        # 300k-row UPDATE, then 150k key changes) failed for DuckDB's memory in most
        # runs at the default memory; in one join, a 1M-change backlog in half of them.
        con.execute(f"CREATE TABLE lastc AS {last}; DROP TABLE IF EXISTS keyseq")
        passes = None
        if self.has_op:
            (rows,) = con.execute(
                "SELECT greatest((SELECT count(*) FROM lastc), (SELECT count(*) FROM curk))"
            ).fetchall()[0]
            passes = self._join_passes(int(rows), self._duck_limit)
        transition = self._join_current("SELECT * FROM lastc", "curk", cut=cut, passes=passes)
        con.execute("DROP TABLE lastc")
        return transition

    def same_as_current(self) -> bool:
        """Whether a snapshot re-capture holds exactly the current rows: nothing changed.

        Both sides' (id, payload hash) pairs are folded into a fingerprint:
        the row count (first, alone) and a 128-bit set digest of random
        terms, one a pair (:meth:`_folds`). Two different sets of pairs fold
        alike with a chance of ~2^-128, so an unchanged capture (the common
        case of a repeated snapshot) needs neither the join nor the
        duplicate check: the current rows hold each id once, and so does a
        capture equal to them. A capture with any change, a repeated row
        included, folds to another fingerprint and takes the join. The
        folds are compared within this reduction only, never stored.
        """
        if self._same is None:
            self._same = False
            if self.by_content:
                self._same = self._same_content()
            elif self.streamed and not self.all_new:
                # Row counts first (the files' metadata): a capture that
                # inserts or deletes rows is not folded at all.
                captured = self._staged.count_rows()
                if captured == self._current_rows():
                    mine, theirs = self._folds()
                    self._same = mine == theirs and mine[0] == captured
        return self._same

    def _same_content(self) -> bool:
        """Whether a keyless capture holds the current rows' contents, repeats alike.

        Its ids follow from the multiset of its payload hashes (section 9 of
        docs/identity.md): equal multisets, equal ids. Each side is folded to
        its count and two sums of 64-bit hashes of each hash: sums, not the
        xor of the keyed fold, so a repeat does not cancel its twin.
        """
        if not self._has_current or prov.PAYLOAD_HASH not in self.capture_schema.names:
            return False
        captured = self._staged.count_rows()
        if captured != self._current_rows():
            return False
        folds = "SELECT count({h}), sum(hash({h})), sum(hash({h} || {h})) FROM {rows}"
        mine = self.con.execute(folds.format(h=prov.PAYLOAD_HASH, rows="pay")).fetchall()[0]
        theirs = self.con.execute(folds.format(h="_khash", rows="cur")).fetchall()[0]
        return bool(mine == theirs and mine[0] == captured)

    def _folds(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Both sides' (pairs, fold, fold): the staged rows' and the lake's.

        v2 digests are folded from their 64-bit words (``pair_folds``), the
        staged ones read from the parts' two columns alone: DuckDB's
        ``hash(id || hash)`` and ``hash(hash || id)`` over every row of
        both sides cost about twice as much (0.13 against 0.06 CPU-s a
        million rows, most of it now reading the lake's digests). Elsewhere
        (v1, a null or odd-sized digest), DuckDB folds, counting the pairs
        with a NULL side apart (it hashes NULL to a constant, and two such
        rows would cancel out).
        """
        if (
            not self.dropped
            and self.digest == dg.BINARY
            and parts_carry(self._staged.paths, (prov.ID, prov.PAYLOAD_HASH))
        ):
            mine = pair_folds(
                (b.column(prov.ID), b.column(prov.PAYLOAD_HASH))
                for p in self._staged.paths
                for b in read_part(p)
            )
            try:
                theirs = pair_folds((b.column(0), b.column(1)) for b in self._lake_digests())
            except (pa.ArrowInvalid, KeyError):
                theirs = None  # (a lake file without the digest columns)
            if mine is not None and theirs is not None:
                return mine, theirs
        folds = (
            "SELECT count({i} || {h}), bit_xor(hash({i} || {h})), "
            "bit_xor(hash({h} || {i})) FROM {rows}"
        )
        mine = self.con.execute(
            folds.format(i=prov.ID, h=prov.PAYLOAD_HASH, rows="pay")
        ).fetchall()[0]
        theirs = self.con.execute(folds.format(i="_kid", h=self._kcmp, rows="cur")).fetchall()[0]
        return mine, theirs

    @property
    def _first_op(self) -> str:
        """The SQL literal of a first-seen row's operation."""
        return "'snapshot'" if self.baseline else "'insert'"
