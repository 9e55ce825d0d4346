"""A reduction's join of the captured rows with the current state: the transition table ``tr``.

A mixin of :class:`~combined.capture._reduce.Reducer`: the join reads the
reduction's views and tables (``cur``, ``keys``, the staged parts) through
its connection, in passes over ranges of ids when the ids are many.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from combined.capture._databases import lit
from combined.capture._dropped import unchanged_sql
from combined.protocol import _digest as dg

if TYPE_CHECKING:
    import duckdb

    from combined.capture._transition import Transition
    from combined.delivery import StagedParts

#: Reduction memory per row of a snapshot re-capture's join pass (a pass
#: builds ~130 bytes per id; the rest is DuckDB's working room). At the
#: default 256 MiB, 2M ids take six passes: four held ~17 MB more at the
#: peak of the benchmark's 1%-changed re-capture (its reduce phase took
#: ~0.4 s less), over the 400 MB the process must stay under.
JOIN_BYTES_PER_ROW = 768
MAX_JOIN_PASSES = 6


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


class _Reduction(Protocol):
    """What the join reads and writes of a reduction."""

    @property
    def con(self) -> duckdb.DuckDBPyConnection: ...

    full: bool
    has_op: bool
    streamed: bool

    @property
    def whole_staged(self) -> bool: ...

    memory_limit: int
    digest: dg.Digest
    _staged: StagedParts
    _current_count: int | None
    #: The current rows' column a captured payload hash is compared with (``capture._dropped``).
    _kcmp: str

    @property
    def _first_op(self) -> str: ...

    def _current_rows(self) -> int: ...

    def _whole(self, cut: int | None) -> bool: ...

    def _join_passes(self, rows: int, memory: int | None = None) -> int: ...

    def _stats(self, unchanged: int | None = None) -> Transition: ...


class Join:
    """The transition of captured rows against the current ones (a reduction's mixin)."""

    #: The lake's current rows (None: not counted yet).
    _current_count: int | None = None

    def _current_rows(self: _Reduction) -> int:
        """The lake's current rows (``cur``), counted once (from the files' metadata)."""
        rows = self._current_count
        if rows is None:
            (counted,) = self.con.execute("SELECT count(*) FROM cur").fetchall()[0]
            rows = self._current_count = int(counted)
        return rows

    def _whole(self: _Reduction, cut: int | None) -> bool:
        """Whether absent ids are deletes: the capture is the whole relation (a
        snapshot, or a stream that truncated it); a delta leaves them alone."""
        return self.full or cut is not None

    def _join_passes(self: _Reduction, rows: int, memory: int | None = None) -> int:
        """Passes of a snapshot re-capture's join: each builds its share of the ids.

        A hash join over 2M hex ids and hashes holds ~270 MB; in four passes
        over id ranges, ~160 MB for the same time (scanning the narrow columns
        again costs what the smaller tables save); in six, ~17 MB less again
        for ~0.2 s a pass. Sized by the reduction's memory, at most
        ``MAX_JOIN_PASSES`` (past that, DuckDB's own spilling is cheaper than
        scanning again).
        """
        per_pass = max((memory or self.memory_limit) // JOIN_BYTES_PER_ROW, 1)
        return max(1, min(MAX_JOIN_PASSES, -(-rows // per_pass)))

    def _join_current(
        self: _Reduction, last: str, current: str, cut: int | None, passes: int | None = None
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
        if self.whole_staged:
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
            passes = passes or 1
        select = (
            "SELECT * FROM (SELECT coalesce(c._cid, k._kid) AS id, CASE "
            "WHEN c._cid IS NULL THEN 'delete' "
            "WHEN c._cop = 'delete' THEN (CASE WHEN k._kid IS NULL THEN 'same' "
            "ELSE 'delete' END) "
            f"WHEN k._kid IS NULL THEN {self._first_op} "
            f"WHEN {unchanged_sql('c._chash', 'k.', self._kcmp)} THEN 'same' "
            "ELSE 'update' END AS op, "
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
