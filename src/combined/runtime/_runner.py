"""The Run lifecycle, step by step: each step is a module, this one calls them in order.

admit (``_admit``) -> lease (``_lease``) -> in Attempts: extract and stage
(``_extract``, ``_stage``; ``_backfill`` for partitions), reduce
(``_reduce``), deliver (``_deliver``) -> commit (``_commit``) -> project
(``_project``) -> reconcile (``_reconcile``) -> publish (``_publish``);
``_recover`` closes what a dead process left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from combined._interrupts import raise_if_interrupted
from combined.catalog import Admission, Catalog, Member, Run, queue
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.connectors import check_config, connector_class
from combined.connectors.abc import (
    ConfigSink,
    DatasetDiscovery,
    Discovery,
    Source,
    StreamOwner,
)
from combined.delivery import StagingArea
from combined.errors import (
    CombinedError,
    ConfigError,
    DriftRejected,
    DuplicateKeys,
    LakeError,
    NotFoundError,
    ProtocolViolation,
    RetryLater,
    RunCanceled,
    SchemaMismatch,
    StreamGap,
    UnsupportedType,
    redact,
)
from combined.lake import LakeLayout, shared_loads
from combined.runtime._backfill import BackfillSpec, stage_partitioned
from combined.runtime._cancel import CancelWatch
from combined.runtime._commit import commit, keep_position, verified
from combined.runtime._compaction import compact_if_due, compact_ledger_at
from combined.runtime._deadline import AttemptDeadline
from combined.runtime._disk import disk_error
from combined.runtime._drift import declared_fields
from combined.runtime._extract import extract
from combined.runtime._faults import fault
from combined.runtime._gap import hold_ended, record_gap
from combined.runtime._lease import LeaseKeeper, acquire
from combined.runtime._lost import lost_tables
from combined.runtime._plan import DatasetPlan, Prepared, Settings, Staged, plans_from_admission
from combined.runtime._project import project_commit
from combined.runtime._publish import after_failed_commit, end_reads, publish_now, publish_run
from combined.runtime._quarantine import drift_held
from combined.runtime._reconcile import check_lake_untouched, reconcile_run
from combined.runtime._recover import Recovery, catch_up
from combined.runtime._reduce import every_held, prepare
from combined.runtime._reporter import NullReporter, Reporter
from combined.runtime._retry import backoff, defer_retry

__all__ = ["Runner", "name_owner"]

log = logging.getLogger(__name__)


@dataclass
class _Attempt:
    """One Attempt of a Run: what it reads, where it stages, which try it is."""

    run: Run
    admission: Admission
    plans: list[DatasetPlan]
    watch: CancelWatch
    backfill: BackfillSpec | None
    area: StagingArea
    number: int


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
        #: The sink keeping a source's configuration updates, by (admission config, Run id).
        self.config_updates: Callable[[Mapping[str, Any], str | None], ConfigSink] | None = None
        #: Publishes a succeeding Run's members (a capture of several sources holds them).
        self.publish: Callable[[Connection, Run, list[Member]], str | None] = publish_now

    # -- admitted -> leased -------------------------------------------------------

    def execute(
        self, run: Run, backfill: BackfillSpec | None = None, *, give_back: bool = False
    ) -> Run:
        """Execute a queued Run to a final state (a partitioned backfill when given one).

        With ``give_back`` (a worker's Run), a Run whose dataset another Run
        holds goes back to the queue, still queued, instead of failing: it
        waited for a worker and can wait for the dataset too.
        """
        # Under its leases, the Run's steps read each table's one load until
        # the Run writes it (each load is a listing and reads of an object store).
        with shared_loads():
            return self._execute_held(run, backfill, give_back)

    def _execute_held(self, run: Run, backfill: BackfillSpec | None, give_back: bool) -> Run:
        held: list[DatasetPlan] = []
        keeper = LeaseKeeper(
            self.catalog, run.id, [(run.source, d) for d in run.datasets], self.settings.lease_ttl_s
        )
        watch = CancelWatch(self.catalog, run.id)
        try:  # from here, whatever fails ends the Run (_fail)
            with self.catalog.begin() as conn:
                admission = runs_repo.get_admission(conn, run.admission_id)
            plans = plans_from_admission(admission)
            selected = [plans[d] for d in run.datasets]
            for plan in selected:
                if not acquire(self.catalog, plan.source, plan.name, run.id, keeper.ttl):
                    return self._held_elsewhere(run, plan, give_back)
                held.append(plan)
                # A Run that held the dataset before may have died between its
                # lake commit and its projection after this process last
                # repaired: building on a catalog behind the lake would
                # parent the next version on a stale one and, its sequence
                # then known, leave that commit's Deliveries and MAR out for
                # good. Under the lease, nothing else moves the dataset.
                for note in catch_up(self.catalog, self.layout, plan.source, plan.name):
                    self.reporter.note(note)
            keeper.start()
            watch.start()
            return self._execute(run, admission, selected, keeper, watch, backfill)
        except CombinedError as exc:
            raise_if_interrupted(exc)
            return self.fail(run.id, exc)
        except Exception as exc:  # a defect still ends the Run, with its evidence
            raise_if_interrupted(exc)  # (a Ctrl-C DuckDB reported as its own error)
            # Its trace (redacted by the log's handler) at DEBUG: what a report of it needs.
            log.debug("run %s ended by an unexpected error", run.id, exc_info=exc)
            return self.fail(run.id, disk_error(exc, self.layout) or exc)
        finally:
            watch.stop()
            keeper.stop()
            if held:
                self.catalog.release_leases([(p.source, p.name) for p in held], run.id)

    def _held_elsewhere(self, run: Run, plan: DatasetPlan, give_back: bool) -> Run:
        """A worker's Run given back to the queue; else the error that another Run holds it."""
        holder = self.catalog.lease_holder(plan.source, plan.name)
        if give_back and run.claimed_by is not None:
            with self.catalog.begin() as conn:
                if queue.give_back(conn, run.id, run.claimed_by):
                    return runs_repo.get_run(conn, run.id)
        from combined.maintain import HOLDER as MAINTENANCE

        if holder is not None and holder.startswith(MAINTENANCE):
            raise ProtocolViolation(
                f"{plan.source}.{plan.name} is being maintained (`combined maintain`, "
                f"{holder}): its table is compacted or vacuumed under the dataset's lease",
                hint="capture again once the maintenance ends (a queued capture, taken by a "
                "worker, waits in the queue for it instead)",
            )
        raise ProtocolViolation(
            f"{plan.source}.{plan.name} is being captured by run {holder}",
            hint="wait for that run to finish, or run `combined repair` if it died",
        )

    def fail(self, run_id: str, exc: BaseException) -> Run:
        """End the Run in the state ``exc``'s class leads to, with its error.

        The lake's ledger records the end first; a store that refuses it (the
        lake the Run failed on, gone or refusing) does not leave a Run that
        committed nothing unfinished: the catalog alone records its end.
        """
        try:
            run, later = self._end(run_id, exc)
        except LakeError as unkept:  # (the ledger's write: the transaction's one lake write)
            run, later = self._end(run_id, exc, unkept)
        if later is not None:
            self.reporter.note(f"retry {later.id} queued, not before {later.not_before:%H:%M:%S}Z")
        self.reporter.run_finished(run.id, run.state)
        return run

    def _end(
        self, run_id: str, exc: BaseException, unkept: LakeError | None = None
    ) -> tuple[Run, Run | None]:
        """Move the Run to its end (unless it has one); the retry it defers, if any.

        ``unkept``: the ledger's store refused the end, which the catalog then
        records alone, of a Run that committed nothing; a Run that may have
        committed stays unfinished (its lake commits reach the catalog first,
        at the repair that ends it).
        """
        state = exc.run_state if isinstance(exc, CombinedError) else "failed"
        with self.catalog.begin(ledger=unkept is None) as conn:
            run = runs_repo.get_run(conn, run_id)
            if run.terminal:
                return run, None
            if unkept is not None and run.state not in ("queued", "extracting"):
                raise unkept
            run = runs_repo.move_run(conn, run_id, state, error=exc)
            cat.emit(
                conn,
                f"run.{state}",
                source=run.source,
                run_id=run.id,
                error=run.error,
                error_type=type(exc).__name__,
                **({"by": run.canceled_by, "reason": run.cancel_reason} if run.canceled_by else {}),
                **({"unledgered": unkept.message} if unkept else {}),
            )
            if unkept is not None:  # (written to the ledger at the next Run's end)
                cat.emit(conn, "run.unledgered", source=run.source, run_id=run.id)
            later = (
                defer_retry(self.catalog, conn, run, exc) if isinstance(exc, RetryLater) else None
            )
        if unkept is not None:
            self.reporter.note(
                f"run {run.id} ended {state}, in the catalog alone: {unkept.message}"
            )
        return run, later

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
        lost = lost_tables(self.catalog, self.layout, plans)  # (never written afresh)
        if lost is not None:
            name_held_back(run, lost)
            raise lost
        for plan in plans:
            check_lake_untouched(self.catalog, self.layout, run, plan)
        area = StagingArea(self.layout.staging(run.id), self.settings.limits)
        number = 0
        while True:
            number += 1
            a = _Attempt(run, admission, plans, watch, backfill, area, number)
            done = self._attempt(a)
            if done is not None:
                break
            area = StagingArea(self.layout.staging(run.id), self.settings.limits)
        source, prepared = done
        try:
            return self._commit_all(run, prepared, area, leases)
        finally:
            source.close()

    # -- in Attempts: extract and stage, reduce, deliver -----------------------------

    def _attempt(self, a: _Attempt) -> tuple[Source, list[Prepared]] | None:
        """One Attempt: every dataset extracted, reduced and delivered; None to try again."""
        with self.catalog.begin() as conn:
            number = runs_repo.start_attempt(
                conn,
                a.run.id,
                f"{self.settings.worker}:{os.getpid()}",
                socket.gethostname(),
                os.getpid(),
            )
        source: Source | None = None
        opened: list[Staged] = []
        deadline = AttemptDeadline(self.settings.attempt_timeout_s, a.number).start()
        a.watch.attach(deadline)
        staged_all = False
        try:
            source = self._open(a.admission, a.run.id)
            prepared = self._prepare_all(a, source, opened)
            a.watch.check()  # a cancel seen between reads: nothing staged is committed
            with self.catalog.begin() as conn:
                runs_repo.end_attempt(conn, a.run.id, number, "staged")
            staged_all = True
            return source, prepared
        except CombinedError as exc:
            raise_if_interrupted(exc)
            ended = "canceled" if isinstance(exc, RunCanceled) else "failed"
            self._attempt_failed(a.run.id, number, opened, ended, exc.describe())
            if self._retrying(a, exc):
                return None
            a.area.erase_all()
            a.watch.check()  # a read stopped by a cancel may fail in its own way
            name_held_back(a.run, exc)
            raise
        except Exception as exc:
            raise_if_interrupted(exc)  # (the Run stays unfinished, as after any Ctrl-C)
            self._attempt_failed(a.run.id, number, opened, "failed", redact(repr(exc)))
            a.area.erase_all()
            a.watch.check()  # a read stopped by a cancel may fail in its own way
            raise
        finally:
            deadline.cancel()
            # A staged source stays open until its reads' outcomes are known.
            if source is not None and not staged_all:
                source.close()

    def _attempt_failed(
        self, run_id: str, number: int, opened: list[Staged], ended: str, error: str
    ) -> None:
        """End the Attempt's reads (``abort``) and record how the Attempt ended."""
        end_reads(self.catalog, run_id, opened, ["abort"] * len(opened))
        with self.catalog.begin() as conn:
            runs_repo.end_attempt(conn, run_id, number, ended, error)

    def _retrying(self, a: _Attempt, exc: CombinedError) -> bool:
        """Whether another Attempt follows a failed one; its staging erased, its backoff waited."""
        retry = not isinstance(exc, RetryLater) and a.watch.error is None
        if not (exc.transient and retry and a.number < self.settings.max_attempts):
            return False
        self.reporter.note(f"attempt {a.number} failed ({exc.message}); retrying")
        a.area.erase_all()
        a.watch.pause(backoff(self.settings.backoff_s, a.number, exc))
        return True

    def _open(self, admission: Admission, run_id: str) -> Source:
        """The admission's source, its configuration checked before its secrets are resolved.

        A source that keeps its connector's configuration updates is given the sink.
        """
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
        name_owner(source, self.layout)
        keep = getattr(source, "keep_config_updates", None)  # optional in the Source protocol
        if keep is not None and self.config_updates is not None:
            keep(self.config_updates(admission.config, run_id))
        return source

    def _prepare_all(self, a: _Attempt, source: Source, opened: list[Staged]) -> list[Prepared]:
        """Extract and stage each dataset, then reduce and deliver it; ``opened``: its reads."""
        admission = a.admission
        producer = f"{admission.connector}@{admission.revision}#{admission.id[:12]}"
        prepared = []
        # A discovery that reads records (an API's pages) is not spent before
        # each capture: the read checks values against declared fields itself.
        discovery = (
            None if getattr(type(source), "DISCOVERY_READS_RECORDS", False) else source.discover()
        )
        # A dataset held for duplicate keys (its rows in quarantine) does not stop the
        # others: the Run's error names every one that holds some, not the first alone.
        held: list[DuplicateKeys] = []
        for plan in a.plans:
            self.reporter.phase(plan.name, "extracting")
            try:
                found = _discovered(discovery, source, plan)
                staged = self._extract(a, plan, source, declared_fields(found))
                opened.append(staged)
                prepared.append(
                    prepare(
                        staged,
                        run_id=a.run.id,
                        admission_id=admission.id,
                        producer=producer,
                        area=a.area,
                        layout=self.layout,
                        memory_limit=self.settings.memory_limit,
                        catalog=self.catalog,
                        reporter=self.reporter,
                    )
                )
            except DuplicateKeys as exc:
                held.append(exc)
            except CombinedError as exc:
                if not held or isinstance(exc, RunCanceled):
                    raise
                raise every_held(held, then=exc) from None
        if held:
            raise every_held(held)
        return prepared

    def _extract(
        self, a: _Attempt, plan: DatasetPlan, source: Source, declared: Mapping[str, str] | None
    ) -> Staged:
        """One dataset read into staging (its range's partitions, for a backfill)."""
        try:
            if a.backfill is not None:
                return stage_partitioned(
                    plan, source, a.backfill, a.area, self.layout, self.reporter, declared
                )
            staged = extract(
                plan,
                source,
                a.area,
                self.layout,
                self.reporter,
                declared,
                self.read_options if plan.strategy == "cdc" else None,
                kept=self._kept_fold(plan),
            )
            # A gap met at the read's end, kept with the changes before it (runtime._gap).
            return hold_ended(staged, a.run.id)
        except DriftRejected as exc:
            raise drift_held(self.catalog, self.layout, a.run.id, plan, exc) from None
        except (NotFoundError, SchemaMismatch, UnsupportedType) as exc:
            name_dataset(plan, exc)
            raise
        except StreamGap as exc:
            # Held until a new snapshot, even once its cause is mended (runtime._gap).
            record_gap(self.catalog, self.layout, a.run.id, plan, exc)
            raise

    def _kept_fold(self, plan: DatasetPlan) -> Any:
        """The fold the catalog keeps of a snapshot's last capture that changed nothing."""
        if plan.strategy != "snapshot":
            return None
        with self.catalog.begin() as conn:
            try:
                return cat.get_dataset(conn, plan.source, plan.name).capture_fold
            except NotFoundError:
                return None

    # -- commit, project, reconcile, publish -------------------------------------------

    def _commit_all(
        self, run: Run, prepared: list[Prepared], area: StagingArea, leases: LeaseKeeper
    ) -> Run:
        """Commit, reconcile and publish a staged Run; each read ends by what the lake holds."""
        fault("after_staging")
        run, members = self._commit_each(run, prepared, area, leases)
        run = self._publish(run, prepared, members, leases)
        for p in prepared:
            if p.staged.state is not None:
                p.staged.extraction.acknowledge(p.staged.state)
        end_reads(self.catalog, run.id, [p.staged for p in prepared], ["success"] * len(prepared))
        area.erase_all()
        plans = {(p.staged.plan.source, p.staged.plan.name): p.staged.plan for p in prepared}
        for key, plan in plans.items():
            limit = self.settings.compact_files.get(key)
            compact_if_due(self.catalog, self.layout, *key, run.id, limit, history=plan.history)
        compact_ledger_at(self.catalog, self.layout, run.id, run.publication_id)
        self.reporter.run_finished(run.id, run.state)
        return run

    def _commit_each(
        self, run: Run, prepared: list[Prepared], area: StagingArea, leases: LeaseKeeper
    ) -> tuple[Run, list[Member]]:
        """The Run committing, each dataset committed and projected; failed reads ended."""
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
        return run, members

    def _commit_one(self, run: Run, p: Prepared, area: StagingArea, leases: LeaseKeeper) -> Member:
        plan = p.staged.plan
        self.reporter.phase(plan.name, "committing")
        leases.require(plan.source, plan.name)
        lake_version, committed_at = commit(p, self.layout)
        if p.staged.keeps_position and not p.deliveries:
            keep_position(self.layout, p.staged)
        if p.deliveries:
            fault("after_commit")
            meta = dict(p.metadata)
            meta["lake_version"] = lake_version
            project_commit(
                self.catalog, self.layout, plan.source, plan.name, meta, staging_root=area.root
            )
        with self.catalog.begin() as conn:
            row = cat.get_dataset(conn, plan.source, plan.name)
            if _keeps_fold(p, lake_version):
                # Its rows are the lake's: the next capture under its marker
                # may be checked against its fold (runtime._fold).
                cat.update_dataset(
                    conn, plan.source, plan.name, capture_fold=dict(p.staged.kept_fold or {})
                )
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

    def _publish(
        self, run: Run, prepared: list[Prepared], members: list[Member], leases: LeaseKeeper
    ) -> Run:
        """Reconcile the committed Run, then publish it, while it holds every dataset."""
        try:
            checks = reconcile_run(self.catalog, self.layout, run, prepared, members)
            fault("after_projection")
            # No publication from a Run that lost a dataset.
            leases.require_all([(p.staged.plan.source, p.staged.plan.name) for p in prepared])
            with self.catalog.begin() as conn:
                return publish_run(conn, run, prepared, members, checks, self.publish)
        except BaseException:
            # Committed, not published (a reconciliation that blocks, a Run
            # recovery closed meanwhile): the reads end, nothing is acknowledged.
            end_reads(
                self.catalog, run.id, [p.staged for p in prepared], ["success"] * len(prepared)
            )
            raise

    # -- recovery ---------------------------------------------------------------

    def recover(self, datasets: Sequence[tuple[str, str]]) -> list[str]:
        """Project lake commits the catalog lacks; close Runs whose process died.

        A dataset whose lake commits cannot be projected (its error is in the
        notes and the activity feed) keeps the staging of any dead Run of it;
        the other datasets and Runs are recovered all the same.
        """
        settings = self.settings
        recovery = Recovery(self.catalog, self.layout, settings.lease_ttl_s, settings.max_attempts)
        return recovery.recover(datasets)


def _names(exc: CombinedError, dataset: str) -> bool:
    """Whether ``exc``'s message names ``dataset`` (``SOURCE.DATASET``) as a whole word."""
    return re.search(rf"(?<![\w.]){re.escape(dataset)}(?![\w.])", exc.message) is not None


def name_dataset(plan: DatasetPlan, exc: CombinedError) -> None:
    """Name in ``exc`` the dataset whose read raised it, and the source in its hint.

    A connector knows the relation it reads, not the dataset's name: a Run
    of many datasets ended "relation 'public.custmers' does not exist" or
    "2 rows of 'invoices' hold null in cursor column ...", leaving a person to
    find which dataset (two may read one relation), and without the name
    :func:`name_held_back` could not tell the datasets it held back. A
    hint's ``combined discover SOURCE`` is given the source's name.
    """
    named = f"{plan.source}.{plan.name}"
    if not _names(exc, named):
        exc.args = (f"{named}: {exc.message}", *exc.args[1:])
    if exc.hint:
        exc.hint = exc.hint.replace("combined discover SOURCE", f"combined discover {plan.source}")


def name_held_back(run: Run, exc: CombinedError) -> None:
    """Name in ``exc``'s hint the Run's datasets it held back, and how to capture them alone.

    A Run publishes its datasets together, so one dataset's failure before
    any commit (a drift to review, a value to cast) leaves the others
    uncommitted too; a person (or an alert) reading the error only saw the
    dataset it names. Nothing is added when it names none of them (the
    source itself failed) or every one.
    """
    named = {d for d in run.datasets if _names(exc, f"{run.source}.{d}")}
    others = [f"{run.source}.{d}" for d in run.datasets if d not in named]
    if not named or not others:
        return
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    alone = " ".join(others) if len(others) <= 5 else "SOURCE.DATASET ..."
    held = (
        f"this Run's other datasets ({shown}) were not committed either (a Run publishes "
        f"its datasets together): `combined capture {alone}` captures them meanwhile"
    )
    exc.hint = f"{exc.hint}; {held}" if exc.hint else held


def _keeps_fold(p: Prepared, lake_version: int | None) -> bool:
    """Whether the catalog keeps the fold of ``p``'s capture (``runtime._fold.kept_fold``).

    Only a capture that changed nothing, of the lake version it read (no
    commit came between the read and now).
    """
    kept = p.staged.kept_fold
    if not kept or p.deliveries or p.transition.changes:
        return False
    return bool(kept["read"]["lake_version"] == lake_version)


def _discovered(
    discovery: Discovery | None, source: Source, plan: DatasetPlan
) -> DatasetDiscovery | None:
    """What discovery reports of ``plan``'s relation: its declared types and column identities.

    A SQL source's discovery names a relation with its schema
    (``public.orders``), while a dataset may name it bare (``orders``, its
    name by default): the source's ``discovered_name`` says which it is, so a
    capture of hundreds of bare-named tables does not describe each again on
    a connection of its own. Found under no name (outside the discovered
    schemas), its batches would go unchecked and its columns' identities
    unrecorded, so a column renamed or swapped at the source would go
    unnoticed: such a relation is described on its own (one catalog query);
    one the source does not have is left to the read, which says so.
    """
    if discovery is None:
        return None
    found = discovery.dataset(plan.relation) or discovery.dataset(plan.name)
    named = getattr(source, "discovered_name", None)  # optional in the Source protocol
    if found is None and named is not None:
        with contextlib.suppress(ConfigError):  # a name that cannot be parsed: the read says so
            found = discovery.dataset(named(plan.relation))
    describe = getattr(source, "describe_relation", None)
    if found is not None or describe is None:
        return found
    try:
        described: DatasetDiscovery = describe(plan.relation)
    except NotFoundError:
        return None
    return described


def name_owner(source: Source, layout: LakeLayout) -> None:
    """Tell a source that makes server objects for its streams whose project they are.

    The project's id is read from the lake (made there the first time) only
    when the source asks for it: when a stream is made, claimed or dropped.
    Asked with ``make=False`` (a command that only reads), a lake without an
    id yet is left so, and the answer is None. The owner keeps the source's
    records of what its first captures made in the lake (``lake/_streams.py``).
    """
    keep = getattr(source, "keep_stream_owner", None)  # optional in the Source protocol
    if keep is not None:

        def owner(make: bool = True) -> StreamOwner | None:
            from combined.lake._project import existing_project_id, project_id
            from combined.lake._streams import LakeStreamRecords

            found = project_id(layout) if make else existing_project_id(layout)
            if found is None:
                return None
            return StreamOwner(found, records=LakeStreamRecords(layout))

        keep(owner)
