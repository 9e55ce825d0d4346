"""Settings, PyMySQL sessions and the translation of driver errors.

The password is held only by :class:`Settings` (never in ``repr``), handed to
the driver at connect time, and scrubbed from every driver message before it
reaches a :class:`~combined.errors.CombinedError`. Driver exceptions are never
chained: each classified error is raised outside the driver's handler, so
neither ``__cause__`` nor ``__context__`` holds one, and only the scrubbed
message travels, as ``detail``.

Every session reads text: the driver is given no decoders, so each value
arrives as the server's text (``str``) or, for binary columns, as ``bytes``,
and :mod:`combined.connectors.mariadb._types` turns whole columns into Arrow
arrays with vectorised casts. That skips PyMySQL's per-value ``Decimal`` and
``datetime`` objects, which measured twice as slow (``docs/mariadb.md``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

import pymysql
import pymysql.connections
import pymysql.converters
import pymysql.cursors

from combined.connectors._shared import casts_by_relation
from combined.connectors._shared import close_quietly as shared_close_quietly
from combined.connectors.abc import refuse_unknown_keys
from combined.errors import (
    AuthRejected,
    CombinedError,
    ConfigError,
    NotFoundError,
    SourceError,
    SourceUnavailable,
    redact,
)

CONNECTOR = "mariadb"
_log = logging.getLogger(__name__)
SCHEMES = ("mysql", "mariadb")
DEFAULT_PORT = 3306

#: Everything the driver raises for a failed connection, statement or stream.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (pymysql.err.Error, OSError)

#: Encoders only (keyed by Python type): with no decoders every value arrives as text.
_ENCODERS = {k: v for k, v in pymysql.converters.conversions.items() if not isinstance(k, int)}

# Server error codes (https://mariadb.com/kb/en/mariadb-error-codes/).
_AUTH_CODES = {1045, 1044, 1698, 1251, 1862, 1820, 4151}
_PERMISSION_CODES = {1142, 1143, 1227, 1370}
_UNKNOWN_DB = 1049
_UNKNOWN_THREAD = 1094
_NO_SUCH_TABLE = {1146, 1109}
_NO_SUCH_COLUMN = {1054}
# Client codes (2002-2013: cannot connect, unknown host, gone away, lost) and
# server states after which another attempt may succeed: too many
# connections, shutdown, lock wait, deadlock, query interrupted, statement
# timeouts, read-only snapshot too old, a table altered after the snapshot
# began (1412: the server itself says to retry the transaction).
_TRANSIENT_CODES = {
    1040,
    1053,
    1077,
    1152,
    1158,
    1159,
    1160,
    1161,
    1205,
    1213,
    1317,
    1412,
    1969,
    3024,
    *range(2000, 2056),
}

#: A server that answered and refused a connection, by error code, and what lifts it
#: (the host and network are fine: the generic hint sent people to check them).
_REFUSALS = {
    1040: "the server's max_connections is reached: free connections, or raise it "
    "(SET GLOBAL max_connections = <n>)",
    1203: "the account's MAX_USER_CONNECTIONS (or the server's max_user_connections) is "
    "reached: lower the connections it holds elsewhere, or ALTER USER <account> WITH "
    "MAX_USER_CONNECTIONS <n>",
    1226: "the account's resource limit is reached (MAX_USER_CONNECTIONS, or an hourly "
    "MAX_CONNECTIONS_PER_HOUR or MAX_QUERIES_PER_HOUR): lower its use, or ALTER USER "
    "<account> WITH <limit> <n>",
    1129: "the server blocked this host after many failed connections (max_connect_errors): "
    "a DBA unblocks it with FLUSH HOSTS",
    1053: "the server is shutting down",
}


def _resource_hint(resource: str) -> str:
    """What lifts the account's resource limit ``resource`` (``max_user_connections``...)."""
    return (
        f"the account's {resource} limit is reached: lower its use, or ALTER USER "
        f"<account> WITH {resource.upper()} <n>"
    )


ZeroDates = Literal["error", "null"]
_QUERY_KEYS = ("unix_socket", "ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_identity")


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one MariaDB/MySQL source.

    ``password`` is kept out of ``repr``.
    """

    dsn: str
    host: str
    port: int
    user: str
    database: str
    password: str | None = field(default=None, repr=False)
    query: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: int = 10
    read_timeout: int = 600
    batch_rows: int | None = None
    casts: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    zero_dates: ZeroDates = "error"

    #: The configuration keys a MariaDB source takes: any other is refused.
    KEYS: ClassVar[tuple[str, ...]] = (
        "dsn",
        "password",
        "connect_timeout",
        "read_timeout",
        "batch_rows",
        "casts",
        "zero_dates",
    )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = CONNECTOR) -> Settings:
        """Validate the source configuration (the :attr:`KEYS`)."""
        refuse_unknown_keys(name, config, cls.KEYS)
        dsn = config.get("dsn")
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigError(
                f"the {name} source needs a dsn",
                hint="set `dsn` such as mysql://user@host:3306/dbname",
            )
        url, port = _parsed_dsn(dsn, name)
        database = unquote(url.path.lstrip("/"))
        if not database or "/" in database:
            raise ConfigError(
                f"the {name} dsn names no database",
                hint="end the dsn with the database to read: mysql://user@host:3306/dbname",
            )
        if not url.hostname and "unix_socket" not in url.query:
            raise ConfigError(f"the {name} dsn names no host", hint="mysql://user@host:3306/db")
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        unknown = [k for k in query if k not in _QUERY_KEYS]
        if unknown:
            raise ConfigError(
                f"the {name} dsn has the unknown parameter {unknown[0]!r}",
                hint=f"the dsn takes: {', '.join(_QUERY_KEYS)}",
            )
        _require_files(query, name)
        password = config.get("password")
        if password is not None and not isinstance(password, str):
            raise ConfigError(f"the {name} password must be text", hint="resolve the secret")
        return cls(
            dsn=dsn.strip(),
            host=url.hostname or "localhost",
            port=port,
            user=unquote(url.username or ""),
            database=database,
            password=password or None,
            query=query,
            connect_timeout=_seconds(config, "connect_timeout", 10, name),
            read_timeout=_seconds(config, "read_timeout", 600, name),
            batch_rows=_positive(config.get("batch_rows"), "batch_rows", name),
            casts=casts_by_relation(config.get("casts"), name),
            zero_dates=zero_dates_option(config.get("zero_dates", "error")),
        )

    def scrub(self, text: str) -> str:
        """``text`` without the password (verbatim or in URL/``key=value`` form)."""
        if self.password:
            text = text.replace(self.password, "***")
        return redact(text)

    def connect_kwargs(self) -> dict[str, Any]:
        """PyMySQL's connection arguments, password included: never log or show them."""
        q = self.query
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            # The server hashes the password as the bytes the client wrote it in
            # (utf8mb4 here); PyMySQL would encode a str as latin-1.
            "password": (self.password or "").encode("utf-8"),
            "database": self.database,
            "charset": "utf8mb4",
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "write_timeout": self.read_timeout,
            "autocommit": True,
            "conv": _ENCODERS,
            "cursorclass": pymysql.cursors.SSCursor,
            # An unbuffered read stalls the server's writes while a batch is
            # staged: wait as long as the client waits for the server.
            "init_command": f"SET time_zone = '+00:00', net_write_timeout = {self.read_timeout}",
            "program_name": "combined",
        }
        if "unix_socket" in q:
            kwargs["unix_socket"] = q["unix_socket"]
        for key in ("ssl_ca", "ssl_cert", "ssl_key"):
            if q.get(key):
                kwargs[key] = q[key]
        if "ssl_verify_identity" in q:
            kwargs["ssl_verify_identity"] = q["ssl_verify_identity"].lower() in ("1", "true")
        return kwargs


def _require_files(query: Mapping[str, str], name: str) -> None:
    """Refuse a TLS file the dsn names that is not there (it failed as a network error)."""
    for key in ("ssl_ca", "ssl_cert", "ssl_key"):
        path = query.get(key)
        if path and not os.path.isfile(path):
            raise ConfigError(
                f"the {name} dsn's {key} names {path!r}, which is not a file on this machine",
                hint=f"give {key} the path of the PEM file (absolute, or relative to the "
                "directory Combined runs in)",
                option=key,
            )


def zero_dates_option(value: Any) -> ZeroDates:
    """Validate the ``zero_dates`` policy: ``error`` (default) or ``null``.

    ``zero_dates: null`` in YAML, as the documentation and the errors spell it,
    is a YAML null: it means the ``null`` policy, as the quoted ``"null"`` does.
    """
    if value is None:
        return "null"
    if value not in ("error", "null"):
        raise ConfigError(
            f"zero_dates must be 'error' or 'null', not {value!r}",
            hint="'error' refuses 0000-00-00 values; 'null' reads them as nulls",
        )
    return "null" if value == "null" else "error"


def _parsed_dsn(dsn: str, name: str) -> tuple[SplitResult, int]:
    """The dsn split into its parts, and its port: refused unparsable, of another scheme,
    or holding a password (which the error never quotes)."""
    try:
        url = urlsplit(dsn.strip())
        port = url.port or DEFAULT_PORT
    except ValueError:  # the parser's message may quote the dsn: keep it out
        url = None
    if url is None:  # raised outside the handler: the parser's error is not its context
        raise ConfigError(
            f"the {name} dsn cannot be parsed",
            hint="use mysql://user@host:port/dbname (or mariadb://...)",
        )
    if url.scheme.lower() not in SCHEMES:
        raise ConfigError(
            f"the {name} dsn must start with mysql:// or mariadb://",
            hint="use mysql://user@host:port/dbname",
        )
    if url.password is not None:
        raise ConfigError(
            f"the {name} dsn holds a password",
            hint="remove it from the dsn and pass it as `password` from a secret reference",
        )
    return url, port


def _seconds(config: Mapping[str, Any], key: str, default: int, name: str) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} {key} must be a whole number of seconds, not {value!r}",
            hint=f"for example {key}: {default}",
        )
    return value


def _positive(value: Any, key: str, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} {key} must be a positive whole number, not {value!r}",
            hint=f"for example {key}: 10000",
        )
    return value


# -- errors -------------------------------------------------------------------


def error_code(exc: BaseException) -> int | None:
    """The server or client error number PyMySQL attached, if any."""
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def detail_of(exc: BaseException, settings: Settings) -> str:
    """The scrubbed message of a driver error, one line."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    text = str(args[1]) if len(args) > 1 else str(exc)
    line = (text.strip().splitlines() or [type(exc).__name__])[0]
    return settings.scrub(line)[:300]


def connect_error(exc: BaseException, settings: Settings) -> CombinedError:
    """Classify a failed connection attempt; the password never appears."""
    code = error_code(exc)
    detail = detail_of(exc, settings)
    where = f"{settings.host}:{settings.port}/{settings.database}"
    context: dict[str, Any] = {"detail": detail, "code": code, "server": where}
    if code in _AUTH_CODES:
        return AuthRejected(
            f"the {CONNECTOR} server refused the credentials of {settings.user!r}: {detail}",
            hint="check the user in the dsn and the password secret; the account must exist "
            "for the host it connects from and be granted access to the database",
            **context,
        )
    if code == _UNKNOWN_DB:
        return ConfigError(
            f"the {CONNECTOR} database {settings.database!r} does not exist: {detail}",
            hint="fix the database name at the end of the dsn",
            **context,
        )
    if code in _REFUSALS:
        limit = re.search(r"exceeded the '(\w+)' resource", detail) if code == 1226 else None
        told = _REFUSALS[code] if limit is None else _resource_hint(limit.group(1))
        return SourceUnavailable(
            f"the {CONNECTOR} server at {where} refused the connection: {detail}",
            hint=f"{told}; the attempt can be retried",
            **context,
        )
    if code is None or code in _TRANSIENT_CODES or isinstance(exc, OSError):
        return SourceUnavailable(
            f"cannot reach the {CONNECTOR} source at {where}: {detail}",
            hint="check host, port and network, and that the server accepts connections; "
            "the attempt can be retried",
            **context,
        )
    return SourceError(
        f"the {CONNECTOR} source refused the connection: {detail}",
        hint="see the detail; the server refused the session",
        **context,
    )


def query_error(exc: BaseException, settings: Settings, doing: str) -> CombinedError:
    """Classify a failure while ``doing`` something on an open session."""
    if isinstance(exc, CombinedError):
        return exc
    code = error_code(exc)
    detail = detail_of(exc, settings)
    context: dict[str, Any] = {"detail": detail, "code": code}
    if code in _PERMISSION_CODES or code in _AUTH_CODES:
        return AuthRejected(
            f"the {CONNECTOR} account may not do this while {doing}: {detail}",
            hint="grant the account SELECT on the table (GRANT SELECT ON db.table TO user)",
            **context,
        )
    if code in _NO_SUCH_TABLE or code in _NO_SUCH_COLUMN:
        return NotFoundError(
            f"a table or column is missing while {doing}: {detail}",
            hint="the source's schema changed: `combined discover SOURCE` shows it now",
            **context,
        )
    if code is None or code in _TRANSIENT_CODES or isinstance(exc, OSError):
        return SourceUnavailable(
            f"the {CONNECTOR} connection failed while {doing}: {detail}",
            hint="the source or the network was interrupted; the attempt can be retried",
            **context,
        )
    return SourceError(
        f"the {CONNECTOR} source failed while {doing}: {detail}",
        hint="see the detail; the statement failed on the server",
        **context,
    )


# -- sessions -----------------------------------------------------------------


class DriverConnection(pymysql.connections.Connection):  # type: ignore[misc]
    """PyMySQL's connection, its TLS context for the PREFERRED mode made once.

    Without TLS options PyMySQL tries TLS and falls back without it
    (PREFERRED), verifying nothing, yet loads the system's certificates into
    a new context for every connection: ~24 ms of CPU, most of a small
    table's read (a capture of 100 small tables: 2.4 CPU-s of ~13). The
    options given in the DSN (``ssl_ca``, ...) still get a context of their
    own each time, read from their files.
    """

    _preferred: ClassVar[Any] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ``mysql-replication`` opens its control connection with PyMySQL's deprecated
        # ``db``: given as ``database``, no warning (filtered around every event read,
        # the filter cost ~13% of a binlog read of single-row transactions).
        if "db" in kwargs:
            kwargs["database"] = kwargs.pop("db")
        super().__init__(*args, **kwargs)

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        if sslp != {}:
            return super()._create_ssl_ctx(sslp)
        if DriverConnection._preferred is None:
            DriverConnection._preferred = super()._create_ssl_ctx({})
        return DriverConnection._preferred


def stream_connection(settings: Settings) -> dict[str, Any]:
    """The connection settings of a binlog stream (``mysql-replication``'s)."""
    kwargs = settings.connect_kwargs()
    connection = {
        k: kwargs[k]
        for k in ("host", "port", "user", "password", "connect_timeout", "read_timeout")
    }
    for k in ("unix_socket", "ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_identity"):
        if k in kwargs:
            connection[k] = kwargs[k]
    return connection


def next_event(stream: Any) -> Any:
    """A binlog stream's next event, or None at the log's end.

    (The stream's connections are :class:`DriverConnection`: the library's
    deprecated ``db`` argument warns no more.)
    """
    return stream.fetchone()


class Session:
    """One PyMySQL connection in autocommit mode, whose transactions we issue ourselves.

    The session owns at most one open unbuffered result. :meth:`close` never
    raises and never drains a half-read result: it drops the socket, and the
    server rolls an open transaction back.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._cursor: Any = None
        failure: CombinedError | None = None
        try:
            self._conn: Any = DriverConnection(**settings.connect_kwargs())
        except DRIVER_ERRORS as exc:
            failure = connect_error(exc, settings)
        if failure is not None:  # raised outside the handler: no driver exception in context
            raise failure

    def _live(self) -> Any:
        if self._conn is None:
            raise SourceError("the session is closed", hint="open a new session")
        return self._conn

    def literal(self, value: Any) -> str:
        """``value`` as a SQL literal, escaped by the driver for this connection."""
        with self._live().cursor(pymysql.cursors.Cursor) as cur:
            return str(cur.mogrify("%s", (value,)))

    def run(self, query: str, doing: str) -> None:
        """Execute a statement that returns no rows (START TRANSACTION, COMMIT, SET ...)."""
        self.rows(query, doing)

    def rows(self, query: str, doing: str) -> list[tuple[Any, ...]]:
        """Execute a small query and return its rows as text."""
        self.end_stream()
        failure: CombinedError | None = None
        try:
            with self._live().cursor(pymysql.cursors.Cursor) as cur:
                cur.execute(query)
                return list(cur.fetchall())
        except DRIVER_ERRORS as exc:
            failure = query_error(exc, self.settings, doing)
        raise failure

    def stream(self, query: str, doing: str) -> Any:
        """Execute a query unbuffered; fetch its rows with :meth:`fetch`."""
        self.end_stream()
        failure: CombinedError | None = None
        try:
            self._cursor = self._live().cursor(pymysql.cursors.SSCursor)
            self._cursor.execute(query)
            return self._cursor
        except DRIVER_ERRORS as exc:
            failure = query_error(exc, self.settings, doing)
        raise failure

    def fetch(
        self, rows: int, wide: Sequence[int] = (), budget: int = 0
    ) -> tuple[list[tuple[Any, ...]], bool]:
        """Up to ``rows`` rows of the open stream, and whether it ended.

        With ``wide`` (positions of columns whose values may be long), the
        fetch also stops after the row that brings those values' bytes to
        ``budget``: the chunk's size is known as it is read, whatever an
        earlier chunk's rows weighed.
        """
        failure: CombinedError | None = None
        try:
            if not wide:
                got = list(self._cursor.fetchmany(rows))
                return got, len(got) < rows
            return _fetch_within(self._cursor, rows, wide, budget)
        except DRIVER_ERRORS as exc:
            failure = query_error(exc, self.settings, "reading rows")
        raise failure

    def end_stream(self) -> None:
        """Close the open stream; call only once it is exhausted (else the driver drains it)."""
        cursor, self._cursor = self._cursor, None
        if cursor is None:
            return
        failure: CombinedError | None = None
        try:
            cursor.close()
        except DRIVER_ERRORS as exc:
            failure = query_error(exc, self.settings, "closing the result")
        if failure is not None:
            raise failure

    def close(self) -> BaseException | None:
        """Drop the connection; return a failure instead of raising.

        A half-read unbuffered result is not drained: the socket is closed,
        and the server ends the session and rolls its transaction back.
        """
        self._cursor = None
        conn, self._conn = self._conn, None
        if conn is None:
            return None
        try:
            conn.close()
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn._force_close()  # the socket must go even when QUIT cannot be sent
            return exc
        return None

    def cancel(self) -> None:
        """Ask the server to end the statement in progress; from any thread, never raises.

        The session's connection is busy (another thread waits on it), so
        :func:`kill_query` asks on a connection of its own. The statement
        fails as interrupted (1317) and the session stays open; nothing in
        progress: nothing happens.
        """
        conn = self._conn
        if conn is None:
            return
        connection_id = int(conn.thread_id())
        try:
            kill_query(self.settings, connection_id)
        except Exception as exc:  # noqa: BLE001 - asked again while the statement holds the read
            if error_code(exc) != _UNKNOWN_THREAD:  # (the statement's connection ended)
                _log.warning(
                    "could not end the statement of mariadb connection %d: %s",
                    connection_id,
                    detail_of(exc, self.settings),
                )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._conn is None


#: Seconds a cancel's own connection may take to connect and to be answered.
KILL_TIMEOUT_S = 5


def kill_query(settings: Settings, connection_id: int) -> None:
    """End the statement connection ``connection_id`` runs (``KILL QUERY``); raises the
    driver's error.

    It goes on a connection of the source's account opened for that alone:
    an account may end its own statements without any privilege.
    """
    kwargs = settings.connect_kwargs()
    timeout = min(settings.connect_timeout, KILL_TIMEOUT_S)
    kwargs.update(
        connect_timeout=timeout,
        read_timeout=KILL_TIMEOUT_S,
        write_timeout=KILL_TIMEOUT_S,
        init_command=None,
        cursorclass=pymysql.cursors.Cursor,
    )
    conn = DriverConnection(**kwargs)
    try:
        with conn.cursor() as cur:
            cur.execute(f"KILL QUERY {int(connection_id)}")
    finally:
        conn.close()


def close_quietly(session: Session | None, primary: BaseException | None) -> BaseException | None:
    """Close ``session``; a failure becomes a redacted note on ``primary``, never a raise."""
    return shared_close_quietly(session, primary, detail_of)


def quote_ident(name: str) -> str:
    """Quote an identifier for MariaDB/MySQL (backticks, embedded backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def _fetch_within(
    cursor: Any, rows: int, wide: Sequence[int], budget: int
) -> tuple[list[tuple[Any, ...]], bool]:
    """Rows of ``cursor`` until ``rows`` of them, ``wide``'s bytes reach ``budget``, or the end."""
    out: list[tuple[Any, ...]] = []
    size = 0
    while len(out) < rows:
        row = cursor.fetchone()
        if row is None:
            return out, True
        out.append(row)
        for i in wide:
            value = row[i]
            if value is not None:
                size += len(value)
        if size >= budget:
            break
    return out, False
