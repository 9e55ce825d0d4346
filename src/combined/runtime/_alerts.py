"""Conditions that raise an alert: each an Activity event ``alert.<kind>``, once per change.

Some alerts are one event each: a Run that ended ``failed``,
``needs_review`` or ``needs_auth`` where its datasets' previous Runs did
not (raised where the Run ends, once per incident), a
reconciliation that disagrees, a recovery that failed. Others are states
checked from time to time (by the scheduler each round, by
``combined alerts``): a dataset past its freshness target, a CDC stream at
risk. A state raises its alert when it starts, and a clearing event
(``freshness.restored``, ``cdc.slot_safe``) when it ends, so that a breach
is told once, not on every check, and a new breach after a recovery is
told again. Overdue quarantine reviews are told once a review period
(:func:`combined.quality.quarantine.remind`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, queue
from combined.catalog import data as cat
from combined.config import Project
from combined.config._models import AlertSettings
from combined.config._values import format_duration
from combined.errors import CombinedError
from combined.protocol import utcnow

if TYPE_CHECKING:
    from combined.engine import Engine

#: The event that ends each state alert.
CLEARS = {"alert.freshness": "freshness.restored", "alert.cdc_slot_at_risk": "cdc.slot_safe"}


def raise_once(
    catalog: Catalog,
    kind: str,
    *,
    source: str,
    dataset: str,
    breached: bool,
    **body: Any,
) -> bool:
    """Emit ``kind`` when a state starts, its clearing event when it ends; whether it did.

    The dataset's row is locked first, so two checkers at once tell a
    change once.
    """
    with catalog.begin() as conn:  # read first: most checks change nothing, and write nothing
        if breached == _raised(conn, kind, source, dataset):
            return False
    with catalog.begin() as conn:
        queue.lock_dataset(conn, source, dataset)
        if breached == _raised(conn, kind, source, dataset):
            return False  # another checker told it meanwhile
        cat.emit(conn, kind if breached else CLEARS[kind], source=source, dataset=dataset, **body)
        return breached


def _raised(conn: Connection, kind: str, source: str, dataset: str) -> bool:
    """Whether the state alert ``kind`` is raised (its newest event is not its clearing one)."""
    last = [
        e
        for k in (kind, CLEARS[kind])
        for e in cat.activity(conn, kind=k, source=source, dataset=dataset, limit=1, exact=True)
    ]
    return bool(last) and max(last, key=lambda e: e.id).kind == kind


def check_freshness(catalog: Catalog, project: Project, now: datetime | None = None) -> list[str]:
    """Alert (once per breach) on each dataset whose published data is older than its target."""
    from combined._freshness import dataset_status

    now = now or utcnow()
    notes = []
    for row in dataset_status(catalog, project, now=now):
        if row["target"] is None or row["age"] is None:
            continue
        source, _, name = row["dataset"].partition(".")
        age, target = row["age"], row["target"]
        # the summary a person reads (a Slack target gets nothing else) says how stale
        why = (
            f"its published data is {format_duration(timedelta(seconds=int(age.total_seconds())))}"
            f" old, {'past' if age > target else 'within'} its freshness target of "
            f"{format_duration(target)}"
        )
        told = raise_once(
            catalog,
            "alert.freshness",
            source=source,
            dataset=name,
            breached=age > target,
            why=why,
            age_s=int(age.total_seconds()),
            target_s=int(target.total_seconds()),
            position=row["position"],
            position_at=row["position_at"].isoformat() if row["position_at"] else None,
        )
        if told:
            notes.append(f"{row['dataset']} is stale: {why}")
    return notes


def slot_risk(status: Mapping[str, Any], settings: AlertSettings) -> str | None:
    """Why a CDC stream's status puts it at risk, with how long the source keeps it; or None."""
    horizon = settings.slot_horizon.total_seconds()
    if "may_stay_down_seconds" in status:  # a binlog (MariaDB, MySQL)
        left = status.get("may_stay_down_seconds")
        if left is not None and left < horizon:
            return f"the binlog the stream needs is purged in about {_span(left)}"
        return None
    if not status.get("exists", True):
        return "its replication slot does not exist: the next capture takes a new snapshot"
    wal = status.get("wal_status")
    if wal in ("lost", "unreserved"):
        return f"its replication slot's WAL is {wal}: the source no longer keeps what it needs"
    keeps = status.get("keeps_for_seconds")
    if keeps is not None and keeps < horizon:
        return (
            f"at the current WAL rate the source keeps this slot's WAL for about {_span(keeps)} "
            f"more (max_slot_wal_keep_size {status.get('wal_keep_limit')} bytes, "
            f"safe_wal_size {status.get('safe_wal_size')} bytes)"
        )
    lag = status.get("lag_bytes")
    if status.get("wal_keep_limit") is None and lag is not None and lag > settings.slot_max_lag:
        return (
            f"the slot retains {lag} bytes of WAL not yet captured, with no "
            "max_slot_wal_keep_size: the source keeps it until its disk fills"
        )
    return None


def _span(seconds: float) -> str:
    return format_duration(timedelta(seconds=max(int(seconds), 1)))


#: How often a CDC stream's status is kept in the feed (``cdc.slot_status``, for /metrics).
OBSERVE_EVERY = timedelta(minutes=1)


def observe(catalog: Catalog, source: str, dataset: str, status: Mapping[str, Any]) -> None:
    """Keep a stream's status (``cdc.slot_status``), at most once per :data:`OBSERVE_EVERY`."""
    with catalog.begin() as conn:
        last = cat.activity(
            conn, kind="cdc.slot_status", source=source, dataset=dataset, limit=1, exact=True
        )
        if last and last[0].at > utcnow() - OBSERVE_EVERY:
            return
        cat.emit(conn, "cdc.slot_status", source=source, dataset=dataset, **status)


def check_slots(engine: Engine, sources: Iterable[str] | None = None) -> list[str]:
    """Alert (once per change) on each CDC stream at risk; this asks each CDC source."""
    from combined import cdc

    cdc_sources = sorted(
        {s for s, _, d in engine.project.datasets() if d.strategy == "cdc"}
        & set(sources if sources is not None else engine.project.sources)
    )
    notes = []
    for source in cdc_sources:
        try:
            statuses = cdc.status(engine, source)
        except CombinedError as exc:
            notes.append(f"{source}: the CDC status could not be read: {exc.message}")
            continue
        for st in statuses:
            name = st["dataset"].partition(".")[2]
            why = slot_risk(st, engine.project.alerts)
            keep = {k: v for k, v in st.items() if k != "dataset"}
            observe(engine.catalog, source, name, keep)
            told = raise_once(
                engine.catalog,
                "alert.cdc_slot_at_risk",
                source=source,
                dataset=name,
                breached=why is not None,
                why=why,
                **keep,
            )
            if told:
                notes.append(f"{st['dataset']}: CDC stream at risk: {why}")
    return notes
