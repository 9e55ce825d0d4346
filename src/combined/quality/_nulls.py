"""Nulls the lake holds where the source has values: values a change stream missed.

A change stream's reconciliation has no source count taken at its
position, so counts alone pass a capture whose rows lack a value the
source gave them without a change (``ALTER TABLE ... ADD COLUMN ... NOT
NULL DEFAULT``, before the fill that now reads them). A null in a column
the source declares NOT NULL is such a value, whenever the lake holds it:
the capture's source side is then a ``mismatch`` (alerted), naming the
columns and how many rows.

A column the stream filled (:mod:`combined.connectors.postgres._fill`) is
checked whether or not it is NOT NULL: its nulls in the lake are compared
with the source's, counted in a snapshot that holds the same transactions
as the lake's commit (:func:`filled_check`). An event stream's added
column is not filled: :func:`record_unfilled` says so, with the rows that
hold a value no event carries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from combined.catalog import data as cat
from combined.quality._reconcile import Reconciliation

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from combined.lake import LakeTable

__all__ = ["filled_check", "lake_nulls", "null_check", "record_unfilled"]


def lake_nulls(
    table: LakeTable,
    version: int,
    files: Sequence[str],
    columns: Sequence[str],
    *,
    absent: bool = False,
) -> dict[str, int]:
    """Rows holding null in each of ``columns`` the table has (absent columns are left out,
    or with ``absent`` counted as null in every row: a filled column must be there).

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
    return out | _scanned_nulls(table, files, scan, absent)


def _scanned_nulls(
    table: LakeTable, files: Sequence[str], columns: Sequence[str], absent: bool
) -> dict[str, int]:

    from combined.protocol.identity import quote_ident

    if not files or not columns:
        return {}
    with table.store.duck() as con:
        source = table.store.duck_source(con, files)
        held = {str(r[0]) for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        wanted = [c for c in columns if c in held or absent]
        if not wanted:
            return {}
        counts = ", ".join(
            f"count(*) FILTER (WHERE {quote_ident(c)} IS NULL)" if c in held else "count(*)"
            for c in wanted
        )
        row = con.execute(f"SELECT {counts} FROM {source}").fetchall()[0]
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


def filled_check(
    result: Reconciliation, table: LakeTable, version: int | None, filled: Mapping[str, int] | None
) -> Reconciliation:
    """``result`` with the filled columns' nulls, a source mismatch where lake and source differ."""
    if not filled or version is None:
        return result
    held = lake_nulls(table, version, table.files(version), list(filled), absent=True)
    counts = {c: {"source": n, "lake": held.get(c, 0)} for c, n in filled.items()}
    differ = any(v["source"] != v["lake"] for v in counts.values())
    return dataclasses.replace(
        result,
        filled_nulls=counts,
        source_status="mismatch" if differ else result.source_status,
    )


def record_unfilled(
    conn: Connection, unfilled: Mapping[str, int], *, source: str, dataset: str, run_id: str
) -> None:
    """Emit ``alert.column_not_filled``: an event stream's added columns left without values."""
    listed = ", ".join(f"{c} ({n} rows)" for c, n in unfilled.items())
    body = {
        "columns": dict(unfilled),
        "message": f"{source}.{dataset} is an event stream (sync_mode: append): the column(s) "
        f"{listed} were added with a value on rows no event since then changed, and no event "
        "records it: an append dataset keeps the events the source sent, and a value the "
        "source gave without a change is not one",
        "remedy": "read the rows' current values from an incremental dataset of the same "
        "table (sync_mode: incremental), which fills them",
    }
    cat.emit(conn, "alert.column_not_filled", source=source, dataset=dataset, run_id=run_id, **body)
