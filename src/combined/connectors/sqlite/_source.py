"""The SQLite source: check, discover and read one database file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from combined.connectors.abc import (
    BaseSource,
    DatasetDiscovery,
    Discovery,
    Extraction,
    KeyMeasure,
    ReadRequest,
    refuse_bounds,
)
from combined.connectors.sqlite import _catalog as catalog
from combined.connectors.sqlite._connection import (
    DRIVER_ERRORS,
    Connection,
    execute,
    fetch,
    open_readonly,
    scalar,
    translate,
)
from combined.connectors.sqlite._extraction import SQLiteExtraction, select_columns
from combined.errors import ConfigError

DEFAULT_BUSY_TIMEOUT_MS = 5_000


def _int_option(
    config: Mapping[str, Any], key: str, default: int | None, minimum: int
) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"sqlite source option {key!r} must be an integer of at least {minimum}, not {value!r}",
            hint=f"set {key} to a whole number such as {default or 10_000}",
            option=key,
        )
    return value


class SQLiteSource(BaseSource):
    """A SQLite database file, opened read-only through the ADBC SQLite driver.

    Configuration:

    ``path``
        The database file (the engine passes it resolved to an absolute path).
        It must exist: a missing file is never created.
    ``batch_rows`` (optional)
        An upper bound on rows per batch for this source, applied on top of
        the request's ``batch_rows`` (useful for very wide rows).
    ``busy_timeout_ms`` (optional, default 5000)
        How long a read waits for a writer's lock before the source is
        reported unavailable (and the Attempt retried).

    Any other key is refused, naming the closest one that is taken.

    Every read runs in one read transaction, so its batches (and, for a cursor
    read, its upper bound) come from one consistent snapshot of the file. In a
    rollback-journal (non-WAL) database that transaction blocks writers until
    the read ends; in WAL mode writers proceed. SQLite issues no snapshot
    token, so receipts carry no ``snapshot_authority``.

    Column types come from the declared types; see
    :mod:`combined.connectors.sqlite._types` for the mapping and for why a
    value that does not fit raises :class:`~combined.errors.SchemaMismatch`.
    """

    name: ClassVar[str] = "sqlite"
    revision: ClassVar[str] = "1"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = True
    SUPPORTS_CDC: ClassVar[bool] = False
    SUPPORTS_PARTITIONS: ClassVar[bool] = False
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = ("path", "batch_rows", "busy_timeout_ms")

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        path = self.config.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                "the sqlite source needs a path",
                hint="set `path` to the database file in the source's configuration",
            )
        self.path = path
        self.batch_rows = _int_option(self.config, "batch_rows", None, 1)
        self.busy_timeout_ms = _int_option(
            self.config, "busy_timeout_ms", DEFAULT_BUSY_TIMEOUT_MS, 0
        )

    def _open(self) -> Connection:
        return open_readonly(self.path, busy_timeout_ms=self.busy_timeout_ms or 0)

    def check(self) -> None:
        """Open the file and read its schema: it must exist and be a SQLite database."""
        conn = self._open()
        try:
            scalar(conn, "SELECT count(*) FROM sqlite_schema")
        except DRIVER_ERRORS as exc:
            raise translate(exc, self.path) from exc
        finally:
            conn.close()

    def measure_key(self, relation: str, key: Sequence[str]) -> KeyMeasure:
        """Rows, distinct key values and rows with a null key part of ``relation``."""
        cols = ", ".join('"' + k.replace('"', '""') + '"' for k in key)
        nulls = " OR ".join('"' + k.replace('"', '""') + '" IS NULL' for k in key)
        table = '"' + relation.replace('"', '""') + '"'
        query = (
            f"SELECT (SELECT count(*) FROM {table}), "
            f"(SELECT count(*) FROM (SELECT DISTINCT {cols} FROM {table} WHERE NOT ({nulls}))), "
            f"(SELECT count(*) FROM {table} WHERE {nulls})"
        )
        conn = self._open()
        try:
            rows, distinct, null_keys = fetch(conn, query)[0].values()
        except DRIVER_ERRORS as exc:
            raise translate(exc, self.path) from exc
        finally:
            conn.close()
        return KeyMeasure(int(rows), int(distinct), int(null_keys), query)

    def discover(self) -> Discovery:
        """Report every table and view with fields, keys and cursor evidence."""
        conn = self._open()
        try:
            execute(conn, "BEGIN")
            datasets = tuple(catalog.describe(conn, rel) for rel in catalog.relations(conn))
            execute(conn, "COMMIT")
        except DRIVER_ERRORS as exc:
            raise translate(exc, self.path) from exc
        finally:
            conn.close()
        return Discovery(connector=self.name, revision=self.revision, datasets=datasets)

    def describe_relation(self, relation: str) -> DatasetDiscovery:
        """What discovery reports of one relation; :class:`NotFoundError` when it is gone."""
        conn = self._open()
        try:
            execute(conn, "BEGIN")
            found = catalog.describe(conn, catalog.find_relation(conn, relation))
            execute(conn, "COMMIT")
        except DRIVER_ERRORS as exc:
            raise translate(exc, self.path) from exc
        finally:
            conn.close()
        return found

    def read(self, request: ReadRequest) -> Extraction:
        """Prepare a read of one relation; rows are read only once it is iterated.

        The relation and the named columns are checked now, so a wrong name
        fails before the engine stages anything.
        """
        if request.strategy not in ("snapshot", "cursor"):
            raise ConfigError(
                f"the sqlite connector cannot read with strategy {request.strategy!r}",
                hint="use the snapshot or cursor strategy",
                dataset=request.dataset,
            )
        if request.strategy == "cursor" and request.cursor is None:
            raise ConfigError(
                f"dataset {request.dataset!r} uses the cursor strategy without a cursor",
                hint="declare the cursor column, its lookback and its trust basis",
                dataset=request.dataset,
            )
        refuse_bounds(
            self.name,
            request,
            "drop the bounds: a sqlite read is one transaction over the relation",
        )
        if request.batch_rows < 1:
            raise ConfigError(
                f"batch_rows must be positive, not {request.batch_rows}",
                hint="request at least one row per batch",
                dataset=request.dataset,
            )
        batch_rows = min(request.batch_rows, self.batch_rows or request.batch_rows)
        conn = self._open()
        try:
            rel = catalog.find_relation(conn, request.relation)
            cols = catalog.columns(conn, rel)
            select_columns(catalog.plans(rel, cols, catalog.indexes(conn, rel)), request, rel.name)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, DRIVER_ERRORS):
                raise translate(exc, self.path) from exc
            raise
        return SQLiteExtraction(
            conn,
            path=self.path,
            request=request,
            relation=rel.name,
            batch_rows=batch_rows,
        )
