"""CDC reads for the engine: the stitched first snapshot, then the stream.

Stand-up order (DESIGN.md section 5): the publication exists, the slot is
created with its exported snapshot and confirmed to retain WAL, its
consistent LSN is recorded, and only then is the relation read, inside that
exported snapshot. The snapshot's final state carries the consistent LSN, so
the stream that follows starts exactly where the snapshot ends: the key
resolves rows the snapshot already holds, with no gap and no double.

Each dataset has its own slot and publication (``<prefix>_<schema>_<table>``):
one slot per dataset keeps a dataset's checkpoint independent of every other
dataset's, at the cost of the server decoding the WAL once per slot.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from combined.connectors.abc import BaseExtraction, ReadRequest
from combined.connectors.postgres._cdc import CdcExtraction, lsn_from_state
from combined.connectors.postgres._connect import Session, Settings
from combined.connectors.postgres._extract import PartitionRead, PostgresExtraction, ReadOptions
from combined.connectors.postgres._replication import (
    SlotHandle,
    create_slot,
    drop_slot,
    ensure_publication,
    require_slot,
    slot_status,
)
from combined.errors import ConfigError, SourceError
from combined.protocol import Message, RecordBatchMessage, StateMessage, TerminalOutcome


def qualified(relation: str) -> str:
    """``schema.table`` for a relation named with or without its schema."""
    return relation if "." in relation else f"public.{relation}"


def slot_name(prefix: str, relation: str) -> str:
    """The slot (and publication) name of one dataset: lower-case, at most 63 bytes."""
    base = re.sub(r"[^a-z0-9_]", "_", f"{prefix}_{qualified(relation)}".lower())
    return base[:63]


def cdc_read(settings: Settings, request: ReadRequest, prefix: str) -> BaseExtraction:
    """A stitched snapshot when no LSN was committed yet, else the stream from it."""
    if not request.key:
        raise ConfigError(
            f"cdc dataset {request.dataset} needs a key",
            hint="declare `key:` with the table's replica identity columns",
        )
    name = slot_name(prefix, request.relation)
    lsn = lsn_from_state(request.state)
    if lsn is None:
        return StitchedSnapshot(settings, request, slot=name, publication=name)
    # Never resume silently with a gap: the slot must exist and hold its WAL.
    require_slot(settings, name)
    stop = None
    max_changes = request.options.get("max_changes")
    ext: CdcExtraction
    if max_changes:

        def stop() -> bool:
            return ext.receipt.rows >= int(max_changes)

    ext = CdcExtraction(
        settings,
        slot=name,
        publication=name,
        datasets={request.dataset: qualified(request.relation)},
        start_lsn=lsn,
        end_lsn=request.options.get("end_lsn", "current"),
        keys={request.dataset: tuple(request.key)},
        batch_rows=request.batch_rows,
        stop=stop,
        timeout=request.options.get("timeout"),
    )
    return ext


class StitchedSnapshot(BaseExtraction):
    """The first read of a CDC dataset: slot first, then the snapshot it exported."""

    def __init__(
        self, settings: Settings, request: ReadRequest, *, slot: str, publication: str
    ) -> None:
        super().__init__()
        self._settings = settings
        self._request = request
        self.slot = slot
        self.publication = publication
        self._handle: SlotHandle | None = None
        self._inner: PostgresExtraction | None = None

    def _messages(self) -> Iterator[Message]:
        s, req = self._settings, self._request
        ensure_publication(s, self.publication, [qualified(req.relation)], add_missing=True)
        if slot_status(s, self.slot).exists:
            # No committed checkpoint refers to this slot (we are here because
            # none exists), so it is a leftover of an interrupted stand-up.
            drop_slot(s, self.slot)
        self._handle = handle = create_slot(s, self.slot)
        snapshot_id = handle.snapshot_name
        if snapshot_id is None:
            raise SourceError(
                f"replication slot {self.slot!r} exported no snapshot",
                hint="the server must support exported snapshots (PostgreSQL 10 or newer)",
            )
        snapshot_text = _snapshot_text(s, snapshot_id)
        snap_req = replace(req, strategy="snapshot", state=None, cursor=None)
        self._inner = inner = PostgresExtraction(
            s,
            snap_req,
            ReadOptions.of(snap_req),
            PartitionRead(
                snapshot_id=snapshot_id,
                snapshot_text=snapshot_text,
                column=req.key[0],
                index=0,
                lower=None,
                upper=None,
                include_nulls=True,
            ),
        )
        self._authority = inner.authority  # one receipt: the snapshot read's
        for msg in inner:
            if isinstance(msg, RecordBatchMessage):
                yield msg
        inner.finish("success")
        handle.release_snapshot()
        lsn = handle.consistent_point_text
        yield StateMessage(req.dataset, {"lsn": lsn, "stitched": True}, position=lsn, final=True)

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        if self._inner is not None:
            self._inner.finish("success" if outcome == "success" else "abort")
        if self._handle is not None:
            self._handle.release_snapshot()
        return ()


def _snapshot_text(settings: Settings, snapshot_id: str) -> str:
    """``pg_current_snapshot()`` as seen by a session that imports ``snapshot_id``."""
    from psycopg import sql

    session = Session(settings)
    try:
        session.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "probing the snapshot")
        session.run(
            sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_id)),
            "importing the slot's snapshot",
        )
        text: Any = session.rows(
            "SELECT CAST(pg_current_snapshot() AS text)", "reading the snapshot"
        )[0][0]
        session.run("ROLLBACK", "closing the probe")
        return str(text)
    finally:
        session.close()
