"""The bulk path of a snapshot or cursor read: the server's rows straight into Arrow (connectorx).

PyMySQL hands every value to Python before Arrow sees it; connectorx reads
the result set in Rust into Arrow builders, and this module turns its
columns into the read's schema. A column connectorx reads exactly
(integers, floats, most decimals, strings, dates without zero dates) is
selected as it is and cast to the read's type; any other is selected as the
server's text (``CAST(... AS CHAR)``) and converted with the row path's
vectorised casts (:mod:`~combined.connectors.mariadb._bulk_types`), so exact
decimals, zero dates, the session's ``+00:00`` time zone and casts keep the
meaning they have on the row path.

The bulk read runs on a connection of its own. It must see the snapshot of
the transaction that reads the catalog, the binlog position and the control
totals, so the two snapshots are made equal for the relation
(:class:`SnapshotTwin`): a third session holds ``LOCK TABLES t READ`` (which
waits for every transaction writing ``t`` to end and admits no new one)
while the controlling transaction opens its snapshot and while the bulk
connection runs ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` as a
``pre_execution_query`` (connectorx runs those on the connection that then
runs the query). The lock is released once the bulk connection takes a user
lock (``GET_LOCK``) named for the read, the pre-execution statement after
its snapshot opened, seen by polling ``IS_USED_LOCK`` every 10 ms; or, at
the latest, when the first batch (or the end) arrives. Writers of ``t`` wait
that long. Nothing else is held.

Both waits are bounded. The lock waits at most
:data:`~combined.connectors.mariadb._binlog_anchor.LOCK_WAIT_SECONDS` for the
transactions writing ``t``; when it is not granted the row path reads. And
connectorx may prepare the query on a connection of its pool before the
pre-execution runs, which a writer queued behind the lock (a ``TRUNCATE``, a
``RENAME``, a ``LOCK TABLES t WRITE``) blocks: the lock is let go after
:data:`TWIN_DEADLINE_SECONDS` whether or not ``GET_LOCK`` was seen. A bulk
snapshot not seen open under the lock is not known equal to the controlling
one: its reader is closed and the row path reads, in the controlling snapshot.

The path is taken only when it keeps every guarantee: connectorx is
installed, the read is a whole-relation snapshot or a cursor read's
window (one statement), the connection needs no
TLS or socket options connectorx would not honour, and the account may
``LOCK TABLES``. Otherwise the read keeps the row path. So does a table whose
first rows weigh a megabyte or more (:meth:`Sizing.long_rows`). A row longer
than connectorx's packet limit comes through it with its long values NULL and
is read on the row path afterwards (:class:`Fit`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from combined.connectors.mariadb import _bulk_types
from combined.connectors.mariadb._binlog_anchor import TableLock
from combined.connectors.mariadb._connect import Session, Settings
from combined.connectors.mariadb._types import ColumnPlan, Layout
from combined.errors import AuthRejected, CombinedError, SourceError, SourceUnavailable

if TYPE_CHECKING:
    from combined.connectors.mariadb._catalog import Relation

#: The bytes of a row assumed before the server's table statistics say more.
_ROW_GUESS = 256
#: Rows whose string and binary values are weighed to size the batches.
SAMPLE_ROWS = 16
#: Rows of more than 1/16 of a batch's bytes (1 MiB by default) are read by rows.
LONG_ROW_SHARE = 16
#: What a value takes on the wire beside its bytes (a length prefix, at most 9 bytes).
_PREFIX = 9
#: Bytes kept under ``max_allowed_packet`` for the row's header and NULL bitmap (a bit a column).
_MARGIN = 1024
#: The most bytes a number, date or time takes as text (DECIMAL(65,30): 67).
_FIXED_TEXT = 80
#: Character sets whose bytes are sent as they are to a utf8mb4 connection.
_AS_SENT = "'utf8mb4', 'utf8mb3', 'utf8', 'ascii', 'binary'"

#: Seconds the twin's table lock waits for the bulk connection's snapshot to
#: open; later, the lock is let go and the bulk read is dropped for the row path.
TWIN_DEADLINE_SECONDS = 5.0

_log = logging.getLogger(__name__)


def available(settings: Settings) -> bool:
    """Whether a snapshot read of ``settings``' source can take the bulk path."""
    try:
        import connectorx  # noqa: F401
    except ImportError:
        return False
    q = settings.query
    return not any(k in q for k in ("unix_socket", "ssl_ca", "ssl_cert", "ssl_key"))


def select_list(layout: Layout, *, named: bool = True, fit: Fit | None = None) -> str:
    """The select list of the bulk read: native values where exact, else the server's text.

    ``named=False`` leaves the expressions unnamed, so that an ``ORDER BY``
    of a bare column name sorts by the table's column, not by its text
    (the batches' columns are taken by position). With ``fit``, a row too
    long for connectorx comes with its weighed values NULL and a last column
    of 0 (:func:`converted` leaves it out; the row path reads it after).
    """
    from combined.connectors.mariadb._connect import quote_ident

    listed = []
    for i, p in enumerate(layout.plans):
        expr = _bulk_types.expression(p, layout.zero_dates)
        if fit is not None and i in fit.columns:
            expr = f"IF({fit.test}, {expr}, NULL)"
        listed.append(expr + (f" AS {quote_ident(p.name)}" if named else ""))
    if fit is not None:
        listed.append(f"({fit.test})" + (" AS `_combined_fits`" if named else ""))
    return ", ".join(listed)


@dataclass(frozen=True, slots=True)
class Fit:
    """The rows connectorx can read: their long values' bytes leave the packet under the limit.

    connectorx's driver refuses a row packet longer than the server's
    ``max_allowed_packet`` ("Packet is larger than max_allowed_packet"),
    wherever the row comes in the result: a row of two 9 MB values after the
    first batch failed the whole read. The server itself sends such a row,
    and PyMySQL reads it.
    """

    #: SQL, true of a row whose packet stays under the limit.
    test: str
    #: The positions of the columns weighed (the values selected only when the row fits).
    columns: frozenset[int]


def packet_fit(layout: Layout, packet: int) -> Fit | None:
    """Which rows pass ``packet`` bytes (``max_allowed_packet``); ``None``: every row does.

    ``None`` when the columns' declared sizes (a TEXT holds 64 KiB) add up to
    less. Else the columns declared longer than 8 KiB (or of no known length)
    are weighed row by row: their bytes as sent (text converted to the
    connection's utf8mb4). Every other column counts at the most its type
    holds (InnoDB keeps those under 64 KiB a row), a length prefix each.
    """
    bounds = [_most_bytes(p) for p in layout.plans]
    known = [b for b in bounds if b is not None]
    if len(known) == len(bounds) and sum(known) + _PREFIX * len(bounds) + _MARGIN <= packet:
        return None  # (TEXT columns: 64 KiB each)
    weighed = _weighed(layout, packet)
    fixed = sum(b or 0 for i, b in enumerate(bounds) if i not in weighed)
    room = packet - fixed - _PREFIX * (len(bounds) + 1) - _MARGIN
    return Fit(f"({_weights(layout, weighed)}) <= {room}", frozenset(weighed))


def _weighed(layout: Layout, packet: int) -> tuple[int, ...]:
    """The columns weighed row by row: the long ones, or every string when the rest is long."""
    wide = layout.wide
    narrow = sum(_most_bytes(p) or 0 for i, p in enumerate(layout.plans) if i not in wide)
    if narrow + _MARGIN <= packet // 2:
        return wide
    return tuple(i for i, p in enumerate(layout.plans) if p.kind in ("string", "binary"))


def _most_bytes(plan: ColumnPlan) -> int | None:
    """The most bytes a column's value takes as sent (utf8mb4: 4 a character); None: unknown."""
    if plan.kind in ("string", "binary"):
        if plan.octets is None:
            return None
        return plan.octets * (4 if plan.kind == "string" else 1)
    return _FIXED_TEXT


def _weights(layout: Layout, columns: Sequence[int]) -> str:
    """SQL: the bytes the values of ``columns`` take as the bulk read sends them."""
    terms = []
    for i in columns:
        plan = layout.plans[i]
        e = _bulk_types.expression(plan, layout.zero_dates)
        length = f"LENGTH({e})"
        if plan.kind != "binary":  # sent in utf8mb4: a latin1 'é' takes two bytes
            sent = f"LENGTH(CONVERT({e} USING utf8mb4))"
            length = f"IF(CHARSET({e}) IN ({_AS_SENT}), {length}, {sent})"
        terms.append(f"IFNULL({length}, 0)")
    return " + ".join(terms)


@dataclass(frozen=True, slots=True)
class Sizing:
    """How the bulk read is sized (:func:`sizing`)."""

    #: Rows per batch.
    rows: int
    #: The rows it can pass (``None``: every row).
    fit: Fit | None
    #: The longest sampled row's string bytes.
    sampled: int

    def long_rows(self, batch_bytes: int) -> bool:
        """Whether the sampled rows are long enough for the row path to read them as well.

        A row of a megabyte costs the row path one Python tuple, which is
        nothing beside its bytes, while connectorx reads ahead of its
        consumer without a bound (a queue of such rows).
        """
        return self.sampled * LONG_ROW_SHARE >= batch_bytes


def sizing(
    session: Session, relation: Relation, layout: Layout, limit: int, batch_bytes: int
) -> Sizing:
    """Rows per bulk batch (:func:`batch_rows`) and which rows it can pass (:func:`packet_fit`).

    The table's average row length may be stale (before ``ANALYZE TABLE``
    InnoDB counts no off-page BLOB page: 50 rows of 4 MB read as 178 KB
    each, one 200 MB batch) or zero, so the string and binary values of
    :data:`SAMPLE_ROWS` rows are weighed too (the first rows: no scan).
    """
    lit = session.literal
    ((avg, packet),) = session.rows(
        "SELECT (SELECT AVG_ROW_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
        f"{lit(relation.database)} AND TABLE_NAME = {lit(relation.table)}), "
        "@@global.max_allowed_packet",
        "reading the table's row length",
    )
    fitting = packet_fit(layout, int(packet))
    strings = [i for i, p in enumerate(layout.plans) if p.kind in ("string", "binary")]
    sampled = 0
    if strings:
        ((top,),) = session.rows(
            f"SELECT MAX(w) FROM (SELECT {_weights(layout, strings)} AS w "
            f"FROM {relation.ident} LIMIT {SAMPLE_ROWS}) s",
            "weighing a sample of the rows",
        )
        sampled = min(int(top or 0), int(packet))  # a longer row is read by rows
    rows = batch_rows(limit, batch_bytes, avg, layout.schema, sampled)
    return Sizing(rows, fitting, sampled)


def batch_rows(
    limit: int, batch_bytes: int, avg_row_length: Any, schema: pa.Schema, sampled: int = 0
) -> int:
    """Rows per bulk batch: at most ``limit``, near ``batch_bytes`` by the rows' width.

    The width is the table's average row length or, when more, what a row
    takes in Arrow whatever its values (:func:`arrow_row_floor`) plus the
    longest ``sampled`` bytes of its strings: the server stores a NULL in no
    bytes, Arrow in its column's full width, so a row of 300 mostly-NULL
    columns is ~100 bytes on disk and ~2 KB in a batch.
    """
    floor = arrow_row_floor(schema) + int(sampled)
    width = max(int(avg_row_length or 0) or _ROW_GUESS, floor)
    return max(1, min(limit, batch_bytes // max(width, 1)))


def arrow_row_floor(schema: pa.Schema) -> int:
    """The bytes a row takes in ``schema``'s Arrow arrays even when every value is NULL."""
    bits = 0
    for field in schema:
        t = field.type
        if pa.types.is_boolean(t):
            bits += 1
        elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
            bits += 64  # an offset
        elif pa.types.is_string(t) or pa.types.is_binary(t):
            bits += 32
        else:
            bits += t.bit_width
        bits += 1  # validity
    return (bits + 7) // 8


def _url(settings: Settings) -> str:
    auth = quote(settings.user or "root", safe="")
    if settings.password:
        auth += ":" + quote(settings.password, safe="")
    return f"mysql://{auth}@{settings.host}:{settings.port}/{quote(settings.database, safe='')}"


def driver_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is connectorx's failure: an exception, or a panic of its Rust code.

    pyo3 raises a panic as ``PanicException``, a ``BaseException`` (a lost
    connection mid-read panics its writer), which escaped the capture as a
    crash. An interrupt or an exit is neither.
    """
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


#: What connectorx says of a connection lost under it (the server ended it, or the network).
_LOST = ("onnect", "timed out", "broken pipe", "io error", "gone away", "reset by peer")


def bulk_error(exc: BaseException, settings: Settings) -> CombinedError:
    """A failure of the bulk read as a Combined error, the password scrubbed."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if settings.password:
        text = text.replace(quote(settings.password, safe=""), "***")
    detail = settings.scrub(text)[:300]
    if "Access denied" in detail or "denied to user" in detail:
        return AuthRejected(
            f"the mariadb account may not do this while reading in bulk: {detail}",
            hint="grant the account SELECT on the table (GRANT SELECT ON db.table TO user)",
            detail=detail,
        )
    if any(lost in detail.lower() for lost in _LOST):
        return SourceUnavailable(
            f"the mariadb connection failed while reading in bulk: {detail}",
            hint="the source or the network was interrupted; the attempt can be retried",
            detail=detail,
        )
    return SourceError(
        f"the mariadb source failed while reading in bulk: {detail}",
        hint="see the detail; the statement failed on the server",
        detail=detail,
    )


class SnapshotTwin:
    """The table lock that makes the bulk connection's snapshot equal the controlling one's.

    :meth:`watch` releases it as soon as the bulk connection holds the user
    lock :attr:`signal` (taken in its pre-execution, right after its
    snapshot opened), polled every 10 ms on the lock's own session; the
    first batch releases it in any case (:meth:`settle`). After
    :data:`TWIN_DEADLINE_SECONDS` without the signal the watcher lets go:
    the twin is then not known equal.
    """

    def __init__(self, settings: Settings, relation: str, lock: TableLock | None = None) -> None:
        self._lock = lock or TableLock(settings, relation)
        self.relation = relation
        self._held = False
        self._equal = False
        self._mutex = threading.Lock()
        #: The user lock the bulk connection takes once its snapshot is open.
        self.signal = f"combined-bulk-{uuid.uuid4().hex}"
        #: Why the lock could not be taken (the row path then reads).
        self.refusal: str | None = None

    def hold(self) -> bool:
        """Take the lock; ``False`` when the account may not or in time (the row path reads)."""
        try:
            self._lock.hold()
        except CombinedError as exc:  # no grant, no such table, a long writer: the row path
            self._lock.release()
            self.refusal = exc.message
            return False
        self._held = True
        return True

    def watch(self) -> None:
        """Release the lock from a thread once the bulk connection shows :attr:`signal`.

        connectorx may hold the GIL while it waits on the server, so the
        deadline is the server's too: the lock's session gets a
        ``wait_timeout`` of :data:`TWIN_DEADLINE_SECONDS`, after which the
        server closes it (and its lock) unless the watcher kept it busy.
        """
        with self._mutex:
            session = self._lock.session
            if self._held and session is not None:
                wait = max(1, math.ceil(TWIN_DEADLINE_SECONDS))
                session.run(f"SET SESSION wait_timeout = {wait}", "bounding the table lock")
        threading.Thread(target=self._watch, name="combined-bulk-twin", daemon=True).start()

    def _watch(self) -> None:
        query = f"SELECT IS_USED_LOCK('{self.signal}')"
        deadline = time.monotonic() + TWIN_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            with self._mutex:
                session = self._lock.session
                if not self._held or session is None:
                    return
                try:
                    ((holder,),) = session.rows(query, "watching the bulk read's snapshot")
                except CombinedError:
                    break  # the lock's session failed: its lock may be gone
            if holder is not None:
                self._let_go(equal=True)
                return
            time.sleep(0.01)
        self._let_go(equal=False)

    def _let_go(self, *, equal: bool) -> bool:
        with self._mutex:
            session = self._lock.session
            if self._held and session is not None:
                self._held = False
                if equal:  # held all along only if the server did not close the session
                    try:
                        session.rows("SELECT 1", "checking the table lock")
                    except CombinedError:
                        equal = False
                self._equal = equal
                self._lock.release()
            return self._equal

    def settle(self) -> bool:
        """At the first batch: release the lock; whether the bulk snapshot opened under it."""
        return self._let_go(equal=True)

    def release(self) -> None:
        """Let the writers of the table go on (idempotent, from either thread)."""
        self._let_go(equal=False)


def stream(
    settings: Settings, query: str, layout: Layout, dataset: str, rows: int, twin: SnapshotTwin
) -> Iterator[pa.RecordBatch]:
    """Run ``query`` in a consistent snapshot of its own connection; yield converted batches."""
    yield from converted(settings, start(settings, query, rows, twin), layout, dataset)


def start(settings: Settings, query: str, rows: int, twin: SnapshotTwin) -> Started:
    """Start the bulk read and take its first batch; ``twin`` is released either way.

    The bulk connection's snapshot was open once the first batch (or the
    end) arrived. A failure here hands over nothing: the caller may read the
    rows another way in its own snapshot.
    """
    import connectorx as cx

    pre = [
        f"SET time_zone = '+00:00', net_write_timeout = {int(settings.read_timeout)}",
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
        f"DO GET_LOCK('{twin.signal}', 0)",  # the snapshot is open: the twin may let go
    ]
    failure: CombinedError | None = None
    reader: Any = None
    started: Started | None = None
    try:
        twin.watch()
        reader = cx.read_sql(
            _url(settings),
            query,
            return_type="arrow_stream",
            batch_size=rows,
            pre_execution_query=pre,
        )
        batches = iter(reader)
        first = next(batches, None)
        if twin.settle():
            started = Started(reader, batches, first)
            return started
        _log.warning(
            "the bulk read of %s had not opened its snapshot within %.0f s of the table lock: "
            "the rows are read on the row path (the bulk snapshot is not known equal)",
            twin.relation,
            TWIN_DEADLINE_SECONDS,
        )
        failure = SourceError(
            f"the bulk read's snapshot was not seen open within {TWIN_DEADLINE_SECONDS:.0f} s "
            "of the table lock (a writer queued behind it?): it is not known equal to the "
            "read's snapshot",
            hint="nothing to do: the row path reads the rows in the read's own snapshot",
        )
    except BaseException as exc:  # connectorx raises RuntimeError and Rust panics
        if not driver_failure(exc):
            raise
        failure = exc if isinstance(exc, CombinedError) else bulk_error(exc, settings)
    finally:
        twin.release()
        if started is None and reader is not None:
            with contextlib.suppress(Exception):
                reader.close()  # a dropped read ends its connection
    raise failure  # outside the handler: the driver's text stays out of the chain


@dataclass(slots=True)
class Started:
    """A started bulk read: connectorx's reader and its first batch (None: no rows)."""

    reader: Any
    batches: Iterator[pa.RecordBatch]
    first: pa.RecordBatch | None
    #: The rows it can pass (its select list's last column says which did).
    fit: Fit | None = None
    #: The rows left out for being too long for connectorx, counted as they pass.
    skipped: int = 0


def converted(
    settings: Settings, started: Started, layout: Layout, dataset: str
) -> Iterator[pa.RecordBatch]:
    """The started read's batches in the read's schema; closing it ends the connection.

    A row too long for connectorx (``started.fit``) is left out and counted
    in ``started.skipped``: the caller reads it on the row path.
    """
    failure: CombinedError | None = None
    batch = started.first
    pacer = Pacer()
    try:
        while batch is not None:
            if started.fit is not None:
                batch = _fitting(batch, started, len(layout.plans))
            yield _convert(batch, layout, dataset)
            time.sleep(pacer.pause)  # without the GIL: the capture's other threads run
            waited = time.monotonic()
            batch = next(started.batches, None)  # holds the GIL until the batch is there
            pacer.waited(time.monotonic() - waited)
    except CombinedError:
        raise
    except BaseException as exc:  # connectorx raises RuntimeError and Rust panics
        if not driver_failure(exc):
            raise
        failure = bulk_error(exc, settings)
    finally:
        started.reader.close()  # an abandoned read ends its connection
    if failure is not None:
        raise failure


def _fitting(batch: pa.RecordBatch, started: Started, width: int) -> pa.RecordBatch:
    """``batch`` without the rows too long for connectorx (their flag, column ``width``, is 0)."""
    fits = batch.column(width)
    left = batch.num_rows - int(pc.sum(fits).as_py() or 0)
    if not left:
        return batch
    started.skipped += left
    return batch.filter(pc.not_equal(fits, 0))


class Pacer:
    """How long to sleep before asking connectorx for its next batch.

    connectorx's ``next()`` holds the GIL until the batch is there, which
    stalls every other Python thread of the capture (its staging) for as long
    as the server takes. Its reader thread reads ahead of the consumer
    without waiting for it, so a consumer that asks later never slows the
    read: sleeping (GIL released) for most of the time the last batch took to
    arrive turns that wait into time the other threads can use. A batch
    found waiting halves the pause, so a consumer slower than the read
    (its batches always there) soon sleeps not at all.
    """

    #: A wait shorter than this (seconds) found the batch there already.
    READY = 0.002
    #: The share of the last batch's arrival time slept before the next.
    SHARE = 0.9
    #: The longest pause (seconds), whatever the server's pace.
    LONGEST = 0.5

    def __init__(self) -> None:
        self.pause = 0.0

    def waited(self, seconds: float) -> None:
        """Learn from a ``next()`` that held the GIL for ``seconds`` after :attr:`pause`."""
        if seconds > self.READY:
            self.pause = min(self.LONGEST, self.SHARE * (self.pause + seconds))
        else:
            self.pause /= 2


def _convert(batch: pa.RecordBatch, layout: Layout, dataset: str) -> pa.RecordBatch:
    arrays = [
        _bulk_types.convert(batch.column(i), plan, dataset, layout.zero_dates)
        for i, plan in enumerate(layout.plans)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=layout.schema)
