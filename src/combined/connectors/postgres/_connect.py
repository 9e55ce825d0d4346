"""Settings, ADBC sessions and the translation of driver errors.

The password is held only by :class:`Settings` (never in ``repr``), joined
into the libpq connection string at connect time, and scrubbed from every
driver message before it reaches a :class:`~combined.errors.CombinedError`.
Driver exceptions are never chained (``from None``): their text is not ours
to vouch for, so only the scrubbed first line travels, as ``detail``.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import adbc_driver_postgresql
import pyarrow as pa
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from combined._credentials import is_credential_key
from combined.connectors import _adbc
from combined.connectors._shared import casts_by_relation
from combined.connectors._shared import close_quietly as shared_close_quietly
from combined.connectors.abc import refuse_unknown_keys
from combined.errors import (
    AuthRejected,
    CombinedError,
    ConfigError,
    NotFoundError,
    SchemaMismatch,
    SourceError,
    SourceUnavailable,
    redact,
)

#: ADBC statement option bounding the bytes of each batch the driver builds.
BATCH_BYTES_OPTION = "adbc.postgresql.batch_size_hint_bytes"
_TXN_STATUS_OPTION = "adbc.postgresql.transaction_status"
DEFAULT_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_APPLICATION_NAME = "combined"
DEFAULT_SLOT_PREFIX = "combined"

#: The ``sslmode`` values libpq takes.
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

#: Everything the driver stack raises for a failed statement or stream.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    _adbc.Error,
    OSError,
    pa.ArrowException,
)

# SQLSTATE classes and codes after which a retry may succeed.
_TRANSIENT_CLASSES = ("08", "53", "57")
_TRANSIENT_CODES = ("40001", "40P01", "55P03")
# Fragments of libpq/server connection-time messages (which carry no SQLSTATE).
_AUTH_FRAGMENTS = (
    "password authentication failed",
    "authentication failed",
    "no password supplied",
    "is not permitted to log in",
    "no pg_hba.conf entry",
    "pg_hba.conf rejects",
    "permission denied for database",
)
# Quoted, so that a database (or table) whose name holds "role" is not a role.
_NO_ROLE = re.compile(r'role "[^"]*" does not exist')
_CONNECTION_FRAGMENTS = (
    "terminating connection",
    "server closed the connection",
    "connection to server",
    "could not receive data",
    "could not send data",
    "no connection to the server",
    "connection not open",
    "ssl syscall",
    "eof detected",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one PostgreSQL source.

    ``password`` is kept out of ``repr`` and of :attr:`public`.
    """

    dsn: str
    password: str | None = field(default=None, repr=False)
    schemas: tuple[str, ...] = ("public",)
    connect_timeout: int = 10
    application_name: str = DEFAULT_APPLICATION_NAME
    slot_prefix: str = DEFAULT_SLOT_PREFIX
    #: Columns read through a cast, by relation (``orders`` or ``sales.orders``).
    casts: Mapping[str, Mapping[str, str]] = field(default_factory=dict, hash=False)

    #: The configuration keys a PostgreSQL source takes: any other is refused.
    KEYS: ClassVar[tuple[str, ...]] = (
        "dsn",
        "password",
        "schemas",
        "connect_timeout",
        "application_name",
        "slot_prefix",
        "casts",
    )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """Validate the source configuration (the :attr:`KEYS`: ``dsn``, ``password``, ...)."""
        refuse_unknown_keys("postgres", config, cls.KEYS)
        dsn = config.get("dsn")
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigError(
                "the postgres source needs a dsn",
                hint="set `dsn` such as postgresql://user@host:5432/dbname",
            )
        try:
            parts = conninfo_to_dict(dsn)
        except Exception:  # the parser's message may quote the dsn: keep it out
            raise ConfigError(
                "the postgres dsn cannot be parsed",
                hint="use postgresql://user@host:port/dbname or host=... dbname=... form",
            ) from None
        # Not only ``password``: ``sslpassword`` (the client key's passphrase)
        # is a secret too, and the dsn is stored and shown as it is.
        inline = [key for key, value in parts.items() if value and is_credential_key(key)]
        if inline:
            raise ConfigError(
                f"the postgres dsn holds a password ({', '.join(inline)})",
                hint="remove it from the dsn and pass it as `password` from a secret reference",
            )
        sslmode = parts.get("sslmode")
        if sslmode is not None and sslmode not in SSLMODES:
            raise ConfigError(
                f"the postgres dsn's sslmode is {sslmode!r}, which libpq does not take",
                hint=f"use sslmode={' / '.join(SSLMODES)} (verify-full checks the "
                "server's certificate and host name)",
            )
        password = config.get("password")
        if password is not None and not isinstance(password, str):
            raise ConfigError("the postgres password must be text", hint="resolve the secret")
        schemas = config.get("schemas", ["public"])
        if isinstance(schemas, str) or not isinstance(schemas, Sequence) or not schemas:
            raise ConfigError(
                "postgres `schemas` must be a non-empty list of schema names",
                hint="for example schemas: [public, sales]",
            )
        if not all(isinstance(s, str) and s for s in schemas):
            raise ConfigError("every postgres schema name must be non-empty text", hint="fix it")
        timeout = config.get("connect_timeout", 10)
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise ConfigError(
                f"postgres connect_timeout must be a whole number of seconds, not {timeout!r}",
                hint="for example connect_timeout: 10",
            )
        app = parts.get("application_name") or config.get("application_name")
        return cls(
            dsn=dsn,
            password=password or None,
            schemas=tuple(schemas),
            connect_timeout=timeout,
            application_name=str(app or DEFAULT_APPLICATION_NAME),
            slot_prefix=str(config.get("slot_prefix", DEFAULT_SLOT_PREFIX)),
            casts=casts_by_relation(config.get("casts"), "postgres"),
        )

    def casts_for(self, relation: str) -> Mapping[str, str]:
        """The casts declared for ``relation``, however either names it.

        ``orders``, ``public.orders`` and ``"public"."orders"`` are one
        relation, and so are ``"Sales"."T4"`` and ``Sales.T4``: a cast keyed
        one way served a dataset named the other way in one step of a
        capture and not in another.
        """
        from combined.connectors.postgres._catalog import parse_relation

        wanted = parse_relation(relation)
        return {
            column: cast
            for name, columns in self.casts.items()
            if _named(name) == wanted
            for column, cast in columns.items()
        }

    def conninfo(self) -> str:
        """The libpq connection string, password included: never log or show it."""
        extra: dict[str, Any] = {
            "connect_timeout": self.connect_timeout,
            "application_name": self.application_name,
        }
        if self.password:
            extra["password"] = self.password
        return make_conninfo(self.dsn, **extra)

    def scrub(self, text: str) -> str:
        """``text`` without the password (verbatim or in dsn form)."""
        if self.password:
            text = text.replace(self.password, "***")
        return redact(text)


def detail_of(exc: BaseException, settings: Settings) -> str:
    """The scrubbed first meaningful line of a driver error."""
    return next(iter(detail_lines(exc, settings)), type(exc).__name__)


def detail_lines(exc: BaseException, settings: Settings) -> list[str]:
    """Every meaningful line of a driver error, scrubbed.

    A connection to several hosts (or addresses) fails once per attempt, and
    libpq reports each failure on its own line: the telling one need not be
    the first.
    """
    text = str(exc)
    for prefix in ("IO: ", "INVALID_DATA: ", "INVALID_ARGUMENT: ", "INVALID_STATE: ", "UNKNOWN: "):
        text = text.removeprefix(prefix)
    text = text.replace("[libpq] ", "")
    for prefix in ("Failed to connect: ", "Failed to execute query: ", "could not begin COPY: "):
        text = text.replace(prefix, "")
    lines = (ln.strip().replace("FATAL:  ", "").replace("ERROR:  ", "") for ln in text.splitlines())
    return [settings.scrub(ln)[:300] for ln in lines if ln]


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE the driver attached, when it attached one."""
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) and len(state) == 5 else None


def connect_error(exc: BaseException, settings: Settings) -> CombinedError:
    """Classify a failed connection attempt; the password never appears."""
    return connect_failure(detail_of(exc, settings))


def connect_failure(detail: str) -> CombinedError:
    """Classify a failed connection attempt from its scrubbed message ``detail``."""
    low = detail.lower()
    if any(f in low for f in _AUTH_FRAGMENTS) or _NO_ROLE.search(low):
        return AuthRejected(
            f"the postgres server refused the credentials: {detail}",
            hint="check the user in the dsn and the password secret; "
            "the role must exist and have LOGIN",
            detail=detail,
        )
    if "database" in low and "does not exist" in low:
        return ConfigError(
            f"the postgres database does not exist: {detail}",
            hint="fix the database name in the dsn",
            detail=detail,
        )
    return SourceUnavailable(
        f"cannot reach the postgres source: {detail}",
        hint=next(
            (hint for told, hint in _REFUSALS if told in low),
            "check host, port and network, and that the server accepts connections",
        ),
        detail=detail,
    )


#: A server that answered and refused the connection, in its words, and what lifts each
#: (the host and network are fine: the generic hint sent people to check them).
_REFUSALS = (
    (
        "is not currently accepting connections",
        "the database refuses every connection (ALTER DATABASE ... ALLOW_CONNECTIONS false, "
        "as during maintenance): the Run is retried; a DBA lifts it with ALTER DATABASE "
        "<name> ALLOW_CONNECTIONS true",
    ),
    (
        "too many connections for role",
        "the role's CONNECTION LIMIT is reached: the Run is retried; lower the connections "
        "this role holds elsewhere, or ALTER ROLE <role> CONNECTION LIMIT <n>",
    ),
    (
        "too many connections for database",
        "the database's CONNECTION LIMIT is reached: the Run is retried; a DBA raises it "
        "with ALTER DATABASE <name> CONNECTION LIMIT <n>",
    ),
    (
        "too many clients already",
        "the server's max_connections is reached: the Run is retried; free connections, or "
        "raise max_connections (a restart)",
    ),
    (
        "connection slots are reserved",
        "the server's max_connections is reached (the slots left are reserved for "
        "superusers or replication): the Run is retried; free connections, or raise "
        "max_connections (a restart)",
    ),
    (
        "the database system is",
        "the server is starting up, shutting down or recovering: the Run is retried",
    ),
)


#: The server's wordings of its replication limits reached, and what lifts each.
_LIMITS = (
    (
        "all replication slots are in use",
        "every one of the server's max_replication_slots is taken: drop the slots no "
        "longer used (SELECT slot_name, active FROM pg_replication_slots; then "
        "SELECT pg_drop_replication_slot('NAME'); `combined cdc teardown` drops a "
        "dataset's), or raise max_replication_slots (ALTER SYSTEM SET "
        "max_replication_slots = N; it takes a server restart), then capture again",
    ),
    (
        "number of requested standby connections exceeds max_wal_senders",
        "every one of the server's max_wal_senders streams is in use (SELECT * FROM "
        "pg_stat_replication shows them): stop a consumer no longer needed, or raise "
        "max_wal_senders (ALTER SYSTEM SET max_wal_senders = N; it takes a server "
        "restart), then capture again",
    ),
)


def replication_limit(lines: list[str]) -> CombinedError | None:
    """The error of a replication limit the server reached, with what lifts it; else None.

    Not retried: another attempt meets the same limit until a person lifts it
    (it said "check that the server is reachable", which it was).
    """
    for line in lines:
        for wording, hint in _LIMITS:
            if wording in line.lower():
                return SourceError(
                    f"postgresql refused a replication stream: {line}", hint=hint, detail=line
                )
    return None


def query_error(exc: BaseException, settings: Settings, doing: str) -> CombinedError:
    """Classify a failure while ``doing`` something on an open session."""
    detail = detail_of(exc, settings)
    state = sqlstate_of(exc)
    low = detail.lower()
    context: dict[str, Any] = {"detail": detail, "sqlstate": state}
    if state is not None:
        if state.startswith(_TRANSIENT_CLASSES) or state in _TRANSIENT_CODES:
            return SourceUnavailable(
                f"the postgres source failed while {doing}: {detail}",
                hint="the source or the network was interrupted; the attempt can be retried",
                **context,
            )
        if state.startswith("28") or state == "42501":
            return AuthRejected(
                f"the postgres role may not do this while {doing}: {detail}",
                hint="grant the role SELECT on the relation (and USAGE on its schema)",
                **context,
            )
        if state == "42P01":
            return NotFoundError(
                f"a relation is missing while {doing}: {detail}",
                hint="`combined discover SOURCE` lists the relations the source has now",
                **context,
            )
        return SourceError(
            f"the postgres source failed while {doing}: {detail}",
            hint="see the detail; the statement failed on the server",
            **context,
        )
    if isinstance(exc, pa.ArrowInvalid) or "readrecord failed" in low:
        # The driver refused a value it cannot convert (e.g. an interval whose
        # time part overflows nanoseconds): retrying cannot help.
        return SchemaMismatch(
            f"a value does not fit its arrow type while {doing}: {detail}",
            hint='declare casts: {"<table>.<column>": "text"} in the source configuration '
            "for the column holding it",
            **context,
        )
    if isinstance(exc, OSError) or any(f in low for f in _CONNECTION_FRAGMENTS):
        # A stream cut by the network or by pg_terminate_backend has no SQLSTATE.
        return SourceUnavailable(
            f"the postgres connection was lost while {doing}: {detail}",
            hint="the attempt can be retried",
            **context,
        )
    return SourceError(
        f"the postgres driver failed while {doing}: {detail}",
        hint="see the detail",
        **context,
    )


# Float text must round-trip whatever a role or database sets (0 gives 15
# digits): it becomes cursor checkpoints, page edges and values cast to text.
SESSION_SETUP = (
    "SELECT pg_backend_pid(),"
    " set_config('TimeZone', 'UTC', false),"
    " set_config('DateStyle', 'ISO, YMD', false),"
    " set_config('IntervalStyle', 'postgres', false),"
    " set_config('extra_float_digits', '3', false)"
)


#: The driver's databases, kept for the process (see _adbc.SharedDatabases).
_DATABASES = _adbc.SharedDatabases(adbc_driver_postgresql.connect)


class Session:
    """One ADBC connection in autocommit mode, whose transactions we issue ourselves.

    Autocommit leaves BEGIN to us, so ``SET TRANSACTION SNAPSHOT`` can follow
    our own ``BEGIN`` as the transaction's first statement. The session owns
    at most one cursor and one open stream; :meth:`close` closes all three,
    in order, and never raises.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            self._conn: _adbc.Connection | None = _DATABASES.connect(settings.conninfo())
        except DRIVER_ERRORS as exc:
            raise connect_error(exc, settings) from None
        self._cursor: _adbc.Cursor | None = None
        self._reader: pa.RecordBatchReader | None = None
        self.pid = 0
        try:
            self._cursor = self._conn.cursor()
            self.pid = int(self.rows(SESSION_SETUP, "opening the session")[0][0])
        except BaseException:
            self.close()
            raise

    def discard(self) -> None:
        """Release what the session's reads left at its level, its settings back to new.

        ``DISCARD ALL`` returns every setting to its value at connection time
        (the connection string's ``options`` and ``application_name``, the
        role's and database's defaults stay) and releases advisory locks,
        temporary tables and prepared statements: a read's SQL may have made
        any of them (a view's function may call ``set_config`` or take a
        lock), and a changed ``extra_float_digits`` or ``DateStyle`` would
        change the text of a cursor's checkpoint.
        """
        self.run("DISCARD ALL", "releasing what the read left in its session")

    def settle(self) -> None:
        """Set the settings every session reads with (:data:`SESSION_SETUP`) again."""
        self.rows(SESSION_SETUP, "settling a kept session")

    @property
    def streaming(self) -> bool:
        """Whether a result stream is open (and possibly unfinished)."""
        return self._reader is not None

    def transaction_status(self) -> str:
        """libpq's transaction status: ``idle``, ``intrans``, ``inerror``, ``active``."""
        try:
            return str(self._open()[0].handle.get_option(_TXN_STATUS_OPTION))
        except DRIVER_ERRORS:
            return "unknown"

    def _open(self) -> tuple[_adbc.Connection, _adbc.Cursor]:
        if self._conn is None or self._cursor is None:
            raise _adbc.closed_error("the session")
        return self._conn, self._cursor

    def _sql(self, query: str | sql.Composable) -> str:
        return query if isinstance(query, str) else query.as_string(None)

    def run(self, query: str | sql.Composable, doing: str) -> None:
        """Execute a statement that returns no rows (BEGIN, COMMIT, SET ...)."""
        self.end_stream()
        try:
            self._open()[1].execute(self._sql(query))
        except DRIVER_ERRORS as exc:
            raise query_error(exc, self.settings, doing) from None

    def rows(self, query: str | sql.Composable, doing: str) -> list[tuple[Any, ...]]:
        """Execute a small query and return its rows as Python values."""
        self.end_stream()
        try:
            cursor = self._open()[1]
            cursor.execute(self._sql(query))
            return cursor.fetchall()
        except DRIVER_ERRORS as exc:
            raise query_error(exc, self.settings, doing) from None

    def stream(
        self, query: str | sql.Composable, batch_bytes: int, doing: str
    ) -> pa.RecordBatchReader:
        """Execute a query and return its Arrow stream (read lazily, in bounded batches)."""
        self.end_stream()
        try:
            cursor = self._open()[1]
            cursor.set_options(**{BATCH_BYTES_OPTION: str(batch_bytes)})
            cursor.execute(self._sql(query))
            self._reader = cursor.fetch_record_batch()
        except DRIVER_ERRORS as exc:
            raise query_error(exc, self.settings, doing) from None
        return self._reader

    def end_stream(self) -> None:
        """Close the open stream; call only once it is exhausted (else the driver drains it)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def close(self) -> BaseException | None:
        """Close stream, cursor and connection; return the first failure instead of raising.

        An unfinished stream is not drained: closing the connection ends the
        backend, and the server rolls its transaction back.
        """
        first: BaseException | None = None
        reader, self._reader = self._reader, None
        cursor, self._cursor = self._cursor, None
        conn, self._conn = getattr(self, "_conn", None), None
        for closer in (reader, cursor, conn):
            if closer is None:
                continue
            try:
                closer.close()
            except Exception as exc:  # keep closing the rest
                first = first or exc
        return first

    def cancel(self) -> None:
        """Ask the server to end the statement in progress; from any thread, never raises.

        libpq's cancel request travels on a connection of its own, so it
        reaches a backend whose session another thread is blocked on (a fetch
        waiting for rows that do not come). Nothing in progress: nothing happens.
        """
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):  # (a closed or broken connection)
                conn.handle.cancel()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._conn is None


class Sessions:
    """The idle sessions of one source, handed to its next read instead of a new connection.

    A capture of hundreds of small tables opened a connection a table: a new
    server process each, whose catalog caches start cold, so the connection
    and the catalog queries of a table cost more than its rows (200 tables of
    100 rows: 5.4 server CPU-s, against the floor's 0.08). A session is kept
    only when its transaction is over (libpq's status ``idle``: committed,
    nothing streaming), at most :attr:`KEPT` of them, and reused only within
    :attr:`IDLE_S` seconds (a proxy or ``idle_session_timeout`` may end an
    idle connection): an older one is closed. What a read's SQL may have
    made at the session's level (a view's function calling ``set_config``,
    an advisory lock) is released when the session is given back
    (:meth:`Session.discard`), and the settings every session starts with
    are settled again when it is taken (:meth:`Session.settle`); one that
    fails to settle (its backend ended while it was kept) is closed, and
    another, or a new one, is handed out instead.
    :meth:`close` (the source's) closes them.
    """

    KEPT: ClassVar[int] = 2
    IDLE_S: ClassVar[float] = 30.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._idle: list[tuple[float, Session]] = []
        self._closed = False
        # A source dropped without close() still closes what it kept, in order
        # (the driver refuses a connection closed under its open statement).
        weakref.finalize(self, _close_kept, self._idle)

    def take(self) -> Session:
        """A kept session, its settings settled again; else a new one."""
        while (kept := self._kept()) is not None:
            try:
                kept.settle()
            except CombinedError:
                kept.close()  # (it ended while kept: the next, or a new one)
                continue
            except BaseException:
                kept.close()
                raise
            return kept
        return Session(self.settings)

    def _kept(self) -> Session | None:
        """The newest kept session young enough to reuse; older ones are closed."""
        with self._lock:
            stale = self._stale()
            found = None
            while self._idle and (found is None or found.closed):
                found = self._idle.pop()[1]
        _close_kept(stale)
        return None if found is None or found.closed else found

    def give_back(self, session: Session) -> BaseException | None:
        """Keep ``session`` for the next read when its transaction is over; else close it.

        What the read left in the session is released now (:meth:`Session.discard`),
        not when the next read takes it: an advisory lock its SQL took is not held
        while the session waits.
        """
        if session.closed or session.streaming or session.transaction_status() != "idle":
            return session.close()
        try:
            session.discard()
        except CombinedError:
            return session.close()  # (the connection ended: nothing to keep)
        with self._lock:
            stale = self._stale()
            kept = not self._closed and len(self._idle) < self.KEPT
            if kept:
                self._idle.append((time.monotonic(), session))
        _close_kept(stale)
        return None if kept else session.close()

    def _stale(self) -> list[tuple[float, Session]]:
        """Take the kept sessions older than :attr:`IDLE_S` out (under the lock)."""
        limit = time.monotonic() - self.IDLE_S
        stale = [entry for entry in self._idle if entry[0] < limit]
        self._idle[:] = [entry for entry in self._idle if entry[0] >= limit]
        return stale

    def close(self) -> None:
        """Close every kept session; sessions given back later are closed too."""
        with self._lock:
            self._closed = True
            idle = list(self._idle)
            self._idle.clear()
        _close_kept(idle)


def _close_kept(idle: list[tuple[float, Session]]) -> None:
    for _, session in idle:
        session.close()
    idle.clear()


def close_quietly(session: Session | None, primary: BaseException | None) -> BaseException | None:
    """Close ``session``; a failure becomes a redacted note on ``primary``, never a raise."""
    return shared_close_quietly(session, primary, detail_of)


def _named(relation: str) -> tuple[str, str] | None:
    """(schema, table) of a cast key's relation; None for a key no relation can match."""
    from combined.connectors.postgres._catalog import parse_relation

    try:
        return parse_relation(relation)
    except ConfigError:
        return None
