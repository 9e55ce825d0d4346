"""What the Runs of one command mean as an exit status, for the CLI and for orchestrators."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SUCCEEDED = 0
"""Every Run succeeded."""
RUN_FAILED = 1
"""A Run failed: a retry later may succeed."""
ERROR = 2
"""An error before any Run: an invalid project file, an unknown dataset."""
RUN_NEEDS_REVIEW = 3
"""A Run needs a person's review: quarantine, drift, reconciliation."""
RUN_NEEDS_AUTH = 4
"""A Run needs its credentials fixed."""
RECONCILIATION_DISAGREES = 5
"""Every Run succeeded and published, but a reconciliation disagrees with the source.

A cursor capture's lake keeps rows the source deleted, say: the data is
published, and a person decides whether to close the gap (the remedy is in
``alert.reconciliation_failed``).
"""

#: A published dataset's reconciliation statuses that disagree with the source.
DISAGREEING = ("mismatch", "expected_variance")


def disagreements(stats: Mapping[str, Any] | None) -> list[str]:
    """The datasets of a Run's stats whose reconciliation disagrees with the source."""
    return [ds for ds, s in (stats or {}).items() if s.get("reconciliation") in DISAGREEING]


def exit_status(states: Iterable[str], *, disagrees: bool = False) -> int:
    """The exit status for Runs that ended in ``states``: 0 when all succeeded.

    What needs a person outranks what a retry may fix: credentials first
    (nothing reads until they work), then a review, then a failure. When
    every Run succeeded but one's reconciliation ``disagrees``
    (:func:`disagreements`), 5.
    """
    seen = set(states)
    for state, status in (("needs_auth", RUN_NEEDS_AUTH), ("needs_review", RUN_NEEDS_REVIEW)):
        if state in seen:
            return status
    if seen - {"succeeded"}:
        return RUN_FAILED
    return RECONCILIATION_DISAGREES if disagrees else SUCCEEDED
