"""A reduction's counts and digest terms: the transition's, a first baseline's, a full refresh's.

A mixin of :class:`~combined.capture._reduce.Reducer`: per row, md5 terms
of (id, payload hash) folded by xor, computed in the reduction's DuckDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from combined.capture._transition import DIGEST_CLASSES, Transition, _halves, transition_digest
from combined.protocol import _digest as dg
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import duckdb

    from combined.delivery import StagedParts


class _Reduction(Protocol):
    """What the counts and digests read and write of a reduction."""

    @property
    def con(self) -> duckdb.DuckDBPyConnection: ...

    sync_mode: str
    digest: dg.Digest
    streamed: bool

    @property
    def whole_staged(self) -> bool: ...

    soft: str | None
    transition: Transition | None
    _staged: StagedParts

    @property
    def _first_op(self) -> str: ...

    def _keys(self) -> str: ...


class Stats:
    """A reduction's counts and digest terms (a reduction's mixin)."""

    #: The transition's counts and digests (None: not reduced yet).
    transition: Transition | None = None

    def _stats(self: _Reduction, unchanged: int | None = None) -> Transition:
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
            if self.whole_staged
            else self.con.execute(f"SELECT count(*) FROM {self._keys()}").fetchall()[0][0]
        )
        found = self.transition = Transition(
            inserts=int(row[0]),
            updates=int(row[1]),
            deletes=int(row[2]),
            unchanged=int(row[3]) if unchanged is None else unchanged,
            captured=int(captured),
            digest=transition_digest(dict(zip(DIGEST_CLASSES, row[5:], strict=True))),
            content_xor=_halves(int(row[4] or 0)),
        )
        return found

    def flagged(self: _Reduction, sum_column: str | None = None) -> tuple[int, Any]:
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

    def counts_all_new(self: _Reduction) -> Transition:
        """A first baseline's counts, from the staged parts' batch headers (no digests yet)."""
        rows = self._staged.count_rows()
        return Transition(inserts=int(rows), captured=int(rows))

    def _stats_all_new(
        self: _Reduction, con: duckdb.DuckDBPyConnection | None = None
    ) -> Transition:
        # The terms _stats computes from tr, over the staged (id, hash) columns
        # in one streaming pass: each row is a put of a first-seen id, so one
        # md5 per row gives both digests. ``con`` may be a cursor of this
        # reduction's database, used from another thread.
        i, h = prov.ID, prov.PAYLOAD_HASH
        sql = f"SELECT count(*), bit_xor({dg.pair_term_sql(i, h, self.digest)}) FROM pay"
        rows, n = (con or self.con).execute(sql).fetchall()[0]
        found = self.transition = Transition(
            inserts=int(rows),
            captured=int(rows),
            digest=transition_digest({self._first_op.strip("'"): n}),
            content_xor=_halves(int(n or 0)),
        )
        return found

    def full_content_xor(self: _Reduction) -> tuple[int, int]:
        """The content digest of the whole capture (full refresh)."""
        (value,) = self.con.execute(
            f"SELECT bit_xor({dg.pair_term_sql('_cid', '_chash', self.digest)}) FROM {self._keys()}"
        ).fetchall()[0]
        return _halves(int(value or 0))
