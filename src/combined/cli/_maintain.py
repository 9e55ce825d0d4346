"""``combined maintain``: compaction, vacuum and raw-layer retention (``docs/maintenance.md``)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from combined.cli import ProjectOpt, _session, app
from combined.cli._output import print_table, table


@app.command()
def maintain(
    datasets: Annotated[
        list[str] | None, typer.Argument(help="SOURCE or SOURCE.DATASET (all when none)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the reports as JSON")] = False,
    project: ProjectOpt = None,
) -> None:
    """Compact small files, vacuum what no kept publication reads, expire raw Deliveries.

    Files no commit names (a killed writer's orphans) are reported, and removed
    only under `retention.orphans`. What is kept follows `retention:` in
    combined.yaml (project and dataset level); every removal is recorded in the
    activity feed. Exit 1 when a dataset was left unmaintained because the lake commits
    the catalog lacks could not be projected (`combined repair` says why), or because
    the lake's store failed while it was maintained.
    """
    with _session(project) as engine:
        reports = engine.maintain(datasets or [])
    # (a dataset left unmaintained for an error: not a quiet success)
    status = 1 if any(r.get("not_projected") or r.get("failed") for r in reports) else 0
    if as_json:
        sys.stdout.write(json.dumps(reports) + "\n")
        raise typer.Exit(status)
    t = table(
        "dataset", "files compacted", "files vacuumed", "raw removed", "usage files", "orphans"
    )
    for r in reports:
        if "skipped" in r:
            t.add_row(r["dataset"], f"skipped: {r['skipped']}", "", "", "", "")
            continue
        t.add_row(
            r["dataset"],
            str(r["compacted"]),
            str(r["vacuumed"]),
            str(r["raw_removed"]),
            f"{r['usage_compacted']} compacted, {r['usage_vacuumed']} vacuumed",
            _orphans(r.get("orphans")),
        )
    print_table(t)
    for r in reports:
        for note in r.get("projected", []):
            sys.stdout.write(f"{note}\n")
    raise typer.Exit(status)


def _orphans(found: dict[str, Any] | None) -> str:
    """A report's orphans in a few words: removed, or found and the setting that removes them."""
    if not found:
        return ""
    if "not_judged" in found and not found["found"]:
        return "not judged: " + "; ".join(found["not_judged"])
    if found["removed"]:
        of = "" if found["removed"] == found["found"] else f" of {found['found']} found"
        return f"{found['removed']} removed{of}"
    if found["found"]:
        kept = f"kept: {found['setting']} removes them"
        return f"{found['found']} found ({found['bytes']} bytes), {kept}"
    return "none"
