"""The control plane: tables, migrations and repositories (SQLite or PostgreSQL)."""

from combined.catalog import _console as console
from combined.catalog import _data as data
from combined.catalog import _queue as queue
from combined.catalog import _resets as resets
from combined.catalog import _runs as runs
from combined.catalog._catalog import Catalog, worker_identity
from combined.catalog._data import Member, VersionTotals, version_id
from combined.catalog._runs import (
    RUN_STATES,
    TERMINAL,
    TRANSITIONS,
    TRIGGERS,
    Admission,
    Run,
    RunState,
    Trigger,
    check_transition,
)

__all__ = [
    "RUN_STATES",
    "TERMINAL",
    "TRANSITIONS",
    "TRIGGERS",
    "Admission",
    "Catalog",
    "Member",
    "Run",
    "RunState",
    "Trigger",
    "VersionTotals",
    "check_transition",
    "console",
    "data",
    "queue",
    "resets",
    "runs",
    "version_id",
    "worker_identity",
]
