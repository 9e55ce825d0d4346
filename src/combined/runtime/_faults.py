"""Fault injection for crash-safety tests: an explicit, documented switch.

Set ``COMBINED_FAULT`` to one lifecycle boundary and the capture process kills
itself with SIGKILL when it reaches it:

- ``after_staging``: every Delivery of the first dataset is staged, nothing committed;
- ``during_commit``: a watchdog kills the process ``COMBINED_FAULT_DELAY_MS``
  milliseconds (default 2) into the lake commit call;
- ``before_log``: the commit's data files are in the table's directory, its
  log entry is not written (what a writer killed mid-commit leaves: orphans);
- ``after_commit``: the lake commit landed, the catalog projection did not;
- ``after_usage``: the lake commit and its MAR (the usage table's commit)
  landed, the catalog projection did not;
- ``history_before_log``: the lake commit landed and its history commit's data
  files are in the history's directory, the history's log entry is not;
- ``after_history``: the lake commit and its history (``history: true``)
  landed, the catalog projection did not;
- ``after_projection``: the catalog projection landed, the publication did not;
- ``after_ledger``: the publication is in the lake's ledger, its catalog
  transaction not committed.

Nothing else reads these variables; unset, the functions do nothing.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = (
    "after_staging",
    "during_commit",
    "before_log",
    "after_commit",
    "after_usage",
    "history_before_log",
    "after_history",
    "after_projection",
    "after_ledger",
)


def _armed(point: str) -> bool:
    return os.environ.get("COMBINED_FAULT") == point


def fault(point: str) -> None:
    """Kill this process now if the fault switch names ``point``."""
    if _armed(point):
        os.kill(os.getpid(), signal.SIGKILL)


def arm_commit_watchdog() -> None:
    """Start the ``during_commit`` watchdog if armed."""
    if not _armed("during_commit"):
        return
    delay = float(os.environ.get("COMBINED_FAULT_DELAY_MS", "2")) / 1000
    timer = threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()
