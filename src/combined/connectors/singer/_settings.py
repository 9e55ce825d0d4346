"""The singer source's configuration, and the private files a tap run reads."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from combined._credentials import walk
from combined.connectors.singer._schema import json_default
from combined.errors import ConfigError, redact

CONFIG_KEYS = (
    "command",
    "config",
    "catalog",
    "discover_timeout",
    "idle_timeout",
    "batch_rows",
    "batch_bytes",
    "max_line_bytes",
)

DEFAULT_DISCOVER_TIMEOUT_S = 300.0
DEFAULT_IDLE_TIMEOUT_S = 600.0
DEFAULT_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024

_INSTALL_HINT = (
    "install the tap where Combined runs (e.g. `pipx install {name}` or "
    "`pip install {name}` into its own virtual environment) and set `command:` to the "
    "name on PATH or its absolute path"
)


def _seconds(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(
            f"singer source option {key!r} must be a number of seconds above zero, not {value!r}",
            hint=f"e.g. {key}: {int(default)}",
            option=key,
        )
    return float(value)


def _count(config: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"singer source option {key!r} must be a positive integer, not {value!r}",
            hint=f"e.g. {key}: {default or 10_000}",
            option=key,
        )
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one singer source (secrets resolved)."""

    command: tuple[str, ...]
    tap_config: Mapping[str, Any]
    catalog: str | None
    discover_timeout: float
    idle_timeout: float
    batch_rows: int | None
    batch_bytes: int
    max_line_bytes: int

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> Settings:
        """Validate ``config``; raises :class:`~combined.errors.ConfigError`."""
        command = config.get("command")
        if isinstance(command, str) and command:
            argv: tuple[str, ...] = (command,)
        elif (
            isinstance(command, list) and command and all(isinstance(a, str) and a for a in command)
        ):
            argv = tuple(command)
        else:
            raise ConfigError(
                "the singer source needs a `command`: the tap's executable name or an argv list",
                hint="e.g. command: tap-github, or command: [python, -m, tap_github]",
            )
        tap_config = config.get("config", {})
        if not isinstance(tap_config, Mapping):
            raise ConfigError(
                "the singer source's `config` must be a mapping: the tap's own configuration",
                hint="write the tap's settings under `config:`, secrets as {secret: env:NAME}",
            )
        catalog = config.get("catalog")
        if catalog is not None and (not isinstance(catalog, str) or not catalog):
            raise ConfigError(
                "the singer source's `catalog` must be the path of a catalog file",
                hint="remove it to run the tap's discovery, or give a path",
            )
        return cls(
            command=argv,
            tap_config=dict(tap_config),
            catalog=catalog,
            discover_timeout=_seconds(config, "discover_timeout", DEFAULT_DISCOVER_TIMEOUT_S),
            idle_timeout=_seconds(config, "idle_timeout", DEFAULT_IDLE_TIMEOUT_S),
            batch_rows=_count(config, "batch_rows", None),
            batch_bytes=_count(config, "batch_bytes", DEFAULT_BATCH_BYTES) or DEFAULT_BATCH_BYTES,
            max_line_bytes=_count(config, "max_line_bytes", DEFAULT_MAX_LINE_BYTES)
            or DEFAULT_MAX_LINE_BYTES,
        )

    def executable(self) -> list[str]:
        """The tap's argv with its executable found; ``ConfigError`` when it is not."""
        name = self.command[0]
        found = shutil.which(name) if os.sep not in name else (name if _runnable(name) else None)
        if found is None:
            where = "is not an executable file" if os.sep in name else "is not on PATH"
            raise ConfigError(
                f"the tap {name!r} {where}",
                hint=_INSTALL_HINT.format(name=Path(name).name),
                command=name,
            )
        return [found, *self.command[1:]]

    def scrubber(self) -> Any:
        """A function masking the tap config's credential values, then any credential shape."""
        values = sorted(
            {
                str(value)
                for _, value, under in walk(self.tap_config)
                if under and isinstance(value, str | int) and not isinstance(value, bool)
                if len(str(value)) >= 4
            },
            key=len,
            reverse=True,
        )

        def scrub(text: str) -> str:
            for value in values:
                text = text.replace(value, "***")
            return redact(text)

        return scrub


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


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


class PrivateDir:
    """A directory only this user can read (0700), for the files a tap run reads.

    The tap's configuration (secrets resolved) is written to ``config.json``
    with mode 0600; :meth:`remove` deletes everything, whatever happened.
    """

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="combined-singer-"))
        os.chmod(self.path, 0o700)

    def write(self, name: str, data: Any) -> str:
        """Write ``data`` as JSON to a new 0600 file; return its path."""
        path = self.path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump(data, f, default=json_default)
        return str(path)

    def remove(self) -> None:
        """Delete the directory and every file in it."""
        shutil.rmtree(self.path, ignore_errors=True)
