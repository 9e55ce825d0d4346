"""What the Runs of one command mean as an exit status, for the CLI and for orchestrators."""

from __future__ import annotations

from collections.abc import Iterable

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


def exit_status(states: Iterable[str]) -> int:
    """The exit status for Runs that ended in ``states``: 0 when all succeeded.

    What needs a person outranks what a retry may fix: credentials first
    (nothing reads until they work), then a review, then a failure.
    """
    seen = set(states)
    for state, status in (("needs_auth", RUN_NEEDS_AUTH), ("needs_review", RUN_NEEDS_REVIEW)):
        if state in seen:
            return status
    return RUN_FAILED if seen - {"succeeded"} else SUCCEEDED
