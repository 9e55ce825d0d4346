"""A program's configuration as it stands: the declared one, then each update it made.

A connector program may update its own configuration: an Airbyte source
sends it (``CONTROL`` ``CONNECTOR_CONFIG``), a Singer tap writes it back into
its ``--config`` file (the Singer SDK's settings write-back, singer-io taps'
``write_config``); typically a rotated refresh token, the old one revoked.
Every later run of the program, in this process and in the next, must be
given the new one: the source's :class:`LiveConfig` holds it for this
process, and the engine's sink (:class:`~combined.connectors.abc.ConfigSink`)
keeps it for the next.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from combined._credentials import remember_secret, walk
from combined.connectors.abc import ConfigSink

if TYPE_CHECKING:
    from combined.connectors._subprocess._private import PrivateDir

#: The name of the program's configuration file in its private directory.
CONFIG_FILE = "config.json"


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as plain JSON values (exact numbers parsed as ``Decimal`` made numbers)."""
    # Here, not at the top: the engine sweeps private files without importing pyarrow.
    from combined.connectors._subprocess._schema import json_encoder

    # (the encoder, not json.dumps's default: a number no double holds raises there)
    plain: dict[str, Any] = json.loads(json_encoder()(config))
    return plain


def _over(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` laid over ``base``: mappings merged key by key, anything else replaced."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            merged[key] = _over(below, value)
        else:
            merged[key] = value
    return merged


class LiveConfig:
    """The program configuration each run of the program is given."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.current: dict[str, Any] = dict(config)
        self.sink: ConfigSink | None = None

    def receive(self, config: Mapping[str, Any]) -> list[str]:
        """Take ``config`` as the program's configuration from now on; the changed paths.

        The sink keeps it before this returns (raising if it cannot); with
        no sink (a source used outside a project) it lasts as long as the source.
        Its credential values are masked from now on wherever Combined shows text.
        """
        before, self.current = self.current, _plain(config)
        for _, value, under in walk(self.current):
            if under and isinstance(value, str):
                remember_secret(value)  # a new token: masked in whatever shows it from now on
        if self.sink is None:
            keys = [*before, *(k for k in self.current if k not in before)]
            return [f"config.{k}" for k in keys if before.get(k) != self.current.get(k)]
        return self.sink.update({"config": before}, {"config": self.current})

    def take_back(self, files: PrivateDir) -> list[str]:
        """What the program wrote back into its configuration file in ``files``, if anything.

        A file that is no longer a JSON object (a program killed while writing
        it) is no update. What it holds is laid over the configuration: a key
        the program left out of the file is kept (some write only what changed).
        """
        given = files.written.get(CONFIG_FILE)
        if given is None:
            return []
        try:
            written = json.loads((files.path / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        if not isinstance(written, dict) or written == _plain(given):
            return []
        return self.receive(_over(self.current, written))
