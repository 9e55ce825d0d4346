"""A gap in a change stream, recorded in the dataset's checkpoint until a new snapshot.

A capture that meets a :class:`~combined.errors.StreamGap` (a PostgreSQL
publication that left the table out, or narrowed it, for a while) fails
before anything is committed, like any :class:`~combined.errors.NeedsSnapshot`.
Its cause may then be mended without a trace: a row filter removed, the
table published again. The stream then looks whole, while the changes of
that time stay missing. So the refusal is recorded, under :data:`GAP`, in
the checkpoint the capture would have resumed from: a lake commit that
changes no row and keeps the position (the slot is never confirmed past
it), projected into the catalog. Every later capture of the dataset is
refused with it (:func:`refuse_recorded`) until a new snapshot:
``combined cdc teardown`` voids the checkpoint, and the next capture's
stitched snapshot commits one of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.errors import NeedsSnapshot, StreamGap
from combined.lake import LakeLayout
from combined.runtime._plan import DatasetPlan, table_of
from combined.runtime._project import commit_checkpoint

#: The checkpoint's key of a recorded gap: the refusal's error, hint, Run and time.
GAP = "needs_snapshot"


def refuse_recorded(plan: DatasetPlan, checkpoint: Mapping[str, Any] | None) -> None:
    """Raise :class:`NeedsSnapshot` when ``checkpoint`` holds a recorded gap (a change
    capture's: a dataset now read by ``snapshot`` reads the whole table)."""
    if plan.strategy == "cdc":
        refuse_recorded_in(f"{plan.source}.{plan.name}", checkpoint)


def refuse_recorded_in(dataset: str, checkpoint: Mapping[str, Any] | None) -> None:
    """Raise :class:`NeedsSnapshot` when the cdc ``dataset``'s ``checkpoint`` holds a
    recorded gap (``combined check`` tells it as a capture would)."""
    gap = (checkpoint or {}).get(GAP)
    if not gap:
        return
    raise NeedsSnapshot(
        f"{dataset}: {gap['error']} (found by run {gap['run_id']} on "
        f"{gap['at']} and kept in the dataset's checkpoint: every capture is refused until "
        "a new snapshot, the cause mended or not)",
        hint=gap["hint"],
        dataset=dataset.rpartition(".")[2],
    )


def record_gap(
    catalog: Catalog, layout: LakeLayout, run_id: str, plan: DatasetPlan, gap: StreamGap
) -> None:
    """Record ``gap`` in the dataset's checkpoint (the caller holds the dataset's lease).

    Not without a checkpoint to resume from (a first capture: the next one
    takes a snapshot anyway), nor twice.
    """
    last = table_of(layout, plan).latest_commit() or {}
    checkpoint = last.get("checkpoint")
    if not checkpoint or checkpoint.get(GAP):
        return
    at = datetime.now(UTC).isoformat(timespec="seconds")
    held = {**checkpoint, GAP: {"error": gap.message, "hint": gap.hint, "run_id": run_id, "at": at}}
    version = commit_checkpoint(
        catalog,
        layout,
        plan.source,
        plan.name,
        held,
        run_id=run_id,
        source_position=last.get("source_position"),
    )
    with catalog.begin() as conn:
        cat.emit(
            conn,
            "checkpoint.held",
            source=plan.source,
            dataset=plan.name,
            run_id=run_id,
            lake_version=version,
            error=gap.message,
        )
