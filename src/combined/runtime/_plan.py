"""What the lifecycle steps hand each other: settings, plans, staged and prepared captures.

The Run's :class:`Settings`; each dataset's :class:`DatasetPlan`, frozen in
its admission; what extraction leaves in staging (:class:`Staged`) and what
reducing and delivering leave ready to commit (:class:`Prepared`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from combined.capture._reduce import Transition
from combined.catalog import Admission
from combined.connectors.abc import Extraction
from combined.delivery import Limits, StagedDelivery
from combined.lake import LakeLayout, LakeTable
from combined.lake._positions import LakePositions
from combined.protocol import ExtractionReceipt
from combined.runtime._deadline import DEFAULT_ATTEMPT_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class Settings:
    """Engine-wide settings taken from the project file."""

    root: Path
    limits: Limits
    memory_limit: int
    max_attempts: int = 3
    backoff_s: float = 0.5
    #: How long a dataset's lease outlives its last renewal; a running Run
    #: renews it every fifth of this, so only a stalled or dead one loses it.
    lease_ttl_s: float = 300.0
    #: What executes Runs, as Attempts record it: ``embedded`` (a command that
    #: executes the Runs it admits) or ``worker`` (a queue worker).
    worker: str = "embedded"
    attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S  # an Attempt's reads stop past it
    #: Per (source, dataset): the file count past which a capture compacts its table.
    compact_files: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DatasetPlan:
    """A dataset's declaration as frozen in the Run's admission."""

    source: str
    name: str
    relation: str
    key: tuple[str, ...]
    strategy: str
    sync_mode: str
    cursor: Mapping[str, Any] | None
    columns: tuple[str, ...] | None
    batch_rows: int
    max_rows: int
    max_bytes: int
    drift: Mapping[str, str]
    quarantine_reader: str
    review_every_s: int
    control_sum: str | None = None
    #: Whether every version of every row is kept (``history: true``).
    history: bool = False
    #: The soft-delete flag (``{"flag": COLUMN, "value": V or None}``), when declared.
    deletes: Mapping[str, Any] | None = None


def plans_from_admission(admission: Admission) -> dict[str, DatasetPlan]:
    """The dataset plans frozen in an admission."""
    out = {}
    source = admission.config["source"]
    for name, d in admission.config["datasets"].items():
        out[name] = DatasetPlan(
            source=source,
            name=name,
            relation=d["relation"],
            key=tuple(d["key"] or ()),
            strategy=d["strategy"],
            sync_mode=d["sync_mode"],
            cursor=d.get("cursor"),
            columns=tuple(d["columns"]) if d.get("columns") else None,
            batch_rows=int(d["batch_rows"]),
            max_rows=int(d["delivery"]["max_rows"]),
            max_bytes=int(d["delivery"]["max_bytes"]),
            drift=dict(d["drift"]),
            quarantine_reader=d["quarantine"]["reader"],
            review_every_s=int(d["quarantine"]["review_every_s"]),
            control_sum=d.get("control_sum"),
            history=bool(d.get("history")),
            deletes=d.get("deletes"),
        )
    return out


@dataclass
class Staged:
    """What extraction left in staging for one dataset."""

    plan: DatasetPlan
    extraction: Extraction
    parts: list[Path]
    schema: pa.Schema
    state: Mapping[str, Any] | None
    position: str | None
    receipt: ExtractionReceipt
    rows: int
    drift: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the capture is the whole relation (absent ids become deletes).
    full: bool = False
    #: Rows of a snapshot read that found the source as the committed read left it
    #: and read nothing (``skip_unchanged``): the lake must still hold as many.
    unchanged_rows: int | None = None
    #: The checkpoint the read started from.
    prior_state: Mapping[str, Any] | None = None
    #: The table's newest Combined commit the read resumed after (``lake._positions``).
    after: Mapping[str, Any] | None = None
    #: Whether the read moved the checkpoint and changed no row: the commit keeps
    #: the position beside the table (``lake._positions``), no Delivery.
    keeps_position: bool = False
    #: For a bounded capture: SQL over the lake's columns selecting the range it covers.
    current_filter: str | None = None
    #: Control totals read in the capture's snapshot (rows, optional column sum).
    control: Mapping[str, Any] | None = None
    #: Each column's identity at the source (for renames), as the commit records it.
    fields: Mapping[str, str] | None = None
    #: Columns the source declares NOT NULL, where a change stream told them.
    not_null: tuple[str, ...] = ()
    #: Columns a change stream filled from the source, with the source's nulls in each
    #: at the lake's checkpoint (reconciliation compares the lake's).
    filled_nulls: Mapping[str, int] | None = None
    #: An event stream's columns that arrived unfilled, with the source's rows holding a value.
    unfilled: Mapping[str, int] | None = None
    #: For a backfill: SQL over the lake's columns selecting the range, whatever its column.
    landed_filter: str | None = None
    #: Whether control totals that differ from what landed block publication (a backfill).
    bounded: bool = False
    #: The capture's fold, for its commit to record (``runtime._fold``).
    fold: Mapping[str, Any] | None = None
    #: Where staging waited for the fold before hashing: ``same`` (the capture is the
    #: one the lake's newest commit recorded: nothing changed, no row was hashed) or
    #: ``differed`` (hashed after the read). None where it hashed as it read.
    fold_verdict: str | None = None
    #: What the catalog keeps should the capture change nothing (``runtime._fold.kept_fold``).
    kept_fold: Mapping[str, Any] | None = None
    #: The payload columns (in the lake's types) staging left unhashed for the
    #: reduction to compare with the lake's by value (``capture._values``) ...
    by_value: pa.Schema | None = None
    #: ... and how the reduction compared them: ``values``, or ``digests`` (it
    #: hashed every row: two rows of one key, say). None: not compared by value.
    compared: str | None = None

    @property
    def same_as_committed(self) -> bool:
        """Whether the fold showed the capture equal to the committed one."""
        return self.fold_verdict == "same"


@dataclass
class Prepared:
    """A reduced transition written as Deliveries, ready to commit."""

    staged: Staged
    transition: Transition
    deliveries: list[StagedDelivery]
    changes_path: Path | None
    metadata: dict[str, Any]
    mode: str
    needs_merge: bool


def table_of(layout: LakeLayout, plan: DatasetPlan) -> LakeTable:
    """The lake table of a dataset."""
    return layout.dataset_table(plan.source, plan.name)


def resumed_commit(
    layout: LakeLayout, plan: DatasetPlan, table: LakeTable | None = None
) -> Mapping[str, Any] | None:
    """The table's newest Combined commit, with the checkpoint its next read resumes from.

    That is the commit's own, unless captures that changed no row moved it
    since (``lake._positions``). A snapshot's read keeps no position.
    """
    last = (table or table_of(layout, plan)).latest_commit()
    if plan.strategy == "snapshot":
        return last
    return LakePositions(layout).resumed(plan.source, plan.name, last)
