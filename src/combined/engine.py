"""The engine facade: the one object the CLI and the API drive."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from combined._owner_only import restrict_umask
from combined._reading import Reading, _check_limit
from combined.catalog import Admission, Catalog, Run, Trigger, queue, worker_identity
from combined.catalog import data as cat
from combined.config import (
    Project,
    config_digest,
    load_project,
    redact_config,
    resolve_secrets,
)
from combined.config._updates import ConfigUpdates
from combined.connectors import (
    check_config,
    check_shared_streams,
    check_strategy,
    check_streams,
    connector_class,
    sweep_private_dirs,
)
from combined.delivery import Limits
from combined.errors import ConfigError
from combined.lake import LakeLayout
from combined.lake._ledger import Ledger
from combined.runtime._admit import admit, admit_or_join, admit_retry_of, freeze_admission
from combined.runtime._deadline import DEFAULT_ATTEMPT_TIMEOUT_S, env_seconds
from combined.runtime._lease import lease_ttl
from combined.runtime._memory import tune_allocators
from combined.runtime._plan import Settings
from combined.runtime._preflight import cdc_streams, preflight, requests_of, verify_declared
from combined.runtime._publish import HeldPublications
from combined.runtime._reporter import NullReporter, Reporter
from combined.runtime._runner import Runner, name_owner

if TYPE_CHECKING:
    from combined.config import WebhookConfig
    from combined.connectors.abc import Discovery, Source
    from combined.runtime._notify import Sender


#: What ``status(slots=True)`` shows of a replication slot, and of a binlog stream.


class Engine(Reading):
    """Everything Combined does, over one project."""

    def __init__(self, project: Project, reporter: Reporter | None = None) -> None:
        self.project = project
        self.reporter = reporter or NullReporter()
        tune_allocators()
        restrict_umask()  # what it writes (lake, catalog, spill) is the owner's alone
        # An object-store lake stages its Runs on this machine, under the project.
        self.layout = LakeLayout(
            project.lake_uri(), staging_root=project.root / ".combined" / "staging"
        )
        self._catalog: Catalog | None = None
        # The API serves requests from threads: the catalog is opened once.
        self._opening = threading.Lock()

    @classmethod
    def open(cls, path: str | Path | None = None, reporter: Reporter | None = None) -> Engine:
        """Load the project file and build an engine over it."""
        return cls(load_project(path), reporter)

    @property
    def catalog(self) -> Catalog:
        """The catalog, opened (and migrated) on first use."""
        with self._opening:
            if self._catalog is None:
                self._catalog = Catalog.open(
                    self.project.catalog_url(), password=self.project.catalog_secret()
                )
                self._catalog.ledger = Ledger(self.layout)  # the lake first: lake/_ledger.py
            return self._catalog

    def close(self) -> None:
        """Release the alert sender's claims (:meth:`Sender.close`), then the catalog."""
        sender = self.__dict__.pop("sender", None)  # (cached: a later use makes a new one)
        if sender is not None:
            sender.close()
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None

    @property
    def runner(self) -> Runner:
        """The Run executor over this project's catalog and lake."""
        return self._runner()

    def _runner(
        self, read_options: dict[str, Any] | None = None, worker: str = "embedded"
    ) -> Runner:
        staging = self.project.staging
        settings = Settings(
            root=self.project.root,
            limits=Limits(
                max_bytes=staging.max_bytes,
                max_files=staging.max_files,
                max_path_length=staging.max_path_length,
                compression=staging.compression,
            ),
            memory_limit=self.project.reduction_memory,
            backoff_s=float(os.environ.get("COMBINED_RETRY_BACKOFF_S", "0.5")),
            lease_ttl_s=lease_ttl(),
            worker=worker,
            attempt_timeout_s=env_seconds("COMBINED_ATTEMPT_TIMEOUT_S", DEFAULT_ATTEMPT_TIMEOUT_S),
            compact_files={
                (s, d): self.project.retention_of(s, d).compact_files
                for s, d, _ in self.project.datasets()
            },
        )
        runner = Runner(
            self.catalog, self.layout, settings, self._resolve, self.reporter, read_options
        )
        runner.config_updates = self._config_updates
        return runner

    def _resolve(self, admission_config: dict[str, Any]) -> dict[str, Any]:
        """A source's connector configuration: secrets resolved, kept updates applied."""
        resolved = resolve_secrets(
            admission_config["config"],
            self.project.root,
            prefix=f"sources.{admission_config['source']}.config",
        )
        return self._config_updates(admission_config).apply(resolved)

    def _config_updates(
        self, admission_config: Mapping[str, Any], run_id: str | None = None
    ) -> ConfigUpdates:
        """The kept configuration updates of a source; each new one told in Activity."""
        source = admission_config["source"]

        def told(keys: Sequence[str], places: Sequence[str]) -> None:
            self.reporter.note(
                f"source {source}: the connector updated its configuration "
                f"({', '.join(keys)}); kept for the next run"
            )
            with self.catalog.begin() as c:
                cat.emit(
                    c,
                    "source.config_updated",
                    source=source,
                    run_id=run_id,
                    keys=list(keys),
                    kept_in=list(places),
                )

        return ConfigUpdates(self.project.root, source, admission_config["config"], told)

    # -- declarations and admission ------------------------------------------------

    def selectors(self, names: Sequence[str]) -> dict[str, list[str]]:
        """Resolve ``SOURCE`` / ``SOURCE.DATASET`` selectors (all when empty).

        One name alone, not in a list, is taken as one name (a string is a
        sequence of its letters: ``capture("shop.orders")`` named source ``s``).
        """
        if isinstance(names, str):
            names = [names]
        out: dict[str, list[str]] = {}
        if not names:
            for source, dataset, _ in self.project.datasets():
                out.setdefault(source, []).append(dataset)
            return out
        for name in names:
            source, dot, dataset = name.partition(".")
            if not source or (dot and not dataset):
                # "shop." would otherwise select every dataset of shop: a typo
                # must not widen what is captured.
                raise ConfigError(
                    f"{name!r} is not SOURCE or SOURCE.DATASET",
                    hint="e.g. shop or shop.orders; `combined status` lists the datasets",
                )
            src = self.project.source(source)
            if dataset:
                self.project.dataset(source, dataset)
                if dataset not in out.setdefault(source, []):
                    out[source].append(dataset)
            else:
                for d in src.datasets:
                    if d not in out.setdefault(source, []):
                        out[source].append(d)
        return out

    def _admission(self, source: str) -> Admission:
        """``source``'s configuration as it stands, frozen for a Run (``runtime/_admit.py``)."""
        return freeze_admission(self.project, source)

    def _connector(self, source: str) -> type[Source]:
        """The connector class of ``source``, once it accepts the configuration's keys."""
        src = self.project.source(source)
        cls = connector_class(src.connector)
        check_config(cls, src.config, where=f"sources.{source}.config")
        for name, d in src.datasets.items():
            # Refused at check time, not at the read: capabilities are class constants.
            check_strategy(
                cls, d.strategy, where=f"sources.{source}.datasets.{name}", key=d.key or []
            )
        relations = {name: (d.strategy, d.relation) for name, d in src.datasets.items()}
        check_streams(cls, src.config, relations, where=f"sources.{source}")
        alike = {  # slot names are the server's: another source may compute the same one
            name: (s.config, {n: (d.strategy, d.relation) for n, d in s.datasets.items()})
            for name, s in self.project.sources.items()
            if s.connector == src.connector
        }
        check_shared_streams(cls, source, alike)
        return cls

    def _declare(self, source: str) -> None:
        # The connector refuses keys it does not take before anything is stored:
        # a misspelt key's value may be the secret the user meant to reference.
        self._connector(source)
        src = self.project.source(source)
        with self.catalog.begin() as conn:
            cat.upsert_source(
                conn, source, src.connector, redact_config(src.config), config_digest(src.config)
            )
            for name, d in src.datasets.items():
                cat.ensure_dataset(
                    conn,
                    source,
                    name,
                    relation=d.relation,
                    key=list(d.key or []),
                    strategy=d.strategy,
                    sync_mode=d.sync_mode,
                    freshness_target_s=int(d.freshness.total_seconds()) if d.freshness else None,
                )

    # -- captures -------------------------------------------------------------------

    def capture(
        self,
        names: Sequence[str] = (),
        trigger: Trigger | None = None,
        read_options: dict[str, Any] | None = None,
    ) -> list[Run]:
        """Capture the selected datasets: one Run per source."""
        selected = self.selectors(names)
        for source, datasets in selected.items():  # what a source shows cannot be read: exit 2
            first = self._never_captured(source)
            preflight(
                self.project, source, datasets, self._source, first, self.committed_checkpoint
            )
        self._ready()
        # Several sources' Runs publish together, once all ended: no reader sees half of it.
        with HeldPublications(self.catalog, together=len(selected) > 1) as held:
            for source, datasets in selected.items():
                run = self._admit(source, datasets, trigger)
                held.runs.append(held.hold(self._runner(read_options)).execute(run))
        self._after(held.runs)
        return held.runs

    def _after(self, runs: Sequence[Run]) -> None:
        """After Runs: the CDC streams they read checked for risk, alerts sent in the background."""
        from combined.runtime._alerts import check_slots

        cdc = {r.source for r in runs if r.state == "succeeded"} & {
            s for s, _, d in self.project.datasets() if d.strategy == "cdc"
        }
        if cdc:
            for note in check_slots(self, cdc):
                self.reporter.note(note)
        self.sender.soon()

    @cached_property
    def sender(self) -> Sender:
        """Sends alerts to the project's notification targets, from a background thread."""
        from combined.runtime._notify import Sender

        return Sender(self)

    def check_alerts(self, *, slots: bool = True, now: datetime | None = None) -> list[str]:
        """Check freshness, overdue reviews and (``slots``: asking each source) CDC streams.

        Each breach raises its alert once (see :mod:`combined.runtime._alerts`);
        pending alerts are then sent in the background. Returns what was raised.
        """
        from combined.runtime._alerts import check_freshness, check_slots

        notes = check_freshness(self.catalog, self.project, now) + self.remind_quarantine(now)
        if slots:
            notes += check_slots(self)
        self.sender.soon()
        return notes

    def _admit(
        self, source: str, datasets: list[str], trigger: Trigger | None, enqueue: bool = False
    ) -> Run:
        """Declare ``source`` and admit a Run of ``datasets`` under its current configuration."""
        self._declare(source)
        admission = self._admission(source)
        with self.catalog.begin() as conn:  # a lake that holds a table is no first sync
            fresh = all(
                cat.get_dataset(conn, source, d).current_version is None
                and not self.layout.dataset_table(source, d).exists()
                for d in datasets
            )
        return admit(
            self.catalog,
            source=source,
            datasets=datasets,
            trigger=trigger or ("first_sync" if fresh else "manual"),
            admission=admission,
            enqueue=enqueue,
        )

    # -- the queue ------------------------------------------------------------------

    def enqueue(self, names: Sequence[str] = (), trigger: Trigger | None = None) -> list[Run]:
        """Admit captures of the selected datasets to the queue: one Run per source.

        Nothing is read here: a worker (``combined worker``) takes each Run.
        A dataset whose capture is queued or running joins it: a source's Run
        is then that one, unless its other datasets needed a new Run.
        """
        from combined.runtime._scheduler import enqueue, per_source

        return per_source(enqueue(self, names, trigger))

    def enqueue_dataset(
        self, source: str, dataset: str, trigger: Trigger = "webhook"
    ) -> tuple[Run, bool]:
        """Queue one capture of exactly ``source.dataset``; ``(run, joined)``.

        While a capture of the dataset waits in the queue (no worker took it
        yet), another request joins it (``joined`` is True) instead of
        queueing a second one: that Run reads the source after both requests.
        """
        self.project.dataset(source, dataset)
        self._declare(source)
        admission = self._admission(source)
        return admit_or_join(self.catalog, source, dataset, trigger, admission)

    def queued(self, limit: int = 100, *, due: bool = False) -> list[Run]:
        """Runs waiting for a worker, oldest first (``due``: only those takeable now)."""
        _check_limit(limit)
        with self.catalog.begin() as conn:
            return queue.queued(conn, limit, due=due)

    def take_run(self) -> Run | None:
        """Take the oldest queued Run for this process to execute; None when none waits."""
        with self.catalog.begin() as conn:
            run = queue.take(conn, worker_identity())
            if run is not None:
                cat.emit(conn, "run.taken", source=run.source, run_id=run.id, by=run.claimed_by)
            return run

    def execute_taken(self, run: Run) -> Run:
        """Execute a Run :meth:`take_run` took, as a capture executes its own.

        A Run whose dataset another Run holds goes back to the queue (it is
        returned still queued). A lake the store fails or refuses before the
        Run (unreachable, its credentials expired) ends the Run failed with
        that error, ``alert.run_failed`` telling it once: the worker goes on
        (it ended, and an unattended capture stopped until someone restarted it).
        """
        from combined.errors import LakeError

        try:
            self._ready()
        except LakeError as exc:
            run = self._runner(worker="worker").fail(run.id, exc)
            self._after([run])
            return run
        except BaseException:
            with self.catalog.begin() as conn:  # it holds nothing yet: another worker may
                queue.give_back(conn, run.id, run.claimed_by or "")
            raise
        run = self._runner(worker="worker").execute(run, give_back=True)
        if run.terminal:
            self._after([run])
        return run

    def work(
        self,
        stopping: Callable[[], bool],
        *,
        poll_s: float = 2.0,
        once: bool = False,
        max_runs: int | None = None,
    ) -> Iterator[Run]:
        """Be a worker: execute queued Runs one at a time, yielding each once it ended.

        ``stopping`` is asked between Runs and while idle; ``once`` stops
        when the queue is empty; ``max_runs`` after that many Runs.
        """
        from combined.runtime._worker import work

        if poll_s <= 0 or max_runs is not None and max_runs < 1:
            raise ConfigError(
                "--poll must be more than 0 seconds and --max-runs at least 1",
                hint="e.g. --poll 2 --max-runs 10",
            )
        # Runs a dead worker left are closed before this one waits for more. An object
        # store that does not answer yet is waited for (one that refuses is an error),
        # unless ``once`` (a job run from time to time: its next start tries again). A
        # lake on this machine's disk answers or refuses: never waited for.
        if once or not self.layout.store.remote:
            self._ready()
        elif not self._ready_when_reachable(stopping):
            return
        tried: set[str] = set()
        yield from work(
            self.take_run,
            self.execute_taken,
            stopping,
            lambda: bool(self.queued(1, due=True)),
            poll_s=poll_s,
            once=once,
            max_runs=max_runs,
            give_back=self._give_back_taken,
            idle=lambda: self._recover_abandoned(tried),
        )

    def _ready_when_reachable(self, stopping: Callable[[], bool]) -> bool:
        """:meth:`_ready`, once the lake's store answers (``runtime._lake_wait``); False
        when ``stopping`` came first. A store that refuses is not waited for: raised."""
        from combined.errors import LakeNotWritable
        from combined.lake._probe import check_store
        from combined.runtime._lake_wait import when_reachable

        def probe() -> None:  # (one short try a request)
            check_store(self.layout.store, waiting=True)

        try:
            if not when_reachable(probe, stopping, self.catalog, send=self.sender.soon):
                return False
        except LakeNotWritable as exc:
            raise type(exc)(
                exc.message,
                hint=f"{exc.hint}; the worker does not wait for this (the store answered "
                "and refused): fix it, then start the worker again",
            ) from None
        self._ready()
        return True

    def _recover_abandoned(self, tried: set[str]) -> None:
        """Repair when a Run lost its process (a worker killed while the others idled).

        Its Run is then ended and retried (``runtime._requeue``) at once, not
        once a new Run is queued (a worker repairs before each Run it takes).
        Once per such Run (``tried``): one recovery cannot end (its lake commits
        unreadable) is not tried, and told, again at every poll.
        """
        with self.catalog.begin() as conn:
            lost = set(queue.abandoned(conn, timedelta(seconds=lease_ttl())))
        if lost <= tried:
            return
        tried |= lost
        self._ready()

    def _give_back_taken(self) -> None:
        """Put back in the queue the Runs this process took and has not started."""
        with self.catalog.begin() as conn:
            queue.give_back_all(conn, worker_identity())

    def webhook(self, source: str, dataset: str) -> WebhookConfig | None:
        """The webhook setting of a dataset (its own, else its source's); None if unset."""
        d = self.project.dataset(source, dataset)
        return d.webhook or self.project.source(source).webhook

    def backfill(
        self,
        name: str,
        *,
        partitions: int,
        lower: str | None = None,
        upper: str | None = None,
        column: str | None = None,
        sum_column: str | None = None,
    ) -> Run:
        """Capture ``[lower, upper)`` of one dataset in parallel partitions under one snapshot."""
        from combined.runtime._backfill import BackfillSpec, check_backfill

        source, _, dataset = name.partition(".")
        if not dataset:
            raise ConfigError(
                f"backfill takes SOURCE.DATASET, not {name!r}", hint="e.g. shop.orders"
            )
        spec = BackfillSpec(partitions, column, lower, upper, sum_column)
        d = self.project.dataset(source, dataset)
        check_backfill(  # before any Run: what the dataset cannot take is refused (exit 2)
            name,
            self._connector(source),
            (d.strategy, d.sync_mode, tuple(d.key or ())),
            self.layout.dataset_table(source, dataset).schema(),
            spec,
        )
        preflight(self.project, source, [dataset], self._source)
        self._ready()
        self._declare(source)
        run = admit(
            self.catalog,
            source=source,
            datasets=[dataset],
            trigger="manual",
            admission=self._admission(source),
        )
        run = self.runner.execute(run, backfill=spec)
        self.sender.soon()
        return run

    def retry(self, run_id: str, *, enqueue: bool = False) -> Run:
        """Execute a failed Run again, as a new Run under the same admission.

        With ``enqueue``, the new Run waits in the queue for a worker.
        """
        # First close the Runs whose process died (a retry stopped by SIGTERM
        # stays unfinished until then): none of them is still retrying.
        if enqueue:
            self.repair()
        else:
            self._ready()
        run = admit_retry_of(self.catalog, run_id, enqueue=enqueue)
        if enqueue:
            return run
        run = self.runner.execute(run)
        self.sender.soon()
        return run

    def cancel(self, run_id: str, *, by: str, reason: str | None = None) -> Run:
        """Cancel a queued Run now, or ask a running one (any process) to stop.

        A running Run stops its reads at its next poll, commits and
        acknowledges nothing, and ends ``canceled``; the Run is returned as
        it is now. A finished or committing Run cannot be canceled.
        """
        from combined.runtime._cancel import request_cancel

        with self.catalog.begin() as conn:
            return request_cancel(conn, run_id, by, reason)

    def _ready(self) -> None:
        """Before any Run: a writable lake, a catalog that matches it, overdue reviews told.

        Private files (a program's resolved configuration) that a Combined
        process killed outright left on this machine are removed too. What
        the repair did (a dead Run's lake commits projected, the Run ended)
        is told: the capture that follows would otherwise show no change.
        """
        self.layout.ensure_writable()
        sweep_private_dirs()
        notes = self.repair()
        for note in notes:
            self.reporter.note(note)
        if notes:
            # A dead Run ended raises its alert: sent now, not after the next Run (an
            # idle worker held it back for as long as the queue stayed empty).
            self.sender.soon()
        self.remind_quarantine()

    def repair(self) -> list[str]:
        """Rebuild the projection from the lake and close Runs whose process died.

        An empty catalog gets back, from the lake, its sources and datasets,
        their versions, Deliveries and MAR, and every publication with its
        Runs and their admissions (``lake/_ledger.py``).
        """
        from combined._restore import restore_publications

        pairs = [(s, d) for s, d, _ in self.project.datasets()]
        notes = restore_publications(self.catalog, self.layout, self.project, self._declare)
        return notes + self.runner.recover(pairs)

    def maintain(
        self, names: Sequence[str] = (), *, now: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Compact, vacuum and expire the raw layer of the named datasets (all by default).

        What is past its retention is judged as of ``now`` (the clock's time by default).
        """
        from combined.maintain import compact_ledger, maintain

        pairs = [(s, d) for s, names_ in self.selectors(names).items() for d in names_]
        self.layout.ensure_writable()
        ttl = timedelta(seconds=lease_ttl())
        reports = maintain(self.project, self.catalog, self.layout, pairs, ttl=ttl, now=now)
        return reports if names else [*reports, compact_ledger(self.layout)]

    def reset(
        self, names: Sequence[str], *, by: str, reason: str, drop_table: bool = False
    ) -> list[dict[str, Any]]:
        """Forget, by a recorded decision, the lake table each named dataset's catalog records:
        its next capture is a first capture (:mod:`combined.runtime._reset`).

        ``names`` are ``SOURCE`` or ``SOURCE.DATASET`` (never every dataset by
        default); ``drop_table`` removes the tables the lake still holds of them.
        """
        from combined.runtime._reset import Decision, reset_datasets

        if isinstance(names, str):
            names = [names]
        if not names:
            raise ConfigError(
                "name the datasets to reset", hint="e.g. `combined reset shop.orders --reason ...`"
            )
        selected = self.selectors(names)
        self.layout.ensure_writable()
        for source in selected:
            self._declare(source)
        pairs = [(s, d) for s, datasets in selected.items() for d in datasets]
        ttl = timedelta(seconds=lease_ttl())
        decision = Decision(by, reason, drop_table)
        return reset_datasets(self.catalog, self.layout, pairs, decision, ttl)

    # -- sources ----------------------------------------------------------------------

    def _never_captured(self, source: str) -> list[str]:
        """The datasets of ``source`` that no capture committed yet (one catalog read)."""
        with self.catalog.begin() as conn:
            done = {
                r.name for r in cat.list_datasets(conn) if r.source == source and r.last_sequence
            }
        # (a catalog newer than its lake, before a repair: the lake says which it holds)
        return [
            d
            for d in self.project.source(source).datasets
            if d not in done and not self._in_lake(source, d)
        ]

    def _in_lake(self, source: str, dataset: str) -> bool:
        """Whether the lake holds the dataset's table; True when the lake cannot be read
        (the lake's own check, before any Run, then says why)."""
        try:
            return bool(self.layout.dataset_table(source, dataset).exists())
        except Exception:  # noqa: BLE001 - told by ensure_writable next, with its remedy
            return True

    def committed_checkpoint(self, source: str, dataset: str) -> dict[str, Any] | None:
        """The checkpoint of a dataset's newest lake commit (the authoritative one), or the
        position captures that changed no row kept after it (``lake._positions``).

        A store that fails the read (its bucket gone, unreachable) is a LakeError saying so.
        """
        from combined.lake._positions import LakePositions
        from combined.lake._probe import read_failure

        try:
            meta = self.layout.reading_table(source, dataset).latest_commit()
        except OSError as exc:
            where = f"{source}.{dataset}: the lake at {self.layout.store.root} could not be read"
            raise read_failure(where, exc) from None
        resumed = LakePositions(self.layout).resumed(source, dataset, meta)
        return None if resumed is None else resumed.get("checkpoint")

    def reset_checkpoint(self, source: str, dataset: str, reason: str) -> int | None:
        """Void a dataset's checkpoint by a recorded lake commit; returns its lake version."""
        from combined.runtime._project import commit_reset

        self.project.dataset(source, dataset)
        self._declare(source)
        return commit_reset(self.catalog, self.layout, source, dataset, reason)

    def open_source(self, source: str) -> Source:
        """A connected-on-demand source of the project (secrets resolved now)."""
        return self._source(source)

    def _source(self, source: str) -> Source:
        cls = self._connector(source)
        declared = {"source": source, "config": self.project.source(source).config}
        config = self._resolve(declared)
        if isinstance(config.get("path"), str) and "://" not in config["path"]:
            config["path"] = os.path.abspath(self.project.root / config["path"])
        conn = cls(config)
        name_owner(conn, self.layout)
        keep = getattr(conn, "keep_config_updates", None)  # optional in the Source protocol
        if keep is not None:
            keep(self._config_updates(declared))
        return conn

    def check(self, source: str, warn: Callable[[str], object] | None = None) -> None:
        """Connect to a source and authenticate; verify what its datasets need.

        Every declared relation, key, cursor and ``columns:`` must exist with a
        type the dataset can take (:func:`~combined.runtime._preflight.verify_declared`);
        every dataset that cannot is told.

        ``warn`` hears the configuration's risks first, then those of the declared reads.
        """
        conn = self._source(source)
        try:
            if warn is not None:
                for why in getattr(conn, "warnings", tuple)():  # optional in the Source protocol
                    warn(why)
            conn.check()
            if warn is not None:
                self._warn_reads(source, conn, warn)
            verify_declared(self.project, source, self._source)  # every dataset's own, first
            self._check_streams(source, conn)
        finally:
            conn.close()

    def _warn_reads(self, source: str, conn: Source, warn: Callable[[str], object]) -> None:
        """What the source finds risky in the datasets' reads (``read_warnings``, optional)."""
        read_warnings = getattr(conn, "read_warnings", None)
        if read_warnings is not None:
            datasets = list(self.project.source(source).datasets)
            for why in read_warnings(requests_of(self.project, source, datasets)):
                warn(why)

    def _check_streams(self, source: str, conn: Source) -> None:
        """What would stop the cdc datasets' change streams: a gap recorded in a checkpoint
        (every capture refused until a new snapshot), then the connector's ``cdc_check``
        (given each resumed relation's committed checkpoint)."""
        from combined.runtime._gap import refuse_recorded_in

        def committed(source: str, name: str) -> dict[str, Any] | None:
            checkpoint = self.committed_checkpoint(source, name)
            refuse_recorded_in(f"{source}.{name}", checkpoint)
            return checkpoint

        names = list(self.project.source(source).datasets)
        relations, resumed = cdc_streams(self.project, source, names, committed)
        cdc_check = getattr(conn, "cdc_check", None)
        if relations and cdc_check is not None:
            cdc_check(relations, committed=resumed)

    def discover(self, source: str) -> Discovery:
        """Run discovery on a source and store it as the next version."""
        from dataclasses import asdict

        conn = self._source(source)
        try:
            found = conn.discover()
        finally:
            conn.close()
        with self.catalog.begin() as c:
            cat.record_discovery(
                c, source, found.connector, found.revision, _jsonable(asdict(found))
            )
        return found


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value
