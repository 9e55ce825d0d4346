"""Connectors: one folder per source kind, found through entry points."""

from combined.connectors._registry import connector_class, known_connectors
from combined.connectors._subprocess._private import sweep as sweep_private_dirs
from combined.connectors.abc import (
    check_config,
    check_shared_streams,
    check_strategy,
    check_streams,
)

__all__ = [
    "check_config",
    "check_shared_streams",
    "check_strategy",
    "check_streams",
    "connector_class",
    "known_connectors",
    "sweep_private_dirs",
]
