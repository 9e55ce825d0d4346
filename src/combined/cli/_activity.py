"""``combined activity``: the Activity feed; and the events of one Run for ``run show``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import typer
from rich.table import Table
from rich.text import Text

from combined.cli import ProjectOpt, _fail, _session, _when, app, console


def _since(text: str) -> datetime:
    """``--since``: an ISO-8601 instant, or a duration back from now (``1h``, ``2d``)."""
    from combined.config import parse_duration
    from combined.errors import ConfigError
    from combined.protocol import utcnow

    try:
        return utcnow() - parse_duration(text)
    except ValueError:
        pass
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        _fail(
            ConfigError(
                f"--since {text!r} is neither an ISO-8601 instant nor a duration",
                hint="use e.g. 2026-11-29T08:00:00Z, or 2h for the last two hours",
            )
        )
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _body(body: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in body.items())


def events_table(events: Sequence[Mapping[str, Any]], *, runs: bool = True) -> Table:
    """The events as a table, oldest first (the feed is read newest first).

    ``runs``: with a column naming each event's Run (``run show`` leaves it out).
    """
    table = Table()
    table.add_column("at", no_wrap=True)
    table.add_column("kind", overflow="fold")
    table.add_column("dataset", overflow="fold")
    if runs:
        table.add_column("run", overflow="fold")  # folded, never cut
    table.add_column("details", overflow="fold")  # a narrow terminal folds it, cuts nothing
    for e in reversed(events):
        kind = Text(e["kind"], style="red" if str(e["kind"]).startswith("alert") else "")
        where = ".".join(str(p) for p in (e["source"], e["dataset"]) if p) or "-"
        run = [e["run_id"] or "-"] if runs else []
        table.add_row(_when(e["at"]), kind, where, *run, _body(e["body"]))
    return table


@app.command()
def activity(
    dataset: Annotated[
        str | None, typer.Option(help="only events of SOURCE.DATASET (or of SOURCE)")
    ] = None,
    run: Annotated[str | None, typer.Option(help="only events of this run")] = None,
    kind: Annotated[
        str | None, typer.Option(help="only this kind and those below it (alert: alert.*)")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="an ISO-8601 instant, or a duration back from now (2h)")
    ] = None,
    limit: Annotated[int, typer.Option(help="at most this many, the newest")] = 50,
    format: Annotated[
        Literal["table", "json"], typer.Option("--format", help="table, or json (one array)")
    ] = "table",
    project: ProjectOpt = None,
) -> None:
    """Show the Activity feed: what Runs, schedules, reviews and alerts did, newest last."""
    source, _, name = (dataset or "").partition(".")
    after = _since(since) if since is not None else None
    with _session(project) as engine:
        events = engine.activity(
            limit,
            kind=kind,
            run_id=run,
            source=source or None,
            dataset=name or None,
            since=after,
        )
    if format == "json":
        from combined.api._json import jsonable

        typer.echo(json.dumps(jsonable(events)))
        return
    from combined.cli._output import print_table

    print_table(events_table(events))


@app.command()
def alerts(
    slots: Annotated[
        bool, typer.Option("--slots/--no-slots", help="also ask each CDC source for its stream")
    ] = True,
    project: ProjectOpt = None,
) -> None:
    """Check freshness targets, overdue reviews and CDC streams now; send pending alerts.

    Each breach is raised once (`combined activity --kind alert` lists them);
    the scheduler checks all but the CDC streams on its own. Waits until the
    alerts are sent (or their attempts spent), so it suits a cron job.
    """
    with _session(project) as engine:
        notes = engine.check_alerts(slots=slots)
        engine.sender.soon()  # (alerts raised before, by a process that ended, too)
        engine.sender.wait()
        told = list(engine.sender.told)  # this process's sends, not another's meanwhile
    sent = [t for t, error in told if error is None]
    failed = [(t, error) for t, error in told if error is not None]
    for note in notes:
        console.print(Text(note), highlight=False)
    if not notes:
        console.print("no new alert")
    if sent or failed:
        console.print(f"{len(sent)} alert(s) sent, {len(failed)} failed")
    for target, error in failed:
        console.print(Text(f"  not sent to {target}: {error}"), highlight=False)
    if failed:
        raise typer.Exit(1)  # (a cron job's mail says so)
