"""The singer source's configuration (see :class:`~combined.connectors.singer.SingerSource`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from combined.connectors._subprocess._settings import COMMON_KEYS, Flavour, ProgramSettings
from combined.errors import ConfigError

CONFIG_KEYS = (*COMMON_KEYS, "catalog")

FLAVOUR = Flavour(
    connector="singer",
    protocol="Singer",
    noun="tap",
    example="command: tap-github, or command: [python, -m, tap_github]",
    install=(
        "install the tap where Combined runs (e.g. `pipx install {name}` or "
        "`pip install {name}` into its own virtual environment) and set `command:` to the "
        "name on PATH or its absolute path"
    ),
)


@dataclass(frozen=True, slots=True)
class Settings(ProgramSettings):
    """The validated configuration of one singer source (secrets resolved)."""

    catalog: str | None = None

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> Settings:
        """Validate ``config``; raises :class:`~combined.errors.ConfigError`."""
        common = cls.common(FLAVOUR, config)
        catalog = config.get("catalog")
        if catalog is not None and (not isinstance(catalog, str) or not catalog):
            raise ConfigError(
                "the singer source's `catalog` must be the path of a catalog file",
                hint="remove it to run the tap's discovery, or give a path",
            )
        return cls(**common, catalog=catalog)


def load_json(path: str) -> Any:
    """A JSON file, numbers kept exact (``multipleOf`` becomes a ``Decimal``)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, parse_float=Decimal)
    except FileNotFoundError:
        raise ConfigError(
            f"the catalog file {path!r} does not exist",
            hint="fix `catalog:` or remove it to run the tap's discovery",
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"the catalog file {path!r} cannot be read as JSON: {exc}",
            hint="write the catalog the tap's --discover prints, or remove `catalog:`",
        ) from None
