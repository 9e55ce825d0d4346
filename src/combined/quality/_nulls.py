"""Nulls the lake holds in columns the source declares NOT NULL: values a change stream missed.

A change stream's reconciliation has no source count taken at its
position, so counts alone pass a capture whose rows lack a value the
source gave them without a change (``ALTER TABLE ... ADD COLUMN ... NOT
NULL DEFAULT``, before the fill that now reads them). A null in a column
the source declares NOT NULL is such a value, whenever the lake holds it:
the capture's source side is then a ``mismatch`` (alerted), naming the
columns and how many rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from combined.quality._reconcile import Reconciliation

if TYPE_CHECKING:
    from combined.lake import LakeTable

__all__ = ["lake_nulls", "null_check"]


def lake_nulls(
    table: LakeTable, version: int, files: Sequence[str], columns: Sequence[str]
) -> dict[str, int]:
    """Rows holding null in each of ``columns`` the table has (absent columns are left out).

    Counted from the Delta log's per-file null counts, no data read, where
    every file has them; a column some file has none for (written before the
    column existed, or past the columns delta-rs keeps statistics of) is
    counted by reading ``files``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    options = table.store.storage_options()
    dt = DeltaTable(str(table.path), version=version, storage_options=options)
    actions = pa.table(dt.get_add_actions(flatten=True))
    out: dict[str, int] = {}
    scan: list[str] = []
    for c in columns:
        stat = f"null_count.{c}"
        if stat not in actions.column_names or actions.column(stat).null_count:
            scan.append(c)
        elif n := int(pc.sum(actions.column(stat)).as_py() or 0):
            out[c] = n
    return out | _scanned_nulls(table, files, scan)


def _scanned_nulls(
    table: LakeTable, files: Sequence[str], columns: Sequence[str]
) -> dict[str, int]:
    import duckdb

    from combined.protocol.identity import quote_ident

    if not files or not columns:
        return {}
    con = duckdb.connect()
    try:
        source = table.store.duck_source(con, files)
        held = {str(r[0]) for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        wanted = [c for c in columns if c in held]
        if not wanted:
            return {}
        counts = ", ".join(f"count(*) FILTER (WHERE {quote_ident(c)} IS NULL)" for c in wanted)
        row = con.execute(f"SELECT {counts} FROM {source}").fetchall()[0]
    finally:
        con.close()
    return {c: int(n) for c, n in zip(wanted, row, strict=True) if n}


def null_check(
    result: Reconciliation, table: LakeTable, version: int | None, not_null: Sequence[str]
) -> Reconciliation:
    """``result``, a source mismatch when the lake holds nulls the source cannot have."""
    if not not_null or version is None:
        return result
    nulls = lake_nulls(table, version, table.files(version), not_null)
    if not nulls:
        return result
    return dataclasses.replace(result, source_status="mismatch", not_null_violations=nulls)
