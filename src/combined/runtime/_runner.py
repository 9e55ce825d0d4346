"""The Run lifecycle: admission, leases, Attempts, commit, projection, publication."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from combined.catalog import Admission, Catalog, Member, Run, queue
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.connectors import check_config, connector_class
from combined.connectors.abc import Source
from combined.delivery import Limits, StagingArea
from combined.errors import (
    CombinedError,
    DriftQuarantined,
    DriftRejected,
    NotFoundError,
    ProtocolViolation,
    ReconciliationFailed,
    RetryLater,
    RunCanceled,
    redact,
)
from combined.lake import LakeLayout
from combined.quality import Reconciliation, lake_rows, range_totals, reconcile, same_sum
from combined.quality._nulls import filled_check, null_check, record_unfilled
from combined.quality._variance import expected_variance, record_reconciliation
from combined.runtime._admit import admit as admit
from combined.runtime._backfill import BackfillSpec, stage_partitioned
from combined.runtime._cancel import CancelWatch
from combined.runtime._compaction import compact_if_due
from combined.runtime._deadline import DEFAULT_ATTEMPT_TIMEOUT_S, AttemptDeadline
from combined.runtime._drift import declared_fields
from combined.runtime._faults import fault
from combined.runtime._finish import after_failed_commit, end_reads, publish_run
from combined.runtime._leases import LeaseKeeper
from combined.runtime._pipeline import (
    DatasetPlan,
    Prepared,
    Staged,
    commit,
    project_commit,
    stage,
    table_of,
)
from combined.runtime._prepare import prepare, quarantine_capture, verified
from combined.runtime._publish import publish_now
from combined.runtime._reporter import NullReporter, Reporter
from combined.runtime._retry import backoff, defer_retry


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


#: The lease holder prefix of a recovery projecting a dataset's lake commits.
REPAIR = "repair:"


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


class Runner:
    """Executes Runs under their admission; recovers interrupted ones."""

    def __init__(
        self,
        catalog: Catalog,
        layout: LakeLayout,
        settings: Settings,
        resolve: Any,
        reporter: Reporter | None = None,
        read_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.catalog = catalog
        self.layout = layout
        self.settings = settings
        self.resolve = resolve  # (admission config) -> connector config with secrets
        self.reporter = reporter or NullReporter()
        #: Options handed to every read (e.g. ``max_changes`` for a follow loop).
        self.read_options = dict(read_options or {})
        #: Publishes a succeeding Run's members (a capture of several sources holds them).
        self.publish: Callable[[Connection, Run, list[Member]], str | None] = publish_now

    # -- execution ------------------------------------------------------------

    def execute(
        self, run: Run, backfill: BackfillSpec | None = None, *, give_back: bool = False
    ) -> Run:
        """Execute a queued Run to a final state (a partitioned backfill when given one).

        With ``give_back`` (a worker's Run), a Run whose dataset another Run
        holds goes back to the queue, still queued, instead of failing: it
        waited for a worker and can wait for the dataset too.
        """
        with self.catalog.begin() as conn:
            admission = runs_repo.get_admission(conn, run.admission_id)
        plans = plans_from_admission(admission)
        selected = [plans[d] for d in run.datasets]
        held: list[DatasetPlan] = []
        keeper = LeaseKeeper(
            self.catalog, run.id, [(p.source, p.name) for p in selected], self.settings.lease_ttl_s
        )
        watch = CancelWatch(self.catalog, run.id)
        try:
            for plan in selected:
                if not self._acquire(plan, run.id, keeper.ttl):
                    holder = self.catalog.lease_holder(plan.source, plan.name)
                    if give_back and run.claimed_by is not None:
                        with self.catalog.begin() as conn:
                            if queue.give_back(conn, run.id, run.claimed_by):
                                return runs_repo.get_run(conn, run.id)
                    raise ProtocolViolation(
                        f"{plan.source}.{plan.name} is being captured by run {holder}",
                        hint="wait for that run to finish, or run `combined repair` if it died",
                    )
                held.append(plan)
                # A Run that held the dataset before may have died between its
                # lake commit and its projection after this process last
                # repaired: building on a catalog behind the lake would
                # parent the next version on a stale one and, its sequence
                # then known, leave that commit's Deliveries and MAR out for
                # good. Under the lease, nothing else moves the dataset.
                for note in self._catch_up(plan.source, plan.name):
                    self.reporter.note(note)
            keeper.start()
            watch.start()
            return self._execute(run, admission, selected, keeper, watch, backfill)
        except CombinedError as exc:
            return self._fail(run.id, exc)
        except Exception as exc:  # a defect still ends the Run, with its evidence
            return self._fail(run.id, exc)
        finally:
            watch.stop()
            keeper.stop()
            for plan in held:
                self.catalog.release_lease(plan.source, plan.name, run.id)

    def _acquire(self, plan: DatasetPlan, run_id: str, ttl: timedelta) -> bool:
        """Take the dataset's lease; waits (up to a minute) while a repair projects it."""
        deadline = time.monotonic() + 60
        while not self.catalog.acquire_lease(plan.source, plan.name, run_id, ttl):
            holder = self.catalog.lease_holder(plan.source, plan.name) or ""
            if not holder.startswith(REPAIR) or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def _fail(self, run_id: str, exc: BaseException) -> Run:
        state = exc.run_state if isinstance(exc, CombinedError) else "failed"
        with self.catalog.begin() as conn:
            run = runs_repo.get_run(conn, run_id)
            if run.terminal:
                return run
            run = runs_repo.move_run(conn, run_id, state, error=exc)
            cat.emit(
                conn,
                f"run.{state}",
                source=run.source,
                run_id=run.id,
                error=run.error,
                error_type=type(exc).__name__,
                **({"by": run.canceled_by, "reason": run.cancel_reason} if run.canceled_by else {}),
            )
            later = (
                defer_retry(self.catalog, conn, run, exc) if isinstance(exc, RetryLater) else None
            )
        if later is not None:
            self.reporter.note(f"retry {later.id} queued, not before {later.not_before:%H:%M:%S}Z")
        self.reporter.run_finished(run.id, run.state)
        return run

    def _execute(
        self,
        run: Run,
        admission: Admission,
        plans: list[DatasetPlan],
        leases: LeaseKeeper,
        watch: CancelWatch,
        backfill: BackfillSpec | None = None,
    ) -> Run:
        with self.catalog.begin() as conn:
            run = runs_repo.move_run(conn, run.id, "extracting")
            cat.emit(conn, "run.extracting", source=run.source, run_id=run.id)
        self.reporter.run_started(run.id, run.source, list(run.datasets))
        for plan in plans:
            self._check_lake_untouched(run, plan)
        area = StagingArea(self.layout.staging(run.id), self.settings.limits)
        producer = f"{admission.connector}@{admission.revision}#{admission.id[:12]}"
        prepared: list[Prepared] = []
        attempt = 0
        while True:
            attempt += 1
            with self.catalog.begin() as conn:
                number = runs_repo.start_attempt(
                    conn,
                    run.id,
                    f"{self.settings.worker}:{os.getpid()}",
                    socket.gethostname(),
                    os.getpid(),
                )
            source: Source | None = None
            opened: list[Staged] = []
            deadline = AttemptDeadline(self.settings.attempt_timeout_s, attempt).start()
            watch.attach(deadline)
            staged_all = False
            try:
                cls = connector_class(admission.connector)
                # Checked again before its secrets are resolved: a Run retried
                # under an admission frozen before a check existed (a secret
                # reference in a program's command line) is refused too.
                check_config(
                    cls,
                    admission.config["config"],
                    where=f"sources.{admission.config['source']}.config",
                )
                source = cls(self.resolve(admission.config))
                prepared = []
                # A discovery that reads records (an API's pages) is not spent before
                # each capture: the read checks values against declared fields itself.
                discovery = (
                    None
                    if getattr(type(source), "DISCOVERY_READS_RECORDS", False)
                    else source.discover()
                )
                for plan in plans:
                    self.reporter.phase(plan.name, "extracting")
                    found = (
                        discovery.dataset(plan.relation) or discovery.dataset(plan.name)
                        if discovery is not None
                        else None
                    )
                    declared = declared_fields(found)
                    try:
                        if backfill is not None:
                            staged = stage_partitioned(
                                plan, source, backfill, area, self.layout, self.reporter, declared
                            )
                        else:
                            staged = stage(
                                plan,
                                source,
                                area,
                                self.layout,
                                self.reporter,
                                declared,
                                self.read_options if plan.strategy == "cdc" else None,
                            )
                    except DriftRejected as exc:
                        raise self._drift_held(run, plan, exc) from None
                    opened.append(staged)
                    prepared.append(
                        prepare(
                            staged,
                            run_id=run.id,
                            admission_id=admission.id,
                            producer=producer,
                            area=area,
                            layout=self.layout,
                            memory_limit=self.settings.memory_limit,
                            catalog=self.catalog,
                            reporter=self.reporter,
                        )
                    )
                watch.check()  # a cancel seen between reads: nothing staged is committed
                with self.catalog.begin() as conn:
                    runs_repo.end_attempt(conn, run.id, number, "staged")
                staged_all = True
                break
            except CombinedError as exc:
                end_reads(self.catalog, run.id, opened, ["abort"] * len(opened))
                ended = "canceled" if isinstance(exc, RunCanceled) else "failed"
                with self.catalog.begin() as conn:
                    runs_repo.end_attempt(conn, run.id, number, ended, exc.describe())
                retry = not isinstance(exc, RetryLater) and watch.error is None
                if exc.transient and retry and attempt < self.settings.max_attempts:
                    self.reporter.note(f"attempt {attempt} failed ({exc.message}); retrying")
                    area.erase_all()
                    area = StagingArea(self.layout.staging(run.id), self.settings.limits)
                    watch.pause(backoff(self.settings.backoff_s, attempt, exc))
                    continue
                area.erase_all()
                watch.check()  # a read stopped by a cancel may fail in its own way
                raise
            except Exception as exc:
                end_reads(self.catalog, run.id, opened, ["abort"] * len(opened))
                with self.catalog.begin() as conn:
                    runs_repo.end_attempt(conn, run.id, number, "failed", redact(repr(exc)))
                area.erase_all()
                watch.check()  # a read stopped by a cancel may fail in its own way
                raise
            finally:
                deadline.cancel()
                # A staged source stays open until its reads' outcomes are known.
                if source is not None and not staged_all:
                    source.close()
        assert source is not None
        try:
            return self._commit_all(run, prepared, area, leases)
        finally:
            source.close()

    def _commit_all(
        self, run: Run, prepared: list[Prepared], area: StagingArea, leases: LeaseKeeper
    ) -> Run:
        """Commit, reconcile and publish a staged Run; each read ends by what the lake holds."""
        fault("after_staging")
        members: list[Member] = []
        try:
            with self.catalog.begin() as conn:  # refused (RunCanceled) once a cancel was asked
                run = runs_repo.move_run(conn, run.id, "committing")
                cat.emit(conn, "run.committing", source=run.source, run_id=run.id)
            for p in verified(prepared):
                members.append(self._commit_one(run, p, area, leases))
        except BaseException as exc:
            refused = isinstance(exc, ProtocolViolation | RunCanceled)
            outcomes = after_failed_commit(len(prepared), len(members), refused)
            end_reads(self.catalog, run.id, [p.staged for p in prepared], outcomes)
            raise
        try:
            checks = self._reconcile(run, prepared, members)
            fault("after_projection")
            for p in prepared:  # no publication from a Run that lost a dataset
                leases.require(p.staged.plan.source, p.staged.plan.name)
            with self.catalog.begin() as conn:
                run = publish_run(conn, run, prepared, members, checks, self.publish)
        except BaseException:
            # Committed, not published (a reconciliation that blocks, a Run
            # recovery closed meanwhile): the reads end, nothing is acknowledged.
            end_reads(
                self.catalog, run.id, [p.staged for p in prepared], ["success"] * len(prepared)
            )
            raise
        for p in prepared:
            if p.staged.state is not None:
                p.staged.extraction.acknowledge(p.staged.state)
        end_reads(self.catalog, run.id, [p.staged for p in prepared], ["success"] * len(prepared))
        area.erase_all()
        for key in {(p.staged.plan.source, p.staged.plan.name) for p in prepared}:
            compact_if_due(
                self.catalog, self.layout, *key, run.id, self.settings.compact_files.get(key)
            )
        self.reporter.run_finished(run.id, run.state)
        return run

    def _reconcile(
        self, run: Run, prepared: list[Prepared], members: list[Member]
    ) -> dict[str, Reconciliation]:
        """Check lake, version and source counts of every dataset before publishing."""
        out: dict[str, Reconciliation] = {}
        for p, m in zip(prepared, members, strict=True):
            plan = p.staged.plan
            with self.catalog.begin() as conn:
                version = cat.get_version(conn, m.dataset_version) if m.dataset_version else None
            whole = p.staged.full and plan.sync_mode != "append"
            result = reconcile(
                f"{plan.source}.{plan.name}",
                self.layout.dataset_table(plan.source, plan.name),
                m.lake_version,
                int(version.row_count) if version is not None else 0,
                p.staged.rows if whole else None,
            )
            if p.staged.control is not None:
                result = expected_variance(self._check_control(run, p, m, result), plan.strategy)
            lake = table_of(self.layout, plan)
            result = null_check(result, lake, m.lake_version, p.staged.not_null)
            result = filled_check(result, lake, m.lake_version, p.staged.filled_nulls)
            out[plan.name] = result
            with self.catalog.begin() as conn:
                record_reconciliation(
                    conn, result, source=plan.source, dataset=plan.name, run_id=run.id
                )
                if p.staged.unfilled:
                    record_unfilled(
                        conn,
                        p.staged.unfilled,
                        source=plan.source,
                        dataset=plan.name,
                        run_id=run.id,
                    )
            blocking = result.lake_status == "mismatch" or (
                result.source_status == "mismatch" and p.staged.full
            )
            if blocking:  # (committed, just not published: the reads succeeded)
                raise ReconciliationFailed(
                    f"{result.dataset} does not reconcile: the lake holds {result.lake_rows} "
                    f"rows, its version claims {result.version_rows}, the source read "
                    f"{result.source_rows}; nothing was published",
                    hint="inspect `combined run show` and the activity feed, then capture again",
                )
        return out

    def _check_lake_untouched(self, run: Run, plan: DatasetPlan) -> None:
        """Refuse a capture over a table whose rows its dataset version does not account for.

        A table that another writer changed (a Spark job appending to it, a
        manual delete) would be reduced against rows no version holds: the
        transition would count their deletes, and every later version would
        claim a row count the lake never holds again, unpublishable for good.
        Caught before the read, nothing is committed and the version chain
        stays right: restoring the table to its last Combined version mends it.
        """
        with self.catalog.begin() as conn:
            row = cat.get_dataset(conn, plan.source, plan.name)
            version = cat.get_version(conn, row.current_version) if row.current_version else None
        if version is None:
            return  # a first capture: no version to account for the rows
        table = table_of(self.layout, plan)
        newest = table.version()
        if newest is None:
            return
        held = lake_rows(table, newest)
        if held == int(version.row_count):
            return
        name = f"{plan.source}.{plan.name}"
        ours = row.lake_version
        foreign = table.foreign_versions(ours)
        with self.catalog.begin() as conn:
            cat.emit(
                conn,
                "alert.reconciliation_failed",
                source=plan.source,
                dataset=plan.name,
                run_id=run.id,
                lake_rows=held,
                version_rows=int(version.row_count),
                source_rows=None,
                lake_status="mismatch",
                source_status="not_reconciled",
                lake_version=newest,
                foreign_lake_versions=foreign,
            )
        what = (
            f"{name} does not reconcile: the lake holds {held} rows at lake version {newest}, "
            f"but its dataset version {version.id[:12]} (lake version {ours}) claims "
            f"{version.row_count}"
        )
        if foreign and ours is not None:
            listed = ", ".join(str(v) for v in foreign)
            raise ReconciliationFailed(
                f"{what}: lake version{'s' if len(foreign) > 1 else ''} {listed} "
                f"{'were' if len(foreign) > 1 else 'was'} written outside Combined; nothing "
                "was read or committed",
                hint=f"restore the table to lake version {ours} (with the deltalake package: "
                f"DeltaTable('{table.path}').restore({ours})), then capture again",
            )
        raise ReconciliationFailed(
            f"{what}; nothing was read or committed",
            hint=f"see `combined history {name}` and the activity feed; restore the table "
            "to the last lake version whose rows its dataset version accounts for, then "
            "capture again",
        )

    def _check_control(
        self, run: Run, p: Prepared, m: Member, result: Reconciliation
    ) -> Reconciliation:
        """Compare a backfill's control totals (read in its snapshot) with what landed."""
        plan, control = p.staged.plan, p.staged.control
        assert control is not None
        table = table_of(self.layout, plan)
        files = table.files(m.lake_version) if m.lake_version is not None else []
        rows, total, tolerance = range_totals(
            files, p.staged.landed_filter, control.get("sum_column"), table.store
        )
        ok = rows == control["rows"] and same_sum(total, control.get("sum"), tolerance)
        with self.catalog.begin() as conn:
            cat.emit(
                conn,
                "reconciliation.control",
                source=plan.source,
                dataset=plan.name,
                run_id=run.id,
                control=dict(control),
                landed={"rows": rows, "sum": total, "tolerance": tolerance},
                ok=ok,
            )
        if not ok and (p.staged.full or p.staged.bounded):
            raise ReconciliationFailed(
                f"{plan.source}.{plan.name}: the source's control totals ({control['rows']} "
                f"rows, sum {control.get('sum')}) differ from what landed ({rows} rows, "
                f"sum {total}); nothing was published",
                hint=f"a whole `combined capture {result.dataset}` carries rows gone from range",
            )
        # A delta capture (cursor) cannot see deletes or updates that leave its
        # cursor alone: a mismatch is that limit showing, reported and published.
        return dataclasses.replace(
            result,
            source_rows=control["rows"],
            source_status="reconciled" if ok else "mismatch",
        )

    def _commit_one(self, run: Run, p: Prepared, area: StagingArea, leases: LeaseKeeper) -> Member:
        plan = p.staged.plan
        self.reporter.phase(plan.name, "committing")
        leases.require(plan.source, plan.name)
        lake_version, committed_at = commit(p, self.layout)
        if p.deliveries:
            fault("after_commit")
            meta = dict(p.metadata)
            meta["lake_version"] = lake_version
            project_commit(
                self.catalog, self.layout, plan.source, plan.name, meta, staging_root=area.root
            )
        with self.catalog.begin() as conn:
            row = cat.get_dataset(conn, plan.source, plan.name)
        return Member(
            source=plan.source,
            dataset=plan.name,
            dataset_version=row.current_version,
            lake_version=lake_version,
            source_position=p.staged.position,
            extraction_receipt=p.staged.receipt.to_json(),
            committed_at=committed_at,
            changed=False,  # decided against the last publication, when publishing
        )

    def _drift_held(self, run: Run, plan: DatasetPlan, exc: DriftRejected) -> DriftRejected:
        """Record a capture's drift held back by its policy; quarantine holds the capture.

        Every drift event is written to the Activity feed with its outcome,
        whatever it is. A ``quarantine`` outcome (and no ``fail``) keeps the
        whole capture in quarantine for review before the staging goes; the
        error returned (to raise) names the quarantine entry.
        """
        with self.catalog.begin() as conn:
            for event in exc.drift:
                cat.emit(
                    conn, "drift", source=plan.source, dataset=plan.name, run_id=run.id, **event
                )
        if not isinstance(exc, DriftQuarantined) or not exc.parts:
            return exc
        held = [e for e in exc.drift if e["outcome"] == "quarantine"]
        reason = "schema drift: " + ", ".join(f"{e['class']} {e['field']!r}" for e in held)
        with self.catalog.begin() as conn:
            waiting = [
                q.id
                for q in cat.quarantined(conn, plan.source)
                if q.dataset == plan.name and q.decision is None and q.reason == reason
            ]
        if waiting:
            # The same drift already awaits review: the source still holds
            # these rows (nothing was committed, no checkpoint moved), so a
            # second copy would only grow the quarantine area at every capture.
            message = (
                f"{exc.what}; nothing was committed, and the same drift awaits review in "
                f"quarantine entry {waiting[0]}, so this capture was not held again"
            )
        else:
            qid = quarantine_capture(
                exc.parts,
                plan,
                run_id=run.id,
                reason=reason,
                layout=self.layout,
                catalog=self.catalog,
            )
            message = f"{exc.message} (entry {qid})"
        named = DriftQuarantined(message, hint=exc.hint)
        named.drift, named.parts, named.what = exc.drift, exc.parts, exc.what
        return named

    # -- recovery ---------------------------------------------------------------

    def recover(self, datasets: Sequence[tuple[str, str]]) -> list[str]:
        """Project lake commits the catalog lacks; close Runs whose process died.

        A dataset whose lake commits cannot be projected (its error is in the
        notes and the activity feed) keeps the staging of any dead Run of it;
        the other datasets and Runs are recovered all the same.
        """
        notes: list[str] = []
        for source, name in datasets:
            self._try_catch_up(source, name, notes)
        with self.catalog.begin() as conn:
            stuck = runs_repo.list_runs(
                conn, limit=1000, states=["queued", "extracting", "committing"]
            )
        ttl = timedelta(seconds=self.settings.lease_ttl_s)
        for run in stuck:
            if run.state == "queued" and queue.taker_live(run, ttl):
                # Waiting in the queue for a worker (for minutes, if need be),
                # or taken and its leases not taken yet: the process that took
                # it may be about to take them. It holds nothing (no lease, no
                # staging, no commit), so it is closed only once its taker is
                # dead (on this host) or took it longer ago than a lease's
                # time to live (elsewhere).
                continue
            if any(self.catalog.lease_holder(run.source, d) == run.id for d in run.datasets):
                continue  # a live process still holds it
            if not self.catalog.break_leases(run.source, run.datasets, run.id):
                continue  # renewed meanwhile: alive after all
            # Its lake commits reach the catalog (and its committed Deliveries
            # the raw layer) before its staging goes, even for a dataset no
            # longer in the project file: once its leases are broken, it can
            # commit nothing more.
            if not all([self._try_catch_up(run.source, d, notes) for d in run.datasets]):
                continue
            with self.catalog.begin() as conn:
                current = runs_repo.get_run(conn, run.id)
                if current.terminal:
                    continue
                staged = cat.deliveries(conn, run_id=run.id, states=["staged"])
                cat.mark_deliveries(conn, [d.id for d in staged], "rejected")
                # One asked to stop before it died ends as asked: it never committed.
                asked = current.cancel_requested_at is not None and current.state == "extracting"
                runs_repo.move_run(
                    conn,
                    run.id,
                    "canceled" if asked else "failed",
                    error=runs_repo.canceled(current)
                    if asked
                    else "the run was interrupted; its committed deliveries were projected "
                    "from the lake and the next capture publishes them",
                )
                cat.emit(conn, "run.recovered", source=run.source, run_id=run.id)
            _erase_private(self.layout.staging(run.id))
            notes.append(f"run {run.id} was interrupted: marked failed")
        self._sweep_staging(notes)
        return notes

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
        """:meth:`_catch_up` under the dataset's lease, its failure told (note, alert).

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
        ttl = timedelta(seconds=self.settings.lease_ttl_s)
        if not self.catalog.acquire_lease(source, name, repairer, ttl):
            holder = self.catalog.lease_holder(source, name)
            notes.append(f"{source}.{name}: left to run {holder}, which holds it")
            return False
        try:
            notes.extend(self._catch_up(source, name))
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
        notes.append(f"{source}.{name}: its lake commits could not be projected: {error}")
        with self.catalog.begin() as conn:
            cat.emit(conn, "alert.recovery_failed", source=source, dataset=name, error=error)
        return False

    def _catch_up(self, source: str, name: str) -> list[str]:
        table = self.layout.dataset_table(source, name)
        with self.catalog.begin() as conn:
            try:
                row = cat.get_dataset(conn, source, name)
            except NotFoundError:
                return []
        known = int(row.last_sequence or 0)
        if table.committed_sequence() <= known:
            return []
        missing = [m for m in table.commits() if int(m.get("last_sequence") or 0) > known]
        notes = []
        for meta in sorted(missing, key=lambda m: int(m["last_sequence"])):
            project_commit(self.catalog, self.layout, source, name, meta)
            notes.append(
                f"{source}.{name}: projected lake version {meta['lake_version']} "
                f"(run {meta['run_id']}) into the catalog"
            )
        return notes


def _erase_private(path: Path) -> None:
    # Only private staging (captures, spill, uncommitted deliveries) lives here;
    # committed deliveries were promoted to the raw layer by the projection.
    import shutil

    shutil.rmtree(path, ignore_errors=True)
