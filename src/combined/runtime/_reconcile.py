"""Reconcile: what the lake holds checked against the dataset version and the source.

Before a capture reads, the table must hold the rows its dataset version
accounts for (:func:`check_lake_untouched`: no other writer changed it).
After its commits, each dataset's landed rows are checked against its
version, the source's count and control totals, and its NOT NULL and filled
columns (:func:`reconcile_run`); a mismatch that blocks leaves the Run
committed but not published.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from combined.catalog import Catalog, Member, Run
from combined.catalog import data as cat
from combined.errors import ReconciliationFailed
from combined.lake import LakeLayout, LakeTable
from combined.quality import Reconciliation, lake_rows, range_totals, reconcile, same_sum
from combined.quality._nulls import filled_check, null_check, record_unfilled
from combined.quality._variance import expected_variance, record_reconciliation
from combined.runtime._plan import DatasetPlan, Prepared, table_of


def reconcile_run(
    catalog: Catalog, layout: LakeLayout, run: Run, prepared: list[Prepared], members: list[Member]
) -> dict[str, Reconciliation]:
    """Check lake, version and source counts of every dataset before publishing."""
    with catalog.begin() as conn:  # (one read for every dataset's version)
        versions = [
            cat.get_version(conn, m.dataset_version) if m.dataset_version else None for m in members
        ]
    out: dict[str, Reconciliation] = {}
    for p, m, version in zip(prepared, members, versions, strict=True):
        result = _reconcile_one(catalog, layout, run, p, m, version)
        out[p.staged.plan.name] = result
        blocking = result.lake_status == "mismatch" or (
            result.source_status == "mismatch"
            and (p.staged.full or p.staged.unchanged_rows is not None)
        )
        if blocking:  # (committed, just not published: the reads succeeded)
            raise ReconciliationFailed(
                f"{result.dataset} does not reconcile: the lake holds {result.lake_rows} "
                f"rows, its version claims {result.version_rows}, the source read "
                f"{result.source_rows}; nothing was published",
                hint="inspect `combined run show` and the activity feed, then capture again",
            )
    return out


def _reconcile_one(
    catalog: Catalog, layout: LakeLayout, run: Run, p: Prepared, m: Member, version: Any
) -> Reconciliation:
    """One dataset's checks, recorded (with its control totals' event) in one transaction."""
    plan = p.staged.plan
    whole = p.staged.full and plan.sync_mode != "append"
    # One load of the table for the checks below (each reads the version committed).
    lake = table_of(layout, plan).pinned()
    result = reconcile(
        f"{plan.source}.{plan.name}",
        lake,
        m.lake_version,
        int(version.row_count) if version is not None else 0,
        p.staged.rows if whole else p.staged.unchanged_rows,
    )
    told: dict[str, Any] | None = None
    if p.staged.control is not None:
        checked, told, failure = _check_control(lake, p, m, result)
        if failure is not None:
            with catalog.begin() as conn:
                cat.emit(conn, "reconciliation.control", run_id=run.id, **told)
            raise failure
        result = expected_variance(checked, plan.strategy)
    result = null_check(result, lake, m.lake_version, p.staged.not_null)
    result = filled_check(result, lake, m.lake_version, p.staged.filled_nulls)
    with catalog.begin() as conn:
        if told is not None:
            cat.emit(conn, "reconciliation.control", run_id=run.id, **told)
        record_reconciliation(conn, result, source=plan.source, dataset=plan.name, run_id=run.id)
        if p.staged.unfilled:
            record_unfilled(
                conn, p.staged.unfilled, source=plan.source, dataset=plan.name, run_id=run.id
            )
    return result


def _check_control(
    table: LakeTable, p: Prepared, m: Member, result: Reconciliation
) -> tuple[Reconciliation, dict[str, Any], ReconciliationFailed | None]:
    """Compare a backfill's control totals (read in its snapshot) with what landed.

    ``table``: the reconciliation's view of the dataset's table (its one
    load). Returns the result, the ``reconciliation.control`` event's
    fields (recorded with the reconciliation, or alone before the failure)
    and the failure that leaves the Run unpublished, if any.
    """
    plan, control = p.staged.plan, p.staged.control
    assert control is not None
    if p.staged.landed_filter is None and not control.get("sum_column"):
        # Rows alone, of the whole version: the count ``result`` read from
        # the version's log (its files' footers where the log has none), not
        # a query of every file again.
        rows, total, tolerance = result.lake_rows, None, 0.0
    else:
        files = table.files(m.lake_version) if m.lake_version is not None else []
        rows, total, tolerance = range_totals(
            files, p.staged.landed_filter, control.get("sum_column"), table.store
        )
    ok = rows == control["rows"] and same_sum(total, control.get("sum"), tolerance)
    told = {
        "source": plan.source,
        "dataset": plan.name,
        "control": dict(control),
        "landed": {"rows": rows, "sum": total, "tolerance": tolerance},
        "ok": ok,
    }
    if not ok and (p.staged.full or p.staged.bounded):
        failure = ReconciliationFailed(
            f"{plan.source}.{plan.name}: the source's control totals ({control['rows']} "
            f"rows, sum {control.get('sum')}) differ from what landed ({rows} rows, "
            f"sum {total}); nothing was published",
            hint=f"a whole `combined capture {result.dataset}` carries rows gone from range",
        )
        return result, told, failure
    # A delta capture (cursor) cannot see deletes or updates that leave its
    # cursor alone: a mismatch is that limit showing, reported and published.
    checked = dataclasses.replace(
        result,
        source_rows=control["rows"],
        source_status="reconciled" if ok else "mismatch",
    )
    return checked, told, None


def check_lake_untouched(catalog: Catalog, layout: LakeLayout, run: Run, plan: DatasetPlan) -> None:
    """Refuse a capture over a table whose rows its dataset version does not account for.

    A table that another writer changed (a Spark job appending to it, a
    manual delete) would be reduced against rows no version holds: the
    transition would count their deletes, and every later version would
    claim a row count the lake never holds again, unpublishable for good.
    Caught before the read, nothing is committed and the version chain
    stays right: restoring the table to its last Combined version mends it.
    """
    with catalog.begin() as conn:
        row = cat.get_dataset(conn, plan.source, plan.name)
        version = cat.get_version(conn, row.current_version) if row.current_version else None
    if version is None:
        return  # a first capture: no version to account for the rows
    table = table_of(layout, plan).pinned()
    newest = table.version()
    if newest is None:
        return
    held = lake_rows(table, newest)
    if held == int(version.row_count):
        return
    ours = row.lake_version
    foreign = table.foreign_versions(ours)
    with catalog.begin() as conn:
        cat.emit(
            conn,
            "alert.reconciliation_failed",
            source=plan.source,
            dataset=plan.name,
            run_id=run.id,
            lake_rows=held,
            version_rows=int(version.row_count),
            source_rows=None,
            lake_status="mismatch",
            source_status="not_reconciled",
            lake_version=newest,
            foreign_lake_versions=foreign,
        )
    what = (
        f"{plan.source}.{plan.name} does not reconcile: the lake holds {held} rows at lake "
        f"version {newest}, but its dataset version {version.id[:12]} (lake version {ours}) "
        f"claims {version.row_count}"
    )
    raise _touched(f"{plan.source}.{plan.name}", what, ours, foreign, table.path)


def _touched(
    name: str, what: str, ours: int | None, foreign: list[int], path: str
) -> ReconciliationFailed:
    """The error of a table changed outside Combined: how to restore it, when known."""
    if foreign and ours is not None:
        listed = ", ".join(str(v) for v in foreign)
        return ReconciliationFailed(
            f"{what}: lake version{'s' if len(foreign) > 1 else ''} {listed} "
            f"{'were' if len(foreign) > 1 else 'was'} written outside Combined; nothing "
            "was read or committed",
            hint=f"restore the table to lake version {ours} (with the deltalake package: "
            f"DeltaTable('{path}').restore({ours})), then capture again",
        )
    return ReconciliationFailed(
        f"{what}; nothing was read or committed",
        hint=f"see `combined history {name}` and the activity feed; restore the table "
        "to the last lake version whose rows its dataset version accounts for, then "
        "capture again",
    )
