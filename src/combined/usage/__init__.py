"""MAR: distinct stable identities with a committed change, per calendar month.

The month's identity set lives in the lake (one Delta table per dataset under
``_usage/``), merged with set semantics: inserting an identity that is already
there changes nothing, so a retried, duplicated or re-projected commit can
never bill twice. Counts are read back from that table.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from combined.lake import LakeLayout


def record_usage(
    layout: LakeLayout, source: str, dataset: str, changes_file: Path, *, month: str
) -> dict[str, dict[str, int]]:
    """Merge a transition's (id, op) set into the month's identities; return the month's counts."""
    from deltalake import DeltaTable, write_deltalake

    changes = pq.read_table(str(changes_file))
    table = pa.table(
        {
            "month": pa.array([month] * changes.num_rows, pa.string()),
            "_combined_id": changes.column("_combined_id").cast(pa.string()),
            "op": changes.column("op").cast(pa.string()),
        }
    )
    path = layout.usage(source, dataset)
    if not DeltaTable.is_deltatable(str(path)):
        write_deltalake(
            str(path),
            table.slice(0, 0),
            configuration={"delta.enableDeletionVectors": "false"},
        )
    if table.num_rows:
        (
            DeltaTable(str(path))
            .merge(
                source=table,
                predicate="t.month = s.month AND t._combined_id = s._combined_id AND t.op = s.op",
                source_alias="s",
                target_alias="t",
            )
            .when_not_matched_insert_all()
            .execute()
        )
    return {month: month_counts(layout, source, dataset, month)}


def month_counts(layout: LakeLayout, source: str, dataset: str, month: str) -> dict[str, int]:
    """MAR and its per-operation breakdown for one dataset and month."""
    import duckdb
    from deltalake import DeltaTable

    path = layout.usage(source, dataset)
    if not DeltaTable.is_deltatable(str(path)):
        return {"mar": 0, "inserts": 0, "updates": 0, "deletes": 0}
    files = DeltaTable(str(path)).file_uris()
    if not files:
        return {"mar": 0, "inserts": 0, "updates": 0, "deletes": 0}
    con = duckdb.connect()
    try:
        row = con.execute(
            "SELECT count(DISTINCT _combined_id), "
            "count(DISTINCT _combined_id) FILTER (WHERE op = 'insert'), "
            "count(DISTINCT _combined_id) FILTER (WHERE op = 'update'), "
            "count(DISTINCT _combined_id) FILTER (WHERE op = 'delete') "
            "FROM read_parquet(?) WHERE month = ?",
            [files, month],
        ).fetchall()[0]
    finally:
        con.close()
    return {"mar": row[0], "inserts": row[1], "updates": row[2], "deletes": row[3]}
