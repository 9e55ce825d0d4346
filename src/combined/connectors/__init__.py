"""Connectors: one folder per source kind, found through entry points."""

from combined.connectors._registry import connector_class, known_connectors
from combined.connectors._subprocess._private import sweep as sweep_private_dirs
from combined.connectors.abc import check_config, check_strategy

__all__ = [
    "check_config",
    "check_strategy",
    "connector_class",
    "known_connectors",
    "sweep_private_dirs",
]
