"""Boundary rules: count reconciliation (drift and quarantine live with the pipeline)."""

from combined.quality._reconcile import Reconciliation, reconcile

__all__ = ["Reconciliation", "reconcile"]
