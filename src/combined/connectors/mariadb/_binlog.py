"""MariaDB/MySQL change capture: the row-based binary log streamed into change batches.

:class:`BinlogExtraction` streams the binlog with ``mysql-replication``
(``COM_BINLOG_DUMP`` from a file and offset) from the committed position up
to the end of the log when the read starts, and yields, in log order,
change batches (:mod:`~._binlog_rows`) and, after a batch, at the end of the
next committed transaction that touched the table, a ``StateMessage`` whose
state is the checkpoint:

``{"binlog": "<file>:<offset>", "at": "<time of its last event>", "columns": {...}}``

(``columns``: the table's columns as the read planned them, and ``gone``
those it no longer has, kept while a change logged before their drop may
still come: :meth:`BinlogExtraction._vanished`.)

``binlog`` is the end of the last transaction whose changes were yielded
before the message: resuming there replays nothing the lake holds and
skips nothing it lacks. The engine commits the state with the lake commit
of the rows before it; rows after the last state belong to a transaction
whose end was not read yet (a large transaction is yielded as it streams,
in batches, so memory stays bounded) and are never committed without a
state covering them. Small transactions share a batch: at a transaction's
end its rows are flushed (and the state follows) only once the pending rows
reach half a batch (:attr:`~._binlog_rows.ChangeRows.due`) or a batch went
out since the last state; else the next transactions' rows join them (a
backlog of single-row transactions was a batch and a state a change: ~2k
changes per CPU-second). A read never ends inside a transaction, and its
last message is a ``final`` state at the last transaction boundary read.

Nothing on the server remembers a consumer: the position lives only in the
lake's checkpoint, so :meth:`acknowledge` has nothing to confirm, and the
server's binlog retention alone decides how long a consumer may stay away
(``combined cdc status``). A position the server purged fails the read
(:class:`~._binlog_setup.BinlogGone`), never skipped.

Statements in the log that touch the table:

- ``TRUNCATE`` is a ``truncate`` marker batch: every row of the dataset
  committed before it is removed;
- ``DROP TABLE``, ``RENAME TABLE`` or ``CREATE OR REPLACE TABLE`` naming it
  (or ``DROP DATABASE`` of its database),
  or an ``ALTER TABLE`` that renames it or truncates, drops, exchanges or
  converts a partition (or discards or imports a tablespace), stops the
  read: rows left or moved without a row event. A read that yielded changes
  ends before the statement (they are committed, and the next read starts
  at it); one that did not fails (:class:`~._binlog_ddl.TableMoved`, a
  :class:`~combined.errors.NeedsSnapshot`: the Run ends ``needs_review``
  until a person takes a new snapshot).
  Statements are read without their comments (:mod:`~._binlog_ddl`);
- ``ALTER TABLE`` goes by: the row images name their columns, and the
  engine's drift rules judge the columns the capture saw; one that adds a
  column giving the rows present a value, or under a name an ALTER read
  before took away or the lake holds (a new column, not the dropped one), is
  followed by those rows' values, read from the source
  (:mod:`~._binlog_fill`), and the read goes on past that read's binlog
  position before it ends. So is, where the read would end, a column the
  catalog showed at its start that the lake lacks and no ``ALTER`` read
  added (a column grant widened);
- a data-changing statement logged as a statement (``binlog_format`` other
  than ROW in the writing session) fails the read: it names no rows.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from combined.connectors._shared import SessionRead, cdc_values
from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._binlog_charsets import learn_charsets, library_charsets
from combined.connectors.mariadb._binlog_ddl import TableMoved, touching
from combined.connectors.mariadb._binlog_decode import (
    RowDecoder,
    event_body,
    library_labels,
    row_decoder,
)
from combined.connectors.mariadb._binlog_fill import (
    Added,
    ColumnFill,
    added_columns,
    appeared_columns,
    left_columns,
)
from combined.connectors.mariadb._binlog_origin import (
    LogIdentity,
    created_differs,
    origin,
    require_resumable,
    require_same_log,
)
from combined.connectors.mariadb._binlog_rows import (
    OP_TRUNCATE,
    PREPARED_XA,
    ChangeRows,
    CompressedQuery,
    compressed_query,
    event_time,
    refuse_compressed,
    refuse_prepared_xa,
    require_full_image,
)
from combined.connectors.mariadb._binlog_setup import (
    RESNAPSHOT,
    BinlogGone,
    acknowledged,
    binlog_status,
    parse_position,
    require_binlog,
    require_logged_table,
)
from combined.connectors.mariadb._connect import (
    DRIVER_ERRORS,
    DriverConnection,
    Session,
    Settings,
    close_quietly,
    error_code,
    next_event,
    query_error,
    stream_connection,
)
from combined.connectors.mariadb._types import (
    ColumnPlan,
    SourceColumn,
    holds,
    zero_date_key_hint,
)
from combined.errors import (
    CombinedError,
    NeedsSnapshot,
    NotFoundError,
    SourceError,
    SourceUnavailable,
)
from combined.protocol import (
    OP_COLUMN,
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    StateMessage,
)

_log = logging.getLogger(__name__)

#: Server errors of a dump request whose start the server no longer holds.
_PURGED_CODES = {1236}
#: What :meth:`BinlogExtraction._events` yields at the log's end while columns wait a fill.
_AT_END = object()


class BinlogExtraction(SessionRead[Session]):
    """Stream a table's changes from ``start`` (the committed position) to the log's end.

    ``max_changes`` ends the read at the first transaction boundary after that
    many rows. Rows are decoded from the events' bytes (:mod:`~._binlog_decode`);
    ``library_rows`` decodes every event with ``mysql-replication`` instead
    (as for a table map that module does not read). ``server_id`` identifies
    the stream to the server as a replica; it must differ from every other
    replica's (a random one by default).
    """

    def __init__(
        self,
        settings: Settings,
        request: ReadRequest,
        *,
        start: tuple[str, int],
        max_changes: int | None = None,
        batch_bytes: int = 16 << 20,
        server_id: int | None = None,
        library_rows: bool = False,
    ) -> None:
        super().__init__(ExtractionAuthority(), close_quietly)
        self._settings = settings
        self._request = request
        self._file, self._offset = start
        self._max_changes = max_changes
        self._batch_bytes = batch_bytes
        self._server_id = server_id or random.randint(1 << 20, (1 << 31) - 1)
        self._stream: Any = None
        self._seen = 0
        #: Whether a batch went out that no state followed yet (:meth:`_read` then
        #: states the next transaction end it reads).
        self._uncovered = False
        #: Whether the read met a TRUNCATE of the table: a change, as rows are (``_seen``),
        #: that a DROP after it is stopped before.
        self._truncated = False
        self._library_rows = library_rows
        #: Rows events decoded by ``mysql-replication`` (the rest: from their bytes).
        self.library_events = 0
        #: Table maps of the table the read parsed (the library's, each kept while its id holds).
        self.table_maps = 0
        self._decoders: dict[str, RowDecoder | None] = {}
        self._table: Any = None
        self._current: RowDecoder | None = None
        self._learned: Any = None  # the last table map whose charsets were learned
        self._filler = ColumnFill(settings, request)
        #: The checkpoint's record of the table's columns (:func:`catalog.column_record`),
        #: and of those the table no longer has, the log's end when that was seen.
        self._columns: dict[str, list[object]] = {}
        self._gone: dict[str, str] = {}
        self._wider: dict[str, str] = {}
        #: Names the ALTERs read so far took away (dropped, renamed): one added again is new.
        self._left: set[str] = set()
        #: Columns the catalog shows at the start that the lake lacks (filled at the read's
        #: end unless an ALTER the read met added them: ``_altered``).
        self._appeared: Added | None = None
        self._altered: set[str] = set()
        #: The checkpoint's log (:mod:`~._binlog_origin`): the files' first GTIDs, asked once
        #: a file, and the GTID of the last transaction read before the position.
        self._identity: LogIdentity | None = None
        self._boundary_gtid: tuple[str, int] | None = None
        self._created: dict[str, int] = {}
        #: Columns filled in this read, and their nulls counted at its end with the
        #: count's binlog position (``{}``: no count, or one the read raced past).
        self._filled: list[str] = []
        self._count: tuple[dict[str, int], tuple[str, int]] | None = None
        #: Per dataset, the source's nulls in each filled column, counted in a
        #: snapshot holding the transactions the lake's commit holds.
        self.filled_nulls: dict[str, dict[str, int]] = {}
        self._plans: dict[str, ColumnPlan] = {}
        #: The table is gone at the read's start: the read fails unless it meets the
        #: statement that took it (a DROP, a RENAME) after changes it commits.
        self._gone_table: NeedsSnapshot | None = None

    def null_key_hint(self, columns: Sequence[str]) -> str | None:
        """Zero dates of a key column read as NULL (``zero_dates: null``), or None."""
        return zero_date_key_hint(self._plans, columns, self._settings.zero_dates, casts=False)

    def _messages(self) -> Iterator[Message]:
        self._claim()
        failure: CombinedError | None = None
        try:
            yield from cdc_values(self._read())
        except GeneratorExit:
            self._abandon(None)
            raise
        except CombinedError as exc:
            self._abandon(exc)
            raise
        except DRIVER_ERRORS as exc:
            failure = self._failure(exc)
            self._abandon(failure)
        if failure is not None:  # raised outside the handler: no driver exception in context
            raise failure

    def _failure(self, exc: BaseException) -> CombinedError:
        if error_code(exc) in _PURGED_CODES:
            return BinlogGone(
                f"the server cannot stream the binary log from {self._file}:{self._offset} for "
                f"dataset {self._request.dataset}: {self._settings.scrub(str(exc))[:300]}",
                hint=f"take a new snapshot: {RESNAPSHOT}",
                dataset=self._request.dataset,
            )
        return query_error(exc, self._settings, "streaming the binary log")

    def _open(self) -> tuple[catalog.Relation, ChangeRows]:
        self._session = session = Session(self._settings)
        request = self._request
        try:
            rel = catalog.find_relation(session, request.relation, self._settings.database)
        except NotFoundError as exc:
            self._gone_table = NeedsSnapshot(
                f"{exc.message}: the table of cdc dataset {request.dataset} was dropped or "
                "renamed since the last capture, and its changes cannot be followed (or the "
                "account lost its privileges on it: MariaDB hides such a table)",
                hint="if the account lost its privileges, grant them back and capture again; "
                f"else, once the table exists again, take a new snapshot: {RESNAPSHOT}",
                dataset=request.dataset,
            )
            if not catalog.recorded_columns(request.state):
                raise self._gone_table from None
            # read with the columns the checkpoint recorded, up to the DROP or RENAME
            db, table = catalog.parse_relation(request.relation, self._settings.database)
            rel = catalog.Relation(db, table, "table", None, None)
        require_binlog(session, f"{rel.database}.{rel.table}")
        if self._gone_table is None:
            require_logged_table(session, rel.database, rel.table)
        ds = request.dataset
        start = (self._file, self._offset)
        self._identity = require_resumable(
            session, start, request.state, f"dataset {ds}", dataset=ds
        )
        now = self._catalog_columns(session, rel)
        gone = self._vanished(session, now)
        now = self._narrowed(session, now, rel)
        plans, vanished = self._column_plans([*now, *gone], rel), {c.name for c in gone}
        self._plans = {p.name: p for p in plans}
        self._appeared = appeared_columns(
            request, [p.name for p in plans if p.name not in vanished]
        )
        rows = ChangeRows(
            plans,
            request.dataset,
            vanished=vanished,
            key=request.key,
            batch_rows=request.batch_rows,
            batch_bytes=self._batch_bytes,
            zero_dates=self._settings.zero_dates,
        )
        return rel, rows

    def _catalog_columns(self, session: Session, rel: catalog.Relation) -> list[SourceColumn]:
        """The table's columns as the catalog holds them now (kept for the checkpoint)."""
        cols = catalog.columns(session, rel.database, [rel.table]).get(rel.table, [])
        self._columns.update(catalog.column_record(cols))
        return cols

    def _vanished(self, session: Session, now: Sequence[SourceColumn]) -> list[SourceColumn]:
        """Columns the checkpoint recorded that the table no longer has, whose drop the
        read may still meet: a change logged before it names them with their values.

        Each is kept, with the log's end when the read first found it gone, until
        a read starts past that position (the drop is behind it).
        """
        names = {c.name for c in now}
        gone = [c for c in catalog.recorded_columns(self._request.state) if c.name not in names]
        kept, self._gone = self._kept(session, gone, "gone")
        return kept

    def _narrowed(
        self, session: Session, now: list[SourceColumn], rel: catalog.Relation
    ) -> list[SourceColumn]:
        """``now``, a column an ``ALTER TABLE ... MODIFY`` narrowed (INT to TINYINT) as the
        checkpoint recorded it while the read may still meet it logged wider: a value
        logged before (300) did not fit the new type, and every capture stopped there
        (found by a MariaDB review). Kept as :meth:`_vanished` keeps a dropped one."""
        recorded = {c.name: c for c in catalog.recorded_columns(self._request.state)}
        wider = []
        for c in now:
            was = recorded.get(c.name)
            if was is not None and was.column_type != c.column_type:
                (old, new) = catalog.column_plans([was, c], table=rel.table)
                if holds(old.arrow_type, new.arrow_type):
                    wider.append(was)
        kept, self._wider = self._kept(session, wider, "narrowed")
        by_name = {c.name: c for c in kept}
        return [by_name.get(c.name, c) for c in now]

    def _kept(
        self, session: Session, columns: list[SourceColumn], key: str
    ) -> tuple[list[SourceColumn], dict[str, str]]:
        """Of ``columns`` as the checkpoint recorded them, those the read may still meet so:
        each kept, with the log's end when a read first found it changed (``key`` of the
        checkpoint), until a read starts past that position (the change is behind it)."""
        if not columns:
            return [], {}
        was = dict((self._request.state or {}).get(key) or {})
        end = None
        for c in columns:
            if c.name not in was:
                end = end or ":".join(str(v) for v in binlog_status(session)[0][:2])
                was[c.name] = end
        start = (self._file, self._offset)
        kept = [c for c in columns if parse_position(str(was[c.name])) > start]
        self._columns.update(catalog.column_record(kept))
        return kept, {c.name: str(was[c.name]) for c in kept}

    def _column_plans(
        self, cols: Sequence[SourceColumn], rel: catalog.Relation
    ) -> list[ColumnPlan]:
        """The plans of ``cols`` (of ``rel``) that the dataset captures."""
        request = self._request
        plans = [p for p in catalog.column_plans(cols, table=rel.table) if p.arrow_type is not None]
        if request.columns is not None:
            plans = [p for p in plans if p.name in request.columns or p.name in request.key]
        return plans

    def _reader(self, rel: catalog.Relation) -> Any:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            FormatDescriptionEvent,
            GtidEvent,
            MariadbGtidEvent,
            NotImplementedEvent,
            QueryEvent,
            RotateEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        return BinLogStreamReader(
            connection_settings=stream_connection(self._settings),
            server_id=self._server_id,
            log_file=self._file,
            log_pos=self._offset,
            resume_stream=True,
            blocking=False,
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                QueryEvent,
                XidEvent,
                RotateEvent,
                FormatDescriptionEvent,
                GtidEvent,
                MariadbGtidEvent,
                NotImplementedEvent,  # a compressed event among them: refused, never skipped
            ],
            filter_non_implemented_events=False,
            only_schemas=[rel.database],
            only_tables=[rel.table],
            enable_logging=False,
            # A table map of an id the read knows is not parsed again (half the read of
            # single-row transactions): a table's definition gets a new id at any change.
            # Forgotten at each file's start (a restart numbers anew) and statement (DDL).
            freeze_schema=True,
            pymysql_wrapper=DriverConnection,  # (its TLS context made once)
        )

    def _read(self) -> Iterator[Message]:
        from pymysqlreplication.event import (
            FormatDescriptionEvent,
            GtidEvent,
            MariadbGtidEvent,
            NotImplementedEvent,
            QueryEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        with self._lock:
            rel, rows = self._open()
        self.authority.acquire()
        name = f"{rel.database}.{rel.table}"
        boundary = f"{self._file}:{self._offset}"
        at: datetime | None = None
        gtid: tuple[str, int] | None = None  # (of the transaction being read, its event's start)
        touched = in_txn = xa = False
        self._stream = stream = self._reader(rel)
        try:
            for event in self._events(stream, name):
                self._still_reading(stream, name, boundary)
                if event is _AT_END:  # (between transactions, unless the log is cut)
                    if not in_txn:
                        touched = (yield from self._fill_appeared(rows, rel, boundary)) or touched
                    continue
                here = f"{stream.log_file}:{stream.log_pos}"
                when = event_time(event.timestamp)
                event = compressed_query(event) or event  # (a statement, decompressed)
                if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                    if event.schema != rel.database or event.table != rel.table:
                        continue
                    require_full_image(event, name)
                    if xa:
                        refuse_prepared_xa(name, here)
                    touched = True
                    for batches in self._rows(event, rows, when, here):
                        yield from self._emit(batches)
                    continue
                if isinstance(event, FormatDescriptionEvent):  # (a file's first event)
                    self._file_created(str(stream.log_file), int(event.timestamp or 0))
                    stream.table_map = {}  # (a new file may be a new server run: ids anew)
                    continue
                if isinstance(event, MariadbGtidEvent):
                    in_txn = not (int(event.flags) & 1)  # FL_STANDALONE: one event, no COMMIT
                    gtid = (str(event.gtid), int(event.packet.log_pos - event.packet.event_size))
                    xa = bool(int(event.flags) & PREPARED_XA)
                    continue
                if isinstance(event, NotImplementedEvent | GtidEvent):
                    xa = xa and not isinstance(event, GtidEvent)
                    gtid = None if isinstance(event, GtidEvent) else gtid
                    refuse_compressed(event, (rel.database, rel.table), name, here)  # (no GTID is)
                    continue
                end = isinstance(event, XidEvent)
                if isinstance(event, QueryEvent | CompressedQuery):
                    try:
                        verb, marker = self._query(event, rel, rows, when, here)
                    except TableMoved as exc:
                        if in_txn or not (self._seen or self._truncated) or self._filled:
                            raise
                        _log.warning("%s: stopped before it at %s", exc.message, boundary)
                        self._gone_table = None
                        break  # the changes before it are committed; the next read fails
                    if verb == "BEGIN" or verb.startswith("XA START"):  # (MySQL's XA)
                        in_txn = True
                        xa = verb != "BEGIN"
                        continue
                    end = verb in ("COMMIT", "ROLLBACK") or not in_txn
                    if isinstance(marker, Added):
                        touched = (yield from self._fill(marker, rows, rel, when, here)) or touched
                        marker = []
                    touched = touched or bool(marker)
                    yield from self._emit(marker)
                if not end:
                    continue
                in_txn = False
                boundary, at, self._boundary_gtid = here, when, gtid
                if touched:
                    touched = False
                    self._note_race(stream)
                    if rows.due or self._uncovered:  # (else its rows wait for the next ones)
                        yield from self._emit(rows.flush())
                        yield self._state(boundary, at, final=False)
                if self._max_changes and self._seen >= self._max_changes:
                    touched = (yield from self._fill_appeared(rows, rel, boundary)) or touched
                    if self._past(stream):
                        self._gone_table = None  # (its statement is further on)
                        break
        finally:
            stream.close()
            self._stream = None
        if self._gone_table is not None:  # the log's end, and no statement took the table
            raise self._gone_table
        yield from self._end_read(rows, name, boundary, at, in_txn=in_txn)

    def _file_created(self, name: str, created: int) -> None:
        """Note when the binlog file ``name`` was created; fail if not the checkpoint's."""
        if created:
            ds, start = self._request.dataset, (self._file, self._offset)
            why = created_differs(self._request.state, name, created)
            require_same_log(why, start, f"dataset {ds}", dataset=ds)
            self._created[name] = created

    def _events(self, stream: Any, name: str) -> Iterator[Any]:
        """The log's events to its end, and on at least to the position of the last fill.

        At the log's end the library closes the stream; asked again, it
        reconnects where it stopped.
        """
        while True:
            start = (stream.log_file, stream.log_pos)
            yield from iter(lambda: next_event(stream), None)
            if self._appeared is not None:
                yield _AT_END  # (the read fills them there: :meth:`_fill_appeared`)
                if not self._past(stream):
                    continue  # on to the fill's position
            if self._past(stream):
                if not self._count_filled() or self._past(stream):
                    return
                continue  # on to the count's position
            if (stream.log_file, stream.log_pos) == start:  # pragma: no cover - a server fault
                raise SourceError(
                    f"the binary log of {name} ends at {start[0]}:{start[1]}, before the "
                    f"position {self._filler.at} of the rows read to fill a new column",
                    hint="capture again: the read resumes from the last whole transaction",
                )

    def _count_filled(self) -> bool:
        """Count the filled columns' nulls once, at the end of a read that filled; whether
        counted now (the read then goes on to the count's binlog position)."""
        if not self._filled or self._count is not None:
            return False
        self._count = self._filler.count_nulls(self._filled) or ({}, ("", 0))
        self._filler.at = max(self._filler.at or self._count[1], self._count[1])
        return True

    def _note_race(self, stream: Any) -> None:
        """A transaction changing the table that ends past the count is not in it."""
        if self._count is not None and (str(stream.log_file), int(stream.log_pos)) > self._count[1]:
            self._count = ({}, ("", 0))  # the lake and the count no longer hold the same rows

    def _past(self, stream: Any) -> bool:
        """Whether the stream has passed the binlog position of the last fill's read."""
        at = self._filler.at
        return at is None or (str(stream.log_file), int(stream.log_pos)) >= at

    def _fill(
        self, added: Added, rows: ChangeRows, rel: catalog.Relation, when: datetime, here: str
    ) -> Generator[Message, None, bool]:
        """The rows' values of columns an ALTER TABLE gave them, as updates of those alone;
        whether there were any to fill."""
        found = self._filler.check(rel.ident, added)
        if any(c not in rows.plans for c in found):
            # Added after the read's start read the table's columns (an ALTER that
            # committed while the read went on): their plans are read now, else the
            # fill left them out, and every row held null in them, silently.
            session = Session(self._settings)
            try:
                rows.learn(self._column_plans(self._catalog_columns(session, rel), rel))
            finally:
                session.close()
        wanted = [c for c in found if c in rows.plans]
        if not wanted:
            return False
        yield from self._emit(rows.flush())
        self._filled += [c for c in wanted if c not in self._filled]
        for read in self._filler(wanted):
            self._seen += read.num_rows
            yield from self._emit([rows.fill(read, added.names, when, here)])
        return True

    def _fill_appeared(
        self, rows: ChangeRows, rel: catalog.Relation, here: str
    ) -> Generator[Message, None, bool]:
        """Where the read would end, once: fill the columns the catalog showed at its start
        that the lake lacks (:func:`appeared_columns`), but those an ALTER it met added
        (its own fill, if any, holds). Whether any were filled."""
        appeared, self._appeared = self._appeared, None
        names = tuple(n for n in appeared.names if n not in self._altered) if appeared else ()
        if appeared is None or not names:
            return False
        late = replace(appeared, names=names, filled=names)
        return (yield from self._fill(late, rows, rel, datetime.now(UTC), here))

    def _still_reading(self, stream: Any, name: str, boundary: str) -> None:
        """Fail the read when it was finished from another thread (a cancel, the deadline).

        The library would otherwise reconnect and read on.
        """
        if self._stream is not stream:
            raise SourceUnavailable(
                f"the binary log read of {name} was stopped at {boundary}",
                hint="capture again: the read resumes from the last committed position",
            )

    def _end_read(
        self, rows: ChangeRows, name: str, boundary: str, at: datetime | None, *, in_txn: bool
    ) -> Iterator[Message]:
        """The read's last rows and its final state, at the last transaction boundary read."""
        if in_txn:  # the log ended inside a transaction: should not happen, never commit it
            raise SourceError(
                f"the binary log of {name} ended inside a transaction at {boundary}",
                hint="capture again: the read resumes from the last whole transaction",
            )
        yield from self._emit(rows.flush())
        if self._count is not None and self._count[0]:
            self.filled_nulls = {self._request.dataset: self._count[0]}
        yield self._state(boundary, at, final=True)
        self.authority.complete()
        with self._lock:
            self._abandon(None)

    def _rows(self, event: Any, rows: ChangeRows, when: datetime, here: str) -> Iterator[list[Any]]:
        """The batches one rows event fills, a batch as soon as it is full."""
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent

        key = self._request.key
        op = (
            "update"
            if isinstance(event, UpdateRowsEvent)
            else "delete"
            if isinstance(event, DeleteRowsEvent)
            else "insert"
        )
        self._learn(event, rows)
        decoder = self._decoder(event, rows)
        body = event_body(event) if decoder is not None else None
        if decoder is not None and body is not None:
            ops, changed = decoder.changes(body, op, key)
            self._seen += len(changed) - ops.count("delete") if op == "update" else len(changed)
            yield rows.add_decoded(decoder, ops, changed, when, here, len(body))
            return
        self.library_events += 1
        library_charsets(event.columns)
        library_labels(event.columns, rows.plans)
        for row in event.rows:
            self._seen += 1
            if isinstance(event, UpdateRowsEvent):
                before, after = row["before_values"], row["after_values"]
                moved = any(before.get(k) != after.get(k) for k in key)
                if moved:  # the old key's delete, the new key's insert
                    nones = row.get("before_none_sources")
                    yield rows.add("delete", before, event.columns, when, here, nones)
                nones = row.get("after_none_sources")
                after_op = "insert" if moved else "update"
                yield rows.add(after_op, after, event.columns, when, here, nones)
            else:
                op = "delete" if isinstance(event, DeleteRowsEvent) else "insert"
                nones = row.get("none_sources")
                yield rows.add(op, row["values"], event.columns, when, here, nones)
            if rows.full:
                yield rows.flush()

    def _learn(self, event: Any, rows: ChangeRows) -> None:
        """How the server reads the charsets of a new table map's text columns."""
        table = event.table_map.get(event.table_id)
        if table is None or table is self._learned:
            return
        self._learned = table

        def query(sql: str) -> list[tuple[Any, ...]]:
            with self._lock:
                return self._live().rows(sql, "reading how the server reads a charset")

        learn_charsets(event.columns, rows.plans, query)

    def _decoder(self, event: Any, rows: ChangeRows) -> RowDecoder | None:
        """The decoder of the event's table map, or None (the library decodes).

        Every transaction logs its own table map: a decoder is kept per
        distinct column list, so it is built once per table shape.
        """
        if self._library_rows:
            return None
        table = event.table_map.get(event.table_id)
        if table is None:
            return None
        if table is not self._table:
            self.table_maps += 1
            shape = repr([c.data for c in table.columns])
            if shape not in self._decoders:
                if len(self._decoders) >= 16:  # shapes seen in one read: a few at most
                    self._decoders.clear()
                self._decoders[shape] = row_decoder(table.columns, rows.plans)
            self._table, self._current = table, self._decoders[shape]
        return self._current

    def _query(
        self, event: Any, rel: catalog.Relation, rows: ChangeRows, when: datetime, here: str
    ) -> tuple[str, list[Any] | Added]:
        """A statement's verb (upper case), and the truncate marker when it empties the table
        (the columns to fill when it gave the rows present values)."""
        query = event.query if isinstance(event.query, str) else str(event.query)
        schema = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
        verb = query.strip().upper()
        if verb in ("BEGIN", "COMMIT", "ROLLBACK"):
            return verb, []
        self._stream.table_map = {}  # (a statement may be DDL: table maps read anew)
        touches = self._touches(query, schema, rel)
        if isinstance(touches, Added) or not touches:
            return verb, touches or []
        self._truncated = True  # (the only other statement _touches lets through)
        return verb, rows.truncate(when, here)

    def _touches(self, query: str, schema: str, rel: catalog.Relation) -> bool | Added:
        """Whether a statement in the log acts on the table (what an ALTER TABLE adds
        that must be filled); fail on the ones that cannot pass (:func:`touching`)."""
        touched = touching(query, schema, rel.database, rel.table)
        if touched is None:
            return False
        verb, rest = touched
        added = self._added(rest) if verb == "alter" else None
        return added if added is not None else verb == "truncate"

    def _added(self, alter: str) -> Added | None:
        """What an ALTER TABLE gives the rows present (:func:`added_columns`). A column added
        under a name an ALTER read before took away, or that the lake holds, is a new one:
        before, the rows the log did not change after it kept the dropped one's values."""
        self._left.update(left_columns(alter))
        lake = self._request.options.get("lake_columns") or ()
        added = added_columns(alter, self._left.union(lake))
        self._altered.update(added.names)
        return added if added.fills else None

    def _emit(self, batches: list[Any]) -> Iterator[Message]:
        for batch in batches:
            self._uncovered = True
            ops = batch.column(OP_COLUMN)
            if not (batch.num_rows == 1 and ops[0].as_py() == OP_TRUNCATE):
                self.authority.count(batch.num_rows, batch.nbytes)
            yield RecordBatchMessage(self._request.dataset, batch)

    def _state(self, position: str, at: datetime | None, *, final: bool) -> StateMessage:
        state: dict[str, Any] = {"binlog": position, "columns": self._columns}
        if self._identity is not None:
            before = self._request.state or {}
            created = self._created.get(position.rpartition(":")[0])
            with self._lock:  # (the session: a cancel may close it meanwhile)
                state.update(origin(self._identity, position, self._boundary_gtid, before, created))
        if self._gone:
            state["gone"] = self._gone
        if self._wider:
            state["narrowed"] = self._wider
        if at is not None:
            state["at"] = at.isoformat()
        elif (self._request.state or {}).get("at"):
            state["at"] = self._request.state["at"]  # type: ignore[index]
        self._uncovered = False
        return StateMessage(
            self._request.dataset,
            state,
            position=position,
            emitted_at=at.isoformat() if at is not None else None,
            final=final,
        )

    def acknowledge(self, state: Mapping[str, Any]) -> None:
        """Nothing to confirm: the position lives in the lake's checkpoint only."""
        acknowledged(state)

    def _release(self, outcome: Any) -> tuple[str, ...]:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        return super()._release(outcome)
