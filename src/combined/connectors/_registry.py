"""Find connector classes through the ``combined.connectors`` entry-point group."""

from __future__ import annotations

import difflib
import os
from importlib.metadata import entry_points
from typing import cast

from combined.connectors.abc import Source
from combined.errors import ConfigError

GROUP = "combined.connectors"
#: The group of test doubles (``scripted``): searched only where
#: :data:`TEST_SWITCH` is ``1``, so that no production project can name one.
TEST_GROUP = "combined.test_connectors"
TEST_SWITCH = "COMBINED_TEST_CONNECTORS"


def _groups() -> tuple[str, ...]:
    return (GROUP, TEST_GROUP) if os.environ.get(TEST_SWITCH) == "1" else (GROUP,)


def known_connectors() -> list[str]:
    """Names of every registered connector (test doubles only where enabled)."""
    return sorted({ep.name for group in _groups() for ep in entry_points(group=group)})


#: The classes found, by (group, name): a lookup scans every installed
#: distribution's metadata (20-50 ms), and a capture looked twice.
_found: dict[tuple[str, str], type[Source]] = {}


def connector_class(name: str) -> type[Source]:
    """The connector class registered as ``name``."""
    for group in _groups():
        if (group, name) in _found:
            return _found[(group, name)]
        for ep in entry_points(group=group):
            if ep.name == name:
                found = _found[(group, name)] = cast(type[Source], ep.load())
                return found
    known = known_connectors()
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = (f"did you mean {close[0]!r}? " if close else "") + f"use one of: {', '.join(known)}"
    if any(ep.name == name for ep in entry_points(group=TEST_GROUP)):
        hint = f"{name} is a test double: it is found only where {TEST_SWITCH}=1"
    raise ConfigError(f"unknown connector {name!r}", hint=hint)
