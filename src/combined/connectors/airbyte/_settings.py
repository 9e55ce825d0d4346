"""The airbyte source's configuration (see :class:`~combined.connectors.airbyte.AirbyteSource`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from combined.connectors._subprocess._settings import COMMON_KEYS, Flavour, ProgramSettings

CONFIG_KEYS = COMMON_KEYS

FLAVOUR = Flavour(
    connector="airbyte",
    protocol="Airbyte",
    noun="connector",
    example="command: source-faker, or command: [docker, run, --rm, -i, airbyte/source-faker]",
    install=(
        "install the connector where Combined runs (e.g. `pipx install airbyte-{name}` for a "
        "Python connector) and set `command:` to the name on PATH or its absolute path; or "
        "run its image: command: [docker, run, --rm, -i, ...]"
    ),
)


@dataclass(frozen=True, slots=True)
class Settings(ProgramSettings):
    """The validated configuration of one airbyte source (secrets resolved)."""

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> Settings:
        """Validate ``config``; raises :class:`~combined.errors.ConfigError`."""
        return cls(**cls.common(FLAVOUR, config))
