"""Which Delta version each dataset is at, per publication: the map for outside readers.

A reader outside Combined (Polars, DuckDB, deltalake, dbt-duckdb, Spark)
reads a Delta table at a version; a publication says which version of each
dataset it holds. The table's head may be ahead of the newest publication (a
capture committed and not yet published, or never published because its
reconciliation failed): read the version a publication names, never the
head, to see only what Combined published. See ``docs/readers.md``.
"""

from __future__ import annotations

from typing import Any

from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.lake import LakeLayout
from combined.lake._history import history_table, history_version
from combined.lake._maintain import reading_version


def publication_map(
    catalog: Catalog, layout: LakeLayout, limit: int, dataset: str | None = None
) -> list[dict[str, Any]]:
    """The newest ``limit`` publications, each with its basis: dataset -> Delta version and URI.

    ``dataset`` (``SOURCE.DATASET``) keeps that dataset alone, and only the
    publications whose basis holds it.
    """
    with catalog.begin() as conn:
        pubs = cat.list_publications(conn, limit)
        bases = {p.id: cat.published_basis(conn, p.seq) for p in pubs}
    out = []
    for p in pubs:
        members = {}
        for m in bases[p.id]:
            name = f"{m.source}.{m.dataset}"
            if m.lake_version is None or (dataset is not None and name != dataset):
                continue
            table = layout.reading_table(m.source, m.dataset)
            members[name] = {
                "delta_version": m.lake_version,
                "table_uri": table.path,
                # The same rows in fewer files once a compaction followed it.
                "read_version": reading_version(table, m.lake_version, reading=True),
                "dataset_version": m.dataset_version,
                "changed": m.changed,
            }
            history = history_version(layout, m.source, m.dataset, m.lake_version)
            if history is not None:  # ``history: true``: its versions as of this publication
                members[name]["history"] = {
                    "delta_version": history,
                    "table_uri": layout.history(m.source, m.dataset),
                    "read_version": reading_version(
                        history_table(layout, m.source, m.dataset), history
                    ),
                }
        if dataset is None or members:
            out.append(
                {
                    "publication": p.id,
                    "seq": p.seq,
                    "published_at": p.published_at.isoformat(),
                    "run_id": p.run_id,
                    "datasets": members,
                }
            )
    return out
