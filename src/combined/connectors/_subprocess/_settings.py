"""What every program-run connector is configured with (its private files: :mod:`._private`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from combined._credentials import has_inline_credential, is_credential_key, masking, walk
from combined.connectors._subprocess._typing import KEYS as TYPING_KEYS
from combined.connectors._subprocess._typing import Typing
from combined.errors import ConfigError

#: The configuration keys every program-run connector takes.
COMMON_KEYS = (
    "command",
    "config",
    "discover_timeout",
    "idle_timeout",
    "batch_rows",
    "batch_bytes",
    "max_line_bytes",
    "env",
    *TYPING_KEYS,
)

DEFAULT_DISCOVER_TIMEOUT_S = 300.0
DEFAULT_IDLE_TIMEOUT_S = 600.0
DEFAULT_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Flavour:
    """How one connector names its program in messages: ``tap`` of ``singer``, ..."""

    connector: str
    """The registered connector name (``singer``, ``airbyte``)."""
    protocol: str
    """The protocol's name in prose (``Singer``, ``Airbyte``)."""
    noun: str
    """What the program is called (``tap``, ``connector``)."""
    example: str
    """An example ``command:`` for hints."""
    install: str
    """How to install one, for hints; ``{name}`` is the missing executable."""


def _seconds(flavour: Flavour, config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(
            f"{flavour.connector} source option {key!r} must be a number of seconds above "
            f"zero, not {value!r}",
            hint=f"e.g. {key}: {int(default)}",
            option=key,
        )
    return float(value)


def _count(
    flavour: Flavour, config: Mapping[str, Any], key: str, default: int | None
) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{flavour.connector} source option {key!r} must be a positive integer, not {value!r}",
            hint=f"e.g. {key}: {default or 10_000}",
            option=key,
        )
    return value


@dataclass(frozen=True, slots=True)
class ProgramSettings:
    """The validated configuration of a program-run source (secrets resolved)."""

    flavour: Flavour
    command: tuple[str, ...]
    program_config: Mapping[str, Any]
    discover_timeout: float
    idle_timeout: float
    batch_rows: int | None
    batch_bytes: int
    max_line_bytes: int
    #: Variables set for the program, on top of the environment it inherits.
    env: Mapping[str, str]
    #: The declared field types and naive-timestamp policy, over the streams' schemas.
    typing: Typing

    @classmethod
    def common(cls, flavour: Flavour, config: Mapping[str, Any]) -> dict[str, Any]:
        """The validated common fields of ``config``; raises ``ConfigError``."""
        command = config.get("command")
        if isinstance(command, str) and command:
            argv: tuple[str, ...] = (command,)
        elif (
            isinstance(command, list) and command and all(isinstance(a, str) and a for a in command)
        ):
            argv = tuple(command)
        else:
            raise ConfigError(
                f"the {flavour.connector} source needs a `command`: the {flavour.noun}'s "
                "executable name or an argv list",
                hint=f"e.g. {flavour.example}",
            )
        program_config = config.get("config", {})
        if not isinstance(program_config, Mapping):
            raise ConfigError(
                f"the {flavour.connector} source's `config` must be a mapping: the "
                f"{flavour.noun}'s own configuration",
                hint=f"write the {flavour.noun}'s settings under `config:`, "
                "secrets as {secret: env:NAME}",
            )
        env = config.get("env", {})
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and k and "=" not in k and isinstance(v, str | int | float)
            for k, v in env.items()
        ):
            raise ConfigError(
                f"the {flavour.connector} source's `env` must map variable names to values",
                hint='e.g. env: {GITHUB_TOKEN: {secret: "env:GITHUB_TOKEN"}, TZ: UTC}',
            )
        return {
            "flavour": flavour,
            "command": argv,
            "env": {str(k): str(v) for k, v in env.items()},
            "program_config": dict(program_config),
            "typing": Typing.parse(flavour.connector, config),
            "discover_timeout": _seconds(
                flavour, config, "discover_timeout", DEFAULT_DISCOVER_TIMEOUT_S
            ),
            "idle_timeout": _seconds(flavour, config, "idle_timeout", DEFAULT_IDLE_TIMEOUT_S),
            "batch_rows": _count(flavour, config, "batch_rows", None),
            "batch_bytes": _count(flavour, config, "batch_bytes", DEFAULT_BATCH_BYTES)
            or DEFAULT_BATCH_BYTES,
            "max_line_bytes": _count(flavour, config, "max_line_bytes", DEFAULT_MAX_LINE_BYTES)
            or DEFAULT_MAX_LINE_BYTES,
        }

    def executable(self) -> list[str]:
        """The program's argv with its executable found; ``ConfigError`` when it is not."""
        name = self.command[0]
        found = shutil.which(name) if os.sep not in name else (name if _runnable(name) else None)
        if found is None:
            where = "is not an executable file" if os.sep in name else "is not on PATH"
            raise ConfigError(
                f"the {self.flavour.noun} {name!r} {where}",
                hint=self.flavour.install.format(name=Path(name).name),
                command=name,
            )
        return [found, *self.command[1:]]

    def environment(self) -> dict[str, str]:
        """The program's environment: Combined's, less what may be a credential, plus ``env``.

        A variable whose name says it holds a credential (``*_PASSWORD``,
        ``*_TOKEN``, ``*_SECRET_ACCESS_KEY``, ...) or whose value carries one
        (a URL with a password) is another source's or the lake's, never the
        program's: it gets what ``env`` gives it, secrets by reference.
        """
        kept = {
            name: value
            for name, value in os.environ.items()
            if not is_credential_key(name) and not has_inline_credential(value)
        }
        return {**kept, **self.env}

    def scrubber(self) -> Callable[[str], str]:
        """A function masking the program config's credential values, then any credential shape."""
        return masking(
            str(value)
            for _, value, under in walk({**self.program_config, "env": dict(self.env)})
            if under and isinstance(value, str | int) and not isinstance(value, bool)
            if len(str(value)) >= 4
        )


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)
