"""``combined publications``: what was published; ``--json``, the map for outside readers."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from combined.cli import ProjectOpt, _instant_text, _session, app, console


@app.command()
def publications(
    dataset: Annotated[
        str | None, typer.Argument(help="SOURCE.DATASET: only that dataset's Delta versions")
    ] = None,
    limit: Annotated[int, typer.Option(help="how many")] = 20,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="print publication -> dataset -> Delta version and table URI"),
    ] = False,
    project: ProjectOpt = None,
) -> None:
    """List publications and their members (newest first).

    `--json` prints, per publication, each dataset of its basis with the
    Delta version to read and the table's URI (docs/readers.md). A table's
    Delta head may be ahead of the newest publication.
    """
    if as_json or dataset is not None:
        with _session(project) as engine:
            mapping = engine.publication_map(limit, dataset)
        if as_json:
            sys.stdout.write(json.dumps(mapping) + "\n")
            return
        t = Table("publication", "published", "dataset", "delta version", "table")
        for p in mapping:
            for name, m in p["datasets"].items():
                t.add_row(
                    p["publication"],
                    p["published_at"],
                    name,
                    str(m["delta_version"]),
                    m["table_uri"],
                )
        console.print(t)
        return
    with _session(project) as engine:
        rows = engine.publications(limit)
    t = Table("publication", "published", "run", "members")
    for p in rows:
        members = ", ".join(
            f"{m['source']}.{m['dataset']}@{m['lake_version']}" + ("*" if m["changed"] else "")
            for m in p["member_rows"]
        )
        # The exact instant, as --as-of takes it: a publication made within
        # the second a shorter form shows would lie after that form's instant.
        t.add_row(p["id"], _instant_text(p["published_at"]), p["run_id"] or "-", members)
    console.print(t)
