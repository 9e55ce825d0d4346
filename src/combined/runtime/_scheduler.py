"""The scheduler: queue a capture for each due tick of each dataset's ``schedule:``.

It reads the project and the catalog only: it never contacts a source, it
queues Runs that workers execute. Any number of schedulers may share one
catalog: each tick of a dataset is recorded (``schedule_ticks``) in the
transaction that queues its Run, and the record's primary key lets exactly
one scheduler queue it. A tick that finds a capture of the dataset already
queued or running joins it. After downtime only the newest missed tick is
due: one catch-up Run, not one per missed tick.

The core, :meth:`Scheduler.tick`, takes the time as a parameter; the loop
(:meth:`Scheduler.run`) asks a clock for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import Admission, Catalog, Run, Trigger, queue
from combined.catalog import data as cat
from combined.config import Project
from combined.errors import CatalogError
from combined.protocol import utcnow
from combined.runtime._admit import admit
from combined.runtime._worker import _sleep

if TYPE_CHECKING:
    from combined.config._schedule import ScheduleConfig
    from combined.engine import Engine

_log = logging.getLogger("combined.scheduler")


@dataclass(frozen=True, slots=True)
class Part:
    """What one request (a tick, ``capture --enqueue``) did for some datasets of a source.

    ``joined``: the datasets were already being captured by ``run`` (queued
    or running), which now answers the request too; else ``run`` is new.
    """

    run: Run
    datasets: tuple[str, ...]
    joined: bool


@dataclass(frozen=True, slots=True)
class Due:
    """Datasets of one source whose schedule has a tick not queued yet."""

    source: str
    datasets: tuple[str, ...]
    tick: datetime
    schedule: ScheduleConfig


def schedules(project: Project) -> Iterator[tuple[str, str, ScheduleConfig, bool]]:
    """Every scheduled (source, dataset, schedule, own): ``own`` if set on the dataset."""
    for source, name, d in project.datasets():
        schedule = d.schedule or project.source(source).schedule
        if schedule is not None:
            yield source, name, schedule, d.schedule is not None


def due(project: Project, last: Mapping[tuple[str, str], datetime], now: datetime) -> list[Due]:
    """The captures due at ``now``, given the newest tick recorded for each dataset.

    A dataset is due when its schedule's newest tick at or before ``now``
    is newer than its last recorded one; however many ticks were missed,
    only that newest one is due. Datasets sharing their source's schedule
    are captured together, in one Run; a dataset with its own, alone.
    """
    groups: dict[tuple[str, str, datetime], list[str]] = {}
    found: dict[tuple[str, str, datetime], ScheduleConfig] = {}
    for source, name, schedule, own in schedules(project):
        tick = schedule.latest(now)
        previous = last.get((source, name))
        if previous is not None and previous >= tick:
            continue
        key = (source, name if own else "", tick)
        groups.setdefault(key, []).append(name)
        found[key] = schedule
    return [
        Due(source, tuple(names), tick, found[(source, group, tick)])
        for (source, group, tick), names in groups.items()
    ]


def next_tick(project: Project, now: datetime) -> datetime | None:
    """The first tick of any schedule after ``now``; None when nothing is scheduled."""
    ticks = [schedule.following(now) for _, _, schedule, _ in schedules(project)]
    return min(ticks, default=None)


def admit_or_join(
    catalog: Catalog,
    conn: Connection,
    *,
    source: str,
    datasets: Sequence[str],
    trigger: Trigger,
    admission: Admission,
    ttl: timedelta,
    retry_of: str | None = None,
) -> list[Part]:
    """Queue one Run of the ``datasets`` no capture is queued for or running yet.

    The others join the capture of theirs (a ``run.joined`` event each). The
    datasets' rows are locked first, so two requests at once do not both
    find nothing to join. A retry (``retry_of``) never joins the Run it retries.
    """
    for dataset in sorted(datasets):
        queue.lock_dataset(conn, source, dataset)
    joined: dict[str, tuple[Run, list[str]]] = {}
    rest: list[str] = []
    for dataset in datasets:
        live = queue.live(conn, source, dataset, ttl, besides=retry_of)
        if live is None:
            rest.append(dataset)
            continue
        joined.setdefault(live.id, (live, []))[1].append(dataset)
        cat.emit(
            conn, "run.joined", source=source, dataset=dataset, run_id=live.id, trigger=trigger
        )
    parts = [Part(run, tuple(names), True) for run, names in joined.values()]
    if rest:
        run = admit(
            catalog,
            source=source,
            datasets=rest,
            trigger=trigger,
            admission=admission,
            retry_of=retry_of,
            enqueue=True,
            conn=conn,
        )
        parts.append(Part(run, tuple(rest), False))
    return parts


def enqueue(engine: Engine, names: Sequence[str], trigger: Trigger | None = None) -> list[Part]:
    """Queue captures of the selected datasets, joining those already queued or running."""
    from combined.runtime._lease import lease_ttl

    parts: list[Part] = []
    for source, datasets in engine.selectors(names).items():
        engine._declare(source)
        admission = engine._admission(source)
        with engine.catalog.begin() as conn:
            fresh = all(cat.get_dataset(conn, source, d).current_version is None for d in datasets)
            parts += admit_or_join(
                engine.catalog,
                conn,
                source=source,
                datasets=datasets,
                trigger=trigger or ("first_sync" if fresh else "manual"),
                admission=admission,
                ttl=timedelta(seconds=lease_ttl()),
            )
    return parts


def per_source(parts: Iterable[Part]) -> list[Run]:
    """One Run per source: its new Run, else the first it joined."""
    runs: dict[str, Run] = {}
    for part in parts:
        if not part.joined or part.run.source not in runs:
            runs[part.run.source] = part.run
    return list(runs.values())


class Scheduler:
    """Queues the due captures of an engine's project."""

    def __init__(self, engine: Engine) -> None:
        from combined.runtime._reload import ProjectFile

        self.engine = engine
        self.file = ProjectFile(engine)

    def tick(self, now: datetime) -> list[tuple[Due, list[Part]]]:
        """Queue (or join) a capture for every tick due at ``now``; what each did.

        A tick another scheduler recorded first is left to it (not returned).
        """
        with self.engine.catalog.begin() as conn:
            last = queue.last_ticks(conn, now)
        done = []
        for entry in due(self.engine.project, last, now):
            try:
                done.append((entry, self._queue(entry)))
            except sa.exc.IntegrityError:
                continue  # another scheduler queued this tick, in its own transaction
        return done

    def _queue(self, entry: Due) -> list[Part]:
        from combined.runtime._lease import lease_ttl

        engine = self.engine
        engine._declare(entry.source)
        admission = engine._admission(entry.source)
        with engine.catalog.begin() as conn:
            parts = admit_or_join(
                engine.catalog,
                conn,
                source=entry.source,
                datasets=entry.datasets,
                trigger="schedule",
                admission=admission,
                ttl=timedelta(seconds=lease_ttl()),
            )
            for part in parts:
                for dataset in part.datasets:
                    queue.record_tick(
                        conn, entry.source, dataset, entry.tick, part.run.id, joined=part.joined
                    )
        return parts

    def run(
        self,
        stopping: Callable[[], bool],
        *,
        clock: Callable[[], datetime] = utcnow,
        report: Callable[[Due, list[Part]], None] = lambda entry, parts: None,
        max_wait_s: float = 60.0,
        once: bool = False,
    ) -> None:
        """Queue due captures until ``stopping`` (after one round with ``once``).

        Each round first reads the project file again if it changed, then
        also checks freshness targets and overdue quarantine reviews, and
        sends pending alerts. Between rounds it sleeps until
        the next tick, waking at least every ``max_wait_s`` (so a changed
        clock is noticed) and when asked to stop.
        """
        while not stopping():
            self.file.refresh()  # (a changed project file: its schedules and sources)
            now = clock()
            try:
                for entry, parts in self.tick(now):
                    report(entry, parts)
                # Catalog-only checks (freshness, overdue reviews); alerts sent in the background.
                self.engine.check_alerts(slots=False, now=now)
            except CatalogError as exc:
                if once or not exc.context.get("lost"):
                    raise
                # (a catalog restart or failover: the next round tries again)
                _log.warning("%s; trying again in %.0f s", exc.message, max_wait_s)
                _sleep(max_wait_s, stopping)
                continue
            if once:
                return
            wake = next_tick(self.engine.project, now)
            wait = max_wait_s if wake is None else (wake - clock()).total_seconds()
            # (woken by a changed project file too: a new schedule may be due now)
            _sleep(min(max(wait, 0.0), max_wait_s), lambda: stopping() or self.file.changed())


def describe(parts: Iterable[Part]) -> list[str]:
    """One line per part: ``run R queued: shop (orders)`` / ``... joined: ...``."""
    return [
        f"run {p.run.id} {'joined' if p.joined else 'queued'}: {p.run.source} "
        f"({', '.join(p.datasets)})" + (f", already {p.run.state}" if p.joined else "")
        for p in parts
    ]
