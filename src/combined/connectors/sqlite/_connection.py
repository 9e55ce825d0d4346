"""Opening a SQLite file read-only through ADBC, and naming its failures."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import adbc_driver_sqlite

from combined.connectors import _adbc
from combined.errors import (
    CombinedError,
    NotFoundError,
    SourceError,
    SourceUnavailable,
)

Connection = _adbc.Connection

#: The statement option that sets rows per batch (and rows used for type inference).
BATCH_ROWS_OPTION: str = adbc_driver_sqlite.StatementOptions.BATCH_ROWS.value

#: Errors the driver raises: ``adbc_driver_manager`` errors, and ``OSError``
#: from the Arrow stream when a step fails mid-read.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (_adbc.Error, OSError)


def open_readonly(path: str, *, busy_timeout_ms: int) -> Connection:
    """Open ``path`` read-only (never created, never written) in autocommit mode.

    Autocommit lets the reader issue its own ``BEGIN``/``COMMIT``, so one read
    transaction spans exactly the statements of one extraction.
    """
    file = pathlib.Path(path)
    if not file.exists():
        raise SourceUnavailable(
            f"sqlite database {path!r} does not exist",
            hint="check the source's path, or mount the volume that holds it",
            path=path,
        )
    if file.is_dir():
        raise SourceError(
            f"{path!r} is a directory, not a sqlite database",
            hint="point the source's path at the database file",
            path=path,
        )
    # mode=ro: a source is a system the user does not own; a missing file must
    # never be created and nothing may ever be written to it.
    uri = file.absolute().as_uri() + "?mode=ro"
    try:
        conn = _adbc.Connection(adbc_driver_sqlite.connect(uri))
    except DRIVER_ERRORS as exc:
        raise translate(exc, path) from exc
    try:
        execute(conn, f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    except BaseException:
        conn.close()
        raise
    return conn


def fetch(conn: Connection, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """Run a small catalog query and return its rows (never used for data)."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        rows: list[dict[str, Any]] = cur.fetch_arrow_table().to_pylist()
    return rows


def scalar(conn: Connection, sql: str, params: Sequence[Any] | None = None) -> Any:
    """The single value of a one-row, one-column query (``None`` when no row)."""
    rows = fetch(conn, sql, params)
    if not rows:
        return None
    return next(iter(rows[0].values()))


def execute(conn: Connection, sql: str) -> None:
    """Run a statement whose result is not needed (``BEGIN``, ``PRAGMA``)."""
    with conn.cursor() as cur:
        cur.execute(sql)
        cur.fetch_arrow_table()


def translate(exc: BaseException, path: str) -> CombinedError:
    """The Combined error for a driver failure on the database at ``path``."""
    if isinstance(exc, CombinedError):
        return exc
    detail = (str(exc).splitlines() or [type(exc).__name__])[0]
    text = detail.lower()
    if "not a database" in text:
        return SourceError(
            f"{path!r} is not a sqlite database",
            hint="point the source's path at a sqlite database file",
            path=path,
        )
    if "locked" in text or "busy" in text:
        return SourceUnavailable(
            "the sqlite database is locked by another connection",
            hint="retry later, or raise busy_timeout_ms in the source configuration",
            path=path,
        )
    if "unable to open" in text or "failed to open" in text:
        return SourceUnavailable(
            f"cannot open sqlite database {path!r}",
            hint="check that the file exists and is readable by this process",
            path=path,
        )
    if "no such table" in text or "no such column" in text:
        return NotFoundError(
            f"sqlite relation changed during the read: {detail}",
            hint="the source's schema changed: `combined discover SOURCE` shows it now",
            path=path,
        )
    return SourceError(
        f"sqlite failed: {detail}",
        hint="check the database file with `sqlite3 <file> 'PRAGMA integrity_check'`",
        path=path,
    )
