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

A gap whose changes before it the stream still carries (a table dropped:
its changes up to the ``DROP TABLE``) is met at the read's end instead
(``stream_gaps``, :func:`hold_ended`): those changes are committed with the
refusal in the same checkpoint, published, and only then does the Run end
``needs_review`` (:func:`ended_by`). Refused before its read, the capture
left them in the slot, which the teardown it asked for dropped with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, Member, Run
from combined.catalog import data as cat
from combined.errors import NeedsSnapshot, StreamGap
from combined.lake import LakeLayout
from combined.runtime._plan import DatasetPlan, Prepared, Staged, resumed_commit
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
    last = resumed_commit(layout, plan) or {}
    checkpoint = last.get("checkpoint")
    if not checkpoint or checkpoint.get(GAP):
        return
    held = {**checkpoint, GAP: _record(gap, run_id)}
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


def _record(gap: StreamGap, run_id: str) -> dict[str, Any]:
    """What a checkpoint keeps of ``gap``, found by Run ``run_id``."""
    at = datetime.now(UTC).isoformat(timespec="seconds")
    return {"error": gap.message, "hint": gap.hint, "run_id": run_id, "at": at}


def hold_ended(staged: Staged, run_id: str) -> Staged:
    """``staged`` with the gap its read ended at (``stream_gaps``) kept in its checkpoint:
    committed with the changes before it, never without them."""
    gaps: Mapping[str, StreamGap] = getattr(staged.extraction, "stream_gaps", None) or {}
    gap = gaps.get(staged.plan.name)
    if gap is None:
        return staged
    if staged.state is None:  # (no checkpoint to keep it in: refused as it is)
        raise gap
    return dataclasses.replace(staged, state={**staged.state, GAP: _record(gap, run_id)})


def ended_by(
    conn: Connection, run: Run, prepared: Sequence[Prepared], members: Sequence[Member]
) -> NeedsSnapshot | None:
    """The gap this Run's reads ended at (:func:`hold_ended`), now committed; each told
    (Activity ``checkpoint.held``). None when none did."""
    versions = {(m.source, m.dataset): m.lake_version for m in members}
    found: NeedsSnapshot | None = None
    for p in prepared:
        gap = (p.staged.state or {}).get(GAP)
        if not gap or gap["run_id"] != run.id:
            continue
        plan = p.staged.plan
        cat.emit(
            conn,
            "checkpoint.held",
            source=plan.source,
            dataset=plan.name,
            run_id=run.id,
            lake_version=versions.get((plan.source, plan.name)),
            error=gap["error"],
        )
        if found is None:
            found = NeedsSnapshot(
                f"{plan.source}.{plan.name}: {gap['error']}", hint=gap["hint"], dataset=plan.name
            )
    return found
