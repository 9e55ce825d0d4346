"""``combined quarantine``: review held records, and decide on them (recorded)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from combined.cli import ProjectOpt, _cell, _red, _session, _when, console, quarantine_app
from combined.cli._output import FormatOpt, check_format, emit_records, print_table, table

_FIELDS = (
    "id",
    "source",
    "dataset",
    "run_id",
    "reason",
    "record_count",
    "reader",
    "review_due_at",
    "overdue",
    "created_at",
    "decision",
    "decided_by",
    "decided_at",
)


@quarantine_app.command("list")
def quarantine_list(
    source: Annotated[str | None, typer.Option(help="only this source")] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="also the entries already released or discarded")
    ] = False,
    fmt: FormatOpt = "table",
    project: ProjectOpt = None,
) -> None:
    """Quarantine entries awaiting review (or every one), newest first."""
    check_format(fmt)
    with _session(project) as engine:
        rows = engine.quarantine(source, include_decided=all_)
    if emit_records(fmt, [{k: q.get(k) for k in _FIELDS} for q in rows], header=_FIELDS):
        return
    t = table("id", "dataset", "reason", "records", "reader", "review due", "decision")
    for q in rows:
        due: str | Text = _when(q["review_due_at"])
        if q["overdue"]:
            due = _red(f"{due} (overdue)")
        decision = (
            f"{q['decision']} by {q['decided_by']} {_when(q['decided_at'])}"
            if q["decision"]
            else "-"
        )
        t.add_row(
            q["id"],
            f"{q['source']}.{q['dataset']}",
            q["reason"],
            str(q["record_count"]),
            q["reader"],
            due,
            decision,
        )
    print_table(t)
    if not rows:
        console.print("nothing awaits review" if not all_ else "nothing was ever quarantined")


@quarantine_app.command("show")
def quarantine_show(
    quarantine_id: Annotated[str, typer.Argument(help="the entry's id (see `quarantine list`)")],
    limit: Annotated[int, typer.Option(help="records to print; 0 prints every one")] = 20,
    project: ProjectOpt = None,
) -> None:
    """One quarantine entry and its records."""
    with _session(project) as engine:
        q, records = engine.quarantine_records(quarantine_id, limit)
    console.print(
        f"quarantine {q['id']}  {q['source']}.{q['dataset']}  run {q['run_id']}  "
        f"{q['record_count']} records: {q['reason']}"
    )
    console.print(
        f"  reader {q['reader']}  review due {_when(q['review_due_at'])}  "
        + (
            f"{q['decision']} by {q['decided_by']} at {_when(q['decided_at'])}"
            if q["decision"]
            else "awaiting a decision"
        )
    )
    console.print(f"  file {q['path']}")
    t = table(*records.column_names)
    from combined._pyrows import python_rows

    for row in python_rows(records):
        t.add_row(*("null" if v is None else _cell(v) for v in row.values()))  # bytes as hex
    print_table(t)
    if records.num_rows < q["record_count"]:
        console.print(f"first {records.num_rows} of {q['record_count']} records (--limit 0: all)")


def _reviewer(by: str | None) -> str:
    if by is not None:
        return by
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid: the decision needs one
        return ""


ReasonOpt = Annotated[str, typer.Option("--reason", help="why: recorded with the decision")]
ByOpt = Annotated[str | None, typer.Option("--by", help="who decides (default: your user name)")]


@quarantine_app.command("release")
def quarantine_release(
    quarantine_id: Annotated[str, typer.Argument(help="the entry's id")],
    reason: ReasonOpt,
    by: ByOpt = None,
    project: ProjectOpt = None,
) -> None:
    """Close an entry's review, keeping its records in quarantine as evidence."""
    _decide(project, quarantine_id, "released", by, reason, "its records are kept")


@quarantine_app.command("discard")
def quarantine_discard(
    quarantine_id: Annotated[str, typer.Argument(help="the entry's id")],
    reason: ReasonOpt,
    by: ByOpt = None,
    project: ProjectOpt = None,
) -> None:
    """Close an entry's review and delete its records (the decision is recorded first)."""
    _decide(project, quarantine_id, "discarded", by, reason, "its records are deleted")


def _decide(
    project: Path | None, qid: str, decision: str, by: str | None, reason: str, outcome: str
) -> None:
    with _session(project) as engine:
        q = engine.decide_quarantine(qid, decision, by=_reviewer(by), reason=reason)
    console.print(f"quarantine {q['id']} {decision} by {q['decided_by']}; {outcome}")
