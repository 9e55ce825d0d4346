"""Boundary rules: count reconciliation (drift and quarantine live with the pipeline)."""

from combined.quality._reconcile import Reconciliation, range_totals, reconcile, same_sum

__all__ = ["Reconciliation", "range_totals", "reconcile", "same_sum"]
