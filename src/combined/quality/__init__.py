"""Boundary rules: count reconciliation and quarantine review (drift lives with the pipeline)."""

from combined.quality import _quarantine as quarantine
from combined.quality._reconcile import (
    Reconciliation,
    lake_rows,
    range_totals,
    reconcile,
    same_sum,
)

__all__ = [
    "Reconciliation",
    "lake_rows",
    "quarantine",
    "range_totals",
    "reconcile",
    "same_sum",
]
