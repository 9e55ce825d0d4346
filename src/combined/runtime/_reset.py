"""``combined reset``: forget, by a recorded decision, the lake table a dataset's catalog records.

After its table was lost (``runtime._lost`` then refuses every capture of
the dataset), or to start a dataset afresh on purpose (a new identity
encoding, ``docs/identity.md`` section 7), a person resets it: the catalog
forgets the table's versions, delivery sequence, dataset version and
checkpoint, so that its next capture is a first capture, making a new table.

The decision is recorded first, in the lake's ledger (``_combined/resets``,
as begun: a catalog rebuilt from the lake knows it), with who made it,
when, why, what it forgets and the tables it removes. Then the tables still
in the lake go (the projection, or its ``_history/`` table, whose sequences
the new table would restart under: only when asked, ``drop``), then the
catalog forgets the table in one transaction that records the reset
(``dataset_resets``) and the Activity event ``dataset.reset``, then the
ledger marks it done. A reset stopped at any step (a store failing, the
process killed) is finished by the same reset again, as it was decided:
under the lease it finds the ledger's begun record, removes what is left,
and records in the catalog what the catalog lacks, never a second reset nor
a removed table as missing. The dataset's members published before it name
versions of the table it forgot: a query of them says so, and a
publication of the new table is not held older than them.

Nothing else goes: the raw layer's Deliveries, the
quarantine and the MAR table (``_usage/``, whose identities the new table's
changes are billed against, so a row billed this month is not billed again)
stay, with the catalog's records of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from combined._credentials import redact
from combined.catalog import Catalog, resets
from combined.catalog import data as cat
from combined.catalog._resets import BEGUN, DONE
from combined.errors import ConfigError, LakeError, ProtocolViolation
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
        hint='pass --drop-table (through the API, "drop_table": true) to remove them with '
        "the reset (recorded in the activity "
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
            _state(catalog, layout, source, dataset, decision)
    return [reset_dataset(catalog, layout, s, d, decision, ttl) for s, d in pairs]


@dataclass(frozen=True)
class _State:
    """Where a dataset's reset stands before this one acts."""

    #: The reset the ledger records as begun and not done (stopped part way), if any.
    begun: dict[str, Any] | None
    #: The newest publication's number the catalog recorded ``begun`` after; None: not yet.
    after: int | None
    #: The dataset's tables the lake holds (none looked for once the catalog forgot them).
    kept: list[LakeTable]


def _state(
    catalog: Catalog, layout: LakeLayout, source: str, dataset: str, decision: Decision
) -> _State:
    """Where the dataset's reset stands; refused when the lake holds tables not to drop."""
    begun = None
    for r in Ledger(layout).resets():
        if (r["source"], r["dataset"], r.get("state")) == (source, dataset, BEGUN):
            begun = r if begun is None or str(r["at"]) > str(begun["at"]) else begun
    with catalog.begin() as conn:
        after = None if begun is None else resets.reset_after_seq(conn, begun["id"])
    if after is not None:  # the catalog forgot the table: a new capture's may be there
        return _State(begun, after, [])
    kept = tables_in_lake(layout, source, dataset)
    if kept and not decision.drop:
        raise refuse_kept(f"{source}.{dataset}", kept)
    return _State(begun, None, kept)


def reset_dataset(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    decision: Decision,
    ttl: timedelta,
) -> dict[str, Any]:
    """Reset one dataset under its lease (see the module); what was done, as a report.

    A reset the ledger records as begun is finished as it was decided (its
    who, when and why), whatever this one's reason.
    """
    holder = f"{HOLDER}{uuid.uuid4().hex[:12]}"
    if not catalog.acquire_lease(source, dataset, holder, ttl):
        run = catalog.lease_holder(source, dataset)
        raise ProtocolViolation(
            f"{source}.{dataset} is held by {run}: nothing was reset",
            hint="reset it once that run (or maintenance) has ended",
        )
    try:
        state = _state(catalog, layout, source, dataset, decision)
        if state.begun is not None:  # stopped part way: finished as it was decided
            done = _finish(catalog, layout, state.begun, state.kept, state.after)
            begun = state.begun
            return {**done, "finished": begun["at"], "by": begun["by"], "reason": begun["reason"]}
        with catalog.begin() as conn:
            seen = recorded(conn, source, dataset)
        if seen is None and not state.kept:
            name = f"{source}.{dataset}"
            return {"dataset": name, "reset": False, "note": "the catalog records no table of it"}
        record = _decided(catalog, layout, source, dataset, decision, seen, state.kept)
        # The decision first, in the lake: from here, the same reset finishes it.
        _keep(layout, record, "nothing was reset")
        return _finish(catalog, layout, record, state.kept, None)
    finally:
        catalog.release_lease(source, dataset, holder)


def _decided(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    decision: Decision,
    seen: Recorded | None,
    kept: Sequence[LakeTable],
) -> dict[str, Any]:
    """The reset's record as the ledger first keeps it (:data:`BEGUN`): who, when, why and
    what it forgets, the tables it removes among it."""
    with catalog.begin() as conn:
        row = cat.get_dataset(conn, source, dataset)
    return {
        "id": uuid.uuid4().hex,
        "source": source,
        "dataset": dataset,
        "at": utcnow().isoformat(),
        # A person's words, kept in the lake and the catalog and shown by `combined sql`:
        # masked as the Activity event masks them (a password pasted into --reason).
        "by": redact(decision.by),
        "reason": redact(decision.reason),
        "forgotten": _forgotten(layout, row, seen, [t.path for t in kept]),
        "dropped": [t.path for t in kept],
        "state": BEGUN,
    }


def _finish(
    catalog: Catalog,
    layout: LakeLayout,
    record: dict[str, Any],
    kept: Sequence[LakeTable],
    after: int | None,
) -> dict[str, Any]:
    """Carry out the reset ``record`` decided: remove the tables, forget them in the catalog
    (with Activity), then mark it done in the ledger. ``after``: the catalog recorded it
    already (after that publication), and only the ledger's mark is left."""
    name = f"{record['source']}.{record['dataset']}"
    dropped = sorted({*record["dropped"], *(t.path for t in kept)})
    record = {**record, "dropped": dropped}
    if dropped:  # (begun over a missing table, finished over one put back meanwhile)
        record["forgotten"] = {**record["forgotten"], "table": "removed by the reset"}
    if after is None:
        _drop(layout, name, kept)
        after = _forget(catalog, record)
    _keep(layout, {**record, "after_seq": after, "state": DONE}, "reset, but not marked done")
    return {"dataset": name, "reset": True, "forgotten": record["forgotten"], "dropped": dropped}


def _keep(layout: LakeLayout, record: dict[str, Any], then: str) -> None:
    """Keep the reset's ``record`` in the lake's ledger; ``then``: what the store failing
    this write leaves, which the same reset again finishes."""
    name = f"{record['source']}.{record['dataset']}"
    try:
        Ledger(layout).reset(record)
    except LakeError as exc:
        raise LakeError(
            f"{name}: {then}: {exc.message}",
            hint=f"once the store answers, the same `combined reset {name}` finishes it "
            "(never resetting it twice)",
        ) from None


def _forget(catalog: Catalog, record: dict[str, Any]) -> int:
    """Record the reset in the catalog and Activity and forget the table, in one
    transaction; the newest publication's number it is recorded after."""
    source, dataset = record["source"], record["dataset"]
    forgotten, dropped = record["forgotten"], record["dropped"]
    with catalog.begin() as conn:
        # (now, not when decided: a publication between names the table forgotten)
        after = resets.newest_publication_seq(conn)
        resets.record_reset(
            conn,
            **{k: record[k] for k in ("id", "source", "dataset", "by", "reason")},
            at=datetime.fromisoformat(record["at"]),
            after_seq=after,
            forgotten=forgotten,
        )
        cat.update_dataset(conn, source, dataset, **_FIRST_CAPTURE)
        cat.emit(
            conn,
            "dataset.reset",
            source=source,
            dataset=dataset,
            by=record["by"],
            reason=record["reason"],
            forgotten=forgotten,
            dropped=dropped,
            kept=KEPT,
        )
    return after


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
                "the reset is recorded in the lake's ledger as begun: the same `combined reset "
                f"{name} --drop-table` removes what is left and finishes it",
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
