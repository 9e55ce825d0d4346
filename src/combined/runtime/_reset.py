"""``combined reset``: forget, by a recorded decision, the lake table a dataset's catalog records.

After its table was lost (``runtime._lost`` then refuses every capture of
the dataset), or to start a dataset afresh on purpose (a new identity
encoding, ``docs/identity.md`` section 7), a person resets it: the catalog
forgets the table's versions, delivery sequence, dataset version and
checkpoint, so that its next capture is a first capture, making a new table.

The decision is recorded, before the catalog forgets anything, in the lake's
ledger (``_combined/resets``: a catalog rebuilt from the lake knows it), then
in the catalog (``dataset_resets``) and as the Activity event
``dataset.reset``, with who made it, when, why and what it forgot. The
dataset's members published before it name versions of the table it
forgot: a query of them says so, and a publication of the new table is not
held older than them.

A table still in the lake (the projection, or its ``_history/`` table, whose
sequences the new table would restart under) is removed only when asked
(``drop``), before the decision is recorded (a store failing part way
leaves the catalog as it was: the same reset again finishes it), and the
event says so. Nothing else goes: the raw layer's Deliveries, the
quarantine and the MAR table (``_usage/``, whose identities the new table's
changes are billed against, so a row billed this month is not billed again)
stay, with the catalog's records of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from combined._credentials import redact
from combined.catalog import Catalog, resets
from combined.catalog import data as cat
from combined.errors import ConfigError, ProtocolViolation
from combined.lake import LakeLayout, LakeTable
from combined.lake._ledger import Ledger
from combined.lake._probe import read_failure, store_failure
from combined.protocol import utcnow
from combined.runtime._lost import Recorded, recorded

#: The lease holder prefix of a reset: no Run captures the dataset meanwhile.
HOLDER = "reset:"
#: What a reset keeps of a dataset, as its Activity event says.
KEPT = "the raw layer's Deliveries, the quarantine and the MAR table are kept"


def tables_in_lake(layout: LakeLayout, source: str, dataset: str) -> list[LakeTable]:
    """The dataset's tables the lake holds: its projection and its history."""
    from combined.lake._history import history_table

    found = []
    for table in (layout.dataset_table(source, dataset), history_table(layout, source, dataset)):
        try:
            if table.exists():
                found.append(table)
        except OSError as exc:  # the lake's store unreachable, or refusing
            what = f"{source}.{dataset}: the lake at {layout.store.root} could not be read"
            raise read_failure(what, exc) from None
    return found


def refuse_kept(name: str, tables: Sequence[LakeTable]) -> ConfigError:
    """The error of a reset not asked to remove the tables the lake still holds."""
    where = " and ".join(t.path for t in tables)
    many = len(tables) > 1
    return ConfigError(
        f"{name}: the lake holds its table{'s' if many else ''} at {where}; a reset without "
        f"--drop-table would leave {'them' if many else 'it'} beside the new table its next "
        "capture makes: nothing was reset",
        hint="pass --drop-table to remove them with the reset (recorded in the activity "
        f"feed; {KEPT}), or restore what the catalog records and capture again",
    )


@dataclass(frozen=True)
class Decision:
    """A person's decision to reset: who, why, and whether the lake's tables go too."""

    by: str
    reason: str
    #: Remove the dataset's tables the lake still holds (``--drop-table``).
    drop: bool = False


def reset_datasets(
    catalog: Catalog,
    layout: LakeLayout,
    pairs: Sequence[tuple[str, str]],
    decision: Decision,
    ttl: timedelta,
) -> list[dict[str, Any]]:
    """Reset each (source, dataset) of ``pairs``; a report of each.

    Without ``decision.drop``, a dataset whose tables the lake still holds is
    refused before any dataset is reset.
    """
    if not decision.reason.strip():
        raise ConfigError(
            "a reset is recorded with its reason, and none was given",
            hint="say why with --reason, e.g. --reason 'the bucket was emptied'",
        )
    if not decision.drop:
        for source, dataset in pairs:
            kept = tables_in_lake(layout, source, dataset)
            if kept:
                raise refuse_kept(f"{source}.{dataset}", kept)
    return [reset_dataset(catalog, layout, s, d, decision, ttl) for s, d in pairs]


def reset_dataset(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    decision: Decision,
    ttl: timedelta,
) -> dict[str, Any]:
    """Reset one dataset under its lease (see the module); what was done, as a report."""
    holder = f"{HOLDER}{uuid.uuid4().hex[:12]}"
    if not catalog.acquire_lease(source, dataset, holder, ttl):
        run = catalog.lease_holder(source, dataset)
        raise ProtocolViolation(
            f"{source}.{dataset} is held by {run}: nothing was reset",
            hint="reset it once that run (or maintenance) has ended",
        )
    try:
        name = f"{source}.{dataset}"
        kept = tables_in_lake(layout, source, dataset)
        if kept and not decision.drop:
            raise refuse_kept(name, kept)
        with catalog.begin() as conn:
            seen = recorded(conn, source, dataset)
        if seen is None and not kept:
            return {"dataset": name, "reset": False, "note": "the catalog records no table of it"}
        dropped = _drop(layout, name, kept)
        forgotten = _record(catalog, layout, source, dataset, decision, seen, dropped)
        return {"dataset": name, "reset": True, "forgotten": forgotten, "dropped": dropped}
    finally:
        catalog.release_lease(source, dataset, holder)


def _record(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    decision: Decision,
    seen: Recorded | None,
    dropped: list[str],
) -> dict[str, Any]:
    """Record the reset (the ledger, then the catalog and Activity) and forget the table;
    what it forgot."""
    with catalog.begin() as conn:
        row = cat.get_dataset(conn, source, dataset)
        after = resets.newest_publication_seq(conn)
    at = utcnow()
    forgotten = _forgotten(layout, row, seen, dropped)
    # A person's words, kept in the lake and the catalog and shown by `combined sql`:
    # masked as the Activity event masks them (a password pasted into --reason).
    by, reason = redact(decision.by), redact(decision.reason)
    record: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "source": source,
        "dataset": dataset,
        "at": at.isoformat(),
        "by": by,
        "reason": reason,
        "after_seq": after,
        "forgotten": forgotten,
    }
    Ledger(layout).reset(record)  # the lake first, as every recorded decision
    with catalog.begin() as conn:
        resets.record_reset(conn, **{**record, "at": at})
        cat.update_dataset(conn, source, dataset, **_FIRST_CAPTURE)
        cat.emit(
            conn,
            "dataset.reset",
            source=source,
            dataset=dataset,
            by=by,
            reason=reason,
            forgotten=forgotten,
            dropped=dropped,
            kept=KEPT,
        )
    return forgotten


#: A dataset's catalog row as before its first capture: the next capture is one.
_FIRST_CAPTURE: dict[str, Any] = {
    "checkpoint": None,
    "source_position": None,
    "last_sequence": 0,
    "lake_version": None,
    "current_version": None,
    "schema": None,
    "schema_revision": 0,
    "capture_fold": None,
    "published_at": None,  # (its publications read the table forgotten)
}


def _drop(layout: LakeLayout, name: str, tables: Sequence[LakeTable]) -> list[str]:
    """Remove the dataset's ``tables`` from the lake; their locations."""
    for table in tables:
        try:
            layout.store.delete_tree(table.path)
        except OSError as exc:
            raise store_failure(
                f"{name}: the table at {table.path} could not be removed",
                exc,
                "nothing was reset; the same `combined reset --drop-table` removes what is left",
            ) from None
    return [t.path for t in tables]


def _forgotten(
    layout: LakeLayout, row: Any, seen: Recorded | None, dropped: list[str]
) -> dict[str, Any]:
    """What the reset forgets of the dataset's table, as recorded."""
    return {
        "location": layout.table(row.source, row.name),
        "table": "removed by the reset" if dropped else "missing from the lake",
        "lake_version": None if seen is None else seen.lake_version,
        "committed_at": None if seen is None or seen.at is None else seen.at.isoformat(),
        "last_sequence": int(row.last_sequence or 0),
        "dataset_version": row.current_version,
        "checkpoint": row.checkpoint,
        "source_position": row.source_position,
    }
