"""Combined: governed capture into a Delta Lake you own.

The Python API (``docs/python.md``)::

    from combined import Engine, exit_status

    engine = Engine.open("combined.yaml")
    try:
        runs = engine.capture(["shop.orders"])
    finally:
        engine.close()
    status = exit_status(run.state for run in runs)  # 0, 1, 3 or 4, as the CLI exits

Names are imported on first use, so ``import combined`` (and ``combined
--help``) stays instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from combined import _alloc  # noqa: F401  (first: it picks Arrow's allocator)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from combined._status import (
        ERROR,
        RECONCILIATION_DISAGREES,
        RUN_FAILED,
        RUN_NEEDS_AUTH,
        RUN_NEEDS_REVIEW,
        SUCCEEDED,
        disagreements,
        exit_status,
    )
    from combined.catalog import Run, RunState, Trigger
    from combined.engine import Engine
    from combined.errors import (
        AuthRejected,
        CaptureError,
        CatalogError,
        CombinedError,
        ConfigError,
        NotFoundError,
        SecretError,
        SourceError,
        SourceUnavailable,
    )
    from combined.runtime._reporter import NullReporter, Reporter

#: Each public name and the module that defines it.
_PUBLIC = {
    "Engine": "combined.engine",
    "Run": "combined.catalog",
    "RunState": "combined.catalog",
    "Trigger": "combined.catalog",
    "Reporter": "combined.runtime._reporter",
    "NullReporter": "combined.runtime._reporter",
    "exit_status": "combined._status",
    "SUCCEEDED": "combined._status",
    "RUN_FAILED": "combined._status",
    "ERROR": "combined._status",
    "RUN_NEEDS_REVIEW": "combined._status",
    "RUN_NEEDS_AUTH": "combined._status",
    "RECONCILIATION_DISAGREES": "combined._status",
    "disagreements": "combined._status",
    **{
        name: "combined.errors"
        for name in (
            "CombinedError",
            "ConfigError",
            "SecretError",
            "NotFoundError",
            "CatalogError",
            "SourceError",
            "SourceUnavailable",
            "AuthRejected",
            "CaptureError",
        )
    },
}

__all__ = [
    "ERROR",
    "RECONCILIATION_DISAGREES",
    "RUN_FAILED",
    "RUN_NEEDS_AUTH",
    "RUN_NEEDS_REVIEW",
    "SUCCEEDED",
    "AuthRejected",
    "CaptureError",
    "CatalogError",
    "CombinedError",
    "ConfigError",
    "Engine",
    "NotFoundError",
    "NullReporter",
    "Reporter",
    "Run",
    "RunState",
    "SecretError",
    "SourceError",
    "SourceUnavailable",
    "Trigger",
    "__version__",
    "disagreements",
    "exit_status",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'combined' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
