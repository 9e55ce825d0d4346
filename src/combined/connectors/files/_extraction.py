"""One read of a file set: list, stream exactly that list, prove it unchanged."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from combined.connectors._shared import ControlTotals
from combined.connectors.abc import BaseExtraction, ReadRequest
from combined.connectors.files import _scan
from combined.connectors.files._listing import (
    LISTING_AUTHORITY,
    FollowSymlinks,
    Listing,
    list_files,
)
from combined.connectors.files._settings import FileSet, Format
from combined.errors import ConfigError, ProtocolViolation, SchemaMismatch, SourceError
from combined.protocol import Message, RecordBatchMessage, StateMessage, TerminalOutcome, utcnow

#: The reader's version in a read's fingerprint: changed whenever what a read
#: makes of the same files changes (types, parsing), so that files read by an
#: older reader are read again, never taken as unchanged.
READER = "files-3"


def empty_match(
    file_set: FileSet,
    root: Path,
    dataset: str,
    listing: Listing | None = None,
    *,
    rowless: bool = False,
) -> SourceError:
    """The refusal of a read whose glob matched no file, only empty ones, or (``rowless``)
    only files that hold no row (a header alone, an empty JSON array)."""
    where = f"files.{file_set.name}" if file_set.declared else "a file set under config.files"
    n = len(listing.entries) if listing else 0
    found = f"only {n} empty files" if n else "no file"
    if rowless:
        found = f"{n} file(s) that hold no row (a header alone, or no record)"
    return SourceError(
        f"{file_set.glob!r} matches {found} under {str(root)!r}: an empty snapshot would "
        f"delete every row of dataset {dataset!r}, so nothing was read",
        hint=f"check the glob and the source's path; if no row at all is a real state, set "
        f"`allow_empty: true` in {where}",
        relation=file_set.name,
        glob=file_set.glob,
    )


class FilesExtraction(BaseExtraction):
    """A snapshot read of one file set through DuckDB, in bounded Arrow batches.

    Iterating lists the files, reads exactly that list and stats it again
    once every row is read: a changed or vanished file fails the read as
    transient before its final state, so nothing of it is committed. The
    verified listing is the read's snapshot: its digest is the receipt's
    source token. Iterating twice, or after :meth:`finish`, is a
    :class:`~combined.errors.ProtocolViolation`.
    """

    def __init__(
        self,
        *,
        root: Path,
        file_set: FileSet,
        request: ReadRequest,
        control: bool | str,
        follow_symlinks: FollowSymlinks = "within",
    ) -> None:
        super().__init__()
        self._root = root
        self._follow_symlinks: FollowSymlinks = follow_symlinks
        self._set = file_set
        self._request = request
        self._control_ask = control
        self._control: ControlTotals | None = None
        #: The Parquet footers' row count, read once before the rows (the
        #: listing, verified unchanged after them, says it still holds).
        self._footer_rows: int | None = None
        self._empty_schema: pa.Schema | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        #: Each column's DuckDB type, inferred once per read (None: Parquet, or not yet).
        self._typed: list[tuple[str, str]] | None = None
        #: The rows the previous read found in the same files, when this read took them
        #: as unchanged and read nothing (``skip_unchanged``); None when it read them.
        self.unchanged_rows: int | None = None
        self._rows = 0
        self._guard = threading.Lock()
        self._started = False
        self._finished = False

    @property
    def empty_schema(self) -> pa.Schema | None:
        """The columns of a read that returned no row, when the declared types give them.

        A first capture has no batch to take its schema from: no file
        (``allow_empty``), or files of a header alone.
        """
        return self._empty_schema

    @property
    def control_totals(self) -> ControlTotals | None:
        """Rows counted from Parquet footers (and a sum when asked), once the read ends.

        None for CSV and JSON without a ``control_sum``: counting their rows
        would parse every file a second time with the same reader.
        """
        return self._control

    def _claim(self) -> duckdb.DuckDBPyConnection:
        with self._guard:
            if self._finished:
                raise ProtocolViolation(
                    "the extraction is finished", hint="start a new read to read again"
                )
            if self._started:
                raise ProtocolViolation(
                    "the extraction was already read", hint="start a new read for another pass"
                )
            self._started = True
            self._con = _scan.connect()
            return self._con

    def _live(self) -> None:
        if self._finished:
            raise ProtocolViolation(
                "the extraction is finished", hint="start a new read to read again"
            )

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        with self._guard:
            self._finished = True
            con, self._con = self._con, None
        if con is not None:
            con.close()
        return ()

    def _messages(self) -> Iterator[Message]:
        con = self._claim()
        request = self._request
        relation = self._set.name
        self.authority.acquire()
        listed_at = utcnow()
        listing = list_files(self._root, self._set.glob, relation, self._follow_symlinks)
        fmt: Format = "csv"
        readable = listing
        try:
            if listing.entries:
                fmt = self._set.format_for([e.name for e in listing.entries])
                readable = listing.readable(fmt)
            fingerprint = self._fingerprint(listing)
            if not readable.entries:
                if not self._set.allow_empty:
                    raise empty_match(self._set, self._root, request.dataset, listing)
                if self._set.columns:
                    self._empty_schema = _scan.declared_schema(con, self._set, request.columns)
            elif not self._unchanged(fingerprint):  # else the committed read's files: no read
                yield from self._batches(con, fmt, readable)
                if self._rows == 0 and not self._set.allow_empty:
                    # (nothing was handed over: no batch holds a row)
                    raise empty_match(
                        self._set, self._root, request.dataset, readable, rowless=True
                    )
                self._control = self._totals(con, fmt, readable)
        except (*_scan.DUCKDB_ERRORS, pa.ArrowException, OSError) as exc:
            # A file that changed under the reader explains any parse failure.
            listing.verify(relation)
            error = _scan.translate(exc, readable, relation)
            if isinstance(error, SchemaMismatch) and "file" not in error.context:
                # Some failures (a JSON line that is no object) name no file.
                columns = None if request.columns is None else list(dict.fromkeys(request.columns))
                name = _scan.locate(con, self._set, fmt, readable, columns)
                if name is not None:
                    error = SchemaMismatch(
                        f"file {name!r}: {error.message}",
                        hint=error.hint,
                        **{**error.context, "file": name},
                    )
            raise error from exc
        except SourceError:
            listing.verify(relation)
            raise
        listing.verify(relation)
        self.authority.acquire_snapshot(LISTING_AUTHORITY, listing.token(), at=listed_at)
        self.authority.complete()
        rows = self._rows if self.unchanged_rows is None else self.unchanged_rows
        state = {} if fingerprint is None else {"listing": fingerprint, "rows": rows}
        yield StateMessage(request.dataset, state, final=True)

    def _fingerprint(self, listing: Listing) -> str | None:
        """The digest of what the read's rows depend on: the files as listed, the read's
        settings and the reader; None where the file system cannot prove a file unchanged.

        A file's content cannot change without its status-change time
        (``ctime``, which no program sets) or its inode changing with it.
        """
        entries = listing.entries
        if not entries or any(e.inode == 0 or e.ctime_ns == 0 for e in entries):
            return None
        request = self._request
        what = {
            "reader": (READER, duckdb.__version__),
            "set": repr(self._set),
            "read": [request.columns, request.key],
            "files": [[e.name, e.size, e.mtime_ns, e.inode, e.ctime_ns] for e in entries],
        }
        text = json.dumps(what, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _unchanged(self, fingerprint: str | None) -> bool:
        """Whether the committed read was of exactly these files (then its rows are taken).

        Asked only where the engine allows it (``skip_unchanged``: a snapshot
        merged by key), and only of the state committed with the lake.
        """
        prior = self._request.state or {}
        rows = prior.get("rows")
        if not (
            self._request.options.get("skip_unchanged")
            and fingerprint is not None
            and prior.get("listing") == fingerprint
            and isinstance(rows, int)
        ):
            return False
        self.unchanged_rows = rows
        return True

    def _batches(
        self, con: duckdb.DuckDBPyConnection, fmt: Format, listing: Listing
    ) -> Iterator[Message]:
        request = self._request
        if fmt == "parquet":
            self._footer_rows = _scan.check_parquet(listing, self._set.name, request.columns)
        typed = self._typed = _scan.infer(con, self._set, fmt, listing)
        columns = self._columns(con, fmt, listing, typed)
        query = _scan.select(self._set, fmt, listing, columns, typed)
        reader: pa.RecordBatchReader = con.sql(query).to_arrow_reader(request.batch_rows)
        rows = 0
        for batch in reader:
            for offset in range(0, batch.num_rows, request.batch_rows):
                piece = batch.slice(offset, request.batch_rows)
                self.authority.count(piece.num_rows, piece.nbytes)
                rows += piece.num_rows
                yield RecordBatchMessage(request.dataset, piece)
                self._live()
        self._rows = rows
        if rows == 0 and set(reader.schema.names) <= set(self._set.types):
            # Files of a header alone, every column declared. (Undeclared, a
            # header's columns have no type yet: DuckDB would say VARCHAR.)
            self._empty_schema = reader.schema

    def _columns(
        self,
        con: duckdb.DuckDBPyConnection,
        fmt: Format,
        listing: Listing,
        typed: list[tuple[str, str]] | None,
    ) -> list[str] | None:
        """The read's columns (all when none are named); refuse names the files lack."""
        request = self._request
        wanted = [*(request.columns or ()), *request.key]
        if not wanted:
            return None
        if typed is None:
            typed = _scan.describe(con, _scan.select(self._set, fmt, listing))
        have = [n for n, _ in typed]
        missing = [c for c in wanted if c not in have]
        if missing:
            from combined.errors import NotFoundError

            raise NotFoundError(
                f"column {missing[0]!r} is in no file of {self._set.name!r}",
                hint="run `combined discover` to see the files' columns; fix the key or columns",
                relation=self._set.name,
                column=missing[0],
            )
        return None if request.columns is None else list(dict.fromkeys(request.columns))

    def _totals(
        self, con: duckdb.DuckDBPyConnection, fmt: Format, listing: Listing
    ) -> ControlTotals | None:
        ask = self._control_ask
        if not ask:
            return None
        column = ask if isinstance(ask, str) else None
        if fmt != "parquet" and column is None:
            return None
        rows = self._footer_rows if fmt == "parquet" else None
        total: Any = None
        if column is not None:
            query = _scan.select(self._set, fmt, listing, typed=self._typed)
            col = _scan.quote_ident(column)
            if not any(n == column for n, _ in _scan.describe(con, query)):
                raise ConfigError(
                    f"control_sum column {column!r} is in no file of {self._set.name!r}",
                    hint="name a numeric column of the files, or remove control_sum",
                )
            row = con.execute(
                f"SELECT count(*), CAST(sum({col}) AS VARCHAR) FROM ({query})"
            ).fetchone()
            assert row is not None
            rows = int(row[0]) if rows is None else rows
            total = row[1]
        assert rows is not None
        return ControlTotals(rows=rows, sum_column=column, sum=total)


__all__ = ["FilesExtraction", "empty_match"]
