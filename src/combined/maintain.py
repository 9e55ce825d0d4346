"""``combined maintain``: compaction, vacuum and raw-layer retention, by declared policy.

Nothing while the catalog lacks publications the lake's ledger holds
(``combined repair`` first). For each dataset, under its lease (no capture of
it runs meanwhile), and
none while a Run of it has not ended (one whose process died after its lake
commit: the table's files complete its raw layer until ``combined repair`` or
the next capture projects it); lake commits the catalog lacks (a Run that
failed after its commit) are projected first:

1. its table's small files are compacted (one maintenance commit, same rows);
2. its table is vacuumed: the files no kept publication reads are deleted.
   A publication is kept while it is newer than ``retention.publications``
   (and the basis in force at that horizon, and every newest one);
3. its committed Deliveries older than ``retention.raw`` leave the raw layer:
   the decision (what, why, which policy) is recorded first, as an Activity
   event ``maintenance.raw_removed`` with the Deliveries marked ``expired``;
   only then are their files deleted (with ``history: true``, not those of
   commits the history has still to mirror), once MAR holds a copy of the
   identities it billed by reference to them;
4. its MAR table (``_usage/``) is compacted and vacuumed;
5. its history table (``_history/``, ``history: true``) is compacted, and
   vacuumed of the files no history version that a kept publication reads
   holds;
6. its orphans (files no commit names, a killed writer's) are found, and
   removed only under ``retention.orphans`` (:mod:`combined._orphans`).

Each step that changed something writes an Activity event.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from combined._orphans import orphans, unended_run
from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.config import Project
from combined.config._retention import FOREVER, Retention
from combined.errors import CombinedError, LakeError, redact
from combined.lake import LakeLayout
from combined.lake._ledger import LEDGER_TABLES, Ledger
from combined.lake._maintain import compact, reading_version, vacuum
from combined.lake._table import LakeTable
from combined.protocol import utcnow
from combined.usage._refs import keep_billed

#: The lease holder prefix of a maintenance (a Run id never starts so).
HOLDER = "maintain:"


def maintain(
    project: Project,
    catalog: Catalog,
    layout: LakeLayout,
    datasets: Sequence[tuple[str, str]],
    *,
    ttl: timedelta,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Maintain each dataset under its lease; one report per dataset."""
    now = now or utcnow()
    behind = _catalog_behind(catalog, layout)
    if behind is not None:  # (its vacuum would take what the lake's publications read)
        return [{"dataset": f"{s}.{d}", "skipped": behind} for s, d in datasets]
    reports: list[dict[str, Any]] = []
    for source, dataset in datasets:
        holder = f"{HOLDER}{uuid.uuid4().hex[:12]}"
        if not catalog.acquire_lease(source, dataset, holder, ttl):
            run = catalog.lease_holder(source, dataset)
            reports.append({"dataset": f"{source}.{dataset}", "skipped": f"run {run} holds it"})
            continue
        try:
            # A Run that has not ended may have committed without its projection: compacted
            # and vacuumed, the table no longer holds the files that complete its raw layer.
            unended = unended_run(catalog, source, dataset)
            if unended is not None:
                reports.append({"dataset": f"{source}.{dataset}", "skipped": unended})
                continue
            projected: list[str] = []
            failed = _caught_up(catalog, layout, source, dataset, projected)
            if failed is not None:  # (an error, not a wait: `not_projected`, exit 1)
                reports.append(
                    {"dataset": f"{source}.{dataset}", "skipped": failed, "not_projected": True}
                )
                continue
            retention = project.retention_of(source, dataset)
            try:
                report = _dataset(catalog, layout, source, dataset, retention, now)
            except (OSError, LakeError) as exc:  # (a store failing: this dataset alone)
                report = _store_failed(source, dataset, exc)
            reports.append({**report, "projected": projected} if projected else report)
        finally:
            catalog.release_lease(source, dataset, holder)
    return reports


def _store_failed(source: str, dataset: str, exc: Exception) -> dict[str, Any]:
    """The report of a dataset whose maintenance the lake's store failed (``failed``: exit 1).

    Each step is a commit or a recorded removal of its own: what was done before
    the failure stays, and the next ``combined maintain`` goes on from there.
    """
    error = exc.message if isinstance(exc, CombinedError) else redact(str(exc))
    return {
        "dataset": f"{source}.{dataset}",
        "skipped": f"the lake's store failed while it was maintained ({error}); what was "
        "done before stays, and the next `combined maintain` goes on",
        "failed": True,
    }


def _catalog_behind(catalog: Catalog, layout: LakeLayout) -> str | None:
    """Why nothing is maintained while the catalog lacks publications the lake's ledger
    holds (a catalog lost, or restored from an older backup), else None.

    Its vacuum keeps the files of the publications the catalog knows: on a
    lost catalog it removed what every publication but the newest reads,
    whatever ``retention.publications`` said.
    """
    ledger = Ledger(layout)
    records = ledger.records() if ledger.table("publications").exists() else []
    if not records:
        return None
    with catalog.begin() as conn:
        newest = cat.get_publication(conn)
    known = 0 if newest is None else int(newest.seq)
    lake = max(int(r.get("seq") or 0) for r in records)
    if lake <= known:
        return None
    return (
        f"the catalog holds publications up to {known} of the lake's {lake} (lost, restored "
        "from an older backup, or a publication being made right now): run `combined repair` "
        "first, which rebuilds them from the lake, or maintain again in a moment"
    )


def _caught_up(
    catalog: Catalog, layout: LakeLayout, source: str, dataset: str, projected: list[str]
) -> str | None:
    """Project the lake commits the catalog lacks (a Run that failed after its commit),
    each told in ``projected``; why the dataset is not maintained when they cannot be,
    else None.

    Their raw layer is completed from the run's staging or the table's files,
    which compaction and vacuum would take. Whatever stops them (a store's
    error too) leaves this dataset alone, never the others.
    """
    from combined.runtime._recover import NOT_PROJECTED, catch_up

    try:
        catch_up(catalog, layout, source, dataset, projected)
    except Exception as exc:  # noqa: BLE001 - one dataset never blocks the others
        error = exc.message if isinstance(exc, CombinedError) else redact(repr(exc))
        return f"{NOT_PROJECTED} first ({error}); `combined repair` says why"
    return None


def _dataset(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    retention: Retention,
    now: datetime,
) -> dict[str, Any]:
    table = layout.dataset_table(source, dataset)
    report: dict[str, Any] = {"dataset": f"{source}.{dataset}"}
    done = compact(table, "combined maintain")
    report["compacted"] = 0 if done is None else done.files_removed
    if done is not None:
        _emit(catalog, "maintenance.compacted", source, dataset, **vars(done))
    report["vacuumed"] = _vacuum_table(catalog, table, source, dataset, retention, now)
    report["raw_removed"] = expire_raw(catalog, layout, source, dataset, retention, now)
    usage = layout.usage_table(source, dataset)
    used = compact(usage, "combined maintain")
    report["usage_vacuumed"] = len(vacuum(usage, set(), "the newest MAR version is kept"))
    report["usage_compacted"] = 0 if used is None else used.files_removed
    report.update(_history(catalog, layout, source, dataset, retention, now))
    report["orphans"] = orphans(catalog, layout, source, dataset, retention, now)
    return report


def _history(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    retention: Retention,
    now: datetime,
) -> dict[str, int]:
    """Compact the dataset's history; vacuum what no kept publication's history version reads."""
    from combined.lake._history import history_table, history_version

    history = history_table(layout, source, dataset)
    if not history.exists():
        return {}
    done = compact(history, "combined maintain")
    keep = retention.publications
    with catalog.begin() as conn:
        published = cat.kept_lake_versions(
            conn, source, dataset, None if keep == FOREVER else now - keep
        )
    mirrored = {history_version(layout, source, dataset, v) for v in published}
    kept = {v for v in mirrored if v is not None}
    kept |= {reading_version(history, v) for v in kept}
    removed = vacuum(history, kept, retention.describe("publications"))
    return {
        "history_compacted": 0 if done is None else done.files_removed,
        "history_vacuumed": len(removed),
    }


def _vacuum_table(
    catalog: Catalog,
    table: LakeTable,
    source: str,
    dataset: str,
    retention: Retention,
    now: datetime,
) -> int:
    """Vacuum the files no kept publication reads; the decision told as Activity."""
    keep = retention.publications
    since = None if keep == FOREVER else now - keep
    with catalog.begin() as conn:
        published = cat.kept_lake_versions(conn, source, dataset, since)
    # A kept publication is read through its compaction (the same rows, fewer files).
    kept = published | {reading_version(table, v) for v in published}
    policy = retention.describe("publications")
    removed = vacuum(table, kept, policy)
    if removed:
        _emit(
            catalog,
            "maintenance.vacuumed",
            source,
            dataset,
            files=len(removed),
            policy=policy,
            kept_since=None if since is None else since.isoformat(),
            kept_lake_versions=sorted(kept),
        )
    return len(removed)


def expire_raw(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    retention: Retention,
    now: datetime,
) -> int:
    """Remove the dataset's Deliveries committed before ``retention.raw``; how many went.

    The decision is recorded first (Deliveries ``expired``, a
    ``maintenance.raw_removed`` event naming them and the policy), then the
    files are deleted: a crash in between leaves files the next maintenance
    deletes, never a removal nobody decided.
    """
    if retention.raw == FOREVER:
        return 0
    horizon = now - retention.raw
    policy = retention.describe("raw")
    with catalog.begin() as conn:
        rows = [
            d
            for d in cat.deliveries(
                conn, source=source, dataset=dataset, states=["committed", "expired"]
            )
            if d.committed_at is not None and d.committed_at < horizon
        ]
        # Kept: the Deliveries of commits the history has still to mirror.
        mirrored = _history_mirrored(layout, source, dataset)
        rows = [d for d in rows if d.state == "expired" or d.sequence <= mirrored]
        fresh = [d for d in rows if d.state == "committed"]
        if fresh:
            # The lake keeps the decision too (first): a catalog rebuilt by `combined
            # repair` then finds the commits whose files it names complete.
            Ledger(layout).expiry(
                source,
                dataset,
                [d.path.rsplit("/", 1)[-1] for d in fresh],  # (named as commits name them)
                policy=policy,
                committed_before=horizon.isoformat(),
            )
            cat.mark_deliveries(conn, [d.id for d in fresh], "expired")
            cat.emit(
                conn,
                "maintenance.raw_removed",
                source=source,
                dataset=dataset,
                deliveries=[d.id for d in fresh],
                sequences=[min(d.sequence for d in fresh), max(d.sequence for d in fresh)],
                committed_before=horizon.isoformat(),
                reason=f"committed before {horizon.isoformat()}, older than {policy}",
                policy=policy,
            )
    # MAR bills a first capture's rows by reference to its Deliveries: their
    # ids are copied into the usage table before the files go.
    keep_billed(layout, (source, dataset), [d.path.rsplit("/", 1)[-1] for d in rows])
    for d in rows:
        layout.store.delete(d.path)
    return len(fresh)


def _history_mirrored(layout: LakeLayout, source: str, dataset: str) -> float:
    """The last Delivery sequence the history mirrors, where the history is on; else infinity.

    On: the dataset's newest commit with Deliveries was made with ``history: true``.
    """
    from combined.lake._history import history_table

    newest = next(
        (m for m in layout.dataset_table(source, dataset).commits() if m.get("deliveries")), None
    )
    if newest is None or not newest.get("history"):
        return float("inf")
    return history_table(layout, source, dataset).committed_sequence()


def _emit(catalog: Catalog, kind: str, source: str, dataset: str, **body: Any) -> None:
    with catalog.begin() as conn:
        cat.emit(conn, kind, source=source, dataset=dataset, **body)


def explain_removed(catalog: Catalog, project: Project, exc: Any, publication: Any) -> Any:
    """A query's missing files (``exc``, a ``FilesRemoved``) said with what removed them."""
    from combined.errors import FilesExpired

    source, dataset = exc.context["source"], exc.context["dataset"]
    version = exc.context["lake_version"]
    with catalog.begin() as conn:
        events = cat.activity(
            conn, limit=1, kind="maintenance.vacuumed", source=source, dataset=dataset, exact=True
        )
    read = (
        f"publication {publication.id} (published {publication.published_at.isoformat()}) "
        f"reads {source}.{dataset} at lake version {version}"
    )
    if exc.context.get("missing"):  # the whole table: no retention removes that
        from combined.runtime._lost import CAUSES

        return FilesExpired(
            f"{read}, but its table at {exc.context['missing']} is missing from the lake "
            f"({CAUSES}), though the catalog records it",
            hint="restore the lake (or point `lake:` back at it); or record a reset, "
            f"`combined reset {source}.{dataset} --reason TEXT --yes`, and capture it again "
            "to publish a new table (captures of it are refused until then)",
            **exc.context,
        )
    if not events:
        return FilesExpired(
            f"{read}, whose files are no longer in the lake: they were removed outside "
            "Combined (the table's directory deleted, a VACUUM of the table, or the expiry "
            "of its Delta log)",
            hint="query a later publication (`combined publications` lists them), or capture "
            "again to publish what the lake holds now; remove a table's files only with "
            "`combined maintain`, which keeps what publications read",
            **exc.context,
        )
    body = events[0].body or {}
    since = body.get("kept_since")
    return FilesExpired(
        f"{read}, whose files `combined maintain` removed on {events[0].at.isoformat()} under "
        f"{body.get('policy')}" + (f": publications before {since} are not kept" if since else ""),
        hint="query a newer publication or instant (`combined publications` lists them); "
        "lengthen retention.publications in combined.yaml to keep more from now on",
        **exc.context,
    )


def compact_ledger(layout: LakeLayout) -> dict[str, Any]:
    """Compact and vacuum the ledger's tables (``_combined/``): one file per record otherwise."""
    compacted = vacuumed = 0
    for name in LEDGER_TABLES:
        table = Ledger(layout).table(name)
        done = compact(table, "combined maintain")
        compacted += 0 if done is None else done.files_removed
        vacuumed += len(vacuum(table, set(), "the ledger's newest version is kept"))
    return {
        "dataset": "_combined (ledger)",
        "compacted": compacted,
        "vacuumed": vacuumed,
        "raw_removed": 0,
        "usage_compacted": 0,
        "usage_vacuumed": 0,
    }
