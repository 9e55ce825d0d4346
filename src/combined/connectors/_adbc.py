"""ADBC connections and statements without ``adbc_driver_manager.dbapi``.

Why not the DB-API module: importing it imports its ``_dbapi_backend``,
which imports polars whenever polars is installed (``try: import polars``):
about 50-65 MB of resident memory in every Combined process, for a library
Combined never uses. This module drives the same low-level handles the
DB-API wraps (``AdbcDatabase``, ``AdbcConnection``, ``AdbcStatement``) and
keeps the DB-API's behaviour for the subset Combined uses:

* a statement is prepared when its SQL text changes, then executed under
  ``_blocking_call`` (Ctrl-C cancels the statement, as with the DB-API, and
  still reaches the command: ``combined._interrupts``);
* positional parameters are bound as a one-row Arrow record batch with
  columns ``"0"``, ``"1"``, ... (the DB-API's pyarrow conversion);
* small results are read through the driver manager's reader, so a failure
  mid-result carries the driver's SQLSTATE; a data stream is the plain Arrow
  reader (as ``fetch_record_batch`` returns);
* closing a connection closes its cursors first, and an unclosed cursor or
  connection is closed when it is collected.

Connections start in autocommit mode (the ADBC default): callers issue their
own ``BEGIN``/``COMMIT``.
"""

from __future__ import annotations

import signal
import threading
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import adbc_driver_manager
import pyarrow as pa
from adbc_driver_manager import _lib, _reader

from combined._interrupts import heard

#: The base class of every error the driver manager raises (with ``sqlstate``).
Error = adbc_driver_manager.Error


def _blocking(func: Any, cancel: Any) -> Any:
    # The driver manager's own wrapper: on the main thread, SIGINT cancels
    # the call instead of waiting for it to return. Its handler takes the
    # signal from Python's, which never hears of it: the statement ended with
    # its cancel's error and the KeyboardInterrupt was gone (a capture's
    # Ctrl-C became a failed Attempt, retried). The command is told first,
    # before the canceled statement's error can reach it.
    def on_sigint() -> None:
        heard(signal.SIGINT)
        cancel()

    return _lib._blocking_call(func, (), {}, on_sigint)


def closed_error(what: str) -> Error:
    """The driver manager's error for a use of ``what`` after it was closed."""
    return adbc_driver_manager.ProgrammingError(
        f"{what} is closed", status_code=adbc_driver_manager.AdbcStatusCode.INVALID_STATE
    )


class _Closing(ABC):
    """Closed on leaving a ``with`` block, or when collected while still open."""

    _closed: bool

    @abstractmethod
    def close(self) -> None:
        """Release what the object holds (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._closed:
            self.close()


class Connection(_Closing):
    """One ADBC connection in autocommit mode, on a database it owns or shares."""

    def __init__(
        self,
        database: adbc_driver_manager.AdbcDatabase,
        shared: threading.RLock | None = None,
    ) -> None:
        """Open a connection on ``database``, which this object then owns (and closes).

        With ``shared`` (the lock of :class:`SharedDatabases`), the database is
        another's: this object opens and closes only its connection, under
        that lock (the driver counts a database's connections unguarded).
        """
        self._closed = True  # first: __del__ may run if __init__ fails
        self._db, self._shared = database, shared
        try:
            if shared is None:
                self._conn = adbc_driver_manager.AdbcConnection(database)
            else:
                with shared:
                    self._conn = adbc_driver_manager.AdbcConnection(database)
        except BaseException:
            if shared is None:
                database.close()
            raise
        self._cursors: weakref.WeakSet[Cursor] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def handle(self) -> adbc_driver_manager.AdbcConnection:
        """The low-level connection (for driver options)."""
        return self._conn

    def cursor(self, options: Mapping[str, str] | None = None) -> Cursor:
        """A new cursor (one statement) with the driver statement ``options``."""
        cursor = Cursor(self._conn, options)
        with self._lock:
            self._cursors.add(cursor)
        return cursor

    def close(self) -> None:
        """Close the cursors, then the connection and the database; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cursors = list(self._cursors)
        # The connection refuses to close while a statement is open; a cursor
        # that fails to close does not keep the rest open.
        first: BaseException | None = None
        for cursor in cursors:
            try:
                cursor.close()
            except Exception as exc:
                first = first or exc
        if self._shared is not None:
            with self._shared:
                self._conn.close()
        else:
            try:
                self._conn.close()
            finally:
                self._db.close()
        if first is not None:
            raise first


class SharedDatabases:
    """ADBC databases kept open for the process, one per connection string.

    Opening a PostgreSQL database costs ~60 ms of CPU and a round trip: the
    driver reads the server's type catalog to build its decoders. A
    connection on an open database costs ~0.2 ms. A capture of many small
    tables opened one database a table (200 tables: ~13 CPU-s of 34). The
    decoders serve the built-in types only (the reads cast every other type
    on the server), so a database kept open does not go stale. The newest
    ``limit`` strings keep theirs; an older one's database is released when
    its last connection closes.
    """

    def __init__(
        self, opener: Callable[[str], adbc_driver_manager.AdbcDatabase], limit: int = 16
    ) -> None:
        self._opener, self._limit = opener, limit
        self._databases: OrderedDict[str, adbc_driver_manager.AdbcDatabase] = OrderedDict()
        # Reentrant: a connection collected while this thread holds it (the
        # garbage collector may run a finalizer inside ``connect``) closes
        # under it too, where a plain lock would wait for itself forever.
        self._lock = threading.RLock()

    def connect(self, key: str) -> Connection:
        """A new connection on the database of ``key`` (opened the first time)."""
        with self._lock:
            database = self._databases.pop(key, None)
            if database is None:
                database = self._opener(key)
            self._databases[key] = database  # (the newest last)
            while len(self._databases) > self._limit:
                self._databases.popitem(last=False)
        return Connection(database, shared=self._lock)


class Cursor(_Closing):
    """One ADBC statement: execute, then fetch rows, a table or the Arrow stream."""

    def __init__(
        self, connection: adbc_driver_manager.AdbcConnection, options: Mapping[str, str] | None
    ) -> None:
        """A statement on ``connection`` (use :meth:`Connection.cursor`)."""
        self._closed = True  # first: __del__ may run if __init__ fails
        self._stmt = adbc_driver_manager.AdbcStatement(connection)
        self._closed = False
        self._last_query: str | None = None
        self._handle: Any = None  # the result stream, not yet imported
        self._reader: Any = None  # the driver manager's reader over it, once imported
        if options:
            self._stmt.set_options(**options)

    def set_options(self, **options: str) -> None:
        """Set driver statement options (they hold for the following executions)."""
        self._stmt.set_options(**options)

    def execute(self, query: str, parameters: Sequence[Any] | None = None) -> None:
        """Run ``query`` with positional ``parameters``; its result is fetched next."""
        self._clear()
        if query != self._last_query:
            self._last_query = query
            self._stmt.set_sql_query(query)
            try:
                _blocking(self._stmt.prepare, self._stmt.cancel)
            except adbc_driver_manager.NotSupportedError:
                pass  # not every driver prepares
        if parameters:
            batch = pa.record_batch(
                [[value] for value in parameters], names=[str(i) for i in range(len(parameters))]
            )
            self._stmt.bind(batch)
        self._handle, _ = _blocking(self._stmt.execute_query, self._stmt.cancel)

    def _adbc_reader(self) -> Any:
        if self._reader is None:
            handle, self._handle = self._handle, None
            if handle is None:
                raise closed_error("the result")
            self._reader = _reader.AdbcRecordBatchReader._import_from_c(handle.address)
        return self._reader

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every row of the result as Python values."""
        reader = self._adbc_reader()
        rows: list[tuple[Any, ...]] = []
        while True:
            try:
                batch = _blocking(reader.read_next_batch, self._stmt.cancel)
            except StopIteration:
                return rows
            rows.extend(zip(*(column.to_pylist() for column in batch.columns), strict=True))

    def fetch_arrow_table(self) -> pa.Table:
        """The whole result as an Arrow table."""
        table: pa.Table = _blocking(self._adbc_reader().read_all, self._stmt.cancel)
        return table

    def fetch_record_batch(self) -> pa.RecordBatchReader:
        """The result as an Arrow stream, read lazily in the driver's batches."""
        # The plain Arrow reader, as the DB-API returns: Arrow may reach into it.
        stream: pa.RecordBatchReader = self._adbc_reader()._reader
        return stream

    def _clear(self) -> None:
        reader, self._reader = self._reader, None
        handle, self._handle = self._handle, None
        if reader is not None:
            reader.close()
        elif handle is not None:  # a result never imported: release it
            handle.release()

    def close(self) -> None:
        """Close the result and the statement; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._clear()
        finally:
            self._stmt.close()
