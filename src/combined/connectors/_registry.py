"""Find connector classes through the ``combined.connectors`` entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import cast

from combined.connectors.abc import Source
from combined.errors import ConfigError

GROUP = "combined.connectors"


def known_connectors() -> list[str]:
    """Names of every registered connector."""
    return sorted(ep.name for ep in entry_points(group=GROUP))


def connector_class(name: str) -> type[Source]:
    """The connector class registered as ``name``."""
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            return cast(type[Source], ep.load())
    raise ConfigError(
        f"unknown connector {name!r}",
        hint=f"use one of: {', '.join(known_connectors())}",
    )
