"""What ``combined status`` shows: freshness and the published position of each dataset.

``version``, ``lake_version`` and ``position`` are those of the dataset's
newest publication: what a query reads. A commit made since and not
published yet (its Run died or did not reconcile) is told apart, under
``unpublished``.

Freshness is the age of the newest published source position: the time
the source was read at that position (the extraction receipt's snapshot
time, else the time its read started), not when the capture was
published. A capture that took an hour to land reads an hour older than
it was published, as the data it holds is.

``last_run`` is the dataset's newest ended Run (its ``id``, ``state`` and
``ended_at``; a canceled Run passed over): a night of failures shows there
even while the published data still reads fresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from combined.catalog import Catalog, resets
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.config import Project
from combined.errors import CombinedError
from combined.protocol import utcnow

if TYPE_CHECKING:
    from combined.engine import Engine
    from combined.lake import LakeLayout

_SLOT_KEYS = ("exists", "lag_bytes", "lag_seconds", "wal_status")
_BINLOG_KEYS = ("committed_retained", "retention_seconds", "may_stay_down_seconds")


def position_time(receipt: Mapping[str, Any] | None) -> datetime | None:
    """When the source was at a published position: its read's snapshot, else its start."""
    for key in ("snapshot_acquired_at", "extraction_started_at"):
        value = (receipt or {}).get(key)
        if value:
            return datetime.fromisoformat(value) if isinstance(value, str) else value
    return None


def dataset_status(
    catalog: Catalog, project: Project, now: datetime | None = None
) -> list[dict[str, Any]]:
    """One row per declared dataset, from the catalog alone."""
    out = []
    with catalog.begin() as conn:
        rows = {(r.source, r.name): r for r in cat.list_datasets(conn)}
        members = cat.newest_members(conn)
        # (a member of a table a reset forgot since: the dataset is unpublished since)
        for key in resets.forgotten_members(conn, resets.newest_publication_seq(conn)):
            members.pop(key, None)
        last = runs_repo.last_ended(conn, {(s, n) for s, n, _ in project.datasets()})
    now = now or utcnow()
    for source, name, d in project.datasets():
        r = rows.get((source, name))
        m = members.get((source, name))
        published = r.published_at if r is not None else None
        target = d.freshness
        at = position_time(m.extraction_receipt) if m is not None else None
        at = at or published  # a publication made before receipts were kept
        age = (now - at) if at else None
        committed = (
            None
            if r is None or r.lake_version is None
            else {
                "position": r.source_position,
                "version": r.current_version,
                "lake_version": r.lake_version,
            }
        )
        shown = (
            None
            if m is None
            else {
                "position": m.source_position,
                "version": m.dataset_version,
                "lake_version": m.lake_version,
            }
        )
        out.append(
            {
                "dataset": f"{source}.{name}",
                "strategy": d.strategy,
                "sync_mode": d.sync_mode,
                "version": shown["version"] if shown else None,
                "lake_version": shown["lake_version"] if shown else None,
                "position": shown["position"] if shown else None,
                "unpublished": committed if _committed(committed) != _committed(shown) else None,
                "published_at": published,
                "position_at": at,
                "age": age,
                "target": target,
                "fresh": None if target is None or age is None else age <= target,
                "last_run": last.get((source, name)),
                "slot": None,
                "table_missing": None,
            }
        )
    return out


def _committed(at: Mapping[str, Any] | None) -> tuple[Any, Any] | None:
    """The dataset and lake versions of a commit or a published member, not its position.

    A capture that changed no row publishes the position it read to with the
    lake version it started from (kept beside the table, ``lake._positions``):
    that position is newer than the commit's, and nothing is unpublished.
    """
    return None if at is None else (at["version"], at["lake_version"])


def add_slot_lag(engine: Engine, rows: list[dict[str, Any]]) -> None:
    """Add each cdc dataset's slot lag (bytes and seconds) to its status row."""
    from combined import cdc

    by_name = {r["dataset"]: r for r in rows}
    sources = {r["dataset"].split(".")[0] for r in rows if r["strategy"] == "cdc"}
    for source in sorted(sources):
        try:
            for st in cdc.status(engine, source):
                # A slot's lag, or a binlog's retention and margin (MariaDB).
                keys = _SLOT_KEYS if "slot" in st else _BINLOG_KEYS
                by_name[st["dataset"]]["slot"] = {k: st.get(k) for k in keys}
        except CombinedError as exc:
            for r in rows:
                if r["dataset"].startswith(f"{source}.") and r["strategy"] == "cdc":
                    r["slot"] = {"error": exc.message}


def add_missing_tables(layout: LakeLayout, rows: list[dict[str, Any]]) -> None:
    """Set ``table_missing`` (its location) on each row whose table the catalog records
    and the lake does not hold: its captures are refused (``runtime._lost``).

    One listing of the lake per source (a table is a directory there); a lake that
    cannot be listed leaves every row as it is.
    """
    recorded = [
        r
        for r in rows
        if r["lake_version"] is not None or (r["unpublished"] or {}).get("lake_version") is not None
    ]
    held: dict[str, set[str] | None] = {}
    for r in recorded:
        source, _, name = r["dataset"].partition(".")
        if source not in held:
            held[source] = layout.store.directories(layout.store.join(source), reading=True)
        found = held[source]
        if found is not None and name not in found:
            r["table_missing"] = layout.table(source, name)
