"""``combined explain`` and ``combined replay``: evidence from the raw layer (docs/explain.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from combined._status import RUN_NEEDS_REVIEW
from combined.cli import ProjectOpt, _session, _when, app, console

if TYPE_CHECKING:
    from combined.evidence import Replay, RowVersion


def _values(v: RowVersion) -> str:
    """A version's values as JSON, each as ``--json`` writes it (decimals positional)."""
    from combined.api._json import jsonable

    return json.dumps(jsonable(v.values), ensure_ascii=False) if v.values else "-"


def _version_lines(n: int, v: RowVersion) -> list[str]:
    """One version as a few labelled lines: a table this wide would fold every cell."""
    delivery = f"{v.delivery_sequence}:{v.delivery_id}" if v.delivery_id else "-"
    published = (
        f"{v.publication} at {_when(v.published_at)}" if v.publication else "not published yet"
    )
    op = f"{v.op} (soft-delete flag {v.soft_delete})" if v.soft_delete else v.op
    return [
        f"{n}. {op}  run {v.run_id}  delivery {delivery}  lake version {v.lake_version}",
        f"   observed {_when(v.observed_at)}  accepted {_when(v.accepted_at)}  "
        f"published {published}",
        f"   dataset version {v.dataset_version or '-'}  source position "
        f"{v.source_position or '-'}  payload {v.payload_hash or '-'}",
        f"   receipt {_receipt(v.receipt)}",
        f"   values {_values(v)}",
    ]


def _receipt(receipt: Mapping[str, Any] | None) -> str:
    """The extraction receipt in one line: the read's interval, its clock and snapshot."""
    if not receipt:
        return "-"
    text = (
        f"read {receipt.get('extraction_started_at')} to "
        f"{receipt.get('extraction_completed_at')} ({receipt.get('clock_authority')})"
    )
    if receipt.get("snapshot_acquired_at"):
        text += f", snapshot at {receipt['snapshot_acquired_at']}"
    if receipt.get("source_token"):
        text += f", token {receipt['source_token']}"
    return text


@app.command()
def explain(
    dataset: Annotated[str, typer.Argument(help="SOURCE.DATASET")],
    key: Annotated[
        list[str] | None,
        typer.Argument(help="the key's values, in the key's column order (none with --id)"),
    ] = None,
    row_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="the row's _combined_id (32 hex digits, as `combined sql` shows it) "
            "instead of its key: the way to find a row of a dataset without a key",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the whole explanation as JSON")] = False,
    project: ProjectOpt = None,
) -> None:
    """Every version of one row across dataset versions and publications, from the raw layer.

    The row is given by its key values, or by --id; for a row not in the projection,
    the answer also says why."""
    with _session(project) as engine:
        found = engine.explain(dataset, key or [], id=row_id)
    if as_json:
        typer.echo(json.dumps(found.to_json()))
        return
    named = [f"{k}={v}" for k, v in found.key.items()]
    if found.id:
        named.append(f"_combined_id {found.id}")
    shown = ", ".join(named)
    console.print(
        f"{found.dataset} ({shown}): {found.status}: {found.reason}", markup=False, soft_wrap=True
    )
    for n, v in enumerate(found.versions, 1):
        for line in _version_lines(n, v):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    for q in found.quarantined:
        decided = q["decision"] or "awaiting review"
        line = (
            f"quarantine {q['id']} (run {q['run_id']}): {q['reason']}; {decided}; "
            f"{len(q['rows'])} record(s)"
        )
        console.print(line, markup=False, soft_wrap=True)


@app.command()
def replay(
    dataset: Annotated[str, typer.Argument(help="SOURCE.DATASET")],
    to_version: Annotated[
        str | None,
        typer.Option(help="replay up to this lake version, or dataset version id (prefix)"),
    ] = None,
    into: Annotated[
        str | None, typer.Option(help="also write the replay as a new Delta table here")
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="when they differ, write the replay as the table's newest version "
            "(after the comparison is shown; recorded in Activity)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the comparison as JSON")] = False,
    project: ProjectOpt = None,
) -> None:
    """Rebuild a dataset's projection from its raw Deliveries and compare it with the table.

    No source is contacted. The replay is compared row by row with the table; the exit
    status is 3 when they differ (with --replace, once the replay was written)."""
    with _session(project) as engine:
        done = engine.replay(
            dataset,
            to_version=to_version,
            into=into,
            replace=replace,
            compared=None if as_json else _print_replay,
        )
    if as_json:
        typer.echo(json.dumps(done.to_json()))
    elif done.replaced_version is not None:
        console.print(
            f"replaced: lake version {done.replaced_version} of {done.dataset} holds the "
            f"replay (it held lake version {done.lake_version}'s rows); publications keep "
            "the versions they pinned, and the next capture's publication reads this one",
            markup=False,
            soft_wrap=True,
        )
    elif replace:
        console.print("nothing replaced: the table already holds the replay", markup=False)
    if not done.equal:
        raise typer.Exit(RUN_NEEDS_REVIEW)


def _print_replay(done: Replay) -> None:
    """The comparison of a replay with the table, as ``combined replay`` shows it."""
    console.print(
        f"replayed {done.dataset} ({done.sync_mode}) to lake version {done.lake_version} "
        f"from {done.commits} commits and {done.deliveries} Deliveries: "
        f"{done.replayed_rows} rows; the projection holds {done.projection_rows}",
        markup=False,
        soft_wrap=True,
    )
    if done.foreign_versions:
        versions = ", ".join(str(v) for v in done.foreign_versions)
        console.print(
            f"lake versions {versions} were committed outside Combined",
            markup=False,
            soft_wrap=True,
        )
    if done.into:
        console.print(f"written to {done.into}", markup=False, soft_wrap=True)
    if done.equal:
        console.print("equal: every identity and payload hash matches", markup=False)
        return
    console.print(
        f"DIFFERENT: {done.only_in_replay} only in the replay, "
        f"{done.only_in_projection} only in the projection, "
        f"{done.other_payload} with another payload",
        markup=False,
        soft_wrap=True,
    )
    for d in done.differences:
        console.print(f"  {d['kind']}: {d['id']}", markup=False, soft_wrap=True)


@app.command()
def plan(
    source: Annotated[str | None, typer.Argument(help="one source (all when omitted)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the plans as JSON")] = False,
    output: Annotated[
        Path | None, typer.Option(help="write one SOURCE.md per source into this directory")
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Each source's ingestion design, built from evidence.

    Every claim names the query, Run or setting it rests on, and what cannot be supported
    is marked unproven."""
    from combined.evidence import render

    with _session(project) as engine:
        found = engine.plan([source] if source else [])
    if as_json:
        typer.echo(json.dumps([p.to_json() for p in found]))
        return
    if output is None:
        typer.echo("\n".join(render(p) for p in found))
        return
    output.mkdir(parents=True, exist_ok=True)
    for p in found:
        path = output / f"{p.source}.md"
        path.write_text(render(p))
        console.print(f"wrote {path}", markup=False, soft_wrap=True)
