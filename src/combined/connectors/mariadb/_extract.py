"""One MariaDB/MySQL read: one consistent-snapshot transaction streamed as Arrow batches.

The first ``next()`` connects, sets ``REPEATABLE READ``, and issues
``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY``: InnoDB fixes the
read view at that statement, so the catalog lookup, a cursor's upper bound,
every row and the control totals are all read from one snapshot. Receipt
boundaries use the server's ``UTC_TIMESTAMP(6)`` (``mariadb:utc_timestamp``):
``acquire`` and ``acquire_snapshot`` take the time read right after the
snapshot was opened, ``complete`` a time read after the last row. The
snapshot token is the server id, the session's connection id and that time,
plus the binary log position MariaDB pins to the snapshot when the binary
log is on (``binlog_snapshot_file``/``_position``).

Rows are read with an unbuffered (server-side streaming) cursor, in chunks
of at most ``batch_rows`` rows whose size adapts so that a batch stays near
``batch_bytes``: memory is bounded by the batch, never by the table.

A whole-relation read takes the bulk path when it can
(:mod:`~combined.connectors.mariadb._arrow_read`): connectorx reads the rows
into Arrow on a connection of its own whose snapshot a brief table read lock
makes equal to this transaction's; without that lock (no grant), when the
bulk read cannot start, or for a view, this transaction reads the rows itself.

An Attempt's deadline or a cancel finishes the read from another thread:
the statement this transaction is blocked in (a view's function sleeping, a
lock it waits for) is ended with ``KILL QUERY`` (:meth:`Session.cancel`)
until the read lets go. connectorx holds the GIL while it waits for a batch,
so no thread of the process could end a bulk statement that does not
return: a view, whose statement may be anything, is read by rows.

A cursor read holds the same lock; with the twin snapshot, connectorx reads
the whole window as one statement (one snapshot's pages partition it),
ordered by the cursor where the key may repeat; the bound, the NULL cursors
and the totals stay here. Without it, the row path pages by keyset as below.

Cursor reads page by keyset over (cursor, key...) inside the snapshot:
``cursor > last - lookback AND cursor <= MAX(cursor)``, the maximum read in
the snapshot before the first page; the checkpoint is that maximum, never
moved below the previous checkpoint. A NULL cursor is in no window: the
cursor's ``nulls`` policy fails the read when the snapshot holds one
(``fail``, the default; not checked for a NOT NULL column), reads them after
the keyset pages and counts them in the control totals (``include``), or
leaves them out (``exclude``). They are tested with ``<=> NULL``, which, unlike
``IS NULL``, no zero date of a NOT NULL column satisfies: a zero date is a
value to the server, the lowest, read by the window (``zero_dates: null``
turns it into NULL in the batch only). Without a unique NOT NULL key among
those columns, rows may tie (NULLs, repeats, collation-equal text, strings
equal in the ``max_sort_length`` bytes ``ORDER BY`` sorts by): a page then
ends at an edge row's values and takes every row tied with it. So does
a read whose zero dates become NULLs: only the server's text of an edge row
says where the next page starts.

Only transactional engines (InnoDB) honour the snapshot. A MyISAM, Aria or
MEMORY table, or a view that reads one, is read as it changes; its receipt
then carries no snapshot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import pyarrow as pa

from combined.connectors._shared import (
    ControlTotals,
    SessionRead,
    cast_key,
    final_state,
    keyset_pages,
    keyset_terms,
    new_to_lake,
    null_cursor_error,
    select_plans,
    tie_free,
)
from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb import _arrow_read as bulk
from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._connect import (
    DRIVER_ERRORS,
    Session,
    Settings,
    close_quietly,
    query_error,
    quote_ident,
)
from combined.connectors.mariadb._read_plan import (
    ReadOptions,
    Work,
    lower_bound,
    refuse_cursor_order,
    server_time,
    where_clause,
)
from combined.connectors.mariadb._types import (
    ColumnPlan,
    Layout,
    SourceColumn,
    from_state,
    state_value,
    typed_value,
    zero_date_key_hint,
)
from combined.errors import (
    CombinedError,
    ConfigError,
    ProtocolViolation,
    SourceError,
    UnsupportedType,
)
from combined.protocol import (
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    StateMessage,
    TerminalOutcome,
)

#: The clock that issues every window timestamp of a MariaDB read.
SERVER_CLOCK = "mariadb:utc_timestamp"
#: The snapshot authority: InnoDB's consistent read view of the transaction.
CONSISTENT_SNAPSHOT = "mariadb:consistent_snapshot"
#: Why a view is read by rows (``bulk_failure``): an abort could not end its bulk statement.
VIEW_BY_ROWS = (
    "a view is read by rows: connectorx holds the GIL while its statement runs, "
    "so neither a deadline nor a cancel could end one that does not return"
)

BEGIN = (
    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
)


class MariaDBExtraction(SessionRead[Session]):
    """A snapshot or cursor read of one relation in one consistent-snapshot transaction.

    Read it once; iterating again, or after :meth:`finish`, raises
    :class:`~combined.errors.ProtocolViolation`. The session is closed before
    the last message (the transaction is read only: nothing awaits the
    outcome), or by :meth:`finish` when the read is abandoned.
    """

    def __init__(self, settings: Settings, request: ReadRequest, options: ReadOptions) -> None:
        super().__init__(ExtractionAuthority(clock_authority=SERVER_CLOCK), close_quietly)
        self._settings = settings
        self._request = request
        self._options = options
        self._batch_rows = min(request.batch_rows, settings.batch_rows or request.batch_rows)
        self._control: ControlTotals | None = None
        #: The relation's columns as the read plans them (by name).
        self._plans: dict[str, ColumnPlan] = {}
        self.connection_id: int | None = None
        #: The binlog position (``file:offset``) and time pinned to the snapshot,
        #: when the snapshot covers the relation (``None`` otherwise).
        self.snapshot_pin: dict[str, str] | None = None
        #: The table's columns as the read found them (a stitched snapshot's checkpoint
        #: records them: :func:`catalog.column_record`).
        self.source_columns: list[SourceColumn] = []
        #: Anchors the binlog position where the server pins none (MySQL):
        #: held while the snapshot opens (``_binlog_anchor.TableLock``).
        self.anchor: Any = None
        #: Whether a whole-relation read may take the bulk path (``_arrow_read``).
        self.bulk = True
        #: How the rows were read: ``bulk`` (into Arrow by connectorx) or ``rows``.
        self.path = "rows"
        #: Why a bulk read that could not start left the rows to the row path.
        self.bulk_failure: str | None = None
        #: Rows too long for the bulk read's packets, read by rows after it.
        self.long_rows = 0
        self._twin: bulk.SnapshotTwin | None = None
        #: The table's last-write marker when asked for (``change_marker``), read
        #: in the snapshot before its rows: the engine folds a capture whose marker
        #: did not move (``runtime._fold``).
        self.change_marker: str | None = None

    @property
    def control_totals(self) -> ControlTotals | None:
        """Counts read in the same snapshot after the last row, when requested."""
        return self._control

    def null_key_hint(self, columns: Sequence[str], *, casts: bool = True) -> str | None:
        """Zero dates of a key column read as NULL (``zero_dates: null``), or None;
        ``casts``: whether the dataset may cast the column to text instead."""
        return zero_date_key_hint(self._plans, columns, self._options.zero_dates, casts=casts)

    # -- lifecycle -----------------------------------------------------------

    # -- reading -------------------------------------------------------------

    def _messages(self) -> Iterator[Message]:
        self._claim()
        request = self._request
        failure: CombinedError | None = None
        try:
            with self._lock:
                work = self._begin()
            if request.strategy == "cursor":
                yield from self._cursor_pages(work)
            else:
                yield from self._whole(work)
            with self._lock:
                final = self._end(work)
        except GeneratorExit:
            self._drop_twin()
            self._abandon(None)
            raise
        except CombinedError as exc:
            self._drop_twin()
            self._abandon(exc)
            raise
        except DRIVER_ERRORS as exc:
            self._drop_twin()
            failure = query_error(exc, self._settings, "reading")
            self._abandon(failure)
        except BaseException as exc:
            self._drop_twin()
            self._abandon(exc)
            raise
        if failure is not None:  # raised outside the handler: no driver exception in context
            raise failure
        yield final

    def _begin(self) -> Work:
        if self._finished:
            raise ProtocolViolation("the extraction is finished", hint="start a new read")
        self._session = session = Session(self._settings)
        anchor = self.anchor
        twin = self._hold_twin(anchor)
        if twin is None and anchor is not None:
            anchor.hold()
        try:
            for statement in BEGIN:
                session.run(statement, "opening the consistent snapshot")
            anchored = anchor.position() if anchor is not None else None
        except BaseException:
            self._drop_twin()
            raise
        finally:
            if twin is None and anchor is not None:
                anchor.release()
        server_id, conn_id, now = session.rows(
            "SELECT @@server_id, CONNECTION_ID(), UTC_TIMESTAMP(6)", "reading the snapshot"
        )[0]
        self.connection_id = int(conn_id)
        at = server_time(now)
        self.authority.acquire(at=at)
        rel = catalog.find_relation(session, self._request.relation, self._settings.database)
        if rel.kind == "view":
            self._by_rows(VIEW_BY_ROWS)
        if self._request.options.get("change_marker") and not self._request.bounds:
            self.change_marker = catalog.change_marker(session, rel)
        if catalog.snapshot_covers(session, rel):
            binlog = dict(
                session.rows("SHOW STATUS LIKE 'binlog_snapshot_%'", "reading the snapshot")
            )
            position = anchored or (
                f"{binlog.get('Binlog_snapshot_file', '')}:"
                f"{binlog.get('Binlog_snapshot_position', '')}"
            )
            token = f"server_id={server_id};connection_id={conn_id};at={now};binlog={position}"
            self.snapshot_pin = {"binlog": position, "at": at.isoformat()}
            self.authority.acquire_snapshot(CONSISTENT_SNAPSHOT, token, at=at)
        return self._prepare(session, rel)

    def _hold_twin(self, anchor: Any) -> bulk.SnapshotTwin | None:
        """Lock the table for the bulk path's twin snapshot; ``None``: the row path reads."""
        request = self._request
        if not (
            self.bulk
            and request.strategy in ("snapshot", "cursor")
            and bulk.available(self._settings)
        ):
            return None
        twin = bulk.SnapshotTwin(self._settings, request.relation, anchor)
        self._twin = twin if twin.hold() else None
        self.bulk_failure = twin.refusal
        return self._twin

    def _by_rows(self, reason: str) -> None:
        """Leave the rows to this transaction (the row path), ``reason`` saying why."""
        if self._twin is not None:
            self.bulk_failure = reason
            self._drop_twin()

    def _cancel_statement(self, session: Session) -> None:
        session.cancel()

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        self._drop_twin()  # a read cancelled while the bulk read starts lets the table go
        return super()._release(outcome)

    def _drop_twin(self) -> None:
        twin, self._twin = self._twin, None
        if twin is not None:
            twin.release()

    def _whole(self, work: Work) -> Iterator[Message]:
        """Every row of the relation: in bulk when the twin snapshot is held, else by rows."""
        request = self._request
        where = where_clause([work.where])
        started = self._bulk_start(work, where)
        if started is None:
            q = f"SELECT {work.layout.select_list()} FROM {work.relation.ident}{where}"
            batches = self._stream(q, work.layout)
        else:
            batches = self._bulk_batches(work, started)
        for batch in batches:
            yield RecordBatchMessage(request.dataset, batch)

    def _bulk_start(self, work: Work, where: str, order: str = "") -> bulk.Started | None:
        """Start reading the rows ``where`` holds in the twin snapshot; ``None``: the row path.

        ``order`` (SQL expressions) orders them. A bulk read that cannot
        start hands over nothing (``bulk_failure`` says why): this
        transaction's snapshot then reads the rows itself.
        """
        twin = self._twin
        if twin is None:
            return None
        rel = work.relation
        budget = self._options.batch_bytes
        with self._lock:
            size = bulk.sizing(self._live(), rel, work.layout, self._batch_rows, budget)
        fit, reason = size.fit, None
        if size.long_rows(budget):
            reason = f"rows of megabytes ({size.sampled} bytes): read by rows"
        elif fit is not None and order:  # (read after the others, long rows break the order)
            reason = "a row may be too long for an ordered bulk read"
        if reason is not None:
            self._by_rows(reason)
            return None
        listed = bulk.select_list(work.layout, named=not order, fit=fit)
        q = f"SELECT {listed} FROM {rel.ident}{where}{f' ORDER BY {order}' if order else ''}"
        try:
            started = bulk.start(self._settings, q, size.rows, twin)
        except CombinedError as exc:
            self.bulk_failure = exc.message
            self._twin = None
            return None
        started.fit = fit
        self.path = "bulk"
        return started

    def _bulk_batches(self, work: Work, started: bulk.Started) -> Iterator[pa.RecordBatch]:
        """The bulk read's batches, then the rows too long for it read by rows.

        An empty batch is not handed over (as on the row path).
        """
        dataset = self._request.dataset
        for batch in bulk.converted(self._settings, started, work.layout, dataset):
            self._live()  # a cancelled or finished read stops here, between batches
            if not batch.num_rows:
                continue
            self.authority.count(batch.num_rows, batch.nbytes)
            yield batch
        if started.skipped:
            yield from self._long_rows(work, started)

    def _long_rows(self, work: Work, started: bulk.Started) -> Iterator[pa.RecordBatch]:
        """The rows the bulk read left out as too long, read by rows in the same snapshot."""
        assert started.fit is not None
        where = where_clause([work.where, f"NOT {started.fit.test}"])
        q = f"SELECT {work.layout.select_list()} FROM {work.relation.ident}{where}"
        read = 0
        for batch in self._stream(q, work.layout):
            read += batch.num_rows
            yield batch
        self.long_rows = read
        if read != started.skipped:  # the twin snapshot was not this one's
            raise SourceError(
                f"the bulk read left out {started.skipped} rows of {work.relation.table!r} as "
                f"too long, and its snapshot holds {read}: the snapshots differ",
                hint="retry the capture; report it if it happens again",
            )

    def _prepare(self, session: Session, rel: catalog.Relation) -> Work:
        request = self._request
        cols = catalog.columns(session, rel.database, [rel.table]).get(rel.table, [])
        self.source_columns = cols
        plans = catalog.column_plans(cols, self._options.casts, rel.table)
        by_name, selected = select_plans(plans, request, rel.table, noun="table")
        for p in selected:
            if p.arrow_type is None:
                raise UnsupportedType(
                    f"column {p.name!r} of {rel.table!r} has type {p.source_type}: {p.reason}",
                    hint=f'declare casts: {{{cast_key(rel.table, p.name, "`")}: "text"}} in '
                    "the source configuration to read its text form",
                    relation=rel.table,
                    column=p.name,
                    source_type=p.source_type,
                )
        self._plans = by_name
        return Work(rel, Layout.of(selected, self._options.zero_dates), by_name)

    def _stream(self, query: str, layout: Layout) -> Iterator[pa.RecordBatch]:
        """Stream ``query`` as batches of at most ``batch_rows`` rows, near ``batch_bytes``."""
        limit, budget, wide = self._batch_rows, self._options.batch_bytes, layout.wide
        chunk = min(limit, 1_000)  # a first small chunk measures the row width
        with self._lock:
            self._live().stream(query, "starting the read")
        while True:
            with self._lock:
                session = self._live()
                # Long values are weighed as they arrive: a chunk of rows the
                # last one's width allowed may hold a few of many megabytes.
                rows, ended = session.fetch(chunk, wide, budget)
                if not rows:
                    session.end_stream()
                    return
                batch = layout.convert(rows, self._request.dataset)
            self._live()  # nothing is handed over after a terminal outcome
            self.authority.count(batch.num_rows, batch.nbytes)
            yield batch
            if ended:
                with self._lock:
                    self._live().end_stream()
                return
            per_row = max(1, batch.nbytes // max(1, batch.num_rows))
            chunk = max(1, min(limit, self._options.batch_bytes // per_row))

    def _end(self, work: Work) -> StateMessage:
        session = self._live()
        (now,) = session.rows("SELECT UTC_TIMESTAMP(6)", "closing the read window")[0]
        self.authority.complete(at=server_time(now))
        control = self._options.control_totals
        if control is not False:
            self._control = self._count(
                session, work, control if isinstance(control, str) else None
            )
        self._commit_and_close(session)
        request = self._request
        return final_state(
            request, work.checkpoint, state_value, cursor=request.strategy == "cursor"
        )

    def _count(self, session: Session, work: Work, column: str | None) -> ControlTotals:
        if column is not None and column not in work.by_name:
            raise ConfigError(
                f"control_totals names column {column!r}, which the table does not have",
                hint="name a numeric column",
            )
        total = f"CAST(SUM({quote_ident(column)}) AS CHAR)" if column else "NULL"
        where = where_clause([work.control_where])
        q = f"SELECT COUNT(*), {total} FROM {work.relation.ident}{where}"
        rows, summed = session.rows(q, "reading control totals")[0]
        return ControlTotals(int(rows), column, summed)

    # -- cursor strategy -----------------------------------------------------

    def _cursor_pages(self, work: Work) -> Iterator[Message]:
        """The rows in the cursor's window, then (``nulls: include``) those with no cursor."""
        spec = self._request.cursor
        assert spec is not None
        plan = work.by_name[spec.column]
        order = refuse_cursor_order(
            self._request.dataset, work.by_name, spec.column, self._request.key
        )
        absent = [c for c in order if c not in work.layout.schema.names]
        if absent:
            raise ConfigError(
                f"the read must select column {absent[0]!r}: it orders the cursor's pages",
                hint="add it to the dataset's columns",
                column=absent[0],
            )
        # No window reaches a NULL cursor; a NOT NULL column holds none to count or read.
        is_null = f"{quote_ident(spec.column)} <=> NULL"
        nulls = spec.nulls if plan.nullable else "exclude"
        include = nulls == "include"
        last_raw = (self._request.state or {}).get("cursor")
        last = None if last_raw is None else from_state(last_raw, plan)
        if last is not None and self._filled_below(work, plan, last):
            last = None  # read from the start: the rows below the checkpoint changed too
        upper = self._window(work, plan, last, is_null if include else None)
        started = None if upper is None else self._bulk_window(work, plan)
        self._drop_twin()  # the bulk read started (or never will): writers go on
        try:
            if nulls == "fail":
                self._refuse_null_cursors(work, spec.column, is_null)
        except BaseException:
            if started is not None:
                with contextlib.suppress(Exception):
                    started.reader.close()  # an abandoned bulk read ends its connection
            raise
        total = 0
        if started is not None:
            for batch in self._bulk_batches(work, started):
                total += batch.num_rows
                yield RecordBatchMessage(self._request.dataset, batch)
        elif upper is not None:
            total = yield from self._keyset_pages(work, order)
        if include:
            yield from self._null_cursor_rows(work, is_null)
        if total:
            # Never move the checkpoint backwards (rows above it may have been deleted).
            work.checkpoint = upper if last is None or upper >= last else last

    def _bulk_window(self, work: Work, plan: ColumnPlan) -> bulk.Started | None:
        """Start the window's bulk read in the twin snapshot; ``None``: the pages read it.

        One statement reads the window: one snapshot's keyset pages partition
        it. Where the declared key may repeat, the cursor orders it (the last
        row of a key wins, as on the pages); else it is not ordered, so that
        no server sort delays the first batch, which the twin's lock awaits.
        """
        if self._twin is None:
            return None
        casts = self._options.casts
        keys = self._unique_keys(work)
        repeats = not tie_free(self._request.key, keys, lambda c: c not in casts)
        return self._bulk_start(
            work, where_clause([work.where]), self._ordered(plan) if repeats else ""
        )

    @property
    def _lookback(self) -> Any:
        spec = self._request.cursor
        return None if spec is None else spec.lookback

    def _filled_below(self, work: Work, plan: ColumnPlan, last: Any) -> bool:
        """Whether a column new to the lake holds values at or below ``last`` (see new_to_lake)."""
        new = new_to_lake(self._request, work.by_name)
        if not new:
            return False
        session = self._live()
        filled = " OR ".join(f"{quote_ident(n)} IS NOT NULL" for n in new)
        with self._lock:
            (found,) = session.rows(
                f"SELECT EXISTS (SELECT 1 FROM {work.relation.ident} WHERE "
                f"{quote_ident(plan.name)} <= {session.literal(last)} AND ({filled}))",
                "looking for values of new columns below the checkpoint",
            )[0]
        return bool(found)

    def _refuse_null_cursors(self, work: Work, column: str, is_null: str) -> None:
        """``nulls: fail``: fail the read when the snapshot holds a NULL cursor."""
        with self._lock:
            (count,) = self._live().rows(
                f"SELECT COUNT(*) FROM {work.relation.ident} WHERE {is_null}",
                "counting null cursor values",
            )[0]
        if int(count):
            raise null_cursor_error(work.relation.table, column, int(count))

    def _window(self, work: Work, plan: ColumnPlan, last: Any, nulls: str | None) -> Any:
        """Read the cursor's upper bound; set the window over ``last`` and the totals' filter.

        Returns the bound (``None``: no row has a cursor). ``nulls`` is the
        NULL test of included NULL cursors, which the control totals count.
        """
        session = self._live()
        with self._lock:
            # The upper bound is read inside the data's snapshot: rows committed
            # after it are invisible to this read and wait for the next one.
            (top,) = session.rows(
                f"SELECT MAX({plan.expr}) FROM {work.relation.ident}",
                "reading the cursor's upper bound",
            )[0]
        upper = typed_value(top, plan)
        if upper is None:
            work.control_where = nulls or "FALSE"
            return None
        col = quote_ident(plan.name)
        below = f"{col} <= {session.literal(upper)}"
        # Control totals cover every row up to the bound (what the projection
        # should hold after this read), not only the window read again.
        work.control_where = f"({below} OR {nulls})" if nulls else below
        work.where = below
        if last is not None:
            lower = lower_bound(plan, last, self._lookback)
            work.where = f"{below} AND {col} > {session.literal(lower)}"
        return upper

    def _keyset_pages(self, work: Work, order: list[str]) -> Generator[Message, None, int]:
        """The window on the row path, by keyset pages of ``page_rows``; returns the row count."""
        # Pages are ordered and compared on one expression per column: ORDER
        # BY a bare name would sort by the select list's column of that name.
        exprs = [self._ordered(work.by_name[c]) for c in order]
        exact = self._tie_free(work, order, exprs, self._unique_keys(work))
        return (
            yield from keyset_pages(
                lambda after, upto: self._page(work, exprs, after, upto, exact=exact),
                order,
                self._options.page_rows,
                self._request.dataset,
                edge=None if exact else lambda after: self._edge(work, order, exprs, after),
            )
        )

    def _unique_keys(self, work: Work) -> list[tuple[str, ...]]:
        """The relation's unique keys over NOT NULL columns, its primary key among them."""
        rel = work.relation
        with self._lock:
            indexes = catalog.indexes(self._live(), rel.database, [rel.table])
        primary, unique = catalog.keys(indexes.get(rel.table, []), list(work.by_name.values()))
        return [primary, *unique]

    def _tie_free(
        self, work: Work, order: list[str], exprs: list[str], keys: list[tuple[str, ...]]
    ) -> bool:
        """Whether each page may be the next ``page_rows`` rows (else pages end at edge rows)."""
        with self._lock:
            ((sort_bytes,),) = self._live().rows(
                "SELECT @@max_sort_length", "reading the sort limit"
            )
        # A zero date read as NULL (zero_dates: null) cannot start the next
        # page: only an edge row's own text can. ORDER BY sorts a string by
        # its first max_sort_length bytes while a comparison reads it whole:
        # a page's last row is its largest only if no value is longer.
        zero_nulls = self._options.zero_dates == "null" and any(
            work.by_name[c].temporal for c in order
        )
        sorted_whole = all(
            (n := work.by_name[c].octets) is None or n <= int(sort_bytes) for c in order
        )
        return (
            sorted_whole
            and not zero_nulls
            and tie_free(order, keys, lambda c: exprs[order.index(c)] == quote_ident(c))
        )

    def _keyset(self, exprs: list[str], values: list[Any], *, after: bool) -> str:
        """The rows after (or at and before) ``values`` in the pages' order, as SQL."""
        # ORDER BY's ascending order puts NULLs first. NULL tests are spelled
        # `<=> NULL`: in a WHERE clause `d IS NULL` also holds for a zero
        # date in a NOT NULL DATE or DATETIME column.
        terms = keyset_terms(values, after=after, nulls_first=True)
        if not terms:
            return "FALSE"
        literal = self._live().literal

        def test(i: int, op: str, value: Any) -> str:
            if value is not None:
                return f"{exprs[i]} {op} {literal(value)}"
            return f"{exprs[i]} <=> NULL" if op == "is null" else f"NOT ({exprs[i]} <=> NULL)"

        ors = ["(" + " AND ".join(test(*t) for t in term) + ")" for term in terms]
        return "(" + " OR ".join(ors) + ")"

    def _edge(
        self, work: Work, order: list[str], exprs: list[str], after: list[Any] | None
    ) -> list[Any] | None:
        """The ``order`` values of the ``page_rows``-th row after ``after`` (None: fewer left)."""
        # The edge's values as text that compares exactly: a FLOAT through
        # DOUBLE (its own text has 6 digits), BIT and BOOL as numbers.
        edge_sql = ", ".join(
            work.by_name[c].expr
            if e == quote_ident(c) and work.by_name[c].kind in ("float", "bits", "bool")
            else e
            for c, e in zip(order, exprs, strict=True)
        )
        where = [work.where, None if after is None else self._keyset(exprs, after, after=True)]
        q = (
            f"SELECT {edge_sql} FROM {work.relation.ident}{where_clause(where)}"
            f" ORDER BY {', '.join(exprs)} LIMIT 1 OFFSET {int(self._options.page_rows) - 1}"
        )
        with self._lock:
            rows = self._live().rows(q, "finding the next page's edge")
        return list(rows[0]) if rows else None

    def _page(
        self,
        work: Work,
        exprs: list[str],
        after: list[Any] | None,
        upto: list[Any] | None,
        *,
        exact: bool,
    ) -> Iterator[pa.RecordBatch]:
        """The rows after ``after`` up to ``upto`` (or the next ``page_rows`` when ``exact``)."""
        where = [
            work.where,
            None if after is None else self._keyset(exprs, after, after=True),
            None if upto is None else self._keyset(exprs, upto, after=False),
        ]
        limit = f" LIMIT {int(self._options.page_rows)}" if exact else ""
        q = (
            f"SELECT {work.layout.select_list()} FROM {work.relation.ident}"
            f"{where_clause(where)} ORDER BY {', '.join(exprs)}{limit}"
        )
        return self._stream(q, work.layout)

    def _null_cursor_rows(self, work: Work, is_null: str) -> Iterator[Message]:
        """Every row whose cursor is NULL (``nulls: include``): no checkpoint covers them."""
        q = f"SELECT {work.layout.select_list()} FROM {work.relation.ident} WHERE {is_null}"
        for batch in self._stream(q, work.layout):
            yield RecordBatchMessage(self._request.dataset, batch)

    def _ordered(self, plan: ColumnPlan) -> str:
        """The expression that orders and compares ``plan``'s column in keyset pages.

        A column read as text is ordered as that text (its values come back
        as text), an ENUM or SET as its text (``ORDER BY`` would sort it by
        member number while a comparison with text compares text), every
        other column as itself, so that indexes serve it.
        """
        if plan.name in self._options.casts:
            return plan.expr
        if plan.source_type.lower().startswith(("enum", "set")):
            return f"CAST({quote_ident(plan.name)} AS CHAR)"
        return quote_ident(plan.name)
