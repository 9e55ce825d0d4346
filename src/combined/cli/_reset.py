"""``combined reset``: forget, by a recorded decision, a lake table the catalog records."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from combined.cli import ProjectOpt, _session, app, console, err
from combined.cli._run import _user


@app.command()
def reset(
    datasets: Annotated[list[str], typer.Argument(help="SOURCE or SOURCE.DATASET")],
    reason: Annotated[str, typer.Option("--reason", help="why: recorded with the reset")],
    drop_table: Annotated[
        bool,
        typer.Option(
            "--drop-table", help="remove the tables the lake still holds of them (recorded)"
        ),
    ] = False,
    by: Annotated[
        str | None, typer.Option("--by", help="who resets (default: your user name)")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask before resetting")] = False,
    project: ProjectOpt = None,
) -> None:
    """Forget a dataset's lake table in the catalog, so that its next capture is a first capture.

    For a table the lake lost (the bucket emptied, the table's directory deleted),
    whose captures are refused until the lake is restored or a reset is recorded;
    or to start a dataset afresh (--drop-table removes its table and history table).
    The decision is recorded in the lake's ledger, the catalog and the activity feed
    (`dataset.reset`: who, when, why, the versions forgotten). The raw layer's
    Deliveries, the quarantine and the MAR table are kept.
    """
    if not yes:
        what = " and remove their tables from the lake" if drop_table else ""
        if not sys.stdin.isatty() or not typer.confirm(
            f"reset {', '.join(datasets)}{what}? their next capture is a first capture",
            default=False,
        ):
            err.print("nothing reset (pass --yes to reset without asking)", highlight=False)
            raise typer.Exit(1)
    with _session(project) as engine:
        reports = engine.reset(datasets, by=by or _user(), reason=reason, drop_table=drop_table)
        streams = {f"{s}.{d}" for s, d, c in engine.project.datasets() if c.strategy == "cdc"}
    for report in reports:
        console.print(_said(report, report["dataset"] in streams), highlight=False)


def _said(report: dict[str, Any], stream: bool) -> str:
    """What a reset did to one dataset, in a line or two."""
    name = report["dataset"]
    if not report["reset"]:
        return f"{name}: nothing to reset ({report['note']})"
    forgot = report["forgotten"]
    version = forgot["lake_version"]
    line = (
        f"{name}: reset; the catalog forgot "
        + (f"lake version {version} of " if version is not None else "")
        + f"its table at {forgot['location']}"
    )
    dropped = [d for d in report["dropped"] if d != forgot["location"]]
    if report["dropped"]:
        line += ", which the reset removed from the lake" + (
            f" with {', '.join(dropped)}" if dropped else ""
        )
    line += (
        "; the raw layer, quarantine and MAR table are kept; its next capture is a first capture"
    )
    if report.get("finished"):
        line += (
            f"\n  (this finished the reset {report['by']} began on {report['finished']}, for "
            f"its reason: {report['reason']})"
        )
    if stream:
        source = name.partition(".")[0]
        line += (
            f"\n  a change stream: `combined cdc teardown {source} --yes` then `combined cdc "
            f"setup {source}` takes its new snapshot"
        )
    return line
