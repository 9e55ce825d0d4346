"""CDC reads for the engine: the stitched first snapshot, then the binlog from its position.

Stand-up order (docs/architecture.md, section 5): the server's binlog
preconditions are verified; the first read opens ``START TRANSACTION WITH
CONSISTENT SNAPSHOT`` and, first thing inside it, reads the binlog position
MariaDB pins to that snapshot (``Binlog_snapshot_file`` and
``Binlog_snapshot_position``: every transaction committed before the
position is in the snapshot, none after it); then the table is read in that
snapshot. The snapshot's final state carries the position, so the stream
that follows starts exactly where the snapshot ends; the key resolves any
row both hold.

A MySQL server pins no binlog position to a snapshot (and reading ``SHOW
BINARY LOG STATUS`` beside one can miss a transaction in flight): there the
position is anchored by a brief read lock on the table while the snapshot
opens (:mod:`~._binlog_anchor`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from combined.connectors._shared import cdc_values
from combined.connectors.abc import BaseExtraction, ReadRequest
from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._binlog import BinlogExtraction
from combined.connectors.mariadb._binlog_anchor import TableLock, pins_snapshots
from combined.connectors.mariadb._binlog_origin import (
    LogIdentity,
    created_differs,
    file_created,
    origin,
    require_resumable,
    require_same_log,
)
from combined.connectors.mariadb._binlog_setup import (
    acknowledged,
    position_of,
    require_binlog,
    require_logged_table,
    require_snapshot_engine,
)
from combined.connectors.mariadb._connect import Session, Settings
from combined.connectors.mariadb._extract import MariaDBExtraction
from combined.connectors.mariadb._read_plan import ReadOptions
from combined.errors import ConfigError, SourceError
from combined.protocol import Message, RecordBatchMessage, StateMessage, TerminalOutcome


def cdc_read(settings: Settings, request: ReadRequest) -> BaseExtraction:
    """A stitched snapshot when no position was committed yet, else the binlog from it."""
    if not request.key:
        raise ConfigError(
            f"cdc dataset {request.dataset} needs a key",
            hint="declare `key:` with the table's primary key columns",
        )
    if settings.casts:
        _, table = catalog.parse_relation(request.relation, settings.database)
        if settings.casts.get(request.relation) or settings.casts.get(table):
            raise ConfigError(
                f"casts are declared for {request.relation!r}, which is read by cdc",
                hint="change data capture reads every column as its own type; remove its "
                "casts, or capture the relation with the snapshot or cursor strategy",
            )
    start = position_of(request.state)
    if start is None:
        return StitchedSnapshot(settings, request)
    # The stream follows the read's zero_dates as the stitched snapshot does (ReadOptions):
    # it read the source's alone, and a zero date the snapshot took as NULL failed it.
    settings = replace(settings, zero_dates=ReadOptions.of(request, settings).zero_dates)
    max_changes = request.options.get("max_changes")
    return BinlogExtraction(
        settings, request, start=start, max_changes=int(max_changes) if max_changes else None
    )


def check_server(
    settings: Settings, relation: str, committed: Mapping[str, Any] | None = None
) -> None:
    """Raise unless the server can stream the binlog for ``relation`` (see ``_binlog_setup``)
    and, given ``committed`` (the lake's checkpoint), from its position as a capture would.

    Without ``committed``, the relation's next read is its stitched first
    snapshot, which only a transactional table can give (a stream that resumes
    from a checkpoint reads the log alone).
    """
    session = Session(settings)
    try:
        require_binlog(session, relation)
        database, table = catalog.parse_relation(relation, settings.database)
        require_logged_table(session, database, table)
        if committed is None:
            require_snapshot_engine(session, database, table)
        position = position_of(committed)
        if position is not None:
            whose = f"table {relation}"
            require_resumable(session, position, committed, whose, relation=relation)
            created = file_created(settings, position[0])  # (a capture's first event tells it)
            if created is not None:
                why = created_differs(committed, position[0], created)
                require_same_log(why, position, whose, relation=relation)
    finally:
        session.close()


class StitchedSnapshot(BaseExtraction):
    """The first read of a cdc dataset: a snapshot whose state is its pinned binlog position."""

    ROWS_ONLY = True  # (the stream follows in the next capture)

    def __init__(self, settings: Settings, request: ReadRequest) -> None:
        super().__init__()
        self._settings = settings
        self._request = request
        self._inner: MariaDBExtraction | None = None

    def _messages(self) -> Iterator[Message]:
        s, req = self._settings, self._request
        check_server(s, req.relation)
        snap = replace(req, strategy="snapshot", state=None, cursor=None)
        self._inner = inner = MariaDBExtraction(s, snap, ReadOptions.of(snap, s))
        if not pins_snapshots(s):
            inner.anchor = TableLock(s, req.relation)
        self._authority = inner.authority  # one receipt: the snapshot read's
        for msg in cdc_values(iter(inner)):
            if isinstance(msg, RecordBatchMessage):
                yield msg
        inner.finish("success")
        position, at = pinned(inner.snapshot_pin, req)
        state: dict[str, Any] = {"binlog": position, "at": at, "stitched": True}
        session = Session(s)
        try:  # (which log the position is of: docs of _binlog_origin)
            created = file_created(s, position.rpartition(":")[0])
            state.update(origin(LogIdentity(session), position, None, {}, created))
        finally:
            session.close()
        state["columns"] = catalog.column_record(inner.source_columns)
        yield StateMessage(req.dataset, state, position=position, final=True)

    def null_key_hint(self, columns: Sequence[str]) -> str | None:
        """The snapshot read's (a cdc dataset takes no casts)."""
        return None if self._inner is None else self._inner.null_key_hint(columns, casts=False)

    def acknowledge(self, state: Mapping[str, Any]) -> None:
        """Nothing to confirm: the position lives in the lake's checkpoint only."""
        acknowledged(state)

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        if self._inner is not None:
            self._inner.finish("success" if outcome == "success" else "abort")
        return ()


def pinned(token: Mapping[str, str] | None, req: ReadRequest) -> tuple[str, str]:
    """The binlog position and time the snapshot read pinned, or the reason it has none."""
    if token is None:
        raise SourceError(
            f"the snapshot of {req.relation} is not a consistent snapshot (the table is not "
            "InnoDB): no binlog position can be tied to it",
            hint="change data capture needs a transactional table: ALTER TABLE ... "
            "ENGINE=InnoDB, or capture it with the snapshot strategy",
            dataset=req.dataset,
        )
    binlog = token.get("binlog", "")
    name, _, offset = binlog.rpartition(":")
    if not name or not offset.isdigit():
        raise ConfigError(
            f"the server pins no binlog position to the snapshot of {req.relation} "
            "(Binlog_snapshot_file is empty): the binary log is off",
            hint="turn log_bin on (`combined check` names the settings)",
            dataset=req.dataset,
        )
    at = token.get("at") or datetime.now(UTC).isoformat()
    return binlog, at
