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

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from combined.capture._duplicates import DuplicateChecks
from combined.capture._fingerprint import Fingerprints
from combined.capture._output import (
    OUTPUT_BATCH_ROWS,
    Delivered,
    PartRange,
    _Constants,
    by_part,
    constant_columns,
    in_order,
    part_ranges,
    part_rows,
    staged_rows,
)
from combined.capture._soft import deleted_sql
from combined.capture._transition import (
    DIGEST_CLASSES,
    Transition,
    _halves,
    transition_digest,
)
from combined.capture._unchanged import (
    UNCHANGED,
    VALUE_MEMORY_FACTOR,
    Resolved,
    files_sql,
    lit,
    resolve_unchanged,
)
from combined.delivery import StagedParts
from combined.protocol import _digest as dg
from combined.protocol import _provenance as prov
from combined.protocol.identity import (
    duckdb_scannable_schema,
    identity_sql,
    payload_hash_sql,
    quote_ident,
)

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "DIGEST_CLASSES",
    "OUTPUT_BATCH_ROWS",
    "UNCHANGED",
    "Reducer",
    "Transition",
    "transition_digest",
]

#: The name the staged parts are registered under in a reduction's connection.
_STAGED = "staged_capture"


#: Reduction memory per row of a snapshot re-capture's join pass (a pass
#: builds ~130 bytes per id; the rest is DuckDB's working room). At the
#: default 256 MiB, 2M ids take six passes: four held ~17 MB more at the
#: peak of the benchmark's 1%-changed re-capture (its reduce phase took
#: ~0.4 s less), over the 400 MB the process must stay under.
JOIN_BYTES_PER_ROW = 768
MAX_JOIN_PASSES = 6

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
#: DuckDB memory each column's fills add to a change stream's reduction, in
#: MB: every statement over the filled rows joins each such column's fills,
#: and a hash join holds its partitions however few rows it builds on (~2 MB
#: for a scalar column, ~6 MB for a list): 40 rows filled in 14 columns
#: failed at 64 MB, 50 rows in 24 list columns at 128 MB.
FILL_JOIN_MB = 8


def _duck_mb(nbytes: int) -> int:
    """A DuckDB memory limit in MB for ``nbytes``, at least ``MIN_DUCK_MB``."""
    return max(nbytes // 2**20, MIN_DUCK_MB)


def _id_ranges(passes: int, digest: dg.Digest = dg.HEX) -> list[tuple[str | None, str | None]]:
    """``passes`` contiguous ranges (SQL literals) that together cover every digest once.

    The bounds split the first hex digit (v1) or byte (v2) evenly, so
    digests spread evenly.
    """
    if digest == dg.HEX:
        bounds = [lit(format(i * 16 // passes, "x")) for i in range(1, passes)]
    else:
        bounds = [f"'\\x{i * 256 // passes:02x}'::BLOB" for i in range(1, passes)]
    edges: list[str | None] = [None, *bounds, None]
    return list(zip(edges, edges[1:], strict=False))


def _in_range(column: str, low: str | None, high: str | None) -> str:
    """SQL: ``column`` lies in [low, high) (SQL literals; an open end when None)."""
    terms = [
        f"{column} >= {low}" if low is not None else "",
        f"{column} < {high}" if high is not None else "",
    ]
    return " AND ".join(t for t in terms if t) or "true"


def _connect(memory_limit: int, spill_dir: Path) -> duckdb.DuckDBPyConnection:
    """A reduction's connection: in memory, spilling to ``spill_dir`` past ``memory_limit``."""
    import duckdb

    return duckdb.connect(
        ":memory:",
        config={
            "memory_limit": f"{_duck_mb(memory_limit)}MB",
            "temp_directory": str(spill_dir),
            "threads": 2,
            "preserve_insertion_order": False,
            # Every join here builds its hash table on the side written on
            # its right, chosen for its size: DuckDB knows no row count for
            # the staged parts' stream (it takes it for one row), and would
            # build on the whole capture instead.
            "disabled_optimizers": "build_side_probe_side",
            "allocator_flush_threshold": "32MB",
        },
    )


class Reducer(DuplicateChecks, Fingerprints):
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
    ) -> None:
        #: The table's digest format (v1 hex, v2 binary); staged digests tell it.
        self.digest: dg.Digest = digest or (
            dg.digest_of(capture_schema) if prov.ID in capture_schema.names else dg.HEX
        )
        self._t = dg.digest_sql_type(self.digest)

        # In memory, spilling to the run's staging past ``memory_limit``: the narrow tables
        # it materialises are evicted to disk when they must be, so a table several times
        # larger than the limit still reduces. ``lake`` (a LakeStore) reads ``current_files``.
        self.memory_limit = memory_limit
        share = CHANGE_STREAM_SHARE if prov.OP in capture_schema.names else 1
        self._duck_limit = memory_limit // share
        self.con = _connect(self._duck_limit, spill_dir)
        if lake is not None:
            lake.attach(self.con)
        self.capture_schema, self.sync_mode, self.baseline = capture_schema, sync_mode, baseline
        # ``current_filter`` (SQL over the lake's columns): a backfill's range of the current state.
        self._has_keys = False
        self._same: bool | None = None
        self._fingerprinted = None
        self._current_count: int | None = None
        self.transition: Transition | None = None
        self._has_current = bool(current_files)
        # (the fingerprints read a local lake's files without DuckDB: see _fingerprint)
        local = not current_filter and not any("://" in str(f) for f in current_files)
        self._lake_files = list(current_files) if local else None
        self._modes(key, strategy, full, deletes, dataset)
        op_expr = self._op_sql()
        id_expr = identity_sql(self.key, capture_schema, self.digest)
        hash_expr = payload_hash_sql(self.payload, capture_schema, self.digest)
        if not capture_files:
            raise ValueError("a reduction needs at least one staged part (it may be empty)")
        self.capture_files = list(capture_files)
        # The staged parts (Arrow IPC), scanned as one stream of the capture's
        # schema (in types DuckDB scans: a float16 column arrives as float32):
        # a registered object is the connection's own (see cursor()).
        self._staged = StagedParts(self.capture_files, duckdb_scannable_schema(capture_schema))
        self.con.register(_STAGED, self._staged)
        self._capture_views(id_expr, hash_expr, op_expr, current_files)
        self._current_view(current_files, current_filter)
        if self._first_delta():
            # A first delta (a cursor's first read) that holds each id once
            # needs no deduplicating either: it is a first baseline too.
            self.streamed = self.all_new = True

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
        self.payload = [
            f.name
            for f in capture_schema
            if f.name not in prov.CONTROL_COLUMNS and not f.name.startswith("_combined_")
        ]
        self.key = list(key) or self.payload
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
        self._resolved: Resolved | None = None
        if UNCHANGED in names:
            self._resolved = resolve_unchanged(
                self.con,
                staged=_STAGED,
                names=names,
                payload=self.payload,
                id_expr=id_expr,
                current_files=current_files,
            )
            if self._resolved.fills:
                mb = _duck_mb(self._duck_limit) + FILL_JOIN_MB * len(self._resolved.fills)
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
        self._cap = f"{hash_expr} AS _chash, {op_expr} AS _cop"
        self.con.execute(
            f"CREATE VIEW cap AS SELECT *, {hash_expr} AS _chash, {op_expr} AS _cop "
            f"FROM {source} AS s0"
        )

    def _current_view(self, current_files: Sequence[str], current_filter: str | None) -> None:
        """View ``cur``: the lake's current (id, payload hash) pairs, in a backfill's range."""
        if current_files:
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
        """Close the DuckDB connection (and its spill files)."""
        self.con.close()

    def _keys(self) -> str:
        """The narrow (ordinal, id, hash, op) table: every row hashed exactly once."""
        if not self._has_keys:
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
                    lambda rows, o: keys.format(
                        f"(SELECT *, {self._cap} FROM ({resolved.sql(rows, o)}))"
                    ),
                    whole=keys.format("cap"),
                )
            else:
                self.con.execute(f"CREATE TABLE keys AS {keys.format('cap')}")
            self._has_keys = True
        return "keys"

    def reduce(self, con: duckdb.DuckDBPyConnection | None = None) -> Transition:
        """Materialise the transition's ids and operations; return its counts.

        A first baseline (``all_new``) only reads the staged columns, and may
        do so on ``con``, a cursor of this reduction's database, from another thread.
        """
        if self.all_new:
            return self._stats_all_new(con)
        if self.same_as_current():
            return self._unchanged()
        if self.streamed:
            found = self.by_fingerprints()
            if found is not None:
                return found
            # A snapshot re-capture: its staged (id, hash) columns meet the
            # lake's as they are (plain columns, nothing computed in the join).
            last = (
                f"SELECT _combined_ordinal AS ord, {prov.ID} AS _cid, "
                f"{prov.PAYLOAD_HASH} AS _chash, 'upsert' AS _cop FROM pay"
            )
            return self._join_current(last, "cur", cut=None)
        keys = self._keys()
        if self.sync_mode == "append":
            self.con.execute(
                "CREATE TABLE tr AS SELECT _cid AS id, "
                f"CASE WHEN _cop = 'upsert' THEN {self._first_op} ELSE _cop END AS op, "
                f"_chash AS new_hash, NULL::{self._t} AS old_hash, ord FROM {keys}"
            )
            return self._stats()
        return self._reduce_changes(keys)

    def _unchanged(self) -> Transition:
        """No changes: an empty transition table, for whatever reads it next."""
        t = self._t
        self.con.execute(
            f"CREATE TABLE tr (id {t}, op VARCHAR, new_hash {t}, old_hash {t}, ord BIGINT)"
        )
        rows = self._staged.count_rows()  # (a snapshot's pay is its staged parts)
        self.transition = Transition(unchanged=int(rows), captured=int(rows))
        return self.transition

    def _reduce_changes(self, keys: str) -> Transition:
        """The transition of keyed changes: each id's last one, against the current rows."""
        con = self.con
        # A truncate in a change stream empties the table at that point: only
        # changes after the last truncate survive, and every other row goes.
        cut = None
        if self.has_op:
            cut = con.execute(f"SELECT max(ord) FROM {keys} WHERE _cop = 'truncate'").fetchall()[0][
                0
            ]
        after = "" if cut is None else f"AND ord > {int(cut)}"
        last = f"SELECT _cid, _chash, _cop, ord FROM {keys} WHERE _cop <> 'truncate' {after}"
        if self.has_op or not self.full:
            # Several changes of one row: the last one wins. (A full-row capture
            # was checked for duplicate keys already, and needs no window.)
            last += " QUALIFY row_number() OVER (PARTITION BY _cid ORDER BY ord DESC) = 1"
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
        con.execute(f"CREATE TABLE curk AS SELECT _kid, _khash FROM cur{mine}")
        return self._join_current(last, "curk", cut=cut)

    def same_as_current(self) -> bool:
        """Whether a snapshot re-capture holds exactly the current rows: nothing changed.

        Both sides' (id, payload hash) pairs are folded into a fingerprint:
        the row count (first, alone) and the xor of two 64-bit hashes of
        each pair (of ``id || hash`` and of ``hash || id``), a 128-bit set
        digest of random terms. Two different sets of pairs fold alike with a
        chance of ~2^-128, so an unchanged capture (the common case of a
        repeated snapshot) needs neither the join nor the duplicate check:
        the current rows hold each id once, and so does a capture equal to
        them. A capture with any change, a repeated row included, folds to
        another fingerprint and takes the join. The hashes are DuckDB's,
        compared within this connection only, never stored.
        """
        if self._same is None:
            self._same = False
            if self.streamed and not self.all_new:
                # Row counts first (the files' metadata): a capture that
                # inserts or deletes rows is not folded at all.
                captured = self._staged.count_rows()
                if captured == self._current_rows():
                    # (Pairs with a NULL side are counted apart: DuckDB hashes
                    # NULL to a constant, and two such rows would cancel out.)
                    folds = (
                        "SELECT count({i} || {h}), bit_xor(hash({i} || {h})), "
                        "bit_xor(hash({h} || {i})) FROM {rows}"
                    )
                    mine = self.con.execute(
                        folds.format(i=prov.ID, h=prov.PAYLOAD_HASH, rows="pay")
                    ).fetchall()[0]
                    theirs = self.con.execute(
                        folds.format(i="_kid", h="_khash", rows="cur")
                    ).fetchall()[0]
                    self._same = mine == theirs and mine[0] == captured
        return self._same

    def _current_rows(self) -> int:
        """The lake's current rows (``cur``), counted once (from the files' metadata)."""
        if self._current_count is None:
            (rows,) = self.con.execute("SELECT count(*) FROM cur").fetchall()[0]
            self._current_count = int(rows)
        return self._current_count

    def _whole(self, cut: int | None) -> bool:
        """Whether absent ids are deletes: the capture is the whole relation (a
        snapshot, or a stream that truncated it); a delta leaves them alone."""
        return self.full or cut is not None

    def _join_passes(self, rows: int) -> int:
        """Passes of a snapshot re-capture's join: each builds its share of the ids.

        A hash join over 2M hex ids and hashes holds ~270 MB; in four passes
        over id ranges, ~160 MB for the same time (scanning the narrow columns
        again costs what the smaller tables save); in six, ~17 MB less again
        for ~0.2 s a pass. Sized by the reduction's memory, at most
        ``MAX_JOIN_PASSES`` (past that, DuckDB's own spilling is cheaper than
        scanning again).
        """
        per_pass = max(self.memory_limit // JOIN_BYTES_PER_ROW, 1)
        return max(1, min(MAX_JOIN_PASSES, -(-rows // per_pass)))

    def _join_current(
        self, last: str, current: str, cut: int | None, passes: int | None = None
    ) -> Transition:
        """The transition of the captured rows ``last`` against the current state.

        A snapshot re-capture that streams its staged columns joins in
        passes, one per range of ids (lexical ranges of the hex digests:
        together they cover every id exactly once).
        """
        con = self.con
        join = "FULL OUTER JOIN" if self._whole(cut) else "LEFT JOIN"
        # A snapshot re-capture keeps only its changes: it is mostly unchanged
        # rows, which materialised would only be counted (and spilled). A
        # change stream's rows are mostly changes: counting its deduplicated
        # rows again would cost more than keeping them.
        only_changes = self.full and not self.has_op
        # Captured rows: a snapshot's are counted once, for its passes and
        # for its unchanged rows (every one is a change in tr or unchanged).
        if self.streamed:
            # ``last`` is every staged row and ``current`` is ``cur``: both
            # were counted already (see same_as_current). The hash table holds
            # the current side (written on the right): the passes are sized
            # by the larger side, so a capture much smaller than the lake
            # still builds the lake's ids in parts.
            kept = self._staged.count_rows()
            passes = passes or self._join_passes(max(kept, self._current_rows()))
        else:
            kept = (
                con.execute(f"SELECT count(*) FROM ({last})").fetchall()[0][0]
                if only_changes
                else 0
            )
            passes = 1
        select = (
            "SELECT * FROM (SELECT coalesce(c._cid, k._kid) AS id, CASE "
            "WHEN c._cid IS NULL THEN 'delete' "
            "WHEN c._cop = 'delete' THEN (CASE WHEN k._kid IS NULL THEN 'same' "
            "ELSE 'delete' END) "
            f"WHEN k._kid IS NULL THEN {self._first_op} "
            "WHEN c._chash = k._khash THEN 'same' ELSE 'update' END AS op, "
            "CASE WHEN c._cid IS NULL OR c._cop = 'delete' THEN NULL ELSE c._chash END "
            "AS new_hash, k._khash AS old_hash, c.ord "
            "FROM ({last}) c {join} {current} k ON c._cid = k._kid)"
            + (" WHERE op <> 'same'" if only_changes else "")
        )
        ranges = _id_ranges(passes, self.digest)
        for n, (low, high) in enumerate(ranges):
            if len(ranges) == 1:
                sides = {"last": last, "current": current}
            else:
                sides = {
                    "last": f"SELECT * FROM ({last}) WHERE {_in_range('_cid', low, high)}",
                    "current": f"(SELECT * FROM {current} WHERE {_in_range('_kid', low, high)})",
                }
            query = select.format(join=join, **sides)
            con.execute(f"CREATE TABLE tr AS {query}" if n == 0 else f"INSERT INTO tr {query}")
        if not only_changes:
            return self._stats()
        (changed,) = con.execute("SELECT count(*) FROM tr WHERE ord IS NOT NULL").fetchall()[0]
        return self._stats(unchanged=int(kept) - int(changed))

    def _stats(self, unchanged: int | None = None) -> Transition:
        # Per row, md5 terms folded by xor (bit_xor over 128-bit values, equal
        # to md5_number_lower/_upper): ``n`` of each put's (id, new hash), ``o``
        # of each replaced or deleted row's (id, old hash): the content digest
        # moves by both. The transition digest reuses ``n`` (see
        # :func:`transition_digest`): only a delete needs a term of its own.
        ordinal = "'|' || ord::VARCHAR" if self.sync_mode == "append" else "''"
        d, empty = self.digest, dg.empty_sql(self.digest)
        gone = dg.pair_term_sql(
            f"coalesce(id, {empty})", f"coalesce(new_hash, {empty})", d, ordinal
        )
        folds = ", ".join(
            f"bit_xor({'x' if op in ('delete', 'truncate') else 'n'}) FILTER (WHERE op = '{op}')"
            for op in DIGEST_CLASSES
        )
        row = self.con.execute(
            "WITH d AS (SELECT op, "
            "CASE WHEN op IN ('update', 'delete') THEN "
            f"{dg.pair_term_sql('id', 'old_hash', d)} ELSE 0::UHUGEINT END AS o, "
            "CASE WHEN op IN ('insert', 'snapshot', 'update') THEN "
            f"{dg.pair_term_sql('id', 'new_hash', d, ordinal)} ELSE 0::UHUGEINT END AS n, "
            "CASE WHEN op IN ('delete', 'truncate') THEN "
            f"{gone} END AS x "
            "FROM tr) SELECT "
            "count(*) FILTER (WHERE op IN ('insert', 'snapshot')), "
            "count(*) FILTER (WHERE op = 'update'), "
            "count(*) FILTER (WHERE op = 'delete'), "
            "count(*) FILTER (WHERE op = 'same'), "
            f"xor(bit_xor(o), bit_xor(n)), {folds} FROM d"
        ).fetchall()[0]
        captured = (
            self._staged.count_rows()
            if self.streamed
            else self.con.execute(f"SELECT count(*) FROM {self._keys()}").fetchall()[0][0]
        )
        self.transition = Transition(
            inserts=int(row[0]),
            updates=int(row[1]),
            deletes=int(row[2]),
            unchanged=int(row[3]) if unchanged is None else unchanged,
            captured=int(captured),
            digest=transition_digest(dict(zip(DIGEST_CLASSES, row[5:], strict=True))),
            content_xor=_halves(int(row[4] or 0)),
        )
        return self.transition

    def flagged(self, sum_column: str | None = None) -> tuple[int, Any]:
        """The staged rows the soft-delete flag marks, and their sum of ``sum_column``.

        A whole capture's source counts less these are the live rows it
        read: what the lake, which holds no flagged row, is reconciled with.
        """
        if self.soft is None:
            return 0, None
        column = quote_ident(sum_column) if sum_column else "NULL"
        rows, total = self.con.execute(
            f"SELECT count(*), sum({column}) FROM pay WHERE {self.soft}"
        ).fetchall()[0]
        return int(rows), total

    def counts_all_new(self) -> Transition:
        """A first baseline's counts, from the staged parts' batch headers (no digests yet)."""
        rows = self._staged.count_rows()
        return Transition(inserts=int(rows), captured=int(rows))

    def _stats_all_new(self, con: duckdb.DuckDBPyConnection | None = None) -> Transition:
        # The terms _stats computes from tr, over the staged (id, hash) columns
        # in one streaming pass: each row is a put of a first-seen id, so one
        # md5 per row gives both digests. ``con`` may be a cursor of this
        # reduction's database, used from another thread.
        i, h = prov.ID, prov.PAYLOAD_HASH
        sql = f"SELECT count(*), bit_xor({dg.pair_term_sql(i, h, self.digest)}) FROM pay"
        rows, n = (con or self.con).execute(sql).fetchall()[0]
        self.transition = Transition(
            inserts=int(rows),
            captured=int(rows),
            digest=transition_digest({self._first_op.strip("'"): n}),
            content_xor=_halves(int(n or 0)),
        )
        return self.transition

    def full_content_xor(self) -> tuple[int, int]:
        """The content digest of the whole capture (full refresh)."""
        (value,) = self.con.execute(
            f"SELECT bit_xor({dg.pair_term_sql('_cid', '_chash', self.digest)}) FROM {self._keys()}"
        ).fetchall()[0]
        return _halves(int(value or 0))

    @property
    def _first_op(self) -> str:
        """The SQL literal of a first-seen row's operation."""
        return "'snapshot'" if self.baseline else "'insert'"

    def _every_row_new(self) -> bool:
        """Whether the transition inserts every staged row, once each."""
        if self.all_new:
            return True
        if not self.prehashed or self.has_op or self.sync_mode != "incremental":
            return False
        if self.soft is not None:
            return False
        t = self.transition
        return t is not None and t.inserts == t.captured and not (t.updates or t.deletes)

    def release(self) -> None:
        """Drop the tables the output does not read, before it allocates its own.

        A first baseline streams its staged rows and reads neither ``tr`` nor
        ``keys``; any other output joins ``tr`` with the staged rows, and only
        a full refresh reads ``keys`` again (its output and content digest).
        The lake's rows a delta met (``curk``) are read by nothing after the join.
        """
        every_row_new = self._every_row_new()
        if every_row_new:
            self.con.execute("DROP TABLE IF EXISTS tr")
        if every_row_new or self.sync_mode != "full_refresh":
            self.con.execute("DROP TABLE IF EXISTS keys")
            self._has_keys = False
        self.con.execute("DROP TABLE IF EXISTS curk")

    def changes(self, batch_rows: int = 65_536) -> pa.RecordBatchReader:
        """(id, op) of every change, streamed: the identities MAR counts.

        Written out where the Deliveries hold more than the changes (a full
        refresh delivers its unchanged rows too); elsewhere MAR reads them there.
        """
        sql = (
            f"SELECT {prov.ID} AS _combined_id, 'insert' AS op FROM pay"
            if self.all_new
            else "SELECT id AS _combined_id, CASE WHEN op = 'snapshot' THEN 'insert' ELSE op END "
            "AS op FROM tr WHERE op <> 'same'"
        )
        reader: pa.RecordBatchReader = self.con.sql(sql).to_arrow_reader(batch_rows)
        return reader

    def constants(self, constants: dict[str, Any]) -> dict[str, pa.Scalar]:
        """The columns :meth:`output` gives one value in every row, with that value."""
        _, scalars = constant_columns(self.capture_schema, constants)
        if self.all_new:
            return {prov.OP: pa.scalar(self._first_op.strip("'"), pa.string()), **scalars}
        return scalars

    def output(
        self, constants: dict[str, Any], batch_rows: int = OUTPUT_BATCH_ROWS
    ) -> Iterator[pa.RecordBatch]:
        """Stream the rows to deliver: source columns plus provenance."""
        provenance, scalars = constant_columns(self.capture_schema, constants)
        if self.all_new:
            # A first baseline delivers its staged parts as they are: read
            # straight into Arrow (DuckDB would convert every value, strings
            # included, and read ahead of the writers).
            yield from staged_rows(
                self.capture_files, self.payload, self._first_op.strip("'"), scalars, batch_rows
            )
            return
        fixed_columns = _Constants(scalars, batch_rows)
        cuts = self._resolved.cuts if self._resolved is not None else ()
        ranges = [] if self._every_row_new() else part_ranges(self.capture_files, cuts)
        ordered = self.sync_mode == "append"
        if ranges and (in_order(ranges) or not ordered):
            if self._resolved is not None and (mb := self._resolved.output_mb(FILL_JOIN_MB)):
                self.con.execute(f"SET memory_limit = '{mb}MB'")  # part by part: less
            yield from self._ranged_output(ranges, provenance, fixed_columns, batch_rows)
            return
        sql = self._output_sql(provenance)
        reader: pa.RecordBatchReader = self.con.sql(sql).to_arrow_reader(batch_rows)
        for batch in reader:
            yield fixed_columns.add(batch)

    def _ranged_output(
        self, ranges: list[PartRange], provenance: str, fixed: _Constants, batch_rows: int
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`output` of a transition or a full refresh, one staged part at a time."""
        refresh = self.sync_mode == "full_refresh"
        yield from part_rows(
            self.con,
            ranges,
            self._staged.schema,
            Delivered(
                payload=self.payload,
                provenance=provenance,
                resolved=self._resolved,
                keys=self._keys() if refresh else None,
                staged=_STAGED,
            ),
            ordered=self.sync_mode == "append",
            fixed=fixed,
            batch_rows=batch_rows,
        )

    def _output_sql(self, provenance: str = "") -> str:
        """The query of the rows to deliver when the staged rows do not stream as they are.

        Its join builds on the transition (or the keys), never on the staged
        parts (see the connection's ``disabled_optimizers``).
        """
        cols = ", ".join(f"c.{quote_ident(n)}" for n in self.payload)
        if self._every_row_new():
            # Every staged row is an insert (a first baseline): no join, the
            # staged parts stream straight to the Deliveries.
            sql = (
                f"SELECT {cols}, c._cid AS {prov.ID}, {self._first_op} AS {prov.OP}, "
                f"c._chash AS {prov.PAYLOAD_HASH}{provenance} FROM cap c"
            )
        elif self.sync_mode == "full_refresh":
            sql = (
                f"SELECT {cols}, k._cid AS {prov.ID}, 'snapshot' AS {prov.OP}, "
                f"k._chash AS {prov.PAYLOAD_HASH}{provenance} "
                f"FROM pay c JOIN {self._keys()} k ON c._combined_ordinal = k.ord"
            )
        else:
            sql = (
                f"SELECT {cols}, tr.id AS {prov.ID}, tr.op AS {prov.OP}, "
                f"tr.new_hash AS {prov.PAYLOAD_HASH}{provenance} "
                "FROM pay c RIGHT JOIN tr ON c._combined_ordinal = tr.ord "
                "WHERE tr.op <> 'same'"
            )
            if self.sync_mode == "append":
                sql += " ORDER BY tr.ord"  # an event stream keeps source order
        return sql
