"""Admit: a source's configuration frozen into an admission; a queued Run under it.

A Run is taken now or left to a worker; a retry runs under its failed
Run's own admission, and a webhook's capture joins one already waiting.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from combined.capture._soft import spec_of
from combined.catalog import Admission, Catalog, Run, Trigger, queue, worker_identity
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.config import DatasetConfig, Project, canonical_digest, redact_config
from combined.connectors import connector_class
from combined.errors import ProtocolViolation


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


def freeze_admission(project: Project, source: str) -> Admission:
    """``source``'s configuration as it stands (secrets redacted), frozen for a Run."""
    src = project.source(source)
    cls = connector_class(src.connector)
    config = redact_config(src.config)
    if isinstance(config.get("path"), str) and "://" not in config["path"]:
        # Frozen absolute: a retry reads the same file whatever the cwd.
        config["path"] = os.path.abspath(project.root / config["path"])
    datasets = {name: _frozen(d) for name, d in src.datasets.items()}
    body = {"source": source, "config": config, "datasets": datasets}
    return Admission.freeze(
        connector=src.connector,
        revision=str(cls.revision),
        # ``config`` is redacted already; dataset names are not setting names.
        config_digest=canonical_digest(body),
        config=body,
        billing_policy=src.billing_policy,
        venue=src.venue,
    )


def _frozen(d: DatasetConfig) -> dict[str, Any]:
    """A dataset's declaration as an admission freezes it."""
    out: dict[str, Any] = {
        "relation": d.relation,
        "key": list(d.key or []),
        "strategy": d.strategy,
        "sync_mode": d.sync_mode,
        "cursor": None
        if d.cursor is None
        else {
            "column": d.cursor.column,
            "lookback": d.cursor.lookback.total_seconds()
            if hasattr(d.cursor.lookback, "total_seconds")
            else d.cursor.lookback,
            "lookback_is_duration": hasattr(d.cursor.lookback, "total_seconds"),
            "trust": d.cursor.trust,
            "nulls": d.cursor.nulls,
        },
        "columns": list(d.columns) if d.columns else None,
        "batch_rows": d.batch_rows,
        "control_sum": d.control_sum,
        # (only when set: the digest of an admission without it is unchanged)
        **({"history": True} if d.history else {}),
        "delivery": {"max_rows": d.delivery.max_rows, "max_bytes": d.delivery.max_bytes},
        "drift": d.drift.model_dump(),
        "quarantine": {
            "reader": d.quarantine.reader,
            "review_every_s": int(d.quarantine.review_every.total_seconds()),
        },
    }
    if d.deletes is not None:  # (absent otherwise: earlier admissions digest alike)
        out["deletes"] = spec_of(d.deletes)
    return out


def admit_retry_of(catalog: Catalog, run_id: str, *, enqueue: bool) -> Run:
    """A retry of the failed Run ``run_id``, unless it cannot or need not be retried.

    Refused (ProtocolViolation) for a Run still going or that succeeded, and
    for a failure a retry already did (or is doing) again.
    """
    with catalog.begin() as conn:
        old = runs_repo.get_run(conn, run_id)
        if not old.terminal:
            raise ProtocolViolation(
                f"run {old.id} is still {old.state}",
                hint="retry a run once it has failed; `combined repair` closes dead runs",
            )
        if old.state == "succeeded":
            raise ProtocolViolation(
                f"run {old.id} succeeded; there is nothing to retry",
                hint=f"run `{runs_repo.recapture(old)}` to read its datasets again",
            )
        first = old
        while first.retry_of is not None:
            first = runs_repo.get_run(conn, first.retry_of)
        # Two retries of one failure at once (a request sent again) must not
        # both find it not retried yet: the second waits for the first's
        # admission, in this transaction, and then finds its retry.
        runs_repo.lock_run(conn, first.id)
        for later in runs_repo.retries(conn, first.id):
            # A retry of the same failure already did (or is doing) what
            # this one would: another would read again under the old
            # admission, to no end.
            if later.state == "succeeded" or not later.terminal:
                done = "succeeded" if later.state == "succeeded" else f"is {later.state}"
                raise ProtocolViolation(
                    f"run {old.id} was retried by run {later.id}, which {done}",
                    hint=f"see `combined run show {later.id}`; capture again with "
                    f"`{runs_repo.recapture(old)}`",
                )
        return admit_retry(catalog, conn, old, enqueue=enqueue)


def admit_or_join(
    catalog: Catalog, source: str, dataset: str, trigger: Trigger, admission: Admission
) -> tuple[Run, bool]:
    """Queue one capture of exactly ``source.dataset``, or join one waiting; (run, joined)."""
    with catalog.begin() as conn:
        queue.lock_dataset(conn, source, dataset)
        waiting = queue.waiting(conn, source, dataset)
        if waiting is not None:
            cat.emit(
                conn,
                "run.joined",
                source=source,
                dataset=dataset,
                run_id=waiting.id,
                trigger=trigger,
            )
            return waiting, True
        run = admit(
            catalog,
            source=source,
            datasets=[dataset],
            trigger=trigger,
            admission=admission,
            enqueue=True,
            conn=conn,
        )
    return run, False
