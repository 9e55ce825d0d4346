"""``combined explain``: every version of one row, with its evidence (docs/explain.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from combined.cli import ProjectOpt, _session, _when, app, console

if TYPE_CHECKING:
    from combined.evidence import RowVersion


def _values(v: RowVersion) -> str:
    return json.dumps(v.values, default=str, ensure_ascii=False) if v.values else "-"


def _version_lines(n: int, v: RowVersion) -> list[str]:
    """One version as a few labelled lines: a table this wide would fold every cell."""
    delivery = f"{v.delivery_sequence}:{v.delivery_id}" if v.delivery_id else "-"
    published = (
        f"{v.publication} at {_when(v.published_at)}" if v.publication else "not published yet"
    )
    return [
        f"{n}. {v.op}  run {v.run_id}  delivery {delivery}  lake version {v.lake_version}",
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
        list[str] | None, typer.Argument(help="the key's values, in the key's column order")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the whole explanation as JSON")] = False,
    project: ProjectOpt = None,
) -> None:
    """Every version of one row across dataset versions and publications, read from the
    raw layer; and, for a key not in the projection, why."""
    with _session(project) as engine:
        found = engine.explain(dataset, key or [])
    if as_json:
        typer.echo(json.dumps(found.to_json()))
        return
    shown = ", ".join(f"{k}={v}" for k, v in found.key.items())
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
