"""What a reduction delivers: the changes MAR counts, the constant columns, the rows.

A mixin of :class:`~combined.capture._reduce.Reducer`, the last step of a
reduction: the staged rows as they are (a first baseline), or joined with
the transition ``tr`` (or a full refresh's ``keys``), part by part where
the parts allow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from combined.capture._output import (
    OUTPUT_BATCH_ROWS,
    Delivered,
    PartRange,
    _Constants,
    constant_columns,
    in_order,
    part_ranges,
    part_rows,
    staged_rows,
)
from combined.capture._unchanged import FILL_JOIN_MB, Resolved
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident
from combined.runtime._memory import release_memory

if TYPE_CHECKING:
    import duckdb

    from combined.capture._transition import Transition
    from combined.delivery import StagedParts

#: The name the staged parts are registered under in a reduction's connection.
STAGED = "staged_capture"
#: DuckDB memory, in MB, while a keyless mirror's rows are delivered part by
#: part (``release``): a 5M-row first capture otherwise kept the reduction's
#: limit beside the Deliveries' buffers (peak 392 MB, 339 MB with it).
CONTENT_OUTPUT_MB = 64


class _Reduction(Protocol):
    """What the output reads and writes of a reduction."""

    @property
    def con(self) -> duckdb.DuckDBPyConnection: ...

    all_new: bool
    prehashed: bool
    has_op: bool
    sync_mode: str
    by_content: bool
    soft: str | None
    payload: list[str]
    capture_schema: pa.Schema
    capture_files: list[Path]
    transition: Transition | None
    _resolved: Resolved | None
    _staged: StagedParts
    _has_keys: bool
    _gone: tuple[str, ...]

    @property
    def _first_op(self) -> str: ...

    def _keys(self) -> str: ...

    def _every_row_new(self) -> bool: ...

    def _output_sql(self, provenance: str = "") -> str: ...

    def _ranged_output(
        self,
        ranges: list[PartRange],
        provenance: str,
        fixed: _Constants,
        batch_rows: int,
        roomier: Callable[[], Any] | None = None,
    ) -> Iterator[pa.RecordBatch]: ...


class Output:
    """The rows a reduction delivers (a reduction's mixin)."""

    def _every_row_new(self: _Reduction) -> bool:
        """Whether the transition inserts every staged row, once each."""
        if self.all_new:
            return True
        if not self.prehashed or self.has_op or self.sync_mode != "incremental":
            return False
        if self.soft is not None:
            return False
        t = self.transition
        return t is not None and t.inserts == t.captured and not (t.updates or t.deletes)

    def release(self: _Reduction) -> None:
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
        release_memory()  # (what the reduction freed, DuckDB's and the heaps', before the output)
        if self.by_content and not every_row_new:
            # Each part's rows meet a few row groups of ``tr`` (kept in the
            # parts' order): the rest of it waits on disk, not in memory.
            self.con.execute(f"SET memory_limit = '{CONTENT_OUTPUT_MB}MB'")

    def changes(self: _Reduction, batch_rows: int = 65_536) -> pa.RecordBatchReader:
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

    def constants(self: _Reduction, constants: dict[str, Any]) -> dict[str, pa.Scalar]:
        """The columns :meth:`output` gives one value in every row, with that value."""
        _, scalars = constant_columns(self.capture_schema, constants)
        if self.all_new:
            return {prov.OP: pa.scalar(self._first_op.strip("'"), pa.string()), **scalars}
        return scalars

    def output(
        self: _Reduction, constants: dict[str, Any], batch_rows: int = OUTPUT_BATCH_ROWS
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
            roomier = None
            if self._resolved is not None and (mb := self._resolved.output_mb(FILL_JOIN_MB)):
                # (a part that needs more gets the reduction's own limit back)
                (held,) = self.con.execute("SELECT current_setting('memory_limit')").fetchall()[0]
                roomier = partial(self.con.execute, f"SET memory_limit = '{held}'")
                self.con.execute(f"SET memory_limit = '{mb}MB'")  # part by part: less
            yield from self._ranged_output(ranges, provenance, fixed_columns, batch_rows, roomier)
            return
        sql = self._output_sql(provenance)
        reader: pa.RecordBatchReader = self.con.sql(sql).to_arrow_reader(batch_rows)
        for batch in reader:
            yield fixed_columns.add(batch)

    def _ranged_output(
        self: _Reduction,
        ranges: list[PartRange],
        provenance: str,
        fixed: _Constants,
        batch_rows: int,
        roomier: Callable[[], Any] | None = None,
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
                staged=STAGED,
                gone=self._gone,
            ),
            ordered=self.sync_mode == "append",
            fixed=fixed,
            batch_rows=batch_rows,
            roomier=roomier,
        )

    def _output_sql(self: _Reduction, provenance: str = "") -> str:
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
