"""A program's configuration as it stands: the declared one, then each update it sent.

An Airbyte source may send its updated configuration (``CONTROL``
``CONNECTOR_CONFIG``: a rotated refresh token). Every later run of the
program, in this process and in the next, must be given the new one: the
source's :class:`LiveConfig` holds it for this process, and the engine's sink
(:class:`~combined.connectors.abc.ConfigSink`) keeps it for the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from combined.connectors.abc import ConfigSink


class LiveConfig:
    """The program configuration each run of the program is given."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.current: dict[str, Any] = dict(config)
        self.sink: ConfigSink | None = None

    def receive(self, config: Mapping[str, Any]) -> list[str]:
        """Take ``config`` as the program's configuration from now on; the changed paths.

        The sink keeps it before this returns (raising if it cannot); with
        no sink (a source used outside a project) it lasts as long as the source.
        """
        before, self.current = self.current, dict(config)
        if self.sink is None:
            keys = [*before, *(k for k in self.current if k not in before)]
            return [f"config.{k}" for k in keys if before.get(k) != self.current.get(k)]
        return self.sink.update({"config": before}, {"config": self.current})
