"""One SQLite read: a single read transaction streamed as bounded Arrow batches."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from combined.connectors._shared import new_to_lake, null_cursor_error, select_plans
from combined.connectors.abc import BaseExtraction, ReadRequest
from combined.connectors.sqlite import _catalog as catalog
from combined.connectors.sqlite._connection import (
    BATCH_ROWS_OPTION,
    DRIVER_ERRORS,
    Connection,
    execute,
    scalar,
    translate,
)
from combined.connectors.sqlite._cursor import (
    check_next_rowid,
    check_one_order,
    lower_bound,
    next_state,
)
from combined.connectors.sqlite._types import ColumnPlan, Projection, quote_ident
from combined.errors import ConfigError, ProtocolViolation
from combined.protocol import Message, RecordBatchMessage, StateMessage, TerminalOutcome


@dataclass(frozen=True, slots=True)
class _Plan:
    projection: Projection
    sql: str | None
    params: tuple[Any, ...] | None
    #: The checkpoint after the read: ``max(cursor)``, or the last one if above it.
    upper: Any
    #: The rows whose cursor is NULL (``nulls: include``), read after ``sql``.
    null_sql: str | None = None


def select_columns(
    all_plans: Sequence[ColumnPlan], request: ReadRequest, relation: str
) -> tuple[ColumnPlan, ...]:
    """The requested columns (all when none are named); refuse unknown names.

    The key and the cursor must exist too, even when not selected, since the
    read orders by them.
    """
    return tuple(select_plans(all_plans, request, relation)[1])


class SQLiteExtraction(BaseExtraction):
    """A snapshot or cursor read of one relation in one read transaction.

    The connection is owned by this extraction and closed by :meth:`finish`
    (any outcome: a read holds nothing that must survive it). Iterating
    starts the read; iterating a second time, or after :meth:`finish`, is a
    :class:`~combined.errors.ProtocolViolation`.
    """

    def __init__(
        self,
        conn: Connection,
        *,
        path: str,
        request: ReadRequest,
        relation: str,
        batch_rows: int,
    ) -> None:
        super().__init__()
        self._conn: Connection | None = conn
        self._path = path
        self._request = request
        self._relation = relation
        self._batch_rows = batch_rows
        self._guard = threading.Lock()
        self._started = False
        #: The database file's marker when asked for (``change_marker``), taken
        #: before the read: the engine folds a capture whose marker did not move.
        self.change_marker: str | None = None

    def _claim(self) -> Connection:
        with self._guard:
            conn = self._live()
            if self._started:
                raise ProtocolViolation(
                    "the extraction was already read",
                    hint="start a new read for another pass",
                )
            self._started = True
            return conn

    def _live(self) -> Connection:
        conn = self._conn
        if conn is None:
            raise ProtocolViolation(
                "the extraction is finished", hint="start a new read to read again"
            )
        return conn

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        with self._guard:
            conn, self._conn = self._conn, None
        if conn is not None:
            # Closing also closes the open cursor and ends the read transaction.
            conn.close()
        return ()

    def _messages(self) -> Iterator[Message]:
        conn = self._claim()
        request = self._request
        self.authority.acquire()
        in_transaction = False
        cursor = None
        if request.options.get("change_marker") and not request.bounds:
            self.change_marker = file_marker(self._path)
        try:
            # One read transaction: the catalog, max(cursor) and every row are
            # read from the same snapshot of the file.
            execute(conn, "BEGIN")
            in_transaction = True
            plan = self._plan(conn)
            rows = 0  # of the window: NULL cursors move no checkpoint
            for window, sql, params in (
                (True, plan.sql, plan.params),
                (False, plan.null_sql, None),
            ):
                if sql is None:
                    continue
                cursor = conn.cursor({BATCH_ROWS_OPTION: str(self._batch_rows)})
                cursor.execute(sql, params)
                reader = cursor.fetch_record_batch()
                while True:
                    self._live()
                    try:
                        raw = reader.read_next_batch()
                    except StopIteration:
                        break
                    batch = plan.projection.convert(raw, request.dataset)
                    for offset in range(0, batch.num_rows, self._batch_rows):
                        piece = batch.slice(offset, self._batch_rows)
                        self.authority.count(piece.num_rows, piece.nbytes)
                        rows += piece.num_rows if window else 0
                        yield RecordBatchMessage(request.dataset, piece)
                        self._live()
                cursor.close()
                cursor = None
            execute(self._live(), "COMMIT")
            in_transaction = False
            self.authority.complete()
            if request.strategy == "snapshot" or request.cursor is None:
                yield StateMessage(request.dataset, {}, final=True)
            else:
                state, position = next_state(request.state, plan.upper, rows, request.cursor)
                yield StateMessage(request.dataset, state, position=position, final=True)
        except (*DRIVER_ERRORS, pa.ArrowException) as exc:
            raise translate(exc, self._path) from exc
        finally:
            self._abandon(cursor, in_transaction)

    def _abandon(self, cursor: Any, in_transaction: bool) -> None:
        conn = self._conn
        if conn is None:  # finish() already closed everything
            return
        # Cleanup never replaces the error that brought us here.
        with contextlib.suppress(*DRIVER_ERRORS):
            if cursor is not None:
                cursor.close()
            if in_transaction:
                execute(conn, "ROLLBACK")

    def _plan(self, conn: Connection) -> _Plan:
        request = self._request
        rel = catalog.find_relation(conn, self._relation)
        cols = catalog.columns(conn, rel)
        idx = catalog.indexes(conn, rel)
        all_plans = catalog.plans(rel, cols, idx)
        projection = Projection(select_columns(all_plans, request, rel.name))
        base = f"SELECT {projection.select_list()} FROM {quote_ident(rel.name)}"
        if request.strategy == "snapshot":
            return _Plan(projection, base, None, None)
        spec = request.cursor
        if spec is None:  # read() refuses this; kept for type narrowing
            raise ConfigError("a cursor read needs a cursor", hint="declare the dataset's cursor")
        kind = next(p for p in all_plans if p.name == spec.column)
        if not kind.type.cursor_capable:
            raise ConfigError(
                f"column {spec.column!r} is declared {kind.declared or 'without a type'} "
                "and cannot serve as a cursor",
                hint="choose an integer, real or text column, see discovery's cursor candidates",
                column=spec.column,
            )
        q = quote_ident(spec.column)
        table = quote_ident(rel.name)
        # No window reaches a NULL cursor (SQL NULL only: text such as 'null'
        # is a value, and a column mixing it with numbers is refused below).
        # A column the catalog proves NOT NULL holds none to count or read.
        nulls = spec.nulls if kind.nullable else "exclude"
        if nulls == "fail":
            count = scalar(conn, f"SELECT count(*) FROM {table} WHERE {q} IS NULL")
            if count:
                raise null_cursor_error(rel.name, spec.column, int(count))
        # Read by their own statement in the same transaction: or-ed into the
        # window's, they would make sqlite sort the whole window.
        null_sql = f"{base} WHERE {q} IS NULL" if nulls == "include" else None
        upper = scalar(conn, f"SELECT max({q}) FROM {table}")
        if upper is None:
            return _Plan(projection, None, None, None, null_sql)
        last = (request.state or {}).get("cursor")
        if last is not None and _filled_below(conn, table, q, last, request, projection):
            last = None  # read from the start: the rows below the checkpoint changed too
        checkpoint = upper
        low = scalar(conn, f"SELECT min({q}) FROM {table}")
        check_one_order(spec.column, low, upper, last)
        where = [f"{q} <= ?"]
        params: list[Any] = [upper]
        if last is not None:
            lower = lower_bound(last, spec.lookback, spec.column)
            if spec.column == catalog.rowid_alias(rel, cols, idx):
                check_next_rowid(spec.column, catalog.next_rowid(conn, rel, upper), lower, last)
            where.append(f"{q} > ?")
            params.append(lower)
            # The checkpoint never moves backwards (rows at the top deleted
            # since): compared by sqlite under the column's collation, as the
            # window is; compared in Python, 'b' > 'C' under NOCASE kept the
            # checkpoint on 'b' and every capture read the 'C' row again.
            if not scalar(conn, f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {q} >= ?)", (last,)):
                checkpoint = last
        order = ", ".join(quote_ident(c) for c in dict.fromkeys((spec.column, *request.key)))
        sql = f"{base} WHERE {' AND '.join(where)} ORDER BY {order}"
        return _Plan(projection, sql, tuple(params), checkpoint, null_sql)


def file_marker(path: str) -> str | None:
    """A text that moves whenever the database file may have: the file's and its WAL's.

    Each write changes the file or its write-ahead log (size, modification
    time to the nanosecond where the file system keeps it). A hint, never
    proof: on a file system that keeps coarser times a write in the same
    tick leaves it as it was. None for a database that is not a plain file.
    """
    marks = []
    for name in (path, f"{path}-wal"):
        try:
            st = os.stat(name)
        except OSError:
            if name == path:
                return None
            marks.append("-")
            continue
        marks.append(f"{st.st_dev}.{st.st_ino}.{st.st_size}.{st.st_mtime_ns}")
    return "sqlite1:" + ":".join(marks)


def _filled_below(
    conn: Connection, table: str, cursor: str, last: Any, request: ReadRequest, read: Projection
) -> bool:
    """Whether a column new to the lake holds values at or below ``last`` (see new_to_lake)."""
    new = new_to_lake(request, read.schema.names)
    if not new:
        return False
    filled = " OR ".join(f"{quote_ident(n)} IS NOT NULL" for n in new)
    below = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {cursor} <= ? AND ({filled}))"
    return bool(scalar(conn, below, (last,)))
