"""The base of a source whose connector is a program (a Singer tap, an Airbyte source)."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, TypeVar

from combined.connectors._subprocess._live import LiveConfig
from combined.connectors._subprocess._settings import ProgramSettings, inherit_env
from combined.connectors.abc import BaseSource, ConfigSink, CursorSpec, ReadRequest
from combined.errors import ConfigError

SettingsT = TypeVar("SettingsT", bound=ProgramSettings)


class ProgramSource(BaseSource, Generic[SettingsT]):
    """A source read by running a program: snapshot and cursor reads, no cdc, no partitions.

    Subclasses parse their settings (:meth:`_parse`); the credential scrubber
    of every log tail and message is built from them.
    """

    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = True
    SUPPORTS_CDC: ClassVar[bool] = False
    SUPPORTS_PARTITIONS: ClassVar[bool] = False
    #: A program resumes at its bookmark, inclusive (a Singer tap, an Airbyte
    #: source's cursor), and re-sends what followed its last state.
    REDELIVERS: ClassVar[bool] = True
    #: The argv is the program's command line: any user of the machine reads it.
    PUBLIC_KEYS: ClassVar[Mapping[str, tuple[str, str]]] = {
        "command": (
            "`command` becomes the program's command line, which any user of the machine "
            "can read (ps)",
            "give the secret in the program's `config:` (written to a private 0600 file) or "
            'in `env:`, e.g. env: {API_TOKEN: {secret: "env:API_TOKEN"}}',
        )
    }

    @classmethod
    def check_static(cls, config: Mapping[str, Any]) -> None:
        """Refuse, before any Run, an ``inherit_env`` naming a secret's variable."""
        inherit_env(cls.name, config)

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.settings: SettingsT = self._parse(self.config)
        self._scrub = self.settings.scrubber()
        #: The program's configuration as it stands (updates it sent included).
        self.live = LiveConfig(self.settings.program_config)

    def keep_config_updates(self, sink: ConfigSink) -> None:
        """Have ``sink`` keep each configuration update the program sends, for the next run."""
        self.live.sink = sink

    @classmethod
    @abc.abstractmethod
    def _parse(cls, config: Mapping[str, Any]) -> SettingsT:
        """The validated settings of ``config``; raises ``ConfigError``."""

    def _run_options(self, request: ReadRequest) -> dict[str, Any]:
        """What every read's extraction takes: settings, argv, request, batch rows, scrubber,
        the program's configuration as it stands.

        The batch rows are the request's, capped by the source's ``batch_rows``.
        """
        return {
            "settings": self.settings,
            "argv": self.settings.executable(),
            "request": request,
            "batch_rows": min(request.batch_rows, self.settings.batch_rows or request.batch_rows),
            "scrub": self._scrub,
            "live": self.live,
        }

    @staticmethod
    def _declared_cursor(request: ReadRequest, field: str) -> CursorSpec:
        """The cursor a cursor read declares; ``ConfigError`` naming ``field`` when none."""
        if request.cursor is None:
            raise ConfigError(
                f"dataset {request.dataset!r} uses the cursor strategy without a cursor",
                hint=f"declare `cursor: {{column: <the stream's {field}>, trust: ...}}`",
                dataset=request.dataset,
            )
        return request.cursor
