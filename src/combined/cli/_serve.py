"""The long-running commands: ``combined worker`` and ``combined serve``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from combined.cli import (
    INTERRUPTED,
    TERMINATED,
    ProjectOpt,
    Terminated,
    _dataset_line,
    _engine,
    _fail,
    _state,
    app,
    err,
)
from combined.cli._recycle import RECYCLE_MB, RecycleOpt, Recycler
from combined.cli._reporting import ACTIVE, Tracking, say_interrupted
from combined.cli._schedule import in_background

if TYPE_CHECKING:
    from fastapi import FastAPI

    from combined.catalog import Run

#: Hosts ``--insecure-no-auth`` accepts: only this machine can reach them.
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class _Log(Tracking):
    """A reporter for a long-running process: one line per event, no progress bars."""

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        super().run_started(run_id, source, datasets)
        err.print(f"run {run_id}: capturing {source} ({', '.join(datasets)})", highlight=False)

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        """Too many lines for a log: the Run's end says what it read."""

    def phase(self, dataset: str, phase: str) -> None:
        """Too many lines for a log."""

    def note(self, message: str) -> None:
        err.print(Text(message), highlight=False)


@app.command()
def worker(
    once: Annotated[
        bool, typer.Option("--once", help="stop when the queue is empty instead of waiting")
    ] = False,
    poll: Annotated[
        float, typer.Option("--poll", help="seconds between looks at an empty queue")
    ] = 2.0,
    max_runs: Annotated[
        int | None, typer.Option("--max-runs", help="stop after executing N runs")
    ] = None,
    schedule: Annotated[
        bool, typer.Option("--schedule", help="also queue the captures schedules make due")
    ] = False,
    recycle_mb: RecycleOpt = RECYCLE_MB,
    project: ProjectOpt = None,
) -> None:
    """Execute queued runs, one at a time, as `combined capture` executes its own.

    Start as many workers as you like, on as many machines as share the
    catalog: each queued run is executed by exactly one. SIGTERM stops the
    worker after its current run (exit status 143); a second SIGTERM stops
    the run too, as it stops `combined capture`, even while the run waits on
    its source's statement (canceled on the server). A worker that has grown by
    `--recycle-mb` starts itself again between two runs, under the same
    process id: the Delta library keeps a few KB of every table it opens.
    """
    from combined.errors import CombinedError

    stop = _stop_on_sigterm()
    grown, done, recycle = Recycler(recycle_mb), 0, False
    engine = _engine(project, _Log())
    scheduling = threading.Event()
    if schedule:
        in_background(project, scheduling)
    try:
        err.print(f"worker started on {engine.catalog.url}", highlight=False)
        for run in engine.work(lambda: bool(stop), poll_s=poll, once=once, max_runs=max_runs):
            done += 1
            err.print(_run_line(run), highlight=False)
            if run.error:
                err.print(f"  {run.error}", highlight=False)
            if not stop and grown.due():
                recycle = max_runs is None or done < max_runs
                break
    except CombinedError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        say_interrupted("SIGINT")  # (naming the Run it stopped, as `capture` does)
        raise typer.Exit(INTERRUPTED) from None
    finally:
        scheduling.set()
        engine.close()
    if stop:
        err.print("worker stopped by SIGTERM", highlight=False)
        raise typer.Exit(TERMINATED)
    if recycle:
        grown.start_again("worker", "--max-runs", None if max_runs is None else max_runs - done)


def _stop_on_sigterm() -> list[int]:
    """Catch SIGTERM: the first is noted in the list returned, a second one unwinds the Run.

    Each is told as it arrives, while the Run may be blocked in its source's
    statement: the second stops the Run's reads for the unwinding.
    """
    import signal

    from combined._interrupts import watch

    stop: list[int] = []

    def told(count: int) -> None:
        if count == 1:
            stop.append(signal.SIGTERM)
            err.print(
                "SIGTERM: finishing the current Run, then stopping; send SIGTERM again to "
                "stop it now"
                if ACTIVE
                else "SIGTERM: stopping",
                highlight=False,
            )
        elif count == 2 and ACTIVE:
            # Unwound as `capture` is (leases released, the Run closed by the next repair).
            err.print("SIGTERM again: stopping the current Run now", highlight=False)

    watch(signal.SIGTERM, lambda: Terminated(TERMINATED), unwind_at=2, told=told)
    return stop


def _run_line(run: Run) -> Text:
    """The log line of an executed run: its state and each dataset's numbers."""
    line = Text.assemble(f"run {run.id} ", _state(run.state))
    for ds, s in (run.stats or {}).items():
        line.append(_dataset_line(run.source, ds, s, deliveries=False))
    return line


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="the address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the port to listen on (0: any free port)")] = 8000,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="serve without COMBINED_API_TOKEN (only on a loopback address)",
        ),
    ] = False,
    no_schedule: Annotated[
        bool, typer.Option("--no-schedule", help="do not run the scheduler in this process")
    ] = False,
    project: ProjectOpt = None,
) -> None:
    """Serve the HTTP API, webhooks and the web console at / (captures queue for `combined worker`).

    The scheduler runs in the server too (unless --no-schedule): it queues
    the captures `schedule:` makes due, as `combined schedule` does.

    Every endpoint but /health takes `Authorization: Bearer $COMBINED_API_TOKEN`;
    webhooks are verified by their provider's signature instead, and the
    console's pages by a session its login opens with the same token. Serving never
    reads a source by itself: captures wait in the queue for a worker.
    """
    from combined.errors import ConfigError

    if insecure_no_auth and host not in LOOPBACK:
        _fail(
            ConfigError(
                f"--insecure-no-auth serves anyone who can reach {host}",
                hint="bind to 127.0.0.1, or set COMBINED_API_TOKEN and drop --insecure-no-auth",
            )
        )
    application = _application(project, insecure_no_auth)
    import uvicorn

    from combined._logging import current_format

    scheduling = threading.Event()
    if not no_schedule:
        in_background(project, scheduling)
    # JSON logs: uvicorn's own records go through the redacting JSON handler too.
    from uvicorn.config import LOGGING_CONFIG

    logs = LOGGING_CONFIG if current_format() == "text" else None
    try:
        uvicorn.run(
            application, host=host, port=port, log_level="info", access_log=True, log_config=logs
        )
    finally:
        scheduling.set()


def _application(project: Path | None, insecure_no_auth: bool) -> FastAPI:
    """The API application over ``project``, its logging configured as the project says."""
    import os

    from combined.errors import CombinedError

    try:
        from combined._logging import configure
        from combined.api import create_app

        application = create_app(
            project,
            token=os.environ.get("COMBINED_API_TOKEN") or None,
            allow_no_auth=insecure_no_auth,
        )
        settings = application.state.engine.project.logging
        configure(settings.format, settings.level, explicit=False)
    except CombinedError as exc:
        _fail(exc)
    return application
