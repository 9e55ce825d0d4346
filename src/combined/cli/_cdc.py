"""``combined cdc``: set up, inspect, follow and tear down change capture (PostgreSQL, MariaDB)."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from combined.cli import (
    INTERRUPTED,
    ProjectOpt,
    _engine,
    _exit_for,
    _fail,
    _progress,
    _red,
    _session,
    _when,
    cdc_app,
    console,
    err,
)
from combined.cli._output import print_table, table
from combined.cli._recycle import RECYCLE_MB, RecycleOpt, Recycler

#: The environment variable a follower started afresh in place reads what it carries on from.
_CARRIED = "COMBINED_FOLLOW_CARRIED"


@cdc_app.command("setup")
def cdc_setup(
    source: Annotated[str, typer.Argument(help="the source whose cdc datasets to set up")],
    project: ProjectOpt = None,
) -> None:
    """Anchor each cdc dataset's stream and take its first snapshot inside it.

    PostgreSQL: the first capture of each cdc dataset creates its publication and
    replication slot, takes the slot's exported snapshot, records the slot's
    consistent LSN and reads the table inside that snapshot; later captures
    stream from that LSN. MariaDB/MySQL: the first capture checks the binlog
    settings, records the binlog position of a consistent snapshot and reads the
    table inside it; later captures read the binlog from that position.
    """
    from combined import cdc

    with _session(project, _progress()) as engine:
        notes, run = cdc.setup(engine, source)
    for note in notes:
        console.print(note)
    console.print(f"initial capture: run {run.id} {run.state}")
    if run.error:
        err.print(f"  {run.error}", highlight=False)
    _exit_for([run.state])


@cdc_app.command("status")
def cdc_status(
    source: Annotated[str, typer.Argument(help="the source")], project: ProjectOpt = None
) -> None:
    """Each cdc dataset's stream: committed position, lag, what the server still retains.

    PostgreSQL: the slot's confirmed LSN, lag in bytes and time, WAL status.
    MariaDB/MySQL: the committed binlog position, the server's current and oldest
    binlog, the retention and how long the consumer may stay down. A dataset whose
    captures are refused until a new snapshot is told on standard error; so is a server
    that cannot stream at all (PostgreSQL: wal_level not logical), and the exit is 2.
    A PostgreSQL slot named with the source's slot_prefix that no declared dataset owns
    (a dataset removed from the project), and that no other project marked its own, is
    told on standard error, with the statements that drop it; it is never dropped.
    """
    from combined import cdc

    with _session(project) as engine:
        rows = cdc.status(engine, source)
        left = cdc.undeclared(engine, source)
    if rows and "slot" not in rows[0]:
        _binlog_status(rows)
        _held(rows)
        return
    t = table("dataset", "slot", "exists", "committed", "confirmed", "lag bytes", "lag s", "wal")
    for r in rows:
        t.add_row(
            r["dataset"],
            r["slot"],
            "yes" if r.get("exists") else _red("no"),
            str(r.get("committed_lsn") or "-"),
            str(r.get("confirmed_flush_lsn") or "-"),
            str(r.get("lag_bytes") if r.get("lag_bytes") is not None else "-"),
            str(r.get("lag_seconds") if r.get("lag_seconds") is not None else "-"),
            str(r.get("wal_status") or "-"),
        )
    print_table(t)
    _held(rows)
    for r in left:
        _undeclared(r)
    _refused(rows)


def _refused(rows: list[dict[str, Any]]) -> None:
    """Tell what stops the datasets' streams on this server (a PostgreSQL ``wal_level``
    other than ``logical``), as `combined check` does, and exit 2: their slots showed
    as missing, exit 0, and why none could exist went unsaid."""
    told: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        refused = r.get("refused")
        if refused:
            told.setdefault((refused["error"], refused["hint"]), []).append(r["dataset"])
    for (error, hint), datasets in told.items():
        err.print(f"{', '.join(datasets)}: {error}\n  hint: {hint}", highlight=False)
    if told:
        raise typer.Exit(2)


def _held(rows: list[dict[str, Any]]) -> None:
    """Tell each dataset whose captures are refused until a new snapshot, and why."""
    for r in rows:
        held = r.get("held")
        if held:
            err.print(
                f"{r['dataset']}: every capture is refused until a new snapshot (found by run "
                f"{held.get('run_id')} on {held.get('at')}): {held.get('error')}\n"
                f"  hint: {held.get('hint')}",
                highlight=False,
            )


def _undeclared(r: dict[str, Any]) -> None:
    """Tell a slot named with the source's prefix that no declared dataset owns."""
    held = r.get("retained_bytes")
    keeps = "" if held is None else f", holding back {held} bytes of WAL"
    err.print(
        f"slot {r['slot']} is named with this source's slot_prefix but no declared dataset "
        f"owns it ({'active' if r.get('active') else 'inactive'}{keeps}): a dataset removed "
        "from the project leaves its slot, and the server keeps its WAL until it is dropped. "
        "If no project uses it, drop it: "
        f"SELECT pg_drop_replication_slot('{r['slot']}'); DROP PUBLICATION IF EXISTS "
        f"{r['slot']};",
        highlight=False,
    )


def _binlog_status(rows: list[dict[str, Any]]) -> None:
    """A binlog source's rows: positions, the server's retention, how long to stay down."""

    def text(value: Any) -> str:
        return "-" if value is None else str(value)

    t = table(
        "dataset", "committed", "server at", "oldest binlog", "retention s", "may stay down s"
    )
    for r in rows:
        retention = r.get("retention_seconds")
        down = r.get("may_stay_down_seconds")
        t.add_row(
            r["dataset"],
            text(r.get("committed_position")),
            text(r.get("current_position")),
            text(r.get("oldest_binlog")),
            "kept for ever" if retention is None else str(retention),
            _red("0: take a new snapshot") if down == 0 else text(down),
        )
    print_table(t)


@cdc_app.command("teardown")
def cdc_teardown(
    source: Annotated[str, typer.Argument(help="the source")],
    yes: Annotated[bool, typer.Option("--yes", help="do not ask before dropping")] = False,
    project: ProjectOpt = None,
) -> None:
    """Void the cdc datasets' checkpoints and drop what the server keeps for them.

    PostgreSQL: the replication slots and publications are dropped, and the server
    stops retaining WAL for them; another project's (their publication's mark), or
    ones not provably this project's, are refused and left alone. MariaDB/MySQL:
    nothing is kept on the server; the binlog position is voided. The lake keeps
    every row; the next capture takes a new snapshot and reconciles it with the lake.
    """
    from combined import cdc

    with _session(project) as engine:
        names = cdc.cdc_datasets(engine, source)
        if not yes:
            listing = ", ".join(f"{source}.{n}" for n, _ in names)
            if not sys.stdin.isatty() or not typer.confirm(
                f"drop the replication slots and publications of {listing}?", default=False
            ):
                err.print("nothing dropped (pass --yes to drop without asking)")
                raise typer.Exit(1)
        notes = cdc.teardown(engine, source)
    for note in notes:
        console.print(note)


@cdc_app.command("follow")
def cdc_follow(
    source: Annotated[str, typer.Argument(help="the source")],
    every: Annotated[float, typer.Option(help="publish at least every N seconds")] = 5.0,
    max_changes: Annotated[
        int | None, typer.Option(help="publish as soon as M changes were read")
    ] = None,
    iterations: Annotated[int | None, typer.Option(help="stop after N captures")] = None,
    recycle_mb: RecycleOpt = RECYCLE_MB,
    project: ProjectOpt = None,
) -> None:
    """Capture the change stream continuously, publishing every N seconds or M changes.

    Grown by `--recycle-mb`, it starts afresh in place between two captures
    (the same process id, `--iterations` counting on): the Delta library keeps
    a few KB of every table it opens.
    """
    from combined import cdc
    from combined.errors import CombinedError

    grown, captures, recycle = Recycler(recycle_mb), 0, False
    # What a follower started afresh in place (--recycle-mb) carries on: the states of the
    # Runs that did not succeed (its exit at the end of --iterations), its failures in a row.
    carried = json.loads(os.environ.pop(_CARRIED, "") or "{}")
    ended: list[str] = list(carried.get("ended", []))  # the states of Runs that did not succeed
    streak = int(carried.get("failed", 0))

    def recycling() -> bool:  # (asked after each capture)
        nonlocal captures, recycle
        captures += 1
        recycle = grown.due() and (iterations is None or captures < iterations)
        return recycle

    engine = _engine(project)
    try:
        for run in cdc.follow(
            engine,
            source,
            every=every,
            max_changes=max_changes,
            iterations=iterations,
            stop=recycling,
            failed=streak,
            waiting=lambda pause, failed: err.print(
                f"  {failed} capture{'s' if failed > 1 else ''} in a row failed: "
                f"the next starts {pause:.0f} s after the last began",
                highlight=False,
            ),
        ):
            changes = sum(
                s["inserts"] + s["updates"] + s["deletes"] for s in (run.stats or {}).values()
            )
            console.print(f"{_when(run.ended_at)} run {run.id} {run.state}: {changes} changes")
            streak = streak + 1 if run.state == "failed" else 0
            if run.state != "succeeded":
                if run.error:
                    err.print(f"  {run.error}", highlight=False)
                ended.append(run.state)
                if run.state in ("needs_review", "needs_auth"):
                    _exit_for([run.state])  # a person must act: following on fails the same
                # Failed (an outage, a lease another capture held) or canceled: the loop
                # goes on with its next Run (it ended for good on the first one).
    except CombinedError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        from combined.cli._reporting import say_interrupted

        say_interrupted("SIGINT")
        raise typer.Exit(INTERRUPTED) from None
    finally:
        engine.close()
    if recycle:
        left = None if iterations is None else iterations - captures
        os.environ[_CARRIED] = json.dumps({"ended": ended, "failed": streak})
        grown.start_again("cdc follow", "--iterations", left)
    _exit_for(ended)  # (a loop of --iterations ends saying whether a Run failed)
