"""The expected variance of a cursor capture, reported with its remedy and alerted once.

A cursor reads what its column says changed: a row the source deleted is
never read again, so the lake keeps it and the source's count (read in the
capture's snapshot) is short of the lake's by the rows deleted so far. That
gap is the strategy's known limit, not a failed capture: each reconciliation
states it (``source_status: expected_variance`` and how many rows), and
``alert.reconciliation_failed`` is raised only when it changes, with the
way to close it. A lake that holds fewer rows than the source is still a
mismatch, alerted every time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Connection

from combined.catalog import data as cat
from combined.quality._reconcile import Reconciliation

__all__ = ["expected_variance", "record_reconciliation", "variance_remedy"]


def expected_variance(result: Reconciliation, strategy: str) -> Reconciliation:
    """``result``, its source mismatch stated as the cursor's variance where it is one."""
    if (
        strategy != "cursor"
        or result.lake_status != "reconciled"
        or result.source_status != "mismatch"
        or result.source_rows is None
        or result.lake_rows <= result.source_rows
    ):
        return result
    return dataclasses.replace(
        result,
        source_status="expected_variance",
        expected_variance=result.lake_rows - result.source_rows,
    )


def variance_remedy(dataset: str) -> str:
    """What closes a cursor's variance."""
    return (
        "a cursor capture cannot see deletes: the lake keeps the rows the source deleted. "
        f"To remove them, capture the whole table from time to time (`combined backfill "
        f"{dataset} --column <key> --from <lowest> --to <past the highest>` deletes what the "
        "source no longer holds), or capture it with `strategy: cdc`, which streams deletes"
    )


def record_reconciliation(
    conn: Connection, result: Reconciliation, *, source: str, dataset: str, run_id: str
) -> None:
    """Emit the reconciliation event, and the alert unless an expected variance is unchanged."""
    body: dict[str, Any] = {k: v for k, v in result.to_json().items() if k != "dataset"}
    kinds = ["reconciliation" if result.ok else "alert.reconciliation_failed"]
    if result.expected_variance is not None:
        # Not ``reconciliation.control``: the newest plain one states the variance.
        last = cat.activity(
            conn, kind="reconciliation", source=source, dataset=dataset, limit=1, exact=True
        )
        before = last[0].body.get("expected_variance") if last else None
        body["remedy"] = variance_remedy(result.dataset)
        if before != result.expected_variance:
            kinds.append("alert.reconciliation_failed")
            body["previous_variance"] = before
    for kind in kinds:
        cat.emit(conn, kind, source=source, dataset=dataset, run_id=run_id, **body)
