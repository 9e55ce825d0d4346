"""Recover: lake commits the catalog lacks projected, Runs whose process died closed.

A Run that died between its lake commit and its projection left the
catalog behind the lake: its commits are projected from their metadata
(:func:`catch_up`), under the dataset's lease, before anything else builds
on the dataset. A Run whose leases expired is closed; its staging goes once
nothing in it is needed (``Recovery._sweep_staging``).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, Run, queue
from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.errors import CombinedError, NotFoundError, ProtocolViolation, redact
from combined.lake import LakeLayout
from combined.lake._probe import read_failure
from combined.protocol import utcnow
from combined.runtime._lease import REPAIR
from combined.runtime._project import project_commit
from combined.runtime._requeue import Requeued, requeue


class Recovery:
    """Recovers the datasets and Runs of one catalog and lake (``combined repair``)."""

    def __init__(
        self, catalog: Catalog, layout: LakeLayout, lease_ttl_s: float, retries: int = 3
    ) -> None:
        self.catalog = catalog
        self.layout = layout
        self.lease_ttl_s = lease_ttl_s
        #: How many times a worker may die executing a Run and its automatic retries
        #: before it is not retried again (``runtime._requeue``): the Attempts budget.
        self.retries = retries
        self._declared: set[tuple[str, str]] = set()

    def recover(self, datasets: Sequence[tuple[str, str]]) -> list[str]:
        """Project lake commits the catalog lacks; close Runs whose process died.

        A dataset whose lake commits cannot be projected (its error is in the
        notes and the activity feed) keeps the staging of any dead Run of it;
        the other datasets and Runs are recovered all the same.
        """
        notes: list[str] = []
        self._declared = set(datasets)  # (a dead Run's retry captures only these)
        for source, name in datasets:
            self._try_catch_up(source, name, notes)
        with self.catalog.begin() as conn:
            stuck = runs_repo.list_runs(
                conn, limit=1000, states=["queued", "extracting", "committing"]
            )
        ttl = timedelta(seconds=self.lease_ttl_s)
        for run in stuck:
            self._close_dead(run, ttl, notes)
        self._sweep_staging(notes)
        return notes

    def _close_dead(self, run: Run, ttl: timedelta, notes: list[str]) -> None:
        """Close a Run whose process died, once its lake commits reach the catalog."""
        if run.state == "queued" and queue.taker_live(run, ttl):
            # Waiting in the queue for a worker (for minutes, if need be),
            # or taken and its leases not taken yet: the process that took
            # it may be about to take them. It holds nothing (no lease, no
            # staging, no commit), so it is closed only once its taker is
            # dead (on this host) or took it longer ago than a lease's
            # time to live (elsewhere).
            return
        if any(self.catalog.lease_holder(run.source, d) == run.id for d in run.datasets):
            return  # a live process still holds it
        if not self.catalog.break_leases(run.source, run.datasets, run.id):
            return  # renewed meanwhile: alive after all
        # Its lake commits reach the catalog (and its committed Deliveries
        # the raw layer) before its staging goes, even for a dataset no
        # longer in the project file: once its leases are broken, it can
        # commit nothing more.
        if not all([self._try_catch_up(run.source, d, notes) for d in run.datasets]):
            return
        try:
            ended = self._mark_closed(run)
            if ended is None:
                return
        except ProtocolViolation:
            with self.catalog.begin() as conn:
                if runs_repo.get_run(conn, run.id).terminal:
                    return  # another process's recovery closed it first
            raise
        _erase_private(self.layout.staging(run.id))
        notes.append(f"run {run.id} was interrupted: {ended}")

    def _mark_closed(self, run: Run) -> str | None:
        """Move a dead Run to its end (its staged Deliveries rejected); None if it had one.

        A worker's Run is retried in the same transaction (``runtime._requeue``).
        What became of it is returned (``marked failed; run R retries ...``).
        """
        with self.catalog.begin() as conn:
            current = runs_repo.get_run(conn, run.id)
            if current.terminal:
                return None
            staged = cat.deliveries(conn, run_id=run.id, states=["staged"])
            cat.mark_deliveries(conn, [d.id for d in staged], "rejected")
            committed = cat.deliveries(conn, run_id=run.id, states=["committed"])
            _end_attempts(conn, run.id)
            # One asked to stop before it died ends as asked: it never committed.
            if current.cancel_requested_at is not None and current.state == "extracting":
                runs_repo.move_run(conn, run.id, "canceled", error=runs_repo.canceled(current))
                cat.emit(
                    conn, "run.interrupted", source=run.source, run_id=run.id, state="canceled"
                )
                return "marked canceled"
            again = requeue(
                self.catalog,
                conn,
                current,
                declared=self._declared,
                committed={d.dataset for d in committed},
                budget=self.retries,
                ttl=timedelta(seconds=self.lease_ttl_s),
            )
            error = _interrupted(current, len(committed), again)
            runs_repo.move_run(conn, run.id, "failed", error=error)
            # (not `run.recovered`, the end of an alert: targets were sent that as
            # "the run recovered", right after this Run's own alert.run_failed)
            cat.emit(
                conn,
                "run.interrupted",
                source=run.source,
                run_id=run.id,
                state="failed",
                **(again.body() if again else {}),
            )
            if again is not None and again.exhausted:
                cat.emit(
                    conn,
                    "alert.run_retries_exhausted",
                    source=run.source,
                    run_id=run.id,
                    datasets=list(run.datasets),
                    deaths=again.deaths,
                    deferred=again.deferred,
                    error=error,
                )
        return "marked failed" + (f"; {again.told()}" if again and again.told() else "")

    def _sweep_staging(self, notes: list[str]) -> None:
        """Erase the staging that ended Runs left behind, once nothing in it is needed.

        A Run that failed in or after its commit (a lake commit it could not
        project, a reconciliation that blocked) keeps its staging: its staged
        Deliveries are what projecting its lake commits promotes into the raw
        layer. Once every dataset of the Run is caught up (its lake commits
        projected), the staging holds nothing the lake, the raw layer or MAR
        need, and goes, recorded as ``run.staging_erased``. A directory of a
        Run this catalog does not know, or of a Run still going, stays.
        """
        root = self.layout.staging_area()
        if not root.is_dir():
            return
        for path in sorted(p for p in root.iterdir() if p.is_dir()):
            with self.catalog.begin() as conn:
                try:
                    run = runs_repo.get_run(conn, path.name)
                except NotFoundError:
                    continue
            if not run.terminal or any(
                self.catalog.lease_holder(run.source, d) == run.id for d in run.datasets
            ):
                continue
            if not all([self._try_catch_up(run.source, d, notes) for d in run.datasets]):
                continue  # kept: projecting its commits may still need it
            _erase_private(path)
            with self.catalog.begin() as conn:
                cat.emit(conn, "run.staging_erased", source=run.source, run_id=run.id)
            notes.append(f"run {run.id} ({run.state}): its staging was erased")

    def _try_catch_up(self, source: str, name: str, notes: list[str]) -> bool:
        """:func:`catch_up` under the dataset's lease, its failure told (note, alert).

        False when it failed, or when a live Run holds the dataset: that Run
        projects the lake's commits itself (any it finds when it takes the
        lease, then its own), and two projections of one commit at once would
        bill its changes twice.
        """
        try:
            if not self._behind(source, name):
                return True
        except Exception as exc:  # noqa: BLE001 - one dataset never blocks the others
            return self._not_projected(source, name, notes, exc)
        repairer = f"{REPAIR}{uuid.uuid4().hex[:12]}"
        ttl = timedelta(seconds=self.lease_ttl_s)
        if not self.catalog.acquire_lease(source, name, repairer, ttl):
            holder = self.catalog.lease_holder(source, name)
            notes.append(f"{source}.{name}: left to run {holder}, which holds it")
            return False
        try:
            notes.extend(catch_up(self.catalog, self.layout, source, name))
        except Exception as exc:  # noqa: BLE001 - one dataset never blocks the others
            return self._not_projected(source, name, notes, exc)
        finally:
            self.catalog.release_lease(source, name, repairer)
        return True

    def _behind(self, source: str, name: str) -> bool:
        """Whether the lake holds commits of the dataset that the catalog lacks."""
        with self.catalog.begin() as conn:
            try:
                row = cat.get_dataset(conn, source, name)
            except NotFoundError:
                return False
        table = self.layout.dataset_table(source, name)
        return table.committed_sequence() > int(row.last_sequence or 0)

    def _not_projected(self, source: str, name: str, notes: list[str], exc: Exception) -> bool:
        """Tell (note, alert) that a dataset's lake commits could not be projected; False."""
        error = exc.describe() if isinstance(exc, CombinedError) else redact(repr(exc))
        notes.append(f"{source}.{name}: {NOT_PROJECTED}: {error}")
        with self.catalog.begin() as conn:
            cat.emit(conn, "alert.recovery_failed", source=source, dataset=name, error=error)
        return False


#: What a repair's note of a dataset it could not bring up to the lake says (exit 1).
NOT_PROJECTED = "its lake commits could not be projected"


def _interrupted(run: Run, committed: int, again: Requeued | None) -> str:
    """What became of a Run whose process died: where it stopped, what it committed, what next."""
    landed = (
        f"its {committed} committed deliveries were projected from the lake and the next "
        "capture publishes them"
        if committed
        else "nothing of it was committed, billed or acknowledged"
    )
    told = again.told() if again is not None else ""
    return (
        f"the run was interrupted while {run.state}: its process ended without finishing it "
        f"({_who(run)}killed, or its machine stopped); {landed}; "
        + (told or f"`{runs_repo.recapture(run)}` (or the next scheduled tick) captures it again")
    )


def _who(run: Run) -> str:
    """``pid P on HOST: `` of the process that took ``run``; empty when its name does not tell."""
    host, _, rest = (run.claimed_by or "").partition(":")
    pid = rest.split(":")[0]
    if not host or not pid.isdigit():
        return ""
    return f"pid {pid} on {host}: "


def _end_attempts(conn: Connection, run_id: str) -> None:
    """End the Attempts a dead Run left open: they stop with it, not stay running."""
    conn.execute(
        t.attempts.update()
        .where(t.attempts.c.run_id == run_id, t.attempts.c.ended_at.is_(None))
        .values(
            ended_at=utcnow(),
            outcome="interrupted",
            error="its process ended before the attempt did",
        )
    )


def catch_up(
    catalog: Catalog, layout: LakeLayout, source: str, name: str, notes: list[str] | None = None
) -> list[str]:
    """Project the dataset's lake commits the catalog lacks, oldest first; notes of each
    (put in ``notes`` as each is projected, when given: those before a failure too).

    The caller holds the dataset's lease (a Run taking it, or a repair).
    """
    table = layout.dataset_table(source, name).pinned()
    with catalog.begin() as conn:
        try:
            row = cat.get_dataset(conn, source, name)
        except NotFoundError:
            return []
    known = int(row.last_sequence or 0)
    try:
        if table.committed_sequence() <= known:
            return []
        missing = [m for m in table.commits() if int(m.get("last_sequence") or 0) > known]
    except OSError as exc:  # the lake's store unreachable, or refusing (an internal error)
        what = f"{source}.{name}: the lake at {layout.store.root} could not be read"
        raise read_failure(what, exc) from None
    notes = [] if notes is None else notes
    for meta in sorted(missing, key=lambda m: int(m["last_sequence"])):
        project_commit(catalog, layout, source, name, meta)
        notes.append(
            f"{source}.{name}: projected lake version {meta['lake_version']} "
            f"(run {meta['run_id']}) into the catalog"
        )
    return notes


def _erase_private(path: Path) -> None:
    # Only private staging (captures, spill, uncommitted deliveries) lives here;
    # committed deliveries were promoted to the raw layer by the projection.
    shutil.rmtree(path, ignore_errors=True)
