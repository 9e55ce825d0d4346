"""Keys a capture holds more than once: found, refused, and their rows for quarantine.

A mixin of :class:`~combined.capture._reduce.Reducer`: it reads the
reduction's views (``pay``, ``cap``) through the reduction's connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

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


class _Reduction(Protocol):
    """What the checks read of a reduction."""

    con: duckdb.DuckDBPyConnection
    sync_mode: str
    has_op: bool
    full: bool
    streamed: bool
    key: list[str]
    capture_schema: pa.Schema

    def same_as_current(self) -> bool: ...

    def by_fingerprints(self) -> Any: ...

    def _keys(self) -> str: ...

    def duplicates(self, limit: int = 1000) -> list[tuple[str, int, list[int]]]: ...


class DuplicateChecks:
    """Duplicate keys of a full-row capture (a reduction's mixin)."""

    def _may_repeat_ids(self: _Reduction) -> bool:
        """Whether two staged rows may share an id (their ids' 64-bit hashes meet)."""
        rows = self.con.execute(f"SELECT 1 FROM ({meeting_hashes('pay', prov.ID)}) LIMIT 1")
        return bool(rows.fetchall())

    def duplicates(self: _Reduction, limit: int = 1000) -> list[tuple[str, int, list[int]]]:
        """Ids present more than once in a full-row capture, with their ordinals.

        An event stream (``append``) has none: it keeps every row it reads and
        replaces none, so two equal rows (a keyless event read twice, the same
        event repeated) are two events, not a key that cannot choose a row.
        """
        if self.sync_mode == "append":
            return []
        if self.has_op or not self.full or self.same_as_current():
            return []  # (see same_as_current: an unchanged capture holds each id once)
        if self.by_fingerprints() is not None:
            return []  # (its checks found each id once)
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
            "(SELECT _cid FROM cap GROUP BY _cid HAVING count(*) > 1) ORDER BY _combined_ordinal"
        ).to_arrow_table()
