"""Admitting a Run: a queued Run under a frozen admission, taken now or left to a worker."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.engine import Connection

from combined.catalog import Admission, Catalog, Run, Trigger, worker_identity
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo


def admit(
    catalog: Catalog,
    *,
    source: str,
    datasets: Sequence[str],
    trigger: Trigger,
    admission: Admission,
    retry_of: str | None = None,
    enqueue: bool = False,
    conn: Connection | None = None,
    not_before: datetime | None = None,
) -> Run:
    """Create a queued Run under ``admission``.

    The Run is taken by this process, which executes it next, unless
    ``enqueue``: then it waits in the queue until a worker takes it. Given
    ``conn``, the Run is admitted in that transaction (with the checks the
    caller made in it). A Run with ``not_before`` waits in the queue until then.
    """
    if conn is None:
        with catalog.begin() as conn:
            return admit(
                catalog,
                source=source,
                datasets=datasets,
                trigger=trigger,
                admission=admission,
                retry_of=retry_of,
                enqueue=enqueue,
                conn=conn,
                not_before=not_before,
            )
    run = runs_repo.create_run(
        conn,
        source=source,
        datasets=datasets,
        trigger=trigger,
        admission=admission,
        retry_of=retry_of,
        claimed_by=None if enqueue else worker_identity(),
        not_before=not_before,
    )
    cat.emit(
        conn,
        "run.queued",
        source=source,
        run_id=run.id,
        trigger=trigger,
        **({"waits_for": "worker"} if enqueue else {}),
        **({"not_before": not_before.isoformat()} if not_before else {}),
    )
    return run


__all__ = ["admit"]


def admit_retry(
    catalog: Catalog,
    conn: Connection,
    run: Run,
    *,
    enqueue: bool,
    not_before: datetime | None = None,
) -> Run:
    """A retry of ``run`` under its own admission, never a newer configuration."""
    return admit(
        catalog,
        source=run.source,
        datasets=run.datasets,
        trigger="retry",
        admission=runs_repo.get_admission(conn, run.admission_id),
        retry_of=run.id,
        enqueue=enqueue,
        conn=conn,
        not_before=not_before,
    )
