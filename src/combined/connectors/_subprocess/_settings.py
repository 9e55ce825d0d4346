"""What every program-run connector is configured with (its private files: :mod:`._private`)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from combined._credentials import (
    has_inline_credential,
    is_credential_key,
    masking,
    reserved_env,
    value_masking,
    walk,
)
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
    "inherit_env",
    *TYPING_KEYS,
)

#: What a program inherits of Combined's environment, besides its ``inherit_env``:
#: where to find programs and files, the locale and time zone, proxies and CAs.
INHERITED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TMP",
        "TEMP",
        *(f"{name}_PROXY" for name in ("HTTP", "HTTPS", "ALL", "NO")),
        *(f"{name}_proxy" for name in ("http", "https", "all", "no")),
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    }
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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
    #: Variables of Combined's environment the program inherits besides :data:`INHERITED_ENV`.
    inherit_env: frozenset[str]
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
            "inherit_env": inherit_env(flavour.connector, config),
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
        """The program's environment: an allow-list of Combined's, plus ``env``.

        A program inherits only :data:`INHERITED_ENV` and the names its
        ``inherit_env`` lists, never a variable a secret reference of the
        project names (another source's password, the catalog's), nor one
        whose value carries a credential (a proxy URL with a password): it
        gets a secret only as ``env`` gives it one, by reference.
        """
        wanted = INHERITED_ENV | self.inherit_env
        reserved = reserved_env()
        kept = {
            name: value
            for name, value in os.environ.items()
            if (name in wanted or name.startswith("LC_"))
            and name not in reserved
            and not is_credential_key(name)
            and not has_inline_credential(value)
        }
        return {**kept, **self.env}

    def scrubber(self) -> Callable[[str], str]:
        """A function masking the program config's credential values, then any credential shape."""
        return masking(self._credential_values())

    def state_masker(self) -> Callable[[str], str]:
        """A function masking the program config's credential values alone (a state kept)."""
        return value_masking(self._credential_values())

    def _credential_values(self) -> list[str]:
        return [
            str(value)
            for _, value, under in walk({**self.program_config, "env": dict(self.env)})
            if under and isinstance(value, str | int) and not isinstance(value, bool)
            if len(str(value)) >= 4
        ]


def inherit_env(connector: str, config: Mapping[str, Any]) -> frozenset[str]:
    """The validated ``inherit_env``: names of variables that hold no credential."""
    names = config.get("inherit_env", [])
    hint = "e.g. inherit_env: [JAVA_HOME, PYTHONPATH]"
    if not isinstance(names, list) or not all(
        isinstance(n, str) and _ENV_NAME.match(n) for n in names
    ):
        raise ConfigError(
            f"the {connector} source's `inherit_env` must list environment variable names",
            hint=hint,
        )
    reserved = reserved_env()
    for name in names:
        if is_credential_key(name) or name in reserved:
            raise ConfigError(
                f"the {connector} source's `inherit_env` names {name}, which holds a "
                "secret: a program is given a secret only by reference",
                hint=f'give it as env: {{{name}: {{secret: "env:{name}"}}}}',
                variable=name,
            )
    return frozenset(names)


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)
