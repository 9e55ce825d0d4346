"""One PostgreSQL read: a REPEATABLE READ READ ONLY transaction streamed as Arrow batches.

Receipt boundaries (the clock is the server's ``clock_timestamp()``, named
``postgresql:clock_timestamp``):

* nothing happens when the extraction is built or ``iter()`` is called; the
  first ``next()`` connects (or takes a session its source kept: see
  ``_connect.Sessions``), opens the transaction and reads
  ``pg_current_snapshot()`` as the transaction's first statement (which is
  what fixes its snapshot): ``acquire`` and ``acquire_snapshot`` take that
  statement's server time, ``source_token`` the digest of the snapshot text;
* rows are counted as each batch is handed over; ``complete`` happens only
  once the driver's stream ended (the terminal empty read), with a server
  time read after it;
* ``lifecycle="whole"`` (default: the "whole" and "batched" contracts, the
  driver streaming one COPY in bounded batches) then commits the read-only
  transaction and gives the session back to its source (for the source's
  next read, or closed) before the last message; ``lifecycle="streaming"``
  keeps the transaction (and its snapshot) open until :meth:`finish`:
  ``success`` commits, ``abort`` and ``retain_commit_unknown`` roll back.
  Either way the transaction is over by the terminal outcome at the latest:
  a committed session is given back, any other is closed.

Cursor reads page by keyset over (cursor, key...) inside the one snapshot:
``cursor > last - lookback AND cursor <= max(cursor)``, the maximum read in
that snapshot before the first page; the lower bound is exclusive, so
without a lookback a row committed late with a value at or below the last
checkpoint is never read (the documented limit of the strategy), and an
update that does not move the cursor is never seen (control totals over
the relation reveal it to reconciliation). A NaN or infinity in the cursor
column (above every value) is refused, never checkpointed: no later row
would compare above it. A NULL cursor is in no window: the cursor's
``nulls`` policy either fails the read (``fail``, after counting them in the
snapshot: the default, skipped when the column is NOT NULL), reads them in
every read after the keyset pages (``include``, counted by the control
totals too) or leaves them out (``exclude``). Pages are ordered and compared on
the relation's own columns, NULLs where ``ORDER BY`` puts them (last). Where a
unique index over NOT NULL columns lies within (cursor, key...), no two rows
tie and a page is the next ``page_rows`` rows; otherwise (a view, a nullable
or non-unique key, a cast column, whose values are read rounded or as text)
a page ends at the ``page_rows``-th row's values, read as the columns' own
text, and takes every row tied with it, so that a row equal to a page's last
one is never skipped.

A read creates no staging relation (the transaction is read only), so the
only resources to guard are the session and its stream: any failure before
the last message closes them at once (closing ends the backend, which rolls
the transaction back, and never drains a half-read stream); a close failure
is attached to the primary error as a note and reported by :meth:`finish` as
its ``cleanup_error_code``, never raised in its place.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, Literal

import pyarrow as pa
from psycopg import sql

from combined.connectors._shared import (
    ControlTotals,
    KeysetAtom,
    SessionRead,
    cast_key,
    check_lookback,
    cursor_order,
    final_state,
    keyset_pages,
    keyset_terms,
    new_to_lake,
    null_cursor_error,
    numeric_lookback,
    select_plans,
    sql_read_options,
    tie_free,
    time_window,
)
from combined.connectors.abc import ReadRequest
from combined.connectors.postgres import _catalog as catalog
from combined.connectors.postgres._connect import (
    DEFAULT_BATCH_BYTES,
    DRIVER_ERRORS,
    Session,
    Sessions,
    Settings,
    close_quietly,
    query_error,
)
from combined.connectors.postgres._preflight import (
    refuse_cursor,
    refuse_order,
    refuse_unreadable,
)
from combined.connectors.postgres._types import ColumnPlan, Layout, jsonable, value_from_text
from combined.errors import (
    CombinedError,
    ConfigError,
    ProtocolViolation,
    SchemaMismatch,
    SourceUnavailable,
    UnsupportedType,
)
from combined.protocol import (
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    StateMessage,
    TerminalOutcome,
)

#: The clock that issues every window timestamp of a PostgreSQL read.
SERVER_CLOCK = "postgresql:clock_timestamp"
#: Snapshot authorities: a transaction's own snapshot, or one imported from a coordinator.
CURRENT_SNAPSHOT = "postgresql:pg_current_snapshot"
EXPORTED_SNAPSHOT = "postgresql:pg_export_snapshot"

Lifecycle = Literal["whole", "streaming"]
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_SNAPSHOT = "SELECT CAST(pg_current_snapshot() AS text), clock_timestamp()"


#: Columns from which a read asks the driver for batches of half the bytes (see _stream).
WIDE_COLUMNS = 100


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The options of one read, from ``ReadRequest.options``.

    ``lifecycle`` (``whole`` or ``streaming``), ``casts`` ({column: ``text`` |
    ``numeric(p,s)``}), ``batch_bytes`` (the driver's batch size hint),
    ``page_rows`` (rows per keyset page of a cursor read; an index leading
    with the cursor keeps each page cheap) and ``control_totals`` (``True``
    for a count, or a column name for a count and that column's exact sum,
    read in the same snapshot after the last row: over the bounds or
    partition of a snapshot read, and over every row up to the upper bound
    of a cursor read, with ``nulls: include`` every row whose cursor is NULL
    too, which is what the projection should then hold).
    """

    lifecycle: Lifecycle = "whole"
    casts: Mapping[str, str] = field(default_factory=dict)
    batch_bytes: int = DEFAULT_BATCH_BYTES
    page_rows: int = 1_000_000
    control_totals: bool | str = False

    @classmethod
    def of(cls, request: ReadRequest, settings: Settings | None = None) -> ReadOptions:
        """Validate ``request.options``; unknown keys are left to other layers.

        The source's ``casts`` for the relation (``settings``) apply unless
        the read names its own.
        """
        opts = request.options
        lifecycle = opts.get("lifecycle", "whole")
        if lifecycle not in ("whole", "streaming"):
            raise ConfigError(
                f"unknown postgres read lifecycle {lifecycle!r}",
                hint="use whole (commit when read) or streaming (hold until the outcome)",
            )
        casts = opts.get("casts")
        if casts is None:
            casts = {} if settings is None else settings.casts_for(request.relation)
        shared = sql_read_options(
            request, casts, batch_bytes=DEFAULT_BATCH_BYTES, page_rows=1_000_000
        )
        return cls(
            lifecycle, shared.casts, shared.batch_bytes, shared.page_rows, shared.control_totals
        )


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """What a worker needs to read one partition under an exported snapshot."""

    snapshot_id: str
    snapshot_text: str
    column: str
    index: int
    lower: Any
    upper: Any
    include_nulls: bool


def literal(value: Any, plan: ColumnPlan) -> sql.Composable:
    """``value`` as a SQL literal comparable with ``plan``'s column.

    Text is cast to the column's type; Python values carry psycopg's own type.
    """
    if isinstance(value, str):
        return sql.SQL("CAST({} AS {})").format(sql.Literal(value), sql.SQL(plan.source_type))
    return sql.Literal(value)


def range_predicate(
    plan: ColumnPlan, lower: Any, upper: Any, include_nulls: bool
) -> sql.Composable | None:
    """``lower <= col < upper`` (either side may be open), or-ed with ``col IS NULL``."""
    col = sql.Identifier(plan.name)
    conds: list[sql.Composable] = []
    if lower is not None:
        conds.append(sql.SQL("{} >= {}").format(col, literal(lower, plan)))
    if upper is not None:
        conds.append(sql.SQL("{} < {}").format(col, literal(upper, plan)))
    if not conds:
        return None if include_nulls else sql.SQL("{} IS NOT NULL").format(col)
    both = sql.SQL(" AND ").join(conds)
    if include_nulls:
        return sql.SQL("({} OR {} IS NULL)").format(both, col)
    return both


def _cursor_value(text: str | None, plan: ColumnPlan) -> Any:
    """A cursor's upper bound or checkpoint, from its PostgreSQL text.

    NaN and infinity sort above every value: checkpointed, no later row
    would ever compare above them, so they are refused.
    """
    if text is not None and text.lower() in ("nan", "infinity"):
        raise SchemaMismatch(
            f"cursor column {plan.name!r} ({plan.source_type}) holds {text!r}, which sorts "
            "above every value: a checkpoint there would never read a later row",
            hint=_CURSOR_ESCAPE,
            column=plan.name,
        )
    return value_from_text(text, plan, hint=_CURSOR_ESCAPE)


#: What to do about a cursor value no checkpoint can hold.
_CURSOR_ESCAPE = (
    "read the relation through a view that leaves those rows out (its `relation:`), "
    "or capture it with `strategy: snapshot`"
)


def _and(parts: Sequence[sql.Composable | None]) -> sql.Composable:
    kept = [p for p in parts if p is not None]
    if not kept:
        return sql.SQL("")
    return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(kept)


@dataclass(slots=True)
class _Work:
    relation: catalog.Relation
    layout: Layout
    by_name: dict[str, ColumnPlan]
    not_null: frozenset[str] = frozenset()
    where: sql.Composable | None = None
    control_where: sql.Composable | None = None
    upper: Any = None
    checkpoint: Any = None
    #: Rows the one statement over ``control_where`` returned (None: the
    #: read was not one such statement, e.g. a cursor's pages).
    rows_read: int | None = None


@dataclass(frozen=True)
class _Keyset:
    """The (cursor, key...) order of pages, compared on the relation's own columns.

    A bare name in ORDER BY would sort by the select list's column of that
    name, which reads numeric, enum or cast columns as text ('10' < '9').
    """

    source: list[sql.Composable]
    types: list[str]
    #: No column of the order holds a NULL in the window.
    never_null: bool

    @classmethod
    def of(cls, work: _Work, order: list[str], cursor: str) -> _Keyset:
        """The order's qualified columns; the cursor is never NULL (``<=`` its upper bound)."""
        rel = work.relation
        return cls(
            source=[sql.Identifier(rel.schema, rel.table, c) for c in order],
            types=[work.by_name[c].source_type for c in order],
            never_null=all(c in work.not_null or c == cursor for c in order),
        )

    @property
    def order_sql(self) -> sql.Composable:
        """The ORDER BY list."""
        return sql.SQL(", ").join(self.source)

    def typed(self, i: int, value: Any) -> sql.Composable:
        """``value`` as a literal of the ``i``-th column's own type."""
        return sql.SQL("CAST({} AS {})").format(sql.Literal(value), sql.SQL(self.types[i]))

    def compare(self, values: list[Any], *, after: bool) -> sql.Composable:
        """Rows strictly after ``values`` (``after``) or at or before them."""
        if self.never_null and all(v is not None for v in values):
            # A row comparison: what a btree index on (cursor, key...) serves.
            return sql.SQL("({}) {} ({})").format(
                self.order_sql,
                sql.SQL(">" if after else "<="),
                sql.SQL(", ").join(self.typed(i, v) for i, v in enumerate(values)),
            )
        # ORDER BY's ascending order puts NULLs last.
        terms = keyset_terms(values, after=after, nulls_first=False)
        if not terms:
            return sql.SQL("false")
        return sql.SQL("({})").format(
            sql.SQL(" OR ").join(
                sql.SQL("({})").format(sql.SQL(" AND ").join(self._term(term))) for term in terms
            )
        )

    def _term(self, term: list[KeysetAtom]) -> Iterator[sql.Composable]:
        """One conjunction of a keyset comparison: ``column op value`` or ``IS [NOT] NULL``."""
        for i, op, value in term:
            if value is None:
                yield sql.SQL("{} {}").format(self.source[i], sql.SQL(op.upper()))
            else:
                yield sql.SQL("{} {} {}").format(self.source[i], sql.SQL(op), self.typed(i, value))


class PostgresExtraction(SessionRead[Session]):
    """A snapshot, cursor or partition read of one relation.

    Read it once; iterating again, or after :meth:`finish`, raises
    :class:`~combined.errors.ProtocolViolation`. :meth:`finish` may be called
    from another thread: it waits for a batch being fetched, never for the
    consumer.
    """

    def __init__(
        self,
        settings: Settings,
        request: ReadRequest,
        options: ReadOptions,
        partition: PartitionRead | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        super().__init__(ExtractionAuthority(clock_authority=SERVER_CLOCK), close_quietly)
        self._settings = settings
        #: The source's kept sessions: the read takes one and gives it back committed.
        self._sessions = sessions
        self._request = request
        self._options = options
        self._partition = partition
        self._pid: int | None = None
        self._control: ControlTotals | None = None
        #: The relation's statistics marker when asked for (``change_marker``), read
        #: before its rows: the engine folds a capture whose marker did not move.
        self.change_marker: str | None = None

    @property
    def backend_pid(self) -> int | None:
        """The server process serving this read, once it started (diagnostics, tests)."""
        return self._pid

    @property
    def control_totals(self) -> ControlTotals | None:
        """Counts read in the same snapshot after the last row, when requested."""
        return self._control

    @property
    def holds_transaction(self) -> bool:
        """Whether a source session is still open (a streaming read awaiting its outcome)."""
        return self._session is not None

    # -- lifecycle -----------------------------------------------------------

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        if outcome != "success":
            self._stop_statement()
        with self._lock:
            self._finished = True
            session, self._session = self._session, None
        if session is not None:
            failure: BaseException | None = None
            status = "idle" if session.streaming else session.transaction_status()
            end = None
            if status in ("intrans", "inerror"):
                end = "COMMIT" if outcome == "success" and status == "intrans" else "ROLLBACK"
                try:
                    session.run(end, "ending the read transaction")
                except CombinedError as exc:
                    failure = exc
            # A half-read stream is not drained: closing ends the backend.
            committed = end == "COMMIT" and failure is None
            closed = self._give_back(session) if committed else session.close()
            failure = failure or closed
            if failure is not None:
                raise failure
        if self._cleanup_failure is not None:
            raise self._cleanup_failure
        return ()  # a read keeps no file evidence

    def _cancel_statement(self, session: Session) -> None:
        session.cancel()

    # -- reading -------------------------------------------------------------

    def _messages(self) -> Iterator[Message]:
        self._claim()
        request = self._request
        try:
            with self._lock:
                work = self._begin()
            if request.strategy == "cursor" and self._partition is None:
                yield from self._cursor_pages(work)
            else:
                q = sql.SQL("SELECT {} FROM {}{}").format(
                    work.layout.select_list(), work.relation.ident, _and([work.where])
                )
                work.rows_read = 0
                for batch in self._stream(q, work.layout):
                    work.rows_read += batch.num_rows
                    yield RecordBatchMessage(request.dataset, batch)
            with self._lock:
                final = self._end(work)
        except GeneratorExit:
            self._abandon(None)
            raise
        except CombinedError as exc:
            self._abandon(exc)
            raise
        except DRIVER_ERRORS as exc:
            err = query_error(exc, self._settings, "reading")
            self._abandon(err)
            raise err from None
        except BaseException as exc:
            self._abandon(exc)
            raise
        # Outside the guard: a consumer that stops after the last message must
        # not close a streaming transaction that awaits its outcome.
        yield final

    def _begin(self) -> _Work:
        if self._finished:
            raise ProtocolViolation("the extraction is finished", hint="start a new read")
        # A kept session of the source's (settled), else a new one: closed by
        # _abandon if the read fails from here on, given back once committed.
        self._session = session = (
            Session(self._settings) if self._sessions is None else self._sessions.take()
        )
        self._pid = session.pid
        session.run(_BEGIN, "opening the read transaction")
        part = self._partition
        if part is not None:
            # The snapshot id must be a literal: SET TRANSACTION SNAPSHOT takes no parameter.
            stmt = sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(part.snapshot_id))
            try:
                session.run(stmt, "importing the exported snapshot")
            except SourceUnavailable:
                raise
            except CombinedError as exc:
                raise ProtocolViolation(
                    "the partition plan's exported snapshot cannot be imported",
                    hint="keep the partition plan open until every partition was read",
                    detail=exc.message,
                ) from None
        snapshot, at = session.rows(_SNAPSHOT, "reading the snapshot")[0]
        at = at.astimezone(UTC)
        self.authority.acquire(at=at)
        if part is not None:
            if snapshot != part.snapshot_text:
                raise ProtocolViolation(
                    "the worker's snapshot differs from the exported one",
                    hint="report this: the imported snapshot must equal the coordinator's",
                )
            self.authority.acquire_snapshot(EXPORTED_SNAPSHOT, snapshot, at=at)
        else:
            self.authority.acquire_snapshot(CURRENT_SNAPSHOT, snapshot, at=at)
        return self._prepare(session)

    def _give_back(self, session: Session) -> BaseException | None:
        """The read's session, its transaction committed, kept for the source's next read."""
        if self._sessions is None:
            return session.close()
        return self._sessions.give_back(session)

    def _prepare(self, session: Session) -> _Work:
        request = self._request
        rel = catalog.find_relation(session, request.relation)
        if request.options.get("change_marker") and self._partition is None and not request.bounds:
            self.change_marker = catalog.change_marker(session, rel)
        cols = catalog.columns(session, [rel.oid]).get(rel.oid, [])
        types = catalog.load_types(session, {c.typoid for c in cols})
        casts = self._options.casts
        unknown = sorted(set(casts) - {c.name for c in cols})
        if unknown:
            raise ConfigError(
                f"a cast names column {unknown[0]!r}, which {rel.name!r} does not have",
                hint="fix the casts option",
            )
        plans = catalog.column_plans(cols, types, casts)
        part = self._partition
        also = () if part is None else (part.column,)
        by_name, selected = select_plans(plans, request, rel.name, also=also)
        # An interval is the dataset's to fix (cast or leave out), and a type without an
        # Arrow type needs review; the preflight told both, this read meets a change since.
        readable = [p for p in selected if p.route != "unsupported"]
        refuse_unreadable(request.dataset, rel.name, readable, cdc=False)
        for p in selected:
            if p.route == "unsupported":
                raise UnsupportedType(
                    f"column {p.name!r} of {rel.name!r} has type {p.source_type}: {p.reason}",
                    hint=f'declare casts: {{{cast_key(rel.name, p.name)}: "text"}} in the source '
                    "configuration to read its text form",
                    relation=rel.name,
                    column=p.name,
                    source_type=p.source_type,
                )
        not_null = frozenset(c.name for c in cols if c.notnull)
        work = _Work(rel, Layout.of(selected), by_name, not_null)
        if part is not None:
            work.where = range_predicate(
                by_name[part.column], part.lower, part.upper, part.include_nulls
            )
        elif request.bounds:
            work.where = self._bounds(by_name)
        work.control_where = work.where
        return work

    def _bounds(self, by_name: Mapping[str, ColumnPlan]) -> sql.Composable | None:
        bounds = dict(self._request.bounds or {})
        column = bounds.get("column")
        if not isinstance(column, str) or column not in by_name:
            raise ConfigError(
                f"read bounds name column {column!r}, which the relation does not have",
                hint="bounds are {column, lower (inclusive), upper (exclusive), include_nulls}",
            )
        return range_predicate(
            by_name[column],
            bounds.get("lower"),
            bounds.get("upper"),
            bool(bounds.get("include_nulls", False)),
        )

    def _stream(self, query: sql.Composable, layout: Layout) -> Iterator[pa.RecordBatch]:
        rows = self._request.batch_rows
        # A batch of many columns is held several times over while it is read,
        # converted, waits for the stager and is hashed: half as many bytes a
        # batch (a 300-column table's read peaked at 406-431 MB, 367-392 so).
        wide = len(layout.plans) >= WIDE_COLUMNS
        batch_bytes = self._options.batch_bytes // 2 if wide else self._options.batch_bytes
        with self._lock:
            reader = self._live().stream(query, batch_bytes, "starting the read")
        while True:
            with self._lock:
                session = self._live()
                try:
                    raw = reader.read_next_batch()
                except StopIteration:
                    session.end_stream()
                    return
                except DRIVER_ERRORS as exc:
                    error = query_error(exc, self._settings, "reading rows")
                    if isinstance(error, SchemaMismatch):
                        error = layout.named(error, self._request.relation)
                    raise error from None
                batch = layout.convert(raw, self._request.relation)
            # Driver batches are bounded in bytes; slicing (zero-copy) bounds rows too.
            for offset in range(0, batch.num_rows, rows):
                self._live()  # nothing is handed over after a terminal outcome
                piece = batch.slice(offset, rows)
                self.authority.count(piece.num_rows, piece.nbytes)
                yield piece

    def _end(self, work: _Work) -> StateMessage:
        session = self._live()
        (at,) = session.rows("SELECT clock_timestamp()", "closing the read window")[0]
        at = at.astimezone(UTC)
        self.authority.complete(at=at)
        control = self._options.control_totals
        if control is not False:
            self._control = self._count(
                session, work, control if isinstance(control, str) else None
            )
        if self._options.lifecycle == "whole":
            self._commit_and_close(session, self._give_back)
        request = self._request
        cursor = request.strategy == "cursor" and self._partition is None
        return final_state(request, work.checkpoint, jsonable, cursor=cursor)

    def _count(self, session: Session, work: _Work, column: str | None) -> ControlTotals:
        if column is not None and column not in work.by_name:
            raise ConfigError(
                f"control_totals names column {column!r}, which the relation does not have",
                hint="name a numeric column",
            )
        if column is None and work.rows_read is not None:
            # The read was one statement over the control predicate in this
            # REPEATABLE READ snapshot: the rows it returned are the count a
            # second ``count(*)`` scan would give, without that scan.
            return ControlTotals(work.rows_read)
        total = (
            sql.SQL("CAST(sum({}) AS text)").format(sql.Identifier(column))
            if column
            else sql.SQL("NULL")
        )
        q = sql.SQL("SELECT count(*), {} FROM {}{}").format(
            total, work.relation.ident, _and([work.control_where])
        )
        rows, summed = session.rows(q, "reading control totals")[0]
        return ControlTotals(int(rows), column, summed)

    # -- cursor strategy -----------------------------------------------------

    def _cursor_pages(self, work: _Work) -> Iterator[Message]:
        request = self._request
        spec = request.cursor
        assert spec is not None
        plan = refuse_cursor(request.dataset, work.by_name, spec.column)
        col = sql.Identifier(spec.column)
        # No window reaches a NULL cursor; a NOT NULL column holds none to count or read.
        is_null = sql.SQL("{} IS NULL").format(col)
        nulls = spec.nulls if spec.column not in work.not_null else "exclude"
        if nulls == "fail":
            self._refuse_null_cursors(work, spec.column, is_null)
        include = nulls == "include"
        last = (request.state or {}).get("cursor")
        if last is not None and self._filled_below(work, col, literal(str(last), plan)):
            last = None  # read from the start: the rows below the checkpoint changed too
        lower = None if last is None else self._lower_bound(plan, last, spec.lookback)
        upper_text, best_text = self._cursor_upper(work, col, plan, last)
        work.upper = _cursor_value(upper_text, plan)
        best = _cursor_value(best_text, plan)  # a stored NaN or infinity is refused too
        if work.upper is None:
            work.control_where = is_null if include else sql.SQL("false")
            if include:
                yield from self._null_cursor_rows(work, is_null)
            return
        below = sql.SQL("{} <= {}").format(col, literal(upper_text, plan))
        # Control totals cover every row up to the bound (what the projection
        # should hold after this read), not only the window read again.
        work.control_where = sql.SQL("({} OR {})").format(below, is_null) if include else below
        work.where = below
        if lower is not None:
            work.where = sql.SQL("{} AND {} > {}").format(below, col, lower)
        order = cursor_order(spec.column, request.key)
        refuse_order(request.dataset, work.by_name, order)
        keys = _Keyset.of(work, order, spec.column)
        exact = self._tie_free(work, order)
        total = yield from keyset_pages(
            lambda after, upto: self._page(work, keys, exact, after, upto),
            order,
            self._options.page_rows,
            request.dataset,
            edge=None if exact else (lambda after: self._edge(work, keys, after)),
        )
        if include:
            yield from self._null_cursor_rows(work, is_null)
        if total:
            # Never move the checkpoint backwards (rows above it may have been deleted).
            work.checkpoint = best if last is not None else work.upper

    def _filled_below(self, work: _Work, col: sql.Identifier, last: sql.Composable) -> bool:
        """Whether a column the lake lacks holds values at or below the checkpoint.

        A column added with a default (or renamed: a new name to the lake)
        gave every existing row a value: a read past the checkpoint alone
        left the rows below it null in the lake, and reconciliation, which
        counts rows, passed. Such a read starts again from the first row.
        """
        new = new_to_lake(self._request, work.by_name)
        if not new:
            return False
        # (``IS NOT NULL`` is false for a composite value holding a null field)
        filled = sql.SQL(" OR ").join(
            sql.SQL("num_nulls({}) = 0").format(sql.Identifier(n)) for n in new
        )
        with self._lock:
            (found,) = self._live().rows(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} <= {} AND ({}))").format(
                    work.relation.ident, col, last, filled
                ),
                "looking for values of new columns below the checkpoint",
            )[0]
        return bool(found)

    def _refuse_null_cursors(self, work: _Work, column: str, is_null: sql.Composable) -> None:
        """Count the NULL cursor values in the snapshot (``nulls: fail``); refuse any."""
        with self._lock:
            (count,) = self._live().rows(
                sql.SQL("SELECT count(*) FROM {} WHERE {}").format(work.relation.ident, is_null),
                "counting null cursor values",
            )[0]
        if count:
            raise null_cursor_error(work.relation.name, column, int(count))

    def _cursor_upper(
        self, work: _Work, col: sql.Identifier, plan: ColumnPlan, last: Any
    ) -> tuple[str | None, str | None]:
        """The cursor's maximum and the greatest of it and ``last``, as the server's text."""
        with self._lock:
            session = self._live()
            # The upper bound is read inside the data's snapshot: rows committed
            # after it are invisible to this read and wait for the next one.
            top = sql.SQL("CAST(max({}) AS text)").format(col)
            greatest = (
                sql.SQL("CAST(GREATEST(max({}), {}) AS text)").format(col, literal(str(last), plan))
                if last is not None
                else sql.SQL("NULL")
            )
            upper_text, best_text = session.rows(
                sql.SQL("SELECT {}, {} FROM {}").format(top, greatest, work.relation.ident),
                "reading the cursor's upper bound",
            )[0]
        return upper_text, best_text

    def _tie_free(self, work: _Work, order: list[str]) -> bool:
        """Whether no two rows tie on ``order`` and pages can end at their ``page_rows``-th row."""
        with self._lock:
            indexes = catalog.indexes(self._live(), [work.relation.oid])
        unique = [
            i.columns
            for i in indexes.get(work.relation.oid, [])
            if i.unique and not i.partial and not i.expressions and i.own_collations
        ]
        # A page's last row is read through the select list: a cast column
        # hands over its cast value (1.003 as 1.00), not the column's, so such
        # pages end at an edge row whose values are read as the column's text.
        casts = self._options.casts
        return not any(c in casts for c in order) and tie_free(
            order, unique, lambda c: c in work.not_null
        )

    def _edge(self, work: _Work, keys: _Keyset, after: list[Any] | None) -> list[Any] | None:
        """The order values of the ``page_rows``-th row after ``after`` (None: fewer remain)."""
        where = [work.where, None if after is None else keys.compare(after, after=True)]
        q = sql.SQL("SELECT {} FROM {}{} ORDER BY {} LIMIT 1 OFFSET {}").format(
            sql.SQL(", ").join(sql.SQL("CAST({} AS text)").format(c) for c in keys.source),
            work.relation.ident,
            _and(where),
            keys.order_sql,
            sql.Literal(self._options.page_rows - 1),
        )
        with self._lock:
            rows = self._live().rows(q, "finding the next page's edge")
        return list(rows[0]) if rows else None

    def _page(
        self,
        work: _Work,
        keys: _Keyset,
        exact: bool,
        after: list[Any] | None,
        upto: list[Any] | None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream the rows after ``after`` and at or before ``upto`` (a full page when exact)."""
        page_where: list[sql.Composable | None] = [work.where]
        if after is not None:
            page_where.append(keys.compare(after, after=True))
        if upto is not None:
            page_where.append(keys.compare(upto, after=False))
        limit = sql.SQL(" LIMIT {}").format(sql.Literal(self._options.page_rows))
        q = sql.SQL("SELECT {} FROM {}{} ORDER BY {}{}").format(
            work.layout.select_list(),
            work.relation.ident,
            _and(page_where),
            keys.order_sql,
            limit if exact else sql.SQL(""),
        )
        return self._stream(q, work.layout)

    def _null_cursor_rows(self, work: _Work, is_null: sql.Composable) -> Iterator[Message]:
        """Every row whose cursor is NULL (``nulls: include``): no checkpoint covers them."""
        q = sql.SQL("SELECT {} FROM {} WHERE {}").format(
            work.layout.select_list(), work.relation.ident, is_null
        )
        for batch in self._stream(q, work.layout):
            yield RecordBatchMessage(self._request.dataset, batch)

    def _lower_bound(self, plan: ColumnPlan, last: Any, lookback: Any) -> sql.Composable:
        """``last`` minus the lookback: rows above it are read again (the key dedups them)."""
        base = literal(str(last) if not isinstance(last, str) else last, plan)
        if lookback is None:
            return base
        check_lookback(plan.name, lookback)
        if plan.temporal:
            step: Any = time_window(lookback)
        else:
            step = numeric_lookback(plan.name, lookback)
        return sql.SQL("({} - {})").format(base, sql.Literal(step))
