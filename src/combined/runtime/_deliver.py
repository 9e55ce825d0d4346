"""Deliver: a reduced transition written as bounded Delivery files, and described for commit.

The Deliveries are final: their rows become the lake table's rows as they
are, and the raw layer keeps them once committed. The lake commit's metadata
(:func:`commit_metadata`) says what they hold and which dataset version they
make; the projection is built from it alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from combined.capture._reduce import Reducer, Transition
from combined.delivery import StagedDelivery, StagingArea, write_deliveries
from combined.lake import ROW_GROUP_ROWS, LakeTable, lake_schema, parquet_writer, to_lake
from combined.protocol import _provenance as prov
from combined.protocol._digest import Digest
from combined.runtime._fold import capture_columns
from combined.runtime._plan import Staged
from combined.runtime._reporter import Reporter
from combined.runtime._stage import ORDINAL


@dataclass(frozen=True, slots=True)
class Writing:
    """Who writes a transition's Deliveries, where, and when it was accepted."""

    area: StagingArea
    run_id: str
    producer: str
    #: The acceptance time: the engine accepted the transition for commit. It is
    #: stamped on the Delivery rows and recorded in the lake commit's metadata.
    accepted_at: datetime
    #: The dataset's catalog row (None before its first capture registers it).
    row: Any | None
    #: Whether the table does not exist yet (a first capture: every row is new).
    baseline: bool
    digest: Digest


@dataclass
class Written:
    """A transition's Deliveries, its change list, and its digests still being computed."""

    deliveries: list[StagedDelivery]
    changes_path: Path | None = None
    pending: Future[Transition] | None = None


def deliver(
    reducer: Reducer,
    staged: Staged,
    transition: Transition,
    table: LakeTable,
    w: Writing,
    side: ThreadPoolExecutor,
    reporter: Reporter,
) -> Written:
    """Write the transition as Deliveries (none when nothing changed and nothing moved)."""
    plan = staged.plan
    first_seq = table.committed_sequence() + 1
    payload = [
        f for f in staged.schema if not f.name.startswith("_combined_") and f.name != ORDINAL
    ]
    schema = lake_schema(pa.schema(payload))
    for pf in prov.provenance_fields(w.digest):
        schema = schema.append(pf)
    out = Written(deliveries=[])
    kept = _position_only(staged, table)
    moved = (
        _moved(staged, table.schema(), payload, w.baseline)
        or _newly_dropped(staged, table)
        # (a change stream's position with what its commit records beside it)
        or (staged.plan.strategy == "cdc" and _position_moved(staged) and not kept)
    )
    # A replacement that changes no row is not written: the projection
    # already holds every row it would deliver, and another copy of the
    # table in the lake and the raw layer would record nothing new. A read
    # that moved its position writes what its rows deliver (an event
    # stream's truncate changes no identity, and is delivered), if anything.
    if transition.changes or moved or (kept and plan.sync_mode != "full_refresh"):
        observed = staged.receipt.snapshot_acquired_at or staged.receipt.extraction_started_at
        constants = {
            "observed_at": (observed or w.accepted_at).isoformat(),
            # The Deliveries are final: their rows become the table's rows as they are.
            "ingested_at": w.accepted_at.isoformat(),
            "run_id": w.run_id,
            "producer": w.producer,
            "position": staged.position,
        }
        if plan.sync_mode == "full_refresh":
            # A replacement delivers every row, changed or not: MAR needs
            # the list of the ones that changed. Any other transition
            # delivers exactly its changes, and MAR reads their ids there.
            out.changes_path = w.area.path(
                f"{plan.source}/{plan.name}/deliveries/"
                f"{first_seq:09d}-{uuid.uuid4().hex[:16]}-transition.parquet"
            )
            _write_changes(reducer.changes(), out.changes_path, w.area)
        elif reducer.all_new:
            out.pending = side.submit(_digests, reducer)
        reducer.release()  # what the Deliveries no longer need, before they are encoded
        batches = (to_lake(b, schema) for b in reducer.output(constants))
        out.deliveries = write_deliveries(
            w.area,
            batches,
            run_id=w.run_id,
            source=plan.source,
            dataset=plan.name,
            first_sequence=first_seq,
            schema=schema,
            schema_revision=_schema_revision(w.row, schema),
            max_rows=plan.max_rows,
            max_bytes=plan.max_bytes,
            allow_empty=moved or plan.sync_mode == "full_refresh",
            constants=reducer.constants(constants),
            large_values=reducer.large_values,
        )
        reporter.progress(plan.name, staged.rows, 0, len(out.deliveries))
    staged.keeps_position = kept and not out.deliveries
    return out


def _newly_dropped(staged: Staged, table: LakeTable) -> bool:
    """Whether the capture evolved past a column the last commit's Deliveries held.

    The lake keeps such a column, with its former values on the rows that
    did not otherwise change (``capture._dropped``): a capture that changed
    no row still commits (an empty Delivery) so the accepted drop is in the
    feed and the next capture's Deliveries are compared without it.
    """
    dropped = {e["field"] for e in staged.drift if e["class"] == "drop"}
    if not dropped or any(e["outcome"] != "evolve" for e in staged.drift):
        return False
    held = (table.latest_commit() or {}).get("schema") or []
    return any(name in dropped for name, _ in held)


def _moved(
    staged: Staged, committed: pa.Schema | None, payload: list[pa.Field], baseline: bool
) -> bool:
    """Whether the capture commits even without a changed row (an empty Delivery then).

    A first capture creates the table even when the source is empty, so
    the dataset is queryable (and empty) once published.
    A column the drift policy let the table evolve to is published even
    while every row holds null there (no row changed): an empty Delivery
    carries the widened schema. So is a column whose type widened.
    """
    plan = staged.plan
    grown = committed is not None and (
        any(f.name not in committed.names for f in payload)
        or any(e["class"] == "widened_type" for e in staged.drift)
    )
    # A replacement follows the source's columns: one it no longer has
    # leaves the table, even where it held only nulls (which no row's
    # payload hash tells apart from an absent column).
    names = {f.name for f in payload}
    shrunk = (
        plan.sync_mode == "full_refresh"
        and committed is not None
        and any(not n.startswith("_combined_") and n not in names for n in committed.names)
    )
    return baseline or grown or shrunk


def _position_moved(staged: Staged) -> bool:
    """Whether the read moved the checkpoint it resumed from."""
    return staged.state is not None and dict(staged.state) != dict(staged.prior_state or {})


def _position_only(staged: Staged, table: LakeTable) -> bool:
    """Whether the read moved the checkpoint and the commit would record nothing else.

    A read that changes no row then keeps its position beside the table
    (``lake._positions``), no Delivery: a change stream that moved past
    other tables' changes and its own end marker, a cursor past rows the
    lake holds unchanged. One that judged drift, or found the source's
    columns' identities other than the ones the lake recorded, commits them
    with an empty Delivery (none recorded, as after a reset: nothing to
    tell a rename by, the next read judges as this one did).
    """
    if staged.plan.strategy == "snapshot" or staged.after is None or not _position_moved(staged):
        return False
    held = (table.latest_commit() or {}).get("fields")
    return not staged.drift and (held is None or dict(staged.fields or {}) == dict(held))


def _write_changes(changes: pa.RecordBatchReader, path: Path, area: StagingArea) -> None:
    """The transition's change list (id, op): the identities MAR bills."""
    with parquet_writer(path, changes.schema) as writer:
        for batch in changes:
            writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
    area.account(path.stat().st_size, files=1)


def _digests(reducer: Reducer) -> Transition:
    """A first baseline's transition, on a cursor of its reduction."""
    con = reducer.cursor()
    try:
        # The two Delivery writers keep both cores busy meanwhile: one DuckDB
        # thread beside them takes as long as two, with one scan's buffers
        # (~13 MB less at the phase's peak, seven runs each). The setting is
        # the database's; the reduction runs nothing else in this phase.
        con.execute("SET threads = 1")
        return reducer.reduce(con)
    finally:
        con.close()


def _schema_revision(row: Any | None, schema: pa.Schema) -> int:
    if row is None:
        return 1
    fields = [[f.name, str(f.type)] for f in schema]
    if row.schema is None:
        return 1
    if row.schema == fields:
        return int(row.schema_revision or 1)
    return int(row.schema_revision or 0) + 1


def commit_metadata(
    staged: Staged,
    transition: Transition,
    written: Written,
    version: Mapping[str, Any],
    *,
    run_id: str,
    admission_id: str,
    accepted_at: datetime,
) -> dict[str, Any]:
    """The lake commit's metadata: the Deliveries, the transition and the version they make."""
    plan = staged.plan
    deliveries, changes_path = written.deliveries, written.changes_path
    metadata: dict[str, Any] = {
        "dataset": f"{plan.source}.{plan.name}",
        "run_id": run_id,
        "admission_id": admission_id,
        "first_sequence": deliveries[0].sequence if deliveries else 0,
        "last_sequence": deliveries[-1].sequence if deliveries else 0,
        "deliveries": [_described(d) for d in deliveries],
        "changes_file": changes_path.name if changes_path else None,
        # Without a change list, the Deliveries hold exactly the changes (MAR
        # reads their ids); a full refresh delivers unchanged rows too.
        "changes_from": "file" if changes_path else "deliveries",
        # A keyed transition changes each identity once; an event stream may repeat one.
        "changes_unique": plan.sync_mode != "append",
        # The key the ids are of: another key declared later is refused (_drift.check_key).
        "key": list(plan.key),
        "source_position": staged.position,
        "checkpoint": dict(staged.state) if staged.state is not None else None,
        "extraction_receipt": staged.receipt.to_json(),
        "transition": {
            "inserts": transition.inserts,
            "updates": transition.updates,
            "deletes": transition.deletes,
            "unchanged": transition.unchanged,
            "captured": transition.captured,
            "digest": transition.digest,
        },
        "version": dict(version),
        "drift": staged.drift,
        "fields": dict(staged.fields) if staged.fields else None,
        "schema": commit_schema_fields(deliveries[0].path) if deliveries else None,
        "ingested_at": accepted_at.isoformat(),
    }
    if staged.fold is not None:
        # What the next capture's rows are folded against (``runtime._fold``).
        metadata["capture_fold"] = dict(staged.fold)
    if plan.strategy == "snapshot" and plan.sync_mode == "incremental" and plan.key:
        # Whether the next capture may compare its rows by value (``capture._values``).
        metadata["capture_columns"] = capture_columns(staged.schema)
    if plan.history:
        # Its projection keeps the versions too (``lake/_history.py``).
        metadata["history"] = True
    return metadata


def _described(d: StagedDelivery) -> dict[str, Any]:
    """A Delivery as the commit's metadata records it."""
    return {
        "id": d.id,
        "sequence": d.sequence,
        "records": d.record_count,
        "bytes": d.byte_count,
        "content_hash": d.content_hash,
        "schema_revision": d.schema_revision,
        "file": d.path.name,
    }


def commit_schema_fields(path: Path) -> list[list[str]]:
    """The ``[name, type]`` list of a Delivery file's schema (kept in the catalog)."""
    return [[f.name, str(f.type)] for f in pq.read_schema(str(path))]
