"""Connectors: one folder per source kind, found through entry points."""

from combined.connectors._registry import connector_class, known_connectors

__all__ = ["connector_class", "known_connectors"]
