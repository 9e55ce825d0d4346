"""``combined schedule``: queue the captures the project's schedules make due.

``combined serve`` and ``combined worker --schedule`` run the same scheduler
in a thread of their own (:func:`in_background`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from combined.cli import TERMINATED, ProjectOpt, Terminated, _engine, _fail, app, err

if TYPE_CHECKING:
    from combined.engine import Engine
    from combined.runtime._scheduler import Due, Part


def _report(entry: Due, parts: list[Part]) -> None:
    from combined.runtime._scheduler import describe

    when = entry.tick.isoformat(timespec="seconds")
    for line in describe(parts):
        err.print(f"tick {when} ({entry.schedule.describe()}): {line}", highlight=False)


def _scheduled(engine: Engine) -> int:
    from combined.runtime._scheduler import schedules

    return sum(1 for _ in schedules(engine.project))


@app.command()
def schedule(
    once: Annotated[bool, typer.Option("--once", help="queue what is due now, then stop")] = False,
    project: ProjectOpt = None,
) -> None:
    """Queue a capture at each tick of every `schedule:` (trigger `schedule`).

    Workers (`combined worker`) execute the queued runs: the scheduler never
    reads a source itself. Run as many schedulers over one catalog as you
    like: each tick queues exactly one run, and a dataset whose capture is
    already queued or running joins it. After downtime, each dataset gets
    one catch-up run for its newest missed tick. SIGTERM stops it (143)
    after the round in progress; a second SIGTERM stops it now.
    """
    import signal

    from combined._interrupts import watch
    from combined.errors import CombinedError, ConfigError
    from combined.runtime._scheduler import Scheduler

    stop: list[int] = []
    watch(
        signal.SIGTERM,
        lambda: Terminated(TERMINATED),
        unwind_at=2,
        told=lambda count: stop.append(count),
    )
    engine = _engine(project)
    try:
        count = _scheduled(engine)
        if not count:
            raise ConfigError(
                f"no source or dataset in {engine.project.path} declares a schedule",
                hint="add e.g. `schedule: {interval: 1h}` to a source or a dataset "
                "(docs/schedules.md)",
            )
        err.print(
            f"scheduler started on {engine.catalog.url}: {count} scheduled datasets",
            highlight=False,
        )
        Scheduler(engine).run(lambda: bool(stop), report=_report, once=once)
    except CombinedError as exc:
        _fail(exc)
    finally:
        engine.close()
    if stop:
        err.print("scheduler stopped by SIGTERM", highlight=False)
        raise typer.Exit(TERMINATED)


def in_background(project: Path | None, stop: threading.Event) -> threading.Thread | None:
    """Run the scheduler in a daemon thread until ``stop``; None when nothing is scheduled.

    It has its own engine (and catalog connections). An error is told and
    retried a minute later: a catalog that is briefly unreachable must not
    end scheduling for the life of the server.
    """
    from combined.errors import CombinedError, redact
    from combined.runtime._scheduler import Scheduler

    engine = _engine(project)
    watched = engine.project.notifications or any(
        d.freshness for _, _, d in engine.project.datasets()
    )
    if not _scheduled(engine) and not watched:
        engine.close()
        return None

    scheduler = Scheduler(engine)  # (one: it knows which project file it last read)

    def loop() -> None:
        try:
            while not stop.is_set():
                try:
                    scheduler.run(stop.is_set, report=_report)
                except Exception as exc:
                    message = exc.message if isinstance(exc, CombinedError) else redact(repr(exc))
                    err.print(f"scheduler: {message}; trying again in a minute", highlight=False)
                    stop.wait(60)
        finally:
            engine.close()

    thread = threading.Thread(target=loop, name="combined-scheduler", daemon=True)
    thread.start()
    err.print("scheduler started", highlight=False)
    return thread
