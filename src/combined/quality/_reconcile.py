"""Count reconciliation of a committed capture, before it is published.

Three counts are compared:

- the rows the lake table holds at the committed version (from the Delta
  log's per-file record counts: no data is read);
- the row count the dataset version claims (maintained from transitions);
- for a capture of the whole relation, the rows the source returned, read in
  the same snapshot as the capture (the extraction receipt's count).

A delta capture (cursor, change stream) has no source count taken in the
capture's snapshot: its source side is ``not_reconciled``, never "within
tolerance". When the source side of a cursor capture is short of the lake
by rows the cursor could not see deleted, the difference is its
``expected_variance`` (:mod:`~combined.quality._variance`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from combined.lake._store import LakeStore

if TYPE_CHECKING:
    from combined.lake import LakeTable

Status = Literal["reconciled", "mismatch", "not_reconciled", "expected_variance"]


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The outcome of one dataset's reconciliation."""

    dataset: str
    lake_rows: int
    version_rows: int
    source_rows: int | None
    lake_status: Status
    source_status: Status
    #: Rows the lake holds that the source no longer does, where the capture
    #: cannot see deletes (a cursor): a known limit, not a defect.
    expected_variance: int | None = None
    #: Nulls the lake holds per column the source declares NOT NULL.
    not_null_violations: dict[str, int] | None = None
    #: Per column a change stream filled from the source: its nulls in the
    #: source and in the lake at the same position (``{"source": n, "lake": m}``).
    filled_nulls: dict[str, dict[str, int]] | None = None

    @property
    def ok(self) -> bool:
        """Whether no count disagrees."""
        return "mismatch" not in (self.lake_status, self.source_status)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return asdict(self)


def lake_rows(table: LakeTable, version: int) -> int:
    """Rows of a Delta table version, from the log's record counts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    dt = table.delta(version)  # (a pinned view at that version reads its own load)
    if dt is None:
        return 0
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    records = actions.column("num_records")
    if records.null_count:
        # A file whose stats delta-rs could not parse (written before struct
        # columns got no flat null count): its Parquet footer counts its rows.
        return _footer_rows(table, version)
    total = pc.sum(records).as_py()
    return int(total or 0)


def _footer_rows(table: LakeTable, version: int) -> int:
    """Rows of a table version counted from its data files' Parquet footers."""
    files = table.files(version)
    if not files:
        return 0
    with table.store.duck() as con:
        row = con.execute(f"SELECT count(*) FROM {table.store.duck_source(con, files)}").fetchone()
    return int(row[0]) if row else 0


def reconcile(
    dataset: str,
    table: LakeTable,
    lake_version: int | None,
    version_rows: int,
    source_rows: int | None,
) -> Reconciliation:
    """Compare the lake, the dataset version and (when known) the source."""
    held = lake_rows(table, lake_version) if lake_version is not None and table.exists() else 0
    lake_status: Status = "reconciled" if held == version_rows else "mismatch"
    if source_rows is None:
        source_status: Status = "not_reconciled"
    else:
        source_status = "reconciled" if source_rows == held else "mismatch"
    return Reconciliation(
        dataset=dataset,
        lake_rows=held,
        version_rows=version_rows,
        source_rows=source_rows,
        lake_status=lake_status,
        source_status=source_status,
    )


#: The unit roundoff of each floating type DuckDB reports (``typeof``).
_ROUNDOFF = {"DOUBLE": 2.0**-53, "FLOAT": 2.0**-24}


def range_totals(
    files: list[str], where: str | None, sum_column: str | None, store: LakeStore | None = None
) -> tuple[int, str | None, float]:
    """Rows (and the sum of a column) the lake holds inside a range.

    The third value is how far two sums of those values may differ by
    rounding alone: 0 for an exact type (integer, decimal), whose sums are
    equal or not. A float sum depends on the order it adds in, which the
    source's scan (its heap, after a ``CLUSTER`` or ``VACUUM FULL``) and the
    lake's files do not share: each side may be off the exact sum by up to
    ``(n - 1) * u * sum(|v|)`` (u: the type's unit roundoff).
    """

    from combined.protocol.identity import quote_ident

    if not files:
        return 0, None, 0.0
    column = quote_ident(sum_column) if sum_column else "NULL"
    store = store or LakeStore.at(files[0])
    with store.duck() as con:
        row = con.execute(
            f"SELECT count(*), CAST(sum({column}) AS VARCHAR), "
            f"sum(abs(CAST({column} AS DOUBLE))), any_value(typeof({column})) "
            f"FROM {store.duck_source(con, files)}" + (f" WHERE {where}" if where else "")
        ).fetchall()[0]
    rows, total, magnitude, kind = int(row[0]), row[1], row[2], row[3]
    roundoff = _ROUNDOFF.get(str(kind), 0.0) if sum_column else 0.0
    # Both sides round: twice one side's bound, and twice again for the
    # source's text form of its sum.
    tolerance = 4.0 * max(rows - 1, 1) * roundoff * float(magnitude or 0.0)
    return rows, total if sum_column else None, tolerance


def same_sum(a: str | None, b: str | None, tolerance: float = 0.0) -> bool:
    """Whether two sums (as text) are equal, or within ``tolerance``; None equals None."""
    from decimal import Decimal, InvalidOperation

    if a is None or b is None:
        return a is None and b is None
    try:
        gap = abs(Decimal(a) - Decimal(b))
    except InvalidOperation:
        return a == b
    return bool(gap <= Decimal(repr(tolerance))) if tolerance else gap == 0
