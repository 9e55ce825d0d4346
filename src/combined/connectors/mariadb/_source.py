"""The MariaDB/MySQL source: check, discover and read."""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from combined.connectors._shared import cursor_order, unreadable_column_fix
from combined.connectors.abc import (
    BaseExtraction,
    BaseSource,
    DatasetDiscovery,
    Discovery,
    KeyMeasure,
    ReadRequest,
    refuse_bounds,
    require_cursor_and_key,
)
from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._connect import Session, Settings
from combined.connectors.mariadb._extract import MariaDBExtraction
from combined.connectors.mariadb._read_plan import ReadOptions, refuse_cursor_order
from combined.errors import ConfigError
from combined.protocol import utcnow


class MariaDBSource(BaseSource):
    """A MariaDB or MySQL database read through PyMySQL as bounded Arrow batches.

    Configuration:

    ``dsn``
        ``mysql://user@host:port/dbname`` or ``mariadb://...``, without a
        password (one inside is refused). Query parameters: ``unix_socket``,
        ``ssl_ca``, ``ssl_cert``, ``ssl_key``, ``ssl_verify_identity``.
    ``password`` (optional)
        The resolved secret (``password: {secret: "env:NAME"}`` in the
        project file). Handed to the driver only when connecting and
        scrubbed from every error.
    ``connect_timeout`` / ``read_timeout`` (optional, default 10 / 600)
        Seconds before an unreachable server, or a server that sends nothing
        for that long during a read, is reported as
        :class:`~combined.errors.SourceUnavailable`.
    ``batch_rows`` (optional)
        An upper bound on rows per batch for this source, on top of the
        request's ``batch_rows``.
    ``casts`` (optional)
        ``{"table.column": "text"}``: read those columns as the server's
        text (unsupported types, zero dates, times beyond a day).
    ``zero_dates`` (optional, ``error`` or ``null``; default ``error``)
        What a read does with a ``0000-00-00`` date: refuse it, naming the
        column, or read it as a null.

    Any other key is refused, naming the closest one that is taken.

    Datasets are tables and views of the dsn's database (``table``, or
    ``database.table`` for another database). Every read is one
    ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`` transaction;
    see :mod:`combined.connectors.mariadb._extract` for the receipt
    boundaries and read options, and :mod:`combined.connectors.mariadb._types`
    for the type mapping.
    """

    name: ClassVar[str] = "mariadb"
    revision: ClassVar[str] = "1"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = True
    SUPPORTS_CDC: ClassVar[bool] = True
    CURSOR_NEEDS_KEY: ClassVar[bool] = True
    SUPPORTS_PARTITIONS: ClassVar[bool] = False
    SUPPORTS_CONTROL_TOTALS: ClassVar[bool] = True
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = Settings.KEYS

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.settings = Settings.from_config(config, self.name)
        # Keep the configuration, but never the secret, on the instance.
        super().__init__({k: ("***" if k == "password" else v) for k, v in config.items()})
        self._lock = threading.Lock()
        self._extractions: weakref.WeakSet[MariaDBExtraction] = weakref.WeakSet()

    def check(self) -> None:
        """Connect, authenticate and open the dsn's database.

        Raises :class:`~combined.errors.SourceUnavailable` (unreachable),
        :class:`~combined.errors.AuthRejected` (credentials or access refused)
        or :class:`~combined.errors.ConfigError` (unknown database).
        """
        session = Session(self.settings)
        try:
            session.rows("SELECT 1", "checking the session")
        finally:
            session.close()

    def measure_key(self, relation: str, key: Sequence[str]) -> KeyMeasure:
        """Rows, distinct key values and rows with a null key part of ``relation``."""
        cols = [f"`{k.replace('`', '``')}`" for k in key]
        parts = catalog.parse_relation(relation, self.settings.database)
        table = ".".join(f"`{p.replace('`', '``')}`" for p in parts)
        query = (
            f"SELECT COUNT(*), COUNT(DISTINCT {', '.join(cols)}), "
            f"COALESCE(SUM({' OR '.join(f'{c} IS NULL' for c in cols)}), 0) FROM {table}"
        )
        session = Session(self.settings)
        try:
            ((rows, distinct, nulls),) = session.rows(query, f"measuring the key of {relation}")
        finally:
            session.close()
        # COUNT(DISTINCT) leaves out a key with a null part, as the measure wants.
        return KeyMeasure(int(rows), int(distinct), int(nulls), query)

    def feed_retention(self) -> Mapping[str, Any]:
        """How long the server keeps a closed binlog file."""
        from combined.connectors.mariadb._binlog_setup import retention_seconds

        session = Session(self.settings)
        try:
            seconds = retention_seconds(session)
        finally:
            session.close()
        return {
            "kind": "binlog",
            "retention_seconds": seconds,
            "query": "SELECT @@binlog_expire_logs_seconds, @@expire_logs_days",
        }

    def preflight(self, requests: Sequence[ReadRequest]) -> None:
        """Refuse, before any Run, a read selecting a column without an Arrow type, or
        a cursor or key that cannot order pages.

        A geometry column was a needs_review Run that `combined check` had passed.
        """
        session = Session(self.settings)
        try:
            rels = catalog.find_relations(
                session, [r.relation for r in requests], self.settings.database
            )
            by_db: dict[str, list[str]] = defaultdict(list)
            for rel in rels.values():
                by_db[rel.database].append(rel.table)
            cols_of = {db: catalog.columns(session, db, tables) for db, tables in by_db.items()}
            for r in requests:
                rel = rels[r.relation]
                cols = cols_of[rel.database].get(rel.table, [])
                cdc = r.strategy == "cdc"
                casts = {} if cdc else ReadOptions.of(r, self.settings).casts
                plans = catalog.column_plans(cols, casts, rel.table)
                for p in plans:
                    if p.arrow_type is None and (r.columns is None or p.name in r.columns):
                        raise ConfigError(
                            f"dataset {r.dataset!r}: column {p.name!r} of {rel.table!r} has "
                            f"type {p.source_type}: {p.reason}",
                            hint=unreadable_column_fix(rel.table, [p.name], cdc=cdc, quote="`"),
                            dataset=r.dataset,
                            column=p.name,
                        )
                by_name = {p.name: p for p in plans}
                spec = r.cursor
                if r.strategy == "cursor" and spec is not None:
                    order = cursor_order(spec.column, r.key)
                    if all(c in by_name for c in order):  # a name missing: the read says so
                        refuse_cursor_order(r.dataset, by_name, spec.column, r.key)
        finally:
            session.close()

    def read_warnings(self, requests: Sequence[ReadRequest]) -> list[str]:
        """Datasets without ``columns:`` read through column grants alone: the server hides
        the columns the account holds no grant on, and a read leaves them out unsaid."""
        from combined.connectors.mariadb._grants import column_grant_warnings

        session = Session(self.settings)
        try:
            return column_grant_warnings(session, requests, self.settings.database)
        finally:
            session.close()

    def discover(self) -> Discovery:
        """Tables and views of the dsn's database with columns, keys and cursor evidence."""
        session = Session(self.settings)
        try:
            at = utcnow()
            db = self.settings.database
            rels = catalog.list_relations(session, db)
            tables = [r.table for r in rels]
            cols = catalog.columns(session, db, tables)
            idx = catalog.indexes(session, db, tables)
            casts = self.settings.casts
            datasets = tuple(
                catalog.describe(
                    r,
                    cols.get(r.table, []),
                    idx.get(r.table, []),
                    casts.get(r.table) or casts.get(f"{db}.{r.table}"),
                )
                for r in rels
            )
        finally:
            session.close()
        return Discovery(self.name, self.revision, datasets, discovered_at=at)

    def describe_relation(self, relation: str) -> DatasetDiscovery:
        """What discovery reports of one relation; :class:`NotFoundError` when it is gone."""
        session = Session(self.settings)
        try:
            rel = catalog.find_relation(session, relation, self.settings.database)
            casts = self.settings.casts
            return catalog.describe(
                rel,
                catalog.columns(session, rel.database, [rel.table]).get(rel.table, []),
                catalog.indexes(session, rel.database, [rel.table]).get(rel.table, []),
                casts.get(rel.table) or casts.get(f"{rel.database}.{rel.table}"),
            )
        finally:
            session.close()

    def read(self, request: ReadRequest) -> BaseExtraction:
        """A lazy read of one relation; nothing touches the server until iterated.

        ``snapshot`` reads the whole relation; ``cursor`` pages by keyset over
        (cursor, key) up to ``MAX(cursor)`` read in the same snapshot,
        resuming from ``request.state["cursor"]`` minus the cursor's lookback.
        ``cdc`` reads a stitched snapshot first (its pinned binlog position as
        the state), then the binlog from the committed position
        (:mod:`combined.connectors.mariadb._binlog`).
        """
        if request.strategy == "cdc":
            from combined.connectors.mariadb._binlog_stitch import cdc_read

            return cdc_read(self.settings, request)
        if request.strategy not in ("snapshot", "cursor"):
            raise ConfigError(
                f"the {self.name} connector cannot read with strategy {request.strategy!r}",
                hint="use snapshot, cursor or cdc",
                dataset=request.dataset,
            )
        refuse_bounds(
            self.name, request, "drop the bounds: a read is one transaction over the relation"
        )
        require_cursor_and_key(request)
        options = ReadOptions.of(request, self.settings)
        ext = MariaDBExtraction(self.settings, request, options)
        with self._lock:
            self._extractions.add(ext)
        return ext

    def cdc_check(
        self, relations: Sequence[str], committed: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """Raise naming every unmet binlog requirement (``_binlog_setup``) and its fix.

        ``committed``: the checkpoints the lake resumes ``relations`` from; a position
        the server no longer holds (purged), or holds in another log (begun again),
        raises :class:`~._binlog_setup.BinlogGone` naming the new snapshot, as the
        capture would. A relation without one takes its first snapshot next, which
        a table of a non-transactional engine cannot give.
        """
        from combined.connectors.mariadb._binlog_stitch import check_server

        for relation in relations:
            check_server(self.settings, relation, (committed or {}).get(relation))

    def cdc_setup(self, relation: str, committed: Mapping[str, Any] | None = None) -> str:
        """Verify the server's binlog settings and grants (the position comes with a read)."""
        self.cdc_check([relation], None if committed is None else {relation: committed})
        return (
            f"binary log settings and grants verified for {relation}; the first capture "
            "records the binlog position of its consistent snapshot"
        )

    def cdc_status(
        self, relation: str, committed: Mapping[str, Any] | None = None
    ) -> Mapping[str, Any]:
        """The server's binlog position and retention, and how long the consumer may stay down."""
        from combined.connectors.mariadb._binlog_setup import stream_status

        session = Session(self.settings)
        try:
            return stream_status(session, committed)
        finally:
            session.close()

    def cdc_teardown(self, relation: str, committed: Mapping[str, Any] | None = None) -> str:
        """Nothing on the server holds a binlog consumer: only the checkpoint is voided."""
        return "no server object to drop (the binlog position lives in the lake's checkpoint)"

    def close(self) -> None:
        """Abort extractions that were never finished (their sessions are dropped)."""
        with self._lock:
            exts, self._extractions = list(self._extractions), weakref.WeakSet()
        for ext in exts:
            ext.finish("abort")


class MySQLSource(MariaDBSource):
    """The same connector registered as ``mysql``: MySQL servers speak the same protocol."""

    name: ClassVar[str] = "mysql"
