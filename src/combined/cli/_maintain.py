"""``combined maintain``: compaction, vacuum and raw-layer retention (``docs/maintenance.md``)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

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

    What is kept follows `retention:` in combined.yaml (project and dataset
    level); every removal is recorded in the activity feed.
    """
    with _session(project) as engine:
        reports = engine.maintain(datasets or [])
    if as_json:
        sys.stdout.write(json.dumps(reports) + "\n")
        return
    t = table("dataset", "files compacted", "files vacuumed", "raw removed", "usage files")
    for r in reports:
        if "skipped" in r:
            t.add_row(r["dataset"], f"skipped: {r['skipped']}", "", "", "")
            continue
        t.add_row(
            r["dataset"],
            str(r["compacted"]),
            str(r["vacuumed"]),
            str(r["raw_removed"]),
            f"{r['usage_compacted']} compacted, {r['usage_vacuumed']} vacuumed",
        )
    print_table(t)
