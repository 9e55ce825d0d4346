"""Project: the catalog made to reflect one lake commit, from the lake's evidence only.

The projection is a function of the lake commit's metadata and the raw
layer only, so :func:`project_commit` serves both the normal path and the
repair of a catalog that lags the lake (:mod:`combined.runtime._recover`).
It records the commit's Deliveries, its dataset version and its MAR, moves
the dataset's checkpoint, and tells the commit as Activity, once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from sqlalchemy.engine import Connection

from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.lake import LakeLayout
from combined.lake._probe import store_failure
from combined.runtime._commit import complete_raw_layer, promote, raw_location
from combined.runtime._faults import fault


def project_commit(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    meta: Mapping[str, Any],
    *,
    staging_root: Path | None = None,
) -> None:
    """Make the catalog reflect one lake commit; idempotent, from lake evidence only."""
    deliveries = list(meta.get("deliveries") or [])
    files = [d["file"] for d in deliveries]
    if meta.get("changes_file"):
        files.append(meta["changes_file"])
    if staging_root is None:
        staging_root = layout.staging(meta["run_id"])
    hashes = {d["file"]: d["content_hash"] for d in deliveries if d.get("content_hash")}
    try:
        promote(layout, staging_root, source, dataset, files, hashes)
    except OSError as exc:
        raise store_failure(
            f"{source}.{dataset}: lake version {meta['lake_version']} was committed, but its "
            "Delivery files could not be put into the raw layer",
            exc,
            "the lake holds the commit: the next capture (or `combined repair`) puts them "
            "there and projects it",
        ) from exc
    gone_empty, expired = complete_raw_layer(layout, source, dataset, meta)
    kept = [f for f in files if f not in gone_empty and f not in expired]
    months = _bill_committed(layout, source, dataset, meta, kept, billed=bool(expired))
    fault("after_usage")
    if meta.get("history"):
        from combined.lake._history import maintain_history

        # Before the catalog moves: a crash in between leaves the catalog
        # behind the lake, and its catch-up mirrors what the history lacks.
        maintain_history(
            layout,
            source,
            dataset,
            _history_told(catalog, source, dataset),
            before_log=lambda: fault("history_before_log"),
        )
        fault("after_history")
    with catalog.begin() as conn:
        # Projecting a commit the catalog already holds changes nothing: no
        # checkpoint moves back and no event is told twice.
        fresh = int(cat.get_dataset(conn, source, dataset).last_sequence or 0) < int(
            meta.get("last_sequence") or 0
        )
        _record_deliveries(conn, layout, source, dataset, meta, expired)
        _record_version(conn, source, dataset, meta)
        for month, counts in months.items():
            cat.set_usage(conn, source, dataset, month, **counts)
        if not fresh:
            return
        cat.update_dataset(conn, source, dataset, **_dataset_values(meta))
        _tell(conn, source, dataset, meta)


def _bill_committed(
    layout: LakeLayout,
    source: str,
    dataset: str,
    meta: Mapping[str, Any],
    kept: list[str],
    *,
    billed: bool,
) -> dict[str, dict[str, int]]:
    """:func:`_bill`, a store's failure said as what it is: the commit landed, its MAR did not.

    The catalog then stays behind the lake, which is the durable record of
    what is unbilled: the next capture of the dataset (or a repair) projects
    the commit again before anything else, and billing it again adds only
    the pairs its month lacks, so it is billed once, however often it fails.
    """
    import duckdb
    from deltalake.exceptions import DeltaError

    try:
        return _bill(layout, source, dataset, meta, kept, billed=billed)
    except (OSError, DeltaError, duckdb.Error) as exc:
        raise store_failure(
            f"{source}.{dataset}: lake version {meta['lake_version']} was committed (its rows "
            "are in the lake), but its MAR could not be billed",
            exc,
            "its billing is pending: the next capture of the dataset (or `combined repair`) "
            "bills it, once, before anything else, and projects the commit",
        ) from exc


def _bill(
    layout: LakeLayout,
    source: str,
    dataset: str,
    meta: Mapping[str, Any],
    kept: list[str],
    *,
    billed: bool = False,
) -> dict[str, dict[str, int]]:
    """MAR of the commit's changes, by month; ``kept``: its files still in the raw layer.

    The transition's changes are its change list, or (``changes_from``) its
    Deliveries, which then hold exactly its changes. ``billed``: a retention
    removed some of its files, which it does only once a commit was billed:
    the month's counts are the usage table's.
    """
    from combined.usage import month_counts, record_usage

    if billed:
        month = f"{datetime.fromisoformat(meta['ingested_at']):%Y-%m}"
        return {month: month_counts(layout, source, dataset, month)}
    changes = [meta["changes_file"]] if meta.get("changes_file") else []
    from_deliveries = not changes and meta.get("changes_from") == "deliveries"
    if from_deliveries:
        changes = kept
    if not changes:
        return {}
    ingested_at = datetime.fromisoformat(meta["ingested_at"])
    return record_usage(
        layout,
        source,
        dataset,
        [raw_location(layout, source, dataset, f) for f in changes],
        month=f"{ingested_at:%Y-%m}",
        unique=bool(meta.get("changes_unique")),
        deliveries=from_deliveries,
    )


def _record_deliveries(
    conn: Connection,
    layout: LakeLayout,
    source: str,
    dataset: str,
    meta: Mapping[str, Any],
    expired: Collection[str] = (),
) -> None:
    """Record the commit's Deliveries, committed (``expired``: their files a retention
    removed), where the raw layer keeps them."""
    deliveries = list(meta.get("deliveries") or [])
    for d in deliveries:
        cat.record_delivery(
            conn,
            id=d["id"],
            run_id=meta["run_id"],
            source=source,
            dataset=dataset,
            sequence=d["sequence"],
            schema_revision=d["schema_revision"],
            record_count=d["records"],
            byte_count=d["bytes"],
            content_hash=d["content_hash"],
            state="staged",
            path=raw_location(layout, source, dataset, d["file"]),
        )
    cat.mark_deliveries(
        conn,
        [d["id"] for d in deliveries],
        "committed",
        lake_version=int(meta["lake_version"]),
        committed_at=datetime.fromisoformat(meta["ingested_at"]),
    )
    gone = [d["id"] for d in deliveries if d["file"] in expired]
    if gone:
        cat.mark_deliveries(conn, gone, "expired")


def _record_version(conn: Connection, source: str, dataset: str, meta: Mapping[str, Any]) -> None:
    """Record the dataset version the commit made, unless the catalog holds it already."""
    version, tr = meta["version"], meta["transition"]
    if version.get("id") and cat.get_version(conn, version["id"]) is None:
        cat.add_version(
            conn,
            id=version["id"],
            source=source,
            dataset=dataset,
            parent_id=version.get("parent"),
            transition_digest=tr["digest"],
            inserts=tr["inserts"],
            updates=tr["updates"],
            deletes=tr["deletes"],
            row_count=version["row_count"],
            content_digest=version["content_digest"],
            run_id=meta["run_id"],
            lake_version=int(meta["lake_version"]),
        )


def _dataset_values(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset's catalog row as of the commit: checkpoint, position, version, schema."""
    deliveries = list(meta.get("deliveries") or [])
    schema = meta.get("schema")
    values: dict[str, Any] = {
        "checkpoint": meta.get("checkpoint"),
        "source_position": meta.get("source_position"),
        "last_sequence": int(meta.get("last_sequence") or 0),
        "lake_version": int(meta["lake_version"]),
        "current_version": meta["version"].get("id"),
    }
    if schema is not None:
        values["schema"] = schema
    if deliveries:
        values["schema_revision"] = deliveries[-1]["schema_revision"]
    return values


def _tell(conn: Connection, source: str, dataset: str, meta: Mapping[str, Any]) -> None:
    """The commit as Activity: its drift events, then ``delivery.committed``."""
    for event in meta.get("drift") or []:
        cat.emit(conn, "drift", source=source, dataset=dataset, run_id=meta["run_id"], **event)
    cat.emit(
        conn,
        "delivery.committed",
        source=source,
        dataset=dataset,
        run_id=meta["run_id"],
        lake_version=int(meta["lake_version"]),
        deliveries=len(meta.get("deliveries") or []),
        **meta["transition"],
    )


def _history_told(catalog: Catalog, source: str, dataset: str) -> Any:
    """Record a history's restart from the projection as Activity (``history.restarted``)."""

    def told(body: dict[str, Any]) -> None:
        with catalog.begin() as conn:
            cat.emit(conn, "history.restarted", source=source, dataset=dataset, **body)

    return told


def commit_reset(
    catalog: Catalog, layout: LakeLayout, source: str, dataset: str, reason: str
) -> int | None:
    """Record, in the lake, that a dataset's checkpoint is void (a recorded decision).

    The next capture then starts from scratch (a CDC dataset re-snapshots and
    reconciles against the lake) instead of resuming from a position its
    source can no longer serve. Returns the lake version, or None without a table.
    """
    now = datetime.now(UTC)
    version = commit_checkpoint(
        catalog, layout, source, dataset, None, run_id=f"reset-{now:%Y%m%d%H%M%S}", reset=reason
    )
    if version is not None:
        with catalog.begin() as conn:
            cat.emit(conn, "checkpoint.reset", source=source, dataset=dataset, reason=reason)
    return version


def commit_checkpoint(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    checkpoint: Mapping[str, Any] | None,
    *,
    run_id: str,
    source_position: str | None = None,
    **marks: Any,
) -> int | None:
    """Set a dataset's checkpoint by a lake commit that changes no row, and project it.

    ``marks`` are kept in the commit's metadata (``reset``: why it was voided).
    Returns the lake version, or None without a table.
    """
    table = layout.dataset_table(source, dataset)
    schema = table.schema()
    if schema is None:
        return None
    seq = table.committed_sequence() + 1
    now = datetime.now(UTC)
    with catalog.begin() as conn:
        current = cat.get_dataset(conn, source, dataset).current_version
    meta: dict[str, Any] = {
        "dataset": f"{source}.{dataset}",
        "run_id": run_id,
        "admission_id": None,
        "first_sequence": seq,
        "last_sequence": seq,
        "deliveries": [],
        "changes_file": None,
        "source_position": source_position,
        "checkpoint": None if checkpoint is None else dict(checkpoint),
        **marks,
        "key": (table.latest_commit() or {}).get("key"),  # the ids' key still
        "extraction_receipt": None,
        "transition": {
            "inserts": 0,
            "updates": 0,
            "deletes": 0,
            "unchanged": 0,
            "captured": 0,
            "digest": "0" * 32,
        },
        "version": {"id": current, "parent": current},
        "drift": [],
        "schema": None,
        "ingested_at": now.isoformat(),
    }
    result = table.commit(
        first_sequence=seq,
        last_sequence=seq,
        mode="append",
        data=lambda: pa.RecordBatchReader.from_batches(schema, []),
        metadata=meta,
        needs_merge=False,
    )
    meta["lake_version"] = result.lake_version
    project_commit(catalog, layout, source, dataset, meta)
    return result.lake_version
